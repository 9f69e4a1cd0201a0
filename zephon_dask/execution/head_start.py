"""``HeadStart``: the first windows computed in this process while the embedded cluster starts. Holds state.

An embedded cluster takes seconds to start (its scheduler and worker processes
import Dask and the pipeline's libraries) and a first window as long again on one
worker: the first batch would wait for both. Until the cluster is up, the
distributed runner queues the windows submitted to it here instead; one thread
of this process computes them in priority order, each window's chunk tasks in
parallel on a thread pool (the cluster's worker threads, at most the cores; tokenizers
release the GIL),
fused windows included. :meth:`HeadStart.hand_over` sends every window not yet
started to the cluster once it is up; those being computed here finish here. A
window's bytes do not depend on where it was computed.

The cluster's start (:class:`Boot`) begins only once the first window taken here (the
one the first batch needs: the consumer submits it first, at the highest priority)
is done, computed or failed, and, computed, once the consumer has cut the first batch from
it (:meth:`HeadStart.first_batch_taken`; at most :data:`CUT_AT_MOST` seconds after the
window, for a caller that takes no batch). Started earlier, its processes would take the
cores that window needs, and its import of ``distributed`` the GIL the cut needs, and
the first batch would come later than the floor of tokenizing it on every core. Waiting costs nothing while the head start keeps the cores busy, so the
start's only bound is the head start falling behind its own plan (:meth:`HeadStart.due`):
past :data:`PACE_MARGIN` times the time the window's chunks predict at the pace of
those done so far (``t_k * n / k`` after ``k`` of its ``n`` chunks; at least
:data:`ALONE_AT_LEAST`, so that jitter on a short window starts nothing), or, before any
chunk is done, past the runner's ``stall`` seconds (the time after which a window on
the cluster is reported as stalled), counted from when the window began here (from
when the head start was made, while it has no window). The start also begins at once
when the runner needs the cluster itself (its client) or closes. Its deadline,
``cluster_timeout``, counts from when it begins.

A window that fails here is sent to the cluster when the runner has
``retries``, so a failure meets the same retries and the same error as on the
cluster, unless the error is final (:func:`~.task_errors.is_final`: the library's
own data or configuration errors), which is raised at once, as on the cluster.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..core.spec import PipelineSpec
from ..core.window import (
    ChunkOutput,
    WindowOutput,
    chunk_output,
    compute_chunk,
    finish_window,
    narrowed,
    read_chunk,
)
from ..errors import ClosedError, ClusterError
from ..graph import GroupGraph, WindowGraph
from .base import WindowHandle
from .task_errors import is_final
from .watch import DEFAULT_STALL

POLL = 1.0  # the longest slice of a wait for the cluster, between two checks of its deadline
PACE_MARGIN = 2.0  # how far past its chunks' predicted time the first window may run before the cluster starts
ALONE_AT_LEAST = 1.0  # seconds the first window always has alone: a few ms' jitter on a short one starts nothing
CUT_AT_MOST = 1.0  # seconds after the first window is computed the start waits for the first batch's cut


class Boot:
    """The embedded cluster's start, on a thread of its own: ``start()`` runs there once
    :meth:`begin` is called or ``due()`` (seconds until the start must begin; ``None``: at
    once) is not positive, checked every :data:`POLL` seconds at most. :meth:`wait` returns
    once it has ended, raising its error, or a :class:`ClusterError` past ``timeout`` seconds
    from when it began."""

    def __init__(self, start: Callable[[], None], timeout: float, due: Callable[[], float] | None = None):
        self.timeout = float(timeout)
        self.error: BaseException | None = None
        self.deadline: float | None = None  # set when the start begins
        self._lock = threading.Lock()
        self._begun = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start, due), name="zephon-cluster-start",
                                        daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """Let the start begin now (nothing once it has); its deadline counts from here."""
        with self._lock:
            if self.deadline is None:
                self.deadline = time.monotonic() + self.timeout
        self._begun.set()

    def _run(self, start: Callable[[], None], due: Callable[[], float] | None) -> None:
        try:
            # each wake checks the bound: due() falls as time passes, the window's progress moves it
            while due is not None and not self._begun.is_set() and (left := due()) > 0:
                self._begun.wait(min(POLL, left))
            self.begin()
            start()
        except BaseException as exc:  # handed to every waiter
            self.error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, slice_s: float | None = None) -> bool:
        """``True`` once the start ended well; ``False`` after ``slice_s`` seconds (``None``: until
        it ends, and the start begins now if it has not). Raises the start's error, or
        :class:`ClusterError` past the deadline."""
        if slice_s is None:
            self.begin()  # waited for: needed now
        end = time.monotonic() + slice_s if slice_s is not None else None
        while not self._done.is_set():
            now, deadline = time.monotonic(), self.deadline
            if deadline is not None and now >= deadline:
                raise ClusterError(f"the embedded Dask cluster did not start within {self.timeout:g} s; check "
                                   "the machine's load and free memory, or raise the cluster_timeout option")
            if end is not None and now >= end:
                return False
            self._done.wait(min(POLL, *([deadline - now] if deadline is not None else []),
                                *([end - now] if end is not None else [])))
        if self.error is not None:
            raise self.error
        return True


class HeadStartHandle(WindowHandle):
    """A window queued while the cluster starts: computed here, or sent on to the cluster."""

    graph: WindowGraph  # one window each: a task of several windows never waits here

    def __init__(self, graph: WindowGraph, priority: int, head: HeadStart):
        super().__init__(graph)
        self.priority, self._head = priority, head
        self._settled = threading.Event()
        self._value: WindowOutput | None = None
        self._error: BaseException | None = None
        self._remote: WindowHandle | None = None
        self.released = False
        self.chunks_here = 0  # chunks computed here so far (set by the head start's thread)
        self.chunks_planned = 0  # the window's chunks, once it began here
        self.began: float | None = None  # time.monotonic() when it began here
        self.last_chunk = 0.0  # time.monotonic() when its last chunk so far finished here

    def settle(self, value: WindowOutput | None = None, error: BaseException | None = None,
               remote: WindowHandle | None = None) -> None:
        self._value, self._error, self._remote = value, error, remote
        self._settled.set()

    @property
    def held_nbytes(self) -> int:
        remote, value = self._remote, self._value
        return remote.held_nbytes if remote is not None else value.__sizeof__() if value is not None else 0

    def done(self) -> bool:
        if not self._settled.is_set():
            return False
        return self._remote.done() if self._remote is not None else True

    def chunks_done(self) -> int:
        if self._remote is not None:
            return self._remote.chunks_done()
        return super().chunks_done() if self.done() else self.chunks_here

    def result(self) -> WindowOutput:
        while not self._settled.wait(POLL):
            self._head.check_boot()
        if self._remote is not None:
            return self._remote.result()
        if self._error is not None:
            error = self._error
            if not isinstance(error, ClosedError):
                error.add_note(f"zephon_dask: while computing {self.graph.label}")
            raise error
        assert self._value is not None
        return self._value

    def release(self) -> None:
        self.released = True
        remote, self._remote, self._value = self._remote, None, None
        if remote is not None:
            remote.release()


class HeadStart:
    """Windows queued until :meth:`hand_over`; a thread computes them here meanwhile, in priority
    order, each on a pool of ``threads`` threads, and appends ``(lane, window)`` to
    ``computed_here``. ``retry_remotely``: a window that fails here is sent to the cluster
    instead of failing. ``stall``: the runner's stall timeout, which bounds :meth:`due`."""

    def __init__(self, spec: PipelineSpec, threads: int, retry_remotely: bool,
                 computed_here: list[tuple[int, int]], stall: float = DEFAULT_STALL):
        self.spec, self.retry_remotely, self.stall = spec, retry_remotely, float(stall)
        self.computed_here = computed_here  # (lane, window) of each window computed here, appended
        self.boot: Boot | None = None  # the cluster's start, begun once the first window is done; ends in hand_over or fail
        self._made = time.monotonic()
        self._lead: HeadStartHandle | None = None  # the first window taken here (done: first_window)
        self._lead_computed: float | None = None  # time.monotonic() when it was computed (not failed)
        self._first_batch = False  # the consumer has cut the first batch
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, HeadStartHandle]] = []  # (-priority, order, handle)
        self._order = 0
        self._failed: list[HeadStartHandle] = []  # failed here, for the cluster
        self._send: Callable[[WindowGraph, int], WindowHandle] | None = None
        self._closed = False
        self._threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="zephon-head-start") if threads > 1 else None
        self.first_window = threading.Event()
        self._driver = threading.Thread(target=self._drive, name="zephon-head-start", daemon=True)
        self._driver.start()

    def offer(self, graph: WindowGraph, priority: int) -> HeadStartHandle | None:
        """Queue ``graph``; ``None`` once handed over (submit it to the cluster)."""
        with self._cond:
            if self._send is not None or self._closed:
                return None
            handle = HeadStartHandle(graph, priority, self)
            heapq.heappush(self._queue, (-priority, self._order, handle))
            self._order += 1
            self._cond.notify_all()
            return handle

    def _drive(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._queue and self._send is None and not self._closed:
                        self._cond.wait()
                    if self._send is not None or self._closed:
                        return
                    handle = heapq.heappop(self._queue)[2]
                if handle.released:
                    continue
                if self._lead is None:
                    self._lead = handle
                computed = False
                try:
                    value = narrowed(self._compute(handle))  # held until taken, as the cluster's are
                except BaseException as exc:
                    self._failed_here(handle, exc)
                else:
                    self.computed_here.append((handle.graph.lane, handle.graph.window))
                    handle.settle(value=value)
                    computed = True
                if handle is self._lead:
                    if computed:  # the start waits for the first batch's cut (first_batch_taken)
                        self._lead_computed = time.monotonic()
                    if (not computed or self._first_batch) and self.boot is not None:
                        self.boot.begin()  # the cores are the cluster's
                self.first_window.set()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)

    def _compute(self, handle: HeadStartHandle) -> WindowOutput:
        """The handle's window: its chunks (in parallel on the pool, :class:`LargestFirst`), each
        counted in ``handle.chunks_here`` as it finishes, then the window's accumulators."""
        graph = handle.graph
        handle.chunks_planned, handle.began = len(graph.chunks), time.monotonic()

        def finished() -> None:  # on one thread at a time
            handle.last_chunk = time.monotonic()  # before the count: due() reads the count first
            handle.chunks_here += 1

        return window_here(self.spec, graph, self._pool, self._threads, finished)

    def _failed_here(self, handle: HeadStartHandle, exc: BaseException) -> None:
        if not self.retry_remotely or isinstance(exc, ClosedError) or is_final(exc):
            handle.settle(error=exc)
            return
        with self._cond:
            send = self._send
            if send is None:
                self._failed.append(handle)
                return
        self._send_one(send, handle)

    @staticmethod
    def _send_one(send: Callable[[WindowGraph, int], WindowHandle], handle: HeadStartHandle) -> None:
        if handle.released:
            return
        try:
            handle.settle(remote=send(handle.graph, handle.priority))
        except BaseException as exc:
            handle.settle(error=exc)

    def hand_over(self, send: Callable[[WindowGraph, int], WindowHandle]) -> None:
        """From now on windows go to the cluster through ``send(graph, priority)``: the queued ones
        now, in priority order; those computing here finish here."""
        with self._cond:
            waiting = [h for _, _, h in sorted(self._queue)] + self._failed
            self._queue, self._failed, self._send = [], [], send
            self._cond.notify_all()
        for handle in waiting:
            self._send_one(send, handle)

    def fail(self, error: BaseException) -> None:
        """The cluster did not start: every queued window fails with ``error``; no more are taken."""
        self.first_window.set()
        with self._cond:
            waiting = [h for _, _, h in self._queue] + self._failed
            self._queue, self._failed, self._closed = [], [], True
            self._cond.notify_all()
        for handle in waiting:
            handle.settle(error=error)

    def first_batch_taken(self) -> None:
        """The consumer has its first batch: the cluster's start begins (see the module
        docstring); the cores are no longer the first batch's."""
        self._first_batch = True
        if self.boot is not None:
            self.boot.begin()

    def due(self) -> float:
        """Seconds until the cluster's start must begin (see the module docstring): once the
        first window taken here is done, 0 if it failed or the first batch was taken, else what
        is left of :data:`CUT_AT_MOST` after it; while it computes, :data:`PACE_MARGIN` times the time
        its chunks predict from those done (at least :data:`ALONE_AT_LEAST`; ``stall`` seconds
        before the first), from when it began; ``stall`` seconds from this head start's making
        while no window has begun."""
        if self.first_window.is_set():
            computed = self._lead_computed
            if computed is None or self._first_batch:
                return 0.0
            return computed + CUT_AT_MOST - time.monotonic()
        lead = self._lead
        began = lead.began if lead is not None else None
        if lead is None or began is None:
            return self._made + self.stall - time.monotonic()
        done = lead.chunks_here
        if done == 0:
            return began + self.stall - time.monotonic()
        predicted = (lead.last_chunk - began) * lead.chunks_planned / done
        return began + max(ALONE_AT_LEAST, PACE_MARGIN * predicted) - time.monotonic()

    def check_boot(self) -> None:
        """Raise if the cluster's start failed or is past its deadline."""
        if self.boot is not None:
            self.boot.wait(0)

    def close(self) -> None:
        """Fail every queued window with :class:`ClosedError`; a window computing here finishes
        in the background and is dropped."""
        self.fail(ClosedError("this distributed runner was closed while the window waited for the embedded "
                              "cluster; build or reopen the pipeline to compute more windows"))


def window_here(spec: PipelineSpec, graph: WindowGraph, pool: ThreadPoolExecutor | None, threads: int,
                finished: Callable[[], None] = lambda: None) -> WindowOutput:
    """``graph``'s window computed in this process: its chunks on ``threads`` threads of ``pool``
    (:class:`LargestFirst`; ``None``: one after the other here), ``finished()`` after each, then
    its accumulators. The bytes a worker computes."""
    if pool is None:
        outs = []
        for g in graph.chunks:
            outs.append(compute_chunk(spec, g))
            finished()
    else:
        outs = LargestFirst(spec, graph.chunks).run(pool, threads, finished)
    return finish_window(spec, graph.lane, graph.window, outs)


def compute_here(spec: PipelineSpec, graph: WindowGraph | GroupGraph, threads: int) -> WindowOutput | tuple:
    """What ``graph``'s task returns, computed in this process on ``threads`` threads and narrowed
    as on a worker: its window, or a group's windows in member order (the distributed runner
    computes windows here while it has no scheduler)."""
    windows = graph.windows if isinstance(graph, GroupGraph) else (graph,)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="zephon-here") if threads > 1 else None
    try:
        outs = tuple(window_here(spec, g, pool, threads) for g in windows)
    finally:
        if pool is not None:
            pool.shutdown(wait=False)
    return narrowed(outs if isinstance(graph, GroupGraph) else outs[0])


def text_size(records: Sequence) -> int:
    """What tokenizing ``records`` costs, roughly: the length of their strings and sequences."""
    return sum(len(v) for r in records if isinstance(r, dict)
               for v in r.values() if isinstance(v, str | bytes | list | np.ndarray))


class LargestFirst:
    """A window's chunks computed on ``threads`` threads of a pool so that they finish together.
    Holds state (the chunks read and not yet taken; ``log``: ``("read", i, size)`` and
    ``("take", i)`` in the order they happened).

    One thread at a time reads every chunk not yet read, in chunk order (Python: it holds the GIL,
    while the other threads tokenize); every other thread, and the reader once done, takes the
    chunk read and not yet taken with the most text (:func:`text_size`) and applies the record
    operators to it (the tokenizer releases the GIL). A thread that finds none read while the
    reader reads reads the next chunk itself (reads waiting on storage overlap, as on the pool's
    threads before). So the window's last chunks are its smallest,
    instead of one thread tokenizing a large one alone at the end. The outputs are
    :func:`~zephon_dask.core.window.compute_chunk`'s, in chunk order: the order of work changes no
    byte. The first error stops the work and is raised."""

    def __init__(self, spec: PipelineSpec, chunks: Sequence[int]):
        self.spec, self.chunks = spec, tuple(chunks)
        self.log: list[tuple] = []
        self._cond = threading.Condition()
        self._unread = list(range(len(self.chunks)))[::-1]  # popped from the end: chunk order
        self._reading = False
        self._ready: list[tuple[int, int, np.ndarray, list, float, float]] = []  # (-size, i, pointers, records, s, cpu)
        self._outs: list[ChunkOutput | None] = [None] * len(self.chunks)
        self._error: BaseException | None = None

    def run(self, pool: ThreadPoolExecutor, threads: int, finished: Callable[[], None]) -> list[ChunkOutput]:
        """The chunks' outputs in chunk order; ``finished()`` after each chunk (one thread at a time)."""
        futures = [pool.submit(self._work, finished) for _ in range(min(threads, len(self.chunks)))]
        for future in futures:
            future.result()  # a window computed here has no deadline, as on a worker
        if self._error is not None:
            raise self._error
        return [out for out in self._outs if out is not None]

    def _next(self) -> tuple | None:
        """Under the lock: ``("read",)``, ``("take", item)``, or ``None`` when nothing is left."""
        while self._error is None:
            if self._unread and not self._reading:
                self._reading = True
                return ("read",)
            if self._ready:
                item = heapq.heappop(self._ready)
                self.log.append(("take", item[1]))
                return ("take", item)
            if self._unread:  # nothing read yet: read one beside the reader
                return ("read one",)
            if not self._reading:
                return None
            self._cond.wait(POLL)  # the last chunks being read; woken when one is
        return None

    def _work(self, finished: Callable[[], None]) -> None:
        try:
            while True:
                with self._cond:
                    job = self._next()
                if job is None:
                    return
                if job[0] == "read":
                    self._read_all()
                    continue
                if job[0] == "read one":
                    self._read_one()
                    continue
                _, i, pointers, records, seconds, cpu = job[1]
                out = chunk_output(self.spec, self.chunks[i], pointers, records, seconds, cpu)
                with self._cond:
                    self._outs[i] = out
                    finished()
        except BaseException as exc:
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._reading = False
                self._cond.notify_all()

    def _read_all(self) -> None:
        while self._read_one():
            pass
        with self._cond:
            self._reading = False
            self._cond.notify_all()

    def _read_one(self) -> bool:
        """Read the next chunk not yet read; ``False`` if none is left (or the work stopped)."""
        with self._cond:
            if not self._unread or self._error is not None:
                return False
            i = self._unread.pop()
        started, cpu = time.perf_counter(), time.thread_time()
        pointers, records = read_chunk(self.spec, self.chunks[i])
        size = text_size(records)
        item = (-size, i, pointers, records, time.perf_counter() - started, time.thread_time() - cpu)
        with self._cond:
            heapq.heappush(self._ready, item)
            self.log.append(("read", i, size))
            self._cond.notify_all()
        return True
