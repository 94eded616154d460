"""The fit's chunk size is the engine's plan's (engine/plan.py), not the command's: on GPU
workers a file daskmeans read is read again in chunks of ``daskmeans.gpu-chunk-bytes``,
within an eighth of the workers' measured device budget; a caller's own chunks and CPU
workers' are left as they are (the plan reads budgets given to it: no cluster, no GPU)."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from daskmeans.engine.plan import plan
from daskmeans.io.readers import read

ROWS, D = 200_000, 8  # float32: 32 bytes a row


def budgets(device: int | None, workers: int = 2) -> dict:
    """Budgets as engine.plan.worker_budgets measures them, for ``workers`` workers."""
    return {f"tcp://w{i}": {"host": 2**34, "device": device, "flops": 1e12, "sm_count": 132} for i in range(workers)}


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    path = tmp_path_factory.mktemp("chunks") / "x.npy"
    np.save(path, np.random.default_rng(0).standard_normal((ROWS, D)).astype(np.float32))
    return str(path)


def test_gpu_workers_read_daskmeans_own_chunks_at_the_gpu_chunk_size(npy):
    X = read(npy, chunk_bytes="200KiB")  # 6400 rows a chunk
    assert X.numblocks[0] == 32
    with dask.config.set({"daskmeans.gpu-chunk-bytes": "2MiB"}):
        tiers = plan(None, X, "cupy", 4, budgets=budgets(2**33), own_chunks=True)
    assert tiers.chunk_rows == 2**21 // (D * 4)


def test_the_gpu_chunk_stays_within_an_eighth_of_the_device_budget(npy):
    X = read(npy, chunk_bytes="200KiB")
    with dask.config.set({"daskmeans.gpu-chunk-bytes": "2MiB"}):
        small = budgets(2**33)
        small["tcp://w1"]["device"] = 8 * 2**20  # the smallest budget of the workers decides
        tiers = plan(None, X, "cupy", 4, budgets=small, own_chunks=True)
    assert tiers.chunk_rows == 8 * 2**20 // 8 // (D * 4)


@pytest.mark.parametrize("backend, own", [("cupy", False), ("numpy", True)], ids=["callers-chunks", "cpu-workers"])
def test_a_caller_s_chunks_and_cpu_workers_chunks_are_kept(npy, backend, own):
    X = read(npy, chunk_bytes="200KiB")
    device = 2**33 if backend == "cupy" else None
    with dask.config.set({"daskmeans.gpu-chunk-bytes": "2MiB"}):
        assert plan(None, X, backend, 4, budgets=budgets(device), own_chunks=own).chunk_rows is None


def test_chunks_read_near_the_gpu_chunk_size_are_kept(npy):
    """The command's --chunk-bytes is also the fit's gpu-chunk-bytes: the file's chunks stay."""
    X = read(npy, chunk_bytes="1MiB")
    with dask.config.set({"daskmeans.gpu-chunk-bytes": "1MiB"}):
        assert plan(None, X, "cupy", 4, budgets=budgets(2**33), own_chunks=True).chunk_rows is None
