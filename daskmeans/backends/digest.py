"""A content digest of row blocks that does not depend on how the rows are chunked.

Each row is hashed from its values' bits and its global index (so a changed value, a
swapped pair of rows or a shifted block all change it), then the row hashes are added
modulo 2**64. Addition of integers is associative and commutative: the digest of the whole
data is the wrapped sum of its blocks' digests, in any order, on any number of workers.

Pure functions on one in-memory block (NumPy or CuPy alike: the same integer operations,
so the same bits on either).
"""

from __future__ import annotations

from typing import Any

import numpy as np

MASK = (1 << 64) - 1
_ROWS = 1 << 14  # rows hashed at a time: the (rows, d) uint64 temporary stays small
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(xp: Any, h: Any) -> Any:
    """splitmix64's finaliser, elementwise on uint64 (a bijection that spreads every bit): the
    one row hash of the package (the digest's terms, the balancing's per-row keys), the same
    bits with NumPy and CuPy."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _column_keys(xp: Any, d: int) -> Any:
    """An odd, well-mixed uint64 multiplier per column (a value's hash weight by position)."""
    return splitmix64(xp, xp.arange(1, d + 1, dtype=xp.uint64) * _GOLDEN) | np.uint64(1)


def block_digest(xp: Any, block: Any, row_offset: int) -> int:
    """The digest of ``block`` (n, d) (or (n,) weights) whose first row is global row
    ``row_offset``: the wrapped sum over rows ``i`` of
    ``mix(mix(sum_j bits_ij * key_j) + i * golden)``.

    Returns
    -------
    int
        In [0, 2**64).
    """
    if block.shape[0] == 0:
        return 0
    a = xp.ascontiguousarray(block if block.ndim == 2 else block[:, None])
    n, d = a.shape
    bits = a.view(xp.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else None
    if bits is None:
        raise TypeError(f"cannot digest values of dtype {a.dtype}")
    keys = _column_keys(xp, d)
    total = 0
    with np.errstate(over="ignore"):
        for s in range(0, n, _ROWS):
            part = bits[s : s + _ROWS].astype(xp.uint64)
            row = splitmix64(xp, (part * keys[None, :]).sum(axis=1, dtype=xp.uint64))
            idx = xp.arange(row_offset + s, row_offset + s + part.shape[0], dtype=xp.uint64)
            total += int(splitmix64(xp, row + idx * _GOLDEN).sum(dtype=xp.uint64))
    return total & MASK


def combine(*digests: int) -> int:
    """The digest of the union of disjoint row ranges."""
    return sum(digests) & MASK
