"""Mixture schedules: weights that change at given chunks. Pure.

A schedule is a list of phases ``(start, {dataset: weight})``. Phase ``p``
owns the chunks ``[g_p, g_{p+1})`` (``g_0 = 0``; the last phase never ends),
and inside it the allocation is phase ``p``'s own :class:`Mixture` counted
from the phase's first chunk::

    A_c(g) = A_c(g_p) + Mixture_p.allocated(g - g_p)    for g_p <= g < g_{p+1}

so ``A_c`` stays exact, non-decreasing and ``sum_c A_c(g) == g * chunk_size``
across phases, and chunk ``g`` is still found in O(phases). Each dataset's
sample order is unchanged: a dataset absent from the early phases (weight 0)
starts at its sample 0 when its first phase begins.

A phase's ``start`` is in the schedule's unit: ``"chunk"`` (a global chunk
index: exact) or ``"step"`` (a global training step, which a
:class:`~zephon_dask.Pipeline` converts into a chunk start; see
``docs/concepts.md``). :func:`parse` validates a user's schedule;
:class:`Schedule` is the allocation once every start is a chunk.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple

from ..errors import ConfigError
from .mixture import Mixture, exact_weight

UNITS = ("step", "chunk")


class Phase(NamedTuple):
    """One phase as the user gave it: its start (in the schedule's unit) and normalised weights
    (one per dataset, in dataset order; 0 for a dataset the phase leaves out) in the source's
    ``weight_by`` unit: token shares for ``weight_by="tokens"``, converted to sample weights
    before they reach a :class:`Schedule`."""

    start: int
    weights: tuple[Fraction, ...]


def _weight(value: object, name: str, where: str) -> Fraction:
    """A schedule weight: like :func:`exact_weight`, but 0 is allowed (the dataset sits the phase out)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and value == 0:
        return Fraction(0)
    try:
        return exact_weight(value, name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc} (a schedule also accepts 0: the dataset sits the phase out)") from None


def parse(schedule: object, names: Sequence[str], unit: str) -> tuple[Phase, ...]:
    """Validate ``[(start, {name: weight}), ...]`` against the dataset ``names``; normalise weights.

    Raises :class:`ConfigError` naming the value and the fix: not a list of pairs, a first
    phase not at 0, starts not strictly increasing (or repeated), a negative or non-int
    start, an unknown dataset, a negative or non-number weight, a phase without a positive
    weight.
    """
    if unit not in UNITS:
        raise ConfigError(f"schedule_unit={unit!r} is unknown; choose 'step' (global training steps) "
                          "or 'chunk' (global chunk indices)")
    if isinstance(schedule, str | bytes | Mapping) or not isinstance(schedule, Sequence) or not schedule:
        raise ConfigError(f"schedule={schedule!r} must be a non-empty list of (start {unit}, "
                          f"{{dataset: weight}}) pairs, e.g. [(0, {{{names[0]!r}: 1.0}})]")
    phases: list[Phase] = []
    for i, entry in enumerate(schedule):
        where = f"schedule[{i}]"
        if isinstance(entry, str | bytes) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise ConfigError(f"{where} = {entry!r} must be a pair (start {unit}, {{dataset: weight}})")
        start, weights = entry
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ConfigError(f"{where} starts at {start!r}; a phase starts at a {unit} given as an int >= 0")
        if i == 0 and start != 0:
            raise ConfigError(f"{where} starts at {unit} {start}; the first phase must start at 0 "
                              f"(add a phase (0, {{...}}) for the {unit}s before {start})")
        if phases and start <= phases[-1].start:
            what = "repeats" if start == phases[-1].start else "comes before"
            raise ConfigError(f"{where} starts at {unit} {start}, which {what} the previous phase's start "
                              f"({phases[-1].start}); list phases once each, sorted by start")
        if not isinstance(weights, Mapping):
            raise ConfigError(f"{where} weights {weights!r} must be a dict by dataset name, "
                              f"e.g. {{{names[0]!r}: 1.0}}")
        unknown = sorted(str(n) for n in weights if n not in names)
        if unknown:
            raise ConfigError(f"{where} names unknown datasets {unknown}; the datasets are {list(names)} "
                              "(a dataset left out of a phase has weight 0 there)")
        raw = [_weight(weights[n], n, where) if n in weights else Fraction(0) for n in names]
        total = sum(raw, Fraction(0))
        if total == 0:
            raise ConfigError(f"{where} gives no dataset a positive weight; every phase needs at least one")
        phases.append(Phase(start, tuple(w / total for w in raw)))
    return tuple(phases)


def min_chunk_size(weights: Sequence[Fraction]) -> int:
    """The smallest chunk size keeping one phase's allocation monotone (its positive weights only)."""
    return Mixture.min_chunk_size([w for w in weights if w > 0])


def check_chunk_size(phase_weights: Sequence[Sequence[Fraction]], chunk_size: int) -> None:
    """Refuse a chunk size too small for some phase's allocation to be monotone (``phase_weights``:
    each phase's normalised sample weights)."""
    for p, weights in enumerate(phase_weights):
        need = min_chunk_size(weights)
        if chunk_size < need:
            active = sum(1 for w in weights if w > 0)
            raise ConfigError(
                f"chunk_size={chunk_size} is too small for schedule phase {p}'s {active} datasets (largest "
                f"sample weight {float(max(weights)):.4g}): its allocation would not be monotone. "
                f"Use chunk_size >= {need}")


class Schedule:
    """Phases with chunk starts: the allocation ``A_c(g)`` across phases (immutable).

    ``chunks[p]`` is phase ``p``'s first global chunk (``chunks[0] == 0``, strictly
    increasing); ``weights[p]`` its normalised sample weights in dataset order. Check the chunk
    size first with :func:`check_chunk_size` (for a message naming the phase).
    """

    def __init__(self, chunks: Sequence[int], weights: Sequence[Sequence[Fraction]], chunk_size: int,
                 names: Sequence[str]):
        self.chunks = tuple(int(g) for g in chunks)
        if len(self.chunks) != len(weights) or self.chunks[0] != 0 or any(
                b <= a for a, b in zip(self.chunks, self.chunks[1:], strict=False)):
            raise ConfigError(f"phase chunk starts {list(self.chunks)} must begin at 0, increase strictly "
                              f"and number one per phase ({len(weights)})")
        self.weights = tuple(tuple(w) for w in weights)
        self.chunk_size = chunk_size
        self.names = tuple(names)
        self.active: tuple[tuple[int, ...], ...] = tuple(
            tuple(c for c, w in enumerate(ws) if w > 0) for ws in self.weights)
        self.mixtures: list[Mixture] = []
        for ws, active in zip(self.weights, self.active, strict=True):  # each checks its chunk size
            self.mixtures.append(Mixture([ws[c] for c in active], chunk_size, [names[c] for c in active]))
        self.bases: list[list[int]] = [[0] * len(self.names)]  # A_c(g_p)
        for p in range(1, len(self.chunks)):
            self.bases.append(self._within(p - 1, self.chunks[p]))

    def phase_of(self, g: int) -> int:
        """The phase that owns chunk ``g`` (the chunks ``[g_p, g_{p+1})``)."""
        return bisect.bisect_right(self.chunks, g) - 1

    def _within(self, p: int, g: int) -> list[int]:
        out = list(self.bases[p])
        for c, n in zip(self.active[p], self.mixtures[p].allocated(g - self.chunks[p]), strict=True):
            out[c] += n
        return out

    def allocated(self, g: int) -> list[int]:
        """``[A_c(g) for c]``: samples of each dataset in chunks ``0..g-1``, across phases."""
        return self._within(self.phase_of(max(g - 1, 0)) if g > 0 else 0, g)

    def final_limit(self) -> list[float]:
        """Each dataset's allocation as ``g`` grows without bound: ``inf`` when the last phase gives
        it a positive weight, else its count at the last phase's start."""
        last = len(self.chunks) - 1
        return [math.inf if w > 0 else float(n) for w, n in zip(self.weights[last], self.bases[last], strict=True)]
