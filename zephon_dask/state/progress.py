"""``Progress``: what one pipeline has delivered to its caller. Holds state.

It is fed every batch at the moment the caller receives it (never when it
is prefetched or staged), so :meth:`Progress.state` is exactly where the
caller stands. Training frameworks fetch a batch or two ahead of the step
they run, so it also keeps a bounded undo ring of the last
:data:`CONSUMED_RING` deliveries: :meth:`Progress.state` can be asked for the
state as of an earlier delivery (``ahead``, ``at_step``, or the watermark
:meth:`Progress.mark_consumed` sets). It also decides where an iteration
starts (:func:`start_lane`; a new pass over the stream: :func:`pass_start`)
and appends the run ledger.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from dataclasses import replace

import numpy as np

from ..errors import StateError, ZephonWarning, user_stacklevel
from .history import StepHistory
from .ledger import LedgerWriter
from .schema import LaneProgress, State, StepProgress, pointer_key
from .steps import StepShape

CONSUMED_RING = 64  # deliveries a state can be rewound by (batches fetched ahead of the step)


def resume_point(resume: State | None, lanes: list[int]) -> tuple[dict[int, LaneProgress], int]:
    """Each lane's saved progress (fresh when absent) and the lane the round-robin starts at."""
    saved = resume.lanes if resume is not None else {}
    progress = {lane: saved.get(lane, LaneProgress()) for lane in lanes}
    return progress, start_lane(lanes, progress, resume.pointers if resume is not None else {})


def start_lane(lanes: list[int], progress: dict[int, LaneProgress], pointers: dict[str, int]) -> int:
    """Where the round-robin over ``lanes`` starts.

    The saved pointer when its key (these exact lanes) matches; otherwise the
    unfinished lane with the fewest delivered batches, lowest lane id on ties.
    """
    key = pointer_key(0, 1, lanes)
    if key in pointers and pointers[key] in lanes:
        return pointers[key]
    live = [lane for lane in lanes if not progress[lane].finished] or list(lanes)
    return min(live, key=lambda lane: (progress[lane].batches_delivered, lane))


def behind(state: State, lanes: list[int]) -> list[int]:
    """Those of ``lanes`` that delivered fewer batches than some lane of ``state``. Lanes whose
    pass ends on whole steps advance a step at a time together: these still owe their batches of
    the step the others have begun."""
    most = max((p.batches_delivered for p in state.lanes.values()), default=0)
    return [lane for lane in lanes if state.lanes[lane].batches_delivered < most]


def pass_start(state: State) -> State:
    """The state a new pass over the stream starts at after ``state``: every lane of ``state``
    at its beginning, the round-robin at its first lane, and the count at the global step after
    ``state``'s (a step left unfinished ends with its pass, as frameworks step the optimizer on
    an epoch's last batch). The data config and G are ``state``'s. Pure."""
    step = state.step
    return replace(state, lanes={lane: LaneProgress() for lane in state.lanes}, pointers={},
                   step=replace(step, global_step=step.global_step + (1 if step.batches_in_step else 0),
                                batches_in_step=0))


class Progress:
    """Per-lane progress, the group pointer, the step count and the ledger of one iteration."""

    def __init__(self, spec, lanes: list[int], resume: State | None, shape: StepShape,
                 ledger: LedgerWriter | None = None, first_lane: int | None = None):
        self.fingerprint, self.config = spec.fingerprint, spec.config()
        self.lanes = list(lanes)
        self.lane, self.first_lane = resume_point(resume, self.lanes)
        self.start_at = {lane: (p.window, p.offset) for lane, p in self.lane.items()}  # each lane's frontier at the start
        if first_lane is not None:
            self.first_lane = first_lane
        self.next_lane = self.first_lane
        self.shape = shape
        step = resume.step if resume is not None else None
        self.start_step = step.global_step if step is not None else 0
        self.delivered = 0  # since the start_step boundary
        if step is not None and step.batches_per_step == shape.per_rank and step.dp_degree == shape.dp_degree:
            self.delivered = step.batches_in_step
        self.count = 0  # batches delivered by this iteration
        self._undo: deque[tuple] = deque(maxlen=CONSUMED_RING)  # per delivery: lane, id, its progress before, pointer
        self.consumed: int | None = None  # the watermark: deliveries the training step has consumed
        self.ledger = ledger
        self._ends: dict[int, int] = {}  # lane -> batch count at which it is known to end
        # throughput and mixture, for stats() only (never part of the data or the state)
        self.started = time.perf_counter()
        self.ended: float | None = None  # when the iteration was closed: its rate stops there
        self.tokens = self.slots = self.batches = 0
        self._counts = np.zeros((2, len(spec.source.names)), dtype=np.int64)  # both, added as one
        self.dataset_tokens, self.dataset_samples = self._counts  # views: tokens, records started
        self.history = StepHistory(len(spec.source.names))  # per step: tokens and samples per dataset, real, slots

    @property
    def batches_per_step(self) -> int:
        return self.shape.per_rank

    def lane_finished(self, lane: int, batches: int) -> None:
        """The lane has no batch after its ``batches``-th; finished once those are delivered."""
        self._ends[lane] = batches
        if self._ended(lane, self.lane[lane].batches_delivered):
            self.lane[lane] = self.lane[lane]._replace(finished=True)

    def _ended(self, lane: int, delivered: int) -> bool:
        """Whether the lane has no batch after its first ``delivered``."""
        end = self._ends.get(lane)
        return end is not None and end <= delivered

    @property
    def global_step(self) -> int:
        return self.start_step + self.delivered // self.shape.per_rank

    def observe(self, lane: int, index_in_lane: int, window: int, offset: int, last: bool,
                tokens, counts) -> None:
        """Record one batch handed to the caller (its token matrix; ``counts``: ``[2, datasets]``,
        its real tokens and records started per dataset)."""
        step = self.global_step
        if self.ledger is not None:
            self.ledger.write(step, lane, index_in_lane, tokens)
        real, slots = int(counts[0].sum()), int(np.size(tokens))
        self._counts += counts
        self.history.add(step, real, slots, counts)
        p = self.lane[lane]
        undo = (lane, index_in_lane, p, self.next_lane)
        after = self.lanes[(self.lanes.index(lane) + 1) % len(self.lanes)]
        now = LaneProgress(window, offset, index_in_lane + 1,
                           p.finished or last or self._ended(lane, index_in_lane + 1))
        # The record itself makes no call before its last statement: CPython runs a signal handler
        # (Ctrl-C's KeyboardInterrupt) only after a call or a backward jump, so an interrupt lands
        # before or after a delivery is recorded, never halfway.
        self.lane[lane] = now
        self.next_lane = after
        self.delivered += 1
        self.count += 1
        self.tokens += real
        self.slots += slots
        self.batches += 1
        self._undo.append(undo)

    def observe_batch(self, batch) -> None:
        window, offset = batch.position
        self.observe(batch.lane, batch.index_in_lane, window, offset, batch.last, batch["tokens"],
                     batch.dataset_counts())

    # -- consumed, not fetched ------------------------------------------------------------

    def mark_consumed(self, upto) -> None:
        """Set the watermark: the training step consumed deliveries up to ``upto``.

        ``upto`` is a count of this iteration's deliveries, or the batch itself
        (anything with ``lane`` and ``index_in_lane``: a :class:`Batch`, or a
        dict of tensors from ``to_torch_loader()``), found among the last
        :data:`CONSUMED_RING` deliveries.
        """
        if isinstance(upto, int) and not isinstance(upto, bool):
            count = upto
        else:
            count = self.count - self._ahead_of(_batch_id(upto))
        if not 0 <= count <= self.count:
            raise StateError(f"mark_consumed({upto!r}): this iteration has delivered {self.count} batches")
        self.consumed = count

    def _ahead_of(self, key: tuple[int, int]) -> int:
        """How many deliveries came after the batch ``(lane, index_in_lane)``."""
        for back, (lane, index, _, _) in enumerate(reversed(self._undo)):
            if (lane, index) == key:
                return back
        raise StateError(f"batch (lane {key[0]}, index_in_lane {key[1]}) is not among the last "
                         f"{len(self._undo)} deliveries of this iteration; mark batches as they are "
                         f"consumed (at most {CONSUMED_RING} may be fetched ahead)")

    def _resolve_ahead(self, ahead: int | None, at_step: int | None) -> int:
        if at_step is not None:
            if ahead is not None:
                raise StateError("pass ahead= or at_step=, not both")
            ahead = self.delivered - (at_step - self.start_step) * self.shape.per_rank
            what = f"at_step={at_step}"
        elif ahead is None:
            ahead = 0 if self.consumed is None else self.count - self.consumed
            what = f"the consumed watermark ({self.consumed} of {self.count} deliveries)"
        else:
            what = f"ahead={ahead}"
        reach = len(self._undo)
        if not isinstance(ahead, int) or not 0 <= ahead <= reach:
            raise StateError(f"{what} asks for the state {ahead} deliveries back, but this iteration "
                             f"can go back {reach} (it delivered {self.count}; at most {CONSUMED_RING} "
                             "are kept): take the state when the step ends, or mark_consumed() each batch")
        return ahead

    def state(self, ahead: int | None = None, at_step: int | None = None) -> dict:
        """The state after the consumed deliveries: all of them, or all but the last ``ahead``,
        or those up to the end of global step ``at_step``, or up to the watermark."""
        state = self._state(self._resolve_ahead(ahead, at_step))
        in_step = state.step.batches_in_step
        if in_step and self.shape.warns_mid_step:
            warnings.warn(
                f"state_dict() taken {in_step} batches into a step of {self.shape.per_rank}: a resume "
                f"starts after those {in_step} batches, so they are skipped unless the weights saved "
                "with this state have trained on them (a framework saving between the micro-batches "
                "of an optimizer step has not: take state_dict(at_step=N) with the weights of step N), "
                "and a resume on another topology may interleave lanes differently. Checkpoint at "
                "step boundaries",
                ZephonWarning, stacklevel=user_stacklevel(),
            )
        return state.to_dict()

    def next_pass(self) -> State:
        """The state the next pass over the stream starts at, after this iteration's deliveries
        (see :func:`pass_start`)."""
        return pass_start(self._state(0))

    def _state(self, back: int) -> State:
        """The state after all deliveries but the last ``back`` (within the undo ring)."""
        lanes = dict(self.lane)
        next_lane, delivered = self.next_lane, self.delivered - back
        for lane, _, before, pointer in list(self._undo)[len(self._undo) - back:][::-1]:
            lanes[lane], next_lane = before, pointer
        shape = self.shape
        return State(
            fingerprint=self.fingerprint, config=self.config,
            lanes={lane: lanes[lane] for lane in self.lanes},
            pointers={pointer_key(0, 1, self.lanes): next_lane},
            step=StepProgress(global_step=self.start_step + delivered // shape.per_rank,
                              batches_in_step=delivered % shape.per_rank, batches_per_step=shape.per_rank,
                              dp_degree=shape.dp_degree, global_batches=shape.global_batches,
                              microbatch_size=shape.microbatch),
        )

    @property
    def elapsed_s(self) -> float:
        """Seconds from the iteration's start to now, or to its close."""
        return (self.ended if self.ended is not None else time.perf_counter()) - self.started

    def close(self) -> None:
        if self.ended is None:
            self.ended = time.perf_counter()
        if self.ledger is not None:
            self.ledger.close()


def _batch_id(batch) -> tuple[int, int]:
    """``(lane, index_in_lane)`` of a :class:`Batch` or of a dict of tensors carrying them."""
    try:
        if hasattr(batch, "lane") and hasattr(batch, "index_in_lane"):
            return int(batch.lane), int(batch.index_in_lane)
        return int(batch["lane"]), int(batch["index_in_lane"])
    except (KeyError, TypeError, ValueError):
        raise StateError(f"mark_consumed() needs a count or a batch carrying lane and index_in_lane, "
                         f"got {type(batch).__name__}") from None
