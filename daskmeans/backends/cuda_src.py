"""CUDA C++ sources of the CuPy backend's kernels, and their compile cache.

The sources are files beside this module, one kernel family each (``cuda/small.cu``,
``prep.cu``, ``select_rows.cu``, ``select_cols.cu``, ``sums.cu``, ``fit.cu``), each compiled
after the shared device functions (``common.cuh``; the selections also ``certify.cuh``);
here they get their compile-time ``#define`` header, and a module's kernels are looked up
by name. Pure source text and
compilation (NVRTC through ``cupy.RawModule``, cached by CuPy on disk
too); the host-side logic that chooses and launches them is :mod:`.gpu_plan` (choices),
:mod:`.gpu_small`, :mod:`.gpu_gemm` and :mod:`.gpu_sums` (launches).

The kernels (see that module for when each runs):

``fused_small``
    One pass over X, nothing else: each group of ``L`` lanes holds one row (``DPL`` values
    per lane, float64), computes its float64 distance to every centroid, the argmin (lowest
    index wins ties), and accumulates the row into block-private float64 sums. Where K x DPL
    values fit in registers (``KACC`` = K): the centroids in registers and each lane group's
    sums in its own slice of shared memory (``CREG``), or the centroids in shared memory and
    the sums in registers; otherwise both in shared memory. Each block writes one partial
    (sums, weights, counts, inertia, reassigned) which ``reduce_parts`` sums in a fixed order:
    no global atomics.
``gemm_prep``
    Before each GEMM tile: the tile's rows as the GEMM reads them (rounded to nearest TF32 or
    bfloat16, or split into TF32 high and low parts for fp32 precision on tensor cores) and
    each row's certified error bound, from the row's norm and its actual rounding residual.
``select_rows``
    After the GEMM tile ``G = alpha * X C^T`` (alpha = -2): one warp per row takes the top-2
    of ``G + ||c||^2`` (16-byte loads); ``exact_winner``, the one certify-and-re-rank
    function of both selections, certifies the winner with the row's error bound and re-ranks
    the uncertain rows by exact float64 distances to the few candidates that the bound cannot
    exclude (found by a second scan of the row). Ties go to the lower index (``precedes``,
    the one comparison of every argmin and merge).
``select_cols``
    The same selection on a column-major tile (cuBLAS writing G^T), a thread per 1, 2 or 4
    rows: chosen for float32 tiles in fp32 precision with K <= 2048 where the tile has rows
    enough for three blocks per SM (``gpu_plan.select_layout``).
``fused_select`` / ``fused_recheck`` / ``fused_rerank`` / ``fused_rescan``
    The tf32 precision's float16 GEMM and the selection in one kernel (mma.sync on the tensor
    cores; the rows in shared memory, the centroids streamed through it): per row the top-2
    and third value of ``G + ||c||^2`` over every centroid tile, never written out, then
    ``exact_winner`` on the rows the bound leaves uncertain; the few rows with three or more
    candidates go through the same main loop again (``fused_recheck``: each candidate noted),
    are re-ranked exactly (``fused_rerank``), and ``fused_rescan`` scans every centroid for a
    row with more candidates than a list holds (``gpu_plan.uses_fused`` says where it runs).
``update_centroids`` / ``sum_parts``
    The Lloyd update from the combined integer sums and its squared shift, summed in a fixed
    order.
``label_counts``
    Rows per label (cluster sizes).
``col_pass_f32`` / ``col_pass_f64`` / ``col_reduce``
    The moments pass: per-column sums, largest absolute values, first non-finite row, then
    sums of squared deviations, each in a fixed order.
``label_hist`` / ``label_block_offsets`` / ``label_bases`` / ``label_scatter`` (or
``scatter_by_label``, large K) / ``sorted_sums``
    Per-cluster float64 sums once the labels are known: the rows ordered by label (a
    block-local counting sort, or global counters for large K), then register accumulation
    along runs of equal labels, one atomic add per run and column instead of one per element.
``group_min`` (``cuda/group_min.cu``, outside :data:`SOURCES`: only ``algorithm="yinyang"``
loads it)
    Yinyang's per-group lower bounds from a row-major GEMM tile whose columns are the
    centroids sorted by group: per row and group the smallest ``G + ||c||^2`` but the row's own
    centroid's, less the row's certified error bound, as a distance rounded down
    (:func:`.gpu_gemm.group_lower` launches it).
``afkmc2_block`` / ``afkmc2_fold`` (``cuda/afkmc2.cu``, outside :data:`SOURCES`: only
``init="afk-mc2"`` loads them)
    One block of AFK-MC²'s Markov chains on one CTA, in order: each chain's proposals'
    squared distances to the block's earlier picks, then the chain in one warp; after it, the
    block's picks folded from their GEMM into the later chains' distances
    (:mod:`daskmeans.seeding.afkmc2_chains` launches them).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import Any

from . import gpu_device


def _source(name: str) -> str:
    """The text of ``cuda/<name>``, shipped beside this file (found from the file, not the
    package: :mod:`.gpu_warm_ops` loads this module alone, without the package's imports)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda", name), encoding="utf-8") as f:
        return f.read()


# Each module is the common device functions followed by its own kernels; the host code puts
# its compile-time #defines in front (small_source, select_rows_source, ...).
_COMMON = _source("common.cuh")
SMALL_SRC = _COMMON + _source("small.cu")
PREP_SRC = _COMMON + _source("prep.cu")
SELECT_ROWS_SRC = _COMMON + _source("certify.cuh") + _source("select_rows.cu")
SELECT_COLS_SRC = _COMMON + _source("certify.cuh") + _source("select_cols.cu")
SUMS_SRC = _COMMON + _source("sums.cu")
FIT_SRC = _COMMON + _source("fit.cu")
AFKMC2_SRC = _COMMON + _source("afkmc2.cu")
FUSED_SRC = _COMMON + _source("certify.cuh") + _source("fused_select.cu")
GROUP_MIN_SRC = _COMMON + _source("group_min.cu")
SOURCES = (SMALL_SRC, PREP_SRC, SELECT_ROWS_SRC, SELECT_COLS_SRC, SUMS_SRC, FIT_SRC, FUSED_SRC)


OPTIONS = ("--std=c++17",)  # NVRTC's options for every module (part of CuPy's cache key)
# The fused module's four kernels optimised and code-generated on threads of their own: its
# compile, the longest of a first fit's at wide K, then ends sooner (docs/performance.md, "A
# first fit"). Labels and sums are the same bits whatever the code generation (every label
# certified, every sum exact). Older NVRTCs refuse the option: SPLIT_COMPILE_NVRTC on.
SPLIT_COMPILE = ("--split-compile=0",)
SPLIT_COMPILE_NVRTC = (12, 1)

_CACHE: dict = {}
_PENDING: dict = {}  # key -> Future of a compile in flight (another thread waits for it)
_LOCK = threading.Lock()


def _ctype(dtype: Any) -> str:
    import numpy

    return {"float32": "float", "float64": "double", "float16": "half"}[numpy.dtype(dtype).name]


def small_source(dtype: Any, lanes: int, dpl: int, kacc: int, tred: bool, threads: int,
                 rows: int | None = None, min_blocks: int | None = None, mode: int = 0,
                 creg: bool = False, dfull: bool = False) -> str:
    """CUDA source of ``fused_small`` (``mode`` 0 fused, 1 labels only) and ``reduce_parts``
    for one configuration (``creg``: centroids in registers, sums in shared memory; needs
    ``kacc`` > 0; ``dfull``: D = ``lanes`` x ``dpl`` exactly, the row stride compiled in);
    ``rows`` (U) and ``min_blocks`` (MINB) default to the measured choices (profiling scripts
    vary them)."""
    creg = bool(creg and kacc)
    if rows is None:
        # Rows per group per loop trip (U x DPL registers): up to 8 values per lane, 16 with the
        # centroids in registers (no accumulators there); see docs/performance.md, "Small K".
        rows = max(1, min(4, (16 if creg else 8) // dpl))
    if min_blocks is None:
        # Two blocks per SM only for one-row TRED configurations: elsewhere the bound spills or
        # slows the kernel (docs/performance.md, "Small K").
        min_blocks = 2 if tred and rows == 1 and mode == 0 and not creg else 1
    kp = 1 << max(0, kacc - 1).bit_length()  # K rounded up to a power of 2
    return (f"#define T {_ctype(dtype)}\n#define L {lanes}\n#define DPL {dpl}\n#define KACC {kacc}\n"
            f"#define NT {threads}\n#define U {rows}\n#define TRED {int(bool(tred))}\n"
            f"#define KP {kp}\n#define MINB {min_blocks}\n#define MODE {mode}\n"
            f"#define CREG {int(creg)}\n#define DFULL {int(bool(dfull))}\n" + SMALL_SRC)


def _functions(key: tuple, src: str, names: tuple[str, ...], split: bool = False) -> dict[str, Any]:
    """The kernels ``names`` of the module compiled from ``src``, by name, once per process
    (CuPy also caches the binary on disk); the same objects every call, as the launch code keys
    its occupancy cache by them. ``split``: with :func:`fused_options` (a module of several
    large kernels), else :data:`OPTIONS`."""

    def build() -> dict[str, Any]:
        import cupy

        mod = cupy.RawModule(code=src, options=fused_options() if split else OPTIONS)
        return {f: mod.get_function(f) for f in names}

    return _once(key, build)


def fused_options() -> tuple[str, ...]:
    """NVRTC's options for the fused module: :data:`OPTIONS`, and :data:`SPLIT_COMPILE` where
    this NVRTC takes it (:data:`SPLIT_COMPILE_NVRTC` on)."""
    from cupy.cuda import nvrtc

    return OPTIONS + (SPLIT_COMPILE if tuple(nvrtc.getVersion()) >= SPLIT_COMPILE_NVRTC else ())


def _once(key: tuple, build: Any) -> Any:
    """``_CACHE[key]``, from ``build()`` the first time. A thread asking for a key another
    thread is building (e.g. :func:`.cupy_backend.warm`'s compiles) waits for that build
    instead of starting its own; a failed build raises in every waiting thread, and the next
    call tries again."""
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        pending = _PENDING.get(key)
        mine = pending is None
        if mine:
            pending = _PENDING[key] = Future()
    if not mine:
        return pending.result()
    try:
        value = build()
    except BaseException as e:
        with _LOCK:
            del _PENDING[key]
        pending.set_exception(e)
        raise
    with _LOCK:
        _CACHE[key] = value
        del _PENDING[key]
    pending.set_result(value)
    return value


def _first(key: tuple, compile_: Any, *also: Any) -> dict[str, Any]:
    """``_CACHE[key]``, compiling it the first time together with the modules the same fit
    needs next (``also``), in threads."""
    if key not in _CACHE:
        compile_concurrently(compile_, *also)
    return _CACHE[key]


def small_kernels(dtype: Any, lanes: int, dpl: int, kacc: int, tred: bool, threads: int,
                  mode: int = 0, creg: bool = False, dfull: bool = False) -> tuple[Any, Any]:
    """``(fused_small, reduce_parts)`` for one (dtype, L, DPL, KACC, TRED, NT, MODE, CREG,
    DFULL) configuration."""
    key = ("small", _ctype(dtype), lanes, dpl, kacc, bool(tred), threads, mode, bool(creg), bool(dfull))
    src = small_source(dtype, lanes, dpl, kacc, tred, threads, mode=mode, creg=creg, dfull=dfull)
    m = _first(key, lambda: _functions(key, src, ("fused_small", "reduce_parts")), fit_kernels)
    return m["fused_small"], m["reduce_parts"]


def select_rows_source(dtype: Any, gemm_dtype: Any, batch: int = 8, chains: int = 2) -> str:
    """CUDA source of ``select_rows`` for data of ``dtype`` and a GEMM tile of ``gemm_dtype``:
    ``batch`` 16-byte vectors per lane per buffer (8: two buffers in 128 registers without
    spilling on sm_90, float32) and ``chains`` independent top-3 states per lane (2: see
    docs/performance.md, "select_rows"). A float16 ``gemm_dtype`` (gemm_prep's MODE 4 tiles) reads eight values
    per vector and scales them by the kernel's ``gsc``."""
    import numpy

    t = _ctype(dtype)
    if numpy.dtype(gemm_dtype) == numpy.float16:  # eight float16 values per 16-byte vector
        head = f"#define T {t}\n#define GH 1\n#define GT float\n#define GV uint4\n#define VEC 8\n"
    else:
        gt = _ctype(gemm_dtype)
        vec = 4 if gt == "float" else 2
        head = f"#define T {t}\n#define GT {gt}\n#define GV {gt}{vec}\n#define VEC {vec}\n"
    return head + f"#define B {batch}\n#define CH {chains}\n" + SELECT_ROWS_SRC


def select_cols_source(dtype: Any, rows_per_thread: int) -> str:
    """CUDA source of ``select_cols`` (column-major float32 tiles) with ``rows_per_thread``
    (1, 2 or 4) rows per thread, and the resident blocks per SM the registers allow without
    spilling (sm_90, ptxas)."""
    minb = {1: 4, 2: 3, 4: 2}[rows_per_thread]
    return f"#define T {_ctype(dtype)}\n#define RPT {rows_per_thread}\n#define SC_MINB {minb}\n" + SELECT_COLS_SRC


def sums_source(dtype: Any, sum_rows: int | None = None, sum_min_blocks: int | None = None) -> str:
    """CUDA source of the sums module (the counting sorts by label and ``sorted_sums``):
    ``sum_rows`` (RG) and ``sum_min_blocks`` (SS_MINB) default to the measured choices
    (profiling scripts vary them)."""
    t = _ctype(dtype)
    if sum_min_blocks is None:
        # 4 blocks per SM (64 registers) for float32 rows; float64 rows spill there.
        sum_min_blocks = 4 if t == "float" else 3
    head = f"#define T {t}\n#define SS_MINB {sum_min_blocks}\n"
    if sum_rows is not None:
        head += f"#define RG {sum_rows}\n"
    return head + SUMS_SRC


PREP_KERNELS = tuple(f"gemm_prep{m}" for m in range(5))
SUMS_KERNELS = ("scatter_by_label", "sorted_sums", "label_hist", "label_scatter", "label_block_offsets", "label_bases")


def prep_source(dtype: Any) -> str:
    """CUDA source of the ``gemm_prep`` module for data of ``dtype``."""
    return f"#define T {_ctype(dtype)}\n" + PREP_SRC


def prep_kernel(dtype: Any, mode: int) -> Any:
    """``gemm_prep`` of ``mode`` (0-4, see cuda/prep.cu) for data of ``dtype``."""
    key = ("prep", _ctype(dtype))
    return _first(key, lambda: _functions(key, prep_source(dtype), PREP_KERNELS))[
        f"gemm_prep{mode}"]


def sums_kernels(dtype: Any) -> dict[str, Any]:
    """The sums module's kernels by name (:data:`SUMS_KERNELS`) for data of ``dtype``."""
    key = ("sums", _ctype(dtype))
    return _first(key, lambda: _functions(key, sums_source(dtype), SUMS_KERNELS))


def _gemm_pass(dtype: Any) -> tuple:
    """The modules a GEMM-regime pass needs besides its selection, compiled beside it."""
    return (lambda: prep_kernel(dtype, 0), lambda: sums_kernels(dtype), fit_kernels)


def select_rows_kernel(dtype: Any, gemm_dtype: Any, batch: int = 8) -> Any:
    """``select_rows`` for data of ``dtype`` and a row-major GEMM tile of ``gemm_dtype``."""
    key = ("select_rows", _ctype(dtype), _ctype(gemm_dtype), batch)
    src = select_rows_source(dtype, gemm_dtype, batch)
    return _first(key, lambda: _functions(key, src, ("select_rows",)), *_gemm_pass(dtype))["select_rows"]


def select_cols_kernel(dtype: Any, rows_per_thread: int) -> Any:
    """``select_cols`` for data of ``dtype``, a column-major float32 GEMM tile and
    ``rows_per_thread`` (1, 2 or 4) rows per thread."""
    key = ("select_cols", _ctype(dtype), rows_per_thread)
    src = select_cols_source(dtype, rows_per_thread)
    return _first(key, lambda: _functions(key, src, ("select_cols",)), *_gemm_pass(dtype))["select_cols"]


FUSED_KERNELS = ("fused_select", "fused_recheck", "fused_rerank", "fused_rescan")


def fused_source(dtype: Any, dp: int, stages: int, columns: int, warps: tuple[int, int],
                 fold_min: bool = False, vote: bool = False) -> str:
    """CUDA source of :data:`FUSED_KERNELS` for rows of ``dtype`` padded to
    ``dp`` columns, ``stages`` pipeline stages of ``columns`` (BK) columns each, and ``warps``
    (WM, WN) over a block's rows and centroids. ``fold_min``: ``benchmarks profile-step``'s
    variant whose epilogue keeps each tile's minimum alone (the main loop's cost without the
    top-3 fold; its labels are not the kernel's, launch it with ``exact`` 0). ``vote``: the
    fold's branches taken by the warp's vote (a tile, then each pair of a lane's values,
    inserted only where one of its lanes needs it), not by each lane (the same labels).

    Raises
    ------
    ValueError
        A combination the kernel cannot run (the source's static assertions, said before NVRTC
        would): ``dp`` not a multiple of ``columns``, ``columns`` not 32 or 64, fewer than two
        stages, or warps other than 4 x 2, 2 x 2 and 8 x 1."""
    if dp % columns or columns not in (32, 64) or stages < 2 or tuple(warps) not in ((4, 2), (2, 2), (8, 1)):
        raise ValueError(f"fused_select: dp={dp}, columns={columns}, stages={stages}, warps={tuple(warps)} should have "
                         f"dp a multiple of columns (32 or 64), stages >= 2 and warps (4, 2), (2, 2) or (8, 1)")
    return (f"#define T {_ctype(dtype)}\n#define DP {int(dp)}\n#define NST {int(stages)}\n"
            f"#define BK {int(columns)}\n#define WM {int(warps[0])}\n#define WN {int(warps[1])}\n"
            + ("#define FUSED_FOLD_MIN 1\n" if fold_min else "") + f"#define FUSED_VOTE {int(vote)}\n" + FUSED_SRC)


def fused_kernels(dtype: Any, dp: int, stages: int, columns: int, warps: tuple[int, int],
                  vote: bool = False) -> dict[str, Any]:
    """The fused float16 regime's kernels by name (:data:`FUSED_KERNELS`), compiled with the
    modules a GEMM-regime pass needs besides (the sums, the fit module)."""
    key = ("fused", _ctype(dtype), int(dp), int(stages), int(columns), tuple(warps), bool(vote))
    src = fused_source(dtype, dp, stages, columns, warps, vote=vote)
    return _first(key, lambda: _functions(key, src, FUSED_KERNELS, split=True), *_gemm_pass(dtype)[1:])


FIT_KERNELS = ("update_centroids", "sum_parts", "label_counts", "col_pass_f32", "col_pass_f64", "col_reduce",
               "pin_words")


def fit_kernels() -> dict[str, Any]:
    """The fit module's kernels by name (:data:`FIT_KERNELS`; no compile-time configuration)."""
    return _functions(("fit",), FIT_SRC, FIT_KERNELS)


AFKMC2_THREADS = 512  # 16 warps: the proposals' distances hide their loads' latency on one SM


AFKMC2_KERNELS = ("afkmc2_block", "afkmc2_fold")
# Proposals per warp held in registers at once, and the most columns per lane held there
# (16 x 32 = 512 features; 2 x 16 doubles and the rest fit 512 threads' 128 registers each).
AFKMC2_ROWS, AFKMC2_MAX_DCH = 2, 16


def afkmc2_dch(d: int) -> int:
    """Columns per lane of ``d`` features in ``afkmc2_block``'s registers (``ceil(d / 32)``),
    or 0 (the loop over global memory) beyond :data:`AFKMC2_MAX_DCH`."""
    dch = -(-int(d) // 32)
    return dch if 0 < dch <= AFKMC2_MAX_DCH else 0


def afkmc2_kernels(d: int) -> dict[str, Any]:
    """AFK-MC²'s kernels by name for rows of ``d`` features: the in-block chains
    (``afkmc2_block``, launched with :data:`AFKMC2_THREADS` threads in one block) and the fold
    of a block's picks into the later chains' distances (``afkmc2_fold``, 256 threads a block)."""
    dch = afkmc2_dch(d)
    src = f"#define AFK_THREADS {AFKMC2_THREADS}\n#define AFK_DCH {dch}\n#define AFK_R {AFKMC2_ROWS}\n" + AFKMC2_SRC
    return _functions(("afkmc2", AFKMC2_THREADS, dch, AFKMC2_ROWS), src, AFKMC2_KERNELS)


def group_min_source(gemm_dtype: Any, csq_dtype: Any) -> str:
    """CUDA source of ``group_min`` for a row-major GEMM tile of ``gemm_dtype`` (float16:
    gemm_prep's MODE 4 tiles, read as float16 bits and scaled) and squared norms of
    ``csq_dtype``."""
    import numpy

    head = "#define GH 1\n" if numpy.dtype(gemm_dtype) == numpy.float16 else ""
    if numpy.dtype(gemm_dtype) not in (numpy.float16, numpy.dtype(csq_dtype)):
        raise ValueError(f"group_min: gemm_dtype={numpy.dtype(gemm_dtype)} should be float16 or csq_dtype="
                         f"{numpy.dtype(csq_dtype)} (the selections' tiles)")
    return head + f"#define GT {_ctype(csq_dtype)}\n" + GROUP_MIN_SRC


def group_min_kernel(gemm_dtype: Any, csq_dtype: Any) -> Any:
    """``group_min`` for a GEMM tile of ``gemm_dtype`` and squared norms of ``csq_dtype``."""
    key = ("group_min", _ctype(gemm_dtype), _ctype(csq_dtype))
    return _functions(key, group_min_source(gemm_dtype, csq_dtype), ("group_min",))["group_min"]


def compile_concurrently(*compiles: Any, device: int | None = None) -> None:
    """Run the given compile calls (e.g. ``lambda: sums_kernels(...)``) in threads: NVRTC
    releases the GIL, so a cold kernel cache costs the longest compile, not their sum. Each
    thread runs on GPU ``device``, by default the caller's: a module is loaded on the GPU of the
    thread that asks for it, and an in-process worker's is its own, not the process's first."""
    from concurrent.futures import ThreadPoolExecutor

    if device is None:
        device = gpu_device.current_device()
    if len(compiles) < 2:
        for c in compiles:
            _on_device(device, c)
        return
    with ThreadPoolExecutor(len(compiles)) as ex:
        for f in [ex.submit(_on_device, device, c) for c in compiles]:
            f.result()


def _on_device(device: int | None, call: Any) -> Any:
    if device is None:
        return call()
    import cupy

    with cupy.cuda.Device(device):
        return _loaded(call())


def _loaded(value: Any) -> Any:
    """``value``, a compile call's kernels (a ``cupy.RawKernel``, or a dict, tuple or list of
    them), each loaded on the current GPU. A module is built once per process (``_CACHE``) but
    loaded per GPU, at a kernel's first launch there: a call whose module another GPU of the
    process built returns at once, and without this the module would load on this GPU in the
    middle of the fit, where its worker's warm-up (:func:`.cupy_backend.warm`) is meant to have
    loaded it during placement."""
    import cupy

    if isinstance(value, cupy.RawKernel):
        value.compile()  # from CuPy's cache of the module for this GPU, or its disk cache
    elif isinstance(value, dict):
        for v in value.values():
            _loaded(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _loaded(v)
    return value
