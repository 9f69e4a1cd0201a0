"""Batches cut ahead in one vectorised pass equal, byte for byte, the one-batch cut
(``make_batch``) over the same rows and a row-by-row oracle, and no two batches share memory;
windows held narrowed (``SampleTable.narrowed``) give the batches of the windows as computed."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.oracles import ref_batch_arrays
from zephon_dask.consumer import BatchOptions, make_batch
from zephon_dask.consumer import batcher as batcher_module
from zephon_dask.consumer.batcher import LaneBatcher
from zephon_dask.operators.table import SampleTable

NAMES = ("prose", "code", "chat")


@st.composite
def window(draw, packed: bool, masked: bool, width: int, kept: bool = False) -> SampleTable:
    """A window's samples: packed rows of ``width`` slots (documents, then padding), or
    unpacked ones of 1 to ``width`` tokens (now and then an empty one). ``kept``: lineage as
    the operators lay it (a row's k-th document segment is its k-th lineage row, its token count
    the segment's length) and kept fields of each dtype, one value per lineage row."""
    n = draw(st.integers(0, 14))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if packed:
        lengths = np.full(n, width)
    else:
        lengths = rng.integers(1, width + 1, n)
        if n and draw(st.integers(0, 9)) == 0:
            lengths[rng.integers(0, n)] = 0
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    doc_ids, positions = [], []
    for length in lengths.tolist():
        ids = np.sort(rng.integers(0, 3, length)) if packed else np.zeros(length, np.int64)
        if packed and length:
            ids[length - int(rng.integers(0, length)):] = -1  # padding at the row's end
        starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1]))) if length else np.zeros(0, int)
        pos = np.arange(length) - np.repeat(starts, np.diff(np.concatenate((starts, [length]))))
        doc_ids.append(ids)
        positions.append(np.where(ids < 0, 0, pos))
    total = int(offsets[-1])
    if kept:
        return _kept_window(rng, offsets, doc_ids, positions, masked)
    per_row = rng.integers(0, 4, n)
    lineage = np.stack([rng.integers(0, len(NAMES), per_row.sum()), rng.integers(0, 5, per_row.sum()),
                        rng.integers(0, 100, per_row.sum()), rng.integers(0, 3, per_row.sum()),
                        rng.integers(1, 50, per_row.sum())], axis=1).astype(np.int64)
    return SampleTable(
        rng.integers(1, 1000, total).astype(np.int32), offsets,
        np.concatenate(positions or [np.zeros(0)]).astype(np.int32),
        np.concatenate(doc_ids or [np.zeros(0)]).astype(np.int32),
        lineage, np.concatenate(([0], np.cumsum(per_row))).astype(np.int64),
        rng.integers(0, 2, total).astype(np.uint8) if masked else None,
    )


def _kept_window(rng, offsets, doc_ids, positions, masked) -> SampleTable:
    """The window of ``window(kept=True)``: document ids made dense (0, 1, ... per row), one lineage
    row per document segment, kept fields ``domain`` (int64), ``score`` (float32), ``flag`` (bool)."""
    segments, dense = [], []
    for ids in doc_ids:
        real = ids[ids >= 0]
        _, first, counts = np.unique(real, return_index=True, return_counts=True)
        rank = np.repeat(np.arange(len(counts)), counts)
        dense.append(np.concatenate((rank, np.full(len(ids) - len(real), -1))).astype(np.int64))
        segments.append(counts)
    per_row = np.array([len(c) for c in segments], dtype=np.int64)
    m = int(per_row.sum())
    lineage = np.stack([rng.integers(0, len(NAMES), m), rng.integers(0, 5, m), rng.integers(0, 100, m),
                        rng.integers(0, 3, m), np.concatenate(segments or [np.zeros(0)])], axis=1).astype(np.int64)
    total = int(offsets[-1])
    return SampleTable(
        rng.integers(1, 1000, total).astype(np.int32), offsets,
        np.concatenate(positions or [np.zeros(0)]).astype(np.int32),
        np.concatenate(dense or [np.zeros(0)]).astype(np.int32),
        lineage, np.concatenate(([0], np.cumsum(per_row))).astype(np.int64),
        rng.integers(0, 2, total).astype(np.uint8) if masked else None,
        {"domain": rng.integers(0, 4, m).astype(np.int64), "score": rng.random(m).astype(np.float32),
         "flag": rng.integers(0, 2, m).astype(bool)},
    )


@st.composite
def lane(draw):
    packed, masked, kept = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    width = draw(st.integers(1, 9))
    windows = draw(st.lists(window(packed, masked, width, kept), min_size=1, max_size=6))
    opts = BatchOptions(microbatch_size=draw(st.integers(1, 5)), drop_last=draw(st.booleans()),
                        labels=draw(st.sampled_from([False, True, "shifted", "hf"])), ignore_index=-100,
                        mask_document_boundaries=draw(st.booleans()), cu_seqlens=draw(st.booleans()),
                        pad_id=draw(st.sampled_from([0, 1, 2, 3, 300, 70_000, 2**31])),  # some not uint8/uint16/int32
                        dataset_ids=kept and draw(st.booleans()))
    skip = draw(st.integers(0, len(windows[0])))
    return windows, opts, skip, draw(st.booleans())


def stream(windows, opts, skip):
    """The lane's batches as the tail pulls them: a window pushed whenever no full batch is
    buffered; the last partial batch at the end. Each with the rows it holds, as
    ``(window, offset)``."""
    batcher = LaneBatcher(3, opts, NAMES, first_index=5, position=(0, skip))
    rows, delivered, out = [], 0, []
    pending = list(enumerate(windows))
    while True:
        while not batcher.ready() and pending:
            w, table = pending.pop(0)
            start = skip if w == 0 else 0
            batcher.push(w, table, skip=start)
            rows += [(w, i) for i in range(start, len(table))]
        batch = batcher.pop() if batcher.ready() else batcher.finish()
        if batch is None:
            return out
        n = batch.num_samples
        nxt = rows[delivered + n] if delivered + n < len(rows) else (max(w for w, _ in rows) + 1, 0) if rows else None
        out.append((batch, rows[delivered:delivered + n], nxt))
        delivered += n
        if batch.last:
            return out


def same_arrays(batch, ref) -> None:
    assert list(batch) == list(ref)
    for key in ref:
        a, b = batch[key], ref[key]
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), key
    assert (batch["input_ids"] is batch["tokens"]) == (ref["input_ids"] is ref["tokens"]) if "input_ids" in ref else True


def same(batch, ref) -> None:
    same_arrays(batch, ref)
    assert (batch.lane, batch.index_in_lane, batch.position, batch.last) == \
        (ref.lane, ref.index_in_lane, ref.position, ref.last)
    assert len(batch.lineage) == len(ref.lineage)
    for a, b in zip(batch.lineage, ref.lineage, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert [batch.sources(i) for i in range(batch.num_samples)] == [ref.sources(i) for i in range(ref.num_samples)]
    for name in ("dataset_tokens", "dataset_samples"):
        a, b = getattr(batch, name)(), getattr(ref, name)()
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    counts = batch.dataset_counts()
    assert not counts.flags.writeable and np.array_equal(counts, ref.dataset_counts())


def scribble(batch) -> None:
    """Write into every array of ``batch`` in place (as a training step might into its tensors)."""
    for value in {id(v): v for v in batch.values()}.values():
        if value.dtype == bool:
            np.logical_not(value, out=value)
        else:
            value += 7919


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lane())
def test_cut_batches_equal_the_one_batch_cut_and_the_oracle(case):
    windows, opts, skip, narrow = case
    held = [t.narrowed()[0] if narrow else t for t in windows]  # as a window computed ahead is held
    if narrow:
        assert all(a.tokens.dtype.itemsize <= 2 and a.positions.dtype.itemsize == 1 for a in held if len(a.tokens))
        assert all(a.widened(t.narrowed()[1]).digest() == t.digest() for a, t in zip(held, windows, strict=True))
    batches = stream(held, opts, skip)
    for k, (batch, rows, nxt) in enumerate(batches):
        table = SampleTable.concat([windows[w].slice(i, i + 1) for w, i in rows])
        same_arrays(batch, ref_batch_arrays(table, opts))
        ref = make_batch(table, 3, 5 + k, opts, NAMES, nxt, last=batch.last)
        same(batch, ref)  # batches before this one were written into: none of it shows here
        scribble(batch)
    total = sum(len(t) for t in windows) - skip
    full, part = divmod(total, opts.microbatch_size)
    assert len(batches) == full + (1 if part and not opts.drop_last else 0)


def test_cut_covers_whole_windows_and_is_used(monkeypatch):
    """Batches inside a window come from the window's cut; a batch that straddles two windows is a
    one-batch cut (``make_batch``)."""
    built = []
    monkeypatch.setattr(batcher_module, "make_batch", lambda *a, **k: built.append(a[2]) or make_batch(*a, **k))
    rng = np.random.default_rng(0)
    n, width = 34, 16
    table = SampleTable(rng.integers(0, 9, n * width).astype(np.int32), np.arange(n + 1) * width,
                        np.tile(np.arange(width), n).astype(np.int32), np.zeros(n * width, np.int32),
                        np.zeros((n, 5), np.int64), np.arange(n + 1))
    batcher = LaneBatcher(0, BatchOptions(microbatch_size=4), ("a",))
    batcher.push(0, table)
    batcher.push(1, table)
    got = [batcher.pop() for _ in range(2 * n // 4)]
    assert built == [n // 4]  # only the batch across the two windows
    assert [b.position for b in got[n // 4 - 1:n // 4 + 1]] == [(0, n - 2), (1, 2)]


@settings(max_examples=100, deadline=None)
@given(window(packed=False, masked=True, width=5), st.sampled_from([False, True, "hf"]), st.booleans())
def test_make_batch_of_any_rows_equals_the_oracle(table, labels, cu_seqlens):
    """Any rows in one batch, none or all empty included."""
    opts = BatchOptions(microbatch_size=2, labels=labels, cu_seqlens=cu_seqlens, pad_id=5)
    same_arrays(make_batch(table, 0, 0, opts, NAMES), ref_batch_arrays(table, opts))
    empty = SampleTable(table.tokens[:0], np.zeros(3, np.int64), table.positions[:0], table.document_ids[:0],
                        table.lineage[:0], np.zeros(3, np.int64), None)
    same_arrays(make_batch(empty, 0, 0, opts, NAMES), ref_batch_arrays(empty, opts))
