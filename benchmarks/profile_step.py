"""``python -m benchmarks profile-step``: where the CuPy kernel step spends its time, by
difference: the GEMM tiles alone, the step without sums (GEMM + select), and the whole step;
each the median of repeats between device synchronisations; then the select and sums kernels'
variants alone, and where the step runs ``fused_select`` (tf32, D' <= 128) the kernel alone,
without its top-3 fold, and its rescan. For planning kernel work; prints, writes no file.

    python -m benchmarks profile-step [P2] [P3] [W14] [W18] [--precision tf32] [--tile 256MiB]
"""


import numpy as np

from benchmarks import meta, problems

SUMMARY = "the GEMM regime's step in pieces (GEMM, select, prep, sums)"  # its line in --help

PROBLEMS = problems.pick("P2", "P3", "S1", "S2", "W10", "W14", "W16", "W18")


def t(fn):
    return meta.synced_ms(fn, reps=10, warm=3)


def profile(problem: problems.Problem, precision: str, tile: str) -> None:
    """Print the step's pieces for ``problem`` (the GEMM regime's pieces where it has them)."""
    import cupy

    from daskmeans.backends import cupy_backend as be
    from daskmeans.backends import gpu_device, gpu_gemm, gpu_sums
    from daskmeans.numerics.grid import Grid

    name, (n, d, k) = problem.name, problem.shape
    X, C = problems.cupy_randn(problem)
    grid = Grid.for_block(X)
    p = be.prepare(C, cupy.float32, precision)
    r = {"whole_ms": t(lambda: be.assign(X, p, grid=grid)), "no_sums_ms": t(lambda: be.assign(X, p, want_sums=False))}
    if p.small is None:
        rows = gpu_gemm.tile_rows(p, n)
        gdt = gpu_gemm.tile_dtype(p)
        buf = cupy.empty((rows, p.a.shape[0]), gdt)
        xbuf = gpu_gemm.prep_buffer(rows, d, p.mode)
        eb = cupy.empty(n, cupy.float64)
        err, alpha, xscale, gsc = gpu_gemm.row_scales(p, X)

        def tile_in(s, prep=True):
            m = min(rows, n - s)
            xt = X[s : s + m] if xbuf is None else xbuf[:m]
            if prep:
                gpu_gemm.prep(X[s : s + m], p.mode, 0, None if xbuf is None else xt, None, None, eb[s : s + m], err,
                              xscale)
            return xt, m

        def gemms():
            for s in range(0, n, rows):
                xt, m = tile_in(s)
                gpu_gemm.gemm(p, xt, buf[:m], alpha=alpha)

        def preps():
            for s in range(0, n, rows):
                tile_in(s)

        r["gemm_mode"] = p.mode
        r["prep_tiles_ms"] = t(preps)
        # Every row in one launch (not what the step does; docs/performance.md, "Tried and rejected").
        xall = gpu_gemm.prep_buffer(n, d, p.mode)
        r["prep_one_launch_ms"] = t(lambda: gpu_gemm.prep(X, p.mode, 0, xall, None, None, eb, err, xscale))  # noqa: B023
        del xall
        r["gemm_tiles_ms"] = t(gemms)
        r["tile_rows"] = rows
        # The select kernel alone on one tile (no GEMM running beside it), scaled to all tiles.
        from daskmeans.backends import cuda_src

        cuda_src.select_rows_kernel(X.dtype, gdt)  # the default select module, compiled first
        gpu_gemm.gemm(p, tile_in(0)[0], buf, alpha=alpha)
        lab = cupy.empty(rows, cupy.int32)
        stat = cupy.zeros(3, cupy.float64)
        args = (buf, cupy.int32(p.a.shape[0]), p.csq, X[:rows], cupy.int32(d), cupy.int64(rows), p.centroids,
                eb[:rows], np.int32(0), gpu_device.NULL, gpu_device.NULL, lab, gpu_device.NULL, stat)
        rargs = args + (np.float32(gsc),)  # select_rows reads the tile times gsc
        # select_rows variants: B vectors per lane per batch (8: the default) and ch
        # independent top-3 states per lane (2: the default); labels checked against the
        # default's.
        ref_lab = None
        for batch, ch in ((8, 2), (8, 1), (8, 4), (4, 2), (6, 2)):
            src = cuda_src.select_rows_source(X.dtype, gdt, batch, chains=ch)
            kb = cupy.RawModule(code=src, options=("--std=c++17",)).get_function("select_rows")
            nbb = int(min(gpu_device.blocks_per_sm(kb, 256, 0) * gpu_device.sm_count(0), -(-rows // 8)))
            ms = meta.event_ms(lambda: kb((nbb,), (256,), rargs), reps=10, warm=3)  # noqa: B023
            key = "" if ch == 2 else f"_ch{ch}"
            r[f"select_B{batch}{key}_all_tiles_ms"] = ms * n / rows
            if ref_lab is None:
                ref_lab = lab.copy()
            elif not bool((lab == ref_lab).all()):
                r[f"select_B{batch}{key}_LABELS_DIFFER"] = 1.0
        r["select_read_tb_s"] = rows * p.a.shape[0] * gdt.itemsize / (r["select_B8_all_tiles_ms"] * rows / n * 1e-3) / 1e12
        # select_cols alone on a column-major float32 tile (rows per thread 1, 2, 4).
        if p.mode != 4:  # float32 tiles only
            ldr = -(-rows // 4) * 4
            bcol = cupy.empty((p.a.shape[0], ldr), cupy.float32)
            gpu_gemm.gemm(p, tile_in(0)[0], bcol, ldr)
            for rpt in (1, 2, 4):
                kc = cuda_src.select_cols_kernel(X.dtype, rpt)
                cargs = (bcol, cupy.int64(ldr), cupy.int32(p.a.shape[0])) + args[2:]
                nbc = -(-rows // (32 * rpt))
                r[f"select_cols{rpt}_all_tiles_ms"] = meta.event_ms(
                    lambda: kc((nbc,), (256,), cargs), reps=10, warm=3) * n / rows  # noqa: B023
            del bcol
        if p.fused is not None:
            # fused_select (tf32 at D' <= 128): the kernel alone, its variant that keeps each
            # tile's minimum alone (the main loop without the top-3 fold: their difference is
            # the fold's cost), the rescan of the rows it listed; gemm_tiles_ms above is the
            # float16 GEMM it replaces, its floor.
            from daskmeans.backends import gpu_plan

            scales = gpu_gemm.row_scales(p, X, grid.x_max)
            lab = cupy.empty(n, cupy.int32)
            main, rescan, st = gpu_gemm.fused_calls(X, p, scales, True, labels=lab)
            r["fused_main_ms"] = meta.event_ms(main, reps=10, warm=3)
            r["fused_rescan_ms"] = meta.event_ms(rescan, reps=10, warm=3)
            r["fused_rechecked"] = float(st[2]) / n
            dp = p.fused[0].shape[1]
            src = cuda_src.fused_source(X.dtype, dp, gpu_plan.FUSED_STAGES, gpu_plan.fused_columns(dp),
                                        gpu_plan.FUSED_WARPS, fold_min=True)
            mod = cupy.RawModule(code=src, options=cuda_src.fused_options())
            variant = {f: mod.get_function(f) for f in cuda_src.FUSED_KERNELS}
            r["fused_main_fold_min_ms"] = meta.event_ms(
                gpu_gemm.fused_calls(X, p, scales, False, labels=lab, kernels=variant)[0], reps=10, warm=3)
        labels = be.assign(X, p)["labels"]
        r["sums_ms"] = meta.event_ms(lambda: gpu_sums.label_sums(X, labels, None, k, grid, p.centroids, stat), reps=10, warm=3)
        # The sums pass by stage: counting sort (bincount, offsets, scatter), then sorted_sums
        # with RG rows' loads in flight per lane.
        ev = meta.event_ms
        counts = cupy.bincount(labels, minlength=k)
        r["sums_global_bincount_ms"] = ev(lambda: cupy.bincount(labels, minlength=k))
        cursor = (cupy.cumsum(counts) - counts).astype(cupy.uint64)
        scatter = cuda_src.sums_kernels(X.dtype)["scatter_by_label"]
        perm, slab = cupy.empty(n, cupy.int64), cupy.empty(n, cupy.int32)
        nbs = int(min(8 * gpu_device.sm_count(0), -(-n // 256)))
        scatter((nbs,), (256,), (labels, cupy.int64(n), cursor, perm, slab))
        sums = cupy.zeros((k, d), cupy.int64)
        scales = grid.scales(cupy)
        for rg, mb in ((1, 4), (2, 4), (2, 3), (4, 3)):  # rows in flight per lane, min blocks per SM
            src = cuda_src.sums_source(X.dtype, sum_rows=rg, sum_min_blocks=mb)
            ss = cupy.RawModule(code=src, options=("--std=c++17",)).get_function("sorted_sums")
            nbq = int(min(8 * gpu_device.sm_count(0), -(-n // 256)))
            sargs = (X, cupy.int32(d), cupy.int64(n), perm, slab, gpu_device.NULL, p.centroids, scales, sums, stat)
            r[f"sums_sorted_RG{rg}_mb{mb}_ms"] = ev(lambda: ss((nbq,), (256,), sargs))  # noqa: B023
            sargs = (X, cupy.int32(d), cupy.int64(n), perm, slab, gpu_device.NULL, gpu_device.NULL, scales, sums,
                     gpu_device.NULL)
            r[f"sums_sorted_RG{rg}_mb{mb}_no_inertia_ms"] = ev(lambda: ss((nbq,), (256,), sargs))  # noqa: B023
            r[f"sums_sorted_RG{rg}_mb{mb}_regs"] = ss.attributes["num_regs"]
    print(name, precision, tile, {kk: round(v, 3) for kk, v in r.items()}, flush=True)


def main(argv=None):
    ap = meta.parser("profile-step", __doc__)
    meta.problems_arg(ap, PROBLEMS, "P2")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--tile", default="256MiB", help="daskmeans.gpu-tile-bytes")
    args = ap.parse_args(argv)
    chosen = meta.chosen(ap, args.problems)
    import dask

    dask.config.set({"daskmeans.gpu-tile-bytes": args.tile})
    for problem in chosen:
        profile(problem, args.precision, args.tile)


if __name__ == "__main__":
    main()
