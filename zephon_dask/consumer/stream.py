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
batches; otherwise the stream looks ahead at each step's start (from the
pass's second step: the first batch waits for its own lane only) until every
one of its lanes has that step's batches buffered (or has ended). Each lane stops
at its first batch after the last whole step (a lane behind the others after
a mid-step resume on another topology still delivers its batches before it).
Lanes stopped so are not ``finished`` in the state (their data did not run
out): a stream resumed there ends at once, the same way. With an
``agreement`` (:class:`~.pass_end.StepAgreement`) the stream serves a step
only when every DP group holds it whole, so all end on the same step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from ..core.spec import PipelineSpec
from ..errors import EmptyStreamError, StateError, ZephonWarning, user_stacklevel
from .batch import Batch, BatchOptions
from .batcher import LaneBatcher
from .checks import check_first_window, check_mixture_drift, empty_stream, idle_lanes
from .fetcher import WindowFetcher
from .pass_end import KEEP_EVERY_SAMPLE, UNAGREED, PassEnd, StepAgreement
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
        # the first step (of each lane's batches) that is not whole, once known; the last step every
        # lane here was seen to complete, looking ahead; the batches dropped after the pass, counted
        self._end_step = pass_end.steps if pass_end is not None else None
        self._whole_through = -1
        self._dropped = 0
        self._warned = False
        # the DP groups' vote on each step of a pass whose end each group finds on its own
        self.agreement: StepAgreement | None = None
        self.unagreed = False  # several groups, and no vote could be held: said when the pass ends
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
        if self.pass_end is not None and not self._whole(self.batchers[lane].next_index):
            self._stop(lane)
            return None
        if self._fill(lane):
            return self.batchers[lane].pop()
        if self.pass_end is not None and self._fresh and self.batchers[lane].next_index < self.pass_end.per_lane:
            self._no_whole_step()  # the lane ends inside the first step, served without looking ahead
        self.finished[lane] = True
        batch = self.batchers[lane].finish()
        if batch is None and self.on_finish is not None:
            self.on_finish(lane, self.batchers[lane].next_index)
        return batch

    def _whole(self, index: int) -> bool:
        """Whether the global step holding a lane's batch ``index`` is whole (see the module
        docstring); looking ahead, each step is checked once, for every lane here. A pass's first
        step is served without looking ahead (the first batch waits for its own lane only): a lane
        that cannot complete it leaves the pass no whole step, an error raised where it shows."""
        end = self.pass_end
        assert end is not None
        step = index // end.per_lane
        if self._end_step is None and step > self._whole_through:
            if step == 0 and self._fresh:
                self._whole_through = 0
            else:
                self._look_ahead(step)
        if self._end_step == 0 and self._fresh:
            self._no_whole_step()
        return self._end_step is None or step < self._end_step

    def _no_whole_step(self) -> None:
        """Raise :class:`EmptyStreamError` for a pass without a whole step, naming the cause."""
        for lane in self.lanes:  # no sample yet: read on for one, or count every record dropped
            if not self.stats.get("samples"):
                self._fill(lane)
        self._check_not_empty()
        if (idle := idle_lanes(self.spec.source, self.spec.canonical_replicas)) is not None:
            raise EmptyStreamError(f"the pass has no whole global step (drop_last_step): {idle}")
        per_lane = self.pass_end.per_lane  # type: ignore[union-attr]
        raise EmptyStreamError(
            f"the pass has no whole global step: a lane gives fewer than the {per_lane} full "
            f"batch{'es' if per_lane != 1 else ''} each lane holds in a step (a lane without a chunk, "
            "or too little data for the step), so drop_last_step drops every batch. Give every lane "
            "more data (fewer canonical_replicas, a smaller chunk_size or global step), or keep every "
            "sample with .options(drop_last_step=False)")

    def _look_ahead(self, step: int) -> None:
        """Fill every lane here up to the end of ``step``: the pass ends there if one cannot."""
        upto = (step + 1) * self.pass_end.per_lane  # type: ignore[union-attr]
        for lane in self.lanes:
            need = upto - self.batchers[lane].next_index
            if need > 0 and (self.finished[lane] or not self._fill(lane, need)):
                self._end_step = step
                return
        self._whole_through = step

    def _stop(self, lane: int) -> None:
        """The lane's next batch is after the pass's last whole step: the lane stops, its batches
        from here dropped (counted here when not known up front)."""
        if self.pass_end is not None and self.pass_end.steps is None:
            batcher = self.batchers[lane]
            full, rest = divmod(batcher.buffered, batcher.opts.microbatch_size)
            self._dropped += full + (1 if rest and not batcher.opts.drop_last else 0) + (1 if self._fill(lane) else 0)
        self.finished[lane] = True
        self.batchers[lane].finish(keep=False)

    def _refused(self, batch: Batch) -> None:
        """Another DP group cannot complete the step ``batch`` opens: the pass ends before it."""
        step = batch.index_in_lane // self.pass_end.per_lane  # type: ignore[union-attr]
        self._end_step = step if self._end_step is None else min(step, self._end_step)
        self._dropped += 1

    def _warn_dropped(self) -> None:
        """Once the pass has ended on a whole step, say what it dropped (Python's default filter
        shows it once: the text is the same every pass)."""
        end = self.pass_end
        if end is None or self._end_step is None or self._warned:
            return
        self._warned = True
        dropped = end.dropped if end.steps is not None else self._dropped
        if not dropped and not self.unagreed:
            return
        lanes = ",".join(map(str, self.lanes))
        count = f"{dropped} batch{'es' if dropped != 1 else ''}" if end.steps is not None else "batches"
        text = (f"the pass over the stream ends on its last whole global step: {count} of lanes {lanes} after "
                f"it are dropped, so that every step holds {end.per_rank} batches here" if dropped else
                f"the pass over the stream ends on the last whole global step of lanes {lanes}")
        alone = f" {UNAGREED}" if self.unagreed else ""
        warnings.warn(f"{text} (drop_last_step=True; pipeline.num_steps() counts the whole steps).{alone} "
                      f"{KEEP_EVERY_SAMPLE}", ZephonWarning, stacklevel=user_stacklevel())

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
            if batch is None:
                continue
            if self.agreement is None or self.agreement.admit(True):
                return batch
            self._refused(batch)
        if self.agreement is not None:
            self.agreement.admit(False)
        self._warn_dropped()
        self.close()
        self._check_not_empty()
        raise StopIteration

    def _check_not_empty(self) -> None:
        """A stream read from its start that found records and gave no sample raises."""
        if self._fresh and self.stats.get("records") and not self.stats.get("samples"):
            raise empty_stream(self.stats, f"the stream over lanes {self.lanes}, from its start to its end,")

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
