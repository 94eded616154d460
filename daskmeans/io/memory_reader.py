"""Data already in memory: NumPy and CuPy arrays, lists, pandas and Dask DataFrames, SciPy
sparse matrices, as Dask arrays of row chunks (sparse rows densified chunk by chunk)."""

from __future__ import annotations

import warnings
from typing import Any

import dask.array as da
import numpy as np

from ..errors import DaskmeansWarning, DataError, DataTypeError
from ..validation import check_2d_numeric
from .blocks import float_dtype, non_numeric, rows_per_chunk


def is_dataframe(a: Any) -> bool:
    """Whether ``a`` is a pandas or Dask DataFrame (by duck type: neither is imported here)."""
    return type(a).__name__ == "DataFrame" and hasattr(a, "dtypes") and hasattr(a, "columns")


def from_dataframe(df: Any, cb: int | None) -> da.Array:
    """A pandas or Dask DataFrame of numeric columns (any other column is refused by name) as
    a Dask array (n_rows, n_columns): a pandas frame in chunks of about ``cb`` bytes, a Dask
    frame in its partitions."""
    bad = non_numeric(df.dtypes)
    if bad:
        raise DataError(f"column {bad[0][0]!r} of the DataFrame is not numeric (dtype {bad[0][1]}): pass its numeric "
                        f"columns, e.g. df.select_dtypes('number')")
    if isinstance(df, __import__("pandas").DataFrame):
        return from_memory(df.to_numpy(), cb)
    return df.to_dask_array(lengths=True)  # a Dask DataFrame: its partitions' lengths, one pass


def column_names(X: Any) -> np.ndarray | None:
    """The column names of ``X`` as scikit-learn takes them: an object array (n_features,) of
    str when ``X`` has ``columns`` (pandas, Dask or another DataFrame) all named by strings;
    None for no columns or names that are not strings (a pandas default of 0, 1, ...).

    Raises
    ------
    TypeError
        Names that mix strings and other types, as scikit-learn raises.
    """
    columns = getattr(X, "columns", None)
    if columns is None or isinstance(X, (str, bytes)) or hasattr(X, "__fspath__"):
        return None
    names = np.asarray(list(columns), dtype=object)
    if names.ndim != 1 or len(names) == 0:
        return None
    types = sorted({type(v).__qualname__ for v in names})
    if len(types) > 1 and "str" in types:
        raise TypeError(
            f"Feature names are only supported if all input features have string names, but your input has "
            f"{types} as feature name / column name types. If you want feature names to be stored and validated, "
            f"you must convert them all to strings, by using X.columns = X.columns.astype(str) for example. "
            f"Otherwise you can remove feature / column names from your input data, or convert them all to a "
            f"non-string data type."
        )
    return names if types == ["str"] else None


def is_sparse(a: Any) -> bool:
    """Whether ``a`` is a SciPy sparse matrix or array."""
    return type(a).__module__.startswith("scipy.sparse") and hasattr(a, "toarray")


def _densify(block: Any) -> np.ndarray:
    return np.asarray(block.toarray())


def from_sparse(a: Any, cb: int | None) -> da.Array:
    """A SciPy sparse matrix (n_rows, n_columns) as a Dask array, densified chunk by chunk
    (each chunk of about ``cb`` dense bytes; default ``daskmeans.chunk-bytes``)."""
    a = a.tocsr()
    check_2d_numeric(a.shape, a.dtype)
    n, d = a.shape
    rows = rows_per_chunk(d, float_dtype(a.dtype).itemsize, cb)
    blocks = [da.from_delayed(__import__("dask").delayed(_densify)(a[s : s + rows]), shape=(min(rows, n - s), d),
                              dtype=a.dtype) for s in range(0, n, rows)]
    return da.concatenate(blocks, axis=0)


def from_memory(a: Any, cb: int | None) -> da.Array:
    """A 2-D NumPy or CuPy array (n_rows, n_columns) as a Dask array of row chunks of about
    ``cb`` bytes (as the float data it becomes), CuPy blocks kept on the GPU; an object array
    of numbers becomes float64."""
    if a.dtype == object:
        a = _object_to_float(a)
    check_2d_numeric(getattr(a, "shape", ()), a.dtype)
    rows = rows_per_chunk(a.shape[1], float_dtype(a.dtype).itemsize, cb)
    return _views(a, rows)


def _views(a: Any, rows: int) -> da.Array:
    """``a`` as a Dask array whose chunks are views of its rows: no copy (``da.from_array``
    copies the whole array first, which cost a fit from memory more than its moments pass),
    CuPy rows kept on the GPU. Named by a hash of the contents (with ``xxhash`` installed,
    several GB/s), so that a re-fit of equal data finds its placement
    (:mod:`daskmeans.engine.reuse`) and changed data never does."""
    from dask.base import tokenize

    n, d = a.shape
    starts = range(0, n, rows) if n else [0]
    name = f"daskmeans-memory-{tokenize(a, rows)}"
    graph = {(name, i, 0): a[s : s + rows] for i, s in enumerate(starts)}
    chunks = (tuple(min(rows, n - s) for s in starts), (d,))
    return da.Array(graph, name, chunks, meta=a[:0])


def _object_to_float(a: np.ndarray) -> np.ndarray:
    """An object array of numbers as float64 (as NumPy and scikit-learn take it)."""
    try:
        out = np.asarray(a, dtype=np.float64)
    except TypeError as e:  # a value that is no number at all (a dict)
        raise DataTypeError(f"X has dtype object and a value that is not a number: {e}") from None
    except ValueError as e:  # a string that is not a number
        raise DataError(f"X has dtype object and a value that is not a number: {e}") from None
    warnings.warn("X is object: converted to float64 for clustering", DaskmeansWarning, stacklevel=4)
    return out
