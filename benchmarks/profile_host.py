"""``python -m benchmarks profile-host``: host (Python) time of the CuPy kernel step against
its GPU time, for small problems where the launch overhead is a visible share of the step: per
call, the host time of ``assign`` (no synchronisation, the GPU queue absorbs the work), the step
between CUDA events and between synchronisations, and the fused kernel alone. For planning
kernel work; prints, writes no file.

    python -m benchmarks profile-host [S1] [S2]
"""


import time

from benchmarks import meta, problems

SUMMARY = "host-side cost of a small-K step"  # its line in --help

PROBLEMS = problems.pick("S1", "S2")


def host_us(fn, calls=200):
    """Host microseconds per call of ``fn`` (no synchronisation between calls)."""
    import cupy

    for _ in range(5):
        fn()
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    cupy.cuda.Device().synchronize()
    return (t1 - t0) / calls * 1e6


def profile(problem: problems.Problem) -> None:
    """Print the host and GPU times of ``problem``'s step and its pieces."""
    import cupy

    from daskmeans.backends import cupy_backend as be
    from daskmeans.backends import gpu_device, gpu_small
    from daskmeans.numerics.grid import Grid

    name, n = problem.name, problem.n
    X, C = problems.cupy_randn(problem)
    grid = Grid.for_block(X)
    p = be.prepare(C, cupy.float32)
    labels = cupy.empty(n, cupy.int32)
    kern, reduce, shared, nb, width, (n64, d32, k32, nb32, width32, kd32) = gpu_small._plan(X, p)
    part = cupy.empty((nb, width), cupy.int64)
    kargs = (X, n64, d32, k32, p.c64, gpu_device.NULL, grid.scales(cupy), cupy.float64(grid.wscale), gpu_device.NULL, labels, gpu_device.NULL,
             part, gpu_device.NULL)
    r = {
        "host_assign_us": host_us(lambda: be.assign(X, p, grid=grid)),
        "host_assign_out_labels_us": host_us(lambda: be.assign(X, p, out_labels=labels, grid=grid)),
        "host_plan_us": host_us(lambda: gpu_small._plan(X, p)),
        "host_empty_us": host_us(lambda: cupy.empty((nb, width), cupy.float64)),
        "host_launch_us": host_us(lambda: kern((nb,), (256,), kargs, shared_mem=shared)),
        "step_events_ms": meta.event_ms(lambda: be.assign(X, p, grid=grid), reps=30, warm=5),
        "step_synced_ms": meta.synced_ms(lambda: be.assign(X, p, grid=grid), reps=30, warm=5),
        "kernel_events_ms": meta.event_ms(lambda: kern((nb,), (256,), kargs, shared_mem=shared), reps=30, warm=5),
    }
    tot, stat = cupy.empty(width - 2, cupy.int64), cupy.empty(2, cupy.float64)
    rargs = (part, nb32, width32, k32, kd32, tot, stat)
    r["reduce_events_ms"] = meta.event_ms(lambda: reduce((-(-width * 32 // 256),), (256,), rargs), reps=30, warm=5)
    Y = cupy.empty_like(X)
    r["hbm_read_events_ms"] = meta.event_ms(lambda: Y.__setitem__(slice(None), X), reps=30, warm=5) / 2
    r["hbm_read_synced_ms"] = meta.synced_ms(lambda: Y.__setitem__(slice(None), X), reps=30, warm=5) / 2
    print(name, {kk: round(v, 4) for kk, v in r.items()}, flush=True)


def main(argv=None):
    meta.profile_main("profile-host", __doc__, PROBLEMS, "S1", profile, argv)


if __name__ == "__main__":
    main()
