"""zephon_dask."""
