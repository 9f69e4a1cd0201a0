"""Per-file sample counts and their ``index.json`` cache.

``index.json`` lives in the directory holding the files and is keyed by file
name, so several datasets in one directory share it::

    {"version": 1,
     "files": {"a.jsonl": {"format": "jsonl", "size": 123, "mtime": 1.7e9,
                           "num_samples": 10}}}

Format-specific extras ride along (parquet stores its ``columns``). An entry is
reused only when format, size and mtime still match; otherwise the file is
re-inspected (in a thread pool, with a tqdm bar). Writes merge with the entries
already on disk and go through a temp file + rename. The cache is best effort:
an unreadable or unwritable location only costs a rebuild (and one warning).

:func:`build_index` does I/O and writes the cache; nothing else here holds state
except the set of locations already warned about.
"""

from __future__ import annotations

import json
import os
import posixpath
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem

from ..progress_bar import progress_bar
from .paths import INDEX_NAME, FileInfo, is_local

INDEX_VERSION = 1
_MIN_FILES_FOR_BAR = 4
_warned: set[str] = set()

Inspect = Callable[[AbstractFileSystem, FileInfo], dict[str, Any]]


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
) -> IndexResult:
    """Index ``files``: reuse valid cached entries, run ``inspect`` on the rest in parallel.

    ``inspect(fs, file)`` returns at least ``{"num_samples": int}``. A failure
    cancels the files not yet started; of the files that failed, the error of the
    first in ``files`` order is raised, and entries that did finish are still cached.
    """
    by_dir: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        by_dir.setdefault(posixpath.dirname(f.name), []).append(i)
    cached = {d: _load(fs, d) for d in by_dir}
    entries: list[dict[str, Any] | None] = [None] * len(files)
    todo = []
    for d, idx in by_dir.items():
        for i in idx:
            entry = cached[d].get(posixpath.basename(files[i].name))
            if _valid(entry, files[i], fmt):
                entries[i] = entry
            else:
                todo.append(i)
    if todo:
        errors = _run(fs, files, fmt, inspect, sorted(todo), entries, progress, max_workers)
        rebuilt = set(todo)
        for d, idx in by_dir.items():
            fresh = {
                posixpath.basename(files[i].name): entries[i]
                for i in idx
                if i in rebuilt and entries[i] is not None
            }
            if fresh:
                _store(fs, d, fresh)
        if errors:
            raise errors[min(errors)]
    return IndexResult(tuple(entries), len(todo))


def _run(fs, files, fmt, inspect, todo, entries, progress, max_workers) -> dict[int, BaseException]:
    """Inspect ``files[todo]`` in a thread pool, filling ``entries``; returns errors by index."""
    errors: dict[int, BaseException] = {}
    bar = progress_bar(
        total=len(todo),
        desc=f"indexing {fmt}",
        unit="file",
        disable=None if progress and len(todo) >= _MIN_FILES_FOR_BAR else True,
    )
    with bar, ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = {pool.submit(inspect, fs, files[i]): i for i in todo}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                extra = fut.result()
            except Exception as exc:  # re-raised after the pool drains
                errors[i] = exc
                for other in futures:
                    other.cancel()
                continue
            f = files[i]
            entries[i] = {"format": fmt, "size": f.size, "mtime": f.mtime, **extra}
            bar.update()
    return errors


def _valid(entry: Any, f: FileInfo, fmt: str) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("format") == fmt
        and entry.get("size") == f.size
        and entry.get("mtime") == f.mtime
        and isinstance(entry.get("num_samples"), int)
    )


def _load(fs: AbstractFileSystem, directory: str) -> dict[str, Any]:
    """The ``files`` mapping of ``directory``'s index.json; ``{}`` if absent, stale or unreadable."""
    try:
        doc = json.loads(fs.cat_file(posixpath.join(directory, INDEX_NAME)))
    except Exception:  # the cache is best effort: an unreadable one is rebuilt
        return {}
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION:
        return {}
    files = doc.get("files")
    return dict(files) if isinstance(files, dict) else {}


def _store(fs: AbstractFileSystem, directory: str, fresh: dict[str, Any]) -> None:
    """Merge ``fresh`` into ``directory``'s index.json atomically; warn once if impossible."""
    target = posixpath.join(directory, INDEX_NAME)
    tmp = f"{target}.tmp-{uuid.uuid4().hex}"
    try:
        files = {**_load(fs, directory), **fresh}
        doc = {"version": INDEX_VERSION, "files": dict(sorted(files.items()))}
        fs.pipe_file(tmp, json.dumps(doc, indent=1, sort_keys=True).encode())
        if is_local(fs):
            os.replace(tmp, target)  # atomic, and never moves *into* a directory
        else:
            fs.mv(tmp, target)
    except Exception as exc:  # never fail because of the cache
        try:
            fs.rm_file(tmp)
        except Exception:
            pass
        if directory not in _warned:
            _warned.add(directory)
            warnings.warn(
                f"zephon_dask: cannot write the index cache {target!r} ({exc!r}); "
                "continuing without it (files will be re-indexed next time)",
                stacklevel=4,
            )
