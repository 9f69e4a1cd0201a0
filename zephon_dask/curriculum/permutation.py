"""A seed-keyed bijection of ``range(n)`` evaluated pointwise. Pure.

A balanced Feistel network over ``2 * half_bits`` bits with cycle walking
maps ``[0, n)`` onto itself. Any element (and its inverse) is computed in
O(1) without materialising the permutation, so a shard of a billion samples
or a block of lanes costs nothing until it is touched. The round function is
the SplitMix64 finaliser, written out here so the permutation depends on no
library's random-number algorithm and stays identical across numpy versions.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _half_bits(n: int) -> int:
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _rounds(x: np.ndarray, ks: list, half: int, inverse: bool) -> np.ndarray:
    """The Feistel rounds on ``x`` under round keys ``ks`` (``ROUNDS`` uint64 scalars, or arrays
    of ``x``'s shape: a key per element)."""
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    left, right = x >> shift, x & mask
    if not inverse:
        for k in ks:
            left, right = right, left ^ (mix64(right ^ k) & mask)
    else:
        for k in reversed(ks):
            left, right = right ^ (mix64(left ^ k) & mask), left
    return (left << shift) | right


def _walk(idx: np.ndarray, n: int, ks: list, inverse: bool) -> np.ndarray:
    """:func:`_rounds` with cycle walking back into ``[0, n)``; an array key follows its element."""
    half = _half_bits(n)
    with np.errstate(over="ignore"):
        x = _rounds(idx.astype(np.uint64), ks, half, inverse)
        out = x >= np.uint64(n)
        while out.any():  # cycle walking: expected < 4 passes
            x[out] = _rounds(x[out], [k if np.ndim(k) == 0 else k[out] for k in ks], half, inverse)
            out = x >= np.uint64(n)
    return x.astype(np.int64)


def permute(index, n: int, keys: tuple[int, ...], *, inverse: bool = False) -> np.ndarray:
    """Image of ``index`` (array-like of ints in ``[0, n)``) under the keyed permutation.

    ``inverse=True`` evaluates the inverse permutation. Returns int64.
    """
    idx = np.asarray(index, dtype=np.int64)
    if n <= 1:
        return np.zeros_like(idx)
    return _walk(idx, n, [np.uint64(k) for k in keys[:ROUNDS]], inverse)


def permute_each(index, n: int, keys: np.ndarray, *, inverse: bool = False) -> np.ndarray:
    """:func:`permute` of each ``index[i]`` under its own keys ``keys[i]`` (a uint64 array of
    shape ``(len(index), >= ROUNDS)``), in one vectorised pass. Returns int64."""
    idx = np.asarray(index, dtype=np.int64)
    if n <= 1:
        return np.zeros_like(idx)
    keys = np.asarray(keys, dtype=np.uint64)
    return _walk(idx, n, [keys[:, r] for r in range(ROUNDS)], inverse)


def permutation(n: int, keys: tuple[int, ...]) -> np.ndarray:
    """The whole permutation of ``range(n)`` as an int64 array (for small ``n``)."""
    return permute(np.arange(n, dtype=np.int64), n, keys)
