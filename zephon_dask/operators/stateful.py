"""User accumulators: ``.stateful(name, init, push, flush)``. Pure if the user's functions are.

``init()`` makes a fresh state at each window's start; ``push(state, sample)``
returns the samples to emit now (any iterable, possibly empty);
``flush(state)`` returns what is left at the window's end. The state object
never outlives one window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from ..errors import ConfigError
from .base import Accumulator, WindowContext
from .identity import check_pins, function_identity
from .table import MASK_DTYPE, TOKEN_DTYPE, SampleTable, concat_fields


class Sample(NamedTuple):
    """One sample as the user's accumulator sees it."""

    tokens: np.ndarray
    positions: np.ndarray
    document_ids: np.ndarray
    lineage: np.ndarray  # rows of (dataset, shard, offset, token_start, token_count)
    loss_mask: np.ndarray | None = None  # 0/1 per token (``tokenize_chat``); None: all trained
    fields: dict | None = None  # kept field name -> one value per lineage row (``tokenize(keep=)``)


def to_samples(table: SampleTable) -> list[Sample]:
    o, lo, m = table.offsets, table.lineage_offsets, table.loss_mask
    return [
        Sample(table.tokens[o[i]:o[i + 1]], table.positions[o[i]:o[i + 1]],
               table.document_ids[o[i]:o[i + 1]], table.lineage[lo[i]:lo[i + 1]],
               None if m is None else m[o[i]:o[i + 1]], table.fields_at(slice(lo[i], lo[i + 1])))
        for i in range(len(table))
    ]


def from_samples(samples: list[Sample]) -> SampleTable:
    if not samples:
        return SampleTable.empty()
    lengths = np.array([len(s.tokens) for s in samples], dtype=np.int64)
    nlin = np.array([len(s.lineage) for s in samples], dtype=np.int64)
    mask = None
    if any(s.loss_mask is not None for s in samples):  # a sample without one trains every real token
        mask = np.concatenate([
            (np.asarray(s.document_ids) >= 0).astype(MASK_DTYPE) if s.loss_mask is None
            else np.asarray(s.loss_mask, MASK_DTYPE) for s in samples
        ])
    return SampleTable(
        np.concatenate([np.asarray(s.tokens, TOKEN_DTYPE) for s in samples]),
        np.concatenate(([0], np.cumsum(lengths))),
        np.concatenate([np.asarray(s.positions, TOKEN_DTYPE) for s in samples]),
        np.concatenate([np.asarray(s.document_ids, TOKEN_DTYPE) for s in samples]),
        np.concatenate([np.asarray(s.lineage, np.int64).reshape(-1, 5) for s in samples]),
        np.concatenate(([0], np.cumsum(nlin))),
        mask,
        concat_fields([s.fields for s in samples]),
    )


class Stateful(Accumulator):
    name = "stateful"

    def __init__(self, name: str, init: Callable[[], object],
                 push: Callable[[object, Sample], Iterable[Sample]],
                 flush: Callable[[object], Iterable[Sample]], version=None):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"stateful(name={name!r}): give the accumulator a unique name")
        for label, fn in (("init", init), ("push", push), ("flush", flush)):
            if not callable(fn):
                raise ConfigError(f"stateful({name!r}): {label}={fn!r} is not callable")
        check_pins(None, version, "stateful")
        self.label, self.init, self.push, self.flush, self.version = name, init, push, flush, version

    def spec(self) -> dict:
        return {
            "op": "stateful",
            "name": self.label,
            "version": self.version,
            "init": function_identity(self.init, version=self.version),
            "push": function_identity(self.push, version=self.version),
            "flush": function_identity(self.flush, version=self.version),
        }

    def apply(self, table: SampleTable, ctx: WindowContext) -> SampleTable:
        state = self.init()
        out: list[Sample] = []
        for sample in to_samples(table):
            out.extend(self.push(state, sample))
        out.extend(self.flush(state))
        return from_samples([Sample(*s) for s in out])
