"""Sequence packing: a window's documents into rows of exactly ``max_length`` slots. Pure.

``"wrap"`` concatenates the documents in order and cuts the stream into rows;
the final partial row is dropped and counted (``pack.dropped_tokens``).
``"first_fit"`` / ``"best_fit"`` place whole documents into at most
``num_bins`` open bins and pad the rest of each row with ``pad_id``; a document
longer than ``max_length`` is first cut into ``max_length`` pieces (counted in
``pack.split_documents``), so no token is ever dropped. A document goes to the
first open bin (in opening order) with room, or for ``best_fit`` the one with
the least room that fits (earliest-opened on ties); when none fits and
``num_bins`` are open, the fullest bin (earliest-opened on ties) is emitted
first. Open bins are emitted in opening order at the end of the window.
``"best_fit_wrap"`` fills rows of exactly ``max_length`` with no padding, one
row at a time: it places the longest remaining document (earliest on ties)
that fits the row's room; when none fits, it cuts the longest remaining one
(earliest on ties) so its head completes the row and its tail returns to the
pool as a document of its own. So every row has at most one cut, short
documents fill row ends, and long ones are cut rarely. When the remaining
documents hold fewer than ``max_length`` tokens they are dropped and counted
(``pack.dropped_tokens``); documents cut at least once are counted in
``pack.split_documents``.

Within a row, each document segment restarts its positions at 0 and gets the
next document id (from 0); padding has position 0 and document id -1. Each
segment contributes one lineage row ``(dataset, shard, offset, token_start,
token_count)`` whose ``token_start`` is shifted by the segment's offset inside
its document. Zero-length documents contribute nothing (no slot, no lineage).
A table's ``loss_mask`` (``tokenize_chat``) is gathered with its tokens, 0 on
padding, so every algorithm keeps each token's mask.

Options (each in the fingerprint only when set, so pipelines without them fingerprint as before):
``min_sequence_length`` (any algorithm) drops documents shorter than it before packing
(``pack.short_documents``); ``drop_oversized`` (``first_fit``/``best_fit``) drops documents longer
than ``max_length`` instead of cutting them (``pack.oversized_documents``);
``max_sequences_per_bin`` (``first_fit``/``best_fit``) caps the document pieces of a row: a bin
holding that many counts as full (no room; closed first); ``groups=<kept field>`` (any algorithm)
packs each value of a field kept by ``tokenize(keep=[...])`` on its own, so only documents of one
group share a row: the groups' rows in ascending value order (``pack.group_rows.<value>``);
``shuffle_bins`` (any algorithm) emits the window's rows in an order drawn from
``(seed, lane, window)`` instead of their packing order.

Segments are computed as arrays and every output array is built at full size
from them (repeat, cumsum, one gather), so no Python code runs per token; the
bin choice loops once per document over a numpy array of open-bin room.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from ..curriculum.seeding import stream_keys
from ..errors import ConfigError
from ..validate import check_bool, check_choice, check_int, check_name
from .base import Accumulator, WindowContext
from .table import SampleTable, segment_arange

ALGORITHMS = ("wrap", "first_fit", "best_fit", "best_fit_wrap")
BIN_ALGORITHMS = ("first_fit", "best_fit")
DEFAULT_NUM_BINS = 64


class Pack(Accumulator):
    """Pack a window's documents into ``max_length`` rows (see the module docstring).

    ``num_bins`` bounds the open bins of ``first_fit`` / ``best_fit`` (default
    64) and must stay ``None`` for ``wrap`` and ``best_fit_wrap``. ``apply`` is a pure function of
    its input table: no randomness and nothing kept between calls.
    """

    name = "pack"

    def __init__(self, max_length: int, algorithm: str = "wrap", pad_id: int = 0,
                 num_bins: int | None = None, drop_oversized: bool = False,
                 max_sequences_per_bin: int | None = None, min_sequence_length: int | None = None,
                 groups: str | None = None, shuffle_bins: bool = False):
        self.max_length = check_int(max_length, "max_length", 1, call="pack",
                                    hint="the row length in tokens, e.g. 2048")
        self.algorithm = check_choice(algorithm, ALGORITHMS, "algorithm", call="pack")
        self.pad_id = check_int(pad_id, "pad_id", 0, call="pack", hint="the tokenizer's padding token id")
        if algorithm not in BIN_ALGORITHMS:
            if num_bins is not None:
                raise ConfigError(
                    f"num_bins={num_bins!r} only applies to 'first_fit' and 'best_fit'; "
                    f"drop it for algorithm={algorithm!r}"
                )
        elif num_bins is None:
            num_bins = DEFAULT_NUM_BINS
        else:
            num_bins = check_int(num_bins, "num_bins", 1, call="pack",
                                 hint=f"how many bins stay open, default {DEFAULT_NUM_BINS}")
        self.num_bins = num_bins
        self.drop_oversized = check_bool(drop_oversized, "drop_oversized", call="pack")
        self.shuffle_bins = check_bool(shuffle_bins, "shuffle_bins", call="pack")
        self.max_sequences_per_bin = check_int(max_sequences_per_bin, "max_sequences_per_bin", 1, optional=True,
                                               call="pack", hint="documents per row at most, e.g. 8")
        self.min_sequence_length = check_int(min_sequence_length, "min_sequence_length", 1, optional=True,
                                             call="pack", hint="tokens; shorter documents are dropped")
        if groups is not None:
            check_name(groups, "groups", "a field kept by tokenize(keep=[...]), e.g. 'domain'", call="pack")
        self.groups = groups
        for option, used in (("drop_oversized", self.drop_oversized),
                             ("max_sequences_per_bin", self.max_sequences_per_bin is not None)):
            if used and algorithm not in BIN_ALGORITHMS:
                raise ConfigError(f"pack({option}=...) only applies to 'first_fit' and 'best_fit' (whole "
                                  f"documents into bins); drop it for algorithm={algorithm!r}")

    def spec(self) -> dict[str, Any]:
        options = {"drop_oversized": self.drop_oversized, "max_sequences_per_bin": self.max_sequences_per_bin,
                   "min_sequence_length": self.min_sequence_length, "groups": self.groups,
                   "shuffle_bins": self.shuffle_bins}
        return {
            "op": self.name,
            "max_length": self.max_length,
            "algorithm": self.algorithm,
            "pad_id": self.pad_id,
            "num_bins": self.num_bins,
            **{k: v for k, v in options.items() if v},  # only when set: fingerprints as before
        }

    def apply(self, table: SampleTable, ctx: WindowContext) -> SampleTable:
        """The packed rows of ``table``'s documents, in order; counts ``pack.*`` into ``ctx``."""
        per_sample = np.diff(table.lineage_offsets)
        if len(per_sample) != len(table) or np.any(per_sample != 1):
            raise ConfigError(
                "Pack expects one document per sample (exactly one lineage row each), but this "
                "table's samples have several lineage rows; pack only once per pipeline"
            )
        ctx.count("pack.documents", len(table))
        lengths = table.lengths
        keep = np.ones(len(table), dtype=bool)
        if self.min_sequence_length is not None:
            short = lengths < self.min_sequence_length
            ctx.count("pack.short_documents", int(np.count_nonzero(short)))
            keep &= ~short
        if self.drop_oversized:
            long = keep & (lengths > self.max_length)  # a document too short is counted there only
            ctx.count("pack.oversized_documents", int(np.count_nonzero(long)))
            keep &= ~long
        if not keep.all():
            table = table.take(np.flatnonzero(keep))
        if self.groups is None or not len(table):
            out = self._pack(table, ctx)
        else:
            if not table.fields or self.groups not in table.fields:
                raise ConfigError(f"pack(groups={self.groups!r}) needs tokenize(keep=[{self.groups!r}]): the "
                                  f"field is not kept (kept: {sorted(table.fields or ())})")
            values = table.fields[self.groups]
            if values.dtype.kind == "f":
                raise ConfigError(f"pack(groups={self.groups!r}): the field is {values.dtype}; groups are the "
                                  "values of an int or bool field (keep it as 'int64')")
            parts = []
            for value in np.unique(values):
                part = self._pack(table.take(np.flatnonzero(values == value)), ctx)
                ctx.count(f"pack.group_rows.{value.item()}", len(part))
                parts.append(part)
            out = SampleTable.concat(parts)
        if self.shuffle_bins and len(out) > 1:
            keys = stream_keys(ctx.seed, "pack.shuffle_bins", ctx.lane, ctx.window)
            out = out.take(np.random.Generator(np.random.PCG64(list(keys))).permutation(len(out)))
        return out

    def _pack(self, table: SampleTable, ctx: WindowContext) -> SampleTable:
        """``table``'s documents packed by the algorithm (no option but the bins' cap applied)."""
        length = self.max_length
        if self.algorithm == "wrap":
            seg_doc, seg_src, seg_len, seg_row, n_rows, dropped = _wrap_segments(
                table.offsets, length
            )
            ctx.count("pack.dropped_tokens", dropped)
        elif self.algorithm == "best_fit_wrap":
            seg_doc, seg_src, seg_len, seg_row, n_rows, dropped, split = _best_fit_wrap_segments(
                table.offsets, length
            )
            ctx.count("pack.dropped_tokens", dropped)
            ctx.count("pack.split_documents", split)
        else:
            dtype = table.tokens.dtype
            if np.issubdtype(dtype, np.integer) and self.pad_id > np.iinfo(dtype).max:
                raise ConfigError(
                    f"pad_id={self.pad_id} does not fit the token dtype {dtype}; use a pad_id "
                    f"<= {np.iinfo(dtype).max}"
                )
            seg_doc, seg_src, seg_len, seg_row, n_rows, split = self._bin_segments(table.offsets)
            ctx.count("pack.split_documents", split)
        out = _assemble(table, seg_doc, seg_src, seg_len, seg_row, n_rows, length, self.pad_id)
        ctx.count("pack.rows", n_rows)
        ctx.count("pack.tokens", int(seg_len.sum()))
        ctx.count("pack.slots", n_rows * length)
        return out

    def _bin_segments(self, offsets: np.ndarray):
        """Segments of the bin-packing algorithms, sorted by (row, placement order)."""
        length = self.max_length
        doc_len = np.diff(offsets)
        pieces = -(-doc_len // length)  # ceil; 0 for an empty document
        piece_doc = np.repeat(np.arange(len(doc_len), dtype=np.int64), pieces)
        skip = segment_arange(pieces) * length
        piece_src = offsets[piece_doc] + skip
        piece_len = np.minimum(length, doc_len[piece_doc] - skip)
        piece_bin, emitted = self._place(piece_len)
        row_of_bin = np.empty(len(emitted), dtype=np.int64)
        row_of_bin[emitted] = np.arange(len(emitted), dtype=np.int64)
        piece_row = row_of_bin[piece_bin]
        order = np.argsort(piece_row, kind="stable")
        split = int(np.count_nonzero(doc_len > length))
        return (
            piece_doc[order],
            piece_src[order],
            piece_len[order],
            piece_row[order],
            len(emitted),
            split,
        )

    def _place(self, piece_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bin id (numbered by opening) of each piece, and the bin ids in emission order."""
        length, capacity, most = self.max_length, self.num_bins, self.max_sequences_per_bin
        assert capacity is not None, "the bin algorithms always have num_bins"
        best = self.algorithm == "best_fit"
        # room of the open bins in opening order; unused slots have room 0, so nothing fits them
        room = np.zeros(max(1, min(capacity, len(piece_len))), dtype=np.int64)
        held = np.zeros(len(room), dtype=np.int64)  # pieces per open bin (with max_sequences_per_bin)
        ids: list[int] = []  # the open bins' ids, in the same order
        piece_bin: list[int] = []
        emitted: list[int] = []
        for n in piece_len.tolist():
            if best:  # as unsigned, room - n wraps to a huge value where n does not fit
                j = int((room - n).view(np.uint64).argmin())
            else:
                j = int((room >= n).argmax())
            if room[j] >= n:
                room[j] -= n
                piece_bin.append(ids[j])
                if most is not None:
                    held[j] += 1
                    if held[j] == most:  # a bin with its most pieces has no room left
                        room[j] = 0
                continue
            if len(ids) == capacity:  # close the fullest bin (earliest-opened on ties)
                j = int(room.argmin())
                emitted.append(ids.pop(j))
                room[j:-1] = room[j + 1 :]
                held[j:-1] = held[j + 1 :]
            room[len(ids)] = length - n if most != 1 else 0
            held[len(ids)] = 1
            ids.append(len(emitted) + len(ids))
            piece_bin.append(ids[-1])
        emitted.extend(ids)
        return np.asarray(piece_bin, dtype=np.int64), np.asarray(emitted, dtype=np.int64)


def _wrap_segments(offsets: np.ndarray, length: int):
    """Segments of ``wrap``: boundaries are the union of document starts and row starts."""
    total = int(offsets[-1])
    n_rows = total // length
    kept = n_rows * length
    doc_starts = offsets[:-1]
    starts = np.union1d(doc_starts[doc_starts < kept], np.arange(0, kept, length, dtype=np.int64))
    seg_len = np.diff(np.append(starts, kept))
    # side="right" skips zero-length documents that share a start with the next one
    seg_doc = np.searchsorted(offsets, starts, side="right") - 1
    return seg_doc, starts, seg_len, starts // length, n_rows, total - kept


def _best_fit_wrap_segments(offsets: np.ndarray, length: int):
    """Segments of ``best_fit_wrap``, row by row, in placement order within each row.

    The pool is one ascending list of integer keys ``size * M + (M - 1 - doc)``: a
    bisect finds the longest piece of at most ``room`` tokens, earliest document on ties,
    and the last key is the longest piece overall. A document has at most one piece in
    the pool at a time (its uncut tail), so the key is unique.
    """
    doc_len = np.diff(offsets)
    n_docs = len(doc_len)
    big = n_docs + 1
    present = np.flatnonzero(doc_len > 0)
    pool = sorted((doc_len[present] * big + (big - 1 - present)).tolist())
    start = offsets[:-1].tolist()
    remaining = int(doc_len.sum())
    segments: list[tuple[int, int, int]] = []  # (doc, source offset, size)
    cut: set[int] = set()
    n_rows = 0
    while remaining >= length:
        room = length
        while room:
            i = bisect.bisect_right(pool, room * big + big - 1) - 1
            if i >= 0:
                size, doc = divmod(pool.pop(i), big)
                doc = big - 1 - doc
                segments.append((doc, start[doc], size))
                room -= size
                continue
            size, doc = divmod(pool.pop(), big)
            doc = big - 1 - doc
            segments.append((doc, start[doc], room))
            start[doc] += room
            bisect.insort(pool, (size - room) * big + big - 1 - doc)
            cut.add(doc)
            room = 0
        n_rows += 1
        remaining -= length
        segments.append((-1, 0, 0))  # row marker
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
    marker = seg[:, 0] < 0
    seg_row: np.ndarray = (np.cumsum(marker) - marker)[~marker]
    seg = seg[~marker]
    return seg[:, 0], seg[:, 1], seg[:, 2], seg_row, n_rows, remaining, len(cut)


def _ramp(start: np.ndarray, lengths: np.ndarray, slope: np.ndarray, dtype) -> np.ndarray:
    """``concat(s + k * arange(n) for s, k, n in zip(start, slope, lengths))``, lengths >= 1.

    One output allocation: repeat the slopes, write each segment's jump at its head, cumsum
    in place.
    """
    out = np.repeat(slope.astype(dtype), lengths)
    if len(out):
        heads = np.cumsum(lengths) - lengths
        ends = start + slope * (lengths - 1)
        out[0] = start[0]
        out[heads[1:]] = start[1:] - ends[:-1]
        np.cumsum(out, out=out)
    return out


def _assemble(
    table: SampleTable,
    seg_doc: np.ndarray,
    seg_src: np.ndarray,
    seg_len: np.ndarray,
    seg_row: np.ndarray,
    n_rows: int,
    length: int,
    pad_id: int,
) -> SampleTable:
    """Lay segments (sorted by row, in slot order, each >= 1 token) into ``n_rows x length`` rows.

    Segments fill each row from slot 0; a padding segment (slope 0) completes a short row, so
    every output array is built at full size in one pass, with no scatter.
    """
    mask = table.loss_mask  # gathered with the tokens, 0 on padding
    per_row = np.bincount(seg_row, minlength=n_rows)
    row_end = np.cumsum(per_row)
    rank = np.arange(len(seg_len), dtype=np.int64) - (row_end - per_row)[seg_row]
    slope = np.ones(len(seg_len), dtype=np.int64)
    pad = length - np.bincount(seg_row, weights=seg_len, minlength=n_rows).astype(np.int64)
    short = np.flatnonzero(pad)
    if len(short):  # one padding segment after each short row's last document
        at = row_end[short]
        lengths = np.insert(seg_len, at, pad[short])
        src = _ramp(np.insert(seg_src, at, 0), lengths, np.insert(slope, at, 0), np.int64)
        tokens = table.tokens[src]
        document_ids = np.repeat(np.insert(rank, at, -1).astype(table.document_ids.dtype), lengths)
        tokens[document_ids < 0] = pad_id
        if mask is not None:
            mask = mask[src]
            mask[document_ids < 0] = 0
        slope = np.insert(slope, at, 0)
    else:
        lengths = seg_len
        if len(seg_src) and np.array_equal(seg_src[1:], seg_src[:-1] + seg_len[:-1]):
            tokens = table.tokens[seg_src[0] : seg_src[0] + length * n_rows].copy()
            if mask is not None:
                mask = mask[seg_src[0] : seg_src[0] + length * n_rows].copy()
        else:
            src = _ramp(seg_src, lengths, slope, np.int64)
            tokens = table.tokens[src]
            if mask is not None:
                mask = mask[src]
        document_ids = np.repeat(rank.astype(table.document_ids.dtype), lengths)
    positions = _ramp(np.zeros_like(lengths), lengths, slope, table.positions.dtype)
    source = table.lineage_offsets[seg_doc]
    lineage = table.lineage[source]
    lineage[:, 3] += seg_src - table.offsets[seg_doc]
    lineage[:, 4] = seg_len
    lineage_offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(per_row, out=lineage_offsets[1:])
    return SampleTable(
        tokens=tokens,
        offsets=np.arange(n_rows + 1, dtype=np.int64) * length,
        positions=positions,
        document_ids=document_ids,
        lineage=lineage,
        lineage_offsets=lineage_offsets,
        loss_mask=mask,
        fields=table.fields_at(source),
    )
