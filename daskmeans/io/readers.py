"""Readers: files by format (a registry of one module per format, chosen by suffix) and data in
memory, to a 2-D float32/float64 Dask array of row chunks sized by bytes
(``daskmeans.chunk-bytes``).

Nothing is loaded into the client: each chunk is read by the task that needs it (a CSV file's
line breaks are counted by tasks too, for the chunks' lengths). In-memory NumPy/CuPy arrays,
DataFrames, sparse matrices and Dask arrays are accepted too.

Adding a format is a module with an ``open_<format>(path, chunk_bytes, dtype, **options)``
function (see :mod:`daskmeans.io.npy_reader`) and an entry in :data:`FORMATS` (or a call of
:func:`register`). A reader returns its array, or a :class:`Table` of it; what the engine
needs of its source comes with it: :func:`read_table` names the file in every task the reader
makes (a Dask annotation, :func:`daskmeans.io.blocks.files_of`), and an array made by
:func:`daskmeans.io.blocks.row_blocks` says how it is read again in other row chunks
(``Table.rows``). Nothing is registered on the side.

:func:`read_table` also returns what the source says of its columns (:class:`Table`): their
names (a CSV header, a Zarr array's ``feature_names`` attribute, a DataFrame's column names),
which a model keeps and checks, and, for CSV, other columns read by name (labels written
beside an id column).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import dask
import dask.array as da
import numpy as np

from ..errors import DaskmeansWarning, DataError
from . import csv_reader, memory_reader, npy_reader, zarr_reader
from .blocks import (
    FILE_ANNOTATION, RowSource, Table, file_of, files_of, finish, float_dtype, float_dtype_arg, from_memory, rows_of,
    rows_per_chunk, split_rows, with_rows,
)

__all__ = ["FORMATS", "Format", "RowSource", "Table", "file_of", "files_of", "float_dtype", "format_of", "read",
           "read_table", "read_weights", "register", "rows_of", "rows_per_chunk", "split_rows", "unregister"]


@dataclass(frozen=True)
class Format:
    """A file format :func:`read` opens.

    Attributes
    ----------
    name : str
        For messages ("CSV").
    suffixes : tuple of str
        Lower-case endings of its paths (``".csv.gz"``).
    open : callable
        ``open(path, chunk_bytes, dtype, **options) -> dask.array.Array`` of shape
        (n_samples, n_features), row chunks of about ``chunk_bytes`` (None: the default); it
        may parse straight to ``dtype`` (float32/float64 or None), else :func:`read` converts.
        A format whose files name their columns returns a :class:`Table` of that array instead.
    options : tuple of str
        :func:`read`'s keyword arguments it takes (given to ``open`` by name).
    directories : bool
        A directory of any name is of this format (a Zarr store).
    """

    name: str
    suffixes: tuple[str, ...]
    open: Callable[..., "da.Array | Table"]
    options: tuple[str, ...] = ()
    directories: bool = False


FORMATS: tuple[Format, ...] = (
    Format("CSV", csv_reader.SUFFIXES, csv_reader.open_csv, options=("columns", "drop_columns", "delimiter")),
    Format(".npy", npy_reader.SUFFIXES, npy_reader.open_npy),
    Format("Zarr", zarr_reader.SUFFIXES, zarr_reader.open_zarr, options=("dataset",), directories=True),
)


def register(fmt: Format) -> None:
    """Add the format ``fmt`` to :data:`FORMATS` (tried after those before it).

    Raises
    ------
    ValueError
        Its name is taken, or a suffix is another format's.
    """
    global FORMATS
    for other in FORMATS:
        shared = set(fmt.suffixes) & set(other.suffixes)
        if other.name == fmt.name or shared:
            what = f"name {fmt.name!r}" if other.name == fmt.name else f"suffix {sorted(shared)[0]!r}"
            raise ValueError(f"format {fmt.name!r}: its {what} is the {other.name} format's already")
    FORMATS = FORMATS + (fmt,)


def unregister(name: str) -> None:
    """Remove the format named ``name`` from :data:`FORMATS`."""
    global FORMATS
    if name not in {f.name for f in FORMATS}:
        raise ValueError(f"format {name!r} is not registered: registered are {[f.name for f in FORMATS]}")
    FORMATS = tuple(f for f in FORMATS if f.name != name)


def format_of(path: str) -> Format:
    """The format of the file or directory ``path`` (an existing path): by its suffix, else
    a directory's format; a DataError naming the known suffixes otherwise."""
    lower = path.lower().rstrip("/")
    for fmt in FORMATS:
        if lower.endswith(fmt.suffixes):
            return fmt
    if os.path.isdir(path):
        for fmt in FORMATS:
            if fmt.directories:
                return fmt
    known = ", ".join(s for fmt in FORMATS for s in fmt.suffixes)
    raise DataError(f"cannot tell the format of {path}: expected a file or directory ending in one of {known}")


def read(
    source: Any,
    *,
    dataset: str | None = None,
    columns: str | Sequence[str | int] | None = None,
    drop_columns: str | Sequence[str | int] | None = None,
    chunk_bytes: int | str | None = None,
    delimiter: str | None = None,
    dtype: Any = None,
    **options: Any,
) -> da.Array:
    """Open data as a 2-D float Dask array of row chunks (one chunk across columns); a CSV
    column that looks like an identifier (see :func:`read_table`) is refused.

    Parameters
    ----------
    source : str or path-like, or a NumPy / CuPy / Dask array, a DataFrame, a sparse matrix
        A path of one of :data:`FORMATS`: ``*.zarr`` or any Zarr store directory, ``*.npy``,
        or ``*.csv`` (also ``.tsv``, ``.txt``, compressed ``.csv.gz``...).
    dataset : str, optional
        Zarr only: the array's path inside a group (needed when the group holds several arrays).
    columns, drop_columns : str or sequence of str or int, optional
        CSV only: features to keep, or to drop (e.g. a label column), by name or position;
        a string is a comma-separated list (``"id,label"``).
    chunk_bytes : int or str, optional
        Target bytes per row chunk; default ``daskmeans.chunk-bytes``.
    delimiter : str, optional
        CSV only; guessed from the first line (comma, tab, semicolon, space) if omitted.
    dtype : {"float32", "float64"}, optional
        The array's dtype. Default: float32 for CSV (``daskmeans.csv-dtype``; text is parsed
        straight to it), the stored float dtype for other data (float16 becomes float32,
        integers float64).
    **options
        Options of other formats of :data:`FORMATS`, by name.

    Returns
    -------
    dask.array.Array, shape (n_samples, n_features), float32 or float64
        For CSV, chunks of about ``chunk_bytes`` of text, each parsed by one task.

    Raises
    ------
    DataError
        The data cannot be read or clustered, or a CSV column looks like an identifier.
    """
    table = _read_table(source, dataset, columns, drop_columns, chunk_bytes, delimiter, dtype, options)
    # The array alone goes on to a fit without its columns' names: refused here as a fit would.
    table.refuse_identifiers()
    return table.array


def read_table(
    source: Any,
    *,
    dataset: str | None = None,
    columns: str | Sequence[str | int] | None = None,
    drop_columns: str | Sequence[str | int] | None = None,
    chunk_bytes: int | str | None = None,
    delimiter: str | None = None,
    dtype: Any = None,
    **options: Any,
) -> Table:
    """:func:`read`, with what the source says of its columns: their names and, for CSV,
    whether one looks like an identifier (refused by a fit, not here) and its other columns.

    Parameters
    ----------
    source : path, array, DataFrame or Table
        As :func:`read`; a :class:`Table` is returned as it is, as lazy data (its array
        converted to ``dtype`` where given).
    dataset, columns, drop_columns, chunk_bytes, delimiter, dtype, **options
        As :func:`read`.

    Returns
    -------
    Table
        ``columns`` from a CSV header, a Zarr array's ``feature_names`` attribute (a list of
        one string per column), or a DataFrame's string column names; None otherwise.

    Raises
    ------
    TypeError
        A DataFrame's column names mix strings and other types (scikit-learn's error).
    """
    return _read_table(source, dataset, columns, drop_columns, chunk_bytes, delimiter, dtype, options)


def _read_table(source: Any, dataset: Any, columns: Any, drop_columns: Any, chunk_bytes: Any, delimiter: Any,
                dtype: Any, options: dict) -> Table:
    """:func:`read_table`'s work, for it and :func:`read` (its warnings name their caller's caller)."""
    if isinstance(source, Table):
        x = finish(source.array, None if dtype is None else float_dtype_arg(dtype))
        # Read again, the Table is lazy data: its array's outputs stay lazy.
        return source if x is source.array and not source.in_memory else \
            dataclasses.replace(source, array=x, in_memory=False)
    cb = None if chunk_bytes is None else int(__import__("dask").utils.parse_bytes(chunk_bytes))
    dt = None if dtype is None else float_dtype_arg(dtype)
    takers = {name for fmt in FORMATS for name in fmt.options}
    for name in options:
        if name not in takers:
            raise TypeError(f"read() got an unexpected keyword argument {name!r}")
    options = {"dataset": dataset, "columns": columns, "drop_columns": drop_columns, "delimiter": delimiter, **options}
    if isinstance(source, (str, os.PathLike)):
        # Absolute on the client: workers resolve a relative path from their own directory,
        # which on an external cluster is not the user's (it read as an empty store: zeros).
        path = os.path.abspath(os.fspath(source))
        if not os.path.exists(path):
            raise DataError(f"no such file or directory: {path}")
        fmt = format_of(path)
        for name, value in options.items():
            if name not in fmt.options and _given(value):
                takers = "/".join(f.name for f in FORMATS if name in f.options)
                raise DataError(f"{name}={value!r} applies to {takers} input only, not to {path}")
        # Every task the reader makes names the file (whatever is derived from its array).
        with dask.annotate(**{FILE_ANNOTATION: path}):
            opened = fmt.open(path, cb, dt, **{k: v for k, v in options.items() if k in fmt.options})
        # A format that knows more of its columns than the array says so in a Table.
        table = opened if isinstance(opened, Table) else Table(opened)
        rows = table.rows or rows_of(table.array)
        rows = None if rows is None else dataclasses.replace(rows, path=path)
        x, meta = table.array, dataclasses.replace(table, source=path, rows=rows)
    else:
        # An array is rows as it is: a Dask array's chunks, or views of an array in memory
        # (NumPy, CuPy) in row chunks; other data in memory (a DataFrame, a sparse matrix, a
        # list) is made an array first, with its columns' names (a path's are its reader's).
        x, names = (source, None) if _array(source) else memory_reader.as_array(source, cb)
        if not isinstance(x, da.Array):
            x = from_memory(x, cb)
        # A Dask array a reader returned earlier (read()'s) is read again in other chunks too.
        meta = Table(x, None if names is None else tuple(str(n) for n in names), rows=rows_of(x),
                     in_memory=not dask.is_dask_collection(source))
    if any(np.isnan(c) for c in x.chunks[0]):
        warnings.warn("X has unknown chunk sizes: computing them (one pass over X)", DaskmeansWarning, stacklevel=3)
        x = x.compute_chunk_sizes()
    rows = meta.rows
    y = finish(x, dt)
    if rows is not None and rows.out_dtype != y.dtype:
        rows = dataclasses.replace(rows, out_dtype=np.dtype(y.dtype))
    if rows is not None:
        with_rows(y, rows)  # read()'s bare array is read again in other chunks too (split_rows)
    if meta.columns is not None and len(meta.columns) != int(y.shape[1]):
        raise DataError(f"{meta.source or 'X'} names {len(meta.columns)} columns but has {int(y.shape[1])}")
    return dataclasses.replace(meta, array=y, rows=rows)


def _array(source: Any) -> bool:
    """Whether ``source`` is an array whose rows a fit reads as they are: a Dask array, or a
    NumPy or CuPy array in memory (no columns' names, nothing to convert first)."""
    return isinstance(source, (da.Array, np.ndarray)) or hasattr(source, "__cuda_array_interface__")


def _given(value: Any) -> bool:
    """Whether a reader option was given: not None, and not an empty string or list."""
    return value is not None and not (isinstance(value, (str, list, tuple)) and len(value) == 0)


def read_weights(sample_weight: Any, x: da.Array) -> da.Array:
    """``sample_weight`` (n_samples,) as a Dask array in ``x``'s row chunks and dtype.

    NumPy, CuPy and Dask arrays, lists, and pandas or Dask Series are accepted.
    """
    n = int(x.shape[0])
    w = sample_weight
    if hasattr(w, "to_dask_array"):  # a Dask Series
        w = w.to_dask_array(lengths=True)
    elif not isinstance(w, da.Array) and not hasattr(w, "__cuda_array_interface__"):
        w = np.asarray(w)  # lists, pandas Series, objects with __array__
    shape = tuple(int(s) for s in w.shape)
    if shape != (n,):
        raise DataError(f"sample_weight has shape {shape}, should be (n_samples,) = ({n},)")
    if np.dtype(w.dtype).kind not in "iuf":
        raise DataError(f"sample_weight should be numeric, got dtype {np.dtype(w.dtype)}")
    if isinstance(w, da.Array):
        w = w.rechunk((x.chunks[0],))
    else:
        w = da.from_array(w, chunks=(x.chunks[0],), asarray=False)
    return w.astype(x.dtype)
