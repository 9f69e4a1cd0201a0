"""``DistributedHandle``: a window's tasks on a cluster, waited on, fetched, copied and
resubmitted through its runner (:class:`~.runner.DistributedRunner`). Holds state.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

from ..errors import ClusterError
from ..graph import GroupGraph, WindowGraph
from .base import WindowHandle
from .cluster import logger  # the cluster's one logger (its name is documented)
from .task_errors import raise_if_failed
from .watch import NOT_FETCHED


def lost_result() -> tuple[type[BaseException], ...]:
    """The errors of a gather whose result was lost with its worker (computed again)."""
    from distributed import CancelledError
    from distributed.comm import CommClosedError

    return CancelledError, CommClosedError, OSError


def dask_errors() -> tuple[type[BaseException], ...]:
    """Dask's errors for a task it gave up on (its workers died with it too often)."""
    from distributed import KilledWorker

    return (KilledWorker,)


RESUBMITS = 3
SCHEDULER_GRACE = 0.2  # seconds given a client to see its scheduler gone (then it reconnects)
SILENT_AFTER = 3.0  # seconds without a heartbeat (at least) before a worker counts as frozen


class DistributedHandle(WindowHandle):
    """A window's futures (one per task key of its graph), or those of a task computing several
    windows (a :class:`~zephon_dask.graph.GroupGraph`, one task), waited on and fetched through
    the runner's :class:`~.watch.ClusterWatch`; messages name every window of the task. Tracked by the
    runner (:meth:`~.runner.DistributedRunner.track`) until released.

    A result lost with its worker (a gather that fails or a future the scheduler
    cancels) is resubmitted under the same keys: the window is pure, so the
    recomputation gives the same bytes. A result lost with the scheduler (the client
    reconnects and cancels every future) is resubmitted by the runner with every window
    in flight (:meth:`~.runner.DistributedRunner.outage`, :meth:`renew`), counted apart
    from those resubmits; until a scheduler answers, the window waited for is computed in
    this process (:meth:`~.runner.DistributedRunner.compute_here`). Dask's own errors
    reach the caller as :class:`~zephon_dask.errors.ClusterError`. A window still computing (or not fetched)
    after the runner's ``stall`` seconds (a task of n windows: n times that) is
    logged with the workers computing or holding it, and (if a worker holds it and
    others exist) its :meth:`~zephon_dask.graph.WindowGraph.fused_copy` is
    submitted to the other workers, carrying the spec by value; the first of the two
    to finish is used (the same bytes either way). A worker among those that is
    also silent (no heartbeat for :data:`SILENT_AFTER` seconds) is stalled: every
    window in flight on it is copied at once (:meth:`~.runner.DistributedRunner.rescue`),
    and none is fetched from it.

    A task's final error (:mod:`.task_errors`: the library's own data or
    configuration errors) comes back as its value and is raised here.

    Its result is fetched as soon as it is computed, ahead of the consumer
    (:meth:`~.runner.DistributedRunner.fetch_early`), and the cluster's copy is released
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
        self._want_early = early
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

    @property
    def priority(self) -> int:
        return self._priority

    @property
    def lost(self) -> bool:
        """Whether the window's result is neither here nor coming: its future was cancelled (by a
        client that lost its scheduler) and no copy of it runs."""
        future = self._future
        return (self._early_value is NOT_FETCHED and future is not None and future.cancelled()
                and (self._copy is None or self._copy.cancelled()))

    def renew(self) -> None:
        """Submit the window again under the same keys (its futures were lost, see :attr:`lost`);
        fetched ahead again unless the consumer has taken it over."""
        runner = self._runner
        futures = runner.submit_futures(self.graph, self._priority)
        with self._early_lock:
            old, early = [*self._chunks, self._future, self._copy], self._early
            self._chunks, self._future, self._copy, self._early = futures[:-1], futures[-1], None, None
            self._early_gathering = False
            claimed = self._claimed
        if early is not None:
            early.cancel()
        for f in old:
            if f is not None:
                f.release()
        self._stuck.clear()
        if self._want_early and not claimed:
            early = runner.fetch_early(self, self._future)
            with self._early_lock:
                if self._early is None and not self._claimed:
                    self._early = early
                    early = None
            if early is not None:
                early.cancel()

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
            self._runner.note_back()
            return raise_if_failed(value, self.graph.label)
        runner, resubmits = self._runner, 0
        started = reported = time.monotonic()
        while True:
            try:
                if runner.outage() and not self._finished():  # no cluster now: computed here (with head_start)
                    value = runner.compute_here(self.graph)
                    if value is not None:
                        return value
            except ClusterError as exc:
                exc.add_note(f"zephon_dask: while waiting for {self.graph.label}")
                raise
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
                if self._with_scheduler(done):  # submitted again by the runner: not one of RESUBMITS
                    continue
                if resubmits == RESUBMITS:
                    raise ClusterError(f"{self.graph.label}: its result was lost with a worker {RESUBMITS + 1} "
                                       f"times ({exc!r}); check the workers' logs and memory") from exc
                resubmits += 1
                logger.warning("%s: its result was lost with a worker (%s); computing it "
                               "again (%d of %d)", self.graph.label, type(exc).__name__,
                               resubmits, RESUBMITS)
                self.renew()
                continue
            except dask_errors() as exc:  # a task that killed its workers: Dask gave up on it
                raise ClusterError(f"{self.graph.label}: Dask gave up on it ({exc}); check the workers' "
                                   "logs and memory") from exc
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

    def _finished(self) -> bool:
        """Whether the window is computed on the cluster (its result may be fetched)."""
        future = self._future
        return future is not None and future.status == "finished"

    def _with_scheduler(self, lost) -> bool:
        """Whether the result of ``lost`` (a future of this window) went with the scheduler, not a
        worker: the client reconnects, or reconnected and the runner submitted this window again
        (:meth:`~.runner.DistributedRunner.outage`); or the scheduler does not answer (the client
        has yet to see it gone: a moment later it reconnects, or the wait's deadline ends it)."""
        runner = self._runner
        if runner.outage() or not any(lost is f for f in (self._future, self._copy)):  # renewed meanwhile
            return True
        runner.watch.check()
        if runner.watch.unreachable:
            time.sleep(SCHEDULER_GRACE)
            return True
        return False

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

