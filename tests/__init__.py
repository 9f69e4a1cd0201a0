"""The test suite (see tests/README.md: which folder a test goes in, how to run one group)."""
