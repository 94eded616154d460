"""The GEMM regime of the CuPy backend (moderate and large K).

Per row tile, ``gemm_prep`` writes the rows as the GEMM reads them and each row's certified
error bound, cuBLAS ``gemmEx`` (alpha = -2) writes ``G = -2 X C^T`` into one of two
preallocated tiles, then a selection kernel takes the top-2 (and third value) of ``G +
||c||^2`` per row, certifies the winner against the row's bound and re-ranks the uncertain
rows by exact float64 distances (``exact_winner`` in cuda/select.cu): ``select_cols`` on a
column-major tile (threads own rows; fp32, where few rows are uncertain) or ``select_rows``
on a row-major one (a warp per row; :func:`.gpu_plan.select_layout`). The GEMMs run on one
stream and the selects on another (:func:`.gpu_device.streams`). Sums (and, where the selection
did not compute exact distances, the inertia) follow from :func:`.gpu_sums.label_sums`.
"""

from __future__ import annotations

from typing import Any

import numpy

from .protocol import Tunables, tunables_in_force
from . import cuda_src, gpu_device, gpu_plan
from .gpu_device import ptr
from .gpu_plan import CSQ_PAD, Prepared
from .gpu_sums import label_sums

_CUDA_R_32F, _CUDA_R_64F, _CUDA_R_16F, _CUDA_R_16BF = 0, 1, 2, 14  # cudaDataType_t (library_types.h)


def prepare(c: Any, c64: Any, precision: str, layout: str = "auto", tunables: Tunables | None = None,
            mode_k: int | None = None, fused_copy: bool = True) -> Prepared:
    """The GEMM regime's centroid side: ``c`` ``(K, D)`` in the data dtype and its float64
    values ``c64``; the centroids as the GEMM reads them (in the GEMM mode ``tunables`` pick
    for ``precision`` and K, or for ``mode_k`` centroids where given: the mode of the subsets
    :func:`take` draws from ``c``), their squared norms and the error bound's coefficients;
    where ``fused_select`` runs, its copy of the centroids (not with ``fused_copy`` False: rows
    that only :func:`take` subsets of, which makes each subset's) and its bound."""
    import cupy

    tunables = tunables or tunables_in_force()
    k, d = c.shape
    gemm64 = c.dtype == cupy.float64
    mode = mode_of(precision, gemm64, k if mode_k is None else mode_k, d, tunables)
    kpad = _kpad(k, mode)
    a = cupy.zeros((kpad, d), c.dtype)
    a[:k] = c
    smax = 0.0
    cexp = 0
    if mode:
        if mode == 4:
            cexp = gpu_plan.half_exp(_max_abs(c))
        rsq = cupy.empty(kpad, cupy.float64)
        ab = prep_buffer(kpad, d, mode)
        prep(a, mode, 1, ab, None, rsq, None, (0.0, 0.0, 0.0), 2.0**cexp)
        a = ab
        smax = float(cupy.sqrt(rsq.max()))
    sq = (c64 * c64).sum(axis=1)
    csq = _padded_norms(sq, cupy.float64 if gemm64 else cupy.float32)
    cmax = float(cupy.sqrt(sq.max()))
    fused = None
    if uses_fused(mode, d, tunables):
        fused = (_fused_centroids(a, k, d) if fused_copy else None,
                 gpu_plan.error_bound(cmax, smax, d, mode, gemm64, rounded_output=False))
    return Prepared(c, c64, precision, None, a, csq, gpu_plan.error_bound(cmax, smax, d, mode, gemm64), mode, layout,
                    cexp, tunables, fused)


def _fused_centroids(a: Any, k: int, d: int) -> Any:
    """``fused_select``'s centroids: the first ``k`` rows of the float16 GEMM copy ``a``, in
    whole tiles of :data:`.gpu_plan.FUSED_BN` rows of ``fused_dp(d)`` values (zeros past K
    and D: they add nothing, and the centroids past K have +inf squared norms)."""
    import cupy

    out = cupy.zeros((-(-k // gpu_plan.FUSED_BN) * gpu_plan.FUSED_BN, gpu_plan.fused_dp(d)), cupy.uint16)
    out[:k, :d] = a[:k, :d]
    return out


def take(full: Prepared, rows: Any, c: Any) -> Prepared:
    """What :func:`prepare` gives for a subset of the centroids ``full`` was prepared on:
    ``rows`` (int, shape (k,), on the device) their positions in ``full``, ``c`` ``(k, D)``
    their values. The rows as the GEMM reads them and their squared norms are ``full``'s, and
    so is the error bound, whose largest norm and rounding error bound every subset's (the
    subset's own bound would be tighter: at most a few more rows re-ranked exactly, the same
    labels and distances). No reduction and no read back to the host, where :func:`prepare`
    reads up to four of each subset's maxima (seeding's draws: two subsets per dependent
    step)."""
    import cupy

    k = c.shape[0]
    kpad = _kpad(k, full.mode)
    a = cupy.zeros((kpad, full.a.shape[1]), full.a.dtype)
    a[:k] = full.a[rows] if full.mode else c
    csq = _padded_norms(full.csq[rows], full.csq.dtype)
    fused = None if full.fused is None else (_fused_centroids(a, k, c.shape[1]), full.fused[1])
    return Prepared(c, c.astype(cupy.float64), full.precision, None, a, csq, full.err, full.mode, full.layout,
                    full.cexp, full.tunables, fused)


def _kpad(k: int, mode: int) -> int:
    """The GEMM side's rows for ``k`` centroids in GEMM ``mode``: whole 16-byte vectors of the
    tile's rows (8 float16 values in mode 4, else 4)."""
    return -(-k // 8) * 8 if mode == 4 else -(-k // 4) * 4


def _padded_norms(sq: Any, dtype: Any) -> Any:
    """The centroids' squared norms ``sq`` ``(k,)`` in ``dtype``, padded with +inf (never
    selected) to whole :data:`CSQ_PAD` groups: select_rows reads them in 16-byte vectors past K."""
    import cupy

    k = sq.shape[0]
    csq = cupy.full(-(-k // CSQ_PAD) * CSQ_PAD, numpy.inf, dtype)
    csq[:k] = sq
    return csq


def _max_abs(X: Any) -> float:
    """The largest ``|x|`` of ``X`` (two reductions: no temporary of X's size)."""
    return float(max(X.max(), -X.min())) if X.size else 0.0


def mode_of(precision: str, gemm64: bool, k: int, d: int, tunables: Tunables) -> int:
    """The GEMM mode (:func:`.gpu_plan.gemm_mode`) of ``k`` centroids of ``d`` features on this
    device."""
    return gpu_plan.gemm_mode(precision, gemm64, tunables.gpu_fp32_gemm, _cc(), tunables.gpu_tf32_gemm, k, d)


def uses_fused(mode: int, d: int, tunables: Tunables) -> bool:
    """:func:`.gpu_plan.uses_fused` on this device."""
    dev = gpu_device.device_id()
    return gpu_plan.uses_fused(tunables.gpu_tf32_gemm, mode, d, _cc(), gpu_device.shared_optin(dev))


def _cc() -> str:
    return gpu_device.compute_capability(gpu_device.device_id())


def prep(X: Any, mode: int, cen: int, out: Any, sq: Any, rsq: Any, eb: Any, err: tuple, scale: float = 1.0) -> None:
    """``gemm_prep`` on the rows of ``X`` (see cuda_src): the GEMM's rounded copy in ``out``
    (mode > 0; mode 4: of ``X`` times ``scale``, a power of two), per-row ``||x||^2`` /
    ``||x - xb||^2`` / error bounds where arrays are given."""
    import cupy

    rows, d = X.shape
    kern = cuda_src.prep_kernel(X.dtype, mode)
    nb = int(max(1, min(32 * gpu_device.sm_count(gpu_device.device_id()), -(-rows // 32))))  # 8 warps x 4 rows
    kern((nb,), (256,), (X, cupy.int64(rows), cupy.int32(d), cupy.int32(cen), ptr(out),
                         ptr(sq), ptr(rsq), ptr(eb), *(numpy.float64(e) for e in err), numpy.float32(scale)))


def prep_buffer(rows: int, d: int, mode: int) -> Any:
    """The GEMM's copy of ``rows`` rows in ``mode`` (None for mode 0: the data itself)."""
    import cupy

    if mode == 0:
        return None
    return cupy.empty((rows, 3 * d if mode == 2 else d), cupy.uint16 if mode in (3, 4) else cupy.float32)


def row_scales(p: Prepared, X: Any, x_max: float | None = None) -> tuple[tuple, float, float, float]:
    """``(err, alpha, xscale, gsc)`` of a block ``X`` (n, D): the bound's coefficients, the
    GEMM's alpha, the rows' scale for ``gemm_prep`` and the factor the selection reads the tile
    with. Mode 4 takes powers of two that keep the float16 inputs and output in range (the
    centroids' 2^cexp bounds their largest magnitude by 2^(14 - cexp)); the bound gains the
    output's subnormal floor. ``x_max`` bounds ``|X|`` where the caller knows a bound (the
    fit's grid: no reduction and no synchronisation per block; labels are certified whatever
    the scale). Other modes: ``(p.err, -2, 1, 1)``."""
    if p.mode != 4:
        return p.err, -2.0, 1.0, 1.0
    xe, _, o = gpu_plan.half_scales(_max_abs(X) if x_max is None else x_max, 2.0 ** (14 - p.cexp), X.shape[1])
    err = (p.err[0], p.err[1], p.err[2] + gpu_plan.half_output_floor(o))
    return err, -2.0 * 2.0 ** -(xe + p.cexp + o), 2.0**xe, 2.0**o


def tile_dtype(p: Prepared) -> Any:
    """The GEMM tile's dtype: float16 in mode 4, else that of the squared norms."""
    return numpy.dtype(numpy.float16) if p.mode == 4 else p.csq.dtype


def gemm(p: Prepared, xt, out, ldr: int | None = None, alpha: float = -2.0) -> None:
    """``out[:rows] = alpha xt a^T`` (rows x Kpad, row-major) on the current stream; with ``ldr``,
    column-major instead (``out[k * ldr + r]``). ``xt`` (rows x D') is the tile as the GEMM
    reads it: the data for ``p.mode`` 0, else ``gemm_prep``'s copy."""
    import cupy
    from cupy.cuda import cublas, device

    rows, d = xt.shape
    kpad = p.a.shape[0]
    h = device.get_cublas_handle()
    cublas.setStream(h, cupy.cuda.get_current_stream().ptr)
    if p.centroids.dtype == cupy.float64:
        scal = numpy.array([alpha, 0.0])
        ab, ct, comp = _CUDA_R_64F, _CUDA_R_64F, cublas.CUBLAS_COMPUTE_64F
    else:
        scal = numpy.array([alpha, 0.0], numpy.float32)
        ct, comp = _CUDA_R_32F, cublas.CUBLAS_COMPUTE_32F
        ab = _CUDA_R_16BF if p.mode == 3 else _CUDA_R_32F
        if p.mode == 4:  # float16 in and out, float32 accumulation
            ab = ct = _CUDA_R_16F
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


def tile_rows(p: Prepared, n: int) -> int:
    """Rows of one GEMM tile for a block of ``n`` rows (:func:`.gpu_plan.tile_rows` within
    the prepared centroids' ``Tunables.gpu_tile_bytes``)."""
    return _tile_rows(n, p.a.shape[0], p.centroids.shape[1], p.mode, tile_dtype(p).itemsize,
                      p.tunables or tunables_in_force())


def _tile_rows(n: int, kpad: int, d: int, mode: int, out_itemsize: int, tunables: Tunables) -> int:
    # gemm_prep's copy of a tile (prep_buffer): none in mode 0, 3D float32 columns in mode 2.
    cols, item = (0, 0) if mode == 0 else (3 * d if mode == 2 else d, 2 if mode in (3, 4) else 4)
    return gpu_plan.tile_rows(n, kpad, out_itemsize, cols, item, tunables.gpu_tile_bytes,
                              gpu_plan.fill_rows(gpu_device.sm_count(gpu_device.device_id())),
                              tunables.gpu_tile_bytes_max)


def _select_kernel(dtype: Any, gemm_dtype: Any, rpt: int) -> Any:
    return cuda_src.select_cols_kernel(dtype, rpt) if rpt else cuda_src.select_rows_kernel(dtype, gemm_dtype)


def compiles(k: int, d: int, dtype: Any, precision: str, n: int, tunables: Tunables | None = None) -> list:
    """The compile calls of the modules a fit of K x D launches on blocks of ``n`` rows of
    ``dtype`` (the selection as :func:`run` picks it under ``tunables``, ``gemm_prep`` and the
    sums), for :func:`.cupy_backend.warm`."""
    tunables = tunables or tunables_in_force()
    gemm64 = numpy.dtype(dtype) == numpy.float64
    mode = mode_of(precision, gemm64, k, d, tunables)
    if uses_fused(mode, d, tunables):  # gemm_prep: the centroids' float16 copy
        dp = gpu_plan.fused_dp(d)
        return [lambda: cuda_src.fused_kernels(dtype, dp, gpu_plan.FUSED_STAGES, gpu_plan.fused_columns(dp),
                                               gpu_plan.FUSED_WARPS, gpu_plan.fused_vote(k)),
                lambda: cuda_src.prep_kernel(dtype, 0), lambda: cuda_src.sums_kernels(dtype)]
    kpad = _kpad(k, mode)
    gdt, _ = _gemm_dtypes(mode, gemm64)
    rows = _tile_rows(n, kpad, d, mode, gdt.itemsize, tunables)
    rpt = gpu_plan.select_layout(rows, kpad, gdt == numpy.float32, gpu_device.sm_count(gpu_device.device_id()),
                                 precision)
    return [lambda: _select_kernel(dtype, gdt, rpt), lambda: cuda_src.prep_kernel(dtype, 0),
            lambda: cuda_src.sums_kernels(dtype)]


def bound_compiles(k: int, d: int, dtype: Any, precision: str, tunables: Tunables | None = None) -> list:
    """The compile calls Yinyang's bounds add to :func:`compiles` in the GEMM regime:
    :func:`group_lower`'s ``group_min`` for the mode's tile and squared norms (the tile path's
    ``gemm_prep`` is :func:`compiles`' already)."""
    tunables = tunables or tunables_in_force()
    gemm64 = numpy.dtype(dtype) == numpy.float64
    gdt, csq = _gemm_dtypes(mode_of(precision, gemm64, k, d, tunables), gemm64)
    return [lambda: cuda_src.group_min_kernel(gdt, csq)]


def _gemm_dtypes(mode: int, gemm64: bool) -> tuple[Any, Any]:
    """``(tile, squared norms)`` dtypes of a GEMM of ``mode`` before there is a
    :class:`Prepared` (:func:`tile_dtype`'s rule): float64 for float64 data, else float32
    norms and a float16 tile in mode 4, float32 otherwise."""
    csq = numpy.dtype(numpy.float64 if gemm64 else numpy.float32)
    return (numpy.dtype(numpy.float16) if mode == 4 else csq), csq


def run(X: Any, p: Prepared, w: Any, prev: Any, labels: Any, d2: Any, want_sums: bool, grid: Any = None) -> dict:
    """As :func:`.gpu_small.run`, through GEMM tiles and the selection kernels (or
    :func:`_run_fused`, where the centroids were prepared for it)."""
    import cupy

    n, d = X.shape
    scales = row_scales(p, X, None if grid is None else grid.x_max)  # once: a reduction where there is no grid
    if p.fused is not None and n and fused_factor(scales[1], scales[3]) is not None:
        return _run_fused(X, p, w, prev, labels, d2, want_sums, grid, scales)
    k = p.k
    kpad = p.a.shape[0]
    gdt = tile_dtype(p)
    dev = gpu_device.device_id()
    rows = tile_rows(p, n)
    rpt = gpu_plan.select_layout(rows, kpad, gdt == numpy.float32, gpu_device.sm_count(dev), p.precision, p.layout)
    kern = _select_kernel(X.dtype, gdt, rpt)
    stat = cupy.zeros(3, cupy.float64)
    # A persistent grid (every resident block slot once): each warp streams its rows with the
    # next batch always in flight, which extra waves of blocks would restart.
    blocks_max = gpu_device.blocks_per_sm(kern, 256, 0) * gpu_device.sm_count(dev)
    ntiles = -(-n // rows)
    main = cupy.cuda.get_current_stream()
    # A two-buffer pipeline: GEMM of tile t+1 (one stream) runs while tile t is selected (the
    # other); a buffer is rewritten only after its select is done.
    gs, ss = gpu_device.streams(dev)
    nbuf = 1 if ntiles == 1 else 2
    bufs = [cupy.empty((-(-rows // 4) * 4, kpad), gdt) for _ in range(nbuf)]
    xbufs = [prep_buffer(rows, d, p.mode) for _ in range(nbuf)]
    eb = cupy.empty(n, cupy.float64)  # each row's error bound, from gemm_prep
    err, alpha, xscale, gsc = scales
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
            prep(X[s0:s1], p.mode, 0, xt if p.mode else None, None, None, eb[s0:s1], err, xscale)
            gemm(p, xt, bufs[i] if rpt else g, ldr if rpt else None, alpha)
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
                 ptr(None if w is None else w[s0:s1]), ptr(None if prev is None else prev[s0:s1]),
                 ptr(None if labels is None else labels[s0:s1]), ptr(None if d2 is None else d2[s0:s1]),
                 stat) + (() if rpt else (numpy.float32(gsc),)),
            )
            freed[i] = ss.record()
    from cupy.cuda import cublas, device

    cublas.setStream(device.get_cublas_handle(), main.ptr)  # leave the handle as CuPy expects
    main.wait_event(gs.record())
    main.wait_event(ss.record())
    out = {"inertia": stat[0], "reassigned": stat[1], "rechecked": stat[2]}  # views: read after the sums pass
    if want_sums:
        out.update(label_sums(X, labels, w, k, grid, None if exact else p.centroids, None if exact else stat))
    return out


def fused_factor(alpha: float, gsc: float) -> float | None:
    """``fs``, the one factor ``fused_select`` takes ``-2 x.c`` from its float32 sums with
    (``alpha`` x ``gsc``, as the tile path's GEMM output and its read), or None where it is not
    a normal float32 (data and centroids both tiny: a product beyond float32's range, or
    rounded in it, would no longer be within the bound). Those blocks take the tile path,
    whose two factors keep every value in range."""
    fs = alpha * gsc
    return fs if 2.0**-126 <= abs(fs) <= 2.0**127 else None


def group_lower(X: Any, p: Prepared, starts: Any, t: int, own: Any, xnorm: Any, cmax: float, lower: Any,
                rel: float, delta: float) -> None:
    """Yinyang's per-group lower bounds of the rows of ``X`` from GEMM tiles (``group_min``,
    cuda/group_min.cu), not from float64 distances: the tiles' values within each row's
    certified bound, the bound taken off.

    Parameters
    ----------
    X : cupy.ndarray, shape (n, D)
    p : Prepared
        The centroids in group order, in the GEMM regime (their tiles, never ``fused_select``).
    starts : cupy.ndarray of int32, shape (t + 1,)
        Group ``q``'s centroids are ``p``'s rows ``[starts[q], starts[q + 1])``.
    t : int
        Groups.
    own : cupy.ndarray of int32, shape (n,)
        Each row's own centroid's position in ``p`` (left out of its group's minimum).
    xnorm : cupy.ndarray of float64, shape (n,)
        The rows' ``||x||^2``.
    cmax : float
        The largest centroid norm, rounded up.
    lower : cupy.ndarray of float64, shape (n, t), C-contiguous
        Out: at most the distance from each row to any other centroid of each group (+inf
        where the group has none).
    rel, delta : float
        The float64 arithmetic's relative rounding margin and the bounds' outward rounding
        (:func:`.bounds.margins` of float64).
    """
    import cupy

    n, d = X.shape
    if n == 0:
        return
    kpad = p.a.shape[0]
    gdt = tile_dtype(p)
    rows = tile_rows(p, n)
    kern = cuda_src.group_min_kernel(gdt, p.csq.dtype)
    err, alpha, xscale, gsc = row_scales(p, X)
    eb = cupy.empty(n, cupy.float64)  # each row's error bound, from gemm_prep
    g = cupy.empty((rows, kpad), gdt)
    xbuf = prep_buffer(rows, d, p.mode)
    cap = 32 * gpu_device.sm_count(gpu_device.device_id())  # grid-strided: 8 warps (rows) a block
    for s0 in range(0, n, rows):
        s1 = min(n, s0 + rows)
        m = s1 - s0
        xt = X[s0:s1] if xbuf is None else xbuf[:m]
        prep(X[s0:s1], p.mode, 0, xt if p.mode else None, None, None, eb[s0:s1], err, xscale)
        gemm(p, xt, g[:m], None, alpha)
        kern((max(1, min(cap, -(-m // 8))),), (256,),
             (g, numpy.int64(kpad), numpy.int64(m), p.csq, starts, numpy.int32(t), own[s0:s1], eb[s0:s1],
              xnorm[s0:s1], p.csq.dtype.type(gsc), numpy.float64(rel), numpy.float64(cmax), numpy.float64(delta),
              lower[s0:s1]))


def fused_calls(X: Any, p: Prepared, scales: tuple, exact: bool, w: Any = None, prev: Any = None, labels: Any = None,
                d2: Any = None, kernels: dict | None = None) -> tuple[Any, Any, Any]:
    """``(main, rescan, stat)``: ``fused_select``'s launch on the block ``X`` (n, D), and
    those that finish the rows it listed (``fused_recheck``, ``fused_rerank``,
    ``fused_rescan``), each queued by calling it (``main`` first: it zeroes the statistics
    ``stat`` (3,) float64 and the count of listed rows), their arguments as :func:`run`'s and
    ``exact`` (the winners' exact distances computed here, not by the sums pass); ``kernels``:
    :data:`.cuda_src.FUSED_KERNELS` as :func:`.cuda_src.fused_kernels` gives them (a variant's,
    for profiling)."""
    import cupy

    n, d = X.shape
    ch, err = p.fused
    dp = ch.shape[1]
    dev = gpu_device.device_id()
    stages, columns, warps = gpu_plan.FUSED_STAGES, gpu_plan.fused_columns(dp), gpu_plan.FUSED_WARPS
    threads = gpu_plan.fused_threads(warps)
    kernels = kernels or cuda_src.fused_kernels(X.dtype, dp, stages, columns, warps, gpu_plan.fused_vote(p.k))
    kmain, kcheck, krerank, krescan = (kernels[f] for f in cuda_src.FUSED_KERNELS)
    shared = gpu_plan.fused_shared_bytes(dp, stages, columns)
    for kern in (kmain, kcheck):
        if kern.max_dynamic_shared_size_bytes < shared:
            kern.max_dynamic_shared_size_bytes = shared
    # The bound without the tile's float16 rounding (there is no tile), the row scale of
    # gemm_prep MODE 4 and G's factor: -2 x.c = fs x (the float16 products' sum).
    _, alpha, xscale, gsc = scales
    fs = fused_factor(alpha, gsc)
    stat = cupy.empty(3, cupy.float64)
    # Per listed row: its index, two candidates and threshold, the candidates fused_recheck
    # notes and their count, and its place in the list where fused_rescan finishes it
    # (gpu_plan.fused_list_bytes a row, counted by working_bytes).
    found = gpu_plan.FUSED_FOUND
    cands = cupy.empty(3 * n, cupy.int64)
    noted = cupy.empty(n * found, cupy.int32)
    nfound = cupy.empty(n, cupy.int32)
    over = cupy.empty(n, cupy.uint64)
    counts = cupy.empty(2, cupy.uint64)  # listed rows, rows left to fused_rescan
    ncand, nover = counts[:1], counts[1:]
    tail = (p.centroids, numpy.int32(exact), ptr(w), ptr(prev), ptr(labels), ptr(d2), stat)
    ntile = ch.shape[0] // gpu_plan.FUSED_BN
    splits = gpu_plan.recheck_splits(ntile)
    sms = gpu_device.sm_count(dev)

    def main() -> None:
        stat.fill(0)
        counts.fill(0)
        kmain((-(-n // gpu_plan.FUSED_BM),), (threads,),
              (X, numpy.int32(d), numpy.int64(n), numpy.float32(xscale), ch, numpy.int32(ntile),
               p.csq, numpy.float32(fs), *(numpy.float64(e) for e in err)) + tail + (cands, ncand), shared_mem=shared)

    def rescan() -> None:
        # Grids sized for every row and capped near the blocks the SMs hold at once: the count of
        # listed rows is on the device (the kernels stride over it; a block past it returns).
        # The lists' counts zeroed here, not by main(): each call gives the same result (profiling
        # queues this one several times after one main()).
        rt = gpu_plan.FUSED_RESCAN_THREADS
        nfound.fill(0)
        nover.fill(0)
        rowblocks = max(1, min(-(-n // gpu_plan.FUSED_BM), sms // splits))  # a block per SM: its launch bounds
        kcheck((rowblocks, splits), (threads,),
               (X, numpy.int32(d), numpy.float32(xscale), ch, numpy.int32(ntile), numpy.int32(p.k), p.csq,
                numpy.float32(fs), cands, ncand, noted, nfound), shared_mem=shared)
        blocks = max(1, min(-(-n // (rt // 32)), 2 * sms))
        krerank((blocks,), (rt,), (X, numpy.int32(d)) + tail + (cands, ncand, noted, nfound, over, nover))
        krescan((blocks,), (rt,), (X, numpy.int32(d), numpy.float32(xscale), ch, numpy.int32(p.k), p.csq,
                                  numpy.float32(fs)) + tail + (cands, over, nover))

    return main, rescan, stat


def _run_fused(X: Any, p: Prepared, w: Any, prev: Any, labels: Any, d2: Any, want_sums: bool, grid: Any,
               scales: tuple) -> dict:
    """:func:`run` through ``fused_select`` (cuda/fused_select.cu): one launch for the whole
    block, no distance tile; then the rows it listed (three or more candidates within the
    bound) through ``fused_recheck``, ``fused_rerank`` and, past their lists, ``fused_rescan``,
    which read their count on the device. ``scales``: the
    block's :func:`row_scales`."""
    exact = d2 is not None or not want_sums
    main, rescan, stat = fused_calls(X, p, scales, exact, w, prev, labels, d2)
    main()
    rescan()
    out = {"inertia": stat[0], "reassigned": stat[1], "rechecked": stat[2]}  # views: read after the sums pass
    if want_sums:
        out.update(label_sums(X, labels, w, p.k, grid, None if exact else p.centroids, None if exact else stat))
    return out
