"""``HeadStart``: the first windows computed in this process while the embedded cluster starts. Holds state.

An embedded cluster takes about a second to start (its worker processes import
Dask and the pipeline's libraries) and a first window as long again on one
worker: the first batch would wait for both. Until the cluster is up, the
distributed runner queues the windows submitted to it here instead; one thread
of this process computes them in priority order, each window's chunk tasks in
parallel on a small thread pool (tokenizers release the GIL), fused windows included. :meth:`HeadStart.hand_over`
sends every window not yet started to the cluster once it is up; those being
computed here finish here. The cluster starts once the first window is computed here (or
after :data:`HEAD_START_ALONE` seconds): started at once, its processes
would take the cores the first window needs. A window's bytes do not depend on where it was
computed. A window that fails here is sent to the cluster when the runner has
``retries``, so a failure meets the same retries and the same error as on the
cluster, unless the error is final (:func:`~.task_errors.is_final`: the library's
own data or configuration errors), which is raised at once, as on the cluster.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import dask
import dask.threaded

from ..core.spec import PipelineSpec
from ..core.window import WindowOutput, narrowed
from ..errors import ClosedError, ClusterError
from ..graph import WindowGraph, window_graph
from .base import WindowHandle
from .task_errors import is_final

POLL = 1.0  # the longest slice of a wait for the cluster, between two checks of its deadline
HEAD_START_ALONE = 1.0  # seconds the first window may compute here before the cluster starts anyway


class Boot:
    """The embedded cluster's start, on a thread of its own: ``start()`` runs there; :meth:`wait`
    returns once it has ended, raising its error, or a :class:`ClusterError` past ``timeout`` seconds."""

    def __init__(self, start: Callable[[], None], timeout: float):
        self.timeout = float(timeout)
        self.error: BaseException | None = None
        self.deadline = time.monotonic() + self.timeout
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start,), name="zephon-cluster-start", daemon=True)
        self._thread.start()

    def _run(self, start: Callable[[], None]) -> None:
        try:
            start()
        except BaseException as exc:  # handed to every waiter
            self.error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, slice_s: float | None = None) -> bool:
        """``True`` once the start ended well; ``False`` after ``slice_s`` seconds (``None``: until
        it ends). Raises the start's error, or :class:`ClusterError` past the deadline."""
        end = time.monotonic() + slice_s if slice_s is not None else None
        while not self._done.is_set():
            now = time.monotonic()
            if now >= self.deadline:
                raise ClusterError(f"the embedded Dask cluster did not start within {self.timeout:g} s; check "
                                   "the machine's load and free memory, or raise the cluster_timeout option")
            if end is not None and now >= end:
                return False
            self._done.wait(min(POLL, self.deadline - now, *([end - now] if end is not None else [])))
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
    instead of failing."""

    def __init__(self, spec: PipelineSpec, threads: int, retry_remotely: bool,
                 computed_here: list[tuple[int, int]]):
        self.spec, self.retry_remotely = spec, retry_remotely
        self.computed_here = computed_here  # (lane, window) of each window computed here, appended
        self.boot: Boot | None = None  # the cluster's start, which ends in hand_over or fail
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, HeadStartHandle]] = []  # (-priority, order, handle)
        self._order = 0
        self._failed: list[HeadStartHandle] = []  # failed here, for the cluster
        self._send: Callable[[WindowGraph, int], WindowHandle] | None = None
        self._closed = False
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
                try:
                    value = narrowed(self._compute(handle))  # held until taken, as the cluster's are
                except BaseException as exc:
                    self._failed_here(handle, exc)
                else:
                    self.computed_here.append((handle.graph.lane, handle.graph.window))
                    handle.settle(value=value)
                self.first_window.set()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)

    def _compute(self, handle: HeadStartHandle) -> WindowOutput:
        """The handle's window, its chunks as tasks (in parallel on the pool), each counted in
        ``handle.chunks_here`` as it finishes."""
        graph = handle.graph
        split = window_graph(self.spec, graph.lane, graph.window) if graph.fused else graph
        chunk_keys = set(split.chunk_keys)

        def finished(key, result, dsk, state, worker_id) -> None:  # on the thread that schedules them
            if key in chunk_keys:
                handle.chunks_here += 1

        callbacks = [(None, None, None, finished, None)]  # dask.local's (start, start_state, pretask, posttask, finish)
        if self._pool is None:
            return dask.get(split.to_dict(self.spec), split.key, callbacks=callbacks)
        return dask.threaded.get(split.to_dict(self.spec), split.key, pool=self._pool, callbacks=callbacks)

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

    def check_boot(self) -> None:
        """Raise if the cluster's start failed or is past its deadline."""
        if self.boot is not None:
            self.boot.wait(0)

    def close(self) -> None:
        """Fail every queued window with :class:`ClosedError`; a window computing here finishes
        in the background and is dropped."""
        self.fail(ClosedError("this distributed runner was closed while the window waited for the embedded "
                              "cluster; build or reopen the pipeline to compute more windows"))
