"""The Lloyd step's record (engine.step.IterationStats) and the re-seeding hook's composition
(engine.reseed): the keys the history and callbacks receive, the stop rule, and which variant
acts in which iteration, without a cluster."""

from __future__ import annotations

import numpy as np

from daskmeans.engine.reseed import EmptyClusters, FirstOf, Reduced, Reseeded, SizeBalance, for_fit
from daskmeans.engine.step import IterationStats, Layout
from daskmeans.numerics.grid import Grid

# What a fit's history_ and users' callbacks have always received, in this order.
KEYS = ["iteration", "inertia", "shift", "reassigned", "n_empty", "rechecked", "imbalance", "n_moved",
        "kernel_seconds", "collective_seconds", "update_seconds", "seconds", "gb_per_s"]


def stats(**kw) -> IterationStats:
    base = dict(iteration=1, inertia=2.0, shift=0.5, reassigned=3, n_empty=0, rechecked=0.0, imbalance=1.2,
                n_moved=0, kernel_seconds=0.1, collective_seconds=0.01, update_seconds=0.02, seconds=0.2,
                gb_per_s=1.5)
    return IterationStats(**{**base, **kw})


def test_the_record_gives_the_history_its_keys_and_no_more():
    s = stats(end_segment=True)
    d = s.as_dict()
    assert list(d) == KEYS
    assert d["iteration"] == 1 and d["inertia"] == 2.0 and d["gb_per_s"] == 1.5


def test_the_stop_rule_is_scikit_learns_and_a_balancing_step_is_no_fixed_point():
    assert stats(reassigned=0).settled(1e-4)
    assert stats(shift=1e-5).settled(1e-4)
    assert not stats().settled(1e-4)
    assert not stats(reassigned=0, n_moved=2).settled(1e-4)


def test_the_layout_sends_the_weights_onwards_to_the_host():
    lay = Layout(3, 2, 4)  # sums 6, weights 3, counts 3, inertia 4, reassigned, rechecked, flag
    assert (lay.sums, lay.weights, lay.counts) == (slice(0, 6), slice(6, 9), slice(9, 12))
    assert (lay.inertia, lay.reassigned, lay.rechecked, lay.flag, lay.n) == (12, 16, 17, 18, 19)
    assert lay.host_words == 13


def test_the_layout_carries_the_inertias_sums_in_place_of_the_chunks_slots():
    lay = Layout(3, 2, 4, qsums=True)  # sums 6, weights 3, counts 3, qsums 3, reassigned, rechecked, flag
    assert (lay.sums, lay.weights, lay.counts, lay.qsums) == (slice(0, 6), slice(6, 9), slice(9, 12), slice(12, 15))
    assert lay.inertia is None
    assert (lay.reassigned, lay.rechecked, lay.flag, lay.n) == (15, 16, 17, 18)
    assert lay.host_words == 12


def reduced(weights, counts, n_samples) -> Reduced:
    k = len(counts)
    return Reduced(shard=None, comm=None, iteration=0, centroids=None, isums=np.zeros((k, 2), np.int64),
                   iweights=np.asarray(weights, np.int64), weights=np.asarray(weights, np.int64),
                   counts=np.asarray(counts, np.int64), grid=Grid(np.ones(2), float(n_samples)),
                   n_samples=n_samples)


def test_imbalance_is_the_largest_cluster_over_the_mean():
    assert reduced([1, 1, 1, 1], [10, 30, 40, 20], 100).imbalance == 40 * 4 / 100


def test_neither_variant_acts_where_nothing_is_empty_or_too_large():
    """No collective is called (the facts have none): every rank returns None alike."""
    r = reduced([5, 5, 5, 5], [25, 25, 30, 20], 100)
    assert EmptyClusters()(r) is None
    assert SizeBalance(1.5, 0)(r) is None  # 1.2 times the mean: within the bound
    assert for_fit(1.5, 0)(r) is None


class Fake:
    def __init__(self, out):
        self.out, self.asked = out, 0

    def __call__(self, r):
        self.asked += 1
        return self.out


def test_the_first_variant_that_reseeds_wins_and_the_rest_are_not_asked():
    r = reduced([1, 1], [1, 1], 2)
    first = Reseeded(r.isums, r.iweights)
    none, a, b = Fake(None), Fake(first), Fake(Reseeded(r.isums, r.iweights, n_moved=1))
    assert FirstOf((none, a, b))(r) is first
    assert (none.asked, a.asked, b.asked) == (1, 1, 0)
    assert FirstOf((none,))(r) is None


def test_a_fit_reseeds_empty_clusters_before_it_balances():
    assert for_fit(None, 7) == EmptyClusters()
    assert for_fit(2.0, 7) == FirstOf((EmptyClusters(), SizeBalance(2.0, 7)))
