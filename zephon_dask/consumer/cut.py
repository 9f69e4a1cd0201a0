"""Cutting a run of full batches from one table in one vectorised pass. Pure.

:func:`cut_batches` prepares ``count`` consecutive batches of
``microbatch_size`` rows, starting at row ``start`` of one table, in one
pass: the rows laid out flat in the table's dtype, batch after batch, each
batch padded to its own longest row (as
:func:`~zephon_dask.consumer.batch.make_batch` pads it; packed rows need no
copy), which labels are ignored and where sequences start (``cu_seqlens``)
computed once over all of them, the rows' lineage and the tokens and records
started per dataset (one ``bincount``) too. :meth:`CutBatch.arrays` then
converts one batch's slots to its int64 arrays, a few numpy calls, when the
batch is handed out: no int64 array exists before its batch is asked for, and
each batch owns its arrays except ``lengths`` and ``cu_seqlens``, slices of
the run's arrays that no other batch shares, so writing into one batch (or a
tensor made from it) cannot change another.

Each batch equals, byte for byte, what ``make_batch`` gives for the same
rows: the same fields, dtypes, shapes and values, ``input_ids`` the same
array as ``tokens`` and ``position_ids`` as ``positions``, and per row a view
of the table's lineage rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..operators.table import SampleTable
from .batch import BatchOptions


@dataclass(frozen=True)
class Run:
    """What the batches of one cut share: the rows laid out flat in the table's dtype, batch after
    batch (each padded to its width), and over the same slots which labels are ignored."""

    opts: BatchOptions
    tokens: np.ndarray
    positions: np.ndarray
    doc_ids: np.ndarray
    untrained: np.ndarray | None  # None without labels
    lengths: np.ndarray  # [count, microbatch] int64
    cu_seqlens: list[np.ndarray] | None  # per batch, None unless asked


@dataclass(frozen=True)
class CutBatch:
    """One batch of a cut: its slots ``lo:hi`` of the run (rows of ``width``), its rows' lineage,
    and its tokens and records started per dataset (``[2, n_datasets]``, read-only; ``None``:
    not counted here)."""

    run: Run
    index: int
    lo: int
    hi: int
    width: int
    lineage: list[np.ndarray]
    counts: np.ndarray | None

    def arrays(self) -> dict[str, np.ndarray]:
        """The batch's arrays, as ``make_batch`` builds them (new int64 arrays; a few numpy calls)."""
        run, lo, hi, opts = self.run, self.lo, self.hi, self.run.opts
        shape = (opts.microbatch_size, self.width)
        tokens = run.tokens[lo:hi].astype(np.int64).reshape(shape)
        positions = run.positions[lo:hi].astype(np.int64).reshape(shape)
        docs = run.doc_ids[lo:hi]
        batch = {"tokens": tokens, "positions": positions, "document_ids": docs.astype(np.int64).reshape(shape),
                 "lengths": run.lengths[self.index]}  # make_batch's fields, in its order; rows of
        # lengths and cu_seqlens are slices of the run's arrays that no other batch shares
        if run.untrained is not None:
            shift = 1 if opts.label_convention == "shifted" else 0  # shifted: a slot's target is the next token
            untrained = run.untrained[lo:hi]
            labels = np.empty(hi - lo, dtype=np.int64)
            labels[:hi - lo - shift] = run.tokens[lo + shift:hi]
            labels[untrained] = opts.ignore_index
            if opts.label_convention == "hf":
                batch["attention_mask"] = (docs >= 0).astype(np.int64).reshape(shape)
                batch["position_ids"] = positions
            batch.update(input_ids=tokens, labels=labels.reshape(shape), loss_mask=~untrained.reshape(shape))
        if run.cu_seqlens is not None:
            batch["cu_seqlens"] = run.cu_seqlens[self.index]
        return batch


def cut_batches(table: SampleTable, start: int, count: int, opts: BatchOptions,
                n_datasets: int) -> list[CutBatch] | None:
    """The ``count`` batches of ``opts.microbatch_size`` rows from row ``start`` of ``table``, or
    ``None`` when a row is empty or ``pad_id`` is not an int64 (then ``make_batch`` builds them
    one at a time)."""
    m = opts.microbatch_size
    rows = count * m
    offsets = table.offsets[start:start + rows + 1]
    lengths = np.diff(offsets)
    if not rows or int(lengths.min()) == 0 or not _fits(opts.pad_id, np.dtype(np.int64)):
        return None
    widths = lengths.reshape(count, m).max(axis=1)
    slot = np.zeros(rows + 1, dtype=np.int64)  # where each row starts in the flat blocks
    np.cumsum(np.repeat(widths, m), out=slot[1:])
    a, b = int(offsets[0]), int(offsets[-1])
    equal = int(slot[-1]) == b - a  # every row full: the table's flat arrays are the blocks
    dest = None if equal else np.arange(b - a, dtype=np.int64) + np.repeat(slot[:-1] - (offsets[:-1] - a), lengths)

    def block(flat: np.ndarray, fill: int) -> np.ndarray:
        """The rows' values padded to their batch's width, in the table's dtype (int64 where
        ``fill`` does not fit it: a held window's arrays are narrowed to their values)."""
        if equal:
            return flat[a:b]
        out = np.full(int(slot[-1]), fill, dtype=flat.dtype if _fits(fill, flat.dtype) else np.int64)
        out[dest] = flat[a:b]
        return out

    doc_ids = block(table.document_ids, -1)
    first = np.zeros(len(doc_ids), dtype=bool)
    first[slot[:-1]] = True
    untrained = None
    if opts.label_convention is not None:
        untrained = _untrained(doc_ids, first, slot, opts,
                               None if table.loss_mask is None else block(table.loss_mask, 0))
    run = Run(opts, block(table.tokens, opts.pad_id), block(table.positions, 0), doc_ids, untrained,
              lengths.astype(np.int64).reshape(count, m),
              _cu_seqlens(doc_ids, first, slot[::m]) if opts.cu_seqlens else None)
    bounds = slot[::m].tolist()  # where each batch starts in the flat blocks, and the end
    lineage = _lineage(table, start, rows)
    counts = _counts(table, start, rows, m, count, n_datasets)
    return [CutBatch(run, j, lo, hi, width, lineage[j * m:(j + 1) * m], None if counts is None else counts[j])
            for j, (lo, hi, width) in enumerate(zip(bounds[:-1], bounds[1:], widths.tolist(), strict=True))]


def _fits(value: int, dtype: np.dtype) -> bool:
    """Whether the integer ``value`` is a value of the integer ``dtype``."""
    info = np.iinfo(dtype)
    return info.min <= value <= info.max


def _untrained(doc_ids: np.ndarray, first: np.ndarray, slot: np.ndarray, opts: BatchOptions,
               token_mask: np.ndarray | None) -> np.ndarray:
    """Over the flat blocks, where the label is ``ignore_index`` (``~loss_mask``):
    :func:`~zephon_dask.consumer.batch.next_token_labels` row by row, the last slot of a row
    standing for its last column; with ``"hf"`` one slot later, the first slot of a row
    untrained."""
    invalid = np.zeros(len(doc_ids), dtype=bool)
    invalid[slot[1:] - 1] = True  # a row's last column has no next token
    invalid[:-1] |= doc_ids[1:] < 0
    if opts.mask_document_boundaries:
        invalid[:-1] |= doc_ids[1:] != doc_ids[:-1]
    if token_mask is not None:
        invalid[:-1] |= token_mask[1:] == 0
    invalid |= doc_ids < 0
    if opts.label_convention != "hf":
        return invalid
    later = np.empty_like(invalid)  # the same targets, one column to the right
    later[1:] = invalid[:-1]
    later[first] = True
    return later


def _cu_seqlens(doc_ids: np.ndarray, first: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
    """Per batch, the int32 offsets where a row or a document starts in its flattened tokens,
    then its size (``make_batch``'s ``cu_seqlens``), all built in one array."""
    count = len(bounds) - 1
    starts_at = first.copy()
    starts_at[1:] |= doc_ids[1:] != doc_ids[:-1]
    starts = np.flatnonzero(starts_at)
    owner = np.searchsorted(bounds, starts, side="right") - 1  # the batch of each start
    ends = np.cumsum(np.bincount(owner, minlength=count)) + np.arange(count)  # where each batch's size goes
    cu = np.empty(len(starts) + count, dtype=np.int32)
    cu[np.arange(len(starts)) + owner] = starts - bounds[owner]
    cu[ends] = np.diff(bounds)
    edges = [0, *(ends + 1).tolist()]
    return [cu[lo:hi] for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def _lineage(table: SampleTable, start: int, rows: int) -> list[np.ndarray]:
    """Per row, a view of its lineage rows (as ``SampleTable.sample_lineage`` gives them)."""
    edges = table.lineage_offsets[start:start + rows + 1].tolist()
    lineage = table.lineage
    return [lineage[lo:hi] for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def _counts(table: SampleTable, start: int, rows: int, m: int, count: int,
            n_datasets: int) -> np.ndarray | None:
    """``[count, 2, n_datasets]`` (read-only): real tokens and records started per dataset of each
    batch (what ``Batch.dataset_counts`` computes), or ``None`` when a lineage row names a dataset
    outside ``range(n_datasets)``."""
    edges = table.lineage_offsets[start:start + rows + 1]
    lineage = table.lineage[int(edges[0]):int(edges[-1])]
    datasets = lineage[:, 0]
    if not n_datasets or len(datasets) and (int(datasets.min()) < 0 or int(datasets.max()) >= n_datasets):
        return None
    key = np.repeat(np.arange(rows, dtype=np.int64) // m, np.diff(edges)) * n_datasets + datasets
    cells = count * n_datasets
    tokens = np.bincount(key, weights=lineage[:, 4], minlength=cells).astype(np.int64)
    samples = np.bincount(key[lineage[:, 3] == 0], minlength=cells).astype(np.int64)
    counts = np.stack((tokens.reshape(count, n_datasets), samples.reshape(count, n_datasets)), axis=1)
    counts.flags.writeable = False
    return counts
