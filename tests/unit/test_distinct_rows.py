"""The count of distinct centroids behind the fit's "copies of others" warning
(``estimator._distinct_rows``): what ``np.unique(c, axis=0)`` counts, by row hashes."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans import estimator


def test_by_hand():
    a = np.array([[1.0, 2.0], [0.0, -0.0], [1.0, 2.0], [-0.0, 0.0], [2.0, 1.0], [1.0, 2.0]])
    # {(1, 2), (0, 0), (2, 1)}: -0.0 is the value 0.0.
    assert estimator._distinct_rows(a) == 3
    assert estimator._distinct_rows(a[:1]) == 1 and estimator._distinct_rows(a[:0]) == 0


@pytest.mark.parametrize("colliding", [False, True])
def test_counts_as_numpy_unique(monkeypatch, colliding):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3000, 9)).astype(np.float32)
    a[rng.integers(0, 3000, 400)] = a[rng.integers(0, 3000, 400)]  # copies of other rows
    a[::7, 3] = 0.0
    if colliding:  # every row hashed alike: the rows themselves decide
        monkeypatch.setattr(estimator, "column_keys", lambda xp, d: xp.zeros(d, xp.uint64))
    assert estimator._distinct_rows(a) == len(np.unique(a.astype(np.float64), axis=0)) < 3000


def test_many_copies_in_one_pass():
    """Many copies (the fits the warning is for): each hash's rows compared at once, NumPy's
    unique never called; the same count as NumPy's, NaN rows included."""
    rng = np.random.default_rng(2)
    a = np.repeat(rng.standard_normal((5000, 16)), 3, axis=0)
    a[::1000] = np.nan  # NaN rows: NumPy's own count
    expected = len(np.unique(a, axis=0))
    assert estimator._distinct_rows(a[rng.permutation(len(a))]) == expected
