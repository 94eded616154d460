"""The balancing of chunks over workers by hand (owned.balance_owners, plan.balance_chunks): pure
functions of the chunks' holders, rows and the workers' threads; no cluster."""

import dask.array as da
import pytest

from daskmeans.engine.owned import balance_owners
from daskmeans.engine.plan import balance_chunks


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
    assert balance_owners(holders, rows, nthreads) == owners


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
