"""Order-free exact combination of float64 partial sums: two 32-bit fixed-point limbs.

Each float64 value ``v`` of a feature whose sums are bounded by ``2**E`` in magnitude is cut,
with exact operations only (scaling by powers of two, truncation, subtraction), into integer
limbs ``l0, l1`` in ``(-2**32, 2**32)`` with ``v ~= (l0 * 2**32 + l1) * 2**(E - 64)``; the
bits below ``2**(E - 64)`` are dropped, the same way wherever the value was computed. Limbs
are added as int64, exactly and in any order, so the combined value depends only on the set of
per-chunk partials, never on how chunks were spread over workers or in what order the
workers' buffers arrived. One int64 holds the sum of up to ``2**31`` chunks' limbs.

The resolution is ``2**(E - 64)``, with ``2**E`` at least the largest possible sum (the largest
absolute value of the feature times the total sample weight): for 10**10 rows that is still
2**-31 of the feature's range, finer than float32 data carry.

Functions work on NumPy and CuPy arrays alike (identical IEEE operations, so identical bits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backends import get_backend

LIMBS = 2
_LIMB = 32


def exponents(max_abs: np.ndarray, total_weight: float) -> np.ndarray:
    """Per-feature exponents ``E`` with ``2**E`` above any sum of weighted values.

    Parameters
    ----------
    max_abs : ndarray, shape (d,)
        Largest absolute value of each feature over the data.
    total_weight : float
        Sum of the sample weights (the row count when unweighted).

    Returns
    -------
    ndarray of int64, shape (d,)
    """
    bound = np.asarray(max_abs, np.float64) * max(float(total_weight), 1.0)
    return np.array([math.frexp(b)[1] + 1 if b > 0 else 0 for b in bound], np.int64)


def to_limbs(x: Any, exps: Any) -> Any:
    """Fixed-point limbs of ``x`` (..., d) float64 with per-feature ``exps`` (d,): int64
    array of shape (2, ..., d)."""
    xp = get_backend(x).xp
    r = xp.ldexp(xp.asarray(x, dtype=xp.float64), -xp.asarray(exps, dtype=xp.int32))
    out = []
    for _ in range(LIMBS):
        r = xp.ldexp(r, _LIMB)
        t = xp.trunc(r)
        out.append(t)
        r = r - t
    return xp.stack(out).astype(xp.int64)


def from_limbs(limbs: Any, exps: Any) -> Any:
    """float64 values (..., d) of summed limbs (2, ..., d): the carries are propagated first,
    so the two terms added are exact and the result is rounded once."""
    xp = get_backend(limbs).xp
    hi, lo = limbs[0], limbs[1]
    carry = lo >> _LIMB  # floor division by 2**32: 0 <= lo - carry * 2**32 < 2**32
    lo = lo - (carry << _LIMB)
    hi = hi + carry
    e = xp.asarray(exps, dtype=xp.int32)
    return xp.ldexp(hi.astype(xp.float64), e - _LIMB) + xp.ldexp(lo.astype(xp.float64), e - 2 * _LIMB)
