"""GPU tests (run with ``pytest -m gpu`` on a CUDA host): the CuPy backend against a float64
NumPy reference, and the whole pipeline on a LocalCUDACluster against the CPU path."""

import math
import os

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _ref(X, C, w=None):
    """Float64 reference: labels (lowest index on ties), sums, counts, inertia, min d2."""
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    d = ((X64[:, None, :] - C64[None]) ** 2).sum(-1)
    lab = d.argmin(1)
    w = np.ones(len(X)) if w is None else w
    sums = np.zeros_like(C64)
    np.add.at(sums, lab, X64 * w[:, None])
    d2 = d[np.arange(len(X)), lab]
    return lab, sums, np.bincount(lab, minlength=len(C)), float((d2 * w).sum()), d2


def _check_sums(out, X, w, lab, sums):
    """The kernel's sums and weights are exactly the integers of the grid's rule (each w x
    rounded to the nearest step, ties to even, then added: the NumPy backend's too), and so
    within half a step per row of the float64 sums."""
    import cupy

    g = out["grid"]
    k = len(out["counts"])
    w1 = np.ones(len(X)) if w is None else w
    v = np.rint(w1[:, None] * X.astype(np.float64) * np.ldexp(1.0, -g.exps)).astype(np.int64)
    isums = np.zeros((k, X.shape[1]), np.int64)
    np.add.at(isums, lab, v)
    np.testing.assert_array_equal(cupy.asnumpy(out["sums"]), isums)
    iw = np.zeros(k, np.int64)
    np.add.at(iw, lab, np.rint(w1 * g.wscale).astype(np.int64))
    np.testing.assert_array_equal(cupy.asnumpy(out["weights"]), iw)
    np.testing.assert_allclose(cupy.asnumpy(g.sums(out["sums"])), sums, rtol=0,
                               atol=len(X) * np.ldexp(0.5, g.exps).max() + 1e-12 * np.abs(sums).max())


@pytest.fixture
def poisoned_pool():
    """Fill CuPy's memory pool with NaN bytes, so that every buffer a kernel fails to write
    shows up as garbage in the results."""
    import cupy

    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    junk = [cupy.full(1 << 24, cupy.nan, cupy.float64) for _ in range(4)]  # 4 x 128 MiB
    cupy.cuda.Device().synchronize()
    del junk
    yield
    pool.free_all_blocks()


# (n, d, k): regimes fused-registers, fused-shared-memory and GEMM; D not a multiple of 4/8;
# K = 1; N not a multiple of any block; K much larger than a GEMM tile's rows.
SHAPES = [(1000, 3, 1), (4099, 7, 5), (3001, 2, 8), (5000, 100, 4), (513, 130, 17), (20000, 33, 300), (2000, 61, 1500),
          # transposed distance reduction (TRED): K not a power of 2 (padded), K = L
          (3001, 70, 3), (1500, 20, 2), (2000, 60, 5)]


def _data(n, d, k, dtype, seed=0):
    rng = np.random.default_rng(n + d + k + seed)
    centers = rng.normal(0, 4, (k, d))
    X = (centers[rng.integers(0, k, n)] + rng.normal(0, 1, (n, d))).astype(dtype)
    # k rows of X, or where there are fewer rows than centroids (fused_select's shapes) the centres
    C = X[rng.choice(n, k, replace=False)].astype(np.float64) if k <= n else centers
    return X, C, rng


@pytest.mark.parametrize("n,d,k", SHAPES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_cupy_assign_matches_float64_reference(n, d, k, weighted, dtype, precision, poisoned_pool):
    _check_assign(n, d, k, weighted, dtype, precision)


# Fused-kernel shapes whose K x D/L values fit in registers, so that the kernel has two
# placements: centroids in registers (the default) or in shared memory.
REG_SHAPES = [(1000, 3, 1), (4099, 7, 5), (3001, 2, 8), (5000, 100, 4), (3001, 70, 3), (1500, 20, 2), (2000, 60, 5)]


@pytest.mark.parametrize("n,d,k", REG_SHAPES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("centroids", ["registers", "shared"])
def test_fused_small_centroid_placements_match_reference(n, d, k, weighted, dtype, centroids, poisoned_pool):
    from daskmeans.backends import cupy_backend as be

    assert be.prepare(np.zeros((k, d)), dtype, _centroids=centroids).small[4] == (centroids == "registers")
    _check_assign(n, d, k, weighted, dtype, "fp32", _centroids=centroids)


def _check_assign(n, d, k, weighted, dtype, precision, **forced):
    import cupy
    import dask

    from daskmeans.backends import get_backend

    be = get_backend("cupy")
    X, C, rng = _data(n, d, k, dtype)
    w = rng.random(n) + 0.5 if weighted else None
    wg = None if w is None else cupy.asarray(w)
    with dask.config.set({"daskmeans.gpu-tile-bytes": "64KiB" if k == 1500 else "256MiB"}):
        p = be.prepare(C, dtype, precision, **forced)
        prev = cupy.full(n, -7, cupy.int32)  # poison: every label must be written
        out = be.assign(cupy.asarray(X), p, wg, prev_labels=prev, out_labels=prev)
        lab_only, d2 = be.min_sqdist(cupy.asarray(X), p)
    lab, sums, counts, inertia, d2_ref = _ref(X, C.astype(dtype), w)
    got = cupy.asnumpy(out["labels"])
    # Labels are those of exact distances in every regime and precision.
    np.testing.assert_array_equal(got, lab)
    np.testing.assert_array_equal(cupy.asnumpy(lab_only), lab)
    assert int(out["reassigned"]) == n  # previous labels were all -7
    np.testing.assert_array_equal(cupy.asnumpy(out["counts"]), counts)
    _check_sums(out, X, w, lab, sums)
    assert abs(float(out["inertia"]) - inertia) <= 1e-10 * inertia
    np.testing.assert_allclose(cupy.asnumpy(d2), d2_ref, rtol=1e-10, atol=1e-9)
    assert 0 <= int(out["rechecked"]) <= n


@pytest.mark.parametrize("k,d", [(3, 2), (4, 40), (40, 5), (300, 20)])  # fused: registers, TRED, shared; GEMM
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("centroids", ["registers", "shared"])
def test_exact_ties_go_to_the_lowest_index(k, d, precision, centroids):
    """Duplicated centroids tie exactly for every row near them: the lower index must win."""
    import cupy

    from daskmeans.backends import get_backend

    be = get_backend("cupy")
    rng = np.random.default_rng(k)
    base = rng.integers(-20, 20, (k // 2 + 1, d)).astype(np.float64)
    C = np.concatenate([base, base])[:k]  # centroid j + len(base) duplicates centroid j
    X = (base[rng.integers(0, len(base), 3000)] + rng.integers(-1, 2, (3000, d))).astype(np.float32)
    out = be.assign(cupy.asarray(X), be.prepare(C, np.float32, precision, _centroids=centroids))
    lab, *_ = _ref(X, C.astype(np.float32))
    np.testing.assert_array_equal(cupy.asnumpy(out["labels"]), lab)
    assert (lab < len(base)).all()


def test_low_precision_rechecks_uncertain_rows_and_keeps_fp32_labels():
    """P2-like random data: bf16 cannot certify every row, the re-check restores exact labels."""
    import cupy

    from daskmeans.backends import get_backend

    be = get_backend("cupy")
    X = cupy.random.default_rng(1).standard_normal((50000, 100), dtype=cupy.float32)
    C = X[:1000].astype(cupy.float64)
    res = {pr: be.assign(X, be.prepare(C, np.float32, pr)) for pr in ("fp32", "tf32", "bf16")}
    for pr in ("tf32", "bf16"):
        assert bool((res[pr]["labels"] == res["fp32"]["labels"]).all()), pr
    assert int(res["bf16"]["rechecked"]) > int(res["tf32"]["rechecked"]) > 0
    assert int(res["fp32"]["rechecked"]) < 0.01 * 50000


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
    """`daskmeans fit` on the GPU (CuPy chunks) vs the CPU path, same data and init; each fit
    is the command itself (``python -m daskmeans``: its process as users get it)."""
    import subprocess
    import sys

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
        p = subprocess.run([sys.executable, "-m", "daskmeans", *argv], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
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
        # labels_ of Dask input is lazy: it lives on the cluster, so compute it while the client
        # is open; of NumPy input it is NumPy.
        same = (km.labels_.compute() == cpu.labels_).mean()
    assert same >= 0.9999
    assert abs(km.inertia_ - cpu.inertia_) <= 1e-5 * cpu.inertia_


@pytest.mark.parametrize("metric,precision", [("cosine", "fp32"), ("euclidean", "tf32")])
def test_gpu_fit_variants_agree_with_cpu(metric, precision):
    """Spherical k-means and the TF32 mode on a LocalCUDACluster: the CPU path's labels on
    separated blobs (the CPU's fp32 GEMM labels may differ from exact ones only at near-ties),
    and for TF32 exactly the GPU fp32 labels (both are exact)."""
    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans

    rng = np.random.default_rng(9)
    centers = rng.normal(0, 3, (40, 48))
    X = (centers[rng.integers(0, 40, 60000)] + rng.normal(0, 1, (60000, 48))).astype(np.float32)
    # Start near the true centres: no two centroids share a blob, so no near-ties where the
    # CPU's fp32 GEMM labels could differ from exact ones and send the runs apart.
    init = centers + rng.normal(0, 0.3, centers.shape)
    kw = dict(init=init, max_iter=20, tol=0, metric=metric)
    with LocalCUDACluster(dashboard_address=":0") as lc, Client(lc) as client:
        Xg = da.from_array(cupy.asarray(X), chunks=(7000, 48), asarray=False)
        km = daskmeans.KMeans(40, precision=precision, client=client, **kw).fit(Xg)
        ref = daskmeans.KMeans(40, client=client, **kw).fit(Xg)
        cpu = daskmeans.KMeans(40, backend="cpu", client=client, **kw).fit(X)
        lab, lab_ref, lab_cpu = km.labels_.compute(), ref.labels_.compute(), cpu.labels_  # cpu: NumPy input
    assert km.backend_ == "cupy" and cpu.backend_ == "numpy"
    np.testing.assert_array_equal(lab, lab_ref)
    same = (lab == lab_cpu).mean()
    assert same >= 0.9999, same
    assert abs(km.inertia_ - cpu.inertia_) <= 1e-5 * cpu.inertia_
    assert all("rechecked" in h for h in km.history_)
    if metric == "cosine":
        np.testing.assert_allclose(np.linalg.norm(km.cluster_centers_, axis=1), 1.0, rtol=1e-5)


# GEMM-regime shapes: D odd / not a multiple of 4 / tiny, K not a multiple of the 128-wide
# centroid tile, K spanning many tiles, N not a multiple of the 128-row block.
GEMM_SHAPES = [(513, 130, 170), (20000, 33, 300), (2000, 61, 1500), (3000, 64, 200), (2777, 5, 1000)]


def _path(path):
    """``(dask config, selection layout)`` forcing a GEMM-regime path: cuBLAS tiles with the
    row-major (warp per row) or column-major (1, 2 or 4 rows per thread) selection; "+sgemm":
    fp32 precision through cuBLAS's fp32 GEMM instead of split TF32; "+tf32": tf32 precision
    through TF32 inputs and a float32 tile instead of scaled float16 (fp32 precision unchanged)."""
    layout, _, gemm = path.partition("+")
    return {"daskmeans.gpu-fp32-gemm": gemm if gemm == "sgemm" else "3xtf32",
            "daskmeans.gpu-tf32-gemm": "tf32" if gemm == "tf32" else "fp16"}, layout


GEMM_PATHS = ["rows", "cols1", "cols2", "cols4", "rows+sgemm", "cols2+sgemm", "rows+tf32"]


@pytest.mark.parametrize("n,d,k", GEMM_SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("path", GEMM_PATHS)
@pytest.mark.parametrize("offset", [0, 1])
def test_gemm_paths_match_float64_reference(n, d, k, precision, path, offset, poisoned_pool):
    """Every GEMM-regime path (cuBLAS tiles + row- or column-major selection) gives the exact labels, sums and distances, also on a block that
    starts one row into its buffer (not 16-byte aligned when D is odd) and with weights."""
    config, layout = _path(path)
    _check_gemm_block(n, d, k, offset, 3, precision, config, layout)


def _check_gemm_block(n, d, k, offset, seed, precision, config, layout="auto"):
    """A GEMM-regime block of ``n`` rows one ``offset`` into its buffer, weighted, under the
    dask ``config``: the exact labels (also where ``prev`` held none, every row counted as
    moved), counts, sums, inertia and distances. Returns the prepared centroids."""
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as be

    X, C, rng = _data(n + offset, d, k, np.float32, seed=seed)
    w = rng.random(n) + 0.5
    Xg = cupy.asarray(X)[offset:]
    X = X[offset:]
    with dask.config.set(config):
        p = be.prepare(C, np.float32, precision, _layout=layout)
        assert p.small is None  # the GEMM regime
        prev = cupy.full(n, -7, cupy.int32)
        out = be.assign(Xg, p, cupy.asarray(w), prev_labels=prev, out_labels=prev)
        lab_only, d2 = be.min_sqdist(Xg, p)
    lab, sums, counts, inertia, d2_ref = _ref(X, C.astype(np.float32), w)
    np.testing.assert_array_equal(cupy.asnumpy(out["labels"]), lab)
    np.testing.assert_array_equal(cupy.asnumpy(lab_only), lab)
    assert int(out["reassigned"]) == n
    np.testing.assert_array_equal(cupy.asnumpy(out["counts"]), counts)
    _check_sums(out, X, w, lab, sums)
    assert abs(float(out["inertia"]) - inertia) <= 1e-10 * inertia
    np.testing.assert_allclose(cupy.asnumpy(d2), d2_ref, rtol=1e-10, atol=1e-9)
    return p


def test_float16_gemm_rounds_its_output_to_nearest():
    """The mode-4 bound takes cuBLAS's float32 -> float16 conversion of the tile as rounding to
    nearest (half an ulp): the float16 GEMM of the same float16 inputs against its float32
    output, on every element (round-towards-zero or a second rounding would exceed it)."""
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as be
    from daskmeans.backends import gpu_gemm

    rng = np.random.default_rng(5)
    X = rng.normal(0, 1, (4096, 64)).astype(np.float32)
    C = rng.normal(0, 1, (1024, 64))
    with dask.config.set({"daskmeans.gpu-tf32-gemm": "fp16"}):
        p = be.prepare(C, np.float32, "tf32")
    Xg = cupy.asarray(X)
    xt = gpu_gemm.prep_buffer(len(X), 64, 4)
    _, alpha, xscale, _ = gpu_gemm.row_scales(p, Xg)
    gpu_gemm.prep(Xg, 4, 0, xt, None, None, None, (0.0, 0.0, 0.0), xscale)
    g16 = cupy.empty((len(X), p.a.shape[0]), cupy.float16)
    gpu_gemm.gemm(p, xt, g16, alpha=alpha)
    xh, ah = xt.view(cupy.float16).astype(cupy.float64), p.a.view(cupy.float16).astype(cupy.float64)
    ref = alpha * (xh @ ah.T)  # float64: the float32 accumulation's error is far below float16's
    got = g16.astype(cupy.float64)
    # half an ulp of float16 (2^-11 relative; 2^-25 absolute below the normal range), and the
    # float32 accumulation of 64 products (64 x 2^-24 relative to the sum of magnitudes)
    acc = 64 * 2.0**-24 * abs(alpha) * (cupy.abs(xh) @ cupy.abs(ah).T)
    assert bool((cupy.abs(got - ref) <= 2.0**-11 * cupy.abs(ref) + 2.0**-25 + acc).all())
    assert float((cupy.abs(got - ref) / (2.0**-11 * cupy.abs(ref) + 2.0**-25 + acc)).max()) > 0.5


# fused_select's shapes: GEMM_SHAPES (D' from 32 to 160, K within and across 128-centroid
# tiles) and the widest rows it takes (D' = 320), K just past a tile.
# K = 128 exactly (no centroid past K in the last tile) with fewer rows than a block, D = 1,
# and rows just past a block.
FUSED_SHAPES = GEMM_SHAPES + [(1200, 320, 300), (700, 256, 129), (100, 33, 128), (100, 1, 4096), (129, 64, 128)]


@pytest.mark.parametrize("n,d,k", FUSED_SHAPES)
@pytest.mark.parametrize("offset,vote", [(0, False), (1, False), (0, True)])
def test_fused_select_matches_float64_reference(n, d, k, offset, vote, poisoned_pool, monkeypatch):
    """The tf32 precision's fused float16 GEMM and selection: the exact labels, sums and
    distances, on a block that starts one row into its buffer and with weights; every row
    counted as moved (``prev`` holds no label). ``vote``: the fold's branches by the warp's
    vote (``gpu_plan.fused_vote``), whatever K."""
    from daskmeans.backends import gpu_plan

    monkeypatch.setattr(gpu_plan, "FUSED_VOTE_MIN_K", 0 if vote else math.inf)
    p = _check_gemm_block(n, d, k, offset, 5, "tf32", {"daskmeans.gpu-tf32-gemm": "fused"})
    assert p.mode == 4 and p.fused is not None and p.fused[0].shape == (-(-k // 128) * 128, -(-d // 32) * 32)


@pytest.mark.parametrize("d,vote,ways", [(40, False, 3), (40, True, 3), (300, False, 3), (40, False, 6),
                                         (300, False, 6)])
@pytest.mark.parametrize("tied", ["all", "some"])
def test_fused_select_ties_go_to_the_first_of_equal_centroids(tied, d, vote, ways, monkeypatch):
    """Rows tied ``ways`` ways (centroids repeated, the copies 64 apart: across 128-centroid
    tiles): no such row is certain and each has ``ways`` candidates, so fused_select lists it;
    fused_recheck notes its candidates, and fused_rerank finishes it at 3 ways (2 noted besides
    j1) while at 6 ways (5 noted, more than a list's 4) fused_rescan scans every centroid for
    it. The winner is the first copy, as NumPy's argmin, at its exact distance. "all": every
    centroid repeated (every row listed: many blocks of listed rows, more than the recheck's
    grid); "some": 8 of 64, so that blocks mix listed and certified rows. D = 300: the rescan's
    groups of 16 rows (D' = 320). ``vote``: the fold's branches by the warp's vote. The
    recheck takes each centroid tile as a share of its own (2 or 3 shares: the copies of a
    row's centroid in different shares, noted into one list)."""
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as be
    from daskmeans.backends import gpu_plan

    monkeypatch.setattr(gpu_plan, "FUSED_VOTE_MIN_K", 0 if vote else math.inf)
    monkeypatch.setattr(gpu_plan, "recheck_splits", lambda ntile: ntile)
    rng = np.random.default_rng(2)
    base = rng.normal(0, 3, (64, d))
    copies = base if tied == "all" else base[:8]
    C = np.concatenate([base] + [copies] * (ways - 1))
    X = (base[rng.integers(0, 64, 3000)] + rng.normal(0, 1, (3000, d))).astype(np.float32)
    with dask.config.set({"daskmeans.gpu-tf32-gemm": "fused"}):
        p = be.prepare(C, np.float32, "tf32")
        assert p.fused is not None
        prev = cupy.zeros(len(X), cupy.int32)
        out = be.assign(cupy.asarray(X), p, None, prev_labels=prev)
        lab, d2 = be.min_sqdist(cupy.asarray(X), p)
    ref, _, _, _, d2_ref = _ref(X, C.astype(np.float32))
    assert ref.max() < 64
    np.testing.assert_array_equal(cupy.asnumpy(out["labels"]), ref)
    np.testing.assert_array_equal(cupy.asnumpy(lab), ref)
    assert int(out["reassigned"]) == int((ref != 0).sum())
    listed = int((ref < len(copies)).sum())
    assert listed == len(X) if tied == "all" else 0 < listed < len(X) / 4
    assert listed <= int(out["rechecked"]) < len(X) if tied == "some" else int(out["rechecked"]) == len(X)
    np.testing.assert_allclose(cupy.asnumpy(d2), d2_ref, rtol=1e-10, atol=1e-9)


def test_fused_select_tiny_data_and_centroids_stay_exact():
    """Rows just under 2^-70, centroids of magnitude 2^-53: fused_select's one factor for
    -2 x.c (2^-150) is zero in float32, so the block takes the tile path, whose factor for the
    tile is kept at 2^-126 (2^-131 would keep the tile's values near 2^15, but is subnormal).
    With a zero factor the values would be ||c||^2 alone and certify centroid 0, whose norm is
    2^-17 smaller, although centroid 1 is nearer to every row (the rest, random signs, are
    farther still)."""
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as be

    rng = np.random.default_rng(8)
    X = (2.0**-70 * (1 - 0.01 * rng.random((300, 64)))).astype(np.float32)
    C = 2.0**-53 * rng.choice([-1.0, 1.0], (200, 64))
    C[0], C[1] = -(1 - 2.0**-17) * 2.0**-53, 2.0**-53
    with dask.config.set({"daskmeans.gpu-tf32-gemm": "fused"}):
        p = be.prepare(C, np.float32, "tf32")
        assert p.fused is not None
        lab, d2 = be.min_sqdist(cupy.asarray(X), p)
    ref, _, _, _, d2_ref = _ref(X, C.astype(np.float32))
    assert (ref == 1).all()
    np.testing.assert_array_equal(cupy.asnumpy(lab), ref)
    np.testing.assert_allclose(cupy.asnumpy(d2), d2_ref, rtol=1e-10)


def test_fused_select_empty_block():
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as be

    with dask.config.set({"daskmeans.gpu-tf32-gemm": "fused"}):
        p = be.prepare(np.random.default_rng(0).normal(size=(300, 64)), np.float32, "tf32")
        out = be.assign(cupy.empty((0, 64), cupy.float32), p, None)
    assert out["labels"].shape == (0,) and int(out["counts"].sum()) == 0 and float(out["inertia"]) == 0.0


def test_tensor_core_sums_are_within_the_bounds_accumulation_term():
    """The bound's premise for fused_select's float32 sums (gpu_plan.error_bound: any order,
    2 D u times the sum of the products' magnitudes, twice the classical term since
    tensor-core adders may truncate): mma.sync m16n8k16 float16 -> float32, chained over D
    as fused_select chains it, against float64 on every element of tiles built to lose the
    most (one large product beside many just under half its ulp, and cancellation) and of
    rows of float16 subnormals (a flush to zero would lose all of them)."""
    import cupy

    src = r"""
    extern "C" __global__ void mma_dots(const unsigned short* A, const unsigned short* B, float* out, int D) {
        const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
        A += (long long)blockIdx.x * 16 * D;
        B += (long long)blockIdx.y * 8 * D;
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        auto pk = [&](const unsigned short* p) { return (unsigned)p[0] | ((unsigned)p[1] << 16); };
        for (int k0 = 0; k0 < D; k0 += 16) {
            const unsigned a0 = pk(A + g * D + k0 + 2 * t), a1 = pk(A + (g + 8) * D + k0 + 2 * t);
            const unsigned a2 = pk(A + g * D + k0 + 8 + 2 * t), a3 = pk(A + (g + 8) * D + k0 + 8 + 2 * t);
            const unsigned b0 = pk(B + g * D + k0 + 2 * t), b1 = pk(B + g * D + k0 + 8 + 2 * t);
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};\n" : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
        const long long ld = (long long)gridDim.y * 8, r = (long long)blockIdx.x * 16, col = (long long)blockIdx.y * 8;
        out[(r + g) * ld + col + 2 * t] = c[0];
        out[(r + g) * ld + col + 2 * t + 1] = c[1];
        out[(r + g + 8) * ld + col + 2 * t] = c[2];
        out[(r + g + 8) * ld + col + 2 * t + 1] = c[3];
    }"""
    kern = cupy.RawKernel(src, "mma_dots", options=("--std=c++17",))
    rng = np.random.default_rng(6)
    d, m, n = 256, 64, 64
    a = rng.normal(size=(m, d))
    b = rng.normal(size=(n, d))
    # rows 0-15: one product 2^20 first, then 255 just under half its float32 ulp (2^-4)
    a[:16], b[:16] = 2.0**-3, 2.0**-2 * 0.97
    a[:16, 0], b[:16, 0] = 2.0**10, 2.0**10
    # rows 16-31: cancellation, +-2^12 products that cancel around small ones
    a[16:32] = np.where(np.arange(d) % 2, 64.0, -64.0) + rng.normal(0, 2.0**-6, (16, d))
    b[16:32] = 64.0 + rng.normal(0, 2.0**-6, (16, d))
    # rows 32-47: float16 subnormals (2^-15 to 2^-24: values of a row far under the grid's
    # largest, as gemm_prep scales them), which the premise needs taken as they are, not as 0
    a[32:48] = rng.choice([-1.0, 1.0], (16, d)) * 2.0 ** -rng.integers(15, 25, (16, d)).astype(np.float64)
    ah, bh = a.astype(np.float16), b.astype(np.float16)
    assert (np.abs(ah[32:48].astype(np.float64)) < 2.0**-14).all() and (ah[32:48] != 0).all()
    out = cupy.empty((m, n), cupy.float32)
    kern((m // 16, n // 8), (32,), (cupy.asarray(ah.view(np.uint16)), cupy.asarray(bh.view(np.uint16)), out,
                                   np.int32(d)))
    a64, b64 = ah.astype(np.float64), bh.astype(np.float64)
    exact, mag = a64 @ b64.T, np.abs(a64) @ np.abs(b64).T
    err = np.abs(cupy.asnumpy(out).astype(np.float64) - exact)
    assert (err <= 2 * d * 2.0**-24 * mag).all(), float((err / (2 * d * 2.0**-24 * mag)).max())


@pytest.mark.parametrize("k", [300, 5000])
def test_fused_select_fit_is_the_tile_paths_bitwise(k):
    """A whole tf32 fit through fused_select and through the float16 tile: the same centroids,
    labels, iterations and statistics to the bit (both labels are exact; the inertias as
    reproducible as float atomics make them), fewer rows re-ranked exactly (no float16 rounding
    of the distances in the bound)."""
    import cupy
    import dask
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans

    rng = np.random.default_rng(4)
    X = rng.normal(size=(60000, 64)).astype(np.float32)
    res = {}
    with LocalCUDACluster(dashboard_address=":0", n_workers=1) as lc, Client(lc) as client:
        Xg = da.from_array(cupy.asarray(X), chunks=(7000, 64), asarray=False)
        for gemm in ("fused", "fp16"):
            with dask.config.set({"daskmeans.gpu-tf32-gemm": gemm}):
                km = daskmeans.KMeans(k, init=X[:k].astype(np.float64), n_init=1, max_iter=6, tol=0, precision="tf32",
                                      client=client).fit(Xg)
            res[gemm] = km, cupy.asnumpy(km.labels_.compute())
    (a, la), (b, lb) = res["fused"], res["fp16"]
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(la, lb)
    # A chunk's inertia is added with float atomics on the GPU (design.md): its last bits vary
    assert a.n_iter_ == b.n_iter_ == 6 and a.inertia_ == pytest.approx(b.inertia_, rel=1e-12)
    timings = {"kernel_seconds", "collective_seconds", "update_seconds", "seconds", "gb_per_s"}
    for ha, hb in zip(a.history_, b.history_):
        assert ha["inertia"] == pytest.approx(hb["inertia"], rel=1e-12)
        assert {key: v for key, v in ha.items() if key not in timings | {"rechecked", "inertia"}} == \
            {key: v for key, v in hb.items() if key not in timings | {"rechecked", "inertia"}}
    assert sum(h["rechecked"] for h in a.history_) < sum(h["rechecked"] for h in b.history_)


@pytest.mark.parametrize("scale", [1e-15, 1.0, 1e15])
@pytest.mark.parametrize("tf32_gemm", ["fp16", "tf32", "fused"])
def test_tf32_labels_exact_at_any_scale(scale, tf32_gemm):
    """tf32 precision through scaled float16 inputs and tile (mode 4) or TF32 (mode 1): exact
    labels and distances on data far from float16's range (1e-15, 1e15), rows of mixed norms
    (1e-3 to 30 times), and a centroid far out."""
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as be

    X, C, rng = _data(5000, 96, 700, np.float32, seed=11)
    X *= rng.choice([1e-3, 1.0, 30.0], (len(X), 1)).astype(np.float32)
    C[0] *= 1e4
    X, C = (X * scale).astype(np.float32), C * scale
    with dask.config.set({"daskmeans.gpu-tf32-gemm": tf32_gemm}):
        p = be.prepare(C, np.float32, "tf32")
        assert p.mode == (1 if tf32_gemm == "tf32" else 4) and (p.fused is not None) == (tf32_gemm == "fused")
        lab, d2 = be.min_sqdist(cupy.asarray(X), p)
    ref, _, _, _, d2_ref = _ref(X, C.astype(np.float32))
    np.testing.assert_array_equal(cupy.asnumpy(lab), ref)
    np.testing.assert_allclose(cupy.asnumpy(d2), d2_ref, rtol=1e-10, atol=1e-30 * scale**2)


@pytest.mark.parametrize("hist_max_k", [0, 1 << 30])
def test_label_sums_counting_sorts_agree(hist_max_k, monkeypatch):
    """The sums pass with block-local (shared-memory) label counters and with global ones
    (taken when K is too large for shared memory): the same sums, counts and inertia."""
    import cupy

    from daskmeans.backends import cupy_backend as be

    from daskmeans.backends import gpu_sums

    monkeypatch.setattr(gpu_sums, "HIST_MAX_K", hist_max_k)
    X, C, rng = _data(6000, 21, 600, np.float32, seed=7)
    w = rng.random(6000) + 0.5
    p = be.prepare(C, np.float32)
    out = be.assign(cupy.asarray(X), p, cupy.asarray(w))
    lab, sums, counts, inertia, _ = _ref(X, C.astype(np.float32), w)
    np.testing.assert_array_equal(cupy.asnumpy(out["labels"]), lab)
    np.testing.assert_array_equal(cupy.asnumpy(out["counts"]), counts)
    _check_sums(out, X, w, lab, sums)
    assert abs(float(out["inertia"]) - inertia) <= 1e-10 * inertia


@pytest.mark.parametrize("copies", [2, 3])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("path", GEMM_PATHS)
def test_gemm_paths_resolve_ties_among_many_candidates(copies, precision, path):
    """Every centroid repeated ``copies`` times: each row has ``copies`` exactly tied best
    candidates (three or more take the fused path's every-centroid re-check); the lowest
    index wins, as in the float64 reference."""
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as be

    rng = np.random.default_rng(copies)
    base = rng.integers(-20, 20, (50, 40)).astype(np.float64)
    C = np.concatenate([base] * copies)
    X = (base[rng.integers(0, 50, 4000)] + rng.integers(-1, 2, (4000, 40))).astype(np.float32)
    config, layout = _path(path)
    with dask.config.set(config):
        p = be.prepare(C, np.float32, precision, _layout=layout)
        assert p.small is None  # the GEMM regime
        out = be.assign(cupy.asarray(X), p)
    lab, *_ = _ref(X, C.astype(np.float32))
    np.testing.assert_array_equal(cupy.asnumpy(out["labels"]), lab)
    assert (lab < 50).all()
    assert int(out["rechecked"]) == 4000  # every row has a zero margin


def _round_mantissa(x, keep):
    """float32 -> float32 rounded to nearest even with ``keep`` mantissa bits (NumPy reference
    of gemm_prep's rounding), values below 2^-100 flushed to zero."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    sh = 23 - keep
    u = (u + ((1 << (sh - 1)) - 1) + ((u >> sh) & 1)) & ~np.uint64((1 << sh) - 1)
    out = (u & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(np.abs(x) < 2.0**-100, np.float32(0), out)


@pytest.mark.parametrize("mode", [1, 2, 3, 4])
@pytest.mark.parametrize("cen", [0, 1])
def test_gemm_prep_rounds_to_nearest_even_and_splits_exactly(mode, cen):
    """gemm_prep's rounded copy (TF32 / split TF32 / bf16) against a NumPy reference, on values
    that include exact ties, binade edges, negative numbers, zeros and tiny (flushed) values;
    the residual norms are exact and the split parts sum back to x."""
    import cupy

    from daskmeans.backends import gpu_gemm

    rng = np.random.default_rng(mode + 10 * cen)
    d = 37
    x = rng.normal(0, 3, (500, d)).astype(np.float32)
    keep = 7 if mode == 3 else 10
    # exact ties: a kept mantissa plus exactly half a unit of the last kept place
    half = np.float32(2.0 ** -(keep + 1))
    x[0, :8] = np.float32(1) + half * np.arange(1, 16, 2)[:8].astype(np.float32)
    x[1, :4] = [np.float32(2) - np.float32(2.0**-23), 1e-35, -1e-30, 0.0]
    x[2] = -x[2]
    xg = cupy.asarray(x)
    out = gpu_gemm.prep_buffer(len(x), d, mode)
    sq, rsq, eb = (cupy.empty(len(x), cupy.float64) for _ in range(3))
    scale = 2.0**-3  # mode 4: float16 of x / 8 (the ties above stay ties, x[1, 1] is subnormal there)
    gpu_gemm.prep(xg, mode, cen, out, sq, rsq, eb, (0.5, 3.0, 0.25), scale)
    if mode == 4:
        h = np.where(np.abs(x) < 2.0**-100, np.float32(0), x * np.float32(scale)).astype(np.float16)
        xb = (h.astype(np.float32) / np.float32(scale)).astype(np.float32)
    else:
        xb = _round_mantissa(x, keep)
    xs = np.where(np.abs(x) < 2.0**-100, np.float32(0), x - xb)
    if mode == 4:
        np.testing.assert_array_equal(cupy.asnumpy(out).view(np.float16), h)
    elif mode == 3:
        got = (cupy.asnumpy(out).astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(got, xb)
    elif mode == 1:
        np.testing.assert_array_equal(cupy.asnumpy(out), xb)
    else:
        parts = (xb, xs, xb) if cen else (xb, xb, xs)
        np.testing.assert_array_equal(cupy.asnumpy(out), np.concatenate(parts, axis=1))
    np.testing.assert_array_equal(xb[0, :8] - 1, np.float32(2.0**-keep) * np.array([0, 2, 2, 4, 4, 6, 6, 8]))  # ties to even
    assert (xb.astype(np.float64) + xs == np.where(np.abs(x) < 2.0**-100, 0, x)).all()
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(cupy.asnumpy(sq), (x64 * x64).sum(1), rtol=1e-14)
    np.testing.assert_allclose(cupy.asnumpy(rsq), (xs.astype(np.float64) ** 2).sum(1), rtol=1e-14)
    ref_eb = 0.5 * np.sqrt((x64 * x64).sum(1)) + 3.0 * np.sqrt((xs.astype(np.float64) ** 2).sum(1)) + 0.25
    np.testing.assert_allclose(cupy.asnumpy(eb), ref_eb, rtol=1e-14)


@pytest.mark.parametrize("precision,fp32_gemm,mode", [("fp32", "sgemm", 0), ("fp32", "3xtf32", 2), ("tf32", "tf32", 1),
                                                      ("bf16", None, 3), ("tf32", "fp16", 4)])
@pytest.mark.parametrize("offset", [0.0, 50.0])
@pytest.mark.parametrize("scale", [1.0, 1e-15, 1e15])
def test_gemm_error_bound_holds_for_every_pair(precision, fp32_gemm, mode, offset, scale):
    """The certified bound the selection relies on: for every row and every centroid,
    ``|fl(G + csq) - (||c||^2 - 2 x.c)| <= eb(row)``, G from the real cuBLAS call, the right
    side in float64; on rows of mixed scales, centred and not (offset). TF32/bf16 bounds use
    each row's actual rounding residual, so they are far below the format's worst case."""
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as be
    from daskmeans.backends import gpu_gemm

    rng = np.random.default_rng(int(offset) + len(precision))
    n, d, k = 3000, 77, 300
    X = ((rng.normal(0, 1, (n, d)) * rng.choice([1e-3, 1.0, 30.0], (n, 1)) + offset) * scale).astype(np.float32)
    C = X[rng.choice(n, k, replace=False)].astype(np.float64) + rng.normal(0, 0.1 * scale, (k, d))
    gemms = {"daskmeans.gpu-fp32-gemm": fp32_gemm if precision == "fp32" else "auto",
             "daskmeans.gpu-tf32-gemm": fp32_gemm if precision == "tf32" else "auto"}
    with dask.config.set(gemms):
        p = be.prepare(C, np.float32, precision)
    assert p.mode == mode
    Xg = cupy.asarray(X)
    xt = gpu_gemm.prep_buffer(n, d, p.mode)
    eb = cupy.empty(n, cupy.float64)
    coef, alpha, xscale, gsc = gpu_gemm.row_scales(p, Xg)
    gpu_gemm.prep(Xg, p.mode, 0, xt, None, None, eb, coef, xscale)
    G = cupy.empty((n, p.a.shape[0]), gpu_gemm.tile_dtype(p))
    gpu_gemm.gemm(p, Xg if xt is None else xt, G, alpha=alpha)
    cupy.cuda.Device().synchronize()
    assert bool(cupy.isfinite(G).all())  # mode 4: the float16 tile never overflows
    # the float32 sum the selection takes
    v = (G[:, :k].astype(cupy.float32) * cupy.float32(gsc) + p.csq[None, :k]).astype(cupy.float64)
    c32 = p.centroids.astype(cupy.float64)
    exact = (c32 * c32).sum(1)[None, :] - 2.0 * Xg.astype(cupy.float64) @ c32.T
    err = cupy.abs(v - exact).max(axis=1)
    bound = eb
    assert bool((err <= bound).all()), float((err / bound).max())
    if precision != "fp32":
        # The GEMM's part of the bound (less the rounding of ||c||^2 + G, the same B in every
        # mode) against the old worst case 2 (2 u_in) ||x|| cmax: TF32 with u_in = 2^-10
        # (inputs possibly truncated; ours are rounded to nearest, 2^-11), bf16 with 2^-8
        # (rounded to nearest either way): the actual residuals are ~0.4 of the worst case.
        u_in = 2.0**-10 if precision == "tf32" else 2.0**-8
        worst = 4 * u_in * cupy.sqrt((Xg.astype(cupy.float64) ** 2).sum(1)) * float(cupy.sqrt((c32 * c32).sum(1).max()))
        ratio = float(((bound - coef[2]) / worst).max())
        # mode 4 adds the float16 output's rounding, 2^-11 of |G| <= 2 ||x|| M
        assert ratio < (0.35 if mode == 1 else 0.7), ratio


@pytest.mark.parametrize("k,d", [(3, 2), (1000, 100), (3000, 400)])  # one block; many; > 1024 x 256 values
def test_gpu_update_gives_the_numpy_backends_centroids_and_shift(k, d):
    """The update kernel (cuda/update.cu): the NumPy backend's centroid bits, empty clusters
    keep their centroid, and the shift is that of float64 NumPy, the same bits every call."""
    import cupy

    from daskmeans.backends import cupy_backend as cb
    from daskmeans.backends import numpy_backend as nb
    from daskmeans.numerics.grid import Grid

    rng = np.random.default_rng(k)
    X = rng.normal(0, 5, (2000, d))
    grid = Grid.for_block(X)
    isums = rng.integers(-(2**50), 2**50, (k, d), dtype=np.int64)
    iweights = grid.unit_weights(rng.integers(0, 50, k).astype(np.int64))
    iweights[::7] = 0  # empty clusters
    old = rng.normal(0, 5, (k, d))
    want, want_shift = nb.update_centroids(isums, iweights, old, grid)
    got, shift = cb.update_centroids(cupy.asarray(isums), cupy.asarray(iweights), cupy.asarray(old), grid)
    np.testing.assert_array_equal(cupy.asnumpy(got), want)
    np.testing.assert_array_equal(cupy.asnumpy(got)[::7], old[::7])
    assert float(shift) == pytest.approx(want_shift, rel=1e-12)
    again = cb.update_centroids(cupy.asarray(isums), cupy.asarray(iweights), cupy.asarray(old), grid)[1]
    assert float(again) == float(shift)


@pytest.mark.parametrize("k", [1, 7, 12_288, 12_289, 40_000])  # shared-memory counters up to 48 KiB, then global
def test_gpu_label_counts_equal_bincount(k):
    import cupy

    from daskmeans.backends import cupy_backend as cb

    lab = np.random.default_rng(k).integers(0, k, 300_001).astype(np.int32)
    got = cb.label_counts(cupy.asarray(lab), k)
    assert got.dtype == cupy.int64
    np.testing.assert_array_equal(cupy.asnumpy(got), np.bincount(lab, minlength=k))


@pytest.mark.parametrize("n,d", [(3, 2), (5003, 7), (70_001, 408), (300, 33)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_moments_match_float64_reference(n, d, dtype):
    """The moments kernels (cuda/fit.cu) against float64 NumPy, and the same bits every call."""
    import cupy

    from daskmeans.backends import cupy_backend as cb

    rng = np.random.default_rng(n + d)
    X = (rng.standard_normal((n, d)) * rng.uniform(0.1, 100, d) + rng.uniform(-1e4, 1e4, d)).astype(dtype)
    mean, m2, max_abs, bad = cb.moments(cupy.asarray(X))
    X64 = X.astype(np.float64)
    np.testing.assert_allclose(cupy.asnumpy(mean), X64.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(cupy.asnumpy(m2), ((X64 - X64.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-9)
    np.testing.assert_array_equal(cupy.asnumpy(max_abs), np.abs(X64).max(axis=0))
    assert bad is None
    again = cb.moments(cupy.asarray(X))
    for a, b in zip(again[:3], (mean, m2, max_abs)):
        np.testing.assert_array_equal(cupy.asnumpy(a), cupy.asnumpy(b))


def test_gpu_moments_toy_first_bad_row_and_overflow():
    import cupy

    from daskmeans.backends import cupy_backend as cb
    from daskmeans.errors import DataError

    X = np.array([[1.0, 10.0], [3.0, -12.0], [-5.0, 10.0]], np.float32)
    mean, m2, max_abs, bad = cb.moments(cupy.asarray(X))
    np.testing.assert_array_equal(cupy.asnumpy(mean), [-1 / 3, 8 / 3])
    np.testing.assert_allclose(cupy.asnumpy(m2), [312 / 9, 2904 / 9], rtol=1e-15)
    np.testing.assert_array_equal(cupy.asnumpy(max_abs), [5.0, 12.0])
    for value in (np.nan, np.inf, -np.inf):
        Y = np.ones((100_000, 3), np.float32)
        Y[60_000, 0] = value
        Y[37_123, 2] = value  # the first, in a later warp's rows than row 60,000 of another block
        assert cb.moments(cupy.asarray(Y))[3] == 37_123
    with pytest.raises(DataError, match="too large to average in float64"):
        cb.moments(cupy.full((4, 2), 1e308))


def test_kmeans_parallel_init_converges_as_well_as_kmeans_plusplus_on_p3():
    """P3 (randn 3e5 x 408, K = 5000): fitted to convergence (or 300 iterations) from the
    default k-means|| init (the candidates reclustered on the GPU in batches) and from greedy
    k-means++, the final inertias are within 1%; the same seed gives the same init (one
    iteration from it, twice: the same centroid bits), and the init's own inertia is below
    that of K random rows."""
    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans

    X = cupy.random.default_rng(3).standard_normal((300_000, 408), dtype=cupy.float32)
    fits = {}
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=":0") as lc, Client(lc) as client:
        Xg = da.from_array(X, chunks=(100_000, 408), asarray=False)
        for init in ("k-means||", "k-means++", "random"):
            fits[init] = daskmeans.KMeans(5000, init=init, random_state=0, max_iter=300, client=client).fit(Xg)
        again = [daskmeans.KMeans(5000, random_state=0, max_iter=1, client=client).fit(Xg) for _ in range(2)]
    par, pp, rnd = fits["k-means||"], fits["k-means++"], fits["random"]
    assert abs(par.inertia_ - pp.inertia_) <= 0.01 * pp.inertia_, (par.inertia_, pp.inertia_, par.n_iter_, pp.n_iter_)
    assert par.history_[0]["inertia"] < rnd.history_[0]["inertia"], (par.history_[0], rnd.history_[0])
    np.testing.assert_array_equal(again[0].cluster_centers_, again[1].cluster_centers_)  # exact integer sums
    # The GPU adds a chunk's inertia with float atomics: equal to rounding, not to the bit.
    assert again[0].history_[0]["inertia"] == pytest.approx(par.history_[0]["inertia"], rel=1e-12)


def _draws_module(shard, n):
    """The array module of a first k-means|| round's draws on ``shard`` (its data part)."""
    from daskmeans.seeding import kmeans_parallel

    return type(kmeans_parallel._par_sample(shard, None, [float(n)], 400.0, 5, 0)[1]).__module__.split(".")[0]


def test_kmeans_parallel_draws_stay_on_the_gpu_and_give_every_placements_centroids():
    """The device tier's k-means|| draws stay on the GPU that drew them (a round's rows cross
    to the host and back no more), the host tier's are host arrays; the init's centroids are
    the same bits on the device and host tiers, on one worker and on two worker processes
    (each worker's draws sent to the other's device for its passes and to the recluster's),
    for any chunking."""
    import cupy
    import dask.array as da
    from distributed import Client

    from daskmeans.engine.placement import place
    from daskmeans.io.readers import read
    from daskmeans.seeding import resolve_init, rows

    rng = np.random.default_rng(21)
    X = (rng.standard_normal((40, 16)) * 30)[rng.integers(0, 40, 30_000)] + rng.standard_normal((30_000, 16))
    X = X.astype(np.float32)

    def init(cluster, backend, tier, chunks):
        with cluster as lc, Client(lc) as c:
            p = place(c, read(da.from_array(X, chunks=(chunks, -1))), backend, tier=tier, balance=False)
            mods = c.gather(rows.submit_per_shard(c, p, _draws_module, [len(X)] * len(p.shards), name="draws"))
            return resolve_init(c, p, "k-means||", 300, 9), set(mods)

    two = "0,1" if cupy.cuda.runtime.getDeviceCount() >= 2 else "0,0"
    ref, mods = init(_gpu_cluster("0"), "cupy", "device", 30_000)
    assert mods == {"cupy"} and ref.shape == (300, 16) and len(np.unique(ref, axis=0)) == 300
    for devices, tier, chunks, module in (("0", "device", 7_001, "cupy"), ("0", "host", 7_001, "numpy"),
                                          (two, "device", 4_000, "cupy"), (two, "host", 30_000 // 2, "numpy")):
        got, mods = init(_gpu_cluster(devices), "cupy", tier, chunks)
        assert mods == {module}, (devices, tier, chunks, mods)
        np.testing.assert_array_equal(got, ref, err_msg=f"{devices} {tier} {chunks}")


def _gpu_cluster(devices):
    """A cluster of a worker per GPU of ``devices``; "0,0": two worker processes on GPU 0
    (dask-cuda allows one per device)."""
    from dask_cuda import LocalCUDACluster
    from distributed import LocalCluster

    if devices == "0,0":
        return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, dashboard_address=":0")


def test_training_on_a_sample_of_cupy_data_is_the_fit_of_the_sampled_rows():
    """max_samples_per_cluster on CuPy blocks: the centroids of the fit of the sampled rows
    (and of the CPU path) bit for bit, and labels of every row as predict gives them."""
    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans
    from daskmeans.sampling import sample_rows

    x, C, _ = _data(40_000, 24, 50, np.float32, seed=8)
    rows = sample_rows(len(x), 20 * 50, 4)
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=":0") as lc, Client(lc) as client:
        Xg = da.from_array(cupy.asarray(x), chunks=(7_000, -1), asarray=False)
        km = daskmeans.KMeans(50, init=C, max_samples_per_cluster=20, random_state=4, max_iter=30,
                              client=client).fit(Xg)
        ref = daskmeans.KMeans(50, init=C, random_state=4, max_iter=30, client=client).fit(cupy.asarray(x[rows]))
        labels = cupy.asnumpy(km.labels_.compute())
        pred = cupy.asnumpy(km.predict(cupy.asarray(x)))
    cpu = daskmeans.KMeans(50, init=C, random_state=4, max_iter=30, backend="cpu").fit(x[rows])
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(km.cluster_centers_, cpu.cluster_centers_)
    np.testing.assert_array_equal(labels, pred)
    assert km.n_samples_fit_ == 1000


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_k_2_20_fit_labels_and_predict_are_exact(precision):
    """K = 2^20 (the largest IVF shape): a fit's iteration, its training labels and predict on
    new rows give the exact nearest centroid (float64 reference on the GPU, 2000 rows each)."""
    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans

    k, d = 1 << 20, 64
    rng = cupy.random.default_rng(20)
    X = rng.standard_normal((k + k // 8, d), dtype=cupy.float32)
    init = X[:k].astype(cupy.float64).get()
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=":0") as lc, Client(lc) as client:
        Xg = da.from_array(X, chunks=(300_000, d), asarray=False)
        km = daskmeans.KMeans(k, init=init, max_iter=1, tol=0, precision=precision, client=client).fit(Xg)
        labels = cupy.asarray(km.labels_.compute())
        new = rng.standard_normal((2000, d), dtype=cupy.float32)
        pred = cupy.asarray(km.predict(new))
    C = cupy.asarray(km.cluster_centers_, dtype=cupy.float64)

    def nearest(rows, cen):  # float64, lowest index on ties
        r = rows.astype(cupy.float64)
        return cupy.argmin((cen * cen).sum(1)[None, :] - 2.0 * r @ cen.T + (r * r).sum(1)[:, None], axis=1)

    pick = cupy.asarray(np.random.default_rng(1).choice(len(X), 2000, replace=False))
    # the training labels come from the final pass, under the final centroids
    assert bool((labels[pick] == nearest(X[pick], C)).all())
    assert bool((pred == nearest(new, C)).all())
    assert km.cluster_centers_.shape == (k, d) and km.n_iter_ == 1


@pytest.mark.parametrize("k,d,precision,n", [
    (5, 2, "fp32", 100_000),  # the fused kernel
    (256, 64, "fp32", 200_000),  # column-major selection
    (5000, 408, "fp32", 30_000),  # row selection, split TF32
    (1000, 100, "tf32", 50_000),
])
def test_warm_compiles_every_kernel_a_fit_launches(monkeypatch, k, d, precision, n):
    """After ``warm`` the moments, assignment and update of a fit of that shape compile
    nothing more: each kernel they ask for is the one warm() built."""
    import cupy

    from daskmeans.backends import cuda_src, cupy_backend as cb, gpu_small

    monkeypatch.setattr(cuda_src, "_CACHE", {})  # compiles again (from CuPy's disk cache)
    monkeypatch.setattr(gpu_small, "_PLANS", {})
    cb.warm(k, d, np.float32, precision, n).join(300)
    warmed = dict(cuda_src._CACHE)
    assert warmed
    X = cupy.random.default_rng(0).standard_normal((n, d), dtype=cupy.float32)
    cb.moments(X)
    p = cb.prepare(X[:k], X.dtype, precision)
    out = cb.assign(X, p)
    cb.update_centroids(out["sums"], out["weights"], p.c64, out["grid"])
    cb.label_counts(out["labels"], k)
    cupy.cuda.Device().synchronize()
    assert cuda_src._CACHE == warmed


_OPEN_CONTEXT = """
import sys, threading
import cupy
from daskmeans.backends import gpu_device
n = cupy.cuda.runtime.getDeviceCount()
seen = {}
def opened(i):
    gpu_device.open_context(i)
    seen[i] = cupy.cuda.runtime.getDevice()  # the thread's current device: the one opened
threads = [threading.Thread(target=opened, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
assert seen == {i: i for i in range(n)}, seen
for i in range(n):
    with cupy.cuda.Device(i):
        a = cupy.arange(1000, dtype=cupy.int64)
        assert int(a.sum()) == 499500 and a.device.id == i
print("ok", n)
"""


def test_open_context_makes_each_gpus_context_that_cupy_then_uses():
    """A new process (no context yet) opens every GPU from threads of its own, through the
    driver: each thread is left on its GPU, and CuPy allocates and launches on every one."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _OPEN_CONTEXT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("ok ")


def test_the_fused_module_as_built_neither_spills_nor_outgrows_two_blocks_a_sm():
    """The fused kernels as the package builds them (NVRTC's split compile, which this host's
    NVRTC takes): no kernel uses local memory (a spill), and ``fused_select`` keeps two blocks
    of WM x WN warps within an SM's 64K registers, at the narrowest, a middle and the widest
    D' and with the fold by the warp's vote: what ``test_cuda_compile`` holds nvcc's build to."""
    from daskmeans.backends import cuda_src
    from daskmeans.backends import gpu_plan as plan

    assert set(cuda_src.SPLIT_COMPILE) <= set(cuda_src.fused_options())
    wm, wn = plan.FUSED_WARPS
    for dp in (plan.fused_dp(1), 128, plan.FUSED_MAX_DP):
        for vote in (False, True):
            ks = cuda_src.fused_kernels("float32", dp, plan.FUSED_STAGES, plan.fused_columns(dp), plan.FUSED_WARPS,
                                        vote=vote)
            assert {name: k.local_size_bytes for name, k in ks.items()} == dict.fromkeys(cuda_src.FUSED_KERNELS, 0)
            regs = ks["fused_select"].num_regs
            assert 2 * regs * 32 * wm * wn <= 65536, (dp, vote, regs)


def test_empty_pinned_gives_page_locked_host_arrays_of_any_shape():
    """gpu_staging.empty_pinned: host arrays of the asked shape and dtype in page-locked memory
    (CUDA reports them as host memory it registered), empty ones included."""
    import cupy

    from daskmeans.backends import gpu_staging

    for shape, dtype in (((3, 4), np.float32), (5, np.int64), ((0,), np.float64), ((2, 0, 3), np.uint8)):
        a = gpu_staging.empty_pinned(shape, dtype)
        want = (shape,) if isinstance(shape, int) else shape
        assert a.shape == want and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        attrs = cupy.cuda.runtime.pointerGetAttributes(a.ctypes.data)
        assert attrs.type == cupy.cuda.runtime.memoryTypeHost
        a[...] = 7
        g = cupy.asarray(a)
        np.testing.assert_array_equal(cupy.asnumpy(g), np.full(want, 7, dtype))


def test_upload_copies_page_locked_arrays_as_they_are_and_pageable_ones_through_its_lanes(monkeypatch):
    """gpu_staging.upload: a page-locked host array of any size (page_locked says so) goes to
    the device by one copy, never through the uploader's lanes; a pageable one is not
    page-locked and goes through them above UPLOAD_MIN_BYTES; both arrive exactly."""
    import cupy

    from daskmeans.backends import gpu_staging

    big = gpu_staging.UPLOAD_MIN_BYTES // 8 + 3
    pinned = gpu_staging.empty_pinned(big, np.int64)
    pinned[...] = np.arange(big) * 7 - 5
    pageable = pinned.copy()
    assert gpu_staging.page_locked(pinned) and gpu_staging.page_locked(pinned[5:])
    assert not gpu_staging.page_locked(pageable)
    lanes = []
    real = gpu_staging._Uploader.copy
    monkeypatch.setattr(gpu_staging._Uploader, "copy",
                        lambda self, src, dst: (lanes.append(src.size), real(self, src, dst)))
    np.testing.assert_array_equal(cupy.asnumpy(gpu_staging.upload(pinned)), pinned)
    np.testing.assert_array_equal(cupy.asnumpy(gpu_staging.upload(pinned[:10].reshape(2, 5))), pinned[:10].reshape(2, 5))
    assert lanes == []
    np.testing.assert_array_equal(cupy.asnumpy(gpu_staging.upload(pageable)), pageable)
    assert lanes == [pageable.nbytes]


def test_page_lock_a_shared_mapping_and_add_it_on_the_device():
    """page_lock registers a shared-memory mapping with CUDA (it reads as host memory CUDA
    knows) and its unlock releases it; add_host adds a host int64 array, locked or not, to a
    device array exactly (wrapping as int64 does)."""
    import cupy

    from daskmeans.backends import cupy_backend as cb
    from daskmeans.engine import shm

    if not shm.room_for(1 << 22):
        pytest.skip("needs /dev/shm with room")
    seg = shm.Segment(f"{shm.SHM_DIR}/daskmeans-test-lock-{os.getpid()}", 1 << 18, create=True)
    try:
        seg.array[...] = np.arange(1 << 18, dtype=np.int64) * (2**50)
        unlock = cb.page_lock(seg.array)
        assert cupy.cuda.runtime.pointerGetAttributes(seg.array.ctypes.data).type == cupy.cuda.runtime.memoryTypeHost
        acc = cupy.full(1 << 18, 2**62, cupy.int64)
        cb.add_host(acc, seg.array)
        cb.add_host(acc, np.ones(1 << 18, np.int64))  # ordinary host memory too
        want = np.full(1 << 18, 2**62, np.int64)
        want += seg.array  # int64 wraps on overflow, on both sides
        want += 1
        np.testing.assert_array_equal(cupy.asnumpy(acc), want)
        unlock()
        assert cupy.cuda.runtime.pointerGetAttributes(seg.array.ctypes.data).type != cupy.cuda.runtime.memoryTypeHost
    finally:
        seg.close()


def test_queued_copy_to_the_host_and_marks():
    """to_numpy(blocking=False) only queues the copy: after wait() on a later mark the
    page-locked array holds the data; elapsed() times the work between two marks."""
    import cupy

    from daskmeans.backends import cupy_backend as cb

    a = cupy.arange(1 << 22, dtype=cupy.int64)
    out = cb.pinned(np.zeros(1 << 22, np.int64))
    m0 = cb.mark()
    b = a * 3  # some work between the marks
    host = cb.to_numpy(b, out=out, blocking=False)
    m1 = cb.mark()
    cb.wait(m1)
    assert host is out
    np.testing.assert_array_equal(out, np.arange(1 << 22, dtype=np.int64) * 3)
    assert 0 < cb.elapsed(m0, m1) < 10


def test_upload_through_page_locked_buffers_copies_every_byte(monkeypatch, tmp_path):
    """Large host arrays reach the GPU through the page-locked lanes: the same array for sizes
    around the pieces' edges, float64, a non-contiguous view and a memory map; two uploads at
    once (two threads) do not mix their buffers."""
    import threading

    import cupy

    from daskmeans.backends import cupy_backend as cb, gpu_staging

    monkeypatch.setattr(gpu_staging, "UPLOAD_PIECE_BYTES", 4096)
    monkeypatch.setattr(gpu_staging, "UPLOAD_MIN_BYTES", 4 * 4096)
    monkeypatch.setattr(gpu_staging, "_UPLOADERS", {})
    rng = np.random.default_rng(0)
    for shape, dtype in (((1023, 4), np.float32), ((1024, 4), np.float32), ((4097, 3), np.float32),
                         ((777, 5), np.float64), ((3, 5), np.float32)):
        a = rng.standard_normal(shape).astype(dtype)
        g = cb.asarray(a)
        assert g.flags.c_contiguous and g.dtype == dtype
        np.testing.assert_array_equal(cupy.asnumpy(g), a)
    v = rng.standard_normal((4000, 8)).astype(np.float32)[:, ::2]
    np.testing.assert_array_equal(cupy.asnumpy(cb.asarray(v)), v)
    np.save(tmp_path / "m.npy", v)
    m = np.load(tmp_path / "m.npy", mmap_mode="r")
    np.testing.assert_array_equal(cupy.asnumpy(cb.asarray(m)), v)
    arrays = [rng.standard_normal((5000, 7)).astype(np.float32) for _ in range(2)]
    out = [None, None]

    def go(i):
        out[i] = cupy.asnumpy(cb.asarray(arrays[i]))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, o in zip(arrays, out):
        np.testing.assert_array_equal(o, a)


def test_balanced_sizes_on_the_gpu():
    """``max_imbalance`` with CuPy data: the rows' keys are the host's bits, the moves the same
    for any chunking (bitwise centroids), and the sizes pulled toward the bound."""
    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans
    from daskmeans.numerics.hashing import row_keys

    rows = np.arange(5000, dtype=np.int64)
    np.testing.assert_array_equal(cupy.asnumpy(row_keys(cupy, cupy.asarray(rows), 9)), row_keys(np, rows, 9))
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 1, (6000, 4)), rng.normal(10, 3, (600, 4)),
                        rng.normal(-10, 3, (600, 4))]).astype(np.float32)
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=":0") as lc, Client(lc) as client:
        fits = {}
        for chunks in (2, 5):
            X = da.from_array(cupy.asarray(x), chunks=(-(-len(x) // chunks), -1), asarray=False)
            fits[chunks] = daskmeans.KMeans(24, random_state=3, max_iter=40, max_imbalance=1.5,
                                            client=client).fit(X)
        free = daskmeans.KMeans(24, random_state=3, max_iter=40, client=client).fit(X)
    bal = fits[2]
    assert bal.backend_ == "cupy" and sum(h["n_moved"] for h in bal.history_) > 0
    np.testing.assert_array_equal(fits[5].cluster_centers_, bal.cluster_centers_)
    assert [h["n_moved"] for h in fits[5].history_] == [h["n_moved"] for h in bal.history_]
    mean = len(x) / 24
    assert free.cluster_sizes_.max() / mean > 2.0  # the data is skewed
    assert bal.cluster_sizes_.max() < 0.75 * free.cluster_sizes_.max()
    assert bal.cluster_sizes_.min() > free.cluster_sizes_.min()


@pytest.mark.parametrize("on_host", [True, False])
def test_a_files_chunks_read_into_page_locked_blocks_or_onto_the_device(tmp_path, on_host, monkeypatch):
    """The reading pipeline on a GPU (engine.reading.read_blocks with the CuPy backend): the
    host tier's blocks are page-locked host arrays holding the file's rows; the device tier's
    are device arrays filled through each thread's staging buffer and copy stream, every copy
    done on return; both bitwise the rows of the file."""
    import cupy
    import zarr

    from daskmeans.backends import cupy_backend as cb
    from daskmeans.engine import reading
    from daskmeans.io import readers
    from daskmeans.io.blocks import rows_of, split_rows

    x = np.random.default_rng(2).standard_normal((20000, 33)).astype(np.float32)
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(1000, 33))
    monkeypatch.setattr("daskmeans.io.fill.PIECE_BYTES", 2 * 1000 * 33 * 4)  # several pieces a chunk
    y = split_rows(readers.read(str(tmp_path / "x.zarr")), 7000)
    offs = np.concatenate([[0], np.cumsum(y.chunks[0])]).astype(int)
    sources = [rows_of(y).chunk(int(a), int(b)) for a, b in zip(offs[:-1], offs[1:])]
    blocks = reading.read_blocks(cb, on_host, sources, 33, np.float32, 4)
    if on_host:
        for b in blocks:
            assert cupy.cuda.runtime.pointerGetAttributes(b.ctypes.data).type == cupy.cuda.runtime.memoryTypeHost
        got = np.concatenate(blocks)
    else:
        assert all(isinstance(b, cupy.ndarray) for b in blocks)
        got = np.concatenate([cupy.asnumpy(b) for b in blocks])
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("on_host", [True, False])
def test_a_csv_files_rows_parsed_into_page_locked_blocks_or_onto_the_device(tmp_path, on_host, monkeypatch):
    """A CSV file in the reading pipeline on a GPU: its pieces of whole lines parsed by the
    threads into page-locked host blocks, or into each thread's staging buffer and on to the
    device; bitwise the file's rows (float32 written with 9 digits), chunk boundaries inside
    pieces included."""
    import cupy

    from daskmeans.backends import cupy_backend as cb
    from daskmeans.engine import reading
    from daskmeans.io import readers
    from daskmeans.io.blocks import rows_of, split_rows

    x = np.random.default_rng(5).standard_normal((20000, 33)).astype(np.float32)
    np.savetxt(tmp_path / "x.csv", x, delimiter=",", fmt="%.9g")
    monkeypatch.setattr("daskmeans.io.csv_reader._PIECE_BYTES", 200_000)  # about 600 lines a piece
    y = split_rows(readers.read(str(tmp_path / "x.csv")), 7001)
    offs = np.concatenate([[0], np.cumsum(y.chunks[0])]).astype(int)
    sources = [rows_of(y).chunk(int(a), int(b)) for a, b in zip(offs[:-1], offs[1:])]
    blocks = reading.read_blocks(cb, on_host, sources, 33, np.float32, 4)
    got = np.concatenate(blocks if on_host else [cupy.asnumpy(b) for b in blocks])
    np.testing.assert_array_equal(got.view(np.uint32), x.view(np.uint32))


@pytest.mark.parametrize("tier", ["device", "host", "storage"])
def test_csv_fit_through_the_reading_pipeline_is_the_persisted_fit_on_a_gpu(tmp_path, tier):
    """A CSV fitted on a GPU worker, its rows parsed on the worker into the placement's blocks
    (no block persisted), gives the centroids, labels and iterations of the same rows placed
    by persisting the Dask array's parsed blocks, in every tier."""
    import cupy
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans
    from daskmeans.io import readers
    from daskmeans.io.blocks import rows_of

    x, C, _ = _data(30_000, 20, 12, np.float32, seed=3)
    np.savetxt(tmp_path / "x.csv", x, delimiter=",", fmt="%.9g")
    table = readers.read_table(str(tmp_path / "x.csv"), chunk_bytes=1 << 20)
    assert table.rows is not None and rows_of(table.array) is not None
    derived = table.array.map_blocks(lambda b: b, dtype=table.array.dtype)  # no RowSource: persisted
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=":0") as lc, Client(lc) as client:
        fits = [daskmeans.KMeans(12, init=C, max_iter=30, tol=0, tier=tier, client=client).fit(X)
                for X in (table, derived)]
        labels = [cupy.asnumpy(f.labels_.compute()) for f in fits]
    assert fits[0].n_iter_ == fits[1].n_iter_
    assert fits[0].cluster_centers_.tobytes() == fits[1].cluster_centers_.tobytes()
    np.testing.assert_array_equal(labels[0], labels[1])


def test_copy_in_from_several_threads():
    """cupy_backend.copy_in: copies queued from several threads (each on its own stream) into
    rows of one device array, each done once its mark is waited for."""
    import threading

    import cupy

    from daskmeans.backends import cupy_backend as cb

    dst = cupy.zeros((8, 1 << 16), cupy.float32)
    marks = [None] * 8

    def one(i):
        src = cb.empty_host((1, 1 << 16), np.float32)
        src[...] = i
        marks[i] = cb.copy_in(dst[i:i + 1], src)
        cb.wait(marks[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(cupy.asnumpy(dst), np.repeat(np.arange(8, dtype=np.float32)[:, None], 1 << 16, 1))
