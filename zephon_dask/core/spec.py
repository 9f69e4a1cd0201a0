"""``PipelineSpec``: every data-defining setting, and its fingerprint. Immutable, pure.

The spec is what a window is a pure function of. Execution settings (runner,
workers, prefetch, fusion, retries, DP identity) are not part of it, so they
can never change a byte of the data or the fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..curriculum import MixtureWorkSource
from ..operators.base import Accumulator, RecordOp
from ..operators.identity import sha256_json

FORMAT = "zephon_dask.pipeline"
FORMAT_VERSION = 1


@dataclass(frozen=True, eq=False)
class PipelineSpec:
    source: MixtureWorkSource
    record_ops: tuple[RecordOp, ...]  # in chain order (tokenize among them)
    accumulators: tuple[Accumulator, ...]
    canonical_replicas: int
    flush_every_k_chunks: int

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
            "canonical_replicas": self.canonical_replicas,
            "flush_every_k_chunks": self.flush_every_k_chunks,
        }

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the canonical JSON of :meth:`config`."""
        return sha256_json(self.config())

    def window_chunks(self, lane: int, window: int) -> list[int]:
        return self.source.window(lane, window, self.canonical_replicas, self.flush_every_k_chunks)

    def num_windows(self, lane: int) -> int | None:
        return self.source.num_windows(lane, self.canonical_replicas, self.flush_every_k_chunks)
