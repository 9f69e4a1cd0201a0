"""``LaneBatcher``: cuts one lane's sample stream into batches. Holds state (its buffer).

The lane's stream is the concatenation of its window outputs in window
order; batches may straddle windows. ``drop_last`` applies only at the end of
the lane.
"""

from __future__ import annotations

from collections import deque

from ..operators.table import SampleTable
from .batch import Batch, BatchOptions, make_batch


class LaneBatcher:
    def __init__(self, lane: int, opts: BatchOptions, dataset_names: tuple[str, ...], first_index: int = 0):
        self.lane, self.opts, self.names = lane, opts, dataset_names
        self.next_index = first_index  # index_in_lane of the next batch
        self._tables: deque[SampleTable] = deque()
        self._head = 0  # samples of _tables[0] already batched
        self.buffered = 0

    def push(self, table: SampleTable, skip: int = 0) -> None:
        """Append a window's samples, dropping its first ``skip`` (already delivered)."""
        if skip:
            table = table.slice(skip, len(table))
        if len(table):
            self._tables.append(table)
            self.buffered += len(table)

    def ready(self) -> bool:
        return self.buffered >= self.opts.microbatch_size

    def _take(self, n: int) -> SampleTable:
        parts = []
        while n:
            t = self._tables[0]
            k = min(n, len(t) - self._head)
            parts.append(t.slice(self._head, self._head + k))
            self._head += k
            n -= k
            if self._head == len(t):
                self._tables.popleft()
                self._head = 0
        self.buffered -= sum(len(p) for p in parts)
        return SampleTable.concat(parts)

    def pop(self) -> Batch:
        """The next full batch (call only when :meth:`ready`)."""
        return self._emit(self.opts.microbatch_size)

    def finish(self) -> Batch | None:
        """At the lane's end: the last partial batch, unless ``drop_last``."""
        if self.buffered and not self.opts.drop_last:
            return self._emit(self.buffered)
        self._tables.clear()
        self._head = self.buffered = 0
        return None

    def _emit(self, n: int) -> Batch:
        batch = make_batch(self._take(n), self.lane, self.next_index, self.opts, self.names)
        self.next_index += 1
        return batch
