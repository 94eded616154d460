"""Yinyang's step gives Lloyd's bits: centroids, labels, iteration count, inertia and the
history's statistics, over seeds, K, chunkings, worker counts, weights, empty-cluster
re-seeds and size balancing; and its bounds do skip rows."""

from __future__ import annotations

import math

import dask
import dask.array as da
import numpy as np
import pytest

from daskmeans import KMeans
from daskmeans.backends import bounds
from daskmeans.engine import yinyang

# The statistics of a step's result; not ``rechecked``, the rows a pass re-ranked by their exact
# distances (work, not a result: a bounded step re-ranks only rows its bounds leave uncertain).
STATS = ("iteration", "inertia", "shift", "reassigned", "n_empty", "imbalance", "n_moved")


def _data(seed, n=4000, d=6, centers=12):
    rng = np.random.default_rng(seed)
    c = rng.normal(scale=3, size=(centers, d))
    return (c[rng.integers(0, centers, n)] + rng.normal(size=(n, d))).astype(np.float32)


def _set_rule(values):
    from daskmeans.engine import yinyang as module

    old = (module.BOUND_START, module.ABANDON)
    module.BOUND_START, module.ABANDON = values
    return old


@pytest.fixture(params=["default", "always"])
def bound_start(request, client):
    """Yinyang's bounds from the first step that can have them and never dropped ("always":
    from the second step on, so that every re-seed and early move meets the bounded path), or
    by the default rule (Lloyd's passes while many rows move or the bounds certify too few), on
    the session cluster's workers."""
    if request.param == "default":
        yield request.param
        return
    old = client.run(_set_rule, (1.0, math.inf))
    try:
        yield request.param
    finally:
        client.run(_set_rule, next(iter(old.values())))


def _same(a, b, client_a, client_b=None):
    """Every bit of two fits' results the algorithms must share."""
    client_b = client_b or client_a
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(client_a.compute(a.labels_).result(), client_b.compute(b.labels_).result())
    assert a.n_iter_ == b.n_iter_
    assert a.inertia_ == b.inertia_
    assert [[h[s] for s in STATS] for h in a.history_] == [[h[s] for s in STATS] for h in b.history_]


def _pair(client, X, k, sw=None, **kw):
    return [KMeans(k, algorithm=alg, n_init=1, client=client, **kw).fit(X, sample_weight=sw)
            for alg in ("lloyd", "yinyang")]


@pytest.mark.parametrize("seed,k", [(0, 3), (1, 12), (2, 40), (3, 100)])
def test_yinyang_is_lloyds_bits(client, bound_start, seed, k):
    x = _data(seed)
    X = da.from_array(x, chunks=(900, -1))
    lloyd, yy = _pair(client, X, k, random_state=seed, tol=0, max_iter=60)
    assert lloyd.n_iter_ > 3
    _same(lloyd, yy, client)


@pytest.mark.parametrize("chunks", [(4000,), (333,), ((1500, 7, 2493),)])
def test_yinyang_for_any_chunking_and_weights(client, bound_start, chunks):
    x = _data(5)
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(x))
    X = da.from_array(x, chunks=chunks + (-1,))
    sw = da.from_array(w, chunks=X.chunks[0])
    lloyd, yy = _pair(client, X, 20, sw, init=x[:20].astype(np.float64), tol=0, max_iter=40)
    _same(lloyd, yy, client)
    # and the same as another chunking's Yinyang (Lloyd's own invariance)
    other = KMeans(20, algorithm="yinyang", init=x[:20].astype(np.float64), tol=0, max_iter=40, client=client).fit(
        da.from_array(x, chunks=(1000, -1)), sample_weight=da.from_array(w, chunks=(1000,)))
    np.testing.assert_array_equal(other.cluster_centers_, yy.cluster_centers_)


def test_yinyang_on_one_and_three_workers(client1, client3):
    x = _data(7)
    X = da.from_array(x, chunks=(500, -1))
    one = KMeans(16, algorithm="yinyang", random_state=3, tol=0, max_iter=50, client=client1).fit(X)
    three = KMeans(16, algorithm="yinyang", random_state=3, tol=0, max_iter=50, client=client3).fit(X)
    ref = KMeans(16, algorithm="lloyd", random_state=3, tol=0, max_iter=50, client=client1).fit(X)
    _same(ref, one, client1)
    np.testing.assert_array_equal(three.cluster_centers_, one.cluster_centers_)
    np.testing.assert_array_equal(client3.compute(three.labels_).result(), client1.compute(one.labels_).result())
    assert three.n_iter_ == one.n_iter_


def test_yinyang_with_empty_cluster_reseeds(client, bound_start):
    """Duplicate initial centroids leave clusters empty: the re-seeds move centroids far, and
    the bounds follow them (the drift) to Lloyd's bits."""
    x = _data(11)
    init = np.repeat(x[:4].astype(np.float64), 3, axis=0)  # 12 centroids, 4 distinct
    X = da.from_array(x, chunks=(700, -1))
    lloyd, yy = _pair(client, X, 12, init=init, tol=0, max_iter=40)
    assert lloyd.history_[0]["n_empty"] > 0
    _same(lloyd, yy, client)


def test_yinyang_with_size_balancing(client, bound_start):
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.normal(size=(3000, 4)), rng.normal(loc=8, scale=0.3, size=(300, 4))]).astype(np.float32)
    X = da.from_array(x, chunks=(800, -1))
    lloyd, yy = _pair(client, X, 16, random_state=2, tol=0, max_iter=40, max_imbalance=1.5)
    assert sum(h["n_moved"] for h in lloyd.history_) > 0
    _same(lloyd, yy, client)


def test_yinyang_across_segments_and_float64(client, bound_start):
    """Segments of one iteration (the bounds kept on the shard between tasks), float64 data."""
    x = _data(13).astype(np.float64)
    X = da.from_array(x, chunks=(1000, -1))
    with dask.config.set({"daskmeans.segment-seconds": 1e-6}):
        lloyd, yy = _pair(client, X, 24, random_state=5, tol=0, max_iter=30)
    _same(lloyd, yy, client)


def _count_rows(dask_worker):
    from daskmeans.backends import numpy_backend

    real = numpy_backend.assign_bounds
    seen = dask_worker.yy_rows = []

    def counted(X, *a, **kw):
        seen.append(X.shape[0])
        return real(X, *a, **kw)

    dask_worker.yy_real = real
    numpy_backend.assign_bounds = counted


def _restore(dask_worker):
    from daskmeans.backends import numpy_backend

    numpy_backend.assign_bounds = dask_worker.yy_real
    return dask_worker.yy_rows


def _fit_counting(client, X, k, **kw):
    """A Yinyang fit, and the rows of each ``assign_bounds`` call on the workers (the backend's
    function wrapped there), in call order per worker."""
    client.run(_count_rows)
    try:
        km = KMeans(k, algorithm="yinyang", random_state=0, tol=0, client=client, **kw).fit(X)
    finally:
        calls = [c for rows in client.run(_restore).values() for c in rows]
    return km, calls


def test_the_bounds_skip_rows_in_late_iterations(client, bound_start):
    """The filter certifies most rows once few move: fewer rows go through the assignment than
    there are rows (counted on the workers by wrapping the backend's ``assign_bounds``)."""
    x = _data(17, n=6000)
    km, calls = _fit_counting(client, da.from_array(x, chunks=(3000, -1)), 30, max_iter=25)
    seen = sum(calls)
    # The first step assigns every row; the later ones a fraction of them.
    assert km.n_iter_ > 10
    assert len(x) <= seen < 0.5 * len(x) * km.n_iter_


def test_a_probe_keeps_bounds_that_would_not_pay_from_being_set(client):
    """Rows without clusters (randn, K = 300 of 8000 rows): centroids move by more than the
    gaps between them, so the bounds would leave most rows uncertain. The probe's sample says
    so and every row's bounds are never set: no ``assign_bounds`` call takes more rows than a
    chunk's sample; the fit is Lloyd's bits. On clustered rows the probe passes and the bounds
    are set for whole chunks, after the sample's calls."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8000, 32)).astype(np.float32)
    X = da.from_array(x, chunks=(4000, -1))
    sample = -(-4000 // yinyang.PROBE_STRIDE)
    km, calls = _fit_counting(client, X, 300, max_iter=18)
    assert calls and max(calls) <= sample
    _same(KMeans(300, algorithm="lloyd", random_state=0, tol=0, max_iter=18, client=client).fit(X), km, client)

    b = _data(3, n=8000)
    km, calls = _fit_counting(client, da.from_array(b, chunks=(4000, -1)), 30, max_iter=30)
    first_full = calls.index(4000)
    assert first_full > 0 and max(calls[:first_full]) <= sample


def _cap_steps_after(on):
    """``yinyang._steps_after`` as ``max_iter`` alone bounds it (``on``), or the module's own."""
    from daskmeans.engine import yinyang as module

    if on:
        module._real_steps_after = module._steps_after
        module._steps_after = lambda st, at, last, max_iter: max(0, max_iter - at - 1)
    elif hasattr(module, "_real_steps_after"):
        module._steps_after = module._real_steps_after


def test_bounds_are_not_set_a_step_or_two_before_the_fit_settles(client):
    """Separated blobs from random rows: the moved rows shrink about five times a step
    (6000, 1041, 235, 36, 1, 0), so the probe's verdict falls one step before the fit settles.
    Bounds set there cost a pass over every row and save one step: with the steps counted up
    to ``max_iter`` alone they are set (a call over a whole chunk), with the moved rows' decay
    they are not; the fit is Lloyd's bits either way."""
    from sklearn.datasets import make_blobs

    x = make_blobs(n_samples=6000, n_features=16, centers=300, cluster_std=1.0, random_state=2)[0].astype(np.float32)
    X = da.from_array(x, chunks=(3000, -1))
    kw = dict(init="random", n_init=1, max_iter=20)
    client.run(_cap_steps_after, True)
    try:
        _, capped = _fit_counting(client, X, 300, **kw)
    finally:
        client.run(_cap_steps_after, False)
    assert 3000 in capped
    km, calls = _fit_counting(client, X, 300, **kw)
    assert [h["reassigned"] for h in km.history_][-2:] == [1, 0] and km.n_iter_ <= 8
    assert calls and max(calls) < 3000
    _same(KMeans(300, algorithm="lloyd", random_state=0, tol=0, client=client, **kw).fit(X), km, client)


@pytest.mark.parametrize("moved,before,rows,at,last,max_iter,steps", [
    (0.02, 0.1, 1000, 3, 2, 20, 2),  # 20 rows, a fifth a step: 4, then 0.8 (<1), then none moving
    (0.02, 0.1, 1000, 5, 2, 20, 0),  # the same decay, the bounds set three steps on: nothing left
    (0.02, 0.1, 1000, 3, 2, 5, 1),  # max_iter leaves one step after step 3
    (0.05, 0.04, 1000, 3, 2, 20, 16),  # the moved rows grow: max_iter alone
    (0.001, 0.01, 1000, 3, 2, 20, 0),  # one row moved: the next step finds none
    (0.5, None, 1000, 3, 2, 20, 16),  # no step before: max_iter alone
])
def test_steps_after_follow_the_moved_rows_decay(moved, before, rows, at, last, max_iter, steps):
    """Hand-computed: 20 moved rows shrinking five times a step move 4, then 0.8 (no row): the
    steps after step 2 are 3 (that one included), so 2 follow step 3 and none step 5."""
    st = yinyang.YinyangState(next_iteration=at, expect=None, moved=moved, moved_before=before, rows=rows)
    assert yinyang._steps_after(st, at, last, max_iter) == steps


@pytest.mark.parametrize("uncertain,remaining,pays", [(0.2, 20, True), (0.35, 20, False), (0.2, 2, False),
                                                      (0.0, 3, True), (0.0, 2, False)])
def test_bounds_pay_by_their_step_and_their_setting(uncertain, remaining, pays):
    """Hand-computed at the CPU's cost (3 Lloyd rows an uncertain row): a step with 20% of the
    rows uncertain costs 0.6 of Lloyd's (<= ABANDON = 0.9) and saves 0.4 a step, so 20 steps
    repay the setting's 2 passes beyond Lloyd's and 2 steps (0.8) do not; 35% costs 1.05; with
    no row uncertain 3 steps save 3 > 2 and 2 steps save 2, not more."""
    assert yinyang._pays(uncertain, 3.0, remaining) is pays


def test_groups_and_memory_rule():
    assert bounds.n_groups(1) == 1 and bounds.n_groups(9) == 1 and bounds.n_groups(100) == 10
    assert bounds.n_groups(1 << 18) == bounds.MAX_GROUPS
    assert bounds.bound_bytes(1000, 100) == 1000 * 8 * 12 + 1000 * 12
    c = np.concatenate([np.zeros((5, 2)), np.full((5, 2), 10.0)])
    g = yinyang.centroid_groups(np, c, 2)
    assert g.dtype == np.int32 and set(g[:5]) == {g[0]} and set(g[5:]) == {g[5]} and g[0] != g[5]


def test_the_plan_counts_and_refuses_the_bounds():
    from daskmeans.engine.plan import working_parts

    lloyd = working_parts(1000, 16, 4, 1 << 20, 100_000, "numpy")
    yy = working_parts(1000, 16, 4, 1 << 20, 100_000, "numpy", algorithm="yinyang")
    assert "bounds" not in lloyd
    # the bounds, the kept sums, and the centroids in group order (data dtype and GEMM copies)
    assert yy["bounds"] == bounds.bound_bytes(100_000, 1000) + (1000 * 16 + 2000) * 8 + 1000 * 16 * 16


def test_yinyang_refused_cleanly_where_the_bounds_do_not_fit(client):
    x = _data(19, n=20_000, d=4)
    X = da.from_array(x, chunks=(5000, -1))
    from daskmeans.errors import DaskmeansError

    # 200 clusters: 20 groups, up to 15,000 rows per worker: 2.8 MB of bounds over a 2 MB
    # budget that holds Lloyd's working set (1.4 MB).
    KMeans(200, algorithm="lloyd", max_iter=1, random_state=0, init="random", memory_limit="2MB",
           tier="storage", client=client).fit(X)
    with pytest.raises(DaskmeansError, match="Yinyang's bounds"):
        KMeans(200, algorithm="yinyang", max_iter=1, random_state=0, init="random", memory_limit="2MB",
               tier="storage", client=client).fit(X)


def test_yinyang_on_a_gpu_backend_warns_and_lloyd_does_not(client, monkeypatch):
    """On a device backend Yinyang has not been measured faster than Lloyd's step: the fit
    says so (with the same result), and Lloyd's fit there says nothing. The device is stood in
    for by the job's question about the backend, answered "on a GPU" for the CPU workers."""
    import warnings

    from daskmeans.engine import job
    from daskmeans.errors import DaskmeansWarning

    monkeypatch.setattr(job, "on_gpu", lambda name: True)
    X = _data(3, n=600)
    with pytest.warns(DaskmeansWarning, match=r"algorithm='yinyang' on the numpy backend: measured slower than "
                                              r"Lloyd's step on a GPU so far"):
        KMeans(4, algorithm="yinyang", init="random", max_iter=3, random_state=0).fit(X)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="algorithm='yinyang'", category=DaskmeansWarning)
        KMeans(4, algorithm="lloyd", init="random", max_iter=3, random_state=0).fit(X)
