"""``ensure_mixture``: re-balance a window's samples toward the target mixture. Pure per window.

Filters, splits and other record operators change how many samples of each
dataset reach a window; the curriculum's mixture holds for what was *read*,
not for what is left. This accumulator re-balances what is left:

* The **target** is ``weights`` (shares per dataset name; a dataset left out
  has weight 0), or, with ``weights=None``, the mixture itself: the samples of
  each dataset the curriculum put in the window's chunks (so a mixture
  schedule's phase holds too). With ``weight_by="tokens"`` and no weights, the
  source's token weights (a source weighed by tokens, without a schedule).
* A sample belongs to the dataset of its first lineage row. Its **units** are
  1 (``weight_by="samples"``) or its real tokens (``"tokens"``); a dataset's
  **share** is its units over the units of every dataset.
* ``strict=False`` keeps every sample and only reorders: samples queue per
  dataset in arrival order, at most ``buffer_size`` held at a time, and each
  next sample comes from the held dataset furthest below its target share
  (the largest ``W_c * E - e_c * sum(W)``: ``W`` the integer weights, ``E``
  the units emitted, ``e_c`` those of dataset ``c``; lowest index on ties).
* ``strict=True`` first drops the surplus: with ``T`` the largest total the
  window can fill at the target (``min(available_c / W_c)`` over the datasets
  with weight), dataset ``c`` keeps its first samples (arrival order) whose
  units fit in ``floor(T * W_c)``; the rest is dropped and counted. The kept
  samples are then ordered as above. So each dataset delivers its share of
  ``T`` to within one sample's units; a window lacking a dataset of positive
  weight delivers nothing.

A sample without lineage belongs to no dataset: it is kept, never counted,
and leaves ahead of the others once held. Counters per window, for each
dataset ``d``: ``ensure_mixture.d.in`` and ``.out`` (units before and after),
``.dropped`` (samples dropped) and, with ``weights=None``, ``.target`` (the
samples the curriculum drew). Nothing but the table, its lineage and the
window's allocation is read: no seed, counter or clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from ..curriculum.token_weights import WEIGHT_BY  # one home: the shares a mixture is weighed in
from ..errors import ConfigError
from ..validate import check_bool, check_choice, check_int
from .base import Accumulator, WindowContext
from .table import SampleTable

STAT = "ensure_mixture"


def exact_weight(value: object, name: str) -> Fraction:
    """``value`` (an int, float or Fraction >= 0) as an exact Fraction (a float by its decimal text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or not value >= 0 \
            or value != value or value in (float("inf"),):
        raise ConfigError(f"ensure_mixture(weights=...): the weight of {name!r} is {value!r}; give a "
                          "number >= 0")
    return Fraction(str(value)) if isinstance(value, float) else Fraction(value)


def integer_weights(shares: Sequence[Fraction]) -> tuple[int, ...]:
    """``shares`` scaled to integers with the same ratios (their common denominator)."""
    den = 1
    for s in shares:
        den = den * s.denominator // np.gcd(den, s.denominator)
    return tuple(int(s * den) for s in shares)


def dataset_of(table: SampleTable) -> np.ndarray:
    """Each sample's dataset: its first lineage row's (``-1`` for a sample without lineage)."""
    first = table.lineage_offsets[:-1]
    has = table.lineage_offsets[1:] > first
    ds = np.full(len(table), -1, dtype=np.int64)
    ds[has] = table.lineage[first[has], 0]
    return ds


def keep_counts(available: Sequence[int], weights: Sequence[int]) -> list[int]:
    """Units each dataset keeps under ``strict``: ``floor(T * W_c)``, ``T = min(available_c / W_c)``
    over the datasets with weight (0 for every dataset when none has weight)."""
    fills = [Fraction(a, w) for a, w in zip(available, weights, strict=True) if w > 0]
    if not fills:
        return [0] * len(weights)
    t = min(fills)
    return [int(t * w) for w in weights]


def balanced_order(ds: Sequence[int], units: Sequence[int], weights: Sequence[int], buffer_size: int) -> list[int]:
    """The order (indices into ``ds``) the samples leave in: per-dataset queues in arrival order,
    at most ``buffer_size`` held, each next one from the held dataset furthest below its target
    (see the module docstring); a sample of no dataset (``-1``) leaves first once held."""
    n_ds, total_w = len(weights), sum(weights)
    queues: list[deque[int]] = [deque() for _ in range(n_ds + 1)]  # the last: samples of no dataset
    emitted, total, held, nxt, n = [0] * n_ds, 0, 0, 0, len(ds)
    out: list[int] = []
    while True:
        while held < buffer_size and nxt < n:
            queues[ds[nxt]].append(nxt)  # ds == -1 lands in the last queue
            held, nxt = held + 1, nxt + 1
        if not held:
            return out
        if queues[-1]:
            out.append(queues[-1].popleft())
            held -= 1
            continue
        best, score = -1, 0
        for c in range(n_ds):
            if queues[c]:
                s = weights[c] * total - emitted[c] * total_w
                if best < 0 or s > score:
                    best, score = c, s
        i = queues[best].popleft()
        out.append(i)
        held -= 1
        emitted[best] += units[i]
        total += units[i]


class EnsureMixture(Accumulator):
    """``.ensure_mixture(weights=None, weight_by="samples", strict=False, buffer_size=1024,
    warn_tolerance=None)``; ``names`` are the source's datasets, in order."""

    name = STAT

    def __init__(self, names: Sequence[str], weights: Mapping[str, object] | None = None, *,
                 weight_by: str = "samples", strict: bool = False, buffer_size: int = 1024,
                 warn_tolerance: float | None = None, source_token_weights: Sequence[Fraction] | None = None):
        call = "ensure_mixture"
        self.names = tuple(names)
        self.weight_by = check_choice(weight_by, WEIGHT_BY, "weight_by", call=call)
        self.strict = check_bool(strict, "strict", call=call)
        self.buffer_size = check_int(buffer_size, "buffer_size", 1, call=call, hint="e.g. 1024")
        if warn_tolerance is not None and (isinstance(warn_tolerance, bool) or not isinstance(
                warn_tolerance, (int, float)) or not 0 <= warn_tolerance < 1):
            raise ConfigError(f"ensure_mixture(warn_tolerance={warn_tolerance!r}) must be a share in [0, 1), "
                              "e.g. 0.05, or None (no warning)")
        self.warn_tolerance = warn_tolerance  # how far a window's share may drift before a warning (not data)
        self.one_to_one = not self.strict  # non-strict only reorders inside a window
        self.given: tuple[Fraction, ...] | None = None
        if weights is not None:
            if not isinstance(weights, Mapping) or not weights:
                raise ConfigError(f"ensure_mixture(weights={weights!r}) must be a dict {{dataset: weight}}, "
                                  "or None for the source's mixture")
            unknown = sorted(set(map(str, weights)) - set(self.names))
            if unknown:
                raise ConfigError(f"ensure_mixture(weights=...) names {unknown}, not datasets of this source; "
                                  f"its datasets: {list(self.names)}")
            raw = [exact_weight(weights.get(n, 0), n) for n in self.names]
            if not sum(raw):
                raise ConfigError("ensure_mixture(weights=...) are all 0; give at least one dataset a weight > 0")
            self.given = tuple(w / sum(raw) for w in raw)
        elif self.weight_by == "tokens":
            if source_token_weights is None:
                raise ConfigError(
                    "ensure_mixture(weight_by='tokens') without weights= takes the source's token weights, "
                    "and this source weighs by samples (or follows a schedule): pass weights={dataset: "
                    "share} or weight_by='samples'")
            self.given = tuple(source_token_weights)
        self._weights = None if self.given is None else integer_weights(self.given)

    def spec(self) -> dict:
        weights = None if self.given is None else {n: str(w) for n, w in zip(self.names, self.given, strict=True)}
        return {"op": STAT, "weights": weights, "weight_by": self.weight_by, "strict": self.strict,
                "buffer_size": self.buffer_size}

    def targets(self, stats: Mapping[str, int]) -> dict[str, float] | None:
        """The target share per dataset: the weights, or (``weights=None``) the shares of what the
        curriculum drew in the windows ``stats`` sums; ``None`` before any."""
        if self.given is not None:
            return {n: float(w) for n, w in zip(self.names, self.given, strict=True)}
        drawn = [stats.get(f"{STAT}.{n}.target", 0) for n in self.names]
        return {n: d / sum(drawn) for n, d in zip(self.names, drawn, strict=True)} if sum(drawn) else None

    def delivered(self, stats: Mapping[str, int]) -> dict[str, float] | None:
        """The delivered share per dataset over the windows ``stats`` sums (``None``: nothing delivered)."""
        out = [stats.get(f"{STAT}.{n}.out", 0) for n in self.names]
        return {n: o / sum(out) for n, o in zip(self.names, out, strict=True)} if sum(out) else None

    def drift(self, stats: Mapping[str, int]) -> float:
        """The largest distance between a delivered and a target share (0 when nothing was delivered)."""
        got, want = self.delivered(stats), self.targets(stats)
        if got is None or want is None:
            return 0.0
        return max(abs(got[n] - want[n]) for n in self.names)

    def drift_warning(self, stats: Mapping[str, int]) -> str | None:
        """What a window with counters ``stats`` delivered, when further than ``warn_tolerance`` from
        the target (else ``None``)."""
        far = self.drift(stats)
        if self.warn_tolerance is None or far <= self.warn_tolerance:
            return None
        got, want = self.delivered(stats) or {}, self.targets(stats) or {}
        shares = ", ".join(f"{n} {got.get(n, 0):.3f} (target {want.get(n, 0):.3f})" for n in self.names)
        return (f"delivered {shares}, {far:.3f} from the target, more than warn_tolerance="
                f"{self.warn_tolerance}: the window lacks samples of a dataset (a filter or split removes "
                "most of it). ensure_mixture(strict=True) drops the surplus instead. Warned once per iteration")

    def apply(self, table: SampleTable, ctx: WindowContext) -> SampleTable:
        ds = dataset_of(table)
        units = (table.lengths - table.padding()) if self.weight_by == "tokens" else np.ones(len(table), np.int64)
        weights = self._weights
        if weights is None:
            drawn = ctx.allocated if ctx.allocated is not None else np.bincount(ds[ds >= 0], minlength=len(self.names))
            weights = tuple(int(x) for x in drawn)
            for n, w in zip(self.names, weights, strict=True):
                ctx.count(f"{STAT}.{n}.target", w)
        n_ds = len(self.names)
        labelled = ds >= 0
        available = np.bincount(ds[labelled], weights=units[labelled], minlength=n_ds).astype(np.int64)
        keep = np.ones(len(table), dtype=bool)
        if self.strict:
            budget = keep_counts(available.tolist(), weights)
            for c in range(n_ds):
                mine = np.flatnonzero(ds == c)
                keep[mine] = np.cumsum(units[mine]) <= budget[c]
        kept = np.flatnonzero(keep)
        dropped = np.bincount(ds[labelled & ~keep], minlength=n_ds)
        delivered = np.bincount(ds[labelled & keep], weights=units[labelled & keep], minlength=n_ds).astype(np.int64)
        for c, n in enumerate(self.names):
            ctx.count(f"{STAT}.{n}.in", int(available[c]))
            ctx.count(f"{STAT}.{n}.out", int(delivered[c]))
            ctx.count(f"{STAT}.{n}.dropped", int(dropped[c]))
        order = balanced_order(ds[kept].tolist(), units[kept].tolist(), weights, self.buffer_size)
        index = kept[np.asarray(order, dtype=np.int64)] if len(order) else kept[:0]
        if len(index) == len(table) and np.array_equal(index, np.arange(len(table))):
            return table
        return table.take(index)
