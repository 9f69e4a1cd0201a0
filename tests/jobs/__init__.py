"""Scripts the tests run as subprocesses (torchrun, preempted trainers): run by path, not imported."""
