"""The data layer's per-process caches: least recently used first out, bounded by bytes, the
newest entry kept even alone over the bound."""

from __future__ import annotations

from zephon_dask.data.memo import byte_lru


def test_evicts_least_recently_used_by_bytes():
    cache = byte_lru(10, len)
    cache["a"], cache["b"] = b"aaaa", b"bbbb"
    assert cache.get("a") == b"aaaa"  # a used after b: b goes first
    cache["c"] = b"cccc"
    assert cache.get("b") is None and list(cache) == ["a", "c"] and cache.total_weight == 8
    cache["a"] = b"a"  # storing again replaces the weight
    assert cache.total_weight == 5
    cache["d"] = b"dddddd"
    assert sorted(cache) == ["a", "d"] and cache.total_weight == 7  # c was the least recent
    assert cache.get("missing") is None


def test_the_newest_entry_is_kept_even_alone_over_the_bound():
    cache = byte_lru(10, len)
    cache["a"] = b"aa"
    cache["big"] = b"x" * 25
    assert list(cache) == ["big"] and cache.get("big") == b"x" * 25
    cache["b"] = b"bb"  # the oversize one is the least recent now
    assert list(cache) == ["b"] and cache.total_weight == 2
    cache.clear()
    assert not cache and cache.total_weight == 0
