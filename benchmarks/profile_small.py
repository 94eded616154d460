"""``python -m benchmarks profile-small``: the fused small-K kernel (``fused_small``) alone,
timed with CUDA events (median of repeats), for compile-time variants of its configuration,
next to the whole step (``backends.cupy_backend.assign``, between device synchronisations) and
one HBM read of X. For planning kernel work on S1/S2; prints, writes no file.

    python -m benchmarks profile-small [S1] [S2]
"""


from benchmarks import meta, problems

SUMMARY = "compile-time variants of the fused small-K kernel"  # its line in --help

PROBLEMS = problems.pick("S1", "S2")


# (L, DPL, TRED, U, min blocks, MODE, CREG) per problem; MODE 1 = labels only (no sums);
# CREG: centroids in registers, sums in per-group shared memory.
VARIANTS = {
    "S1": [(16, 7, 1, 1, 2, 0, 0), (16, 7, 1, 1, 1, 0, 1), (16, 7, 1, 2, 1, 0, 1), (16, 7, 1, 3, 1, 0, 1),
           (16, 7, 1, 1, 1, 1, 0), (16, 7, 1, 2, 1, 1, 1), (16, 7, 1, 3, 1, 1, 1)],
    "S2": [(1, 2, 0, 4, 1, 0, 0), (1, 2, 0, 2, 1, 0, 1), (1, 2, 0, 4, 1, 0, 1), (1, 2, 0, 8, 1, 0, 1),
           (1, 2, 0, 4, 3, 0, 1), (1, 2, 0, 8, 3, 0, 1), (1, 2, 0, 4, 1, 1, 0), (1, 2, 0, 4, 1, 1, 1)],
}


def variant(lanes, dpl, kacc, tred, rows, min_blocks, mode, creg, dfull):
    import cupy

    from daskmeans.backends import cuda_src

    src = cuda_src.small_source(cupy.float32, lanes, dpl, kacc, tred, 256, rows, min_blocks, mode, creg, dfull)
    return cupy.RawModule(code=src, options=("--std=c++17",)).get_function("fused_small")


def profile(problem: problems.Problem) -> None:
    """Print the step, the HBM read and each variant's kernel time for ``problem``."""
    import cupy

    from daskmeans.backends import cupy_backend as be
    from daskmeans.backends import gpu_device, gpu_plan
    from daskmeans.numerics.grid import Grid

    ev, synced = meta.event_ms, meta.synced_ms
    name, (n, d, k) = problem.name, problem.shape
    X, C = problems.cupy_randn(problem)
    grid = Grid.for_block(X)
    p = be.prepare(C, cupy.float32)
    Y = cupy.empty_like(X)
    res = {"hbm_read_ms": ev(lambda: cupy.copyto(Y, X)) / 2}
    for cen in ("shared", "registers"):
        p = be.prepare(C, cupy.float32, _centroids=cen)
        res[f"step_{cen}_synced_ms"] = synced(lambda: be.assign(X, p, grid=grid))  # noqa: B023
        res[f"step_{cen}_events_ms"] = ev(lambda: be.assign(X, p, grid=grid))  # noqa: B023
    labels = cupy.empty(n, cupy.int32)
    for lanes, dpl, tred, rows, mb, mode, creg in VARIANTS[name]:
        kacc = k if k * dpl <= 32 else 0  # register accumulators, as in backends.gpu_plan.small_config
        shared = gpu_plan.shared_bytes(k, lanes, dpl, creg, mode)
        kern = variant(lanes, dpl, kacc, tred and kacc > 0, rows, mb, mode, creg, d == lanes * dpl)
        kern.max_dynamic_shared_size_bytes = shared
        slots = gpu_device.blocks_per_sm(kern, 256, shared) * gpu_device.sm_count(0)
        nb = int(max(1, min(slots, -(-n // (256 // lanes)))))
        part = cupy.empty((nb, k * d + 2 * k + 2), cupy.int64)
        pstat = cupy.empty((nb, 2), cupy.float64)
        null = gpu_device.NULL
        args = (X, cupy.int64(n), cupy.int32(d), cupy.int32(k), p.c64, null, grid.scales(cupy), cupy.float64(grid.wscale),
                null, labels, null, null if mode == 1 else part, pstat if mode == 1 else null)
        t = ev(lambda: kern((nb,), (256,), args, shared_mem=shared))  # noqa: B023
        a = kern.attributes
        res[f"L{lanes}_DPL{dpl}_tred{tred}_U{rows}_mb{mb}_mode{mode}_creg{creg}"] = (round(t, 4), a["num_regs"], a["local_size_bytes"], nb)
    print(name, p.small, res, flush=True)


def main(argv=None):
    meta.profile_main("profile-small", __doc__, PROBLEMS, "S1", profile, argv)


if __name__ == "__main__":
    main()
