"""GPU tests (run with ``pytest -m gpu`` on a CUDA host): the CuPy backend against a float64
NumPy reference, and the whole pipeline on a LocalCUDACluster against the CPU path."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _ref(X, C, w=None):
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    d = ((X64[:, None, :] - C64[None]) ** 2).sum(-1)
    lab = d.argmin(1)
    w = np.ones(len(X)) if w is None else w
    sums = np.zeros_like(C64)
    np.add.at(sums, lab, X64 * w[:, None])
    return lab, sums, np.bincount(lab, minlength=len(C)), float((d[np.arange(len(X)), lab] * w).sum())


@pytest.mark.parametrize("n,d,k", [(1000, 3, 1), (4099, 7, 5), (20000, 33, 300), (513, 130, 17)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cupy_assign_matches_float64_reference(n, d, k, weighted, dtype):
    import cupy

    from daskmeans.backends import get_backend

    be = get_backend("cupy")
    rng = np.random.default_rng(n + d + k)
    centers = rng.normal(0, 4, (k, d))
    X = (centers[rng.integers(0, k, n)] + rng.normal(0, 1, (n, d))).astype(dtype)
    C = X[rng.choice(n, k, replace=False)].astype(np.float64)
    w = rng.random(n) + 0.5 if weighted else None
    sums_out = cupy.full((k, d), cupy.nan)  # poison: every output must be written
    out = be.assign(cupy.asarray(X), be.prepare(C, dtype), None if w is None else cupy.asarray(w))
    sums_out[...] = out["sums"]
    assert not bool(cupy.isnan(sums_out).any())
    lab, sums, counts, inertia = _ref(X, C.astype(dtype), w)
    got = cupy.asnumpy(out["labels"])
    assert (got == lab).mean() > 0.999  # fp32 distances: only near-ties may differ
    np.testing.assert_array_equal(cupy.asnumpy(out["counts"]), np.bincount(got, minlength=k))
    assert abs(out["inertia"] - inertia) <= 1e-5 * inertia
    if (got == lab).all():
        np.testing.assert_allclose(cupy.asnumpy(out["sums"]), sums, rtol=1e-9, atol=1e-6)


def test_cupy_matches_numpy_backend_on_ties():
    import cupy

    from daskmeans.backends import get_backend

    X = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]], np.float32)
    C = np.array([[1.0, 1.0], [1.0, -1.0], [5.0, 0.0]])
    for name in ("numpy", "cupy"):
        be = get_backend(name)
        Xb = cupy.asarray(X) if name == "cupy" else X
        lab = be.to_numpy(be.assign(Xb, be.prepare(C, np.float32))["labels"])
        np.testing.assert_array_equal(lab, [0, 0, 0])  # equidistant: lowest index wins


def test_cli_fit_gpu_agrees_with_cpu(tmp_path):
    """`daskmeans fit` on a LocalCUDACluster (CuPy chunks) vs the CPU path, same data and init."""
    import zarr

    from daskmeans.cli import main

    data, init = str(tmp_path / "x.zarr"), str(tmp_path / "init.npy")
    assert main(["generate", "blobs", "--n", "400000", "--d", "24", "--centers", "40", "--std", "2.5",
                 "--chunk-rows", "50000", "-o", data]) == 0
    x = zarr.open_array(data, mode="r")
    np.save(init, x[np.random.default_rng(0).choice(x.shape[0], 40, replace=False)].astype(np.float64))
    res = {}
    for backend in ("gpu", "cpu"):
        model, labels = str(tmp_path / f"m_{backend}.zarr"), str(tmp_path / f"l_{backend}.zarr")
        argv = ["fit", data, "--k", "40", "--init", init, "--max-iter", "30", "--tol", "0",
                "--backend", backend, "-o", model, "--labels", labels, "-q"]
        if backend == "cpu":
            argv += ["--workers", "2"]
        assert main(argv) == 0
        g = zarr.open_group(model, mode="r")
        res[backend] = (zarr.open_group(labels, mode="r")["labels"][:], float(g.attrs["inertia"]), g.attrs["backend"])
    assert res["gpu"][2] == "cupy" and res["cpu"][2] == "numpy"
    same = (res["gpu"][0] == res["cpu"][0]).mean()
    assert same >= 0.9999, same
    assert abs(res["gpu"][1] - res["cpu"][1]) <= 1e-5 * res["cpu"][1]


def test_estimator_with_cupy_dask_array():
    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans

    rng = np.random.default_rng(5)
    X = rng.normal(0, 1, (100000, 10)).astype(np.float32) + rng.integers(0, 5, (100000, 1)) * 6
    init = X[:5].astype(np.float64)
    with LocalCUDACluster(dashboard_address=":0") as lc, Client(lc) as client:
        Xg = da.from_array(cupy.asarray(X), chunks=(10000, 10), asarray=False)
        km = daskmeans.KMeans(5, init=init, max_iter=50, client=client).fit(Xg)
        assert km.backend_ == "cupy"
        cpu = daskmeans.KMeans(5, init=init, max_iter=50, backend="cpu", client=client).fit(X)
        # labels_ is lazy: it lives on the cluster, so compute it while the client is open.
        same = (km.labels_.compute() == cpu.labels_.compute()).mean()
    assert same >= 0.9999
    assert abs(km.inertia_ - cpu.inertia_) <= 1e-5 * cpu.inertia_
