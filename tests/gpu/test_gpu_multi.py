"""The loop on several GPU workers (a LocalCUDACluster): bitwise the same centroids on 1 and
2 workers, through NCCL (two GPUs) and through Dask's comms, and for three chunkings, in fp32
and tf32. On a one-GPU
host the two workers share the GPU (Dask's comms only: NCCL needs a GPU per rank)."""

from __future__ import annotations


import dask
import dask.array as da
import numpy as np
import pytest

from daskmeans.backends import gpu_available

pytestmark = pytest.mark.gpu


def _n_gpus() -> int:
    if not gpu_available():
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def _cluster(devices):
    from dask_cuda import LocalCUDACluster
    from distributed import LocalCluster

    if devices == "0,0":  # two worker processes on one GPU (dask-cuda allows one per device)
        return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, dashboard_address=":0")


def _fit(devices, X, init, precision, collective):
    from distributed import Client

    from daskmeans import KMeans

    with _cluster(devices) as lc, Client(lc) as c:
        with dask.config.set({"daskmeans.collective": collective, "daskmeans.segment-seconds": 0.2}):
            km = KMeans(len(init), init=init, tol=0, max_iter=15, precision=precision, client=c).fit(X)
        return km, c.compute(km.labels_).result()


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_one_and_two_gpu_workers_and_any_chunking_give_the_same_bits(precision):
    rng = np.random.default_rng(11)
    X = rng.standard_normal((60_000, 96)).astype(np.float32)
    init = X[:700].astype(np.float64)
    Xd = da.from_array(X, chunks=(60_000 // 16, -1))
    ref, ref_labels = _fit("0", Xd, init, precision, "auto")
    assert ref.n_iter_ == 15
    runs = [("0", da.from_array(X, chunks=(60_000, -1)), "auto"), ("0", da.from_array(X, chunks=((7, 33_000, 26_993), -1)), "auto")]
    two = [("0,1", "nccl"), ("0,1", "dask")] if _n_gpus() >= 2 else [("0,0", "dask")]
    runs += [(devices, Xd, kind) for devices, kind in two] + [(two[0][0], runs[0][1], two[0][1])]
    for devices, Xr, kind in runs:
        km, labels = _fit(devices, Xr, init, precision, kind)
        np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
        np.testing.assert_array_equal(labels, ref_labels)
        # The GPU kernels add a chunk's inertia with float atomics: its last bits vary from
        # run to run (the sums behind the centroids are exact integers).
        assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)


@pytest.mark.skipif(_n_gpus() < 2, reason="needs 2 GPUs or more")
def test_wide_k_on_every_gpu_gives_the_bits_of_one_gpu():
    """The IVF shape (K = 2^17 of short rows, tf32: the scaled float16 GEMM, the warp-per-row
    selection) from a fixed init on every GPU of the host gives the centroids and labels of
    one GPU, bit for bit."""
    rng = np.random.default_rng(17)
    k, d = 1 << 17, 64
    X = rng.standard_normal((3 * k, d)).astype(np.float32)
    init = X[:k].astype(np.float64)
    Xd = da.from_array(X, chunks=(len(X) // 12, -1))
    ref, ref_labels = _fit("0", Xd, init, "tf32", "auto")
    every = ",".join(map(str, range(_n_gpus())))
    km, labels = _fit(every, Xd, init, "tf32", "auto")
    # About three rows per cluster: the fit may converge before max_iter; both runs alike.
    assert km.n_iter_ == ref.n_iter_ >= 2
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(labels, ref_labels)


@pytest.mark.skipif(_n_gpus() < 2, reason="needs 2 GPUs")
def test_nccl_is_chosen_between_gpu_workers():
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from daskmeans.engine.collective import choose_collective
    from daskmeans.io.readers import read
    from daskmeans.engine.placement import place

    with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,1", dashboard_address=":0") as lc, Client(lc) as c:
        p = place(c, read(np.ones((40_000, 8), np.float32)), "cupy")
        assert len(set(p.workers)) == 2
        assert choose_collective(c, p, "auto") == "nccl"
        assert choose_collective(c, p, "dask") == "dask"


def _cupy_allreduce(rank, spec, n, calls=1):
    """``calls`` all-reduces of this rank's buffers (CuPy arrays, different each call, the
    next one queued before the last one's sum is read): the sums on the host, whether they
    went through shared memory, whether every segment was page-locked, and whether the host
    sum of the comms' path is (None where that path was not taken)."""
    import cupy
    from distributed import get_worker

    from daskmeans.engine import collective as coll

    c = coll.open_collective(spec, rank, get_worker())
    outs = []
    for call in range(calls):
        buf = cupy.asarray(np.random.default_rng([rank, n, call]).integers(-(2**60), 2**60, n, dtype=np.int64))
        out = c.allreduce(buf)
        assert isinstance(out, cupy.ndarray)
        outs.append(out)
    locked = bool(c._shm) and all(
        cupy.cuda.runtime.pointerGetAttributes(seg.array.ctypes.data).type == cupy.cuda.runtime.memoryTypeHost
        for seg in c._shm[1] + [s for ss in c._shm[2].values() for s in ss])
    host_sum = None if c._sum is None else (
        cupy.cuda.runtime.pointerGetAttributes(c._sum.ctypes.data).type == cupy.cuda.runtime.memoryTypeHost)
    return [cupy.asnumpy(o) for o in outs], bool(c._shm), locked, host_sum


def test_dask_collective_sums_cupy_buffers_through_shared_memory_and_the_comms():
    """Two worker processes on one host: 2 MB CuPy buffers go through shared memory (where
    /dev/shm has room), page-locked and summed on the device, five calls in a row (each
    segment written again while the peers' copies of the last call may be queued);
    1,000 values go through the comms, their sum in page-locked host memory on its way back
    to the device; every sum is exact."""
    from distributed import Client

    from daskmeans.engine import collective as coll
    from daskmeans.engine import shm

    calls = 5
    with _cluster("0,0") as lc, Client(lc) as c:
        c.run(coll.install_mailbox)
        ws = sorted(c.nthreads())
        for n in (1000, 2**18):
            spec = coll.CollectiveSpec(f"t-gpu-{n}", 0, tuple(ws), "dask", timeout=60)
            outs = c.gather([c.submit(_cupy_allreduce, r, spec, n, calls, workers=[w], pure=False)
                             for r, w in enumerate(ws)])
            c.run(coll.release, spec.fit_id)
            for sums, shared, locked, host_sum in outs:
                for call, out in enumerate(sums):
                    want = sum(np.random.default_rng([r, n, call]).integers(-(2**60), 2**60, n, dtype=np.int64)
                               for r in range(2))
                    np.testing.assert_array_equal(out, want)
                assert shared == (n == 2**18 and shm.room_for(2 * 8 * n))
                assert locked == shared
                assert host_sum is (None if shared else True)


def _nccl_queued(rank, spec, n):
    """An NCCL all-reduce queued without waiting, work queued behind it, then the wait: the
    sum, doubled on the device."""
    import cupy
    from distributed import get_worker

    from daskmeans.engine import collective as coll

    c = coll.open_collective(spec, rank, get_worker())
    buf = cupy.asarray(np.random.default_rng([rank, n]).integers(-(2**40), 2**40, n, dtype=np.int64))
    out = c.allreduce(buf, wait=False)
    twice = out * 2  # queued behind the all-reduce on the same stream
    c.wait()
    c.wait()  # nothing pending: returns at once
    return cupy.asnumpy(twice)


@pytest.mark.skipif(_n_gpus() < 2, reason="needs 2 GPUs")
def test_nccl_allreduce_queued_then_waited():
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from daskmeans.engine import collective as coll

    n = 1 << 20
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,1", dashboard_address=":0") as lc, Client(lc) as c:
        c.run(coll.install_mailbox)
        ws = sorted(c.nthreads())
        nccl_id = c.submit(coll.nccl_unique_id, workers=[ws[0]], pure=False).result()
        spec = coll.CollectiveSpec("t-nccl-queued", 0, tuple(ws), "nccl", nccl_id, timeout=60)
        outs = c.gather([c.submit(_nccl_queued, r, spec, n, workers=[w], pure=False) for r, w in enumerate(ws)])
        c.run(coll.release, spec.fit_id)
    want = 2 * sum(np.random.default_rng([r, n]).integers(-(2**40), 2**40, n, dtype=np.int64) for r in range(2))
    for out in outs:
        np.testing.assert_array_equal(out, want)


@pytest.mark.skipif(_n_gpus() < 2, reason="needs 2 GPUs")
def test_in_process_workers_one_per_gpu_give_the_bits_of_worker_processes():
    """``local-cluster: threads`` on a host of several GPUs: a worker per GPU in this process
    (``engine/devices.py``), each placing, reading and computing on its own GPU (a block made on
    another worker's GPU is copied), summing through the in-process collective (NCCL needs a
    process per rank), or the Dask collective where asked. The centroids, labels and inertia are those of a worker process per GPU."""
    from daskmeans import KMeans
    from daskmeans.dask_cluster import connect
    from daskmeans.engine.collective import choose_collective
    from daskmeans.engine.placement import place
    from daskmeans.io.readers import read

    rng = np.random.default_rng(5)
    X = rng.standard_normal((40_000, 64)).astype(np.float32)
    init = X[:300].astype(np.float64)
    Xd = da.from_array(X, chunks=(40_000 // 8, -1))
    ref, ref_labels = _fit("0,1", Xd, init, "tf32", "auto")
    with dask.config.set({"daskmeans.local-cluster": "threads"}), connect(backend="gpu") as c:
        info = c.scheduler_info()["workers"]
        assert len(info) == _n_gpus() and all(a.startswith("inproc://") for a in info)
        p = place(c, read(X), "cupy")
        assert len(set(p.workers)) == _n_gpus()
        assert choose_collective(c, p, "auto") == "process" and choose_collective(c, p, "dask") == "dask"

        def devices(shard):
            import cupy

            return cupy.cuda.Device().id, sorted({b.device.id for b in shard.blocks})

        ids = [c.submit(devices, s, workers=[w], pure=False).result() for s, w in zip(p.shards, p.workers)]
        assert sorted(ids) == [(i, [i]) for i in range(_n_gpus())]
        del p
        for data, kind in ((Xd, "auto"), (X, "auto"), (X, "dask")):
            with dask.config.set({"daskmeans.segment-seconds": 0.2, "daskmeans.collective": kind}):
                km = KMeans(len(init), init=init, tol=0, max_iter=15, precision="tf32", client=c).fit(data)
            labels = np.asarray(km.labels_ if isinstance(data, np.ndarray) else c.compute(km.labels_).result())
            np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
            np.testing.assert_array_equal(labels, ref_labels)
            assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)


@pytest.mark.skipif(_n_gpus() < 2, reason="needs 2 GPUs")
def test_the_command_on_in_process_gpus_writes_the_model_of_worker_processes(tmp_path):
    """``daskmeans fit`` with ``local-cluster: threads`` on every GPU of the host (no worker
    process) writes the model that a worker process per GPU writes, k-means|| init included."""
    import os
    import subprocess
    import sys

    from daskmeans.io.model_store import load_model

    rng = np.random.default_rng(8)
    path = tmp_path / "x.npy"
    np.save(path, rng.standard_normal((60_000, 32)).astype(np.float32))
    models = {}
    for how in ("processes", "threads"):
        out = tmp_path / f"{how}.zarr"
        env = {**os.environ, "DASK_DASKMEANS__LOCAL_CLUSTER": how}
        r = subprocess.run([sys.executable, "-m", "daskmeans", "fit", str(path), "--k", "64", "--max-iter", "10",
                            "--seed", "3", "--output", str(out)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        models[how] = load_model(str(out))[0]
    np.testing.assert_array_equal(models["threads"], models["processes"])


@pytest.mark.skipif(_n_gpus() < 2, reason="needs 2 GPUs")
def test_in_process_workers_take_cupy_chunks_of_one_gpu_and_sum_large_buffers():
    """A notebook's CuPy chunks, all made on GPU 0, fitted, predicted and scored on in-process
    workers of every GPU: each worker's shard holds its blocks on its own GPU (copied, not read
    across the link each pass), and the centroid sums (K x D x 8 bytes over 1 MiB, beyond the
    comms' small-message path) are summed between the ranks of one process. Centroids, labels,
    predictions and score are those of a worker process per GPU."""
    import cupy

    from daskmeans import KMeans
    from daskmeans.dask_cluster import connect
    from daskmeans.engine.placement import place

    rng = np.random.default_rng(21)
    X = rng.standard_normal((30_000, 160)).astype(np.float32)
    init = X[:1024].astype(np.float64)
    assert init.nbytes > 1 << 20
    ref, ref_labels = _fit("0,1", da.from_array(X, chunks=(3000, -1)), init, "fp32", "auto")
    with cupy.cuda.Device(0):
        Xg = da.from_array(cupy.asarray(X), chunks=(3000, -1), asarray=False)
    with dask.config.set({"daskmeans.local-cluster": "threads"}), connect(backend="gpu") as c:
        p = place(c, Xg, "cupy")

        def devices(shard):
            return cupy.cuda.Device().id, sorted({b.device.id for b in shard.blocks})

        ids = [c.submit(devices, s, workers=[w], pure=False).result() for s, w in zip(p.shards, p.workers)]
        assert sorted(ids) == [(i, [i]) for i in range(_n_gpus())]
        del p
        with dask.config.set({"daskmeans.segment-seconds": 0.2}):
            km = KMeans(len(init), init=init, tol=0, max_iter=15, client=c).fit(Xg)
        np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
        np.testing.assert_array_equal(cupy.asnumpy(c.compute(km.labels_).result()), ref_labels)
        np.testing.assert_array_equal(cupy.asnumpy(c.compute(km.predict(Xg)).result()), ref_labels)
        assert km.score(Xg) == pytest.approx(-ref.inertia_, rel=1e-6)
