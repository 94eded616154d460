"""Pure units, by hand: the parameter constraints (validation.py), the balancing of chunks over
workers (placement._balance, balance_chunks) and the tree reduction of futures (reduction.tree_reduce)."""

import dask.array as da
import numpy as np
import pytest

from daskmeans.errors import InvalidParameterError
from daskmeans.placement import _balance, balance_chunks
from daskmeans.reduction import tree_reduce
from daskmeans.validation import AnyOf, ArrayLike, ByteSize, Interval, NoneOr, Options, RandomStateLike, seed_of


# ------------------------------------------------------------------ constraints


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


# ------------------------------------------------------------------ chunk balancing


@pytest.mark.parametrize("holders, rows, nthreads, owners", [
    # Everything on one worker of two: it keeps its share, the rest moves.
    (["a"] * 4, [10] * 4, {"a": 1, "b": 1}, ["a", "a", "b", "b"]),
    # Shares follow the threads: b has three of four.
    (["a"] * 4, [10] * 4, {"a": 1, "b": 3}, ["a", "b", "b", "b"]),
    # Already balanced: nothing moves.
    (["a", "b", "a", "b"], [10] * 4, {"a": 1, "b": 1}, ["a", "b", "a", "b"]),
    # A chunk whose holder has gone goes to the emptiest worker.
    (["x", "a"], [10, 10], {"a": 1, "b": 1}, ["b", "a"]),
    # Unequal chunks: a keeps the big one (its share), b gets the small ones.
    (["a", "a", "a"], [30, 10, 20], {"a": 1, "b": 1}, ["a", "b", "b"]),
    # No holder and a tie: the later name, always the same.
    ([None], [4], {"a": 1, "b": 1}, ["b"]),
])
def test_balance_by_hand(holders, rows, nthreads, owners):
    assert _balance(holders, rows, nthreads) == owners


@pytest.mark.parametrize("chunks, n_workers, expected", [
    ((12000,), 1, (12000,)),  # one worker: nothing to share
    ((12000,), 2, (6000, 6000)),  # one chunk: one per worker
    ((100_000,) * 15, 2, (93_750,) * 16),  # 8 + 7 chunks is 7% over an equal share: 16 chunks
    ((1000,) * 16, 2, (1000,) * 16),  # 8 + 8: kept
    ((1000,) * 101, 2, (1000,) * 101),  # 51 + 50: within 2%, kept (a kernel call has a fixed cost)
    ((1000, 9000), 2, (5000, 5000)),  # unequal chunks: equal ones
    ((1500,), 2, (1500,)),  # too few rows for two chunks of min-chunk-rows (1024)
    ((7, 33_000, 26_993), 1, (7, 33_000, 26_993)),  # one worker holds everything anyway
    ((3000, 1000, 1000, 1000), 2, (3000, 1000, 1000, 1000)),  # 3000 | 1000 x 3: equal shares
])
def test_balance_chunks_by_hand(chunks, n_workers, expected):
    X = da.zeros((sum(chunks), 3), chunks=(chunks, 3))
    assert balance_chunks(X, n_workers).chunks[0] == expected


# ------------------------------------------------------------------ tree reduction


def _wrap(items):
    return "(" + "".join(items) + ")"


def _shout(root, suffix):
    return root.upper() + suffix


def test_tree_reduce_groups_contiguous_runs_in_order(client):
    futs = [client.submit(str, c, pure=False) for c in "abcde"]
    # fan-in 2: (ab)(cd)(e) -> ((ab)(cd))((e)) -> the root
    assert tree_reduce(client, futs, _wrap, "t", split_every=2).result() == "(((ab)(cd))((e)))"
    assert tree_reduce(client, futs, _wrap, "t", split_every=8).result() == "(abcde)"
    assert tree_reduce(client, futs[:1], _wrap, "t", split_every=2).result() == "(a)"  # combined at least once
    root = tree_reduce(client, futs, _wrap, "t", split_every=3, finalize=_shout, finalize_args=("!",))
    assert root.result() == "((ABC)(DE))!"
    with pytest.raises(ValueError, match="split_every=1 should be >= 2"):
        tree_reduce(client, futs, _wrap, "t", split_every=1)


@pytest.mark.parametrize("how,n_gpus,expected", [
    ("auto", 1, True), ("threads", 1, True), ("processes", 1, False),
    ("auto", 2, False), ("threads", 2, False), ("auto", 8, False),
])
def test_only_one_gpu_runs_its_worker_in_process(how, n_gpus, expected):
    """Several GPUs need a worker process each: an in-process cluster of one worker would
    leave every GPU but the first idle."""
    import dask

    from daskmeans import config

    with dask.config.set({"daskmeans.local-cluster": how}):
        assert config.gpu_in_process(n_gpus) is expected
