"""Yinyang's bound kernels by hand, and the array-module versions (backends/bounds.py, the
GPU's) against the CPU's compiled ones."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans.backends import bounds
from daskmeans.backends import numpy_backend as nb
from daskmeans.numerics.grid import Grid

X4 = np.array([[0.0], [1.0], [10.0], [11.0]])
C2 = np.array([[0.5], [10.5]])
GROUPS2 = np.array([0, 1], np.int32)  # each centroid its own group


def _bounds(X, C, groups, t):
    p = nb.prepare(C, X.dtype)
    xnorm = nb.row_sqnorms(X)
    _, cmax = nb.centroid_drift(p.centroids, p.centroids)
    return p, xnorm, nb.assign_bounds(X, p, groups, t, xnorm, cmax)


def test_bounds_by_hand():
    p, xnorm, (lab, upper, lower) = _bounds(X4, C2, GROUPS2, 2)
    np.testing.assert_array_equal(lab, [0, 0, 1, 1])
    np.testing.assert_allclose(upper, [0.5] * 4, rtol=1e-12)
    assert (upper >= 0.5).all()  # rounded up
    # A row's own group holds no other centroid; the other group's bound is the distance to
    # its centroid (rounded down by the margin).
    assert np.isinf(lower[[0, 1], 0]).all() and np.isinf(lower[[2, 3], 1]).all()
    np.testing.assert_allclose(lower[:, 1][:2], [10.5, 9.5], rtol=1e-9)
    np.testing.assert_allclose(lower[:, 0][2:], [9.5, 10.5], rtol=1e-9)
    assert (lower[:2, 1] <= [10.5, 9.5]).all() and (lower[2:, 0] <= [9.5, 10.5]).all()


@pytest.mark.parametrize("impl", ["compiled", "array-module"])
def test_filter_skips_the_rows_the_drift_cannot_reach(impl):
    """Centroid 1 moves from 10.5 to 1.2 (drift 9.3): row 1 (x = 1, at 0.5 from its centroid)
    is the only row whose bound can no longer certify its label (0.2 from the moved centroid);
    rows 2 and 3 tighten their upper bound to their distance (8.8, 9.8) and stay below 9.5 and
    10.5; row 0's group bound 10.5 - 9.3 = 1.2 still exceeds its 0.5."""
    _, xnorm, (lab, upper, lower) = _bounds(X4, C2, GROUPS2, 2)
    new = nb.prepare(np.array([[0.5], [1.2]]), X4.dtype)
    drift, cmax = nb.centroid_drift(nb.prepare(C2, X4.dtype).centroids, new.centroids)
    np.testing.assert_allclose(drift, [0.0, 9.3], rtol=1e-12)
    gdrift = drift.copy()  # one centroid per group
    if impl == "compiled":
        cand = nb.yinyang_filter(X4, new, lab, upper, lower, xnorm, drift, gdrift, cmax)
    else:
        cand = bounds.yinyang_filter(np, X4, new.centroids, lab, upper, lower, xnorm, drift, gdrift, cmax)
    np.testing.assert_array_equal(cand, [1])
    np.testing.assert_allclose(upper[[2, 3]], [8.8, 9.8], rtol=1e-12)
    # The moved bounds stay below the true distances.
    true = np.abs(X4 - new.centroids[:, 0][None, :])
    assert lower[0, 1] <= true[0, 1] and lower[2, 0] <= true[2, 0] and lower[3, 0] <= true[3, 0]
    # Row 1's label does change: the full assignment of the rows left takes it to centroid 1.
    lab1, _, _ = nb.assign_bounds(X4[cand], new, GROUPS2, 2, xnorm[cand], cmax)
    assert lab1.tolist() == [1]


def test_no_drift_certifies_every_row():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 3)).astype(np.float32)
    c = rng.normal(size=(20, 3))
    groups = np.arange(20, dtype=np.int32) % 4
    p, xnorm, (lab, upper, lower) = _bounds(x, c, groups, 4)
    drift, cmax = nb.centroid_drift(p.centroids, p.centroids)
    cand = nb.yinyang_filter(x, p, lab, upper, lower, xnorm, drift, np.zeros(4), cmax)
    # Only rows within the rounding margin of a tie are left (none here).
    assert cand.size == 0
    np.testing.assert_array_equal(lab, nb.assign(x, p, want_sums=False)["labels"])


@pytest.mark.parametrize("weighted", [False, True])
def test_moved_rows_update_the_sums_to_the_full_sums(weighted):
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(300, 5)) * [1, 1e3, 1e-3, 1, 7]).astype(np.float32)
    w = rng.uniform(0.2, 3.0, len(x)) if weighted else None
    g = Grid(np.abs(x).max(axis=0), len(x) if w is None else w.sum())
    p_old, p_new = nb.prepare(x[:6].astype(np.float64), x.dtype), nb.prepare(x[6:12].astype(np.float64), x.dtype)
    old, new = nb.assign(x, p_old, w, grid=g), nb.assign(x, p_new, w, grid=g)
    xnorm = nb.row_sqnorms(x)
    for impl in ("compiled", "array-module"):
        sums, weights, counts = old["sums"].copy(), old["weights"].copy(), old["counts"].copy()
        qsums = old["qsums"].copy()
        if w is None:
            weights[:] = 0
        moved = np.flatnonzero(old["labels"] != new["labels"])
        assert moved.size
        xm, wm, xn = x[moved], None if w is None else w[moved], xnorm[moved]
        for lab, sign in ((old["labels"][moved], -1), (new["labels"][moved], 1)):
            if impl == "compiled":
                nb.add_label_sums(xm, lab, wm, sign, g, sums, weights, counts, qsums, xn)
            else:
                bounds.add_label_sums(np, xm, lab, wm, sign, g, sums, weights, counts, qsums, xn)
        np.testing.assert_array_equal(sums, new["sums"])
        np.testing.assert_array_equal(counts, new["counts"])
        np.testing.assert_array_equal(qsums, new["qsums"])
        if w is not None:
            np.testing.assert_array_equal(weights, new["weights"])


@pytest.mark.parametrize("d", [1, 3, 7, 16, 33, 100])  # the norms' loop vectorised or not, with tails
def test_label_sums_of_every_row_are_assigns_integers(d):
    """The rows' w ||x||^2 added by label from ``row_sqnorms`` (Yinyang's) are the integers
    ``assign`` adds from its own norms (Lloyd's), kept between passes or not."""
    rng = np.random.default_rng(d)
    x = (rng.normal(size=(2000, d)) + 3.0).astype(np.float32)
    w = rng.uniform(0.2, 3.0, len(x))
    p = nb.prepare(x[:9].astype(np.float64), x.dtype)
    for sw in (None, w):
        g = Grid(np.abs(x).max(axis=0), len(x) if sw is None else sw.sum())
        norms = nb.row_norms(len(x))
        for out in (nb.assign(x, p, sw, grid=g), nb.assign(x, p, sw, grid=g, row_norms=norms),
                    nb.assign(x, p, sw, grid=g, row_norms=norms)):
            k = p.centroids.shape[0]
            sums, weights, counts, qsums = np.zeros((k, d), np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64), \
                np.zeros(k, np.int64)
            nb.add_label_sums(x, out["labels"], sw, 1, g, sums, weights, counts, qsums, nb.row_sqnorms(x))
            np.testing.assert_array_equal(qsums, out["qsums"])
            np.testing.assert_array_equal(sums, out["sums"])


@pytest.mark.parametrize("k", [5, 40])  # both sides of the compiled pass's own argmin
def test_inertia_from_the_sums_is_the_rows_inertia(k):
    """``Grid.inertia`` of ``assign``'s exact sums is the rows' inertia under their labels (float64
    distances), and the per-row inertia ``assign`` adds, to the margin of its float32 distances."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3000, 7)).astype(np.float32)
    w = rng.uniform(0.5, 2, len(x))
    p = nb.prepare(rng.normal(size=(k, 7)), x.dtype)
    for sw in (None, w):
        g = Grid(np.abs(x).max(axis=0), len(x) if sw is None else sw.sum())
        out = nb.assign(x, p, sw, grid=g)
        by_sums = g.inertia(out["sums"], out["weights"], out["qsums"], p.centroids)
        lab, d2 = nb.min_sqdist(x, p)
        np.testing.assert_array_equal(lab, out["labels"])
        np.testing.assert_allclose(by_sums, bounds.owner_inertia(np, x, p.centroids, lab, sw), rtol=1e-12)
        np.testing.assert_allclose(by_sums, out["inertia"], rtol=1e-6)


@pytest.mark.parametrize("k", [5, 40])
def test_array_module_bounds_hold_and_agree_on_labels(k):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(800, 6)).astype(np.float32)
    c = rng.normal(size=(k, 6))
    t = max(1, k // 10)
    groups = (np.arange(k) % t).astype(np.int32)
    p, xnorm, (lab, upper, lower) = _bounds(x, c, groups, t)
    _, cmax = nb.centroid_drift(p.centroids, p.centroids)
    lab2, upper2, lower2 = bounds.assign_bounds(nb, x, p, groups, t, xnorm, cmax)
    np.testing.assert_array_equal(lab2, lab)
    d = np.sqrt(((x[:, None, :].astype(np.float64) - p.centroids[None].astype(np.float64)) ** 2).sum(-1))
    own = d[np.arange(len(x)), lab]
    assert (upper >= own).all() and (upper2 >= own).all()
    d[np.arange(len(x)), lab] = np.inf
    for q in range(t):
        true = d[:, groups == q].min(axis=1)
        assert (lower[:, q] <= true).all() and (lower2[:, q] <= true).all()
        np.testing.assert_allclose(lower[:, q], true, rtol=1e-4)
