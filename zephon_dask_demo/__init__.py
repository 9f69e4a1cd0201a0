"""zephon_dask_demo: the demo job of ``zephon-dask demo``, outside the library.

A user of zephon_dask (a corpus builder, a small causal transformer and its
training loop with checkpoint and resume on another DP degree); ``import
zephon_dask`` never imports it. Run it with ``zephon-dask demo`` or
``python -m zephon_dask_demo`` (same options).
"""

from .job import run

__all__ = ["run"]
