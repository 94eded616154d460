"""Compiled CPU kernels (Numba) for the NumPy backend: pure functions on in-memory arrays.

Why Numba: after the distance GEMM, NumPy needs several full passes over each tile and the
data (``||x||^2``, gathering the winning distance, sorting rows by label, casting to float64,
a segmented reduction) and each pass allocates. One compiled pass over a tile that is still in
cache does all of it (``docs/performance.md``, "CPU path").

Conventions shared with the NumPy backend:

- distances are ``g[i, j] = ||c_j||^2 - 2 x_i.c_j`` in the data dtype; the label is the argmin
  of that row (taken by NumPy, lowest index on ties), the squared distance is
  ``g[i, label] + ||x_i||^2`` with ``||x_i||^2`` in float64, clamped at 0;
- each weighted value ``w x`` is rounded once to the sums' fixed-point grid (``w x * scale``
  to the nearest integer, ties to even, as CUDA's ``__double2ll_rn``) and added as int64, so
  the sums are the GPU's integers for any tiling or chunking (:mod:`.grid`); the inertia
  accumulates in float64, row by row in row order.

``fastmath`` allows only re-association and contraction (vectorised float64 reductions and
FMA): no assumption about NaN or infinity, which the engine rejects before a fit anyway.
Compiled code is cached on disk (``cache=True``), so a new worker process loads it in
milliseconds instead of compiling. The cache goes to the user's cache folder
(``$XDG_CACHE_HOME/daskmeans/numba``, or ``NUMBA_CACHE_DIR`` when set), never into the
installed package: reinstalling, or switching to an editable install, always works.
"""

from __future__ import annotations

import os

import numba
import numpy as np


def cache_dir() -> str:
    """Where compiled CPU kernels are cached: ``NUMBA_CACHE_DIR``, else the user's cache."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return numba.config.CACHE_DIR or os.path.join(base, "daskmeans", "numba")


# Numba reads NUMBA_CACHE_DIR when it is imported (maybe before us): set its setting itself.
numba.config.CACHE_DIR = cache_dir()

_FAST = {"reassoc", "contract"}
_JIT = dict(nogil=True, cache=True, fastmath=_FAST, error_model="numpy")


@numba.njit(**_JIT)
def _sqdist(gib, x):  # pragma: no cover - compiled
    """``gib + ||x||^2`` in float64 (``gib = ||c||^2 - 2 x.c`` of the chosen centroid),
    clamped at 0 (rounding can take a point on its centroid below 0)."""
    sq = 0.0
    for t in range(x.shape[0]):
        v = np.float64(x[t])
        sq += v * v
    d2 = np.float64(gib) + sq
    return d2 if d2 > 0.0 else 0.0


# Adding 1.5 * 2**52 to a float64 below 2**51 in magnitude rounds it to an integer (to nearest,
# ties to even, as ``rint``) held in the low mantissa bits: the integer is the sum's bits less
# the constant's. Integer subtraction vectorises where a float64 -> int64 conversion does not
# (x86 before AVX-512), which made the conversion most of a small-K step.
_MAGIC = 6755399441055744.0
_MAGIC_BITS = 0x4338000000000000


@numba.njit(nogil=True, cache=True, error_model="numpy")  # no fastmath: the products round as written
def _add_on_grid(acc, x, wi, scales, buf, ibuf):  # pragma: no cover - compiled
    """``acc += rint(wi * x * scales)`` as int64, each ``|wi * x * scales| < 2**51``; ``buf``
    float64 (D,) scratch and ``ibuf`` its int64 view."""
    for t in range(x.shape[0]):
        buf[t] = wi * np.float64(x[t]) * scales[t] + _MAGIC
    for t in range(x.shape[0]):
        acc[t] += ibuf[t] - _MAGIC_BITS


@numba.njit(**_JIT)
def tile_stats(g, lab, xt, w, prev, out, scales, wscale, sums, wsum, counts, want_sums, inertia,
               small=False):  # pragma: no cover - compiled
    """Per-row distance, inertia, reassignment and per-cluster sums of one tile.

    Parameters
    ----------
    g : (n, K) float32/float64, ``||c||^2 - 2 x.c`` (read only)
    lab : (n,) intp, argmin of each row of ``g``
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
    small : bool, whether every ``|w x scales|`` is below ``2**51`` (:func:`_add_on_grid`'s
        rounding applies; the same integers as ``rint``)

    Returns
    -------
    inertia : float, ``inertia`` plus this tile's weighted clamped squared distances
    reassigned : int
    """
    n, d = xt.shape
    reassigned = 0
    buf = np.empty(d, np.float64)
    ibuf = buf.view(np.int64)
    for i in range(n):
        b = lab[i]
        x = xt[i]
        d2 = _sqdist(g[i, b], x)
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
            acc = sums[b]
            if small:
                _add_on_grid(acc, x, wi, scales, buf, ibuf)
            else:
                for t in range(d):
                    acc[t] += np.int64(np.rint(wi * np.float64(x[t]) * scales[t]))
            if w is not None:
                wsum[b] += np.int64(np.rint(wi * wscale))
            counts[b] += 1
    return inertia, reassigned


@numba.njit(**_JIT)
def tile_sqdist(g, lab, xt, out_lab, out_d2):  # pragma: no cover - compiled
    """Labels (int32) and clamped float64 squared distances of one tile (no statistics)."""
    for i in range(xt.shape[0]):
        b = lab[i]
        out_d2[i] = _sqdist(g[i, b], xt[i])
        out_lab[i] = b


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
