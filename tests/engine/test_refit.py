"""Re-fits on the same data reuse the placement kept by the fit before (engine/reuse.py):
nothing is placed or scanned again, the bits are those of a fresh fit, other data (or the
same file written again) is placed anew, ``daskmeans.release`` frees the workers' memory, and
a lost worker or a closed client drops what was kept."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, get_task_stream
from sklearn.cluster import KMeans as SKKMeans

import daskmeans
from daskmeans import KMeans
from daskmeans.engine import reuse

# Tasks of the placement (one per shard) and of the moments pass (one per shard).
PLACING = ("daskmeans-shard-", "daskmeans-moments-")


def _data(seed: int, n: int = 4000, d: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=5, size=(6, d))
    return centres[rng.integers(0, 6, n)] + rng.standard_normal((n, d))


def _fit(client, X, k=6, **kw):
    """A fit, and how many placement and moments tasks ran during it."""
    with get_task_stream(client=client) as ts:
        km = KMeans(k, random_state=0, client=client, **kw).fit(X)
    placing = sum(1 for t in ts.data if str(t["key"]).startswith(PLACING))
    return km, placing


def _same_bits(a, b, client=None):
    """``client``: where the labels are (default: the default client's cluster)."""
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    if client is None:
        np.testing.assert_array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    else:
        np.testing.assert_array_equal(*client.gather(client.compute([a.labels_, b.labels_])))
    assert a.inertia_ == b.inertia_
    assert a.n_iter_ == b.n_iter_
    for field in ("inertia", "shift", "reassigned"):  # the rest of the history is timings
        assert [h[field] for h in a.history_] == [h[field] for h in b.history_]


def _in_memory(keys, dask_scheduler) -> list:
    # A released task stays known while tasks made from it (the labels) are: its data does not.
    return [k for k in keys if k in dask_scheduler.tasks and dask_scheduler.tasks[k].who_has]


def _on_workers(client, keys) -> list:
    """The keys some worker still holds, or the scheduler still counts in a worker's memory."""
    held = client.run(lambda keys, dask_worker: [k for k in keys if k in dask_worker.data], keys)
    return sorted({k for ks in held.values() for k in ks} | set(client.run_on_scheduler(_in_memory, keys)))


@pytest.fixture
def fresh(client):
    """The session client with nothing kept from earlier tests (and nothing left after)."""
    daskmeans.release(client)
    yield client
    daskmeans.release(client)


def test_release_is_public():
    assert "release" in daskmeans.__all__
    assert daskmeans.release is reuse.release


def test_toy_refit_reuses_and_gives_the_hand_computed_centroids(fresh):
    X = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 10.0], [10.0, 11.0]])
    init = np.array([[0.0, 0.0], [10.0, 10.0]])
    first, placed = _fit(fresh, X, 2, init=init, n_init=1)
    again, placed_again = _fit(fresh, X, 2, init=init, n_init=1)
    assert placed > 0 and placed_again == 0
    for km in (first, again):
        np.testing.assert_array_equal(km.cluster_centers_, [[0.0, 0.5], [10.0, 10.5]])
        np.testing.assert_array_equal(np.asarray(km.labels_), [0, 0, 1, 1])
        assert km.inertia_ == 1.0  # four rows, each 0.5 from its centroid


def test_second_fit_places_nothing_and_gives_a_fresh_fits_bits(fresh):
    X = _data(0)
    first, placed = _fit(fresh, X)
    assert placed > 0
    assert len(reuse.held(fresh)) == 1
    # The same values in a new array: the same Dask keys, so the same data.
    again, placed_again = _fit(fresh, X.copy())
    assert placed_again == 0
    assert again.timings_.get("moments") is None  # no pass over the data either
    assert daskmeans.release(fresh) == 1
    fresh_fit, placed_fresh = _fit(fresh, X)
    assert placed_fresh > 0
    _same_bits(first, fresh_fit)
    _same_bits(again, fresh_fit)


def test_refit_at_another_k_matches_scikit_learn(fresh):
    """An elbow loop: K = 3 places, K = 5 reuses; each fit is scikit-learn's Lloyd from the
    same initial centroids."""
    X = _data(1)
    for k, expect_placing in ((3, True), (5, False)):
        init = X[np.random.default_rng(k).choice(len(X), k, replace=False)]
        km, placed = _fit(fresh, X, k, init=init, n_init=1)
        assert (placed > 0) == expect_placing, k
        sk = SKKMeans(k, init=init, n_init=1, algorithm="lloyd", tol=1e-4).fit(X)
        np.testing.assert_array_equal(np.asarray(km.labels_), sk.labels_)
        np.testing.assert_allclose(km.cluster_centers_, sk.cluster_centers_, rtol=1e-9, atol=1e-9)
        assert km.n_iter_ == sk.n_iter_


def test_the_plan_reuses_the_budgets_measured_for_the_kept_placement(fresh, monkeypatch):
    import daskmeans.engine.job as fit_module  # the job plans every fit

    calls = []
    measure = fit_module.worker_budgets
    monkeypatch.setattr(fit_module, "worker_budgets", lambda *a, **kw: calls.append(a) or measure(*a, **kw))
    X = _data(12)
    first, _ = _fit(fresh, X, 4)
    again, placed = _fit(fresh, X, 7)  # another K: the same budgets, tier and placement
    assert len(calls) == 1 and placed == 0
    assert again.tier_plan_ == first.tier_plan_


def test_sweep_places_once_for_every_k(fresh):
    X = _data(13)
    with get_task_stream(client=fresh) as ts:
        out = daskmeans.sweep(X, [2, 3, 4, 5], sample=500, random_state=0, client=fresh)
    shards = [t for t in ts.data if str(t["key"]).startswith("daskmeans-shard-")]
    assert 0 < len(shards) <= len(fresh.nthreads())
    daskmeans.release(fresh)
    for km in out.models:
        _same_bits(km, _fit(fresh, X, km.n_clusters)[0])


def test_n_init_across_fits_and_weights(fresh):
    X = _data(2)
    w = np.random.default_rng(3).uniform(0.5, 2.0, len(X))
    with get_task_stream(client=fresh) as ts:
        a = KMeans(6, random_state=1, n_init=2, client=fresh).fit(X, sample_weight=w)
        b = KMeans(6, random_state=1, n_init=2, client=fresh).fit(X, sample_weight=w)
    shards = [t for t in ts.data if str(t["key"]).startswith("daskmeans-shard-")]
    assert 0 < len(shards) <= len(fresh.nthreads())  # placed once, for the first fit
    _same_bits(a, b)
    # The same rows without weights are other data: placed again, not given the weighted shards.
    c, placed = _fit(fresh, X)
    assert placed > 0
    daskmeans.release(fresh)
    _same_bits(c, _fit(fresh, X)[0])


def test_different_data_is_placed_again_and_at_most_two_are_kept(fresh):
    X, Y, Z = _data(4), _data(5), _data(6)  # the same shape, different values: different keys
    kx, _ = _fit(fresh, X)
    ky, placed = _fit(fresh, Y)
    assert placed > 0
    assert not np.array_equal(kx.cluster_centers_, ky.cluster_centers_)
    _fit(fresh, Z)
    assert len(reuse.held(fresh)) == reuse.KEEP == 2
    kz, placed = _fit(fresh, Z)
    assert placed == 0
    kx2, placed = _fit(fresh, X)  # the oldest was dropped
    assert placed > 0
    _same_bits(kx, kx2)
    daskmeans.release(fresh)
    _same_bits(ky, _fit(fresh, Y)[0])
    _same_bits(kz, _fit(fresh, Z)[0])


def test_a_file_written_again_is_placed_again(fresh, tmp_path):
    path = str(tmp_path / "x.npy")
    X, Y = _data(7).astype(np.float32), _data(8).astype(np.float32)
    np.save(path, X)
    kx, _ = _fit(fresh, path)
    np.save(path, Y)  # the reader's keys name the path: the same keys, other contents
    ky, placed = _fit(fresh, path)
    assert placed > 0
    daskmeans.release(fresh)
    _same_bits(ky, _fit(fresh, Y)[0])
    assert not np.array_equal(kx.cluster_centers_, ky.cluster_centers_)


def test_release_frees_the_workers_memory(fresh):
    X = _data(9)
    km, _ = _fit(fresh, X)
    (kept,) = reuse.held(fresh)
    assert kept["shards"] and _on_workers(fresh, kept["shards"]) == sorted(kept["shards"])
    assert daskmeans.release(fresh) == 1
    assert reuse.held(fresh) == []
    assert _on_workers(fresh, kept["shards"]) == []
    # The fitted model's labels do not need the shards.
    assert np.asarray(km.labels_).shape == (len(X),)
    assert daskmeans.release(fresh) == 0


@pytest.fixture
def own_cluster():
    """A 3-worker process cluster (nannies restart a killed worker) of this test only."""
    cluster = LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0",
                           silence_logs=logging.CRITICAL)
    c = Client(cluster, set_as_default=False)
    try:
        yield c
    finally:
        daskmeans.release(c)
        c.close()
        cluster.close()


async def _die() -> None:
    os._exit(1)  # a worker lost without a word (its nanny starts another at a new address)


def _until(predicate, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def test_a_lost_worker_drops_the_kept_data_and_the_next_fit_is_right(own_cluster):
    c = own_cluster
    X = _data(10)
    first, _ = _fit(c, X)
    (kept,) = reuse.held(c)
    victim = kept["workers"][0]
    c.run(_die, workers=[victim], wait=False)
    _until(lambda: victim not in c.nthreads())
    c.wait_for_workers(3, timeout=60)  # the nanny's new worker, at a new address
    again, placed = _fit(c, X)
    assert placed > 0
    assert all(victim not in h["workers"] for h in reuse.held(c))
    _same_bits(first, again, c)


def test_closing_the_client_drops_its_cache():
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                           silence_logs=logging.ERROR)
    try:
        c = Client(cluster, set_as_default=False)
        _fit(c, _data(11), 3)
        assert len(reuse.held(c)) == 1
        c.close()
        assert reuse.held(c) == []
        assert c.id not in reuse._CACHES
        assert daskmeans.release() == 0
    finally:
        cluster.close()
