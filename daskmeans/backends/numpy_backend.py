"""NumPy kernels: exact float32/float64 nearest-centroid assignment and fixed-point partial sums.

Distances are computed as ``||c||^2 - 2 x.c`` by GEMM over row tiles whose rows and
``rows x K`` distance block together are bounded in bytes (``Tunables.tile_bytes``, from
``daskmeans.tile-bytes`` on the client), so the
N x K matrix never exists whole and the tile's rows are still in cache for the second pass: one
compiled pass (:mod:`.cpu_kernels`) over the tile, while it is still in cache, takes each row's
label (the argmin; NumPy's vectorised one beyond ``OWN_ARGMIN_MAX_K`` centroids), adds
``||x||^2``, the inertia, the reassigned count and the per-cluster sums (int64 on a
:class:`.grid.Grid`).

The compiled kernels (Numba, whose imports are a visible share of a command:
docs/performance.md, "Startup") load on first use: a GPU fit uses this module for host-side
arrays only and never needs them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy

from ..errors import DataError
from ..numerics.grid import Grid
from .protocol import Tunables, tunables_in_force

name = "numpy"
xp = numpy
on_host = True
tile_setting = "tile-bytes"
# Host buffers: workers of one process add each other's where they are, others through the
# Dask collective.
collectives = ("process", "dask")
# The step's inertia from exact per-cluster sums (``assign``'s ``qsums``, ``Grid.inertia``):
# the same bits whichever rows a step re-assigned (Yinyang's), at no per-row distance cost.
inertia_from_sums = True
# An uncertain row of Yinyang's step against a row of Lloyd's pass: its float64 distances to
# every centroid and the group minima (docs/performance.md, "Yinyang").
bounds_cost = 3.0


def available() -> bool:
    """NumPy runs wherever daskmeans imports."""
    return True


def device_count() -> int:
    """No devices: the host's cores."""
    return 0


def device_budget() -> None:
    """No device memory to plan: the host budget holds the data and the loop."""
    return None


def step_rate() -> float:
    """This CPU's rate at the iterations' own work, counted as 2 N K D FLOP/s: the whole step
    (BLAS GEMM tiles, then the compiled pass with the exact sums) on 2048 rows of 64 features
    against 512 centroids (a few ms), the best of three after a first call (which loads the
    compiled pass, as the fit's first iteration would), under the calling thread's BLAS limit.
    A bare GEMM in cache overstates the rate several times over, and the warning then promised
    a fraction of the fit's time (docs/performance.md, "The long-fit estimate")."""
    rng = numpy.random.default_rng(0)
    n, d, k = 2048, 64, 512
    x = rng.standard_normal((n, d), dtype=numpy.float32)
    p = prepare(rng.standard_normal((k, d)), numpy.float32)
    grid = Grid(numpy.full(d, 8.0), float(n))
    assign(x, p, want_sums=True, grid=grid)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        assign(x, p, want_sums=True, grid=grid)
        best = min(best, time.perf_counter() - t)
    return 2 * n * k * d / max(best, 1e-9)


def asarray(block: Any, dtype: Any = None) -> numpy.ndarray:
    """C-contiguous and aligned (arrays deserialized from the network may be unaligned,
    which sends NumPy and BLAS down slow paths: docs/performance.md, "CPU path")."""
    return numpy.require(block, dtype=dtype, requirements=["C", "A"])


def staged(blocks: list) -> Any:
    """The host tier's chunks as the kernels take them (on the CPU: as they are)."""
    return (asarray(b) for b in blocks)


def pinned(block: Any) -> numpy.ndarray:
    """A host copy for the ``host`` tier; on the CPU the resident block itself."""
    return asarray(block)


def empty_host(shape: tuple[int, ...], dtype: Any) -> numpy.ndarray:
    """An uninitialised host array, C-contiguous and aligned (NumPy's allocations are)."""
    return numpy.empty(shape, dtype)


def copy_in(dst: numpy.ndarray, src: numpy.ndarray) -> Any:
    """``dst[...] = src``, done on return; the mark :func:`wait` takes."""
    numpy.copyto(dst, src)
    return mark()


def page_lock(a: numpy.ndarray) -> Any:
    """Nothing to lock on the host: returns the no-op unlock."""
    return _nothing


def _nothing() -> None:
    return None


def add_host(acc: numpy.ndarray, part: numpy.ndarray) -> None:
    acc += part


def to_numpy(a: Any, out: numpy.ndarray | None = None, blocking: bool = True) -> numpy.ndarray:
    if out is None:
        return numpy.asarray(a)
    numpy.copyto(out, a)
    return out


def mark() -> float:
    """The time: on the host every call's work is done when it returns."""
    return time.perf_counter()


def wait(mark: float) -> None:
    return None


def elapsed(start: float, end: float) -> float:
    return end - start


def working_bytes(k: int, d: int, rows: int, sm_count: int = 0, tunables: Tunables | None = None) -> int:
    """One tile of rows and their K distances (float64 at most), within ``tile_bytes``."""
    return min((tunables or tunables_in_force()).tile_bytes, rows * (k + d) * 8)


def warm(k: int, d: int, dtype: Any, precision: str = "fp32", rows: int = 1 << 20,
         tunables: Tunables | None = None, algorithm: str = "lloyd") -> None:
    """Nothing to start: Numba loads the cached CPU kernels at their first call."""
    return None


@dataclass(frozen=True)
class Prepared:
    """Centroid-side precomputation for one iteration (shared by all blocks)."""

    centroids: numpy.ndarray  # (K, D) in the data dtype
    neg2_ct: numpy.ndarray  # (D, K) = -2 * centroids.T, C-contiguous for the GEMM
    sqnorm: numpy.ndarray  # (K,) ||c||^2 in the data dtype
    tile_bytes: int  # a tile's rows and distances, bytes (Tunables.tile_bytes)
    cmax: float  # the largest ||c||, rounded up: the labels' certified margin (cpu_kernels.certify_tol)
    eps: float  # the GEMM's relative error bound for D and the dtype (bounds.margins)

    @property
    def k(self) -> int:
        return self.centroids.shape[0]


def prepare(centroids: Any, dtype: Any, precision: str = "fp32", tunables: Tunables | None = None) -> Prepared:
    """Cast centroids ``(K, D)`` to the data dtype and precompute ``-2 C^T`` and ``||c||^2``;
    the kernels on what this returns tile by ``tunables.tile_bytes``.

    ``precision`` names a GPU GEMM mode; CPUs have no TF32/BF16 GEMM, so every mode computes
    in the data dtype here (checked once per fit, by the estimator)."""
    from .bounds import margins

    c = numpy.ascontiguousarray(centroids, dtype=dtype)
    sq64 = numpy.einsum("kd,kd->k", c.astype(numpy.float64), c.astype(numpy.float64))
    eps, delta = margins(c.shape[1], c.dtype)
    cmax = float(numpy.sqrt(sq64.max())) * (1.0 + delta) if len(c) else 0.0
    return Prepared(c, numpy.ascontiguousarray((-2 * c).T), sq64.astype(dtype),
                    int((tunables or tunables_in_force()).tile_bytes), cmax, eps)


def _tile_rows(k: int, d: int, itemsize: int, tile_bytes: int) -> int:
    """Rows per tile: its rows (D values) and distances (K values) within ``tile_bytes``, so
    that the compiled pass re-reads the rows from the core's cache, not from memory; and at
    small K * D no more rows than keep the tile's GEMM within :data:`SMALL_GEMM_MNK`, where
    that leaves at least :data:`SMALL_GEMM_MIN_ROWS` (docs/performance.md, "CPU path")."""
    rows = tile_bytes // max(1, (k + d) * itemsize)
    small = SMALL_GEMM_MNK // max(1, k * d)
    if small >= SMALL_GEMM_MIN_ROWS:
        rows = min(rows, small)
    return max(TILE_ROWS_ALIGN, rows - rows % TILE_ROWS_ALIGN)


# OpenBLAS's AVX-512 kernels (the ``SkylakeX`` build NumPy's wheels run on such x86 cores)
# multiply matrices of at most this many M * N * K products by small-matrix kernels that skip
# packing the operands into panels; a tile of the step's GEMM (rows x D times D x K) just past
# it took a third longer at K = 4 (docs/performance.md, "CPU path"). Elsewhere the bound only
# makes small-K tiles smaller, never below SMALL_GEMM_MIN_ROWS rows.
SMALL_GEMM_MNK = 1_000_000
SMALL_GEMM_MIN_ROWS = 1024
# Tiles are whole multiples of this many rows: no row of a tile's GEMM falls in a BLAS
# kernel's partial block of rows, whose arithmetic may differ (see :func:`_tiles`).
TILE_ROWS_ALIGN = 64


# Up to this many centroids the compiled pass adds ``||c||^2`` and takes each row's argmin itself,
# while it reads the row's distances anyway: NumPy's row argmin over a few columns costs a call
# per row, and ``g += ||c||^2`` a pass over the tile (docs/performance.md, "CPU path"); beyond,
# NumPy's SIMD argmin is faster.
OWN_ARGMIN_MAX_K = 64


class _Workspace:
    """Tile buffers reused across tiles, blocks and calls (one set per thread). Dask workers
    set MALLOC_TRIM_THRESHOLD_=64KiB, so a fresh multi-MB temporary is mapped, faulted in and
    returned to the OS every time; one set per block is not enough (docs/performance.md,
    "CPU path")."""

    def __init__(self, rows: int, k: int, dtype: Any):
        self.g = numpy.empty((rows, k), dtype)
        self.lab = numpy.empty(rows, numpy.intp)
        # "No previous labels" as labels no row has: the compiled pass then has one
        # specialisation for both (each one loaded costs a new process time: docs/performance.md,
        # "One compiled pass after the GEMM").
        self.no_labels = numpy.full(rows, -1, numpy.int32)
        self.windows: dict[tuple[int, int], tuple[numpy.ndarray, numpy.ndarray]] = {}
        self.short: numpy.ndarray | None = None

    def short_tile(self, rows: int, d: int) -> numpy.ndarray:
        """A whole tile's rows ``(rows, D)`` for a block's last, shorter tile (:func:`_tiles`);
        rows past the block's hold whatever was there (each row of a GEMM is its own)."""
        if self.short is None or self.short.shape[0] < rows or self.short.shape[1] != d:
            self.short = numpy.zeros((max(rows, self.g.shape[0]), d), self.g.dtype)
        return self.short[:rows]

    def sum_windows(self, k: int, d: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        """The compiled pass's per-cluster float64 windows ``(K, D)`` and their weights
        ``(K,)``, zero between calls (each call closes its windows)."""
        w = self.windows.get((k, d))
        if w is None:
            w = self.windows[k, d] = (numpy.zeros((k, d), numpy.float64), numpy.zeros(k, numpy.float64))
        return w


_local = threading.local()
_NO_SQNORM = {numpy.dtype(numpy.float32): numpy.empty(0, numpy.float32),
              numpy.dtype(numpy.float64): numpy.empty(0, numpy.float64)}


def _workspace(rows: int, k: int, dtype: Any) -> _Workspace:
    ws = getattr(_local, "ws", None)
    if ws is None or ws.g.shape[0] < rows or ws.g.shape[1] != k or ws.g.dtype != dtype:
        ws = _local.ws = _Workspace(rows, k, dtype)
    return ws


def _tiles(X: numpy.ndarray, p: Prepared, own_argmin: bool = False):
    """Yield ``(start, stop, g, lab)`` per row tile: ``g = ||c||^2 - 2 x.c`` (rows, K) in the
    data dtype and its row-wise argmin (lowest index on ties), in reused buffers; with
    ``own_argmin``, ``g = -2 x.c`` only and ``lab`` scratch (the compiled pass adds
    ``||c||^2`` and takes the argmin).

    Every GEMM multiplies a whole tile, the block's last and shorter one copied into a tile's
    buffer: BLAS libraries pick their kernel by the product's shape (OpenBLAS's AVX-512 build
    a small-matrix kernel up to :data:`SMALL_GEMM_MNK`, its packed kernel beyond, a GEMV for
    one row), and those round a row's dot products differently, so a row's distances, and
    near a tie its label, depended on where the block ended: on the chunking. With one shape
    for every call, a row's bits no longer depend on where its block ends
    (``tests/unit/test_numpy_backend.py``); at another offset in a tile a BLAS may still round
    it differently (docs/performance.md, "CPU path"), within the error bound the compiled
    passes certify each label by (``cpu_kernels.certify_tol``)."""
    n = X.shape[0]
    step = _tile_rows(p.k, X.shape[1], X.dtype.itemsize, p.tile_bytes)
    ws = _workspace(step, p.k, X.dtype)
    for s in range(0, n, step):
        xt = X[s : s + step]
        m = xt.shape[0]
        if m < step:
            whole = ws.short_tile(step, X.shape[1])
            whole[:m] = xt
            xt = whole
        g = numpy.matmul(xt, p.neg2_ct, out=ws.g[:step])[:m]
        if own_argmin:
            yield s, s + m, g, ws.lab[:m]
            continue
        g += p.sqnorm
        yield s, s + m, g, g.argmin(axis=1, out=ws.lab[:m])


class RowNorms:
    """``||x||^2`` (float64, shape (n,)) of one block's rows, kept between passes over the same
    rows: they never change while the centroids do, and computing them was a fifth of a
    small-K step (docs/performance.md, "CPU path"). The first :func:`assign` given this
    object computes them in its pass and keeps them (``known``); the next ones read them.

    The caller keeps one per block and guarantees the block's rows are the same values in
    every pass given it (the engine's shards: a resident chunk, or one read again and checked
    against its pin)."""

    __slots__ = ("values", "known")

    def __init__(self, rows: int):
        self.values = numpy.empty(rows, numpy.float64)
        self.known = False

    def __len__(self) -> int:
        return self.values.shape[0]


def row_norms(rows: int) -> RowNorms:
    """An empty :class:`RowNorms` for a block of ``rows`` rows (``assign(row_norms=...)``)."""
    return RowNorms(rows)


_NO_NORMS = numpy.empty(0, numpy.float64)


def min_sqdist(X: numpy.ndarray, p: Prepared, grid: Grid | None = None) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Nearest centroid of each row.

    Parameters
    ----------
    X : ndarray, shape (n, d)
    p : Prepared centroids, K rows
    grid : Grid, optional
        Not needed on the host (the GPU backend's float16 GEMM takes its scale from it).

    Returns
    -------
    labels : ndarray of int32, shape (n,)
        Certified as :func:`assign`'s: the same for any chunking.
    sqdist : ndarray of float64, shape (n,)
        ``||x - c||^2`` of each row's centroid in a fixed order (``cpu_kernels.owner_sqdist``):
        a function of the row and its centroid alone.
    """
    from . import cpu_kernels

    X = asarray(X)
    labels = numpy.empty(X.shape[0], numpy.int32)
    d2 = numpy.empty(X.shape[0], numpy.float64)
    for s, e, g, lab in _tiles(X, p):
        cpu_kernels.tile_sqdist(g, lab, X[s:e], p.centroids, p.cmax, p.eps, labels[s:e], d2[s:e])
    return labels, d2


def assign(
    X: numpy.ndarray,
    p: Prepared,
    sample_weight: numpy.ndarray | None = None,
    want_sums: bool = True,
    prev_labels: numpy.ndarray | None = None,
    out_labels: numpy.ndarray | None = None,
    grid: Grid | None = None,
    interrupt: Callable[[], None] | None = None,
    row_norms: RowNorms | None = None,
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
        Where to write the labels (may be ``prev_labels``: each row is compared before it
        is overwritten).
    grid : Grid, optional
        The fixed-point grid of the sums (a fit's, the same for every block); by default the
        block's own.
    interrupt : callable, optional
        Called before each tile (it raises to stop early).
    row_norms : RowNorms, optional
        The rows' ``||x||^2``, kept from an earlier pass over the same rows or filled by
        this one (the same bits either way).

    Returns
    -------
    dict with ``labels`` (n,) int32, ``inertia`` float (weighted sum of squared distances),
    ``reassigned`` and ``rechecked`` ints (the rows whose label the GEMM's error bound left
    uncertain, re-ranked by their exact distances: ``cpu_kernels.tile_stats``),
    and when ``want_sums``: ``sums`` (K, d) and ``weights`` (K,) int64 multiples of the
    ``grid``'s steps (returned too), and ``counts`` (K,) int64.
    """
    from . import cpu_kernels

    X = asarray(X)
    n, d = X.shape
    k = p.k
    labels = out_labels if out_labels is not None else numpy.empty(n, numpy.int32)
    # float64 weights, as on the GPU: w * x rounds the same way on both.
    w = None if sample_weight is None else asarray(sample_weight, numpy.float64)
    if want_sums and grid is None:
        grid = Grid.for_block(X, w)
    kk = k if want_sums else 0  # the kernel touches the accumulators only with want_sums
    sums = numpy.zeros((kk, d), numpy.int64)
    weights = numpy.zeros(kk, numpy.int64)
    counts = numpy.zeros(kk, numpy.int64)
    qsums = numpy.zeros(kk, numpy.int64)
    qscale = grid.qscale if want_sums else 0.0
    scales = grid.scales(numpy) if want_sums else numpy.zeros(d)
    wscale = grid.wscale if want_sums else 0.0
    window = cpu_kernels.window_weight(grid.wexp) if want_sums else 0.0
    own = k <= OWN_ARGMIN_MAX_K
    sqnorm = p.sqnorm if own else _NO_SQNORM[X.dtype]
    ws = _workspace(_tile_rows(k, d, X.dtype.itemsize, p.tile_bytes), k, X.dtype)
    acc, wwin = ws.sum_windows(kk, d)
    inertia = 0.0
    reassigned = 0
    rechecked = 0
    if row_norms is not None and row_norms.values.shape[0] != n:
        raise ValueError(f"row_norms holds {row_norms.values.shape[0]} rows; the block has {n}: one RowNorms per block")
    known = row_norms is not None and row_norms.known
    norms = _NO_NORMS if row_norms is None else row_norms.values
    try:
        for s, e, g, lab in _tiles(X, p, own):
            if interrupt is not None:
                interrupt()
            prev = ws.no_labels[: e - s] if prev_labels is None else prev_labels[s:e]
            inertia, r_t, c_t = cpu_kernels.tile_stats(
                g, sqnorm, lab, X[s:e], None if w is None else w[s:e], prev, labels[s:e], scales, wscale, sums,
                weights, counts, want_sums, inertia, acc, wwin, window, norms[s:e] if norms.size else norms, known,
                qscale, qsums, p.centroids, p.cmax, p.eps,
            )
            reassigned += r_t
            rechecked += c_t
        if want_sums:
            cpu_kernels.flush_windows(acc, wwin, sums)
        if row_norms is not None:
            row_norms.known = True  # every tile ran: every row's norm is there
    finally:
        if want_sums and wwin.any():  # interrupted: the next call starts from closed windows
            acc[:] = 0.0
            wwin[:] = 0.0
    out: dict[str, Any] = {"labels": labels, "inertia": inertia, "reassigned": reassigned, "rechecked": rechecked}
    if want_sums:
        if w is None:
            weights = grid.unit_weights(counts)
        out.update(sums=sums, weights=weights, counts=counts, qsums=qsums, grid=grid)
    return out


def update_centroids(isums: numpy.ndarray, iweights: numpy.ndarray, old: numpy.ndarray, grid: Grid) -> tuple:
    """The Lloyd update from a fit's combined sums: ``(new, shift)``, the centroids (K, d)
    float64 (sums over weights; a cluster of no weight keeps its centroid) and the summed
    squared shift from ``old``. The CuPy backend's fused kernel gives the same bits."""
    ne = (iweights > 0)[:, None]
    new = numpy.where(ne, grid.sums(isums) / grid.weights(numpy.maximum(iweights, 1))[:, None], old)
    return new, float(((new - old) ** 2).sum())


def pin(X: numpy.ndarray) -> int:
    """A 64-bit hash of ``X``'s values in row order: xxHash's XXH3 of its bytes (faster than the
    reads it checks, docs/performance.md, "inputs pinned"; it releases the GIL, so several
    blocks are pinned at once)."""
    import xxhash

    return xxhash.xxh3_64_intdigest(numpy.ascontiguousarray(X))


def label_counts(labels: numpy.ndarray, k: int) -> numpy.ndarray:
    """Rows per label: int64 ``(k,)`` for int32 ``labels`` ``(n,)`` in ``[0, k)``."""
    return numpy.bincount(labels, minlength=k).astype(numpy.int64)


def bin_sums(labels: numpy.ndarray, weights: numpy.ndarray | None, m: int) -> numpy.ndarray:
    """Per-label sums of ``weights`` (None: counts), float64 ``(m,)``."""
    return numpy.bincount(labels, weights=weights, minlength=m).astype(numpy.float64, copy=False)


def moments(X: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray, int | None]:
    """Per-column mean, sum of squared deviations and largest absolute value (float64, shape
    (d,) each) of a block, and the index of its first row holding a NaN or infinity (None if
    all are finite)."""
    from . import cpu_kernels

    X = asarray(X)
    mean, m2, max_abs = (numpy.empty(X.shape[1], numpy.float64) for _ in range(3))
    if cpu_kernels.column_moments(X, mean, m2, max_abs):
        return mean, m2, max_abs, None
    bad = numpy.flatnonzero(~numpy.isfinite(X).all(axis=1))
    if bad.size:
        return mean, m2, max_abs, int(bad[0])
    raise DataError("X has values too large to average in float64 (a column sum overflows); rescale the data")


# ---------------------------------------------------------------- Yinyang's bounds (engine/yinyang.py)


def bound_margins(d: int, dtype: Any) -> tuple[float, float]:
    """``(eps, delta)`` of the Yinyang kernels for ``d`` features of ``dtype``
    (:func:`.bounds.margins`: the GEMM's ``g`` in the data dtype, as this backend computes it)."""
    from .bounds import margins

    return margins(d, dtype)


def row_sqnorms(X: numpy.ndarray) -> numpy.ndarray:
    """``||x||^2`` of every row, float64 ``(n,)``."""
    from . import cpu_kernels

    X = asarray(X)
    out = numpy.empty(X.shape[0], numpy.float64)
    cpu_kernels.row_sqnorms(X, out)
    return out


def centroid_drift(old: numpy.ndarray, new: numpy.ndarray) -> tuple[numpy.ndarray, float]:
    """Each centroid's move ``||new - old||`` (float64 ``(K,)``, rounded up) between two
    steps' centroids in the data dtype ``(K, D)``, and the largest norm of ``new`` (rounded up)."""
    from . import bounds

    return bounds.centroid_drift(numpy, old, new)


def yinyang_filter(X: numpy.ndarray, p: Prepared, labels: numpy.ndarray, upper: numpy.ndarray,
                   lower: numpy.ndarray, xnorm: numpy.ndarray, drift: numpy.ndarray, gdrift: numpy.ndarray,
                   cmax: float) -> numpy.ndarray:
    """Yinyang's global filter on one block: the bounds moved by the drift (in place) and the
    rows they leave uncertain.

    Parameters
    ----------
    X : ndarray, shape (n, d)
    p : Prepared, the step's centroids
    labels : int32 ndarray, shape (n,), the previous step's
    upper : float64 ndarray, shape (n,); lower : float64 ndarray, shape (n, t)
        The bounds under the previous step's centroids, updated in place.
    xnorm : float64 ndarray, shape (n,), ``||x||^2``
    drift : float64 ndarray, shape (K,); gdrift : shape (t,), the largest of each group
    cmax : float, the largest centroid norm

    Returns
    -------
    int64 ndarray, shape (m,): the rows (ascending) whose label the bounds do not certify.
    """
    from . import cpu_kernels

    X = asarray(X)
    eps, delta = bound_margins(X.shape[1], X.dtype)
    cand = numpy.empty(X.shape[0], numpy.int64)
    m = cpu_kernels.yy_filter(X, p.centroids, labels, upper, lower, xnorm, drift, gdrift, float(cmax), eps, delta,
                              cand)
    return cand[:m]


def assign_bounds(X: numpy.ndarray, p: Prepared, group_of: numpy.ndarray, n_groups: int, xnorm: numpy.ndarray,
                  cmax: float, interrupt: Callable[[], None] | None = None) -> tuple:
    """Labels of :func:`assign` and Yinyang's bounds of a block's rows.

    Parameters
    ----------
    X : ndarray, shape (n, d)
    p : Prepared
    group_of : int32 ndarray, shape (K,), each centroid's group in ``[0, n_groups)``
    xnorm : float64 ndarray, shape (n,); cmax : float, the largest centroid norm
    interrupt : callable, optional

    Returns
    -------
    labels : int32 (n,)
        :func:`assign`'s labels of these rows (the same GEMM, argmin and certification).
    upper : float64 (n,)
        Each row's distance to its centroid, rounded up.
    lower : float64 (n, n_groups)
        Per group, a lower bound on the distances to its centroids other than the row's own.
    """
    from . import cpu_kernels

    X = asarray(X)
    n, d = X.shape
    eps, delta = bound_margins(d, X.dtype)
    labels = numpy.empty(n, numpy.int32)
    upper = numpy.empty(n, numpy.float64)
    lower = numpy.empty((n, n_groups), numpy.float64)
    # The columns by group, each group a contiguous range of ``order``: a tile's columns taken
    # in that order (``numpy.take``, several times faster than fancy indexing) make each
    # group's minimum a contiguous run for the compiled pass.
    group_of = numpy.asarray(group_of, numpy.int32)
    order = numpy.argsort(group_of, kind="stable").astype(numpy.int64)
    sizes = numpy.bincount(group_of, minlength=n_groups)
    ends = numpy.cumsum(sizes)
    starts = ends - sizes
    gp = None
    for s, e, g, lab in _tiles(X, p):  # ||c||^2 added, NumPy's argmin: assign's labels
        if interrupt is not None:
            interrupt()
        if gp is None or gp.shape[0] < g.shape[0]:
            gp = numpy.empty_like(g)
        numpy.take(g, order, axis=1, out=gp[: g.shape[0]])
        cpu_kernels.tile_bounds(g, lab, gp[: g.shape[0]], X[s:e], p.centroids, group_of, order, starts, ends,
                                xnorm[s:e], float(cmax), eps, delta, labels[s:e], upper[s:e], lower[s:e])
    return labels, upper, lower


def add_label_sums(X: numpy.ndarray, labels: numpy.ndarray, sample_weight: numpy.ndarray | None, sign: int,
                   grid: Grid, sums: numpy.ndarray, weights: numpy.ndarray, counts: numpy.ndarray,
                   qsums: numpy.ndarray | None = None, xnorm: numpy.ndarray | None = None) -> None:
    """``sign`` (+1 or -1) times the rows' values on ``grid`` added to their labels' sums
    ``(K, d)``, weights ``(K,)`` (weighted rows only: unit weights follow the counts) and
    counts ``(K,)``, all int64, in place: the integers :func:`assign` adds. With ``qsums``
    ``(K,)`` int64 and the rows' ``xnorm`` ``(n,)`` float64 (:func:`row_sqnorms`), also
    their ``w ||x||^2`` on the grid (``assign``'s ``qsums``, the inertia's exact sums)."""
    from . import cpu_kernels

    X = asarray(X)
    w = None if sample_weight is None else asarray(sample_weight, numpy.float64)
    if qsums is None:
        qsums, xnorm = _NO_Q, _NO_NORMS
    cpu_kernels.label_sums(X, labels, w, int(sign), grid.scales(numpy), grid.wscale, sums, weights, counts,
                           xnorm, grid.qscale, qsums)


_NO_Q = numpy.zeros(0, numpy.int64)


def owner_inertia(X: numpy.ndarray, p: Prepared, labels: numpy.ndarray,
                  sample_weight: numpy.ndarray | None = None) -> float:
    """The rows' inertia under ``labels`` (``sum w ||x - c||^2`` in float64, NumPy's order).
    The steps do not call it here: this backend's step inertia is :meth:`.grid.Grid.inertia`
    of the exact sums (``inertia_from_sums``)."""
    from . import bounds

    return float(bounds.owner_inertia(numpy, asarray(X), p.centroids, labels, sample_weight))


def sqdistances(X: numpy.ndarray, p: Prepared) -> numpy.ndarray:
    """Squared distances ``(n, K)`` from every row to every centroid (float64, clamped at 0),
    from the GEMM tiles of :func:`_tiles` (the same bits wherever the block ends)."""
    X = asarray(X)
    g = numpy.empty((X.shape[0], p.k), numpy.float64)
    for s, e, t, _ in _tiles(X, p, own_argmin=True):
        g[s:e] = t
    g += p.sqnorm
    g += numpy.einsum("nd,nd->n", X, X, dtype=numpy.float64)[:, None]
    return numpy.maximum(g, 0.0, out=g)
