"""Order-free exact sums: every weighted value rounded once to a fixed-point grid, then added
as int64.

The kernels add ``rint(w * x[j] / 2**e_j)`` as int64, where ``2**e_j`` is feature ``j``'s grid
step (``Grid.exps``). Integer addition is exact and associative, so a per-cluster sum is the
same int64 whatever the chunking, the order of the kernel's atomics, the number of workers or
the order in which a collective adds their buffers: centroids are bitwise the same for any of
them. Nothing overflows in any order: ``2**(e_j + 62)`` exceeds the largest absolute value of
the feature times the total sample weight, which bounds every partial sum (weights are never
negative), and one int64 holds ``2**63``.

The price is the rounding of each value to the grid, at most half a step: ``2**e_j`` is about
``max|x_j| * W * 2**-62`` (``W`` the total weight), a relative ``2**-40`` of the feature's
largest value for 10**6 rows and ``2**-29`` for 10**10, finer than float32 data carry.

The step's inertia comes from exact sums too (:meth:`Grid.inertia`): each row's ``w ||x||^2``
rounded once to a step of its own (``2**qexp``, about ``W * sum_j max|x_j|^2 * 2**-62``) and
added per cluster as int64 (``Q_k``), then, with the value sums ``S_k``, the weights ``W_k`` and
the centroids ``c_k`` the labels were assigned against,
``inertia = sum_k (Q_k - 2 c_k . S_k + W_k ||c_k||^2)`` in float64: a function of the labels
and centroids alone, the same bits for any chunking, worker count or algorithm that gives
the same labels. The three terms are each about ``W_k ||mu_k||^2`` (``mu_k`` the cluster's
mean), so the result carries a relative error of about ``eps * ||mu_k||^2 / sigma_k^2``
(``sigma_k^2`` the cluster's mean squared distance, ``eps = 2**-53``): the cancellation that
``||x||^2 - 2 x.c + ||c||^2`` per row has too, there in the data dtype (docs/performance.md,
"inertia from exact sums").

Functions work on NumPy and CuPy arrays alike (identical IEEE operations, so identical bits).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

GRID_BITS = 62  # a sum's bound is below 2**(e + GRID_BITS): int64 holds it with a bit to spare
_MIN_EXP = -1000  # the kernels multiply by 2**-e, which must stay a finite float64


def _exps(bounds: np.ndarray) -> np.ndarray:
    out = [math.frexp(float(b))[1] - GRID_BITS if b > 0 else _MIN_EXP for b in np.ravel(bounds)]
    return np.maximum(np.array(out, np.int64), _MIN_EXP)


class Grid:
    """The fixed-point grid of one fit's per-cluster sums and weights.

    Parameters
    ----------
    max_abs : ndarray, shape (d,)
        Largest absolute value of each feature over the data.
    total_weight : float
        Sum of the sample weights (the row count when unweighted).

    Attributes
    ----------
    exps : ndarray of int64, shape (d,)
        A feature's sums are int64 multiples of ``2**exps[j]``.
    wexp : int
        The per-cluster weights are int64 multiples of ``2**wexp``.
    qexp : int
        The per-cluster sums of ``w ||x||^2`` are int64 multiples of ``2**qexp``
        (:meth:`inertia`).
    x_max : float
        The largest absolute value of any feature (a bound on every value the kernels read).
    """

    def __init__(self, max_abs: np.ndarray, total_weight: float):
        w = max(float(total_weight), 1.0)
        self.exps = _exps(np.asarray(max_abs, np.float64) * w)
        self.wexp = int(_exps(np.array([w]))[0])
        # sum_i w_i ||x_i||^2 <= W * sum_j max|x_j|^2, bounded in exponents (the product may
        # not be a finite float64 where the data is near the dtype's range).
        sq = float(np.sum(np.square(np.asarray(max_abs, np.float64)))) if np.size(max_abs) else 0.0
        if sq > 0 and math.isfinite(sq):
            self.qexp = max(math.frexp(sq)[1] + math.frexp(w)[1] - GRID_BITS, _MIN_EXP)
        else:
            self.qexp = _MIN_EXP if sq == 0 else 1024 - GRID_BITS
        self.x_max = float(np.max(max_abs)) if np.size(max_abs) else 0.0
        self._scales: dict = {}

    @classmethod
    def for_block(cls, X: Any, sample_weight: Any = None) -> "Grid":
        """The grid of one block's own bounds (callers outside a fit: the init, tests)."""
        xp = _xp(X)
        max_abs = _host(xp.abs(X).max(axis=0)) if X.shape[0] else np.zeros(X.shape[1])
        total = float(X.shape[0]) if sample_weight is None else float(_host(sample_weight.sum()))
        return cls(max_abs, total)

    def __getstate__(self) -> dict:
        return {"exps": self.exps, "wexp": self.wexp, "qexp": self.qexp, "x_max": self.x_max}

    def __setstate__(self, state: dict) -> None:
        self.exps, self.wexp, self.x_max, self._scales = state["exps"], state["wexp"], state["x_max"], {}
        self.qexp = state["qexp"]

    def scales(self, xp: Any) -> Any:
        """``2**-exps`` as float64 on ``xp``'s device (kept: a fit asks once per chunk)."""
        key = (xp.__name__, _device(xp))
        if key not in self._scales:
            self._scales[key] = xp.asarray(np.ldexp(1.0, -self.exps))
        return self._scales[key]

    def exps_on(self, xp: Any) -> Any:
        """``exps`` as int32 on ``xp``'s device (kept, as :meth:`scales`)."""
        key = ("exps", xp.__name__, _device(xp))
        if key not in self._scales:
            self._scales[key] = xp.asarray(self.exps.astype(np.int32))
        return self._scales[key]

    def on_grid(self, x: np.ndarray, w: float) -> tuple[np.ndarray, int]:
        """One row's weighted values ``w x`` (d,) and its weight as the kernels add them:
        int64 multiples of the steps."""
        v = np.rint(float(w) * np.asarray(x, np.float64) * np.ldexp(1.0, -self.exps)).astype(np.int64)
        return v, int(np.rint(float(w) * self.wscale))

    @property
    def wscale(self) -> float:
        """``2**-wexp``: a sample weight in units of the weights' grid step."""
        return math.ldexp(1.0, -self.wexp)

    @property
    def qscale(self) -> float:
        """``2**-qexp``: a row's ``w ||x||^2`` in units of its grid step (the kernels add
        ``rint(w ||x||^2 * qscale)``)."""
        return math.ldexp(1.0, -self.qexp)

    def inertia(self, isums: np.ndarray, iweights: np.ndarray, iq: np.ndarray, centroids: np.ndarray) -> float:
        """The inertia of labelled rows from their exact per-cluster sums:
        ``sum_k (Q_k - 2 c_k . S_k + W_k ||c_k||^2)`` in float64, each cluster's term clamped
        at 0 (it is a sum of squares; rounding can take a cluster whose rows sit on its
        centroid below 0).

        Host arrays (the step reads the reduced sums on the host). Float64 rather than long
        double: several times cheaper per step at wide K, and the same on every platform
        (docs/performance.md, "inertia from exact sums", has both measured).

        Parameters
        ----------
        isums : int64 ndarray, shape (K, d)
            ``S_k``: the rows' ``w x`` on the grid (:meth:`sums`' integers).
        iweights : int64 ndarray, shape (K,)
            ``W_k`` on the weights' grid.
        iq : int64 ndarray, shape (K,)
            ``Q_k``: the rows' ``w ||x||^2``, multiples of ``2**qexp``.
        centroids : ndarray, shape (K, d)
            The centroids the labels were assigned against (any float dtype).

        Returns
        -------
        float
            The same bits for the same integers and centroids (NumPy's fixed reduction order),
            whatever chunking or algorithm produced the integers.
        """
        c = np.asarray(centroids).astype(np.float64)
        # c_kj * 2**e_j is exact (a power of two), so the cross term needs no ldexp of the sums.
        cross = (c * np.ldexp(1.0, self.exps) * np.asarray(isums).astype(np.float64)).sum(axis=1)
        q = np.asarray(iq).astype(np.float64) * math.ldexp(1.0, self.qexp)
        w = np.asarray(iweights).astype(np.float64) * math.ldexp(1.0, self.wexp)
        per = q - 2.0 * cross + w * (c * c).sum(axis=1)
        return float(np.maximum(per, 0.0).sum())

    def unit_weights(self, counts: Any) -> Any:
        """Per-cluster weights on the grid when every sample weight is 1: ``counts * 2**-wexp``
        (exact: ``-wexp >= 0`` and the product stays below ``2**62``)."""
        return counts << (-self.wexp)

    def sums(self, isums: Any) -> Any:
        """float64 values of int64 sums ``(..., d)`` (one rounding each)."""
        xp = _xp(isums)
        return xp.ldexp(isums.astype(xp.float64), xp.asarray(self.exps.astype(np.int32)))

    def weights(self, iweights: Any) -> Any:
        """float64 values of int64 weights ``(...,)``."""
        xp = _xp(iweights)
        return xp.ldexp(iweights.astype(xp.float64), self.wexp)


# A centroid's value is the mean of values each rounded by at most half a step: the step must
# stay below this fraction of a feature's typical magnitude for the sums to be trusted.
RESOLUTION = 2.0**-12
# The initial centroids a feature's typical magnitude (check_resolution's) is taken over, evenly
# spaced (all where K is smaller): a median over that many is as robust, and one over K x D
# values at wide K took the command longer than a short fit's iterations (performance.md,
# "Several GPUs").
TYPICAL_ROWS = 4096


def check_resolution(grid: Grid, typical: np.ndarray, n_samples: int) -> None:
    """Refuse data whose fixed-point grid is too coarse for its typical values.

    A feature's step is set by its largest absolute value times the total weight (so that
    no sum overflows): one huge value among ordinary ones (1e18 among values near 1) makes
    the step larger than the ordinary values themselves, which then all round to zero and
    give wrong centroids silently.

    Parameters
    ----------
    grid : Grid
    typical : ndarray (d,)
        A robust magnitude of each feature (the median |value| of the initial centroids,
        which are rows of the data or close to them; of at most ``TYPICAL_ROWS`` of them,
        evenly spaced, where there are more); features where it is 0 are skipped.
    n_samples : int

    Raises
    ------
    DataError
        Naming the first feature whose step exceeds ``RESOLUTION`` times its typical value.
    """
    from ..errors import DataError

    step = np.ldexp(1.0, grid.exps)
    typical = np.asarray(typical, np.float64)
    bad = np.flatnonzero((typical > 0) & (step > RESOLUTION * typical))
    if bad.size:
        j = int(bad[0])
        raise DataError(
            f"feature {j} spans too wide a range for exact sums: over {n_samples} rows its largest |value| sets the "
            f"sums' step to {step[j]:.3g}, and its typical |value| {typical[j]:.3g} should be at least "
            f"{1 / RESOLUTION:.0f} steps; rescale, clip or drop the outlying values ({bad.size} feature(s) affected)"
        )


def check_range(max_abs: np.ndarray, dtype: Any) -> None:
    """Refuse data whose squared row norms can overflow the distances' dtype (the kernels
    compute ``|x|^2 - 2 x.c + |c|^2`` in the data's dtype).

    Raises
    ------
    DataError
    """
    from ..errors import DataError

    with np.errstate(over="ignore"):
        bound = float(np.sum(np.square(np.asarray(max_abs, np.float64))))
    limit = float(np.finfo(dtype).max) / 4
    if not bound <= limit:
        raise DataError(
            f"X's values are too large for {np.dtype(dtype).name} distances: a row's squared norm can reach "
            f"{bound:.3g} (from each feature's largest |value|), above {limit:.3g}; rescale the data"
            + (" or use float64 data" if np.dtype(dtype) == np.float32 else "")
        )


def _xp(a: Any) -> Any:
    """The array module of ``a`` (NumPy or CuPy), from its type: numerics know arrays, not the
    backends built on them."""
    return sys.modules[type(a).__module__.partition(".")[0]]  # numpy for NumPy's, cupy for CuPy's


def _host(a: Any) -> np.ndarray:
    """``a`` as a NumPy array (copied from the device where it is a device array: ``get``)."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _device(xp: Any) -> int:
    return xp.cuda.runtime.getDevice() if hasattr(xp, "cuda") else -1  # CuPy's module has the device API


def float_sums(out: dict) -> tuple[Any, Any]:
    """``(sums, weights)`` in float64 of one ``assign`` result (its ``grid``'s values)."""
    g = out["grid"]
    return g.sums(out["sums"]), g.weights(out["weights"])
