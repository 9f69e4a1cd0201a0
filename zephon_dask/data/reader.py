"""The reader protocol: what zephon_dask needs to know to read one data format. Pure data.

Each format module defines one :class:`Reader` (``READER``) and the registry
(:mod:`zephon_dask.data.formats`) finds them, so a new format is one module. The callables take the :class:`~zephon_dask.data.Dataset`
(they never import it) and must be pure functions of the data, apart from
per-process read caches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem

from .paths import FileInfo


def _nothing(*_: Any) -> dict[str, Any]:
    return {}


def _no_pairs(*_: Any) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True)
class Reader:
    """One format.

    - ``name``: the ``Dataset.format`` string; ``constructor``: the Dataset classmethod
      building one (``"from_jsonl"``), which recipes and ``from_path`` call; ``None``
      for a plain file format, built by the generic ``Dataset.from_files``.
    - ``read(dataset, shard index, offsets)``: the records at ``offsets`` (int64,
      validated), in order, fresh objects each.
    - ``inspect(fs, file)``: ``{"num_samples": n, ...extras}`` for the index cache
      (``None`` for formats whose metadata is their own index).
    - ``extensions``: lower-case file name endings that are data of this format
      (``".jsonl.gz"``); ``detect(fs, directory)``: whether a directory is a folder
      of this format (a token store, an MDS folder, a ``save_to_disk`` folder).
    - ``identity(dataset)`` / ``shard_identity(dataset, i)``: extra keys of
      ``Dataset.identity()`` (what defines the data besides counts and sizes).
    - ``html(dataset)``: extra ``(label, value)`` rows of the notebook view.
    - ``holds_tokens``: records are ``{"tokens": array}``, already tokenized.
    - ``fields(fs, file)``: the field names of a non-empty file's first record, read cheaply
      (never the whole file), for formats whose index holds no ``columns``.
    - ``doc``: what it reads, one line of the table in ``docs/formats.md`` (``make docs``).
    """

    name: str
    constructor: str | None
    read: Callable[[Any, int, Any], list[dict[str, Any]]]
    inspect: Callable[[AbstractFileSystem, FileInfo], dict[str, Any]] | None = None
    extensions: tuple[str, ...] = ()
    detect: Callable[[AbstractFileSystem, str], bool] | None = None
    identity: Callable[[Any], dict[str, Any]] = _nothing
    shard_identity: Callable[[Any, int], dict[str, Any]] = _nothing
    html: Callable[[Any], list[tuple[str, str]]] = _no_pairs
    holds_tokens: bool = False
    fields: Callable[[AbstractFileSystem, FileInfo], list[str]] | None = None
    doc: str = ""

    def matches(self, rel: str) -> bool:
        """Whether the file name ``rel`` ends with one of this format's extensions."""
        low = rel.lower()
        return any(low.endswith(ext) for ext in self.extensions)
