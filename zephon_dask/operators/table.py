"""``SampleTable``: a window's samples as flat arrays. Immutable values, pure helpers.

A table holds ``n`` variable-length samples in CSR form: ``tokens``,
``positions`` and ``document_ids`` are flat arrays cut by ``offsets``
(length ``n + 1``). Before packing a sample is one document; after packing it
is a row of ``max_length`` slots. ``document_ids`` numbers the documents of a
sample from 0 and is ``-1`` on padding; ``positions`` restart at 0 at each
document.

Lineage is a second CSR level: sample ``i`` came from the rows
``lineage[lineage_offsets[i]:lineage_offsets[i+1]]``, each
``(dataset, shard, offset, token_start, token_count)``: which pointer
contributed, and which of its tokens.

``loss_mask`` is optional: ``None`` (every token trained, the default), or a
flat ``uint8`` array aligned with ``tokens``, 1 where a token is a training
target (``tokenize_chat``: the assistant's tokens) and 0 elsewhere (padding
included). Every helper carries it along with the tokens; a table without it
hashes exactly as before it existed.

``fields`` is optional too: ``None`` (the default), or a mapping of a kept record field's name
(``tokenize(keep=[...])``) to one value per *lineage row*, so each document segment carries its
document's value: gathering lineage gathers them, and no per-token copy exists before a batch is
cut (:func:`token_lineage` maps each token to its lineage row there). A table without fields hashes
as before they existed; narrowing leaves them as they are, so their dtypes never vary.

:meth:`SampleTable.narrowed` gives the same values with ``tokens``, ``positions`` and
``document_ids`` each in the smallest integer type that holds them (``uint16`` tokens
whenever the vocabulary has fewer than 65,536 ids): how a finished window is held and
sent between processes until its batches are built (in int64, whatever the table's dtypes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import FieldTypeError

TOKEN_DTYPE = np.int32
MASK_DTYPE = np.uint8
KEPT_DTYPES = ("int64", "float32", "float64", "bool")  # the dtypes of kept fields (tokenize(keep=))
KEPT_FILL = {"i": -1, "f": float("nan"), "b": False}  # a kept field's value on padding, by dtype kind
LINEAGE_FIELDS = ("dataset", "shard", "offset", "token_start", "token_count")
NARROW_FIELDS = ("tokens", "positions", "document_ids")  # the per-token arrays a held window narrows
NARROW_DTYPES = tuple((np.dtype(t), int(np.iinfo(t).min), int(np.iinfo(t).max))
                      for t in (np.uint8, np.int8, np.uint16, np.int16))  # (dtype, min, max), smallest first


def narrowest(a: np.ndarray) -> np.ndarray:
    """``a`` in the first of :data:`NARROW_DTYPES` that holds all its values and is smaller than
    its own dtype (a copy), else ``a`` itself."""
    if a.dtype.kind not in "iu" or not a.size:
        return a
    lo, hi = int(a.min()), int(a.max())
    for dtype, least, most in NARROW_DTYPES:
        if dtype.itemsize >= a.dtype.itemsize:
            break
        if least <= lo and hi <= most:
            return a.astype(dtype)
    return a


def csr_gather(offsets: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat source positions and new offsets for taking rows ``index`` of a CSR array."""
    index = np.asarray(index, dtype=np.int64)
    starts = offsets[index]
    lengths = offsets[index + 1] - starts
    new_offsets = np.zeros(len(index) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    flat = np.arange(new_offsets[-1], dtype=np.int64) + np.repeat(starts - new_offsets[:-1], lengths)
    return flat, new_offsets


def segment_arange(lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(n) for n in lengths)`` without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)


@dataclass(frozen=True, eq=False)
class SampleTable:
    """Samples with tokens, positions, document ids and lineage (treat as immutable)."""

    tokens: np.ndarray
    offsets: np.ndarray
    positions: np.ndarray
    document_ids: np.ndarray
    lineage: np.ndarray
    lineage_offsets: np.ndarray
    loss_mask: np.ndarray | None = None
    fields: Mapping[str, np.ndarray] | None = None  # name -> one value per lineage row

    def __sizeof__(self) -> int:
        """Bytes held, arrays included (what Dask's memory accounting sees via ``sys.getsizeof``)."""
        arrays = (self.tokens, self.offsets, self.positions, self.document_ids, self.lineage, self.lineage_offsets,
                  self.loss_mask)
        kept = sum(a.nbytes for a in self.fields.values()) if self.fields else 0
        return object.__sizeof__(self) + sum(a.nbytes for a in arrays if a is not None) + kept

    @classmethod
    def empty(cls) -> SampleTable:
        z = np.zeros(0, dtype=TOKEN_DTYPE)
        return cls(z, np.zeros(1, np.int64), z, z, np.zeros((0, 5), np.int64), np.zeros(1, np.int64))

    @classmethod
    def from_documents(cls, tokens: np.ndarray, offsets: np.ndarray, lineage: np.ndarray,
                       loss_mask: np.ndarray | None = None,
                       fields: Mapping[str, np.ndarray] | None = None) -> SampleTable:
        """One sample per document; ``lineage`` has one row per document; ``loss_mask`` (optional)
        one 0/1 per token; ``fields`` (optional) one value per document each."""
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        n = len(lengths)
        return cls(
            tokens=np.asarray(tokens, dtype=TOKEN_DTYPE),
            offsets=offsets,
            positions=segment_arange(lengths).astype(TOKEN_DTYPE),
            document_ids=np.zeros(int(offsets[-1]), dtype=TOKEN_DTYPE),
            lineage=np.asarray(lineage, dtype=np.int64).reshape(n, 5),
            lineage_offsets=np.arange(n + 1, dtype=np.int64),
            loss_mask=None if loss_mask is None else np.asarray(loss_mask, dtype=MASK_DTYPE),
            fields=None if fields is None else dict(fields),
        )

    def fields_at(self, index: np.ndarray | slice) -> dict[str, np.ndarray] | None:
        """The kept fields of lineage rows ``index`` (``None`` without fields)."""
        return None if self.fields is None else {k: v[index] for k, v in self.fields.items()}

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int(np.count_nonzero(self.document_ids >= 0))

    def padding(self) -> np.ndarray:
        """Padding slots per sample."""
        pad = (self.document_ids < 0).astype(np.int64)
        sums = np.concatenate(([0], np.cumsum(pad)))
        return sums[self.offsets[1:]] - sums[self.offsets[:-1]]

    def take(self, index) -> SampleTable:
        """Samples ``index`` in that order (vectorised gather)."""
        index = np.asarray(index, dtype=np.int64)
        lflat, loffsets = csr_gather(self.lineage_offsets, index)
        width = self.row_width()
        if width:  # rows of one length (packed): whole rows are gathered, no flat index is built
            def rows(a: np.ndarray) -> np.ndarray:
                return a.reshape(-1, width)[index].reshape(-1)

            return SampleTable(
                rows(self.tokens), np.arange(len(index) + 1, dtype=np.int64) * width, rows(self.positions),
                rows(self.document_ids), self.lineage[lflat], loffsets,
                None if self.loss_mask is None else rows(self.loss_mask), self.fields_at(lflat),
            )
        flat, offsets = csr_gather(self.offsets, index)
        return SampleTable(
            self.tokens[flat], offsets, self.positions[flat], self.document_ids[flat],
            self.lineage[lflat], loffsets, None if self.loss_mask is None else self.loss_mask[flat],
            self.fields_at(lflat),
        )

    def row_width(self) -> int:
        """The samples' common length when every sample has the same positive one and the arrays
        hold exactly them (packed rows), else 0."""
        o = self.offsets
        if len(o) < 2 or o[0] != 0 or o[-1] != len(self.tokens):
            return 0
        width = int(o[1])
        n = len(o) - 1
        return width if width > 0 and int(o[-1]) == width * n and np.array_equal(o, np.arange(n + 1) * width) else 0

    def slice(self, start: int, stop: int) -> SampleTable:
        """Samples ``start`` to ``stop``: views of this table's arrays (offsets rebased), no copy."""
        o, lo = self.offsets, self.lineage_offsets
        a, b, la, lb = int(o[start]), int(o[stop]), int(lo[start]), int(lo[stop])
        return SampleTable(
            self.tokens[a:b], o[start:stop + 1] - a, self.positions[a:b], self.document_ids[a:b],
            self.lineage[la:lb], lo[start:stop + 1] - la, None if self.loss_mask is None else self.loss_mask[a:b],
            self.fields_at(slice(la, lb)),
        )

    @staticmethod
    def concat(tables: list[SampleTable]) -> SampleTable:
        tables = [t for t in tables if len(t)]
        if not tables:
            return SampleTable.empty()
        if len(tables) == 1:
            return tables[0]

        def stack(field: str) -> np.ndarray:
            return np.concatenate([getattr(t, field) for t in tables])

        def offsets(field: str) -> np.ndarray:
            parts, base = [np.zeros(1, np.int64)], 0
            for t in tables:
                o = getattr(t, field)
                parts.append(o[1:] + base)
                base += int(o[-1])
            return np.concatenate(parts)

        masked = any(t.loss_mask is not None for t in tables)
        return SampleTable(
            stack("tokens"), offsets("offsets"), stack("positions"), stack("document_ids"),
            np.concatenate([t.lineage for t in tables]), offsets("lineage_offsets"),
            np.concatenate([t.mask_or_ones() for t in tables]) if masked else None,
            concat_fields([t.fields for t in tables]),
        )

    def narrowed(self) -> tuple[SampleTable, dict[str, np.dtype]]:
        """``(this table with each of NARROW_FIELDS in its smallest dtype (:func:`narrowest`), the
        dtype each narrowed field had)``: equal values, so :meth:`widened` gives this table back
        byte for byte."""
        arrays: dict[str, Any] = {name: narrowest(getattr(self, name)) for name in NARROW_FIELDS}
        wide = {name: getattr(self, name).dtype for name, a in arrays.items() if a is not getattr(self, name)}
        if not wide:
            return self, {}
        return replace(self, **arrays), wide

    def widened(self, dtypes: dict[str, np.dtype]) -> SampleTable:
        """This table with each field named in ``dtypes`` converted to that dtype."""
        if not dtypes:
            return self
        return replace(self, **{name: getattr(self, name).astype(dtype) for name, dtype in dtypes.items()})

    def mask_or_ones(self) -> np.ndarray:
        """``loss_mask``, or ones on real tokens (0 on padding) for a table without one."""
        if self.loss_mask is not None:
            return self.loss_mask
        return (self.document_ids >= 0).astype(MASK_DTYPE)

    def sample_lineage(self, i: int) -> np.ndarray:
        """Lineage rows of sample ``i``: ``(dataset, shard, offset, token_start, token_count)``."""
        return self.lineage[self.lineage_offsets[i] : self.lineage_offsets[i + 1]]

    def digest(self) -> str:
        """SHA-256 over every array (``loss_mask`` only when present, so tables without one hash as
        they always did): equal digests mean byte-identical tables."""
        h = hashlib.sha256()
        names = ("tokens", "offsets", "positions", "document_ids", "lineage", "lineage_offsets")
        arrays = [(name, getattr(self, name)) for name in names + (("loss_mask",) if self.loss_mask is not None else ())]
        kept = self.fields or {}
        arrays += [(f"fields.{k}", kept[k]) for k in sorted(kept)]
        for name, a in arrays:
            a = np.ascontiguousarray(a)
            h.update(name.encode())
            h.update(str(a.dtype).encode())
            h.update(a.tobytes())
        return h.hexdigest()


def concat_fields(parts: list[Mapping[str, np.ndarray] | None]) -> dict[str, np.ndarray] | None:
    """The kept fields of tables laid end to end: ``None`` when none has any; the same names and
    dtypes in every part, else a :class:`~zephon_dask.errors.FieldTypeError` naming the field."""
    if all(p is None for p in parts):
        return None
    first = next(p for p in parts if p is not None)
    for p in parts:
        if p is None or sorted(p) != sorted(first):
            raise FieldTypeError(f"kept fields differ between tables: {sorted(first)} and {sorted(p or ())}")
        for k, v in p.items():
            if v.dtype != first[k].dtype:
                raise FieldTypeError(f"kept field {k!r} is {first[k].dtype} in one chunk and {v.dtype} in another; "
                                     f"give its type, tokenize(keep={{{k!r}: 'float32'}})")
    return {k: np.concatenate([p[k] for p in parts if p is not None]) for k in first}


def token_lineage(lineage_offsets: np.ndarray, document_ids: np.ndarray, rows: np.ndarray,
                  width: int) -> np.ndarray:
    """For ``len(rows)`` rows of ``width`` slots laid flat (``document_ids``, -1 on padding), each
    slot's lineage row: the row's first lineage row plus the slot's document id (the k-th document
    segment of a row is its k-th lineage row, as every built-in operator lays them), -1 on padding.
    A :class:`ValueError` when a document id names a lineage row the row does not have."""
    docs = document_ids.reshape(len(rows), width)
    first = lineage_offsets[rows]
    if width and np.any(docs.max(axis=1) >= lineage_offsets[rows + 1] - first):
        raise ValueError("a sample's document ids outnumber its lineage rows; an accumulator must give "
                         "the k-th document of a sample its k-th lineage row")
    return np.where(docs >= 0, docs + first[:, None], -1).reshape(-1)
