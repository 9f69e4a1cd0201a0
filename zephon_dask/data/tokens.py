"""Pre-tokenized token stores (zarr v3).

Layout (a zarr v3 group at ``path``)::

    zarr.json                       root group; attributes:
        {"format": "zephon_dask.tokens", "version": 1,
         "tokenizer": {...},        # whatever the writer stored (e.g. "sha256")
         "shards": ["a", "b", ...]} # shard ids, sorted
    shards/<shard_id>/tokens        1-D uint16 (all ids < 65536) or uint32
    shards/<shard_id>/offsets       1-D int64, num_docs + 1 entries, offsets[0] == 0,
                                    non-decreasing, offsets[-1] == len(tokens)

Document ``i`` of a shard is ``tokens[offsets[i]:offsets[i+1]]``. Shard ids
match ``[A-Za-z0-9][A-Za-z0-9._-]*``. Construction reads metadata only; a
shard's offsets array is loaded (and checked) on its first read in a process
and kept in a byte-bounded LRU (:data:`OPENED`, keyed by the :class:`Shard`).
Reads fetch one token slice per run of nearby documents (gaps under
:data:`GAP` tokens are read through). Documents come back in the stored dtype.
:func:`write_token_store` is the writer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import ConfigError, DataFormatError, DatasetNotFoundError
from .memo import ByteLRU
from .paths import filesystem, to_url
from .shard import Shard

FORMAT = "zephon_dask.tokens"
VERSION = 1
TOKEN_CHUNK = 1 << 20
OFFSET_CHUNK = 1 << 16
GAP = 1 << 14  # token gap under which two needed documents are fetched in one slice
_SHARD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))
OPENED = ByteLRU(1 << 30)


def _root(path: str, storage_options: dict[str, Any] | None) -> str:
    fs, name = filesystem(path, storage_options)
    return to_url(fs, name.rstrip("/"))


def write_token_store(
    path: str,
    shards: Mapping[str, Sequence[np.ndarray]],
    tokenizer_meta: dict[str, Any] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Write ``{shard_id: [token array per document]}`` as a token store, replacing ``path``.

    Token ids must be non-negative integers below 2**32; the dtype is uint16 when
    every id is below 65536, else uint32 (one dtype for the whole store).
    """
    ids = sorted(str(k) for k in shards)
    bad = [s for s in ids if not _SHARD_ID.fullmatch(s)]
    if bad:
        raise ConfigError(f"token store shard ids {bad} are invalid; use [A-Za-z0-9._-] only")
    try:
        meta_json = json.dumps(tokenizer_meta or {}, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"tokenizer_meta must be JSON-serialisable ({exc})") from None
    docs = {str(k): [np.asarray(d) for d in v] for k, v in shards.items()}
    top = -1
    for sid in ids:
        for i, d in enumerate(docs[sid]):
            if d.ndim != 1 or (d.size and d.dtype.kind not in "iu"):
                raise ConfigError(
                    f"shard {sid!r} document {i}: expected a 1-D integer array, "
                    f"got shape {d.shape} dtype {d.dtype}"
                )
            if d.size and (int(d.min()) < 0 or int(d.max()) >= 2**32):
                raise ConfigError(f"shard {sid!r} document {i}: token ids must be in [0, 2**32)")
            top = max(top, int(d.max()) if d.size else -1)
    dtype = np.uint16 if top < 2**16 else np.uint32
    root = zarr.open_group(path, mode="w", storage_options=storage_options or None)
    for sid in ids:
        lengths = np.array([d.size for d in docs[sid]], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        flat = np.concatenate([np.empty(0, dtype), *docs[sid]]).astype(dtype)
        root.create_array(
            f"shards/{sid}/tokens", data=flat, chunks=(max(1, min(flat.size, TOKEN_CHUNK)),)
        )
        root.create_array(
            f"shards/{sid}/offsets", data=offsets, chunks=(min(offsets.size, OFFSET_CHUNK),)
        )
    root.attrs.update(
        {"format": FORMAT, "version": VERSION, "tokenizer": json.loads(meta_json), "shards": ids}
    )


def open_store(
    path: str, storage_options: dict[str, Any] | None
) -> tuple[tuple[Shard, ...], dict[str, Any]]:
    """``(shards, tokenizer meta)`` from a store's metadata (no token data is read)."""
    try:
        root = zarr.open_group(path, mode="r", storage_options=storage_options or None)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"token store {path!r} does not exist") from None
    attrs = dict(root.attrs)
    if attrs.get("format") != FORMAT or attrs.get("version") != VERSION:
        raise DataFormatError(
            f"{path!r} is a zarr group but not a zephon_dask token store version {VERSION} "
            f"(attributes format={attrs.get('format')!r}, version={attrs.get('version')!r}); "
            "write it with zephon_dask.data.write_token_store"
        )
    ids = attrs.get("shards")
    if not isinstance(ids, list) or not all(isinstance(s, str) for s in ids):
        raise DataFormatError(f"token store {path!r}: attribute 'shards' must be a list of ids")
    base = _root(path, storage_options)
    out = []
    for sid in sorted(ids):
        try:
            tok, off = root[f"shards/{sid}/tokens"], root[f"shards/{sid}/offsets"]
        except KeyError:
            raise DataFormatError(
                f"token store {path!r}: shard {sid!r} lacks its tokens or offsets array"
            ) from None
        if (
            tok.ndim != 1
            or tok.dtype not in _TOKEN_DTYPES
            or off.ndim != 1
            or off.dtype != np.int64
            or off.shape[0] < 1
        ):
            raise DataFormatError(
                f"token store {path!r}: shard {sid!r} has tokens {tok.dtype}{tok.shape} and "
                f"offsets {off.dtype}{off.shape}; expected 1-D uint16/uint32 and 1-D int64 (n+1)"
            )
        nbytes = int(tok.shape[0]) * tok.dtype.itemsize
        out.append(Shard(sid, f"{base}/shards/{sid}", int(off.shape[0]) - 1, nbytes, None))
    return tuple(out), attrs.get("tokenizer") or {}


def _open(shard: Shard, storage_options: dict[str, Any] | None) -> tuple[Any, np.ndarray]:
    """The shard's token array and its checked offsets (cached per process)."""
    cached = OPENED.get(shard)
    if cached is not None:
        return cached
    opts = storage_options or None
    try:
        tok = zarr.open_array(f"{shard.path}/tokens", mode="r", storage_options=opts)
        off = zarr.open_array(f"{shard.path}/offsets", mode="r", storage_options=opts)[:]
    except FileNotFoundError:
        raise DatasetNotFoundError(f"token shard {shard.path!r} no longer exists") from None
    if (
        off.shape[0] != shard.num_samples + 1
        or off[0] != 0
        or off[-1] != tok.shape[0]
        or np.any(np.diff(off) < 0)
    ):
        raise DataFormatError(
            f"token shard {shard.path!r}: offsets must have {shard.num_samples + 1} entries, "
            f"start at 0, never decrease and end at len(tokens)={tok.shape[0]}; the store is "
            "corrupt or changed since the Dataset was built"
        )
    OPENED.put(shard, (tok, off), off.nbytes)
    return tok, off


def read(
    shard: Shard, offsets: np.ndarray, *, storage_options: dict[str, Any] | None
) -> list[dict[str, np.ndarray]]:
    """``{"tokens": array}`` for the documents at ``offsets`` (validated), in order; fresh arrays."""
    tok, off = _open(shard, storage_options)
    uniq, inverse = np.unique(offsets, return_inverse=True)
    start, end = off[uniq], off[uniq + 1]
    cut = np.flatnonzero(start[1:] - end[:-1] > GAP) + 1
    first = np.concatenate(([0], cut))
    last = np.concatenate((cut, [uniq.size])) - 1
    docs: list[np.ndarray] = []
    for a, b in zip(first.tolist(), last.tolist(), strict=True):
        lo = int(start[a])
        run = tok[lo : int(end[b])]
        docs.extend(
            run[s - lo : e - lo]
            for s, e in zip(start[a : b + 1].tolist(), end[a : b + 1].tolist(), strict=True)
        )
    return [{"tokens": docs[j].copy()} for j in inverse.ravel().tolist()]
