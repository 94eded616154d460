"""Yinyang's bound kernels on any array module (NumPy or CuPy): what a backend without
compiled ones of its own runs (the CuPy backend's today), and what both share (the margins,
the centroids' drift).

The bounds are on Euclidean distances (not squared) from each row to the centroids in the
data dtype (the centroids every backend's labels are taken against), in float64:

- ``upper[i]`` at least the distance of row ``i`` to its own centroid;
- ``lower[i, q]`` at most the distance of row ``i`` to any other centroid of group ``q``
  (``inf`` where the group holds none).

A step moves them by each centroid's drift (the triangle inequality) and a row keeps its
label without any distance computed where its upper bound stays below every group's lower
bound by a margin (:func:`margins`) wide enough that no rounding of the backend's distances
could have ranked another centroid first: the skipped rows' labels are the labels the full
assignment gives. Every bound is rounded outwards (``delta``) as it is computed and moved.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Ding et al. take t = K / 10 groups; the bounds cost 8 bytes per row and group, so t is
# capped (MAX_GROUPS) to keep them a small multiple of the rows' own memory at wide K.
GROUP_RATIO = 10
MAX_GROUPS = 256


def n_groups(k: int) -> int:
    """Groups of ``k`` centroids: ``k / 10`` (Ding et al.), at least 1, at most :data:`MAX_GROUPS`."""
    return int(min(MAX_GROUPS, max(1, k // GROUP_RATIO)))


def bound_bytes(rows: int, k: int) -> int:
    """Bytes of a rank's Yinyang state for ``rows`` rows and ``k`` centroids: per row the
    upper bound, ``||x||^2`` and the group bounds (float64), and the step's gathered rows'
    labels and indices (bounded by the rows)."""
    return rows * 8 * (2 + n_groups(k)) + rows * (8 + 4)


# Rows per piece of the gathers below: a piece's float64 copy of its rows stays near 128 MiB.
_PIECE_BYTES = 1 << 27


def margins(d: int, dtype: Any) -> tuple[float, float]:
    """``(eps, delta)`` for ``d`` features of ``dtype``.

    ``eps``: two values of one row's ``g = ||c||^2 - 2 x.c`` computed in the data dtype (a
    GEMM, then the addition of ``||c||^2`` rounded to the dtype) may come out in the opposite
    order of the exact squared distances only where those differ by at most
    ``eps * (2 ||x|| C + C^2)`` (``C`` the largest centroid norm): each ``g`` is within
    ``(d + 2) u (2 ||x|| ||c|| + ||c||^2)`` of its exact value (``u`` the dtype's unit roundoff;
    a dot product's error bound holds for any order of summation, hence for any BLAS), two of
    them within twice that; doubled again for the float64 rounding of the test itself. A
    backend whose labels are exact distances' (the GPU's, certified) needs less: this margin
    is safe for both. ``delta``: the relative rounding of the float64 bounds and drifts
    (``(d + 8) 2^-50``), applied outwards at each update."""
    u = float(np.finfo(np.dtype(dtype)).eps) / 2
    return 4.0 * (d + 4) * u, (d + 8) * 2.0**-50


def centroid_drift(xp: Any, old: Any, new: Any) -> tuple[Any, float]:
    """Each centroid's move ``||new - old||`` (float64 ``(K,)``, rounded up) between two steps'
    centroids ``(K, D)`` in the data dtype, and the largest norm of ``new`` (rounded up)."""
    _, delta = margins(new.shape[1], new.dtype)
    n64 = new.astype(xp.float64)
    diff = n64 - old.astype(xp.float64)
    drift = xp.sqrt((diff * diff).sum(axis=1)) * (1.0 + delta)
    cmax = float(xp.sqrt((n64 * n64).sum(axis=1)).max()) * (1.0 + delta) if new.shape[0] else 0.0
    return drift, cmax


def row_sqnorms(xp: Any, X: Any) -> Any:
    """``||x||^2`` of every row, float64 ``(n,)``."""
    x64 = X.astype(xp.float64)
    return (x64 * x64).sum(axis=1)


def _pieces(n: int, d: int):
    step = max(1, _PIECE_BYTES // max(1, 8 * d))
    for s in range(0, n, step):
        yield s, min(n, s + step)


def _owner_sq(xp: Any, X: Any, cen: Any, labels: Any) -> Any:
    """Each row's float64 squared distance to its centroid (``X`` (m, D), ``labels`` (m,))."""
    out = xp.empty(X.shape[0], xp.float64)
    for s, e in _pieces(X.shape[0], X.shape[1]):
        diff = X[s:e].astype(xp.float64) - cen[labels[s:e]].astype(xp.float64)
        out[s:e] = (diff * diff).sum(axis=1)
    return out


def _owner_dist(xp: Any, X: Any, cen: Any, labels: Any) -> Any:
    """Each row's float64 distance to its centroid."""
    return xp.sqrt(_owner_sq(xp, X, cen, labels))


def _certain(xp: Any, u: Any, lmin: Any, e: Any, delta: float) -> Any:
    return (lmin > u) & ((lmin - u) * (lmin + u) * (1.0 - delta) > e)


def yinyang_filter(xp: Any, X: Any, cen: Any, labels: Any, upper: Any, lower: Any, xnorm: Any, drift: Any,
                   gdrift: Any, cmax: float) -> Any:
    """The global filter of one block (``numpy_backend.yinyang_filter``'s contract): the
    bounds moved by the drift in place; returns the uncertain rows, ascending (int64)."""
    eps, delta = margins(X.shape[1], X.dtype)
    up, down = 1.0 + delta, 1.0 - delta
    u = (upper + drift[labels]) * up
    lower -= gdrift[None, :]
    xp.maximum(lower, 0.0, out=lower)
    lower *= down
    lmin = lower.min(axis=1) if lower.shape[1] else xp.full(X.shape[0], xp.inf)
    xn = xp.sqrt(xnorm) * up
    e = eps * (2.0 * xn * cmax + cmax * cmax)
    idx = xp.flatnonzero(~_certain(xp, u, lmin, e, delta))
    if idx.size:
        tight = _owner_dist(xp, X[idx], cen, labels[idx]) * up
        u[idx] = tight
        idx = idx[~_certain(xp, tight, lmin[idx], e[idx], delta)]
    upper[...] = u
    return idx.astype(xp.int64)


def assign_bounds(be: Any, X: Any, p: Any, group_of: Any, n_groups: int, xnorm: Any, cmax: float) -> tuple:
    """The backend's labels of ``X`` (``be.assign``) and Yinyang's bounds
    (``numpy_backend.assign_bounds``'s contract), the bounds from float64 distances to every
    centroid, a piece of rows at a time."""
    xp = be.xp
    n, d = X.shape
    k = p.centroids.shape[0]
    eps, delta = margins(d, np.float64)
    labels = be.assign(X, p, want_sums=False)["labels"]  # the backend's own labels (exact on the GPU)
    c64 = p.centroids.astype(xp.float64)
    csq = (c64 * c64).sum(axis=1)
    neg2 = -2.0 * c64.T
    # The columns by group as one (t, smax) table of column indices, short groups padded with
    # column K (an extra column of inf): a piece's group minima are one gather and one
    # reduction, whatever t (a launch per group would cost more than the distances at wide K).
    gh = np.asarray(be.to_numpy(group_of), np.int64)
    sizes = np.bincount(gh, minlength=n_groups)
    smax = max(1, int(sizes.max()) if sizes.size else 1)
    table = np.full((n_groups, smax), k, np.int64)
    order = np.argsort(gh, kind="stable")
    ends = np.cumsum(sizes)
    for q in np.flatnonzero(sizes):
        table[q, : sizes[q]] = order[ends[q] - sizes[q] : ends[q]]
    table = xp.asarray(table.reshape(-1))
    lower = xp.empty((n, n_groups), xp.float64)
    step = max(1, 4 * _PIECE_BYTES // max(1, 8 * (k + 1 + n_groups * smax + d)))
    for s in range(0, n, step):
        e_ = min(n, s + step)
        g = xp.empty((e_ - s, k + 1), xp.float64)
        g[:, k] = xp.inf
        gk = g[:, :k]
        gk[...] = X[s:e_].astype(xp.float64) @ neg2
        xn2 = xnorm[s:e_]
        gk += csq[None, :]
        gk += xn2[:, None]
        gk[xp.arange(e_ - s), labels[s:e_]] = xp.inf  # the row's own centroid is no other centroid
        mins = xp.take(g, table, axis=1).reshape(e_ - s, n_groups, smax).min(axis=2)
        xn = xp.sqrt(xn2) * (1.0 + delta)
        err = eps * (2.0 * xn * cmax + cmax * cmax + xn2)
        v = mins - err[:, None]
        lower[s:e_] = xp.where(xp.isinf(v), v, xp.sqrt(xp.maximum(v, 0.0)) * (1.0 - delta))
    return labels, upper_bounds(xp, X, p.centroids, labels), lower


def upper_bounds(xp: Any, X: Any, cen: Any, labels: Any) -> Any:
    """Each row's upper bound ``(n,)`` float64 on the distance to its centroid ``cen[label]``:
    the float64 distance rounded up (:func:`margins`' ``delta`` of float64)."""
    _, delta = margins(X.shape[1], np.float64)
    return _owner_dist(xp, X, cen, labels) * (1.0 + delta)


def add_label_sums(xp: Any, X: Any, labels: Any, sample_weight: Any, sign: int, grid: Any, sums: Any, weights: Any,
                   counts: Any, qsums: Any = None, xnorm: Any = None) -> None:
    """``numpy_backend.add_label_sums``'s contract on any array module: each value rounded
    once to the grid as the kernels round it, the integers added per label by sorted
    segments (an int64 running sum, exact: every partial sum is within the grid's bound);
    with ``qsums`` (K,) and ``xnorm`` (n,), each row's ``rint(w ||x||^2 * qscale)`` too."""
    n, d = X.shape
    if n == 0:
        return
    order = xp.argsort(labels, kind="stable")
    lab = labels[order]
    head = xp.concatenate([xp.ones(1, bool), lab[1:] != lab[:-1]])
    starts = xp.flatnonzero(head)
    ends = xp.concatenate([starts[1:], xp.asarray([n])])
    segs = lab[starts]
    scales = grid.scales(xp)
    w = None if sample_weight is None else sample_weight.astype(xp.float64)[order]
    acc = xp.zeros((segs.shape[0], d), xp.int64)
    for s, e in _pieces(n, d):
        rows = X[order[s:e]].astype(xp.float64)
        v = xp.rint((rows if w is None else w[s:e, None] * rows) * scales).astype(xp.int64)
        cs = xp.cumsum(v, axis=0)
        # Each segment's part of this piece: the running sum at its last row here less the
        # running sum before its first row here.
        lo = xp.clip(starts - s, 0, e - s)
        hi = xp.clip(ends - s, 0, e - s)
        csz = xp.concatenate([xp.zeros((1, d), xp.int64), cs])
        acc += csz[hi] - csz[lo]
    sums[segs] += sign * acc
    counts[segs] += sign * (ends - starts)
    if w is not None:
        iw = xp.rint(w * grid.wscale).astype(xp.int64)
        csw = xp.concatenate([xp.zeros(1, xp.int64), xp.cumsum(iw)])
        weights[segs] += sign * (csw[ends] - csw[starts])
    if qsums is not None:
        xn = xnorm.astype(xp.float64)[order]
        iq = xp.rint((xn if w is None else w * xn) * grid.qscale).astype(xp.int64)
        csq = xp.concatenate([xp.zeros(1, xp.int64), xp.cumsum(iq)])
        qsums[segs] += sign * (csq[ends] - csq[starts])


def owner_inertia(xp: Any, X: Any, cen: Any, labels: Any, sample_weight: Any = None) -> Any:
    """A block's inertia under ``labels`` (float64, 0-d): ``sum w ||x - c||^2``; the sum's order
    is the array module's (on the GPU, as Lloyd's own inertia there, not bitwise the CPU's)."""
    d2 = _owner_sq(xp, X, cen, labels)
    return (d2 if sample_weight is None else sample_weight.astype(xp.float64) * d2).sum()
