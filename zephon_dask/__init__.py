"""zephon_dask: deterministic, elastically resumable LLM training batches computed on Dask.

Importing the package is cheap: it pulls in neither dask nor torch; those
load when a pipeline runs or converts batches to tensors.
"""

from .consumer import Batch, BatchOptions
from .curriculum import MixtureWorkSource, Pointer, plan
from .data import Dataset
from .errors import (
    ConfigError,
    DataFormatError,
    DatasetNotFoundError,
    ElasticityWarning,
    EmptyDatasetError,
    MissingFieldError,
    StateError,
    ZephonError,
)
from .jobs import prepare_tokens
from .log import set_log_level
from .operators import Tokenize
from .pipeline import Pipeline, WindowOutput, compute_window
from .state import gather_state, load_state, merge_states, save_state, verify_ledgers

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchOptions",
    "ConfigError",
    "DataFormatError",
    "Dataset",
    "DatasetNotFoundError",
    "ElasticityWarning",
    "EmptyDatasetError",
    "MissingFieldError",
    "MixtureWorkSource",
    "Pipeline",
    "Pointer",
    "StateError",
    "Tokenize",
    "WindowOutput",
    "ZephonError",
    "compute_window",
    "gather_state",
    "load_state",
    "merge_states",
    "plan",
    "prepare_tokens",
    "save_state",
    "set_log_level",
    "verify_ledgers",
]
