"""A new init is one module and one registry entry (design.md, "Seams"): a dummy registered in
:data:`daskmeans.seeding.REGISTRY` is accepted by the estimator and runs on the workers."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans import KMeans
from daskmeans.seeding import REGISTRY, Init


@pytest.fixture
def random_again():
    entry = Init("random-again", "extension_init", "init_random_again", "the random init, again (a test's)")
    REGISTRY[entry.name] = entry
    try:
        yield entry.name
    finally:
        del REGISTRY[entry.name]


def test_a_registered_init_runs_a_fit(client, random_again):
    X = np.random.default_rng(3).standard_normal((600, 3))
    mine = KMeans(4, init=random_again, n_init=1, max_iter=5, random_state=7).fit(X)
    theirs = KMeans(4, init="random", n_init=1, max_iter=5, random_state=7).fit(X)
    assert mine.init == "random-again"
    assert np.array_equal(mine.cluster_centers_, theirs.cluster_centers_)
    assert np.array_equal(np.asarray(mine.labels_), np.asarray(theirs.labels_))


def test_an_unregistered_name_is_refused_with_the_registered_ones(random_again):
    with pytest.raises(ValueError, match=r"init.*'random-again'"):
        KMeans(4, init="no-such-init").fit(np.zeros((10, 2)))
