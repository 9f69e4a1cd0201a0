"""Parquet shards: row counts, column names and types for the index, row-group-pruned reads.

A record is one row as a dict of the selected columns. Reads open the file's
footer, map each needed row to its row group, read only those row groups and
only the selected columns, then take the rows in the order asked. Stateless.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from fsspec import AbstractFileSystem

from ..errors import DataFormatError, DatasetNotFoundError
from .integrity import changed
from .paths import FileInfo, filesystem
from .reader import Reader

if TYPE_CHECKING:  # imported where used: a process that reads no parquet file never loads pyarrow
    import pyarrow as pa
from .shard import Shard

# str values, or bytes that ``.decode_text()`` turns into str (a bytes field reaching
# ``.tokenize`` undecoded is a FieldTypeError naming the record)
TEXT_TYPES = ("string", "large_string", "string_view", "binary", "large_binary", "binary_view")


def column_types(schema: pa.Schema) -> dict[str, str]:
    """Each top-level column's Arrow type, as text (``"string"``, ``"int64"``, ``"list<item: string>"``). Pure."""
    return {f.name: str(f.type) for f in schema}


def is_text_type(arrow_type: str) -> bool:
    """Whether a column of Arrow type ``arrow_type`` (as :func:`column_types` writes it) can hold
    text: a string or binary type (binary for ``.decode_text()``), or a dictionary of one. Pure."""
    if arrow_type.startswith("dictionary<values="):
        arrow_type = arrow_type[len("dictionary<values="):].split(",")[0]
    return arrow_type in TEXT_TYPES


def inspect(fs: AbstractFileSystem, f: FileInfo) -> dict[str, Any]:
    """Index entry extras for one file: ``num_samples``, top-level ``columns`` and their ``types``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with fs.open(f.name, "rb") as fh:
            pf = pq.ParquetFile(fh)
            schema = pf.schema_arrow
            return {"num_samples": int(pf.metadata.num_rows), "columns": schema.names,
                    "types": column_types(schema)}
    except FileNotFoundError:
        raise DatasetNotFoundError(f"parquet file {f.url!r} no longer exists") from None
    except (pa.ArrowException, OSError) as exc:
        raise DataFormatError(f"cannot read parquet file {f.url!r}: {exc}") from None


def read(
    shard: Shard,
    offsets: np.ndarray,
    *,
    columns: tuple[str, ...] | None,
    storage_options: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The rows at ``offsets`` (int64, validated) of ``shard``, in order; fresh dicts each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert shard.path is not None, "a file shard has a path"
    fs, name = filesystem(shard.path, storage_options)
    try:
        # no read-ahead (an object store's file would fetch 50 MiB blocks): pyarrow asks for the
        # footer, then the needed column chunks of the needed row groups, coalesced (pre_buffer)
        with fs.open(name, "rb", cache_type="none") as fh:
            pf = pq.ParquetFile(fh, pre_buffer=True)
            md = pf.metadata
            counts = np.array(
                [md.row_group(i).num_rows for i in range(md.num_row_groups)], np.int64
            )
            bounds = np.concatenate(([0], np.cumsum(counts)))
            if bounds[-1] != shard.num_samples:
                raise changed(None, str(shard.path),
                              f"indexed: {shard.num_samples} rows, now {int(bounds[-1])}")
            uniq, inverse = np.unique(offsets, return_inverse=True)
            group = np.searchsorted(bounds, uniq, side="right") - 1
            needed = np.unique(group)
            table = pf.read_row_groups(needed.tolist(), columns=list(columns) if columns else None)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"parquet file {shard.path!r} no longer exists") from None
    except PermissionError:
        raise  # a refused read, not a malformed file (Dataset.read types it)
    except (pa.ArrowException, OSError) as exc:
        raise DataFormatError(f"cannot read parquet file {shard.path!r}: {exc}") from None
    start_in_table = np.concatenate(([0], np.cumsum(counts[needed])))
    rows = start_in_table[np.searchsorted(needed, group)] + (uniq - bounds[group])
    return table.take(pa.array(rows[inverse.ravel()])).to_pylist()


def _read(dataset: Any, index: int, offsets: np.ndarray) -> list[dict[str, Any]]:
    return read(
        dataset.shards[index], offsets, columns=dataset.columns,
        storage_options=dataset.storage_options,
    )


def columns_identity(dataset: Any) -> dict[str, Any]:
    """The selected columns (``None``: all), part of a columnar dataset's identity."""
    return {"columns": None if dataset.columns is None else list(dataset.columns)}


def columns_html(dataset: Any) -> list[tuple[str, str]]:
    """The notebook view's row for the selected columns."""
    return [("columns", "all" if dataset.columns is None else ", ".join(dataset.columns))]


READER = Reader(
    "parquet", "from_parquet", _read, inspect=inspect, extensions=(".parquet", ".pq"),
    identity=columns_identity, html=columns_html, doc="Parquet files (`.parquet`, `.pq`)",
)
