"""The package's version, in the base layer: the workers' check compares it with the client's
(:func:`daskmeans.dask_cluster.run_checked`), and models record it."""

__version__ = "0.1.0"
