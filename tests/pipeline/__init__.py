"""Whole pipelines in one process: checkpoints and resume, whole runs, inspection, in-process faults."""
