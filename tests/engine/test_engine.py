"""The distributed engine through the KMeans API: scikit-learn equivalence, invariance to
chunking and cluster size, monotone inertia, empty clusters, init methods, stopping rules,
inference methods and parameter errors."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans as SKKMeans
from sklearn.datasets import make_blobs

import daskmeans
import daskmeans.engine.fit
import daskmeans.estimator
from daskmeans import DataError, InvalidParameterError, KMeans, NotFittedError
from daskmeans.seeding import resolve_init
from daskmeans.io.readers import read
from daskmeans.engine.placement import place


def rel_close(a, b, rel):
    np.testing.assert_allclose(a, b, rtol=rel, atol=rel * max(1.0, float(np.abs(b).max())))


def init_rows(X, k, seed):
    rng = np.random.default_rng(seed)
    return X[rng.choice(len(X), size=k, replace=False)].copy()


# ---------------------------------------------------------------- datasets (module cache)


def _blobs(n, d, centers, std, seed):
    return make_blobs(n_samples=n, n_features=d, centers=centers, cluster_std=std, random_state=seed)[0]


@pytest.fixture(scope="module")
def blobs_big():
    return _blobs(120_000, 8, 10, 2.5, 1)


@pytest.fixture(scope="module")
def randn_small():
    return np.random.default_rng(42).standard_normal((5000, 7))


@pytest.fixture(scope="module")
def blobs_overlap():
    return _blobs(20_000, 3, 6, 4.0, 3)


@pytest.fixture(scope="module")
def mixed_20k():
    rng = np.random.default_rng(7)
    X = _blobs(20_000, 6, 8, 1.5, 5)
    return X + 0.3 * rng.standard_normal(X.shape)


# ---------------------------------------------------------------- (a) scikit-learn equivalence


def _assert_same_as_sklearn(km, sk):
    labels = np.asarray(km.labels_)
    assert labels.dtype == np.int32
    np.testing.assert_array_equal(labels, sk.labels_)
    assert km.inertia_ == pytest.approx(sk.inertia_, rel=1e-6)
    assert km.n_iter_ == sk.n_iter_
    rel_close(km.cluster_centers_, sk.cluster_centers_, 1e-6)


@pytest.mark.parametrize(
    "dataset,k,chunks",
    [
        ("blobs_big", 10, (10_000, -1)),  # >= 1e5 rows, 12 chunks over both workers
        ("randn_small", 12, None),  # numpy input: one chunk, many iterations
        ("blobs_overlap", 6, (1_500, -1)),
    ],
)
def test_matches_sklearn_lloyd(request, client, dataset, k, chunks):
    X = request.getfixturevalue(dataset)
    init = init_rows(X, k, seed=k)
    Xin = X if chunks is None else da.from_array(X, chunks=chunks)
    km = KMeans(k, init=init, n_init=1, max_iter=300, tol=1e-4, client=client).fit(Xin)
    sk = SKKMeans(k, init=init, n_init=1, max_iter=300, tol=1e-4, algorithm="lloyd").fit(X)
    _assert_same_as_sklearn(km, sk)
    assert km.n_iter_ == len(km.history_)
    assert km.cluster_centers_.dtype == np.float64
    assert km.n_features_in_ == X.shape[1]


def test_matches_sklearn_with_sample_weight(client, mixed_20k):
    X = mixed_20k[:8000]
    w = np.random.default_rng(1).uniform(0.2, 3.0, size=len(X))
    init = init_rows(X, 7, seed=0)
    km = KMeans(7, init=init, client=client).fit(da.from_array(X, chunks=(1000, -1)), sample_weight=w)
    sk = SKKMeans(7, init=init, n_init=1, algorithm="lloyd").fit(X, sample_weight=w)
    _assert_same_as_sklearn(km, sk)


def test_integer_weights_equal_repeated_rows(client):
    rng = np.random.default_rng(9)
    X = rng.standard_normal((1500, 3))
    w = rng.integers(1, 4, size=len(X))
    init = init_rows(X, 5, seed=1)
    kw = KMeans(5, init=init, tol=0.0, client=client).fit(X, sample_weight=w.astype(np.float64))
    kr = KMeans(5, init=init, tol=0.0, client=client).fit(np.repeat(X, w, axis=0))
    rel_close(kw.cluster_centers_, kr.cluster_centers_, 1e-9)
    assert kw.inertia_ == pytest.approx(kr.inertia_, rel=1e-9)
    np.testing.assert_array_equal(np.repeat(np.asarray(kw.labels_), w), np.asarray(kr.labels_))


def test_sample_weight_wrong_length(client):
    """Regression (fixed): a NumPy sample_weight of the wrong length is wrapped with X's chunks
    (``da.from_array(w, chunks=(X.chunks[0],))``) before the shape check, so dask raises
    ``ValueError: Chunks do not add up to shape`` instead of the intended DataError."""
    X = np.random.default_rng(0).standard_normal((100, 2))
    with pytest.raises(DataError, match=r"sample_weight has shape \(99,\), should be \(n_samples,\) = \(100,\)"):
        KMeans(3, client=client).fit(X, sample_weight=np.ones(99))


def test_sample_weight_wrong_length_dask(client):
    X = np.random.default_rng(0).standard_normal((100, 2))
    with pytest.raises(DataError, match=r"sample_weight has shape \(99,\), should be \(n_samples,\) = \(100,\)"):
        KMeans(3, client=client).fit(X, sample_weight=da.ones(99, chunks=50))


def test_sample_weight_negative_or_nan(client):
    X = np.random.default_rng(0).standard_normal((100, 2))
    w = np.ones(100)
    w[40] = -1
    with pytest.raises(DataError, match="sample_weight has negative values: weights should be >= 0"):
        KMeans(3, client=client).fit(X, sample_weight=w)
    w = np.ones(100)
    w[5] = w[70] = np.nan
    with pytest.raises(DataError, match=r"sample_weight contains 2 NaN or infinite value\(s\), the first at row 5"):
        KMeans(3, client=client).fit(X, sample_weight=w)
    with pytest.raises(DataError, match="sample_weight sums to zero: at least one weight should be > 0"):
        KMeans(3, client=client).fit(X, sample_weight=np.zeros(100))
    X[[3, 9], 1] = np.nan
    X[9, 0] = -np.inf
    with pytest.raises(DataError, match=r"X contains 3 NaN or infinite value\(s\), the first in row 3"):
        KMeans(3, client=client).fit(X)


def test_cluster_of_zero_weight_points(client):
    """Zero weights are allowed (only < 0 is refused). Regression (fixed): a cluster whose rows all
    have weight 0 is "non-empty" by count (the loop's update tests ``weights > 0``) but its
    centroid is ``sums / weights = 0 / 0``: NaN centroid, NaN shift and NaN inertia in
    ``history_`` (scikit-learn tests ``weight_in_clusters == 0`` instead)."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.standard_normal((100, 2)), rng.standard_normal((50, 2)) + 20])
    w = np.r_[np.ones(100), np.zeros(50)]
    init = np.array([[0.0, 0.0], [20.0, 20.0], [1.0, 1.0]])
    km = KMeans(3, init=init, client=client).fit(X, sample_weight=w)
    for h in km.history_:
        assert np.isfinite(h["inertia"]) and np.isfinite(h["shift"]), h
    assert np.isfinite(km.cluster_centers_).all()
    assert np.isfinite(km.inertia_)
    labels = np.asarray(km.labels_)
    assert ((X - km.cluster_centers_[labels]) ** 2).sum(axis=1) @ w == pytest.approx(km.inertia_, rel=1e-9)


# ---------------------------------------------------------------- (b) chunking invariance


@pytest.mark.parametrize("init", ["array", "random", "k-means++"])
def test_chunking_invariance(client, mixed_20k, init):
    X = mixed_20k
    spec = init_rows(X, 8, seed=3) if init == "array" else init
    fits = []
    for chunks in [(len(X), -1), (len(X) // 50, -1)]:
        Xd = da.from_array(X, chunks=chunks)
        assert Xd.numblocks[0] in (1, 50)
        fits.append(KMeans(8, init=spec, random_state=11, client=client).fit(Xd))
    one, fifty = fits
    np.testing.assert_array_equal(np.asarray(one.labels_), np.asarray(fifty.labels_))
    rel_close(fifty.cluster_centers_, one.cluster_centers_, 1e-6)
    assert fifty.inertia_ == pytest.approx(one.inertia_, rel=1e-6)
    assert fifty.n_iter_ == one.n_iter_
    assert fifty.labels_.chunks == ((len(X) // 50,) * 50,)


def test_row_uniforms_do_not_depend_on_the_split():
    from daskmeans.numerics.hashing import row_uniforms

    whole = row_uniforms(11, 2, 0, 1000)
    cuts = [0, 1, 3, 4, 9, 250, 251, 999, 1000]
    parts = np.concatenate([row_uniforms(11, 2, a, b - a) for a, b in zip(cuts, cuts[1:])])
    np.testing.assert_array_equal(parts, whole)
    assert not np.array_equal(row_uniforms(11, 3, 0, 1000), whole)  # another stream
    assert 0 <= whole.min() and whole.max() < 1 and abs(whole.mean() - 0.5) < 0.05


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_seeded_init_is_bitwise_the_same_for_any_chunking_and_worker_count(client1, client, client3, mixed_20k, init):
    """The same seed gives the same model bit for bit for 3 chunkings x 1, 2 and 3 workers:
    the init draws by global row (k-means||: a counter-based generator jumped to the row), and
    the sums are exact integers (numerics.grid), for float32 and float64 data alike."""
    fits = []
    for X in (mixed_20k.astype(np.float32), mixed_20k):
        for c in (client1, client, client3):
            for rows in (len(X), 3001, 700):
                km = KMeans(8, init=init, random_state=21, client=c).fit(da.from_array(X, chunks=(rows, -1)))
                fits.append(km)
    for group in (fits[:9], fits[9:]):
        for km in group[1:]:
            np.testing.assert_array_equal(km.cluster_centers_, group[0].cluster_centers_)
            assert km.n_iter_ == group[0].n_iter_
            # The reported inertia adds per-chunk float64 sums (in chunk order): its last
            # bits follow the chunking.
            assert km.inertia_ == pytest.approx(group[0].inertia_, rel=1e-12)


# ---------------------------------------------------------------- (c) worker-count invariance


# Regression (k-means|| once depended on the chunk placement): seeding.py concatenates the sampled
# candidates in shard order, and a shard holds one worker's chunks (e.g. chunks 0,2,3,7 on one
# worker, 1,4,5,6 on the other, and a different split on every place()); the k-means++ recluster
# then sees the same candidates in a different order and, with the same seed, picks different
# centres. So the same seed gives different centroids on 2 vs 3 workers (and can differ between
# two fits on the same cluster), contrary to the module docstring.



@pytest.mark.parametrize("init", ["array", "k-means||", "k-means++", "random"])
def test_two_vs_three_workers(client, client3, mixed_20k, init):
    client.wait_for_workers(2, timeout=60)
    client3.wait_for_workers(3, timeout=60)
    assert len(client.nthreads()) == 2 and len(client3.nthreads()) == 3
    X = mixed_20k
    Xd = da.from_array(X, chunks=(400, -1))
    spec = init_rows(X, 8, seed=4) if init == "array" else init
    k2 = KMeans(8, init=spec, random_state=5, client=client).fit(Xd)
    k3 = KMeans(8, init=spec, random_state=5, client=client3).fit(Xd)
    # client3 is not the default client: compute its lazy labels on its own cluster
    l2 = client.compute(k2.labels_).result()
    l3 = client3.compute(k3.labels_).result()
    np.testing.assert_array_equal(l2, l3)
    rel_close(k3.cluster_centers_, k2.cluster_centers_, 1e-6)
    assert k3.inertia_ == pytest.approx(k2.inertia_, rel=1e-6)
    assert k3.n_iter_ == k2.n_iter_


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_init_same_on_two_and_three_workers(client, client3, mixed_20k, init):
    Xd = read(da.from_array(mixed_20k, chunks=(400, -1)))
    c2 = resolve_init(client, place(client, Xd, "numpy"), init, 8, 1234)
    c3 = resolve_init(client3, place(client3, Xd, "numpy"), init, 8, 1234)
    np.testing.assert_allclose(c3, c2, rtol=1e-12, atol=1e-12)


def test_labels_and_fit_predict_use_the_given_cluster(client, client3):
    """An estimator given ``client=`` does not depend on which client is the default one:
    ``fit_predict`` computes on the fitting client. ``labels_`` of in-memory ``X`` is computed
    there at the end of the fit (a NumPy array, as scikit-learn's); of Dask ``X`` it lives on
    that cluster (as documented), so it is computed there."""
    X = np.random.default_rng(0).standard_normal((3000, 3))
    km = KMeans(4, random_state=0, client=client3)
    labels = km.fit_predict(X)
    assert isinstance(labels, np.ndarray) and isinstance(km.labels_, np.ndarray)
    np.testing.assert_array_equal(labels, km.predict(X))
    np.testing.assert_array_equal(km.labels_, labels)
    lazy = KMeans(4, random_state=0, client=client3).fit(da.from_array(X, chunks=1000))
    assert isinstance(lazy.labels_, da.Array)
    np.testing.assert_array_equal(client3.compute(lazy.labels_).result(), labels)


# ---------------------------------------------------------------- (d) monotone inertia (property)


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(8, 1500),
    d=st.integers(1, 6),
    k=st.integers(1, 8),
    n_chunks=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    init=st.sampled_from(["random", "k-means++", "k-means||"]),
    blobs=st.booleans(),
)
def test_inertia_never_increases(client, n, d, k, n_chunks, seed, init, blobs):
    k = min(k, n)
    rng = np.random.default_rng(seed)
    if blobs:
        centers = rng.uniform(-10, 10, size=(max(k, 2), d))
        X = centers[rng.integers(0, len(centers), size=n)] + rng.standard_normal((n, d))
    else:
        X = rng.standard_normal((n, d)) * rng.uniform(0.1, 10, size=d)
    Xd = da.from_array(X, chunks=(-(-n // n_chunks), -1))
    km = KMeans(k, init=init, random_state=seed, tol=0.0, max_iter=60, client=client).fit(Xd)
    hist = [h["inertia"] for h in km.history_]
    assert len(hist) == km.n_iter_ >= 1
    for i, (a, b) in enumerate(zip(hist, hist[1:])):
        assert b <= a * (1 + 1e-9) + 1e-12, f"inertia went up at iteration {i + 2}: {a!r} -> {b!r}"
    assert km.inertia_ <= hist[-1] * (1 + 1e-9) + 1e-12
    labels = np.asarray(km.labels_)
    assert labels.shape == (n,) and labels.min() >= 0 and labels.max() < k
    # inertia_ is the inertia of labels_ under cluster_centers_
    ref = ((X - km.cluster_centers_[labels]) ** 2).sum()
    assert km.inertia_ == pytest.approx(ref, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------- (e) empty clusters


@pytest.fixture(scope="module")
def blobs_2d():
    X, _ = make_blobs(n_samples=3000, n_features=2, centers=4, cluster_std=1.0, random_state=2)
    return X


def test_empty_cluster_relocation_matches_sklearn(client, blobs_2d):
    X = blobs_2d
    init = np.concatenate([init_rows(X, 4, seed=0), [[1e3, 1e3]]])  # centroid 4 gets no point
    km = KMeans(5, init=init, client=client).fit(da.from_array(X, chunks=(250, -1)))
    assert km.history_[0]["n_empty"] == 1
    assert km.history_[-1]["n_empty"] == 0
    labels = np.asarray(km.labels_)
    counts = np.bincount(labels, minlength=5)
    assert (counts > 0).all(), counts
    assert np.isfinite(km.inertia_)
    assert np.abs(km.cluster_centers_).max() < 100  # the far centroid was moved onto the data
    # scikit-learn relocates one empty cluster onto the single farthest point, as daskmeans
    sk = SKKMeans(5, init=init, n_init=1, algorithm="lloyd").fit(X)
    _assert_same_as_sklearn(km, sk)
    np.testing.assert_array_equal(counts, np.bincount(sk.labels_, minlength=5))


def test_empty_cluster_relocation_rule(client, blobs_2d):
    """Empty clusters, in increasing index, take the farthest points (from their own
    centroid) in decreasing distance; each is removed from its former cluster."""
    X = blobs_2d
    base = init_rows(X, 3, seed=1)
    far = np.array([[1e3, 1e3], [-1e3, 1e3]])
    init = np.concatenate([far[:1], base, far[1:]])  # empty clusters 0 and 4
    km = KMeans(5, init=init, max_iter=1, client=client).fit(da.from_array(X, chunks=(400, -1)))
    assert km.history_[0]["n_empty"] == 2
    assert km.n_iter_ == 1
    # expected first update by hand
    d2 = ((X[:, None, :] - init[None]) ** 2).sum(axis=2)
    lab = d2.argmin(axis=1)
    assert set(np.unique(lab)) == {1, 2, 3}
    dist = d2[np.arange(len(X)), lab]
    order = np.argsort(-dist, kind="stable")[:2]
    sums = np.zeros_like(init)
    np.add.at(sums, lab, X)
    cnt = np.bincount(lab, minlength=5).astype(float)
    for j, row in zip([0, 4], order):
        sums[lab[row]] -= X[row]
        cnt[lab[row]] -= 1
        sums[j] = X[row]
        cnt[j] = 1
    expected = sums / cnt[:, None]
    rel_close(km.cluster_centers_, expected, 1e-9)
    counts = np.bincount(np.asarray(km.labels_), minlength=5)
    assert (counts > 0).all(), counts
    # converged fit from the same init: no empty cluster left, inertia near sklearn's
    full = KMeans(5, init=init, client=client).fit(X)
    assert (np.bincount(np.asarray(full.labels_), minlength=5) > 0).all()
    sk = SKKMeans(5, init=init, n_init=1, algorithm="lloyd").fit(X)
    assert (np.bincount(sk.labels_, minlength=5) > 0).all()
    assert full.inertia_ <= 1.5 * sk.inertia_


@pytest.mark.parametrize("chunks", [5, 2])
def test_an_empty_cluster_takes_no_row_at_its_centroid(client, chunks):
    """Duplicate points, as many centres as points (two of them equal): the second copy's
    cluster is empty, and the only rows left are at distance 0 from their centroid. Moving one
    would empty its cluster (the fit never settles); as scikit-learn (its issue 28055), the
    empty cluster stays where it is and the fit converges at once."""
    X = np.array([[0, 0], [1, 1], [1, 1], [1, 0], [0, 1]], dtype=float)
    with pytest.warns(UserWarning, match=r"Number of distinct clusters \(4\) found smaller than n_clusters \(5\)"):
        km = KMeans(5, init=X, client=client).fit(da.from_array(X, chunks=(chunks, -1)))
    assert km.n_iter_ == 1 and km.history_[0]["n_empty"] == 1
    np.testing.assert_array_equal(np.asarray(km.labels_), [0, 1, 1, 3, 4])
    np.testing.assert_array_equal(km.cluster_centers_, X)


# ---------------------------------------------------------------- (f) init methods


@pytest.fixture(scope="module")
def separated():
    X, _ = make_blobs(
        n_samples=20_000, n_features=4, centers=8, cluster_std=0.6, center_box=(-30, 30), random_state=7
    )
    return X


@pytest.fixture(scope="module")
def separated_placement(client, separated):
    return place(client, read(da.from_array(separated, chunks=(2000, -1))), "numpy")


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_init_gives_k_distinct_centers_reproducibly(client, separated, separated_placement, init):
    k = 8
    c1 = resolve_init(client, separated_placement, init, k, 17)
    c2 = resolve_init(client, separated_placement, init, k, 17)
    c3 = resolve_init(client, separated_placement, init, k, 18)
    assert c1.shape == (k, separated.shape[1]) and c1.dtype == np.float64
    assert len(np.unique(c1, axis=0)) == k
    np.testing.assert_array_equal(c1, c2)
    assert not np.array_equal(c1, c3)
    if init in ("k-means++", "random"):  # these pick data rows
        rows = {tuple(r) for r in separated}
        assert all(tuple(r) in rows for r in c1)


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_same_random_state_same_model(client, separated, init):
    """Same seed, same model. Each fit persists and places the chunks anew, which may change
    the order of the float64 partial sums, so centroids agree to rounding, labels exactly.
    (k-means|| is covered by the layout tests: see test_init_same_on_two_and_three_workers.)"""
    Xd = da.from_array(separated, chunks=(2000, -1))
    a = KMeans(8, init=init, random_state=3, client=client).fit(Xd)
    b = KMeans(8, init=init, random_state=3, client=client).fit(Xd)
    rel_close(a.cluster_centers_, b.cluster_centers_, 1e-9)
    np.testing.assert_array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-9)
    assert a.n_iter_ == b.n_iter_


def test_kmeans_parallel_quality_on_separated_blobs(client, separated):
    best = SKKMeans(8, init="k-means++", n_init=5, random_state=0).fit(separated).inertia_
    for seed in (0, 1):
        km = KMeans(8, init="k-means||", random_state=seed, client=client).fit(da.from_array(separated, chunks=(2000, -1)))
        assert km.inertia_ <= 1.05 * best, (seed, km.inertia_, best)


@pytest.mark.parametrize("init", ["k-means||", "k-means++"])
def test_init_with_exactly_k_distinct_points(client, init):
    """Heavily duplicated data (k distinct rows): both seeding methods find all k points."""
    pts = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0], [9.0, 9.0]])
    X = np.repeat(pts, 60, axis=0)
    km = KMeans(4, init=init, random_state=0, client=client).fit(da.from_array(X, chunks=(50, -1)))
    got = {tuple(r) for r in km.cluster_centers_}
    assert got == {tuple(r) for r in pts}
    assert km.inertia_ == 0.0


# ---------------------------------------------------------------- (g) stopping rules, n_init


def test_tol_stops_early(client, mixed_20k):
    X = mixed_20k[:5000]
    init = init_rows(X, 8, seed=2)
    strict = KMeans(8, init=init, tol=0.0, client=client).fit(X)
    loose = KMeans(8, init=init, tol=1e6, client=client).fit(X)
    assert strict.converged_ and strict.history_[-1]["reassigned"] == 0
    assert strict.n_iter_ > 2
    assert loose.n_iter_ == 1 and loose.converged_
    assert loose.tol_abs_ == pytest.approx(1e6 * np.var(X, axis=0).mean(), rel=1e-9)
    assert loose.history_[0]["shift"] <= loose.tol_abs_
    assert strict.tol_abs_ == 0.0
    assert loose.inertia_ >= strict.inertia_


def test_max_iter_respected(client, randn_small):
    init = init_rows(randn_small, 12, seed=12)
    km = KMeans(12, init=init, max_iter=3, tol=0.0, client=client).fit(randn_small)
    assert km.n_iter_ == 3
    assert len(km.history_) == 3
    assert [h["iteration"] for h in km.history_] == [1, 2, 3]
    assert not km.converged_
    sk = SKKMeans(12, init=init, n_init=1, max_iter=3, tol=0.0, algorithm="lloyd").fit(randn_small)
    _assert_same_as_sklearn(km, sk)


def test_history_and_callback(client, randn_small):
    seen = []
    km = KMeans(5, init="k-means++", random_state=0, client=client).fit(randn_small, callback=seen.append)
    assert [s.pop("run") for s in seen] == [1] * km.n_iter_
    assert seen == km.history_
    keys = {"iteration", "inertia", "shift", "reassigned", "n_empty", "seconds", "kernel_seconds"}
    for h in km.history_:
        assert keys <= set(h)
    assert km.history_[0]["reassigned"] == len(randn_small)


def test_verbose_prints_each_iteration_of_each_run(client, randn_small, capsys):
    seen = []
    km = KMeans(5, n_init=2, random_state=0, verbose=1, client=client).fit(randn_small, callback=seen.append)  # both
    out = capsys.readouterr().out.splitlines()
    # The long steps before the iterations, a line each (issue 47: the API showed nothing of them).
    steps = [x for x in out if x.startswith("daskmeans: ")]
    names = [x.split()[1].rstrip(":") for x in steps if " in " in x]
    # (the moments pass only where no earlier fit of this data on the client kept them)
    assert names in (["place", "moments", "init", "init"], ["place", "init", "init"]), steps
    lines = [x for x in out if not x.startswith("daskmeans: ")]
    assert len(lines) == len(seen) and len(seen) >= km.n_iter_  # every iteration of both runs
    for line, s in zip(lines, seen):
        assert line.startswith(f"run {s['run']}/2 iter {s['iteration']:4d}  inertia {s['inertia']:.6e}  "), line
    assert {s["run"] for s in seen} == {1, 2}
    KMeans(5, random_state=0, verbose=2, max_iter=2, client=client).fit(randn_small)
    lines = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("daskmeans: ")]
    assert [x.split()[:2] for x in lines] == [["iter", "1"], ["iter", "2"]]
    assert all(" imbalance " in x and x.endswith(" GB/s") for x in lines), lines


@pytest.fixture
def lloyd_runs(monkeypatch):
    """The LloydResult of every run_lloyd call made by KMeans.fit, in order."""
    results = []
    real = daskmeans.engine.fit.run_lloyd

    def recording(*args, **kwargs):
        res = real(*args, **kwargs)
        results.append(res)
        return res

    monkeypatch.setattr(daskmeans.engine.fit, "run_lloyd", recording)
    return results


def test_n_init_keeps_best(client, lloyd_runs, separated):
    results = lloyd_runs
    km = KMeans(8, init="random", n_init=4, random_state=0, client=client).fit(separated)
    assert len(results) == 4
    inertias = [r.inertia for r in results]
    assert len(set(inertias)) > 1, "runs should differ for this test to mean anything"
    best = int(np.argmin(inertias))
    assert km.inertia_ == inertias[best]
    np.testing.assert_array_equal(km.cluster_centers_, results[best].centroids)
    assert km.n_iter_ == results[best].n_iter
    labels = np.asarray(km.labels_)
    assert ((separated - km.cluster_centers_[labels]) ** 2).sum() == pytest.approx(km.inertia_, rel=1e-9)
    one = KMeans(8, init="random", n_init=1, random_state=0, client=client).fit(separated)
    assert km.inertia_ <= one.inertia_


def test_n_init_runs_each_start_fresh(client, lloyd_runs):
    """Every run's first iteration reassigns all rows (``Partial.reassigned``: "all rows at
    the first one"). Regression (fixed): the shards' label workspace (``Shard.labels``) survives from
    one run to the next, so run 2+ counts its first labels against the previous run's last
    ones: ``reassigned`` is wrong, and a run whose first partition equals the previous run's
    last one stops after 1 iteration as "converged"."""
    results = lloyd_runs
    X, y = make_blobs(3000, 2, centers=3, cluster_std=0.5, random_state=0)
    init = np.stack([X[y == i][0] for i in range(3)])
    # A callable init runs n_init times (explicit centres run once, as scikit-learn's).
    KMeans(3, init=lambda X, k, random_state: init, n_init=3, client=client).fit(X)
    assert len(results) == 3
    firsts = [r.history[0]["reassigned"] for r in results]
    assert firsts == [len(X)] * 3, f"first-iteration reassigned per run: {firsts}"
    # the same init must give the same run
    assert [r.n_iter for r in results] == [results[0].n_iter] * 3


# ---------------------------------------------------------------- (h) inference methods


@pytest.fixture(scope="module")
def fitted(client, mixed_20k):
    X = mixed_20k[:6000]
    return X, KMeans(6, random_state=0, client=client).fit(da.from_array(X, chunks=(700, -1)))


def test_predict_transform_score_numpy(fitted):
    X, km = fitted
    labels = np.asarray(km.labels_)
    pred = km.predict(X)
    assert isinstance(pred, np.ndarray) and pred.dtype == np.int32
    np.testing.assert_array_equal(pred, labels)
    dist = km.transform(X)
    assert isinstance(dist, np.ndarray) and dist.dtype == np.float64 and dist.shape == (len(X), 6)
    ref = np.sqrt(((X[:, None, :] - km.cluster_centers_[None]) ** 2).sum(axis=2))
    np.testing.assert_allclose(dist, ref, rtol=1e-7, atol=1e-7)
    np.testing.assert_array_equal(dist.argmin(axis=1), labels)
    score = km.score(X)
    assert isinstance(score, float)
    assert score == pytest.approx(-km.inertia_, rel=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transform_of_the_centroids_is_exactly_zero_on_the_diagonal(client, fitted, dtype):
    """A row at a centroid is at distance 0: the GEMM expansion's cancellation (8e-8 in
    float64 after the square root) is recomputed exactly; every other distance as before."""
    X, km = fitted
    if dtype == np.float32:  # a float32 model (its centroids float32, as the rows)
        X = X.astype(dtype)
        km = KMeans(6, random_state=0, client=client).fit(X)
    dist = km.transform(np.concatenate([km.cluster_centers_, X[:50]]))
    np.testing.assert_array_equal(np.diag(dist[:6]), np.zeros(6))
    c = km.cluster_centers_.astype(np.float64)
    ref = np.sqrt(((X[:50, None, :].astype(np.float64) - c[None]) ** 2).sum(axis=2))
    np.testing.assert_allclose(dist[6:], ref, rtol=1e-5 if dtype == np.float32 else 1e-7)


def test_score_takes_sample_weight_as_scikit_learn(fitted):
    X, km = fitted
    w = np.random.default_rng(4).uniform(0, 3, len(X))
    sk = SKKMeans(6, init=km.cluster_centers_, n_init=1, max_iter=1).fit(X)
    sk.cluster_centers_ = km.cluster_centers_
    assert km.score(X, sample_weight=w) == pytest.approx(sk.score(X, sample_weight=w), rel=1e-10)
    assert km.score(X, sample_weight=np.ones(len(X))) == pytest.approx(km.score(X), rel=1e-12)
    assert km.score(da.from_array(X, chunks=(999, -1)), sample_weight=da.from_array(w, chunks=500)) == \
        pytest.approx(km.score(X, sample_weight=w), rel=1e-12)


def test_predict_transform_dask(fitted):
    X, km = fitted
    Xd = da.from_array(X, chunks=(1000, -1))
    pred = km.predict(Xd)
    assert isinstance(pred, da.Array)
    np.testing.assert_array_equal(pred.compute(), np.asarray(km.labels_))
    dist = km.transform(Xd)
    assert isinstance(dist, da.Array) and dist.shape == (len(X), 6)
    np.testing.assert_allclose(dist.compute(), km.transform(X), rtol=1e-12)
    assert km.score(Xd) == pytest.approx(-km.inertia_, rel=1e-9)


def test_predict_float32_and_integer_input(fitted):
    X, km = fitted
    np.testing.assert_array_equal(km.predict(np.round(X).astype(np.int64)), km.predict(np.round(X)))
    p32 = km.predict(X.astype(np.float32))
    assert (p32 == np.asarray(km.labels_)).mean() > 0.999


def test_fit_predict(client, mixed_20k):
    X = mixed_20k[:4000]
    init = init_rows(X, 5, seed=0)
    km = KMeans(5, init=init, client=client)
    out = km.fit_predict(X)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.asarray(km.labels_))
    np.testing.assert_array_equal(out, km.predict(X))
    km2 = KMeans(5, init=init, client=client)
    outd = km2.fit_predict(da.from_array(X, chunks=(500, -1)))
    assert isinstance(outd, da.Array)
    np.testing.assert_array_equal(outd.compute(), out)


def test_float32_fit(client, mixed_20k):
    X = mixed_20k[:5000]
    init = init_rows(X, 6, seed=0)
    k32 = KMeans(6, init=init, client=client).fit(X.astype(np.float32))
    k64 = KMeans(6, init=init, client=client).fit(X)
    assert k32.cluster_centers_.dtype == np.float32
    np.testing.assert_allclose(k32.cluster_centers_, k64.cluster_centers_, rtol=1e-3, atol=1e-3)
    assert k32.inertia_ == pytest.approx(k64.inertia_, rel=1e-4)


def test_not_fitted_and_feature_mismatch(fitted):
    X, km = fitted
    with pytest.raises(NotFittedError, match="not fitted"):
        KMeans(3).predict(X)
    with pytest.raises(DataError, match="X has 2 features, but KMeans is expecting 6 features as input"):
        km.predict(X[:, :2])


def test_params_api():
    km = KMeans(5, tol=0.5)
    assert km.get_params()["n_clusters"] == 5
    assert km.set_params(max_iter=7) is km and km.max_iter == 7
    assert repr(km) == "KMeans(n_clusters=5, max_iter=7, tol=0.5)"
    with pytest.raises(ValueError, match="invalid parameter 'foo'"):
        km.set_params(foo=1)


# ---------------------------------------------------------------- (i) errors


def test_more_clusters_than_samples(client):
    X = np.random.default_rng(0).standard_normal((10, 2))
    with pytest.raises(DataError, match=r"n_samples=10 should be >= n_clusters=11"):
        KMeans(11, client=client).fit(X)
    # K == n is fine
    km = KMeans(10, init="k-means++", random_state=0, client=client).fit(X)
    assert km.inertia_ == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_data(client, bad):
    X = np.random.default_rng(0).standard_normal((300, 3))
    X[123, 2] = bad
    with pytest.raises(DataError, match=r"NaN.*row 123"):
        KMeans(3, client=client).fit(da.from_array(X, chunks=(50, -1)))


@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_non_finite_data_at_inference(fitted, method):
    """predict / transform / score refuse NaN and infinite rows as fit does, naming the row
    (NumPy input: computed right away)."""
    _, km = fitted
    X = np.random.default_rng(1).standard_normal((300, km.n_features_in_))
    X[217, 0] = np.inf
    with pytest.raises(DataError, match=r"NaN or infinity \(first at row 217\)"):
        getattr(km, method)(X)


@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_data_beyond_the_distances_range_at_inference(fitted, method):
    """predict / transform / score refuse float32 rows whose squared norm can overflow float32
    distances, as fit does (the kernels compute them in the data's dtype); the same values in
    float64 are taken."""
    _, km = fitted
    X = np.random.default_rng(1).standard_normal((300, km.n_features_in_)).astype(np.float32)
    X[217] = 1e19  # a squared norm of 1e38 x D, above float32's largest / 4
    with pytest.raises(DataError, match=r"X's values are too large for float32 distances: a row's squared norm can "
                                        r"reach .* above 8\.51e\+37; rescale the data or use float64 data"):
        getattr(km, method)(X)
    assert len(np.asarray(km.predict(X.astype(np.float64)))) == 300


@pytest.mark.parametrize(
    "params,message",
    [
        ({"n_clusters": 0}, "n_clusters=0 should be >= 1"),
        ({"n_clusters": 2.5}, "n_clusters=2.5 should be an integer"),
        ({"tol": -1}, "tol=-1 should be >= 0"),
        ({"max_iter": 0}, "max_iter=0 should be >= 1"),
        ({"n_init": 0}, "n_init=0 should be >= 1"),
        ({"random_state": -1}, "random_state=-1 should be >= 0"),
        ({"oversampling_factor": 0}, "oversampling_factor=0 should be > 0"),
        ({"backend": "tpu"}, "backend='tpu' should be one of 'auto', 'cpu', 'gpu'"),
        ({"init": 3}, "init=3 should be one of 'k-means||', 'k-means++', 'random'"),
        ({"metric": "manhattan"}, "metric='manhattan' should be one of 'euclidean', 'cosine'"),
        ({"precision": "fp16"}, "precision='fp16' should be one of 'fp32', 'tf32', 'bf16'"),
    ],
)
def test_invalid_parameters(client, params, message):
    X = np.random.default_rng(0).standard_normal((50, 2))
    with pytest.raises(InvalidParameterError) as info:
        KMeans(**{"n_clusters": 3, **params}, client=client).fit(X)
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["foo", "kmeans++"])
def test_unknown_init_name(client, name):
    """Regression (fixed): an unknown init string (e.g. the typo 'kmeans++') is taken for a .npy path
    and fails, inside fit after reading X, with DataError "init='kmeans++': no such file",
    instead of an InvalidParameterError naming the valid values."""
    X = np.random.default_rng(0).standard_normal((50, 2))
    with pytest.raises(InvalidParameterError) as info:
        KMeans(3, init=name, client=client).fit(X)
    msg = str(info.value)
    assert f"init={name!r}" in msg
    assert "should be one of 'k-means||', 'k-means++', 'random'" in msg


def test_init_array_wrong_shape(client):
    X = np.random.default_rng(0).standard_normal((50, 3))
    with pytest.raises(DataError, match=r"init array has shape \(4, 2\), should be \(n_clusters, n_features\) = \(4, 3\)"):
        KMeans(4, init=np.zeros((4, 2)), client=client).fit(X)
    with pytest.raises(DataError, match=r"init array has shape \(3, 3\)"):
        KMeans(4, init=np.zeros((3, 3)), client=client).fit(X)
    bad = np.zeros((4, 3))
    bad[0, 0] = np.nan
    with pytest.raises(DataError, match="init array contains NaN"):
        KMeans(4, init=bad, client=client).fit(X)


def test_init_from_npy_path(client, tmp_path):
    X = np.random.default_rng(0).standard_normal((500, 3))
    init = init_rows(X, 4, seed=0)
    np.save(tmp_path / "init.npy", init)
    a = KMeans(4, init=str(tmp_path / "init.npy"), client=client).fit(X)
    b = KMeans(4, init=init, client=client).fit(X)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)


@pytest.mark.parametrize(
    "X,message",
    [
        (np.zeros(10), "X should be 2-D"),
        (np.zeros((10, 2), dtype=complex), r"Complex data not supported: X has dtype complex128, should be real"),
        (np.zeros((0, 2)), r"X has 0 sample\(s\) \(shape=\(0, 2\)\) while a minimum of 1 is required"),
        (np.zeros((5, 0)), r"X has 0 feature\(s\) \(shape=\(5, 0\)\) while a minimum of 1 is required"),
        (np.array([[1.0, {"a": 1}]], dtype=object), r"X has dtype object and a value that is not a number: float\(\) "),
        (np.array([["1.5", "x"]], dtype=object), r"X has dtype object and a value that is not a number: could not "),
    ],
)
def test_bad_data_shapes(client, X, message):
    with pytest.raises(DataError, match=message):
        KMeans(1, client=client).fit(X)
