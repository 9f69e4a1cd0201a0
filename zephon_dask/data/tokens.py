"""Pre-tokenized token stores (zarr v3).

Layout (a zarr v3 group at ``path``)::

    zarr.json                       root group; attributes:
        {"format": "zephon_dask.tokens", "version": 1,
         "tokenizer": {...},        # whatever the writer stored (e.g. "sha256")
         "shards": ["a", "b", ...], # shard ids, sorted
         "max_id": 50255,           # optional: the largest token id in the store
         "vocab_size": 50257}       # optional: the tokenizer's vocabulary size
    shards/<shard_id>/tokens        1-D uint16 (all ids < 65536) or uint32
    shards/<shard_id>/offsets       1-D int64, num_docs + 1 entries, offsets[0] == 0,
                                    non-decreasing, offsets[-1] == len(tokens)

Document ``i`` of a shard is ``tokens[offsets[i]:offsets[i+1]]``. Shard ids
match ``[A-Za-z0-9][A-Za-z0-9._-]*``.

A store written by :func:`zephon_dask.prepare_tokens` also carries
``"complete"`` (``false`` until every shard is written and verified), ``"dtype"``
and ``"source"`` (the source dataset's identity) at the root, and a completion
record (attribute ``"record"``: counts, sha256 of tokens and offsets, source
shard) on each ``shards/<shard_id>`` group, written last by
:class:`ShardWriter` and checked by :func:`verify_shard`. :func:`open_store`
refuses a store whose ``"complete"`` is not true (a store without the key,
such as one from :func:`write_token_store`, which writes the root attributes
last, is complete).

Construction reads metadata only; a
shard's offsets array is loaded (and checked: every chunk file present, offsets
consistent, sizes and offsets digest as recorded) on its first read in a process
and kept in a byte-bounded LRU (:data:`OPENED`, keyed by the :class:`Shard`).
Writers write every chunk, even an all-zero one, so a missing chunk file is
always an error (zarr alone would read it as zeros). :func:`verify_store`
also hashes every token. A corrupt input raises :class:`DataFormatError`
naming the file and the fix.
Token ids are checked against the vocabulary: at construction, the store's
recorded ``vocab_size`` against the caller's tokenizer (:class:`TokenizerMismatchError`
when they differ) and the recorded ``max_id`` against the vocabulary; on every
read, the ids read (one ``max`` over them) against it, a :class:`DataFormatError`
naming the chunk file and the fix. Without a known vocabulary (no ``tokenizer=``
and none recorded) only the dtype bounds ids.
A read fetches the tokens of all requested documents with one orthogonal
selection, so zarr decodes each chunk that holds any of them once. Documents
come back in the stored dtype.
:func:`write_token_store` is the writer.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import (
    ConfigError,
    DataFormatError,
    DatasetNotFoundError,
    IncompleteStoreError,
    NotFoundError,
    TokenizerMismatchError,
)
from ..validate import check_int
from .memo import byte_lru
from .paths import filesystem, fs_options, to_url
from .reader import Reader
from .shard import Shard

if TYPE_CHECKING:
    import zarr
    from zarr.core.array_spec import ArrayConfigParams

def _zarr():
    """The ``zarr`` module, imported on first use: a process that reads no token store (a Dask
    worker of a pipeline over JSONL, the scheduler unpickling its graph) never pays its import."""
    import zarr

    return zarr


FORMAT = "zephon_dask.tokens"
VERSION = 1
TOKEN_CHUNK = 1 << 20
OFFSET_CHUNK = 1 << 16
_SHARD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))
OPENED = byte_lru(1 << 30, lambda opened: opened[1].nbytes)  # (tokens, offsets): the offsets weigh
# Every chunk is written, even one equal to the fill value, so a reader can tell a deleted
# chunk file (an error) from a chunk zarr skipped (which it would read back as zeros).
EVERY_CHUNK: ArrayConfigParams = {"write_empty_chunks": True}
RECORD = "record"  # a shard group's completion record (prepare_tokens)
REPAIR = ("rerun zephon_dask.prepare_tokens (or `zephon-dask prepare`) with the same dataset, tokenizer "
          "and output path: it rewrites the shards that fail verification")


def zarr_options(path: str, storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``storage_options`` zarr gets for ``path``: ours completed with the filesystem defaults
    (retries, timeouts), ``None`` when there are none (a local path)."""
    return fs_options(path, storage_options) or None


def _root(path: str, storage_options: dict[str, Any] | None) -> str:
    fs, name = filesystem(path, storage_options)
    return to_url(fs, name.rstrip("/"))


def write_token_store(
    path: str,
    shards: Mapping[str, Sequence[np.ndarray]],
    tokenizer_meta: dict[str, Any] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    vocab_size: int | None = None,
) -> None:
    """Write ``{shard_id: [token array per document]}`` as a token store, replacing ``path``.

    Token ids must be non-negative integers below 2**32 (and below ``vocab_size``,
    recorded when given); the dtype is uint16 when every id is below 65536, else
    uint32 (one dtype for the whole store). The largest id is recorded as ``max_id``.
    """
    if vocab_size is not None:
        vocab_size = check_int(vocab_size, "vocab_size", 1, optional=True, call="write_token_store",
                               hint="the tokenizer's vocabulary size")
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
    if vocab_size is not None and top >= vocab_size:
        raise ConfigError(f"token id {top} is outside the vocabulary [0, {vocab_size})")
    dtype = np.uint16 if top < 2**16 else np.uint32
    root = _zarr().open_group(path, mode="w", storage_options=zarr_options(path, storage_options))
    for sid in ids:
        lengths = np.array([d.size for d in docs[sid]], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        flat = np.concatenate([np.empty(0, dtype), *docs[sid]]).astype(dtype)
        root.create_array(
            f"shards/{sid}/tokens", data=flat, chunks=(max(1, min(flat.size, TOKEN_CHUNK)),),
            config=EVERY_CHUNK,
        )
        root.create_array(
            f"shards/{sid}/offsets", data=offsets, chunks=(min(offsets.size, OFFSET_CHUNK),),
            config=EVERY_CHUNK,
        )
    attrs = {"format": FORMAT, "version": VERSION, "tokenizer": json.loads(meta_json), "shards": ids,
             "max_id": top}
    if vocab_size is not None:
        attrs["vocab_size"] = vocab_size
    root.attrs.update(attrs)


class Store(NamedTuple):
    """A token store's metadata: its shards, tokenizer meta and recorded id bounds (``None``: not recorded)."""

    shards: tuple[Shard, ...]
    tokenizer: dict[str, Any]
    vocab_size: int | None
    max_id: int | None


def _recorded(attrs: dict[str, Any], key: str, minimum: int) -> int | None:
    value = attrs.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= minimum else None


def open_store(path: str, storage_options: dict[str, Any] | None) -> Store:
    """The store's :class:`Store` metadata (no token data is read)."""
    try:
        root = _zarr().open_group(path, mode="r", storage_options=zarr_options(path, storage_options))
        attrs: dict[str, Any] = dict(root.attrs)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"token store {path!r} does not exist") from None
    except (ValueError, KeyError, TypeError) as exc:  # zarr.json that is not JSON, or not zarr's
        raise DataFormatError(f"token store {path!r}: its zarr.json cannot be read ({type(exc).__name__}: "
                              f"{exc}); {REPAIR}") from None
    if attrs.get("format") != FORMAT or attrs.get("version") != VERSION:
        raise DataFormatError(
            f"{path!r} is a zarr group but not a zephon_dask token store version {VERSION} "
            f"(attributes format={attrs.get('format')!r}, version={attrs.get('version')!r}); "
            "write it with zephon_dask.data.write_token_store"
        )
    if attrs.get("complete", True) is not True:
        raise IncompleteStoreError(
            f"token store {path!r} is incomplete: its prepare_tokens job was interrupted or is "
            "still running. Rerun zephon_dask.prepare_tokens (or `zephon-dask prepare`) with the "
            "same dataset, tokenizer and output path to finish it"
        )
    ids = attrs.get("shards")
    if not isinstance(ids, list) or not all(isinstance(s, str) for s in ids):
        raise DataFormatError(f"token store {path!r}: attribute 'shards' must be a list of ids")
    base = _root(path, storage_options)
    out = []
    for sid in sorted(ids):
        try:
            tok, off = array_at(root, f"shards/{sid}/tokens"), array_at(root, f"shards/{sid}/offsets")
        except (KeyError, ValueError, TypeError):
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
    return Store(tuple(out), attrs.get("tokenizer") or {}, _recorded(attrs, "vocab_size", 1),
                 _recorded(attrs, "max_id", -1))


def check_vocab(path: str, store: Store, expected: int | None) -> int | None:
    """The vocabulary size token ids of ``store`` are checked against on read: ``expected`` (the
    caller's tokenizer's), else the recorded one, else ``None`` (unknown). Pure.

    Raises :class:`TokenizerMismatchError` when ``expected`` and the recorded size differ or
    the recorded largest id is outside ``expected``; :class:`DataFormatError` when the store's
    own records disagree (a largest id outside its recorded vocabulary).
    """
    if expected is not None and store.vocab_size is not None and expected != store.vocab_size:
        raise TokenizerMismatchError(
            f"token store {path!r} records a vocabulary of {store.vocab_size} ids, the tokenizer "
            f"given has {expected}; prepare the store again with this tokenizer "
            "(zephon_dask.prepare_tokens) or pass the tokenizer it was prepared with"
        )
    vocab = expected if expected is not None else store.vocab_size
    if vocab is not None and store.max_id is not None and store.max_id >= vocab:
        if expected is not None:
            raise TokenizerMismatchError(
                f"token store {path!r} holds token ids up to {store.max_id}, outside the given "
                f"tokenizer's vocabulary [0, {vocab}); it was written with another tokenizer: "
                "prepare it again with this one (zephon_dask.prepare_tokens) or pass the right tokenizer"
            )
        raise DataFormatError(
            f"token store {path!r} records token ids up to {store.max_id}, outside its recorded "
            f"vocabulary [0, {vocab}); the store is corrupt: {REPAIR}"
        )
    return vocab


def array_at(group: zarr.Group, path: str) -> zarr.Array:
    """The array at ``path`` in ``group``.

    Raises:
        KeyError: nothing is there; :class:`NotFoundError` (a ``KeyError``) for a group.
    """
    node = group[path]
    if not isinstance(node, _zarr().Array):
        raise NotFoundError(f"{path!r} is a group, not an array")
    return node


def _corrupt(shard: Shard, problem: str) -> DataFormatError:
    return DataFormatError(f"token shard {shard.path!r}: {problem}; the store is corrupt or changed "
                           f"since the Dataset was built: {REPAIR}")


def _missing_chunks(array: Any, url: str, storage_options: dict[str, Any] | None) -> list[str]:
    """Chunk files of a 1-D zarr array at ``url`` that are absent (one listing; ``[]`` when all are there)."""
    want = int(array.nchunks) if array.shape[0] else 0
    if not want:
        return []
    fs, name = filesystem(f"{url}/c", storage_options)
    try:
        present = {posixpath.basename(f) for f in fs.find(name)}
    except (FileNotFoundError, NotADirectoryError):
        present = set()
    return [f"{url}/c/{i}" for i in range(want) if str(i) not in present]


def _open(shard: Shard, storage_options: dict[str, Any] | None) -> tuple[Any, np.ndarray]:
    """The shard's token array and its checked offsets (cached per process).

    Checks, once per shard and process: every chunk file of both arrays is present (zarr
    would read a missing one as zeros), the offsets are consistent, and, for a store from
    ``prepare_tokens``, the shapes and the offsets' sha256 match the shard's completion
    record. Tokens are hashed only by :func:`verify_store` (it reads every chunk).
    """
    cached = OPENED.get(shard)
    if cached is not None:
        return cached
    opts = zarr_options(str(shard.path), storage_options)
    try:
        group = _zarr().open_group(shard.path, mode="r", storage_options=opts)
        tok = _zarr().open_array(f"{shard.path}/tokens", mode="r", storage_options=opts)
        off_arr = _zarr().open_array(f"{shard.path}/offsets", mode="r", storage_options=opts)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"token shard {shard.path!r} no longer exists; {REPAIR}") from None
    except (ValueError, KeyError, TypeError) as exc:  # unreadable zarr.json
        raise _corrupt(shard, f"its metadata cannot be read ({type(exc).__name__}: {exc})") from None
    missing = [*_missing_chunks(off_arr, f"{shard.path}/offsets", storage_options),
               *_missing_chunks(tok, f"{shard.path}/tokens", storage_options)]
    if missing:
        raise _corrupt(shard, f"{len(missing)} chunk file(s) are missing, e.g. {missing[0]!r}")
    off = _decode(shard, lambda: off_arr[:])
    if (
        off.shape[0] != shard.num_samples + 1
        or off[0] != 0
        or off[-1] != tok.shape[0]
        or np.any(np.diff(off) < 0)
    ):
        raise _corrupt(shard, f"offsets must have {shard.num_samples + 1} entries, start at 0, never "
                              f"decrease and end at len(tokens)={tok.shape[0]}")
    record = group.attrs.get(RECORD)
    if isinstance(record, dict) and (
        record.get("num_tokens") != tok.shape[0]
        or record.get("num_docs") != off.shape[0] - 1
        or record.get("offsets_sha256") != hashlib.sha256(np.ascontiguousarray(off, "<i8").tobytes()).hexdigest()
    ):
        raise _corrupt(shard, "its tokens or offsets do not match the shard's completion record "
                              "(sizes or offsets sha256)")
    OPENED[shard] = (tok, off)
    return tok, off


def _decode(shard: Shard, read_fn):
    """``read_fn()``, with a chunk that cannot be decoded raised as :class:`DataFormatError`."""
    try:
        return read_fn()
    except FileNotFoundError:
        raise DatasetNotFoundError(f"token shard {shard.path!r} no longer exists; {REPAIR}") from None
    except Exception as exc:  # a codec's error on corrupt bytes (RuntimeError, ValueError, ...)
        raise _corrupt(shard, f"a chunk cannot be decoded ({type(exc).__name__}: {exc})") from None


def read(
    shard: Shard, offsets: np.ndarray, *, storage_options: dict[str, Any] | None,
    vocab_size: int | None = None,
) -> list[dict[str, np.ndarray]]:
    """``{"tokens": array}`` for the documents at ``offsets`` (validated), in order; fresh arrays.

    With ``vocab_size``, every id read must be below it (else :class:`DataFormatError`)."""
    tok, off = _open(shard, storage_options)
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.size and (int(offsets.min()) < 0 or int(offsets.max()) >= shard.num_samples):
        bad = int(offsets[(offsets < 0) | (offsets >= shard.num_samples)][0])
        raise _corrupt(shard, f"document {bad} was asked for, but the shard has {shard.num_samples} "
                              "(a stale index?)")
    uniq, inverse = np.unique(offsets, return_inverse=True)
    start = off[uniq]
    lengths = off[uniq + 1] - start
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    index = np.repeat(start - bounds[:-1], lengths) + np.arange(bounds[-1])
    flat = _decode(shard, lambda: tok.oindex[index]) if index.size else np.empty(0, tok.dtype)
    if vocab_size is not None and flat.size and int(flat.max()) >= vocab_size:
        at = int(np.argmax(flat >= vocab_size))
        doc = int(uniq[np.searchsorted(bounds, at, side="right") - 1])
        chunk = int(index[at]) // int(tok.chunks[0])
        raise DataFormatError(
            f"token shard {shard.path!r}: document {doc} holds token id {int(flat[at])}, outside the "
            f"vocabulary [0, {vocab_size}) (chunk file {shard.path}/tokens/c/{chunk!r}); the store was "
            f"written with another tokenizer or is corrupt: {REPAIR}"
        )
    return [
        {"tokens": flat[bounds[j] : bounds[j + 1]].copy()} for j in inverse.ravel().tolist()
    ]


def verify_store(path: str, storage_options: dict[str, Any] | None = None) -> int:
    """Check every shard of a token store against its completion record, hashing every token;
    returns the number of shards checked, or raises :class:`DataFormatError` naming the first
    bad shard and the fix. Reads the whole store (see docs/reliability.md for its cost)."""
    shards = open_store(path, storage_options).shards
    for shard in shards:
        tok, _ = _open(shard, storage_options)
        record = _zarr().open_group(shard.path, mode="r", storage_options=zarr_options(str(shard.path), storage_options)).attrs.get(RECORD)
        if not isinstance(record, dict):
            continue  # written by write_token_store: no digest to check
        sha = hashlib.sha256()
        for lo in range(0, tok.shape[0], TOKEN_CHUNK):
            part = _decode(shard, lambda lo=lo, tok=tok: tok[lo : lo + TOKEN_CHUNK])
            sha.update(np.ascontiguousarray(part, tok.dtype.newbyteorder("<")).tobytes())
        if sha.hexdigest() != record.get("tokens_sha256"):
            raise _corrupt(shard, "its tokens do not hash to the completion record's tokens_sha256")
    return len(shards)


def tokenizer_identity(expected: Any) -> dict[str, Any]:
    """The identity a store records for ``expected``: a Tokenize operator (its tokenizer's) or a
    tokenizer object with ``identity()`` (``ByteTokenizer``, ``HFTokenizer``). Pure.

    A bare tokenizer spec (``"bytes"``, a path, a ``tokenizers.Tokenizer``, a callable)
    raises :class:`ConfigError`: resolving one is the operators' job, not this module's.
    """
    for candidate in (expected, getattr(expected, "tokenizer", None)):
        identity = getattr(candidate, "identity", None)
        if callable(identity):
            return identity()
    raise ConfigError(
        f"tokenizer={expected!r} cannot be compared with a token store's tokenizer; pass the "
        "Tokenize operator the store was prepared with, e.g. "
        "tokenizer=zephon_dask.Tokenize('tokenizer.json')"
    )


def check_tokenizer(path: str, meta: dict[str, Any], expected: dict[str, Any]) -> None:
    """Raise TokenizerMismatchError unless the store's tokenizer identity is ``expected``. Pure.

    ``meta`` is the store's ``tokenizer`` attribute; a store from ``prepare_tokens``
    holds the tokenize settings there, with the tokenizer's identity under ``"tokenizer"``.
    """
    got = meta.get("tokenizer")
    if got != expected:
        raise TokenizerMismatchError(
            f"token store {path!r} was written with tokenizer {got!r}, not the expected "
            f"{expected!r}; prepare the store again with the expected tokenizer "
            "(zephon_dask.prepare_tokens) or expect the tokenizer it was written with"
        )


class ShardWriter:
    """Streams one shard's documents into ``<url>/tokens`` and ``<url>/offsets``.

    Holds state: the open group (emptied on construction, so an earlier partial
    attempt is dropped), a buffer shorter than one chunk, the document lengths
    and the running sha256. Tokens are written whole chunks at a time;
    :meth:`close` writes the tail, the offsets and then the completion record,
    last. Every id must fit ``dtype``.
    """

    def __init__(self, url: str, dtype: Any, storage_options: dict[str, Any] | None):
        self._dtype = np.dtype(dtype).newbyteorder("<")
        self._top = int(np.iinfo(self._dtype).max)
        self._group = _zarr().open_group(url, mode="w", storage_options=zarr_options(url, storage_options))
        self._tokens = self._group.create_array(
            "tokens", shape=(0,), dtype=self._dtype, chunks=(TOKEN_CHUNK,), config=EVERY_CHUNK
        )
        self._lengths: list[np.ndarray] = []
        self._pending: list[np.ndarray] = [np.empty(0, self._dtype)]
        self._pending_n = self._written = 0
        self._max = -1
        self._sha = hashlib.sha256()

    def add(self, docs: Sequence[np.ndarray]) -> None:
        """Append documents (1-D integer arrays), in order."""
        lengths = np.fromiter((d.size for d in docs), np.int64, len(docs))
        flat = np.concatenate([np.empty(0, np.int64), *docs])
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) > self._top):
            bad = int(flat[(flat < 0) | (flat > self._top)][0])
            raise ConfigError(
                f"the tokenizer produced id {bad}, outside the store's {self._dtype.name} range "
                f"[0, {self._top}]; a tokenizer must produce ids in [0, vocab_size)"
            )
        if flat.size:
            self._max = max(self._max, int(flat.max()))
        self._lengths.append(lengths)
        self._pending.append(flat.astype(self._dtype))
        self._pending_n += flat.size
        if self._pending_n >= TOKEN_CHUNK:
            self._flush(whole_chunks=True)

    def _flush(self, whole_chunks: bool) -> None:
        buf = np.concatenate(self._pending)
        n = buf.size - buf.size % TOKEN_CHUNK if whole_chunks else buf.size
        if n:
            self._tokens.resize((self._written + n,))
            self._tokens[self._written : self._written + n] = buf[:n]
            self._sha.update(buf[:n].tobytes())
            self._written += n
        self._pending, self._pending_n = [buf[n:]], buf.size - n

    def close(self, source: dict[str, Any], truncated_tokens: int = 0) -> dict[str, Any]:
        """Write the tail, the offsets and the completion record; return the record."""
        self._flush(whole_chunks=False)
        lengths = np.concatenate([np.empty(0, np.int64), *self._lengths])
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype("<i8")
        self._group.create_array(
            "offsets", data=offsets, chunks=(min(offsets.size, OFFSET_CHUNK),), config=EVERY_CHUNK
        )
        record: dict[str, Any] = {
            "num_docs": int(lengths.size),
            "num_tokens": self._written,
            "tokens_sha256": self._sha.hexdigest(),
            "offsets_sha256": hashlib.sha256(offsets.tobytes()).hexdigest(),
            "truncated_tokens": int(truncated_tokens),
            "max_id": self._max,
            "source": source,
        }
        self._group.attrs.update({RECORD: record})
        return record


def verify_shard(
    url: str, source: dict[str, Any], dtype: Any, storage_options: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The shard's completion record if it names ``source`` and the data hash to it, else ``None``.

    Reads only. Anything unreadable (a missing group, array or chunk, a corrupt
    chunk) counts as unverified: the caller writes the shard again.
    """
    want = np.dtype(dtype).newbyteorder("<")
    try:
        group = _zarr().open_group(url, mode="r", storage_options=zarr_options(url, storage_options))
        record = group.attrs.get(RECORD)
        if not isinstance(record, dict) or record.get("source") != source:
            return None
        tok, off = array_at(group, "tokens"), array_at(group, "offsets")
        if (
            tok.dtype != want
            or tok.shape != (record["num_tokens"],)
            or off.shape != (record["num_docs"] + 1,)
        ):
            return None
        sha = hashlib.sha256()
        for lo in range(0, tok.shape[0], TOKEN_CHUNK):
            sha.update(np.ascontiguousarray(tok[lo : lo + TOKEN_CHUNK], want).tobytes())
        offsets = np.ascontiguousarray(off[:], "<i8")
    except Exception:  # unreadable in any way means "write it again"
        return None
    ok = (
        sha.hexdigest() == record["tokens_sha256"]
        and hashlib.sha256(offsets.tobytes()).hexdigest() == record["offsets_sha256"]
        and offsets[0] == 0
        and offsets[-1] == tok.shape[0]
        and not np.any(np.diff(offsets) < 0)
    )
    return record if ok else None


def is_store(fs: Any, directory: str) -> bool:
    """Whether ``directory`` holds a zarr group (``zarr.json``): a token store or a foreign one."""
    return bool(fs.isfile(f"{directory.rstrip('/')}/zarr.json"))


READER = Reader(
    "tokens",
    "from_tokens",
    lambda dataset, index, offsets: read(
        dataset.shards[index], offsets, storage_options=dataset.storage_options,
        vocab_size=dataset.vocab_size,
    ),
    detect=is_store,
    identity=lambda dataset: {"tokenizer": dataset.tokenizer_meta},
    html=lambda dataset: [("tokenizer", json.dumps(dataset.tokenizer_meta, sort_keys=True))],
    holds_tokens=True,
    doc="zephon_dask token stores (zarr)",
)
