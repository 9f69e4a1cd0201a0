"""litData folders (what ``litdata.optimize`` writes: ``index.json`` + ``chunk-*.bin``), read in place.

Layout (litData's ``BinaryWriter`` with its default ``PyTreeLoader``)::

    index.json   {"chunks": [{"filename": "chunk-0-0.bin", "chunk_size": n, "chunk_bytes": b,
                  ...}, ...],
                  "config": {"data_format": ["str", "int", ...], "data_spec": "<treespec JSON>",
                  "compression": null | "zstd", "encryption": null,
                  "item_loader": "PyTreeLoader", ...}}
    chunk file   uint32 n | (n + 1) uint32 absolute byte offsets | items; an item is one uint32
                 size per leaf, then the leaves | optionally an Arrow IPC file of the same rows,
                 its uint32 length and the magic ``LDARW01\\0`` (rows of plain JSON types)

A row is a dict; the ``data_spec`` (a treespec) gives its shape: fields that are
leaves, or dicts, lists and tuples of leaves, the leaves in ``data_format`` order. Leaves decode as litData's serializers do: ``str``, ``text``, ``bytes``,
``int`` (int64), ``float`` (float64), ``bool``, ``json`` (a list or dict kept whole, in
litData's tagged encoding), ``numpy`` (a dtype, shape header) and
``no_header_numpy:<dtype>`` (1-D arrays: token ids) to numpy arrays. A chunk ending in
an Arrow footer reads its rows from the footer (as litData does), the footer fetched
once per process and kept in :data:`TABLES`; other raw chunks keep only their offset
table (:data:`OFFSETS`) and fetch the items' byte ranges. A ``zstd`` chunk file is
decompressed whole once per process (:data:`DECODED`). Encrypted folders, other item
loaders (``TokensLoader``), pickled and media leaves are refused with a DataFormatError
naming them. The folder's ``index.json`` is the index;
each chunk file's signature (:mod:`zephon_dask.data.integrity`) is taken when the
folder is opened and checked on every read. Pure apart from those caches.
"""

from __future__ import annotations

import json
import posixpath
import struct
from typing import Any

import numpy as np

from ..errors import ConfigError, DataFormatError, DatasetNotFoundError
from . import integrity
from .compressed import zstandard
from .lance import fresh
from .memo import byte_lru
from .paths import fetch_ranges, file_mtime, filesystem, folder_json, is_local, to_url
from .reader import Reader
from .shard import Shard

INDEX = "index.json"
MAGIC = b"LDARW01\0"
FRAMED = b"LDFZ01\0\0"
OFFSETS = byte_lru(1 << 28, lambda layout: layout[0].nbytes + 64)
DECODED = byte_lru(1 << 30, len)
TABLES = byte_lru(1 << 30, lambda table: table.nbytes)
GAP = 1 << 16
# litData's numpy dtype codes (its _NUMPY_DTYPES_MAPPING), the numeric and bool ones
NUMPY_DTYPES = {i: np.dtype(t) for i, t in enumerate(
    ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
     "float32", "float64", "complex64", "complex128", "bool"))}
_TEXT = ("str", "text")
_LEAVES = ("str", "text", "bytes", "int", "float", "bool", "numpy", "no_header_numpy", "json")


def is_folder(fs: Any, directory: str) -> bool:
    """Whether ``directory`` holds a litData ``index.json`` (``chunks`` and a ``config``)."""
    doc = folder_json(fs, directory, INDEX)
    return (isinstance(doc, dict) and isinstance(doc.get("chunks"), list)
            and isinstance(doc.get("config"), dict) and "data_format" in doc["config"])


def _bad(url: str, problem: str) -> DataFormatError:
    return DataFormatError(
        f"litData folder {url!r}: {problem}; write the folder again with litdata.optimize (or "
        "restore the missing files)"
    )


_CONTAINERS = {"builtins.dict": "dict", "collections.OrderedDict": "dict", "builtins.list": "list",
               "builtins.tuple": "tuple"}


def _template(node: dict[str, Any]) -> Any:
    """A treespec node as ``None`` (a leaf) or ``[kind, keys or None, [children]]``."""
    if node.get("type") is None:
        return None
    kind = _CONTAINERS[node["type"]]  # KeyError: a container we do not rebuild
    keys = [str(k) for k in json.loads(node["context"])] if kind == "dict" else None
    children = [_template(c) for c in node["children_spec"]]
    if keys is not None and len(keys) != len(children):
        raise ValueError("keys and children differ")
    return [kind, keys, children]


def _leaves(template: Any) -> int:
    return 1 if template is None else sum(_leaves(c) for c in template[2])


def _tree(config: dict[str, Any], url: str) -> Any:
    """The row's shape from the ``data_spec`` treespec: a dict of fields, each a leaf or a
    dict, list or tuple of them (one ``data_format`` entry per leaf, in order)."""
    try:
        _, spec = json.loads(config["data_spec"])
        tree = _template(spec)
        ok = tree is not None and tree[0] == "dict" and _leaves(tree) == len(config["data_format"] or ())
    except (TypeError, ValueError, KeyError):
        ok = False
    if not ok:
        raise _bad(url, "its rows are not dicts of fields (data_spec "
                   f"{str(config.get('data_spec'))[:120]!r}); zephon_dask reads rows that are "
                   "dicts")
    return tree


def _build(template: Any, values: Any) -> Any:
    """The value of ``template`` from the decoded leaves (an iterator, in order)."""
    if template is None:
        return next(values)
    kind, keys, children = template
    items = [_build(c, values) for c in children]
    if kind == "dict":
        return dict(zip(keys, items, strict=True))
    return items if kind == "list" else tuple(items)


def _kinds(tree: Any, data_format: list[str]) -> dict[str, str]:
    """Each field's leaf type (``"str"``, ...), or ``"dict"``/``"list"``/``"tuple"`` when nested."""
    out, at = {}, 0
    for key, child in zip(tree[1], tree[2], strict=True):
        out[key] = data_format[at] if child is None else child[0]
        at += _leaves(child)
    return out


def _level(config: dict[str, Any]) -> str | None:
    """How chunk files are compressed: ``None``, or with zstd ``"chunk"`` (the whole file),
    ``"batch"`` (frames of rows) or ``"sample"`` (each row)."""
    if config.get("compression") is None:
        return None
    return config.get("compression_level") or "chunk"


def _check_config(config: dict[str, Any], url: str) -> None:
    refused = {
        "encryption": config.get("encryption") is not None,
        "item_loader": config.get("item_loader", "PyTreeLoader") != "PyTreeLoader",
        "compression": str(config.get("compression")).split(":")[0] not in ("None", "zstd"),
        "compression_level": config.get("compression_level") not in (None, "chunk", "batch", "sample"),
    }
    for key, bad in refused.items():
        if bad:
            raise DataFormatError(
                f"litData folder {url!r}: {key} {config.get(key)!r} is not read by zephon_dask "
                "(it reads PyTreeLoader folders, unencrypted, uncompressed or compressed with "
                "compression='zstd'); write the folder again with litdata.optimize so"
            )
    for leaf in config["data_format"] or ():
        if str(leaf).split(":")[0] not in _LEAVES:
            raise DataFormatError(
                f"litData folder {url!r}: leaf type {leaf!r} is not read by zephon_dask (pickle "
                f"is unsafe to load, media are not text; it reads {list(_LEAVES)})"
            )


def open_folder(
    path: str, storage_options: dict[str, Any] | None
) -> tuple[tuple[Shard, ...], dict[str, Any]]:
    """``(shards, meta)`` of a litData folder from its ``index.json`` and a listing. No row is read.

    ``meta`` is ``{"keys": [...], "tree": the row's shape, "kinds": {field: leaf type or
    container}, "data_format": [...], "compression": None | "chunk" | "batch"
    | "sample" (zstd), "frame_rows", "types": litData's recorded field types, "sizes": chunk
    bytes}``; a shard is one chunk file, in index order.
    """
    fs, root = filesystem(path, storage_options)
    root = root.rstrip("/")
    url = to_url(fs, root)
    try:
        doc = json.loads(fs.cat_file(f"{root}/{INDEX}"))
    except FileNotFoundError:
        raise DatasetNotFoundError(f"litData folder {url!r} has no {INDEX}") from None
    except ValueError as exc:
        raise _bad(url, f"{INDEX} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise _bad(url, f"{INDEX} has no config")
    config, entries = doc["config"], doc.get("chunks")
    if not isinstance(entries, list) or not entries:
        raise _bad(url, f"{INDEX} lists no chunks")
    _check_config(config, url)
    tree = _tree(config, url)
    listing = {posixpath.basename(i["name"]): i for i in fs.ls(root, detail=True)}
    level = _level(config)
    shards = []
    for k, e in enumerate(entries):
        name = e.get("filename") if isinstance(e, dict) else None
        n, size = (e.get("chunk_size"), e.get("chunk_bytes")) if isinstance(e, dict) else (None, None)
        if not isinstance(name, str) or not isinstance(n, int) or n < 0 or not isinstance(size, int):
            raise _bad(url, f"chunk #{k} in {INDEX} is {e!r}, not a filename, chunk_size and chunk_bytes")
        if name not in listing:
            raise _bad(url, f"chunk #{k}: {name!r} is not in the folder")
        info = listing[name]
        if info.get("type") != "file":  # a symbolic link: follow it
            info = fs.info(f"{root}/{name}")
        if level != "chunk" and int(info["size"]) != size:
            raise _bad(url, f"chunk {name!r} is {int(info['size']):,} bytes, {INDEX} says {size:,} "
                       "(truncated or from another write)")
        sig = integrity.local(f"{root}/{name}") if is_local(fs) else integrity.from_info(info)
        shards.append(Shard(name, f"{url}/{name}", n, sig.size, file_mtime(info), sig.mtime_ns,
                            sig.etag, sig.fingerprint))
    meta = {"keys": tree[1], "tree": tree, "kinds": _kinds(tree, list(config["data_format"])),
            "data_format": list(config["data_format"]), "compression": level,
            "frame_rows": int(config.get("compression_batch_size") or 256),
            "types": config.get("types"), "sizes": [int(e["chunk_bytes"]) for e in entries]}
    return tuple(shards), meta


def _leaf_decoder(leaf: str, where: str):
    """A ``bytes -> value`` function for one litData leaf type, as its serializer reads it."""
    base, _, arg = leaf.partition(":")
    if base in _TEXT:
        return lambda b: bytes(b).decode("utf-8")
    if base == "bytes":
        return bytes
    if base == "int":
        return lambda b: struct.unpack("<q", b)[0]
    if base == "float":
        return lambda b: struct.unpack("<d", b)[0]
    if base == "bool":
        return lambda b: b[0] != 0
    if base == "no_header_numpy":
        code = int(arg) if arg.isdigit() else -1
        if code not in NUMPY_DTYPES:
            raise DataFormatError(f"{where}: leaf type {leaf!r} names no numeric numpy dtype")
        dt = NUMPY_DTYPES[code]
        return lambda b: np.frombuffer(b, dt).copy()
    if base == "numpy":
        def decode(b: bytes) -> np.ndarray:
            code, ndim = struct.unpack_from("<II", b)
            shape = struct.unpack_from(f"<{ndim}I", b, 8)
            return np.frombuffer(b, NUMPY_DTYPES[code], offset=8 + 4 * ndim).reshape(shape).copy()
        return decode
    assert base == "json", base  # _check_config allowed only these
    return _json_leaf


def _json_leaf(b: bytes) -> Any:
    """A ``json`` leaf (a list or dict litData keeps whole): its tagged binary, or JSON text."""
    raw = bytes(b)
    if not raw or raw[0] > 0x20:
        return json.loads(raw)
    value, end = _nested(raw, 0)
    if end != len(raw):
        raise ValueError(f"a nested value ends at byte {end} of {len(raw)}")
    return value


def _utf8(raw: bytes, at: int) -> tuple[str, int]:
    n = struct.unpack_from("<I", raw, at)[0]
    return raw[at + 4 : at + 4 + n].decode("utf-8"), at + 4 + n


def _nested(raw: bytes, at: int) -> tuple[Any, int]:
    """The value tagged at ``at`` in litData's nested encoding, and where it ends. Tags: 0 JSON
    text, 1 strs, 2 int64s, 3 float64s, 4 bools, 5 dict, 6 records, 7 str, 8 int64, 9 float64,
    10 bool, 11 None; a record's values tagged 0x10 None, 0x11 str, 0x12 int64, 0x13 float64,
    0x14 bool."""
    tag = raw[at]
    if tag in (7, 8, 9, 10, 11):
        if tag == 7:
            return _utf8(raw, at + 1)
        if tag in (8, 9):
            return struct.unpack_from("<q" if tag == 8 else "<d", raw, at + 1)[0], at + 9
        return (bool(raw[at + 1]), at + 2) if tag == 10 else (None, at + 1)
    n = struct.unpack_from("<I", raw, at + 1)[0]
    at += 5
    if tag == 0:
        return json.loads(raw[at : at + n]), at + n
    if tag == 1:
        out = []
        for _ in range(n):
            text, at = _utf8(raw, at)
            out.append(text)
        return out, at
    if tag in (2, 3):
        if at + 8 * n > len(raw):
            raise ValueError("a nested array runs past its leaf")
        return np.frombuffer(raw, "<i8" if tag == 2 else "<f8", n, at).tolist(), at + 8 * n
    if tag == 4:
        return [bool(x) for x in raw[at : at + n]], at + n
    if tag == 5:
        mapping = {}
        for _ in range(n):
            key, at = _utf8(raw, at)
            mapping[key], at = _nested(raw, at)
        return mapping, at
    if tag == 6:
        count, at, keys = struct.unpack_from("<I", raw, at)[0], at + 4, []
        for _ in range(count):
            key, at = _utf8(raw, at)
            keys.append(key)
        rows = []
        for _ in range(n):
            row: dict[str, Any] = {}
            for key in keys:
                kind, at = raw[at], at + 1
                if kind == 0x11:
                    row[key], at = _utf8(raw, at)
                elif kind in (0x12, 0x13):
                    row[key], at = struct.unpack_from("<q" if kind == 0x12 else "<d", raw, at)[0], at + 8
                elif kind in (0x10, 0x14):
                    row[key], at = (None, at) if kind == 0x10 else (bool(raw[at]), at + 1)
                else:
                    raise ValueError(f"unknown nested record tag {kind}")
            rows.append(row)
        return rows, at
    raise ValueError(f"unknown nested tag {tag}")


def _decode(data: bytes, meta: dict[str, Any], where: str) -> dict[str, Any]:
    leaves = meta["data_format"]
    k = len(leaves)
    try:
        sizes = struct.unpack_from(f"<{k}I", data)
        if 4 * k + sum(sizes) != len(data):
            raise DataFormatError(f"leaf sizes {list(sizes)} do not add up to the {len(data)} bytes")
        values, at = [], 4 * k
        for leaf, n in zip(leaves, sizes, strict=True):
            values.append(_leaf_decoder(leaf, where)(data[at : at + n]))
            at += n
        return _build(meta["tree"], iter(values))
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, struct.error) as exc:
        raise DataFormatError(
            f"{where}: cannot decode the row ({exc}); the chunk is corrupt: write it again"
        ) from None


def _check_head(head: bytes, shard: Shard, size: int) -> tuple[np.ndarray, tuple[int, int] | None]:
    """The offset table and Arrow footer span (``(start, length)`` or ``None``) of a chunk whose
    first ``4 * (n + 2)`` and last 12 bytes ``head`` holds (``size`` bytes in all)."""
    n = shard.num_samples
    span = 4 * (n + 2)
    if len(head) < span + 12 or struct.unpack_from("<I", head)[0] != n:
        raise DataFormatError(
            f"litData chunk {shard.path!r}: its header does not say {n} rows as index.json does; "
            "the file is corrupt, truncated or from another write: write it again"
        )
    table = np.frombuffer(head, np.uint32, n + 1, 4).astype(np.int64)
    footer = None
    tail = head[-12:]
    if tail[-8:] == MAGIC:
        length = struct.unpack_from("<I", tail)[0]
        footer = (size - 12 - length, length)
    end = footer[0] if footer else size
    if int(table[0]) != span or int(table[-1]) > end or np.any(np.diff(table) < 0) or (
        footer is None and int(table[-1]) != size
    ):
        raise DataFormatError(
            f"litData chunk {shard.path!r}: its header does not describe {n} rows in {size} bytes "
            "(bad offset table); the file is corrupt or truncated: write or download it again"
        )
    return table, footer


def _layout(fs: Any, name: str, shard: Shard, data: bytes | None) -> tuple[np.ndarray, tuple[int, int] | None]:
    got = OFFSETS.get(shard)
    if got is None:
        span = 4 * (shard.num_samples + 2)
        if data is None:
            size = int(fs.size(name))
            head = fs.cat_file(name, start=0, end=span) + fs.cat_file(name, start=max(size - 12, 0), end=size)
        else:
            size, head = len(data), data[:span] + data[-12:]
        got = _check_head(head, shard, size)
        OFFSETS[shard] = got
    return got


def _footer(fs: Any, name: str, shard: Shard, span: tuple[int, int], data: bytes | None) -> Any:
    """The chunk's Arrow copy of its rows (a ``pyarrow.Table``), read once per process."""
    import pyarrow as pa  # here, not at import: the registry imports every format, threads none

    table = TABLES.get(shard)
    if table is None:
        start, length = span
        blob = data[start : start + length] if data is not None else fs.cat_file(
            name, start=start, end=start + length)
        try:
            table = pa.ipc.open_file(pa.py_buffer(blob)).read_all().combine_chunks()
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataFormatError(
                f"litData chunk {shard.path!r}: its Arrow footer cannot be read ({exc}); the file "
                "is corrupt: write it again"
            ) from None
        if table.num_rows != shard.num_samples:
            raise DataFormatError(
                f"litData chunk {shard.path!r}: its Arrow footer holds {table.num_rows} rows, "
                f"index.json says {shard.num_samples}; write the folder again"
            )
        TABLES[shard] = table
    return table


def _inflate(blob: bytes, size: int | None, shard: Shard) -> bytes:
    """``blob`` (zstd frames) decompressed, ``size`` bytes when given; DataFormatError otherwise."""
    try:
        dec = zstandard().ZstdDecompressor().decompressobj()
        data = dec.decompress(bytes(blob))
        ok = dec.eof and (size is None or len(data) == size)
    except ConfigError:
        raise
    except Exception:  # zstandard.ZstdError
        ok = False
    if not ok:
        raise DataFormatError(
            f"litData chunk {shard.path!r}: cannot decompress it (zstd) to the bytes its header "
            "says; the file is corrupt or truncated: write it again"
        )
    return data


def _decompressed(fs: Any, name: str, shard: Shard, size: int) -> bytes:
    data = DECODED.get(shard)
    if data is None:
        data = _inflate(fs.cat_file(name), size, shard)
        DECODED[shard] = data
    return data


def _framed(fs: Any, name: str, shard: Shard, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(item offsets in the uncompressed items, frames [first, n, offset, length, raw length])``
    of a chunk written with ``compression_level="batch"`` (``rows`` per frame)."""
    got = OFFSETS.get(shard)
    if got is None:
        n = shard.num_samples
        frames = -(-n // max(rows, 1))
        head = fs.cat_file(name, start=0, end=24 + 4 * (n + 1) + 24 * frames)
        try:
            magic, version, _, count, k, num = struct.unpack_from("<8sHHIII", head)
            ok = magic == FRAMED and version == 1 and count == n and num == frames and k == rows
            logical = np.frombuffer(head, np.uint32, n + 1, 24).astype(np.int64)
            table = np.array([struct.unpack_from("<IIQII", head, 24 + 4 * (n + 1) + 24 * f)
                              for f in range(num)], dtype=np.int64).reshape(num, 5)
        except (struct.error, ValueError):
            ok = False
        size = int(fs.size(name))
        if not ok or np.any(np.diff(logical) < 0) or np.any(table[:, 0] != np.arange(frames) * k) or np.any(
            table[:, 2] + table[:, 3] > size
        ):
            raise DataFormatError(
                f"litData chunk {shard.path!r}: its framed zstd header does not describe {n} rows "
                f"in frames of {rows}; the file is corrupt or truncated: write it again"
            )
        got = (logical, table)
        OFFSETS[shard] = got
    return got


def _framed_items(fs: Any, name: str, shard: Shard, rows: int, uniq: np.ndarray) -> list[bytes]:
    logical, table = _framed(fs, name, shard, rows)
    which = np.unique(uniq // rows)
    blobs = fetch_ranges(fs, name, table[which, 2].tolist(), (table[which, 2] + table[which, 3]).tolist())
    frames = {int(f): _inflate(b, int(table[f, 4]), shard) for f, b in zip(which, blobs, strict=True)}
    out = []
    for i in uniq.tolist():
        f = i // rows
        base = int(logical[int(table[f, 0])])
        out.append(frames[f][int(logical[i]) - base : int(logical[i + 1]) - base])
    return out


def _ranges(fs: Any, name: str, table: np.ndarray, uniq: np.ndarray, data: bytes | None) -> list[bytes]:
    """The items' bytes, from ``data`` or fetched in ranges (items closer than GAP: one range)."""
    lo, hi = table[uniq], table[uniq + 1]
    if data is not None:
        return [data[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
    cut = np.flatnonzero(lo[1:] - hi[:-1] > GAP) + 1
    first, last = np.concatenate(([0], cut)), np.concatenate((cut, [uniq.size])) - 1
    blobs = fetch_ranges(fs, name, lo[first].tolist(), hi[last].tolist())
    group = np.repeat(np.arange(first.size), last - first + 1)
    base = lo[first][group]
    return [blobs[g][a:b] for g, a, b in zip(group.tolist(), (lo - base).tolist(),
                                            (hi - base).tolist(), strict=True)]


def read(shard: Shard, offsets: np.ndarray, *, meta: dict[str, Any], size: int,
         storage_options: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows at ``offsets`` (int64, validated) of chunk ``shard``, in order; fresh dicts each."""
    fs, name = filesystem(str(shard.path), storage_options)
    uniq, inverse = np.unique(offsets, return_inverse=True)
    order = inverse.ravel().tolist()
    level = meta["compression"]
    try:
        if level == "batch":
            raw = _framed_items(fs, name, shard, meta["frame_rows"], uniq)
        else:
            data = _decompressed(fs, name, shard, size) if level == "chunk" else None
            table, footer = _layout(fs, name, shard, data)
            if footer is not None:
                rows = _footer(fs, name, shard, footer, data).take(uniq).to_pylist()
                keys = meta["keys"]
                return fresh([{k: r[k] for k in keys} for r in rows], order)
            raw = _ranges(fs, name, table, uniq, data)
            if level == "sample":
                raw = [_inflate(b, None, shard) for b in raw]
    except FileNotFoundError:
        raise DatasetNotFoundError(f"litData chunk {shard.path!r} no longer exists") from None
    where = f"litData chunk {shard.path!r}, row"
    return [_decode(raw[j], meta, f"{where} {int(uniq[j])}") for j in order]


def _read(dataset: Any, index: int, offsets: np.ndarray) -> list[dict[str, Any]]:
    meta = dataset.meta
    return read(dataset.shards[index], offsets, meta=meta, size=meta["sizes"][index],
                storage_options=dataset.storage_options)


READER = Reader(
    "litdata",
    "from_litdata",
    _read,
    detect=is_folder,
    doc="litData folders (`litdata.optimize`: `index.json` + `chunk-*.bin`)",
    identity=lambda dataset: {"litdata": {k: dataset.meta[k] for k in ("tree", "data_format",
                                                                         "compression")}},
    html=lambda dataset: [("fields", ", ".join(f"{k} ({f})" for k, f in dataset.meta["kinds"].items()))],
)
