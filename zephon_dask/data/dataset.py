"""The :class:`Dataset`: a named, immutable, picklable collection of shards in one format.

Construction does the I/O needed to know every shard's sample count (through
the index cache for files, from metadata for token stores, in memory for
records); afterwards a Dataset holds no open handles and no caches of its own,
so it can be shipped to Dask workers. :meth:`Dataset.read` is a pure function of
the data apart from the per-process read caches of the format modules.

Empty shards (zero samples) are kept, with size 0, so shard indices always map
1:1 to files; only a dataset with no samples at all is an error.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import views
from ..errors import (
    ArgumentTypeError,
    ConfigError,
    DataChangedError,
    DatasetNotFoundError,
    DuplicateNameError,
    EmptyDatasetError,
    FieldTypeError,
    MissingFieldError,
    RecordIndexError,
    ZephonWarning,
    user_stacklevel,
)
from ..validate import check_keywords, did_you_mean
from . import fields as record_fields
from . import formats, hf, integrity, lance, litdata, mds, node_cache, records, remote, tokens
from .index import build_index, with_digests
from .parquet import is_text_type
from .paths import (
    FileInfo,
    Listing,
    filesystem,
    has_glob,
    is_local,
    list_files,
    match_data_files,
    read_errors,
    storage_errors,
    to_url,
)
from .reader import Reader
from .shard import Shard

FORMATS = formats.NAMES
_SHOWN = 3  # files named in a repr or a warning before "and N more"
_SKIPPED_KEPT = 20  # names of files skipped by discovery that a Dataset keeps (it counts them all)


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"dataset name must be a non-empty str, got {name!r}")


def _check_text_field(text_field: Any) -> None:
    if not isinstance(text_field, str) or not text_field:
        raise ConfigError(f"text_field must be a non-empty str, got {text_field!r}")


def _patterns(data_files: Any) -> tuple[str, ...] | None:
    if data_files is None:
        return None
    pats = (data_files,) if isinstance(data_files, str) else data_files
    if not isinstance(pats, Sequence) or not pats or not all(isinstance(p, str) for p in pats):
        raise ConfigError(
            f"data_files must be a glob or a non-empty list of globs relative to the dataset "
            f"folder (e.g. 'data/train-*'), got {data_files!r}"
        )
    return tuple(pats)


def _some(names: Sequence[str], total: int | None = None) -> str:
    """The first names and "and N more" (``total``: how many there are, if more than given)."""
    total = len(names) if total is None else total
    more = f" and {total - _SHOWN:,} more" if total > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _select(
    name: str, listing: Listing, reader: Reader, patterns: tuple[str, ...] | None
) -> tuple[list[FileInfo], list[str]]:
    """The data files of ``reader``'s format in a listing, narrowed by ``data_files`` globs,
    and the files skipped (relative paths).

    In a directory (or under ``data_files``) only files with the format's extensions
    count, and the others are skipped and named in one warning; a file or glob is
    taken as is.
    """
    others: list[str] = []
    files = listing.files
    if patterns is not None:
        files = match_data_files(files, patterns)
        if not files:
            raise DatasetNotFoundError(
                f"dataset {name!r}: data_files {list(patterns)} match none of the "
                f"{listing.searched} (relative paths such as "
                f"{_some([f.rel for f in listing.files]) or 'none'})"
            )
    if listing.kind == "dir" or patterns is not None:
        mine = [f for f in files if reader.matches(f.rel)]
        if files and not mine:
            exts = sorted({formats.extension(f.rel) for f in files})
            raise DatasetNotFoundError(
                f"dataset {name!r}: no {reader.name} files ({', '.join(reader.extensions)}) "
                f"among the {listing.searched}; found extensions {exts}"
            )
        others = [f.rel for f in files if not reader.matches(f.rel)]
        if others:
            warnings.warn(
                f"dataset {name!r}: ignoring {len(others)} file(s) that are not {reader.name} "
                f"data among the {listing.searched}: {_some(others)}. Pass data_files= or a "
                "glob to choose the files explicitly",
                ZephonWarning,
                stacklevel=user_stacklevel(),
            )
        files = mine
    if not files:
        raise DatasetNotFoundError(
            f"dataset {name!r}: no data files found; searched {listing.searched}"
        )
    return files, others


@check_keywords
@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A named collection of shards in one format (immutable, picklable).

    Build one with :meth:`from_path` (any format, detected), :meth:`from_jsonl`,
    :meth:`from_parquet`, :meth:`from_arrow`, :meth:`from_hf`, :meth:`from_mds`,
    :meth:`from_litdata`, :meth:`from_lance`, :meth:`from_records` or :meth:`from_tokens`. Shards are sorted by ``shard_id``
    (MDS shards and litData chunks keep their ``index.json`` order, Lance fragments theirs, ``save_to_disk`` files their
    ``state.json`` order). ``source`` is the path given and
    ``data_files`` the globs that chose the files; ``skipped`` names the first
    files that discovery passed over (not of the format) and ``num_skipped``
    counts them all; ``vocab_size`` (token stores) is the vocabulary every id read
    is checked against (``None``: unknown, unchecked); ``fields`` are the field names
    of its records as known at construction (the file schema, or the first record of
    the first non-empty file; ``None`` for token stores), against which ``text_field``
    was checked there. None of these is part of the identity.

    Example:
        >>> web = zephon_dask.Dataset.from_path("web", "s3://bucket/web/")  # doctest: +SKIP
    """

    name: str
    format: str
    text_field: str
    shards: tuple[Shard, ...]
    columns: tuple[str, ...] | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    memory_records: tuple[tuple[str, ...], ...] = ()
    memory_sha256: tuple[str, ...] = ()
    _tokenizer_json: str | None = None
    source: str | None = None
    data_files: tuple[str, ...] | None = None
    _meta_json: str | None = None
    skipped: tuple[str, ...] = ()
    num_skipped: int = 0
    vocab_size: int | None = None
    fields: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        formats.get(self.format)
        node_cache.settings(self.storage_options)
        remote.confirm_every(self.storage_options)
        if self.num_samples == 0:
            listed = [s.path or s.shard_id for s in self.shards[:5]]
            more = f" and {len(self.shards) - 5} more" if len(self.shards) > 5 else ""
            raise EmptyDatasetError(
                f"dataset {self.name!r} has no samples (shards: {listed}{more})"
            )

    # ----------------------------------------------------------------- sizes
    @property
    def shard_sizes(self) -> tuple[int, ...]:
        """Samples per shard, in shard order."""
        return tuple(s.num_samples for s in self.shards)

    @property
    def num_samples(self) -> int:
        """Samples in all shards."""
        return sum(s.num_samples for s in self.shards)

    @property
    def num_shards(self) -> int:
        """Number of shards (empty ones included)."""
        return len(self.shards)

    def __len__(self) -> int:
        return self.num_samples

    @property
    def reader(self) -> Reader:
        """The format's reader (from the registry)."""
        return formats.get(self.format)

    @property
    def holds_tokens(self) -> bool:
        """Whether records are already token ids (``{"tokens": array}``)."""
        return self.reader.holds_tokens

    @property
    def tokenizer_meta(self) -> dict[str, Any] | None:
        """The token store's tokenizer metadata (a fresh dict), or ``None`` for other formats."""
        return None if self._tokenizer_json is None else json.loads(self._tokenizer_json)

    @property
    def meta(self) -> dict[str, Any]:
        """Format-specific metadata (a fresh dict; e.g. an MDS folder's column schema)."""
        return {} if self._meta_json is None else json.loads(self._meta_json)

    @property
    def files(self) -> tuple[str, ...]:
        """The data files read, as paths or URLs (empty for in-memory records)."""
        return tuple(s.path for s in self.shards if s.path is not None)

    def chosen_files(self) -> str:
        """Which files were read, in one line: the source, the ``data_files`` globs, how many
        files, the first few and those that discovery skipped ("" for in-memory records)."""
        if self.format == "records":
            return ""
        where = f"from {self.source!r}" if self.source is not None else ""
        if self.data_files is not None:
            where += f" with data_files {list(self.data_files)!r}"
        names = [s.shard_id for s in self.shards]
        noun = "file" if len(names) == 1 else "files"
        line = f"{len(names):,} {noun} {where}".rstrip() + f": {_some(names)}"
        if self.num_skipped:
            line += f"; skipped {self.num_skipped:,}: {_some(self.skipped, self.num_skipped)}"
        return line

    def __repr__(self) -> str:
        extra = ""
        if self.source is not None:
            extra += f", source={self.source!r}"
        if self.data_files is not None:
            extra += f", data_files={list(self.data_files)!r}"
        if self.format != "records":
            extra += f", files={self.num_shards} [{_some([repr(s.shard_id) for s in self.shards])}]"
        if self.num_skipped:
            shown = _some([repr(n) for n in self.skipped], self.num_skipped)
            extra += f", skipped={self.num_skipped} [{shown}]"
        return (
            f"Dataset(name={self.name!r}, format={self.format!r}, text_field={self.text_field!r}, "
            f"shards={self.num_shards}, samples={self.num_samples}{extra})"
        )

    # ------------------------------------------------------------- identity
    def identity(self) -> dict[str, Any]:
        """A JSON-native description for fingerprinting (no paths, no mtimes). Pure."""
        reader = self.reader
        shards = []
        for i, s in enumerate(self.shards):
            entry: dict[str, Any] = {
                "shard_id": s.shard_id,
                "num_samples": s.num_samples,
                "size_bytes": s.size_bytes,
            }
            entry.update(reader.shard_identity(self, i))
            shards.append(entry)
        out: dict[str, Any] = {
            "name": self.name,
            "format": self.format,
            "text_field": self.text_field,
            "shards": shards,
        }
        out.update(reader.identity(self))
        return out

    # ----------------------------------------------------------------- read
    def read(self, shard: int, offsets: Iterable[int]) -> list[dict[str, Any]]:
        """The records at ``offsets`` of shard index ``shard``, in the order given.

        Offsets may be unsorted and may repeat; each returned record is a fresh
        object. Raises :class:`~zephon_dask.errors.RecordIndexError` (an ``IndexError``) for an
        out-of-range shard or offset, :class:`~zephon_dask.errors.DataChangedError` when the
        shard's file differs from what its index recorded (see :mod:`zephon_dask.data.integrity`),
        :class:`~zephon_dask.errors.DatasetNotFoundError` when it is gone,
        :class:`~zephon_dask.errors.DataAccessError` when it may not be read, and
        :class:`~zephon_dask.errors.DataFormatError` for a record it cannot parse.
        """
        idx = operator.index(shard)
        if not 0 <= idx < self.num_shards:
            raise RecordIndexError(
                f"dataset {self.name!r} has {self.num_shards} shards; shard index {idx} is out of range"
            )
        sh = self.shards[idx]
        off = np.asarray(list(offsets) if not isinstance(offsets, np.ndarray) else offsets)
        if off.size == 0:
            return []
        if off.dtype.kind not in "iu" or off.ndim != 1:
            raise ArgumentTypeError(f"offsets must be a 1-D sequence of ints, got {off.dtype} {off.shape}")
        off = off.astype(np.int64)
        bad = off[(off < 0) | (off >= sh.num_samples)]
        if bad.size:
            raise RecordIndexError(
                f"dataset {self.name!r} shard {sh.shard_id!r} has {sh.num_samples} samples; "
                f"offset {int(bad[0])} is out of range"
            )
        with read_errors(sh.path, self.name):
            return self._read_shard(idx, sh, off)

    def _read_shard(self, idx: int, sh: Shard, off: np.ndarray) -> list[dict[str, Any]]:
        if sh.path is None or "://" not in sh.path:
            integrity.verify(sh, self.storage_options, self.name)
            return self.reader.read(self, idx, off)
        with storage_errors(sh.path):
            if sh.etag is None:
                integrity.verify(sh, self.storage_options, self.name)
                return self._read_remote(idx, sh, off)
            # Reads are conditional on the listed ETag (data/remote.py): no HEAD unless none was.
            name = sh.path.split("://", 1)[1]
            every = remote.confirm_every(self.storage_options)
            with remote.pinned(name, remote.retagged(name, sh.etag), sh.size_bytes, every) as pin:
                try:
                    out = self._read_remote(idx, sh, off, pin)
                except remote.TagMoved:
                    # written again: the same bytes read on (pinned to their new ETag), others raise
                    now = integrity.verify(sh, self.storage_options, self.name)
                    if now is None or now.etag is None or now.etag == remote.retagged(name, sh.etag):
                        raise
                    remote.same_bytes_under(name, sh.etag, now.etag)
                    return self._read_shard(idx, sh, off)
                except (DataChangedError, DatasetNotFoundError):
                    raise
                except Exception:
                    if not pin.confirmed:  # a changed file explains the failure best
                        integrity.verify(sh, self.storage_options, self.name)
                    raise
            if not pin.confirmed:
                integrity.verify(sh, self.storage_options, self.name)
            return out

    def _read_remote(self, idx: int, sh: Shard, off: np.ndarray,
                     pin: remote.Pin | None = None) -> list[dict[str, Any]]:
        for _ in range(2):  # a second time if the node cache evicted the copy before it was read
            local = node_cache.local_copy(sh, self.storage_options)
            if local is None:
                return self.reader.read(self, idx, off)
            if pin is not None:
                pin.confirmed = True  # the entry holds the object as listed (named by its ETag)
            try:
                return self.reader.read(self._with_local(idx, local), idx, off)
            except FileNotFoundError:
                continue
        raise DatasetNotFoundError(
            f"dataset {self.name!r}: the node cache's copy of {sh.path!r} was evicted twice "
            "before it was read; raise node_cache's max_bytes"
        )

    def _with_local(self, idx: int, local: str) -> Dataset:
        """This dataset with shard ``idx`` read from the local file ``local`` (a node cache copy)."""
        shard = dataclasses.replace(self.shards[idx], path=local)
        return dataclasses.replace(self, shards=(*self.shards[:idx], shard, *self.shards[idx + 1 :]),
                                   storage_options={})

    # --------------------------------------------------------- constructors
    @classmethod
    def _from_files(
        cls,
        name: str,
        reader: Reader,
        fs: Any,
        files: Sequence[FileInfo],
        text_field: str,
        columns: Iterable[str] | None,
        *,
        storage_options: dict[str, Any] | None,
        progress: bool,
        cache_dir: str | os.PathLike | None,
        source: str,
        data_files: tuple[str, ...] | None,
        skipped: Sequence[str] = (),
    ) -> Dataset:
        """Index ``files`` (through the cache) and build the Dataset; columns checked if tabular."""
        cols = None if columns is None else tuple(dict.fromkeys([text_field, *columns]))
        assert reader.inspect is not None, "callers pick a format whose reader can index files"
        index = build_index(fs, files, reader.name, reader.inspect, progress=progress, cache=cache_dir)
        known: tuple[str, ...] | None = None
        for f, e in zip(files, index.entries, strict=True):
            if "columns" not in e:
                continue
            if text_field not in e["columns"]:
                raise record_fields.missing(name, f"{reader.name} file {f.url!r}", text_field, e["columns"])
            missing = [c for c in (cols or ()) if c not in e["columns"]]
            if missing:
                raise MissingFieldError(
                    f"dataset {name!r}: {reader.name} file {f.url!r} has no column(s) {missing}; "
                    f"{did_you_mean(missing[0], e['columns'])}available columns: {e['columns']}. "
                    "Pass columns= accordingly"
                )
            known = known or tuple(cols or e["columns"])
            kind = (e.get("types") or {}).get(text_field)
            if kind is not None and e["num_samples"] and not is_text_type(kind):  # empty: any type
                raise FieldTypeError(
                    f"dataset {name!r}: {reader.name} file {f.url!r}: text column {text_field!r} "
                    f"has Arrow type {kind}, not a string or binary type (its text columns: "
                    f"{[c for c, t in e['types'].items() if is_text_type(t)][:20]}). Pass "
                    "text_field=<a string column>; to tokenize a non-string column, turn it into "
                    "text with .map(...) in the pipeline and .tokenize(field=...) that field"
                )
        first = next((f for f, e in zip(files, index.entries, strict=True) if e["num_samples"]), None)
        if known is None and reader.fields is not None and first is not None:
            known = tuple(reader.fields(fs, first))  # a JSONL file's first record: one short read
            if text_field not in known:
                raise record_fields.missing(name, f"the first record of {first.url!r}", text_field, known)
        shards = tuple(
            Shard(f.rel, f.url, e["num_samples"], e["size"], f.mtime, e["mtime_ns"], e["etag"],
                  e["fingerprint"], tuple(e["parts"]) if e.get("parts") else None, e["digest"])
            for f, e in zip(files, index.entries, strict=True)
        )
        return cls(
            name, reader.name, text_field, shards, cols,
            storage_options=dict(storage_options or {}), source=source, data_files=data_files,
            skipped=tuple(skipped[:_SKIPPED_KEPT]), num_skipped=len(skipped), fields=known,
        )

    @classmethod
    def _from_listing(
        cls, fmt: str, name: str, path: Any, text_field: str, columns: Any, *,
        data_files: Any, storage_options: dict[str, Any] | None, progress: bool,
        cache_dir: str | os.PathLike | None,
    ) -> Dataset:
        _check_name(name)
        _check_text_field(text_field)
        reader = formats.get(fmt)
        patterns = _patterns(data_files)
        listing = list_files(list(path) if isinstance(path, list | tuple) else str(path), storage_options)
        files, skipped = _select(name, listing, reader, patterns)
        return cls._from_files(
            name, reader, listing.fs, files, text_field, columns,
            storage_options=storage_options, progress=progress, cache_dir=cache_dir,
            source=", ".join(map(str, path)) if isinstance(path, list | tuple) else str(path),
            data_files=patterns, skipped=skipped,
        )

    @classmethod
    def from_files(
        cls,
        name: str,
        path: Any,
        format: str,
        text_field: str = "text",
        columns: Iterable[str] | None = None,
        *,
        data_files: str | Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """Files of any registered file format (one whose reader has ``inspect``).

        The generic constructor behind :meth:`from_jsonl` and the like, and the one
        :meth:`from_path` and recipes use for a format whose reader names no
        constructor of its own.

        Example:
            >>> zephon_dask.Dataset.from_files("web", "data/web/", "jsonl")  # doctest: +SKIP
        """
        if formats.get(format).inspect is None:
            raise ConfigError(
                f"format {format!r} is not read from files; use its own constructor "
                f"(Dataset.{formats.get(format).constructor})"
            )
        return cls._from_listing(
            format, name, path, text_field, columns, data_files=data_files,
            storage_options=storage_options, progress=progress, cache_dir=cache_dir,
        )

    @classmethod
    def from_jsonl(
        cls,
        name: str,
        path: Any,
        text_field: str = "text",
        *,
        data_files: str | Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """JSON Lines, plain or gzip/zstd-compressed, from a file, a directory (recursive), a glob
        or a list of them.

        In a directory, ``*.jsonl``/``*.json`` (and ``.gz``/``.zst`` versions) are
        data; ``data_files`` globs (relative to the directory) narrow the choice.
        The first record of the first non-empty file is read here (its first line only) and
        must hold ``text_field`` (MissingFieldError listing its fields); the others are checked
        when read (the index only counts lines).
        ``cache_dir`` overrides where the index cache lives (see docs/formats.md).

        Example:
            >>> zephon_dask.Dataset.from_jsonl("web", "data/web/", text_field="content")  # doctest: +SKIP
        """
        return cls._from_listing(
            "jsonl", name, path, text_field, None, data_files=data_files,
            storage_options=storage_options, progress=progress, cache_dir=cache_dir,
        )

    @classmethod
    def from_parquet(
        cls,
        name: str,
        path: Any,
        text_field: str = "text",
        columns: Iterable[str] | None = None,
        *,
        data_files: str | Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """Parquet from a file, a directory (``*.parquet`` and ``*.pq``, recursive), a glob or a list
        of them (``["a.parquet", "b.parquet"]``).

        ``columns`` selects what :meth:`read` returns (default: all); ``text_field``
        is always included. Every file must have ``text_field`` and the columns.

        Example:
            >>> zephon_dask.Dataset.from_parquet("wiki", "data/wiki/", columns=["title"])  # doctest: +SKIP
        """
        return cls._from_listing(
            "parquet", name, path, text_field, columns, data_files=data_files,
            storage_options=storage_options, progress=progress, cache_dir=cache_dir,
        )

    @classmethod
    def from_arrow(
        cls,
        name: str,
        path: Any,
        text_field: str = "text",
        columns: Iterable[str] | None = None,
        *,
        split: str | None = None,
        data_files: str | Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """Arrow IPC files: a ``save_to_disk`` folder (its files, in order), or ``*.arrow`` files.

        A ``save_to_disk`` folder is read as ``datasets.load_from_disk`` reads it: every
        file its ``state.json`` lists, in that order (a missing one is a DataFormatError
        naming it), unless ``data_files`` globs choose files. A ``DatasetDict`` folder
        needs ``split=`` unless it holds one split; a single Dataset's folder takes no
        ``split=`` but its own.

        Example:
            >>> zephon_dask.Dataset.from_arrow("wiki", "saved/wiki", split="train")  # doctest: +SKIP
        """
        _check_name(name)
        fs, fpath = filesystem(str(path), storage_options)
        if not has_glob(fpath) and fs.isdir(fpath) and hf.is_saved(fs, fpath):
            url = to_url(fs, fpath)
            folder = hf.saved_split(fs, fpath, split, url)
            if data_files is not None:
                return cls._from_listing(
                    "arrow", name, to_url(fs, folder), text_field, columns, data_files=data_files,
                    storage_options=storage_options, progress=progress, cache_dir=cache_dir,
                )
            _check_text_field(text_field)
            files = hf.saved_file_infos(fs, folder, to_url(fs, folder))
            return cls._from_files(
                name, formats.get("arrow"), fs, files, text_field, columns,
                storage_options=storage_options, progress=progress, cache_dir=cache_dir,
                source=to_url(fs, folder), data_files=tuple(f.rel for f in files),
            )
        return cls._from_listing(
            "arrow", name, path, text_field, columns, data_files=data_files,
            storage_options=storage_options, progress=progress, cache_dir=cache_dir,
        )

    @classmethod
    def from_hf(
        cls,
        name: str,
        path: Any,
        split: str | None = None,
        data_files: Any = None,
        text_field: str = "text",
        columns: Iterable[str] | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """A Hugging Face dataset on disk, read in place (no network).

        ``path`` is a ``save_to_disk`` folder (a Dataset or a DatasetDict), a
        repository folder, a hub cache snapshot (``.../snapshots/<rev>``) or a hub
        cache folder (``datasets--org--name``, resolved through ``refs/main``).
        In a repository, ``split`` picks files by ``data_files`` globs (a glob, a
        list, or ``{split: globs}`` as ``datasets.load_dataset`` takes them) or by
        the ``datasets`` naming conventions; the files must be of one format
        (parquet, JSONL or Arrow). A hub name (``"org/name"``) that is no local folder raises
        DatasetNotFoundError saying how to download it: nothing is downloaded here.

        Example:
            >>> zephon_dask.Dataset.from_hf("wiki", "~/.cache/huggingface/hub/datasets--org--wiki", split="train")  # doctest: +SKIP
        """
        _check_name(name)
        fs, fpath = _not_a_hub_name(str(path), storage_options)
        kw: dict[str, Any] = {"storage_options": storage_options, "progress": progress, "cache_dir": cache_dir}
        if not has_glob(fpath) and fs.isdir(fpath) and hf.is_saved(fs, fpath):
            return cls.from_arrow(
                name, path, text_field, columns, split=split, data_files=data_files, **kw
            )
        if data_files is None and not has_glob(fpath) and fs.isdir(fpath) and hf.saved_without_state(fs, fpath):
            raise hf.missing_state(to_url(fs, fpath))
        root = hf.snapshot(fs, fpath)
        url = to_url(fs, root)
        listing = list_files(url, storage_options)
        data = [f for f in listing.files if formats.of_file(f.rel) is not None]
        split, patterns = hf.choose(data, split, data_files, url)
        chosen = match_data_files(data, patterns)
        fmts = sorted({r.name for f in chosen if (r := formats.of_file(f.rel)) and r.inspect})
        if len(fmts) != 1:
            raise (ConfigError if fmts else DatasetNotFoundError)(
                f"dataset {name!r}: split {split!r} of {url!r} (data_files {patterns}) "
                + (f"mixes formats {fmts}; narrow data_files to one format" if fmts else
                   "matches no parquet, JSONL or Arrow file; pass data_files='<glob>'")
            )
        return cls._from_listing(
            fmts[0], name, url, text_field, columns if fmts[0] != "jsonl" else None,
            data_files=tuple(patterns), **kw,
        )

    @classmethod
    def from_mds(
        cls,
        name: str,
        path: Any,
        text_field: str = "text",
        *,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """A Mosaic MDS folder (``index.json`` + ``shard.*.mds[.zstd]``), read in place.

        Its ``index.json`` is the index; the index cache (``cache_dir``) keeps only each
        local shard's whole-file digest (hashed when first seen, with a ``progress``
        bar), so that a shard whose mtime alone moved reads on. Every shard must have
        the same columns, among them ``text_field``.

        Example:
            >>> zephon_dask.Dataset.from_mds("books", "data/books-mds/")  # doctest: +SKIP
        """
        _check_name(name)
        _check_text_field(text_field)
        shards, meta = mds.open_folder(str(path), storage_options)
        shards = with_digests(shards, "mds", progress=progress, cache=cache_dir)
        names = meta["schema"]["column_names"]
        if text_field not in names:
            raise record_fields.missing(name, f"MDS folder {str(path)!r}", text_field, names)
        encoding = meta["schema"]["column_encodings"][names.index(text_field)]
        if encoding.split(":")[0] not in ("str", "json"):
            raise FieldTypeError(
                f"dataset {name!r}: MDS folder {str(path)!r}: text column {text_field!r} has "
                f"encoding {encoding!r}, not str. Pass text_field=<a str column>; to tokenize a "
                "non-string column, turn it into text with .map(...) in the pipeline and "
                ".tokenize(field=...) that field"
            )
        return cls(
            name, "mds", text_field, shards, storage_options=dict(storage_options or {}),
            source=str(path), _meta_json=json.dumps(meta, sort_keys=True), fields=tuple(names),
        )

    @classmethod
    def from_litdata(
        cls, name: str, path: Any, text_field: str = "text", *,
        storage_options: dict[str, Any] | None = None, progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """A litData folder (what ``litdata.optimize`` writes: ``index.json`` + ``chunk-*.bin``),
        read in place; its chunks are the shards, in ``index.json`` order.

        Its ``index.json`` is the index; the index cache (``cache_dir``) keeps only each local
        chunk's whole-file digest (hashed when first seen, with a ``progress`` bar), so that a
        chunk whose mtime alone moved reads on. ``text_field`` must be a ``str`` field of its
        rows.

        Example:
            >>> zephon_dask.Dataset.from_litdata("web", "s3://bucket/web-optimized/")  # doctest: +SKIP
        """
        _check_name(name)
        _check_text_field(text_field)
        with storage_errors(str(path)):
            shards, meta = litdata.open_folder(str(path), storage_options)
        shards = with_digests(shards, "litdata", progress=progress, cache=cache_dir)
        kinds = meta["kinds"]
        return cls._from_folder(name, "litdata", "litData folder", path, text_field, shards, meta,
                                kinds, kinds.get(text_field) in ("str", "text"), storage_options)

    @classmethod
    def from_lance(
        cls, name: str, path: Any, text_field: str = "text", *,
        storage_options: dict[str, Any] | None = None, progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """A Lance dataset (what ``lance.write_dataset`` writes), read in place at its current
        version; its fragments are the shards. Needs ``pip install 'zephon_dask[lance]'``.

        Its manifest is the index (``progress`` and ``cache_dir`` are accepted so that
        ``from_path`` takes the same arguments for every format); ``text_field`` must be a
        string column.

        Example:
            >>> zephon_dask.Dataset.from_lance("web", "data/web.lance")  # doctest: +SKIP
        """
        _check_name(name)
        _check_text_field(text_field)
        with storage_errors(str(path)):
            shards, meta = lance.open_dataset(str(path), storage_options)
        kinds = dict(meta["schema"])
        return cls._from_folder(name, "lance", "Lance dataset", path, text_field, shards, meta,
                                kinds, is_text_type(kinds.get(text_field, "")), storage_options)

    @classmethod
    def _from_folder(
        cls, name: str, fmt: str, what: str, path: Any, text_field: str, shards: tuple[Shard, ...],
        meta: dict[str, Any], kinds: dict[str, str], is_text: bool,
        storage_options: dict[str, Any] | None,
    ) -> Dataset:
        """A folder format's Dataset, once ``text_field`` is checked against its fields' ``kinds``."""
        where = f"{what} {str(path)!r}"
        if text_field not in kinds:
            raise record_fields.missing(name, where, text_field, list(kinds))
        if not is_text:
            raise FieldTypeError(
                f"dataset {name!r}: {where}: text field {text_field!r} is {kinds[text_field]!r}, "
                "not a string. Pass text_field=<a string field>; to tokenize a non-string field, "
                "turn it into text with .map(...) in the pipeline and .tokenize(field=...) that field"
            )
        return cls(
            name, fmt, text_field, shards, storage_options=dict(storage_options or {}),
            source=str(path), _meta_json=json.dumps(meta, sort_keys=True), fields=tuple(kinds),
        )

    @classmethod
    def from_records(cls, name: str, records_or_mapping: Any, text_field: str = "text") -> Dataset:
        """In-memory records: a list (one shard ``"0"``) or ``{shard_id: list}`` (ids as str, sorted).

        A record is a JSON-native dict holding ``text_field`` or a plain string
        (wrapped as ``{text_field: s}``); every record is checked here.

        Example:
            >>> zephon_dask.Dataset.from_records("toy", [{"text": "hello"}, {"text": "world"}])  # doctest: +SKIP
        """
        _check_name(name)
        _check_text_field(text_field)
        ids, lines, sha = records.freeze(records_or_mapping, text_field, name)
        shards = tuple(Shard(i, None, len(ls)) for i, ls in zip(ids, lines, strict=True))
        first = next((ls[0] for ls in lines if ls), None)
        known = None if first is None else tuple(sorted(json.loads(first)))
        return cls(name, "records", text_field, shards, memory_records=lines, memory_sha256=sha,
                   fields=known)

    @classmethod
    def from_tokens(
        cls,
        name: str,
        path: Any,
        *,
        tokenizer: Any = None,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> Dataset:
        """A pre-tokenized zarr token store (see :mod:`zephon_dask.data.tokens`).

        Its metadata is its index (``progress`` and ``cache_dir`` are accepted so that
        ``from_path`` takes the same arguments for every format).

        An incomplete store (an interrupted ``prepare_tokens`` job) is refused.
        ``tokenizer`` (a ``Tokenize`` operator, or its ``.tokenizer``) is the tokenizer
        the caller expects: a store written with another one, or whose recorded
        vocabulary size or largest id does not fit its vocabulary, raises
        TokenizerMismatchError. Every id read is then checked against that vocabulary
        (else the store's recorded one; :attr:`vocab_size`, ``None`` when unknown): an id
        outside it is a DataFormatError naming the chunk file.

        Example:
            >>> zephon_dask.Dataset.from_tokens("web", "tokens/web.zarr")  # doctest: +SKIP
        """
        _check_name(name)
        store = tokens.open_store(str(path), storage_options)
        vocab = None
        if tokenizer is not None:
            tokens.check_tokenizer(str(path), store.tokenizer, tokens.tokenizer_identity(tokenizer))
            vocab = getattr(tokenizer, "vocab_size", None)
        return cls(
            name,
            "tokens",
            "tokens",
            store.shards,
            storage_options=dict(storage_options or {}),
            _tokenizer_json=json.dumps(store.tokenizer, sort_keys=True),
            source=str(path),
            vocab_size=tokens.check_vocab(str(path), store, vocab),
        )

    @classmethod
    def from_path(cls, name: str, path: Any, **kwargs: Any) -> Dataset:
        """Detect the format of ``path`` and build the Dataset; ``kwargs`` go to that constructor.

        A folder layout is recognised first (a token store's ``zarr.json``, an MDS or litData
        ``index.json``, a Lance dataset's ``_versions``, a ``save_to_disk`` folder); otherwise files decide by their
        extensions (``.jsonl``/``.json`` and their ``.gz``/``.zst`` forms, ``.parquet``/``.pq``,
        ``.arrow``). A directory or glob mixing formats is refused; in a directory,
        files of no known format are ignored with one warning.

        Example:
            >>> zephon_dask.Dataset.from_path("web", "data/web/")  # format detected  # doctest: +SKIP
        """
        _check_name(name)
        _not_a_hub_name(str(path), kwargs.get("storage_options"))
        reader = _detect(name, str(path), kwargs.get("storage_options"), kwargs.get("data_files"))
        if reader.constructor is None:
            return cls.from_files(name, path, reader.name, **kwargs)
        return getattr(cls, reader.constructor)(name, path, **kwargs)

    def _repr_html_(self) -> str:
        return views.show("dataset_html", self)


def _not_a_hub_name(path: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """``(filesystem, path)``; a hub name that is no local path raises, saying how to download it."""
    fs, fpath = filesystem(path, storage_options)
    if is_local(fs) and hf.looks_like_hub_id(path) and not fs.exists(fpath):
        raise hf.not_downloaded(path, "dataset")
    return fs, fpath


def _detect(
    name: str, path: str, storage_options: dict[str, Any] | None, data_files: Any
) -> Reader:
    """The format of ``path`` (see :meth:`Dataset.from_path`)."""
    fs, fpath = filesystem(path, storage_options)
    if not has_glob(fpath) and fs.isdir(fpath):
        folder = formats.of_folder(fs, fpath.rstrip("/"))
        if folder is not None:
            return folder
        if data_files is None and hf.saved_without_state(fs, fpath):
            raise hf.missing_state(to_url(fs, fpath))
    listing = list_files(path, storage_options)
    files, searched = listing.files, listing.searched
    patterns = _patterns(data_files)
    if patterns is not None:
        files = match_data_files(files, patterns)
    exts = sorted({formats.extension(f.rel) for f in files})
    found = {r.name: r for f in files if (r := formats.of_file(f.rel)) and r.inspect}
    unknown = sorted({formats.extension(f.rel) for f in files if formats.of_file(f.rel) is None})
    if len(found) > 1:
        raise ConfigError(
            f"dataset {name!r}: {path!r} mixes formats (extensions {exts}); point each Dataset "
            "at one format (a glob such as '*.jsonl', data_files=, or Dataset.from_jsonl/"
            "from_parquet)"
        )
    if not found:
        if not files:
            raise DatasetNotFoundError(
                f"dataset {name!r}: no data files found; searched {searched}"
            )
        known = sorted({e for r in formats.READERS.values() for e in r.extensions})
        raise ConfigError(
            f"dataset {name!r}: cannot tell the format of {path!r} from extension(s) {exts}; "
            f"known: {known}. Use Dataset.from_jsonl/from_parquet/from_hf/from_mds/from_litdata/from_lance/from_tokens"
        )
    if unknown and listing.kind != "dir" and patterns is None:
        raise ConfigError(
            f"dataset {name!r}: {path!r} matches files with unknown extension(s) {unknown}; "
            "narrow the glob or use Dataset.from_jsonl/from_parquet"
        )
    return next(iter(found.values()))


def check_unique_names(datasets: Iterable[Dataset]) -> None:
    """Raise DuplicateNameError if two datasets share a name. Pure."""
    names = [d.name for d in datasets]
    dups = sorted(n for n, c in Counter(names).items() if c > 1)
    if dups:
        raise DuplicateNameError(
            f"dataset names must be unique within a mixture; {dups} appear more than once "
            f"(names: {names}). Give each Dataset a distinct name="
        )
