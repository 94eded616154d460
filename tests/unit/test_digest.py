"""The data's content digest (numerics.digest): the same for any chunking, different for
any change of a value or of the rows' order."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans.numerics.digest import MASK, block_digest, combine


def _digest(x, cuts):
    bounds = [0, *cuts, len(x)]
    return combine(*(block_digest(np, x[a:b], a) for a, b in zip(bounds[:-1], bounds[1:])))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_same_for_any_chunking(dtype):
    x = np.random.default_rng(0).standard_normal((50_000, 7)).astype(dtype)
    whole = block_digest(np, x, 0)
    assert 0 <= whole <= MASK
    for cuts in ([1], [17, 30_000], list(range(1000, 50_000, 1000))):
        assert _digest(x, cuts) == whole


def test_any_change_changes_it():
    x = np.random.default_rng(1).standard_normal((1000, 5)).astype(np.float32)
    base = block_digest(np, x, 0)
    seen = {base}
    y = x.copy()
    y[500, 3] = np.nextafter(y[500, 3], np.float32(np.inf))  # one ulp
    seen.add(block_digest(np, y, 0))
    seen.add(block_digest(np, x[[1, 0, *range(2, 1000)]], 0))  # two rows swapped
    seen.add(block_digest(np, x[:, [1, 0, 2, 3, 4]], 0))  # two columns swapped
    seen.add(block_digest(np, x, 1))  # the same rows elsewhere in the data
    seen.add(block_digest(np, x.astype(np.float64), 0))  # another dtype
    assert len(seen) == 6


def test_by_hand_one_row():
    # One row [0.0] at offset 0: the value's bits are 0, so the row's sum is 0 and its hash is
    # mix(mix(0) + 0) = mix(0) = 0.
    assert block_digest(np, np.zeros((1, 1), np.float64), 0) == 0
    assert block_digest(np, np.zeros((0, 3), np.float32), 0) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_gpu_gives_the_cpus_bits(dtype):
    import cupy

    x = np.random.default_rng(2).standard_normal((40_000, 9)).astype(dtype)
    assert block_digest(cupy, cupy.asarray(x), 123) == block_digest(np, x, 123)
    w = np.random.default_rng(3).random(40_000)
    assert block_digest(cupy, cupy.asarray(w), 5) == block_digest(np, w, 5)
