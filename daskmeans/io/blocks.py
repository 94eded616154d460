"""What every reader shares: float dtypes, rows per chunk, a :class:`Table` (the array and what
the source says of its columns), an array in memory as row chunks (:func:`from_memory`: a
NumPy or CuPy array is a Dask array of views of its rows, finished as any reader's array), and
Dask arrays of row blocks that a reader can cut again (:func:`split_rows`) by reading its file
again in other blocks, or read into a caller's buffers (:class:`RowRange`, the reading
pipelines' chunks)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .. import config
from ..errors import DaskmeansWarning, DataError, DataTypeError, InvalidParameterError
from ..validation import check_2d_numeric
from .headers import float_dtype

if TYPE_CHECKING:
    import dask.array as da


@dataclass(frozen=True)
class Table:
    """Rows a reader opened, and what their source says of the columns.

    The names travel beside the array, not on it: a Dask array has no attributes of its own
    that survive an operation (every operation makes a new array), and names kept by array
    name in a registry would vanish without a word once it forgets them. A Table is what
    the estimator takes to learn and check ``feature_names_in_`` without knowing formats.

    Attributes
    ----------
    array : dask.array.Array, shape (n_samples, n_features), float32 or float64
        The rows, as :func:`daskmeans.io.readers.read` returns them.
    columns : tuple of str or None
        The features' names, in the array's order, where the source names them: a CSV
        header (the columns kept by ``columns``/``drop_columns``), a Zarr array's
        ``feature_names`` attribute, a DataFrame's string column names; None otherwise.
    source : str or None
        The absolute path read (what reuse, pins and messages name); None for data in memory.
    identifier_error : str or None
        Why a column looks like an identifier rather than a feature (the CSV reader's rule:
        :func:`daskmeans.io.csv_reader.identifier_columns`), a message; None if none does.
        A fit refuses such data (:meth:`refuse_identifiers`); inference reads it.
    other_columns : callable or None
        ``other_columns(names) -> (names, dtypes, [delayed pyarrow.Table, ...])``: any columns
        of the source, by name or position, read as written (text) in ``array``'s row chunks,
        one table of strings per chunk, with the NumPy dtype each has in the reader's sample;
        the CSV reader's, None for other sources.
    rows : RowSource or None
        How ``array`` is read again in other row chunks (:func:`split_rows`), where its
        reader can; None otherwise (the array is then rechunked).
    in_memory : bool
        The rows were given in memory (NumPy, CuPy, lists, a pandas DataFrame, a SciPy sparse
        matrix): a fit's outputs are computed as the data's kind, as scikit-learn gives them.
        False for paths and Dask collections, and for a Table given to be read again (its
        array is lazy).
    """

    array: da.Array
    columns: tuple[str, ...] | None = None
    source: str | None = None
    identifier_error: str | None = None
    other_columns: Callable[[Sequence[str | int]], tuple[list[str], list[str], list[Any]]] | None = None
    rows: RowSource | None = None
    in_memory: bool = False

    def refuse_identifiers(self) -> None:
        """Raise a DataError where a column of the table looks like an identifier."""
        if self.identifier_error is not None:
            raise DataError(self.identifier_error)

    @property
    def feature_names(self) -> np.ndarray | None:
        """The columns' names as scikit-learn's ``feature_names_in_`` holds them: an object
        array (n_features,) of str, or None where the source names no columns."""
        return None if self.columns is None else np.asarray(self.columns, dtype=object)

    def files(self) -> tuple[str, ...]:
        """Every file the rows are read from (absolute paths, sorted): the path read and
        those the array's graph names (:func:`files_of`: also for a Dask array derived from a
        reader's). What a re-fit checks for changes (``engine/reuse.py``)."""
        return tuple(sorted({*files_of(self.array), *([self.source] if self.source else [])}))

    def file(self) -> str | None:
        """The one file the rows come from (absolute path): the path read, or the one file
        the graph of a Dask array read from one names (:func:`file_of`); None for data in
        memory or rows of several files. What a fit checks on the workers and messages name."""
        return self.source or file_of(self.array)


def float_dtype_arg(dtype: Any, what: str = "dtype") -> np.dtype:
    """``dtype`` as float32 or float64; anything else is an InvalidParameterError naming it."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.name not in ("float32", "float64"):
        raise InvalidParameterError(f"{what}={dtype!r} should be float32 or float64")
    return dt


def rows_per_chunk(n_features: int, itemsize: int, chunk_bytes: int | None = None, align: int = 1) -> int:
    """Rows in one chunk of about ``chunk_bytes``, a multiple of ``align`` (at least ``align``)."""
    cb = chunk_bytes if chunk_bytes is not None else config.get_bytes("chunk-bytes")
    rows = max(1, int(cb) // max(1, n_features * itemsize))
    return max(align, rows // align * align)


def finish(x: da.Array, dtype: np.dtype | None = None) -> da.Array:
    """A reader's array ``x`` checked (2-D, numeric), in ``dtype`` (default: its float dtype,
    with a warning where that converts) and in one chunk across columns: what every reader's
    array becomes before a fit sees it."""
    check_2d_numeric(x.shape, x.dtype)
    dt = float_dtype(x.dtype) if dtype is None else dtype
    if x.dtype != dt:
        if dtype is None:  # a conversion the user did not ask for
            # stacklevel: the caller of read()/read_table() (through them and _read_table).
            warnings.warn(f"X is {x.dtype}: converted to {dt} for clustering", DaskmeansWarning, stacklevel=4)
        x = x.astype(dt)
    if x.numblocks[1] != 1:
        x = x.rechunk({1: -1})
    return x


def from_memory(a: Any, cb: int | None) -> da.Array:
    """A 2-D NumPy or CuPy array (n_rows, n_columns) as a Dask array of row chunks of about
    ``cb`` bytes (as the float data it becomes; default ``daskmeans.chunk-bytes``), CuPy
    blocks kept on the GPU; an object array of numbers becomes float64.

    The chunks are views of ``a``'s rows: no copy (``da.from_array`` copies the whole array
    first, which cost a fit from memory more than its moments pass). The array is named by a
    hash of its contents (with ``xxhash`` installed, several GB/s), so that a re-fit of equal
    data finds its placement (:mod:`daskmeans.engine.reuse`) and changed data never does; its
    name starts ``daskmeans-memory-``, which :mod:`daskmeans.engine.owned` scatters rather than
    sends inside the graph.
    """
    import dask.array as da
    from dask.base import tokenize

    if a.dtype == object:
        a = _object_to_float(a)
    check_2d_numeric(getattr(a, "shape", ()), a.dtype)
    rows = rows_per_chunk(a.shape[1], float_dtype(a.dtype).itemsize, cb)
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


def non_numeric(dtypes: Any) -> list[tuple[str, str]]:
    """``(column, dtype)`` of the columns of a pandas ``dtypes`` Series that are not numbers
    (booleans are not)."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    return [(c, str(t)) for c, t in dtypes.items() if not is_numeric_dtype(t) or is_bool_dtype(t)]


# The annotation every Dask layer a reader makes for a file carries (the file's absolute path):
# a graph names the files it reads however it was derived from the reader's array (a column
# selection, a conversion), and a re-fit sees the file rewritten (``engine/reuse.py``).
FILE_ANNOTATION = "daskmeans-file"
# The attribute of the array a reader returns that says how its rows are read again
# (:class:`RowSource`): on that array object alone, since the recipe holds for it and for no
# array derived from it (every Dask operation makes a new array object, without it).
_ROWS_ATTRIBUTE = "daskmeans_rows"


@dataclass(frozen=True)
class RowSource:
    """How a reader reads the rows of its array again, in other row chunks.

    Splitting a chunk with ``rechunk`` would read the whole chunk once per part (the storage
    tier re-reads every part every pass); read again, each part reads only its rows.

    Attributes
    ----------
    fn : callable
        ``fn(*args, start, stop) -> ndarray (stop - start, d)`` of ``dtype``.
    args : tuple
        What names the file for ``fn`` (only these travel in the graph).
    n, d : int
        The file's rows and columns.
    dtype : numpy.dtype
        What ``fn`` returns.
    align : int
        Row chunks hold a multiple of this many rows (the file's own chunks).
    out_dtype : numpy.dtype
        The array's dtype (``dtype`` converted by :func:`daskmeans.io.readers.read`).
    path : str or None
        The file (absolute path), which the blocks read again name (:data:`FILE_ANNOTATION`).
    into : callable or None
        ``into(*args, start, stop, out)``: rows ``start:stop`` read straight into ``out``, a
        C-contiguous array (stop - start, d) of ``dtype`` the caller supplies (a reading
        pipeline's buffer, :mod:`daskmeans.io.fill`); None: ``fn``'s result is copied there.
    bounds : tuple of int or None
        The first row of each of the file's own pieces, where they are of uneven lengths (a
        CSV file's pieces of whole lines): chosen rows are read with the pieces that hold them
        (:meth:`RowRange.read_rows`); None: the file's pieces are its ``align`` rows each.
    """

    fn: Callable[..., np.ndarray]
    args: tuple
    n: int
    d: int
    dtype: np.dtype
    align: int
    out_dtype: np.dtype
    path: str | None = None
    into: Callable[..., None] | None = None
    bounds: tuple[int, ...] | None = None

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``start:stop`` of the array into ``out`` (stop - start, d) of :attr:`out_dtype`,
        C-contiguous: read straight into it where the reader can (:attr:`into`) and no
        conversion is needed, else read and copied (converted) into it.

        Raises
        ------
        ValueError
            ``out`` is not a C-contiguous array of that shape and dtype.
        """
        shape = (stop - start, self.d)
        if out.shape != shape or out.dtype != self.out_dtype or not out.flags.c_contiguous:
            raise ValueError(f"rows {start}:{stop} go into a C-contiguous {self.out_dtype} array of shape {shape}, "
                             f"got {out.dtype} {out.shape} (C-contiguous: {out.flags.c_contiguous})")
        if self.into is not None and self.dtype == self.out_dtype:
            self.into(*self.args, start, stop, out)
        elif self.into is not None:
            raw = np.empty(shape, self.dtype)
            self.into(*self.args, start, stop, raw)
            out[...] = raw
        else:
            out[...] = self.fn(*self.args, start, stop)

    def chunk(self, start: int, stop: int) -> "RowRange":
        """Rows ``start:stop`` as a chunk a reading pipeline reads (:mod:`daskmeans.io.fill`)."""
        return RowRange(self, int(start), int(stop))

    def blocks(self, rows: int) -> da.Array:
        """The array again, in chunks of ``rows`` rows rounded to :attr:`align` (the same
        values: the file read in other ranges)."""
        import dask

        with dask.annotate(**({FILE_ANNOTATION: self.path} if self.path else {})):
            y = row_blocks(self.fn, self.args, self.n, self.d, self.dtype,
                           max(self.align, rows // self.align * self.align), self.align, into=self.into)
        y = y.astype(self.out_dtype) if y.dtype != self.out_dtype else y
        return with_rows(y, dataclasses.replace(self, out_dtype=np.dtype(y.dtype)))


@dataclass(frozen=True)
class RowRange:
    """Rows ``start:stop`` of a reader's array (:class:`RowSource`), as one chunk of a reading
    pipeline (:class:`daskmeans.io.fill.ChunkSource`): only the source's recipe and the two
    offsets travel to the worker that reads it.

    Attributes
    ----------
    source : RowSource
    start, stop : int
        The chunk's first row and the row after its last, in the source.
    """

    source: RowSource
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def align(self) -> int:
        return int(self.source.align)

    @property
    def n_features(self) -> int:
        return int(self.source.d)

    @property
    def cuts(self) -> tuple[int, ...] | None:
        """Where the file's own pieces start inside the chunk (rows from its start, the first
        0), for a source whose pieces are of uneven lengths (:attr:`RowSource.bounds`): the
        reading pipeline's pieces (:func:`daskmeans.io.fill.pieces`); None for the others."""
        bounds = self.source.bounds
        if bounds is None:
            return None
        import bisect

        inside = bounds[bisect.bisect_right(bounds, self.start) : bisect.bisect_left(bounds, self.stop)]
        return (0, *(int(b) - self.start for b in inside))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.source.out_dtype)

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``start:stop`` of this chunk into ``out`` (:meth:`RowSource.read_into`)."""
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(f"rows {start}:{stop} lie outside a chunk of {self.rows} rows")
        self.source.read_into(self.start + start, self.start + stop, out)

    def read(self) -> np.ndarray:
        """The chunk, shape (rows, n_features), as a new NumPy array."""
        out = np.empty((self.rows, self.n_features), self.dtype)
        self.read_into(0, self.rows, out)
        return out

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """The chunk's rows ``rows`` (local indices, int64 ``(m,)``), shape (m, d), in that
        order: only the file's chunks that hold them (its ``align`` rows each, or its pieces:
        ``bounds``) are read, each once, not the whole row chunk (the inits' draws in the
        storage tier)."""
        from .ranges import on_cores

        src = self.source
        rows = np.asarray(rows, np.int64)
        glob = rows + self.start
        if src.bounds is not None:  # the file's pieces of uneven lengths: the piece of each row
            bounds = np.append(np.asarray(src.bounds, np.int64), src.n)
            at_piece = np.searchsorted(bounds, glob, side="right") - 1
            first, end = bounds[at_piece], bounds[at_piece + 1]
        else:
            first = glob // src.align * src.align  # the file chunk of each row
            end = np.minimum(first + src.align, src.n)
        out = np.empty((len(rows), src.d), src.out_dtype)

        def one(s: int) -> None:  # a compressed file chunk is decoded whole, on a core of its own
            at = np.flatnonzero(first == s)
            part = np.asarray(src.fn(*src.args, int(s), int(end[at[0]])))
            out[at] = part[glob[at] - s]  # as the chunk's read: the file's values in the array's dtype

        on_cores(one, [int(s) for s in np.unique(first)])
        return out


def row_blocks(fn: Callable[..., np.ndarray], args: tuple, n: int, d: int, dtype: Any, rows: int,
               align: int, into: Callable[..., None] | None = None) -> da.Array:
    """A Dask array of ``fn(*args, start, stop)`` blocks of ``rows`` rows (the last shorter),
    which says how it is read again in other chunks (:func:`rows_of`).

    Parameters
    ----------
    fn : callable
        ``fn(*args, start, stop) -> ndarray (stop - start, d)`` of ``dtype``: reads rows
        ``start:stop`` of the file (``args`` name it: only they travel in the graph).
    n, d : int
        The file's rows and columns.
    rows : int
        Rows per block.
    align : int
        Blocks that :func:`split_rows` cuts again hold a multiple of this many rows (the
        file's own chunks).
    into : callable, optional
        ``into(*args, start, stop, out)``: the same rows read straight into a caller's array
        (:attr:`RowSource.into`), for the reading pipelines.

    Returns
    -------
    dask.array.Array, shape (n, d)
    """
    import dask.array as da
    from dask import delayed

    blocks = [
        da.from_delayed(delayed(fn, pure=True)(*args, s, min(s + rows, n)), shape=(min(s + rows, n) - s, d), dtype=dtype)
        for s in range(0, n, rows)
    ]
    x = da.concatenate(blocks, axis=0)
    return with_rows(x, RowSource(fn, tuple(args), int(n), int(d), np.dtype(dtype), int(align), np.dtype(dtype),
                                  into=into))


def with_rows(x: da.Array, rows: RowSource | None) -> da.Array:
    """``x``, which now says how its rows are read again (``rows``; None: it cannot be)."""
    if rows is None:
        x.__dict__.pop(_ROWS_ATTRIBUTE, None)
    else:
        setattr(x, _ROWS_ATTRIBUTE, rows)
    return x


def rows_of(x: Any) -> RowSource | None:
    """How the array ``x`` a reader returned is read again in other chunks, or None (data in
    memory, or an array derived from a reader's)."""
    src = getattr(x, _ROWS_ATTRIBUTE, None)
    return src if isinstance(src, RowSource) else None


def files_of(x: da.Array) -> tuple[str, ...]:
    """The files (absolute paths, sorted) whose rows the Dask array ``x`` reads: the
    :data:`FILE_ANNOTATION` of its graph's layers (so any array derived from a reader's names
    them too)."""
    graph = x.__dask_graph__()
    layers = getattr(graph, "layers", {})
    found = set()
    for layer in layers.values():
        path = (getattr(layer, "annotations", None) or {}).get(FILE_ANNOTATION)
        if isinstance(path, str):
            found.add(path)
    return tuple(sorted(found))


def file_of(x: da.Array) -> str | None:
    """The one file (absolute path) the array ``x`` was read from by
    :func:`daskmeans.io.readers.read`, or None (data in memory, or rows of several files):
    what messages about its rows name."""
    import dask.array as da

    files = files_of(x) if isinstance(x, da.Array) else ()
    return files[0] if len(files) == 1 else None


def split_rows(x: da.Array, rows: int) -> da.Array:
    """``x`` in chunks of about ``rows`` rows: read again from its file in those chunks when
    ``x`` is what a reader returned for a file (rows rounded to the file's own chunks:
    :func:`rows_of`), else rechunked."""
    src = rows_of(x)
    return x.rechunk({0: rows}) if src is None else src.blocks(rows)
