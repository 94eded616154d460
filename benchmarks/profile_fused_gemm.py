"""Where the fused GEMM path (``backends.cupy_backend._run_fused_gemm``) spends its time: the
``gemm_top2`` kernel, ``finish_top2`` and the label sums, each timed alone with CUDA events
(median of repeats), and how many rows needed each re-check (certified / two candidates /
every centroid). For planning kernel work.

    python benchmarks/profile_fused_gemm.py P2 P3
"""

import sys

import benchmeta
import cupy
import numpy as np

from daskmeans.backends import cuda_src
from daskmeans.backends import cupy_backend as be

PROBLEMS = {"P2": (1_000_000, 100, 1000), "P3": (300_000, 408, 5000), "P4s": (500_000, 480, 40000)}


def t(fn):
    return benchmeta.event_ms(fn, reps=7, warm=2)


names = [a for a in sys.argv[1:] if not a.startswith("--") and a in PROBLEMS]
precs = ["fp32"]
for name in names or ["P2"]:
    n, d, k = PROBLEMS[name]
    X = cupy.random.standard_normal((n, d), dtype=cupy.float32)
    C = X[cupy.random.permutation(n)[:k]].astype(cupy.float64)
    for prec in precs:
        p = be.prepare(C, cupy.float32, prec)
        gemm, finish = cuda_src.fused_gemm_kernels()
        i1, i2 = cupy.empty(n, cupy.int32), cupy.empty(n, cupy.int32)
        bb = cupy.empty((3, n), cupy.float32)
        lab = cupy.empty(n, cupy.int32)
        stat = cupy.zeros(3, cupy.float64)
        ga = (X, cupy.int64(n), cupy.int32(d), p.centroids, cupy.int32(k), p.csq, i1, i2, bb[0], bb[1], bb[2])
        r = {"gemm_top2_ms": t(lambda: gemm((-(-n // 128),), (256,), ga))}  # noqa: B023
        fb = int(min(8 * be._sm_count(0), -(-n // 8)))
        fa = (X, cupy.int32(d), cupy.int64(n), p.centroids, cupy.int32(k), i1, i2, bb[0], bb[1], bb[2],
              np.float64(p.err[0]), np.float64(p.err[2]), be._NULL, be._NULL, lab, be._NULL, stat)
        r["finish_ms"] = t(lambda: finish((fb,), (256,), fa))  # noqa: B023
        r["sums_ms"] = t(lambda: be._label_sums(X, lab, None, k))  # noqa: B023
        r["whole_ms"] = t(lambda: be._run_fused_gemm(X, p, None, None, lab, None, True))  # noqa: B023
        sq = (X.astype(cupy.float64) ** 2).sum(1)
        thr = bb[0].astype(cupy.float64) + 2 * (p.err[0] * cupy.sqrt(sq) + p.err[2])
        r["flag_two"] = float(((bb[1] <= thr) & (bb[2] > thr)).mean())
        r["flag_all"] = float((bb[2] <= thr).mean())
        r["regs"] = gemm.attributes["num_regs"]
        r["tflops"] = 2 * n * d * k / r["gemm_top2_ms"] / 1e9
        print(name, prec, {kk: round(v, 4) for kk, v in r.items()}, flush=True)
