"""``LaneBatcher``: cuts one lane's sample stream into batches. Holds state (its buffer).

The lane's stream is the concatenation of its window outputs in window
order; batches may straddle windows. ``drop_last`` applies only at the end of
the lane. The batcher tracks the lane's frontier ``(window, offset)`` (the
next sample it will emit) so every batch says where a resume would start.

The full batches a window has left are cut ahead in one vectorised pass
(:func:`~zephon_dask.consumer.cut.cut_batches`) at the first
:meth:`LaneBatcher.pop` that finds none cut; :meth:`pop` then
hands each out with its int64 arrays (a few numpy calls) and the
bookkeeping. A batch that straddles two windows and the last partial one are
the one-batch case of the same cut (:func:`~zephon_dask.consumer.cut.make_batch`).
"""

from __future__ import annotations

from collections import deque

from ..errors import StateError
from ..operators.custom import apply_batch_ops
from ..operators.table import SampleTable
from .batch import Batch, BatchOptions
from .cut import CutBatch, cut_batches, make_batch


class LaneBatcher:
    def __init__(self, lane: int, opts: BatchOptions, dataset_names: tuple[str, ...], first_index: int = 0,
                 position: tuple[int, int] = (0, 0), batch_ops: tuple = ()):
        self.lane, self.opts, self.names = lane, opts, dataset_names
        self.batch_ops = batch_ops  # map_batch: each batch's arrays go through them once cut
        self.next_index = first_index  # index_in_lane of the next batch
        self.position = position  # (window, offset) of the next sample to emit
        self._tables: deque[tuple[int, int, SampleTable]] = deque()  # (window, offset of row 0, rows)
        self._head = 0  # rows of _tables[0] already batched
        self.buffered = 0
        # the next batches, cut ahead from _tables[0] at _head: only full batches of buffered rows, so
        # none is left when a batch is built one at a time (pop() finds none; finish() has < 1 batch)
        self._cut: deque[CutBatch] = deque()

    def push(self, window: int, table: SampleTable, skip: int = 0) -> None:
        """Append window ``window``'s samples, dropping its first ``skip`` (already delivered)."""
        if skip > len(table):
            raise StateError(f"the state puts lane {self.lane} at sample {skip} of window {window}, which "
                             f"has {len(table)}: the state is corrupted or from other data")
        if skip:
            table = table.slice(skip, len(table))
        if len(table):
            self._tables.append((window, skip, table))
            self.buffered += len(table)

    @property
    def held_nbytes(self) -> int:
        """Bytes of the window tables this lane's batches are cut from."""
        return sum(t.__sizeof__() for _, _, t in list(self._tables))

    def ready(self) -> bool:
        return self.buffered >= self.opts.microbatch_size

    def _advance(self, n: int) -> None:
        """Move the frontier ``n`` rows into the head window (``n`` at most the rows it has left)."""
        window, base, t = self._tables[0]
        self._head += n
        self.buffered -= n
        self.position = (window, base + self._head)
        if self._head == len(t):
            self._tables.popleft()
            self._head = 0
            self.position = (self._tables[0][0], self._tables[0][1]) if self._tables else (window + 1, 0)

    def _take(self, n: int) -> SampleTable:
        parts = []
        while n:
            _, _, t = self._tables[0]
            k = min(n, len(t) - self._head)
            parts.append(t.slice(self._head, self._head + k))
            self._advance(k)
            n -= k
        return SampleTable.concat(parts)

    def _cut_ahead(self) -> None:
        """Cut the full batches the head window has left at the frontier."""
        if self._tables:
            t = self._tables[0][2]
            count = (len(t) - self._head) // self.opts.microbatch_size
            if count:
                self._cut.extend(cut_batches(t, self._head, count, self.opts, len(self.names)))

    def pop(self) -> Batch:
        """The next full batch (call only when :meth:`ready`)."""
        if not self._cut:
            self._cut_ahead()
        if not self._cut:
            return self._emit(self.opts.microbatch_size, last=False)
        cut = self._cut.popleft()
        self._advance(self.opts.microbatch_size)
        batch = Batch(apply_batch_ops(self.batch_ops, cut.arrays()), self.lane, self.next_index, cut.lineage,
                      self.names, self.position, counts=cut.counts)
        self.next_index += 1
        return batch

    def finish(self, keep: bool = True) -> Batch | None:
        """At the lane's end: the last partial batch, unless ``drop_last`` (or not ``keep``: the
        buffered samples are dropped)."""
        if keep and self.buffered and not self.opts.drop_last:
            return self._emit(self.buffered, last=True)
        self._tables.clear()
        self._cut.clear()
        self._head = self.buffered = 0
        return None

    def _emit(self, n: int, last: bool) -> Batch:
        table = self._take(n)
        batch = make_batch(table, self.lane, self.next_index, self.opts, self.names, self.position, last)
        if self.batch_ops:
            batch = Batch(apply_batch_ops(self.batch_ops, dict(batch)), batch.lane, batch.index_in_lane,
                          batch.lineage, batch.dataset_names, batch.position, batch.last, batch.dataset_counts())
        self.next_index += 1
        return batch
