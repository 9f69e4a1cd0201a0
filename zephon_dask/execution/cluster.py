"""The ``distributed`` runner: windows as Dask tasks on a cluster. Holds the client.

This module starts and talks to clusters (:mod:`.watch` waits on them, :mod:`.spawned`
starts the embedded one's processes, :mod:`.plugins` trims its workers and scheduler); it
imports ``distributed`` only on a path to a client or a cluster (:func:`use_distributed`),
never before the head start's first window. By default the runner
starts an embedded cluster (worker processes with one thread each, so a
Hugging Face tokenizer never oversubscribes a core; its scheduler in a process
of its own, it and the workers forked from one host process, see :mod:`.spawned`), fetches windows straight from the workers
and closes it on ``close()``; an existing cluster is reached with ``client=`` or ``address=``
and left running. :func:`connect` and :func:`each_completed` do the same for
jobs other than the pipeline (``prepare_tokens``).

The pipeline spec is submitted once as a task (recomputable, unlike scattered
data); each window is submitted as its :class:`~zephon_dask.graph.WindowGraph`'s
tasks (one ``Client.get``), which refer to the spec's future, under keys
derived from the pipeline fingerprint, so identical windows submitted by
tensor-parallel peers sharing a cluster are computed once. A worker lost
mid-task is recomputed by the scheduler from the same pure inputs. Runners not
closed when the interpreter exits are closed then (:func:`close_open_runners`):
module state, :data:`OPEN_RUNNERS`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import dask

from ..core.spec import PipelineSpec
from ..errors import ClosedError, ClusterError
from ..graph import GroupGraph, WindowGraph, group_graph
from ..graph import keys as graph_keys
from . import dask_compat
from .base import GroupResult, MemberHandle, Runner, WindowHandle
from .head_start import Boot, HeadStart
from .task_errors import raise_if_failed, settled
from .watch import (
    DEFAULT_STALL,
    DEFAULT_TIMEOUT,
    NOT_FETCHED,
    PROBE_TIMEOUT,
    ClusterWatch,
    probe_address,
)

if TYPE_CHECKING:
    from distributed import Client, SpecCluster

logger = logging.getLogger(__name__)
LOCAL_HOST = "127.0.0.1"

WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAYON_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


# The embedded cluster shares the training machine's cores, so Dask's housekeeping is paid in
# training throughput. Idle, a 2-worker cluster with Dask's defaults used ~0.16 of a core
# (event-loop ticks 50 times a second in every server, 100 profile samples a second in every
# worker, memory checks 10 times a second); with these, ~0.03. A profile sample is taken on the
# worker's event loop, which must win the GIL from the task thread and walk its stack: at 10 a
# second they cost a busy worker's event loop 1-3 ms per prose window (a tenth to a quarter,
# benchmarks/bench_task_cpu.py); at one a second the dashboard's profile still fills.
# MALLOC_TRIM_THRESHOLD_=65536, which Dask exports to its workers, also fixes glibc's mmap
# threshold at 128 KiB, so every window-sized array and tokenizer buffer was a fresh mmap:
# tokenize + pack ran ~20% slower in a worker than in a plain process; workers we start keep
# glibc's default thresholds. Anything the user set in their Dask config (or exported, for
# MALLOC_TRIM_THRESHOLD_ and MALLOC_ARENA_MAX) wins.
# Dask's bounded logs are sized for short jobs: a worker keeps low-level-log-length (1,000) of its
# one-second profile cycles twice (the call tree, and per task prefix), 24-32 KB a second in the
# soak benchmark, so a streaming worker grew by 24-32 MB over its first 17 minutes; at 300 they
# hold the last 5 minutes (the dashboard's profile page) and are full by then, as are the other
# developer logs (transitions, transfers, messages, events: most within a minute or two; each
# holds under 0.3 MB).
# The system monitor keeps 300 samples (10 minutes at 2 s, under 0.1 MB) instead of 7,200 (4 h).
# MALLOC_ARENA_MAX=1: a worker's threads (event loop, task thread, offload thread, ...) share glibc's
# main heap instead of one heap each; malloc_trim gives back the free pages inside every heap but
# the top of the main one only, so with one heap the worker's periodic trim (TrimFreedMemory)
# reaches all of its free memory. A worker runs one task thread, so there is little to contend for.
EMBEDDED_DEFAULTS = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.nanny.pre-spawn-environ.MALLOC_ARENA_MAX": "1",
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.profile.interval": "1s",  # the dashboard's profile still fills
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.admin.low-level-log-length": 300,  # 5 minutes of profile history
    "distributed.admin.system-monitor.log-length": 300,
    "distributed.diagnostics.computations.max-history": 10,  # one per idle spell (every few s)
}


def embedded_config() -> dict[str, Any]:
    """:data:`EMBEDDED_DEFAULTS`, less every key the user's Dask config has changed from Dask's default."""
    dask_defaults = dask.config.merge(*dask.config.defaults)
    return {key: value for key, value in EMBEDDED_DEFAULTS.items()
            if dask.config.get(key, None) == dask.config.get(key, None, config=dask_defaults)}


_DISTRIBUTED_LOCK = threading.Lock()
_distributed_ready = False  # use_distributed() ran


def use_distributed() -> None:
    """Import ``distributed`` (~0.4 s of CPU, more under load), give it a generator of its own
    (:func:`~.dask_compat.isolate_jitter`) and run :func:`close_open_runners` at exit before the
    exit handlers ``distributed`` registers on import; once per process. Every path to a client or
    a cluster calls it first; the embedded cluster's head start does not, so the first batch never
    waits for it (the cluster's start does, on its own thread)."""
    global _distributed_ready
    with _DISTRIBUTED_LOCK:
        if _distributed_ready:
            return
        import distributed  # noqa: F401

        dask_compat.isolate_jitter()
        atexit.unregister(close_open_runners)  # registered again: after Dask's, so it runs before them
        atexit.register(close_open_runners)
        _distributed_ready = True


def local_cluster(n_workers: int | None, threads_per_worker: int = 1, processes: bool = True,
                  dashboard_address: str | None = f"{LOCAL_HOST}:0", timeout: float = DEFAULT_TIMEOUT) -> SpecCluster:
    """The embedded cluster: ``n_workers`` (default: one per core) with quiet logs and
    :func:`embedded_config`. With ``processes``, the scheduler and the workers run in processes
    forked from one host (:mod:`.spawned`, ``timeout`` seconds for the scheduler to start), the
    workers with :data:`WORKER_ENV`, none importing the training script; otherwise a ``LocalCluster`` of threads of
    this process (sharing its env). The scheduler, the workers and the dashboard (``dashboard_address``; ``None``: no dashboard)
    listen on 127.0.0.1 only, unless ``dashboard_address`` names another interface."""
    use_distributed()
    from distributed import LocalCluster

    from .spawned import spawned_cluster

    n = n_workers or os.cpu_count() or 1
    with dask.config.set(embedded_config()):
        if not processes:  # threads talk in-process
            return LocalCluster(n_workers=n, threads_per_worker=threads_per_worker, processes=False,
                                dashboard_address=dashboard_address, silence_logs=logging.ERROR)
        return spawned_cluster(n, threads_per_worker, LOCAL_HOST, dashboard_address, WORKER_ENV, timeout)


SPAN_NAME = ("zephon-dask",)  # the span every window of a runner is submitted under, one id a client


def _outcome_retrieved(task: asyncio.Future) -> None:
    """Mark a task's error as seen (asyncio logs an error no one retrieved when the task is freed)."""
    if not task.cancelled():
        task.exception()


def open_client(address: str, timeout: float = DEFAULT_TIMEOUT) -> Client:
    """A client of the scheduler at ``address``: a closed port fails within seconds, a scheduler
    that does not answer within ``timeout`` seconds fails then (both :class:`ClusterError`)."""
    probe_address(address)
    use_distributed()
    from distributed import Client

    try:
        return Client(address, set_as_default=False, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        raise ClusterError(f"could not connect to the Dask scheduler at {address!r} within {timeout:g} s "
                           f"({exc}); check that a scheduler runs there") from None


def _spec_value(spec: PipelineSpec) -> PipelineSpec:
    return spec


def embedded_pids(cluster: SpecCluster) -> list[int]:
    """The processes of the embedded ``cluster`` still running: its scheduler's and its host's
    (:mod:`.spawned`) and its workers' (one per nanny)."""
    from .spawned import SchedulerProcess

    scheduler = cluster.scheduler
    pids = scheduler.pids() if isinstance(scheduler, SchedulerProcess) else []
    return pids + [nanny.pid for nanny in list(cluster.workers.values()) if getattr(nanny, "pid", None)]


def lost_result() -> tuple[type[BaseException], ...]:
    """The errors of a gather whose result was lost with its worker (computed again)."""
    from distributed import CancelledError
    from distributed.comm import CommClosedError

    return CancelledError, CommClosedError, OSError


RESUBMITS = 3
SILENT_AFTER = 3.0  # seconds without a heartbeat (at least) before a worker counts as frozen
# CPU seconds of Dask's control plane per task (client, scheduler, workers' event loops: ~8 messages
# and a graph unpickle), measured by benchmarks/bench_scale.py with one window per task: 6-8 ms
TASK_CPU = 0.006
EARLY_FETCHES = 2  # results fetched ahead of the consumer at once (a client gathers 5 at once in all)


class DistributedHandle(WindowHandle):
    """A window's futures (one per task key of its graph), or those of a task computing several
    windows (a :class:`~zephon_dask.graph.GroupGraph`, one task), waited on and fetched through
    the runner's :class:`ClusterWatch`; messages name every window of the task. Tracked by the
    runner (:meth:`~DistributedRunner.track`) until released.

    A result lost with its worker (a gather that fails or a future the scheduler
    cancels) is resubmitted under the same keys: the window is pure, so the
    recomputation gives the same bytes. A window still computing (or not fetched)
    after the runner's ``stall`` seconds (a task of n windows: n times that) is
    logged with the workers computing or holding it, and (if a worker holds it and
    others exist) its :meth:`~zephon_dask.graph.WindowGraph.fused_copy` is
    submitted to the other workers, carrying the spec by value; the first of the two
    to finish is used (the same bytes either way). A worker among those that is
    also silent (no heartbeat for :data:`SILENT_AFTER` seconds) is stalled: every
    window in flight on it is copied at once (:meth:`DistributedRunner.rescue`),
    and none is fetched from it.

    A task's final error (:mod:`.task_errors`: the library's own data or
    configuration errors) comes back as its value and is raised here.

    Its result is fetched as soon as it is computed, ahead of the consumer
    (:meth:`DistributedRunner.fetch_early`), and the cluster's copy is released
    then: the windows computed ahead wait in the training process, so a worker
    holds a result only while it is sent, and the consumer finds the next window
    here instead of fetching it between two batches. A window the consumer asks
    for before its early fetch ended is waited for and fetched as above."""

    def __init__(self, graph: WindowGraph | GroupGraph, futures, runner, priority, early: bool = True,
                 stall_windows: int | None = None):
        super().__init__(graph, future=futures[-1])
        self._chunks, self._runner, self._priority = futures[:-1], runner, priority
        # stall_timeout is per window: a task of several windows may compute as many times longer,
        # or as many as the submitter says (small windows grouped automatically: one)
        if stall_windows is None:
            stall_windows = len(graph.windows) if isinstance(graph, GroupGraph) else 1
        self._stall = runner.stall * stall_windows
        self._copy, self._copies = None, 0
        self._copy_on: list[str] = []  # the workers the copy may run on
        self._stuck: set[str] = set()  # keys not to fetch: held by a stalled worker, or not fetched in time
        runner.track(self)
        # the early fetch (set on the client's event loop) and whether the consumer took over
        self._early_lock = threading.Lock()
        self._early_value: Any = NOT_FETCHED
        self._claimed = self._early_gathering = False
        self._early = runner.fetch_early(self, self._future) if early else None

    def gathering(self, future) -> bool:
        """Whether the early fetch of ``future`` may go on to gather it (the consumer has not taken
        the window over); from then on the consumer waits for that fetch instead of cancelling it
        (called on the client's event loop)."""
        with self._early_lock:
            if self._claimed or future is not self._future:
                return False
            self._early_gathering = True
            return True

    def fetched_early(self, future, value) -> None:
        """Keep ``value``, ``future``'s result fetched ahead of the consumer, and release the
        cluster's copy of it, unless the consumer took over the window meanwhile (called on the
        client's event loop)."""
        with self._early_lock:
            if self._claimed or future is not self._future:
                return
            self._early_value = value
            for f in [*self._chunks, future]:
                f.release()

    def stop_early(self) -> None:
        """Cancel an early fetch still waiting for its result (the worker computing it stalled); a
        fetch under way or a result already fetched stays."""
        with self._early_lock:
            if self._early_value is not NOT_FETCHED or self._early_gathering:
                return
            self._claimed = True
            early, self._early = self._early, None
        if early is not None:
            early.cancel()

    def _claim(self) -> tuple[Any, concurrent.futures.Future | None]:
        """``(the result fetched early or NOT_FETCHED, the early fetch under way or None)``; an early
        fetch still waiting for its result is cancelled: the consumer waits and fetches from here on."""
        with self._early_lock:
            self._claimed = True
            value, self._early_value = self._early_value, NOT_FETCHED
            early, self._early = self._early, None
            gathering = self._early_gathering
        if early is not None and value is NOT_FETCHED and not gathering:
            early.cancel()
            early = None
        return value, early if value is NOT_FETCHED else None

    def chunks_done(self) -> int:
        """A split window's chunk tasks finished so far (all once the window is done)."""
        if self.done():
            return super().chunks_done()
        return sum(1 for f in self._chunks if f.done())

    @property
    def keys(self) -> set[str]:
        """The keys of the window's tasks (not its copy's)."""
        return {f.key for f in [self._future, *self._chunks] if f is not None}

    @property
    def stall_after(self) -> float:
        """Seconds the task may compute (or its result be fetched) before it is reported stalled."""
        return self._stall

    @property
    def copied(self) -> bool:
        return self._copy is not None

    @property
    def fetched(self) -> bool:
        """Whether the result was fetched ahead of the consumer (it is in this process, and the
        cluster's copy released)."""
        return self._early_value is not NOT_FETCHED

    @property
    def held(self):
        """The result fetched ahead and held here (``None`` before it is, or once taken; a task of
        several windows: all of them)."""
        value = self._early_value
        return None if value is NOT_FETCHED else value

    def result(self):
        value, early = self._claim()
        if value is not NOT_FETCHED:
            return raise_if_failed(value, self.graph.label)
        runner, resubmits = self._runner, 0
        started = reported = time.monotonic()
        while True:
            live = [f for f in (self._future, self._copy) if f is not None and f.key not in self._stuck]
            try:
                done = runner.watch.wait(live or [self._future])
            except ClusterError as exc:
                exc.add_note(f"zephon_dask: while waiting for {self.graph.label}")
                raise
            if done is None:
                if time.monotonic() - reported >= self._stall:
                    reported = time.monotonic()
                    self._stalled(reported - started)
                continue
            finished = done.status == "finished"
            fetching, early = (early if done is self._future else None), None  # the early fetch under way, once
            try:
                value = runner.watch.fetch(done, self._stall, fetching) if finished else done.result()
            except ClusterError as exc:  # the cluster failed while the result was fetched
                exc.add_note(f"zephon_dask: while waiting for {self.graph.label}")
                raise
            except RuntimeError as exc:  # "IOLoop is closed" when the client closed meanwhile; else the task's own
                runner.watch.check_open()
                exc.add_note(f"zephon_dask: while computing {self.graph.label}")
                raise
            except lost_result() as exc:
                if done.status == "error":  # the task's own error (an OSError), after Dask's retries
                    exc.add_note(f"zephon_dask: while computing {self.graph.label}")
                    raise
                if resubmits == RESUBMITS:
                    raise
                resubmits += 1
                logger.warning("%s: its result was lost with a worker (%s); computing it "
                               "again (%d of %d)", self.graph.label, type(exc).__name__,
                               resubmits, RESUBMITS)
                runner.watch.check()
                self.release()
                again = runner._submit_remote(self.graph, self._priority, early=False)  # its futures become ours
                self._future, self._chunks = again._future, again._chunks
                runner.track(again, False)
                runner.track(self)
                self._stuck.clear()
                continue
            except Exception as exc:
                exc.add_note(f"zephon_dask: while computing {self.graph.label}")
                raise
            if value is not NOT_FETCHED:
                return raise_if_failed(value, self.graph.label)
            self._stuck.add(done.key)
            reported = time.monotonic()
            self._stalled(reported - started)
            if self._copy is None or self._copy is done:
                self._stuck.discard(done.key)  # nothing else to wait for: keep fetching it

    def _stalled(self, waited: float) -> None:
        """Report a window computing (or its result being fetched) for too long; compute a copy on
        the other workers; if a worker computing or holding it is silent, rescue every window on it."""
        runner = self._runner
        placement, live, silent = runner.placement()
        busy = placement.get(self, [])
        if self._copy is not None and set(self._copy_on) & set(silent):  # the copy went to a frozen worker
            self._copy.release()
            self._copy = None
        # responsive workers, those not holding this window first (a silent one may hold its inputs)
        others = sorted(set(live) - set(busy)) or sorted(set(live) & set(busy))
        # a window no worker has taken yet is queued behind others: a copy would only add load
        copy = bool(busy and others) and self._copy is None
        plan = ("computing it again on " + ", ".join(others) if copy else "a copy already runs elsewhere"
                if self._copy is not None else "no responsive worker to compute it" if busy else "it is still queued")
        logger.warning("zephon_dask: %s has been computing (or fetched) for %.0f s (stall_timeout %g s a window) "
                       "on %s; workers not heard from for over %g s: %s; %s", self.graph.label,
                       waited, runner.stall, ", ".join(busy) or "no worker yet", SILENT_AFTER,
                       ", ".join(silent) or "none", plan)
        if copy:
            self.copy_on(others, stalled=set(busy) <= set(silent))
        stalled = set(busy) & set(silent)
        if stalled and live:
            runner.rescue(stalled, placement, live)

    def copy_on(self, workers: list[str], stalled: bool = False) -> None:
        """Compute the window again as one fused task on ``workers``, carrying the spec by value;
        ``stalled``: every worker computing or holding the original is stalled, so only the copy is
        waited for."""
        runner = self._runner
        self._copies += 1
        self._copy_on = workers
        self._copy, = runner.submit_tasks(self.graph.fused_copy(self._copies), runner.spec, self._priority,
                                          retries=None, workers=workers, allow_other_workers=False)
        if stalled and self._future is not None:
            self._stuck.add(self._future.key)

    def release(self) -> None:
        _, early = self._claim()
        if early is not None:
            early.cancel()  # the gather itself is shielded: it ends on its own
        self._runner.track(self, False)
        with self._early_lock:
            fut, chunks, copy = self._future, self._chunks, self._copy
            self._future, self._chunks, self._copy = None, [], None
            for f in [*chunks, fut, copy]:
                if f is not None:
                    f.release()


class DistributedRunner(Runner):
    name = "distributed"
    has_dashboard = True
    task_cpu = TASK_CPU

    def __init__(self, spec: PipelineSpec, n_workers=None, threads_per_worker=1, client=None,
                 address=None, retries=0, timeout: float = DEFAULT_TIMEOUT, stall: float = DEFAULT_STALL,
                 dashboard_address: str | None = f"{LOCAL_HOST}:0", head_start: bool = True):
        super().__init__(spec)
        self.retries, self.stall = retries, stall
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
        OPEN_RUNNERS.add(self)
        if not self._own_cluster:
            self._connect(client if client is not None else open_client(address, timeout), address, timeout)
            if address is not None and client is None:
                logger.info("connected to the Dask scheduler at %s", address,
                            extra={"dashboard": self.dashboard_link})
            return
        n_workers = n_workers or os.cpu_count() or 1
        self._planned_slots = n_workers * threads_per_worker

        def start() -> None:  # with a head start: once its first window is done (HeadStart.due)
            closed = ClosedError("this distributed runner was closed before its embedded cluster started")
            if self._abandoned:  # closed before the cluster was needed: start nothing
                raise closed
            use_distributed()
            if self._abandoned:  # closed while distributed was imported (a short run exiting): nor then
                raise closed
            self._start_embedded(n_workers, threads_per_worker, dashboard_address, timeout)

        if not head_start:
            start()
            return
        threads = min(self._planned_slots, os.cpu_count() or 1)
        self._head = HeadStart(spec, threads, retries > 0, self.computed_here, stall)
        self._boot = self._head.boot = Boot(start, timeout, self._head.due)

    def _start_embedded(self, n_workers: int, threads_per_worker: int, dashboard_address: str | None,
                        timeout: float) -> None:
        """Start the embedded cluster and connect to it; then the head start's queue goes to it. A
        runner closed meanwhile gets nothing: what this start made is closed here (in the
        background, for a start on its own thread)."""
        try:
            cluster = local_cluster(n_workers, threads_per_worker, dashboard_address=dashboard_address,
                                    timeout=timeout)
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
            client.register_plugin(TrimSchedulerRecords(), name=TrimSchedulerRecords.name)
            client.register_plugin(QuietClose(), name=QuietClose.name)
            logger.info("started an embedded cluster: %d worker(s), dashboard %s",
                        len(cluster.workers), self.dashboard_link, extra={"dashboard": self.dashboard_link})
        except BaseException as exc:
            if self._head is not None:
                self._head.fail(exc)
            raise
        head = self._head
        if head is not None:
            head.hand_over(self._submit_remote)
            self._head = None  # windows go to the cluster from now on

    def _connect(self, client: Client, address: str | None, timeout: float) -> None:
        use_distributed()
        self._client = client
        self.watch = ClusterWatch(client, timeout, address)
        # A task, not scattered data: if the worker holding it dies, the
        # scheduler recomputes it from the task definition.
        self._span_id = f"zephon-dask-{client.id}"
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
        """Started from ``n_workers``, ``threads_per_worker``, ``client``, ``address``, ``retries``,
        ``cluster_timeout``, ``stall_timeout``, ``dashboard_address`` and ``head_start`` (a missing or ``None``
        option takes the default, except ``dashboard_address``: ``None`` means no dashboard)."""
        return cls(
            spec,
            n_workers=options.get("n_workers"),
            threads_per_worker=options.get("threads_per_worker") or 1,
            client=options.get("client"),
            address=options.get("address"),
            retries=options.get("retries") or 0,
            timeout=options.get("cluster_timeout") or DEFAULT_TIMEOUT,
            stall=options.get("stall_timeout") or DEFAULT_STALL,
            dashboard_address=options.get("dashboard_address", f"{LOCAL_HOST}:0"),
            head_start=options.get("head_start", True),
        )

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
        (:meth:`DistributedHandle.fetched_early`), at most :data:`EARLY_FETCHES` at once, so a
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
        return self._submit_remote(graph, priority)

    def submit_group(self, graphs: list[WindowGraph], priority: int, stall_windows: int | None = None) -> list[WindowHandle]:
        """Several fused windows as one task (:func:`~zephon_dask.graph.group_graph`), a
        :class:`~.base.MemberHandle` per window; while the head start takes windows, each on its own.
        The task is reported stalled after ``stall_windows`` (default: one per window) times
        ``stall_timeout``."""
        if self._head is not None or len(graphs) == 1:
            return super().submit_group(graphs, priority)
        task = self._submit_remote(group_graph(self.spec, graphs), priority, stall_windows=stall_windows)
        shared = GroupResult(task, len(graphs))
        return [MemberHandle(g, shared, i) for i, g in enumerate(graphs)]

    def _submit_remote(self, graph: WindowGraph | GroupGraph, priority: int, early: bool = True,
                       stall_windows: int | None = None) -> DistributedHandle:
        live_only = self._responsive_only()
        if live_only:  # while a worker is silent: avoid it, and do not fetch the spec from it
            futures = self.submit_tasks(graph, self.spec, priority, self.retries,
                                        workers=live_only, allow_other_workers=False)
        else:
            futures = self.submit_tasks(graph, self._spec_future, priority, self.retries)
        return DistributedHandle(graph, futures, self, priority, early and self.fetch_ahead, stall_windows)

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
        """Stop using the cluster, each step bounded (:data:`CLOSE_S`): a start still in progress is
        not waited for (it closes what it started when it ends, on its own thread); an embedded
        cluster is closed, a client this runner opened too. During interpreter shutdown, when
        Dask's event loop no longer runs, nothing is waited for (:func:`close_open_runners` closed
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
                close_client(client)
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
        try:
            workers = f"{self._identity(0).get('n_workers', 0)} workers"
        except ClusterError:
            workers = "not answering"
        return f"distributed ({where}, {workers}, dashboard {self.dashboard_link})"


CLOSE_S = 5.0  # seconds each step of closing a client or a cluster may take


def close_client(client: Client) -> None:
    """Close ``client`` within :data:`CLOSE_S` seconds (best effort: a dead scheduler is left)."""
    try:
        client.close(timeout=CLOSE_S)
    except Exception:  # a client that cannot reach its scheduler any more; nothing to keep
        pass


def close_cluster(cluster: SpecCluster) -> None:
    """Close the embedded ``cluster`` within :data:`CLOSE_S` seconds; past that, kill its
    processes (scheduler and workers), so nothing outlives the runner nor waits at exit."""
    try:
        cluster.close(timeout=CLOSE_S)
        return
    except Exception:  # timed out, or broke half-way
        pass
    dask_compat.leave_to_us_at_exit(cluster)  # Dask's own exit handler would wait for it again
    for pid in embedded_pids(cluster):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    from .spawned import SchedulerProcess

    if isinstance(cluster.scheduler, SchedulerProcess):
        cluster.scheduler.host.stop()  # its socket: a host killed removes nothing


OPEN_RUNNERS: weakref.WeakSet[DistributedRunner] = weakref.WeakSet()  # not closed yet


def close_open_runners() -> None:
    """Close every distributed runner still open (each step bounded, see
    :meth:`DistributedRunner.close`). Runs at interpreter exit, registered after Dask's own exit
    handlers so that it runs before them, while Dask's event loop still runs: a script that
    ends (or fails) without closing its pipeline exits within seconds, whatever state its
    cluster is in (dead, frozen or still starting)."""
    for runner in list(OPEN_RUNNERS):
        try:
            runner.close()
        except Exception:  # best effort at exit: the next runner still gets closed
            pass
    # imported by every embedded cluster's start (none yet: no attribute, or a start still importing it)
    stop_schedulers = getattr(sys.modules.get(f"{__package__}.spawned"), "stop_schedulers", None)
    if stop_schedulers is not None:
        stop_schedulers()  # of clusters still starting (closed runners' starts, going on in the background)


atexit.register(close_open_runners)


@contextmanager
def connect(client=None, address: str | None = None, n_workers: int | None = None,
            processes: bool = True, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Client]:
    """Yield ``client``, a client of the scheduler at ``address`` (see :func:`open_client`), or one
    on an embedded cluster (:func:`local_cluster`: ``n_workers`` or all cores, one thread each;
    worker processes with :data:`WORKER_ENV`, or threads of this process with ``processes=False``). Closes only
    what it started."""
    use_distributed()
    from distributed import Client

    if client is not None:
        yield client
        return
    if address is not None:
        with open_client(address, timeout) as own:
            yield own
        return
    with local_cluster(n_workers, 1, processes, timeout=timeout) as cluster, \
            Client(cluster, set_as_default=False, direct_to_workers=processes) as own:
        yield own


def _shared_value(value):
    return value


def _apply(fn: Callable, shared: tuple, *args):
    return fn(*shared, *args)


def each_completed(client: Client, fn: Callable, shared: tuple, calls: Sequence[tuple],
                   keys: Sequence[str], shared_key: str,
                   timeout: float = DEFAULT_TIMEOUT) -> Generator[tuple[int, Any, BaseException | None], None, None]:
    """Run ``fn(*shared, *call)`` as one task per call under ``keys``; yield ``(index, result,
    error)`` as the tasks finish.

    ``shared`` travels once, as a task (recomputed if the worker holding it dies). A task
    lost with its worker before its result reached this process is rerun by the
    scheduler; once read, a result is released, so no later worker loss reruns it. On
    exit (close the generator, e.g. with ``contextlib.closing``) every future is
    cancelled. ``keys`` and ``shared_key`` must be unique to the call: a cancel is
    asynchronous, and a key submitted again meanwhile is cancelled with the old one.
    Waits go through a :class:`ClusterWatch` (``timeout`` seconds without scheduler or
    worker raise :class:`~zephon_dask.errors.ClusterStallError`).
    """
    watch = ClusterWatch(client, timeout)
    common = client.submit(_shared_value, shared, key=shared_key, pure=False, priority=1_000_000)
    futures = [client.submit(_apply, fn, common, *call, key=key, pure=False)
               for call, key in zip(calls, keys, strict=True)]
    index = {f.key: i for i, f in enumerate(futures)}
    try:
        pending = list(futures)
        while pending:
            fut = watch.wait(pending)
            if fut is None:
                continue
            pending.remove(fut)
            try:
                result, error = fut.result(), None
            except Exception as exc:  # the task's own error, re-raised here by distributed
                result, error = None, exc
            client.cancel([fut])  # forget it now: a worker lost later must not rerun a finished task
            yield index[fut.key], result, error
    finally:
        client.cancel([*futures, common])
