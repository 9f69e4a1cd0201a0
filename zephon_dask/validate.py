"""Shared argument predicates. Pure."""

from __future__ import annotations


def is_int_at_least(value: object, minimum: int) -> bool:
    """True for a Python ``int`` (not ``bool``) that is ``>= minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
