"""MiniBatchKMeans: Sculley's update by hand, a float64 NumPy reference of the same steps,
inertia against full-batch KMeans, bitwise results across chunkings and worker counts, and
scikit-learn's estimator checks."""

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.utils.estimator_checks import parametrize_with_checks

from daskmeans import KMeans
from daskmeans.errors import DataError
from daskmeans.engine.minibatch import batch_rows
from daskmeans.minibatch import MiniBatchKMeans

# As for KMeans (tests/engine/test_sklearn.py): batches are drawn per row, so a row of weight
# 2 and two copies of it are different draws, and so are the fits.
_WEIGHTS_VS_REPEATS = "batches and the init draw per row, so weights and repeated rows draw different batches"
EXPECTED_FAILED = {
    "check_sample_weight_equivalence_on_dense_data": _WEIGHTS_VS_REPEATS,
    "check_sample_weight_equivalence_on_sparse_data": _WEIGHTS_VS_REPEATS,
}


@pytest.mark.usefixtures("client")  # the checks build their own estimators: the default client
@pytest.mark.filterwarnings("ignore:Estimator MiniBatchKMeans does not inherit from")
@parametrize_with_checks([MiniBatchKMeans(n_clusters=3, random_state=0, max_iter=5, batch_size=64)],
                         expected_failed_checks=lambda est: EXPECTED_FAILED)
def test_scikit_learn_estimator_checks(estimator, check, monkeypatch):
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    check(estimator)


def test_partial_fit_by_hand(client):
    # Step 1 (batch = all rows, counts 0): each centre becomes its rows' mean.
    # Step 2: c <- (c * n_old + sum) / (n_old + w): (1*2 + 3)/3 and (11*2 + 13)/3.
    mb = MiniBatchKMeans(2, init=np.array([[0.0], [10.0]]), client=client)
    mb.partial_fit(np.array([[0.0], [2.0], [10.0], [12.0]]))
    np.testing.assert_array_equal(mb.cluster_centers_, [[1.0], [11.0]])
    np.testing.assert_array_equal(mb.counts_, [2.0, 2.0])
    assert mb.inertia_ == 4.0 and mb.n_steps_ == 1
    mb.partial_fit(np.array([[3.0], [13.0]]), sample_weight=np.array([1.0, 2.0]))
    np.testing.assert_allclose(mb.cluster_centers_, [[5 / 3], [(22 + 26) / 4]], rtol=1e-15)
    np.testing.assert_array_equal(mb.counts_, [3.0, 4.0])
    assert mb.n_steps_ == 2
    np.testing.assert_array_equal(mb.predict(np.array([[0.0], [20.0]])), [0, 1])
    with pytest.raises(DataError, match="X has 2 features, but MiniBatchKMeans is expecting 1 features as input"):
        mb.partial_fit(np.zeros((3, 2)))


def _reference(X, c0, batch, n_steps, seed):
    """scikit-learn's mini-batch steps (no reassignment, no early stop) in float64 NumPy, on
    the batches MiniBatchKMeans draws."""
    c, counts = c0.astype(np.float64).copy(), np.zeros(len(c0))
    for t in range(n_steps):
        xb = X[batch_rows(seed, t, len(X), batch)].astype(np.float64)
        lab = ((xb[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
        for j in range(len(c)):
            rows = xb[lab == j]
            if len(rows):
                c[j] = (c[j] * counts[j] + rows.sum(0)) / (counts[j] + len(rows))
                counts[j] += len(rows)
    return c, counts


def test_steps_equal_a_float64_numpy_reference(client):
    X, _ = make_blobs(3000, 5, centers=6, random_state=2)
    c0 = X[:6]
    mb = MiniBatchKMeans(6, init=c0, batch_size=100, max_iter=2, reassignment_ratio=0.0, max_no_improvement=None,
                         random_state=7, client=client).fit(da.from_array(X, chunks=(700, 5)))
    assert mb.n_steps_ == 60
    ref_c, ref_counts = _reference(X, c0, 100, 60, mb._seeds[0])
    np.testing.assert_allclose(mb.cluster_centers_, ref_c, rtol=1e-10)
    np.testing.assert_array_equal(mb.counts_, ref_counts)


@pytest.fixture(scope="module")
def blobs():
    X, _ = make_blobs(60_000, 8, centers=12, cluster_std=1.5, random_state=0)
    return X.astype(np.float32)


def test_inertia_within_2_percent_of_full_batch_kmeans(client, blobs):
    full = KMeans(12, random_state=0, client=client).fit(blobs)
    mb = MiniBatchKMeans(12, batch_size=1024, random_state=0, client=client).fit(blobs)
    assert mb.inertia_ <= 1.02 * full.inertia_
    assert mb.inertia_ == pytest.approx(-mb.score(blobs), rel=1e-9)
    np.testing.assert_array_equal(np.asarray(mb.labels_), mb.predict(blobs))
    assert mb.cluster_centers_.dtype == np.float32 and mb.n_steps_ < 100 * 60_000 // 1024  # stopped early


def test_bitwise_across_chunkings_and_worker_counts(client, client3, blobs):
    fits = [MiniBatchKMeans(12, batch_size=500, max_iter=3, random_state=3, n_init=2, client=c).fit(x)
            for c, x in ((client, blobs), (client, da.from_array(blobs, chunks=(7_001, 8))),
                         (client3, da.from_array(blobs, chunks=(1_999, 8))))]
    # Lazy labels (Dask input) each on its own cluster; NumPy input's are NumPy already.
    labels = [f.labels_ if isinstance(f.labels_, np.ndarray) else f.client.compute(f.labels_).result() for f in fits]
    for other, other_labels in zip(fits[1:], labels[1:]):
        np.testing.assert_array_equal(other.cluster_centers_, fits[0].cluster_centers_)
        np.testing.assert_array_equal(other.counts_, fits[0].counts_)
        assert other.n_steps_ == fits[0].n_steps_
        np.testing.assert_array_equal(other_labels, labels[0])
        # The inertia is added chunk by chunk: the same to rounding (as KMeans's).
        assert other.inertia_ == pytest.approx(fits[0].inertia_, rel=1e-10)
    another_seed = MiniBatchKMeans(12, batch_size=500, max_iter=3, random_state=4, n_init=2, client=client).fit(blobs)
    assert not np.array_equal(another_seed.cluster_centers_, fits[0].cluster_centers_)


def test_unit_weights_equal_no_weights_and_k_means_parallel_init(client, blobs):
    x = blobs[:20_000]
    a = MiniBatchKMeans(12, init="k-means||", random_state=1, compute_labels=False, client=client).fit(x)
    b = MiniBatchKMeans(12, init="k-means||", random_state=1, compute_labels=False, client=client).fit(
        x, sample_weight=np.ones(len(x)))
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.inertia_ == b.inertia_ > 0  # the smoothed batch inertia times n_samples
    with pytest.raises(AttributeError):
        a.labels_


def test_public_names_and_fit_predict_without_a_client_argument(client):
    import daskmeans

    assert daskmeans.MiniBatchKMeans is MiniBatchKMeans and {"MiniBatchKMeans", "sweep"} <= set(daskmeans.__all__)
    X, _ = make_blobs(2000, 3, centers=3, random_state=1)
    mb = daskmeans.MiniBatchKMeans(3, batch_size=200, random_state=0)  # the default client
    labels = mb.fit_predict(X)
    assert isinstance(labels, np.ndarray) and sorted(np.bincount(labels)) == sorted(np.bincount(mb.predict(X)))
    assert repr(mb) == "MiniBatchKMeans(n_clusters=3, batch_size=200, random_state=0)"
