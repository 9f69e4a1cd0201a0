"""Task keys built from the pipeline fingerprint and indices. Pure.

Keys are readable strings, identical in every process and on every machine
for the same data configuration, and they change whenever anything that
changes a task's value changes (the fingerprint covers all of it). Dask's
dashboard groups tasks by ``dask.utils.key_split``: the words before the first
one that is not all letters, so the fingerprint and the indices are dropped
and the groups are ``zephon-spec``, ``zephon-chunk``, ``zephon-window``,
``zephon-fused-window``, ``zephon-windows`` (several windows in one task) and
``zephon-again-window`` / ``zephon-again-fused-window`` / ``zephon-again-windows``
(copies of stalled tasks), shared by every pipeline on the cluster. (A
fingerprint whose first 16 hex digits are all letters, about one in 6.5
million, stays in the group name.)
"""

from __future__ import annotations

FP_CHARS = 16


def _fp(fingerprint: str) -> str:
    return fingerprint[:FP_CHARS]


def spec_key(fingerprint: str) -> str:
    return f"zephon-spec-{_fp(fingerprint)}"


def chunk_key(fingerprint: str, lane: int, window: int, i: int) -> str:
    return f"zephon-chunk-{_fp(fingerprint)}-{lane}-{window}-{i}"


def window_key(fingerprint: str, lane: int, window: int, fused: bool = False) -> str:
    kind = "fused-window" if fused else "window"
    return f"zephon-{kind}-{_fp(fingerprint)}-{lane}-{window}"


def windows_key(fingerprint: str, members) -> str:
    """The key of one task computing the windows ``members`` (``(lane, window)`` pairs, in order):
    every member is named, so two tasks share a key only if they compute the same windows."""
    return f"zephon-windows-{_fp(fingerprint)}-" + "-".join(f"{lane}.{window}" for lane, window in members)


def again_key(window_key: str, n: int) -> str:
    """The key of the ``n``-th copy of the window under ``window_key``."""
    return f"zephon-again-{window_key.removeprefix('zephon-')}-{n}"
