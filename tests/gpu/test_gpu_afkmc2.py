"""AFK-MC²'s chains on a GPU worker (``seeding/afkmc2_chains.py``, ``backends/cuda/afkmc2.cu``):
the GPU's picks are the CPU's where rounding cannot decide (rows of small integers: every
distance exact, fused multiply-adds or not) for every block size, and on a well-separated
case; the init's centroids bitwise the same on one and two GPU workers and any chunking."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from afkchains import random_chains

from daskmeans.seeding.afkmc2_chains import chain_block, run_chains

pytestmark = pytest.mark.gpu


def test_toy_chains_by_hand_on_the_gpu():
    """tests/unit/test_afkmc2.py's three chains of four proposals (the picks worked out there):
    in one CTA (block 3), split over blocks, and folded by the GEMM alone (block 1)."""
    import cupy

    X = np.array([[0.0], [1.0], [3.0], [6.0], [10.0]])
    q = np.array([0.1, 0.2, 0.3, 0.2, 0.2])
    chains = np.array([[1, 2, 0, 4], [3, 4, 2, 1], [4, 2, 3, 1]], np.int64)
    u = np.array([[0.5, 0.5, 0.5], [0.9, 0.1, 0.15], [0.3, 0.99, 0.99]])
    for block in (1, 2, 3):
        np.testing.assert_array_equal(run_chains(cupy.asarray(X), np.zeros(1), chains, q, u, block=block),
                                      [4, 1, 3], err_msg=str(block))


def test_the_chains_hold_no_more_on_the_device_than_their_estimate(monkeypatch):
    """The chains' device memory, counted at every allocation from a pool of their own (with a
    small fold bound, so that the rows and chains are most of it), within ``chains_bytes``,
    the figure the worker's device is checked against before anything is allocated. Also the
    same picks run twice on one device (cuBLAS on one stream: the same bits)."""
    import cupy

    from daskmeans.seeding import afkmc2_chains

    monkeypatch.setattr(afkmc2_chains, "FOLD_BYTES", 1 << 16)
    X = np.random.default_rng(3).normal(size=(20000, 64))
    k, m, block = 200, 100, 4
    Xu, c1, chains, qu, u = random_chains(X, k, m, 0)
    pool = cupy.cuda.MemoryPool()
    peak = [0]

    def counted(size):
        mem = pool.malloc(size)
        peak[0] = max(peak[0], pool.used_bytes())
        return mem

    picks = []
    for _ in range(2):
        Xd = cupy.asarray(Xu)
        with cupy.cuda.using_allocator(counted):
            picks.append(run_chains(Xd, c1, chains, qu, u, block=block))
    np.testing.assert_array_equal(picks[0], picks[1])
    need = afkmc2_chains.chains_bytes(len(Xu), X.shape[1], k - 1, m, block)
    assert Xd.nbytes + peak[0] <= need, (Xd.nbytes, peak[0], need)


@pytest.mark.parametrize("m, d", [(1, 40), (2, 40), (32, 40), (33, 40), (50, 40), (200, 40), (33, 32), (50, 1),
                                  (50, 512), (50, 600)])
def test_gpu_chains_give_the_cpu_picks_on_integer_rows(m, d):
    """Small integers: every distance exact on both devices, so the picks are equal for every
    block size, across the warp's 32-proposal windows (m = 32, 33, 50, 200), the chain of one
    proposal, and the in-block distances from registers (d <= 512: 1, 32, 40 with a partial
    column of lanes, 512 the most) and from global memory (d = 600)."""
    import cupy

    from daskmeans.backends.cuda_src import afkmc2_dch

    assert (afkmc2_dch(d) == 0) == (d > 512)
    rng = np.random.default_rng(4)
    X = rng.integers(-20, 20, (3000, d)).astype(np.float64)
    Xu, c1, chains, qu, u = random_chains(X, 150, m, 8)
    cpu = run_chains(Xu, c1, chains, qu, u)
    for block in (1, 7, 64, chain_block(True, len(Xu), d, m)):
        gpu = run_chains(cupy.asarray(Xu), c1, chains, qu, cupy.asarray(u), block=block)
        np.testing.assert_array_equal(gpu, cpu, err_msg=str(block))


def test_gpu_chains_give_the_cpu_picks_on_separated_blobs():
    """Well-separated blobs (float rows: the GPU's fused sums round differently, by far less
    than any gap a decision turns on here)."""
    import cupy

    rng = np.random.default_rng(5)
    centres = rng.standard_normal((30, 24)) * 50
    X = centres[rng.integers(0, 30, 6000)] + rng.standard_normal((6000, 24))
    Xu, c1, chains, qu, u = random_chains(X, 80, 100, 1)
    cpu = run_chains(Xu, c1, chains, qu, u)
    np.testing.assert_array_equal(run_chains(cupy.asarray(Xu), c1, chains, qu, u), cpu)


def _cluster(devices):
    from dask_cuda import LocalCUDACluster
    from distributed import LocalCluster

    if devices == "0,0":  # two worker processes on one GPU (dask-cuda allows one per device)
        return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, dashboard_address=":0")


def _init(devices, X, chunks):
    from distributed import Client

    from daskmeans.engine.placement import place
    from daskmeans.io.readers import read
    from daskmeans.seeding.afkmc2 import init_afkmc2

    with _cluster(devices) as lc, Client(lc) as c:
        p = place(c, read(da.from_array(X, chunks=chunks)), "cupy", balance=False)
        return init_afkmc2(c, p, 300, 7, chain_length=100)


def test_one_and_two_gpu_workers_and_any_chunking_give_the_same_centroids():
    """The chains run on the first shard's worker whatever the placement: the same bits for
    one worker (one chunk, uneven chunks) and two (its own rows on its GPU, the other's sent)."""
    import cupy

    rng = np.random.default_rng(11)
    X = rng.standard_normal((40_000, 64)).astype(np.float32)
    two = "0,1" if cupy.cuda.runtime.getDeviceCount() >= 2 else "0,0"
    ref = _init("0", X, (40_000, -1))
    assert ref.shape == (300, 64) and len(np.unique(ref, axis=0)) == 300
    for devices, chunks in (("0", ((7, 25_000, 14_993), -1)), (two, (2_500, -1)), (two, (40_000, -1))):
        np.testing.assert_array_equal(_init(devices, X, chunks), ref, err_msg=f"{devices} {chunks}")
