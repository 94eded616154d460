"""NumPy kernels: exact float32/float64 nearest-centroid assignment and float64 partial sums.

Distances are computed as ``||c||^2 - 2 x.c`` by GEMM over row tiles whose ``rows x K``
distance block is bounded in bytes (``daskmeans.tile-bytes``), so the N x K matrix never
exists whole. Per-cluster sums avoid ``np.add.at`` (one scattered update per row): for small
K a one-hot GEMM, for larger K a stable sort of the tile's labels and a segmented
``np.add.reduceat`` accumulated in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy

from .. import config

name = "numpy"
xp = numpy


def asarray(block: Any, dtype: Any = None) -> numpy.ndarray:
    return numpy.ascontiguousarray(block, dtype=dtype)


def to_numpy(a: Any) -> numpy.ndarray:
    return numpy.asarray(a)


@dataclass(frozen=True)
class Prepared:
    """Centroid-side precomputation for one iteration (shared by all blocks)."""

    centroids: numpy.ndarray  # (K, D) in the data dtype
    neg2_ct: numpy.ndarray  # (D, K) = -2 * centroids.T, C-contiguous for the GEMM
    sqnorm: numpy.ndarray  # (K,) ||c||^2 in the data dtype

    @property
    def k(self) -> int:
        return self.centroids.shape[0]


def prepare(centroids: Any, dtype: Any) -> Prepared:
    """Cast centroids ``(K, D)`` to the data dtype and precompute ``-2 C^T`` and ``||c||^2``."""
    c = numpy.ascontiguousarray(centroids, dtype=dtype)
    sq = numpy.einsum("kd,kd->k", c.astype(numpy.float64), c.astype(numpy.float64)).astype(dtype)
    return Prepared(c, numpy.ascontiguousarray((-2 * c).T), sq)


def _tile_rows(k: int, itemsize: int) -> int:
    return max(64, config.get_bytes("tile-bytes") // max(1, k * itemsize))


def _tile_nearest(xt: numpy.ndarray, p: Prepared) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Labels (int32, lowest index on ties) and clamped squared distances of one tile."""
    g = xt @ p.neg2_ct
    g += p.sqnorm
    lab = g.argmin(axis=1).astype(numpy.int32)
    d2 = g[numpy.arange(len(lab)), lab].astype(numpy.float64)
    d2 += numpy.einsum("nd,nd->n", xt, xt, dtype=numpy.float64)
    numpy.maximum(d2, 0.0, out=d2)
    return lab, d2


def min_sqdist(X: numpy.ndarray, p: Prepared) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Nearest centroid of each row.

    Parameters
    ----------
    X : ndarray, shape (n, d)
    p : Prepared centroids, K rows

    Returns
    -------
    labels : ndarray of int32, shape (n,)
    sqdist : ndarray of float64, shape (n,)
    """
    n = X.shape[0]
    labels = numpy.empty(n, numpy.int32)
    d2 = numpy.empty(n, numpy.float64)
    step = _tile_rows(p.k, X.dtype.itemsize)
    for s in range(0, n, step):
        labels[s : s + step], d2[s : s + step] = _tile_nearest(X[s : s + step], p)
    return labels, d2


def _sums_onehot(xt, lab, k, w, sums):
    rows = int(config.get("onehot-rows"))
    ar = numpy.arange(k, dtype=numpy.int32)[:, None]
    for s in range(0, len(lab), rows):
        oh = (lab[None, s : s + rows] == ar).astype(xt.dtype)
        if w is not None:
            oh *= w[None, s : s + rows].astype(xt.dtype)
        sums += oh @ xt[s : s + rows]


def _sums_sorted(xt, lab, k, w, sums):
    order = numpy.argsort(lab, kind="stable")
    sl = lab[order]
    xs = xt[order]
    if w is not None:
        xs = xs * w[order, None].astype(numpy.float64)
    starts = numpy.flatnonzero(numpy.r_[True, sl[1:] != sl[:-1]])
    sums[sl[starts]] += numpy.add.reduceat(xs, starts, axis=0, dtype=numpy.float64)


def assign(
    X: numpy.ndarray,
    p: Prepared,
    sample_weight: numpy.ndarray | None = None,
    want_sums: bool = True,
) -> dict[str, Any]:
    """Assign each row to its nearest centroid and accumulate per-cluster statistics.

    Parameters
    ----------
    X : ndarray, shape (n, d), float32 or float64
    p : Prepared centroids (K, d), same dtype as X
    sample_weight : ndarray, shape (n,), optional
    want_sums : bool
        If False, only labels and inertia are computed (prediction / scoring).

    Returns
    -------
    dict with ``labels`` (n,) int32, ``inertia`` float (weighted sum of squared distances),
    and when ``want_sums``: ``sums`` (K, d) float64, ``weights`` (K,) float64 and
    ``counts`` (K,) int64.
    """
    n = X.shape[0]
    k = p.k
    labels = numpy.empty(n, numpy.int32)
    inertia = 0.0
    out: dict[str, Any] = {"labels": labels}
    if want_sums:
        sums = numpy.zeros((k, X.shape[1]), numpy.float64)
        sum_fn = _sums_onehot if k <= int(config.get("onehot-max-k")) else _sums_sorted
    step = _tile_rows(k, X.dtype.itemsize)
    for s in range(0, n, step):
        xt = X[s : s + step]
        wt = None if sample_weight is None else sample_weight[s : s + step]
        lab, d2 = _tile_nearest(xt, p)
        labels[s : s + step] = lab
        inertia += float(d2.sum() if wt is None else d2 @ wt.astype(numpy.float64))
        if want_sums:
            sum_fn(xt, lab, k, wt, sums)
    out["inertia"] = inertia
    if want_sums:
        counts = numpy.bincount(labels, minlength=k).astype(numpy.int64)
        weights = (
            counts.astype(numpy.float64)
            if sample_weight is None
            else numpy.bincount(labels, weights=sample_weight, minlength=k)
        )
        out.update(sums=sums, weights=weights, counts=counts)
    return out


def sqdistances(X: numpy.ndarray, p: Prepared) -> numpy.ndarray:
    """Squared distances ``(n, K)`` from every row to every centroid (float64, clamped at 0)."""
    g = (X @ p.neg2_ct).astype(numpy.float64)
    g += p.sqnorm
    g += numpy.einsum("nd,nd->n", X, X, dtype=numpy.float64)[:, None]
    return numpy.maximum(g, 0.0, out=g)
