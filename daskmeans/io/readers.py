"""Readers: Zarr (v2/v3, an array or an array in a group), numeric CSV and ``.npy`` to a 2-D
float32/float64 Dask array of row chunks sized by bytes (``daskmeans.chunk-bytes``).

Nothing is loaded into the client: each chunk is read by the task that needs it. In-memory
NumPy/CuPy arrays and Dask arrays are accepted too.
"""

from __future__ import annotations

import collections
import os
import warnings
from typing import Any, Sequence

import dask.array as da
import numpy as np

from .. import config
from ..errors import DaskmeansWarning, DataError, DataTypeError
from ..validation import check_2d_numeric

CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".tsv", ".txt")


def float_dtype(dtype: Any) -> np.dtype:
    """float32/float64 stay; float16 becomes float32; integers and bools become float64."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.dtype(np.float64) if dt.itemsize >= 8 else np.dtype(np.float32)
    if dt.kind in "iub":
        return np.dtype(np.float64)
    raise DataError(f"X should be numeric, got dtype {dt}")


def rows_per_chunk(n_features: int, itemsize: int, chunk_bytes: int | None = None, align: int = 1) -> int:
    """Rows in one chunk of about ``chunk_bytes``, a multiple of ``align`` (at least ``align``)."""
    cb = chunk_bytes if chunk_bytes is not None else config.get_bytes("chunk-bytes")
    rows = max(1, int(cb) // max(1, n_features * itemsize))
    return max(align, rows // align * align)


def read(
    source: Any,
    *,
    dataset: str | None = None,
    columns: Sequence[str | int] | None = None,
    drop_columns: Sequence[str | int] | None = None,
    chunk_bytes: int | str | None = None,
    delimiter: str | None = None,
) -> da.Array:
    """Open data as a 2-D float Dask array of row chunks (one chunk across columns).

    Parameters
    ----------
    source : str or path-like, or a NumPy / CuPy / Dask array
        ``*.zarr`` or any Zarr store directory, ``*.npy``, or ``*.csv`` (also ``.tsv``,
        ``.txt``, compressed ``.csv.gz``...).
    dataset : str, optional
        The array's path inside a Zarr group (needed when the group holds several arrays).
    columns, drop_columns : sequence of str or int, optional
        CSV only: features to keep, or to drop (e.g. a label column), by name or position.
    chunk_bytes : int or str, optional
        Target bytes per row chunk; default ``daskmeans.chunk-bytes``.
    delimiter : str, optional
        CSV only; guessed from the first line (comma, tab, semicolon, space) if omitted.

    Returns
    -------
    dask.array.Array, shape (n_samples, n_features), float32 or float64
    """
    cb = None if chunk_bytes is None else int(__import__("dask").utils.parse_bytes(chunk_bytes))
    if isinstance(source, da.Array):
        x = source
    elif isinstance(source, (str, os.PathLike)):
        # Absolute on the client: workers resolve a relative path from their own directory,
        # which on an external cluster is not the user's (it read as an empty store: zeros).
        path = os.path.abspath(os.fspath(source))
        if not os.path.exists(path):
            raise DataError(f"no such file or directory: {path}")
        lower = path.lower().rstrip("/")
        if (columns or drop_columns) and not lower.endswith(CSV_SUFFIXES):
            raise DataError("columns/drop_columns apply to CSV input only")
        if lower.endswith(".npy"):
            x = _read_npy(path, cb)
        elif lower.endswith(CSV_SUFFIXES):
            x = _read_csv(path, columns, drop_columns, cb, delimiter)
        elif os.path.isdir(path) or lower.endswith(".zarr") or lower.endswith(".zip"):
            x = _read_zarr(path, dataset, cb)
        else:
            raise DataError(f"cannot tell the format of {path}: expected a .zarr store, a .npy or a .csv file")
    elif _is_dataframe(source):
        x = _from_dataframe(source, cb)
    elif _is_sparse(source):
        x = _from_sparse(source, cb)
    elif hasattr(source, "shape") and hasattr(source, "dtype"):
        x = _from_memory(source, cb)
    elif isinstance(source, (list, tuple)) or hasattr(source, "__array__"):
        x = _from_memory(np.asarray(source), cb)
    else:
        raise DataError(f"X should be an array, a DataFrame or a path, got {type(source).__name__}")
    if any(np.isnan(c) for c in x.chunks[0]):
        warnings.warn("X has unknown chunk sizes: computing them (one pass over X)", DaskmeansWarning, stacklevel=2)
        x = x.compute_chunk_sizes()
    src = _SOURCES.get(x.name)
    x = _finish(x, cb)
    if src is not None:
        _remember(x.name, (*src[:-1], x.dtype))
    return x


# Arrays as read() returned them from a file, by Dask name: how to read them again in other
# row chunks. Splitting a chunk with rechunk would read the whole chunk once per part (the
# storage tier re-reads every part every pass); read again, each part reads only its rows.
_SOURCES: collections.OrderedDict[str, tuple] = collections.OrderedDict()
_MAX_SOURCES = 64


def _row_blocks(fn: Any, args: tuple, n: int, d: int, dtype: Any, rows: int, align: int) -> da.Array:
    """A Dask array of ``fn(*args, start, stop)`` blocks of ``rows`` rows (the last shorter)."""
    from dask import delayed

    blocks = [
        da.from_delayed(delayed(fn, pure=True)(*args, s, min(s + rows, n)), shape=(min(s + rows, n) - s, d), dtype=dtype)
        for s in range(0, n, rows)
    ]
    x = da.concatenate(blocks, axis=0)
    _remember(x.name, (fn, args, n, d, np.dtype(dtype), align, np.dtype(dtype)))
    return x


def _remember(name: str, src: tuple) -> None:
    _SOURCES[name] = src
    while len(_SOURCES) > _MAX_SOURCES:
        _SOURCES.popitem(last=False)


def split_rows(x: da.Array, rows: int) -> da.Array:
    """``x`` in chunks of about ``rows`` rows: read again from its file in those chunks when
    ``x`` is what :func:`read` returned for a file (rows rounded to the file's own chunks),
    else rechunked."""
    src = _SOURCES.get(x.name)
    if src is None:
        return x.rechunk({0: rows})
    fn, args, n, d, dtype, align, out_dtype = src
    y = _row_blocks(fn, args, n, d, dtype, max(align, rows // align * align), align)
    return y.astype(out_dtype) if y.dtype != out_dtype else y


def _finish(x: da.Array, cb: int | None) -> da.Array:
    check_2d_numeric(x.shape, x.dtype)
    dt = float_dtype(x.dtype)
    if x.dtype != dt:
        warnings.warn(f"X is {x.dtype}: converted to {dt} for clustering", DaskmeansWarning, stacklevel=3)
        x = x.astype(dt)
    if x.numblocks[1] != 1:
        x = x.rechunk({1: -1})
    return x


def _is_dataframe(a: Any) -> bool:
    return type(a).__name__ == "DataFrame" and hasattr(a, "dtypes") and hasattr(a, "columns")


def _from_dataframe(df: Any, cb: int | None) -> da.Array:
    """A pandas or Dask DataFrame of numeric columns (any other column is refused by name)."""
    bad = _non_numeric(df.dtypes)
    if bad:
        raise DataError(f"column {bad[0][0]!r} of the DataFrame is not numeric (dtype {bad[0][1]}): pass its numeric "
                        f"columns, e.g. df.select_dtypes('number')")
    if isinstance(df, __import__("pandas").DataFrame):
        return _from_memory(df.to_numpy(), cb)
    return df.to_dask_array(lengths=True)  # a Dask DataFrame: its partitions' lengths, one pass


def _is_sparse(a: Any) -> bool:
    return type(a).__module__.startswith("scipy.sparse") and hasattr(a, "toarray")


def _densify(block: Any) -> np.ndarray:
    return np.asarray(block.toarray())


def _from_sparse(a: Any, cb: int | None) -> da.Array:
    """A SciPy sparse matrix, densified chunk by chunk (each chunk of about ``chunk-bytes``
    dense bytes)."""
    a = a.tocsr()
    check_2d_numeric(a.shape, a.dtype)
    n, d = a.shape
    rows = rows_per_chunk(d, float_dtype(a.dtype).itemsize, cb)
    blocks = [da.from_delayed(__import__("dask").delayed(_densify)(a[s : s + rows]), shape=(min(rows, n - s), d),
                              dtype=a.dtype) for s in range(0, n, rows)]
    return da.concatenate(blocks, axis=0)


def _from_memory(a: Any, cb: int | None) -> da.Array:
    if a.dtype == object:
        a = _object_to_float(a)
    check_2d_numeric(getattr(a, "shape", ()), a.dtype)
    rows = rows_per_chunk(a.shape[1], float_dtype(a.dtype).itemsize, cb)
    # asarray=False keeps CuPy blocks as CuPy (da.from_array would otherwise call np.asarray)
    return da.from_array(a, chunks=(rows, a.shape[1]), asarray=False)


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


def _npy_block(path: str, start: int, stop: int) -> np.ndarray:
    return np.array(np.load(path, mmap_mode="r")[start:stop])


def _read_npy(path: str, cb: int | None) -> da.Array:
    if os.path.getsize(path) == 0:
        raise DataError(f"{path} is empty")
    try:
        mm = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"cannot read {path} as .npy: {e}") from None
    check_2d_numeric(mm.shape, mm.dtype)
    n, d = mm.shape
    rows = rows_per_chunk(d, float_dtype(mm.dtype).itemsize, cb)  # sized as the float data it becomes
    # One task per block opens the memory map itself: the array never travels in the graph.
    return _row_blocks(_npy_block, (path,), n, d, mm.dtype, rows, align=1)


def _read_zarr(path: str, dataset: str | None, cb: int | None) -> da.Array:
    import zarr

    try:
        node = zarr.open(path, mode="r")
    except Exception as e:  # zarr raises several types for "not a store"
        raise DataError(f"cannot open {path} as Zarr: {e}") from None
    if isinstance(node, zarr.Group):
        names = sorted(_array_paths(node))
        if dataset is None:
            if len(names) != 1:
                raise DataError(
                    f"{path} is a Zarr group with arrays {names}: choose one with dataset= (--dataset)"
                )
            dataset = names[0]
        if dataset not in names:
            raise DataError(f"dataset={dataset!r} is not an array in {path}; arrays: {names}")
        arr = node[dataset]
    else:
        if dataset is not None:
            raise DataError(f"{path} is a Zarr array, not a group: drop dataset={dataset!r}")
        arr = node
    check_2d_numeric(arr.shape, arr.dtype)
    zrows = int(arr.chunks[0])
    n, d = (int(s) for s in arr.shape)
    itemsize = float_dtype(arr.dtype).itemsize
    rows = rows_per_chunk(d, itemsize, cb, align=zrows)
    if cb is not None and cb < zrows * d * itemsize:
        # A task reads whole Zarr chunks: smaller row chunks would decompress each one repeatedly.
        warnings.warn(
            f"chunk_bytes={cb} (--chunk-bytes) is smaller than a chunk of {path} ({zrows} rows x {d} x {itemsize} bytes = "
            f"{zrows * d * itemsize} bytes): its own chunks ({zrows} rows) are used",
            DaskmeansWarning, stacklevel=3,
        )
    # One task per block opens the store itself (nothing but the path travels) and refuses a
    # missing chunk: Zarr reads an absent chunk as the fill value, which would silently turn
    # rows of a damaged or half-copied store into zeros.
    return _row_blocks(_zarr_block, (path, arr.path), n, d, arr.dtype, rows, align=zrows)


def _zarr_block(path: str, array_path: str, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the Zarr array ``array_path`` in the store at ``path``; a
    DataError if a chunk they lie in is absent from the store."""
    import zarr

    try:
        arr = zarr.open_array(store=path, path=array_path or None, mode="r")
    except Exception as e:  # deleted or unreadable since the client opened it
        raise DataError(f"cannot open {path} as Zarr on this worker: {e}") from None
    # Keys name storage objects: whole shards where the array is sharded.
    grid = getattr(arr, "shards", None) or arr.chunks
    zrows, zcols = int(grid[0]), int(grid[1])
    d = int(arr.shape[1])
    for i in range(start // zrows, -(-stop // zrows)):
        for j in range(-(-d // zcols)):
            key = arr.metadata.encode_chunk_key((i, j))
            if not _store_has(arr, key):
                full = "/".join(p for p in (array_path, key) if p)
                raise DataError(
                    f"Zarr chunk {full} of {path} is missing (rows {i * zrows} to "
                    f"{min((i + 1) * zrows, int(arr.shape[0])) - 1}): the store is incomplete"
                )
    try:
        return np.asarray(arr[start:stop])
    except Exception as e:  # a corrupt chunk: a codec error names no row
        raise DataError(f"cannot read rows {start} to {stop - 1} of {path}: {type(e).__name__}: {e}") from None


def _store_has(arr: Any, key: str) -> bool:
    """Whether the store of ``arr`` holds chunk ``key`` (a file test for local stores)."""
    import zarr.storage

    sp = arr.store_path
    full = "/".join(p for p in (sp.path, key) if p)
    if isinstance(sp.store, zarr.storage.LocalStore):
        return os.path.exists(os.path.join(str(sp.store.root), *full.split("/")))
    from zarr.core.sync import sync  # other stores' API is async only

    return bool(sync(sp.store.exists(full)))


def _array_paths(group: Any, prefix: str = "") -> list[str]:
    out = []
    for name, arr in group.arrays():
        out.append(prefix + name)
    for name, sub in group.groups():
        out += _array_paths(sub, prefix + name + "/")
    return out


def _guess_layout(path: str, delimiter: str | None) -> tuple[str, bool]:
    """(delimiter, has_header) from the first line: a header has a non-numeric field."""
    import gzip
    import bz2
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(os.path.splitext(path)[1], open)
    with opener(path, "rt") as f:
        first = f.readline().strip()
    if not first:
        raise DataError(f"{path} is empty")
    if delimiter is None:
        counts = {d: first.count(d) for d in (",", "\t", ";")}
        delimiter = max(counts, key=counts.get) if max(counts.values()) > 0 else " "
    fields = [s.strip().strip('"') for s in (first.split() if delimiter == " " else first.split(delimiter))]

    def numeric(s: str) -> bool:
        try:
            float(s)
            return True
        except ValueError:
            return s == ""

    # A non-numeric data file also "has a header" by this test; the dtype check after
    # parsing then names the offending column.
    return delimiter, not all(numeric(s) for s in fields)


def _read_csv(path, columns, drop_columns, cb, delimiter) -> da.Array:
    import dask.dataframe as dd

    delim, header = _guess_layout(path, delimiter)
    kwargs: dict[str, Any] = {"header": 0 if header else None}
    if delim == " ":
        kwargs["sep"] = r"\s+"
    else:
        kwargs["sep"] = delim
    compression = "infer"
    blocksize = cb if cb is not None else config.get_bytes("chunk-bytes")
    if os.path.splitext(path)[1] in (".gz", ".bz2", ".xz"):
        blocksize = None  # compressed files cannot be split
    try:
        df = dd.read_csv(path, blocksize=blocksize, compression=compression, **kwargs)
    except Exception as e:
        raise DataError(f"cannot read {path} as CSV: {e}") from None
    names = list(df.columns)
    if not header:
        df.columns = [str(c) for c in names]
        names = list(df.columns)
    df = df[_select(names, columns, drop_columns, path)]
    def not_numeric(column: str, what: str) -> DataError:
        return DataError(f"column {column!r} of {path} is not numeric ({what}); select features with "
                         f"--columns or --drop-columns")

    bad = _non_numeric(df.dtypes)
    if bad:
        c, t = bad[0]
        raise not_numeric(c, _first_non_numeric(path, c, header, kwargs["sep"]) or f"dtype {t}")
    try:
        x = df.to_dask_array(lengths=True)
    except ValueError as e:  # a value that pandas could not parse as a number, past the sample
        for c in df.columns:
            where = _first_non_numeric(path, c, header, kwargs["sep"], rows=1_000_000)
            if where:
                raise not_numeric(c, where) from None
        raise DataError(f"{path} has a non-numeric value: {str(e).strip().splitlines()[0]}") from None
    return x


def _non_numeric(dtypes: Any) -> list[tuple[str, str]]:
    """``(column, dtype)`` of the columns that are not numbers (booleans are not)."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    return [(c, str(t)) for c, t in dtypes.items() if not is_numeric_dtype(t) or is_bool_dtype(t)]


def _first_non_numeric(path: str, column: str, header: bool, sep: str, rows: int = 100_000) -> str | None:
    """``line N has 'x'`` for the first cell of ``column`` in the first ``rows`` rows that is
    neither a number nor empty (None if there is none there)."""
    import pandas as pd

    try:
        head = pd.read_csv(path, sep=sep, header=0 if header else None, nrows=rows, dtype=str,
                           keep_default_na=False)
    except Exception:
        return None
    head.columns = [str(c) for c in head.columns]
    if column not in head.columns:
        return None
    cells = head[column].str.strip()
    bad = cells[(cells != "") & pd.to_numeric(cells, errors="coerce").isna()]
    if bad.empty:
        return None
    return f"line {int(bad.index[0]) + (2 if header else 1)} has {bad.iloc[0]!r}"


def _select(names: list[str], columns, drop_columns, path: str) -> list[str]:
    def resolve(spec) -> str:
        s = str(spec)
        if s in names:
            return s
        if s.lstrip("-").isdigit():
            i = int(s)
            if -len(names) <= i < len(names):
                return names[i]
        raise DataError(f"column {spec!r} is not in {path}; columns: {names}")

    if columns is not None and drop_columns is not None:
        raise DataError("give columns or drop_columns, not both")
    if columns is not None:
        keep = [resolve(c) for c in columns]
    else:
        drop = {resolve(c) for c in (drop_columns or [])}
        keep = [c for c in names if c not in drop]
    if not keep:
        raise DataError(f"no columns left to cluster in {path}")
    return keep
