"""The NumPy kernels of :mod:`daskmeans.backends.numpy_backend` against hand-computed values and a
plain float64 NumPy reference."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from daskmeans.backends import get_backend
from daskmeans.backends import numpy_backend as nb
from daskmeans.numerics.grid import Grid, float_sums

# Tilings of the kernel: default tiles, tiny tiles ((K + D) * itemsize > tile-bytes, so 64-row
# tiles), and tiles of a row count that divides nothing (1000 rows of K + D = 7 float64 values).
REGIMES = {
    "default": {},
    "tiny-tiles": {"daskmeans.tile-bytes": 256},
    "odd-tiles": {"daskmeans.tile-bytes": 1000 * 8 * 7},
}


def reference(X, C, w=None):
    """Plain float64 nearest-centroid assignment by broadcasting (first index on ties)."""
    X = np.asarray(X, np.float64)
    C = np.asarray(C, np.float64)
    d2 = ((X[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)
    lab = d2.argmin(axis=1)
    mind = d2[np.arange(len(X)), lab]
    k, d = C.shape
    ww = np.ones(len(X)) if w is None else np.asarray(w, np.float64)
    sums = np.zeros((k, d))
    np.add.at(sums, lab, X * ww[:, None])
    return {
        "labels": lab,
        "sqdist": mind,
        "d2": d2,
        "inertia": float(mind @ ww),
        "sums": sums,
        "weights": np.bincount(lab, weights=ww, minlength=k),
        "counts": np.bincount(lab, minlength=k),
    }


# ---------------------------------------------------------------- hand-computed toy case


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("regime", ["default", "tiny-tiles", "odd-tiles"])
def test_toy_1d_exact(dtype, regime):
    X = np.array([[0.0], [1.0], [10.0], [11.0]], dtype=dtype)
    C = np.array([[0.5], [10.5]])
    with dask.config.set(REGIMES[regime]):
        out = nb.assign(X, nb.prepare(C, dtype))
    assert out["labels"].dtype == np.int32
    np.testing.assert_array_equal(out["labels"], [0, 0, 1, 1])
    assert out["sums"].dtype == np.int64  # on the grid (numerics.grid)
    np.testing.assert_array_equal(float_sums(out)[0], [[1.0], [21.0]])
    assert out["counts"].dtype == np.int64
    np.testing.assert_array_equal(out["counts"], [2, 2])
    assert out["weights"].dtype == np.int64
    np.testing.assert_array_equal(float_sums(out)[1], [2.0, 2.0])
    # every point is 0.5 away from its centroid: 4 * 0.25 (all exact in binary floating point)
    assert out["inertia"] == 1.0


def test_toy_1d_weighted_exact():
    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    C = np.array([[0.5], [10.5]])
    w = np.array([1.0, 3.0, 0.5, 2.0])
    out = nb.assign(X, nb.prepare(C, X.dtype), w)
    np.testing.assert_array_equal(out["labels"], [0, 0, 1, 1])
    np.testing.assert_array_equal(float_sums(out)[0], [[3.0], [27.0]])
    np.testing.assert_array_equal(float_sums(out)[1], [4.0, 2.5])
    np.testing.assert_array_equal(out["counts"], [2, 2])  # counts stay unweighted
    assert out["inertia"] == 0.25 * (1.0 + 3.0 + 0.5 + 2.0)


def test_toy_min_sqdist_and_sqdistances_exact():
    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    p = nb.prepare(np.array([[0.5], [10.5]]), X.dtype)
    lab, d2 = nb.min_sqdist(X, p)
    assert lab.dtype == np.int32 and d2.dtype == np.float64
    np.testing.assert_array_equal(lab, [0, 0, 1, 1])
    np.testing.assert_array_equal(d2, [0.25] * 4)
    full = nb.sqdistances(X, p)
    assert full.dtype == np.float64
    np.testing.assert_array_equal(full, [[0.25, 110.25], [0.25, 90.25], [90.25, 0.25], [110.25, 0.25]])


def test_want_sums_false_returns_no_sums():
    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    out = nb.assign(X, nb.prepare(np.array([[0.5], [10.5]]), X.dtype), want_sums=False)
    assert set(out) == {"labels", "inertia", "reassigned", "rechecked"}
    np.testing.assert_array_equal(out["labels"], [0, 0, 1, 1])
    assert out["inertia"] == 1.0
    assert out["reassigned"] == 4 and out["rechecked"] == 0  # no previous labels: all rows count


def test_reassigned_counts_changed_labels_in_place():
    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    prev = np.array([0, 1, 1, 0], np.int32)
    out = nb.assign(X, nb.prepare(np.array([[0.5], [10.5]]), X.dtype), prev_labels=prev, out_labels=prev)
    assert out["reassigned"] == 2
    assert out["labels"] is prev
    np.testing.assert_array_equal(prev, [0, 0, 1, 1])


# ---------------------------------------------------------------- ties


@pytest.mark.parametrize("regime", ["default", "tiny-tiles"])
def test_ties_go_to_lowest_index(regime):
    # 5 is exactly 1 away from 4 and from 6; 0 is exactly 1 away from -1 and 1
    X = np.array([[5.0], [0.0], [5.0]])
    C = np.array([[6.0], [4.0], [-1.0], [1.0]])
    with dask.config.set(REGIMES[regime]):
        out = nb.assign(X, nb.prepare(C, X.dtype))
        lab, _ = nb.min_sqdist(X, nb.prepare(C, X.dtype))
    np.testing.assert_array_equal(out["labels"], [0, 2, 0])
    np.testing.assert_array_equal(lab, [0, 2, 0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_argmin_is_numpys_on_ties_and_nans(dtype):
    """The compiled pass's own argmin (``cpu_kernels.tile_stats`` given ``||c||^2``, up to
    ``OWN_ARGMIN_MAX_K`` centroids) gives NumPy's ``argmin`` of ``g + ||c||^2``: the lowest
    index on ties, and the first NaN of a row that holds one, wherever it is (a tie is
    re-ranked by its exact distances, here every centroid's the same: the lowest index)."""
    from daskmeans.backends import cpu_kernels

    nan = np.nan
    g = np.array([[1, 0, 0, 2, 3], [nan, 0, 1, 1, 1], [3, 2, nan, 0, nan], [1, 1, 1, 1, 1], [4, 3, 2, 1, 0],
                  [2, nan, nan, -1, 0], [0, 1, 2, 3, nan], [5, 4, 4, 3, 3], [2, 1, 1, 0, 1]], dtype)
    sqnorm = np.array([0, 1, 0, 1, 0], dtype)
    n, k = g.shape
    out = np.full(n, -1, np.int32)
    none64, nonei = np.zeros(0), np.zeros(0, np.int64)
    cpu_kernels.tile_stats(g, sqnorm, np.zeros(n, np.intp), np.zeros((n, 1), dtype), None, None, out, np.zeros(1),
                           0.0, np.zeros((0, 1), np.int64), nonei, nonei, False, 0.0, np.zeros((0, 1)), none64, 0.0,
                           none64, False, 0.0, nonei, np.zeros((k, 1), dtype), 0.0, 0.0)
    np.testing.assert_array_equal(out, (g + sqnorm).argmin(axis=1))
    np.testing.assert_array_equal(out, [2, 0, 2, 0, 4, 1, 4, 4, 2])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("regime", ["default", "tiny-tiles", "odd-tiles"])
def test_duplicate_centroids_never_win(dtype, regime):
    """With every centroid duplicated at a higher index, labels stay in the first copy."""
    rng = np.random.default_rng(3)
    X = rng.integers(-8, 8, size=(500, 3)).astype(dtype)
    C0 = rng.integers(-8, 8, size=(6, 3)).astype(np.float64)
    C = np.concatenate([C0, C0])
    with dask.config.set(REGIMES[regime]):
        out = nb.assign(X, nb.prepare(C, dtype))
    assert out["labels"].max() < 6
    np.testing.assert_array_equal(out["counts"][6:], 0)
    np.testing.assert_array_equal(out["labels"], reference(X, C0)["labels"])


# ---------------------------------------------------------------- float64 reference equivalence

SHAPES = [
    # (n, d, k)
    (1, 1, 1),
    (17, 3, 1),
    (257, 5, 2),
    (1000, 7, 9),
    (1000, 13, 50),
    (333, 1, 300),
    (700, 6, 130),
]


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("n,d,k", SHAPES)
def test_assign_matches_float64_reference(n, d, k, regime):
    rng = np.random.default_rng(n * 1000 + d * 10 + k)
    X = rng.standard_normal((n, d)) * 3 + rng.uniform(-5, 5, size=d)
    C = X[rng.choice(n, size=k, replace=True)] + rng.standard_normal((k, d)) * 0.1
    ref = reference(X, C)
    with dask.config.set(REGIMES[regime]):
        p = nb.prepare(C, X.dtype)
        out = nb.assign(X, p)
        lab, d2 = nb.min_sqdist(X, p)
        full = nb.sqdistances(X, p)
    np.testing.assert_array_equal(out["labels"], ref["labels"])
    np.testing.assert_array_equal(lab, ref["labels"])
    np.testing.assert_array_equal(out["counts"], ref["counts"])
    np.testing.assert_array_equal(float_sums(out)[1], ref["counts"].astype(np.float64))
    np.testing.assert_allclose(float_sums(out)[0], ref["sums"], rtol=1e-12, atol=1e-9)
    assert out["inertia"] == pytest.approx(ref["inertia"], rel=1e-10, abs=1e-9)
    np.testing.assert_allclose(d2, ref["sqdist"], rtol=1e-9, atol=1e-9)
    assert full.shape == (n, k)
    np.testing.assert_allclose(full, ref["d2"], rtol=1e-9, atol=1e-9)
    assert (d2 >= 0).all() and (full >= 0).all()


@pytest.mark.parametrize("regime", ["default", "tiny-tiles", "odd-tiles"])
@pytest.mark.parametrize("n,d,k", [(1000, 7, 9), (700, 6, 130), (50, 3, 1)])
def test_assign_weighted_matches_reference(n, d, k, regime):
    rng = np.random.default_rng(k)
    X = rng.standard_normal((n, d))
    C = X[rng.choice(n, size=k, replace=False)]
    w = rng.uniform(0, 4, size=n)
    w[::7] = 0.0  # zero weights are allowed
    ref = reference(X, C, w)
    with dask.config.set(REGIMES[regime]):
        out = nb.assign(X, nb.prepare(C, X.dtype), w)
    np.testing.assert_array_equal(out["labels"], ref["labels"])
    np.testing.assert_array_equal(out["counts"], ref["counts"])
    np.testing.assert_allclose(float_sums(out)[1], ref["weights"], rtol=1e-12)
    np.testing.assert_allclose(float_sums(out)[0], ref["sums"], rtol=1e-12, atol=1e-9)
    assert out["inertia"] == pytest.approx(ref["inertia"], rel=1e-10)


@pytest.mark.parametrize("regime", ["default", "tiny-tiles", "odd-tiles"])
def test_float32_close_to_reference(regime):
    """float32 data: sums and inertia accumulate in float64; labels are optimal to float32
    rounding (a different label only where the two distances are within rounding)."""
    rng = np.random.default_rng(11)
    X64 = rng.standard_normal((2000, 5))
    X = X64.astype(np.float32)
    C = X64[rng.choice(2000, size=20, replace=False)]
    ref = reference(X.astype(np.float64), C.astype(np.float32).astype(np.float64))
    with dask.config.set(REGIMES[regime]):
        out = nb.assign(X, nb.prepare(C, np.float32))
    assert out["sums"].dtype == np.int64  # on the grid (numerics.grid)
    chosen = ref["d2"][np.arange(len(X)), out["labels"]]
    np.testing.assert_allclose(chosen, ref["sqdist"], rtol=1e-4, atol=1e-4)
    assert (out["labels"] == ref["labels"]).mean() > 0.99
    # sums are of the kernel's own labels: recompute the reference with those
    sums = np.zeros((20, 5))
    np.add.at(sums, out["labels"], X.astype(np.float64))
    np.testing.assert_allclose(float_sums(out)[0], sums, rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(out["counts"], np.bincount(out["labels"], minlength=20))
    assert out["inertia"] == pytest.approx(float(chosen.sum()), rel=1e-4)


def test_point_on_centroid_has_nonnegative_distance():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 4)) * 1e3
    p = nb.prepare(X[:10], X.dtype)
    lab, d2 = nb.min_sqdist(X, p)
    np.testing.assert_array_equal(lab[:10], np.arange(10))
    assert (d2 >= 0).all()
    assert (d2[:10] < 1e-6).all()
    assert (nb.sqdistances(X, p) >= 0).all()


def test_prepare_casts_to_data_dtype():
    C = np.arange(6, dtype=np.float64).reshape(3, 2)
    p = nb.prepare(C, np.float32)
    assert p.centroids.dtype == np.float32 and p.neg2_ct.dtype == np.float32 and p.sqnorm.dtype == np.float32
    assert p.k == 3
    np.testing.assert_array_equal(p.neg2_ct, -2 * C.T)
    np.testing.assert_array_equal(p.sqnorm, [1.0, 13.0, 41.0])
    assert p.neg2_ct.flags.c_contiguous


def test_get_backend_dispatch():
    assert get_backend("numpy") is nb
    assert get_backend("cpu") is nb
    assert get_backend(np.zeros(3)) is nb
    import dask.array as da

    assert get_backend(da.zeros((4, 2), chunks=2)) is nb
    with pytest.raises(ValueError, match="backend='tpu'"):
        get_backend("tpu")


@pytest.mark.gpu
def test_cupy_assign_matches_numpy():
    import cupy

    from daskmeans.backends import cupy_backend as cb

    rng = np.random.default_rng(5)
    X = rng.standard_normal((3000, 7))
    C = X[:25]
    w = rng.uniform(0, 2, size=3000)
    grid = Grid(np.abs(X).max(axis=0), w.sum())
    ref = nb.assign(X, nb.prepare(C, X.dtype), w, grid=grid)
    out = cb.assign(cupy.asarray(X), cb.prepare(C, X.dtype), cupy.asarray(w), grid=grid)
    np.testing.assert_array_equal(cb.to_numpy(out["labels"]), ref["labels"])
    # The same integers: the backends round each w x alike.
    np.testing.assert_array_equal(cb.to_numpy(out["sums"]), ref["sums"])
    np.testing.assert_array_equal(cb.to_numpy(out["weights"]), ref["weights"])
    np.testing.assert_array_equal(cb.to_numpy(out["counts"]), ref["counts"])
    assert float(out["inertia"]) == pytest.approx(ref["inertia"], rel=1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_result_independent_of_tiling(dtype):
    """Sums accumulate row by row in row order: any tiling gives the same labels and the same
    bits of the sums. The inertia adds each row's GEMM output, whose last bit BLAS may round
    differently for a different tile height (seen in float32), so it agrees to rounding."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((3001, 11)).astype(dtype)
    C = X[rng.choice(3001, size=40, replace=False)].astype(np.float64)
    w = rng.uniform(0.5, 2, size=3001).astype(dtype)
    outs = []
    for regime in REGIMES.values():
        with dask.config.set(regime):
            outs.append(nb.assign(X, nb.prepare(C, dtype), w))
    for o in outs[1:]:
        for key in ("labels", "sums", "weights", "counts"):
            np.testing.assert_array_equal(o[key], outs[0][key])
        # float32 GEMM rounding per row is ~1e-7 of ||x||^2 + ||c||^2
        assert o["inertia"] == pytest.approx(outs[0]["inertia"], rel=1e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d, k", [(100, 4), (100, 8), (7, 3), (130, 40), (100, 300), (16, 70)])
def test_a_rows_distances_do_not_depend_on_where_its_block_ends(dtype, d, k):
    """BLAS picks its kernel by the product's shape (OpenBLAS's AVX-512 build: a small-matrix
    kernel up to 1e6 products, its packed kernel beyond, a GEMV for one row), and the kernels
    round a row's dot products differently: a block's last, shorter tile gave its rows other
    bits than a whole tile would (float32 at D = 100, K = 4; float64 at K = 300), so near a tie
    a row's label depended on the chunking. Every tile's GEMM now has one shape."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(1)
    X = rng.standard_normal((6000, d)).astype(dtype)
    p = nb.prepare(rng.standard_normal((k, d)), dtype)
    step = nb._tile_rows(k, d, X.dtype.itemsize, p.tile_bytes)
    assert step % nb.TILE_ROWS_ALIGN == 0
    with threadpool_limits(1, "blas"):  # as on a worker
        whole = nb.sqdistances(X, p)
        labels, d2 = nb.min_sqdist(X, p)
        for end in (1, 2, 65, step - 1, step + 1, 2 * step + 7, 5999):
            np.testing.assert_array_equal(nb.sqdistances(X[:end], p), whole[:end], err_msg=f"end={end}")
            got = nb.min_sqdist(X[:end], p)
            np.testing.assert_array_equal(got[0], labels[:end])
            np.testing.assert_array_equal(got[1], d2[:end])


@pytest.mark.parametrize("far", [0, 70])
def test_a_tie_in_the_gemm_takes_the_exact_nearest_centroid(far):
    """Hand-computed: a row at x = 1e-9 (float32) between centroids -1 and 1 computes
    ``||c||^2 - 2 x.c = 1 + 2e-9`` and ``1 - 2e-9``, both 1.0 in float32: the GEMM ties and its
    argmin says 0, yet the row is nearer 1. The tie is within the GEMM's error bound, so the row
    is re-ranked by its float64 distances and takes 1, in the compiled pass's own argmin and
    (``far`` centroids more, K > OWN_ARGMIN_MAX_K) after NumPy's; ``min_sqdist`` gives the same
    label and ``(1 - 1e-9)^2`` computed in float64."""
    x = np.array([[1e-9], [0.5], [-3.0]], np.float32)
    C = np.concatenate([[[-1.0], [1.0]], 100.0 + np.arange(far)[:, None]])
    p = nb.prepare(C, np.float32)
    assert ((p.sqnorm[:2] - 2 * x[0, 0] * C[:2, 0].astype(np.float32)) == 1.0).all()  # the float32 tie
    out = nb.assign(x, p)
    np.testing.assert_array_equal(out["labels"], [1, 1, 0])
    assert out["rechecked"] == 1
    lab, d2 = nb.min_sqdist(x, p)
    np.testing.assert_array_equal(lab, [1, 1, 0])
    x64 = np.float64(x[0, 0])
    assert d2[0] == (x64 - 1.0) * (x64 - 1.0) and d2[0] < (x64 + 1.0) * (x64 + 1.0)


def _near_ties(rng, n, d, k, dtype):
    """Rows within about 1e-6 (relative) of the midpoint of two of K centroids: ties within
    float32's rounding of the GEMM."""
    C = rng.standard_normal((k, d)) * 3
    a, b = rng.integers(0, k, n), rng.integers(0, k, n)
    b = np.where(a == b, (b + 1) % k, b)
    t = 0.5 + rng.standard_normal(n)[:, None] * 1e-6
    return (C[a] * t + C[b] * (1 - t) + rng.standard_normal((n, d)) * 1e-3).astype(dtype), C


@pytest.mark.parametrize("d, k", [(100, 4), (30, 40), (100, 300), (64, 1400)])
def test_labels_near_ties_are_the_exact_distances_argmin(d, k):
    """Rows at near-ties in float32: ``assign``'s and ``min_sqdist``'s labels are the argmin of
    the exact distances (long double), the lowest index on ties, where the GEMM's float32
    argmin mislabelled 1-4 rows in 3000 of these; the uncertain rows are counted."""
    rng = np.random.default_rng(d * 7 + k)
    X, C = _near_ties(rng, 3000, d, k, np.float32)
    ref = ((X.astype(np.longdouble)[:, None, :] - C.astype(np.float32).astype(np.longdouble)[None]) ** 2).sum(-1)
    p = nb.prepare(C, np.float32)
    out = nb.assign(X, p)
    np.testing.assert_array_equal(out["labels"], ref.argmin(1))
    np.testing.assert_array_equal(nb.min_sqdist(X, p)[0], ref.argmin(1))
    assert 0 < out["rechecked"] < len(X)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d, k, tile_rows", [(100, 300, 0), (100, 300, 128), (100, 300, 192), (30, 40, 128),
                                              (30, 40, 192), (64, 1400, 0), (100, 4, 0)])
def test_labels_and_distances_do_not_depend_on_a_rows_place_in_its_tile(dtype, d, k, tile_rows):
    """OpenBLAS rounds a row's products differently at another offset in a tile (tiles of 128 or
    192 rows; in float64 at D = 100, K = 300 most heights): the same rows shifted by 1, 64 and
    200 rows give the same certified labels, the same ``min_sqdist`` labels and the same
    distances, bit for bit (before, ``min_sqdist``'s distances came from the GEMM and differed
    in float64 at K = 300)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(d * 7 + k)
    X, C = _near_ties(rng, 3000, d, k, dtype)
    setting = {"daskmeans.tile-bytes": tile_rows * (k + d) * np.dtype(dtype).itemsize} if tile_rows else {}
    with dask.config.set(setting), threadpool_limits(1, "blas"):  # as on a worker
        p = nb.prepare(C, dtype)
        assert not tile_rows or nb._tile_rows(k, d, np.dtype(dtype).itemsize, p.tile_bytes) == tile_rows
        labels = nb.assign(X, p, want_sums=False)["labels"]
        lab, d2 = nb.min_sqdist(X, p)
        for shift in (1, 64, 200):
            Y = np.concatenate([X[:shift], X])
            np.testing.assert_array_equal(nb.assign(Y, p, want_sums=False)["labels"][shift:], labels)
            got = nb.min_sqdist(Y, p)
            np.testing.assert_array_equal(got[0][shift:], lab)
            np.testing.assert_array_equal(got[1][shift:], d2, err_msg=f"shift={shift}")
    np.testing.assert_array_equal(lab, labels)


def test_small_k_tiles_keep_the_gemm_small():
    """At small K * D a tile holds no more rows than keep its GEMM within SMALL_GEMM_MNK
    products (where that leaves SMALL_GEMM_MIN_ROWS), in whole TILE_ROWS_ALIGN rows."""
    assert nb._tile_rows(4, 100, 4, 1 << 20) == 2496  # 1e6 // 400 = 2500, down to 64s
    assert nb._tile_rows(8, 100, 4, 1 << 20) == 1216
    assert nb._tile_rows(16, 100, 4, 1 << 20) == 2240  # 625 rows would be too few: 1 MiB // 464
    assert nb._tile_rows(2, 100, 4, 1 << 20) == 2560  # 1 MiB // 408 = 2570 is below 1e6 // 200
    assert nb._tile_rows(40000, 200, 8, 1 << 20) == 64


@pytest.mark.parametrize("total", [100.0, 2048.0, 6000.0, 1e6])
@pytest.mark.parametrize("weighted", [False, True])
def test_sums_exact_at_the_grids_bound(total, weighted):
    """Values at the grid's bound (every row at the largest absolute value, a few clusters) add
    to the exact integers of ``Grid.on_grid``: through float64 windows flushed at the bound's
    weight (a flush every few rows for a small total weight), and straight to int64 where a
    row alone exceeds a window (a total weight under 2**11)."""
    rng = np.random.default_rng(int(total))
    n, d, k = 700, 5, 3
    X = rng.choice([-1.0, 1.0], size=(n, d)) * np.array([3.0, 1e-3, 7.5, 1e6, 0.25])
    w = rng.uniform(0.25, 1.0, n) * (total / n / 0.625) if weighted else None
    grid = Grid(np.abs(X).max(axis=0), total)
    C = X[:k] * 0.5
    out = nb.assign(X, nb.prepare(C, X.dtype), w, grid=grid)
    ref = np.zeros((k, d), dtype=object)
    for i in range(n):
        v, _ = grid.on_grid(X[i], 1.0 if w is None else w[i])
        ref[out["labels"][i]] += np.array([int(a) for a in v], dtype=object)
    assert [[int(a) for a in r] for r in out["sums"]] == [[int(a) for a in r] for r in ref]


@pytest.mark.parametrize("k", [3, 40])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kept_row_norms_give_the_same_bits(k, dtype):
    """``row_norms`` filled by one pass and read by the next: the labels, sums and inertia are
    the bits of a pass that computes them (K below and above the compiled argmin's limit)."""
    rng = np.random.default_rng(k)
    X = rng.standard_normal((5003, 13)).astype(dtype)
    C = X[:k].astype(np.float64) + 0.1
    w = rng.uniform(0.5, 2, size=5003)
    for weights in (None, w):
        p = nb.prepare(C, dtype)
        plain = nb.assign(X, p, weights)
        norms = nb.row_norms(len(X))
        assert not norms.known
        first = nb.assign(X, p, weights, row_norms=norms)
        assert norms.known
        second = nb.assign(X, p, weights, row_norms=norms)
        labels_only = nb.assign(X, p, weights, want_sums=False, row_norms=norms)
        for o in (first, second):
            for key in ("labels", "sums", "weights", "counts"):
                np.testing.assert_array_equal(o[key], plain[key])
            assert o["inertia"] == plain["inertia"]
        np.testing.assert_array_equal(labels_only["labels"], plain["labels"])
        assert labels_only["inertia"] == plain["inertia"]
    with pytest.raises(ValueError, match="holds 5003 rows; the block has 10"):
        nb.assign(X[:10], nb.prepare(C, dtype), row_norms=norms)


# ---------------------------------------------------------------- moments


def test_toy_moments_exact():
    X = np.array([[1.0, 10.0], [3.0, -12.0], [-5.0, 10.0]], np.float32)
    mean, m2, max_abs, bad = nb.moments(X)
    np.testing.assert_array_equal(mean, [-1 / 3, 8 / 3])
    # deviations (4/3, 10/3, -14/3) and (22/3, -44/3, 22/3), squared and summed
    np.testing.assert_allclose(m2, [312 / 9, 2904 / 9], rtol=1e-15)
    np.testing.assert_array_equal(max_abs, [5.0, 12.0])
    assert bad is None


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_moments_match_float64_reference(dtype):
    rng = np.random.default_rng(9)
    X = (rng.standard_normal((5003, 7)) * rng.uniform(0.1, 100, 7) + rng.uniform(-1e4, 1e4, 7)).astype(dtype)
    mean, m2, max_abs, bad = nb.moments(X)
    X64 = X.astype(np.float64)
    np.testing.assert_allclose(mean, X64.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(m2, ((X64 - X64.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-9)
    np.testing.assert_array_equal(max_abs, np.abs(X64).max(axis=0))
    assert bad is None


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_moments_report_first_non_finite_row(value):
    X = np.ones((100, 3), np.float32)
    X[37, 2] = value
    X[60, 0] = value
    assert nb.moments(X)[3] == 37


def test_moments_overflow_is_a_data_error():
    from daskmeans.errors import DataError

    X = np.full((4, 2), 1e308)
    with pytest.raises(DataError, match="too large to average in float64"):
        nb.moments(X)


def test_compiled_kernels_are_cached_outside_the_package(tmp_path):
    """Nothing is written into the installed package at run time: Numba's cache goes to the
    user's cache folder."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import daskmeans

    pkg = Path(daskmeans.__file__).parent

    def cached():
        return sorted(str(p) for p in pkg.rglob("*") if p.suffix in (".nbi", ".nbc"))

    before = cached()
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = ("import numpy as np; from daskmeans.backends import numpy_backend as be; "
            "x = np.random.default_rng(0).normal(size=(500, 4)).astype(np.float32); "
            "print(be.moments(x)[3])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert cached() == before
    assert list((tmp_path / "daskmeans" / "numba").rglob("*.nbi")), "the kernels were cached in the user's cache"
