"""Real Dask clusters (LocalCluster, ``dask scheduler`` + ``dask worker``): execution, faults, exits."""
