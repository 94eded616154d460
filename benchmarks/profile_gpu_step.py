"""Where the CuPy kernel step spends its time: each stage of ``backends.cupy.assign`` timed
alone with CUDA events (median of repeats) on one problem. For planning kernel work.

    python benchmarks/profile_gpu_step.py S1 P2
"""

import sys

import cupy
import numpy as np

from daskmeans.backends import cupy as be

PROBLEMS = {"P2": (1_000_000, 100, 1000), "P3": (300_000, 408, 5000), "S1": (1_000_000, 100, 4), "S2": (10_000_000, 2, 8)}


def t(fn, reps=10):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(a, b))
    return float(np.median(ts))


for name in sys.argv[1:] or ["S1", "P2"]:
    n, d, k = PROBLEMS[name]
    X = cupy.random.standard_normal((n, d), dtype=cupy.float32)
    C = X[cupy.random.permutation(n)[:k]].astype(cupy.float64)
    p = be.prepare(C, cupy.float32)
    step = be._tile_rows(k, 4)
    xt = X[:step]
    lab, d2 = be._tile_nearest(xt, p)
    sums = cupy.zeros((k, d), cupy.float64)
    r = {
        "tile_rows": step,
        "assign_total_ms": t(lambda: be.assign(X, p)),
        "gemm_tile_ms": t(lambda: xt @ p.neg2_ct),
        "nearest_tile_ms": t(lambda: be._tile_nearest(xt, p)),
        "accumulate_tile_ms": t(lambda: be._accumulate(xt, lab, None, sums)),
        "bincount_ms": t(lambda: cupy.bincount(lab, minlength=k)),
        "d2_sum_ms": t(lambda: float(d2.sum())),
        "labels_copy_ms": t(lambda: cupy.copyto(cupy.empty_like(lab), lab)),
    }
    print(name, {kk: round(v, 3) if isinstance(v, float) else v for kk, v in r.items()}, flush=True)
