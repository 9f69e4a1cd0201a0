"""Operator contracts. Operators are immutable descriptions; applying one is pure.

Two kinds exist:

* :class:`RecordOp` (stateless): runs in chunk tasks, in pointer order, in
  parallel across chunks. It defines either ``apply(record) -> records`` (zero
  or more; the default ``apply_chunk`` calls it per row) or, to work on a whole
  chunk at once (e.g. batch tokenization), ``apply_chunk(rows, ctx) -> rows``.
* :class:`Accumulator`: sees a whole window's samples in order and returns the
  window's output samples. Starts empty at the window's start and is flushed
  at its end, so a window stays a pure function of (config, lane, window).

``spec()`` returns the JSON-native, data-defining description that enters the
pipeline fingerprint; execution settings never appear in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .table import SampleTable


class _Counters:
    stats: dict[str, int]

    def count(self, key: str, n: int) -> None:
        """Add ``n`` to the counter ``key`` (``stats()`` sums them over the run)."""
        self.stats[key] = self.stats.get(key, 0) + int(n)


@dataclass
class WindowContext(_Counters):
    """Where an accumulator runs, plus the window's counters (the only mutable part).

    ``allocated`` holds the samples of each dataset the curriculum put in the window's chunks
    (``None`` where unknown: a table built by hand)."""

    seed: int
    lane: int
    window: int
    dataset_names: tuple[str, ...]
    stats: dict[str, int] = field(default_factory=dict)
    allocated: np.ndarray | None = None


@dataclass
class ChunkContext(_Counters):
    """Where a record operator runs, plus the chunk's counters (the only mutable part).

    ``pointers`` holds the chunk's ``(dataset, shard, offset)`` rows in pointer order.
    """

    chunk: int
    dataset_names: tuple[str, ...]
    pointers: np.ndarray
    stats: dict[str, int] = field(default_factory=dict)

    def where(self, pointer: int) -> str:
        """``"dataset 'web', shard 3, offset 17 (chunk 5)"`` for pointer index ``pointer``."""
        d, s, o = self.pointers[pointer].tolist()
        return f"dataset {self.dataset_names[d]!r}, shard {s}, offset {o} (chunk {self.chunk})"


class Row(NamedTuple):
    """One record between record operators: its pointer index in the chunk, the offset of its
    first token in the source document (non-zero for a piece of a split one), the record."""

    pointer: int
    token_start: int
    record: dict


class Operator:
    """An operator's traits are class attributes, read by the layers above instead of its type:

    * ``one_to_one``: every input row gives exactly one output row, in a count that stays one
      sample of the mixture per row (``map``, ``decode_text``, ``tokenize`` without
      ``split_long``, ``shuffle``); schedules in global steps and step counts are then exact,
      else measured (see :func:`one_to_one`). False by default: a new operator is measured
      until it says otherwise;
    * ``makes_tokens``: its output records carry token ids (``tokenize``, ``tokenize_chat``), so
      ``pack``, ``shuffle``, ``stateful``, ``batch`` and a token-weighted mixture may follow;
      a pipeline has one such operator;
    * ``needs_tokens``: it reads token ids, so it goes after an operator that ``makes_tokens``
      (or on a token store). Every accumulator does (it sees a window's ``SampleTable``);
    * ``kind``: ``"stateless"`` runs per chunk, before every ``"accumulator"`` (per window).

    ``Pipeline.add_op`` places a user's operator by these traits and refuses a misplaced one.
    """

    kind: ClassVar[str]
    name: ClassVar[str]
    one_to_one: bool = False
    makes_tokens: bool = False
    needs_tokens: bool = False

    def spec(self) -> dict[str, Any]:  # pragma: no cover - every operator overrides it
        """The JSON-native settings that define the output (they enter the fingerprint)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.spec().items() if k != "op")
        return f"{type(self).__name__}({settings})"


class RecordOp(Operator):
    """Stateless: ``apply(record) -> records`` per record, or ``apply_chunk(rows, ctx) -> rows``."""

    kind = "stateless"

    def apply(self, record: dict) -> list[dict]:  # pragma: no cover - overridden
        """The records ``record`` becomes (none to drop it); a subclass overrides this or :meth:`apply_chunk`."""
        raise NotImplementedError(f"{type(self).__name__} defines neither apply nor apply_chunk")

    def apply_chunk(self, rows: list[Row], ctx: ChunkContext) -> list[Row]:
        """:meth:`apply` on each row in order (pure if ``apply`` is); each output record keeps its
        row's pointer and token start. Counts ``<name>.dropped`` (rows in minus rows out, zero
        included); an error gets a note naming the record."""
        out: list[Row] = []
        for row in rows:
            try:
                produced = self.apply(row.record)
            except Exception as exc:
                exc.add_note(f"zephon_dask: {self.name} failed on {ctx.where(row.pointer)}")
                raise
            out.extend(Row(row.pointer, row.token_start, rec) for rec in produced)
        ctx.count(f"{self.name}.dropped", len(rows) - len(out))
        return out


class Accumulator(Operator):
    """Stateful per window: ``apply(table, ctx) -> table``; nothing survives the call."""

    kind = "accumulator"
    needs_tokens = True

    def apply(self, table: SampleTable, ctx: WindowContext) -> SampleTable:  # pragma: no cover
        """The window's output samples from its input ``table`` (in order); a subclass overrides it."""
        raise NotImplementedError


def one_to_one(record_ops, accumulators) -> bool:
    """Whether every delivered row is exactly one sample of the mixture: every operator says so
    (``Operator.one_to_one``). An accumulator may still reorder rows inside a window."""
    return all(op.one_to_one for op in (*record_ops, *accumulators))
