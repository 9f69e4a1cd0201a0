"""Resolve a dataset path (file, directory or glob; local or any fsspec URL) to its files.

Pure apart from listing the filesystem. Symbolic links are followed (a link to a
file is listed under the link's own name, a link to a directory is searched
below the link, each real directory once). Hidden entries (a path component
starting with ``.`` or ``_``, e.g. ``_SUCCESS``), any ``index.json`` (other
tools' index files) and ``zarr.json`` metadata are never data files.
:func:`match_data_files` selects files by Hugging Face ``data_files`` globs.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from ..errors import DatasetNotFoundError

INDEX_NAME = "index.json"
_GLOB_CHARS = frozenset("*?[")
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "created")
_ETAG_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "sha256")


@dataclass(frozen=True)
class FileInfo:
    """One data file as listed: filesystem-internal ``name``, user-facing ``url``, ``rel`` to the root.

    ``etag`` is the backend's content tag (object stores), when it reports one.
    """

    name: str
    url: str
    rel: str
    size: int
    mtime: float | None
    etag: str | None = None


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


def file_etag(info: dict[str, Any]) -> str | None:
    """The content tag from an fsspec ``info`` dict (ETag, md5, ...), if the backend reports one."""
    for key in _ETAG_KEYS:
        value = info.get(key)
        if isinstance(value, str) and value:
            return value.strip('"')
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
    """The data files of a file, a directory (recursive) or a glob, symbolic links followed.

    Files are sorted by their path relative to the root (the directory, the glob's
    fixed prefix, or the file's own directory). Raises DatasetNotFoundError when
    the path does not exist; an empty result is returned as is.
    """
    fs, fpath = filesystem(path, storage_options)
    if has_glob(fpath):
        kind, root, searched = "glob", _glob_root(fpath), f"files matching the glob {path!r}"
        infos = _follow(fs, fs.glob(fpath, detail=True), recurse=False)
    elif fs.isdir(fpath):
        kind, root = "dir", fpath.rstrip("/") or "/"
        searched = f"files under the directory {path!r}"
        infos = _find(fs, root, {_real(fs, root)})
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
            files.append(
                FileInfo(
                    name, to_url(fs, name), rel, int(info["size"]), file_mtime(info),
                    file_etag(info),
                )
            )
    files.sort(key=lambda f: f.rel)
    return Listing(fs, kind, searched, files)


def _real(fs: AbstractFileSystem, name: str) -> str:
    """Where ``name`` really is (symbolic links resolved, locally), to visit each directory once."""
    return os.path.realpath(name) if is_local(fs) else name


def _find(fs: AbstractFileSystem, root: str, seen: set[str]) -> dict[str, dict[str, Any]]:
    """``fs.find(root)`` with links to files resolved and links to directories searched too."""
    return _follow(fs, fs.find(root, detail=True), recurse=True, seen=seen)


def _follow(
    fs: AbstractFileSystem,
    infos: dict[str, dict[str, Any]],
    *,
    recurse: bool,
    seen: set[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """``infos`` with every entry that is neither a file nor a directory (a link) resolved."""
    out: dict[str, dict[str, Any]] = {}
    for name, info in infos.items():
        if info.get("type") not in ("file", "directory"):
            try:
                info = {**fs.info(name), "name": name}  # follows the link
            except (FileNotFoundError, OSError):
                continue  # a dangling link is no data
            if info.get("type") == "directory" and recurse and seen is not None:
                real = _real(fs, name)
                if real not in seen:
                    seen.add(real)
                    out.update(_find(fs, name, seen))
                continue
        out[name] = info
    return out


# A data_files glob: ``**`` crosses directories, ``*`` and ``?`` do not, ``[...]`` is a class.
_GLOB_TOKEN = re.compile(r"\*\*/?|\*|\?|\[[^\]]*\]|[^*?\[]+")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex matching the relative paths that the ``data_files`` glob ``pattern`` selects. Pure."""
    parts = []
    for tok in _GLOB_TOKEN.findall(pattern.lstrip("/")):
        if tok.startswith("**"):
            parts.append("(?:.*/)?" if tok.endswith("/") else ".*")
        elif tok == "*":
            parts.append("[^/]*")
        elif tok == "?":
            parts.append("[^/]")
        elif tok.startswith("[") and len(tok) > 2:
            body = tok[1:-1].replace("\\", "\\\\")
            parts.append("[" + ("^" + body[1:] if body[0] in "!^" else body) + "]")
        else:
            parts.append(re.escape(tok))
    return re.compile("".join(parts))


def match_data_files(files: Sequence[FileInfo], patterns: Sequence[str]) -> list[FileInfo]:
    """The files whose path relative to the root matches any of the glob ``patterns``. Pure."""
    regexes = [glob_regex(p) for p in patterns]
    return [f for f in files if any(r.fullmatch(f.rel) for r in regexes)]


def extension(name: str) -> str:
    """The lower-cased last extension of ``name`` (``".jsonl"``), or ``""``."""
    return posixpath.splitext(name)[1].lower()
