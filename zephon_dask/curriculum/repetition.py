"""How far each dataset may be read: ``exhausted_policy``, ``max_repeats``, ``reshuffle_on_repeat``. Pure.

Each setting is one value for every dataset or a dict by dataset name:

* ``exhausted_policy``: ``None`` (``stop_after_passes`` decides), ``"stop"`` or
  ``"repeat"``; a dict names every dataset, with ``"stop"`` or ``"repeat"`` each.
* ``max_repeats``: passes after the first that a ``"repeat"`` dataset may take
  (``None``: no limit); a dict may name only some of the repeating datasets.
* ``reshuffle_on_repeat``: each pass in a fresh order, or every pass in the first
  one's; a dict may name only some datasets (the rest: ``True``).

Dataset ``c`` may give ``limit_c`` samples: ``N_c`` for ``"stop"``, ``(1 + k) * N_c``
for ``"repeat"`` with ``max_repeats=k``, no limit for ``"repeat"`` alone. The
stream ends before the first chunk that would need a sample past any dataset's
limit, and never when no dataset has one. A dict whose values are all equal
describes the same stream as that one value, and is recorded as it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..errors import ConfigError
from ..validate import check_bool, check_int

POLICIES = ("stop", "repeat")


def _by_name(value: Mapping, names: Sequence[str], key: str, complete: bool) -> None:
    unknown = sorted(str(n) for n in value if n not in names)
    missing = [n for n in names if n not in value] if complete else []
    if unknown or missing:
        raise ConfigError(f"{key} does not match the datasets: unknown {unknown}, missing {missing}; "
                          f"the datasets are {list(names)}")


def _recorded(values: tuple, given: object, names: Sequence[str]):
    """The config form: the one value when every dataset has it, else ``{name: value}``."""
    if not isinstance(given, Mapping) or len(set(values)) == 1:
        return values[0]
    return dict(zip(names, values, strict=True))


@dataclass(frozen=True)
class Repetition:
    """Each dataset's policy, maximum repeats and reshuffling, in dataset order (immutable)."""

    names: tuple[str, ...]
    policies: tuple[str | None, ...]
    repeats: tuple[int | None, ...]
    reshuffles: tuple[bool, ...]
    exhausted_policy: object  # the config forms (scalar, or a dict when the values differ)
    max_repeats: object
    reshuffle_on_repeat: object

    @classmethod
    def parse(cls, names: Sequence[str], policy: object, max_repeats: object, reshuffle: object,
              passes: int) -> Repetition:
        """Validate the three settings against ``names`` (:class:`ConfigError` naming the fix)."""
        names = tuple(names)
        if isinstance(policy, Mapping):
            _by_name(policy, names, "exhausted_policy", complete=True)
            bad = {n: v for n, v in policy.items() if v not in POLICIES}
            if bad:
                raise ConfigError(f"exhausted_policy={dict(policy)!r}: {bad!r} is not 'stop' or 'repeat'; "
                                  "a dict gives every dataset 'stop' or 'repeat'")
            policies: tuple[str | None, ...] = tuple(policy[n] for n in names)
        elif policy in (None, *POLICIES):
            policies = (policy,) * len(names)
        else:
            raise ConfigError(f"exhausted_policy={policy!r} is unknown; choose None (use stop_after_passes), "
                              "'stop', 'repeat' or a dict {dataset: 'stop' or 'repeat'}")
        if policies[0] is not None and passes != 1:
            raise ConfigError(f"exhausted_policy={policy!r} and stop_after_passes={passes} both decide "
                              "where the stream ends; set only one")
        repeating = [n for n, p in zip(names, policies, strict=True) if p == "repeat"]
        if isinstance(max_repeats, Mapping):
            _by_name(max_repeats, names, "max_repeats", complete=False)
            stray = [n for n in names if n in max_repeats and n not in repeating]
            if stray:
                raise ConfigError(f"max_repeats names {stray}, whose exhausted_policy is not 'repeat'; "
                                  "drop them or give them exhausted_policy 'repeat'")
            repeats = tuple(check_int(max_repeats.get(n), f"max_repeats[{n!r}]", 1, optional=True,
                                      hint="None: it repeats without limit") for n in names)
        elif max_repeats is not None:
            if not repeating:
                raise ConfigError(f"max_repeats={max_repeats!r} needs exhausted_policy='repeat' (for "
                                  "every dataset, or a dict naming the ones that repeat)")
            k = check_int(max_repeats, "max_repeats", 1, optional=True, hint="None for an endless stream")
            repeats = tuple(k if n in repeating else None for n in names)
        else:
            repeats = (None,) * len(names)
        if isinstance(reshuffle, Mapping):
            _by_name(reshuffle, names, "reshuffle_on_repeat", complete=False)
            reshuffles = tuple(check_bool(reshuffle.get(n, True), f"reshuffle_on_repeat[{n!r}]") for n in names)
        else:
            reshuffles = (bool(reshuffle),) * len(names)
        # max_repeats is recorded over the repeating datasets only (it means nothing for the others)
        ks = {n: k for n, k in zip(names, repeats, strict=True) if n in repeating}
        recorded_repeats = (None if not ks else next(iter(ks.values())) if len(set(ks.values())) == 1
                            else ks)
        return cls(names, policies, repeats, reshuffles, _recorded(policies, policy, names),
                   recorded_repeats, _recorded(reshuffles, reshuffle, names))

    @property
    def per_dataset(self) -> bool:
        """Whether the datasets end the stream differently (a dict in the recorded ``exhausted_policy``
        or ``max_repeats``): then a repeating dataset must fit its share of a chunk."""
        return isinstance(self.exhausted_policy, dict) or isinstance(self.max_repeats, dict)

    def limits(self, sizes: Sequence[int]) -> list[float]:
        """Each dataset's most samples (``inf``: no limit); only with an ``exhausted_policy``."""
        return [float(n) if p == "stop" else math.inf if k is None else float((1 + k) * n)
                for p, k, n in zip(self.policies, self.repeats, sizes, strict=True)]

    @property
    def bounded(self) -> bool:
        """Whether some dataset limits the stream (an ``exhausted_policy`` with a ``"stop"`` or a
        ``max_repeats``)."""
        return any(p == "stop" or (p == "repeat" and k is not None)
                   for p, k in zip(self.policies, self.repeats, strict=True))

    def check_liveness(self, sizes: Sequence[int], phase_weights: Sequence[Sequence[Fraction]],
                       chunk_size: int) -> None:
        """Refuse a repeating dataset whose share of one chunk (``chunk_size * weight`` rounded up,
        in any phase) exceeds its size: it would repeat inside a chunk."""
        for c, (name, policy, size) in enumerate(zip(self.names, self.policies, sizes, strict=True)):
            if policy != "repeat":
                continue
            quota = max(math.ceil(chunk_size * ws[c]) for ws in phase_weights)
            if quota > size:
                raise ConfigError(
                    f"dataset {name!r} repeats (exhausted_policy 'repeat') but holds {size:,} samples, fewer "
                    f"than its {quota:,} in every chunk of {chunk_size}: it would repeat inside one chunk. "
                    "Lower chunk_size or its weight")

    def describe(self) -> list[tuple[str, str]]:
        """``(dataset, how far it is read)`` for each dataset."""
        out = []
        for name, p, k, r in zip(self.names, self.policies, self.repeats, self.reshuffles, strict=True):
            if p is None:
                text = "passes as stop_after_passes needs"
            elif p == "stop":
                text = "one pass, then the stream stops"
            elif k is None:
                text = "repeats without limit"
            else:
                text = f"1 + {k} pass(es), then the stream stops"
            if p != "stop":
                text += ", each pass reshuffled" if r else ", every pass in the first one's order"
            out.append((name, text))
        return out
