"""Which batch fields a model's ``forward`` takes: the integrations that call a model themselves
pass it only those, and keep the others (kept fields, ``dataset_ids``) reachable beside it.

A field goes to the model when its ``forward`` names it as a parameter. A ``forward`` with
``**kwargs`` (a wrapper such as PEFT's, or a Hugging Face model) also gets the standard fields
(``input_ids``, ``labels``, ``attention_mask``, ``position_ids``) present in the batch, never an
extra one it does not name: a per-domain loss reads ``domain`` beside the model, not inside it.
Pure; imports no framework.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

STANDARD_FIELDS = ("input_ids", "labels", "attention_mask", "position_ids")


def extra_fields(pipeline) -> tuple[str, ...]:
    """The per-token fields a pipeline's batches carry beyond the standard ones: the fields kept by
    ``tokenize(keep=[...])``, and ``dataset_ids`` when ``.batch(dataset_ids=True)``."""
    kept = tuple(k for op in pipeline.spec.record_ops for k in getattr(op, "keep", None) or ())
    return kept + (("dataset_ids",) if pipeline.description.batch.dataset_ids else ())


def forward_fields(model, available: Iterable[str]) -> tuple[str, ...]:
    """The names in ``available`` (in its order) that ``model``'s ``forward`` takes (see the module
    docstring); all of ``available`` when the signature cannot be read."""
    available = tuple(available)
    try:
        params = inspect.signature(getattr(model, "forward", model)).parameters.values()
    except (TypeError, ValueError):
        return available
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind == p.VAR_KEYWORD for p in params):
        named |= set(STANDARD_FIELDS)
    return tuple(k for k in available if k in named)
