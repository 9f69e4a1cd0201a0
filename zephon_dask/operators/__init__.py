"""Operators: stateless record operators (chunk tasks) and accumulators (window tasks)."""

from .base import Accumulator, ChunkContext, RecordOp, Row, WindowContext
from .table import SampleTable
from .tokenize import ByteTokenizer, HFTokenizer, Tokenize

__all__ = [
    "Accumulator", "ByteTokenizer", "ChunkContext", "HFTokenizer", "RecordOp", "Row", "SampleTable",
    "Tokenize", "WindowContext",
]
