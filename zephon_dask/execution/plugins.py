"""The embedded cluster's worker and scheduler plugins (registered once its client connects). Each
plugin holds its periodic callback; :class:`TrimFreedMemory` its last trim's time.

Dask's plugin classes are subclassed here, so importing this module imports ``distributed``: the
runner imports it only when its embedded cluster has started (see :mod:`.runner`). It imports
nothing of the runner: what it needs of it (the span its windows are submitted under) is given.
"""

from __future__ import annotations

import logging
import time

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from tornado.ioloop import PeriodicCallback

from . import dask_compat
from .dask_compat import forget_key_names
from .memory import TRIM_EVERY, trim_freed_memory

TRIM_AFTER_TASK_EVERY = 1.0  # seconds: a worker trims when a task ends, at most this often (~1 ms a trim)
SPANS_KEPT = 10  # finished default spans the embedded cluster's scheduler keeps (its latest computations)
SPAN_QUIET_S = 60.0  # seconds a finished span is kept at least: a worker's metrics for it come within a heartbeat


class TrimFreedMemory(WorkerPlugin):
    """A worker plugin of the embedded cluster: :func:`~.memory.trim_freed_memory` each time a task
    ends, between tasks, at most once every ``after_task_every`` seconds (default
    :data:`TRIM_AFTER_TASK_EVERY`; the workers keep
    glibc's default thresholds and one heap, see :data:`~.cluster.EMBEDDED_DEFAULTS`, so what a window's
    arrays freed would otherwise stay in the worker until a later window reuses it), and every
    ``every`` seconds on the worker's event loop, with :func:`~.dask_compat.forget_key_names`. Holds its last
    trim's time."""

    name = "zephon-trim-freed-memory"

    def __init__(self, every: float = TRIM_EVERY, after_task_every: float = TRIM_AFTER_TASK_EVERY):
        self.every, self.after_task_every = every, after_task_every
        self._callback: PeriodicCallback | None = None
        self._trimmed = 0.0

    def setup(self, worker) -> None:
        self._callback = PeriodicCallback(self._trim, self.every * 1000)
        self._callback.start()

    def transition(self, key, start, finish, **kwargs) -> None:
        if start == "executing" and time.monotonic() - self._trimmed >= self.after_task_every:
            self._trimmed = time.monotonic()
            trim_freed_memory()

    def _trim(self) -> None:
        self._trimmed = time.monotonic()
        trim_freed_memory()
        forget_key_names()

    def teardown(self, worker) -> None:
        if self._callback is not None:
            self._callback.stop()


class TrimSchedulerRecords(SchedulerPlugin):
    """A scheduler plugin of the embedded cluster: every ``every`` seconds,
    :func:`~.memory.trim_freed_memory`, :func:`~.dask_compat.forget_key_names` and
    :func:`~.dask_compat.forget_finished_spans` (finished default spans but the last
    :data:`SPANS_KEPT`, forgotten task groups of the runner's span ``span``, repeated collection
    entries)."""

    name = "zephon-trim-scheduler-records"

    def __init__(self, span: tuple[str, ...], every: float = TRIM_EVERY):
        self.span, self.every = span, every
        self._callback: PeriodicCallback | None = None

    async def start(self, scheduler) -> None:
        self._callback = PeriodicCallback(lambda: self.trim(scheduler, self.span), self.every * 1000)
        self._callback.start()

    @staticmethod
    def trim(scheduler, span: tuple[str, ...], keep: int = SPANS_KEPT, quiet: float = SPAN_QUIET_S) -> None:
        trim_freed_memory()
        forget_key_names()
        dask_compat.forget_finished_spans(scheduler, span, keep, quiet)

    async def close(self) -> None:
        if self._callback is not None:
            self._callback.stop()


class QuietClose(WorkerPlugin):
    """A worker plugin of the embedded cluster: once the worker starts closing (its plugins are
    torn down first), its logs have nothing more to say; without this, a heartbeat that meets the
    closing scheduler logs a 30-line "Failed to communicate with scheduler during heartbeat"
    traceback at ERROR. Nothing is asked of the workers when the cluster closes."""

    name = "zephon-quiet-close"

    def teardown(self, worker) -> None:
        for name in ("distributed.worker", "distributed.nanny", "distributed.core", "distributed.comm"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
