"""zephon_dask: deterministic, elastically resumable LLM training batches computed on Dask.

Importing the package is cheap: each public name below is imported on first
use (PEP 562), so ``zephon-dask --help`` or ``from zephon_dask.errors import
ZephonError`` load neither numpy, dask nor torch. See ``docs/architecture.md``
for the layers behind these names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Accumulator": "operators",
    "Batch": "consumer",
    "BatchOptions": "consumer",
    "ChatFormatError": "errors",
    "ChunkContext": "operators",
    "ConfigError": "errors",
    "DataChangedError": "errors",
    "DataFormatError": "errors",
    "Dataset": "data",
    "DatasetNotFoundError": "errors",
    "ElasticityWarning": "errors",
    "EmptyDatasetError": "errors",
    "MissingFieldError": "errors",
    "MixtureWorkSource": "curriculum",
    "OperatorContractError": "errors",
    "Pipeline": "pipeline",
    "Pointer": "curriculum",
    "Preempted": "preemption",
    "Preemption": "preemption",
    "RecordOp": "operators",
    "Row": "operators",
    "StateError": "errors",
    "Tokenize": "operators",
    "WindowContext": "operators",
    "WindowOutput": "core",
    "ZephonError": "errors",
    "compute_window": "core",
    "gather_state": "state",
    "load_state": "state",
    "merge_states": "state",
    "plan": "curriculum",
    "prepare_tokens": "jobs",
    "save_state": "state",
    "set_log_level": "log",
    "verify_ledgers": "state",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from .consumer import Batch, BatchOptions
    from .core import WindowOutput, compute_window
    from .curriculum import MixtureWorkSource, Pointer, plan
    from .data import Dataset
    from .errors import (
        ChatFormatError,
        ConfigError,
        DataChangedError,
        DataFormatError,
        DatasetNotFoundError,
        ElasticityWarning,
        EmptyDatasetError,
        MissingFieldError,
        OperatorContractError,
        StateError,
        ZephonError,
    )
    from .jobs import prepare_tokens
    from .log import set_log_level
    from .operators import Accumulator, ChunkContext, RecordOp, Row, Tokenize, WindowContext
    from .pipeline import Pipeline
    from .preemption import Preempted, Preemption
    from .state import gather_state, load_state, merge_states, save_state, verify_ledgers


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'zephon_dask' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
