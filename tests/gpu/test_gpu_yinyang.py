"""Yinyang on the GPU (run with ``pytest -m gpu`` on a CUDA host): its kernels (the array-module
versions of backends/bounds.py on CuPy, and the group bounds from GEMM tiles, cuda/group_min.cu)
against the CPU's and the float64 truth, and whole fits
bitwise equal to Lloyd's in fp32 and tf32 for K = 64, 4096 and 2^14 and several chunkings."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

STATS = ("iteration", "inertia", "shift", "reassigned", "n_empty", "imbalance", "n_moved")


@pytest.mark.parametrize("k", [64, 4096])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_cupy_bounds_hold_and_labels_are_assigns(k, precision):
    import cupy

    from daskmeans.backends import cupy_backend as cb
    from daskmeans.backends.bounds import n_groups
    from daskmeans.engine.yinyang import centroid_groups

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 40)).astype(np.float32)
    c = rng.normal(size=(k, 40))
    X = cupy.asarray(x)
    p = cb.prepare(cupy.asarray(c), X.dtype, precision)
    t = n_groups(k)
    groups = centroid_groups(cupy, p.centroids, t)
    xn = cb.row_sqnorms(X)
    _, cmax = cb.centroid_drift(p.centroids, p.centroids)
    lab, upper, lower = cb.assign_bounds(X, p, groups, t, xn, cmax)
    np.testing.assert_array_equal(cupy.asnumpy(lab), cupy.asnumpy(cb.assign(X, p, want_sums=False)["labels"]))
    cd = p.centroids.astype(cupy.float64)
    d = cupy.asnumpy(cupy.sqrt(((X.astype(cupy.float64)[:, None, :] - cd[None]) ** 2).sum(-1)))
    labh, gh = cupy.asnumpy(lab), cupy.asnumpy(groups)
    own = d[np.arange(len(x)), labh]
    assert (cupy.asnumpy(upper) >= own).all()
    d[np.arange(len(x)), labh] = np.inf
    lo = cupy.asnumpy(lower)
    for q in range(t):
        if (gh == q).any():
            assert (lo[:, q] <= d[:, gh == q].min(axis=1)).all()
    # No drift: every row certified but those near a tie.
    cand = cupy.asnumpy(cb.yinyang_filter(X, p, lab, upper, lower, xn, cupy.zeros(k), cupy.zeros(t), cmax))
    if p.small is not None:  # float64 distances' bounds: only rows within their rounding margin of a tie
        assert len(cand) <= 3
        return
    # GEMM tiles' bounds: every row whose two nearest centroids' squared distances differ by
    # more than twice the row's certified error bound (the selection's, from gemm_prep) and
    # the filter's rounding margins is certified
    from daskmeans.backends import gpu_gemm
    from daskmeans.backends.bounds import margins

    err, _, xscale, _ = gpu_gemm.row_scales(p, X)
    eb = cupy.empty(len(x), cupy.float64)
    xt = gpu_gemm.prep_buffer(len(x), x.shape[1], p.mode)
    gpu_gemm.prep(X, p.mode, 0, xt if p.mode else None, None, None, eb, err, xscale)
    eb = cupy.asnumpy(eb)
    xn2 = cupy.asnumpy(xn)
    span = 2 * np.sqrt(xn2) * cmax + cmax * cmax
    width = 2 * eb + margins(x.shape[1], np.float32)[0] * span + margins(x.shape[1], np.float64)[0] * (span + xn2)
    sure = d.min(axis=1) ** 2 - own**2 > 1.01 * width + 1e-9 * d.min(axis=1) ** 2
    assert sure.mean() > 0.5, sure.mean()  # the check is not empty
    assert not sure[cand].any(), (len(cand), int(sure[cand].sum()))


@pytest.mark.parametrize("dtype,precision,tf32_gemm,mode", [
    (np.float32, "tf32", "fp16", 4), (np.float32, "tf32", "tf32", 1), (np.float32, "bf16", "auto", 3),
    (np.float32, "fp32", "auto", 2), (np.float64, "fp32", "auto", 0)])
def test_group_bounds_from_tiles_hold_in_every_gemm_mode(dtype, precision, tf32_gemm, mode):
    """``gpu_gemm.group_lower`` (cuda/group_min.cu) on groups made by hand, in tiles of a few
    dozen to a few hundred rows (the loop's offsets): centroid 0 alone in the first group (+inf
    for the rows it owns), an empty group, groups of 7 across the tile's columns; each bound at
    most the exact distance to the group's nearest centroid but the row's own, and within the
    row's certified error bound (twice, squared) and the rounding margins of it."""
    import cupy
    import dask

    from daskmeans.backends import cupy_backend as cb
    from daskmeans.backends import gpu_gemm
    from daskmeans.backends.bounds import margins

    rng = np.random.default_rng(3)
    n, d, k = 2000, 24, 3000
    c = rng.normal(size=(k, d))
    x = rng.normal(size=(n, d))
    x[:50] = c[0] + 0.01 * rng.normal(size=(50, d))  # rows of centroid 0
    x = x.astype(dtype)
    X = cupy.asarray(x)
    with dask.config.set({"daskmeans.gpu-tf32-gemm": tf32_gemm, "daskmeans.gpu-tile-bytes": "1MiB",
                          "daskmeans.gpu-tile-bytes-max": "1MiB"}):
        p = cb.prepare(cupy.asarray(c), dtype, precision)
    assert p.small is None and p.mode == mode
    assert gpu_gemm.tile_rows(p, n) < n / 4
    sizes = [1, 0] + [7] * ((k - 1) // 7) + ([(k - 1) % 7] if (k - 1) % 7 else [])
    t = len(sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    lab = cb.assign(X, p, want_sums=False)["labels"]
    xn = cb.row_sqnorms(X)
    _, cmax = cb.centroid_drift(p.centroids, p.centroids)
    rel, delta = margins(d, np.float64)
    lower = cupy.empty((n, t), cupy.float64)
    gpu_gemm.group_lower(X, p, cupy.asarray(starts), t, lab, xn, cmax, lower, rel, delta)
    lo, labh = cupy.asnumpy(lower), cupy.asnumpy(lab)
    assert (labh[:50] == 0).all()
    cd = p.centroids.astype(cupy.float64)
    dist = cupy.asnumpy(cupy.sqrt(((X.astype(cupy.float64)[:, None, :] - cd[None]) ** 2).sum(-1)))
    dist[np.arange(n), labh] = np.inf
    truth = np.stack([dist[:, a:b].min(axis=1) if b > a else np.full(n, np.inf)
                      for a, b in zip(starts[:-1], starts[1:])], axis=1)
    assert np.isinf(truth[:50, 0]).all() and np.isfinite(truth[50:, 0]).all() and np.isinf(truth[:, 1]).all()
    np.testing.assert_array_equal(np.isinf(lo), np.isinf(truth))
    fin = np.isfinite(truth)
    assert (lo[fin] <= truth[fin]).all()
    err, _, xscale, _ = gpu_gemm.row_scales(p, X)
    eb = cupy.empty(n, cupy.float64)
    xt = gpu_gemm.prep_buffer(n, d, p.mode)
    gpu_gemm.prep(X, p.mode, 0, xt if p.mode else None, None, None, eb, err, xscale)
    xn2 = cupy.asnumpy(xn)[:, None]
    slack = 1.01 * (2 * cupy.asnumpy(eb)[:, None] + rel * (2 * np.sqrt(xn2) * cmax + cmax * cmax + xn2))
    assert (lo[fin] ** 2 >= ((truth**2 - slack) * (1 - 4 * delta))[fin] - 1e-12).all()


@pytest.mark.parametrize("weighted", [False, True])
def test_cupy_label_sums_are_assigns_integers(weighted):
    import cupy

    from daskmeans.backends import cupy_backend as cb
    from daskmeans.numerics.grid import Grid

    rng = np.random.default_rng(1)
    x = rng.normal(size=(5000, 17)).astype(np.float32)
    w = rng.uniform(0.5, 2, len(x)) if weighted else None
    X, W = cupy.asarray(x), None if w is None else cupy.asarray(w)
    g = Grid(np.abs(x).max(axis=0), len(x) if w is None else w.sum())
    p = cb.prepare(cupy.asarray(rng.normal(size=(300, 17))), X.dtype)
    out = cb.assign(X, p, W, grid=g)
    sums, weights, counts = cupy.zeros((300, 17), cupy.int64), cupy.zeros(300, cupy.int64), cupy.zeros(300, cupy.int64)
    cb.add_label_sums(X, out["labels"], W, 1, g, sums, weights, counts)
    np.testing.assert_array_equal(cupy.asnumpy(sums), cupy.asnumpy(out["sums"]))
    np.testing.assert_array_equal(cupy.asnumpy(counts), cupy.asnumpy(out["counts"]))
    if weighted:
        np.testing.assert_array_equal(cupy.asnumpy(weights), cupy.asnumpy(out["weights"]))


def _set_rule(values):
    from daskmeans.engine import yinyang as module

    old = (module.BOUND_START, module.ABANDON)
    module.BOUND_START, module.ABANDON = values
    return old


@pytest.mark.parametrize("rule", ["default", "always"])
@pytest.mark.parametrize("k", [64, 4096, 1 << 14])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_yinyang_fit_is_lloyds_bits_on_the_gpu(k, precision, rule):
    """Centroids, labels, iteration count and the history's statistics bitwise Lloyd's, in two
    chunkings; the inertia to float atomics' reproducibility (Lloyd's own on the GPU). "always":
    the bounds from the second step on and never dropped (every step after the first through
    the bounded path)."""
    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import daskmeans

    rng = np.random.default_rng(5)
    n, d = 120_000, 64
    x = rng.standard_normal((n, d), dtype=np.float32)
    init = x[:k].astype(np.float64)
    with LocalCUDACluster(dashboard_address=":0") as lc, Client(lc) as client:
        if rule == "always":
            client.run(_set_rule, (1.0, float("inf")))
        for chunks in (n, 17_000):
            X = da.from_array(cupy.asarray(x), chunks=(chunks, d), asarray=False)
            fits = [daskmeans.KMeans(k, init=init, n_init=1, max_iter=12, tol=0, precision=precision,
                                     algorithm=alg, client=client).fit(X) for alg in ("lloyd", "yinyang")]
            a, b = fits
            assert a.backend_ == "cupy"
            np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
            np.testing.assert_array_equal(cupy.asnumpy(a.labels_.compute()), cupy.asnumpy(b.labels_.compute()))
            assert a.n_iter_ == b.n_iter_
            assert [[h[s] for s in STATS if s != "inertia"] for h in a.history_] == \
                [[h[s] for s in STATS if s != "inertia"] for h in b.history_]
            for ha, hb in zip(a.history_, b.history_):
                assert hb["inertia"] == pytest.approx(ha["inertia"], rel=1e-9)
            assert b.inertia_ == pytest.approx(a.inertia_, rel=1e-9)
