"""The ``distributed`` runner: windows as Dask tasks on a cluster. Holds the client.

This is the only module that imports ``distributed``. By default it starts an
embedded ``LocalCluster`` (worker processes with one thread each, so a Hugging
Face tokenizer never oversubscribes a core) and closes it on ``close()``; an
existing cluster is reached with ``client=`` or ``address=`` and left running.

The pipeline spec is submitted once as a task (recomputable, unlike scattered data); each window is submitted as chunk tasks
plus a window task (or one fused task) under keys derived from the pipeline
fingerprint, so identical windows submitted by tensor-parallel peers sharing a
cluster are computed once. A worker lost mid-task is recomputed by the
scheduler from the same pure inputs.
"""

from __future__ import annotations

import logging
import os

from distributed import CancelledError, Client, LocalCluster
from distributed.comm import CommClosedError

from ..graph import WindowGraph
from ..graph import keys as graph_keys
from ..pipeline.spec import PipelineSpec
from ..pipeline.window import compute_chunk, compute_window, finish_window
from .runners import Runner, WindowHandle

WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAYON_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


def _spec_value(spec: PipelineSpec) -> PipelineSpec:
    return spec


LOST_RESULT = (CancelledError, CommClosedError, OSError)
RESUBMITS = 3


class DistributedHandle(WindowHandle):
    """A window's futures. A result lost with its worker (a gather that fails or a
    future the scheduler cancels) is resubmitted under the same keys: the
    window is pure, so the recomputation gives the same bytes."""

    def __init__(self, graph: WindowGraph, future, chunk_futures, runner, priority):
        super().__init__(graph, future=future)
        self._chunks, self._runner, self._priority = chunk_futures, runner, priority

    def result(self):
        for _ in range(RESUBMITS):
            try:
                return super().result()
            except LOST_RESULT:
                self.release()
                again = self._runner.submit(self.graph, self._priority)
                self._future, self._chunks = again._future, again._chunks
        return super().result()

    def release(self) -> None:
        fut, chunks = self._future, self._chunks
        self._future, self._chunks = None, []
        for f in [*chunks, fut]:
            if f is not None:
                f.release()


class DistributedRunner(Runner):
    name = "distributed"

    def __init__(self, spec: PipelineSpec, n_workers=None, threads_per_worker=1, client=None,
                 address=None, retries=0):
        super().__init__(spec)
        self.retries = retries
        self._cluster = None
        self._own_client = client is None
        if client is not None:
            self.client = client
        elif address is not None:
            self.client = Client(address, set_as_default=False)
        else:
            self._cluster = LocalCluster(
                n_workers=n_workers or os.cpu_count() or 1,
                threads_per_worker=threads_per_worker,
                processes=True,
                dashboard_address=":0",
                silence_logs=logging.ERROR,
                env=WORKER_ENV,
            )
            self.client = Client(self._cluster, set_as_default=False)
        # A task, not scattered data: if the worker holding it dies, the
        # scheduler recomputes it from the task definition.
        self._spec_future = self.client.submit(_spec_value, spec, key=graph_keys.spec_key(spec.fingerprint),
                                               pure=False, priority=1_000_000)

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:  # a cluster without a dashboard
            return None

    def worker_pids(self) -> dict[str, int]:
        return self.client.run(os.getpid)

    def submit(self, graph: WindowGraph, priority: int) -> WindowHandle:
        c, spec = self.client, self._spec_future
        opts = {"priority": priority, "retries": self.retries, "pure": False}
        if graph.fused:
            fut = c.submit(compute_window, spec, graph.lane, graph.window, key=graph.key, **opts)
            return DistributedHandle(graph, fut, [], self, priority)
        chunks = [
            c.submit(compute_chunk, spec, g, key=k, **opts)
            for k, g in zip(graph.chunk_keys, graph.chunks, strict=True)
        ]
        fut = c.submit(finish_window, spec, graph.lane, graph.window, chunks, key=graph.key, **opts)
        return DistributedHandle(graph, fut, chunks, self, priority)

    def close(self) -> None:
        client, cluster = self.__dict__.pop("client", None), self._cluster
        self._cluster = None
        if client is None:
            return
        try:
            self._spec_future.release()
        except Exception:  # the scheduler may already be gone
            pass
        if self._own_client:
            client.close()
        if cluster is not None:
            cluster.close()

    def describe(self) -> str:
        workers = len(self.client.scheduler_info().get("workers", {}))
        where = "embedded LocalCluster" if self._cluster is not None else self.client.scheduler.address
        return f"distributed ({where}, {workers} workers, dashboard {self.dashboard_link})"
