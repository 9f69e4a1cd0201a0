"""``WindowFetcher``: keeps a bounded number of windows in flight. Holds state.

Windows are submitted in the order the consumer will need them: window index
by window index, round-robin over the owned lanes (as the seed text says the
pipeline is fed), with falling priorities so the next-needed window runs
first. A window the consumer asks for that is not yet submitted jumps the
queue. The next window to submit comes from a heap of the lanes keyed on
their next window, so a submission costs O(log lanes), not O(lanes). Each handle is released as soon as its result is local, so memory
stays bounded however long the run is, and the memory windows free is
given back to the OS at most every 5 s (:class:`~zephon_dask.execution.memory.Trimmer`).

Its settings are one :class:`~.settings.ConsumerSettings`; the names below are its fields.
With ``fuse`` every window is one task except the first windows of the
stream, one per lane for the first ``split_first`` submissions (the runner's
worker threads, see the session), and the last ``split_last`` windows of an
iteration whose lanes all end, which are split into their chunk tasks: split
windows are computed one after the other by all workers at once instead of one
per worker, so the first batch waits for a fraction of a window (the task
joining a split window's chunks may still wait behind a fused window its worker
already took), and at the iteration's end the workers share its last windows
chunk by chunk, finishing within a chunk of each other instead of one computing
a last window alone while the others idle. Windows in between, other lanes' first
ones included, are fused: the workers are busy with one window each, so a split
would add tasks (a chunk's result sent between workers, the scheduler's and
workers' messages for each) and gain nothing. Both encodings give the same bytes.

With ``windows_per_task`` above 1, up to that many consecutive fused
submissions go to the runner together (:meth:`Runner.submit_group`), which may
compute them as one task: Dask's scheduling, messages and fetch are then paid
once per task, not once per window. Split windows and windows asked for out of
turn stay on their own, as do the last ``alone_at_end`` windows of an iteration
whose lanes all end (the runner's worker threads: the iteration's end is then
shared out window by window, not a group on one worker while the others
idle). A group is submitted only once ``prefetch`` leaves room
for all of it (fewer members only where lanes end), so the windows in flight
stay between ``prefetch - windows_per_task + 1`` and ``prefetch``. Each window
keeps its own handle, released as the consumer takes it.

With ``windows_per_task=None`` (automatic) the size is decided once, from the
windows taken one per task first (``prefetch`` of them, at least
:data:`~zephon_dask.execution.base.AUTO_AFTER`): their median CPU seconds
(:class:`~zephon_dask.core.window.Made`; most of them were computed by workers past
their first task) against the runner's ``task_cpu``, by
:func:`~zephon_dask.execution.base.auto_windows_per_task`. Small windows are
grouped until Dask's cost per task is a small share of their work, large ones stay
one per task. The runner may replace that size by the one the first consumer of a
shared cluster decided (:meth:`~zephon_dask.execution.base.Runner.agree`), and with
a given ``prefetch`` it is capped by
:func:`~zephon_dask.execution.base.most_windows_per_task`; as
the size changes at the same window taken in every consumer, peers with the same
settings keep submitting the same tasks. With ``scale_prefetch`` (``prefetch_windows``
not set) ``prefetch`` is then multiplied by the size, so the tasks in flight, and
the workers kept busy, stay the same; without ``prefetch_bytes`` the size is then
capped so that the scaled prefetch holds at most
:data:`~zephon_dask.execution.base.AUTO_HELD_BYTES` at the mean size of the windows
taken (:func:`~zephon_dask.execution.base.held_windows_per_task`; cheap windows, such
as stored tokens, may be large).

With ``prefetch_bytes``, the windows in flight are also bounded in bytes: at most
``prefetch_bytes`` divided by the mean size of the windows taken so far (as held:
narrowed, see :func:`~zephon_dask.core.window.narrowed`), at least one, and groups no larger
than that; until the first window is taken, ``prefetch`` alone applies. Which windows are
submitted when never changes what they hold.
"""

from __future__ import annotations

import heapq
import logging
import statistics
import time
from collections import OrderedDict

from ..core.spec import PipelineSpec
from ..core.window import WindowOutput
from ..errors import ClosedError
from ..execution.base import (
    AUTO_AFTER,
    auto_windows_per_task,
    held_windows_per_task,
    most_windows_per_task,
)
from ..execution.memory import CONSUMER_TRIM_EVERY, Trimmer
from ..graph import window_graph
from ..log import logger
from .settings import ConsumerSettings


class WindowFetcher:
    def __init__(self, spec: PipelineSpec, runner, lanes: list[int], settings: ConsumerSettings,
                 start_windows: dict[int, int] | None = None):
        self.spec, self.runner, self.lanes, self.settings = spec, runner, list(lanes), settings
        self.base_prefetch = max(1, int(settings.prefetch))
        self.prefetch_bytes = settings.prefetch_bytes
        self.taken_bytes = self.taken = 0  # windows handed to the consumer, and their bytes as held
        self.sample: list[float] = []  # CPU seconds of the windows taken until the automatic size is decided
        self.window_cpu: float | None = None  # their median, once decided
        self._auto = 1  # the automatic size: 1 until decided
        given = settings.windows_per_task
        self.given = None if given is None else max(1, int(given))  # None: automatic
        self.scale_prefetch = settings.scale_prefetch and self.given is None
        self.threads = max(1, settings.threads)  # worker threads of this consumer's share (the automatic size's bound)
        self.alone_at_end = settings.alone_at_end
        self.fused, self.split_first, self.split_last = settings.fuse, settings.split_first, settings.split_last
        start = start_windows or {}
        self.next_needed = {lane: start.get(lane, 0) for lane in self.lanes}
        self.next_submit = dict(self.next_needed)
        self.first = dict(self.next_needed)  # where each lane started (for stats)
        self.num_windows = {lane: spec.num_windows(lane) for lane in self.lanes}
        # windows left to submit, when every lane ends (None: some lane is endless)
        ends = [(n, self.next_submit[lane]) for lane, n in self.num_windows.items()]
        self._left: int | None = sum(max(0, n - at) for n, at in ends if n is not None)
        if any(n is None for n, _ in ends):
            self._left = None
        self.inflight: OrderedDict = OrderedDict()
        # (next window to submit, position, lane) per lane that has one; an entry may lag behind
        # next_submit after a submission, and is corrected when it comes up
        self._queue = [(self.next_submit[lane], i, lane) for i, lane in enumerate(self.lanes)]
        heapq.heapify(self._queue)
        self._seq = 0
        self._closed = False
        self._trimmer = Trimmer(CONSUMER_TRIM_EVERY)  # the windows' freed memory goes back to the OS
        self._top_up()

    @property
    def windows_per_task(self) -> int:
        """Windows per task now: the given size, else the automatic one (see the module docstring);
        never above :attr:`prefetch`."""
        size = self._auto if self.given is None else self.given
        return max(1, min(size, self.prefetch))

    @property
    def prefetch(self) -> int:
        """Windows to keep in flight: the given ``prefetch``, times the automatic windows per task
        with ``scale_prefetch``."""
        return self.base_prefetch * self._auto if self.scale_prefetch else self.base_prefetch

    @property
    def deciding(self) -> bool:
        """Whether the automatic size is still to be decided."""
        return self.given is None and self.window_cpu is None

    def _time(self, cpu: float) -> None:
        """Count a window taken that took ``cpu`` seconds (0: not timed), and decide the automatic
        size once enough are (see the module docstring)."""
        if cpu <= 0:
            return
        self.sample.append(cpu)
        if len(self.sample) < max(AUTO_AFTER, self.base_prefetch):
            return
        self.window_cpu = statistics.median(self.sample)
        size = self.runner.agree("windows-per-task", auto_windows_per_task(self.window_cpu, self.runner.task_cpu))
        most = most_windows_per_task(None if self.scale_prefetch else self.base_prefetch, self.threads)
        if self.scale_prefetch and self.prefetch_bytes is None:  # the bytes held stay bounded
            most = min(most, held_windows_per_task(self.base_prefetch, self.taken_bytes / self.taken))
        self._auto = max(1, min(size, most))

    def _exists(self, lane: int, w: int) -> bool:
        n = self.num_windows[lane]
        return n is None or w < n

    def _split(self, lane: int, w: int, later: int = 0) -> bool:
        """Whether ``(lane, w)``, submitted ``later`` submissions from now, is split into chunk tasks."""
        return (not self.fused or self._among_last(self.split_last, later)
                or (w == self.first[lane] and self._seq + later < self.split_first))

    def _among_last(self, n: int, later: int) -> bool:
        """Whether the submission ``later`` submissions from now is among the iteration's last ``n``
        (known once every lane ends)."""
        return self._left is not None and self._left - later <= n

    def submit(self, lane: int, w: int) -> None:
        """Submit lane ``lane``'s window ``w`` to the runner, after those already submitted: split
        into chunk tasks unless ``fused``, or if it is the lane's first and one of the first
        ``split_first`` submitted, or one of the iteration's last ``split_last``."""
        graph = window_graph(self.spec, lane, w, not self._split(lane, w))
        self.inflight[(lane, w)] = self.runner.submit(graph, priority=-self._seq)
        self._seq += 1
        self.next_submit[lane] = w + 1
        self._taken(1)

    def _taken(self, n: int) -> None:
        if self._left is not None:
            self._left -= n

    def _groupable(self, lane: int, w: int, later: int = 0) -> bool:
        """Whether ``(lane, w)``, submitted ``later`` submissions from now, may share a task: fused,
        and not among the iteration's last ``alone_at_end`` windows."""
        return not self._among_last(self.alone_at_end, later) and not self._split(lane, w, later)

    def _submit_group(self, members: list[tuple[int, int]]) -> None:
        """Submit the fused windows ``members`` (consecutive submissions) together; the first
        at the priority a lone submission would get, each of the others one lower."""
        if len(members) == 1:
            self.submit(*members[0])
            return
        graphs = [window_graph(self.spec, lane, w, True) for lane, w in members]
        # a group of the automatic size computes about as long as one window: one stall_timeout
        handles = self.runner.submit_group(graphs, priority=-self._seq, stall_windows=1 if self.given is None else None)
        for (lane, w), handle in zip(members, handles, strict=True):
            self.inflight[(lane, w)] = handle
            self.next_submit[lane] = w + 1
        self._seq += len(members)
        self._taken(len(members))

    def _next(self) -> tuple[int, int] | None:
        """The lowest (window, lane position) not yet submitted, as ``(lane, window)``, or ``None``."""
        queue = self._queue
        while queue:
            w, i, lane = queue[0]
            if w != self.next_submit[lane]:  # the lane moved on (next_submit only grows)
                heapq.heapreplace(queue, (self.next_submit[lane], i, lane))
            elif not self._exists(lane, w):  # past the lane's end, for good
                heapq.heappop(queue)
            else:
                return lane, w
        return None

    @property
    def held_nbytes(self) -> int:
        """Bytes of the windows in flight already held in this process (fetched ahead, not taken)."""
        return sum(h.held_nbytes for h in list(self.inflight.values()))

    def room(self) -> int:
        """How many windows may be in flight: ``prefetch``, and with ``prefetch_bytes`` no more
        than that many bytes at the mean size of the windows taken so far (at least 1)."""
        if self.prefetch_bytes is None or not self.taken:
            return self.prefetch
        mean = max(1.0, self.taken_bytes / self.taken)
        return max(1, min(self.prefetch, int(self.prefetch_bytes // mean)))

    def _top_up(self) -> None:
        """Submit the lowest (window, lane position) not yet submitted until :meth:`room` are in
        flight: a split window alone, as are the last ``alone_at_end`` windows of an iteration
        whose lanes all end (so its end is shared out window by window), fused ones
        ``windows_per_task`` at a time (at most :meth:`room`) once there is room for as many."""
        room = self.room()
        size = min(self.windows_per_task, room)
        while len(self.inflight) < room and (nxt := self._next()) is not None:
            if size == 1 or not self._groupable(*nxt):
                self.submit(*nxt)
                continue
            if room - len(self.inflight) < size:
                return
            members = [nxt]
            self.next_submit[nxt[0]] = nxt[1] + 1  # taken (the lane's heap entry catches up in _next)
            while len(members) < size and (nxt := self._next()) is not None \
                    and self._groupable(*nxt, len(members)):
                members.append(nxt)
                self.next_submit[nxt[0]] = nxt[1] + 1
            self._submit_group(members)

    def get(self, lane: int) -> WindowOutput | None:
        """The lane's next window (blocking: the runner's handle bounds the wait), or ``None`` past
        its last one. A :class:`ClosedError` once :meth:`close` ran."""
        self.check_open()
        w = self.next_needed[lane]
        if not self._exists(lane, w):
            return None
        if (lane, w) not in self.inflight:
            self.submit(lane, w)
        handle = self.inflight.pop((lane, w))
        started = time.perf_counter()
        try:
            out = handle.result()
        finally:
            handle.release()
        if logger.isEnabledFor(logging.DEBUG):  # once per window, never per batch
            logger.debug("lane %d window %d: computed on %s in %.3f s, %s bytes, %d rows; waited %.3f s here",
                         lane, w, out.made.worker or "?", out.made.seconds, f"{out.__sizeof__():,}", len(out),
                         time.perf_counter() - started)
        self.next_needed[lane] = w + 1
        self.taken += 1
        self.taken_bytes += out.__sizeof__()
        if self.deciding:
            self._time(out.made.cpu)
        self._top_up()
        self._trimmer.maybe()
        return out

    @property
    def windows_done(self) -> int:
        """Windows handed to the consumer since the fetcher started."""
        return sum(self.next_needed[lane] - self.first[lane] for lane in self.lanes)

    def ready_lane(self) -> int | None:
        """A lane whose next-needed window has finished computing (for non-deterministic mode)."""
        for (lane, w), handle in self.inflight.items():
            if w == self.next_needed[lane] and handle.done():
                return lane
        return None

    def check_open(self) -> None:
        """A :class:`ClosedError` once :meth:`close` ran."""
        if self._closed:
            raise ClosedError("this batch iterator was closed (its pipeline was closed or a new "
                              "iteration replaced it); start a new one with iter(pipeline)")

    def close(self) -> None:
        self._closed = True
        for handle in self.inflight.values():
            handle.release()
        self.inflight.clear()
