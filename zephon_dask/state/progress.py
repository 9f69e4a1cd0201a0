"""``Progress``: what one pipeline has delivered to its caller. Holds state.

It is fed every batch at the moment the caller receives it (never when it
is prefetched or staged), so :meth:`Progress.state` is exactly where the
caller stands. It also decides where an iteration starts (:func:`start_lane`)
and appends the run ledger.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import ZephonWarning
from .ledger import LedgerWriter
from .schema import FORMAT, VERSION, StateDict, lanes_of, pointer_key

HISTORY_STEPS = 10_000  # global steps kept for stats() and the plots


@dataclass
class LaneProgress:
    """One lane's frontier: next undelivered sample ``(window, offset)``; batches so far."""

    window: int = 0
    offset: int = 0
    batches_delivered: int = 0
    finished: bool = False

    def as_dict(self) -> dict:
        return {"window": self.window, "offset": self.offset,
                "batches_delivered": self.batches_delivered, "finished": self.finished}


def resume_point(resume: dict | None, lanes: list[int]) -> tuple[dict[int, LaneProgress], int]:
    """Each lane's saved progress (fresh when absent) and the lane the round-robin starts at."""
    saved = lanes_of(resume) if resume else {}
    progress = {lane: LaneProgress(**saved[lane]) if lane in saved else LaneProgress() for lane in lanes}
    return progress, start_lane(lanes, progress, resume["pointers"] if resume else {})


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


class Progress:
    """Per-lane progress, the group pointer, the step count and the ledger of one iteration."""

    def __init__(self, spec, lanes: list[int], resume: dict | None, batches_per_step: int | None,
                 explicit_step: bool, dp_degree: int, ledger: LedgerWriter | None = None):
        self.fingerprint, self.config = spec.fingerprint, spec.config()
        self.lanes = list(lanes)
        self.lane, self.first_lane = resume_point(resume, self.lanes)
        self.next_lane = self.first_lane
        self.batches_per_step, self.explicit_step, self.dp_degree = batches_per_step, explicit_step, dp_degree
        step = resume["step"] if resume else None
        self.start_step = step["global_step"] if step else 0
        same_shape = step and step["batches_per_step"] == batches_per_step and step["dp_degree"] == dp_degree
        self.delivered = step["batches_in_step"] if same_shape else 0
        self.ledger = ledger
        self._ends: dict[int, int] = {}  # lane -> batch count at which it is known to end
        # throughput and mixture, for stats() only (never part of the data or the state)
        self.started = time.perf_counter()
        self.tokens = self.slots = self.batches = 0
        self.dataset_tokens = np.zeros(len(spec.source.names), dtype=np.int64)
        self.history: deque[dict] = deque(maxlen=HISTORY_STEPS)  # per step: tokens per dataset, real, slots

    def lane_finished(self, lane: int, batches: int) -> None:
        """The lane has no batch after its ``batches``-th; finished once those are delivered."""
        self._ends[lane] = batches
        self._settle(lane)

    def _settle(self, lane: int) -> None:
        end = self._ends.get(lane)
        if end is not None and end <= self.lane[lane].batches_delivered:
            self.lane[lane].finished = True

    @property
    def global_step(self) -> int:
        return self.start_step + self.delivered // self.batches_per_step

    def observe(self, lane: int, index_in_lane: int, window: int, offset: int, last: bool,
                tokens, dataset_tokens) -> None:
        """Record one batch handed to the caller (its token matrix, real tokens per dataset)."""
        step = self.global_step
        if self.ledger is not None:
            self.ledger.write(step, lane, index_in_lane, tokens)
        real = int(dataset_tokens.sum())
        self.tokens += real
        self.slots += int(np.size(tokens))
        self.batches += 1
        self.dataset_tokens += dataset_tokens
        if not self.history or self.history[-1]["global_step"] != step:
            self.history.append({"global_step": step, "tokens": 0, "slots": 0,
                                 "dataset_tokens": np.zeros_like(self.dataset_tokens)})
        entry = self.history[-1]
        entry["tokens"] += real
        entry["slots"] += int(np.size(tokens))
        entry["dataset_tokens"] += dataset_tokens
        p = self.lane[lane]
        p.window, p.offset, p.batches_delivered = window, offset, index_in_lane + 1
        p.finished = p.finished or last
        self._settle(lane)
        self.next_lane = self.lanes[(self.lanes.index(lane) + 1) % len(self.lanes)]
        self.delivered += 1

    def observe_batch(self, batch) -> None:
        self.observe(batch.lane, batch.index_in_lane, *batch.position, batch.last,
                     batch["tokens"], batch.dataset_tokens())

    def state(self) -> dict:
        in_step = self.delivered % self.batches_per_step
        if in_step and self.explicit_step:
            warnings.warn(
                f"state_dict() taken {in_step} batches into a step of {self.batches_per_step}: "
                "nothing will be skipped or repeated, but a resume on another topology may "
                "interleave lanes differently. Checkpoint at step boundaries",
                ZephonWarning, stacklevel=3,
            )
        return StateDict({
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": self.fingerprint,
            "config": copy.deepcopy(self.config),
            "lanes": {str(lane): self.lane[lane].as_dict() for lane in self.lanes},
            "pointers": {pointer_key(0, 1, self.lanes): self.next_lane},
            "step": {"global_step": self.global_step, "batches_in_step": in_step,
                     "batches_per_step": self.batches_per_step, "dp_degree": self.dp_degree},
        })

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
