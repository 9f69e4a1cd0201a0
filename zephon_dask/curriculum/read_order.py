"""The order of records inside a chunk. Pure.

A chunk holds ``counts[c]`` records of each dataset ``c`` (the allocation decides
how many, and which: positions ``[A_c(g), A_c(g+1))`` of each dataset's order).
Here only their order inside the chunk is chosen, from the seed and the global
chunk index ``g``, so it is the same whichever lane or rank reads the chunk:

* ``read_order="weighted_round_robin"`` (default): datasets interleaved by smooth
  weighted round-robin (:func:`~.mixture.interleave`), evenly spread.
* ``read_order="weighted_random"``: a uniformly random arrangement of the same
  counts, drawn from ``SeedSequence((seed, "read-order", g))``.
* ``within_dataset="as_is"`` (default): each dataset's records in its own order;
  ``"shuffle"``: permuted inside the chunk by ``SeedSequence((seed, "within-dataset", g, c))``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .mixture import interleave
from .seeding import text_id

READ_ORDERS = ("weighted_round_robin", "weighted_random")
WITHIN_DATASET = ("as_is", "shuffle")
_READ_ORDER, _WITHIN = text_id("read-order"), text_id("within-dataset")


def _rng(seed: int, *indices: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *indices]))


def dataset_sequence(counts: Sequence[int], read_order: str, seed: int, g: int) -> np.ndarray:
    """The dataset of each slot of chunk ``g`` (``counts[c]`` slots of dataset ``c``)."""
    seq = interleave(tuple(int(n) for n in counts))
    if read_order == "weighted_round_robin":
        return seq
    return _rng(seed, _READ_ORDER, g).permutation(seq)


def within(lo: int, hi: int, within_dataset: str, seed: int, g: int, c: int) -> np.ndarray:
    """Dataset ``c``'s positions ``[lo, hi)`` in chunk ``g``, in the order they are read."""
    positions = np.arange(lo, hi, dtype=np.int64)
    if within_dataset == "as_is" or hi - lo < 2:
        return positions
    return _rng(seed, _WITHIN, g, c).permutation(positions)
