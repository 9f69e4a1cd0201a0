"""JSON Lines shards, plain or compressed (gzip, zstd): line index and random-access reads.

A record is one non-blank line holding a JSON object. Blank and
whitespace-only lines (JSON whitespace: space, tab, CR, LF) are skipped, both
when counting and when reading, so sample offset ``i`` is the ``i``-th
non-blank line. Lines may end in ``\\n`` or ``\\r\\n``; the last line needs no
newline. A file is compressed when its magic bytes say so (gzip or zstd,
whatever its extension); spans are then offsets into the decompressed stream,
and reads go through :mod:`zephon_dask.data.compressed`.

Each file's record spans (byte ``[start, end)`` of every non-blank line) are
found by a vectorised numpy scan over the file in blocks. They are not stored
in the index cache (too big): they live in a per-process LRU (:data:`SPANS`,
bounded in bytes) keyed by ``(path, size, mtime)``, with the compressed file's
checkpoints; indexing fills it, and any other process rescans on its first
read. A rescan that disagrees with the indexed size or count raises
DataChangedError (the file changed since it was indexed; ``Dataset.read`` checks
the file's signature before, see :mod:`zephon_dask.data.integrity`).

A plain file in an object store would be fetched whole by that rescan in every
process: indexing also writes its spans to our cache directory
(``spans/<hh>/<sha256 of URL, size and ETag>.npy``, atomically), and a process
missing them in :data:`SPANS` loads that file when its node has it (the
processes of the node that built the Dataset: its Dask workers), so its reads
fetch only byte ranges. Best effort: without the file, the object is scanned.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np
from fsspec import AbstractFileSystem

from ..errors import DataFormatError, DatasetNotFoundError
from . import compressed, fields
from .index import cache_dir
from .integrity import changed
from .memo import byte_lru
from .paths import FileInfo, fetch_ranges, filesystem, is_local
from .reader import Reader
from .shard import Shard

BLOCK = 1 << 23  # bytes scanned per step (a step holds about three times this)
GAP = 1 << 16  # byte gap under which two needed lines are fetched in one range
_WHITESPACE = np.frombuffer(b" \t\r\n", dtype=np.uint8)
SPANS = byte_lru(1 << 30, lambda layout: layout.nbytes)


def _spans_in(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``(k, 2)`` spans of the non-blank lines among ``[starts, ends)`` of ``arr`` (pure)."""
    length = ends - starts
    first = arr[np.minimum(starts, arr.size - 1)]
    keep = (length > 0) & ~np.isin(first, _WHITESPACE)
    for i in np.flatnonzero((length > 0) & ~keep).tolist():  # rare: leading whitespace
        keep[i] = bool(arr[starts[i] : ends[i]].tobytes().strip(b" \t\r\n"))
    return np.stack([starts[keep], ends[keep]], axis=1)


def scan_blocks(blocks: Iterable[bytes]) -> tuple[np.ndarray, int]:
    """``(spans, total bytes)``: int64 ``(n, 2)`` byte spans of the non-blank lines of a byte stream."""
    parts = [np.empty((0, 2), dtype=np.int64)]
    tail, base, total = b"", 0, 0
    for chunk in blocks:
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
    if tail:
        arr = np.frombuffer(tail, dtype=np.uint8)
        parts.append(_spans_in(arr, np.array([0]), np.array([arr.size])) + base)
    return np.concatenate(parts).astype(np.int64, copy=False), total


def _blocks(fh: Any, block: int) -> Iterable[bytes]:
    while chunk := fh.read(block):
        yield chunk


def scan(fs: AbstractFileSystem, name: str, block: int = BLOCK) -> tuple[np.ndarray, int]:
    """``(spans, file size)``: int64 ``(n, 2)`` byte spans of the non-blank lines of a plain file."""
    try:
        with fs.open(name, "rb", block_size=block) as f:  # a remote store's file buffers one block
            return scan_blocks(_blocks(f, block))
    except FileNotFoundError:
        raise DatasetNotFoundError(f"JSONL file {name!r} no longer exists") from None


@dataclass(frozen=True)
class _Layout:
    """A scanned file (per process): record spans, and checkpoints when it is compressed."""

    spans: np.ndarray
    checkpoints: compressed.Checkpoints | None

    @property
    def nbytes(self) -> int:
        return self.spans.nbytes + (self.checkpoints.nbytes if self.checkpoints else 0)


def _scan_any(fs: AbstractFileSystem, name: str, url: str) -> tuple[_Layout, int]:
    """``(layout, file size)`` of a plain or compressed JSONL file (sniffed by magic bytes)."""
    try:
        kind = compressed.codec(fs.cat_file(name, start=0, end=8), url)
        if kind is None:
            spans, size = scan(fs, name)
            return _Layout(spans, None), size
        found: list[compressed.Checkpoints] = []
        spans, _ = scan_blocks(compressed.decompress(fs, name, url, kind, found))
        size = int(fs.size(name))
    except FileNotFoundError:
        raise DatasetNotFoundError(f"JSONL file {url!r} no longer exists") from None
    return _Layout(spans, found[0]), size


def spans_file(url: str, size: int, etag: str) -> str:
    """Where the node keeps the spans of the object ``url`` of this size and ETag."""
    digest = hashlib.sha256(f"{url}\0{size}\0{etag}".encode()).hexdigest()
    return os.path.join(cache_dir(), "spans", digest[:2], f"{digest}.npy")


def _keep_spans(url: str, size: int, etag: str, spans: np.ndarray) -> None:
    target = spans_file(url, size, etag)
    tmp = f"{target}.tmp-{uuid.uuid4().hex}"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(tmp, "wb") as fh:
            np.save(fh, spans, allow_pickle=False)
        os.replace(tmp, target)
    except OSError:  # best effort: the object is scanned instead
        try:
            os.remove(tmp)
        except OSError:
            pass


def _kept_spans(shard: Shard) -> np.ndarray | None:
    """The spans the node kept for ``shard``'s object, if they fit its index; else ``None``."""
    if shard.etag is None or shard.size_bytes is None:
        return None
    try:
        spans = np.load(spans_file(str(shard.path), shard.size_bytes, shard.etag), allow_pickle=False)
    except (OSError, ValueError):
        return None
    ok = (
        spans.dtype == np.int64 and spans.shape == (shard.num_samples, 2)
        and (spans.size == 0 or (int(spans[0, 0]) >= 0 and int(spans[-1, 1]) <= shard.size_bytes))
        and bool(np.all(spans[:, 1] >= spans[:, 0])) and bool(np.all(spans[1:, 0] >= spans[:-1, 1]))
    )
    return spans if ok else None


def inspect(fs: AbstractFileSystem, f: FileInfo) -> dict[str, Any]:
    """Index entry extras for one file; also primes :data:`SPANS` for this process (and, for a
    plain file in an object store, the node's spans file)."""
    layout, size = _scan_any(fs, f.name, f.url)
    if size == f.size:
        SPANS[f.url, f.size, f.mtime] = layout
        if layout.checkpoints is None and f.etag is not None and not is_local(fs):
            _keep_spans(f.url, f.size, f.etag, layout.spans)
    extra: dict[str, Any] = {"num_samples": int(layout.spans.shape[0])}
    if layout.checkpoints is not None:
        extra["codec"] = layout.checkpoints.codec
    return extra


def first_fields(fs: AbstractFileSystem, f: FileInfo) -> list[str]:
    """The field names of the first record of a (non-empty) JSONL file, reading (and
    decompressing) only as far as its first non-blank line; DataFormatError if it is no JSON object."""
    try:
        kind = compressed.codec(fs.cat_file(f.name, start=0, end=8), f.url)
        if kind is None:
            with fs.open(f.name, "rb", block_size=1 << 16) as fh:  # not a remote store's 50 MiB block
                line, number = _first_line(_blocks(fh, 1 << 16))
        else:
            with closing(compressed.head(fs, f.name, f.url, kind)) as blocks:  # decodes no further
                line, number = _first_line(blocks)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"JSONL file {f.url!r} no longer exists") from None
    return sorted(_parse_object(line, f"{f.url}: line {number} (sample offset 0)"))


def _first_line(blocks: Iterable[bytes]) -> tuple[bytes, int]:
    """The first non-blank line of a byte stream and its 1-based line number (``b""`` if none)."""
    buf, skipped = b"", 0
    for chunk in blocks:
        buf += chunk
        while (cut := buf.find(b"\n")) >= 0:
            line, buf = buf[:cut], buf[cut + 1 :]
            if line.strip(b" \t\r"):
                return line, skipped + 1
            skipped += 1
    return buf, skipped + 1


def _layout(fs: AbstractFileSystem, name: str, shard: Shard) -> _Layout:
    key = (shard.path, shard.size_bytes, shard.mtime)
    layout = SPANS.get(key)
    if layout is None and not is_local(fs):
        kept = _kept_spans(shard)
        if kept is not None:
            layout = _Layout(kept, None)
            SPANS[key] = layout
    if layout is None:
        layout, size = _scan_any(fs, name, str(shard.path))
        if size != shard.size_bytes or layout.spans.shape[0] != shard.num_samples:
            raise changed(
                None, str(shard.path), f"indexed: {shard.num_samples} records, {shard.size_bytes} "
                f"bytes; now: {layout.spans.shape[0]} records, {size} bytes"
            )
        SPANS[key] = layout
    return layout


def _fetcher(fs: AbstractFileSystem, name: str, shard: Shard, layout: _Layout) -> Callable:
    """``fetch(lo, hi) -> [bytes]``: byte ranges of the (decompressed) stream."""
    cp = layout.checkpoints
    if cp is None:
        return lambda lo, hi: fetch_ranges(fs, name, lo.tolist(), hi.tolist())
    return lambda lo, hi: compressed.read_ranges(fs, name, str(shard.path), cp, lo, hi)


def read(
    shard: Shard,
    offsets: np.ndarray,
    *,
    dataset: str,
    text_field: str,
    storage_options: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The records at ``offsets`` (int64, validated) of ``shard``, in order; fresh dicts each."""
    assert shard.path is not None, "a file shard has a path"
    fs, name = filesystem(shard.path, storage_options)
    layout = _layout(fs, name, shard)
    fetch = _fetcher(fs, name, shard, layout)
    uniq, inverse = np.unique(offsets, return_inverse=True)
    need = layout.spans[uniq]
    cut = np.flatnonzero(need[1:, 0] - need[:-1, 1] > GAP) + 1
    first = np.concatenate(([0], cut))
    last = np.concatenate((cut, [uniq.size])) - 1
    lo, hi = need[first, 0], need[last, 1]
    blobs = fetch(lo, hi)
    group = np.repeat(np.arange(first.size), last - first + 1)
    rel = need - lo[group][:, None]
    raw = [blobs[g][s:e] for g, (s, e) in zip(group.tolist(), rel.tolist(), strict=True)]
    return [
        _parse(
            raw[j], text_field, dataset, _Where(fetch, shard.path, int(uniq[j]), int(need[j, 0]))
        )
        for j in inverse.ravel().tolist()
    ]


@dataclass(frozen=True)
class _Where:
    """Locates a record for error messages (computes the line number only when asked)."""

    fetch: Callable
    path: str | None
    offset: int
    start: int

    def __str__(self) -> str:
        head = self.fetch(np.array([0]), np.array([self.start]))[0] if self.start else b""
        line = head.count(b"\n") + 1
        return f"{self.path}: line {line} (sample offset {self.offset})"


def _parse_object(raw: bytes, where: object) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError as exc:
        raise DataFormatError(
            f"{where} is not valid JSON ({exc}); fix or remove that line"
        ) from None
    except RecursionError:
        raise DataFormatError(
            f"{where} is nested too deeply to parse ({len(raw):,} bytes); fix or remove that line"
        ) from None
    if not isinstance(record, dict):
        raise DataFormatError(
            f"{where} holds a JSON {type(record).__name__}, not an object; "
            "every line must be a JSON object"
        )
    return record


def _parse(raw: bytes, text_field: str, dataset: str, where: _Where) -> dict[str, Any]:
    record = _parse_object(raw, where)
    if text_field not in record:
        raise fields.missing(dataset, str(where), text_field, list(record))
    return record


def _read(dataset: Any, index: int, offsets: np.ndarray) -> list[dict[str, Any]]:
    return read(
        dataset.shards[index], offsets, dataset=dataset.name, text_field=dataset.text_field,
        storage_options=dataset.storage_options,
    )


EXTENSIONS = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".jsonl.zstd")
READER = Reader("jsonl", "from_jsonl", _read, inspect=inspect, extensions=EXTENSIONS, fields=first_fields,
                doc="JSON Lines, plain or gzip/zstd-compressed (`.jsonl`, `.json`, `.jsonl.gz`, `.jsonl.zst`)")
