"""Errors raised inside a task that the same task would raise again: carried back as a value, raised once here.

Every window is a pure function of the configuration (a ``map``'s function must be pure too), so
an exception raised while computing one comes back every time the task runs, unless it comes from
outside: I/O errors and timeouts (``OSError``, ``TimeoutError``: a file server or a cluster may
recover) and ``MemoryError`` (another worker may have room), but a data file that is gone or
may not be read (:data:`FINAL_IO`: the data layer types them) stays so. Dask would retry every other one
(``retries=``) and log each failure on the worker ("Compute Failed", a traceback each), so the
distributed runner's tasks run through :func:`settle`, which returns such an error (:func:`is_final`)
as a :class:`TaskError` instead of raising it: the task succeeds, nothing is retried or logged at
ERROR, and the handle raises the error in the training process (:meth:`TaskError.reraise`), with
the worker's traceback at DEBUG. Worker loss and the errors from outside still fail the task, so
Dask's retries apply to them; so does an exception that would not unpickle in the training
process. A window :func:`settle` returns is narrowed (:func:`~zephon_dask.core.window.narrowed`),
so the worker holds it, and sends it, in its smallest integer types. Holds no state.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Any

import cloudpickle
from dask.task_spec import Task

from ..core.window import narrowed
from ..errors import DataAccessError, DatasetNotFoundError, StorageAccessError
from .dask_compat import task

logger = logging.getLogger(__name__)
FROM_OUTSIDE = (OSError, TimeoutError, MemoryError)  # what running the task again may not meet
# I/O errors that say the file is gone, or closed to these credentials: running the task again meets them again
FINAL_IO = (DatasetNotFoundError, DataAccessError, StorageAccessError)


def is_final(exc: BaseException) -> bool:
    """Whether ``exc`` would be raised again by the same task (a pure function): any exception
    but one from outside it (:data:`FROM_OUTSIDE`), the library's own errors and the user's; of
    the I/O errors, a data file gone or refused (:data:`FINAL_IO`)."""
    if not isinstance(exc, Exception):
        return False
    return isinstance(exc, FINAL_IO) or not isinstance(exc, FROM_OUTSIDE)


@dataclass
class TaskError:
    """A final error raised by a task, returned as its value (picklable: the library's errors are)."""

    error: BaseException
    worker_traceback: str

    def reraise(self, label: str) -> None:
        """Raise the error here, noting ``label`` (the windows the task computed); the worker's
        traceback goes to the DEBUG log."""
        logger.debug("zephon_dask: the worker's traceback of %s:\n%s", label, self.worker_traceback)
        self.error.add_note(f"zephon_dask: while computing {label}")
        raise self.error


def _failed_input(args: tuple) -> TaskError | None:
    for arg in args:
        for value in arg if isinstance(arg, list | tuple) else (arg,):
            if isinstance(value, TaskError):
                return value
    return None


def settle(func, *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` (a window narrowed, see :func:`~zephon_dask.core.window.narrowed`),
    or the :class:`TaskError` of a final error it raises or an input carries."""
    failed = _failed_input(args)
    if failed is not None:
        return failed
    try:
        return narrowed(func(*args, **kwargs))
    except Exception as exc:
        if not is_final(exc) or not _travels(exc):
            raise
        return TaskError(exc, traceback.format_exc())


def _travels(exc: BaseException) -> bool:
    """Whether ``exc`` survives the trip to the training process as a value (a user's exception
    class may not unpickle); one that does not is left to Dask, which reports it as it can."""
    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:
        return False
    return True


def settled(tasks: dict[str, Task], producers: tuple[str, ...] = ()) -> dict[str, Task]:
    """``tasks`` with each task's function run through :func:`settle` (keys and inputs unchanged),
    those under ``producers`` marked data producers (see :func:`~.dask_compat.task`)."""
    return {key: task(key, settle, t.func, *t.args, producer=key in producers, **t.kwargs)
            for key, t in tasks.items()}


def raise_if_failed(value: Any, label: str) -> Any:
    """``value``, unless it is a :class:`TaskError`: then its error is raised (see :meth:`TaskError.reraise`)."""
    if isinstance(value, TaskError):
        value.reraise(label)
    return value
