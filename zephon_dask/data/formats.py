"""The format registry: every format a :class:`~zephon_dask.data.Dataset` reads, by name.

A new format is one module defining a :class:`~zephon_dask.data.reader.Reader`
and one line in :data:`READERS`. ``Dataset.from_path``, ``Dataset.read`` and
recipes look formats up here. Pure.
"""

from __future__ import annotations

import posixpath

from fsspec import AbstractFileSystem

from ..errors import ConfigError
from . import arrow, jsonl, lance, litdata, mds, parquet, records, tokens
from .reader import Reader

READERS: dict[str, Reader] = {
    r.name: r
    for r in (
        jsonl.READER,
        parquet.READER,
        arrow.READER,
        mds.READER,
        tokens.READER,
        records.READER,
        litdata.READER,
        lance.READER,
    )
}
NAMES = tuple(READERS)
# Folder layouts recognised before file extensions, in this order.
_FOLDERS = ("tokens", "mds", "litdata", "lance", "arrow")


def get(name: str) -> Reader:
    """The reader of format ``name``; ConfigError naming the known formats otherwise."""
    try:
        return READERS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"dataset format must be one of {NAMES}, got {name!r}") from None


def of_file(rel: str) -> Reader | None:
    """The format whose longest extension ends the file name ``rel``, if any."""
    low = rel.lower()
    best: tuple[int, Reader | None] = (0, None)
    for r in READERS.values():
        for ext in r.extensions:
            if low.endswith(ext) and len(ext) > best[0]:
                best = (len(ext), r)
    return best[1]


def extension(rel: str) -> str:
    """The file's known extension (``".jsonl.gz"``), else its last one, else ``"(none)"``."""
    r = of_file(rel)
    if r is not None:
        low = rel.lower()
        return max((e for e in r.extensions if low.endswith(e)), key=len)
    return posixpath.splitext(rel)[1].lower() or "(none)"


def of_folder(fs: AbstractFileSystem, directory: str) -> Reader | None:
    """The format of a folder layout (token store, MDS, litData, Lance, ``save_to_disk``), if it
    is one."""
    for name in _FOLDERS:
        detect = READERS[name].detect
        if detect is not None and detect(fs, directory):
            return READERS[name]
    return None
