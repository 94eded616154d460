"""What the k-means|| init reads of the data (issue 44): in the storage tier every pass reads
every chunk from the store, so the init's cost is its passes. Each round costs one pass (the
fold of the previous round's draws), the draws come from the per-row state the shards keep,
and only the chunks that hold a drawn row are read for them; the centroids are those of the
resident tiers, bit for bit."""

from __future__ import annotations

import threading

import dask
import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from daskmeans.engine.placement import place
from daskmeans.engine.tiers import storage
from daskmeans.io import blocks
from daskmeans.io.readers import read
from daskmeans.numerics.hashing import philox_uniforms, row_uniforms
from daskmeans.seeding import kmeans_parallel, resolve_init, rows

ROWS, CHUNK, D, FILE_CHUNK = 120, 40, 3, 10  # three row chunks of 40 rows, the file's chunks of 10


@pytest.fixture(scope="module")
def threads():
    """An in-process cluster of 2 workers: the counters below see their reads."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as c:
        yield c


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """120 x 3 float32 of 4 separated blobs, stored in chunks of 10 rows."""
    path = tmp_path_factory.mktemp("initpasses") / "x.zarr"
    rng = np.random.default_rng(2)
    x = (rng.normal(scale=8, size=(4, D))[rng.integers(0, 4, ROWS)] + rng.normal(size=(ROWS, D))).astype(np.float32)
    zarr.create_array(str(path), data=x, chunks=(FILE_CHUNK, D))
    return str(path), x


def _reader_key(r):
    """What names a shard's reader of one row chunk: a file's row range by its first row, a
    derived array's chunk by its read graph's key."""
    return ("range", r.start) if isinstance(r, blocks.RowRange) else ("graph", r.key)


@pytest.fixture
def counted(monkeypatch):
    """Every row chunk read whole from the store (its reader's key: a pass reads a file's row
    range from its first row on, a derived array's chunk through its graph), the file's chunks
    read for rows read alone (their first rows), and the chunks of each read of chosen rows."""
    reads, file_chunks, chosen, lock = [], [], [], threading.Lock()
    read_chunk = storage.ChunkReader.read
    range_into, range_rows = blocks.RowRange.read_into, blocks.RowRange.read_rows
    chunk_rows = rows.chunk_rows

    def read_counted(self):
        with lock:
            reads.append(_reader_key(self))
        return read_chunk(self)

    def range_into_counted(self, start, stop, out):
        if start == 0:
            with lock:
                reads.append(_reader_key(self))
        return range_into(self, start, stop, out)

    def read_rows_counted(self, local):
        with lock:
            file_chunks.extend(sorted({(self.start + int(r)) // FILE_CHUNK * FILE_CHUNK for r in local}))
        return range_rows(self, local)

    def chunk_rows_counted(shard, picks, host=True):
        with lock:
            chosen.append(sorted(shard.chunk_ids[j] for j in picks))
        return chunk_rows(shard, picks, host=host)

    monkeypatch.setattr(storage.ChunkReader, "read", read_counted)
    monkeypatch.setattr(blocks.RowRange, "read_into", range_into_counted)
    monkeypatch.setattr(blocks.RowRange, "read_rows", read_rows_counted)
    monkeypatch.setattr(rows, "chunk_rows", chunk_rows_counted)
    return reads, file_chunks, chosen


def _placed(client, path, tier, derived=False):
    """The file placed in ``tier`` in row chunks of 40 rows; ``derived``: an array made from
    the reader's (float64), whose rows a reader cannot read alone."""
    X = read(path, chunk_bytes=CHUNK * D * 4)
    assert X.chunks[0] == (CHUNK,) * 3
    return place(client, X.astype(np.float64) if derived else X, "numpy", tier=tier, balance=False)


def _chunks_read(client, placement, reads):
    """The global chunk index of each read (a reader's key names its chunk's task)."""
    shards = client.gather(placement.shards)
    chunk_of = {_reader_key(r): cid for s in shards for r, cid in zip(s.readers, s.chunk_ids)}
    return sorted(chunk_of[key] for key in reads)


def test_storage_init_reads_a_pass_per_round_and_the_drawn_rows(threads, tiny, counted):
    """Two rounds, K = 2 (l = 1 row a round): two passes (each row chunk read twice), plus the
    file's chunks that hold the rows drawn: the first round's (the seed's row and the uniform
    draws, found here by hand) and the second's. The init before this read 15 row chunks: a
    pass for the seed's row, a pass per round's draws and one per fold."""
    path, _ = tiny
    reads, file_chunks, _ = counted
    p = _placed(threads, path, "storage")
    with dask.config.set({"daskmeans.init.rounds": 2}):
        del reads[:], file_chunks[:]
        got = resolve_init(threads, p, "k-means||", 2, 3)
        ref = resolve_init(threads, _placed(threads, path, "host"), "k-means||", 2, 3)
    np.testing.assert_array_equal(got, ref)
    # The first round by hand: the seed's row and the rows whose uniform draw is below l / n.
    seed = int(np.random.SeedSequence(3).generate_state(1)[0])
    row0 = int(np.random.default_rng([seed, 0]).integers(0, ROWS, size=1)[0])
    first = {row0, *np.flatnonzero(row_uniforms(seed, 0, 0, ROWS) < 1 / ROWS).tolist()}
    first_files = sorted({r // FILE_CHUNK * FILE_CHUNK for r in first})
    # The seed's row 96 and the draws of rows 57 and 95: two of the file's chunks (one for 95 and 96).
    assert (row0, sorted(first), first_files) == (96, [57, 95, 96], [50, 90])
    # The first round's reads come first (the second round's draws wait for its fold).
    assert sorted(file_chunks[:len(first_files)]) == first_files
    assert len(file_chunks) - len(first_files) <= 2  # the second round draws about one row (l = 1)
    assert _chunks_read(threads, p, reads) == [0, 0, 1, 1, 2, 2]  # two passes and no other whole chunk


def test_storage_init_reads_rounds_passes_at_the_default(threads, tiny, counted):
    """Rows of an array derived from the reader's (whose rows a reader cannot read alone): the
    default rounds at K = 4 read at most a pass's worth a round (every chunk once a round; a
    round that drew no row has nothing to fold and reads nothing) plus one read of each chunk
    per round that drew a row in it, at most (rounds + 1) passes' worth in all here; the host
    tier's centroids."""
    path, _ = tiny
    reads, file_chunks, chosen = counted
    p = _placed(threads, path, "storage", derived=True)
    del reads[:], chosen[:]
    got = resolve_init(threads, p, "k-means||", 4, 11)
    assert not file_chunks  # the derived array's rows are read with their whole chunks
    drawn = [c for call in chosen for c in call]
    passes = (len(reads) - len(drawn)) // 3
    rounds = int(dask.config.get("daskmeans.init.rounds"))
    assert 1 <= passes <= rounds
    assert _chunks_read(threads, p, reads) == sorted([0, 1, 2] * passes + drawn)
    assert len(reads) <= (rounds + 1) * 3 + len(drawn)
    np.testing.assert_array_equal(got, resolve_init(threads, _placed(threads, path, "host", derived=True),
                                                    "k-means||", 4, 11))


def test_resident_init_draws_without_a_pass(threads, tiny, monkeypatch):
    """In the host tier the draws index the resident blocks: a shard's blocks are streamed
    only by the folds, one pass for each round that drew a row (here 3 of the 5: the rounds
    of the seed's row alone, of 3 rows, and of 1 row), on each shard."""
    from daskmeans.engine.tiers import host

    path, _ = tiny
    passes, stream, picks, drawn = [], host.HostTier.stream, kmeans_parallel._picks, {}

    def counted_stream(self, shard):
        passes.append(shard.chunk_ids)
        return stream(self, shard)

    def counted_picks(shard, state, phi, ell, seed, rnd):
        got = picks(shard, state, phi, ell, seed, rnd)
        drawn[rnd] = drawn.get(rnd, 0) + sum(map(len, got.values()))
        return got

    monkeypatch.setattr(host.HostTier, "stream", counted_stream)
    monkeypatch.setattr(kmeans_parallel, "_picks", counted_picks)  # looked up by the task, in this process
    p = _placed(threads, path, "host")
    passes.clear()
    with dask.config.set({"daskmeans.init.rounds": 5}):  # five rounds of 0.5 K, as counted here
        resolve_init(threads, p, "k-means||", 4, 11, 0.5)
    assert drawn == {0: 0, 1: 0, 2: 3, 3: 1, 4: 0}  # and the first round's row drawn by the seed
    assert sorted(passes) == sorted(p.chunk_ids * 3)


def test_device_draws_are_the_hosts():
    """The per-row uniforms computed with an array module's integer arithmetic (how a GPU
    draws them, next to the rows' state) are NumPy's Philox draws bit for bit: any seed,
    stream, first row and count, across Philox's four-draw blocks and at large row indices."""
    for seed, stream, start, n in [(0, 0, 0, 10), (2**32 - 1, 5, 7, 1001), (2**64 - 1, 2**64 - 1, 2**40 + 3, 17),
                                   (12345, 1, 3, 0), (1, 2, 1, 1), (7, 4, 2, 2)]:
        a = row_uniforms(seed, stream, start, n)
        b = philox_uniforms(np, seed, stream, start, n)
        assert a.dtype == b.dtype == np.float64 and a.shape == b.shape == (n,)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rows", [0, 5, 30, 2**23])
def test_device_draws_come_in_pieces_of_consecutive_chunks(monkeypatch, rows):
    """On a device a shard's consecutive chunks share calls of up to ``DEVICE_DRAW_ROWS`` rows
    (each call's fixed cost is its kernel launches): every chunk gets its own rows' draws,
    whatever the pieces (chunks 0-55 consecutive, then 60-101 after a gap)."""
    import types

    monkeypatch.setattr(kmeans_parallel, "DEVICE_DRAW_ROWS", rows)
    calls = []

    def counted(xp, seed, stream, start, n):
        calls.append((start, n))
        return philox_uniforms(np, seed, stream, start, n)

    monkeypatch.setattr("daskmeans.numerics.hashing.philox_uniforms", counted)
    xp = types.SimpleNamespace(uint64=np.uint64)  # not NumPy: a device's module, drawing through NumPy here
    shard = types.SimpleNamespace(offsets=(0, 10, 25, 60, 61), rows=(10, 15, 30, 1, 41))
    got = list(kmeans_parallel._uniforms(shard, 5, 2, xp))
    for u, off, n in zip(got, shard.offsets, shard.rows):
        np.testing.assert_array_equal(u, row_uniforms(5, 2, off, n))
    alone = [(0, 10), (10, 15), (25, 30), (60, 1), (61, 41)]  # a chunk per call
    assert calls == {0: alone, 5: alone, 30: [(0, 25), (25, 30), (60, 1), (61, 41)], 2**23: [(0, 55), (60, 42)]}[rows]


@pytest.mark.gpu
def test_device_draws_are_the_hosts_on_a_gpu():
    """CuPy's draws (one CUDA kernel) and the array-module arithmetic run on CuPy are NumPy's."""
    import cupy

    for seed, stream, start, n in [(3, 0, 0, 100_003), (2**32 - 1, 4, 2**33 + 1, 5), (2**64 - 1, 2**64 - 1, 12345, 999),
                                   (9, 9, 2**40 + 3, 77), (1, 1, 5, 0)]:
        expect = row_uniforms(seed, stream, start, n)
        for u in (row_uniforms(seed, stream, start, n, cupy), philox_uniforms(cupy, seed, stream, start, n)):
            assert isinstance(u, cupy.ndarray) and u.dtype == cupy.float64
            np.testing.assert_array_equal(cupy.asnumpy(u), expect)


def test_the_fallback_to_kmeans_plusplus_is_taken_in_the_recluster_task(threads):
    """Fewer distinct rows than K: the rounds stop drawing once every row is at a candidate
    (phi = 0: a round draws nothing and its fold reads nothing), and the recluster's task says
    so; the init is k-means++'s, as before."""
    import dask.array as da

    x = np.repeat(np.eye(3, dtype=np.float64), 20, axis=0)
    X = read(da.from_array(x, chunks=(20, -1)))
    p = place(threads, X, "numpy")
    got = resolve_init(threads, p, "k-means||", 5, 1)
    assert got.shape == (5, 3)
    np.testing.assert_array_equal(got, kmeans_parallel.init_kmeans_plusplus(threads, p, 5, int(
        np.random.SeedSequence(1).generate_state(1)[0])))
