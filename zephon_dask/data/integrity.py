"""What a shard's file was when it was indexed, and the check that it still is.

A file's :class:`Signature` is its size, its modification time in nanoseconds,
the content tag an object store reports (ETag, md5, ...) and, for a local file,
a content fingerprint: the CRC-32 of :data:`SPAN` bytes at five fixed places
(head, tail and the three quarter points; the whole file when it is smaller
than those together), which catches any accidental rewrite of those bytes
(it is no defence against a forger). The index records a signature per file (the index cache
entries, the :class:`~zephon_dask.data.shard.Shard` fields) and
:func:`verify` compares the file with it each time a task reads the shard
(``Dataset.read``), for every format read from files, so a file rewritten,
appended to, truncated or touched after the Dataset was built raises
:class:`~zephon_dask.errors.DataChangedError` naming the file and what changed,
before a record is read. A local file costs one ``fstat`` and five small reads
per check; a file on another filesystem one ``info`` call (size, mtime or ETag,
whatever the backend reports; no content is fetched for the check).

Pure apart from reading file metadata and those byte ranges.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fsspec import AbstractFileSystem

from ..errors import DataChangedError, DatasetNotFoundError
from .paths import FileInfo, file_etag, file_mtime, filesystem, is_local
from .shard import Shard

SPAN = 4096  # bytes hashed at each of the five places
_PLACES = 5


def ranges(size: int) -> list[tuple[int, int]]:
    """The byte ranges a fingerprint hashes, for a file of ``size`` bytes. Pure."""
    if size <= _PLACES * SPAN:
        return [(0, size)]
    starts = [0, size // 4, size // 2, 3 * size // 4, size - SPAN]
    return [(s, s + SPAN) for s in starts]


@dataclass(frozen=True)
class Signature:
    """A file as it is now: ``size``, ``mtime_ns``, ``etag`` and ``fingerprint`` (``None``: not
    reported by the filesystem, or not taken)."""

    size: int
    mtime_ns: int | None
    etag: str | None = None
    fingerprint: str | None = None

    def entry(self) -> dict[str, Any]:
        """The keys an index entry records (besides ``size``)."""
        return {"mtime_ns": self.mtime_ns, "etag": self.etag, "fingerprint": self.fingerprint}


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e9)


def local(name: str) -> Signature:
    """The signature of the local file ``name``: one ``fstat`` and the fingerprint's reads."""
    fd = os.open(name, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        crc = 0
        for lo, hi in ranges(st.st_size):
            crc = zlib.crc32(os.pread(fd, hi - lo, lo), crc)
    finally:
        os.close(fd)
    return Signature(st.st_size, st.st_mtime_ns, None, f"crc32:{crc:08x}")


def from_info(info: dict[str, Any]) -> Signature:
    """The signature a filesystem's ``info`` dict gives (no content read)."""
    return Signature(int(info["size"]), _ns(file_mtime(info)), file_etag(info))


def of_file(fs: AbstractFileSystem, f: FileInfo) -> Signature:
    """The signature of a listed file: taken afresh for a local file, from the listing otherwise."""
    if not is_local(fs):
        return Signature(f.size, _ns(f.mtime), f.etag)
    try:
        return local(f.name)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"file {f.url!r} no longer exists (it was listed a moment ago)") from None


def current(fs: AbstractFileSystem, name: str) -> Signature:
    """The signature of ``name`` now (a local file's fingerprint included; an object store is
    asked afresh, not its filesystem's listing cache)."""
    if is_local(fs):
        return local(name)
    fs.invalidate_cache(name)
    return from_info(fs.info(name))


def recorded(shard: Shard) -> Signature | None:
    """What ``shard``'s index recorded (``None`` when it records nothing to check: in-memory
    records, token store groups, which check themselves)."""
    if shard.path is None or shard.size_bytes is None:
        return None
    if shard.mtime_ns is None and shard.etag is None and shard.fingerprint is None:
        return None
    return Signature(shard.size_bytes, shard.mtime_ns, shard.etag, shard.fingerprint)


def _when(ns: int | None) -> str:
    if ns is None:
        return "unknown"
    stamp = datetime.fromtimestamp(ns // 10**9, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{ns % 10**9:09d}Z"


def differences(was: Signature, now: Signature) -> list[str]:
    """What changed between two signatures of one file, in words (empty: unchanged). Pure."""
    out = []
    if was.size != now.size:
        out.append(f"size {was.size:,} -> {now.size:,} bytes")
    if was.mtime_ns is not None and was.mtime_ns != now.mtime_ns:
        out.append(f"modified {_when(was.mtime_ns)} -> {_when(now.mtime_ns)}")
    if was.etag is not None and was.etag != now.etag:
        out.append(f"ETag {was.etag!r} -> {now.etag!r}")
    if was.fingerprint is not None and now.fingerprint is not None and was.fingerprint != now.fingerprint:
        out.append("content differs in the sampled byte ranges")
    return out


def changed(dataset: str | None, url: str, what: str) -> DataChangedError:
    """The error for a file that changed since it was indexed; ``what`` says how."""
    who = f"dataset {dataset!r}: " if dataset else ""
    return DataChangedError(
        f"{who}file {url!r} changed since it was indexed ({what}); reading on would give other "
        "records than the Dataset describes: rebuild the Dataset to read the new content "
        "(changed files are indexed again), or restore the file"
    )


def verify(shard: Shard, storage_options: dict[str, Any] | None, dataset: str | None = None) -> None:
    """Raise :class:`DataChangedError` when ``shard``'s file differs from what its index recorded
    (:class:`DatasetNotFoundError` when it is gone). A shard that records nothing passes."""
    was = recorded(shard)
    if was is None:
        return
    path = str(shard.path)
    try:
        if "://" in path:
            fs, name = filesystem(path, storage_options)
            now = current(fs, name)
        else:  # a local file, as the index names it: no filesystem object needed
            now = local(path)
    except FileNotFoundError:
        who = f"dataset {dataset!r}: " if dataset else ""
        raise DatasetNotFoundError(
            f"{who}file {shard.path!r} no longer exists (it was indexed when the Dataset was "
            "built); restore it, or rebuild the Dataset without it"
        ) from None
    found = differences(was, now)
    if found:
        raise changed(dataset, str(shard.path), "; ".join(found))
