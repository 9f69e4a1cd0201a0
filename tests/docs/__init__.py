"""The project as documented: docs and notebooks run as written, architecture contracts, docstrings, mypy."""
