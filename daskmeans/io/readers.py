"""Readers: Zarr (v2/v3, an array or an array in a group), numeric CSV and ``.npy`` to a 2-D
float32/float64 Dask array of row chunks sized by bytes (``daskmeans.chunk-bytes``).

Nothing is loaded into the client: each chunk is read by the task that needs it (a CSV file's
line breaks are counted by tasks too, for the chunks' lengths). In-memory NumPy/CuPy arrays and
Dask arrays are accepted too.
"""

from __future__ import annotations

import collections
import io
import os
import warnings
from typing import Any, NamedTuple, Sequence

import dask.array as da
import numpy as np

from .. import config
from ..errors import DaskmeansWarning, DataError, DataTypeError, InvalidParameterError
from ..validation import check_2d_numeric
from . import zarr_chunks
from .ranges import read_into

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
    dtype: Any = None,
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
    dtype : {"float32", "float64"}, optional
        The array's dtype. Default: float32 for CSV (``daskmeans.csv-dtype``; text is parsed
        straight to it), the stored float dtype for other data (float16 becomes float32,
        integers float64).

    Returns
    -------
    dask.array.Array, shape (n_samples, n_features), float32 or float64
        For CSV, chunks of about ``chunk_bytes`` of text, each parsed by one task.
    """
    cb = None if chunk_bytes is None else int(__import__("dask").utils.parse_bytes(chunk_bytes))
    dt = None if dtype is None else _float_dtype_arg(dtype)
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
            x = _read_csv(path, columns, drop_columns, cb, delimiter, dt)
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
    x = _finish(x, cb, dt)
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


def _finish(x: da.Array, cb: int | None, dtype: np.dtype | None = None) -> da.Array:
    check_2d_numeric(x.shape, x.dtype)
    dt = float_dtype(x.dtype) if dtype is None else dtype
    if x.dtype != dt:
        if dtype is None:  # a conversion the user did not ask for
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
    mm = np.load(path, mmap_mode="r")
    if not mm.flags.c_contiguous:  # Fortran order: the rows are not byte ranges
        return np.array(mm[start:stop])
    out = np.empty((stop - start,) + mm.shape[1:], mm.dtype)
    row = mm.dtype.itemsize * int(np.prod(mm.shape[1:]))
    read_into(path, mm.offset + start * row, memoryview(out).cast("B"))
    return out


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
    lay = zarr_chunks.layout(arr)
    try:
        return zarr_chunks.read_rows(lay, start, stop) if lay is not None else np.asarray(arr[start:stop])
    except DataError:
        raise
    except Exception as e:  # a corrupt chunk: a codec error names no row
        raise DataError(f"cannot read rows {start} to {stop - 1} of {path}: {type(e).__name__}: {e}") from None


def _store_has(arr: Any, key: str) -> bool:
    """Whether the store of ``arr`` holds chunk ``key`` (a file test for local stores)."""
    local = zarr_chunks.chunk_file(arr, key)
    if local is not None:
        return os.path.exists(local)
    from zarr.core.sync import sync  # other stores' API is async only

    sp = arr.store_path
    return bool(sync(sp.store.exists("/".join(p for p in (sp.path, key) if p))))


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


def _non_numeric(dtypes: Any) -> list[tuple[str, str]]:
    """``(column, dtype)`` of the columns that are not numbers (booleans are not)."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    return [(c, str(t)) for c, t in dtypes.items() if not is_numeric_dtype(t) or is_bool_dtype(t)]


# ---------------------------------------------------------------- CSV
#
# A plain CSV file is cut into blocks of about ``chunk-bytes`` of text, each starting just after
# a line break, and one task parses each block with pyarrow's multithreaded parser, straight to
# the float dtype. The rows of each block come from counting its line breaks in parallel tasks
# (several times faster than parsing), so the array's chunk lengths are known without parsing
# the file twice. A compressed file cannot be cut: it is one block, its line breaks counted
# while it is decompressed. A block with a cell pyarrow refuses (a short row, a value pandas
# reads and pyarrow does not) goes to pandas' parser, which reads it as before or names the cell.

_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}
_COUNT_BYTES = 16 << 20  # text one counting task scans: its temporaries stay in the tens of MB
_SAMPLE_BYTES = 1 << 20  # the head parsed in the client for the columns' names and types
# Cells read as NaN: pandas' default na_values, given to pyarrow too so that both parsers agree.
_NA_VALUES = ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
              "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null")


class _CsvSpec(NamedTuple):
    """How a task reads a block of a CSV file (small: it travels in every task)."""

    path: str
    size: int  # bytes of the file when read() opened it: the block offsets hold for these only
    mtime_ns: int  # only in the tasks' Dask names: a rewritten file gets new keys
    compression: str | None  # "gzip", "bz2", "lzma" or None
    delimiter: str  # " " stands for runs of whitespace, as in read()
    n_columns: int
    keep: tuple[int, ...]  # positions of the columns read, in the array's order
    names: tuple[str, ...]  # their names, for messages (positions as strings without a header)
    dtype: str  # "float32" or "float64"
    block_size: int  # pyarrow's unit of parallel parsing: several of the longest lines


def _float_dtype_arg(dtype: Any, what: str = "dtype") -> np.dtype:
    """``dtype`` as float32 or float64; anything else is an InvalidParameterError naming it."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.name not in ("float32", "float64"):
        raise InvalidParameterError(f"{what}={dtype!r} should be float32 or float64")
    return dt


def _read_csv(path: str, columns, drop_columns, cb: int | None, delimiter: str | None,
              dtype: np.dtype | None) -> da.Array:
    """A CSV file as a Dask array of row chunks of about ``cb`` bytes of text each (default
    ``daskmeans.chunk-bytes``), their lengths known.

    Returns
    -------
    dask.array.Array, shape (n_rows, n_columns_kept), ``dtype`` (default
    ``daskmeans.csv-dtype``, float32)
    """
    import dask
    from dask import delayed

    if dtype is None:
        dtype = _float_dtype_arg(config.get("csv-dtype"), "daskmeans.csv-dtype")
    delim, header = _guess_layout(path, delimiter)
    compression = _COMPRESSION.get(os.path.splitext(path)[1].lower())
    head, whole = _head(path, compression)
    start = (head.find(b"\n") + 1 or len(head)) if header else 0  # the first data byte
    first_line = 2 if header else 1  # line numbers in messages count the header
    # The sample ends at a line break unless it is the whole file.
    sample = head[start:] if whole else head[start : max(start, head.rfind(b"\n") + 1)]
    names, keep = _csv_columns(path, head[:start] + sample, header, delim, columns, drop_columns, first_line)
    longest = max((len(s) for s in sample.split(b"\n")), default=0)
    st = os.stat(path)
    spec = _CsvSpec(path, st.st_size, st.st_mtime_ns, compression, delim, len(names), tuple(keep),
                    tuple(names[k] for k in keep), dtype.name, min(2**30, max(1 << 20, 8 * longest)))
    # Blocks (first byte, end, line breaks, rows) over the data: from ``start`` to the line
    # break after the last cell that is not whitespace (lines of whitespace after it are no rows).
    if compression:
        ((breaks, rows, stop),) = dask.compute(delayed(_count_stream, pure=True)(spec, start))
        layout = [(start, stop, breaks, rows)]
    else:
        stop, unended = _data_end(path, start, st.st_size)
        bounds = _block_bounds(path, start, stop, cb if cb is not None else config.get_bytes("chunk-bytes"))
        tasks = [[delayed(_count_lines, pure=True)(spec, s, min(s + _COUNT_BYTES, e)) for s in range(b, e, _COUNT_BYTES)]
                 for b, e in bounds]
        (counts,) = dask.compute(tasks)
        layout = [(b, e, sum(p[0] for p in parts), sum(p[1] for p in parts)) for (b, e), parts in zip(bounds, counts)]
        if layout:  # the last line, with no line break, is a row too
            layout[-1] = (*layout[-1][:3], layout[-1][3] + unended)
    blocks, line = [], first_line
    for b, e, breaks, rows in layout:
        if rows:
            blocks.append(da.from_delayed(delayed(_csv_block, pure=True)(spec, b, e, line, rows),
                                          shape=(rows, len(keep)), dtype=dtype))
        line += breaks
    if not blocks:  # a header and no rows: refused by name in read()
        return da.zeros((0, len(keep)), dtype=dtype)
    return da.concatenate(blocks, axis=0)


def _open_text(path: str, compression: str | None) -> Any:
    """The file's bytes, decompressed (a binary file object)."""
    if compression is None:
        return open(path, "rb")
    return __import__(compression).open(path, "rb")


def _head(path: str, compression: str | None) -> tuple[bytes, bool]:
    """The first ``_SAMPLE_BYTES`` or more of the (decompressed) file, up to 64 times that to
    hold a few lines, and whether that is the whole file. A DataError if its lines end with
    CR alone (classic Mac OS): the rows are counted by their LF."""
    with _open_text(path, compression) as f:
        head = f.read(_SAMPLE_BYTES)
        while head.count(b"\n") < 3 and len(head) < 64 * _SAMPLE_BYTES:
            more = f.read(len(head))
            if not more:
                break
            head += more
        whole = not f.read(1)
    cr, lf = head.find(b"\r"), head.find(b"\n")
    if cr >= 0 and head[cr + 1 : cr + 2] != b"\n" and (lf < 0 or cr < lf):
        raise DataError(f"{path} ends its lines with CR alone (classic Mac OS), not LF or CRLF: convert it, "
                        f"e.g. tr '\\r' '\\n' < old.csv > new.csv")
    return head, whole


def _csv_columns(path: str, sample: bytes, header: bool, delim: str, columns, drop_columns,
                 first_line: int) -> tuple[list[str], list[int]]:
    """(the file's column names, positions of the columns to read) from a sample of its first
    lines; a DataError names a non-numeric column to read and its first such cell."""
    import pandas as pd

    try:
        df = pd.read_csv(io.BytesIO(sample), sep=_pandas_sep(delim), header=0 if header else None)
    except Exception as e:
        raise DataError(f"cannot read {path} as CSV: {str(e).strip()}") from None
    names = [str(c) for c in df.columns]
    df.columns = names
    kept = _select(names, columns, drop_columns, path)
    bad = _non_numeric(df[kept].dtypes)
    if bad:
        c, t = bad[0]
        data = sample[sample.find(b"\n") + 1 :] if header else sample
        where = _first_non_numeric(data, delim, len(names), names.index(c), first_line)
        raise _not_numeric(path, c, where or f"dtype {t}")
    return names, [names.index(c) for c in kept]


def _pandas_sep(delim: str) -> str:
    return r"\s+" if delim == " " else delim


def _not_numeric(path: str, column: str, what: str) -> DataError:
    return DataError(f"column {column!r} of {path} is not numeric ({what}); select features with "
                     f"--columns or --drop-columns")


def _block_bounds(path: str, start: int, stop: int, blocksize: int) -> list[tuple[int, int]]:
    """Byte ranges ``[b, e)`` that tile ``start:stop``, cut at the first line break from each
    multiple of ``blocksize`` (from ``start``) on: blocks of about ``blocksize`` in whole lines."""
    import mmap

    if start >= stop:
        return []
    bs, cuts = max(1, blocksize), [start]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        while True:  # the next multiple of bs past the last cut (a line may span several)
            nl = mm.find(b"\n", start + ((cuts[-1] - start) // bs + 1) * bs - 1, stop)
            if nl < 0 or nl + 1 >= stop:
                break
            cuts.append(nl + 1)
    return list(zip(cuts, cuts[1:] + [stop]))


def _count_rows(a: np.ndarray, start: int, stop: int) -> tuple[int, int]:
    """(line breaks in ``a[start:stop]``, rows they end): a break ends no row where its line
    is blank (empty, or a lone CR), as both parsers skip those. Bytes before ``a[0]`` count
    as a line break (a line starts there)."""
    idx = np.flatnonzero(a[start:stop] == 10)
    if idx.size == 0:
        return 0, 0
    idx += start
    p1, p2 = a[np.maximum(idx - 1, 0)], a[np.maximum(idx - 2, 0)]
    p1[idx < 1] = 10
    p2[idx < 2] = 10
    blank = (p1 == 10) | ((p1 == 13) & (p2 == 10))
    return int(idx.size), int(idx.size - np.count_nonzero(blank))


def _check_size(spec: _CsvSpec) -> None:
    size = os.path.getsize(spec.path)
    if size != spec.size:
        raise DataError(f"{spec.path} changed since it was opened: {size} bytes, was {spec.size}; read it again")


def _count_lines(spec: _CsvSpec, start: int, stop: int) -> tuple[int, int]:
    """(line breaks, rows they end) in bytes ``start:stop`` of a plain file."""
    _check_size(spec)
    return _count_rows(np.memmap(spec.path, dtype=np.uint8, mode="r"), start, stop)


def _data_end(path: str, start: int, size: int) -> tuple[int, int]:
    """(end of the data, 1 if its last line has no line break else 0): the data ends with the
    line break after its last byte that is not whitespace, or at that byte."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = size
        while pos > start:  # back over trailing whitespace, 64 KiB at a time
            lo = max(start, pos - (1 << 16))
            kept = len(mm[lo:pos].rstrip())
            if kept:
                end = lo + kept
                nl = mm.find(b"\n", end)
                return (nl + 1, 0) if nl >= 0 else (end, 1)
            pos = lo
    return start, 0


def _count_stream(spec: _CsvSpec, start: int) -> tuple[int, int, int]:
    """(line breaks, rows, end of the data) of a compressed file's decompressed text from byte
    ``start`` (the data ends as in :func:`_data_end`)."""
    breaks = rows = 0
    pos, ctx = 0, np.full(2, 10, np.uint8)  # ctx: the 2 bytes before the chunk
    end, trail = start, b""  # after the last byte that is not whitespace; the whitespace after it
    with _open_text(spec.path, spec.compression) as f:
        while chunk := f.read(_COUNT_BYTES):
            skip, pos = max(0, start - pos), pos + len(chunk)
            a = np.concatenate([ctx, np.frombuffer(chunk, np.uint8)])
            ctx = a[-2:].copy()
            if skip >= len(chunk):
                continue
            n, r = _count_rows(a, 2 + skip, len(a))
            breaks, rows = breaks + n, rows + r
            kept = len(chunk[skip:].rstrip())
            if kept:
                end, trail = pos - len(chunk) + skip + kept, chunk[skip + kept :]
            else:
                trail += chunk[skip:]
    if end == start:
        return 0, 0, start
    lines = trail.split(b"\n")
    if len(lines) == 1:  # the last line has no line break
        return breaks, rows + 1, end
    # The trail's first break ends the last row; the lines after it hold whitespace alone and
    # were counted as rows unless empty.
    extra = lines[1:-1]
    return breaks - len(extra), rows - sum(t not in (b"", b"\r") for t in extra), end + len(lines[0]) + 1


def _csv_block(spec: _CsvSpec, start: int, stop: int | None, first_line: int, rows: int) -> np.ndarray:
    """Bytes ``start:stop`` of the (decompressed) file parsed: an array (rows, len(spec.keep))
    of ``spec.dtype``; ``first_line`` is the file's line number of byte ``start``."""
    if spec.compression is None:
        import pyarrow as pa

        _check_size(spec)
        f = pa.memory_map(spec.path)
        f.seek(start)
        buf = f.read_buffer(stop - start)  # no copy: the file's pages, mapped
    else:
        with _open_text(spec.path, spec.compression) as f:
            buf = memoryview(f.read())[start:stop]
    out = _parse_block(buf, spec, first_line)
    if out.shape[0] != rows:  # the parser skipped or joined lines that the count took for rows
        raise DataError(f"{spec.path}: {_odd_line(buf, first_line)} ({out.shape[0]} rows of values where "
                        f"{rows} lines that are not empty were counted)")
    return out


def _odd_line(buf: Any, first_line: int) -> str:
    """Where a block's rows and its counted lines part: its first line of whitespace alone."""
    lines = bytes(buf).rstrip(b"\n").split(b"\n")
    for i, text in enumerate(lines):
        if text.strip() == b"" and text not in (b"", b"\r"):
            return f"line {first_line + i} holds whitespace alone, which cannot be read: delete it"
    return f"lines {first_line} to {first_line + len(lines) - 1} hold a line break inside quotes, which cannot be read"


def _parse_block(buf: Any, spec: _CsvSpec, first_line: int) -> np.ndarray:
    """``buf`` (whole lines of the file, no header) parsed: pyarrow's parser where it reads
    every cell; else pandas' (short rows, and cells such as ``' 1'`` or ``'None'``)."""
    cols = tuple(dict.fromkeys(spec.keep))  # a column asked for twice is parsed once
    out = None
    if len(spec.delimiter) == 1:
        import pyarrow as pa

        try:
            out = _parse_arrow(buf, spec, cols)
        except pa.ArrowInvalid:
            pass
        # Whitespace runs: pyarrow splits on each space, so a run reads as an empty cell (NaN).
        if out is not None and spec.delimiter == " " and np.isnan(out).any():
            out = None
    if out is None:
        out = _parse_pandas(buf, spec, cols, first_line)
    return out if cols == spec.keep else out[:, [cols.index(k) for k in spec.keep]]


def _parse_arrow(buf: Any, spec: _CsvSpec, cols: tuple[int, ...]) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = [f"f{i}" for i in range(spec.n_columns)]  # unique, whatever the header holds
    typ = pa.float32() if spec.dtype == "float32" else pa.float64()
    table = pcsv.read_csv(
        pa.py_buffer(buf),
        read_options=pcsv.ReadOptions(column_names=names, use_threads=True, block_size=spec.block_size),
        parse_options=pcsv.ParseOptions(delimiter=spec.delimiter),
        convert_options=pcsv.ConvertOptions(column_types={names[c]: typ for c in cols},
                                            include_columns=[names[c] for c in cols], null_values=list(_NA_VALUES)),
    )
    if table.num_rows and hasattr(table, "to_tensor"):  # one row-major copy, in C++
        return table.to_tensor(null_to_nan=True, row_major=True).to_numpy()
    out = np.empty((table.num_rows, len(cols)), dtype=spec.dtype)
    row = 0
    for batch in table.to_batches():  # older pyarrow: a batch per pyarrow block
        if batch.num_rows:
            out[row : row + batch.num_rows] = batch.to_tensor(null_to_nan=True, row_major=True).to_numpy()
            row += batch.num_rows
    return out


def _parse_pandas(buf: Any, spec: _CsvSpec, cols: tuple[int, ...], first_line: int) -> np.ndarray:
    import re

    import pandas as pd

    try:
        df = pd.read_csv(io.BytesIO(buf), sep=_pandas_sep(spec.delimiter), header=None,
                         names=range(spec.n_columns), usecols=list(cols), dtype=spec.dtype)
    except pd.errors.ParserError as e:  # e.g. "Expected 2 fields in line 4, saw 3": the file's line
        msg = re.sub(r"line (\d+)", lambda m: f"line {int(m.group(1)) + first_line - 1}", str(e).strip())
        raise DataError(f"cannot read {spec.path} as CSV: {msg}") from None
    except ValueError as e:  # a cell that is no number
        for c in cols:
            where = _first_non_numeric(buf, spec.delimiter, spec.n_columns, c, first_line)
            if where:
                raise _not_numeric(spec.path, spec.names[spec.keep.index(c)], where) from None
        raise DataError(f"{spec.path} has a non-numeric value after line {first_line}: "
                        f"{str(e).strip().splitlines()[0]}") from None
    return np.ascontiguousarray(df[list(cols)].to_numpy(dtype=spec.dtype))


def _first_non_numeric(data: Any, delim: str, n_columns: int, column: int, first_line: int) -> str | None:
    """``line N has 'x'`` for the first cell of column ``column`` in ``data`` (lines of the
    file from line ``first_line``, no header) that is neither a number, nor empty, nor a NaN
    marker; None if there is none."""
    import pandas as pd

    try:
        cells = pd.read_csv(io.BytesIO(data), sep=_pandas_sep(delim), header=None, names=range(n_columns),
                            usecols=[column], dtype=str, keep_default_na=False, skip_blank_lines=False)[column]
    except Exception:
        return None
    cells = cells.fillna("").str.strip()
    bad = cells[(cells != "") & ~cells.isin(_NA_VALUES) & pd.to_numeric(cells, errors="coerce").isna()]
    if bad.empty:
        return None
    return f"line {int(bad.index[0]) + first_line} has {bad.iloc[0]!r}"


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
