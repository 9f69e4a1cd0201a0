"""Arrow IPC shards (``.arrow``), as Hugging Face ``save_to_disk`` writes them: row-addressed reads.

A file is either the Arrow IPC *stream* format (what ``datasets`` writes) or the
IPC *file* format (magic ``ARROW1``); both are read. A record is one row as a
dict of the selected columns. Local files are memory-mapped (the page cache
holds the data), files on other filesystems are fetched whole; either way the
opened table is kept in a per-process LRU (:data:`TABLES`, keyed by path, size
and mtime) and a read copies out only the rows asked. Pure apart from that cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import DataFormatError, DatasetNotFoundError
from .hf import is_saved
from .integrity import changed
from .memo import ByteLRU
from .parquet import column_types, columns_html, columns_identity
from .paths import FileInfo, filesystem, is_local
from .reader import Reader
from .shard import Shard

FILE_MAGIC = b"ARROW1"
TABLES = ByteLRU(1 << 30)
_MAPPED = 1 << 16


def _open(fs: Any, name: str, url: str) -> pa.Table:
    """The whole file as a table (zero-copy when local)."""
    try:
        if is_local(fs):
            with open(name, "rb") as fh:
                head = fh.read(len(FILE_MAGIC))
            source: Any = pa.memory_map(name, "r")
        else:
            data = fs.cat_file(name)
            head, source = data[: len(FILE_MAGIC)], pa.py_buffer(data)
        opener = pa.ipc.open_file if head == FILE_MAGIC else pa.ipc.open_stream
        return opener(source).read_all()
    except FileNotFoundError:
        raise DatasetNotFoundError(f"Arrow file {url!r} no longer exists") from None
    except (pa.ArrowException, OSError) as exc:
        raise DataFormatError(
            f"cannot read Arrow IPC file {url!r}: {exc}. It is corrupt or truncated, or not an "
            "Arrow IPC file: write it again (datasets' save_to_disk) or point at the right folder"
        ) from None


def inspect(fs: Any, f: FileInfo) -> dict[str, Any]:
    """Index entry extras for one file: ``num_samples``, top-level ``columns`` and their ``types``."""
    table = _open(fs, f.name, f.url)
    return {"num_samples": int(table.num_rows), "columns": table.schema.names,
            "types": column_types(table.schema)}


def _table(shard: Shard, storage_options: dict[str, Any] | None) -> pa.Table:
    key = (shard.path, shard.size_bytes, shard.mtime)
    table = TABLES.get(key)
    if table is None:
        fs, name = filesystem(str(shard.path), storage_options)
        table = _open(fs, name, str(shard.path))
        # a memory-mapped table holds no memory of its own: weigh only its batch headers
        TABLES.put(key, table, _MAPPED if is_local(fs) else table.nbytes)
    return table


def read(
    shard: Shard,
    offsets: np.ndarray,
    *,
    columns: tuple[str, ...] | None,
    storage_options: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The rows at ``offsets`` (int64, validated) of ``shard``, in order; fresh dicts each."""
    table = _table(shard, storage_options)
    if table.num_rows != shard.num_samples:
        raise changed(None, str(shard.path), f"indexed: {shard.num_samples} rows, now {table.num_rows}")
    if columns:
        table = table.select(list(columns))
    # ``take`` on a table of many batches concatenates whole columns first: slice out the
    # runs of consecutive rows needed (zero-copy), then take from that small table.
    uniq, inverse = np.unique(offsets, return_inverse=True)
    runs = np.split(uniq, np.flatnonzero(np.diff(uniq) != 1) + 1)
    small = pa.concat_tables([table.slice(int(r[0]), r.size) for r in runs]).combine_chunks()
    return small.take(pa.array(inverse.ravel())).to_pylist()


READER = Reader(
    "arrow",
    "from_arrow",
    lambda dataset, index, offsets: read(
        dataset.shards[index], offsets, columns=dataset.columns,
        storage_options=dataset.storage_options,
    ),
    inspect=inspect,
    extensions=(".arrow",),
    detect=is_saved,
    identity=columns_identity,
    html=columns_html,
)
