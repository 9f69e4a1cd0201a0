"""Dataset I/O: shards in JSONL, parquet, in-memory records or a zarr token store.

No dask, distributed or torch imports here: a :class:`Dataset` is plain data that
pickles to workers, and :meth:`Dataset.read` is the only entry point for samples.
"""

from .dataset import Dataset, check_unique_names
from .shard import Shard
from .tokens import write_token_store

__all__ = ["Dataset", "Shard", "check_unique_names", "write_token_store"]
