"""The :class:`Shard` record: one file (or one in-memory list) of a dataset. Pure data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """One shard of a dataset (immutable, hashable, picklable).

    ``shard_id`` is the path relative to the dataset root (or the user's key for
    in-memory records, or the group name inside a token store); ``path`` is the
    full fsspec URL or local path (``None`` for records). ``size_bytes`` and
    ``mtime`` (seconds, as listed) are the file's size and modification time when
    it was indexed; ``mtime_ns``, ``etag`` and ``fingerprint`` complete its
    signature (see :mod:`zephon_dask.data.integrity`), checked on every read; ``digest``
    (``"sha256:<hex>"`` of the whole file, local files a file index covers) tells a file whose
    mtime alone moved from a changed one. ``parts`` is a
    format's byte layout recorded at indexing, so that a process reads byte ranges without
    scanning the file first (Arrow IPC in an object store: the schema message's range, then
    start, end and rows of each record batch); ``None``: none recorded.
    """

    shard_id: str
    path: str | None
    num_samples: int
    size_bytes: int | None = None
    mtime: float | None = None
    mtime_ns: int | None = None
    etag: str | None = None
    fingerprint: str | None = None
    parts: tuple[int, ...] | None = None
    digest: str | None = None
