"""CSV text of plain numbers parsed by compiled code straight into float32/float64 rows, correctly
rounded, or refused so that the CSV reader's pyarrow/pandas path reads it.

Why: pyarrow's CSV float conversion is several times slower per core than this pass, and its
table is copied once more into row-major rows (docs/performance.md, "CSV parsing"). The common
file (plain decimal numbers, one delimiter, LF or CRLF, no quotes) needs neither a tokenizer of
quoted fields nor a columnar table: one pass per piece of whole lines that reads each cell's
digits and writes its value into the row it belongs to, with the interpreter lock released
(``nogil``) so that a thread per core parses a piece each.

Exactness: a value is the decimal ``w * 10**e`` with its significant digits ``w`` in a uint64.
Where ``w < 2**53`` and ``|e| <= 22`` both ``w`` and ``10**|e|`` are float64 numbers and one
IEEE product or quotient rounds once: the correctly rounded float64 (Clinger's fast path), the
bits of Python's ``float()``. The float32 of that float64 is the correctly rounded float32 of
the decimal unless the float64 lies exactly halfway between two float32s (the decimal then
may lie on either side, and a second rounding to even can pick the wrong one): such a cell,
and any cell outside the fast path (more than 19 digits, ``w >= 2**53``, ``|e| > 22``), is
*deferred*: its place is recorded and its text converted afterwards by pyarrow's own string
to float conversion (:func:`resolve`), which is what the pyarrow path would have given.
Anything else unusual (quotes, NA spellings other than an empty cell, ``inf``/``nan``, spaces,
a lone CR, a row of another width) refuses the whole piece, which then goes to the existing
parsers with their messages.

The compiled code is cached on disk as the CPU kernels' is (the user's cache folder or
``NUMBA_CACHE_DIR``).
"""

from __future__ import annotations

import threading
from typing import Sequence

import numba
import numpy as np

from ..config import numba_cache_dir


# Numba reads NUMBA_CACHE_DIR when it is imported (maybe before us): set its setting itself.
numba.config.CACHE_DIR = numba_cache_dir(numba.config.CACHE_DIR)

# Bytes a delimiter may not be: those of numbers and of line ends.
_NOT_DELIMITERS = frozenset(b"0123456789+-.eE\r\n\"")
# Deferred cells one piece may record; a piece with more goes to the other parsers whole.
DEFER_CAP = 1 << 16
# 10**0 .. 10**22: every one a float64 exactly.
_POW10 = np.array([float(10**i) for i in range(23)], dtype=np.float64)

# parse_lines' refusal (a negative return): the piece needs the pyarrow/pandas path.
REFUSED = -1


def usable(delimiter: str) -> bool:
    """Whether the compiled parser reads files of this delimiter: one byte, not a space (runs
    of spaces are one delimiter), nor a byte of a number or of a line end."""
    return len(delimiter) == 1 and delimiter != " " and ord(delimiter) < 128 and ord(delimiter) not in _NOT_DELIMITERS


@numba.njit(nogil=True, cache=True, error_model="numpy")  # no fastmath: one IEEE rounding per value
def parse_lines(buf, delim, slot, out, f32, deferred):  # pragma: no cover - compiled
    """Parse ``buf`` (uint8: whole lines, no header) into ``out``.

    Parameters
    ----------
    buf : ndarray (n_bytes,) uint8
    delim : int
        The delimiter's byte.
    slot : ndarray (n_columns,) int64
        The column of ``out`` each of the file's columns goes to, -1 for one not read.
    out : ndarray (rows, k) float32 or float64
        Rows written in order; blank lines (empty, or a lone CR) are no rows.
    f32 : bool
        Whether ``out`` is float32 (the float32 halfway check applies).
    deferred : ndarray (DEFER_CAP, 4) int64
        Filled with ``(row, column of out, first byte, end)`` of the cells to convert
        afterwards (:func:`resolve`).

    Returns
    -------
    (rows, n_deferred) : (int, int)
        ``rows`` is ``REFUSED`` where the piece needs the other parsers (then ``out`` holds
        anything).
    """
    n = buf.shape[0]
    n_columns = slot.shape[0]
    rows_cap = out.shape[0]
    cap = deferred.shape[0]
    nan = np.float64(np.nan)
    scratch = np.empty(1, dtype=np.float64)
    bits = scratch.view(np.uint64)
    half32 = np.uint64(1) << np.uint64(28)  # float64 mantissa bits below a float32's: a halfway point
    low29 = (np.uint64(1) << np.uint64(29)) - np.uint64(1)
    max_w = np.uint64(1) << np.uint64(53)
    r = 0
    nd_def = 0
    i = 0
    while i < n:
        c = buf[i]
        if c == 10:  # a blank line
            i += 1
            continue
        if c == 13 and i + 1 < n and buf[i + 1] == 10:
            i += 2
            continue
        if r >= rows_cap:
            return REFUSED, nd_def
        col = 0
        while True:  # one cell per turn, then its delimiter or the line's end
            s = slot[col]
            start = i
            if s < 0:  # a column not read: skipped to its end, quotes refused (they may hold a delimiter)
                while i < n:
                    c = buf[i]
                    if c == delim or c == 10:
                        break
                    if c == 13:
                        if i + 1 < n and buf[i + 1] == 10:
                            break
                        return REFUSED, nd_def
                    if c == 34:
                        return REFUSED, nd_def
                    i += 1
            else:
                neg = False
                if i < n and (buf[i] == 45 or buf[i] == 43):  # '-' or '+'
                    neg = buf[i] == 45
                    i += 1
                # Every digit goes into w (leading zeros add nothing): a cell of more than 19
                # digits, which w may not hold, is deferred below. The integer and fraction
                # digits are two copies of one loop: as a compiled helper returning
                # (i, w, digits) the parse was slower (docs/performance.md, "CSV").
                w = np.uint64(0)
                digits = 0
                while i < n:
                    d = np.int64(buf[i]) - 48
                    if d < 0 or d > 9:
                        break
                    w = w * np.uint64(10) + np.uint64(d)
                    digits += 1
                    i += 1
                e10 = 0
                if i < n and buf[i] == 46:  # '.'
                    i += 1
                    whole = digits
                    while i < n:
                        d = np.int64(buf[i]) - 48
                        if d < 0 or d > 9:
                            break
                        w = w * np.uint64(10) + np.uint64(d)
                        digits += 1
                        i += 1
                    e10 = whole - digits
                if i < n and (buf[i] == 101 or buf[i] == 69):  # 'e' or 'E'
                    if digits == 0:
                        return REFUSED, nd_def
                    i += 1
                    eneg = False
                    if i < n and (buf[i] == 45 or buf[i] == 43):
                        eneg = buf[i] == 45
                        i += 1
                    ed = 0
                    ev = 0
                    while i < n and 48 <= buf[i] <= 57:
                        if ed < 6:
                            ev = ev * 10 + (buf[i] - 48)
                        ed += 1
                        i += 1
                    if ed == 0:
                        return REFUSED, nd_def
                    if ed > 5:
                        ev = 99999  # far outside the fast path: the cell is deferred below
                    e10 += -ev if eneg else ev
                # The cell ends here: at a delimiter, a line's end or the buffer's end.
                if i < n:
                    c = buf[i]
                    if c == 13:
                        if not (i + 1 < n and buf[i + 1] == 10):
                            return REFUSED, nd_def
                    elif c != delim and c != 10:
                        return REFUSED, nd_def
                if digits == 0:
                    if i != start:  # a sign alone
                        return REFUSED, nd_def
                    out[r, s] = nan  # an empty cell: NA, as both parsers read it
                elif w == 0 and digits <= 19:
                    out[r, s] = -0.0 if neg else 0.0
                elif digits > 19 or w > max_w or e10 > 22 or e10 < -22:
                    if nd_def == cap:
                        return REFUSED, nd_def
                    deferred[nd_def, 0] = r
                    deferred[nd_def, 1] = s
                    deferred[nd_def, 2] = start
                    deferred[nd_def, 3] = i
                    nd_def += 1
                else:
                    f = np.float64(w)
                    if e10 >= 0:
                        f = f * _POW10[e10]
                    else:
                        f = f / _POW10[-e10]
                    if f32:
                        scratch[0] = f
                        if (bits[0] & low29) == half32:  # on a float32 halfway point: rounding twice may err
                            if nd_def == cap:
                                return REFUSED, nd_def
                            deferred[nd_def, 0] = r
                            deferred[nd_def, 1] = s
                            deferred[nd_def, 2] = start
                            deferred[nd_def, 3] = i
                            nd_def += 1
                            f = 0.0
                    out[r, s] = -f if neg else f
            col += 1
            # After the cell: i is at a delimiter, a line's end (LF, CR LF) or the buffer's end.
            if i < n and buf[i] == delim:
                if col == n_columns:  # more cells than columns
                    return REFUSED, nd_def
                i += 1
                continue
            if col != n_columns:  # fewer cells than columns
                return REFUSED, nd_def
            if i < n:
                i += 2 if buf[i] == 13 else 1
            break
        r += 1
    return r, nd_def


@numba.njit(nogil=True, cache=True, inline="always")
def _ends_row(a, i):  # pragma: no cover - compiled
    """Whether the line break ``a[i]`` ends a row: not where its line is blank (empty, or a
    lone CR). Bytes before ``a[0]`` count as a line break."""
    p1 = a[i - 1] if i >= 1 else 10
    p2 = a[i - 2] if i >= 2 else 10
    return not (p1 == 10 or (p1 == 13 and p2 == 10))


@numba.njit(nogil=True, cache=True, inline="always")
def _scan_bytes(a, lo, hi, k):  # pragma: no cover - compiled
    """:func:`_scan` of ``a[lo:hi]`` a byte at a time."""
    breaks = 0
    rows = 0
    for i in range(lo, hi):
        if a[i] == 10:
            breaks += 1
            if _ends_row(a, i):
                rows += 1
                if rows == k:
                    return i + 1, breaks, rows
    return hi, breaks, rows


# Eight bytes at a time: a word holds a line break where one of its bytes XOR 0x0A is zero,
# which ``~(((x & LOW7) + LOW7) | x) & HIGH`` flags exactly (no carry crosses a byte).
_NL8 = np.uint64(0x0A0A0A0A0A0A0A0A)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_HIGH = np.uint64(0x8080808080808080)


@numba.njit(nogil=True, cache=True)
def _scan(a, start, stop, k):  # pragma: no cover - compiled
    """(the byte after the line break that ends the ``k``-th row of ``a[start:stop]``, else
    ``stop``; the line breaks up to there; the rows they end). A break ends no row where its
    line is blank (empty, or a lone CR), as both other parsers skip those; bytes before
    ``a[0]`` count as a line break (a line starts there). ``k < 1``: every row of the range.

    The text is read eight bytes a word, a word's bytes looked at one by one only where it
    holds a line break (a line of a wide CSV spans many words): a byte at a time, the count
    ran at a quarter of the speed (docs/performance.md, "CSV placement")."""
    head = min(stop, 8 * ((start + 7) // 8))  # words from a multiple of 8 (a mapped file's are aligned)
    end, breaks, rows = _scan_bytes(a, start, head, k)
    if k > 0 and rows == k:
        return end, breaks, rows
    words = (stop - head) // 8
    if words > 0:
        w = a[head : head + 8 * words].view(np.uint64)
        for j in range(words):
            x = w[j] ^ _NL8
            if ~(((x & _LOW7) + _LOW7) | x) & _HIGH:
                end, b, r = _scan_bytes(a, head + 8 * j, head + 8 * j + 8, k - rows)
                breaks += b
                rows += r
                if k > 0 and rows == k:
                    return end, breaks, rows
    end, b, r = _scan_bytes(a, head + 8 * words, stop, k - rows)
    return end, breaks + b, rows + r


@numba.njit(nogil=True, cache=True)
def count_rows(a, start, stop):  # pragma: no cover - compiled
    """(line breaks in ``a[start:stop]``, rows they end), in one pass without temporaries
    (:func:`_scan`'s rules)."""
    _, breaks, rows = _scan(a, start, stop, 0)
    return breaks, rows


@numba.njit(nogil=True, cache=True)
def skip_rows(a, start, stop, k):  # pragma: no cover - compiled
    """(the byte after the line break that ends the ``k``-th row of ``a[start:stop]``, the line
    breaks up to it), by :func:`count_rows`' rule (a blank line is no row); ``(start, 0)`` for
    ``k <= 0``; ``(stop, every break)`` where fewer rows end in the range. Where rows ``lo:hi``
    of a piece of text lie, so that they alone are parsed straight into their rows."""
    if k <= 0:
        return start, 0
    end, breaks, _ = _scan(a, start, stop, k)
    return end, breaks


_ready = threading.Event()


def warm(dtype: str) -> None:
    """Load (or compile) the parser for ``dtype`` output and the row count, on this thread;
    :func:`ready` from then on. The CSV reader runs it in a thread of its own when it opens a
    file and while it counts rows (``csv_reader._start_warming``): Numba's first load in a
    process initialises its compiler, which the first parse would otherwise wait for."""
    buf = np.frombuffer(b"1\n", np.uint8)  # read-only, as the reader's mapped text is
    parse_into(buf, ",", 1, [0], np.empty((1, 1), dtype=dtype))
    count_rows(buf, 0, 2)
    skip_rows(buf, 0, 2, 1)
    _ready.set()


def ready() -> bool:
    """Whether :func:`warm` has run: the compiled row count is loaded."""
    return _ready.is_set()


def resolve(buf: np.ndarray, cells: np.ndarray, out: np.ndarray) -> None:
    """Write the deferred cells ``cells`` (``(row, column, first byte, end)`` each, from
    :func:`parse_lines`) of ``buf`` into ``out``, each text converted by pyarrow's string to
    float conversion: the bits pyarrow's CSV parser gives it (correctly rounded, to float32
    directly), and for float64 those of Python's ``float()``."""
    if not len(cells):  # the common piece: pyarrow is not even imported
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    # One string array over the cells' bytes gathered end to end (no Python object per cell).
    first, lengths = cells[:, 2], cells[:, 3] - cells[:, 2]
    offsets = np.zeros(len(cells) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = buf[np.repeat(first - offsets[:-1], lengths) + np.arange(offsets[-1])]
    texts = pa.LargeStringArray.from_buffers(len(cells), pa.py_buffer(offsets), pa.py_buffer(data))
    typ = pa.float32() if out.dtype == np.float32 else pa.float64()
    values = pc.cast(texts, typ).to_numpy(zero_copy_only=False)
    out[cells[:, 0], cells[:, 1]] = values


def parse_into(buf: np.ndarray, delimiter: str, n_columns: int, keep: Sequence[int], out: np.ndarray) -> bool:
    """Parse ``buf`` (whole lines of a CSV file, no header) into ``out`` (rows, len(keep)):
    True where every row was read exactly (``out`` then holds them all), False where the piece
    needs the other parsers (an unusual cell, another row count than ``out``'s; ``out`` then
    holds anything). The caller gives only a :func:`usable` delimiter.

    Parameters
    ----------
    buf : ndarray (n_bytes,) uint8
    delimiter : str
    n_columns : int
        Cells per line.
    keep : sequence of int
        The file's column of each of ``out``'s columns (one may come twice).
    out : ndarray (rows, len(keep)) float32 or float64, rows C-contiguous
    """
    first: dict[int, int] = {}
    for j, k in enumerate(keep):
        first.setdefault(int(k), j)
    slot = np.full(n_columns, -1, dtype=np.int64)
    for k, j in first.items():
        slot[k] = j
    deferred = np.empty((DEFER_CAP, 4), dtype=np.int64)
    rows, nd = parse_lines(buf, ord(delimiter), slot, out, out.dtype == np.float32, deferred)
    if rows != out.shape[0]:
        return False
    resolve(buf, deferred[:nd], out)
    for j, k in enumerate(keep):  # a column asked for twice: the copy of its first place
        if first[int(k)] != j:
            out[:, j] = out[:, first[int(k)]]
    return True
