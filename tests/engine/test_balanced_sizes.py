"""Balanced cluster sizes (``max_imbalance``): the moves on a hand-computed toy, the same bits
for any chunking and worker count, nothing changed where the bound holds, sizes pulled toward
the bound on skewed data, and the parameter's checks."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from daskmeans import KMeans
from daskmeans.backends import get_backend
from daskmeans.engine.reseed import balance, relocate
from daskmeans.errors import DaskmeansError, InvalidParameterError
from daskmeans.io.checkpoint import read_checkpoint
from daskmeans.numerics.grid import Grid
from daskmeans.numerics.hashing import row_keys


@pytest.fixture(scope="module")
def skewed():
    """One dense blob with most rows and two sparse ones: k-means gives uneven sizes."""
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(0, 1, (6000, 4)), rng.normal(10, 3, (600, 4)),
                           rng.normal(-10, 3, (600, 4))]).astype(np.float32)


def test_balance_picks_the_largest_over_the_bound_and_as_many_smallest_below_the_mean():
    counts = np.array([10, 1, 40, 3, 3, 23, 0, 20])  # mean 12.5
    over, donors = balance(counts, 12.5, 1.5)  # above 18.75: 40 (2), 23 (5), 20 (7)
    assert over.tolist() == [2, 5, 7]
    assert donors.tolist() == [6, 1, 3]  # 0, 1, 3 rows (ties: the lower index)
    over, donors = balance(counts, 12.5, 2.0)  # above 25: only cluster 2
    assert over.tolist() == [2] and donors.tolist() == [6]
    over, donors = balance(np.array([5, 5, 5, 5]), 5.0, 1.1)
    assert len(over) == len(donors) == 0


def test_relocate_gives_each_target_its_row_alone_on_the_grid():
    """Cluster 0 (rows 1, 2, 3) gives row 3 to cluster 1, whose rows (10, 12) drop out: the
    sums become 1 + 2 and 3, the weights 2 and 1 (on the grid's steps)."""
    be = get_backend("numpy")
    grid = Grid(np.array([16.0]), 8.0)
    x = np.array([1.0, 2.0, 3.0, 10.0, 12.0])
    sums = np.array([[grid.on_grid(np.array([v]), 1.0)[0][0] for v in (1 + 2 + 3, 10 + 12)]]).T.astype(np.int64)
    weights = np.array([3, 2], np.int64) * grid.on_grid(np.array([0.0]), 1.0)[1]
    s, w = relocate(sums, weights, np.array([1]), [(0, np.array([x[2]]), 1.0)], grid, be)
    np.testing.assert_array_equal(grid.sums(s).ravel(), [3.0, 3.0])
    np.testing.assert_array_equal(grid.weights(w), [2.0, 1.0])


def test_row_keys_depend_on_the_row_and_salt_only():
    rows = np.arange(1000, dtype=np.int64)
    k = row_keys(np, rows, 7)
    np.testing.assert_array_equal(k[10:20], row_keys(np, rows[10:20], 7))
    assert len(np.unique(k)) == 1000
    assert not np.array_equal(k, row_keys(np, rows, 8))


def test_balanced_fit_is_bitwise_the_same_for_any_chunking_and_worker_count(client, client3, skewed):
    runs = {}
    for chunks in (2, 5):
        X = da.from_array(skewed, chunks=(-(-len(skewed) // chunks), -1))
        for c in (client, client3):
            km = KMeans(24, random_state=3, max_iter=15, max_imbalance=1.5, client=c).fit(X)
            runs[chunks, len(c.nthreads())] = km
    ref = runs[2, 2]
    assert sum(h["n_moved"] for h in ref.history_) > 0
    for key, km in runs.items():
        np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_, err_msg=str(key))
        assert [h["n_moved"] for h in km.history_] == [h["n_moved"] for h in ref.history_]
        # Added in chunk order, and the data's 2 chunks are split again for 3 workers.
        assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)


def test_a_bound_that_holds_changes_nothing(client, skewed):
    free = KMeans(24, random_state=3, max_iter=15, client=client).fit(skewed)
    loose = KMeans(24, random_state=3, max_iter=15, max_imbalance=100.0, client=client).fit(skewed)
    assert max(h["imbalance"] for h in free.history_) < 100
    np.testing.assert_array_equal(loose.cluster_centers_, free.cluster_centers_)
    assert all(h["n_moved"] == 0 for h in loose.history_)


def test_balance_pulls_the_sizes_toward_the_bound(client, skewed):
    free = KMeans(24, random_state=3, max_iter=40, client=client).fit(skewed)
    bal = KMeans(24, random_state=3, max_iter=40, max_imbalance=1.5, client=client).fit(skewed)
    sizes_free, sizes_bal = free.cluster_sizes_, bal.cluster_sizes_
    mean = len(skewed) / 24
    assert sizes_free.max() / mean > 2.0  # the data is skewed
    assert sizes_bal.max() / mean < 0.75 * sizes_free.max() / mean
    assert sizes_bal.min() > sizes_free.min()


def test_a_resumed_balanced_fit_goes_on_as_if_never_stopped(client, skewed, tmp_path):
    """The moves depend on the seed and the iteration only: a fit resumed from a checkpoint
    is bitwise the fit that never stopped; with another bound the checkpoint is refused,
    naming it."""
    ck = str(tmp_path / "ck.zarr")
    whole = KMeans(24, random_state=3, max_iter=12, tol=0, max_imbalance=1.5, client=client).fit(skewed)
    moved = [h["n_moved"] for h in whole.history_]
    assert sum(moved[:3]) > 0 and sum(moved[3:]) > 0, moved  # moves before and after the checkpoint
    with dask.config.set({"daskmeans.segment-seconds": 0}):  # a segment per iteration: a checkpoint at 3
        short = KMeans(24, random_state=3, max_iter=4, tol=0, max_imbalance=1.5, checkpoint=ck,
                       checkpoint_every=3, client=client).fit(skewed)
    assert read_checkpoint(ck)["iteration"] == 3
    # A shorter fit's iterations, its last included, are the longer fit's first.
    assert [(h["inertia"], h["n_moved"]) for h in short.history_] == \
           [(h["inertia"], h["n_moved"]) for h in whole.history_[:4]]
    resumed = KMeans(24, random_state=3, max_iter=12, tol=0, max_imbalance=1.5, checkpoint=ck,
                     client=client).fit(skewed, resume=True)
    np.testing.assert_array_equal(resumed.cluster_centers_, whole.cluster_centers_)
    assert [h["n_moved"] for h in resumed.history_] == moved
    with pytest.raises(DaskmeansError, match=r"max_imbalance: checkpoint 1\.5, now 2\.0"):
        KMeans(24, random_state=3, max_iter=12, tol=0, max_imbalance=2.0, checkpoint=ck,
               client=client).fit(skewed, resume=True)


@pytest.mark.parametrize("bad", [1.0, 0.5, -2.0, "2"])
def test_max_imbalance_should_be_a_number_above_one(client, bad):
    with pytest.raises(InvalidParameterError, match=r"max_imbalance=.* should be (> 1|a real number)"):
        KMeans(3, max_imbalance=bad, client=client).fit(np.random.default_rng(0).random((50, 2)))
