"""The error for a record field that is not there, with the fields that are. Pure.

A :class:`~zephon_dask.data.Dataset` knows its records' fields at construction
(``Dataset.fields``: the first record of its first non-empty file, or the file
schema), so a wrong ``text_field`` fails there, and a wrong ``tokenize(field=...)``
when the pipeline is built; readers raise the same error for a later record.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import MissingFieldError
from ..validate import did_you_mean

_SHOWN = 30  # fields listed in a message

TEXT_FIELD_FIX = "Pass text_field=<one of them> (in a recipe: text_field = ... in its [[datasets]] table)"


def missing(dataset: str, where: str, field: str, present: Sequence[str],
            fix: str = TEXT_FIELD_FIX) -> MissingFieldError:
    """A :class:`MissingFieldError`: dataset ``dataset``'s ``where`` has no ``field``; the
    fields ``present`` (the closest first, when one is close) and ``fix``."""
    names = sorted(present)
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return MissingFieldError(
        f"dataset {dataset!r}: {where} has no field {field!r}; {did_you_mean(field, names)}"
        f"fields present: {names[:_SHOWN]}{more}. {fix}"
    )
