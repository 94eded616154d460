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
from . import PRECISIONS

name = "numpy"
xp = numpy


def asarray(block: Any, dtype: Any = None) -> numpy.ndarray:
    """C-contiguous and aligned (arrays deserialized from the network may be unaligned,
    which sends NumPy and BLAS down slow paths: measured 30% slower)."""
    return numpy.require(block, dtype=dtype, requirements=["C", "A"])


def to_numpy(a: Any) -> numpy.ndarray:
    return numpy.asarray(a)


@dataclass(frozen=True)
class Prepared:
    """Centroid-side precomputation for one iteration (shared by all blocks)."""

    centroids: numpy.ndarray  # (K, D) in the data dtype
    neg2_ct: numpy.ndarray  # (D, K) = -2 * centroids.T, C-contiguous for the GEMM
    sqnorm: numpy.ndarray  # (K,) ||c||^2 in the data dtype
    precision: str = "fp32"

    @property
    def k(self) -> int:
        return self.centroids.shape[0]


def prepare(centroids: Any, dtype: Any, precision: str = "fp32") -> Prepared:
    """Cast centroids ``(K, D)`` to the data dtype and precompute ``-2 C^T`` and ``||c||^2``.

    ``precision`` names a GPU GEMM mode; CPUs have no TF32/BF16 GEMM, so every mode computes
    in the data dtype here."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} should be one of {PRECISIONS}")
    c = numpy.ascontiguousarray(centroids, dtype=dtype)
    sq = numpy.einsum("kd,kd->k", c.astype(numpy.float64), c.astype(numpy.float64)).astype(dtype)
    return Prepared(c, numpy.ascontiguousarray((-2 * c).T), sq, precision)


def _tile_rows(k: int, itemsize: int) -> int:
    return max(64, config.get_bytes("tile-bytes") // max(1, k * itemsize))


class _Workspace:
    """Tile buffers reused across tiles. Dask workers set MALLOC_TRIM_THRESHOLD_=64KiB, so a
    fresh multi-MB temporary per tile is mapped, faulted in and returned to the OS every time
    (measured: the kernel ran 2x slower inside a worker than outside)."""

    def __init__(self, rows: int, k: int, d: int, dtype: Any):
        self.g = numpy.empty((rows, k), dtype)
        self.lab = numpy.empty(rows, numpy.intp)
        self.xs = numpy.empty((rows, d), dtype)
        self.xs64 = numpy.empty((rows, d), numpy.float64)
        groups = min(rows, k)
        self.red = numpy.empty((groups, d), numpy.float64)
        self.acc = numpy.empty((groups, d), numpy.float64)


def _tile_nearest(xt: numpy.ndarray, p: Prepared, ws: _Workspace | None = None) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Labels (int32, lowest index on ties) and clamped squared distances of one tile."""
    n = xt.shape[0]
    if ws is None:
        ws = _Workspace(n, p.k, xt.shape[1], xt.dtype)
    g = numpy.matmul(xt, p.neg2_ct, out=ws.g[:n])
    g += p.sqnorm
    lab = g.argmin(axis=1, out=ws.lab[:n])
    d2 = g[numpy.arange(n), lab].astype(numpy.float64)
    lab = lab.astype(numpy.int32)
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
    ws = _Workspace(min(step, n), p.k, X.shape[1], X.dtype)
    for s in range(0, n, step):
        labels[s : s + step], d2[s : s + step] = _tile_nearest(X[s : s + step], p, ws)
    return labels, d2


def _sums_onehot(xt, lab, k, w, sums, ws):
    rows = int(config.get("onehot-rows"))
    ar = numpy.arange(k, dtype=numpy.int32)[:, None]
    for s in range(0, len(lab), rows):
        oh = (lab[None, s : s + rows] == ar).astype(xt.dtype)
        if w is not None:
            oh *= w[None, s : s + rows].astype(xt.dtype)
        sums += oh @ xt[s : s + rows]


def _sums_sorted(xt, lab, k, w, sums, ws):
    order = numpy.argsort(lab, kind="stable")
    sl = lab[order]
    n = xt.shape[0]
    # Gather rows by cluster straight into a float64 buffer, then one segmented reduction;
    # every large temporary lives in the workspace (mode="clip" avoids take's own buffer).
    xs = numpy.take(xt, order, axis=0, out=ws.xs[:n], mode="clip")
    xs64 = ws.xs64[:n]
    numpy.copyto(xs64, xs)
    if w is not None:
        xs64 *= w[order, None]
    starts = numpy.flatnonzero(numpy.r_[True, sl[1:] != sl[:-1]])
    g = len(starts)
    red = numpy.add.reduceat(xs64, starts, axis=0, out=ws.red[:g])
    ids = sl[starts]
    acc = numpy.take(sums, ids, axis=0, out=ws.acc[:g], mode="clip")
    acc += red
    sums[ids] = acc


def assign(
    X: numpy.ndarray,
    p: Prepared,
    sample_weight: numpy.ndarray | None = None,
    want_sums: bool = True,
    prev_labels: numpy.ndarray | None = None,
    out_labels: numpy.ndarray | None = None,
) -> dict[str, Any]:
    """Assign each row to its nearest centroid and accumulate per-cluster statistics.

    Parameters
    ----------
    X : ndarray, shape (n, d), float32 or float64
    p : Prepared centroids (K, d), same dtype as X
    sample_weight : ndarray, shape (n,), optional
    want_sums : bool
        If False, only labels and inertia are computed (prediction / scoring).
    prev_labels : ndarray of int32, shape (n,), optional
        Labels of the previous iteration: ``reassigned`` counts the rows that changed (all
        rows when not given).
    out_labels : ndarray of int32, shape (n,), optional
        Where to write the labels (may be ``prev_labels``: each tile is compared before it
        is overwritten).

    Returns
    -------
    dict with ``labels`` (n,) int32, ``inertia`` float (weighted sum of squared distances),
    ``reassigned`` and ``rechecked`` (always 0 here: labels come straight from the GEMM) ints,
    and when ``want_sums``: ``sums`` (K, d) float64, ``weights`` (K,) float64 and
    ``counts`` (K,) int64.
    """
    n = X.shape[0]
    k = p.k
    labels = out_labels if out_labels is not None else numpy.empty(n, numpy.int32)
    reassigned = n
    inertia = 0.0
    out: dict[str, Any] = {"labels": labels}
    if want_sums:
        sums = numpy.zeros((k, X.shape[1]), numpy.float64)
        sum_fn = _sums_onehot if k <= int(config.get("onehot-max-k")) else _sums_sorted
    step = _tile_rows(k, X.dtype.itemsize)
    ws = _Workspace(min(step, n), k, X.shape[1], X.dtype)
    for s in range(0, n, step):
        xt = X[s : s + step]
        wt = None if sample_weight is None else sample_weight[s : s + step]
        lab, d2 = _tile_nearest(xt, p, ws)
        if prev_labels is not None:
            reassigned -= int(numpy.count_nonzero(lab == prev_labels[s : s + step]))
        labels[s : s + step] = lab
        inertia += float(d2.sum() if wt is None else d2 @ wt.astype(numpy.float64))
        if want_sums:
            sum_fn(xt, lab, k, wt, sums, ws)
    out["inertia"] = inertia
    out["reassigned"] = reassigned
    out["rechecked"] = 0
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
