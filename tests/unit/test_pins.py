"""A chunk's pin (the backends' ``pin``): a 64-bit hash of a block's values in row order, equal
for equal values, different for any changed or moved value; the GPU's (``pin_words``) is the
wrapped sum of splitmix64 terms of the 32-bit words, computed here by hand in NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans.backends import get_backend

GOLDEN, M1, M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
MASK = (1 << 64) - 1


def words_pin(x: np.ndarray) -> int:
    """``pin_words``'s sum, one word at a time in Python integers."""
    total = 0
    for i, w in enumerate(np.ascontiguousarray(x).reshape(-1).view(np.uint32).tolist()):
        h = (w + i * GOLDEN) & MASK
        h = ((h ^ (h >> 30)) * M1) & MASK
        h = ((h ^ (h >> 27)) * M2) & MASK
        total = (total + (h ^ (h >> 31))) & MASK
    return total


BACKENDS = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]


def test_the_host_pin_is_xxh3_of_the_bytes():
    import xxhash

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    pin = get_backend("numpy").pin
    assert pin(x) == xxhash.xxh3_64_intdigest(x.tobytes())
    assert pin(np.asfortranarray(x)) == pin(x)  # the values in row order, whatever the layout


def test_words_pin_by_hand():
    # One word 0 at index 0: h = 0, every step keeps 0, so the pin is 0; one word 1: the
    # finaliser of 1.
    assert words_pin(np.zeros(1, np.float32)) == 0
    h = 1
    h = ((h ^ (h >> 30)) * M1) & MASK
    h = ((h ^ (h >> 27)) * M2) & MASK
    assert words_pin(np.array([1], np.uint32).view(np.float32)) == h ^ (h >> 31)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_any_change_changes_the_pin_and_nothing_else_does(backend, dtype):
    be = get_backend(backend)
    x = np.random.default_rng(4).standard_normal((3000, 6)).astype(dtype)
    base = be.pin(be.asarray(x))
    assert be.pin(be.asarray(x.copy())) == base
    y = x.copy()
    y[2999, 5] = np.nextafter(y[2999, 5], dtype(np.inf))  # one ulp of the last value
    z = x.copy()
    z[[0, 1]] = z[[1, 0]]  # two rows swapped
    pins = {base, be.pin(be.asarray(y)), be.pin(be.asarray(z)), be.pin(be.asarray(x[:, ::-1].copy()))}
    assert len(pins) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_gpu_pin_is_the_words_sum(dtype):
    import cupy

    be = get_backend("cupy")
    x = np.random.default_rng(5).standard_normal((1000, 7)).astype(dtype)
    assert be.pin(cupy.asarray(x)) == words_pin(x)
    big = cupy.random.standard_normal((1 << 20, 3), dtype=cupy.float32)  # many blocks and atomics
    assert be.pin(big) == be.pin(big.copy())
