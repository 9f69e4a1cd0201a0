"""``BatchStream``: the tail multiplexer. Holds the per-lane state of one iteration.

It pulls windows through a :class:`WindowFetcher`, cuts each lane's samples
into batches with a :class:`LaneBatcher`, and emits batches in strict
round-robin over the owned lanes, skipping lanes that have finished (a group
owning one lane passes straight through). With ``deterministic=False`` it
emits whichever lane has a batch ready first.
"""

from __future__ import annotations

from ..pipeline.spec import PipelineSpec
from .batch import Batch, BatchOptions
from .batcher import LaneBatcher
from .fetcher import WindowFetcher


class BatchStream:
    def __init__(self, spec: PipelineSpec, batch_options: BatchOptions, lanes: list[int], runner,
                 prefetch: int, deterministic: bool = True, fused: bool = False):
        self.lanes = list(lanes)
        self.deterministic = deterministic
        self.fetcher = WindowFetcher(spec, runner, self.lanes, prefetch, fused=fused)
        self.batchers = {lane: LaneBatcher(lane, batch_options, spec.source.names) for lane in self.lanes}
        self.finished = {lane: False for lane in self.lanes}
        self.pointer = 0  # index into self.lanes of the lane that emits next
        self.stats: dict[str, int] = {}

    def __iter__(self):
        return self

    def _fill(self, lane: int) -> bool:
        """Pull windows until the lane has a full batch; False when the lane has no more."""
        batcher = self.batchers[lane]
        while not batcher.ready():
            out = self.fetcher.get(lane)
            if out is None:
                return False
            for key, n in out.stats.items():
                self.stats[key] = self.stats.get(key, 0) + n
            batcher.push(out.table)
        return True

    def _emit(self, lane: int) -> Batch | None:
        if self._fill(lane):
            return self.batchers[lane].pop()
        self.finished[lane] = True
        return self.batchers[lane].finish()

    def __next__(self) -> Batch:
        while not all(self.finished.values()):
            lane = self._choose()
            self.pointer = (self.lanes.index(lane) + 1) % len(self.lanes)
            batch = self._emit(lane)
            if batch is not None:
                return batch
        self.close()
        raise StopIteration

    def _choose(self) -> int:
        n = len(self.lanes)
        order = [self.lanes[(self.pointer + i) % n] for i in range(n)]
        order = [lane for lane in order if not self.finished[lane]]
        if self.deterministic:
            return order[0]
        for lane in order:
            if self.batchers[lane].ready():
                return lane
        ready = self.fetcher.ready_lane()
        return ready if ready is not None and not self.finished[ready] else order[0]

    def close(self) -> None:
        self.fetcher.close()
