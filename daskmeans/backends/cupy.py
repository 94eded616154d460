"""CuPy kernels: the same contract as :mod:`daskmeans.backends.numpy`, on the GPU.

This first version is deliberately plain (cuBLAS GEMM over row tiles, argmin, scatter-add
of float64 partial sums); the fused assign-and-partial-sum kernels are tracked separately.
CuPy is imported lazily so that importing daskmeans never needs a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy

from .. import config


def __getattr__(attr: str) -> Any:
    if attr == "xp":
        import cupy

        return cupy
    raise AttributeError(attr)


name = "cupy"


def asarray(block: Any, dtype: Any = None) -> Any:
    import cupy

    return cupy.ascontiguousarray(cupy.asarray(block, dtype=dtype))


def to_numpy(a: Any) -> numpy.ndarray:
    import cupy

    return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else numpy.asarray(a)


@dataclass(frozen=True)
class Prepared:
    centroids: Any  # (K, D) cupy, data dtype
    neg2_ct: Any  # (D, K)
    sqnorm: Any  # (K,)

    @property
    def k(self) -> int:
        return self.centroids.shape[0]


def prepare(centroids: Any, dtype: Any) -> Prepared:
    import cupy

    c = cupy.ascontiguousarray(cupy.asarray(centroids, dtype=dtype))
    c64 = c.astype(cupy.float64)
    sq = (c64 * c64).sum(axis=1).astype(dtype)
    return Prepared(c, cupy.ascontiguousarray((-2 * c).T), sq)


def _tile_rows(k: int, itemsize: int) -> int:
    # GPU tiles are larger than CPU cache tiles: 16x the CPU budget keeps the GEMM efficient.
    return max(1024, 16 * config.get_bytes("tile-bytes") // max(1, k * itemsize))


def _tile_nearest(xt, p):
    import cupy

    g = xt @ p.neg2_ct
    g += p.sqnorm
    lab = g.argmin(axis=1).astype(cupy.int32)
    d2 = g[cupy.arange(len(lab)), lab].astype(cupy.float64)
    xt64 = xt.astype(cupy.float64)
    d2 += (xt64 * xt64).sum(axis=1)
    cupy.maximum(d2, 0.0, out=d2)
    return lab, d2


def min_sqdist(X, p):
    import cupy

    n = X.shape[0]
    labels = cupy.empty(n, cupy.int32)
    d2 = cupy.empty(n, cupy.float64)
    step = _tile_rows(p.k, X.dtype.itemsize)
    for s in range(0, n, step):
        labels[s : s + step], d2[s : s + step] = _tile_nearest(X[s : s + step], p)
    return labels, d2


def assign(X, p, sample_weight=None, want_sums: bool = True) -> dict[str, Any]:
    import cupy
    import cupyx

    n, d = X.shape
    k = p.k
    labels = cupy.empty(n, cupy.int32)
    inertia = cupy.zeros((), cupy.float64)
    if want_sums:
        sums = cupy.zeros((k, d), cupy.float64)
    step = _tile_rows(k, X.dtype.itemsize)
    for s in range(0, n, step):
        xt = X[s : s + step]
        wt = None if sample_weight is None else sample_weight[s : s + step].astype(cupy.float64)
        lab, d2 = _tile_nearest(xt, p)
        labels[s : s + step] = lab
        inertia += d2.sum() if wt is None else d2 @ wt
        if want_sums:
            xs = xt.astype(cupy.float64)
            if wt is not None:
                xs *= wt[:, None]
            cupyx.scatter_add(sums, lab, xs)
    out: dict[str, Any] = {"labels": labels, "inertia": float(inertia)}
    if want_sums:
        counts = cupy.bincount(labels, minlength=k).astype(cupy.int64)
        weights = (
            counts.astype(cupy.float64)
            if sample_weight is None
            else cupy.bincount(labels, weights=sample_weight.astype(cupy.float64), minlength=k)
        )
        out.update(sums=sums, weights=weights, counts=counts)
    return out


def sqdistances(X, p):
    """Squared distances ``(n, K)`` from every row to every centroid (float64, clamped at 0)."""
    import cupy

    g = (X @ p.neg2_ct).astype(cupy.float64)
    g += p.sqnorm
    x64 = X.astype(cupy.float64)
    g += (x64 * x64).sum(axis=1)[:, None]
    return cupy.maximum(g, 0.0)
