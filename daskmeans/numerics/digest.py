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

from .hashing import MASK, column_keys, row_hashes

_ROWS = 1 << 14  # rows hashed at a time: the (rows, d) uint64 temporary stays small


def block_digest(xp: Any, block: Any, row_offset: int) -> int:
    """The digest of ``block`` (n, d) (or (n,) weights) whose first row is global row
    ``row_offset``: the wrapped sum over rows ``i`` of their hashes
    (:func:`~daskmeans.numerics.hashing.row_hashes`).

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
        raise TypeError(f"cannot digest values of dtype {a.dtype}: a digest reads values of 1, 2, 4 or 8 bytes")
    keys = column_keys(xp, d)
    total = 0
    for s in range(0, n, _ROWS):
        # Python ints from here: the wrapped sum is taken once, at the end.
        total += int(row_hashes(xp, bits[s : s + _ROWS].astype(xp.uint64), keys, row_offset + s).sum(dtype=xp.uint64))
    return total & MASK


def combine(*digests: int) -> int:
    """The digest of the union of disjoint row ranges."""
    return sum(digests) & MASK
