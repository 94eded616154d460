"""Data the exact sums or the distances cannot carry is refused with one clear error, never
turned into a wrong model (numerics.grid.check_resolution / check_range)."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans import KMeans
from daskmeans.numerics.grid import Grid, check_range, check_resolution
from daskmeans.errors import DataError


def _blobs(n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=5, size=(5, 4))
    return (centers[rng.integers(0, 5, n)] + rng.normal(size=(n, 4))).astype(np.float32)


def test_one_huge_value_is_refused(client):
    """One 1e18 among values near 1: the sums' step (set by 1e18 x 20000 rows) is larger than
    the ordinary values, which would all round to zero (the fit used to report an inertia
    of ~1e27 for a true ~1e5)."""
    x = _blobs()
    x[7, 2] = 1e18
    with pytest.raises(DataError, match=r"feature 2 spans too wide a range for exact sums: over 20000 rows"):
        KMeans(5, random_state=0, client=client).fit(x)


@pytest.mark.parametrize("typical_rows, typical", [(4096, "100"), (2, "1.5")])
def test_the_typical_value_is_the_median_over_evenly_spaced_centres(client, monkeypatch, typical_rows, typical):
    """The check's typical |value| of a feature: the median of |c| over the initial centres, or
    over TYPICAL_ROWS of them evenly spaced where there are more (rows 0 and 3 of 5 when it
    is 2: the median of 1 and 2)."""
    from daskmeans.engine import fit

    monkeypatch.setattr(fit, "TYPICAL_ROWS", typical_rows)
    x = _blobs()
    x[7, 2] = 1e18
    init = np.zeros((5, 4))
    init[:, 2] = [1.0, -100.0, 200.0, 2.0, 300.0]
    with pytest.raises(DataError, match=rf"feature 2 spans too wide .* and its typical \|value\| {typical} should"):
        KMeans(5, init=init, client=client).fit(x)


def test_a_large_but_representable_outlier_is_fitted_exactly(client):
    """1e6 among values near 1 is well within the grid: the fit equals float64 Lloyd steps
    from the same init (the outlier, alone in its cluster, is its own centroid)."""
    x = _blobs()
    x[7, 2] = 1e6
    init = x[[7, 0, 1, 2, 3]].astype(np.float64)
    km = KMeans(5, init=init, max_iter=3, tol=0, client=client).fit(x)
    c = init.copy()
    xd = x.astype(np.float64)
    for _ in range(3):
        lab = ((xd[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
        c = np.stack([xd[lab == j].mean(0) for j in range(5)])
    np.testing.assert_allclose(km.cluster_centers_, c.astype(np.float32), rtol=1e-5, atol=1e-5)
    assert km.cluster_centers_[0, 2] == np.float32(1e6)


def test_values_whose_squares_overflow_float32_are_refused(client):
    x = _blobs()
    x[7, 1] = 3e38
    with pytest.raises(DataError, match=r"X's values are too large for float32 distances: a row's squared norm can "
                                        r"reach 9e\+76.*; rescale the data or use float64 data"):
        KMeans(5, random_state=0, client=client).fit(x)


def test_checks_by_hand():
    # max |x| = 1 over 2**20 rows: the step is 2**(1 + 20 - 62) = 2**-41, far below 2**-12 x 0.5.
    g = Grid(np.array([1.0, 1.0]), 2.0**20)
    check_resolution(g, np.array([0.5, 0.0]), 2**20)
    # max |x| = 2**40 instead: the step is 2**(41 + 20 - 62) = 0.5 > 2**-12 x 0.5.
    g = Grid(np.array([1.0, 2.0**40]), 2.0**20)
    with pytest.raises(DataError, match=r"feature 1 spans too wide .* step to 0.5, and its typical \|value\| 0.5"):
        check_resolution(g, np.array([0.5, 0.5]), 2**20)
    check_resolution(g, np.array([0.5, 0.0]), 2**20)  # a feature typically 0 (sparse) is exact: skipped
    check_range(np.array([4e18, 4e18]), np.float32)  # 3.2e37 <= 3.4e38 / 4
    with pytest.raises(DataError, match="too large for float32"):
        check_range(np.array([1e19, 1e19]), np.float32)  # 2e38 > 8.5e37
    check_range(np.array([1e19, 1e19]), np.float64)
