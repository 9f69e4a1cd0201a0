"""The package's error hierarchy.

Every error raised on purpose by zephon_dask subclasses :class:`ZephonError`
and the built-in exception a caller would catch for the same fault, so both
``except zephon_dask.ZephonError`` and ``except ValueError`` work. Messages
name the offending value and say how to fix it.
"""

from __future__ import annotations

import inspect
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parent)


class ZephonError(Exception):
    """Base class of every error zephon_dask raises on purpose."""


class ConfigError(ZephonError, ValueError):
    """A data or execution setting is invalid (bad weight, chunk size, degree, ...)."""


class DuplicateNameError(ConfigError):
    """Two datasets in one mixture share a name."""


class EndlessStreamError(ZephonError, TypeError):
    """``len()`` was asked of a stream that never ends (``exhausted_policy='repeat'``)."""


class UnsizedPipelineError(ZephonError, TypeError):
    """``len()`` was asked of a :class:`~zephon_dask.Pipeline`: a stream of ready-made batches, which
    something took for a map-style dataset (a ``DataLoader`` or a ``Trainer`` given the pipeline)."""


class DatasetNotFoundError(ZephonError, FileNotFoundError):
    """A dataset path, glob or tokenizer file does not exist."""


class DataAccessError(ZephonError, PermissionError):
    """A data file exists but may not be read (its permissions, an ACL, a mount that refuses it)."""


class StorageError(ZephonError, OSError):
    """An object store (``s3://``, ...) could not serve a request: unreachable, or still failing
    (throttled, 5xx, connections reset, timeouts) once the retries and their deadline are spent."""


class StorageAccessError(StorageError, PermissionError):
    """An object store refused the request: unknown or wrong credentials, or no permission on the
    bucket or object."""


class EmptyDatasetError(ZephonError, ValueError):
    """A dataset has no samples."""


class EmptyStreamError(EmptyDatasetError):
    """A pipeline's stream read records but gives no sample: its operators drop every one."""


class DataFormatError(ZephonError, ValueError):
    """A data file cannot be parsed (malformed JSON line, unreadable parquet, bad zarr layout)."""


class DataChangedError(DataFormatError):
    """A data file holds other bytes than its index recorded when the Dataset was built (its
    size, content fingerprint or whole-file digest differ; a new modification time or ETag
    alone is no change when the digest still matches): it was rewritten, appended to or
    truncated under a run. Rebuild the Dataset to read the new content."""


class MissingFieldError(DataFormatError):
    """A record lacks the field an operator or reader needs."""


class FieldTypeError(DataFormatError, TypeError):
    """A record's field has the wrong type (an int or a list where text belongs, ...)."""


class ChatFormatError(DataFormatError):
    """A conversation cannot be rendered (``tokenize_chat``): empty, an unknown role, refused by the
    chat template, or a template that is not prefix-stable. Type and missing-key faults raise
    :class:`FieldTypeError` / :class:`MissingFieldError`."""


class OperatorOutputError(ZephonError, TypeError):
    """An operator's user function returned the wrong type (a ``.map`` function: anything but a dict)."""


class OperatorContractError(ConfigError):
    """A user's operator (``add_op``, ``map_batch``) breaks the operator contract on sample data
    (``Pipeline.validate``): it is not deterministic, draws from a global RNG, keeps state, or a
    trait it declares is false."""


class IncompleteStoreError(DataFormatError):
    """A token store's preparation was interrupted (or still runs): it is not complete."""


class TokenizerMismatchError(ConfigError):
    """A token store was written with another tokenizer than the one expected."""


class StateError(ZephonError, ValueError):
    """A checkpoint cannot be restored into this pipeline."""


class ChunkOutOfRangeError(ZephonError, IndexError):
    """A chunk, lane position or window index lies past the end of the stream."""


class RecordIndexError(ZephonError, IndexError):
    """A shard index or a record offset lies outside a dataset (``Dataset.read``)."""


class ArgumentTypeError(ZephonError, TypeError):
    """An argument has the wrong type (``Dataset.read`` offsets that are not a 1-D sequence of ints, ...)."""


class UnknownArgumentError(ConfigError, TypeError):
    """A call got a keyword its method does not take (``.batch(4, label=True)``); names the closest."""


class ZephonWarning(UserWarning):
    """Base class of zephon_dask's warnings."""


class ElasticityWarning(ZephonWarning):
    """A setting is valid but costs balance or elasticity (e.g. lanes not divisible by groups)."""


def user_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` that points at the first frame outside this package (the
    user's call, or a framework's), however deep inside the package the warning is raised: a fixed
    count breaks whenever a call path gains a frame (a wrapper, a helper)."""
    frame, level = inspect.currentframe(), 1
    frame = frame.f_back if frame is not None else None  # the function that calls warnings.warn: 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return max(level - 1, 1) if frame is None else level


class DeviceUnavailableError(ConfigError):
    """A torch device that this torch cannot use (``device="cuda"`` on a torch without CUDA, or
    a GPU index past the GPUs present)."""


class RecipeError(ConfigError):
    """A TOML recipe cannot be used: bad TOML, a missing key or a bad value."""


class RecipeKeyError(RecipeError):
    """A recipe has a table or key zephon_dask does not know (often a typo), or lacks a required one."""


class RecipeTypeError(RecipeError, TypeError):
    """A recipe value has the wrong TOML type (a string where a number belongs, ...)."""


class RecipePathError(DatasetNotFoundError):
    """A recipe, or a dataset or tokenizer path it names, does not exist."""


class MissingDependencyError(ZephonError, ImportError):
    """An optional package or program that a feature needs is not installed."""


class NotFoundError(ZephonError, KeyError):
    """A name looked up in a report or table does not exist (the message lists the names that do)."""

    def __str__(self) -> str:  # KeyError would show the message with quotes around it
        return str(self.args[0]) if self.args else ""


class ClusterError(ZephonError, ConnectionError):
    """The Dask cluster cannot be reached, or was lost: a closed port, a dead scheduler, a closed client."""


class ClusterStallError(ClusterError, TimeoutError):
    """The cluster stayed without a live worker (or without its scheduler) past the configured timeout."""


class OutputPathError(ZephonError, OSError):
    """A path a command will write (a checkpoint file, a ledger folder) cannot be used: checked
    before the command works for minutes, not after."""


class OutputIsADirectoryError(OutputPathError, IsADirectoryError):
    """A file path to be written names an existing folder."""


class OutputNotADirectoryError(OutputPathError, NotADirectoryError):
    """A folder path to be written names an existing file."""


class OutputPermissionError(OutputPathError, PermissionError):
    """Nothing can be written at an output path (no permission, a read-only file system, ...)."""


class ClosedError(ZephonError, RuntimeError):
    """A pipeline, stream or runner was used after ``close()``."""


class ShardingError(ZephonError, RuntimeError):
    """A framework wrapper would split again a pipeline that already splits its lanes by rank."""
