"""The CuPy backend's planning: which regime and kernel configuration a K x D problem takes,
launch sizes, and the certified error bound of the GEMM regime.

Pure Python on numbers (no CuPy, no GPU): device facts (shared memory a block may opt in to,
multiprocessor count, compute capability, a compiled kernel's registers) come in as
arguments, so every decision here is tested on a CPU (``tests/unit/test_gpu_plan.py``).
Measurements behind the choices are in docs/performance.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..validation import Options

THREADS = 256  # threads per block of the fused and selection kernels
REG_ACC = 32  # float64 register values per lane in the fused kernel (K x values-per-lane)
SHARED_BYTES = 48 * 1024  # dynamic shared memory a block gets without opting in
CSQ_PAD = 128  # the centroids' squared norms are padded to a multiple of this
HIST_MAX_K = SHARED_BYTES // 4  # block-local label counters (uint32) in shared memory
TINY = 2.0**-100  # gemm_prep and fused_select flush smaller inputs to zero (cuda/common.cuh)

SMALL_CENTROIDS = ("auto", "registers", "shared")
SELECT_LAYOUTS = ("auto", "rows", "cols1", "cols2", "cols4")
FP32_GEMMS = ("auto", "sgemm", "3xtf32")
TF32_GEMMS = ("auto", "tf32", "fp16", "fused")


@dataclass(frozen=True)
class Prepared:
    """Centroid-side precomputation for one iteration (shared by all blocks).

    ``small`` is the fused kernel's ``(L, DPL, KACC, TRED, CREG)`` (:func:`small_config`), or
    None for the GEMM regime, whose inputs are ``a`` (Kpad x D' centroids as the GEMM reads
    them, zero rows past K; see ``mode``), ``csq`` (squared norms in the GEMM output type,
    +inf past K, padded to :data:`CSQ_PAD`) and the error bound coefficients ``err = (A, R,
    B)``: ``|G + csq - (||c||^2 - 2 x.c)| <= A ||x|| + R ||x - xb|| + B`` for every centroid,
    ``xb`` the row as the GEMM reads it. ``layout`` is the selection layout asked for
    (:func:`select_layout`; "auto" except in kernel benchmarks and tests).
    """

    centroids: Any  # (K, D) cupy, data dtype
    c64: Any  # (K, D) float64 values of ``centroids``
    precision: str
    small: tuple | None
    a: Any = None
    csq: Any = None
    err: tuple = (0.0, 0.0, 0.0)
    mode: int = 0  # GEMM inputs, as gemm_prep's MODE: 0 as given, 1 TF32, 2 split TF32 (3D), 3 bf16, 4 fp16
    layout: str = "auto"
    cexp: int = 0  # mode 4: the centroids were multiplied by 2^cexp (max |c| 2^cexp <= 2^14)
    tunables: Any = None  # the protocol's Tunables the kernels on these centroids run with (tiles)
    fused: Any = None  # mode 4 through fused_select: (float16 centroids, FUSED_BN x D', their bound)

    @property
    def k(self) -> int:
        return self.centroids.shape[0]


# ------------------------------------------------------------------ the fused small-K regime


def small_config(k: int, d: int, shared_max: int = SHARED_BYTES,
                 centroids: str = "auto") -> tuple[int, int, int, bool, bool] | None:
    """``(L, DPL, KACC, TRED, CREG)`` of the fused kernel for K x D, or None for the GEMM
    regime.

    Fewest lanes per row such that K x DPL register values fit (fewer lanes, fewer shuffles
    per row), their K distances reduced transposed when K <= L (TRED); then, by
    ``centroids``, either the centroids in registers and the sums in per-group shared memory
    (CREG; "registers" or "auto", where the block may have the ``shared_max`` bytes this
    takes), or the centroids in shared memory and the sums in registers ("shared"). Else
    shared-memory centroids and accumulators, at most 16 values per lane.

    Auto puts centroids in registers wherever they fit: with centroids in shared memory the
    two 16-lane groups of a warp each pay for their own centroid reads, and one-lane rows'
    K x DPL predicated register updates cost more than a read-add-write of the row's slice
    (docs/performance.md, "Small K").
    """
    Options(SMALL_CENTROIDS).check("centroids", centroids)
    for lanes in (1, 2, 4, 8, 16, 32):
        dpl = -(-d // lanes)
        if k * dpl <= REG_ACC and shared_bytes(k, lanes, dpl, False) <= SHARED_BYTES:
            fits = shared_bytes(k, lanes, dpl, True) <= shared_max
            return lanes, dpl, k, 2 <= k <= lanes, fits and centroids != "shared"
    for lanes in (1, 2, 4, 8, 16, 32):
        dpl = -(-d // lanes)
        if dpl <= 16 or lanes == 32:
            if dpl <= 32 and shared_bytes(k, lanes, dpl, False) <= SHARED_BYTES:
                return lanes, dpl, 0, False, False
            return None
    return None


def uses_tiles(k: int, d: int) -> bool:
    """True where K x D takes the GEMM regime (row tiles of K distances in GPU memory); the
    fused regime needs no tiles (the memory plan asks this on the client)."""
    return small_config(k, d) is None


def shared_bytes(k: int, lanes: int, dpl: int, creg: bool, mode: int = 0) -> int:
    """Dynamic shared memory of ``fused_small`` (cuda/small.cu): float64 centroids and sums
    (K x DP each; no sums in MODE 1), or with CREG each group of L lanes' slice (GS: K x (DP +
    2) sums, weights and counts, made odd for L >= 2; none in MODE 1); then weights, counts
    and two scalars."""
    dp = lanes * dpl
    if creg:
        slice_ = k * (dp + 2) if lanes == 1 else (k * (dp + 2)) | 1
        return 8 * ((0 if mode == 1 else (THREADS // lanes) * slice_) + 2 * k + 2)
    return 8 * ((1 if mode == 1 else 2) * k * dp + 2 * k + 2)


def occupancy(num_regs: int, static_shared: int, threads: int, shared: int) -> int:
    """Resident blocks per multiprocessor of a kernel using ``num_regs`` registers per thread
    and ``static_shared`` + ``shared`` bytes per block (Hopper limits: 64K registers allocated
    per warp in units of 256, 228 KiB shared memory with 1 KiB reserved per block, 2048
    threads, 32 blocks)."""
    regs_per_warp = -(-num_regs * 32 // 256) * 256
    by_regs = 65536 // (regs_per_warp * (threads // 32))
    by_shared = (228 * 1024) // (shared + static_shared + 1024)
    return max(1, min(by_regs, by_shared, 2048 // threads, 32))


# ------------------------------------------------------------------ the GEMM regime


# tf32 "auto": a float16 tile above this K, where the bytes saved outweigh the extra exact
# re-ranks (docs/performance.md, "float16 tile").
FP16_TILE_MIN_K = 2048


def gemm_mode(precision: str, gemm64: bool, fp32_gemm: str = "auto", compute_capability: str = "90",
              tf32_gemm: str = "auto", k: int = FP16_TILE_MIN_K + 1, d: int | None = None) -> int:
    """How the GEMM reads its inputs (``gemm_prep`` MODE): 0 as given (float64 data, or fp32
    through cuBLAS's fp32 GEMM), 1 rounded to TF32, 2 split TF32 (three TF32 products in one
    GEMM of depth 3D, fp32-accurate), 3 rounded to bfloat16, 4 scaled by a power of two and
    rounded to float16 (TF32's 10-bit mantissa), the GEMM writing float16.

    tf32 precision takes mode 4 where ``tf32_gemm`` is "fp16" or "fused", or "auto" where
    :func:`uses_fused` would run ``fused_select`` for ``d`` features (no tile at all: faster
    than either tile at every K of the GEMM regime there, docs/performance.md "fused_select"),
    or with ``k`` above :data:`FP16_TILE_MIN_K`: the tile it writes and the selection reads is half the bytes,
    which is the cost of wide K at short D (the GEMM there is bound by writing its output, not
    by its arithmetic), and the float16 GEMM runs at twice TF32's rate where it is compute-bound
    (large D). The float16 rounding of the output is part of the certified error bound
    (:func:`error_bound`); it roughly doubles the rows re-ranked exactly, which costs more than
    the bytes saved at small K.

    fp32 precision takes split TF32 where ``fp32_gemm`` says "3xtf32", or "auto" on
    A100/H100/B100-class GPUs (compute capability 8.0, 9.0, 10.0), whose TF32 tensor cores run
    a 3D-deep TF32 GEMM faster than the fp32 one (docs/performance.md, "split TF32"); consumer parts
    run TF32 near their fp32 rate, where three TF32 products lose. tf32 and bf16 inputs are
    rounded to nearest by ``gemm_prep``, so each row's rounding error is known exactly
    (``||x - xb||``), not bounded by the format's worst case.
    """
    if gemm64:
        return 0
    if precision == "tf32":
        Options(TF32_GEMMS).check("gpu-tf32-gemm", tf32_gemm)
        if tf32_gemm in ("fp16", "fused") or (tf32_gemm == "auto" and k > FP16_TILE_MIN_K):
            return 4
        return 4 if d is not None and uses_fused(tf32_gemm, 4, d, compute_capability) else 1
    if precision == "bf16":
        return 3
    Options(FP32_GEMMS).check("gpu-fp32-gemm", fp32_gemm)
    if fp32_gemm == "auto":
        fp32_gemm = "3xtf32" if compute_capability in ("80", "90", "100") else "sgemm"
    return 2 if fp32_gemm == "3xtf32" else 0


def error_bound(cmax: float, smax: float, d: int, mode: int, gemm64: bool,
                rounded_output: bool = True) -> tuple[float, float, float]:
    """``(A, R, B)`` with ``|G + csq - (||c||^2 - 2 x.c)| <= A ||x|| + R ||x - xb|| + B`` for
    every centroid: ``cmax`` the largest ``||c||``, ``smax`` the largest ``||c - cb||`` (``cb``
    the centroid as the GEMM reads it), ``mode`` as in :func:`gemm_mode`.

    With ``M = cmax + smax >= ||cb||``, ``S = smax`` and Cauchy-Schwarz throughout:
    rounded inputs (modes 1, 3): ``xb.cb - x.c = -(x.cs + xs.cb)``, at most ``||x|| S +
    ||xs|| M``; split TF32 (mode 2): the GEMM sums ``xb.cb + xb.tf(cs) + tf(xs).cb``, off by
    ``xb.(cs - tf(cs)) + (xs - tf(xs)).cb + xs.cs``, at most ``h (||xb|| S + ||xs|| M) +
    ||xs|| S`` with ``h = 2^-10`` (cuBLAS's TF32 conversion of the residuals, any faithful
    rounding). Accumulating the m D products in any order costs ``g = 2 m D u`` times the sum
    of their magnitudes (twice the classical ``D u``: tensor-core adders may truncate); ``G``
    carries the factor 2 of ``-2 x.c``. Rounding ``||c||^2`` and adding it to ``G`` add ``u (2
    ||x|| cmax + 2 cmax^2)``. Absolute terms cover the flush of inputs below 2^-100 and
    products underflowing float32. A 10% margin covers the second-order terms. Mode 4 also
    rounds ``G`` (at most ``2 ||xb|| M``) to the nearest float16 (cuBLAS's epilogue; a GPU test
    checks it on every element of a tile), within ``2^-11 |G|`` plus an absolute term that
    depends on the tile's scale (:func:`half_output_floor`); not with ``rounded_output`` False
    (``fused_select`` keeps the float32 accumulations)."""
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
        if mode == 4 and rounded_output:  # |G| <= 2 ||xb|| M (1 + g), rounded to nearest float16: half an ulp
            a += 2.0**-11 * M * (1 + g)
            r += 2.0**-11 * M * (1 + g)
    A = 1.1 * (2 * a + 2.2 * u * cmax)
    R = 1.1 * 2 * r
    B = 1.1 * 2.2 * u * cmax * cmax
    if not gemm64:
        A += 2.2 * d**0.5 * TINY
        B += 2.2 * d**0.5 * TINY * M + 4.4 * m * d * 2.0**-126
    return A, R, B


def half_output_floor(scale_exp: int) -> float:
    """The bound's absolute term for a float16 GEMM tile read as ``2^scale_exp`` times its
    values: half float16's subnormal spacing 2^-24 (rounding to nearest near zero), scaled,
    with the 10% margin of :func:`error_bound`."""
    return 1.1 * 2.0 ** (scale_exp - 25)


def _exp_of(v: float) -> int:
    """The smallest ``e`` with ``v <= 2^e`` (0 for zero, negative or non-finite ``v``)."""
    import math

    if not (v > 0 and math.isfinite(v)):
        return 0
    m, e = math.frexp(v)  # v = m 2^e, 0.5 <= m < 1
    return e - 1 if m == 0.5 else e


def half_exp(vmax: float) -> int:
    """The power-of-two exponent that brings values of largest magnitude ``vmax`` to at most
    2^14 before rounding to float16 (which holds up to 65504)."""
    return 14 - _exp_of(vmax)


def half_scales(xmax: float, cmax_abs: float, d: int) -> tuple[int, int, int]:
    """Power-of-two exponents ``(a, b, o)`` of a mode-4 GEMM: the rows are multiplied by 2^a and
    the centroids by 2^b before rounding to float16 (:func:`half_exp` of their largest
    magnitudes ``xmax`` and ``cmax_abs``), and the GEMM writes ``-2 x.c`` times 2^-o, which
    stays within 2^15 since ``|x.c| <= d xmax cmax_abs``. ``o`` is at least -126: the selection
    reads the tile times 2^o in float32, and a subnormal factor may be taken as zero there
    (every distance read as the centroid's norm alone, and certified). Rows whose products are
    that small write a tile below 2^15, whose float16 rounding the bound's floor counts
    (:func:`half_output_floor`)."""
    o = max(_exp_of(2.0 * d * xmax * cmax_abs) - 15, -126) if xmax > 0 and cmax_abs > 0 else 0
    return half_exp(xmax), half_exp(cmax_abs), o


def tile_rows(n: int, kpad: int, out_itemsize: int, prep_cols: int, prep_itemsize: int, tile_bytes: int,
              min_rows: int = 0, max_bytes: int = 0) -> int:
    """Rows of one GEMM tile: its distances (rows x ``kpad`` of ``out_itemsize``) and its
    rounded inputs (``gemm_prep``'s copy, rows x ``prep_cols`` of ``prep_itemsize``; 0 where the
    GEMM reads the data itself) each within ``tile_bytes``; at least ``min_rows`` where that
    stays within ``max_bytes`` (wide K: the selection, a warp per row, needs rows enough to fill
    the GPU; :func:`fill_rows`); at least 32, at most ``n``."""
    row_bytes = _row_bytes(kpad, out_itemsize, prep_cols, prep_itemsize)
    rows = max(tile_bytes // row_bytes, min(min_rows, max_bytes // row_bytes))
    return int(max(32, min(n, rows)))


def fill_rows(sm_count: int) -> int:
    """Rows of a tile that give ``select_rows`` (a warp per row) a row for each of the 64
    warps an SM can hold at once (2048 threads): rows beyond the two blocks per SM its launch
    bounds promise keep the rows' loads in flight (docs/performance.md, "tiles")."""
    return 64 * int(sm_count)


def tile_bytes(n: int, kpad: int, out_itemsize: int, prep_cols: int, prep_itemsize: int, tile_bytes: int,
               max_bytes: int, sm_count: int) -> int:
    """Bytes of one GEMM tile's distances (as :func:`tile_rows` sizes it): for the memory plan."""
    rows = tile_rows(n, kpad, out_itemsize, prep_cols, prep_itemsize, tile_bytes, fill_rows(sm_count), max_bytes)
    return rows * _row_bytes(kpad, out_itemsize, prep_cols, prep_itemsize)


def _row_bytes(kpad: int, out_itemsize: int, prep_cols: int, prep_itemsize: int) -> int:
    """A tile row's bytes: its distances, or its rounded inputs where they are larger."""
    return max(1, kpad * out_itemsize, prep_cols * prep_itemsize)


def select_layout(rows: int, kpad: int, float32_tile: bool, sm_count: int, precision: str,
                  layout: str = "auto") -> int:
    """Rows per thread of ``select_cols`` on a column-major tile of ``rows`` rows (4, 2 or 1),
    or 0 for ``select_rows`` on a row-major tile; ``layout`` "rows" or "cols1" / "cols2" /
    "cols4" forces one (kernel benchmarks and tests).

    Auto, float32 tiles in fp32 precision with K up to 2048: the most rows per thread that
    still gives every SM three blocks (the column kernel parallelises over rows only). Larger
    K: a row whose bound leaves three or more candidates re-reads its row of the column-major
    tile one 32-byte sector per centroid (docs/performance.md, "select layout"), and each
    thread's share of the centroids grows. Not for tf32/bf16: their many more uncertain rows
    make the column kernel's exact re-rank its cost (docs/performance.md, "select layout")."""
    Options(SELECT_LAYOUTS).check("layout", layout)
    if not float32_tile or layout == "rows":
        return 0
    if layout.startswith("cols"):
        return int(layout[4:])
    if precision != "fp32" or kpad > 2048:
        return 0
    for rpt in (4, 2, 1):
        if -(-rows // (32 * rpt)) >= 3 * sm_count:
            return rpt
    return 0


# ------------------------------------------------------------------ the fused float16 regime

FUSED_BN = 128  # centroids per tile of fused_select (cuda/fused_select.cu's BN)
FUSED_BM = 128  # rows per block of fused_select (cuda/fused_select.cu's BM)
FUSED_PAD = 32  # D is padded to a multiple of this (two k16 steps of mma.sync)
FUSED_BK = 64  # columns per pipeline stage (BK) where D' is a multiple of it and two blocks fit, else FUSED_PAD
FUSED_STAGES = 3  # the centroids' shared-memory stages (NST)
FUSED_WARPS = (4, 2)  # warps over a block's rows and centroids (WM, WN): 32 x 64 each
# The fold's branches taken by the warp's vote (cuda_src.fused_source's vote) from this K up:
# faster at K >= 4096, a few percent slower below (docs/performance.md, "fused_select").
FUSED_VOTE_MIN_K = 4096
FUSED_RESCAN_THREADS = 256  # fused_rerank's and fused_rescan's block (cuda/fused_select.cu's RT)
FUSED_FOUND = 4  # candidates fused_recheck notes per listed row (cuda/fused_select.cu's FOUND)
FUSED_RECHECK_SPLITS = 8  # the most shares of the centroids' tiles fused_recheck's grid takes
FUSED_MAX_DP = 320  # the block's rows stay in shared memory: two blocks per SM up to this D'
# "auto" runs fused_select up to this D' (beyond, the tile path is as fast or faster: its GEMM
# is compute-bound and the tile cheap beside it; docs/performance.md, "fused_select"), and only
# on the compute capabilities it was measured on; "fused" runs it from 8.0 (mma.sync m16n8k16,
# cp.async) wherever the rows fit.
FUSED_AUTO_MAX_DP = 128
FUSED_AUTO_CC = ("90",)


def fused_dp(d: int) -> int:
    """``D'``: ``d`` padded to whole :data:`FUSED_PAD` columns (zeros, which add nothing)."""
    return -(-int(d) // FUSED_PAD) * FUSED_PAD


def fused_threads(warps: tuple[int, int]) -> int:
    """Threads of a ``fused_select`` block of ``warps`` (WM, WN)."""
    return 32 * warps[0] * warps[1]


def recheck_splits(ntile: int) -> int:
    """Shares of ``ntile`` centroid tiles ``fused_recheck``'s blocks take (its grid's second
    dimension): a block a share, at least 16 tiles each, at most :data:`FUSED_RECHECK_SPLITS`,
    so that the few listed rows (under 1% at K = 2^14..2^18) still spread over the SMs."""
    return max(1, min(FUSED_RECHECK_SPLITS, ntile // 16))


def fused_list_bytes() -> int:
    """Bytes per row of a block that ``fused_select`` may list: the row's index, two
    candidates and its threshold (24), the :data:`FUSED_FOUND` candidates ``fused_recheck``
    notes (int32) and their count (4), and its place in ``fused_rescan``'s list (8)."""
    return 24 + 4 * FUSED_FOUND + 4 + 8


def fused_vote(k: int) -> bool:
    """Whether ``fused_select`` at ``k`` centroids folds by the warp's vote
    (:data:`FUSED_VOTE_MIN_K`)."""
    return int(k) >= FUSED_VOTE_MIN_K


def fused_columns(dp: int) -> int:
    """Columns of a pipeline stage (BK) for rows of ``dp`` columns: :data:`FUSED_BK` where it
    divides ``dp`` and two blocks with stages that wide share an SM, else :data:`FUSED_PAD`
    (wide rows keep two blocks per SM with narrower stages rather than one with wider)."""
    if dp % FUSED_BK == 0 and _two_blocks_fit(dp, FUSED_BK):
        return FUSED_BK
    return FUSED_PAD


def _two_blocks_fit(dp: int, columns: int) -> bool:
    """Whether two ``fused_select`` blocks (1 KiB reserved each) share an SM's 228 KiB."""
    return 2 * (fused_shared_bytes(dp, FUSED_STAGES, columns) + 1024) <= 228 * 1024


def uses_fused(tf32_gemm: str, mode: int, d: int, compute_capability: str = "90",
               shared_optin: int = 227 * 1024) -> bool:
    """Whether a mode-4 GEMM of ``d`` features runs ``fused_select`` (the GEMM and the selection
    in one kernel, no distance tile): ``tf32_gemm`` "fused" (compute capability 8.0 or later,
    ``D' <=`` :data:`FUSED_MAX_DP`) or "auto" (:data:`FUSED_AUTO_CC`, ``D' <=``
    :data:`FUSED_AUTO_MAX_DP`), wherever a block's shared memory (its rows and
    :data:`FUSED_STAGES` stages of :func:`fused_columns`) is within the device's per-block
    limit ``shared_optin`` (bytes; Hopper's 227 KiB by default, 99 KiB on 8.6, 8.9 and 12.x)
    and lets two blocks share an SM's 228 KiB. Wider rows take the tile path ("fp16"), whose
    GEMM is compute-bound there and the tile cheap beside it."""
    Options(TF32_GEMMS).check("gpu-tf32-gemm", tf32_gemm)
    if mode != 4 or not compute_capability.isdigit() or int(compute_capability) < 80:
        return False
    dp = fused_dp(d)
    if tf32_gemm == "fused":
        wanted = dp <= FUSED_MAX_DP
    else:
        wanted = tf32_gemm == "auto" and compute_capability in FUSED_AUTO_CC and dp <= FUSED_AUTO_MAX_DP
    columns = fused_columns(dp)
    return wanted and fused_shared_bytes(dp, FUSED_STAGES, columns) <= shared_optin and _two_blocks_fit(dp, columns)


def fused_shared_bytes(dp: int, stages: int, columns: int) -> int:
    """Dynamic shared memory of one ``fused_select`` block: its rows (float16, row stride
    ``dp + 8``), the centroids' stages (``FUSED_BN`` x ``columns + 8`` each) and the rows'
    float64 error bounds."""
    return 2 * FUSED_BM * (dp + 8) + 2 * stages * FUSED_BN * (columns + 8) + 8 * FUSED_BM
