"""Cutting a run of full batches from one table in one vectorised pass. Pure.

:func:`cut_batches` builds ``count`` consecutive batches of
``microbatch_size`` rows, starting at row ``start`` of one table, with one
numpy call per field for all of them instead of one per batch: the rows are
laid out in one flat block per field, batch after batch, each batch padded to
its own longest row (as :func:`~zephon_dask.consumer.batch.make_batch` pads
it), and each batch's arrays are reshaped slices of those blocks. The slices
of two batches never overlap, so writing into one batch (or a tensor made
from it) cannot change another; a held batch keeps its whole block alive.

Each batch equals, byte for byte, what ``make_batch`` gives for the same
rows: the same fields, dtypes, shapes and values, ``input_ids`` the same
array as ``tokens`` and ``position_ids`` as ``positions``, and per row a view
of the table's lineage rows. Its tokens and records started per dataset are
counted here too, for all the batches in one ``bincount``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..operators.table import SampleTable
from .batch import BatchOptions


@dataclass(frozen=True)
class CutBatch:
    """One batch's parts: its arrays, its rows' lineage, and its tokens and records started per
    dataset (``None``: not counted here)."""

    arrays: dict[str, np.ndarray]
    lineage: list[np.ndarray]
    counts: tuple[np.ndarray, np.ndarray] | None


def cut_batches(table: SampleTable, start: int, count: int, opts: BatchOptions,
                n_datasets: int) -> list[CutBatch] | None:
    """The ``count`` batches of ``opts.microbatch_size`` rows from row ``start`` of ``table``, or
    ``None`` when a row is empty (then ``make_batch`` builds them one at a time)."""
    m = opts.microbatch_size
    rows = count * m
    offsets = table.offsets[start:start + rows + 1]
    lengths = np.diff(offsets)
    if not rows or int(lengths.min()) == 0:
        return None
    widths = lengths.reshape(count, m).max(axis=1)
    row_width = np.repeat(widths, m)
    slot = np.zeros(rows + 1, dtype=np.int64)  # where each row starts in the flat blocks
    np.cumsum(row_width, out=slot[1:])
    size = int(slot[-1])
    a, b = int(offsets[0]), int(offsets[-1])
    equal = bool((lengths == row_width).all())  # every row full: the flat arrays are the blocks
    dest = None if equal else np.arange(b - a, dtype=np.int64) + np.repeat(slot[:-1] - (offsets[:-1] - a), lengths)

    def block(flat: np.ndarray, fill: int, dtype) -> np.ndarray:
        if equal:
            return flat[a:b].astype(dtype)
        out = np.full(size, fill, dtype=dtype)
        out[dest] = flat[a:b]
        return out

    tokens = block(table.tokens, opts.pad_id, np.int64)
    positions = block(table.positions, 0, np.int64)
    doc_ids = block(table.document_ids, -1, np.int64)
    first = np.zeros(size, dtype=bool)
    first[slot[:-1]] = True
    fields: dict[str, np.ndarray] = {"tokens": tokens, "positions": positions, "document_ids": doc_ids}
    if opts.label_convention is not None:
        fields.update(_labels(tokens, doc_ids, first, slot, opts,
                              None if table.loss_mask is None else block(table.loss_mask, 0, np.uint8)))
    bounds = slot[::m]  # where each batch starts in the flat blocks, and the end
    row_lengths = lengths.astype(np.int64).reshape(count, m)
    cus = _cu_seqlens(doc_ids, first, bounds) if opts.cu_seqlens else None
    arrays = []
    for j, (lo, hi, width) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), widths.tolist(),
                                            strict=True)):
        part = {name: flat[lo:hi].reshape(m, width) for name, flat in fields.items()}
        batch = {"tokens": part["tokens"], "positions": part["positions"], "document_ids": part["document_ids"],
                 "lengths": row_lengths[j]}  # make_batch's fields, in its order
        if opts.label_convention == "hf":
            batch["attention_mask"] = part["attention_mask"]
            batch["position_ids"] = part["positions"]
        if opts.label_convention is not None:
            batch.update(input_ids=part["tokens"], labels=part["labels"], loss_mask=part["loss_mask"])
        if cus is not None:
            batch["cu_seqlens"] = cus[j]
        arrays.append(batch)
    lineage = _lineage(table, start, rows)
    counts = _counts(table, start, rows, m, count, n_datasets)
    return [CutBatch(batch, lineage[j * m:(j + 1) * m], None if counts is None else (counts[0][j], counts[1][j]))
            for j, batch in enumerate(arrays)]



def _labels(tokens: np.ndarray, doc_ids: np.ndarray, first: np.ndarray, slot: np.ndarray,
            opts: BatchOptions, token_mask: np.ndarray | None) -> dict[str, np.ndarray]:
    """``labels`` and ``loss_mask`` (and with ``"hf"``, ``attention_mask``) over the flat blocks:
    :func:`~zephon_dask.consumer.batch.next_token_labels` row by row, the last slot of a row
    standing for its last column."""
    ignore = opts.ignore_index
    invalid = np.zeros(tokens.size, dtype=bool)
    invalid[slot[1:] - 1] = True  # a row's last column has no next token
    invalid[:-1] |= doc_ids[1:] < 0
    if opts.mask_document_boundaries:
        invalid[:-1] |= doc_ids[1:] != doc_ids[:-1]
    if token_mask is not None:
        invalid[:-1] |= token_mask[1:] == 0
    invalid |= doc_ids < 0
    labels = np.empty_like(tokens)
    labels[:-1] = tokens[1:]
    labels[invalid] = ignore
    trained = ~invalid
    if opts.label_convention != "hf":
        return {"labels": labels, "loss_mask": trained}
    shifted, was = labels, trained  # the same targets, one column to the right
    labels = np.empty_like(shifted)
    labels[1:] = shifted[:-1]
    labels[first] = ignore
    trained = np.empty_like(was)
    trained[1:] = was[:-1]
    trained[first] = False
    return {"labels": labels, "loss_mask": trained, "attention_mask": (doc_ids >= 0).astype(np.int64)}


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
            n_datasets: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``[count, n_datasets]`` real tokens and records started per dataset of each batch (what
    ``Batch.dataset_tokens`` and ``Batch.dataset_samples`` compute), or ``None`` when a lineage
    row names a dataset outside ``range(n_datasets)``."""
    edges = table.lineage_offsets[start:start + rows + 1]
    lineage = table.lineage[int(edges[0]):int(edges[-1])]
    datasets = lineage[:, 0]
    if not n_datasets or len(datasets) and (int(datasets.min()) < 0 or int(datasets.max()) >= n_datasets):
        return None
    key = np.repeat(np.arange(rows, dtype=np.int64) // m, np.diff(edges)) * n_datasets + datasets
    cells = count * n_datasets
    tokens = np.bincount(key, weights=lineage[:, 4], minlength=cells).astype(np.int64)
    samples = np.bincount(key[lineage[:, 3] == 0], minlength=cells).astype(np.int64)
    return tokens.reshape(count, n_datasets), samples.reshape(count, n_datasets)
