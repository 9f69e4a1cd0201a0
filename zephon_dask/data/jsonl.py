"""JSON Lines shards: line index and random-access reads.

A record is one non-blank line holding a JSON object. Blank and
whitespace-only lines (JSON whitespace: space, tab, CR, LF) are skipped, both
when counting and when reading, so sample offset ``i`` is the ``i``-th
non-blank line. Lines may end in ``\\n`` or ``\\r\\n``; the last line needs no
newline. Compressed files are not supported.

Each file's record spans (byte ``[start, end)`` of every non-blank line) are
found by a vectorised numpy scan over the file in blocks. They are not stored
in ``index.json`` (too big): they live in a per-process LRU (:data:`SPANS`,
bounded in bytes) keyed by ``(path, size, mtime)``; indexing fills it, and any
other process rescans on its first read. A rescan that disagrees with the
indexed size or count raises DataFormatError (the file changed since it was
indexed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from fsspec import AbstractFileSystem

from ..errors import DataFormatError, DatasetNotFoundError, MissingFieldError
from .memo import ByteLRU
from .paths import FileInfo, filesystem
from .shard import Shard

BLOCK = 1 << 26  # bytes scanned per step
GAP = 1 << 16  # byte gap under which two needed lines are fetched in one range
_WHITESPACE = np.frombuffer(b" \t\r\n", dtype=np.uint8)
SPANS = ByteLRU(1 << 30)


def _spans_in(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``(k, 2)`` spans of the non-blank lines among ``[starts, ends)`` of ``arr`` (pure)."""
    length = ends - starts
    first = arr[np.minimum(starts, arr.size - 1)]
    keep = (length > 0) & ~np.isin(first, _WHITESPACE)
    for i in np.flatnonzero((length > 0) & ~keep).tolist():  # rare: leading whitespace
        keep[i] = bool(arr[starts[i] : ends[i]].tobytes().strip(b" \t\r\n"))
    return np.stack([starts[keep], ends[keep]], axis=1)


def scan(fs: AbstractFileSystem, name: str, block: int = BLOCK) -> tuple[np.ndarray, int]:
    """``(spans, file size)``: int64 ``(n, 2)`` byte spans of the non-blank lines of ``name``."""
    parts = [np.empty((0, 2), dtype=np.int64)]
    tail, base, total = b"", 0, 0
    try:
        with fs.open(name, "rb") as f:
            while chunk := f.read(block):
                total += len(chunk)
                buf = tail + chunk
                arr = np.frombuffer(buf, dtype=np.uint8)
                nl = np.flatnonzero(arr == ord("\n"))
                if nl.size == 0:
                    tail = buf
                    continue
                starts = np.concatenate(([0], nl[:-1] + 1))
                parts.append(_spans_in(arr, starts, nl) + base)
                cut = int(nl[-1]) + 1
                tail, base = buf[cut:], base + cut
    except FileNotFoundError:
        raise DatasetNotFoundError(f"JSONL file {name!r} no longer exists") from None
    if tail:
        arr = np.frombuffer(tail, dtype=np.uint8)
        parts.append(_spans_in(arr, np.array([0]), np.array([arr.size])) + base)
    return np.concatenate(parts).astype(np.int64, copy=False), total


def inspect(fs: AbstractFileSystem, f: FileInfo) -> dict[str, Any]:
    """Index entry extras for one file; also primes :data:`SPANS` for this process."""
    spans, size = scan(fs, f.name)
    if size == f.size:
        SPANS.put((f.url, f.size, f.mtime), spans, spans.nbytes)
    return {"num_samples": int(spans.shape[0])}


def _spans(fs: AbstractFileSystem, name: str, shard: Shard) -> np.ndarray:
    key = (shard.path, shard.size_bytes, shard.mtime)
    spans = SPANS.get(key)
    if spans is None:
        spans, size = scan(fs, name)
        if size != shard.size_bytes or spans.shape[0] != shard.num_samples:
            raise DataFormatError(
                f"JSONL file {shard.path!r} changed since it was indexed (indexed: "
                f"{shard.num_samples} records, {shard.size_bytes} bytes; now: "
                f"{spans.shape[0]} records, {size} bytes); rebuild the Dataset to re-index it"
            )
        SPANS.put(key, spans, spans.nbytes)
    return spans


def read(
    shard: Shard,
    offsets: np.ndarray,
    *,
    dataset: str,
    text_field: str,
    storage_options: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The records at ``offsets`` (int64, validated) of ``shard``, in order; fresh dicts each."""
    fs, name = filesystem(shard.path, storage_options)
    spans = _spans(fs, name, shard)
    uniq, inverse = np.unique(offsets, return_inverse=True)
    need = spans[uniq]
    cut = np.flatnonzero(need[1:, 0] - need[:-1, 1] > GAP) + 1
    first = np.concatenate(([0], cut))
    last = np.concatenate((cut, [uniq.size])) - 1
    lo, hi = need[first, 0], need[last, 1]
    blobs = fs.cat_ranges([name] * first.size, lo.tolist(), hi.tolist())
    group = np.repeat(np.arange(first.size), last - first + 1)
    rel = need - lo[group][:, None]
    raw = [blobs[g][s:e] for g, (s, e) in zip(group.tolist(), rel.tolist(), strict=True)]
    return [
        _parse(
            raw[j], text_field, dataset, _Where(fs, name, shard.path, int(uniq[j]), int(need[j, 0]))
        )
        for j in inverse.ravel().tolist()
    ]


@dataclass(frozen=True)
class _Where:
    """Locates a record for error messages (computes the line number only when asked)."""

    fs: AbstractFileSystem
    name: str
    path: str | None
    offset: int
    start: int

    def __str__(self) -> str:
        line = self.fs.cat_file(self.name, 0, self.start).count(b"\n") + 1 if self.start else 1
        return f"{self.path}: line {line} (sample offset {self.offset})"


def _parse(raw: bytes, text_field: str, dataset: str, where: _Where) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError as exc:
        raise DataFormatError(
            f"{where} is not valid JSON ({exc}); fix or remove that line"
        ) from None
    if not isinstance(record, dict):
        raise DataFormatError(
            f"{where} holds a JSON {type(record).__name__}, not an object; "
            "every line must be a JSON object"
        )
    if text_field not in record:
        raise MissingFieldError(
            f"dataset {dataset!r}: {where} has no field {text_field!r}; fields present: "
            f"{sorted(record)}. Pass text_field=<one of them> to Dataset.from_jsonl"
        )
    return record
