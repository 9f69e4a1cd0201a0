"""The facade users build and iterate: ``Pipeline`` (an immutable description) over a ``Session``."""

from .builder import Pipeline

__all__ = ["Pipeline"]
