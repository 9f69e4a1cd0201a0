"""Per-file sample counts and their cache, kept in a cache directory of ours.

Nothing is ever written beside the data: the index of the files of one data
directory is one JSON file under :func:`cache_dir` (``index/<hh>/<sha256 of the
directory's URL>.json``), keyed by file name::

    {"version": 5, "url": "/data/web", "sha256": "<of the rest>",
     "files": {"a.jsonl": {"format": "jsonl", "size": 123, "mtime": 1.7e9,
                           "mtime_ns": 1700000000123456789, "etag": null,
                           "fingerprint": "crc32:9f2c...", "digest": "sha256:4be1...",
                           "num_samples": 10}}}

Format-specific extras ride along (parquet and Arrow store their ``columns`` and
their ``types``; an Arrow file in an object store its message layout ``parts``). Each entry records the file's signature
(:mod:`zephon_dask.data.integrity`: size, mtime, etag, and a content fingerprint
for local files, taken afresh on every build) and is reused only when format and
signature still match; otherwise the file is re-inspected (in a thread pool,
with a tqdm bar), and a local file hashed whole (``digest``, SHA-256), so that a
read can tell a file whose mtime alone moved (``touch``, a copy) from a changed
one. The document carries the sha256 of its own content: a cache
that fails it (edited by hand, damaged) is not trusted but rebuilt, with one
warning. Older versions are rebuilt too. Writes merge with the entries already
cached and go through a temp file + rename. The cache is best effort: an
unreadable or unwritable cache only costs a rebuild (and one warning).

The cache directory is, in order: the ``cache_dir`` argument, the
``ZEPHON_DASK_CACHE_DIR`` environment variable, or the user's cache directory
(``~/.cache/zephon_dask`` on Linux, honouring ``XDG_CACHE_HOME``). Deleting it
is always safe.

:func:`build_index` does I/O and writes the cache; nothing else here holds state
except the set of locations already warned about.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import fsspec
import platformdirs
from fsspec import AbstractFileSystem

from ..errors import ZephonWarning, user_stacklevel
from ..progress_bar import progress_bar
from . import integrity
from .integrity import Signature
from .paths import FileInfo, is_local
from .shard import Shard

INDEX_VERSION = 5
CACHE_ENV = "ZEPHON_DASK_CACHE_DIR"
_MIN_FILES_FOR_BAR = 4
_warned: set[str] = set()

Inspect = Callable[[AbstractFileSystem, FileInfo], dict[str, Any]]


def cache_dir(override: str | os.PathLike | None = None) -> str:
    """Our cache directory: ``override``, else ``$ZEPHON_DASK_CACHE_DIR``, else the user's cache dir."""
    if override is not None:
        return os.path.abspath(os.path.expanduser(os.fspath(override)))
    env = os.environ.get(CACHE_ENV)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    return platformdirs.user_cache_dir("zephon_dask", appauthor=False)


def index_file(directory_url: str, root: str) -> str:
    """The cache file holding the index of the data directory ``directory_url``. Pure."""
    digest = hashlib.sha256(directory_url.encode()).hexdigest()
    return os.path.join(root, "index", digest[:2], f"{digest}.json")


@dataclass(frozen=True)
class IndexResult:
    """Index entries in the order of the files given, and how many were (re)built."""

    entries: tuple[dict[str, Any], ...]
    rebuilt: int


def build_index(
    fs: AbstractFileSystem,
    files: Sequence[FileInfo],
    fmt: str,
    inspect: Inspect,
    *,
    progress: bool = True,
    max_workers: int | None = None,
    cache: str | os.PathLike | None = None,
) -> IndexResult:
    """Index ``files``: reuse valid cached entries, run ``inspect`` on the rest in parallel.

    ``inspect(fs, file)`` returns at least ``{"num_samples": int}``. A failure
    cancels the files not yet started; of the files that failed, the error of the
    first in ``files`` order is raised, and entries that did finish are still cached.
    ``cache`` overrides the cache directory (see :func:`cache_dir`).
    """
    root = cache_dir(cache)
    sigs = _signatures(fs, files, max_workers)
    by_dir: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        by_dir.setdefault(_dir_url(fs, f.name), []).append(i)
    cached = {d: _load(index_file(d, root), d) for d in by_dir}
    entries: list[dict[str, Any] | None] = [None] * len(files)
    todo = []
    for d, idx in by_dir.items():
        for i in idx:
            entry = cached[d].get(posixpath.basename(files[i].name))
            if _valid(entry, files[i], sigs[i], fmt):
                entries[i] = entry
            else:
                todo.append(i)
    if todo:
        errors = _run(fs, files, sigs, fmt, inspect, sorted(todo), entries, progress, max_workers)
        rebuilt = set(todo)
        for d, idx in by_dir.items():
            fresh = {
                posixpath.basename(files[i].name): entries[i]
                for i in idx
                if i in rebuilt and entries[i] is not None
            }
            if fresh:
                _store(index_file(d, root), d, fresh)
        if errors:
            raise errors[min(errors)]
    done = [e for e in entries if e is not None]
    assert len(done) == len(entries), "every file was indexed or an error was raised"
    return IndexResult(tuple(done), len(todo))


def with_digests(
    shards: Sequence[Shard], fmt: str, *, progress: bool = True, cache: str | os.PathLike | None = None
) -> tuple[Shard, ...]:
    """``shards`` with each local file's whole-file ``digest`` (for formats whose own index
    gives the counts: MDS, litData), hashed when the file is first seen and then kept in the
    index cache beside its signature; shards of other filesystems as given."""
    mine = [i for i, s in enumerate(shards)
            if s.path is not None and "://" not in s.path and s.size_bytes is not None]
    if not mine:
        return tuple(shards)
    fs = fsspec.filesystem("file")
    files = [FileInfo(str(shards[i].path), str(shards[i].path), posixpath.basename(str(shards[i].path)),
                      int(shards[i].size_bytes or 0), shards[i].mtime) for i in mine]
    found = build_index(fs, files, fmt, lambda fs, f: {"num_samples": 0}, progress=progress, cache=cache)
    out = list(shards)
    for i, e in zip(mine, found.entries, strict=True):
        s = shards[i]
        if (e["size"], e["mtime_ns"], e["fingerprint"]) == (s.size_bytes, s.mtime_ns, s.fingerprint):
            out[i] = dataclasses.replace(s, digest=e["digest"])  # the file the shard records
    return tuple(out)


def _dir_url(fs: AbstractFileSystem, name: str) -> str:
    """The URL of the directory holding ``name`` (local paths made absolute)."""
    directory = posixpath.dirname(name)
    return os.path.abspath(directory) if is_local(fs) else fs.unstrip_protocol(directory)


def _signatures(
    fs: AbstractFileSystem, files: Sequence[FileInfo], max_workers: int | None
) -> list[Signature]:
    """Each file's signature now (local files fingerprinted, in a thread pool when many)."""
    if not is_local(fs) or len(files) < _MIN_FILES_FOR_BAR:
        return [integrity.of_file(fs, f) for f in files]
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        return list(pool.map(lambda f: integrity.of_file(fs, f), files))


def _run(fs, files, sigs, fmt, inspect, todo, entries, progress, max_workers) -> dict[int, BaseException]:
    """Inspect ``files[todo]`` in a thread pool, filling ``entries``; returns errors by index."""
    errors: dict[int, BaseException] = {}
    bar = progress_bar(
        total=len(todo),
        desc=f"indexing {fmt}",
        unit="file",
        disable=None if progress and len(todo) >= _MIN_FILES_FOR_BAR else True,
    )
    with bar, ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = {pool.submit(_inspect, inspect, fs, files[i], sigs[i]): i for i in todo}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                extra = fut.result()
            except Exception as exc:  # re-raised after the pool drains
                errors[i] = exc
                for other in futures:
                    other.cancel()
                continue
            sig = sigs[i]
            entries[i] = {"format": fmt, "size": sig.size, "mtime": files[i].mtime, **sig.entry(), **extra}
            bar.update()
    return errors


def _inspect(inspect: Inspect, fs: AbstractFileSystem, f: FileInfo, sig: Signature) -> dict[str, Any]:
    """``inspect``'s extras and, for a local file, its whole-file ``digest`` (``None`` when the
    file changed since ``sig`` was taken, or is not local)."""
    extra = inspect(fs, f)
    return {**extra, "digest": integrity.local_digest(f.name, sig) if is_local(fs) else None}


def _valid(entry: Any, f: FileInfo, sig: Signature, fmt: str) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("format") == fmt
        and entry.get("size") == sig.size
        and entry.get("mtime") == f.mtime
        and all(entry.get(k, "absent") == v for k, v in sig.entry().items())
        and isinstance(entry.get("num_samples"), int)
        and "digest" in entry
    )


def _checksum(doc: dict[str, Any]) -> str:
    """The sha256 of a cache document without its own ``sha256`` key. Pure."""
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _load(target: str, url: str) -> dict[str, Any]:
    """The ``files`` mapping cached for ``url``; ``{}`` if absent, stale or unreadable."""
    try:
        with open(target, "rb") as fh:
            doc = json.load(fh)
    except Exception:  # the cache is best effort: an unreadable one is rebuilt
        return {}
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION or doc.get("url") != url:
        return {}
    if doc.get("sha256") != _checksum(doc):
        if target not in _warned:
            _warned.add(target)
            warnings.warn(
                f"zephon_dask: the index cache {target!r} does not match its own checksum (edited "
                "or damaged); it is not used: the files it lists are indexed again",
                ZephonWarning,
                stacklevel=user_stacklevel(),
            )
        return {}
    files = doc.get("files")
    return dict(files) if isinstance(files, dict) else {}


def _store(target: str, url: str, fresh: dict[str, Any]) -> None:
    """Merge ``fresh`` into the cache file ``target`` atomically; warn once if impossible."""
    tmp = f"{target}.tmp-{uuid.uuid4().hex}"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        files = {**_load(target, url), **fresh}
        doc: dict[str, Any] = {"version": INDEX_VERSION, "url": url, "files": dict(sorted(files.items()))}
        doc["sha256"] = _checksum(doc)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        os.replace(tmp, target)  # atomic, and never moves *into* a directory
    except Exception as exc:  # never fail because of the cache
        try:
            os.remove(tmp)
        except OSError:
            pass
        root = os.path.dirname(os.path.dirname(os.path.dirname(target)))
        if root not in _warned:
            _warned.add(root)
            warnings.warn(
                f"zephon_dask: cannot write the index cache {target!r} ({exc!r}); continuing "
                f"without it (files will be re-indexed next time). Set {CACHE_ENV} or pass "
                "cache_dir= to use a writable directory",
                stacklevel=user_stacklevel(),
            )
