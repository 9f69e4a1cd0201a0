"""Task keys built from the pipeline fingerprint and indices. Pure.

Keys are readable strings, identical in every process and on every machine
for the same data configuration, and they change whenever anything that
changes a task's value changes (the fingerprint covers all of it). Dask
groups tasks by the prefix before the trailing numbers, so the dashboard
shows ``zephon-chunk-<fp>`` and ``zephon-window-<fp>`` task groups.
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
