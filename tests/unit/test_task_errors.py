"""Which errors a task returns as its value (raised once in the training process, never retried)
and which it raises for Dask's ``retries``: ``zephon_dask.execution.task_errors``."""

from __future__ import annotations

import pickle
import threading

import pytest

from zephon_dask.errors import ClusterStallError, ConfigError, MissingFieldError, StorageError
from zephon_dask.execution.task_errors import TaskError, settle


class NeedsTwo(Exception):
    """A user's exception that cannot travel: ``__init__`` takes two arguments (plain pickle
    cannot rebuild it) and it holds a lock (nor can the exception pickling that importing
    ``distributed`` installs, as every worker has)."""

    def __init__(self, a, b):
        super().__init__(f"{a} {b}")
        self.held = threading.Lock()


def raising(exc: BaseException):
    def task(*args):
        raise exc
    return task


@pytest.mark.parametrize("exc", [KeyError("body"), ValueError("bad"), ZeroDivisionError(), RecursionError(),
                                 MissingFieldError("dataset 'web' has no field 'body'"), ConfigError("k")])
def test_an_error_the_task_would_raise_again_is_its_value_raised_once_here(exc):
    value = settle(raising(exc), 1)
    assert isinstance(value, TaskError) and value.error is exc and type(exc).__name__ in value.worker_traceback
    again = pickle.loads(pickle.dumps(value))  # what the worker sends
    with pytest.raises(type(exc)) as raised:
        again.reraise("lane 1, window 0")
    assert raised.value.__notes__[-1] == "zephon_dask: while computing lane 1, window 0"
    assert settle(len, again) is again  # a task fed by the failed one returns the same error


@pytest.mark.parametrize("exc", [OSError("reset"), FileNotFoundError("x"), TimeoutError(), MemoryError(),
                                 StorageError("throttled"), ClusterStallError("no worker"),
                                 NeedsTwo(1, 2), KeyboardInterrupt()])
def test_an_error_from_outside_or_that_cannot_travel_is_raised_for_dasks_retries(exc):
    with pytest.raises(type(exc)):
        settle(raising(exc), 1)
