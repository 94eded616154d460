"""The workers' reading pipeline (:mod:`daskmeans.engine.reading`): a file's chunks read by
several threads into the blocks a shard keeps, and a storage pass's chunks in order, bitwise
the Dask array's compute for several thread counts and chunkings; placement through it."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from daskmeans.backends import get_backend
from daskmeans.engine import reading
from daskmeans.engine.placement import place
from daskmeans.engine.tiers.storage import ChunkReader
from daskmeans.io import readers
from daskmeans.io.blocks import rows_of, split_rows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("reading")
    x = np.random.default_rng(3).standard_normal((5000, 7)).astype(np.float32)
    np.save(d / "x.npy", x)
    zarr.create_array(str(d / "x.zarr"), data=x, chunks=(300, 7))
    zarr.create_array(str(d / "cols.zarr"), data=x, chunks=(256, 3))
    np.savetxt(d / "x.csv", x, delimiter=",", fmt="%.9g")  # float32 exactly; pieces of whole lines
    return d, x


def _chunks(x, rows):
    """``x`` read again in chunks of ``rows`` rows, and each chunk's RowRange."""
    y = split_rows(x, rows)
    src = rows_of(y)
    offs = np.concatenate([[0], np.cumsum(y.chunks[0])]).astype(int)
    return y, [src.chunk(int(a), int(b)) for a, b in zip(offs[:-1], offs[1:])]


@pytest.mark.parametrize("name", ["x.npy", "x.zarr", "cols.zarr", "x.csv"])
@pytest.mark.parametrize("rows, threads", [(5000, 1), (900, 2), (1200, 3), (600, 8)])
@pytest.mark.parametrize("on_host", [True, False])
def test_read_blocks_is_the_arrays_compute(files, name, rows, threads, on_host, monkeypatch):
    d, x = files
    # Small pieces: several per chunk, so that the threads share each chunk.
    monkeypatch.setattr("daskmeans.io.fill.PIECE_BYTES", 4096)
    monkeypatch.setattr("daskmeans.io.csv_reader._PIECE_BYTES", 20_000)  # a CSV's own pieces, of whole lines
    y, sources = _chunks(readers.read(str(d / name)), rows)
    be = get_backend("numpy")
    blocks = reading.read_blocks(be, on_host, sources, 7, np.float32, threads)
    assert [b.shape for b in blocks] == [(c, 7) for c in y.chunks[0]]
    assert all(b.flags.c_contiguous and b.flags.aligned for b in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks), y.compute())
    np.testing.assert_array_equal(np.concatenate(blocks), x)


def test_read_blocks_converts_to_the_fits_dtype(files):
    d, x = files
    y, sources = _chunks(readers.read(str(d / "x.zarr"), dtype="float64"), 1000)
    blocks = reading.read_blocks(get_backend("numpy"), True, sources, 7, np.float64, 2)
    assert blocks[0].dtype == np.float64
    np.testing.assert_array_equal(np.concatenate(blocks), x.astype(np.float64))


@pytest.mark.parametrize("ahead, threads", [(0, 1), (2, 2), (3, 4)])
def test_stream_chunks_in_order_checked_with_buffers_kept(files, ahead, threads):
    d, x = files
    y, sources = _chunks(readers.read(str(d / "x.zarr")), 600)
    ring: list = []
    seen = []
    for _ in range(2):  # two passes: the second reuses the first's buffers
        got, checked = [], []
        for j, b in enumerate(reading.stream_chunks(get_backend("numpy"), sources, 7, np.float32, threads, ahead,
                                                    lambda j, b: checked.append((j, b.sum())), ring)):
            got.append(b.copy())
        seen.append([id(b) for b in ring])
        np.testing.assert_array_equal(np.concatenate(got), x)
        assert sorted(j for j, _ in checked) == list(range(len(sources)))
        assert [s for _, s in sorted(checked)] == [g.sum() for g in got]
    assert len(ring) == ahead + 1 and seen[0] == seen[1]


def test_stream_chunks_lock_each_ring_buffer_once_filled_and_unlock_it_when_freed(files):
    """The storage tier's ring: ordinary memory, each buffer page-locked in place once, after
    its first chunk is read into it and before the chunk is handed over (what a GPU copies from
    it is page-locked), never again in later passes, and unlocked when the ring is freed."""
    import gc

    d, x = files
    _, sources = _chunks(readers.read(str(d / "x.zarr")), 600)
    be = _Locks()
    ring: list = []
    for _ in range(2):
        for j, b in enumerate(reading.stream_chunks(be, sources, 7, np.float32, 2, 2, lambda j, b: None, ring)):
            # Handed over once its buffer is locked, with the buffer's first chunk in it then.
            assert any(p == ring[j % 3][0].ctypes.data for p, _ in be.locked)
            np.testing.assert_array_equal(b, x[600 * j:600 * (j + 1)])
    ptrs = sorted(b.ctypes.data for b, _ in ring)
    assert sorted(p for p, _ in be.locked) == ptrs  # each buffer once, in both passes
    firsts = {p: a[:600] for p, a in be.locked}
    np.testing.assert_array_equal(np.concatenate([firsts[b.ctypes.data] for b, _ in ring]), x[:1800])
    assert be.unlocked == []
    del b  # a view keeps its buffer locked
    ring.clear()
    gc.collect()
    assert sorted(be.unlocked) == ptrs


def test_stream_chunks_of_culled_graphs(files):
    """The fallback for an array derived from a file: each chunk its culled read graph, read
    in one piece."""
    d, x = files
    y = readers.read(str(d / "x.zarr")) * 2
    sources = [ChunkReader(y.blocks[i]) for i in range(y.numblocks[0])]
    got = [b.copy() for b in reading.stream_chunks(get_backend("numpy"), sources, 7, np.float32, 2, 1,
                                                   lambda j, b: None, [])]
    np.testing.assert_array_equal(np.concatenate(got), x * 2)


def test_read_threads():
    from daskmeans.io.ranges import cores

    assert reading.read_threads("auto", 1) == cores()
    assert reading.read_threads("auto", 10**6) == 1
    assert reading.read_threads(None, 2) == max(1, cores() // 2)
    assert reading.read_threads(5, 3) == 5
    with pytest.raises(ValueError, match=r"daskmeans.read-threads=0 should be 'auto' or a count of threads of at "
                                         r"least 1"):
        reading.read_threads(0, 1)
    assert reading.host_peers(["tcp://10.0.0.1:1", "tcp://10.0.0.1:2", "tcp://10.0.0.2:1"]) == {
        "tcp://10.0.0.1:1": 2, "tcp://10.0.0.1:2": 2, "tcp://10.0.0.2:1": 1}


def _blocks_of(shard):
    return [np.asarray(b).copy() for b in shard.blocks], shard.read_threads, shard.readers


@pytest.mark.parametrize("tier", ["host", "device"])  # the device tier of the NumPy backend: host memory
def test_placement_of_a_file_reads_it_on_the_workers(client, files, tier):
    """The shards' blocks are the file's rows, in the chunks of the Dask array, with nothing
    persisted of them (the shards read the file), on the reading threads set."""
    import dask

    d, x = files
    X = split_rows(readers.read(str(d / "x.zarr")), 900)
    with dask.config.set({"daskmeans.read-threads": 2}):
        p = place(client, X, "numpy", tier=tier, balance=False, source=str(d / "x.zarr"))
    got = client.gather([client.submit(_blocks_of, s, pure=False) for s in p.shards])
    assert sorted(c for ids in p.chunk_ids for c in ids) == list(range(X.numblocks[0]))
    by_chunk = {}
    for ids, (blocks, threads, rdrs) in zip(p.chunk_ids, got):
        assert threads == 2 and rdrs is None
        by_chunk.update(zip(ids, blocks))
    np.testing.assert_array_equal(np.concatenate([by_chunk[i] for i in range(X.numblocks[0])]), x)
    assert not any(k.startswith("daskmeans-data") for k in client.has_what().get(p.workers[0], ()))


class _LateCopies:
    """A device backend whose copies run later, on threads of their own (as a GPU's copy
    streams do): a staging buffer refilled before its copy was waited for would show in the
    blocks."""

    on_host = False
    xp = np

    def __init__(self):
        self.copies = 0
        self.marks = []  # every copy's event
        self.locks = []  # (buffer's address, its rows as locked)
        self.unlocks = []  # (buffer's address, whether every copy was done by then)

    @staticmethod
    def empty_host(shape, dtype):
        return np.empty(shape, dtype)

    def page_lock(self, a):
        ptr = a.ctypes.data
        self.locks.append((ptr, a.copy()))
        return lambda: self.unlocks.append((ptr, all(m.is_set() for m in self.marks)))

    def copy_in(self, dst, src):
        import threading
        import time

        done = threading.Event()
        self.marks.append(done)
        self.copies += 1

        def later():
            time.sleep(0.002)
            dst[...] = src
            done.set()

        threading.Thread(target=later).start()
        return done

    @staticmethod
    def wait(mark):
        mark.wait()


@pytest.mark.parametrize("threads", [1, 3])
def test_device_blocks_wait_for_each_copy_before_refilling_its_staging_buffer(files, threads, monkeypatch):
    d, x = files
    monkeypatch.setattr("daskmeans.io.fill.PIECE_BYTES", 7 * 4 * 300)  # one Zarr chunk a piece
    y, sources = _chunks(readers.read(str(d / "x.zarr")), 1500)
    be = _LateCopies()
    blocks = reading.read_blocks(be, False, sources, 7, np.float32, threads)
    assert be.copies == 17  # 5000 rows in pieces of 300 rows, chunk by chunk of 1500
    np.testing.assert_array_equal(np.concatenate(blocks), x)
    # Each thread's staging buffer: ordinary memory locked in place once, after its first piece
    # is written into it (a piece of the data is there when it is locked), and unlocked once,
    # after every copy is done.
    assert 1 <= len(be.locks) <= threads and len({p for p, _ in be.locks}) == len(be.locks)
    rows = {x[i:i + 300].tobytes() for i in range(0, 5000, 300)}
    assert all(a[:300].tobytes() in rows or a[:200].tobytes() == x[4800:].tobytes() for _, a in be.locks)
    assert sorted(p for p, _ in be.unlocks) == sorted(p for p, _ in be.locks)
    assert all(done for _, done in be.unlocks)


class _Locks:
    """A host backend that records each block it page-locks (a copy of it, as it was then)
    and each unlock."""

    on_host = True
    xp = np

    def __init__(self):
        self.locked, self.unlocked = [], []

    def page_lock(self, a):
        ptr = a.ctypes.data
        self.locked.append((ptr, a.copy()))
        return lambda: self.unlocked.append(ptr)

    @staticmethod
    def empty_host(shape, dtype):
        return np.empty(shape, dtype)


def test_host_blocks_are_page_locked_once_filled_and_unlocked_when_freed(files):
    """The host tier's blocks: ordinary memory the threads fill, then locked in place (each
    block once, whole), unlocked only when the block is freed."""
    import gc

    d, x = files
    _, sources = _chunks(readers.read(str(d / "x.zarr")), 1500)
    be = _Locks()
    blocks = reading.read_blocks(be, True, sources, 7, np.float32, 3)
    # Each block locked once, by the thread that filled its last piece (in any order).
    assert sorted(p for p, _ in be.locked) == sorted(b.ctypes.data for b in blocks)
    at = {p: c for p, c in be.locked}
    np.testing.assert_array_equal(np.concatenate([at[b.ctypes.data] for b in blocks]), x)  # filled before locked
    assert be.unlocked == []
    view = blocks[0][:10]
    ptrs = [b.ctypes.data for b in blocks]
    del blocks
    gc.collect()
    assert sorted(be.unlocked) == sorted(ptrs[1:])  # a view keeps its block locked
    del view
    gc.collect()
    assert sorted(be.unlocked) == sorted(ptrs)
