"""Rows read into a caller's buffer (the readers' ``into``) and the reading pipeline's threads
(:mod:`daskmeans.io.fill`): hand-computed rows of a tiny ``.npy`` and Zarr store, then the
pipeline against the Dask array's compute, bitwise, for several thread counts and chunkings."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zarr

from daskmeans.errors import DataError
from daskmeans.io import fill, readers
from daskmeans.io.blocks import RowRange, rows_of
from daskmeans.io.npy_reader import npy_into
from daskmeans.io.zarr_reader import zarr_into

# 7 rows x 3 columns, each value 10 * row + column: any misplaced row or column shows.
HAND = np.array([[10 * r + c for c in range(3)] for r in range(7)], dtype=np.float32)


@pytest.fixture
def tiny(tmp_path):
    np.save(tmp_path / "x.npy", HAND)
    zarr.create_array(str(tmp_path / "x.zarr"), data=HAND, chunks=(2, 3), compressors=zarr.codecs.ZstdCodec())
    zarr.create_array(str(tmp_path / "cols.zarr"), data=HAND, chunks=(3, 2))  # chunks cut the columns
    return tmp_path


def test_npy_rows_into_a_buffer(tiny):
    out = np.full((3, 3), -1, np.float32)
    npy_into(str(tiny / "x.npy"), 2, 5, out)
    np.testing.assert_array_equal(out, [[20, 21, 22], [30, 31, 32], [40, 41, 42]])


@pytest.mark.parametrize("store", ["x.zarr", "cols.zarr"])
def test_zarr_rows_into_a_buffer(tiny, store):
    out = np.full((4, 3), -1, np.float32)
    got = zarr_into(str(tiny / store), "", 3, 7, out)
    assert got is out
    np.testing.assert_array_equal(out, [[30, 31, 32], [40, 41, 42], [50, 51, 52], [60, 61, 62]])


def test_rows_into_a_view_of_a_larger_buffer(tiny):
    """The pipeline reads a piece into rows of a block: a C-contiguous row slice."""
    block = np.full((7, 3), -1, np.float32)
    zarr_into(str(tiny / "x.zarr"), "", 0, 4, block[:4])
    npy_into(str(tiny / "x.npy"), 4, 7, block[4:])
    np.testing.assert_array_equal(block, HAND)


def test_a_buffer_of_the_wrong_shape_or_layout_is_refused(tiny):
    with pytest.raises(ValueError, match=r"rows 0:3 of .* go into a C-contiguous float32 array of shape \(3, 3\), "
                                         r"got float32 \(2, 3\)"):
        npy_into(str(tiny / "x.npy"), 0, 3, np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"go into a C-contiguous float32 array of shape \(3, 3\)"):
        zarr_into(str(tiny / "x.zarr"), "", 0, 3, np.empty((3, 3), np.float32, order="F")[:, :])
    with pytest.raises(ValueError, match=r"go into a C-contiguous float32 array of shape \(3, 3\)"):
        zarr_into(str(tiny / "x.zarr"), "", 0, 3, np.empty((3, 3), np.float64))


def test_a_missing_zarr_chunk_is_an_error_when_read_into_a_buffer(tiny):
    (tiny / "x.zarr" / "c" / "1" / "0").unlink()
    with pytest.raises(DataError, match=r"Zarr chunk c/1/0 of .* is missing \(rows 2 to 3\)"):
        zarr_into(str(tiny / "x.zarr"), "", 0, 4, np.empty((4, 3), np.float32))


def test_the_reader_array_says_how_its_rows_are_read_into_a_buffer(tiny):
    """``read()``'s array of a file carries its RowSource, whose ranges read into buffers;
    converted where the fit's dtype is not the file's."""
    for name in ("x.npy", "x.zarr"):
        x = readers.read(str(tiny / name))
        src = rows_of(x)
        assert src is not None and src.into is not None
        r = src.chunk(1, 6)
        assert isinstance(r, RowRange) and (r.rows, r.n_features, r.dtype) == (5, 3, np.float32)
        out = np.empty((3, 3), np.float32)
        r.read_into(1, 4, out)  # rows 2:5 of the file
        np.testing.assert_array_equal(out, HAND[2:5])
        np.testing.assert_array_equal(r.read(), HAND[1:6])
        x64 = readers.read(str(tiny / name), dtype="float64")
        src64 = rows_of(x64)
        assert src64.out_dtype == np.float64 and src64.dtype == np.float32
        out64 = np.empty((7, 3), np.float64)
        src64.read_into(0, 7, out64)
        np.testing.assert_array_equal(out64, HAND.astype(np.float64))
        with pytest.raises(ValueError, match=r"rows 0:9 lie outside a chunk of 5 rows"):
            r.read_into(0, 9, np.empty((9, 3), np.float32))


class _Counting:
    """A chunk source of ``rows`` rows, value ``10 * global row + column``, recording which
    threads read it and whether a piece was read twice."""

    def __init__(self, start: int, rows: int, align: int, d: int = 3):
        self.start, self.rows, self.align, self.d = start, rows, align, d
        self.threads: set = set()
        self.read_rows: list = []
        self.lock = threading.Lock()

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        with self.lock:
            self.threads.add(threading.get_ident())
            self.read_rows.append((start, stop))
        r = np.arange(self.start + start, self.start + stop)[:, None]
        out[...] = 10 * r + np.arange(self.d)


def test_pieces_are_whole_multiples_of_the_files_chunks():
    src = _Counting(0, 1000, 64)
    ps = fill.pieces(4, src, row_bytes=12, piece_bytes=12 * 200)  # 200 rows a piece -> 192 (3 x 64)
    assert [(p.chunk, p.start, p.stop) for p in ps] == [(4, a, min(1000, a + 192)) for a in range(0, 1000, 192)]
    assert [(p.start, p.stop) for p in fill.pieces(0, _Counting(0, 10, 64), 12, 12)] == [(0, 10)]
    assert [(p.start, p.stop) for p in fill.pieces(0, _Counting(0, 0, 1), 12)] == [(0, 0)]


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_fill_reads_every_piece_once_into_the_callers_buffers(threads):
    sources = [_Counting(0, 100, 8), _Counting(100, 0, 8), _Counting(100, 37, 8), _Counting(137, 250, 1)]
    blocks = [np.full((s.rows, 3), -1, np.int64) for s in sources]
    chunks = [fill.pieces(j, s, row_bytes=24, piece_bytes=24 * 16) for j, s in enumerate(sources)]
    finished = []
    fill.fill(chunks, lambda p: sources[p.chunk].read_into(p.start, p.stop, blocks[p.chunk][p.start:p.stop]),
              threads, finished=finished.append)
    np.testing.assert_array_equal(np.concatenate(blocks), 10 * np.arange(387)[:, None] + np.arange(3))
    assert sorted(finished) == [0, 1, 2, 3]
    for s in sources:
        assert sorted(s.read_rows) == sorted(set(s.read_rows))


def test_fill_raises_a_chunks_failure_after_every_read_returned():
    def read(p):
        if p.chunk == 1:
            raise DataError("chunk 1 is damaged")

    chunks = [[fill.Piece(j, 0, 5)] for j in range(4)]
    with pytest.raises(DataError, match="chunk 1 is damaged"):
        fill.fill(chunks, read, 3)


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_ordered_gives_the_chunks_in_order_with_at_most_ahead_plus_one_held(ahead):
    n = 9
    sources = [_Counting(10 * j, 10, 2) for j in range(n)]
    chunks = [fill.pieces(j, s, row_bytes=24, piece_bytes=24 * 4) for j, s in enumerate(sources)]
    slots = [np.empty((10, 3), np.int64) for _ in range(ahead + 1)]
    started, checked, consumed = [], [], [0]

    def start(j):
        started.append(j)
        # The chunk that had this buffer before (j - ahead - 1) is done with by the caller.
        assert j - (ahead + 1) < consumed[0], (j, consumed)

    def read(p):
        sources[p.chunk].read_into(p.start, p.stop, slots[p.chunk % (ahead + 1)][p.start:p.stop])

    got = []
    for j in fill.ordered(chunks, read, 3, ahead, finished=checked.append, start=start):
        assert j in checked
        assert max(started) == min(n - 1, j + ahead)
        got.append(slots[j % (ahead + 1)].copy())
        consumed[0] = j + 1
    assert started == list(range(n))
    np.testing.assert_array_equal(np.concatenate(got), 10 * np.arange(90)[:, None] + np.arange(3))


def test_ordered_stopped_early_leaves_no_read_running():
    running = threading.Event()
    gate = threading.Event()

    def read(p):
        running.set()
        gate.wait(5)

    chunks = [[fill.Piece(j, 0, 1)] for j in range(6)]
    it = fill.ordered(chunks, read, 2, 2)
    threading.Timer(0.2, gate.set).start()
    next(it)
    it.close()  # waits for the running reads; the rest are cancelled
    assert running.is_set()
