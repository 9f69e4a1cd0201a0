"""Building batches: a run of them from one table in one vectorised pass. Pure.

:func:`cut_batches` prepares ``count`` consecutive batches of ``size`` rows
(``microbatch_size`` unless told), starting at row ``start`` of one table, in
one pass: the rows laid out flat in the table's dtype (int64 where
``pad_id`` does not fit it), batch after batch, each batch padded to its own
longest row (packed rows need no copy), which labels are ignored and where
sequences start (``cu_seqlens``) computed once over all of them, the rows'
lineage and the tokens and records started per dataset (one ``bincount``)
too. :meth:`CutBatch.arrays` then converts one batch's slots to its int64
arrays, a few numpy calls, when the batch is handed out: no int64 array
exists before its batch is asked for, and each batch owns its arrays except
``lengths`` and ``cu_seqlens``, slices of the run's arrays that no other
batch shares, so writing into one batch (or a tensor made from it) cannot
change another.

:func:`make_batch` is the one-batch case: every row of a table in one batch
(a batch straddling two windows, a lane's last partial batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DataFormatError
from ..operators.table import KEPT_FILL, SampleTable, token_lineage
from .batch import Batch, BatchOptions


@dataclass(frozen=True)
class Run:
    """What the batches of one cut share: the rows laid out flat in the table's dtype, batch after
    batch (each padded to its width), and over the same slots which labels are ignored."""

    opts: BatchOptions
    size: int  # rows per batch
    tokens: np.ndarray
    positions: np.ndarray
    doc_ids: np.ndarray
    untrained: np.ndarray | None  # None without labels
    lengths: np.ndarray  # [count, size] int64
    cu_seqlens: list[np.ndarray] | None  # per batch, None unless asked
    start: int = 0  # the table row of the run's first row
    lineage_offsets: np.ndarray | None = None  # the table's, when kept fields or dataset ids are built
    datasets: np.ndarray | None = None  # the table's lineage datasets, when dataset ids are built
    fields: dict[str, np.ndarray] | None = None  # the table's kept fields (one value per lineage row)


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
        """The batch's arrays (new int64 arrays; a few numpy calls)."""
        run, lo, hi, opts = self.run, self.lo, self.hi, self.run.opts
        shape = (run.size, self.width)
        tokens = run.tokens[lo:hi].astype(np.int64).reshape(shape)
        positions = run.positions[lo:hi].astype(np.int64).reshape(shape)
        docs = run.doc_ids[lo:hi]
        batch = {"tokens": tokens, "positions": positions, "document_ids": docs.astype(np.int64).reshape(shape),
                 "lengths": run.lengths[self.index]}  # rows of lengths and cu_seqlens are slices of
        # the run's arrays that no other batch shares
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
        if run.lineage_offsets is not None:
            batch.update(self._per_token(docs, shape))
        return batch

    def _per_token(self, docs: np.ndarray, shape: tuple[int, int]) -> dict[str, np.ndarray]:
        """Each slot's dataset index and kept fields, from its lineage row (fill on padding)."""
        run = self.run
        assert run.lineage_offsets is not None
        rows = run.start + self.index * run.size + np.arange(run.size, dtype=np.int64)
        try:
            at = token_lineage(run.lineage_offsets, docs.astype(np.int64), rows, self.width)
        except ValueError as exc:
            raise DataFormatError(f"batch {self.index} of this cut: {exc}") from None
        pad = at < 0
        clipped = np.maximum(at, 0)

        def gather(values: np.ndarray, fill) -> np.ndarray:
            if not len(values):  # every slot is padding
                return np.full(shape, fill, dtype=values.dtype)
            out = values.take(clipped)
            out[pad] = fill
            return out.reshape(shape)

        out = {} if run.datasets is None else {"dataset_ids": gather(run.datasets, -1)}
        for name, values in (run.fields or {}).items():
            out[name] = gather(values, KEPT_FILL[values.dtype.kind])
        return out


def cut_batches(table: SampleTable, start: int, count: int, opts: BatchOptions,
                n_datasets: int, size: int | None = None) -> list[CutBatch]:
    """The ``count`` batches of ``size`` rows (default ``opts.microbatch_size``) from row ``start``
    of ``table``."""
    m = opts.microbatch_size if size is None else size
    rows = count * m
    offsets = table.offsets[start:start + rows + 1]
    lengths = np.diff(offsets)
    widths = lengths.reshape(count, m).max(axis=1, initial=0)
    slot = np.zeros(rows + 1, dtype=np.int64)  # where each row starts in the flat blocks
    np.cumsum(np.repeat(widths, m), out=slot[1:])
    a, b = int(offsets[0]), int(offsets[-1])
    equal = int(slot[-1]) == b - a  # every row full: the table's flat arrays are the blocks
    dest = None if equal else np.arange(b - a, dtype=np.int64) + np.repeat(slot[:-1] - (offsets[:-1] - a), lengths)

    def block(flat: np.ndarray, fill: int) -> np.ndarray:
        """The rows' values padded to their batch's width, in the table's dtype (int64 where
        ``fill`` is not one of its values)."""
        if equal:
            return flat[a:b]
        info = np.iinfo(flat.dtype)
        out = np.full(int(slot[-1]), fill, dtype=flat.dtype if info.min <= fill <= info.max else np.int64)
        out[dest] = flat[a:b]
        return out

    doc_ids = block(table.document_ids, -1)
    filled = slot[1:] > slot[:-1]  # rows with slots (none in a batch of empty rows)
    first = np.zeros(len(doc_ids), dtype=bool)
    first[slot[:-1][filled]] = True
    untrained = None
    if opts.label_convention is not None:
        untrained = _untrained(doc_ids, first, slot[1:][filled], opts,
                               None if table.loss_mask is None else block(table.loss_mask, 0))
    bounds = slot[np.arange(count + 1) * m]  # where each batch starts in the flat blocks, and the end
    per_token = opts.dataset_ids or bool(table.fields)
    run = Run(opts, m, block(table.tokens, opts.pad_id), block(table.positions, 0), doc_ids, untrained,
              lengths.astype(np.int64).reshape(count, m),
              _cu_seqlens(doc_ids, first, bounds) if opts.cu_seqlens else None,
              start, table.lineage_offsets if per_token else None,
              table.lineage[:, 0] if opts.dataset_ids else None, dict(table.fields) if table.fields else None)
    edges = bounds.tolist()
    lineage = _lineage(table, start, rows)
    counts = _counts(table, start, rows, m, count, n_datasets)
    return [CutBatch(run, j, lo, hi, width, lineage[j * m:(j + 1) * m], None if counts is None else counts[j])
            for j, (lo, hi, width) in enumerate(zip(edges[:-1], edges[1:], widths.tolist(), strict=True))]


def make_batch(table: SampleTable, lane: int, index_in_lane: int, opts: BatchOptions,
               dataset_names: tuple[str, ...] = (), position: tuple[int, int] = (0, 0),
               last: bool = False) -> Batch:
    """One batch of all of ``table``'s rows, padded to the longest (the one-batch case of
    :func:`cut_batches`)."""
    (cut,) = cut_batches(table, 0, 1, opts, len(dataset_names), size=len(table))
    return Batch(cut.arrays(), lane, index_in_lane, cut.lineage, dataset_names, position, last, counts=cut.counts)


def _untrained(doc_ids: np.ndarray, first: np.ndarray, ends: np.ndarray, opts: BatchOptions,
               token_mask: np.ndarray | None) -> np.ndarray:
    """Over the flat blocks, where the label is ``ignore_index`` (``~loss_mask``): the target of a
    slot is the next slot's token, untrained in a row's last column (``ends``: where the rows
    end), where this slot or the next is padding, where the next token's ``token_mask`` is 0 and,
    if asked, where the next token starts another document; with ``"hf"`` one slot later, the
    first slot of a row untrained."""
    invalid = np.zeros(len(doc_ids), dtype=bool)
    invalid[ends - 1] = True  # a row's last column has no next token
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
    then its size, all built in one array."""
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
