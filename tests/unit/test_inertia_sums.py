"""The step's inertia from exact per-cluster sums (``Grid.inertia``): the rows' inertia under
their labels, the same bits for any split of the rows, and its cancellation where clusters sit
far from the origin against their spread (docs/performance.md, "inertia from exact sums")."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from daskmeans.backends import numpy_backend as nb
from daskmeans.numerics.grid import Grid


def _exact(x: np.ndarray, c: np.ndarray, labels: np.ndarray, w: np.ndarray | None) -> float:
    """``sum w ||x - c||^2`` with each row's difference in long double (exact for float32 rows
    and centroids) and the rows' terms added by ``math.fsum``."""
    diff = x.astype(np.longdouble) - c.astype(np.longdouble)[labels]
    d2 = np.sum(diff * diff, axis=1)
    if w is not None:
        d2 = d2 * w.astype(np.longdouble)
    return math.fsum(float(v) for v in d2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("offset", [0.0, 10.0, 1e3])
def test_the_sums_give_the_rows_inertia_within_the_cancellation(dtype, offset):
    """Relative error at most ``64 eps`` times ``||mu||^2 / sigma^2`` (mean row norm over the
    spread), and never above 1e-9 for these offsets."""
    rng = np.random.default_rng(int(offset) + 7)
    n, d, k = 20_000, 16, 6
    centres = rng.normal(size=(k, d)) * 3 + offset / math.sqrt(d)
    x = (centres[rng.integers(0, k, n)] + rng.normal(size=(n, d))).astype(dtype)
    w = rng.uniform(0.5, 2.0, n)
    p = nb.prepare(centres, x.dtype)
    for sw in (None, w):
        g = Grid(np.abs(x).max(axis=0), n if sw is None else sw.sum())
        out = nb.assign(x, p, sw, grid=g)
        got = g.inertia(out["sums"], out["weights"], out["qsums"], p.centroids)
        ref = _exact(x, p.centroids, out["labels"], sw)
        ratio = float(np.mean(np.sum(x.astype(np.float64) ** 2, axis=1))) * (n / ref if sw is None else sw.sum() / ref)
        assert abs(got - ref) <= 64 * 2.0**-53 * max(ratio, 1.0) * ref
        assert abs(got - ref) <= 1e-9 * ref


def test_any_split_of_the_rows_gives_the_same_bits():
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(5000, 9)) + 4).astype(np.float32)
    w = rng.uniform(0.1, 3.0, len(x))
    p = nb.prepare(rng.normal(size=(7, 9)) + 4, x.dtype)
    g = Grid(np.abs(x).max(axis=0), w.sum())
    whole = nb.assign(x, p, w, grid=g)
    ref = g.inertia(whole["sums"], whole["weights"], whole["qsums"], p.centroids)
    for cuts in ([1234], [1, 2500, 4999], list(range(250, 5000, 250))):
        parts = [nb.assign(xb, p, wb, grid=g) for xb, wb in zip(np.split(x, cuts), np.split(w, cuts))]
        got = g.inertia(sum(o["sums"] for o in parts), sum(o["weights"] for o in parts),
                        sum(o["qsums"] for o in parts), p.centroids)
        assert got == ref


def test_the_grid_of_the_squares_bounds_every_sum_and_travels():
    """``2**(qexp + 62)`` exceeds the total weight times ``sum_j max|x_j|^2``; the grid pickles
    with it (workers receive the fit's grid)."""
    max_abs, total = np.array([3.0, 1e3, 0.5]), 1e6
    g = Grid(max_abs, total)
    assert 2.0 ** (g.qexp + 62) > total * float(np.sum(max_abs**2))
    assert 2.0 ** (g.qexp + 60) <= total * float(np.sum(max_abs**2))  # and is no coarser than it must be
    g2 = pickle.loads(pickle.dumps(g))
    assert (g2.qexp, g2.qscale) == (g.qexp, g.qscale)
    assert Grid(np.zeros(2), 10.0).qscale > 0  # all-zero data: a finite scale
