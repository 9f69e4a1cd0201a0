"""Each dataset's infinite sample order: position -> (shard, offset). Pure.

Position ``p`` of dataset ``d``'s stream is epoch ``p // N`` and index
``p % N`` of that epoch's permutation of the ``N`` samples. An epoch's order
is built from three keyed bijections, each evaluated only where it is touched:

1. the shard order (``shuffle_shards``),
2. the order within each shard (``shuffle_within_shard``),
3. an optional block shuffle over the flattened order (``shuffle_block_size``):
   positions are permuted inside consecutive blocks of that many samples,
   which mixes shards locally while keeping reads close together.

With ``reshuffle_on_repeat`` each epoch draws fresh keys; otherwise every
epoch repeats epoch 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

# np.unique (locate) imports numpy.ma on its first call: imported with this module instead of
# in the first window's chunk tasks, where every thread of the head start waits for the import
import numpy.ma  # noqa: F401

from .permutation import permute
from .seeding import stream_keys, text_id


@dataclass(frozen=True)
class DatasetOrder:
    """The sample order of one dataset under one seed (immutable, pure)."""

    name: str
    shard_sizes: tuple[int, ...]
    seed: int
    shuffle_shards: bool = True
    shuffle_within_shard: bool = True
    shuffle_block_size: int | None = None
    reshuffle_on_repeat: bool = True

    @cached_property
    def num_samples(self) -> int:
        return int(sum(self.shard_sizes))

    @cached_property
    def _name_id(self) -> int:
        return text_id(self.name)

    def _epoch_key(self, epoch: int) -> int:
        return epoch if self.reshuffle_on_repeat else 0

    def shard_order(self, epoch: int) -> np.ndarray:
        """Shard indices in the order epoch ``epoch`` visits them."""
        s = len(self.shard_sizes)
        idx = np.arange(s, dtype=np.int64)
        if not self.shuffle_shards:
            return idx
        keys = stream_keys(self.seed, "shard-order", self._name_id, self._epoch_key(epoch))
        return permute(idx, s, keys)

    def locate(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, offset)`` int64 arrays for stream positions (any order, repeats allowed)."""
        pos = np.asarray(positions, dtype=np.int64)
        shard = np.empty_like(pos)
        offset = np.empty_like(pos)
        n = self.num_samples
        epochs = pos // n
        for epoch in np.unique(epochs).tolist():
            sel = np.flatnonzero(epochs == epoch)
            shard[sel], offset[sel] = self._locate_in_epoch(int(epoch), pos[sel] - epoch * n)
        return shard, offset

    def _locate_in_epoch(self, epoch: int, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ekey = self._epoch_key(epoch)
        if self.shuffle_block_size:
            index = self._block_shuffle(ekey, index, self.shuffle_block_size)
        order = self.shard_order(epoch)
        sizes = np.asarray(self.shard_sizes, dtype=np.int64)[order]
        starts = np.concatenate(([0], np.cumsum(sizes)))
        rank = np.searchsorted(starts, index, side="right") - 1
        shard = order[rank]
        local = index - starts[rank]
        if not self.shuffle_within_shard:
            return shard, local
        offset = np.empty_like(local)
        for s in np.unique(shard).tolist():
            sel = np.flatnonzero(shard == s)
            keys = stream_keys(self.seed, "within-shard", self._name_id, ekey, s)
            offset[sel] = permute(local[sel], self.shard_sizes[s], keys)
        return shard, offset

    def _block_shuffle(self, ekey: int, index: np.ndarray, block_size: int) -> np.ndarray:
        b = int(block_size)
        n = self.num_samples
        block = index // b
        out = np.empty_like(index)
        for j in np.unique(block).tolist():
            sel = np.flatnonzero(block == j)
            start = j * b
            size = min(b, n - start)
            keys = stream_keys(self.seed, "block-shuffle", self._name_id, ekey, j)
            out[sel] = start + permute(index[sel] - start, size, keys)
        return out
