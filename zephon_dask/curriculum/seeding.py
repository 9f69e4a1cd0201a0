"""Random streams derived from ``(seed, purpose, indices...)``. Pure.

Every random decision in the curriculum draws its keys from a
:class:`numpy.random.SeedSequence` whose entropy is the run seed, a purpose
tag and integer indices. Strings (tags, dataset names) enter as the first
eight bytes of their SHA-256, never through Python's salted ``hash()``.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

# imported with this module: numpy loads numpy.random on first use, which would be the first iter()
from numpy.random import SeedSequence

from ..validate import check_int


def text_id(text: str) -> int:
    """A stable 64-bit integer for a string (SHA-256 prefix)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def check_seed(seed: object) -> int:
    """Validate a run seed: a non-negative Python or numpy integer."""
    return check_int(seed, "seed", 0, hint="e.g. seed=0")


@lru_cache(maxsize=1024)  # ~0.6 MB, full early; the hot keys (current lane blocks, shard orders) are few
def stream_keys(seed: int, purpose: str, *indices: int, n: int = 8) -> tuple[int, ...]:
    """``n`` 64-bit keys for the stream named by ``(seed, purpose, indices)``."""
    entropy = [seed, text_id(purpose), *(int(i) for i in indices)]
    state = SeedSequence(entropy).generate_state(n, dtype=np.uint64)
    return tuple(int(x) for x in state)
