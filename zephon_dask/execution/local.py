"""The in-process runners: ``synchronous`` and ``threads``. A ``threads`` runner holds its pool.

``synchronous`` computes a window when its result is asked for (debugging,
notebooks); ``threads`` computes submitted windows on a thread pool of this
process, which ``close()`` shuts down. Both run a window's graph with
:meth:`~zephon_dask.execution.base.Runner._run_local`.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

from ..core.spec import PipelineSpec
from ..errors import ClosedError
from ..graph import WindowGraph
from .base import Runner, WindowHandle


class SynchronousRunner(Runner):
    name = "synchronous"
    computes_in_caller = True

    def submit(self, graph: WindowGraph, priority: int) -> WindowHandle:
        return WindowHandle(graph, compute=lambda: self._run_local(graph))


class ThreadRunner(Runner):
    name = "threads"

    def __init__(self, spec: PipelineSpec, n_workers: int | None = None):
        super().__init__(spec)
        self.n_workers = n_workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(self.n_workers, thread_name_prefix="zephon-window")

    @classmethod
    def from_options(cls, spec: PipelineSpec, options: dict) -> ThreadRunner:
        return cls(spec, options.get("n_workers"))

    @property
    def slots(self) -> int:
        return self.n_workers

    def submit(self, graph: WindowGraph, priority: int) -> WindowHandle:
        try:
            fut: Future = self._pool.submit(self._run_local, graph)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            raise ClosedError("this threads runner is closed; build or reopen the pipeline to compute "
                              "more windows") from None
        return WindowHandle(graph, future=fut)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> str:
        return f"threads ({self.n_workers} threads)"
