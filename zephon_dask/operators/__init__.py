"""Operators: stateless record operators (chunk tasks) and accumulators (window tasks)."""

from .base import Accumulator, RecordOp, WindowContext
from .table import SampleTable
from .tokenize import ByteTokenizer, HFTokenizer, Tokenize

__all__ = ["Accumulator", "ByteTokenizer", "HFTokenizer", "RecordOp", "SampleTable", "Tokenize",
           "WindowContext"]
