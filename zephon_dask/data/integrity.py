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

import hashlib
import os
import re
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fsspec import AbstractFileSystem

from ..errors import DataChangedError, DatasetNotFoundError
from .paths import FileInfo, file_etag, file_mtime, filesystem, is_local
from .shard import Shard

SPAN = 4096  # bytes hashed at each of the five places
_PLACES = 5
DIGEST = "sha256"  # the whole-file digest an index records for a local file: "sha256:<hex>"
_BLOCK = 1 << 22  # bytes hashed per read of a whole-file digest
_PLAIN_MD5 = re.compile(r"[0-9a-f]{32}")  # an ETag that is the MD5 of the object's bytes
_KEPT = 4096  # re-checked files whose verdict a process keeps
_same: OrderedDict[tuple[str, int, int | None, str | None], bool] = OrderedDict()
_same_lock = threading.Lock()


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


def digest(fh: Any, algorithm: str = DIGEST) -> str:
    """``"<algorithm>:<hex>"`` of everything ``fh`` (a binary file object) reads from its
    position to its end."""
    h = hashlib.new(algorithm)
    while block := fh.read(_BLOCK):
        h.update(block)
    return f"{algorithm}:{h.hexdigest()}"


def local_digest(name: str, sig: Signature) -> str | None:
    """The :data:`DIGEST` of the local file ``name`` if it still has ``sig``'s size and mtime
    before and after hashing (``None``: it changed meanwhile, or is gone)."""
    try:
        with open(name, "rb", buffering=0) as fh:
            before = os.fstat(fh.fileno())
            out = digest(fh)
            after = os.fstat(fh.fileno())
    except FileNotFoundError:
        return None
    stamps = {(st.st_size, st.st_mtime_ns) for st in (before, after)}
    return out if stamps == {(sig.size, sig.mtime_ns)} else None


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


def only_stamps_moved(was: Signature, now: Signature) -> bool:
    """Whether ``now`` differs from ``was`` at most in its mtime and ETag (same size, no sampled
    byte range known to differ): the case a whole-file digest settles. Pure."""
    return was.size == now.size and (
        was.fingerprint is None or now.fingerprint is None or was.fingerprint == now.fingerprint)


def unchanged_tag(was: Signature, now: Signature) -> bool:
    """An object whose ETag and size did not move has the content indexed, whatever its mtime
    says (an ETag changes with every write of other bytes). Pure."""
    return was.etag is not None and was.etag == now.etag and was.size == now.size


def _reference(shard: Shard) -> tuple[str, str] | None:
    """The digest the index recorded for ``shard`` as (algorithm, ``"<algorithm>:<hex>"``): its
    whole-file digest, else its ETag when that is the MD5 of the bytes. Pure."""
    if shard.digest is not None:
        return shard.digest.partition(":")[0], shard.digest
    if shard.etag is not None and _PLAIN_MD5.fullmatch(shard.etag):
        return "md5", f"md5:{shard.etag}"
    return None


def _hash_now(shard: Shard, now: Signature, algorithm: str,
              storage_options: dict[str, Any] | None) -> str | None:
    """The ``algorithm`` digest of ``shard``'s whole file if it still has signature ``now``
    while hashed (``None``: it changed meanwhile)."""
    path = str(shard.path)
    if "://" not in path:
        return local_digest(path, now) if algorithm == DIGEST else None
    if algorithm == "md5" and now.etag is not None and _PLAIN_MD5.fullmatch(now.etag):
        return f"md5:{now.etag}"  # the store already gives the MD5 of these bytes
    fs, name = filesystem(path, storage_options)
    with fs.open(name, "rb") as fh:
        got = digest(fh, algorithm)
    fs.invalidate_cache(name)
    return got if from_info(fs.info(name)) == now else None


def same_content(shard: Shard, now: Signature, storage_options: dict[str, Any] | None) -> bool | None:
    """Whether ``shard``'s file, now with signature ``now``, holds the bytes indexed, by a
    whole-file digest compared with the recorded one; hashed once per process for each
    (path, size, mtime, ETag), the verdict kept. ``None`` when it cannot tell (no digest
    recorded, or the file changed while it was hashed)."""
    ref = _reference(shard)
    if ref is None or shard.path is None:
        return None
    key = (shard.path, now.size, now.mtime_ns, now.etag)
    with _same_lock:
        if key in _same:
            _same.move_to_end(key)
            return _same[key]
    got = _hash_now(shard, now, ref[0], storage_options)
    if got is None:  # nothing kept: the next read decides
        return None
    with _same_lock:
        _same[key] = got == ref[1]
        while len(_same) > _KEPT:
            _same.popitem(last=False)
    return got == ref[1]


def verify(shard: Shard, storage_options: dict[str, Any] | None, dataset: str | None = None) -> Signature | None:
    """Raise :class:`DataChangedError` when ``shard``'s file holds other bytes than its index
    recorded (:class:`DatasetNotFoundError` when it is gone). A shard that records nothing
    passes (``None``); so does a file whose mtime or ETag alone moved when its whole-file digest
    still matches the recorded one (see the module docstring). Returns the file as it is now."""
    was = recorded(shard)
    if was is None:
        return None
    path = str(shard.path)
    try:
        if "://" in path:
            fs, name = filesystem(path, storage_options)
            now = current(fs, name)
        else:  # a local file, as the index names it: no filesystem object needed
            now = local(path)
        found = differences(was, now)
        if not found or unchanged_tag(was, now):
            return now
        if only_stamps_moved(was, now):
            same = same_content(shard, now, storage_options)
            if same:
                return now
            if same is False:
                found.append("content differs (the digest of the whole file)")
    except FileNotFoundError:
        who = f"dataset {dataset!r}: " if dataset else ""
        raise DatasetNotFoundError(
            f"{who}file {shard.path!r} no longer exists (it was indexed when the Dataset was "
            "built); restore it, or rebuild the Dataset without it"
        ) from None
    raise changed(dataset, str(shard.path), "; ".join(found))
