"""The compiled CSV parser (io/csv_parse.py): bit for bit pyarrow's float parse and Python's
``float()`` on every text it accepts, refusal of what it does not read, and CSV rows parsed into
a buffer the caller gives (``csv_reader.parse_into``)."""

from __future__ import annotations

from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from daskmeans import DataError, read
from daskmeans.io import csv_parse, csv_reader
from test_io import correctly_rounded_f32

pa = pytest.importorskip("pyarrow")
pcsv = pytest.importorskip("pyarrow.csv")


def _arrow(text: str, n_columns: int, dtype) -> np.ndarray:
    """``text`` parsed by pyarrow's CSV reader, every column ``dtype``, as row-major rows."""
    names = [f"f{i}" for i in range(n_columns)]
    typ = pa.float32() if dtype == np.float32 else pa.float64()
    t = pcsv.read_csv(pa.py_buffer(text.encode()), read_options=pcsv.ReadOptions(column_names=names),
                      convert_options=pcsv.ConvertOptions(column_types={n: typ for n in names}))
    return t.to_tensor(null_to_nan=True, row_major=True).to_numpy()


def _same_as_the_references(cells: list[str], n_columns: int) -> None:
    """``cells`` as lines of ``n_columns`` parse, compiled, to pyarrow's bits in float32 and
    float64, and to ``float()``'s in float64."""
    rows = len(cells) // n_columns
    cells = cells[: rows * n_columns]
    text = "\n".join(",".join(cells[r * n_columns : (r + 1) * n_columns]) for r in range(rows)) + "\n"
    buf = np.frombuffer(text.encode(), np.uint8)
    for dtype, u in ((np.float32, np.uint32), (np.float64, np.uint64)):
        out = np.empty((rows, n_columns), dtype)
        assert csv_parse.parse_into(buf, ",", n_columns, range(n_columns), out)
        ref = _arrow(text, n_columns, dtype)
        bad = np.flatnonzero(out.view(u).ravel() != ref.view(u).ravel())
        assert bad.size == 0, [(cells[b], out.ravel()[b], ref.ravel()[b]) for b in bad[:5]]
    py = np.array([float(c) for c in cells]).reshape(rows, n_columns)
    np.testing.assert_array_equal(out.view(np.uint64), py.view(np.uint64))


def test_shortest_texts_of_float32_and_float64_values():
    """Values written as their shortest text (NumPy's str of float32, repr of float64), of
    every magnitude: denormals and extremes are deferred to pyarrow's conversion, the rest on
    the fast path, all with the references' bits."""
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(20000) * 10.0 ** rng.integers(-45, 39, 20000)).astype(np.float32)
    x = x[np.isfinite(x)]
    x[:6] = [np.finfo(np.float32).max, np.finfo(np.float32).tiny, np.float32(1e-45), -0.0, 1, -np.finfo(np.float32).max]
    _same_as_the_references([str(v) for v in x], 4)
    _same_as_the_references([str(v) for v in rng.standard_normal(20000).astype(np.float32)], 5)
    y = rng.standard_normal(20000) * 10.0 ** rng.integers(-320, 308, 20000)
    _same_as_the_references([repr(float(v)) for v in y], 4)
    _same_as_the_references([repr(float(v)) for v in rng.standard_normal(20000)], 4)


def test_spellings_signs_zeros_and_exponents():
    """'1.', '.5', '1e5', '+1', '-0', leading and trailing zeros, E and signed exponents, long
    mantissas and exponents at the fast path's edges."""
    rng = np.random.default_rng(1)
    cells = ["1.", ".5", "1e5", "+1", "-0", "-0.0", "0e10", "0.000e-400", "-.5e-3", "+.25E+02", "007", "00.1000",
             "1e22", "1e23", "1e-22", "1e-23", "9007199254740992", "9007199254740993", "123456789012345678901234567890",
             "0.000000000000000000000000000001", "1.0000000000000000000001", "4.9e-324", "1.8e308", "3.4028235e38",
             "3.4028236e38", "1e000005", "18446744073709551615", "18446744073709551616", "+1e30", "+.5e-30",
             "000123e-40", "1.e40", "-1e-0000005"]
    for v in rng.standard_normal(3000).astype(np.float32):
        k = int(rng.integers(0, 5))
        cells.append([f"+{abs(v):.6e}".replace("e", "E"), f"000{abs(v):.9f}00", f"{v:.3e}".replace("e-0", "e-"),
                      f"{int(rng.integers(-10**6, 10**6))}.", f".{int(rng.integers(0, 10**8))}e{int(rng.integers(-30, 30))}"][k])
    _same_as_the_references(cells + ["1"] * (-len(cells) % 4), 4)


def test_halfway_points_between_float32s():
    """Decimals exactly halfway between two float32s, and a hair above and below: the float64
    of some lies on the halfway point itself, where casting it would round twice; each gives
    its correctly rounded float32 (pyarrow's bits)."""
    rng = np.random.default_rng(2)
    cells = []
    for v in np.abs(rng.standard_normal(1500) * 10.0 ** rng.integers(-15, 15, 1500)).astype(np.float32):
        nx = np.nextafter(v, np.float32(np.inf))
        mid = (Fraction(float(v)) + Fraction(float(nx))) / 2
        with localcontext() as ctx:
            ctx.prec = 60
            d = Decimal(mid.numerator) / Decimal(mid.denominator)
            tiny = Decimal(float(nx) - float(v)) * Decimal("1e-12")
            cells += [f"{d:.25e}", f"{d:.17e}", str(d + tiny), str(d - tiny)]
    for k in range(1, 1500):
        cells += [str(2**24 + 2 * k - 1), str((2**24 + 2 * k - 1) * 8), f"{2**24 + 2 * k - 1}e-5", f"{2**24 + 2 * k - 1}.5"]
    _same_as_the_references(cells, 4)
    out = np.empty((len(cells), 1), np.float32)
    buf = np.frombuffer(("\n".join(cells) + "\n").encode(), np.uint8)
    assert csv_parse.parse_into(buf, ",", 1, [0], out)
    expected = np.array([correctly_rounded_f32(c) for c in cells[:2000]], np.float32)
    np.testing.assert_array_equal(out[:2000, 0].view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("text", ["1,2\n3,x\n", "1,2\n3,nan\n", "1,2\nNA,4\n", '1,"2"\n', "1, 2\n", "1,2\n3\n",
                                  "1,2\n3,4,5\n", "1,2\r3,4\n", "1,-\n", "1,.\n", "1,e5\n", "1,1e\n", "1,inf\n",
                                  "1,2\n   \n", "1,0x1\n", "1,1.2.3\n"])
def test_unusual_pieces_are_refused(text):
    """Anything but plain numbers, empty cells and whole rows of the file's width refuses the
    piece (the CSV reader then parses it with pyarrow or pandas, which read it or name it)."""
    out = np.empty((2, 2), np.float32)
    assert not csv_parse.parse_into(np.frombuffer(text.encode(), np.uint8), ",", 2, [0, 1], out)


def test_blank_lines_crlf_empty_cells_and_columns_not_read():
    """Blank lines are no rows, CRLF ends a line, an empty cell is NaN, columns not read may
    hold any text but quotes, and a column asked for twice comes twice."""
    text = "\r\n1,id7,2.5\r\n\n,word,-3\r\n\r\n4,x,5"
    out = np.empty((3, 3), np.float64)
    assert csv_parse.parse_into(np.frombuffer(text.encode(), np.uint8), ",", 3, [2, 0, 2], out)
    np.testing.assert_array_equal(out, [[2.5, 1, 2.5], [-3, np.nan, -3], [5, 4, 5]])
    assert not csv_parse.parse_into(np.frombuffer(b'1,"a,b",2\n', np.uint8), ",", 3, [0, 2], np.empty((1, 2)))
    assert not csv_parse.usable(" ") and not csv_parse.usable("||") and not csv_parse.usable(".")
    assert csv_parse.usable("\t") and csv_parse.usable(";")


@pytest.mark.parametrize("piece_bytes", [1000, 8 << 20])
def test_parse_into_any_rows_of_a_file(tmp_path, monkeypatch, piece_bytes):
    """Rows start:stop of an opened file parsed into a given buffer: the rows read() gives,
    across blocks and pieces (a block in one piece, or in many), from a piece the compiled
    parser reads and from one it hands to pandas; odd requests refused by value."""
    monkeypatch.setattr(csv_reader, "_PIECE_BYTES", piece_bytes)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3000, 5)).astype(np.float32)
    lines = [",".join(str(v) for v in row) for row in x]
    lines[2100] = " " + lines[2100]  # pandas reads ' 1.5'; the compiled parser and pyarrow do not
    (tmp_path / "x.csv").write_text("a,b,c,d,e\n" + "\n".join(lines) + "\n")
    X = read(str(tmp_path / "x.csv"), chunk_bytes=20_000)
    spec = csv_reader.csv_rows_of(X)
    assert X.numblocks[0] > 4 and (spec.n, spec.d, spec.dtype) == (3000, 5, np.float32)
    assert csv_reader.csv_rows_of(X[:10]) is None
    whole = X.compute()
    np.testing.assert_array_equal(whole, x)
    for start, stop in [(0, 3000), (17, 2999), (2100, 2101), (400, 400), (1, 2)]:
        buf = np.full((stop - start + 2, 5), np.nan, np.float32)
        csv_reader.parse_into(spec, start, stop, buf[1:-1])
        np.testing.assert_array_equal(buf[1:-1].view(np.uint32), x[start:stop].view(np.uint32))
        assert np.isnan(buf[[0, -1]]).all()
    with pytest.raises(ValueError, match=r"rows 10:3001 should lie within the file's 3000 rows"):
        csv_reader.parse_into(spec, 10, 3001, np.empty((2991, 5), np.float32))
    with pytest.raises(ValueError, match=r"should be \(5, 5\) of float32"):
        csv_reader.parse_into(spec, 0, 5, np.empty((5, 5), np.float64))
    with pytest.raises(ValueError, match=r"rows should be C-contiguous"):
        csv_reader.parse_into(spec, 0, 5, np.empty((5, 10), np.float32)[:, ::2])
    n = 120_000  # the bad cell past the sample the client parses when it opens the file
    late = [f"{i},{i}.5" for i in range(n)]
    late[n - 10] = f"{n},word"
    (tmp_path / "bad.csv").write_text("a,b\n" + "\n".join(late) + "\n")
    spec = csv_reader.csv_rows_of(read(str(tmp_path / "bad.csv"), chunk_bytes=400_000))
    got = np.empty((n // 2, 2), np.float32)
    csv_reader.parse_into(spec, 0, n // 2, got)  # rows of other blocks read
    np.testing.assert_array_equal(got, [[i, i + 0.5] for i in range(n // 2)])
    with pytest.raises(DataError, match=rf"column 'b' of .*bad.csv is not numeric \(line {n - 10 + 2} has 'word'\)"):
        csv_reader.parse_into(spec, n - 100, n, np.empty((100, 2), np.float32))


def test_compiled_row_count_is_numpys(monkeypatch):
    """The compiled row count gives NumPy's counts (which the reader uses until the compiled
    parser is loaded): line breaks, and rows that are not blank (empty, or a lone CR), for
    any range of any bytes, a line starting before byte 0; also where the compiled count reads
    the text eight bytes at a time (long ranges, starting at any offset of a word, the text a
    view at any byte of another array, line breaks dense or rare)."""
    csv_parse.warm("float32")
    rng = np.random.default_rng(4)
    cases = []
    for _ in range(100):
        a = rng.choice(np.frombuffer(b"\n\r1,", np.uint8), int(rng.integers(0, 30)))
        cases += [(a, start, stop) for start in range(len(a) + 1) for stop in range(start, len(a) + 1, 3)]
    for p in ([0.3, 0.2, 0.3, 0.2], [0.02, 0.01, 0.57, 0.4]):
        text = rng.choice(np.frombuffer(b"\n\r1,", np.uint8), 400, p=p)
        for offset in range(9):
            a = text[offset:]
            cases += [(a, start, stop) for start in range(0, 20) for stop in (start, start + 7, start + 64, len(a))]
    compiled = [csv_reader._count_rows(*c) for c in cases]
    monkeypatch.setattr(csv_parse, "ready", lambda: False)
    assert [csv_reader._count_rows(*c) for c in cases] == compiled


def _skip_rows_by_numpy(a, start, stop, k):
    """:func:`.csv_parse.skip_rows` by NumPy: the byte after the k-th row's line break (rows
    as the count has them) and the line breaks up to it, else (stop, every break)."""
    if k <= 0:
        return start, 0
    idx = np.flatnonzero(a[start:stop] == 10) + start
    p1 = np.array([a[i - 1] if i >= 1 else 10 for i in idx], np.uint8)
    p2 = np.array([a[i - 2] if i >= 2 else 10 for i in idx], np.uint8)
    ends = np.flatnonzero(~((p1 == 10) | ((p1 == 13) & (p2 == 10))))
    if ends.size < k:
        return stop, int(idx.size)
    return int(idx[ends[k - 1]]) + 1, int(ends[k - 1]) + 1


def test_compiled_row_skip_is_numpys():
    """Where the k-th row of a range ends, and the line breaks up to it: the compiled scan
    (eight bytes a word) against NumPy's, for k within, at and past the rows of the range,
    any start within a word, views at any byte offset, breaks dense or rare."""
    csv_parse.warm("float32")
    rng = np.random.default_rng(5)
    for p in ([0.3, 0.2, 0.3, 0.2], [0.02, 0.01, 0.57, 0.4]):
        text = rng.choice(np.frombuffer(b"\n\r1,", np.uint8), 300, p=p)
        for offset in range(9):
            a = text[offset:]
            for start in range(0, 20, 3):
                for stop in (start, start + 9, start + 70, len(a)):
                    rows = csv_reader._count_rows(a, start, stop)[1]
                    for k in sorted({0, 1, 2, rows // 2, rows, rows + 1}):
                        got = tuple(int(v) for v in csv_parse.skip_rows(a, start, stop, k))
                        assert got == _skip_rows_by_numpy(a, start, stop, k), (offset, start, stop, k)


@pytest.mark.parametrize("sample, header, delim, plain", [
    (b'"f0","f1","f2"\n1,2.5,3\n4,5,6e1\n', True, ",", True),
    (b"id,x,y\n1,0.5,2\n2,,3\r\n3,1.5,4\n", True, ",", True),  # an empty cell: float64
    (b"1,2,3\n4,5,6\n", False, ",", True),
    (b"a,b\n+1,-0\n007,1E3\n", True, ",", True),
    (b"a,b\n1,2\n\n\n3,4", True, ",", True),
    (b" a, b\n1,2\n", True, ",", True),  # spaces in names kept, as pandas keeps them
    (b"a;b\n1;2.0\n", True, ";", True),
    (b"a,a\n1,2\n", True, ",", False),  # pandas renames a repeated name ("a.1")
    (b",b\n1,2\n", True, ",", False),  # ... and an empty one ("Unnamed: 0")
    (b"a,b\n1,NA\n", True, ",", False),  # a cell the compiled parser refuses
    (b"a,b\n1,2\n3\n", True, ",", False),
    (b"a,b\n99999999999999999999,1\n", True, ",", False),  # beyond int64: pandas' own type
    (b"\xef\xbb\xbfa,b\n1,2\n", True, ",", False),  # a byte-order mark, which pandas drops
])
def test_plain_sample_columns_are_pandas(sample, header, delim, plain):
    """The columns of a sample of plain numbers, read without pandas, are named and typed as
    pandas reads them; samples pandas reads otherwise are left to it."""
    import io

    import pandas as pd

    df = pd.read_csv(io.BytesIO(sample), sep=delim, header=0 if header else None)
    for dtype in ("float32", "float64"):  # the sample is parsed to the file's dtype
        got = csv_reader._plain_columns(sample, header, delim, dtype)
        assert (got is not None) == plain
        if plain:
            assert got == ([str(c) for c in df.columns], [str(t) for t in df.dtypes])
