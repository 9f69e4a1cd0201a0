"""Resolve a dataset path (file, directory or glob; local or any fsspec URL) to its files.

Pure apart from listing the filesystem. Hidden entries (a path component starting
with ``.`` or ``_``, e.g. ``_SUCCESS``), the index cache and ``zarr.json`` metadata
are never data files.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from ..errors import DatasetNotFoundError

INDEX_NAME = "index.json"
_GLOB_CHARS = frozenset("*?[")
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "created")


@dataclass(frozen=True)
class FileInfo:
    """One data file as listed: filesystem-internal ``name``, user-facing ``url``, ``rel`` to the root."""

    name: str
    url: str
    rel: str
    size: int
    mtime: float | None


def has_glob(path: str) -> bool:
    """Whether ``path`` contains glob characters."""
    return any(c in _GLOB_CHARS for c in path)


def filesystem(path: str, storage_options: dict[str, Any] | None) -> tuple[AbstractFileSystem, str]:
    """``(filesystem, internal path)`` for a local path or fsspec URL."""
    return fsspec.core.url_to_fs(str(path), **(storage_options or {}))


def is_local(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is the local filesystem (its paths are then kept as plain paths)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return "file" in protocols


def to_url(fs: AbstractFileSystem, name: str) -> str:
    """The path a user (or a worker) opens: a plain local path or a full fsspec URL."""
    return name if is_local(fs) else fs.unstrip_protocol(name)


def file_mtime(info: dict[str, Any]) -> float | None:
    """Modification time (POSIX seconds) from an fsspec ``info`` dict, if the backend reports one."""
    for key in _MTIME_KEYS:
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _hidden(rel: str) -> bool:
    """Hidden entries, the index cache and zarr metadata are never data files."""
    base = posixpath.basename(rel)
    return (
        base in (INDEX_NAME, "zarr.json")
        or base.startswith(f"{INDEX_NAME}.tmp")
        or any(part.startswith((".", "_")) for part in rel.split("/"))
    )


def _glob_root(pattern: str) -> str:
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        if has_glob(part):
            return "/".join(parts[:i]) or "/"
    return posixpath.dirname(pattern)


@dataclass(frozen=True)
class Listing:
    """What a path resolved to: ``kind`` is ``"file"``, ``"dir"`` or ``"glob"``."""

    fs: AbstractFileSystem
    kind: str
    searched: str
    files: list[FileInfo]


def list_files(path: str, storage_options: dict[str, Any] | None = None) -> Listing:
    """The data files of a file, a directory (recursive) or a glob.

    Files are sorted by their path relative to the root (the directory, the glob's
    fixed prefix, or the file's own directory). Raises DatasetNotFoundError when
    the path does not exist; an empty result is returned as is.
    """
    fs, fpath = filesystem(path, storage_options)
    if has_glob(fpath):
        kind, root, searched = "glob", _glob_root(fpath), f"files matching the glob {path!r}"
        infos = fs.glob(fpath, detail=True)
    elif fs.isdir(fpath):
        kind, root = "dir", fpath.rstrip("/") or "/"
        searched = f"files under the directory {path!r}"
        infos = fs.find(fpath, detail=True)
    elif fs.isfile(fpath):
        kind, root, searched = "file", posixpath.dirname(fpath), f"the file {path!r}"
        infos = {fpath: fs.info(fpath)}
    else:
        raise DatasetNotFoundError(
            f"dataset path {path!r} does not exist (looked for a file, a directory or a glob)"
        )
    files = []
    for name, info in infos.items():
        rel = posixpath.relpath(name, root)
        if info.get("type") == "file" and not _hidden(rel):
            files.append(FileInfo(name, to_url(fs, name), rel, int(info["size"]), file_mtime(info)))
    files.sort(key=lambda f: f.rel)
    return Listing(fs, kind, searched, files)


def extension(name: str) -> str:
    """The lower-cased last extension of ``name`` (``".jsonl"``), or ``""``."""
    return posixpath.splitext(name)[1].lower()
