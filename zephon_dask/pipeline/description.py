"""``Description``: what a pipeline was built with besides its work source. Holds no state (a frozen value).

The builder makes one per pipeline; the :class:`~zephon_dask.pipeline.session.Session`
receives it whole, and the inspectors, adapters and checks read its fields
(``pipeline.description``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..consumer.batch import BatchOptions
from ..operators.base import Accumulator, RecordOp


@dataclass(frozen=True, eq=False)
class Description:
    """The record operators, accumulators, batch shape and settings of a pipeline.

    Attributes:
        record_ops: the record operators (``map``, ``filter``, ``tokenize``, ...), in order; each
            runs per chunk.
        accumulators: the window accumulators (``shuffle``, ``pack``, ``stateful``), in order.
        batch: the batch shape and fields set by ``batch()`` (a
            :class:`~zephon_dask.consumer.BatchOptions`).
        settings: every option's value (read-only): data, step and execution settings; unset
            options hold their defaults from :data:`zephon_dask.options.OPTIONS`.
        batch_ops: the ``map_batch`` functions, in order; each runs on a lane batch once cut.

    Example:
        >>> pipeline.description.settings["canonical_replicas"]  # doctest: +SKIP
        8
    """

    record_ops: tuple[RecordOp, ...]
    accumulators: tuple[Accumulator, ...]
    batch: BatchOptions
    settings: Mapping[str, Any]
    batch_ops: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        """The settings, a copy, read-only."""
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))

    def __reduce__(self):
        """Pickled with plain settings (a read-only view does not pickle): a DataLoader started
        by ``spawn`` or ``forkserver`` sends its dataset, and so this, to each worker."""
        return Description, (self.record_ops, self.accumulators, self.batch, dict(self.settings), self.batch_ops)
