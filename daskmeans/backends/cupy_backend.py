"""CuPy kernels: the same contract as :mod:`daskmeans.backends.numpy_backend`, on the GPU.

Two regimes, chosen in :func:`prepare` from K and D alone:

fused (small K x D: the centroids fit in shared memory)
    one ``fused_small`` pass over X: float64 distances, argmin, labels, block-private sums in
    registers or shared memory, one partial per block reduced in a fixed order. No GEMM, no
    N x K tile, no global atomics.
GEMM (moderate and large K)
    per row tile, ``gemm_prep`` writes the rows as the GEMM reads them and each
    row's error bound, cuBLAS ``gemmEx`` (alpha = -2) writes ``G = -2 X C^T`` into one of two
    preallocated tiles, then a selection kernel takes the top-2 (and third value) of
    ``G + ||c||^2`` per row, certifies the winner against the row's bound and re-ranks
    the uncertain rows by exact float64 distances: ``select_cols`` on a column-major tile
    (threads own rows; fp32, where few rows are uncertain) or ``select_rows`` on a row-major
    one (a warp per row; ``_select_layout``). The GEMMs run on a low-priority stream and the
    selects on a high-priority one. In both, sums and (when the selection did not compute
    exact distances) the inertia follow from a counting sort by label and run-length
    accumulation (``sorted_sums``).

Sums and weights are int64 multiples of the grid's steps (:mod:`.grid`): each ``w x`` is
rounded once, as the NumPy backend rounds it, and added exactly, so atomics in any order, any
chunking and either backend give the same integers.

Labels are those of exact distances in both regimes and in every ``precision``: "fp32"
(the default: split TF32, three TF32 products in one tensor-core GEMM of depth 3D, or
cuBLAS's fp32 GEMM; ``gpu-fp32-gemm``), "tf32" (one TF32 product) and "bf16" (bfloat16
inputs) differ in speed and in how many rows need the exact re-check (``rechecked``), never
in labels. The bounds are certified per row (``_error_bound``): inputs are rounded to nearest
by ``gemm_prep``, so each row's actual residual enters, not the format's worst case.
CuPy is imported lazily so that importing daskmeans never needs a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy

from .. import config
from . import check_precision
from . import cuda_src
from .grid import Grid

def __getattr__(attr: str) -> Any:
    if attr == "xp":
        import cupy

        return cupy
    raise AttributeError(attr)


name = "cupy"


def asarray(block: Any, dtype: Any = None) -> Any:
    import cupy

    return cupy.ascontiguousarray(cupy.asarray(block, dtype=dtype))


def pinned(block: Any) -> numpy.ndarray:
    """A copy of host ``block`` in page-locked memory (the ``host`` tier): copies from it to
    the GPU run at the link's speed (pinned ~55 GB/s vs pageable ~10 GB/s on an H200 host)."""
    import cupyx

    a = numpy.asarray(block)
    out = cupyx.empty_pinned(a.shape, a.dtype)
    out[...] = a
    return out


def to_numpy(a: Any) -> numpy.ndarray:
    import cupy

    return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else numpy.asarray(a)


# ------------------------------------------------------------------ regime choice

_THREADS = 256
_REG_ACC = 32  # float64 register accumulators per lane (K x values-per-lane)
_SHARED_BYTES = 48 * 1024


def _small_config(k: int, d: int, shared_max: int = _SHARED_BYTES) -> tuple[int, int, int, bool, bool] | None:
    """``(L, DPL, KACC, TRED, CREG)`` of the fused kernel for K x D, or None for the GEMM
    regime.

    Fewest lanes per row such that K x DPL register values fit (fewer lanes, fewer shuffles
    per row), their K distances reduced transposed when K <= L (TRED); then, by
    ``daskmeans.gpu-small-centroids``, either the centroids in registers and the sums in
    per-group shared memory (CREG; "registers" or "auto", where the block may have the
    ``shared_max`` bytes this takes), or the centroids in shared memory and the sums in
    registers ("shared"). Else shared-memory centroids and accumulators, at most 16 values
    per lane."""
    for lanes in (1, 2, 4, 8, 16, 32):
        dpl = -(-d // lanes)
        if k * dpl <= _REG_ACC and _shared_bytes(k, lanes, dpl, False) <= _SHARED_BYTES:
            choice = config.choice("gpu-small-centroids", ("auto", "registers", "shared"))
            # Auto: registers wherever they fit. Kernel alone, H200: S1 0.246 vs 0.295 ms (the
            # two 16-lane groups of a warp each paid for their own shared-memory centroid
            # reads); S2 0.076 vs 0.086 ms (one lane per row: the K x DPL predicated register
            # updates per row cost more than a read-add-write of the row's slice).
            fits = _shared_bytes(k, lanes, dpl, True) <= shared_max
            creg = fits and choice in ("registers", "auto")
            return lanes, dpl, k, 2 <= k <= lanes, creg
    for lanes in (1, 2, 4, 8, 16, 32):
        dpl = -(-d // lanes)
        if dpl <= 16 or lanes == 32:
            if dpl <= 32 and _shared_bytes(k, lanes, dpl, False) <= _SHARED_BYTES:
                return lanes, dpl, 0, False, False
            return None
    return None


def uses_tiles(k: int, d: int) -> bool:
    """True where K x D takes the GEMM regime (row tiles of K distances in GPU memory); the
    fused regime needs no tiles. Pure: no GPU needed (the memory plan asks on the client)."""
    return _small_config(k, d) is None


def _shared_bytes(k: int, lanes: int, dpl: int, creg: bool, mode: int = 0) -> int:
    """Dynamic shared memory of ``fused_small`` (cuda_src.SMALL_SRC): float64 centroids and
    sums (K x DP each; no sums in MODE 1), or with CREG each group of L lanes' slice (GS:
    K x (DP + 2) sums, weights and counts, made odd for L >= 2; none in MODE 1); then weights,
    counts and two scalars."""
    dp = lanes * dpl
    if creg:
        slice_ = k * (dp + 2) if lanes == 1 else (k * (dp + 2)) | 1
        return 8 * ((0 if mode == 1 else (_THREADS // lanes) * slice_) + 2 * k + 2)
    return 8 * ((1 if mode == 1 else 2) * k * dp + 2 * k + 2)


@functools.lru_cache(maxsize=None)
def _shared_optin(device_id: int) -> int:
    """Most dynamic shared memory one block may opt in to on a device."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id).get("sharedMemPerBlockOptin", _SHARED_BYTES))


@dataclass(frozen=True)
class Prepared:
    """Centroid-side precomputation for one iteration (shared by all blocks).

    ``small`` is the fused kernel's ``(L, DPL, KACC, TRED, CREG)``, or None for the GEMM regime, whose
    inputs are ``a`` (Kpad x D' centroids as the GEMM reads them, zero rows past K; see
    ``mode``), ``csq`` (Kpad squared norms in the GEMM output type, +inf past K) and the error
    bound coefficients ``err = (A, R, B)``: ``|G + csq - (||c||^2 - 2 x.c)| <= A ||x|| +
    R ||x - xb|| + B`` for every centroid, ``xb`` the row as the GEMM reads it.
    """

    centroids: Any  # (K, D) cupy, data dtype
    c64: Any  # (K, D) float64 values of ``centroids``
    precision: str
    small: tuple | None
    a: Any = None
    csq: Any = None
    err: tuple = (0.0, 0.0, 0.0)
    mode: int = 0  # GEMM inputs, as gemm_prep's MODE: 0 as given, 1 TF32, 2 split TF32 (3D), 3 bf16

    @property
    def k(self) -> int:
        return self.centroids.shape[0]


_TINY = 2.0**-100  # gemm_prep flushes smaller inputs to zero (cuda_src)


def _gemm_mode(precision: str, gemm64: bool) -> int:
    """How the GEMM reads its float32 inputs (``gemm_prep`` MODE): fp32 precision as split TF32
    (``daskmeans.gpu-fp32-gemm``: "3xtf32", or "auto" on A100/H100/B100-class GPUs, whose TF32
    tensor cores run a 3D-deep TF32 GEMM faster than the fp32 one: P2 ~2.5 vs 6.2 ms on an
    H200) or as given ("sgemm"); tf32 and bf16 inputs rounded to nearest by us, so that the
    rounding error of each row is known exactly (``||x - xb||``), not bounded by the format's
    worst case."""
    if gemm64:
        return 0
    if precision == "tf32":
        return 1
    if precision == "bf16":
        return 3
    how = config.choice("gpu-fp32-gemm", ("auto", "sgemm", "3xtf32"))
    if how == "auto":
        import cupy

        cc = cupy.cuda.Device().compute_capability  # "90" for 9.0
        # Data-centre parts (8.0, 9.0, 10.0): TF32 throughput 8x fp32 or more; consumer parts
        # (8.6, 8.9, 12.x) run TF32 near their fp32 rate, where three TF32 products lose.
        how = "3xtf32" if cc in ("80", "90", "100") else "sgemm"
    return 2 if how == "3xtf32" else 0


def _error_bound(cmax: float, smax: float, d: int, mode: int, gemm64: bool) -> tuple[float, float, float]:
    """``(A, R, B)`` with ``|G + csq - (||c||^2 - 2 x.c)| <= A ||x|| + R ||x - xb|| + B`` for
    every centroid: ``cmax`` the largest ``||c||``, ``smax`` the largest ``||c - cb||`` (``cb``
    the centroid as the GEMM reads it), ``mode`` as in :func:`_gemm_mode`.

    With ``M = cmax + smax >= ||cb||``, ``S = smax`` and Cauchy-Schwarz throughout:
    rounded inputs (modes 1, 3): ``xb.cb - x.c = -(x.cs + xs.cb)``, at most ``||x|| S +
    ||xs|| M``; split TF32 (mode 2): the GEMM sums ``xb.cb + xb.tf(cs) + tf(xs).cb``, off by
    ``xb.(cs - tf(cs)) + (xs - tf(xs)).cb + xs.cs``, at most ``h (||xb|| S + ||xs|| M) +
    ||xs|| S`` with ``h = 2^-10`` (cuBLAS's TF32 conversion of the residuals, any faithful
    rounding). Accumulating the m D products in any order costs ``g = 2 m D u`` times the sum
    of their magnitudes (twice the classical ``D u``: tensor-core adders may truncate); ``G``
    carries the factor 2 of ``-2 x.c``. Rounding ``||c||^2`` and adding it to ``G`` add ``u (2
    ||x|| cmax + 2 cmax^2)``. Absolute terms cover the flush of inputs below 2^-100 and
    products underflowing float32. A 10% margin covers the second-order terms."""
    u = 2.0**-53 if gemm64 else 2.0**-24
    m = 3 if mode == 2 else 1
    g = 2 * m * d * u
    S, M = smax, cmax + smax
    if mode == 0:
        a, r = g * cmax, 0.0
    elif mode == 2:
        h = 2.0**-10
        a = h * S + g * (M + S * (1 + h))
        r = h * S + h * M + S + g * (M + S * (1 + h) + (1 + h) * M)
    else:
        a = S + g * M
        r = M + g * M
    A = 1.1 * (2 * a + 2.2 * u * cmax)
    R = 1.1 * 2 * r
    B = 1.1 * 2.2 * u * cmax * cmax
    if not gemm64:
        A += 2.2 * d**0.5 * _TINY
        B += 2.2 * d**0.5 * _TINY * M + 4.4 * m * d * 2.0**-126
    return A, R, B


def _prep(X: Any, mode: int, cen: int, out: Any, sq: Any, rsq: Any, eb: Any, err: tuple) -> None:
    """``gemm_prep`` on the rows of ``X`` (see cuda_src): the GEMM's rounded copy in ``out``
    (mode > 0), per-row ``||x||^2`` / ``||x - xb||^2`` / error bounds where arrays are given."""
    import cupy

    rows, d = X.shape
    kern = cuda_src.prep_kernel(X.dtype, mode)
    nb = int(max(1, min(32 * _sm_count(cupy.cuda.Device().id), -(-rows // 32))))  # 8 warps x 4 rows
    kern((nb,), (256,), (X, cupy.int64(rows), cupy.int32(d), cupy.int32(cen), _ptr(out),
                         _ptr(sq), _ptr(rsq), _ptr(eb), *(numpy.float64(e) for e in err)))


def _prep_buffer(rows: int, d: int, mode: int) -> Any:
    """The GEMM's copy of ``rows`` rows in ``mode`` (None for mode 0: the data itself)."""
    import cupy

    if mode == 0:
        return None
    return cupy.empty((rows, 3 * d if mode == 2 else d), cupy.uint16 if mode == 3 else cupy.float32)


def prepare(centroids: Any, dtype: Any, precision: str = "fp32") -> Prepared:
    """Cast centroids ``(K, D)`` to the data dtype and precompute what the kernels read."""
    import cupy

    check_precision(precision)
    c = cupy.ascontiguousarray(cupy.asarray(centroids, dtype=dtype))
    c64 = c.astype(cupy.float64)
    k, d = c.shape
    small = _small_config(k, d, _shared_optin(cupy.cuda.runtime.getDevice()))
    if small is not None:
        return Prepared(c, c64, precision, small)  # c64: contiguous, as c
    gemm64 = c.dtype == cupy.float64
    mode = _gemm_mode(precision, gemm64)
    kpad = -(-k // 4) * 4
    a = cupy.zeros((kpad, d), c.dtype)
    a[:k] = c
    smax = 0.0
    if mode:
        rsq = cupy.empty(kpad, cupy.float64)
        ab = _prep_buffer(kpad, d, mode)
        _prep(a, mode, 1, ab, None, rsq, None, (0.0, 0.0, 0.0))
        a = ab
        smax = float(cupy.sqrt(rsq.max()))
    sq = (c64 * c64).sum(axis=1)
    # Padded with +inf (never selected): select_rows reads it in 16-byte vectors past K.
    csq = cupy.full(-(-k // _CSQ_PAD) * _CSQ_PAD, numpy.inf, cupy.float64 if gemm64 else cupy.float32)
    csq[:k] = sq
    cmax = float(cupy.sqrt(sq.max()))
    return Prepared(c, c64, precision, None, a, csq, _error_bound(cmax, smax, d, mode, gemm64), mode)


@functools.lru_cache(maxsize=None)
def _sm_count(device_id: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


@functools.lru_cache(maxsize=None)
def _streams(device_id: int) -> tuple:
    """``(gemm, select)`` streams of a device; the select stream has the higher priority, so
    its blocks take SMs as soon as GEMM blocks retire (the two kernels overlap)."""
    import cupy

    with cupy.cuda.Device(device_id):
        try:
            least, greatest = cupy.cuda.runtime.deviceGetStreamPriorityRange()
            return (cupy.cuda.Stream(non_blocking=True, priority=least),
                    cupy.cuda.Stream(non_blocking=True, priority=greatest))
        except (TypeError, AttributeError):  # a CuPy without stream priorities
            return cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)


# ------------------------------------------------------------------ the fused regime

_NULL = numpy.uint64(0)  # a NULL pointer argument (optional kernel inputs and outputs)


def _ptr(a: Any) -> Any:
    return _NULL if a is None else a


_OCCUPANCY: dict = {}


def _blocks_per_sm(kern: Any, threads: int, shared: int) -> int:
    key = (id(kern), threads, shared)
    if key not in _OCCUPANCY:
        _OCCUPANCY[key] = _occupancy(kern, threads, shared)
    return _OCCUPANCY[key]


def _occupancy(kern: Any, threads: int, shared: int) -> int:
    """Resident blocks per multiprocessor, from the kernel's registers and shared memory
    (Hopper limits: 64K registers allocated per warp in units of 256, 228 KiB shared memory
    with 1 KiB reserved per block, 2048 threads)."""
    try:
        attrs = kern.attributes
        regs_per_warp = -(-int(attrs["num_regs"]) * 32 // 256) * 256
        by_regs = 65536 // (regs_per_warp * (threads // 32))
        by_shared = (228 * 1024) // (shared + int(attrs.get("shared_size_bytes", 0)) + 1024)
        return max(1, min(by_regs, by_shared, 2048 // threads, 32))
    except Exception:  # the occupancy estimate is an optimisation only
        return 2


_PLANS: dict = {}


def _small_plan(X: Any, p: Prepared, mode: int = 0) -> tuple:
    """Launch plan of the fused kernel (``mode`` as in ``cuda_src.SMALL_SRC``) for a block:
    ``(kern, reduce, shared, nb, width, scalars)``, cached per shape, dtype, configuration and
    device. Building it costs tens of microseconds of Python, a large share of a small
    block's step (S2: ~0.1 ms)."""
    import cupy

    n, d = X.shape
    key = (n, d, X.dtype.char, p.k, p.small, mode, cupy.cuda.runtime.getDevice())
    plan = _PLANS.get(key)
    if plan is None:
        k = p.k
        lanes, dpl, kacc, tred, creg = p.small
        kern, reduce = cuda_src.small_kernels(X.dtype, lanes, dpl, kacc, tred, _THREADS, mode, creg, d == lanes * dpl)
        shared = _shared_bytes(k, lanes, dpl, creg, mode)
        if shared > _SHARED_BYTES:  # past the default 48 KiB: opt in (CREG's group sums)
            kern.max_dynamic_shared_size_bytes = shared
        # Every resident block slot filled once (a persistent grid): the partials to reduce
        # grow with the grid, not with n.
        slots = _blocks_per_sm(kern, _THREADS, shared) * _sm_count(key[-1])
        nb = int(max(1, min(slots, -(-n // (_THREADS // lanes)))))
        width = k * d + 2 * k + 2
        scalars = (cupy.int64(n), cupy.int32(d), cupy.int32(k), cupy.int32(nb), cupy.int32(width), cupy.int32(k * d))
        if len(_PLANS) > 1024:  # many block shapes (e.g. predictions on varied arrays)
            _PLANS.clear()
        plan = _PLANS[key] = (kern, reduce, shared, nb, width, scalars)
    return plan


def _run_small(X, p, w, prev, labels, d2, want_sums, grid=None):
    import cupy

    k, d = p.k, X.shape[1]
    # Without sums, the labels-only variant (MODE 1: no accumulators, more rows in flight;
    # S1 0.21 vs 0.29 ms on an H200).
    kern, reduce, shared, nb, width, (n64, d32, k32, nb32, width32, kd32) = _small_plan(X, p, 0 if want_sums else 1)
    part = cupy.empty((nb, width), cupy.int64) if want_sums else None
    pstat = None if want_sums else cupy.empty((nb, 2), cupy.float64)
    scales, ws = (grid.scales(cupy), grid.wscale) if want_sums else (None, 0.0)
    kern(
        (nb,), (_THREADS,),
        (X, n64, d32, k32, p.c64, _ptr(w), _ptr(scales), cupy.float64(ws), _ptr(prev), _ptr(labels), _ptr(d2),
         _ptr(part), _ptr(pstat)),
        shared_mem=shared,
    )
    if not want_sums:
        st = pstat.sum(axis=0)
        return {"inertia": st[0], "reassigned": st[1], "rechecked": 0}
    kd = k * d
    tot = cupy.empty(kd + 2 * k, cupy.int64)
    stat = cupy.empty(2, cupy.float64)
    # One warp per column.
    reduce((-(-width * 32 // 256),), (256,), (part, nb32, width32, k32, kd32, tot, stat))
    counts = tot[kd + k :]
    return {
        "sums": tot[:kd].reshape(k, d),
        "weights": tot[kd : kd + k] if w is not None else grid.unit_weights(counts),
        "counts": counts,
        "inertia": stat[0],
        "reassigned": stat[1],
        "rechecked": 0,
    }


# ------------------------------------------------------------------ the GEMM regime

_CUDA_R_32F, _CUDA_R_64F, _CUDA_R_16BF = 0, 1, 14  # cudaDataType_t (library_types.h)
_CSQ_PAD = 128  # the centroids' squared norms are padded to a multiple of this


_HIST_MAX_K = _SHARED_BYTES // 4  # block-local label counters (uint32) in shared memory


def _label_sums(X, labels, w, k, grid, C=None, stat=None) -> dict:
    """Per-cluster sums and weights (int64 on ``grid``) and int64 counts of a labelled block:
    rows in label order (a counting sort), then run-length sums (no per-element atomics). With
    ``C`` and ``stat``, the same pass adds the block's inertia (exact float64 distances) to
    ``stat[0]``."""
    import cupy

    n, d = X.shape
    kernels = cuda_src.select_kernels(X.dtype, X.dtype)
    sm = _sm_count(cupy.cuda.Device().id)
    blocks_max = 8 * sm
    perm = cupy.empty(n, cupy.int64)
    slab = cupy.empty(n, cupy.int32)
    if k <= _HIST_MAX_K:
        # Block-local counters: per-block label histograms, their exclusive scan in (label,
        # block) order, then each block scatters its rows from its offsets.
        hist_k, scatter_k = kernels[3], kernels[4]
        nblk = int(max(1, min(2 * sm, -(-n // 4096))))
        rows = -(-n // nblk)
        hist = cupy.empty((nblk, k), cupy.int32)
        args = (labels, cupy.int64(n), cupy.int32(k), cupy.int64(rows))
        hist_k((nblk,), (512,), args + (hist,), shared_mem=4 * k)
        h64 = hist.astype(cupy.int64)
        counts = h64.sum(axis=0)
        off = cupy.cumsum(h64, axis=0)
        off -= h64
        off += (cupy.cumsum(counts) - counts)[None, :]
        scatter_k((nblk,), (512,), args + (off, perm, slab), shared_mem=4 * k)
    else:
        # Global counters. Not cupy.bincount: it synchronises with the host twice (the labels'
        # minimum and maximum), stalling the launches queued behind it.
        counts = cupy.zeros(k, cupy.uint64)  # atomicAdd has no signed 64-bit form
        cupy.add.at(counts, labels, numpy.uint64(1))
        cursor = cupy.cumsum(counts) - counts
        kernels[1]((int(max(1, min(blocks_max, -(-n // 256)))),), (256,), (labels, cupy.int64(n), cursor, perm, slab))
    sums = cupy.zeros((k, d), cupy.int64)
    nb = int(max(1, min(blocks_max, -(-n // (8 * 32)))))  # 8 warps of 32 sorted rows
    kernels[2]((nb,), (256,), (X, cupy.int32(d), cupy.int64(n), perm, slab, _ptr(w), _ptr(C), grid.scales(cupy), sums,
                                _ptr(stat)))
    counts = counts.astype(cupy.int64, copy=False)
    if w is None:
        weights = grid.unit_weights(counts)
    else:  # on the grid (integer atomics: any order, the same bits); weights are never negative
        weights = cupy.zeros(k, cupy.uint64)
        cupy.add.at(weights, labels, cupy.rint(w * grid.wscale).astype(cupy.uint64))
        weights = weights.view(cupy.int64)
    return {"sums": sums, "weights": weights, "counts": counts}


def _tile_rows(p: Prepared, n: int) -> int:
    """Rows of one GEMM tile: its distances (rows x Kpad) and its rounded inputs (gemm_prep's
    copy, rows x D') each within ``gpu-tile-bytes``."""
    row_bytes = max(p.a.shape[0] * p.csq.dtype.itemsize, p.a.shape[1] * p.a.dtype.itemsize if p.mode else 0)
    return int(max(32, min(n, config.get_bytes("gpu-tile-bytes") // max(1, row_bytes))))


def _gemm(p: Prepared, xt, out, ldr: int | None = None) -> None:
    """``out[:rows] = -2 xt a^T`` (rows x Kpad, row-major) on the current stream; with ``ldr``,
    column-major instead (``out[k * ldr + r]``). ``xt`` (rows x D') is the tile as the GEMM
    reads it: the data for ``p.mode`` 0, else ``gemm_prep``'s copy."""
    import cupy
    from cupy.cuda import cublas, device

    rows, d = xt.shape
    kpad = p.a.shape[0]
    h = device.get_cublas_handle()
    cublas.setStream(h, cupy.cuda.get_current_stream().ptr)
    if p.centroids.dtype == cupy.float64:
        scal = numpy.array([-2.0, 0.0])
        ab, ct, comp = _CUDA_R_64F, _CUDA_R_64F, cublas.CUBLAS_COMPUTE_64F
    else:
        scal = numpy.array([-2.0, 0.0], numpy.float32)
        ct, comp = _CUDA_R_32F, cublas.CUBLAS_COMPUTE_32F
        ab = _CUDA_R_16BF if p.mode == 3 else _CUDA_R_32F
        if p.mode in (1, 2):
            comp = cublas.CUBLAS_COMPUTE_32F_FAST_TF32
    bptr = xt.data.ptr
    mode = cublas.getPointerMode(h)
    if mode != cublas.CUBLAS_POINTER_MODE_HOST:
        cublas.setPointerMode(h, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        if ldr is None:
            # Column-major view: out^T (Kpad x rows) = a (Kpad x D') . xt^T (D' x rows).
            cublas.gemmEx(
                h, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, kpad, rows, d,
                scal.ctypes.data, p.a.data.ptr, ab, d, bptr, ab, d,
                scal[1:].ctypes.data, out.data.ptr, ct, kpad, comp, cublas.CUBLAS_GEMM_DEFAULT,
            )
        else:
            # out (rows x Kpad, column-major, leading dimension ldr) = xt (rows x D') . a^T.
            cublas.gemmEx(
                h, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, rows, kpad, d,
                scal.ctypes.data, bptr, ab, d, p.a.data.ptr, ab, d,
                scal[1:].ctypes.data, out.data.ptr, ct, ldr, comp, cublas.CUBLAS_GEMM_DEFAULT,
            )
    finally:
        if mode != cublas.CUBLAS_POINTER_MODE_HOST:
            cublas.setPointerMode(h, mode)


def _select_layout(rows: int, kpad: int, gdt: Any, device_id: int, precision: str) -> int:
    """Rows per thread of ``select_cols`` on a column-major tile of ``rows`` rows (4, 2 or 1),
    or 0 for ``select_rows`` on a row-major tile (``daskmeans.gpu-select-layout``: "auto",
    "rows", or "cols1" / "cols2" / "cols4"). Auto, float32 tiles in fp32 precision with K up
    to 2048: the most rows per thread that still gives every SM three blocks (the column
    kernel parallelises over rows only). Larger K: a row whose bound leaves three or more
    candidates re-reads its row of the column-major tile one 32-byte sector per centroid
    (P3, K = 5000, 2.4% such rows: 35 vs 17 ms, H200), and each thread's share of the
    centroids grows. Not for tf32/bf16: more uncertain rows (4-8% on random data)."""
    layout = config.choice("gpu-select-layout", ("auto", "rows", "cols1", "cols2", "cols4"))
    if gdt != numpy.float32 or layout == "rows":
        return 0
    if layout.startswith("cols"):
        return int(layout[4:])
    if precision != "fp32" or kpad > 2048:
        return 0
    for rpt in (4, 2, 1):
        if -(-rows // (32 * rpt)) >= 3 * _sm_count(device_id):
            return rpt
    return 0


def _run_gemm(X, p, w, prev, labels, d2, want_sums, grid=None):
    import cupy

    n, d = X.shape
    k = p.k
    kpad = p.a.shape[0]
    gdt = p.csq.dtype
    rows = _tile_rows(p, n)
    rpt = _select_layout(rows, kpad, gdt, cupy.cuda.Device().id, p.precision)
    kern = cuda_src.select_cols_kernel(X.dtype, rpt) if rpt else cuda_src.select_kernels(X.dtype, gdt)[0]
    stat = cupy.zeros(3, cupy.float64)
    dev = cupy.cuda.Device().id
    # A persistent grid (every resident block slot once): each warp streams its rows with the
    # next batch always in flight, which extra waves of blocks would restart.
    blocks_max = _blocks_per_sm(kern, 256, 0) * _sm_count(dev)
    ntiles = -(-n // rows)
    main = cupy.cuda.get_current_stream()
    # A two-buffer pipeline: GEMM of tile t+1 (low-priority stream) runs while tile t is
    # selected (high-priority stream); a buffer is rewritten only after its select is done.
    gs, ss = _streams(dev)
    nbuf = 1 if ntiles == 1 else 2
    bufs = [cupy.empty((-(-rows // 4) * 4, kpad), gdt) for _ in range(nbuf)]
    xbufs = [_prep_buffer(rows, d, p.mode) for _ in range(nbuf)]
    eb = cupy.empty(n, cupy.float64)  # each row's error bound, from gemm_prep
    start = main.record()
    gs.wait_event(start)
    ss.wait_event(start)
    freed: list = [None] * nbuf
    # With sums wanted, the winners' exact distances (the inertia) come from the sums pass,
    # which reads every row anyway: the select then needs no dependent centroid read per row.
    exact = numpy.int32(d2 is not None or not want_sums)
    for t in range(ntiles):
        s0 = t * rows
        s1 = min(n, s0 + rows)
        m = s1 - s0
        i = t % nbuf
        g = bufs[i][:m]
        ldr = -(-m // 4) * 4  # column-major tile: rows padded to whole 16-byte vectors
        with gs:
            if freed[i] is not None:
                gs.wait_event(freed[i])
            xt = X[s0:s1] if xbufs[i] is None else xbufs[i][:m]
            _prep(X[s0:s1], p.mode, 0, xt if p.mode else None, None, None, eb[s0:s1], p.err)
            _gemm(p, xt, bufs[i] if rpt else g, ldr if rpt else None)
            ready = gs.record()
        with ss:
            ss.wait_event(ready)
            if rpt:
                nb = int(max(1, -(-m // (32 * rpt))))
                lead = (bufs[i], cupy.int64(ldr), cupy.int32(kpad))
            else:
                nb = int(max(1, min(blocks_max, -(-m // 8))))
                lead = (g, cupy.int32(kpad))
            kern(
                (nb,), (256,),
                lead + (p.csq, X[s0:s1], cupy.int32(d), cupy.int64(m), p.centroids, eb[s0:s1], exact,
                 _ptr(None if w is None else w[s0:s1]), _ptr(None if prev is None else prev[s0:s1]),
                 _ptr(None if labels is None else labels[s0:s1]), _ptr(None if d2 is None else d2[s0:s1]),
                 stat),
            )
            freed[i] = ss.record()
    from cupy.cuda import cublas, device

    cublas.setStream(device.get_cublas_handle(), main.ptr)  # leave the handle as CuPy expects
    main.wait_event(gs.record())
    main.wait_event(ss.record())
    out = {"inertia": stat[0], "reassigned": stat[1], "rechecked": stat[2]}  # views: read after the sums pass
    if want_sums:
        out.update(_label_sums(X, labels, w, k, grid, None if exact else p.centroids, None if exact else stat))
    return out


# ------------------------------------------------------------------ the backend contract


def _run(X, p, sample_weight, prev_labels, labels, d2, want_sums, grid=None):
    import cupy

    if X.dtype != p.centroids.dtype:
        raise TypeError(f"X.dtype={X.dtype} should equal the prepared centroids' dtype {p.centroids.dtype}")
    w = None if sample_weight is None else cupy.ascontiguousarray(sample_weight, dtype=cupy.float64)
    if want_sums and grid is None:
        grid = Grid.for_block(X, w)
    run = _run_small if p.small is not None else _run_gemm
    out = run(X, p, w, prev_labels, labels, d2, want_sums, grid)
    if want_sums:
        out["grid"] = grid
    return out


def assign(
    X: Any,
    p: Prepared,
    sample_weight: Any = None,
    want_sums: bool = True,
    prev_labels: Any = None,
    out_labels: Any = None,
    grid: Grid | None = None,
) -> dict[str, Any]:
    """Assign each row to its nearest centroid and accumulate per-cluster statistics.

    Parameters
    ----------
    X : cupy.ndarray, shape (n, d), float32 or float64, C-contiguous
    p : Prepared centroids (K, d), same dtype as X
    sample_weight : cupy.ndarray, shape (n,), optional
    want_sums : bool
        If False, only labels and inertia are computed (prediction / scoring).
    prev_labels : cupy.ndarray of int32, shape (n,), optional
        Labels of the previous iteration: ``reassigned`` counts the rows that changed
        (all rows when not given).
    out_labels : cupy.ndarray of int32, shape (n,), optional
        Where to write the labels (may be ``prev_labels``: each row is read, then written).
    grid : Grid, optional
        The fixed-point grid of the sums (a fit's, the same for every block); by default the
        block's own.

    Returns
    -------
    dict with ``labels`` (n,) int32, ``inertia``, ``reassigned`` and ``rechecked`` (rows
    re-ranked by exact distances; 0-d device arrays, no synchronisation), and when
    ``want_sums``: ``sums`` (K, d) and ``weights`` (K,) int64 multiples of the ``grid``'s
    steps (returned too), ``counts`` (K,) int64.
    """
    import cupy

    labels = out_labels if out_labels is not None else cupy.empty(X.shape[0], cupy.int32)
    out = _run(X, p, sample_weight, prev_labels, labels, None, want_sums, grid)
    out["labels"] = labels
    return out


@functools.cache
def _update_kernel() -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        "int64 s, int32 e, int64 w, int32 we, float64 old", "float64 c, float64 sq",
        "c = w > 0 ? ldexp((double)s, e) / ldexp((double)w, we) : old; sq = (c - old) * (c - old)",
        "daskmeans_update")


def update_centroids(isums: Any, iweights: Any, old: Any, grid: Grid) -> tuple:
    """The Lloyd update from a fit's combined sums: ``(new, shift)`` as in the NumPy backend
    (the same centroid bits), in one fused pass over K x d, and the shift summed by CuPy's
    device-wide reduction (``shift`` a 0-d device array: no synchronisation). A ReductionKernel
    to one value runs on one block: 17 ms for P4's K x D on an H200, against 0.1 ms."""
    import cupy

    new, sq = _update_kernel()(isums, grid.exps_on(cupy), iweights[:, None], numpy.int32(grid.wexp), old)
    return new, sq.sum()


def min_sqdist(X: Any, p: Prepared) -> tuple[Any, Any]:
    """Nearest centroid (int32, shape (n,)) and its squared distance (float64, shape (n,))."""
    import cupy

    n = X.shape[0]
    labels = cupy.empty(n, cupy.int32)
    d2 = cupy.empty(n, cupy.float64)
    _run(X, p, None, None, labels, d2, False)
    return labels, d2


def moments(X: Any) -> tuple[Any, Any, Any, int | None]:
    """Per-column mean, sum of squared deviations and largest absolute value (float64, shape
    (d,) each) of a block, and the index of its first row holding a NaN or infinity (None if
    all are finite)."""
    import cupy

    x = X.astype(cupy.float64)
    bad_rows = cupy.flatnonzero(~cupy.isfinite(x).all(axis=1))
    mean = x.mean(axis=0)
    max_abs = cupy.abs(x).max(axis=0)
    x -= mean
    m2 = (x * x).sum(axis=0)
    return mean, m2, max_abs, int(bad_rows[0]) if bad_rows.size else None


def sqdistances(X: Any, p: Prepared) -> Any:
    """Squared distances ``(n, K)`` from every row to every centroid (float64, clamped at 0)."""
    import cupy

    x64 = X.astype(cupy.float64)
    g = x64 @ (-2.0 * p.c64.T)
    g += (p.c64 * p.c64).sum(axis=1)
    g += (x64 * x64).sum(axis=1)[:, None]
    return cupy.maximum(g, 0.0)


# ------------------------------------------------------------------ host tier: staged copies


class _Stager:
    """Host (pinned) chunks to the GPU through two device buffers, the copy of the next chunk
    on its own stream overlapping the kernels of the current one.

    A chunk yielded by :meth:`stream` is valid until the next is requested: its buffer is then
    refilled (after an event says the kernels that read it have run).
    """

    def __init__(self, max_elements: int, dtype: Any):
        import cupy

        self.bufs = [cupy.empty(max_elements, dtype) for _ in range(2)]
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)

    def _stage(self, i: int, block: numpy.ndarray, after: Any) -> Any:
        buf = self.bufs[i % 2][: block.size]
        if after is not None:
            self.copy_stream.wait_event(after)  # the kernels that read this buffer are done
        buf.set(block.reshape(-1), stream=self.copy_stream)
        return buf.reshape(block.shape), self.copy_stream.record()

    def stream(self, blocks: list) -> Any:
        import cupy

        if not blocks:
            return
        staged = self._stage(0, blocks[0], None)
        for i in range(len(blocks)):
            arr, copied = staged
            cupy.cuda.get_current_stream().wait_event(copied)
            if i + 1 < len(blocks):
                # Buffer (i+1) % 2 last held chunk i-1, whose kernels were enqueued before
                # chunk i was asked for: wait for them on the copy stream, not on the host.
                staged = self._stage(i + 1, blocks[i + 1], self._done_with_prev)
            yield arr
            self._done_with_prev = cupy.cuda.get_current_stream().record()

    _done_with_prev = None


def staged(blocks: list) -> Any:
    """Yield the pinned host ``blocks`` as device arrays, copies overlapping the kernels."""
    if not blocks:
        return iter(())
    return _Stager(max(b.size for b in blocks), blocks[0].dtype).stream(blocks)
