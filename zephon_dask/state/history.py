"""``StepHistory``: per global step, tokens and samples per dataset, for ``stats()``. Holds state.

A ring of preallocated numpy arrays: full size from the first step, so a long
run's memory does not creep up as steps accumulate (a growing list of per-step
dicts took ~5 MB by :data:`HISTORY_STEPS` steps, reached hours into a real run).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

HISTORY_STEPS = 10_000  # global steps kept for stats() and the plots


class StepHistory:
    """The last ``capacity`` global steps of ``n_datasets`` datasets: real tokens, slots, and
    tokens and records started per dataset."""

    def __init__(self, n_datasets: int, capacity: int = HISTORY_STEPS):
        self.capacity = capacity
        self._step = np.zeros(capacity, dtype=np.int64)
        self._tokens = np.zeros(capacity, dtype=np.int64)  # real tokens
        self._slots = np.zeros(capacity, dtype=np.int64)
        self._datasets = np.zeros((capacity, 2, n_datasets), dtype=np.int64)  # tokens, samples per dataset
        self._n = 0  # steps ever started; the newest is at (_n - 1) % capacity
        self._i, self._step_now = -1, -1
        self._real = self._slots_now = 0  # the newest step's, written to the arrays when it ends (or is read)
        self._row = self._datasets[0]  # a view of the newest row

    def __len__(self) -> int:
        return min(self._n, self.capacity)

    def add(self, step: int, real: int, slots: int, counts) -> None:
        """Count one batch of global step ``step`` (a new entry when the step changes); ``counts``:
        ``[2, n_datasets]``, its tokens and records started per dataset."""
        if step != self._step_now:
            self._flush()
            i = self._i = self._n % self.capacity
            self._n += 1
            self._step[i] = self._step_now = step
            self._real = self._slots_now = 0
            self._datasets[i] = 0
            self._row = self._datasets[i]
        self._real += real
        self._slots_now += slots
        self._row += counts

    def _flush(self) -> None:
        if self._i >= 0:
            self._tokens[self._i], self._slots[self._i] = self._real, self._slots_now

    def __iter__(self) -> Iterator[dict]:
        """Oldest first: ``{"global_step", "tokens", "slots", "dataset_tokens", "dataset_samples"}``
        (arrays are copies)."""
        self._flush()
        start = self._n - len(self)
        for k in range(start, self._n):
            i = k % self.capacity
            yield {"global_step": int(self._step[i]), "tokens": int(self._tokens[i]),
                   "slots": int(self._slots[i]), "dataset_tokens": self._datasets[i, 0].copy(),
                   "dataset_samples": self._datasets[i, 1].copy()}
