"""Per-cluster partial statistics and their order-fixed combination.

A :class:`Partial` is what one task returns for the rows it saw; partials are added up by
a tree of tasks (see :mod:`daskmeans.lloyd`). Sums are float64 and counts int64 whatever the
data dtype, so the combined result does not depend on how rows were split into chunks beyond
float64 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass
class Partial:
    """Statistics of a set of rows under one set of centroids.

    Attributes
    ----------
    sums : array, shape (K, D), float64
        Weighted per-cluster sums of the rows.
    weights : array, shape (K,), float64
        Per-cluster sum of sample weights (equal to counts when unweighted).
    counts : array, shape (K,), int64
        Rows assigned to each cluster.
    inertia : float
        Weighted sum of squared distances to the nearest centroid.
    n : int
        Number of rows.
    reassigned : int
        Rows whose label differs from the previous iteration (all rows at the first one).
    kernel_seconds : float
        Time spent in backend kernels (max over parallel tasks once combined).
    rechecked : int
        Rows whose nearest centroid was re-ranked by exact distances (GPU GEMM regime: the
        low-precision margin test could not certify them).
    """

    sums: Any
    weights: Any
    counts: Any
    inertia: float
    n: int
    reassigned: int = 0
    kernel_seconds: float = 0.0
    rechecked: int = 0

    def __add__(self, other: "Partial") -> "Partial":
        return Partial(
            self.sums + other.sums,
            self.weights + other.weights,
            self.counts + other.counts,
            self.inertia + other.inertia,
            self.n + other.n,
            self.reassigned + other.reassigned,
            max(self.kernel_seconds, other.kernel_seconds),
            self.rechecked + other.rechecked,
        )


def combine(items: Iterable[Any]) -> Partial:
    """Add partials left to right (a fixed order, so the result is reproducible).

    Items may be :class:`Partial` objects or anything with a ``partial`` attribute (a worker's
    iteration state), so the reduction tree can take step results directly.
    """
    total = None
    for item in items:
        p = item if isinstance(item, Partial) else item.partial
        total = p if total is None else total + p
    if total is None:
        raise ValueError("combine() needs at least one partial")
    return total
