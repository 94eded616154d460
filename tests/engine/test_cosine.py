"""Spherical k-means (``metric="cosine"``) on the CPU path: a hand-computed toy case, a float64
NumPy reference from the same init, and properties (monotone inertia, chunk invariance)."""

from __future__ import annotations

import numpy as np
import pytest

import daskmeans
from daskmeans.errors import DataError


def _spherical_reference(X, C, n_iter):
    """Float64 spherical k-means: unit rows; label = argmax cosine (lowest index on ties);
    centroid = normalised mean of its rows (kept when the mean is zero or the cluster empty)."""
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = C / np.linalg.norm(C, axis=1, keepdims=True)
    for _ in range(n_iter):
        lab = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
        new = C.copy()
        for j in range(len(C)):
            if (lab == j).any():
                m = X[lab == j].mean(0)
                if np.linalg.norm(m) > 0:
                    new[j] = m / np.linalg.norm(m)
        C = new
    lab = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
    inertia = float((1 - (X * C[lab]).sum(1)).sum())
    return lab, C, inertia


def test_toy_case_by_hand(client):
    # Two directions: rows at 0/10 degrees and at 90/100 degrees; magnitudes must not matter.
    a = np.deg2rad([0.0, 10.0, 90.0, 100.0])
    X = np.c_[np.cos(a), np.sin(a)] * np.array([[1.0], [50.0], [0.1], [7.0]])
    km = daskmeans.KMeans(2, init=np.array([[1.0, 0.0], [0.0, 3.0]]), metric="cosine", max_iter=10, client=client).fit(X)
    np.testing.assert_array_equal(np.asarray(km.labels_), [0, 0, 1, 1])
    expect = np.c_[np.cos(np.deg2rad([5.0, 95.0])), np.sin(np.deg2rad([5.0, 95.0]))]
    np.testing.assert_allclose(km.cluster_centers_, expect, atol=1e-12)
    assert km.inertia_ == pytest.approx(4 * (1 - np.cos(np.deg2rad(5.0))), rel=1e-9)
    np.testing.assert_allclose(km.transform(X)[:, 0], 1 - np.cos(a - np.deg2rad(5.0)), atol=1e-12)
    assert km.score(X) == pytest.approx(-km.inertia_, rel=1e-9)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matches_float64_reference(client, dtype):
    rng = np.random.default_rng(3)
    dirs = rng.normal(0, 1, (6, 10))
    X = (dirs[rng.integers(0, 6, 5000)] + rng.normal(0, 0.4, (5000, 10))) * rng.uniform(0.5, 20, (5000, 1))
    init = X[:6].copy()
    lab, C, inertia = _spherical_reference(X.astype(dtype).astype(np.float64), init, 15)
    km = daskmeans.KMeans(6, init=init, metric="cosine", max_iter=15, tol=0, client=client).fit(X.astype(dtype))
    np.testing.assert_array_equal(np.asarray(km.labels_), lab)
    rtol = 1e-9 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(km.cluster_centers_, C, rtol=rtol, atol=rtol)
    assert km.inertia_ == pytest.approx(inertia, rel=rtol)
    np.testing.assert_array_equal(km.predict(X.astype(dtype)), lab)


def test_inertia_never_increases_and_chunking_does_not_matter(client):
    import dask.array as da

    rng = np.random.default_rng(4)
    X = rng.normal(0, 1, (6000, 5)) + rng.integers(0, 3, (6000, 1))
    init = X[rng.choice(6000, 12, replace=False)]
    fits = [
        daskmeans.KMeans(12, init=init, metric="cosine", max_iter=40, tol=0, client=client).fit(da.from_array(X, chunks=(c, 5)))
        for c in (6000, 130)
    ]
    inert = [h["inertia"] for h in fits[0].history_]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(inert, inert[1:]))
    np.testing.assert_array_equal(np.asarray(fits[0].labels_), np.asarray(fits[1].labels_))
    np.testing.assert_allclose(fits[0].cluster_centers_, fits[1].cluster_centers_, rtol=1e-6)


def test_zero_row_is_an_error(client):
    X = np.ones((20, 3))
    X[13] = 0
    with pytest.raises(DataError, match=r"metric='cosine' needs rows of nonzero norm; row 13 is all zeros"):
        daskmeans.KMeans(2, metric="cosine", client=client).fit(X)


def test_zero_init_row_is_an_error(client):
    with pytest.raises(DataError, match=r"needs init rows of nonzero norm; row 1 is all zeros"):
        daskmeans.KMeans(2, init=np.array([[1.0, 0.0], [0.0, 0.0]]), metric="cosine", client=client).fit(np.eye(2) + 1)


def test_save_load_keeps_metric(client, tmp_path):
    rng = np.random.default_rng(5)
    X = rng.normal(0, 1, (500, 4)) + 3
    km = daskmeans.KMeans(3, metric="cosine", random_state=0, client=client).fit(X)
    km.save(str(tmp_path / "m.zarr"))
    back = daskmeans.load(str(tmp_path / "m.zarr"))
    assert back.metric == "cosine"
    np.testing.assert_array_equal(back.predict(X * 5), km.predict(X))  # scale-invariant
