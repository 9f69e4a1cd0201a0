"""Byte-bounded least-recently-used caches for per-process state (:func:`byte_lru`).

The caches themselves live in the modules that fill them; each is process-local
and never pickled with a dataset. :func:`clear_all` empties every one of them,
leaving the process as a fresh Dask worker would start.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from zict import LRU

_MADE: list[LRU] = []  # every cache byte_lru made in this process


def byte_lru(max_bytes: int, nbytes: Callable[[Any], int]) -> LRU[Hashable, Any]:
    """A thread-safe LRU mapping (``cache.get(key)``, ``cache[key] = value``) whose values weigh
    at most ``max_bytes`` in all, a value weighing ``nbytes(value)``: storing one evicts the least
    recently used others until the rest fit. The most recent entry is always kept, even when it
    alone exceeds the bound (its weight counts as the bound: zict would drop it at once)."""
    cache: LRU[Hashable, Any] = LRU(max_bytes, {}, weight=lambda _key, value: min(nbytes(value), max_bytes))
    _MADE.append(cache)
    return cache


def clear_all() -> None:
    """Empty every cache :func:`byte_lru` made in this process: reads then go to the files (or the
    store) again, as in a fresh Dask worker."""
    for cache in _MADE:
        cache.clear()
