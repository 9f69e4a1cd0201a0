"""The pure window function: ``compute_window(spec, lane, window) -> WindowOutput``.

A window is computed in two stages that map one-to-one onto Dask tasks:

* ``compute_chunk(spec, g)``: read chunk ``g``'s pointers and run the
  stateless operators, giving one document per output record;
* ``finish_window(spec, lane, window, chunk_tables)``: concatenate the chunk
  outputs in chunk order and run the accumulators, which start empty here and
  are flushed at the end.

Neither uses Dask, torch, a clock or global state: the same inputs give the
same bytes in any process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import DataFormatError, FieldTypeError, MissingFieldError, ZephonError
from ..operators.base import WindowContext
from ..operators.table import SampleTable
from ..operators.tokenize import Tokenize
from .spec import PipelineSpec


@dataclass(eq=False)
class ChunkOutput:
    """Documents of one chunk after the stateless operators (a value)."""

    chunk: int
    table: SampleTable
    stats: dict[str, int] = field(default_factory=dict)

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
        return self.table.digest()


def _note(exc: BaseException, text: str) -> None:
    exc.add_note(f"zephon_dask: {text}")


def read_chunk(spec: PipelineSpec, g: int) -> tuple[np.ndarray, list[dict]]:
    """Chunk ``g``'s pointers as an ``(n, 3)`` array and its records, in pointer order."""
    ds, shard, offset = spec.source.chunk_arrays(g)
    records: list = [None] * len(ds)
    order = np.lexsort((shard, ds))
    keys = np.stack([ds[order], shard[order]], axis=1)
    cuts = np.flatnonzero(np.any(np.diff(keys, axis=0) != 0, axis=1)) + 1
    for group in np.split(order, cuts):
        if not len(group):
            continue
        d, s = int(ds[group[0]]), int(shard[group[0]])
        dataset = spec.datasets[d]
        try:
            got = dataset.read(s, offset[group])
        except Exception as exc:
            _note(exc, f"reading dataset {dataset.name!r}, shard {s}, chunk {g}")
            raise
        for i, rec in zip(group.tolist(), got, strict=True):
            records[i] = rec
    return np.stack([ds, shard, offset], axis=1), records


def compute_chunk(spec: PipelineSpec, g: int) -> ChunkOutput:
    """Read chunk ``g`` and apply the stateless operators (pure)."""
    pointers, records = read_chunk(spec, g)
    names = spec.source.names
    stats = {"records": len(records)}
    # items: [pointer index, token start, record]
    items = [[i, 0, rec] for i, rec in enumerate(records)]

    def where(i: int) -> str:
        d, s, o = pointers[i].tolist()
        return f"dataset {names[d]!r}, shard {s}, offset {o} (chunk {g})"

    for op in spec.record_ops:
        if isinstance(op, Tokenize):
            items = _tokenize(op, items, where, stats)
            continue
        out = []
        for item in items:
            try:
                produced = op.apply(item[2])
            except Exception as exc:
                _note(exc, f"{op.name} failed on {where(item[0])}")
                raise
            out.extend([item[0], item[1], rec] for rec in produced)
        stats[f"{op.name}.dropped"] = stats.get(f"{op.name}.dropped", 0) + len(items) - len(out)
        items = out

    arrays = []
    for item in items:
        tokens = item[2].get("tokens") if isinstance(item[2], dict) else None
        if tokens is None:
            raise MissingFieldError(
                f"record at {where(item[0])} has no 'tokens' after the stateless operators; "
                "add .tokenize() to the pipeline"
            )
        arrays.append(np.asarray(tokens))
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    idx = np.array([it[0] for it in items], dtype=np.int64)
    lineage = np.zeros((len(items), 5), dtype=np.int64)
    if len(items):
        lineage[:, :3] = pointers[idx]
        lineage[:, 3] = [it[1] for it in items]
        lineage[:, 4] = lengths
    flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
    return ChunkOutput(g, SampleTable.from_documents(flat, offsets, lineage), stats)


def _tokenize(op: Tokenize, items: list, where, stats: dict) -> list:
    """Encode the records' text field. A record without the field, with a value that is not a
    ``str``, with text that is not valid Unicode, or on which the tokenizer fails, is named
    exactly (dataset, shard, offset) in a typed error whose message survives pickling."""
    texts = []
    for item in items:
        rec = item[2]
        if op.field not in rec:
            raise MissingFieldError(
                f"record at {where(item[0])} has no field {op.field!r} (fields: {sorted(rec)}); "
                "pass tokenize(field=...)"
            )
        text = rec[op.field]
        if not isinstance(text, str):
            raise FieldTypeError(
                f"record at {where(item[0])}: field {op.field!r} is {type(text).__name__} "
                f"{_short(text)}, not a string; fix the data, or turn it into text with .map(...) "
                "(or .decode_text() for bytes) before .tokenize()"
            )
        texts.append(text)
    try:
        arrays, owners, starts, truncated = op.encode_documents(texts)
    except Exception:
        _raise_for_culprit(op, items, texts, where)
        raise
    if truncated:
        stats["tokenize.truncated_tokens"] = stats.get("tokenize.truncated_tokens", 0) + truncated
    out = []
    for arr, owner, start in zip(arrays, owners, starts, strict=True):
        src = items[owner]
        out.append([src[0], src[1] + start, {**src[2], "tokens": arr}])
    return out


def _raise_for_culprit(op: Tokenize, items: list, texts: list[str], where) -> None:
    """After a batch encode failed: encode text by text and raise for the first one that fails,
    naming its record (returns if none fails alone; the caller re-raises the batch's error)."""
    for item, text in zip(items, texts, strict=True):
        try:
            op.encode_documents([text])
        except UnicodeError as exc:
            raise DataFormatError(
                f"record at {where(item[0])}: field {op.field!r} is not valid Unicode ({exc}); "
                "clean the text, e.g. .map(lambda r: {**r, 'text': r['text'].encode('utf-8', "
                "'replace').decode()})"
            ) from None
        except Exception as exc:
            if isinstance(exc, ZephonError):
                raise type(exc)(f"record at {where(item[0])}: {exc}") from None
            _note(exc, f"tokenize failed on the record at {where(item[0])}")
            raise


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def finish_window(spec: PipelineSpec, lane: int, window: int, chunk_outputs) -> WindowOutput:
    """Run the accumulators over a window's chunk outputs, in chunk order (pure)."""
    chunk_outputs = list(chunk_outputs)
    ctx = WindowContext(spec.seed, lane, window, spec.source.names)
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
    return WindowOutput(
        lane, window, tuple(co.chunk for co in chunk_outputs), table, dict(sorted(ctx.stats.items())),
        spec.source.names,
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
