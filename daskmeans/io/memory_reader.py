"""Data in memory that is not an array yet: pandas and Dask DataFrames, SciPy sparse matrices,
lists and other array-likes, as an array and their columns' names (:func:`as_array`).

A NumPy or CuPy array needs nothing of this module: :func:`daskmeans.io.blocks.from_memory`
makes any array in memory (one given, or one made here) a Dask array of views of its rows, as
:func:`daskmeans.io.readers.read_table` does with a Dask array given. Sparse rows and a Dask
DataFrame's partitions become a Dask array here (densified chunk by chunk; read in one pass
for their lengths)."""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from ..errors import DataError
from ..validation import check_2d_numeric
from .blocks import float_dtype, non_numeric, rows_per_chunk


def is_dataframe(a: Any) -> bool:
    """Whether ``a`` is a pandas or Dask DataFrame (by duck type: neither is imported here)."""
    return type(a).__name__ == "DataFrame" and hasattr(a, "dtypes") and hasattr(a, "columns")


def as_array(source: Any, cb: int | None) -> tuple[Any, np.ndarray | None]:
    """``source``, data in memory that is not a NumPy, CuPy or Dask array, as an array
    (n_rows, n_columns), and its columns' names.

    Parameters
    ----------
    source : DataFrame, sparse matrix, list or array-like
        A pandas or Dask DataFrame (numeric columns), a SciPy sparse matrix or array, a list
        of rows, or anything with ``shape`` and ``dtype`` or ``__array__``.
    cb : int or None
        Dense bytes per chunk of a sparse matrix densified (default ``daskmeans.chunk-bytes``).

    Returns
    -------
    (array, ndarray (n_columns,) of str or None)
        An array in memory (a pandas frame's values, a list's; an array-like as it is), which
        :func:`daskmeans.io.blocks.from_memory` cuts into row chunks, or a Dask array (a Dask
        DataFrame's partitions, sparse rows densified chunk by chunk); the names as
        :func:`column_names` gives them.

    Raises
    ------
    DataError
        A non-numeric column, or ``source`` is none of these kinds.
    TypeError
        Column names that mix strings and other types (scikit-learn's error).
    """
    names = column_names(source)
    if is_dataframe(source):
        return from_dataframe(source), names
    if is_sparse(source):
        return from_sparse(source, cb), names
    if hasattr(source, "shape") and hasattr(source, "dtype"):
        return source, names
    if isinstance(source, (list, tuple)) or hasattr(source, "__array__"):
        return np.asarray(source), names
    raise DataError(f"X should be an array, a DataFrame or a path, got {type(source).__name__}")


def from_dataframe(df: Any) -> Any:
    """A pandas or Dask DataFrame of numeric columns (any other column is refused by name) as
    an array (n_rows, n_columns): a pandas frame's values (a NumPy array), a Dask frame's
    partitions as a Dask array."""
    bad = non_numeric(df.dtypes)
    if bad:
        raise DataError(f"column {bad[0][0]!r} of the DataFrame is not numeric (dtype {bad[0][1]}): pass its numeric "
                        f"columns, e.g. df.select_dtypes('number')")
    if isinstance(df, __import__("pandas").DataFrame):
        return df.to_numpy()
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
