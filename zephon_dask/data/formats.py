"""The format registry: every format a :class:`~zephon_dask.data.Dataset` reads, by name.

A format is one module of this package defining a
:class:`~zephon_dask.data.reader.Reader` as ``READER``: the registry finds it
(:func:`find_readers`), and ``Dataset.from_path``, ``Dataset.from_files``,
``Dataset.read``, recipes and the table in ``docs/formats.md``
(:func:`markdown_table`, written by ``make docs``) look formats up here. A
``Dataset.from_<format>`` constructor is optional. Pure.
"""

from __future__ import annotations

import importlib
import posixpath
import re
from pathlib import Path

from fsspec import AbstractFileSystem

from ..errors import ConfigError
from .reader import Reader

_DEFINES_READER = re.compile(r"^READER\s*[:=]", re.M)


def find_readers() -> dict[str, Reader]:
    """The ``READER`` of every module of this package that defines one at its top level, by
    format name, in module name order (a module is read as text first, so only format modules
    are imported)."""
    found: dict[str, Reader] = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem.startswith("_") or not _DEFINES_READER.search(path.read_text(encoding="utf-8")):
            continue
        reader = importlib.import_module(f"{__package__}.{path.stem}").READER
        if not isinstance(reader, Reader) or reader.name in found:
            raise TypeError(f"{path.name}: READER must be a Reader with a format name of its own, got {reader!r}")
        found[reader.name] = reader
    return found


READERS: dict[str, Reader] = find_readers()
NAMES = tuple(READERS)
# Folder layouts recognised before file extensions: these first, in this order, then any other
# format with a ``detect`` function, by name.
_FOLDERS = ("tokens", "mds", "litdata", "lance", "arrow")


def folder_order() -> tuple[str, ...]:
    """The formats whose ``detect`` recognises a folder, in the order they are tried."""
    return (*(n for n in _FOLDERS if n in READERS),
            *sorted(n for n, r in READERS.items() if r.detect is not None and n not in _FOLDERS))


def markdown_table() -> str:
    """The formats as the Markdown table of ``docs/formats.md``."""
    rows = ["| format | constructor | what it reads |", "| --- | --- | --- |"]
    for name, r in READERS.items():
        constructor = f"`Dataset.{r.constructor}`" if r.constructor else f'`Dataset.from_files(name, path, "{name}")`'
        rows.append(f"| `{name}` | {constructor} | {r.doc} |")
    return "\n".join(rows)


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
    for name in folder_order():
        detect = READERS[name].detect
        if detect is not None and detect(fs, directory):
            return READERS[name]
    return None
