"""Token-share weights turned into exact sample-share weights. Pure.

A mixture stated in tokens ("30% of the tokens from code") is allocated in
samples, like any other: a dataset of token weight ``t_c`` whose samples hold
``s_c`` tokens each on average gets the sample weight ``t_c / s_c`` (then
normalised). With exact :class:`~fractions.Fraction` numbers the allocation
stays exact integer arithmetic. The tokens per sample are measured elsewhere
(the pipeline reads and tokenizes a fixed sample of each dataset) and enter
here only as numbers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction

from ..errors import ConfigError

WEIGHT_BY = ("samples", "tokens")


def exact_tokens_per_sample(value: object, names: Sequence[str]) -> tuple[Fraction, ...]:
    """``{dataset: tokens per sample}`` as exact fractions in dataset order.

    Accepts ints, Fractions, finite floats and ``"p/q"`` strings (as :func:`as_config` writes
    them); every dataset must have a positive number.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f"tokens_per_sample={value!r} must be a dict by dataset name, e.g. "
                          f"{{{names[0]!r}: 812.5}}, or None to have the pipeline measure it")
    unknown = sorted(set(map(str, value)) - set(names))
    missing = [n for n in names if n not in value]
    if unknown or missing:
        raise ConfigError(f"tokens_per_sample does not match the datasets: unknown {unknown}, missing "
                          f"{missing}; the datasets are {list(names)}")
    return tuple(_positive(value[n], n) for n in names)


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
