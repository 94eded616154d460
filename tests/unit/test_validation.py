"""The parameter constraints (validation.py) by hand: each refusal states the value and the
requirement; accepted values pass; seeds drawn from generators as scikit-learn draws them."""

import numpy as np
import pytest

from daskmeans.errors import InvalidParameterError
from daskmeans.validation import AnyOf, ArrayLike, ByteSize, Interval, NoneOr, Options, RandomStateLike, seed_of


@pytest.mark.parametrize("constraint, value, message", [
    (Interval(1, None, integer=True), 0, "n=0 should be >= 1"),
    (Interval(1, None, integer=True), 1.5, "n=1.5 should be an integer"),
    (Interval(1, None, integer=True), True, "n=True should be an integer"),  # a bool is no count
    (Interval(0, None), "3", "n='3' should be a real number"),
    (Interval(0, None, closed="neither"), 0, "n=0 should be > 0"),
    (Interval(0, 1, closed="left"), 1, "n=1 should be < 1"),
    (Interval(0, 1), 1.01, "n=1.01 should be <= 1"),
    (Options(("a", "b")), "c", "n='c' should be one of 'a', 'b'"),
    (Options(("a", "b")), 1, "n=1 should be one of 'a', 'b'"),
    (ByteSize(), 0, "n=0 should be a size such as '4GiB' or a number of bytes > 0"),
    (ByteSize(), "lots", "n='lots' should be a size such as '4GiB' or a number of bytes > 0"),
    (ByteSize(), True, "n=True should be a size such as '4GiB' or a number of bytes > 0"),
    (RandomStateLike(), -1, "n=-1 should be >= 0"),
    (RandomStateLike(), 2**32, "n=4294967296 should be <= 4294967295"),
    (NoneOr(Interval(1, None)), 0, "n=0 should be >= 1"),
    (AnyOf(Options(("k-means||", "random")), ArrayLike()), "x",
     "n='x' should be one of 'k-means||', 'random' or be an array of shape (n_clusters, n_features) or a .npy path"),
])
def test_constraint_refuses_with_value_and_requirement(constraint, value, message):
    with pytest.raises(InvalidParameterError) as e:
        constraint.check("n", value)
    assert str(e.value) == message


@pytest.mark.parametrize("constraint, value", [
    (Interval(1, None, integer=True), np.int64(3)),  # NumPy integers are integers
    (Interval(0, 1, closed="neither"), 0.5),
    (Interval(0, None), np.float32(2.5)),
    (ByteSize(), "4GiB"), (ByteSize(), "auto"), (ByteSize(), 1),
    (RandomStateLike(), 0), (RandomStateLike(), np.random.default_rng(1)), (RandomStateLike(), np.random.RandomState(1)),
    (NoneOr(Interval(1, None)), None),
    (AnyOf(Options(("random",)), ArrayLike()), np.zeros((2, 2))), (AnyOf(Options(("random",)), ArrayLike()), "c.npy"),
])
def test_constraint_accepts(constraint, value):
    constraint.check("n", value)


def test_seed_of_draws_from_generators_as_scikit_learn_does():
    assert seed_of(7) == 7 and seed_of(None) is None
    assert seed_of(np.random.default_rng(0)) == int(np.random.default_rng(0).integers(0, 2**32))
    assert seed_of(np.random.RandomState(0)) == int(np.random.RandomState(0).randint(0, 2**32, dtype=np.uint64))
