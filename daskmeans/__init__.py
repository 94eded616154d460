"""daskmeans: distributed, out-of-core k-means clustering on Dask, fast on GPUs."""

from . import config  # noqa: F401  (registers the dask.config defaults)
from .errors import DaskmeansError, DataError, InvalidParameterError, NotFittedError
from .estimator import KMeans
from .io.readers import read

__version__ = "0.1.0"


def load(path: str) -> KMeans:
    """Load a model written by :meth:`KMeans.save` (a Zarr group)."""
    return KMeans.load(path)


__all__ = ["KMeans", "read", "load", "DaskmeansError", "DataError", "InvalidParameterError", "NotFittedError"]
