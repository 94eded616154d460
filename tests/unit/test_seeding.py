"""The k-means|| building blocks on one in-memory shard, without a cluster: the batched D^2
seeding of the recluster and the incremental nearest-candidate fold that gives the candidates'
weights without a pass of its own."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans.backends import numpy_backend
from daskmeans.engine.placement import Shard
from daskmeans.seeding.kernels import seed_batched
from daskmeans.seeding.kmeans_parallel import _cand_weights, _par_update


def _shard(X: np.ndarray, cuts: list[int], w: np.ndarray | None = None) -> Shard:
    bounds = [0, *cuts, X.shape[0]]
    blocks = [X[a:b] for a, b in zip(bounds, bounds[1:])]
    weights = None if w is None else [w[a:b] for a, b in zip(bounds, bounds[1:])]
    return Shard(tuple(range(len(blocks))), tuple(bounds[:-1]), tuple(len(b) for b in blocks), X.shape[1],
                 X.dtype, "numpy", "host", blocks=blocks, weights=weights)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def seeder(request):
    """``seed_batched`` on the host's or the GPU's copy of X (and of the weights), its centres
    back on the host: the same properties on both devices."""
    if request.param == "numpy":
        return seed_batched
    import cupy

    def on_gpu(X, k, s, sample_weight=None, **kw):
        w = None if sample_weight is None else cupy.asarray(sample_weight)
        c = seed_batched(cupy.asarray(X), k, s, sample_weight=w, **kw)
        assert isinstance(c, cupy.ndarray)
        return cupy.asnumpy(c)

    return on_gpu


def test_seed_batched_toy_finds_every_distinct_point(seeder):
    """Three distinct points, each repeated: after the first pick, the repeats of a chosen point
    have d^2 = 0 and can never be drawn, so k = 3 gives the three points."""
    pts = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0]])
    X = np.repeat(pts, [5, 7, 2], axis=0)
    for seed in range(20):
        c = seeder(X, 3, seed)
        assert c.dtype == X.dtype and c.shape == (3, 2)
        assert sorted(map(tuple, c)) == sorted(map(tuple, pts))


def test_seed_batched_takes_rows_of_zero_probability_only_when_nothing_else_is_left(seeder):
    X = np.zeros((6, 3))
    X[0] = 1.0
    c = seeder(X, 4, 0)  # two distinct points: two picks must be repeats
    assert sorted(map(tuple, c)) == [(0.0,) * 3] * 3 + [(1.0,) * 3]
    w = np.array([0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    X = np.arange(18, dtype=np.float64).reshape(6, 3)
    c = seeder(X, 3, 5, sample_weight=w)  # exactly the rows of positive weight
    assert sorted(map(tuple, c)) == sorted(map(tuple, X[w > 0]))


def test_seed_batched_distinct_rows_reproducible_and_seed_dependent(seeder):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 5)).astype(np.float32)
    a, b, other = seeder(X, 200, 1), seeder(X, 200, 1), seeder(X, 200, 2)
    assert a.dtype == np.float32 and len(np.unique(a, axis=0)) == 200
    rows = {tuple(r) for r in X}
    assert all(tuple(r) in rows for r in a)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, other)


def test_seed_batched_spreads_like_kmeans_plusplus(seeder):
    """40 tight, far-apart blobs and k = 40. In batches of one row (up to k = 64, GREEDY_MAX_K)
    the seeding is greedy k-means++ with local trials and finds every blob; in batches of up
    to 3 rows (``batches=16``, greedy at no k) it still covers far more blobs than a uniform
    draw of 40 rows (about 26 of 40 here)."""
    rng = np.random.default_rng(3)
    centres = rng.uniform(-1000, 1000, (40, 2))
    X = np.repeat(centres, 50, axis=0) + rng.normal(0, 1e-3, (2000, 2))

    def covered(c):
        return len(np.unique(np.argmin(((c[:, None] - centres[None]) ** 2).sum(-1), axis=1)))

    for seed in range(5):
        assert covered(seeder(X, 40, seed)) == 40
        assert covered(seeder(X, 40, seed, batches=16, greedy_k=0)) >= 36, seed


def test_device_draws_by_sorting_are_the_host_draws():
    """The device's draws (two sorts, no count of the live rows read back) are the rows the
    host's partition draws: by key among the rows of positive probability, then the rows of
    probability 0 by their uniform, never an excluded row; run here with NumPy."""
    from daskmeans.seeding.kernels import _draw, _draw_sorted

    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 80))
        p = rng.uniform(0, 1, n) * (rng.uniform(size=n) < 0.6)
        exclude = rng.uniform(size=n) < 0.3
        u = 1.0 - rng.random(n)
        left = int((~exclude).sum())
        for m in {min(1, left), left // 2, left} - {0}:
            got = _draw_sorted(np, p, m, u, exclude)
            np.testing.assert_array_equal(got, _draw(np, p, m, u, exclude))
            assert len(got) == m and not exclude[got].any()


def test_device_draws_order_keys_of_every_magnitude_and_ties_by_row():
    """The one sort's 64-bit keys: a live row of u = 1 has key -0.0, which ties with +0.0 (the
    first row first), not below every other; keys of +inf (probabilities below 2^-1074 x -log u)
    and of 1e300 order as floats; rows of probability 0 and excluded rows by their uniform,
    after every live row; the host's draws throughout."""
    from daskmeans.seeding.kernels import _draw, _draw_sorted

    p = np.array([0.5, 1.0, 5e-324, 1e-300, 0.0, 2.0, 0.0, 3.0, 1.0])
    u = np.array([0.25, 1.0, 0.5, 0.5, 0.75, 1.0, 0.25, 0.5, 1.0])
    exclude = np.zeros(len(p), bool)
    exclude[7] = True
    with np.errstate(over="ignore"):  # the host's key of row 2 is -inf
        for m in range(1, 9):
            np.testing.assert_array_equal(_draw_sorted(np, p, m, u, exclude), _draw(np, p, m, u, exclude))
    # rows 1, 5, 8 (key 0: by row), 0 (2.8), 3 (6.9e299), 2 (+inf), then 6 (u = 0.25), 4 (0.75)
    firsts = [set(_draw_sorted(np, p, m, u, exclude).tolist()) for m in range(1, 9)]
    added = [sorted(b - a)[0] for a, b in zip([set()] + firsts, firsts)]
    assert added == [1, 5, 8, 0, 3, 2, 6, 4]


@pytest.mark.gpu
def test_rows_prepared_once_give_each_subsets_labels_and_distances():
    """``cupy_backend.prepared_rows``: a subset taken from every row prepared once (the error
    bound of all the rows) gives the labels and distances of the subset's own preparation, in
    the fused regime (few rows) and the GEMM regime of tf32 at up to 2048 rows and beyond (TF32
    and float16 tiles, or fused_select where it runs: gpu_plan.gemm_mode)."""
    import cupy

    from daskmeans.backends import cupy_backend as cb

    rng = np.random.default_rng(6)
    X = cupy.asarray(rng.standard_normal((20_000, 24)).astype(np.float32))
    ready = cb.prepared_rows(X, "tf32")
    for k in (5, 300, 3000):
        rows = cupy.asarray(np.sort(rng.choice(20_000, k, replace=False)))
        lab, d2 = cb.min_sqdist(X, ready.take(rows, k))
        want_lab, want_d2 = cb.min_sqdist(X, cb.prepare(X[rows], X.dtype, "tf32"))
        np.testing.assert_array_equal(cupy.asnumpy(lab), cupy.asnumpy(want_lab))
        np.testing.assert_array_equal(cupy.asnumpy(d2), cupy.asnumpy(want_d2))


def test_seed_batched_rejects_k_out_of_range():
    with pytest.raises(ValueError, match=r"k=5 should be > 0 and <= n_samples=4"):
        seed_batched(np.zeros((4, 2)), 5, 0)


def test_seed_batched_groups_draw_each_groups_count_from_its_own_rows(seeder):
    """Two groups of repeated distinct points: group 0 (rows 0-13) holds 3 points, group 1
    (rows 14-20) 2 others. With counts [3, 2] each group's picks are exactly its own points
    (a repeat of a picked point has d^2 = 0); with [0, 2] only group 1's; a count of 1 in a
    group of one distinct point takes that point."""
    g0 = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0]])
    g1 = np.array([[10.0, 10.0], [12.0, 10.0]])
    X = np.concatenate([np.repeat(g0, [5, 7, 2], axis=0), np.repeat(g1, [3, 4], axis=0)])
    groups = np.repeat([0, 1], [14, 7])
    for seed in range(10):
        c = seeder(X, [3, 2], seed, groups=groups)
        assert c.shape == (5, 2) and sorted(map(tuple, c)) == sorted(map(tuple, np.concatenate([g0, g1])))
        c = seeder(X, [0, 2], seed, groups=groups)
        assert sorted(map(tuple, c)) == sorted(map(tuple, g1))
    c = seeder(X[14:17], [1], 0, groups=np.zeros(3, int))
    np.testing.assert_array_equal(c, g1[:1])


def test_seed_batched_one_group_is_the_plain_seeding_and_groups_stay_apart(seeder):
    """One group of every row gives the plain seeding's rows bit for bit; with several groups
    (30 blobs each, 8 centres per group) every group's centres come from its own rows, spread
    over its blobs as the plain seeding would."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((2000, 4)).astype(np.float32)
    np.testing.assert_array_equal(seeder(X, 300, 4, groups=np.zeros(2000, int)), seeder(X, 300, 4))
    centres = rng.uniform(-1000, 1000, (24, 2))
    X = np.repeat(centres, 40, axis=0) + rng.normal(0, 1e-3, (960, 2))
    groups = np.repeat([0, 1, 2], 320)  # blobs 0-7, 8-15, 16-23
    c = seeder(X, [8, 8, 8], 1, sample_weight=rng.uniform(0.5, 2, 960), groups=groups)
    nearest = np.argmin(((c[:, None] - centres[None]) ** 2).sum(-1), axis=1)
    assert sorted(nearest.tolist()) == list(range(24))


def test_seed_batched_groups_are_checked():
    X = np.zeros((5, 2))
    with pytest.raises(ValueError, match=r"^k=3 of group 1 should be >= 0 and <= its n_samples=2$"):
        seed_batched(X, [1, 3], 0, groups=np.array([0, 0, 0, 1, 1]))
    with pytest.raises(ValueError, match=r"^groups should be non-decreasing in \[0, 2\) \(one count of k per group\)$"):
        seed_batched(X, [1, 1], 0, groups=np.array([0, 1, 0, 1, 1]))
    with pytest.raises(ValueError, match=r"^groups of shape \(4,\) should be of shape \(5,\)$"):
        seed_batched(X, [1, 1], 0, groups=np.array([0, 0, 1, 1]))
    with pytest.raises(ValueError, match=r"^k=\[0, 0\] should have a positive sum$"):
        seed_batched(X, [0, 0], 0, groups=np.array([0, 0, 0, 1, 1]))


def test_incremental_fold_equals_one_pass_over_all_candidates():
    """Nearest candidates folded batch by batch (rows keep the earlier candidate on ties) are
    those of one argmin over all candidates in order; the weights are the rows' weights per
    nearest candidate."""
    rng = np.random.default_rng(7)
    X = rng.integers(-3, 4, (500, 3)).astype(np.float64)  # small integers: many exact ties
    w = rng.uniform(0.5, 2.0, 500)
    batches = [X[[11]], X[rng.choice(500, 7)], X[rng.choice(500, 5)], X[[11, 12]]]  # repeats across batches
    shard = _shard(X, [123, 300], w)
    state, offset = None, 0
    for b in batches:  # one round's draws, as a single shard's part: (global rows, data)
        state = _par_update(shard, state, [(np.arange(offset, offset + len(b)), b)], None)
        offset += b.shape[0]
        assert state.n_cands == offset
    allc = np.concatenate(batches)
    d = ((X[:, None, :] - allc[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(np.concatenate(state.nearest), d.argmin(axis=1))  # argmin: first on ties
    np.testing.assert_array_equal(np.concatenate(state.d2), d.min(axis=1))
    assert state.phi == pytest.approx(float(d.min(axis=1) @ w), rel=1e-12)
    expect = np.bincount(d.argmin(axis=1), weights=w, minlength=allc.shape[0])
    np.testing.assert_allclose(_cand_weights(shard, state), expect, rtol=1e-12)
    assert numpy_backend.name == "numpy"


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_the_reclusters_candidates_are_every_rounds_draws_in_row_order_then_kept(backend):
    """The recluster's candidates, gathered on the device (``_candidates``), are the rounds'
    draws put in global row order round by round, then selected by the weights' mask: by hand,
    with shards' parts out of row order, an empty part and float64 draws for float32 data."""
    from daskmeans.backends import get_backend
    from daskmeans.seeding.kmeans_parallel import _candidates

    def part(rows):
        return np.array(rows, np.int64), np.array([[r, -r] for r in rows], np.float64).reshape(-1, 2)

    rounds = [[part([40, 2]), part([7])], [part([]), part([5, 1])], [part([30]), part([9, 3])]]
    keep = np.array([True, True, False, True, True, True, False, True])
    be = get_backend(backend)
    got = _candidates(be, rounds, np.float32, keep)
    want = [[2, -2], [7, -7], [1, -1], [5, -5], [3, -3], [30, -30]]  # round by round: 2 7 40 | 1 5 | 3 9 30
    assert got.dtype == np.float32
    np.testing.assert_array_equal(be.to_numpy(got), np.array(want, np.float32))


def test_rows_gathered_from_the_shards_come_in_the_order_asked():
    from daskmeans.seeding.rows import gather_rows

    parts = [(np.array([7, 9]), np.array([[7.0], [9.0]])), (np.array([], np.int64), np.empty((0, 1))),
             (np.array([1, 3, 4]), np.array([[1.0], [3.0], [4.0]]))]
    rows = np.array([9, 1, 4, 7, 3, 9])
    np.testing.assert_array_equal(gather_rows(parts, rows)[:, 0], rows.astype(float))


# ---------------------------------------------------------------- the registry


def init_first_rows(client, placement, k, seed, **options):
    """A test init: the first k rows (registered by the tests below)."""
    from daskmeans.seeding.rows import take_rows

    return take_rows(client, placement, np.arange(k))


@pytest.fixture
def first_rows(monkeypatch):
    from daskmeans import seeding

    monkeypatch.setitem(seeding.REGISTRY, "first-rows", seeding.Init("first-rows", __name__, "init_first_rows",
                                                                      "the first K rows"))
    return "first-rows"


def test_a_registered_init_is_what_the_fit_runs(first_rows, client):
    """One registry entry makes an init: the estimator accepts its name and the fit starts
    from its centroids, bit for bit the fit from the same rows given as an array."""
    from daskmeans import KMeans

    X = np.random.default_rng(4).standard_normal((600, 3))
    km = KMeans(4, init=first_rows, max_iter=5, tol=0, client=client).fit(X)
    ref = KMeans(4, init=X[:4], max_iter=5, tol=0, client=client).fit(X)
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    assert km.n_iter_ == ref.n_iter_ == 5


def test_unknown_init_names_the_registered_ones():
    from daskmeans.seeding import get_init

    with pytest.raises(ValueError, match=r"^init='k-medoids' should be one of 'k-means\|\|', 'k-means\+\+', 'random', "
                                         r"'hierarchical', 'afk-mc2'$"):
        get_init("k-medoids")


def test_every_registered_init_loads_and_the_registry_loads_nothing_heavy():
    import subprocess
    import sys

    from daskmeans import seeding

    assert seeding.names()[0] == seeding.DEFAULT == "k-means||"
    for entry in seeding.REGISTRY.values():
        assert callable(entry.load()) and entry.summary
    code = ("import sys, daskmeans.seeding as s\n"
            "assert s.names()\n"
            "print(sorted(m for m in ('numpy', 'dask', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
