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

With a :class:`PassEnd` (``drop_last_step``) the stream ends on a whole global
step: each global step holds ``per_lane`` full batches of every lane, and the stream
ends before the first step one lane cannot complete (a lane's last partial
batch, kept by ``drop_last=False``, is never in a whole step). When the pass's whole
steps are known up front (``steps``) every lane stops after ``steps x per_lane``
batches; otherwise the stream looks ahead at each step's start until every one
of its lanes has that step's batches buffered (or has ended). Lanes stopped so
are not ``finished`` in the state (their data did not run out): a stream
resumed there ends at once, the same way.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..core.spec import PipelineSpec
from ..errors import EmptyStreamError, StateError, ZephonWarning, user_stacklevel
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


@dataclass(frozen=True)
class PassEnd:
    """Where a pass ends with ``drop_last_step``: on a whole global step of ``per_lane`` batches
    of every lane. ``steps``: the pass's whole steps when known up front (else the stream looks
    ahead); ``dropped``: the batches of the stream's lanes after them, when known; ``per_rank``:
    the batches of one step here (for the warning)."""

    per_lane: int
    per_rank: int
    steps: int | None = None
    dropped: int | None = None


EMPTY_WINDOWS_LIMIT = 256  # consecutive windows without a sample before a lane gives up


class BatchStream:
    def __init__(self, spec: PipelineSpec, batch_options: BatchOptions, lanes: list[int], runner,
                 settings: ConsumerSettings, *, start: Mapping[int, Frontier], first_lane: int | None = None,
                 pass_end: PassEnd | None = None):
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
        self.pass_end = pass_end
        self._whole_through = -1  # lookahead: the last step (of lane batches) every lane here completes
        self.on_finish: Callable[[int, int], None] | None = None  # called as on_finish(lane, batch count) when a lane ends without a last batch

    def __iter__(self):
        return self

    def _fill(self, lane: int, batches: int = 1) -> bool:
        """Pull windows until the lane has ``batches`` full batches; False when the lane has no more."""
        batcher, empty = self.batchers[lane], 0
        while batcher.buffered < batches * batcher.opts.microbatch_size:
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
        index = self.batchers[lane].next_index
        if self.pass_end is not None and not self._whole(index):
            self._end_pass(first=index < self.pass_end.per_lane and self._fresh)
            return None
        if self._fill(lane):
            return self.batchers[lane].pop()
        self.finished[lane] = True
        batch = self.batchers[lane].finish()
        if batch is None and self.on_finish is not None:
            self.on_finish(lane, self.batchers[lane].next_index)
        return batch

    def _whole(self, index: int) -> bool:
        """Whether the global step holding each lane's batch ``index`` is whole (see the module
        docstring); looking ahead, it fills every lane here up to that step's end once."""
        end = self.pass_end
        assert end is not None
        step = index // end.per_lane
        if end.steps is not None:
            return step < end.steps
        if step <= self._whole_through:
            return True
        upto = (step + 1) * end.per_lane
        for lane in self.lanes:
            batcher = self.batchers[lane]
            need = upto - batcher.next_index
            if need > 0 and (self.finished[lane] or not self._fill(lane, need)):
                return False
        self._whole_through = step
        return True

    def _available(self, lane: int) -> int:
        """The batches the lane has buffered, its last partial one counted unless ``drop_last``."""
        batcher = self.batchers[lane]
        full, rest = divmod(batcher.buffered, batcher.opts.microbatch_size)
        return full + (1 if rest and not batcher.opts.drop_last else 0)

    def _end_pass(self, first: bool) -> None:
        """End the pass at a whole step: every lane here stops; the batches after it are dropped
        (warned, once per pipeline and place with Python's default filter: the text is the same).
        ``first``: the stream starts a pass and has no whole step, which is an error."""
        end = self.pass_end
        assert end is not None
        if first:
            short = [lane for lane in self.lanes
                     if self.batchers[lane].buffered < end.per_lane * self.batchers[lane].opts.microbatch_size]
            raise EmptyStreamError(
                f"the pass has no whole global step: lanes {short or 'of other DP groups'} give fewer than "
                f"the {end.per_lane} batch{'es' if end.per_lane != 1 else ''} each lane holds in a step, so "
                "drop_last_step drops every batch. Give every lane more data (fewer canonical_replicas, a "
                "smaller chunk_size or global step), or keep every sample with .options(drop_last_step=False)")
        dropped = end.dropped if end.steps is not None else sum(
            self._available(lane) + (0 if self.finished[lane] or not self._fill(lane) else 1)
            for lane in self.lanes)
        for lane in self.lanes:
            self.finished[lane] = True
            self.batchers[lane].finish(keep=False)
        if dropped:
            count = f"{dropped} batch{'es' if dropped != 1 else ''}" if end.steps is not None else "batches"
            warnings.warn(
                f"the pass over the stream ends on its last whole global step: {count} of lanes "
                f"{','.join(map(str, self.lanes))} after it are dropped, so that every step holds "
                f"{end.per_rank} batches here (drop_last_step=True; pipeline.num_steps() counts the "
                "whole steps). To keep every sample, with a shorter last step, set "
                ".options(drop_last_step=False)",
                ZephonWarning, stacklevel=user_stacklevel())

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
