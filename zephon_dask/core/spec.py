"""``PipelineSpec``: every data-defining setting, and its fingerprint. Immutable, pure.

The spec is what a window is a pure function of. Execution settings (runner,
workers, prefetch, fusion, retries, DP identity) are not part of it, so they
can never change a byte of the data or the fingerprint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..curriculum import MixtureWorkSource
from ..operators.base import Accumulator, RecordOp
from ..operators.identity import sha256_json
from ..options import DATA_OPTIONS, DEFAULTS

# data options added after the first format, recorded only when set otherwise, so the fingerprints
# (and checkpoints) of pipelines that leave them at their default stay as they were
OMITTED_AT_DEFAULT = ("drop_last_step",)

FORMAT = "zephon_dask.pipeline"
FORMAT_VERSION = 1


@dataclass(frozen=True, eq=False)
class PipelineSpec:
    """The work source, the operators, and one field per data option
    (:data:`~zephon_dask.options.DATA_OPTIONS`, same name): :meth:`of` fills them from a
    pipeline's settings and :meth:`config` records them, so a new data option is an ``Option``,
    a field here and the code that reads it."""

    source: MixtureWorkSource
    record_ops: tuple[RecordOp, ...]  # in chain order (tokenize among them)
    accumulators: tuple[Accumulator, ...]
    canonical_replicas: int
    flush_every_k_chunks: int
    drop_last_step: bool = True
    batch_ops: tuple[Any, ...] = ()  # map_batch: per lane batch, applied by the consumer

    @classmethod
    def of(cls, source: MixtureWorkSource, record_ops, accumulators, settings: Mapping[str, Any],
           batch_ops=()) -> PipelineSpec:
        """The spec of ``source`` and the operators, with the data options ``settings`` holds (a
        pipeline's settings, or another spec's :meth:`data_options`)."""
        return cls(source, tuple(record_ops), tuple(accumulators), **{n: settings[n] for n in DATA_OPTIONS},
                   batch_ops=tuple(batch_ops))

    def data_options(self) -> dict[str, Any]:
        """The data options' values, by name."""
        return {name: getattr(self, name) for name in DATA_OPTIONS}

    @property
    def datasets(self) -> tuple:
        return self.source.datasets

    @property
    def seed(self) -> int:
        return self.source.seed

    def config(self) -> dict:
        """JSON-native data configuration (what the fingerprint hashes)."""
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "source": self.source.config(),
            "operators": [op.spec() for op in (*self.record_ops, *self.accumulators)],
            **{k: v for k, v in self.data_options().items() if k not in OMITTED_AT_DEFAULT or v != DEFAULTS[k]},
            # only when set, so the fingerprints of pipelines without them stay as they were
            **({"batch_ops": [op.spec() for op in self.batch_ops]} if self.batch_ops else {}),
        }

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the canonical JSON of :meth:`config`."""
        return sha256_json(self.config())

    def window_chunks(self, lane: int, window: int) -> list[int]:
        return self.source.window(lane, window, self.canonical_replicas, self.flush_every_k_chunks)

    def num_windows(self, lane: int) -> int | None:
        return self.source.num_windows(lane, self.canonical_replicas, self.flush_every_k_chunks)


def has_tokens(source: MixtureWorkSource, record_ops) -> bool:
    """Whether records carry token ids after ``record_ops``: an operator makes them
    (``Operator.makes_tokens``), or every dataset of ``source`` is a token store."""
    return (all(getattr(d, "format", None) == "tokens" for d in source.datasets)
            or any(op.makes_tokens for op in record_ops))
