"""Shuffles whose randomness comes from record identities. Pure per window.

Each sample's 64-bit key hashes the seed with its first lineage row
``(dataset, shard, offset, token_start)``. Three algorithms use the keys:

* ``"reservoir"``: the reservoir fills to ``buffer_size``; each later sample
  evicts the slot its own key names, and the flush emits what is left in key
  order;
* ``"block"``: the window's samples are cut, in arrival order, into blocks of
  ``buffer_size``; each block is emitted in key order;
* ``"block_warmup"``: like ``"block"``, but the blocks grow: the first holds
  ``max(1, buffer_size // 16)`` samples and each next one twice the last, up to
  ``buffer_size`` (:func:`warmup_sizes`), so a window's first samples are not held
  back by a full buffer.

No running counter or RNG state is involved, so the output depends only on the
window's samples and the seed: the same on any runner and after any resume.
"""

from __future__ import annotations

import numpy as np

from ..curriculum.permutation import mix64
from ..curriculum.seeding import stream_keys
from ..validate import check_choice, check_int
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


WARMUP_DIVISOR = 16  # block_warmup's first block: buffer_size // WARMUP_DIVISOR samples (at least 1)


def warmup_sizes(n: int, buffer_size: int) -> list[int]:
    """Block sizes of ``"block_warmup"`` over ``n`` samples: ``max(1, buffer_size // 16)``,
    doubling up to ``buffer_size``, the last block whatever is left."""
    sizes, size = [], max(1, buffer_size // WARMUP_DIVISOR)
    while n > 0:
        sizes.append(min(size, n))
        n -= sizes[-1]
        size = min(size * 2, buffer_size)
    return sizes


def block_order(keys: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Output order (indices into the input): consecutive blocks of ``sizes``, each in key order."""
    parts, start = [], 0
    for size in sizes:
        parts.append(start + np.argsort(keys[start:start + size], kind="stable"))
        start += size
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


ALGORITHMS = ("reservoir", "block", "block_warmup")


class Shuffle(Accumulator):
    """``.shuffle(buffer_size, seed=None, algorithm="reservoir")``: ``seed=None`` uses the pipeline seed."""

    name = "shuffle"
    one_to_one = True  # it reorders samples inside a window, keeping their count

    def __init__(self, buffer_size: int, seed: int | None = None, algorithm: str = "reservoir"):
        self.buffer_size = check_int(buffer_size, "buffer_size", 1, call="shuffle", hint="e.g. 1024")
        self.seed = check_int(seed, "seed", 0, optional=True, call="shuffle", hint="None: the pipeline seed")
        self.algorithm = check_choice(algorithm, ALGORITHMS, "algorithm", call="shuffle")

    def spec(self) -> dict:
        spec = {"op": "shuffle", "buffer_size": self.buffer_size, "seed": self.seed}
        if self.algorithm != "reservoir":  # the default leaves the fingerprint as it was before the choice
            spec["algorithm"] = self.algorithm
        return spec

    def order(self, keys: np.ndarray) -> np.ndarray:
        """The output order of samples with identity ``keys`` (indices into them)."""
        n, size = len(keys), self.buffer_size
        if self.algorithm == "reservoir":
            return reservoir_order(keys, size)
        if self.algorithm == "block":
            return block_order(keys, [min(size, n - s) for s in range(0, n, size)])
        return block_order(keys, warmup_sizes(n, size))

    def apply(self, table: SampleTable, ctx: WindowContext) -> SampleTable:
        if len(table) < 2:
            return table
        seed = ctx.seed if self.seed is None else self.seed
        return table.take(self.order(identity_keys(table, seed)))
