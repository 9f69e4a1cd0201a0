"""Arrow IPC shards (``.arrow``), as Hugging Face ``save_to_disk`` writes them: row-addressed reads.

A file is either the Arrow IPC *stream* format (what ``datasets`` writes) or the
IPC *file* format (magic ``ARROW1``); both are read. A record is one row as a
dict of the selected columns. Local files are memory-mapped (the page cache
holds the data) and the opened table is kept in a per-process LRU
(:data:`TABLES`, keyed by path, size and mtime); a read copies out only the rows
asked. A file in an object store is fetched whole once, when it is indexed,
which records its message layout (:func:`layout`: the schema message and each
record batch's byte range and rows, ``Shard.parts``); a read then fetches the
schema and the record batches holding the asked rows as byte ranges (contiguous
ones in one request). A file with dictionary batches, or indexed without a
layout, is fetched whole and kept in :data:`TABLES`. Pure apart from that cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataFormatError, DatasetNotFoundError
from .hf import is_saved
from .integrity import changed
from .memo import byte_lru
from .parquet import column_types, columns_html, columns_identity
from .paths import FileInfo, fetch_ranges, filesystem, is_local
from .reader import Reader
from .shard import Shard

if TYPE_CHECKING:  # imported where used: a process that reads no Arrow file never loads pyarrow
    import pyarrow as pa

FILE_MAGIC = b"ARROW1"
TABLES = byte_lru(1 << 30, lambda held: held[1])  # (table, the bytes it holds)
_MAPPED = 1 << 16


def _unreadable(url: str, exc: BaseException) -> DataFormatError:
    return DataFormatError(
        f"cannot read Arrow IPC file {url!r}: {exc}. It is corrupt or truncated, or not an "
        "Arrow IPC file: write it again (datasets' save_to_disk) or point at the right folder"
    )


def layout(data: bytes) -> tuple[int, ...] | None:
    """``(schema start, schema end, then start, end, rows of each record batch)``: the message
    byte ranges of the Arrow IPC stream or file ``data``; ``None`` when it holds dictionary
    batches (such a file is read whole). Pure."""
    import pyarrow as pa

    reader = pa.BufferReader(pa.py_buffer(data))
    reader.seek(8 if data[: len(FILE_MAGIC)] == FILE_MAGIC else 0)
    messages = pa.ipc.MessageReader.open_stream(reader)
    out: list[int] = []
    schema = None
    start = reader.tell()
    while True:
        try:
            msg = messages.read_next_message()
        except StopIteration:
            return tuple(out)
        end = reader.tell()
        if msg.type == "schema" and schema is None:
            schema = pa.ipc.read_schema(msg)
            out += [start, end]
        elif msg.type == "record batch" and schema is not None:
            out += [start, end, pa.ipc.read_record_batch(msg, schema).num_rows]
        else:
            return None
        start = end


def _load(fs: Any, name: str, url: str) -> tuple[pa.Table, bytes | None]:
    """The whole file as a table (zero-copy when local) and, from an object store, its bytes."""
    import pyarrow as pa

    try:
        data = None
        if is_local(fs):
            with open(name, "rb") as fh:
                head = fh.read(len(FILE_MAGIC))
            source: Any = pa.memory_map(name, "r")
        else:
            data = fs.cat_file(name)
            head, source = data[: len(FILE_MAGIC)], pa.py_buffer(data)
        opener = pa.ipc.open_file if head == FILE_MAGIC else pa.ipc.open_stream
        return opener(source).read_all(), data
    except FileNotFoundError:
        raise DatasetNotFoundError(f"Arrow file {url!r} no longer exists") from None
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(url, exc) from None


def _open(fs: Any, name: str, url: str) -> pa.Table:
    return _load(fs, name, url)[0]


def inspect(fs: Any, f: FileInfo) -> dict[str, Any]:
    """Index entry extras for one file: ``num_samples``, top-level ``columns`` and their ``types``
    (and, in an object store, its message layout ``parts``)."""
    table, data = _load(fs, f.name, f.url)
    extra: dict[str, Any] = {"num_samples": int(table.num_rows), "columns": table.schema.names,
                             "types": column_types(table.schema)}
    parts = None if data is None else layout(data)
    if parts:
        extra["parts"] = list(parts)
    return extra


def _ranged(shard: Shard, uniq: np.ndarray, storage_options: dict[str, Any] | None) -> tuple[pa.Table, np.ndarray]:
    """The record batches holding rows ``uniq`` (sorted, unique), fetched as byte ranges, as one
    table, and where each of those rows is in it."""
    import pyarrow as pa

    assert shard.parts is not None, "called for shards with a recorded layout"
    parts = np.asarray(shard.parts[2:], np.int64).reshape(-1, 3)
    bounds = np.concatenate(([0], np.cumsum(parts[:, 2])))
    if bounds[-1] != shard.num_samples:
        raise changed(None, str(shard.path), f"indexed: {shard.num_samples} rows, layout {bounds[-1]}")
    group = np.searchsorted(bounds, uniq, side="right") - 1
    needed = np.unique(group)
    lo = np.concatenate(([shard.parts[0]], parts[needed, 0]))
    hi = np.concatenate(([shard.parts[1]], parts[needed, 1]))
    cut = np.flatnonzero(lo[1:] != hi[:-1]) + 1  # contiguous messages: one request
    first, last = np.concatenate(([0], cut)), np.concatenate((cut, [lo.size])) - 1
    fs, name = filesystem(str(shard.path), storage_options)
    try:
        blobs = fetch_ranges(fs, name, lo[first].tolist(), hi[last].tolist())
        span = np.repeat(np.arange(first.size), last - first + 1)
        base = lo[first][span]
        raw = [pa.py_buffer(blobs[g])[int(a) : int(b)]
               for g, a, b in zip(span.tolist(), lo - base, hi - base, strict=True)]
        schema = pa.ipc.read_schema(pa.ipc.read_message(raw[0]))
        batches = [pa.ipc.read_record_batch(pa.ipc.read_message(b), schema) for b in raw[1:]]
    except FileNotFoundError:
        raise DatasetNotFoundError(f"Arrow file {shard.path!r} no longer exists") from None
    except PermissionError:
        raise  # a refused read, not a malformed file (Dataset.read types it)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(str(shard.path), exc) from None
    start_in_table = np.concatenate(([0], np.cumsum(parts[needed, 2])))
    rows = start_in_table[np.searchsorted(needed, group)] + (uniq - bounds[group])
    return pa.Table.from_batches(batches, schema), rows


def _table(shard: Shard, storage_options: dict[str, Any] | None) -> pa.Table:
    key = (shard.path, shard.size_bytes, shard.mtime)
    held = TABLES.get(key)
    if held is None:
        fs, name = filesystem(str(shard.path), storage_options)
        table = _open(fs, name, str(shard.path))
        # a memory-mapped table holds no memory of its own: weigh only its batch headers
        held = TABLES[key] = (table, _MAPPED if is_local(fs) else table.nbytes)
    return held[0]


def read(
    shard: Shard,
    offsets: np.ndarray,
    *,
    columns: tuple[str, ...] | None,
    storage_options: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The rows at ``offsets`` (int64, validated) of ``shard``, in order; fresh dicts each."""
    import pyarrow as pa

    if shard.parts is not None:
        uniq, inverse = np.unique(offsets, return_inverse=True)
        table, rows = _ranged(shard, uniq, storage_options)
        if columns:
            table = table.select(list(columns))
        return table.take(pa.array(rows[inverse.ravel()])).to_pylist()
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
    doc="Arrow IPC files (`.arrow`), Hugging Face `save_to_disk` folders (also read by `Dataset.from_hf`)",
)
