"""Numeric CSV (also ``.tsv``, ``.txt``, and compressed ``.csv.gz``, ``.bz2``, ``.xz``) as a
Dask array of row chunks, parsed straight to float32 (or float64) on every core.

A plain file is cut into blocks of about ``chunk-bytes`` of text, and each block into pieces
of whole lines (a few MB, a piece per core for smaller files). Before any parsing, tasks count
each piece's line breaks (several times faster than parsing), once: the array's chunk lengths
are known, and every later parse knows where each piece's rows go without counting again. The
task that reads a block parses its pieces on a thread per core
(:func:`daskmeans.io.ranges.on_cores`), each straight into its rows of the block: a worker with
one Dask thread (one GPU) still parses on every core, and a nanny's ``OMP_NUM_THREADS=1``
(which caps pyarrow's own thread pool) does not matter. A compressed file cannot be cut: it is
one block, its line breaks counted while it is decompressed, cut and counted again when it is
parsed. A piece of plain numbers is parsed by compiled code (:mod:`.csv_parse`: correctly
rounded, pyarrow's bits); one it refuses by pyarrow's C++ parser; one with a cell pyarrow
refuses (a short row, a value pandas reads and pyarrow does not) by pandas' parser, which reads
it or names the line and the cell. :func:`parse_into` parses any rows of an opened file the
same way into a buffer its caller gives, only the lines of those rows in a piece they share
with others; a plain file's :class:`~.blocks.RowSource` (``Table.rows``) is built on it, so a
placement parses the file on each worker straight into the blocks it keeps, in the file's
pieces (:mod:`daskmeans.io.fill`): no block persisted, no second copy.

A header names the features (:class:`~daskmeans.io.blocks.Table`'s ``columns``, a model's
``feature_names_in_``); a sample of plain numbers is named and typed (as pandas would) by the
compiled parser, so that the common file never imports pandas. A column that looks like an
identifier rather than a feature is said so (:func:`identifier_columns`), and a fit refuses it
unless ``columns`` selected it. Other columns (an id to write beside the labels) are read by
name as text in the same blocks.
"""

from __future__ import annotations

import bisect
import functools
import io
import os
import sys
import threading
from typing import Any, NamedTuple, Sequence

import numpy as np

from .. import config
from ..errors import DataError
from .blocks import RowSource, Table, float_dtype_arg, non_numeric
from .ranges import cores, on_cores

SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".tsv", ".txt")

_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}
_COUNT_BYTES = 16 << 20  # text one counting call scans: its temporaries stay in the tens of MB
_PIECE_BYTES = 8 << 20  # at most this much text per parsed piece: its rows stay in the caches
_MIN_PIECE_BYTES = 1 << 20  # a block is cut into a piece per core, down to pieces of this size
# Most pieces a plain file is cut into when it is opened: every reader of its rows is given the
# pieces' table (larger pieces for files of more than 32 GB).
_MAX_PIECES = 4096
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
    block_size: int  # pyarrow's largest row: several of the longest lines of the sample
    count_bytes: int  # text per counting call (_COUNT_BYTES)
    piece_bytes: int  # most text per parsed piece (_PIECE_BYTES)


def column_list(value: str | int | Sequence[str | int] | None) -> list[str | int] | None:
    """``columns``/``drop_columns`` as a list: ``"id,label"`` is two names (spaces around
    them dropped), a single name or position is one."""
    if value is None:
        return None
    if isinstance(value, str):
        return [s.strip() for s in value.split(",")]
    if isinstance(value, (int, np.integer)):
        return [int(value)]
    return list(value)


def open_csv(path: str, chunk_bytes: int | None, dtype: np.dtype | None = None, *,
             columns: str | Sequence[str | int] | None = None, drop_columns: str | Sequence[str | int] | None = None,
             delimiter: str | None = None) -> Table:
    """A CSV file as a Dask array of row chunks of about ``chunk_bytes`` bytes of text each
    (default ``daskmeans.chunk-bytes``), their lengths known.

    Parameters
    ----------
    path : str
        An absolute path.
    chunk_bytes : int, optional
        Text per block (a compressed file is one block).
    dtype : numpy.dtype, optional
        float32 or float64, what the text is parsed to; default ``daskmeans.csv-dtype``.
    columns, drop_columns : str or sequence of str or int, optional
        Columns to keep, or to drop, by name or position; a string is a comma-separated list.
    delimiter : str, optional
        Guessed from the first line if omitted (comma, tab, semicolon, else runs of spaces).

    Returns
    -------
    Table
        ``array`` (n_rows, n_columns_kept) of ``dtype``; ``columns``: the header's names of
        the columns kept (None without a header); ``identifier_error``: where a column kept
        without ``columns`` naming it looks like an identifier (:func:`identifier_columns`);
        ``other_columns``: any of the file's columns read as text in the array's chunks.
    """
    import dask.array as da
    from dask import delayed

    if dtype is None:
        dtype = float_dtype_arg(config.get("csv-dtype"), "daskmeans.csv-dtype")
    columns, drop_columns = column_list(columns), column_list(drop_columns)
    from . import csv_ahead

    ahead = csv_ahead.take(csv_ahead.key(path, chunk_bytes, dtype, columns, drop_columns, delimiter))
    survey = None if ahead is None else _Survey.from_json(ahead[0])
    csv_rows = None if survey is None else survey.rows()
    if csv_rows is not None and ahead[1].shape == (csv_rows.n, csv_rows.d) and _unchanged(survey.spec):
        # Surveyed and parsed by the command's read-ahead process (read_ahead), from the file
        # as it is now.
        _AHEAD[survey.spec] = (ahead[1], {p[0]: r for p, r in zip(csv_rows.parts, csv_rows.starts)})
    else:
        _start_warming(dtype.name)  # in-process workers parse in this process: it loads while the layout is read
        survey = _survey(path, chunk_bytes, dtype, columns, drop_columns, delimiter)
        csv_rows = survey.rows()
    spec, names, dtypes, keep = survey.spec, list(survey.names), list(survey.dtypes), list(survey.spec.keep)
    parse = delayed(functools.partial(_csv_block, spec), pure=True)
    arrays = [da.from_delayed(parse(ps), shape=(sum(p[3] for p in ps), len(keep)),
                              dtype=dtype) for ps in survey.blocks]
    # A header and no rows: refused by name in read().
    x = da.concatenate(arrays, axis=0) if arrays else da.zeros((0, len(keep)), dtype=dtype)
    setattr(x, _CSV_ROWS_ATTRIBUTE, csv_rows)
    found = identifier_columns([names[k] for k in keep], [k for k in keep], [dtypes[k] for k in keep]) \
        if survey.header and columns is None else []
    # Each block's bytes as one range (first byte, end, first line, rows), for its other columns.
    parts = tuple((ps[0][0], ps[-1][1], ps[0][2], sum(p[3] for p in ps)) for ps in survey.blocks)
    return Table(x, tuple(names[k] for k in keep) if survey.header else None, path,
                 _identifier_message(path, found, names, drop_columns) if found else None,
                 functools.partial(_other_columns, spec, parts, tuple(names), tuple(dtypes)),
                 rows=_row_source(csv_rows))


class _Survey(NamedTuple):
    """What opening a CSV file learns before any of its rows is parsed: the layout the tasks
    read it by, and its blocks of counted pieces (plain data: :mod:`.csv_ahead` sends it
    between processes as JSON)."""

    spec: _CsvSpec
    header: bool
    names: tuple[str, ...]  # every column's, as pandas names them (positions as strings without a header)
    dtypes: tuple[str, ...]  # every column's in the sample, as pandas types them
    blocks: tuple[tuple[tuple[int, int, int, int], ...], ...]  # each block's pieces (first byte, end, first line, rows)

    def rows(self) -> "CsvRows":
        """The file's :class:`CsvRows`: its pieces in order, with the first row of each."""
        pieces = tuple(p for ps in self.blocks for p in ps)
        counts = [p[3] for p in pieces]
        starts = tuple(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)[:-1]]).tolist()) if counts else ()
        return CsvRows(self.spec, pieces, starts)

    def to_json(self) -> dict:
        return {"spec": list(self.spec), "header": self.header, "names": list(self.names),
                "dtypes": list(self.dtypes), "blocks": [[list(p) for p in ps] for ps in self.blocks]}

    @classmethod
    def from_json(cls, d: dict) -> "_Survey":
        spec = list(d["spec"])
        for i in (6, 7):  # keep, names
            spec[i] = tuple(spec[i])
        return cls(_CsvSpec(*spec), bool(d["header"]), tuple(d["names"]), tuple(d["dtypes"]),
                   tuple(tuple(tuple(int(v) for v in p) for p in ps) for ps in d["blocks"]))


def _survey(path: str, chunk_bytes: int | None, dtype: np.dtype, columns: list | None, drop_columns: list | None,
            delimiter: str | None) -> _Survey:
    """:func:`open_csv`'s reading of the file before its rows are parsed: its layout (the
    delimiter, a header, the columns' names and types in a sample, the columns kept) and its
    pieces' line breaks and rows, counted once."""
    import dask
    from dask import delayed

    delim, header = _guess_layout(path, delimiter)
    compression = _COMPRESSION.get(os.path.splitext(path)[1].lower())
    head, whole = _head(path, compression)
    start = (head.find(b"\n") + 1 or len(head)) if header else 0  # the first data byte
    first_line = 2 if header else 1  # line numbers in messages count the header
    # The sample ends at a line break unless it is the whole file.
    sample = head[start:] if whole else head[start : max(start, head.rfind(b"\n") + 1)]
    names, keep, dtypes = _csv_columns(path, head[:start] + sample, header, delim, columns, drop_columns, first_line,
                                       dtype.name)
    longest = max((len(s) for s in sample.split(b"\n")), default=0)
    st = os.stat(path)
    if not compression:  # the data: from ``start`` to the line break after its last cell that is not whitespace
        stop, unended = _data_end(path, start, st.st_size)
    spec = _CsvSpec(path, st.st_size, st.st_mtime_ns, compression, delim, len(names), tuple(keep),
                    tuple(names[k] for k in keep), dtype.name, min(2**30, max(1 << 20, 8 * longest)),
                    _COUNT_BYTES, _PIECE_BYTES if compression else _piece_bytes(stop - start))
    # Blocks of pieces (first byte, end, line breaks, rows): a plain file's pieces of whole lines
    # (spec.piece_bytes), counted once here, are what every later parse takes as they are (no
    # second count); a compressed file is one piece, cut again where it is parsed.
    if compression:
        ((breaks, rows, stop),) = dask.compute(delayed(_count_stream, pure=True)(spec, start))
        layout = [((start, stop, breaks, rows),)]
    else:
        bounds = _block_bounds(path, start, stop, chunk_bytes if chunk_bytes is not None else config.get_bytes("chunk-bytes"))
        count = delayed(functools.partial(_count_block, spec), pure=True)
        (layout,) = dask.compute([count(b, e) for b, e in bounds])
        layout = [list(block) for block in layout]
        if layout:  # the last line, with no line break, is a row too
            layout[-1][-1] = (*layout[-1][-1][:3], layout[-1][-1][3] + unended)
    blocks, pieces, line = [], [], first_line
    for block in layout:
        first = len(pieces)
        for b, e, breaks, rows in block:
            if rows:
                pieces.append((b, e, line, rows))
            line += breaks
        if len(pieces) > first:
            blocks.append(tuple(pieces[first:]))
    return _Survey(spec, header, tuple(names), tuple(str(t) for t in dtypes), tuple(blocks))


# A file's rows parsed ahead (:mod:`.csv_ahead`), by the spec it was opened with: the buffer
# of every row and the first row of each piece (by its first byte). The command's process
# holds them until it ends; its in-process workers copy rows from here instead of parsing.
_AHEAD: dict[_CsvSpec, tuple[np.ndarray, dict[int, int]]] = {}


# ---------------------------------------------------------------- rows read into a given buffer

# The attribute of the array open_csv returns that holds its CsvRows (that array object alone:
# an array derived from it is other rows, or the same rows in another dtype or order).
_CSV_ROWS_ATTRIBUTE = "daskmeans_csv_rows"


class CsvRows(NamedTuple):
    """What a reader needs to parse any rows of an opened CSV file into a buffer it is given
    (:func:`parse_into`): small and picklable, it travels to the workers.

    Attributes
    ----------
    spec : _CsvSpec
        The file, its layout (delimiter, columns read) and the dtype parsed to.
    parts : tuple of (first byte, end, first line, rows)
        The file's pieces of whole lines, in order, each with rows (lines are the file's): a
        plain file's pieces of about ``spec.piece_bytes`` as :func:`open_csv` counted them
        (at most :data:`_MAX_PIECES`), a compressed file's data as one piece.
    starts : tuple of int
        The first row of each piece.
    """

    spec: _CsvSpec
    parts: tuple[tuple[int, int, int, int], ...]
    starts: tuple[int, ...]

    @property
    def n(self) -> int:
        """Rows of the file."""
        return int(self.starts[-1] + self.parts[-1][3]) if self.parts else 0

    @property
    def d(self) -> int:
        """Columns read."""
        return len(self.spec.keep)

    @property
    def dtype(self) -> np.dtype:
        """What the text is parsed to."""
        return np.dtype(self.spec.dtype)


def csv_rows_of(x: Any) -> CsvRows | None:
    """The :class:`CsvRows` of ``x`` where it is the array :func:`open_csv` returned (through
    :func:`daskmeans.io.readers.read`, which returns it as it is), else None."""
    got = getattr(x, _CSV_ROWS_ATTRIBUTE, None)
    return got if isinstance(got, CsvRows) else None


def parse_into(spec: CsvRows, start: int, stop: int, out: np.ndarray) -> None:
    """Parse rows ``start:stop`` of the CSV file into ``out``, on every core (a thread per core,
    whatever thread calls it; in the calling thread within :func:`daskmeans.io.ranges.in_place`),
    with no copy between the parse and ``out`` (a piece of text ``start`` or ``stop`` cuts: the
    lines of the rows asked for alone, a compressed file's: its rows parsed, then copied): what a
    placement pipeline calls to fill its own buffers (pinned host memory, say) instead of
    copying a parsed block into them.

    Parameters
    ----------
    spec : CsvRows
        The file as opened (:func:`csv_rows_of` of the array :func:`daskmeans.io.readers.read`
        returned).
    start, stop : int
        Rows, ``0 <= start <= stop <= spec.n``.
    out : ndarray (stop - start, spec.d) of spec.dtype
        Its rows C-contiguous (a row slice of a C-ordered buffer is).

    Raises
    ------
    ValueError
        ``start:stop`` or ``out`` do not fit as said above.
    DataError
        The rows cannot be read (the messages of :func:`daskmeans.io.readers.read`'s tasks:
        a cell that is no number, the file changed since it was opened...) of those rows (of
        a compressed file, of the pieces of text that hold them).
    """
    n = spec.n
    if not 0 <= start <= stop <= n:
        raise ValueError(f"rows {start}:{stop} should lie within the file's {n} rows ({spec.spec.path})")
    if out.shape != (stop - start, spec.d) or out.dtype != spec.dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; it should be ({stop - start}, {spec.d}) "
                         f"of {spec.dtype} for rows {start}:{stop}")
    if out.ndim != 2 or (out.size and out.strides != (out.shape[1] * out.itemsize, out.itemsize)):
        raise ValueError(f"out has strides {out.strides}; its rows should be C-contiguous")
    if start == stop:
        return
    # The pieces that hold rows start:stop: from the last that starts at or before ``start``.
    i = bisect.bisect_right(spec.starts, start) - 1
    j = bisect.bisect_left(spec.starts, stop)
    _parse_parts(spec.spec, spec.parts[i:j], spec.starts[i], start, stop, out)


def read_rows(spec: CsvRows, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the CSV file as a new array (stop - start, spec.d) of spec.dtype
    (:func:`parse_into`): the file's rows read again in other row chunks."""
    out = np.empty((stop - start, spec.d), spec.dtype)
    parse_into(spec, start, stop, out)
    return out


def _row_source(spec: CsvRows) -> RowSource | None:
    """How the reading pipelines read the rows of a plain file (:class:`~.blocks.RowSource`):
    any rows parsed straight into the caller's buffer, the pieces counted when it was opened
    (``bounds``: chosen rows are read with their pieces alone). None for a compressed file,
    whose rows can only be read by decompressing it from its start: its blocks are persisted."""
    if spec.spec.compression is not None:
        return None
    return RowSource(read_rows, (spec,), spec.n, spec.d, spec.dtype, 1, spec.dtype, into=parse_into,
                     bounds=spec.starts)


# ---------------------------------------------------------------- identifiers and other columns

# Names (lower case) of columns that number rows rather than measure anything.
_ID_NAMES = ("id", "row", "index")
_ID_SUFFIXES = ("_id",)
_INDEX_NAMES = ("unnamed: 0", "")  # pandas' name for a header's empty first cell: its index, written by to_csv()


def identifier_columns(names: Sequence[str], positions: Sequence[int], dtypes: Sequence[str]) -> list[tuple[str, int, str]]:
    """The columns that look like identifiers rather than features: ``(name, position, why)``.

    The rule: integer values in the sample the reader parses anyway (the file's first MiB of
    text: no extra pass), and a name that numbers rows: ``id``, ``*_id``, ``row`` or
    ``index`` (any case), or the file's first column without a name (pandas' index, which
    ``DataFrame.to_csv()`` writes as ``Unnamed: 0`` once read back). Clustering on such a
    column puts its range (1e6 rows: a variance of 1e11) above every feature's.

    Parameters
    ----------
    names, positions, dtypes : sequences
        The columns' header names, positions in the file, and the sample's dtypes (NumPy names).
    """
    found = []
    for name, pos, dt in zip(names, positions, dtypes):
        if not (dt.startswith("int") or dt.startswith("uint")):
            continue
        low = name.strip().lower()
        if low in _ID_NAMES or low.endswith(_ID_SUFFIXES):
            found.append((name, pos, f"integer values, name {name!r}"))
        elif pos == 0 and (low in _INDEX_NAMES or low.startswith("unnamed: 0")):
            found.append((name, pos, "integer values, an unnamed first column as pandas writes its index"))
    return found


def _option_name(name: str, position: int) -> str:
    """How ``--columns``/``--drop-columns`` name a column: its name, or its position where the
    name would not read back as one (a comma, spaces at its ends, empty, digits alone)."""
    if not name or "," in name or name != name.strip() or name.lstrip("-").isdigit() or name.lower().startswith("unnamed: "):
        return str(position)
    return name


def _identifier_message(path: str, found: list, names: Sequence[str], drop_columns: list | None) -> str:
    """The refusal of the first column of ``found``, with the ``--drop-columns`` that drops
    every one of them (after those already dropped)."""
    name, pos, why = found[0]
    drop = [str(c) for c in (drop_columns or [])] + [_option_name(n, p) for n, p, _ in found]
    it = "it" if len(found) == 1 else f"it and {', '.join(repr(n) for n, _, _ in found[1:])}"
    return (f"column {name!r} of {path} looks like an identifier ({why}): drop {it} with --drop-columns "
            f"{','.join(drop)}, or select it with --columns to cluster on it")


def _other_columns(spec: _CsvSpec, parts: tuple, names: tuple[str, ...], dtypes: tuple[str, ...],
                   wanted: Sequence[str | int]) -> tuple[list[str], list[str], list[Any]]:
    """Columns ``wanted`` (names, or positions) of the file as text, as written, in the
    blocks of the array :func:`open_csv` made: ``(their names, the sample's dtype of each,
    one delayed pyarrow.Table of string columns per block)``."""
    from dask import delayed

    chosen = _select(list(names), list(wanted), None, spec.path)
    cols = tuple(names.index(c) for c in chosen)
    return chosen, [dtypes[c] for c in cols], [
        delayed(_text_block, pure=True)(spec, cols, tuple(chosen), b, e, line, rows) for b, e, line, rows in parts]


def _text_block(spec: _CsvSpec, cols: tuple[int, ...], names: tuple[str, ...], start: int, stop: int,
                first_line: int, rows: int) -> Any:
    """Columns ``cols`` of bytes ``start:stop`` as a pyarrow Table of strings, as written
    (quotes removed, empty cells empty), named ``names``; ``rows`` rows or a DataError."""
    import pyarrow as pa

    a = _block_bytes(spec, start, stop)
    if len(spec.delimiter) == 1 and spec.delimiter != " ":
        import pyarrow.csv as pcsv

        fields = [f"f{i}" for i in range(spec.n_columns)]
        try:
            t = pcsv.read_csv(
                pa.py_buffer(a),
                read_options=pcsv.ReadOptions(column_names=fields, use_threads=False, block_size=spec.block_size),
                parse_options=pcsv.ParseOptions(delimiter=spec.delimiter),
                convert_options=pcsv.ConvertOptions(column_types={fields[c]: pa.string() for c in cols},
                                                    include_columns=[fields[c] for c in cols],
                                                    strings_can_be_null=False, quoted_strings_can_be_null=False))
            t = t.select([fields[c] for c in cols])
        except pa.ArrowInvalid as e:
            raise DataError(f"cannot read {spec.path} as CSV after line {first_line}: {str(e).strip()}") from None
    else:  # runs of whitespace: pandas' parser
        import pandas as pd

        df = pd.read_csv(io.BytesIO(a), sep=_pandas_sep(spec.delimiter), header=None, names=range(spec.n_columns),
                         usecols=list(set(cols)), dtype=str, keep_default_na=False)
        t = pa.table([pa.array(df[c].to_numpy(dtype=object), pa.string()) for c in cols], names=[f"f{c}" for c in cols])
    if t.num_rows != rows:
        raise DataError(f"{spec.path} changed since it was opened: {t.num_rows} rows after line {first_line}, {rows} "
                        f"when it was opened; read it again")
    return t.rename_columns(list(names))


def _block_bytes(spec: _CsvSpec, start: int, stop: int) -> np.ndarray:
    """Bytes ``start:stop`` of the (decompressed) file, as uint8 (read-only): a plain file's
    pages mapped (no copy)."""
    if spec.compression is None:
        _check_size(spec)
        if stop <= start:
            return np.empty(0, np.uint8)
        # A plain ndarray over the map (Numba types a memmap subclass as another signature).
        return np.memmap(spec.path, dtype=np.uint8, mode="r", offset=start, shape=(stop - start,)).view(np.ndarray)
    with _open_text(spec.path, spec.compression) as f:
        return np.frombuffer(f.read(), np.uint8)[start:stop]


def _guess_layout(path: str, delimiter: str | None) -> tuple[str, bool]:
    """(delimiter, has_header) from the first line: a header has a non-numeric field."""
    import bz2
    import gzip
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(os.path.splitext(path)[1].lower(), open)
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


def _csv_columns(path: str, sample: bytes, header: bool, delim: str, columns: list | None,
                 drop_columns: list | None, first_line: int,
                 dtype: str = "float64") -> tuple[list[str], list[int], list[str]]:
    """(the file's column names, positions of the columns to read, each column's dtype in the
    sample) from a sample of its first lines; a DataError names a non-numeric column to read
    and its first such cell; ``dtype``: what the file is parsed to (the compiled parser's
    variant loaded for it reads the sample)."""
    plain = _plain_columns(sample, header, delim, dtype)
    if plain is not None:  # every cell a plain number: no pandas (its import is long: performance.md, "CSV placement")
        names, dtypes = plain
        kept = _select(names, columns, drop_columns, path)
        return names, [names.index(c) for c in kept], dtypes
    import pandas as pd

    try:
        df = pd.read_csv(io.BytesIO(sample), sep=_pandas_sep(delim), header=0 if header else None)
    except Exception as e:
        raise DataError(f"cannot read {path} as CSV: {str(e).strip()}") from None
    names = [str(c) for c in df.columns]
    df.columns = names
    kept = _select(names, columns, drop_columns, path)
    bad = non_numeric(df[kept].dtypes)
    if bad:
        c, t = bad[0]
        data = sample[sample.find(b"\n") + 1 :] if header else sample
        where = _first_non_numeric(data, delim, len(names), names.index(c), first_line)
        raise _not_numeric(path, c, where or f"dtype {t}")
    return names, [names.index(c) for c in kept], [str(t) for t in df.dtypes]


def _plain_columns(sample: bytes, header: bool, delim: str,
                   dtype: str = "float64") -> tuple[list[str], list[str]] | None:
    """(the columns' names, their dtypes) of a sample whose cells are all plain numbers, as
    pandas' ``read_csv`` names and types them (a column of integers alone int64, else float64),
    read by the compiled parser; None where pandas is to read the sample (a cell the parser
    refuses, a header pandas renames: an empty or repeated name, a byte-order mark; an integer
    beyond 2**53; no rows). The sample is parsed to ``dtype``, the file's: the one variant of
    the parser a process loads (Numba loads each from its cache on first use)."""
    import csv

    from . import csv_parse

    if not csv_parse.usable(delim) or sample.startswith(b"\xef\xbb\xbf"):
        return None
    # Loaded here, on the caller's thread (the warming thread may be loading it too: Numba's
    # lock makes one wait for the other): the counts that follow are compiled, not NumPy's.
    csv_parse.warm(dtype)
    nl = sample.find(b"\n")
    first = sample if nl < 0 else sample[:nl]
    try:
        cells = next(csv.reader([first.decode("utf-8").rstrip("\r")], delimiter=delim))
    except (UnicodeDecodeError, csv.Error, StopIteration):
        return None
    if header:
        names = cells
        if "" in names or len(set(names)) != len(names):  # pandas renames them ("Unnamed: 0", "a.1")
            return None
        data = sample[nl + 1 :] if nl >= 0 else b""
    else:
        names, data = [str(i) for i in range(len(cells))], sample
    a = np.frombuffer(data, np.uint8)
    rows = int(csv_parse.count_rows(a, 0, len(a))[1]) + _unended(a, 0, len(a))
    if rows == 0:
        return None
    values = np.empty((rows, len(names)), dtype)
    if not csv_parse.parse_into(a, delim, len(names), list(range(len(names))), values):
        return None
    # A cell with a fraction or an exponent makes its column float, as an empty cell (NaN)
    # does: the column of each such byte is the count of delimiters before it on its line.
    marks = np.flatnonzero((a == 46) | (a == 101) | (a == 69))  # '.', 'e', 'E'
    cut = np.cumsum(a == ord(delim), dtype=np.int64)
    breaks = np.flatnonzero(a == 10)
    lines_before = np.searchsorted(breaks, marks)  # the line breaks before each mark
    at_line = np.where(lines_before > 0, cut[breaks[np.maximum(lines_before - 1, 0)]], 0)
    floats = np.zeros(len(names), bool)
    floats[np.unique(cut[marks] - at_line)] = True
    floats |= np.isnan(values).any(axis=0)
    # Integers pandas may type otherwise (uint64, object); a float32 rounding near the bound
    # leaves the sample to pandas, the safe side.
    if (np.abs(values[:, ~floats]) >= 2.0**53).any():
        return None
    return names, ["float64" if f else "int64" for f in floats]


def _select(names: list[str], columns: list | None, drop_columns: list | None, path: str) -> list[str]:
    """The names of the columns to read: ``columns`` in their order, or every column but
    ``drop_columns`` (names, or positions as ints or digit strings)."""
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


def _pandas_sep(delim: str) -> str:
    return r"\s+" if delim == " " else delim


def _not_numeric(path: str, column: str, what: str) -> DataError:
    return DataError(f"column {column!r} of {path} is not numeric ({what}); select features with "
                     f"--columns or --drop-columns")


# ---------------------------------------------------------------- layout: blocks and their rows


def _find_break(a: np.ndarray, pos: int, stop: int) -> int:
    """The index of the first line break in ``a[pos:stop]`` (bytes), or -1."""
    width = 1 << 16
    while pos < stop:
        end = min(stop, pos + width)
        hit = np.flatnonzero(a[pos:end] == 10)
        if hit.size:
            return pos + int(hit[0])
        pos, width = end, width * 2
    return -1


def _line_cuts(a: np.ndarray, start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """Ranges ``[b, e)`` that tile ``a[start:stop]`` (bytes), cut after the first line break
    from each multiple of ``size`` (from ``start``) on: pieces of about ``size`` in whole lines."""
    if start >= stop:
        return []
    size, cuts = max(1, size), [start]
    while True:  # the next multiple of size past the last cut (a line may span several)
        nl = _find_break(a, start + ((cuts[-1] - start) // size + 1) * size - 1, stop)
        if nl < 0 or nl + 1 >= stop:
            break
        cuts.append(nl + 1)
    return list(zip(cuts, cuts[1:] + [stop]))


def _block_bounds(path: str, start: int, stop: int, blocksize: int) -> list[tuple[int, int]]:
    """Byte ranges ``[b, e)`` of the file that tile ``start:stop`` in blocks of about
    ``blocksize`` in whole lines."""
    if start >= stop:
        return []
    return _line_cuts(np.memmap(path, dtype=np.uint8, mode="r"), start, stop, blocksize)


def _count_rows(a: np.ndarray, start: int, stop: int) -> tuple[int, int]:
    """(line breaks in ``a[start:stop]``, rows they end): a break ends no row where its line
    is blank (empty, or a lone CR), as both parsers skip those. Bytes before ``a[0]`` count
    as a line break (a line starts there). Counted by :func:`.csv_parse.count_rows` (one pass,
    no temporaries, the interpreter lock released) once it is loaded, by NumPy until then."""
    # The compiled pass once loaded, else the same counts by NumPy (the module may be half
    # imported by the warming thread: its ready() comes after its functions).
    parser = sys.modules.get(f"{__package__}.csv_parse")
    ready = getattr(parser, "ready", None)
    if ready is not None and ready():
        breaks, rows = parser.count_rows(a, start, stop)
        return int(breaks), int(rows)
    idx = np.flatnonzero(a[start:stop] == 10)
    if idx.size == 0:
        return 0, 0
    idx += start
    p1, p2 = a[np.maximum(idx - 1, 0)], a[np.maximum(idx - 2, 0)]
    p1[idx < 1] = 10
    p2[idx < 2] = 10
    blank = (p1 == 10) | ((p1 == 13) & (p2 == 10))
    return int(idx.size), int(idx.size - np.count_nonzero(blank))


def _count_all(a: np.ndarray, start: int, stop: int, step: int) -> tuple[int, int]:
    """:func:`_count_rows` of ``a[start:stop]``, ``step`` bytes a call, on every core."""
    parts = on_cores(lambda s: _count_rows(a, s, min(s + step, stop)), range(start, stop, max(1, step)))
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


_warming: set[str] = set()
_warming_lock = threading.Lock()


def _start_warming(dtype: str) -> None:
    """Import and load the compiled parser (:func:`.csv_parse.warm`) in a thread of its own,
    once per process and dtype: Numba's import and first load take a while, which the header's
    read and the row counts (by NumPy until it is ready) hide."""
    with _warming_lock:
        if dtype in _warming:
            return
        _warming.add(dtype)

    def run() -> None:
        from . import csv_parse

        csv_parse.warm(dtype)

    threading.Thread(target=run, name="daskmeans-csv-warm", daemon=True).start()


def _unchanged(spec: _CsvSpec) -> bool:
    """Whether the file is as it was when ``spec`` was made (its size and modification time)."""
    try:
        st = os.stat(spec.path)
    except OSError:
        return False
    return st.st_size == spec.size and st.st_mtime_ns == spec.mtime_ns


def _check_size(spec: _CsvSpec) -> None:
    size = os.path.getsize(spec.path)
    if size != spec.size:
        raise DataError(f"{spec.path} changed since it was opened: {size} bytes, was {spec.size}; read it again")


def _piece_bytes(data_bytes: int) -> int:
    """Text per piece of a plain file of ``data_bytes`` bytes of data: a piece per core down to
    ``_MIN_PIECE_BYTES``, at most ``_PIECE_BYTES``, at most ``_MAX_PIECES`` pieces."""
    size = min(_PIECE_BYTES, max(_MIN_PIECE_BYTES, -(-int(data_bytes) // cores())))
    return max(1, size, -(-int(data_bytes) // _MAX_PIECES))


def _count_block(spec: _CsvSpec, start: int, stop: int) -> tuple[tuple[int, int, int, int], ...]:
    """Bytes ``start:stop`` of a plain file (whole lines) cut into pieces of whole lines of about
    ``spec.piece_bytes``, counted on every core: ``(first byte, end, line breaks, rows they end)``
    of each piece."""
    _check_size(spec)
    _start_warming(spec.dtype)
    a = np.memmap(spec.path, dtype=np.uint8, mode="r")
    cuts = _line_cuts(a, start, stop, spec.piece_bytes)
    counts = on_cores(lambda p: _count_rows(a, *p), cuts)
    return tuple((int(b), int(e), int(n), int(r)) for (b, e), (n, r) in zip(cuts, counts))


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
    _start_warming(spec.dtype)
    breaks = rows = 0
    pos, ctx = 0, np.full(2, 10, np.uint8)  # ctx: the 2 bytes before the chunk
    end, trail = start, b""  # after the last byte that is not whitespace; the whitespace after it
    with _open_text(spec.path, spec.compression) as f:
        while chunk := f.read(spec.count_bytes):
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


# ---------------------------------------------------------------- parsing a block


def _csv_block(spec: _CsvSpec, pieces: tuple[tuple[int, int, int, int], ...]) -> np.ndarray:
    """A block of the array :func:`open_csv` makes: its ``pieces`` (first byte, end, first
    line, rows) of the (decompressed) file parsed on every core, an array (rows,
    len(spec.keep)) of ``spec.dtype``."""
    rows = sum(p[3] for p in pieces)
    out = np.empty((rows, len(spec.keep)), dtype=spec.dtype)
    _parse_parts(spec, pieces, 0, 0, rows, out)
    return out


def _parse_parts(spec: _CsvSpec, parts: Sequence[tuple[int, int, int, int]], first: int, start: int, stop: int,
                 out: np.ndarray) -> None:
    """Rows ``start:stop`` of the file, which ``parts`` (pieces of whole lines, the first
    holding row ``first`` on) hold, parsed into ``out`` (stop - start, len(spec.keep)): a plain
    file's pieces on a thread per core each, straight into their rows (a piece that holds
    rows outside start:stop, only the lines of its rows inside); a compressed file's one piece
    cut again and parsed on every core (:func:`_fill_block`); rows parsed ahead
    (:data:`_AHEAD`) copied."""
    ahead = _AHEAD.get(spec)
    at = None if ahead is None or not parts else ahead[1].get(parts[0][0])  # None: pieces cut otherwise
    if at is not None:
        _check_size(spec)  # as a parse would: a file rewritten since it was opened is refused
        lo = at - first
        out[...] = ahead[0][lo + start : lo + stop]
        return
    jobs = []
    for part in parts:
        rows = part[3]
        lo, hi = max(start, first), min(stop, first + rows)
        if lo < hi:
            jobs.append((part, lo - first, hi - first, out[lo - start : hi - start]))
        first += rows
    if spec.compression is not None:
        for (b, e, line, rows), lo, hi, dest in jobs:
            _fill_block(spec, b, e, line, rows, lo, hi, dest)
        return
    on_cores(lambda job: _parse_piece(spec, *job), jobs)


def _parse_piece(spec: _CsvSpec, part: tuple[int, int, int, int], lo: int, hi: int, out: np.ndarray) -> None:
    """Rows ``lo:hi`` of the piece ``part`` (first byte, end, first line, rows) of a plain
    file parsed into ``out`` (hi - lo, len(spec.keep)): the lines of those rows alone, found by
    their line breaks (:func:`.csv_parse.skip_rows`, a scan far cheaper than a parse), parsed
    straight into ``out`` on the calling thread."""
    from . import csv_parse

    b, e, line, rows = part
    a = _block_bytes(spec, b, e)
    s, before = (0, 0) if lo == 0 else csv_parse.skip_rows(a, 0, len(a), lo)
    t = len(a) if hi == rows else csv_parse.skip_rows(a, s, len(a), hi - lo)[0]
    buf, first_line = a[int(s) : int(t)], line + int(before)
    got = _parse_block(buf, spec, first_line, out)
    if got != hi - lo:  # the parser skipped or joined lines the count took for rows
        raise DataError(f"{spec.path}: {_odd_line(buf, first_line)} ({got} rows of values where "
                        f"{hi - lo} lines that are not empty were counted)")


def _fill_block(spec: _CsvSpec, start: int, stop: int, first_line: int, rows: int, lo: int, hi: int,
                out: np.ndarray) -> None:
    """Rows ``lo:hi`` of the block of bytes ``start:stop`` (``rows`` rows from the file's line
    ``first_line``) parsed into ``out`` (hi - lo, len(spec.keep)) of ``spec.dtype``: a
    compressed file's (its data, decompressed, is one block whose pieces were not counted).

    The block is cut into pieces of whole lines, a few per core; each piece's rows are counted
    (so that every piece knows where its rows go), then each piece that holds rows ``lo:hi``
    is parsed straight into its rows of ``out`` (a piece that holds only some of them, into
    rows of its own first).
    """
    a = _block_bytes(spec, start, stop)
    n = len(a)
    size = min(spec.piece_bytes, max(_MIN_PIECE_BYTES, -(-n // cores())))
    pieces = _line_cuts(a, 0, n, size)
    counts = on_cores(lambda p: _count_rows(a, *p), pieces)
    counts[-1] = (counts[-1][0], counts[-1][1] + _unended(a, *pieces[-1]))
    offsets = np.cumsum([0] + [c[1] for c in counts]).tolist()
    if offsets[-1] != rows:  # the same bytes counted otherwise when the file was opened
        raise DataError(f"{spec.path} changed since it was opened: {offsets[-1]} rows in bytes {start} to {stop}, "
                        f"{rows} when it was opened; read it again")
    lines = np.cumsum([first_line] + [c[0] for c in counts]).tolist()  # the file's line of each piece
    wanted = [i for i in range(len(pieces)) if offsets[i] < hi and offsets[i + 1] > lo and offsets[i + 1] > offsets[i]]

    def parse(i: int) -> None:
        b, e = pieces[i]
        r0, r1 = offsets[i], offsets[i + 1]
        inside = lo <= r0 and r1 <= hi
        dest = out[r0 - lo : r1 - lo] if inside else np.empty((r1 - r0, len(spec.keep)), dtype=spec.dtype)
        got = _parse_block(a[b:e], spec, lines[i], dest)
        if got != r1 - r0:  # the parser skipped or joined lines the count took for rows
            raise DataError(f"{spec.path}: {_odd_line(a[b:e], lines[i])} ({got} rows of values where "
                            f"{r1 - r0} lines that are not empty were counted)")
        if not inside:
            out[max(r0, lo) - lo : min(r1, hi) - lo] = dest[max(r0, lo) - r0 : min(r1, hi) - r0]

    on_cores(parse, wanted)


def _unended(a: np.ndarray, start: int, stop: int) -> int:
    """1 if ``a[start:stop]`` ends in a line without a line break that is not blank, else 0."""
    if stop <= start or a[stop - 1] == 10:
        return 0
    lo = stop
    while lo > start:  # back to the last line break, 64 KiB at a time
        lo2 = max(start, lo - (1 << 16))
        hit = np.flatnonzero(a[lo2:lo] == 10)
        if hit.size:
            lo = lo2 + int(hit[-1]) + 1
            break
        lo = lo2
    return int(bytes(a[lo:stop]).strip() != b"")


def _odd_line(buf: Any, first_line: int) -> str:
    """Where a piece's rows and its counted lines part: its first line of whitespace alone."""
    lines = bytes(buf).rstrip(b"\n").split(b"\n")
    for i, text in enumerate(lines):
        if text.strip() == b"" and text not in (b"", b"\r"):
            return f"line {first_line + i} holds whitespace alone, which cannot be read: delete it"
    return f"lines {first_line} to {first_line + len(lines) - 1} hold a line break inside quotes, which cannot be read"


def _parse_block(buf: np.ndarray, spec: _CsvSpec, first_line: int, out: np.ndarray) -> int:
    """``buf`` (bytes: whole lines of the file, no header) parsed into ``out`` (rows,
    len(spec.keep)), on the calling thread: the rows of values it holds (``out``'s rows where
    they agree with the count, the caller's check). The compiled parser where every cell is a
    plain number (:mod:`.csv_parse`); else pyarrow's parser where it reads every cell; else
    pandas' (short rows, and cells such as ``' 1'`` or ``'None'``)."""
    from . import csv_parse

    if csv_parse.usable(spec.delimiter) and csv_parse.parse_into(buf, spec.delimiter, spec.n_columns, spec.keep, out):
        return out.shape[0]
    cols = tuple(dict.fromkeys(spec.keep))  # a column asked for twice is parsed once
    got = None
    if len(spec.delimiter) == 1:
        import pyarrow as pa

        try:
            got = _parse_arrow(buf, spec, cols)
        except pa.ArrowInvalid:
            pass
        # Whitespace runs: pyarrow splits on each space, so a run reads as an empty cell (NaN).
        if got is not None and spec.delimiter == " " and np.isnan(got).any():
            got = None
    if got is None:
        got = _parse_pandas(buf, spec, cols, first_line)
        if cols != spec.keep:
            got = got[:, [cols.index(k) for k in spec.keep]]
    if got.shape[0] == out.shape[0]:
        out[...] = got
    return got.shape[0]


def _parse_arrow(buf: np.ndarray, spec: _CsvSpec, cols: tuple[int, ...]) -> np.ndarray:
    """``buf`` parsed by pyarrow on this thread: (rows, len(spec.keep)) of ``spec.dtype``."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = [f"f{i}" for i in range(spec.n_columns)]  # unique, whatever the header holds
    typ = pa.float32() if spec.dtype == "float32" else pa.float64()
    table = pcsv.read_csv(
        pa.py_buffer(buf),
        read_options=pcsv.ReadOptions(column_names=names, use_threads=False, block_size=spec.block_size),
        parse_options=pcsv.ParseOptions(delimiter=spec.delimiter),
        convert_options=pcsv.ConvertOptions(column_types={names[c]: typ for c in cols},
                                            include_columns=[names[c] for c in cols], null_values=list(_NA_VALUES)),
    )
    if cols != spec.keep:  # the array's order, a column asked for twice given twice
        table = table.select([cols.index(k) for k in spec.keep])
    if table.num_rows and hasattr(table, "to_tensor"):  # one row-major copy, in C++
        return table.to_tensor(null_to_nan=True, row_major=True).to_numpy()
    out = np.empty((table.num_rows, len(spec.keep)), dtype=spec.dtype)
    row = 0
    for batch in table.to_batches():  # older pyarrow: a batch per pyarrow block
        if batch.num_rows:
            out[row : row + batch.num_rows] = batch.to_tensor(null_to_nan=True, row_major=True).to_numpy()
            row += batch.num_rows
    return out


def _parse_pandas(buf: Any, spec: _CsvSpec, cols: tuple[int, ...], first_line: int) -> np.ndarray:
    """``buf`` parsed by pandas: (rows, len(cols)) of ``spec.dtype``, or a DataError naming the
    file's line (and the column and cell of a value that is no number)."""
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


# ---------------------------------------------------------------- the command's read-ahead process


def read_ahead(argv: list[str]) -> int:
    """The command's read-ahead process (:mod:`.csv_ahead`; ``argv``: the memory file's
    descriptor and the options as JSON): survey the file as :func:`open_csv` does, size the
    memory file to its rows, parse them into it on every core, print the survey, the rows'
    count, columns and dtype as JSON. Exit status 1 on any error: the command then reads the
    file itself and reports it."""
    import json
    import mmap

    import dask
    import dask.threaded

    from . import csv_ahead

    fd, options = int(argv[0]), json.loads(argv[1])
    csv_ahead.end_with_parent(options["parent"])
    # As in the command's own process (cli.main.command_process): Numba, loading the parser,
    # would import SciPy's linear algebra only to offer np.linalg in compiled code, which the
    # parser does not use; it is most of what loading the parser costs here.
    sys.modules.setdefault("scipy.linalg.cython_blas", None)
    try:
        dtype = np.dtype(options["dtype"])
        # The counts' tasks on threads, the scheduler given as a function: Dask then does not
        # import distributed to look for a client (half a second of this process's imports).
        with dask.config.set(scheduler=dask.threaded.get):
            survey = _survey(options["path"], options["chunk_bytes"], dtype, column_list(options["columns"]),
                             column_list(options["drop_columns"]), options["delimiter"])
        rows = survey.rows()
        nbytes = rows.n * rows.d * dtype.itemsize
        os.ftruncate(fd, max(nbytes, 1))
        with mmap.mmap(fd, max(nbytes, 1)) as mm:
            out = np.frombuffer(mm, dtype, count=rows.n * rows.d).reshape(rows.n, rows.d)
            parse_into(rows, 0, rows.n, out)
            del out
    except Exception:  # noqa: BLE001 - any failure: the command reads the file itself
        return 1
    sys.stdout.write(json.dumps({"survey": survey.to_json(), "rows": rows.n, "columns": rows.d,
                                 "dtype": dtype.name}))
    return 0


if __name__ == "__main__":  # pragma: no cover - the read-ahead process, started by csv_ahead.start
    sys.exit(read_ahead(sys.argv[1:]))
