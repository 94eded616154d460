"""Input and output: readers to row-chunked Dask arrays, the model store. No GPU code here."""

from .readers import read  # noqa: F401
