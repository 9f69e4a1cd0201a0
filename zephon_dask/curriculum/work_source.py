"""``MixtureWorkSource``: which samples are trained on, in what order, by which lane. Pure.

It does no I/O: datasets enter only through their ``name`` and
``shard_sizes``. Every answer (the pointers of chunk ``g``, the stream length,
lane ``l``'s ``j``-th chunk, a window's chunks) is computed directly from the
seed and the indices, never by walking earlier chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from functools import cached_property
from typing import NamedTuple, Protocol, cast

import numpy as np

from .. import views
from ..errors import (
    ChunkOutOfRangeError,
    ConfigError,
    DuplicateNameError,
    EmptyDatasetError,
    EndlessStreamError,
)
from ..validate import check_choice, check_int, check_keywords
from . import routing
from . import schedule as schedules
from .mixture import Mixture, exact_weight
from .order import DatasetOrder
from .read_order import READ_ORDERS, WITHIN_DATASET, dataset_sequence, within
from .repetition import Repetition
from .seeding import check_seed
from .token_weights import WEIGHT_BY, as_config, sample_weights, token_pins

MAX_CHUNK_SIZE = 1 << 24  # samples per chunk; larger ones do not fit one task's memory
DEFAULT_CHUNK_SIZE = 1024  # samples per chunk when none is given, at most (see .chunking)


class SizedDataset(Protocol):
    """What the curriculum needs of a dataset."""

    @property
    def name(self) -> str: ...

    @property
    def shard_sizes(self) -> Sequence[int]: ...


class Pointer(NamedTuple):
    """One sample: dataset name, shard index, offset within the shard."""

    dataset: str
    shard: int
    offset: int


class ChunkPointers(NamedTuple):
    """A chunk's pointers as parallel int64 arrays (dataset index, shard, offset)."""

    dataset: np.ndarray
    shard: np.ndarray
    offset: np.ndarray


class LaneChunks(Sequence):
    """Lazy sequence of the global chunk ids of one lane; O(1) per element (immutable)."""

    def __init__(self, source: MixtureWorkSource, lane: int, replicas: int):
        self._source, self.lane, self.replicas = source, lane, replicas

    def _chunk(self, j: int) -> int:
        src = self._source
        return j * self.replicas + routing.slot_of(
            self.lane, j, self.replicas, src.seed, src.lane_assignment
        )

    def _chunks(self, positions: range) -> list[int]:
        """:meth:`_chunk` of every position, in one vectorised pass."""
        src, j = self._source, np.arange(positions.start, positions.stop, positions.step, dtype=np.int64)
        slots = routing.slots_of(self.lane, j, self.replicas, src.seed, src.lane_assignment)
        return (j * self.replicas + slots).tolist()

    def __len__(self) -> int:
        total = self._source.num_chunks
        if total is None:
            raise EndlessStreamError(
                f"lane {self.lane} never ends (exhausted_policy='repeat'); index it lazily "
                "or set max_repeats"
            )
        return self._len

    @cached_property
    def _len(self) -> int:
        total = cast(int, self._source.num_chunks)
        full, rest = divmod(total, self.replicas)
        return full + (1 if rest and self._chunk(full) < total else 0)

    def _bounded(self) -> bool:
        return self._source.num_chunks is not None

    def __getitem__(self, j):
        if isinstance(j, slice):
            if j.stop is None and not self._bounded():
                raise EndlessStreamError(f"lane {self.lane} never ends; slice with a stop")
            n = len(self) if self._bounded() else j.stop
            return self._chunks(range(*j.indices(n)))
        j = int(j)
        if j < 0:
            j += len(self)
        if j < 0 or (self._bounded() and j >= len(self)):
            raise ChunkOutOfRangeError(f"lane {self.lane} has no chunk at position {j}")
        return self._chunk(j)

    def __iter__(self):
        j = 0
        n = len(self) if self._bounded() else None
        while n is None or j < n:
            yield self._chunk(j)
            j += 1

    def __repr__(self) -> str:
        size = len(self) if self._bounded() else "endless"
        return f"LaneChunks(lane={self.lane}, replicas={self.replicas}, len={size})"


@check_keywords
class MixtureWorkSource:
    """A weighted mixture of datasets cut into chunks and routed to lanes (immutable).

    Chunk ``g`` holds ``floor((g+1) * chunk_size * w) - floor(g * chunk_size * w)``
    samples of a dataset of weight ``w`` (exact fractions; the largest weight takes the
    remainder), in a seed-keyed order; block ``g // R`` gives each of the ``R`` lanes
    one chunk (see ``docs/concepts.md``). ``weights=None`` weighs datasets by sample count;
    otherwise pass ``{dataset name: weight}``. ``stop_after_passes=P`` ends the
    stream after the first chunk at which every dataset completed ``P``
    passes; ``exhausted_policy="stop"`` ends it before the first chunk that
    would need a sample beyond any dataset's first pass (``max_repeats`` more
    passes with ``"repeat"``; no ``max_repeats`` means the stream never ends). Each of
    ``exhausted_policy``, ``max_repeats`` and ``reshuffle_on_repeat`` also takes a dict by
    dataset name (see :mod:`.repetition`): the stream then ends before the first chunk that
    would need a sample past any dataset's own limit. ``read_order`` and ``within_dataset``
    choose the order of a chunk's records (see :mod:`.read_order`); never which records.
    ``weight_by="tokens"`` reads the weights as shares of tokens: each dataset's sample
    weight becomes ``weight / tokens_per_sample`` (exact), where ``tokens_per_sample``
    is given (one number for every dataset, or a dict) or measured, for the datasets it
    leaves out, by the :class:`~zephon_dask.Pipeline` the source goes into: on a fixed
    sample, or by ``measure(dataset) -> tokens per sample`` when given
    (:meth:`with_tokens_per_sample` gives the measured source).

    ``schedule=[(start, {name: weight}), ...]`` (instead of ``weights``) changes the
    weights at given starts (see :mod:`.schedule`): global training steps by default
    (``schedule_unit="step"``; a :class:`~zephon_dask.Pipeline` converts them into chunk
    starts and records them in ``phase_chunks``), or global chunk indices
    (``schedule_unit="chunk"``: exact, usable without a pipeline). With
    ``weight_by="tokens"`` every phase's weights are token shares, converted with the
    same ``tokens_per_sample``.

    ``chunk_size=None`` (the default) leaves the chunk size open: 1,024 here, and a
    :class:`~zephon_dask.Pipeline` chooses it from the data (:mod:`.chunking`): smaller
    when the stream would have fewer chunks than lanes. A schedule keeps 1,024.

    Example:
        >>> source = zephon_dask.MixtureWorkSource([web, code], {"web": 0.7, "code": 0.3},  # doctest: +SKIP
        ...                                        chunk_size=64, seed=1234)
    """

    def __init__(
        self,
        datasets: SizedDataset | Sequence[SizedDataset],
        weights: Mapping[str, float] | None = None,
        chunk_size: int | None = None,
        seed: int = 0,
        shuffle_shards: bool = True,
        shuffle_within_shard: bool = True,
        shuffle_block_size: int | None = None,
        stop_after_passes: int = 1,
        exhausted_policy: str | Mapping[str, str] | None = None,
        max_repeats: int | Mapping[str, int | None] | None = None,
        reshuffle_on_repeat: bool | Mapping[str, bool] = True,
        lane_assignment: str = "permute",
        weight_by: str = "samples",
        tokens_per_sample: float | Mapping[str, object] | None = None,
        schedule: Sequence | None = None,
        schedule_unit: str = "step",
        phase_chunks: Sequence[int] | None = None,
        read_order: str = "weighted_round_robin",
        within_dataset: str = "as_is",
        measure: Callable[[SizedDataset], float] | None = None,
    ):
        if hasattr(datasets, "shard_sizes"):
            datasets = [cast(SizedDataset, datasets)]
        self._arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.datasets: tuple = tuple(datasets)
        self.names: tuple[str, ...] = self._check_datasets(self.datasets)
        self.seed = check_seed(seed)
        self.auto_chunk_size = chunk_size is None  # open: a Pipeline chooses it (see .chunking)
        chunk_size = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        self.chunk_size = check_int(chunk_size, "chunk_size", 1, hint="e.g. chunk_size=1024")
        if self.chunk_size > MAX_CHUNK_SIZE:
            raise ConfigError(f"chunk_size={chunk_size!r} is too large: a chunk is read by one task at "
                              f"once; use at most {MAX_CHUNK_SIZE:,} (typical: 256 to 8192)")
        self.shuffle_shards = bool(shuffle_shards)
        self.shuffle_within_shard = bool(shuffle_within_shard)
        self.shuffle_block_size = check_int(shuffle_block_size, "shuffle_block_size", 1, optional=True,
                                            hint="None disables the block shuffle")
        self.lane_assignment = check_choice(lane_assignment, routing.LANE_ASSIGNMENTS, "lane_assignment")
        self.read_order = check_choice(read_order, READ_ORDERS, "read_order")
        self.within_dataset = check_choice(within_dataset, WITHIN_DATASET, "within_dataset")
        self.stop_after_passes = check_int(stop_after_passes, "stop_after_passes", 1, hint="e.g. 1")
        self.repetition = Repetition.parse(self.names, exhausted_policy, max_repeats, reshuffle_on_repeat,
                                           self.stop_after_passes)
        # the config forms: one value, or a dict by dataset name where the datasets differ
        self.exhausted_policy = self.repetition.exhausted_policy
        self.max_repeats = self.repetition.max_repeats
        self.reshuffle_on_repeat = self.repetition.reshuffle_on_repeat
        self.sizes = tuple(int(sum(d.shard_sizes)) for d in self.datasets)
        self.weight_by, self.token_pins = self._check_weight_by(weight_by, tokens_per_sample, measure)
        self.measure = measure
        self.tokens_per_sample: tuple[Fraction, ...] | None = (
            tuple(self.token_pins[n] for n in self.names) if len(self.token_pins) == len(self.names) else None)
        self.phases, self.schedule_unit, self.phase_chunks = self._check_schedule(
            schedule, schedule_unit, phase_chunks, weights)
        targets = ([self._normalised(self._raw_weights(weights))] if self.phases is None
                   else [p.weights for p in self.phases])
        self.target_weights: tuple[Fraction, ...] = targets[0]  # as stated (weight_by units); a schedule's first
        self._phase_weights: tuple[tuple[Fraction, ...], ...] | None = None  # sample weights, once measured
        self._mixture: Mixture | None = None  # without a schedule
        self._schedule: schedules.Schedule | None = None  # with one whose chunk starts are known
        if not self.unmeasured:
            self._phase_weights = tuple(self._sample_weights(t) for t in targets)
            if self.phases is None:
                self._mixture = Mixture(self._phase_weights[0], self.chunk_size, self.names)
            else:
                schedules.check_chunk_size(self._phase_weights, self.chunk_size)
                if self.phase_chunks is not None:
                    self._schedule = schedules.Schedule(self.phase_chunks, self._phase_weights,
                                                        self.chunk_size, self.names)
        self.orders = tuple(
            DatasetOrder(
                d.name,
                tuple(int(s) for s in d.shard_sizes),
                self.seed,
                self.shuffle_shards,
                self.shuffle_within_shard,
                self.shuffle_block_size,
                reshuffle,
            )
            for d, reshuffle in zip(self.datasets, self.repetition.reshuffles, strict=True)
        )
        if self._phase_weights is not None and self.repetition.per_dataset and not self.chooses_chunk_size:
            self.repetition.check_liveness(self.sizes, self._phase_weights, self.chunk_size)
        if self.resolved and not self.unmeasured and not self.chooses_chunk_size and self.num_chunks == 0:
            smallest = min(
                (c for c in range(len(self.names)) if self.weights[c] > 0),
                key=lambda c: self.sizes[c] / self.weights[c]
            )
            raise ConfigError(
                f"the stream has no chunk: one chunk of {self.chunk_size} needs more than the "
                f"{self.sizes[smallest]} samples of {self.names[smallest]!r} at its weight. "
                "Lower chunk_size or use stop_after_passes / exhausted_policy='repeat'"
            )
        if self._schedule is not None and self.num_chunks is not None and self._schedule.chunks[-1] >= self.num_chunks:
            p = len(self._schedule.chunks) - 1
            raise ConfigError(
                f"schedule phase {p} (start {self.phases[p].start} {self.schedule_unit}s) begins at chunk "
                f"{self._schedule.chunks[p]:,}, but the stream ends after {self.num_chunks:,} chunks: it would "
                "never be reached. Start it earlier, or lengthen the stream (stop_after_passes, "
                "exhausted_policy='repeat')"
            )

    # -- validation -------------------------------------------------------------

    @staticmethod
    def _check_datasets(datasets: tuple) -> tuple[str, ...]:
        if not datasets:
            raise ConfigError("MixtureWorkSource needs at least one dataset")
        names: list[str] = []
        for d in datasets:
            if not hasattr(d, "shard_sizes") or not isinstance(getattr(d, "name", None), str):
                raise ConfigError(f"{d!r} is not a dataset; build one with zephon_dask.Dataset")
            if d.name in names:
                raise DuplicateNameError(
                    f"two datasets are named {d.name!r}; give each a unique name"
                )
            if sum(d.shard_sizes) == 0:
                raise EmptyDatasetError(f"dataset {d.name!r} has no samples")
            names.append(d.name)
        return tuple(names)

    def _check_weight_by(self, weight_by, tokens_per_sample, measure) -> tuple[str, dict[str, Fraction]]:
        """``(weight_by, {dataset: tokens per sample given})``."""
        weight_by = check_choice(weight_by, WEIGHT_BY, "weight_by")
        if measure is not None and (weight_by != "tokens" or not callable(measure)):
            raise ConfigError(f"measure={measure!r} must be a function dataset -> tokens per sample, used "
                              "with weight_by='tokens'")
        if tokens_per_sample is None:
            return weight_by, {}
        if weight_by != "tokens":
            raise ConfigError("tokens_per_sample is only used with weight_by='tokens'; drop it or "
                              "set weight_by='tokens'")
        return weight_by, token_pins(tokens_per_sample, self.names)

    @property
    def unpinned(self) -> tuple[str, ...]:
        """The datasets whose tokens per sample are still to be measured (weighted by tokens)."""
        if self.weight_by != "tokens":
            return ()
        return tuple(n for n in self.names if n not in self.token_pins)

    def _check_schedule(self, schedule, unit, chunks, weights):
        """``(phases, unit, phase chunk starts)``: all ``None`` without a schedule."""
        if schedule is None:
            if chunks is not None:
                raise ConfigError("phase_chunks needs a schedule=; pass the schedule it resolves")
            return None, None, None
        if weights is not None:
            raise ConfigError("give weights= or schedule=, not both: the schedule's first phase holds "
                              "the starting weights")
        phases = schedules.parse(schedule, self.names, unit)
        if unit == "chunk":
            if chunks is not None and tuple(chunks) != tuple(p.start for p in phases):
                raise ConfigError(f"phase_chunks={list(chunks)} contradicts a chunk schedule's own starts")
            return phases, unit, tuple(p.start for p in phases)
        if chunks is not None:  # the Schedule checks their order and count
            chunks = tuple(check_int(g, "phase_chunks", 0, hint="a chunk index") for g in chunks)
        return phases, unit, chunks

    @property
    def chooses_chunk_size(self) -> bool:
        """Whether a Pipeline chooses the chunk size from the data: ``chunk_size=None`` and no schedule."""
        return self.auto_chunk_size and self.phases is None

    def with_chunk_size(self, chunk_size: int) -> MixtureWorkSource:
        """This source with ``chunk_size`` given (a new source)."""
        return MixtureWorkSource(**{**self._arguments, "chunk_size": chunk_size})

    def with_phase_chunks(self, chunks: Sequence[int]) -> MixtureWorkSource:
        """This source with its step schedule's phases starting at these global chunks (a new source)."""
        return MixtureWorkSource(**{**self._arguments, "phase_chunks": tuple(int(g) for g in chunks)})

    def phase_source(self, p: int) -> MixtureWorkSource:
        """Schedule phase ``p``'s weights alone, from chunk 0, never ending (a new source)."""
        if self.phases is None:
            raise ConfigError("phase_source() needs a schedule=")
        weights = dict(zip(self.names, self.phases[p].weights, strict=True))
        return MixtureWorkSource(**{**self._arguments, "schedule": [(0, weights)], "schedule_unit": "chunk",
                                    "phase_chunks": None, "stop_after_passes": 1, "exhausted_policy": "repeat",
                                    "max_repeats": None})

    def phase_of(self, g: int) -> int:
        """The schedule phase that owns chunk ``g`` (0 without a schedule)."""
        return 0 if self.phases is None else self._resolved_schedule().phase_of(g)

    def _raw_weights(self, weights):
        if weights is None:
            return [exact_weight(n, name) for n, name in zip(self.sizes, self.names, strict=True)]
        if not isinstance(weights, Mapping):
            raise ConfigError(
                f"weights={weights!r} must be a dict by dataset name, e.g. "
                f"{{{self.names[0]!r}: 1.0}}, or None for weights proportional to size"
            )
        unknown = sorted(set(map(str, weights)) - set(self.names))
        missing = [n for n in self.names if n not in weights]
        if unknown or missing:
            raise ConfigError(
                f"weights do not match the datasets: unknown {unknown}, missing {missing}; "
                f"the datasets are {list(self.names)}"
            )
        return [exact_weight(weights[n], n) for n in self.names]

    # -- weights and allocation ----------------------------------------------------

    @staticmethod
    def _normalised(raw: Sequence[Fraction]) -> tuple[Fraction, ...]:
        total = sum(raw, Fraction(0))
        return tuple(w / total for w in raw)

    def _sample_weights(self, targets: Sequence[Fraction]) -> tuple[Fraction, ...]:
        """The normalised sample weights that give the shares ``targets`` (``weight_by`` units):
        ``targets`` themselves for samples, ``t_c / s_c`` normalised for tokens. Every mixture
        and schedule phase is converted here."""
        if self.tokens_per_sample is None:
            return tuple(targets)
        return self._normalised(sample_weights(targets, self.tokens_per_sample))

    @property
    def unmeasured(self) -> bool:
        """Weighted by tokens with no tokens per sample yet: no chunk can be computed."""
        return self.weight_by == "tokens" and self.tokens_per_sample is None

    @property
    def resolved(self) -> bool:
        """Whether every phase start is known: no schedule, or one whose starts are chunks."""
        return self.phases is None or self.phase_chunks is not None

    @property
    def phase_weights(self) -> tuple[tuple[Fraction, ...], ...]:
        """Each schedule phase's normalised sample weights (one entry without a schedule): the
        stated weights (:attr:`target_weights`, ``phases[p].weights``) converted by ``weight_by``."""
        self._require_measured()
        assert self._phase_weights is not None
        return self._phase_weights

    def _require_measured(self) -> None:
        if self.unmeasured:
            raise ConfigError(
                "this MixtureWorkSource weighs by tokens and its tokens per sample are not measured: "
                "a Pipeline measures them on first use (use pipeline.spec.source), or pass "
                "tokens_per_sample={name: tokens} to MixtureWorkSource"
            )

    @property
    def weights(self) -> tuple[Fraction, ...]:
        """Normalised sample weights: the share of each chunk's samples per dataset (with a
        schedule, its first phase's)."""
        return self.phase_weights[0]

    @property
    def mixture(self) -> Mixture | None:
        """The sample allocation ``A_c(g)`` without a schedule (``None`` with one: see :attr:`schedule`)."""
        self._require_measured()
        return self._mixture

    @property
    def schedule(self) -> schedules.Schedule | None:
        """The sample allocation across phases once their chunk starts are known (else ``None``)."""
        self._require_measured()
        return self._schedule

    def _resolved_schedule(self) -> schedules.Schedule:
        if self.schedule is None:
            raise ConfigError(
                "this source's schedule starts at global steps, which depend on the batch shape: a "
                "Pipeline converts them into chunk starts (pipeline.spec.source is resolved), or give "
                "phase_chunks=[...] / schedule_unit='chunk' (see docs/concepts.md, mixture schedules)"
            )
        return self.schedule

    def _allocated(self, g: int) -> list[int]:
        """``[A_c(g) for c]``: the mixture's, or the schedule's across phases."""
        if self.mixture is not None:
            return self.mixture.allocated(g)
        return self._resolved_schedule().allocated(g)

    def with_tokens_per_sample(self, tokens_per_sample: float | Mapping[str, object]) -> MixtureWorkSource:
        """The same token-weighted mixture with these tokens per sample (a new source): one number,
        or a dict merged over this source's pins (a dataset in both takes the new value)."""
        if self.weight_by != "tokens":
            raise ConfigError("with_tokens_per_sample() needs a source with weight_by='tokens'")
        if isinstance(tokens_per_sample, Mapping):
            tokens_per_sample = {**self.token_pins, **tokens_per_sample}
        complete = not isinstance(tokens_per_sample, Mapping) or all(n in tokens_per_sample for n in self.names)
        return MixtureWorkSource(**{**self._arguments, "tokens_per_sample": tokens_per_sample,
                                    "measure": None if complete else self.measure})

    # -- stream length ----------------------------------------------------------

    @cached_property
    def num_chunks(self) -> int | None:
        """Chunks in the stream, or ``None`` when it never ends."""
        rep = self.repetition
        if rep.policies[0] is not None and not rep.bounded:
            return None
        if rep.policies[0] is None:
            need = [self.stop_after_passes * n for n in self.sizes]
            if self.schedule is not None:
                self._check_reaches(need)
            return _first_true(
                lambda g: all(a >= b for a, b in zip(self._allocated(g), need, strict=True))
            )
        limit = rep.limits(self.sizes)
        if self.schedule is not None:
            self._check_ends(limit)
        too_far = _first_true(
            lambda g: any(a > b for a, b in zip(self._allocated(g), limit, strict=True))
        )
        return too_far - 1

    def _check_reaches(self, need: list[int]) -> None:
        """Refuse a schedule whose last phase leaves out a dataset that still owes passes."""
        assert self.schedule is not None
        for name, have, want in zip(self.names, self.schedule.final_limit(), need, strict=True):
            if have < want:
                raise ConfigError(
                    f"the stream would never end: stop_after_passes={self.stop_after_passes} waits for "
                    f"{want:,} samples of {name!r}, but the schedule's last phase gives it weight 0 after "
                    f"{int(have):,}. Give it a weight in the last phase, or use exhausted_policy='stop'")

    def _check_ends(self, limit: list[float]) -> None:
        """Refuse a schedule whose last phase leaves out every dataset that limits the stream while
        the others repeat without limit: the stream would never reach its end."""
        assert self.schedule is not None
        final = self.schedule.final_limit()
        if any(have > cap for have, cap in zip(final, limit, strict=True)):
            return
        bounded = [n for n, cap in zip(self.names, limit, strict=True) if cap != float("inf")]
        raise ConfigError(
            f"the stream would never end: {bounded} end it (exhausted_policy / max_repeats), but the "
            "schedule's last phase gives them weight 0 before their limit and the other datasets repeat "
            "without limit. Give one of them a weight in the last phase, or set max_repeats for the others")

    def length_status(self) -> tuple[str, str]:
        """The stream length in words, ``(in a sentence, in a "chunks" table cell)``; pure. Once
        known: ``"N chunks"`` / ``"N"`` (or ``"endless"``); before: what it waits for, a Pipeline
        measuring tokens per sample or converting a step schedule into chunk starts."""
        if self.unmeasured:
            return ("tokens per sample not measured",
                    "tokens per sample not measured (a Pipeline measures them)")
        if not self.resolved:
            return "length set by a Pipeline", "set by a Pipeline (the schedule starts at global steps)"
        if self.num_chunks is None:
            return "endless", "endless"
        return f"{self.num_chunks} chunks", f"{self.num_chunks:,}"

    def __len__(self) -> int:
        if self.num_chunks is None:
            raise EndlessStreamError(
                "this stream never ends (exhausted_policy='repeat'); use num_chunks (None) or "
                "set max_repeats"
            )
        return self.num_chunks

    # -- chunks -----------------------------------------------------------------

    def _check_chunk(self, g: int) -> int:
        g = int(g)
        if g < 0 or (self.num_chunks is not None and g >= self.num_chunks):
            raise ChunkOutOfRangeError(
                f"chunk {g} is outside the stream of {self.num_chunks} chunks"
            )
        return g

    def allocation(self, g: int) -> dict[str, int]:
        """``{dataset: samples consumed by chunks 0..g-1}``."""
        return dict(zip(self.names, self._allocated(g), strict=True))

    def chunk_arrays(self, g: int) -> ChunkPointers:
        """Chunk ``g``'s pointers as arrays, in their interleaved order."""
        g = self._check_chunk(g)
        lo, hi = self._allocated(g), self._allocated(g + 1)
        seq = dataset_sequence([b - a for a, b in zip(lo, hi, strict=True)], self.read_order, self.seed, g)
        shard = np.empty(len(seq), dtype=np.int64)
        offset = np.empty(len(seq), dtype=np.int64)
        for c, order in enumerate(self.orders):
            if hi[c] > lo[c]:
                sel = np.flatnonzero(seq == c)
                positions = within(lo[c], hi[c], self.within_dataset, self.seed, g, c)
                shard[sel], offset[sel] = order.locate(positions)
        return ChunkPointers(seq.astype(np.int64), shard, offset)

    def chunk_counts(self, g: int) -> np.ndarray:
        """Chunk ``g``'s records of each dataset (``int64``, in ``names`` order): the dataset
        counts of :meth:`chunk_arrays`, without locating a single record."""
        g = self._check_chunk(g)
        return np.subtract(self._allocated(g + 1), self._allocated(g), dtype=np.int64)

    def chunk(self, g: int) -> list[Pointer]:
        """Chunk ``g``'s pointers, each a ``Pointer(dataset, shard, offset)``."""
        ds, sh, off = self.chunk_arrays(g)
        names = self.names
        return [
            Pointer(names[d], s, o)
            for d, s, o in zip(ds.tolist(), sh.tolist(), off.tolist(), strict=True)
        ]

    # -- lanes and windows --------------------------------------------------------

    def lane_of(self, g: int, canonical_replicas: int) -> int:
        """The lane that owns chunk ``g``."""
        routing.check_replicas(canonical_replicas)
        return routing.lane_of(self._check_chunk(g), canonical_replicas, self.seed, self.lane_assignment)

    def lane_chunks(self, lane: int, canonical_replicas: int) -> LaneChunks:
        """Lane ``lane``'s global chunk ids, lazily."""
        routing.check_replicas(canonical_replicas)
        if not 0 <= lane < canonical_replicas:
            raise ConfigError(f"lane={lane} is outside 0..{canonical_replicas - 1}")
        chunks = self._lanes.get((lane, canonical_replicas))
        if chunks is None:  # kept: a lane's length is computed once, not for every window asked for
            chunks = self._lanes[lane, canonical_replicas] = LaneChunks(self, lane, canonical_replicas)
        return chunks

    @cached_property
    def _lanes(self) -> dict[tuple[int, int], LaneChunks]:
        return {}

    def window(self, lane: int, w: int, canonical_replicas: int, k: int) -> list[int]:
        """Global chunk ids of lane ``lane``'s window ``w`` (``k`` chunks; the last may be short)."""
        k = check_int(k, "flush_every_k_chunks", 1, hint="e.g. 8")
        chunks = self.lane_chunks(lane, canonical_replicas)
        windows = self.num_windows(lane, canonical_replicas, k)  # None for an endless stream
        if w < 0 or (windows is not None and w >= windows):
            raise ChunkOutOfRangeError(f"lane {lane} has no window {w}")
        return chunks[w * k : (w + 1) * k]

    def num_windows(self, lane: int, canonical_replicas: int, k: int) -> int | None:
        """Windows of lane ``lane``, or ``None`` for an endless stream."""
        if self.num_chunks is None:
            return None
        return -(-len(self.lane_chunks(lane, canonical_replicas)) // k)

    def group_lanes(self, canonical_replicas: int, dp_degree: int, mapping: str = "contiguous"):
        """Lanes owned by each DP group."""
        return routing.group_lanes(routing.check_replicas(canonical_replicas), dp_degree, mapping)

    def plan(self, canonical_replicas: int, dp_degree: int, mapping: str = "contiguous") -> routing.Plan:
        """The lane-to-group assignment table."""
        return routing.plan(canonical_replicas, dp_degree, mapping)

    # -- identity -----------------------------------------------------------------

    def with_seed(self, seed: int) -> MixtureWorkSource:
        """The same mixture under another seed (a new source; this one is unchanged)."""
        return MixtureWorkSource(**{**self._arguments, "seed": seed})

    def config(self) -> dict:
        """JSON-native description of every data-defining setting."""
        return {
            "datasets": [
                d.identity() if hasattr(d, "identity") else {"name": d.name, "shard_sizes": list(d.shard_sizes)}
                for d in self.datasets
            ],
            "weights": as_config(self.names, self.target_weights),
            "chunk_size": self.chunk_size,
            "seed": self.seed,
            "shuffle_shards": self.shuffle_shards,
            "shuffle_within_shard": self.shuffle_within_shard,
            "shuffle_block_size": self.shuffle_block_size,
            "stop_after_passes": self.stop_after_passes,
            "exhausted_policy": self.exhausted_policy,
            "max_repeats": self.max_repeats,
            "reshuffle_on_repeat": self.reshuffle_on_repeat,
            "lane_assignment": self.lane_assignment,
            # absent at their defaults: the configs (and fingerprints) written before they existed
            **({} if self.read_order == "weighted_round_robin" else {"read_order": self.read_order}),
            **({} if self.within_dataset == "as_is" else {"within_dataset": self.within_dataset}),
            # absent means samples: the configs (and fingerprints) written before weight_by existed
            **({} if self.weight_by == "samples" else {
                "weight_by": self.weight_by,
                "tokens_per_sample": None if self.tokens_per_sample is None
                else as_config(self.names, self.tokens_per_sample),
            }),
            **({} if self.phases is None else {"schedule": self.schedule_config()}),
        }

    def schedule_config(self) -> list[dict]:
        """The schedule's phases, JSON-native: ``{"step" or "chunk", "chunk", "weights"}`` each
        (``"chunk"`` is ``None`` while a step schedule is unresolved)."""
        phases = self.phases or ()
        chunks = self.phase_chunks or (None,) * len(phases)
        return [{**({"step": p.start} if self.schedule_unit == "step" else {}), "chunk": g,
                 "weights": as_config(self.names, p.weights)}
                for p, g in zip(phases, chunks, strict=True)]

    def __repr__(self) -> str:
        mix = ", ".join(f"{n}={float(w):.3g}" for n, w in zip(self.names, self.target_weights, strict=True))
        if self.weight_by == "tokens":
            mix += " of tokens"
        size, _ = self.length_status()
        phases = "" if self.phases is None else f", {len(self.phases)} phases"
        chunk = "auto" if self.chooses_chunk_size else self.chunk_size
        return f"MixtureWorkSource({mix}; chunk_size={chunk}, seed={self.seed}, {size}{phases})"

    def _repr_html_(self) -> str:
        return views.show("source_html", self)


def _first_true(pred) -> int:
    """Smallest ``g >= 0`` with ``pred(g)`` for a monotone predicate (exponential + binary search)."""
    if pred(0):
        return 0
    lo, hi = 0, 1
    while not pred(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if pred(mid) else (mid, hi)
    return hi
