"""The pure window function: ``compute_window(spec, lane, window) -> WindowOutput``
(and ``compute_windows`` for several windows in one task).

A window is computed in two stages that map one-to-one onto Dask tasks:

* ``compute_chunk(spec, g)``: read chunk ``g``'s pointers and run the
  record operators (``op.apply_chunk`` each), giving one document per
  output record;
* ``finish_window(spec, lane, window, chunk_tables)``: concatenate the chunk
  outputs in chunk order and run the accumulators, which start empty here and
  are flushed at the end.

Neither uses Dask, torch or global state, and no clock reaches the data: the
same inputs give the same bytes in any process. Each output also carries
:class:`Made` (where and in how many seconds of wall time and of CPU it was
computed: the DEBUG log, and the automatic ``windows_per_task``), kept out of its
table, its counters and its digest.

A window computed ahead of its consumer is held narrowed (:func:`narrowed`: its
per-token arrays in their smallest integer types, see
:meth:`~zephon_dask.operators.table.SampleTable.narrowed`), on the worker that computed it, in
transfer and in the training process; its batches are built from it in int64 as from the
window as computed, and :meth:`WindowOutput.widened` gives that window back byte for byte.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import DataFormatError, MissingFieldError
from ..operators.base import ChunkContext, Row, WindowContext
from ..operators.table import SampleTable
from ..operators.tokenize import kept_fields
from .spec import PipelineSpec


@dataclass(frozen=True)
class Made:
    """Where a window was computed (its Dask worker's address, else this process), the seconds
    its tasks took and the CPU seconds of the threads computing them (its chunks' and its own,
    summed): metadata, never part of the data."""

    worker: str = ""
    seconds: float = 0.0
    cpu: float = 0.0


def _here() -> str:
    """The Dask worker computing this task (its address; ``distributed`` is read, never imported),
    else this process and thread."""
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            return str(distributed.get_worker().address)
        # not in a worker; AttributeError: distributed is still being imported, by another thread
        # of this process (the embedded cluster's start, beside the head start): not a worker either
        except (ValueError, AttributeError):
            pass
    return f"pid {os.getpid()} ({threading.current_thread().name})"


@dataclass(eq=False)
class ChunkOutput:
    """Documents of one chunk after the stateless operators (a value; ``seconds`` and ``cpu``: its
    compute time, wall and its thread's CPU)."""

    chunk: int
    table: SampleTable
    stats: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu: float = 0.0

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + self.table.__sizeof__()


@dataclass(eq=False)
class WindowOutput:
    """The samples of one (lane, window) and their counters (a value)."""

    lane: int
    window: int
    chunks: tuple[int, ...]
    table: SampleTable
    stats: dict[str, int]
    dataset_names: tuple[str, ...]
    made: Made = field(default_factory=Made)
    wide: dict[str, np.dtype] = field(default_factory=dict)  # the computed dtype of each narrowed field

    def __len__(self) -> int:
        return len(self.table)

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + self.table.__sizeof__()

    @property
    def efficiency(self) -> float | None:
        """Real tokens / slots of packed rows (``None`` when nothing was packed)."""
        slots = self.stats.get("pack.slots")
        return self.stats.get("pack.tokens", 0) / slots if slots else None

    def digest(self) -> str:
        """SHA-256 of the window's samples as computed (narrowed or not): equal digests mean equal
        bytes (a determinism check)."""
        return self.widened().table.digest()

    def narrowed(self) -> WindowOutput:
        """This window with its per-token arrays in their smallest integer types (the same values)."""
        table, wide = self.table.narrowed()
        return replace(self, table=table, wide={**wide, **self.wide}) if wide else self

    def widened(self) -> WindowOutput:
        """This window as computed: every narrowed array back in its own dtype."""
        return replace(self, table=self.table.widened(self.wide), wide={}) if self.wide else self


def narrowed(value: Any) -> Any:
    """A task's result held narrowed: a :class:`WindowOutput`, or each of a tuple of them
    (:func:`compute_windows`), by :meth:`WindowOutput.narrowed`; any other value as it is."""
    if isinstance(value, WindowOutput):
        return value.narrowed()
    if isinstance(value, tuple) and value and all(isinstance(v, WindowOutput) for v in value):
        return tuple(v.narrowed() for v in value)
    return value


def _note(exc: BaseException, text: str) -> None:
    exc.add_note(f"zephon_dask: {text}")


def read_chunk(spec: PipelineSpec, g: int) -> tuple[np.ndarray, list[dict]]:
    """Chunk ``g``'s pointers as an ``(n, 3)`` array and its records, in pointer order."""
    ds, shard, offset = spec.source.chunk_arrays(g)
    return np.stack([ds, shard, offset], axis=1), read_records(spec.datasets, ds, shard, offset, f"chunk {g}")


def read_records(datasets, ds: np.ndarray, shard: np.ndarray, offset: np.ndarray, where: str) -> list[dict]:
    """The records at the pointers ``(ds, shard, offset)``, in pointer order (one read per shard)."""
    records: list = [None] * len(ds)
    order = np.lexsort((shard, ds))
    keys = np.stack([ds[order], shard[order]], axis=1)
    cuts = np.flatnonzero(np.any(np.diff(keys, axis=0) != 0, axis=1)) + 1
    for group in np.split(order, cuts):
        if not len(group):
            continue
        d, s = int(ds[group[0]]), int(shard[group[0]])
        dataset = datasets[d]
        try:
            got = dataset.read(s, offset[group])
        except Exception as exc:
            _note(exc, f"reading dataset {dataset.name!r}, shard {s}, {where}")
            raise
        for i, rec in zip(group.tolist(), got, strict=True):
            records[i] = rec
    return records


def compute_chunk(spec: PipelineSpec, g: int) -> ChunkOutput:
    """Read chunk ``g`` and apply the record operators, in chain order (pure)."""
    started, cpu = time.perf_counter(), time.thread_time()
    pointers, records = read_chunk(spec, g)
    return chunk_output(spec, g, pointers, records, time.perf_counter() - started, time.thread_time() - cpu)


def chunk_output(spec: PipelineSpec, g: int, pointers: np.ndarray, records: list[dict], seconds: float = 0.0,
                 cpu: float = 0.0) -> ChunkOutput:
    """:func:`compute_chunk` once chunk ``g`` is read (:func:`read_chunk`; ``seconds`` and ``cpu``: the
    read's, counted in the chunk's) (pure)."""
    started, cpu0 = time.perf_counter(), time.thread_time()
    out = apply_record_ops(spec.record_ops, spec.source.names, g, pointers, records)
    out.seconds, out.cpu = seconds + time.perf_counter() - started, cpu + time.thread_time() - cpu0
    return out


def apply_record_ops(record_ops, dataset_names: tuple[str, ...], g: int, pointers: np.ndarray,
                     records: list[dict]) -> ChunkOutput:
    """The record operators over ``records`` (at ``pointers``, labelled chunk ``g``), in chain
    order, as one document per output record (pure)."""
    ctx = ChunkContext(g, dataset_names, pointers, {"records": len(records)})
    rows = [Row(i, 0, rec) for i, rec in enumerate(records)]
    for op in record_ops:
        rows = op.apply_chunk(rows, ctx)

    arrays, masks = [], []
    for row in rows:
        tokens = row.record.get("tokens") if isinstance(row.record, dict) else None
        if tokens is None:
            raise MissingFieldError(
                f"record at {ctx.where(row.pointer)} has no 'tokens' after the stateless operators; "
                "add .tokenize() to the pipeline"
            )
        arrays.append(np.asarray(tokens))
        masks.append(row.record.get("loss_mask"))
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    lineage = np.zeros((len(rows), 5), dtype=np.int64)
    if rows:
        lineage[:, :3] = pointers[np.array([r.pointer for r in rows], dtype=np.int64)]
        lineage[:, 3] = [r.token_start for r in rows]
        lineage[:, 4] = lengths
    flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
    keep: dict = next((op.keep for op in record_ops if getattr(op, "keep", None)), {})
    fields = kept_fields(keep, [r.record for r in rows], ctx, [r.pointer for r in rows])
    return ChunkOutput(g, SampleTable.from_documents(flat, offsets, lineage, _loss_mask(masks, arrays, ctx, rows),
                                                     fields), ctx.stats)


def _loss_mask(masks: list, arrays: list[np.ndarray], ctx: ChunkContext, rows: list[Row]) -> np.ndarray | None:
    """The chunk's flat ``loss_mask`` when a record carries one (``tokenize_chat``), else ``None``;
    a record without one trains all its tokens."""
    if all(m is None for m in masks):
        return None
    parts = []
    for mask, tokens, row in zip(masks, arrays, rows, strict=True):
        if mask is None:
            parts.append(np.ones(len(tokens), np.uint8))
            continue
        mask = np.asarray(mask)
        if mask.shape != tokens.shape:
            raise DataFormatError(
                f"record at {ctx.where(row.pointer)}: 'loss_mask' has shape {mask.shape}, its 'tokens' "
                f"{tokens.shape}; a record operator must keep the two aligned"
            )
        parts.append((mask != 0).astype(np.uint8))
    return np.concatenate(parts)


def finish_window(spec: PipelineSpec, lane: int, window: int, chunk_outputs) -> WindowOutput:
    """Run the accumulators over a window's chunk outputs, in chunk order (pure)."""
    started, cpu = time.perf_counter(), time.thread_time()
    chunk_outputs = list(chunk_outputs)
    ctx = WindowContext(spec.seed, lane, window, spec.source.names,
                        allocated=sum((spec.source.chunk_counts(co.chunk) for co in chunk_outputs),
                                      np.zeros(len(spec.source.names), np.int64)))
    for co in chunk_outputs:
        for key, n in co.stats.items():
            ctx.count(key, n)
    table = SampleTable.concat([co.table for co in chunk_outputs])
    for op in spec.accumulators:
        try:
            table = op.apply(table, ctx)
        except Exception as exc:
            _note(exc, f"{op.name} failed in lane {lane}, window {window}")
            raise
    ctx.count("samples", len(table))
    seconds = time.perf_counter() - started + sum(co.seconds for co in chunk_outputs)
    cpu = time.thread_time() - cpu + sum(co.cpu for co in chunk_outputs)
    return WindowOutput(
        lane, window, tuple(co.chunk for co in chunk_outputs), table, dict(sorted(ctx.stats.items())),
        spec.source.names, Made(_here(), seconds, cpu),
    )


def compute_window(spec: PipelineSpec, lane: int, window: int) -> WindowOutput:
    """Lane ``lane``'s window ``window``, computed in this process (pure)."""
    chunks = spec.window_chunks(lane, window)
    outs = []
    for g in chunks:
        try:
            outs.append(compute_chunk(spec, g))
        except Exception as exc:
            _note(exc, f"lane {lane}, window {window}")
            raise
    return finish_window(spec, lane, window, outs)


def compute_windows(spec: PipelineSpec, members: tuple[tuple[int, int], ...]) -> tuple[WindowOutput, ...]:
    """The windows ``members`` (``(lane, window)`` pairs), in order, each by :func:`compute_window`
    (pure): several windows in one task give the bytes each gives alone."""
    return tuple(compute_window(spec, lane, window) for lane, window in members)
