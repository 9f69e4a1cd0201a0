"""Jobs: work run on a Dask cluster beside the pipeline, built from its pieces.

A job takes the library's own values (a :class:`~zephon_dask.data.Dataset`, an
operator such as :class:`~zephon_dask.operators.Tokenize`), runs on a client it
opens or is given, and returns a report (a value). Importing this package pulls
in no dask: each job imports the execution layer when it runs.

* :func:`prepare_tokens`: tokenize a dataset once into a resumable zarr token store.
"""

from .prepare import PrepareReport, prepare_tokens

__all__ = ["PrepareReport", "prepare_tokens"]
