"""Compiled CPU kernels (Numba) for the NumPy backend: pure functions on in-memory arrays.

Why Numba: after the distance GEMM, NumPy needs several full passes over each tile and the
data (``||x||^2``, gathering the winning distance, sorting rows by label, casting to float64,
a segmented reduction) and each pass allocates. One compiled pass over a tile that is still in
cache does all of it (``docs/performance.md``, "CPU path").

Conventions shared with the NumPy backend:

- distances are ``g[i, j] = ||c_j||^2 - 2 x_i.c_j`` in the data dtype; the label is the argmin
  of that row (the lowest index on ties, the first NaN if any: NumPy's rule, whoever takes it),
  certified: where another centroid's ``g`` lies within the GEMM's error bound of the
  smallest (:func:`certify_tol`), the row's label is the nearest of those centroids by
  :func:`owner_sqdist` instead (:func:`_rerank`), so a label is a function of the row and the
  centroids alone, whatever BLAS kernel and place in a tile computed its ``g`` (a BLAS rounds
  a row's products differently at another offset in a tile, or in another shape of product);
  the squared distance is ``g[i, label] + ||x_i||^2`` with ``||x_i||^2`` in float64, clamped
  at 0 (:func:`tile_sqdist`'s is :func:`owner_sqdist` itself);
- each weighted value ``w x`` is rounded once to the sums' fixed-point grid (``w x * scale``
  to the nearest integer, ties to even, as CUDA's ``__double2ll_rn``) and added exactly (in
  the float64 windows the grid bounds, then as int64), so
  the sums are the GPU's integers for any tiling or chunking (:mod:`.grid`); the inertia
  accumulates in float64, row by row in row order;
- with the sums, each row's ``w ||x||^2`` is rounded once to the grid's own step for it
  (``Grid.qexp``) and added to its cluster's int64 ``qsums``: the step's inertia follows from
  these exact sums, the centroids and the value sums (``Grid.inertia``), the same bits for any
  tiling, chunking or algorithm that gives the same labels (Yinyang's step updates them by the
  rows that moved, :func:`label_sums`).

``fastmath`` allows only re-association and contraction (vectorised float64 reductions and
FMA): no assumption about NaN or infinity, which the engine rejects before a fit anyway.
Compiled code is cached on disk (``cache=True``), so a new worker process loads it in
milliseconds instead of compiling. The cache goes to the user's cache folder
(``$XDG_CACHE_HOME/daskmeans/numba``, or ``NUMBA_CACHE_DIR`` when set), never into the
installed package: reinstalling, or switching to an editable install, always works.
"""

from __future__ import annotations

import numba
import numpy as np

from ..config import numba_cache_dir


# Numba reads NUMBA_CACHE_DIR when it is imported (maybe before us): set its setting itself.
numba.config.CACHE_DIR = numba_cache_dir(numba.config.CACHE_DIR)

_FAST = {"reassoc", "contract"}
_JIT = dict(nogil=True, cache=True, fastmath=_FAST, error_model="numpy")


@numba.njit(**_JIT)
def row_sqnorm(x):  # pragma: no cover - compiled
    """``||x||^2`` of one row in float64 (the same loop, hence the same bits, in every kernel)."""
    sq = 0.0
    for t in range(x.shape[0]):
        v = np.float64(x[t])
        sq += v * v
    return sq


@numba.njit(nogil=True, cache=True, error_model="numpy")  # no fastmath: the same bits wherever inlined
def owner_sqdist(x, c):  # pragma: no cover - compiled
    """``||x - c||^2`` of one row and one centroid (both ``(D,)``, the data dtype) in float64,
    in a fixed order (four running sums over ``t mod 4``, then ``(s0 + s1) + (s2 + s3)``).

    Yinyang's bounds (:func:`yy_filter`, :func:`tile_bounds`) tighten a row's upper bound to
    this distance; compiled without fast-math flags, it is the same bits wherever inlined, and
    it is the distance itself, not ``||c||^2 - 2 x.c + ||x||^2``, whose float32 rounding cancels."""
    d = x.shape[0]
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    t = 0
    while t + 4 <= d:
        a0 = np.float64(x[t]) - np.float64(c[t])
        a1 = np.float64(x[t + 1]) - np.float64(c[t + 1])
        a2 = np.float64(x[t + 2]) - np.float64(c[t + 2])
        a3 = np.float64(x[t + 3]) - np.float64(c[t + 3])
        s0 += a0 * a0
        s1 += a1 * a1
        s2 += a2 * a2
        s3 += a3 * a3
        t += 4
    while t < d:
        a0 = np.float64(x[t]) - np.float64(c[t])
        s0 += a0 * a0
        t += 1
    return (s0 + s1) + (s2 + s3)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def certify_tol(sq, cmax, eps):  # pragma: no cover - compiled
    """The largest gap between a row's two smallest computed ``g`` that leaves its label
    uncertain: ``eps (2 ||x|| C + C^2)`` (``sq`` the row's ``||x||^2`` in float64, ``C =
    cmax`` the largest centroid norm, ``eps`` of :func:`.bounds.margins`): two computed values
    of one row come out in the opposite order of the exact squared distances only within it,
    whatever order a BLAS summed their products in."""
    return eps * (2.0 * np.sqrt(sq) * cmax + cmax * cmax)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _rerank(x, cen, gi, sqnorm, best, tol):  # pragma: no cover - compiled
    """The certified label of a row ``x`` whose computed values leave more than one centroid
    within ``tol`` of the smallest, ``best`` (float64): of the centroids ``j`` whose value
    (``gi[j] + sqnorm[j]`` in ``gi``'s dtype, or ``gi[j]`` with an empty ``sqnorm``) is at most
    ``best + tol``, the one of the smallest :func:`owner_sqdist` (the lowest index on ties). The
    exact nearest centroid is always among them, so a centroid that another tile's rounding
    lets in or leaves out changes the pick only where its float64 distance ties the nearest's."""
    own = sqnorm.shape[0] > 0
    b = -1
    dmin = np.inf
    for j in range(gi.shape[0]):
        v = gi[j] + sqnorm[j] if own else gi[j]
        if np.float64(v) - best <= tol:
            dj = owner_sqdist(x, cen[j])
            if b < 0 or dj < dmin:
                dmin = dj
                b = j
    return b


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _certified(x, cen, gi, b, tol):  # pragma: no cover - compiled
    """``(label, re-ranked)`` of a row ``x`` whose computed values ``gi`` (``||c||^2`` added)
    have their argmin at ``b``: ``b`` where no other value lies within ``tol`` of it, else
    :func:`_rerank`'s label."""
    best = np.float64(gi[b])
    m = 0
    for j in range(gi.shape[0]):
        m += np.float64(gi[j]) <= best + tol
    if m > 1:
        return _rerank(x, cen, gi, gi[:0], best, tol), True
    return b, False


@numba.njit(**_JIT)
def _clamped(gib, sq):  # pragma: no cover - compiled
    """``gib + ||x||^2`` in float64 (``gib = ||c||^2 - 2 x.c`` of the chosen centroid),
    clamped at 0 (rounding can take a point on its centroid below 0)."""
    d2 = np.float64(gib) + sq
    return d2 if d2 > 0.0 else 0.0


def window_weight(wexp: int) -> float:
    """The weight a cluster's float64 accumulator of :func:`tile_stats` may take in before it is
    flushed to int64: every value on the grid is below ``w * 2**(1 - wexp)`` (:mod:`.grid`:
    ``2**(e + 62)`` exceeds ``max|x| * W``, and ``W >= 2**(wexp + 61)``), so the integers of a
    window of total weight ``2**(51 + wexp)`` add to at most ``2**52`` in magnitude, where
    every partial sum of integers is exact in float64 (``2**53``), with a factor of 2 to spare
    for the rounding of the window's weight as it is summed. Below 1 (a total weight under
    2**11: a toy fit), the sums go to int64 row by row."""
    return float(np.ldexp(1.0, 51 + int(wexp)))


@numba.njit(nogil=True, cache=True, error_model="numpy")  # no fastmath: the products round as written
def _add_rounded(acc, x, wi, scales):  # pragma: no cover - compiled
    """``acc += rint(wi * x * scales)`` in float64 (``acc`` a cluster's window: exact while the
    window's bound holds, :func:`window_weight`)."""
    for t in range(x.shape[0]):
        acc[t] += np.rint(wi * np.float64(x[t]) * scales[t])


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _flush(acc, sums):  # pragma: no cover - compiled
    """``sums += acc`` as int64 (exact: ``|acc| <= 2**53``), then ``acc = 0``."""
    for t in range(acc.shape[0]):
        sums[t] += np.int64(acc[t])
        acc[t] = 0.0


@numba.njit(nogil=True, cache=True, error_model="numpy")
def flush_windows(acc, wwin, sums):  # pragma: no cover - compiled
    """Every open window of :func:`tile_stats` added to ``sums`` (K, D) int64 and closed:
    ``acc`` (K, D) float64 and ``wwin`` (K,) back to 0 for the next call."""
    for j in range(acc.shape[0]):
        if wwin[j] != 0.0:
            _flush(acc[j], sums[j])
            wwin[j] = 0.0


@numba.njit(**_JIT)
def tile_stats(g, sqnorm, lab, xt, w, prev, out, scales, wscale, sums, wsum, counts, want_sums, inertia,
               acc, wwin, window, xnorm, xnorm_known, qscale, qsums, cen, cmax, eps):  # pragma: no cover - compiled
    """Per-row label, distance, inertia, reassignment and per-cluster sums of one tile.

    Parameters
    ----------
    g : (n, K) float32/float64, ``-2 x.c`` from the GEMM (read only)
    sqnorm : (K,) ``||c||^2`` in ``g``'s dtype, or an empty array when ``lab`` holds the labels
        already (``g`` then holds ``||c||^2 - 2 x.c``)
    lab : (n,) intp, each row's argmin of ``g``, or scratch when ``sqnorm`` is given: the
        argmin of ``g[i] + sqnorm`` (added in ``g``'s dtype, as NumPy's ``g += sqnorm``), the
        lowest index on ties and the first NaN if any, as NumPy's ``argmin``, is taken here
    xt : (n, D) the tile's rows
    w : (n,) float64 sample weights, or None (all 1)
    prev : (n,) int32 previous labels, or None (every row counts as reassigned)
    out : (n,) int32, receives the labels (may be ``prev``: each row is compared first)
    scales : (D,) float64, ``2**-exps`` of the sums' grid; wscale : float, the weights'
    sums : (K, D) int64, wsum : (K,) int64 (untouched without ``w``), counts : (K,) int64 --
        accumulated in place when ``want_sums``
    want_sums : bool
    inertia : float, the running inertia of the block's previous tiles (so that the sum
        runs in row order whatever the tiling)
    acc : (K, D) float64, wwin : (K,) float64 -- each cluster's open window of rounded values
        and its weight, carried from tile to tile (:func:`flush_windows` closes them)
    window : float, a window's largest weight (:func:`window_weight`); below a row's weight,
        each rounded value goes straight to ``sums`` as int64
    xnorm : (n,) float64, each row's ``||x||^2`` (:func:`row_sqnorm`), or an empty array
    xnorm_known : bool, whether ``xnorm`` holds them already (read, not computed); if not and
        ``xnorm`` is not empty, they are written there for the next pass over the same rows
    qscale : float, ``2**-qexp`` of the grid's squared norms (``Grid.qscale``)
    qsums : (K,) int64 -- with ``want_sums``, each row's ``rint(w ||x||^2 * qscale)`` added to
        its cluster's (the exact sums the step's inertia is computed from: ``Grid.inertia``)
    cen : (K, D) the centroids in the data dtype; cmax : float, their largest norm (rounded
        up); eps : float -- a row whose two smallest values lie within :func:`certify_tol` of
        each other takes its label from :func:`_rerank`

    Returns
    -------
    inertia : float, ``inertia`` plus this tile's weighted clamped squared distances
    reassigned : int
    rechecked : int, the rows re-ranked by :func:`_rerank`

    Each value rounds once to the grid (``rint``: to nearest, ties to even) and the integers
    add exactly, in float64 windows or in int64: the sums are the same integers either way,
    and float64 additions and ``vroundpd`` vectorise where a float64 -> int64 conversion does
    not (x86 before AVX-512).
    """
    n, d = xt.shape
    k = g.shape[1]
    reassigned = 0
    rechecked = 0
    own_argmin = sqnorm.shape[0] > 0
    keep_norms = xnorm.shape[0] > 0
    for i in range(n):
        gi = g[i]
        x = xt[i]
        if xnorm_known:
            sq = xnorm[i]
        else:
            sq = row_sqnorm(x)
            if keep_norms:
                xnorm[i] = sq
        tol = certify_tol(sq, cmax, eps)
        if own_argmin:
            best = gi[0] + sqnorm[0]
            second = np.inf
            b = 0
            # Selects, not branches: which centroid wins is data, and a mispredicted branch
            # per comparison cost more than the comparisons. A row with a NaN (never in a
            # fit's finite data) takes its first NaN, as NumPy's argmin does.
            nan = best != best
            for j in range(1, k):
                v = gi[j] + sqnorm[j]
                less = v < best
                second = np.float64(best) if less else min(second, np.float64(v))
                best = v if less else best
                b = j if less else b
                nan |= v != v
            if nan:
                b = 0
                while not np.isnan(gi[b] + sqnorm[b]):
                    b += 1
                best = gi[b] + sqnorm[b]
            elif second - np.float64(best) <= tol:
                b = _rerank(x, cen, gi, sqnorm, np.float64(best), tol)
                best = gi[b] + sqnorm[b]
                rechecked += 1
        else:
            b, again = _certified(x, cen, gi, lab[i], tol)
            best = gi[b]
            rechecked += again
        d2 = _clamped(best, sq)
        wi = 1.0
        if w is not None:
            wi = np.float64(w[i])
        inertia += wi * d2
        if prev is None:
            reassigned += 1
        elif prev[i] != b:
            reassigned += 1
        out[i] = b
        if want_sums:
            if wi <= window:
                if wwin[b] + wi > window:
                    _flush(acc[b], sums[b])
                    wwin[b] = 0.0
                wwin[b] += wi
                _add_rounded(acc[b], x, wi, scales)
            else:
                row = sums[b]
                for t in range(d):
                    row[t] += np.int64(np.rint(wi * np.float64(x[t]) * scales[t]))
            if w is not None:
                wsum[b] += np.int64(np.rint(wi * wscale))
            counts[b] += 1
            qsums[b] += np.int64(np.rint(wi * sq * qscale))
    return inertia, reassigned, rechecked


@numba.njit(**_JIT)
def tile_sqdist(g, lab, xt, cen, cmax, eps, out_lab, out_d2):  # pragma: no cover - compiled
    """Certified labels (int32) of one tile, as :func:`tile_stats` gives them (``g`` with
    ``||c||^2`` added, ``lab`` its argmin), and each row's squared distance to its centroid
    by :func:`owner_sqdist` (float64): both functions of the row and the centroids alone, as
    the inits' draws and folds need them to be for any chunking."""
    for i in range(xt.shape[0]):
        x = xt[i]
        b = _certified(x, cen, g[i], lab[i], certify_tol(row_sqnorm(x), cmax, eps))[0]
        out_d2[i] = owner_sqdist(x, cen[b])
        out_lab[i] = b


@numba.njit(**_JIT)
def row_sqnorms(x, out):  # pragma: no cover - compiled
    """``out[i] = ||x_i||^2`` (float64, :func:`row_sqnorm`) of every row of ``x`` (n, D)."""
    for i in range(x.shape[0]):
        out[i] = row_sqnorm(x[i])


# ---------------------------------------------------------------- Yinyang's bounds
#
# Bounds are on Euclidean distances (not squared) to the centroids in the data dtype, in
# float64. ``eps`` is the relative error bound of the GEMM path's ``g`` (numpy_backend's
# ``bound_margins``): two computed ``g`` values of one row can swap order only where their
# exact squared distances differ by at most ``eps * (2 ||x|| C + C^2)`` (C the largest
# centroid norm), so a row whose squared bounds are further apart than that keeps its label
# in the GEMM's argmin too. ``delta`` covers the float64 rounding of the bounds themselves.


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _certain(u, l, e, delta):  # pragma: no cover - compiled
    """Whether a lower bound ``l`` on every other centroid's distance beats the owner's upper
    bound ``u`` by more than the squared margin ``e``."""
    return l > u and (l - u) * (l + u) * (1.0 - delta) > e


@numba.njit(nogil=True, cache=True, error_model="numpy")
def yy_filter(xt, cen, lab, upper, lower, xnorm, drift, gdrift, cmax, eps, delta, cand):  # pragma: no cover
    """Yinyang's global filter over one block, its bounds moved by the centroids' drift.

    Parameters
    ----------
    xt : (n, D) rows; cen : (K, D) the new centroids in the data dtype
    lab : (n,) int32 the labels of the previous step
    upper : (n,) float64, an upper bound on each row's distance to its centroid under the
        previous step's centroids (updated in place: under the new ones)
    lower : (n, t) float64, a lower bound per group on the distances to the other centroids
        of the group (updated in place)
    xnorm : (n,) float64 ``||x||^2``
    drift : (K,) float64, each centroid's move (rounded up); gdrift : (t,) the largest per group
    cmax : float, the largest new centroid norm (rounded up); eps, delta : the margins
    cand : (n,) int64 receives the rows the bounds do not certify, in order

    Returns
    -------
    int : the number of rows in ``cand``. A row is certified when its upper bound, moved by
    its centroid's drift (and if need be tightened to its distance, :func:`owner_sqdist`),
    stays below every group's lower bound by the margin.
    """
    n = xt.shape[0]
    t = lower.shape[1]
    m = 0
    up = 1.0 + delta
    down = 1.0 - delta
    for i in range(n):
        a = lab[i]
        u = (upper[i] + drift[a]) * up
        lo = lower[i]
        lmin = np.inf
        for q in range(t):
            v = lo[q] - gdrift[q]
            v = v * down if v > 0.0 else 0.0
            lo[q] = v
            if v < lmin:
                lmin = v
        xn = np.sqrt(xnorm[i]) * up
        e = eps * (2.0 * xn * cmax + cmax * cmax)
        if not _certain(u, lmin, e, delta):
            u = np.sqrt(owner_sqdist(xt[i], cen[a])) * up
            if not _certain(u, lmin, e, delta):
                cand[m] = i
                m += 1
        upper[i] = u
    return m


@numba.njit(**_JIT)
def tile_bounds(g, lab, gp, xt, cen, group_of, order, starts, ends, xnorm, cmax, eps, delta, out, upper,
                lower):  # pragma: no cover - compiled
    """Yinyang's bounds of one tile, from its distances and their minima per group.

    ``g`` (n, K) ``||c||^2 - 2 x.c`` in the data dtype and ``lab`` (n,) its argmin (the labels,
    certified as :func:`tile_stats` certifies them, to ``out`` as int32); ``gp`` (n, K):
    ``g``'s columns by group (``g[:, order]``, group ``q`` in columns ``starts[q]:ends[q]``:
    each group's minimum a contiguous run). ``upper``
    (n,) float64 each row's distance to its centroid, rounded up; ``lower`` (n, t) float64 per
    group a lower bound on the distances to its centroids other than the row's own (``inf``
    where there is none): the group's smallest ``g`` (the row's own group's without its
    centroid, recomputed over that group's few members) plus ``||x||^2`` less the GEMM's error
    bound, rounded down.
    """
    n = g.shape[0]
    t = lower.shape[1]
    for i in range(n):
        gpi = gp[i]
        b = _certified(xt[i], cen, g[i], lab[i], certify_tol(xnorm[i], cmax, eps))[0]  # assign's label
        out[i] = b
        lo = lower[i]
        own = group_of[b]
        for q in range(t):
            v = np.inf
            if q == own:
                for m in range(starts[q], ends[q]):
                    if order[m] != b and np.float64(gpi[m]) < v:
                        v = np.float64(gpi[m])
            else:
                for m in range(starts[q], ends[q]):
                    w = np.float64(gpi[m])
                    v = w if w < v else v
            lo[q] = v
        xn2 = xnorm[i]
        xn = np.sqrt(xn2) * (1.0 + delta)
        e = eps * (2.0 * xn * cmax + cmax * cmax) + eps * xn2
        for q in range(t):
            if lo[q] < np.inf:
                v = lo[q] + xn2 - e
                lo[q] = np.sqrt(v) * (1.0 - delta) if v > 0.0 else 0.0
        upper[i] = np.sqrt(owner_sqdist(xt[i], cen[b])) * (1.0 + delta)


@numba.njit(nogil=True, cache=True, error_model="numpy")  # no fastmath: the products round as written
def label_sums(xt, lab, w, sign, scales, wscale, sums, wsum, counts, xnorm, qscale, qsums):  # pragma: no cover
    """``sign`` (+1 or -1) times each row's values on the grid added to its label's sums, as
    :func:`tile_stats` rounds them (``rint(w x * scale)``, one rounding per value): the same
    integers, so a cluster's sums updated by the rows that left and joined it equal its sums
    over all its rows. ``w`` (n,) float64 or None; ``sums`` (K, D), ``wsum`` (K,) (untouched
    without ``w``), ``counts`` (K,) int64, in place. ``xnorm`` (n,) float64, the rows'
    ``||x||^2`` (:func:`row_sqnorm`'s bits), adds ``sign * rint(w ||x||^2 * qscale)`` to
    ``qsums`` (K,) int64 as :func:`tile_stats` does; an empty ``xnorm`` leaves ``qsums``."""
    n, d = xt.shape
    with_q = xnorm.shape[0] > 0
    for i in range(n):
        b = lab[i]
        wi = 1.0
        if w is not None:
            wi = np.float64(w[i])
        x = xt[i]
        row = sums[b]
        for t in range(d):
            row[t] += sign * np.int64(np.rint(wi * np.float64(x[t]) * scales[t]))
        if w is not None:
            wsum[b] += sign * np.int64(np.rint(wi * wscale))
        counts[b] += sign
        if with_q:
            qsums[b] += sign * np.int64(np.rint(wi * xnorm[i] * qscale))


@numba.njit(**_JIT)
def column_moments(x, mean, m2, max_abs):  # pragma: no cover - compiled
    """Per-column mean, sum of squared deviations and largest absolute value (float64) of
    ``x`` (n, D): the sums and maxima in one pass, the deviations in a second.

    Returns False if a column sum is not finite (a NaN or infinity in ``x``, or float64
    overflow); ``mean``/``m2``/``max_abs`` (D,) are then meaningless.
    """
    n, d = x.shape
    for t in range(d):
        mean[t] = 0.0
        m2[t] = 0.0
        max_abs[t] = 0.0
    for i in range(n):
        r = x[i]
        for t in range(d):
            v = np.float64(r[t])
            mean[t] += v
            max_abs[t] = max(max_abs[t], abs(v))
    ok = True
    for t in range(d):
        if not np.isfinite(mean[t]):
            ok = False
        mean[t] /= max(n, 1)
    if not ok:
        return False
    for i in range(n):
        r = x[i]
        for t in range(d):
            dv = np.float64(r[t]) - mean[t]
            m2[t] += dv * dv
    return True


# Strict float64 (no fastmath): the distances' sums in a fixed order and the chain's products
# left to right, so a seed's AFK-MC² centres do not depend on the CPU's vector width.
@numba.njit(nogil=True, cache=True, error_model="numpy")
def _sqdiff4(a, b):  # pragma: no cover - compiled
    """``sum((a - b)^2)`` in float64 by four running sums over columns ``t = 4 i + r`` (four
    independent lanes the compiler can put in one vector without reordering a sum), added
    ``(s0 + s1) + (s2 + s3)``, then the columns beyond the last multiple of 4 in order."""
    s0 = s1 = s2 = s3 = 0.0
    d = a.shape[0]
    d4 = d - d % 4
    for t in range(0, d4, 4):
        e0 = a[t] - b[t]
        e1 = a[t + 1] - b[t + 1]
        e2 = a[t + 2] - b[t + 2]
        e3 = a[t + 3] - b[t + 3]
        s0 += e0 * e0
        s1 += e1 * e1
        s2 += e2 * e2
        s3 += e3 * e3
    acc = (s0 + s1) + (s2 + s3)
    for t in range(d4, d):
        e = a[t] - b[t]
        acc += e * e
    return acc


@numba.njit(nogil=True, cache=True, error_model="numpy")
def afkmc2_block(X, prior, q, chains, u, picks, s):  # pragma: no cover - compiled
    """One block of AFK-MC²'s Markov chains, in order (``daskmeans.seeding.afkmc2_chains``;
    the GPU's ``afkmc2_block`` in ``cuda/afkmc2.cu`` does the same on one CTA).

    Parameters
    ----------
    X : ndarray (U, d) float64
        The distinct proposal rows.
    prior : ndarray (b, m) float64
        Each proposal's squared distance to every centre chosen before the block.
    q : ndarray (U,) float64
        Each row's proposal probability (positive).
    chains : ndarray (b, m) int64
        The block's chains' proposals, rows of ``X``.
    u : ndarray (b, m - 1) float64
        Their acceptance uniforms.
    picks : ndarray (n_chains,) int64
        Every chain's last state (a row of ``X``); the block's are written at ``[s, s + b)``,
        the ones before ``s`` are not read.
    s : int
        The block's first chain.
    """
    b, m = chains.shape
    d2 = np.empty(m)
    for i in range(b):
        for j in range(m):
            r = chains[i, j]
            v = prior[i, j]
            for p in range(s, s + i):  # the block's picks so far
                acc = _sqdiff4(X[r], X[picks[p]])
                if acc < v:
                    v = acc
            d2[j] = v
        x = 0
        for j in range(1, m):
            if u[i, j - 1] * d2[x] * q[chains[i, j]] < d2[j] * q[chains[i, x]]:
                x = j
        picks[s + i] = chains[i, x]


@numba.njit(nogil=True, cache=True, error_model="numpy")
def afkmc2_fold(g, xsq, csq, dmin):  # pragma: no cover - compiled
    """A block of AFK-MC²'s picks folded into the later chains' distances: ``dmin[i] =
    min(dmin[i], min_j max(0, (g[i, j] + xsq[i]) + csq[j]))`` (``g`` (n, b) float64, the GEMM
    ``-2 X C^T``; the GPU's ``afkmc2_fold``, the same expression in the same order)."""
    n, b = g.shape
    for i in range(n):
        v = dmin[i]
        xi = xsq[i]
        for j in range(b):
            t = (g[i, j] + xi) + csq[j]
            if t < 0.0:
                t = 0.0
            if t < v:
                v = t
        dmin[i] = v
