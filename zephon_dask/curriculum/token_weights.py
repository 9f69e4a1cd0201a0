"""Token-share weights turned into exact sample-share weights. Pure.

A mixture stated in tokens ("30% of the tokens from code") is allocated in
samples, like any other: a dataset of token weight ``t_c`` whose samples hold
``s_c`` tokens each on average gets the sample weight ``t_c / s_c`` (then
normalised). With exact :class:`~fractions.Fraction` numbers the allocation
stays exact integer arithmetic. The tokens per sample are given (one number for
every dataset, or pins for some) or measured elsewhere (the pipeline reads and
tokenizes a fixed sample of each dataset, or calls a ``measure`` function) and
enter here only as numbers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction

from ..errors import ConfigError

WEIGHT_BY = ("samples", "tokens")


def token_pins(value: object, names: Sequence[str]) -> dict[str, Fraction]:
    """The tokens per sample given for some datasets: one number for every dataset, or a dict
    naming some of them (the others are measured), as exact fractions.

    Accepts ints, Fractions, finite floats and ``"p/q"`` strings (as :func:`as_config` writes
    them); each must be positive.
    """
    if isinstance(value, numbers.Real | str) and not isinstance(value, bool):
        return {n: _positive(value, n) for n in names}
    if not isinstance(value, Mapping):
        raise ConfigError(f"tokens_per_sample={value!r} must be a number for every dataset or a dict by "
                          f"dataset name, e.g. {{{names[0]!r}: 812.5}} (the others are measured), or None "
                          "to have the pipeline measure them all")
    unknown = sorted(str(n) for n in value if n not in names)
    if unknown:
        raise ConfigError(f"tokens_per_sample does not match the datasets: unknown {unknown}; the datasets "
                          f"are {list(names)}")
    return {n: _positive(value[n], n) for n in names if n in value}


def _positive(value: object, name: str) -> Fraction:
    number: Fraction | None = None
    if isinstance(value, Fraction | numbers.Integral) and not isinstance(value, bool):
        number = Fraction(int(value)) if isinstance(value, numbers.Integral) else value
    elif isinstance(value, float) and math.isfinite(value):
        number = Fraction(repr(value))
    elif isinstance(value, str):
        try:
            number = Fraction(value)
        except ValueError:
            number = None
    if number is None or number <= 0:
        raise ConfigError(f"tokens per sample of dataset {name!r} is {value!r}; it must be a positive "
                          "number (e.g. '1625/2'): a dataset whose samples all lose their tokens cannot "
                          "be weighted by tokens")
    return number


def sample_weights(token_weights: Sequence[Fraction], tokens_per_sample: Sequence[Fraction]) -> list[Fraction]:
    """The sample weights ``t_c / s_c`` that give token shares ``t_c`` (not normalised)."""
    return [t / s for t, s in zip(token_weights, tokens_per_sample, strict=True)]


def as_config(names: Sequence[str], values: Sequence[Fraction]) -> dict[str, str]:
    """``{dataset: "p/q"}``: exact numbers as JSON-native strings."""
    return {n: f"{v.numerator}/{v.denominator}" for n, v in zip(names, values, strict=True)}
