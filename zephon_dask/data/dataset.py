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

import json
import operator
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import (
    ConfigError,
    DataFormatError,
    DatasetNotFoundError,
    DuplicateNameError,
    EmptyDatasetError,
    MissingFieldError,
)
from . import jsonl, parquet, records, tokens
from .index import build_index
from .paths import extension, filesystem, has_glob, list_files
from .shard import Shard

FORMATS = ("jsonl", "parquet", "records", "tokens")
EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"dataset name must be a non-empty str, got {name!r}")


def _check_text_field(text_field: Any) -> None:
    if not isinstance(text_field, str) or not text_field:
        raise ConfigError(f"text_field must be a non-empty str, got {text_field!r}")


def _files_for(name: str, path: Any, fmt: str, storage_options: dict[str, Any] | None):
    """``(fs, files)`` of a file-based dataset; raises DatasetNotFoundError when none match.

    In a directory only files with ``fmt``'s extensions count; a file or glob is taken as is.
    """
    listing = list_files(str(path), storage_options)
    files = listing.files
    if listing.kind == "dir":
        files = [f for f in files if EXTENSIONS.get(extension(f.rel)) == fmt]
        if listing.files and not files:
            exts = sorted({extension(f.rel) or "(none)" for f in listing.files})
            wanted = sorted(e for e, v in EXTENSIONS.items() if v == fmt)
            raise DatasetNotFoundError(
                f"dataset {name!r}: no {fmt} files ({', '.join(wanted)}) among the "
                f"{listing.searched}; found extensions {exts}"
            )
    if not files:
        raise DatasetNotFoundError(
            f"dataset {name!r}: no data files found; searched {listing.searched}"
        )
    return listing.fs, files


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A named collection of shards in one format (immutable, picklable).

    Build one with :meth:`from_jsonl`, :meth:`from_parquet`, :meth:`from_records`,
    :meth:`from_tokens` or :meth:`from_path`. Shards are sorted by ``shard_id``.
    """

    name: str
    format: str
    text_field: str
    shards: tuple[Shard, ...]
    columns: tuple[str, ...] | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    _records: tuple[tuple[str, ...], ...] = ()
    _record_sha256: tuple[str, ...] = ()
    _tokenizer_json: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.format not in FORMATS:
            raise ConfigError(f"dataset format must be one of {FORMATS}, got {self.format!r}")
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
    def tokenizer_meta(self) -> dict[str, Any] | None:
        """The token store's tokenizer metadata (a fresh dict), or ``None`` for other formats."""
        return None if self._tokenizer_json is None else json.loads(self._tokenizer_json)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, format={self.format!r}, text_field={self.text_field!r}, "
            f"shards={self.num_shards}, samples={self.num_samples})"
        )

    # ------------------------------------------------------------- identity
    def identity(self) -> dict[str, Any]:
        """A JSON-native description for fingerprinting (no paths, no mtimes). Pure."""
        shards = []
        for i, s in enumerate(self.shards):
            entry: dict[str, Any] = {
                "shard_id": s.shard_id,
                "num_samples": s.num_samples,
                "size_bytes": s.size_bytes,
            }
            if self.format == "records":
                entry["sha256"] = self._record_sha256[i]
            shards.append(entry)
        out: dict[str, Any] = {
            "name": self.name,
            "format": self.format,
            "text_field": self.text_field,
            "shards": shards,
        }
        if self.format == "parquet":
            out["columns"] = None if self.columns is None else list(self.columns)
        if self.format == "tokens":
            out["tokenizer"] = self.tokenizer_meta
        return out

    # ----------------------------------------------------------------- read
    def read(self, shard: int, offsets: Iterable[int]) -> list[dict[str, Any]]:
        """The records at ``offsets`` of shard index ``shard``, in the order given.

        Offsets may be unsorted and may repeat; each returned record is a fresh
        object. Raises IndexError for an out-of-range shard or offset.
        """
        idx = operator.index(shard)
        if not 0 <= idx < self.num_shards:
            raise IndexError(
                f"dataset {self.name!r} has {self.num_shards} shards; shard index {idx} is out of range"
            )
        sh = self.shards[idx]
        off = np.asarray(list(offsets) if not isinstance(offsets, np.ndarray) else offsets)
        if off.size == 0:
            return []
        if off.dtype.kind not in "iu" or off.ndim != 1:
            raise TypeError(f"offsets must be a 1-D sequence of ints, got {off.dtype} {off.shape}")
        off = off.astype(np.int64)
        bad = off[(off < 0) | (off >= sh.num_samples)]
        if bad.size:
            raise IndexError(
                f"dataset {self.name!r} shard {sh.shard_id!r} has {sh.num_samples} samples; "
                f"offset {int(bad[0])} is out of range"
            )
        opts = self.storage_options
        if self.format == "jsonl":
            return jsonl.read(
                sh, off, dataset=self.name, text_field=self.text_field, storage_options=opts
            )
        if self.format == "parquet":
            return parquet.read(sh, off, columns=self.columns, storage_options=opts)
        if self.format == "tokens":
            return tokens.read(sh, off, storage_options=opts)
        return records.read(self._records[idx], off)

    # --------------------------------------------------------- constructors
    @classmethod
    def from_jsonl(
        cls,
        name: str,
        path: Any,
        text_field: str = "text",
        *,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
    ) -> Dataset:
        """JSON Lines from a file, a directory (``*.jsonl`` and ``*.json``, recursive) or a glob.

        Records are checked for ``text_field`` when read (the index only counts lines).
        """
        _check_name(name)
        _check_text_field(text_field)
        fs, files = _files_for(name, path, "jsonl", storage_options)
        index = build_index(fs, files, "jsonl", jsonl.inspect, progress=progress)
        shards = tuple(
            Shard(f.rel, f.url, e["num_samples"], f.size, f.mtime)
            for f, e in zip(files, index.entries, strict=True)
        )
        return cls(name, "jsonl", text_field, shards, storage_options=dict(storage_options or {}))

    @classmethod
    def from_parquet(
        cls,
        name: str,
        path: Any,
        text_field: str = "text",
        columns: Iterable[str] | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        progress: bool = True,
    ) -> Dataset:
        """Parquet from a file, a directory (``*.parquet`` and ``*.pq``, recursive) or a glob.

        ``columns`` selects what :meth:`read` returns (default: all); ``text_field``
        is always included. Every file must have ``text_field`` and the columns.
        """
        _check_name(name)
        _check_text_field(text_field)
        cols = None
        if columns is not None:
            cols = tuple(dict.fromkeys([text_field, *columns]))
        fs, files = _files_for(name, path, "parquet", storage_options)
        index = build_index(fs, files, "parquet", parquet.inspect, progress=progress)
        for f, e in zip(files, index.entries, strict=True):
            missing = [c for c in (cols or (text_field,)) if c not in e["columns"]]
            if missing:
                raise MissingFieldError(
                    f"dataset {name!r}: parquet file {f.url!r} has no column(s) {missing}; "
                    f"available columns: {e['columns']}. Pass text_field=/columns= accordingly"
                )
        shards = tuple(
            Shard(f.rel, f.url, e["num_samples"], f.size, f.mtime)
            for f, e in zip(files, index.entries, strict=True)
        )
        return cls(
            name, "parquet", text_field, shards, cols, storage_options=dict(storage_options or {})
        )

    @classmethod
    def from_records(cls, name: str, records_or_mapping: Any, text_field: str = "text") -> Dataset:
        """In-memory records: a list (one shard ``"0"``) or ``{shard_id: list}`` (ids as str, sorted).

        A record is a JSON-native dict holding ``text_field`` or a plain string
        (wrapped as ``{text_field: s}``); every record is checked here.
        """
        _check_name(name)
        _check_text_field(text_field)
        ids, lines, sha = records.freeze(records_or_mapping, text_field, name)
        shards = tuple(Shard(i, None, len(ls)) for i, ls in zip(ids, lines, strict=True))
        return cls(name, "records", text_field, shards, _records=lines, _record_sha256=sha)

    @classmethod
    def from_tokens(
        cls,
        name: str,
        path: Any,
        *,
        tokenizer: Any = None,
        storage_options: dict[str, Any] | None = None,
    ) -> Dataset:
        """A pre-tokenized zarr token store (see :mod:`zephon_dask.data.tokens`).

        An incomplete store (an interrupted ``prepare_tokens`` job) is refused.
        ``tokenizer`` (anything ``Pipeline.tokenize`` accepts) is the tokenizer the
        caller expects: a store written with another one raises TokenizerMismatchError.
        """
        _check_name(name)
        shards, meta = tokens.open_store(str(path), storage_options)
        if tokenizer is not None:
            from ..operators.tokenize import resolve_tokenizer

            tokens.check_tokenizer(str(path), meta, resolve_tokenizer(tokenizer).identity())
        return cls(
            name,
            "tokens",
            "tokens",
            shards,
            storage_options=dict(storage_options or {}),
            _tokenizer_json=json.dumps(meta, sort_keys=True),
        )

    @classmethod
    def from_path(cls, name: str, path: Any, **kwargs: Any) -> Dataset:
        """Detect the format of ``path`` and build the Dataset; ``kwargs`` go to that constructor.

        ``.jsonl``/``.json`` -> JSONL, ``.parquet``/``.pq`` -> parquet, a directory
        holding our token store's ``zarr.json`` -> tokens; a directory or glob of
        files by their extensions (files with other extensions in a directory are ignored).
        """
        _check_name(name)
        fmt = _detect(name, str(path), kwargs.get("storage_options"))
        ctor = {"jsonl": cls.from_jsonl, "parquet": cls.from_parquet, "tokens": cls.from_tokens}
        return ctor[fmt](name, path, **kwargs)

    def _repr_html_(self) -> str:
        from ..inspect import dataset_html

        return dataset_html(self)


def _detect(name: str, path: str, storage_options: dict[str, Any] | None) -> str:
    """The format of ``path`` (see :meth:`Dataset.from_path`)."""
    fs, fpath = filesystem(path, storage_options)
    is_dir = not has_glob(fpath) and fs.isdir(fpath)
    if is_dir and fs.isfile(f"{fpath.rstrip('/')}/zarr.json"):
        try:
            attrs = json.loads(fs.cat_file(f"{fpath.rstrip('/')}/zarr.json")).get("attributes", {})
        except ValueError:
            attrs = {}
        if attrs.get("format") == tokens.FORMAT:
            return "tokens"
        raise DataFormatError(
            f"dataset {name!r}: {path!r} is a zarr store but not a zephon_dask token store "
            f"(attribute format={attrs.get('format')!r}); write it with write_token_store"
        )
    listing = list_files(path, storage_options)
    files, searched = listing.files, listing.searched
    exts = sorted({extension(f.rel) or "(none)" for f in files})
    fmts = sorted({EXTENSIONS[e] for e in exts if e in EXTENSIONS})
    unknown = [e for e in exts if e not in EXTENSIONS]
    if len(fmts) > 1:
        raise ConfigError(
            f"dataset {name!r}: {path!r} mixes formats (extensions {exts}); point each Dataset "
            "at one format (a glob such as '*.jsonl', or Dataset.from_jsonl/from_parquet)"
        )
    if not fmts:
        if not files:
            raise DatasetNotFoundError(
                f"dataset {name!r}: no data files found; searched {searched}"
            )
        raise ConfigError(
            f"dataset {name!r}: cannot tell the format of {path!r} from extension(s) {exts}; "
            f"known: {sorted(EXTENSIONS)}. Use Dataset.from_jsonl/from_parquet/from_tokens"
        )
    if unknown and listing.kind != "dir":
        raise ConfigError(
            f"dataset {name!r}: {path!r} matches files with unknown extension(s) {unknown}; "
            "narrow the glob or use Dataset.from_jsonl/from_parquet"
        )
    return fmts[0]


def check_unique_names(datasets: Iterable[Dataset]) -> None:
    """Raise DuplicateNameError if two datasets share a name. Pure."""
    names = [d.name for d in datasets]
    dups = sorted(n for n, c in Counter(names).items() if c > 1)
    if dups:
        raise DuplicateNameError(
            f"dataset names must be unique within a mixture; {dups} appear more than once "
            f"(names: {names}). Give each Dataset a distinct name="
        )
