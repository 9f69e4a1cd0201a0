"""``BatchStream``: the tail multiplexer. Holds the per-lane state of one iteration.

It pulls windows through a :class:`WindowFetcher`, cuts each lane's samples
into batches with a :class:`LaneBatcher`, and emits batches in strict
round-robin over the owned lanes, skipping lanes that have finished (a group
owning one lane passes straight through). With ``deterministic=False`` (its
:class:`~.settings.ConsumerSettings`) it emits whichever lane has a batch ready first.

A resumed stream starts each lane at its saved frontier: the fetcher begins
at the saved window, the batcher drops the ``offset`` samples of it that were
delivered, and the round-robin begins at ``first_lane``. A state that the
stream cannot have produced is refused (:class:`StateError`) before any
wrong batch: an offset past its window's end when the lane's window is read,
and a lane the state calls finished that still has a batch to give before
the first batch (genuine finished lanes sit at their end: this reads
nothing, or their last window).

A stream that starts at the beginning checks its first window for data lost
silently and raises when it ends without a sample (:mod:`.checks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from ..core.spec import PipelineSpec
from ..errors import StateError
from .batch import Batch, BatchOptions
from .batcher import LaneBatcher
from .checks import check_first_window, check_mixture_drift, empty_stream
from .fetcher import WindowFetcher
from .settings import ConsumerSettings
from .waiting import FirstBatchWait


class Frontier(Protocol):
    """What a stream reads of a lane's starting point (a state's lane progress, fresh or resumed)."""

    @property
    def window(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def batches_delivered(self) -> int: ...
    @property
    def finished(self) -> bool: ...


EMPTY_WINDOWS_LIMIT = 256  # consecutive windows without a sample before a lane gives up


class BatchStream:
    def __init__(self, spec: PipelineSpec, batch_options: BatchOptions, lanes: list[int], runner,
                 settings: ConsumerSettings, *, start: Mapping[int, Frontier], first_lane: int | None = None):
        self.lanes = list(lanes)
        self.settings = settings
        self.deterministic = settings.deterministic
        self.spec = spec
        at = {lane: start[lane] for lane in self.lanes}
        self._fresh = all(f.window == 0 and f.offset == 0 and f.batches_delivered == 0 and not f.finished
                          for f in at.values())
        self._check_first = self._fresh
        self.finished = {lane: bool(at[lane].finished) for lane in self.lanes}
        self._skip = {lane: at[lane].offset for lane in self.lanes}
        ends = {lane: spec.num_windows(lane) for lane in self.lanes}
        self._unverified = [lane for lane in self.lanes if self.finished[lane]
                            and ((end := ends[lane]) is None or at[lane].window < end)]
        for lane in self._unverified:
            self.finished[lane] = False
        live = [lane for lane in self.lanes if not self.finished[lane]]
        self.fetcher = WindowFetcher(spec, runner, live, settings, start_windows={lane: at[lane].window for lane in live})
        self.batchers = {
            lane: LaneBatcher(lane, batch_options, spec.source.names,
                              first_index=at[lane].batches_delivered,
                              position=(at[lane].window, at[lane].offset), batch_ops=spec.batch_ops)
            for lane in self.lanes
        }
        # index into self.lanes of the lane that emits next
        self.pointer = self.lanes.index(first_lane) if first_lane in self.lanes else 0
        self.stats: dict[str, int] = {}
        self._drift_warned = False  # ensure_mixture's warn_tolerance: once per iteration
        self._started = False  # whether the first batch was asked for
        self.on_finish: Callable[[int, int], None] | None = None  # called as on_finish(lane, batch count) when a lane ends without a last batch

    def __iter__(self):
        return self

    def _fill(self, lane: int) -> bool:
        """Pull windows until the lane has a full batch; False when the lane has no more."""
        batcher, empty = self.batchers[lane], 0
        while not batcher.ready():
            window = self.fetcher.next_needed[lane]
            out = self.fetcher.get(lane)
            if out is None:
                return False
            empty = 0 if len(out) else empty + 1
            if empty == EMPTY_WINDOWS_LIMIT:  # a repeating source would loop forever
                raise empty_stream(out.stats, f"lane {lane}: {empty} windows in a row (up to window {window})")
            if self._check_first and out.stats.get("records"):
                self._check_first = False
                check_first_window(self.spec, lane, window, out)
            for key, n in out.stats.items():
                self.stats[key] = self.stats.get(key, 0) + n
            if not self._drift_warned:
                self._drift_warned = check_mixture_drift(self.spec, lane, window, out)
            batcher.push(window, out.table, skip=self._skip.pop(lane, 0))
        return True

    def _emit(self, lane: int) -> Batch | None:
        if self._fill(lane):
            return self.batchers[lane].pop()
        self.finished[lane] = True
        batch = self.batchers[lane].finish()
        if batch is None and self.on_finish is not None:
            self.on_finish(lane, self.batchers[lane].next_index)
        return batch

    def _verify_finished(self) -> None:
        """A lane the state calls finished must have no batch left from its frontier."""
        for lane in self._unverified:
            batcher = self.batchers[lane]
            if self._fill(lane) or (batcher.buffered and not batcher.opts.drop_last):
                raise StateError(f"the state says lane {lane} finished at {batcher.position}, but the "
                                 "lane has more samples there: the state is corrupted or forged")
            batcher.finish()
            self.finished[lane] = True
        self._unverified = []

    def __next__(self) -> Batch:
        if not self._started:
            self._started = True
            with FirstBatchWait(self.fetcher):
                batch = self._next()
            self.fetcher.runner.first_batch_taken()
            return batch
        return self._next()

    def _next(self) -> Batch:
        if self._unverified:
            self._verify_finished()
        while not all(self.finished.values()):
            self.fetcher.check_open()  # batches buffered before a close() are not served after it
            at = self._choose()
            self.pointer = (at + 1) % len(self.lanes)
            batch = self._emit(self.lanes[at])
            if batch is not None:
                return batch
        self.close()
        if self._fresh and self.stats.get("records") and not self.stats.get("samples"):
            raise empty_stream(self.stats, f"the stream over lanes {self.lanes}, from its start to its end,")
        raise StopIteration

    def _order(self) -> Iterator[int]:
        """Positions in ``self.lanes`` of the unfinished lanes, round-robin from the pointer; lazy,
        so the deterministic choice costs the same with 16 lanes or 1,024."""
        n = len(self.lanes)
        for k in range(n):
            at = (self.pointer + k) % n
            if not self.finished[self.lanes[at]]:
                yield at

    def _choose(self) -> int:
        """The position in ``self.lanes`` of the lane that emits next (some lane is unfinished)."""
        order = self._order()
        first = next(order)
        if self.deterministic:
            return first
        for at in (first, *order):
            if self.batchers[self.lanes[at]].ready():
                return at
        ready = self.fetcher.ready_lane()
        return self.lanes.index(ready) if ready is not None and not self.finished[ready] else first

    def close(self) -> None:
        self.fetcher.close()
