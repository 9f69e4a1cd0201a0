"""Resolve a dataset path (file, directory or glob; local or any fsspec URL) to its files.

Pure apart from listing the filesystem. Symbolic links are followed (a link to a
file is listed under the link's own name, a link to a directory is searched
below the link, each real directory once). Hidden entries (a path component
starting with ``.`` or ``_``, e.g. ``_SUCCESS``), any ``index.json`` (other
tools' index files) and ``zarr.json`` metadata are never data files.
:func:`match_data_files` selects files by Hugging Face ``data_files`` globs.

Object stores: :func:`fs_options` completes ``storage_options`` with our retry
and timeout defaults (:data:`S3_DEFAULTS`) where the user set none, and
:func:`storage_errors` turns what an object store raises into typed errors naming
the URL and what to check (never the options: they may hold credentials).
"""

from __future__ import annotations

import copy
import json
import os
import posixpath
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import fsspec
from fsspec import AbstractFileSystem
from fsspec.utils import glob_translate

from ..errors import (
    ConfigError,
    DataAccessError,
    DataFormatError,
    DatasetNotFoundError,
    StorageAccessError,
    StorageError,
    ZephonError,
)
from . import remote

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


# An S3 filesystem's retries and timeouts unless storage_options set them: botocore's "standard"
# retry mode (exponential backoff with jitter: up to 1, 2, 4, 8 s) retries throttling (503
# SlowDown), 5xx, resets and timeouts; s3fs tries a call 5 times in all on a body cut short, a
# timeout or SlowDown (0.1 s to 0.5 s apart). A request that gets no byte for read_timeout
# seconds has failed. The deadline of one call is thus 5 x 5 x (5 + 15) s plus the waits when
# every attempt times out (about 9 minutes), under 80 s when the store answers errors at once.
S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {
        "retries": {"max_attempts": 5, "mode": "standard"},
        "connect_timeout": 5,
        "read_timeout": 15,
    },
}
_S3_PROTOCOLS = ("s3", "s3a")


NODE_CACHE_KEY = "node_cache"  # ours (zephon_dask.data.node_cache), never passed to fsspec
OWN_KEYS = (NODE_CACHE_KEY, remote.CONFIRM_KEY)  # storage options of ours, never passed to fsspec


def fs_options(path: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` completed with our defaults for ``path``'s protocol, without our own
    keys (a fresh dict). Pure."""
    opts = {k: v for k, v in (storage_options or {}).items() if k not in OWN_KEYS}
    if fsspec.core.split_protocol(str(path))[0] in _S3_PROTOCOLS:
        config = dict(opts.get("config_kwargs") or {})
        for key, value in S3_DEFAULTS["config_kwargs"].items():
            config.setdefault(key, copy.deepcopy(value))
        opts["config_kwargs"] = config
    return opts


def filesystem(path: str, storage_options: dict[str, Any] | None) -> tuple[AbstractFileSystem, str]:
    """``(filesystem, internal path)`` for a local path or fsspec URL (:func:`fs_options` applied)."""
    return fsspec.core.url_to_fs(str(path), **fs_options(path, storage_options))


def fetch_ranges(fs: AbstractFileSystem, name: str, starts: list[int], ends: list[int]) -> list[bytes]:
    """The bytes ``[start, end)`` of file ``name``, one per pair. ``fs.cat_ranges`` returns the
    error of a range it could not read in place of its bytes (a file removed, or made unreadable,
    since it was opened): that error is raised instead. A local file is opened once; from S3, one ``GET`` per range and no
    other request, conditional on the ETag a read expects (:mod:`zephon_dask.data.remote`)."""
    if remote.is_s3(fs):
        return remote.fetch_ranges(fs, name, starts, ends)
    if is_local(fs):  # one open and a pread per range
        fd = os.open(name, os.O_RDONLY)
        try:
            return [os.pread(fd, max(0, end - start), start) for start, end in zip(starts, ends, strict=True)]
        finally:
            os.close(fd)
    blobs = fs.cat_ranges([name] * len(starts), starts, ends)
    for blob in blobs:
        if isinstance(blob, BaseException):
            raise blob
    return blobs


@contextmanager
def read_errors(path: str | None, dataset: str | None = None) -> Iterator[None]:
    """Turn the faults of reading one data file under this block, which reading again would meet
    again, into typed errors naming it: a file gone is a
    :class:`~zephon_dask.errors.DatasetNotFoundError`, a read refused a
    :class:`~zephon_dask.errors.DataAccessError`, a record nested too deeply to parse
    (``RecursionError``) a :class:`~zephon_dask.errors.DataFormatError`. Our own errors pass through."""
    who = f"dataset {dataset!r}: " if dataset else ""
    try:
        yield
    except ZephonError:
        raise
    except FileNotFoundError as exc:
        raise DatasetNotFoundError(f"{who}file {path!r} no longer exists ({exc.strerror or exc}); "
                                   "restore it, or rebuild the Dataset without it") from None
    except PermissionError as exc:
        raise DataAccessError(f"{who}file {path!r} may not be read ({exc.strerror or exc}); give this "
                              "process read permission on it (chmod, the mount's options)") from None
    except RecursionError:
        raise DataFormatError(f"{who}a record of {path!r} is nested too deeply to parse; fix or remove "
                              "that record") from None


def _check_hint(url: str) -> str:
    return (
        f"check the URL {url!r}, the endpoint (endpoint_url in storage_options) and the "
        "credentials (storage_options key/secret, the AWS_* environment variables or the "
        "instance role)"
    )


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Turn an object store's failures under this block into typed errors naming ``url``.

    A refusal (wrong or unknown credentials, no permission) is a
    :class:`~zephon_dask.errors.StorageAccessError`; a failure left after the
    filesystem's retries (throttling, 5xx, resets, timeouts, an unreachable
    endpoint) a :class:`~zephon_dask.errors.StorageError`. Our own errors and a
    missing file pass through. Messages carry the exception's class and text,
    never the storage options.
    """
    try:
        yield
    except (ZephonError, FileNotFoundError):
        raise
    except PermissionError as exc:
        raise StorageAccessError(
            f"the object store refused access to {url!r} ({type(exc).__name__}: {exc}); "
            + _check_hint(url) + ", and that they may read this bucket and key"
        ) from None
    except Exception as exc:
        if not _is_remote_failure(exc):
            raise
        raise StorageError(
            f"reading {url!r} failed after the filesystem's retries ({type(exc).__name__}: {exc}); "
            + _check_hint(url) + "; a store that throttles needs fewer concurrent readers, or "
            "more retries (config_kwargs={'retries': {'max_attempts': N}} in storage_options)"
        ) from None


def _is_remote_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a network or object-store failure (not a bug or a data error)."""
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    module = type(exc).__module__.split(".")[0]
    return module in ("botocore", "aiobotocore", "aiohttp", "urllib3", "fsspec", "s3fs")


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


def list_files(path: str | Sequence[str], storage_options: dict[str, Any] | None = None) -> Listing:
    """The data files of a file, a directory (recursive) or a glob, symbolic links followed; or of
    a list of them, together.

    Files are sorted by their path relative to the root (the directory, the glob's
    fixed prefix, or the file's own directory; for a list, the folder they all lie in).
    Raises DatasetNotFoundError when a path does not exist; an empty result is returned as is.
    """
    if not isinstance(path, str):
        return _list_many([os.fspath(p) for p in path], storage_options)
    with storage_errors(path):
        return _list_files(path, storage_options)


def _list_many(paths: list[str], storage_options: dict[str, Any] | None) -> Listing:
    if not paths:
        raise ConfigError("the dataset path is an empty list; pass a file, a folder, a glob or a list of them")
    listings = [list_files(p, storage_options) for p in paths]
    found = {f.name: f for one in listings for f in one.files}  # a file listed twice is read once
    root = posixpath.commonpath([posixpath.dirname(n) for n in found]) if found else ""
    files = sorted((replace(f, rel=posixpath.relpath(f.name, root)) for f in found.values()),
                   key=lambda f: f.rel)
    kind = "dir" if any(one.kind == "dir" for one in listings) else "file"
    return Listing(listings[0].fs, kind, f"files of the {len(paths)} paths {paths!r}", files)


def _list_files(path: str, storage_options: dict[str, Any] | None) -> Listing:
    fs, fpath = filesystem(path, storage_options)
    if not is_local(fs):
        fs.invalidate_cache()  # see the store as it is now, not as an earlier listing saw it
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
            + _missing_bucket(fs, fpath)
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


def _missing_bucket(fs: AbstractFileSystem, fpath: str) -> str:
    """A note when the bucket of an object-store path itself does not exist ("" otherwise)."""
    if is_local(fs) or "/" not in fpath.strip("/"):
        bucket = fpath.strip("/")
    else:
        bucket = fpath.strip("/").split("/")[0]
    if is_local(fs) or not bucket or fs.exists(bucket):
        return ""
    return f": the bucket {bucket!r} does not exist at this endpoint (check its name and endpoint_url)"


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


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex matching the relative paths that the ``data_files`` glob ``pattern`` selects
    (fsspec's glob rules: ``**`` as a whole path component crosses directories, ``*`` and ``?``
    do not, ``[...]`` is a class, ``[!...]`` its complement). Pure."""
    try:
        return re.compile(glob_translate(pattern.lstrip("/")))
    except ValueError as exc:  # "**" inside a component, e.g. "data/**.jsonl"
        raise ConfigError(f"data_files glob {pattern!r}: {exc}; write '**/*.jsonl' for every "
                          "matching file in any folder, '*' within one folder") from None


def match_data_files(files: Sequence[FileInfo], patterns: Sequence[str]) -> list[FileInfo]:
    """The files whose path relative to the root matches any of the glob ``patterns``. Pure."""
    regexes = [glob_regex(p) for p in patterns]
    return [f for f in files if any(r.fullmatch(f.rel) for r in regexes)]


def extension(name: str) -> str:
    """The lower-cased last extension of ``name`` (``".jsonl"``), or ``""``."""
    return posixpath.splitext(name)[1].lower()


def folder_json(fs: Any, directory: str, name: str) -> Any:
    """The parsed JSON file ``name`` in ``directory`` (a folder layout's index), or ``None`` when it
    is missing, unreadable or not JSON: a folder detector asks, it does not judge."""
    target = f"{directory.rstrip('/')}/{name}"
    if not fs.isfile(target):
        return None
    try:
        return json.loads(fs.cat_file(target))
    except (ValueError, OSError):
        return None
