"""Operator contracts. Operators are immutable descriptions; applying one is pure.

Two kinds exist (DESIGN.md section 5):

* :class:`RecordOp` (stateless): maps one record to zero or more records. Runs
  in chunk tasks, in pointer order, in parallel across chunks.
* :class:`Accumulator`: sees a whole window's samples in order and returns the
  window's output samples. Starts empty at the window's start and is flushed
  at its end, so a window stays a pure function of (config, lane, window).

``spec()`` returns the JSON-native, data-defining description that enters the
pipeline fingerprint; execution settings never appear in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .table import SampleTable


@dataclass
class WindowContext:
    """Where an accumulator runs, plus the window's counters (the only mutable part)."""

    seed: int
    lane: int
    window: int
    dataset_names: tuple[str, ...]
    stats: dict[str, int] = field(default_factory=dict)

    def count(self, key: str, n: int) -> None:
        self.stats[key] = self.stats.get(key, 0) + int(n)


class Operator:
    kind: ClassVar[str]
    name: ClassVar[str]

    def spec(self) -> dict[str, Any]:  # pragma: no cover - every operator overrides it
        raise NotImplementedError


class RecordOp(Operator):
    """Stateless: ``apply(record) -> list of records`` (possibly empty)."""

    kind = "stateless"

    def apply(self, record: dict) -> list[dict]:  # pragma: no cover - overridden
        raise NotImplementedError


class Accumulator(Operator):
    """Stateful per window: ``apply(table, ctx) -> table``; nothing survives the call."""

    kind = "accumulator"

    def apply(self, table: SampleTable, ctx: WindowContext) -> SampleTable:  # pragma: no cover
        raise NotImplementedError
