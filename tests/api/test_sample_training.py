"""Training on a sample (issue 35, FAISS's ``max_points_per_centroid``): ``KMeans(...,
max_samples_per_cluster=N)`` fits on the N x K rows of smallest per-row draw, the same rows for
any chunking and worker count, then labels every row and measures the inertia and sizes over
every row."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from daskmeans import KMeans
from daskmeans import sampling
from daskmeans.errors import DaskmeansError, InvalidParameterError
from daskmeans.io.checkpoint import read_checkpoint
from daskmeans.sampling import draw_cut, sample_rows, take
from daskmeans.numerics.hashing import row_uniforms

N_ROWS, N_PER, K = 6000, 60, 5  # a sample of 300 rows


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    centres = rng.uniform(-6, 6, size=(K, 4))
    X = (centres[rng.integers(0, K, N_ROWS)] + rng.normal(size=(N_ROWS, 4))).astype(np.float32)
    w = rng.uniform(0.5, 2.0, N_ROWS)
    return X, w


def _chunked(X: np.ndarray, n_chunks: int) -> da.Array:
    return da.from_array(X, chunks=(-(-X.shape[0] // n_chunks), -1))


def _fit(client, X, w=None, **kw):
    params = dict(max_samples_per_cluster=N_PER, random_state=3, max_iter=50, client=client)
    params.update(kw)
    return KMeans(K, **params).fit(X, sample_weight=w)


# ---------------------------------------------------------------- which rows


def test_the_kept_rows_of_a_toy_case(client):
    """Seed 0, 10 rows, 3 kept: the draws are 0.5359 0.0926 0.3771 0.9178 0.5480 0.5326 0.8075
    0.7172 0.3523 0.7216, so rows 1 (0.0926), 8 (0.3523) and 2 (0.3771), in row order."""
    u = row_uniforms(0, sampling.SAMPLE_STREAM, 0, 10)
    assert np.round(u, 4).tolist() == [0.5359, 0.0926, 0.3771, 0.9178, 0.548, 0.5326, 0.8075, 0.7172, 0.3523,
                                       0.7216]
    assert sample_rows(10, 3, 0).tolist() == [1, 2, 8]
    X = np.arange(20.0).reshape(10, 2)
    for chunks in ((10,), (3, 3, 3, 1), (1,) * 10, (2, 8)):
        cut = draw_cut(client, chunks, 3, 0)
        assert (cut.u, cut.row) == (u[2], 2)
        assert sum(cut.counts) == 3 and len(cut.counts) == len(chunks)
        assert take(da.from_array(X, chunks=(chunks, 2)), cut).compute().tolist() == [[2, 3], [4, 5], [16, 17]]


def test_the_rows_are_the_same_for_any_chunking_and_follow_the_global_rule(client):
    n, m = 5000, 777
    rows = sample_rows(n, m, 42)
    idx = np.arange(n, dtype=np.float64)
    for n_chunks in (1, 3, 7, 50):
        x = da.from_array(idx, chunks=-(-n // n_chunks))
        got = take(x, draw_cut(client, x.chunks[0], m, 42)).compute()
        assert got.astype(np.int64).tolist() == rows.tolist()
    assert len(np.unique(rows)) == m and np.all(np.diff(rows) > 0)


def test_a_band_that_misses_the_cut_is_widened_until_it_holds_it(client, monkeypatch):
    """A band of zero width at m / n holds the cut only by chance: it moves down or up (both
    ways across these seeds) until it does, and the cut is the one of all draws sorted."""
    monkeypatch.setattr(sampling, "_BAND_SIGMAS", 0.0)
    for seed in range(6):
        cut = draw_cut(client, (400, 350, 250), 123, seed)
        u = row_uniforms(seed, sampling.SAMPLE_STREAM, 0, 1000)
        last = np.lexsort((np.arange(1000), u))[122]
        assert (cut.u, cut.row, sum(cut.counts)) == (u[last], last, 123)


# ---------------------------------------------------------------- the fit


def test_the_fit_is_the_fit_of_the_sampled_rows_bit_for_bit(client, data):
    """The same init array, and a named init from the same seed: the model of
    ``KMeans().fit(X[rows])``, whose history it keeps, with every row's inertia and sizes."""
    X, _ = data
    rows = sample_rows(N_ROWS, N_PER * K, 3)
    init = X[:K].astype(np.float64)
    for kw in ({"init": init}, {"init": "k-means||"}):
        km = _fit(client, _chunked(X, 3), **kw)
        ref = KMeans(K, random_state=3, max_iter=50, client=client, **kw).fit(X[rows])
        assert np.array_equal(km.cluster_centers_, ref.cluster_centers_)
        assert km.n_iter_ == ref.n_iter_ and km.sample_inertia_ == ref.inertia_
        assert [h["inertia"] for h in km.history_] == [h["inertia"] for h in ref.history_]
        assert km.n_samples_fit_ == N_PER * K and ref.n_samples_fit_ == N_PER * K
    # Every row: labels as predict gives them, the inertia and sizes of float64 NumPy.
    labels = np.asarray(km.labels_)
    assert np.array_equal(labels, km.predict(X))
    d2 = ((X.astype(np.float64)[:, None, :] - km.cluster_centers_.astype(np.float64)[None]) ** 2).sum(axis=2)
    assert np.array_equal(labels, d2.argmin(axis=1))
    assert km.inertia_ == pytest.approx(-km.score(X), rel=1e-12)
    assert km.inertia_ == pytest.approx(d2.min(axis=1).sum(), rel=1e-6)  # distances in float32, as X
    assert km.inertia_ > km.sample_inertia_ * (N_ROWS / (N_PER * K)) * 0.5  # every row, not the sample's
    assert km.cluster_sizes_.tolist() == np.bincount(labels, minlength=K).tolist()


def test_a_cosine_fit_on_a_sample_is_that_of_the_sampled_rows(client, data):
    """Rows are scaled to unit norm once: the sample's for the fit, every row's for the labels."""
    X, _ = data
    rows = sample_rows(N_ROWS, N_PER * K, 3)
    init = X[:K].astype(np.float64)
    km = _fit(client, _chunked(X, 7), metric="cosine", init=init)
    ref = KMeans(K, metric="cosine", init=init, max_iter=50, client=client).fit(X[rows])
    assert np.array_equal(km.cluster_centers_, ref.cluster_centers_) and km.sample_inertia_ == ref.inertia_
    assert np.array_equal(np.asarray(km.labels_), km.predict(X))
    assert km.inertia_ == pytest.approx(-km.score(X), rel=1e-12)


def test_the_same_centroids_for_any_chunking_and_worker_count(client, client1, data):
    X, _ = data
    fits = [_fit(c, _chunked(X, n)) for c in (client, client1) for n in (3, 7)]
    for km in fits[1:]:
        assert np.array_equal(km.cluster_centers_, fits[0].cluster_centers_)
        assert km.n_iter_ == fits[0].n_iter_
        assert km.cluster_sizes_.tolist() == fits[0].cluster_sizes_.tolist()
    assert np.array_equal(np.asarray(fits[1].labels_), fits[2].labels_.compute(scheduler=client1))


def test_weighted_data_keeps_the_weights_of_the_sampled_rows(client, data):
    X, w = data
    rows = sample_rows(N_ROWS, N_PER * K, 3)
    init = X[:K].astype(np.float64)
    km = _fit(client, _chunked(X, 7), w, init=init)
    ref = KMeans(K, init=init, max_iter=50, client=client).fit(X[rows], sample_weight=w[rows])
    unweighted = KMeans(K, init=init, max_iter=50, client=client).fit(X[rows])
    assert np.array_equal(km.cluster_centers_, ref.cluster_centers_)
    assert not np.array_equal(km.cluster_centers_, unweighted.cluster_centers_)
    d2 = ((X.astype(np.float64)[:, None, :] - km.cluster_centers_.astype(np.float64)[None]) ** 2).sum(axis=2)
    assert km.inertia_ == pytest.approx((w * d2.min(axis=1)).sum(), rel=1e-6)  # weights in float32, as X


def test_data_within_the_bound_fits_every_row_as_without_the_option(client, data):
    X, _ = data
    x = X[:N_PER * K]  # exactly N x K rows
    plain = KMeans(K, random_state=5, max_iter=50, client=client).fit(x)
    for per in (N_PER, N_PER + 1):
        km = KMeans(K, random_state=5, max_iter=50, client=client, max_samples_per_cluster=per).fit(x)
        assert np.array_equal(km.cluster_centers_, plain.cluster_centers_)
        assert (km.inertia_, km.sample_inertia_, km.n_samples_fit_) == (plain.inertia_, plain.inertia_, N_PER * K)
        assert "sample" not in km.timings_


def test_the_config_default_samples_and_the_parameter_wins(client, data):
    X, _ = data
    x = _chunked(X, 3)
    with dask.config.set({"daskmeans.max-samples-per-cluster": N_PER}):
        configured = KMeans(K, random_state=3, max_iter=50, client=client).fit(x)
        every = KMeans(K, random_state=3, max_iter=50, client=client, max_samples_per_cluster=N_ROWS).fit(x)
    assert configured.n_samples_fit_ == N_PER * K and every.n_samples_fit_ == N_ROWS
    assert np.array_equal(configured.cluster_centers_, _fit(client, x).cluster_centers_)


@pytest.mark.parametrize("value, message", [
    (0, "max_samples_per_cluster=0 should be >= 1"),
    (-4, "max_samples_per_cluster=-4 should be >= 1"),
    (2.5, "max_samples_per_cluster=2.5 should be an integer"),
])
def test_a_bad_value_is_refused_before_any_work(value, message):
    with pytest.raises(InvalidParameterError, match=f"^{message}$"):
        KMeans(3, max_samples_per_cluster=value).check_params()


def test_a_bad_configured_value_is_refused_naming_the_setting():
    with dask.config.set({"daskmeans.max-samples-per-cluster": 0}):
        with pytest.raises(InvalidParameterError, match="^daskmeans.max-samples-per-cluster=0 should be >= 1$"):
            KMeans(3).check_params()


def test_the_model_store_keeps_the_sample_size(client, data, tmp_path):
    X, _ = data
    km = _fit(client, _chunked(X, 3))
    km.save(str(tmp_path / "m.zarr"))
    back = KMeans.load(str(tmp_path / "m.zarr"))
    assert (back.n_samples_fit_, back.sample_inertia_, back.inertia_) == (km.n_samples_fit_, km.sample_inertia_,
                                                                          km.inertia_)
    assert back.max_samples_per_cluster == N_PER


# ---------------------------------------------------------------- checkpoints


def test_a_checkpointed_fit_on_a_sample_needs_a_seed(client, data, tmp_path):
    X, _ = data
    ck = tmp_path / "ck.zarr"
    with pytest.raises(DaskmeansError, match=(
            rf"^max_samples_per_cluster={N_PER} with checkpoint='{ck}' needs an int random_state \(--seed\): the "
            rf"sample is drawn from it, and a resumed fit must draw the same one$")):
        KMeans(K, max_samples_per_cluster=N_PER, checkpoint=str(ck), client=client).fit(X)
    assert not ck.exists()


def test_the_sample_is_part_of_the_checkpoint_fingerprint(client, data, tmp_path):
    """Resumed with the same seed and bound, the fit goes on as if never stopped; with another
    bound (another sample) the checkpoint is refused, naming the row counts."""
    X, _ = data
    init = X[-K:].astype(np.float64)  # far from the answer: the fit needs more than 2 iterations
    ck = str(tmp_path / "ck.zarr")
    whole = _fit(client, X, init=init, tol=0)
    assert whole.n_iter_ > 2
    with dask.config.set({"daskmeans.segment-seconds": 0}):  # a segment per iteration: a checkpoint at 2
        _fit(client, X, init=init, tol=0, max_iter=3, checkpoint=ck, checkpoint_every=2)
    assert read_checkpoint(ck)["iteration"] == 2
    resumed = KMeans(K, max_samples_per_cluster=N_PER, random_state=3, max_iter=50, init=init, tol=0,
                     checkpoint=ck, checkpoint_every=1, client=client).fit(X, resume=True)
    assert np.array_equal(resumed.cluster_centers_, whole.cluster_centers_)
    assert resumed.n_iter_ == whole.n_iter_ and resumed.inertia_ == whole.inertia_
    with pytest.raises(DaskmeansError, match=rf"^checkpoint {ck} is for another fit \(the data's values differ; "
                                             rf"n_samples: checkpoint {N_PER * K}, now {(N_PER + 1) * K}\): remove "
                                             rf"it or fit without resume$"):
        KMeans(K, max_samples_per_cluster=N_PER + 1, random_state=3, max_iter=50, init=init, tol=0, checkpoint=ck,
               client=client).fit(X, resume=True)
