"""In-process runners (``synchronous``, ``threads``) and the runner factory. Hold state.

Every runner executes the same :class:`~zephon_dask.graph.WindowGraph`;
``synchronous`` computes a window when its result is asked for (debugging,
notebooks), ``threads`` computes submitted windows on a thread pool, and
``distributed`` (see :mod:`.cluster`) runs them on a Dask cluster.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import dask

from ..core.spec import PipelineSpec
from ..core.window import WindowOutput
from ..errors import ClosedError, ConfigError
from ..graph import WindowGraph
from ..log import logger

RUNNERS = ("distributed", "threads", "synchronous")


class WindowHandle:
    """A submitted window: ``result()`` blocks for it, ``release()`` frees it."""

    def __init__(self, graph: WindowGraph, future=None, compute=None):
        self.graph, self._future, self._compute = graph, future, compute

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def result(self) -> WindowOutput:
        try:
            if self._future is None:
                return self._compute()
            return self._future.result()
        except Exception as exc:
            exc.add_note(f"zephon_dask: while computing lane {self.graph.lane}, window {self.graph.window}")
            raise

    def release(self) -> None:
        self._future = self._compute = None


class Runner:
    """Base runner: runs window graphs; ``close()`` frees every resource it started."""

    name = "base"
    dashboard_link: str | None = None

    def __init__(self, spec: PipelineSpec):
        self.spec = spec

    def submit(self, graph: WindowGraph, priority: int) -> WindowHandle:  # pragma: no cover
        raise NotImplementedError

    @property
    def slots(self) -> int:
        """How many windows this runner computes at once."""
        return 1

    def default_prefetch(self) -> int:
        """Windows to keep in flight when ``prefetch_windows`` is not set: two per slot plus
        four, so that while the consumer waits for the window it needs next, every other
        slot still has a window to compute (results are taken in order, computed out of it)."""
        return 2 * self.slots + 4

    def _run_local(self, graph: WindowGraph) -> WindowOutput:
        return dask.get(graph.to_dict(self.spec), graph.key)

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return self.name


class SynchronousRunner(Runner):
    name = "synchronous"

    def submit(self, graph: WindowGraph, priority: int) -> WindowHandle:
        return WindowHandle(graph, compute=lambda: self._run_local(graph))


class ThreadRunner(Runner):
    name = "threads"

    def __init__(self, spec: PipelineSpec, n_workers: int | None = None):
        super().__init__(spec)
        self.n_workers = n_workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(self.n_workers, thread_name_prefix="zephon-window")

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


def session_client():
    """The Dask client this process made current (``Client(...)`` does, unless told
    ``set_as_default=False``), or ``None``. Looks only if ``distributed`` is imported already."""
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        client = default_client()
    except ValueError:  # no default client
        return None
    return client if client.status == "running" else None


def make_runner(spec: PipelineSpec, options: dict) -> Runner:
    """The runner ``options['runner']`` names, started.

    The ``distributed`` runner uses, in this order: ``client=``, ``address=``, the
    session's current Dask client (unless ``session_client=False``), or a new
    embedded ``LocalCluster``.
    """
    name = options["runner"]
    if options.get("client") is not None or options.get("address") is not None:
        name = "distributed"
    elif name == "distributed" and options.get("session_client", True):
        client = session_client()
        if client is not None:
            logger.info("using the session's Dask client (scheduler %s); .options(session_client=False) "
                        "starts an embedded cluster instead", client.scheduler.address)
            options = {**options, "client": client}
    if name == "synchronous":
        return SynchronousRunner(spec)
    if name == "threads":
        return ThreadRunner(spec, options.get("n_workers"))
    if name == "distributed":
        from .cluster import LOCAL_HOST, DistributedRunner
        from .watch import DEFAULT_STALL, DEFAULT_TIMEOUT

        return DistributedRunner(
            spec,
            n_workers=options.get("n_workers"),
            threads_per_worker=options.get("threads_per_worker") or 1,
            client=options.get("client"),
            address=options.get("address"),
            retries=options.get("retries") or 0,
            timeout=options.get("cluster_timeout") or DEFAULT_TIMEOUT,
            stall=options.get("stall_timeout") or DEFAULT_STALL,
            dashboard_address=options.get("dashboard_address", f"{LOCAL_HOST}:0"),
        )
    raise ConfigError(f"runner={name!r} is unknown; choose one of {', '.join(map(repr, RUNNERS))}")
