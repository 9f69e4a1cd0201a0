"""Mosaic MDS folders (``index.json`` + ``shard.NNNNN.mds[.zstd]``), read in place.

Layout (what mosaicml-streaming's ``MDSWriter`` writes)::

    index.json   {"version": 2, "shards": [{"format": "mds", "version": 2, "samples": n,
                  "column_names": [...], "column_encodings": [...], "column_sizes": [...],
                  "compression": null | "zstd[:level]" | "gz" | "bz2",
                  "raw_data": {"basename": "shard.00000.mds", ...},
                  "zip_data": null | {"basename": "shard.00000.mds.zstd", ...}}, ...]}
    shard file   uint32 n | (n + 1) uint32 absolute byte offsets | the writer's config (JSON)
                 | samples; a sample is one uint32 size per variable-size column, then the
                 columns

The folder's ``index.json`` is the index (nothing is cached or written); each
shard file's signature (:mod:`zephon_dask.data.integrity`) is taken when the
folder is opened and checked on every read. A
shard reads its raw file when present, else its compressed file, which is
decompressed whole once per process (as mosaicml-streaming does) and kept in
:data:`DECODED` (bounded LRU); raw shards keep only their offset table
(:data:`OFFSETS`) and fetch the samples' byte ranges. Columns decode to Python
values (``str``, ``bytes``, ``int``, ``float``, JSON values) or numpy arrays
(``ndarray``); pickle and image encodings are refused. Pure apart from those
caches.
"""

from __future__ import annotations

import bz2
import gzip
import json
import posixpath
from decimal import Decimal
from typing import Any

import numpy as np

from ..errors import ConfigError, DataFormatError, DatasetNotFoundError
from . import integrity
from .compressed import zstandard
from .memo import byte_lru
from .paths import fetch_ranges, file_mtime, filesystem, folder_json, is_local, to_url
from .reader import Reader
from .shard import Shard

INDEX = "index.json"
OFFSETS = byte_lru(1 << 28, lambda table: table.nbytes)
DECODED = byte_lru(1 << 30, len)
GAP = 1 << 16
_SCALARS = {
    name: np.dtype(name)
    for name in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                 "float16", "float32", "float64")
}
_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}
_VALUE_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
                 33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_SCHEMA_KEYS = ("column_names", "column_encodings", "column_sizes")


def is_folder(fs: Any, directory: str) -> bool:
    """Whether ``directory`` holds an MDS ``index.json`` (a foreign one is not ours to judge)."""
    doc = folder_json(fs, directory, INDEX)
    shards = doc.get("shards") if isinstance(doc, dict) else None
    return bool(shards) and isinstance(shards, list) and all(
        isinstance(s, dict) and s.get("format") == "mds" for s in shards
    )


def _bad(url: str, problem: str) -> DataFormatError:
    return DataFormatError(
        f"MDS folder {url!r}: {problem}; write the folder again with MDSWriter (or restore the "
        "missing files)"
    )


def open_folder(
    path: str, storage_options: dict[str, Any] | None
) -> tuple[tuple[Shard, ...], dict[str, Any]]:
    """``(shards, meta)`` of an MDS folder from its ``index.json`` and a listing. No sample is read.

    ``meta`` is ``{"schema": {column_names, column_encodings, column_sizes},
    "compressed": [compression of the file read, or None when raw, per shard]}``.
    """
    fs, root = filesystem(path, storage_options)
    root = root.rstrip("/")
    url = to_url(fs, root)
    try:
        doc = json.loads(fs.cat_file(f"{root}/{INDEX}"))
    except FileNotFoundError:
        raise DatasetNotFoundError(f"MDS folder {url!r} has no {INDEX}") from None
    except ValueError as exc:
        raise _bad(url, f"{INDEX} is not valid JSON ({exc})") from None
    entries = doc.get("shards") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise _bad(url, f"{INDEX} lists no shards")
    listing = {posixpath.basename(i["name"]): i for i in fs.ls(root, detail=True)}
    schema: dict[str, Any] | None = None
    shards, compressed = [], []
    for k, e in enumerate(entries):
        if not isinstance(e, dict) or e.get("format") != "mds" or e.get("version") != 2:
            raise _bad(url, f"shard #{k} in {INDEX} is not an MDS version 2 shard")
        this = {key: e.get(key) for key in _SCHEMA_KEYS}
        if schema is None:
            schema = this
        elif this != schema:
            raise _bad(url, f"shard #{k} has columns {this}, unlike shard #0's {schema}")
        raw = (e.get("raw_data") or {}).get("basename")
        zipped = (e.get("zip_data") or {}).get("basename")
        name = raw if raw in listing else zipped if zipped in listing else None
        if name is None:
            raise _bad(url, f"shard #{k}: neither {raw!r} nor {zipped!r} is in the folder")
        compressed.append(None if name == raw else str(e.get("compression")))
        if name != raw:
            _codec(str(e.get("compression")), f"{url}/{name}")
        info = listing[name]
        if info.get("type") != "file":  # a symbolic link: follow it
            info = fs.info(f"{root}/{name}")
        n = e.get("samples")
        if not isinstance(n, int) or n < 0:
            raise _bad(url, f"shard #{k} has samples = {n!r}")
        sig = integrity.local(f"{root}/{name}") if is_local(fs) else integrity.from_info(info)
        shards.append(Shard(str(raw or name), f"{url}/{name}", n, sig.size, file_mtime(info),
                            sig.mtime_ns, sig.etag, sig.fingerprint))
    assert schema is not None
    if not isinstance(schema["column_names"], list) or not (
        len(schema["column_names"]) == len(schema["column_encodings"] or ())
        == len(schema["column_sizes"] or ())
    ):
        raise _bad(url, f"column names, encodings and sizes do not match: {schema}")
    for column, enc in zip(schema["column_names"], schema["column_encodings"], strict=True):
        if not isinstance(enc, str):
            raise _bad(url, f"column {column!r} has encoding {enc!r}, not a string")
        _decoder(enc, f"MDS folder {url!r}, column {column!r}")
    return tuple(shards), {"schema": schema, "compressed": compressed}


def _codec(compression: str, url: str) -> str:
    algo = compression.split(":")[0]
    if algo not in ("zstd", "gz", "bz2"):
        raise DataFormatError(
            f"MDS shard {url!r} is compressed with {compression!r}; zephon_dask reads zstd, gz and "
            "bz2 MDS shards: keep the raw .mds files next to it, or write with compression='zstd'"
        )
    return algo


def _decompress(data: bytes, algo: str, url: str) -> bytes:
    try:
        if algo == "zstd":
            dec = zstandard().ZstdDecompressor().decompressobj()
            out = dec.decompress(data)
            if not dec.eof:
                raise DataFormatError("the zstd frame ends early (truncated)")
            return out
        return gzip.decompress(data) if algo == "gz" else bz2.decompress(data)
    except ConfigError:
        raise
    except Exception as exc:  # zstandard.ZstdError, OSError, EOFError, ...
        raise DataFormatError(
            f"MDS shard {url!r}: cannot decompress it ({algo}: {exc}); the file is corrupt or "
            "truncated: write or download it again"
        ) from None


def _decoder(encoding: str, url: str):
    """A ``bytes -> value`` function for one MDS column encoding (``url`` names the column in errors)."""
    base = encoding.split(":")[0]
    if base == "str":
        return lambda b: b.decode("utf-8")
    if base == "bytes":
        return bytes
    if base == "int":
        return lambda b: int(np.frombuffer(b, np.int64)[0])
    if base in _SCALARS:
        dt = _SCALARS[base]
        return lambda b: np.frombuffer(b, dt)[0].item()
    if base == "str_int":
        return lambda b: int(b.decode("utf-8"))
    if base == "str_float":
        return lambda b: float(b.decode("utf-8"))
    if base == "str_decimal":
        return lambda b: Decimal(b.decode("utf-8"))
    if base == "json":
        return lambda b: json.loads(b.decode("utf-8"))
    if base == "ndarray":
        return _ndarray_decoder(encoding, url)
    raise DataFormatError(
        f"{url}: column encoding {encoding!r} is not read by zephon_dask (pickle is "
        "unsafe to load, images are not text); store the column as str, bytes, json, ints or "
        "ndarray"
    )


def _ndarray_decoder(encoding: str, url: str):
    """The decoder of ``ndarray[:dtype[:shape]]`` (shape: comma-separated sizes); a dtype or
    shape MDS does not write is a DataFormatError naming the encoding."""
    parts = encoding.split(":")
    if len(parts) > 3:
        raise DataFormatError(f"{url}: column encoding {encoding!r} has {len(parts)} "
                              "parts; an MDS ndarray encoding is ndarray[:dtype[:shape]]")
    dtype = None
    if len(parts) > 1 and parts[1]:
        if parts[1] not in _VALUE_DTYPES.values():
            raise DataFormatError(
                f"{url}: column encoding {encoding!r} has dtype {parts[1]!r}, which MDS "
                f"ndarray columns do not hold (supported: {sorted(set(_VALUE_DTYPES.values()))}); "
                "write the column with one of them"
            )
        dtype = np.dtype(parts[1])
    shape = None
    if len(parts) > 2:
        sizes = parts[2].split(",")
        if not all(x.isdigit() for x in sizes):
            raise DataFormatError(
                f"{url}: column encoding {encoding!r} has shape {parts[2]!r}; a shape is "
                "comma-separated non-negative integers (e.g. 'ndarray:uint32:2,3'): index.json is "
                "damaged, write the folder again with MDSWriter"
            )
        shape = tuple(int(x) for x in sizes)

    def decode(b: bytes) -> np.ndarray:
        i, dt, shp = 0, dtype, shape
        if dt is None:
            dt, i = np.dtype(_VALUE_DTYPES[b[0]]), 1
        if shp is None:
            ndim, sdt = b[i] >> 2, np.dtype(_SHAPE_DTYPES[b[i] % 4])
            shp = tuple(np.frombuffer(b, sdt, ndim, i + 1).tolist())
            i += 1 + ndim * sdt.itemsize
        return np.frombuffer(b[i:], dt).reshape(shp)

    return decode


def _decode(data: bytes, schema: dict[str, Any], where: str) -> dict[str, Any]:
    names, encs, sizes = (schema[k] for k in _SCHEMA_KEYS)
    variable = [s is None for s in sizes]
    head = 4 * sum(variable)
    try:
        var_sizes = iter(np.frombuffer(data, np.uint32, sum(variable)).tolist())
        lengths = [next(var_sizes) if v else s for v, s in zip(variable, sizes, strict=True)]
        if head + sum(lengths) != len(data):
            raise DataFormatError(f"column sizes {lengths} do not add up to the {len(data)} bytes")
        out, at = {}, head
        for name, enc, n in zip(names, encs, lengths, strict=True):
            out[name] = _decoder(enc, where)(data[at : at + n])
            at += n
        return out
    except (ValueError, KeyError, IndexError, UnicodeDecodeError) as exc:
        raise DataFormatError(
            f"{where}: cannot decode the sample ({exc}); the shard is corrupt: write it again"
        ) from None


def _offsets(table: np.ndarray, shard: Shard, size: int) -> np.ndarray:
    """Check a shard's offset table (``n + 1`` absolute offsets) against its file size."""
    n = shard.num_samples
    ok = (
        table.size == n + 1
        and int(table[0]) >= 4 * (n + 2)
        and int(table[-1]) == size
        and not np.any(np.diff(table) < 0)
    )
    if not ok:
        raise DataFormatError(
            f"MDS shard {shard.path!r}: its header does not describe {n} samples in {size} bytes "
            "(bad offset table); the file is corrupt or truncated: write or download it again"
        )
    return table


def _raw_layout(fs: Any, name: str, shard: Shard) -> np.ndarray:
    table = OFFSETS.get(shard)
    if table is None:
        n = shard.num_samples
        head = fs.cat_file(name, start=0, end=4 * (n + 2))
        if len(head) < 4 * (n + 2) or int(np.frombuffer(head, np.uint32, 1)[0]) != n:
            raise DataFormatError(
                f"MDS shard {shard.path!r}: its header does not say {n} samples as index.json "
                "does; the file is corrupt, truncated or from another write: write it again"
            )
        table = _offsets(
            np.frombuffer(head, np.uint32, n + 1, 4).astype(np.int64), shard, int(fs.size(name))
        )
        OFFSETS[shard] = table
    return table


def _decoded(fs: Any, name: str, shard: Shard, compression: str) -> bytes:
    data = DECODED.get(shard)
    if data is None:
        data = _decompress(fs.cat_file(name), _codec(compression, str(shard.path)), str(shard.path))
        n = shard.num_samples
        if len(data) < 4 * (n + 2) or int(np.frombuffer(data, np.uint32, 1)[0]) != n:
            raise DataFormatError(
                f"MDS shard {shard.path!r}: the decompressed header does not say {n} samples as "
                "index.json does; the shard is corrupt: write it again"
            )
        _offsets(np.frombuffer(data, np.uint32, n + 1, 4).astype(np.int64), shard, len(data))
        DECODED[shard] = data
    return data


def read(
    shard: Shard, offsets: np.ndarray, *, schema: dict[str, Any], compression: str | None,
    storage_options: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The samples at ``offsets`` (int64, validated) of ``shard``, in order; fresh dicts each."""
    fs, name = filesystem(str(shard.path), storage_options)
    uniq, inverse = np.unique(offsets, return_inverse=True)
    try:
        if compression is None:
            table = _raw_layout(fs, name, shard)
            lo, hi = table[uniq], table[uniq + 1]
            cut = np.flatnonzero(lo[1:] - hi[:-1] > GAP) + 1
            first, last = np.concatenate(([0], cut)), np.concatenate((cut, [uniq.size])) - 1
            blobs = fetch_ranges(fs, name, lo[first].tolist(), hi[last].tolist())
            group = np.repeat(np.arange(first.size), last - first + 1)
            base = lo[first][group]
            raw = [blobs[g][a:b] for g, a, b in zip(group.tolist(), (lo - base).tolist(),
                                                    (hi - base).tolist(), strict=True)]
        else:
            data = _decoded(fs, name, shard, compression)
            table = np.frombuffer(data, np.uint32, shard.num_samples + 1, 4)
            raw = [data[int(table[u]) : int(table[u + 1])] for u in uniq.tolist()]
    except FileNotFoundError:
        raise DatasetNotFoundError(f"MDS shard {shard.path!r} no longer exists") from None
    where = f"MDS shard {shard.path!r}, sample offset"
    return [_decode(raw[j], schema, f"{where} {int(uniq[j])}") for j in inverse.ravel().tolist()]


def _read(dataset: Any, index: int, offsets: np.ndarray) -> list[dict[str, Any]]:
    meta = dataset.meta
    shard = dataset.shards[index]
    zipped = meta["compressed"][index]
    return read(
        shard, offsets, schema=meta["schema"], compression=zipped,
        storage_options=dataset.storage_options,
    )


READER = Reader(
    "mds",
    "from_mds",
    _read,
    extensions=(".mds", ".mds.zstd", ".mds.gz", ".mds.bz2"),
    detect=is_folder,
    identity=lambda dataset: {"columns": dataset.meta["schema"]},
    html=lambda dataset: [
        ("columns", ", ".join(
            f"{n} ({e})" for n, e in zip(dataset.meta["schema"]["column_names"],
                                        dataset.meta["schema"]["column_encodings"], strict=True)
        ))
    ],
    doc="Mosaic MDS folders (`index.json` + `shard.*.mds[.zstd]`)",
)
