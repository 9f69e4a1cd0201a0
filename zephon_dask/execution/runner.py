"""The ``distributed`` runner: windows as Dask tasks on a cluster. Holds the client.

By default the runner starts an embedded cluster (:mod:`.cluster`), computing the first
windows in this process meanwhile (:mod:`.head_start`), fetches windows straight from the
workers and closes the cluster on ``close()``; an existing cluster is reached with ``client=``
or ``address=`` and left running. Its settings are one :class:`ClusterSettings`, read from the
pipeline's options once. A window's tasks are a :class:`~.handle.DistributedHandle`.

The pipeline spec is submitted once as a task (recomputable, unlike scattered
data); each window is submitted as its :class:`~zephon_dask.graph.WindowGraph`'s
tasks (one ``Client.get``), which refer to the spec's future, under keys
derived from the pipeline fingerprint, so identical windows submitted by
tensor-parallel peers sharing a cluster are computed once. A worker lost
mid-task is recomputed by the scheduler from the same pure inputs.

A scheduler lost is waited for and reconnected to (:mod:`.reconnect`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dask

from ..core.spec import PipelineSpec
from ..errors import ClosedError, ClusterError
from ..graph import GroupGraph, WindowGraph, group_graph
from ..graph import keys as graph_keys
from . import dask_compat
from .base import GroupResult, MemberHandle, Runner, WindowHandle
from .cluster import (
    LOCAL_HOST,
    OPEN_RUNNERS,
    close_client,
    close_cluster,
    embedded_config,
    local_cluster,
    logger,
    open_client,
    use_distributed,
)
from .handle import SILENT_AFTER, DistributedHandle
from .head_start import Boot, HeadStart
from .reconnect import Reconnecting, close_lost
from .task_errors import settled
from .watch import DEFAULT_STALL, DEFAULT_TIMEOUT, PROBE_TIMEOUT, ClusterWatch

if TYPE_CHECKING:
    from distributed import Client, SpecCluster



@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """The ``distributed`` runner's settings, each field the option of the same name (see
    ``zephon_dask.options``); built once, by :meth:`from_options`. ``client`` or ``address``: a
    cluster to use (left running); neither: an embedded one of ``n_workers`` (default: one per
    core) with ``threads_per_worker`` threads each. ``dashboard_address`` ``None``: no dashboard."""

    n_workers: int | None = None
    threads_per_worker: int = 1
    client: Any = None
    address: str | None = None
    retries: int = 0
    cluster_timeout: float = DEFAULT_TIMEOUT
    stall_timeout: float = DEFAULT_STALL
    dashboard_address: str | None = f"{LOCAL_HOST}:0"
    head_start: bool = True

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ClusterSettings:
        """The fields ``options`` names; a missing option, or one set to ``None``, takes the field's
        default, except ``dashboard_address`` (``None``: no dashboard)."""
        given = {f.name: options[f.name] for f in dataclasses.fields(cls) if f.name in options}
        keep_none = {"dashboard_address"}
        return cls(**{name: value for name, value in given.items() if value is not None or name in keep_none})

SPAN_NAME = ("zephon-dask",)  # the span every window of a runner is submitted under, one id a client


def _outcome_retrieved(task: asyncio.Future) -> None:
    """Mark a task's error as seen (asyncio logs an error no one retrieved when the task is freed)."""
    if not task.cancelled():
        task.exception()



def _spec_value(spec: PipelineSpec) -> PipelineSpec:
    return spec


# CPU seconds of Dask's control plane per task (client, scheduler, workers' event loops: ~8 messages
# and a graph unpickle), measured by benchmarks/bench_scale.py with one window per task: 6-8 ms
TASK_CPU = 0.006
EARLY_FETCHES = 2  # results fetched ahead of the consumer at once (a client gathers 5 at once in all)


class DistributedRunner(Reconnecting, Runner):
    name = "distributed"
    has_dashboard = True
    task_cpu = TASK_CPU

    def __init__(self, spec: PipelineSpec, settings: ClusterSettings | None = None):
        super().__init__(spec)
        self.settings = settings = settings if settings is not None else ClusterSettings()
        self.retries, self.stall = settings.retries, settings.stall_timeout
        client, address, timeout = settings.client, settings.address, settings.cluster_timeout
        self._cluster: SpecCluster | None = None
        self._client: Any = None  # the Client, once connected
        self._spec_future: Any = None
        self._head: HeadStart | None = None  # until the embedded cluster takes the windows
        self._boot: Boot | None = None  # the embedded cluster's start, with head_start
        self._adopt = threading.Lock()  # a cluster started late is closed, not kept, once close() gave up on it
        self._abandoned = False
        self._own_client = client is None
        self._own_cluster = client is None and address is None
        self._live_only: tuple[list[str], float] | None = None  # (the responsive workers, until) while some are silent
        self.computed_here: list[tuple[int, int]] = []  # (lane, window) computed in this process (head start)
        self._in_flight: weakref.WeakSet[DistributedHandle] = weakref.WeakSet()  # handles not released
        self._in_flight_lock = threading.Lock()  # handles are made on the consumer's and the start's threads
        self._early_slots: asyncio.Semaphore | None = None  # EARLY_FETCHES, on the client's event loop
        self.fetch_ahead = True  # fetch each window as soon as it is computed (see DistributedHandle)
        self.init_reconnect()
        OPEN_RUNNERS.add(self)
        if not self._own_cluster:
            if client is None:
                assert address is not None
                client = open_client(address, timeout)
                logger.info("connected to the Dask scheduler at %s", address,
                            extra={"dashboard": self.dashboard_link})
            self._connect(client, address, timeout)
            return
        n_workers = settings.n_workers or os.cpu_count() or 1
        self._planned_slots = n_workers * settings.threads_per_worker

        def start() -> None:  # with a head start: once its first window is done (HeadStart.due)
            closed = ClosedError("this distributed runner was closed before its embedded cluster started")
            if self._abandoned:  # closed before the cluster was needed: start nothing
                raise closed
            use_distributed()
            if self._abandoned:  # closed while distributed was imported (a short run exiting): nor then
                raise closed
            self._start_embedded(n_workers)

        if not settings.head_start:
            start()
            return
        threads = min(self._planned_slots, os.cpu_count() or 1)
        self._head = HeadStart(spec, threads, settings.retries > 0, self.computed_here, settings.stall_timeout)
        self._boot = self._head.boot = Boot(start, timeout, self._head.due)

    def _start_embedded(self, n_workers: int) -> None:
        """Start the embedded cluster of ``n_workers`` and connect to it; then the head start's queue goes to it. A
        runner closed meanwhile gets nothing: what this start made is closed here (in the
        background, for a start on its own thread)."""
        try:
            settings, timeout = self.settings, self.settings.cluster_timeout
            cluster = local_cluster(n_workers, settings.threads_per_worker,
                                    dashboard_address=settings.dashboard_address, timeout=timeout)
            with self._adopt:
                if not self._abandoned:
                    self._cluster = cluster
            if self._abandoned:
                close_cluster(cluster)
                raise ClosedError("this distributed runner was closed while its embedded cluster started")
            from distributed import Client

            from .plugins import QuietClose, TrimFreedMemory, TrimSchedulerRecords

            with dask.config.set(embedded_config()):  # the client's own message log is bounded too
                client = Client(cluster, set_as_default=False, direct_to_workers=True)
            with self._adopt:
                if not self._abandoned:
                    self._connect(client, None, timeout)
            if self._abandoned:  # close() took the cluster, or will: the client is this start's to close
                close_client(client)
                raise ClosedError("this distributed runner was closed while its embedded cluster started")
            client.register_plugin(TrimFreedMemory(), name=TrimFreedMemory.name)
            client.register_plugin(TrimSchedulerRecords(SPAN_NAME), name=TrimSchedulerRecords.name)
            client.register_plugin(QuietClose(), name=QuietClose.name)
            logger.info("started an embedded cluster: %d worker(s), dashboard %s",
                        len(cluster.workers), self.dashboard_link, extra={"dashboard": self.dashboard_link})
        except BaseException as exc:
            if self._head is not None:
                self._head.fail(exc)
            raise
        head = self._head
        if head is not None:
            head.hand_over(self.submit_remote)
            self._head = None  # windows go to the cluster from now on

    def _connect(self, client: Client, address: str | None, timeout: float) -> None:
        use_distributed()
        self._client = client
        self.watch = ClusterWatch(client, timeout, address)
        # A task, not scattered data: if the worker holding it dies, the
        # scheduler recomputes it from the task definition.
        self._span_id = f"zephon-dask-{client.id}"
        self._submit_spec(client)

    def _submit_spec(self, client: Client) -> None:
        with dask_compat.fixed_span(SPAN_NAME, self._span_id):
            self._spec_future = client.submit(_spec_value, self.spec, key=graph_keys.spec_key(self.spec.fingerprint),
                                              pure=False, priority=1_000_000)

    def first_batch_taken(self) -> None:
        head = self._head
        if head is not None:
            head.first_batch_taken()

    @property
    def starting(self) -> bool:
        """Whether the embedded cluster is still starting (then :attr:`client` would wait)."""
        return self._boot is not None and not self._boot.done()

    @property
    def client(self) -> Any:
        """The cluster's client (once the embedded cluster has started: a bounded wait)."""
        if self._boot is not None:
            self._boot.wait()
        if self._client is None:
            raise ClosedError("this distributed runner is closed; build or reopen the pipeline to compute more windows")
        return self._client

    @classmethod
    def from_options(cls, spec: PipelineSpec, options: dict) -> DistributedRunner:
        """Started from the options :class:`ClusterSettings` names."""
        return cls(spec, ClusterSettings.from_options(options))

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's address; ``None`` without one, or while the embedded cluster starts
        (never waits for it)."""
        try:
            return self._client.dashboard_link if self._client is not None else None
        except Exception:  # a cluster without a dashboard
            return None

    def _identity(self, n_workers: int) -> dict:
        """The scheduler's identity (``n_workers`` workers listed), or a :class:`ClusterError` within
        :data:`PROBE_TIMEOUT` seconds."""
        client = self.client
        self.watch.check()
        try:
            return dask_compat.identity(client, n_workers, PROBE_TIMEOUT)
        except Exception as exc:
            raise ClusterError(f"the Dask scheduler at {self.watch.address} did not answer within "
                               f"{PROBE_TIMEOUT:g} s ({exc!r}); check the cluster") from None

    def track(self, handle: DistributedHandle, in_flight: bool = True) -> None:
        """Count ``handle`` among the windows in flight (:meth:`placement`), or no more."""
        with self._in_flight_lock:
            if in_flight:
                self._in_flight.add(handle)
            else:
                self._in_flight.discard(handle)

    def placement(self) -> tuple[dict[DistributedHandle, list[str]], list[str], list[str]]:
        """``(workers computing or holding each handle in flight's keys, responsive workers,
        silent workers)`` (see :meth:`_heartbeats`). Empty if the scheduler does not answer."""
        with self._in_flight_lock:
            handles = list(self._in_flight)
        keys = sorted(set().union(*(h.keys for h in handles)))
        try:
            live, silent = self._heartbeats()
            queues = dask_compat.processing(self.client, PROBE_TIMEOUT)
            holders = dask_compat.who_has(self.client, keys, PROBE_TIMEOUT)
        except Exception:  # reporting is best effort; the wait's own checks raise what matters
            return {}, [], []
        where: dict[str, set[str]] = {}
        for worker, queued in queues.items():
            for key in map(str, queued):
                where.setdefault(key, set()).add(worker)
        for key, workers in holders.items():
            where.setdefault(str(key), set()).update(workers)
        placement = {h: sorted(set().union(*(where.get(k, set()) for k in h.keys))) for h in handles}
        return placement, live, silent

    def _heartbeats(self) -> tuple[list[str], list[str]]:
        """``(responsive workers, silent workers)`` from the scheduler's last heartbeats (a worker
        is silent :data:`SILENT_AFTER` seconds behind the newest); while some are silent and others
        not, new windows go to the responsive ones, asked again ``stall`` seconds later."""
        seen = {w: info.get("last_seen", 0.0) for w, info in self._identity(-1).get("workers", {}).items()}
        newest = max(seen.values(), default=0.0)
        silent = sorted(w for w, t in seen.items() if newest - t > SILENT_AFTER)
        live = sorted(set(seen) - set(silent))
        self._live_only = (live, time.monotonic() + self.stall) if silent and live else None
        return live, silent

    def _responsive_only(self) -> list[str] | None:
        """The responsive workers while some are silent (see :meth:`_heartbeats`), else ``None``."""
        if self._live_only is not None and time.monotonic() >= self._live_only[1]:
            try:
                self._heartbeats()
            except ClusterError:  # no answer: keep avoiding the silent ones
                pass
        return self._live_only[0] if self._live_only is not None else None

    def fetch_early(self, handle: DistributedHandle, future) -> concurrent.futures.Future | None:
        """Fetch ``future``'s result as soon as it is computed and hand it to ``handle``
        (:meth:`~.handle.DistributedHandle.fetched_early`), at most :data:`EARLY_FETCHES` at once, so a
        worker that stops answering ties up only those of the client's gathers. Runs on the
        client's event loop until the future ends or the handle cancels it; its errors are left to
        the consumer's own wait and fetch (which waits for this one once it gathers)."""
        client = self._client
        if client is None:
            return None

        from distributed import CancelledError

        async def fetch() -> list:
            await dask_compat.until_done([future])  # a result lost with its worker is waited for again
            if self._early_slots is None:
                self._early_slots = asyncio.Semaphore(EARLY_FETCHES)
            async with self._early_slots:
                if future.status != "finished" or not handle.gathering(future):
                    raise CancelledError(future.key)
                # shielded: a client merges concurrent gathers, and cancelling one would cancel them all;
                # its outcome is retrieved even when no one awaits it any more (a stream closed meanwhile)
                gather = asyncio.ensure_future(client.gather([future], asynchronous=True))
                gather.add_done_callback(_outcome_retrieved)
                values = await asyncio.shield(gather)
            handle.fetched_early(future, values[0])
            return values

        try:
            return asyncio.run_coroutine_threadsafe(fetch(), client.loop.asyncio_loop)
        except RuntimeError:  # the client's loop closed meanwhile: the consumer's own wait says so
            return None

    def rescue(self, stalled: set[str], placement: dict[DistributedHandle, list[str]], live: list[str]) -> None:
        """Compute again, at once, on the ``live`` workers, every window in flight that a
        ``stalled`` worker computes or holds (``placement``, from :meth:`placement`) and that has
        no copy yet: a frozen worker then costs one ``stall_timeout``, not one per window on it."""
        others = sorted(set(live) - stalled)
        if not others:
            return
        rescued = [h for h, workers in placement.items() if set(workers) & stalled and not h.copied]
        for handle in rescued:
            handle.stop_early()  # a fetch from a stalled worker would only hold a gather
            handle.copy_on(others, stalled=set(placement[handle]) <= stalled)
        if rescued:
            logger.warning("zephon_dask: worker(s) %s stalled (no heartbeat for over %g s): computing again on "
                           "%s the %d task(s) in flight there: %s", ", ".join(sorted(stalled)), SILENT_AFTER,
                           ", ".join(others), len(rescued), "; ".join(h.graph.label for h in rescued))

    @property
    def shared(self) -> bool:
        """A cluster this runner did not start (``client=``, ``address=``, the session's client)
        may serve other ranks' pipelines too."""
        return not self._own_cluster

    def agree(self, name: str, value: int) -> int:
        """On a cluster this runner did not start, the value the first consumer to ask under
        ``name`` for this spec stored on the scheduler (``value`` if none did); ``value`` itself
        if the scheduler does not answer within :data:`PROBE_TIMEOUT` seconds or refuses (a
        cluster without ``run_on_scheduler``): disagreeing peers then compute some windows
        twice, never different bytes."""
        if not self.shared:
            return value
        key = f"zephon-{name}-{self.spec.fingerprint[:16]}"
        try:
            return int(dask_compat.first_value(self.client, key, value, PROBE_TIMEOUT))
        except Exception as exc:
            logger.info("zephon_dask: the scheduler did not keep %s (%r); using this process's %s", key, exc, value)
            return value

    @property
    def slots(self) -> int:
        """Worker threads on the cluster now (at least 1: an adaptive cluster may be empty); the
        embedded cluster's planned threads while it starts."""
        if self._boot is not None and not self._boot.done():
            return self._planned_slots
        return max(1, int(self._identity(0).get("total_threads") or 0))

    def worker_pids(self) -> dict[str, int]:
        return self.client.run(os.getpid)

    def submit(self, graph: WindowGraph, priority: int) -> WindowHandle:
        head = self._head
        if head is not None:
            handle = head.offer(graph, priority)
            if handle is not None:  # the embedded cluster is still starting
                return handle
            assert self._boot is not None
            self._boot.wait()  # raises the start's error
        return self.submit_remote(graph, priority)

    def submit_group(self, graphs: list[WindowGraph], priority: int, stall_windows: int | None = None) -> list[WindowHandle]:
        """Several fused windows as one task (:func:`~zephon_dask.graph.group_graph`), a
        :class:`~.base.MemberHandle` per window; while the head start takes windows, each on its own.
        The task is reported stalled after ``stall_windows`` (default: one per window) times
        ``stall_timeout``."""
        if self._head is not None or len(graphs) == 1:
            return super().submit_group(graphs, priority)
        task = self.submit_remote(group_graph(self.spec, graphs), priority, stall_windows=stall_windows)
        shared = GroupResult(task, len(graphs))
        return [MemberHandle(g, shared, i) for i, g in enumerate(graphs)]

    def submit_remote(self, graph: WindowGraph | GroupGraph, priority: int, early: bool = True,
                      stall_windows: int | None = None) -> DistributedHandle:
        """Submit ``graph`` to the cluster (never to the head start); ``early``: fetch its result
        as soon as it is computed (with :attr:`fetch_ahead`)."""
        return DistributedHandle(graph, self.submit_futures(graph, priority), self, priority,
                                 early and self.fetch_ahead, stall_windows)

    def submit_futures(self, graph: WindowGraph | GroupGraph, priority: int) -> list:
        """Submit ``graph`` to the cluster: the futures of its task keys (see :meth:`submit_tasks`);
        after a lost scheduler, the spec and the windows in flight go first (:meth:`recover`)."""
        self.recover()
        live_only = self._responsive_only()
        if live_only:  # while a worker is silent: avoid it, and do not fetch the spec from it
            return self.submit_tasks(graph, self.spec, priority, self.retries,
                                     workers=live_only, allow_other_workers=False)
        return self.submit_tasks(graph, self._spec_future, priority, self.retries)

    def submit_tasks(self, graph: WindowGraph | GroupGraph, spec, priority: int, retries: int | None, **where) -> list:
        """Submit ``graph.tasks_for(spec)`` as one graph; the futures of ``graph.task_keys``.
        ``where``: ``workers=`` / ``allow_other_workers=`` for every task."""
        c = self._client
        if c is None:
            raise ClosedError("this distributed runner is closed; build or reopen the pipeline to compute more windows")
        # Named by its window key (dask_compat.submit_graph: not tokenized on this thread).
        # Each task returns a final error as its value (task_errors): never retried nor logged there.
        # fifo_timeout as in Client.submit: among equal priorities, the graph submitted first runs first.
        # Every window goes to this runner's one span (annotations are context-local), so the
        # per-span records of workers and scheduler stay one entry per task group, however long
        # the run.
        try:
            with dask_compat.fixed_span(SPAN_NAME, self._span_id):
                return dask_compat.submit_graph(c, settled(graph.tasks_for(spec), graph.producer_keys), graph.task_keys,
                                                graph.key, priority=priority, retries=retries,
                                                fifo_timeout="100 ms", **where)
        except Exception:
            self.watch.check_open()  # a client closed meanwhile (windows fetched ahead come first): say so
            raise

    def close(self) -> None:
        """Stop using the cluster, each step bounded (:data:`~.cluster.CLOSE_S`): a start still in progress is
        not waited for (it closes what it started when it ends, on its own thread); an embedded
        cluster is closed, a client this runner opened too. During interpreter shutdown, when
        Dask's event loop no longer runs, nothing is waited for (:func:`~.cluster.close_open_runners` closed
        the runner at exit already)."""
        OPEN_RUNNERS.discard(self)
        head = self._head
        if head is not None:
            head.close()
        with self._adopt:
            self._abandoned = True
            client, cluster = self._client, self._cluster
            self._client = self._cluster = None
        if self._boot is not None:
            self._boot.begin()  # a start not yet begun ends at once, starting nothing
        if sys.is_finalizing():
            return
        if client is not None:
            try:
                self._spec_future.release()
            except Exception:  # the scheduler may already be gone
                pass
            if self._own_client:
                close_lost(client)
        if cluster is not None:
            close_cluster(cluster)

    def describe(self) -> str:
        """What runs the windows; never waits for a start in progress, asks a running scheduler
        for its workers (at most :data:`PROBE_TIMEOUT` seconds)."""
        if self.starting:
            return (f"distributed (embedded cluster starting, {self._planned_slots} worker threads; "
                    "the first windows computed in this process meanwhile)")
        if self._abandoned:
            return "distributed (closed)"
        if self._client is None:
            return f"distributed (the embedded cluster did not start: {self._boot.error if self._boot else None})"
        where = "embedded cluster" if self._own_cluster else self.watch.address
        if (lost := self.lost_for) is not None:
            here = "; the windows needed computed in this process meanwhile" if self.settings.head_start else ""
            return f"distributed ({where}, its scheduler lost {lost:.0f} s ago, reconnecting{here})"
        try:
            workers = f"{self._identity(0).get('n_workers', 0)} workers"
        except ClusterError:
            workers = "not answering"
        return f"distributed ({where}, {workers}, dashboard {self.dashboard_link})"


