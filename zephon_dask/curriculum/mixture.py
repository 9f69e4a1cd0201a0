"""Exact mixture allocation and in-chunk interleaving. Pure.

``A_c(g)``, the number of samples component ``c`` contributes to chunks
``0..g-1``, is ``floor(g * chunk_size * w_c)`` for every component except the
one with the largest weight (lowest index on ties), which takes the remainder.
Everything is exact integer arithmetic on :class:`fractions.Fraction` weights,
so ``sum_c A_c(g) == g * chunk_size`` for every ``g`` and ``A_c`` is
non-decreasing whenever ``chunk_size * w_max >= components - 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import SupportsFloat, cast

import numpy as np

from ..errors import ConfigError


def exact_weight(value: object, name: str) -> Fraction:
    """A user weight as an exact fraction; floats go through their shortest repr (0.7 -> 7/10)."""
    if isinstance(value, bool | str | bytes):
        raise ConfigError(f"weight for {name!r} is {value!r}, not a number; weights are positive "
                          "numbers, e.g. 0.5 (not a string)")
    try:
        if isinstance(value, Fraction | int):
            w = Fraction(value)
        else:
            f = float(cast(SupportsFloat, value))  # anything else raises TypeError, below
            if not math.isfinite(f):
                raise ConfigError(f"weight for {name!r} is {value!r}; weights must be finite")
            w = Fraction(repr(f))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"weight for {name!r} is {value!r}, not a number") from None
    if w <= 0:
        raise ConfigError(
            f"weight for {name!r} is {value!r}; weights must be > 0 (drop the dataset instead)"
        )
    return w


class Mixture:
    """Normalised weights plus the chunk size: the allocation ``A_c(g)`` (immutable)."""

    def __init__(self, weights: Sequence[Fraction], chunk_size: int, names: Sequence[str]):
        total = sum(weights, Fraction(0))
        self.weights: tuple[Fraction, ...] = tuple(w / total for w in weights)
        self.chunk_size = chunk_size
        self.remainder = max(range(len(self.weights)), key=lambda c: (self.weights[c], -c))
        need = self.min_chunk_size(self.weights)
        if chunk_size < need:
            top = names[self.remainder]
            raise ConfigError(
                f"chunk_size={chunk_size} is too small for {len(self.weights)} datasets whose "
                f"largest weight ({top!r}) is {float(self.weights[self.remainder]):.4g}: "
                f"allocation would not be monotone. Use chunk_size >= {need}"
            )

    @staticmethod
    def min_chunk_size(weights: Sequence[Fraction]) -> int:
        """Smallest chunk size with ``chunk_size * w_max >= components - 1`` (at least 1)."""
        return max(1, math.ceil((len(weights) - 1) / max(weights)))

    def allocated(self, g: int) -> list[int]:
        """``[A_c(g) for c]``: samples of each component in chunks ``0..g-1``."""
        total = g * self.chunk_size
        out = [(total * w.numerator) // w.denominator for w in self.weights]
        out[self.remainder] = 0
        out[self.remainder] = total - sum(out)
        return out

    def counts(self, g: int) -> list[int]:
        """Samples of each component inside chunk ``g``."""
        lo, hi = self.allocated(g), self.allocated(g + 1)
        return [b - a for a, b in zip(lo, hi, strict=True)]


@lru_cache(maxsize=4096)
def interleave(counts: tuple[int, ...]) -> np.ndarray:
    """Component id of each slot of a chunk, by smooth weighted round-robin.

    Each step adds every component's count to its credit, emits the component
    with the most credit (lowest id on ties) and charges it the total. The
    result holds component ``c`` exactly ``counts[c]`` times, spread evenly.
    Returned read-only (cached).
    """
    total = sum(counts)
    credit = [0] * len(counts)
    seq = np.empty(total, dtype=np.int32)
    active = [c for c, n in enumerate(counts) if n > 0]
    for i in range(total):
        best = active[0]
        for c in active:
            credit[c] += counts[c]
            if credit[c] > credit[best]:
                best = c
        credit[best] -= total
        seq[i] = best
    seq.setflags(write=False)
    return seq
