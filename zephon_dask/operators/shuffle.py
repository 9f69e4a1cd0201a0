"""Reservoir shuffle whose randomness comes from record identities. Pure per window.

Each sample's 64-bit key hashes the seed with its first lineage row
``(dataset, shard, offset, token_start)``. The reservoir fills to
``buffer_size``; each later sample evicts the slot its own key names, and the
flush emits what is left in key order. No running counter or RNG state is
involved, so the output depends only on the window's samples and the seed.
"""

from __future__ import annotations

import numpy as np

from ..curriculum.permutation import mix64
from ..curriculum.seeding import stream_keys
from ..validate import check_int
from .base import Accumulator, WindowContext
from .table import SampleTable


def identity_keys(table: SampleTable, seed: int) -> np.ndarray:
    """One uint64 key per sample from its first lineage row and the seed."""
    n = len(table)
    first = table.lineage_offsets[:-1]
    has = table.lineage_offsets[1:] > first
    rows = np.zeros((n, 4), dtype=np.int64)
    rows[has] = table.lineage[first[has], :4]
    rows[~has, 3] = -1 - np.flatnonzero(~has)  # samples without lineage: keyed by position
    key = np.full(n, stream_keys(seed, "shuffle")[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in range(4):
            key = mix64(key ^ rows[:, col].astype(np.uint64))
    return key


def reservoir_order(keys: np.ndarray, buffer_size: int) -> np.ndarray:
    """Output order (indices into the input) of the reservoir shuffle."""
    n = len(keys)
    if n <= buffer_size:
        return np.argsort(keys, kind="stable")
    slots = (keys % np.uint64(buffer_size)).astype(np.int64).tolist()
    buffer = list(range(buffer_size))
    out = []
    for i in range(buffer_size, n):
        j = slots[i]
        out.append(buffer[j])
        buffer[j] = i
    rest = np.asarray(buffer, dtype=np.int64)
    rest = rest[np.argsort(keys[rest], kind="stable")]
    return np.concatenate([np.asarray(out, dtype=np.int64), rest])


class Shuffle(Accumulator):
    """``.shuffle(buffer_size, seed=None)``: ``seed=None`` uses the pipeline seed."""

    name = "shuffle"
    one_to_one = True  # it reorders samples inside a window, keeping their count

    def __init__(self, buffer_size: int, seed: int | None = None):
        self.buffer_size = check_int(buffer_size, "buffer_size", 1, call="shuffle", hint="e.g. 1024")
        self.seed = check_int(seed, "seed", 0, optional=True, call="shuffle", hint="None: the pipeline seed")

    def spec(self) -> dict:
        return {"op": "shuffle", "buffer_size": self.buffer_size, "seed": self.seed}

    def apply(self, table: SampleTable, ctx: WindowContext) -> SampleTable:
        if len(table) < 2:
            return table
        seed = ctx.seed if self.seed is None else self.seed
        return table.take(reservoir_order(identity_keys(table, seed), self.buffer_size))
