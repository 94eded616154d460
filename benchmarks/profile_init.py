"""``python -m benchmarks profile-init``: the k-means|| recluster (``seed_batched`` on about
2.5 K weighted candidates, reduced to K on one GPU) at the shapes where the init costs most:
its wall time, the host functions that take the time (cProfile, sorted by their own time),
and the fp32 GEMM floor of its distance passes. For planning init work;
prints, writes no file.

    python -m benchmarks profile-init [P4] [W16] [W18]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

from benchmarks import problems

SUMMARY = "the k-means|| recluster at P4 and wide K: wall time, host profile, GEMM floor"  # its line in --help

PROBLEMS = problems.pick("P4", "W16", "W18")


def profile(problem: problems.Problem) -> None:
    """Print the recluster's wall time at ``problem``'s K and D, its profile, and its floor."""
    import cupy

    from benchmarks import meta
    from daskmeans.seeding.kernels import local_trials, seed_batched

    n_cand, d, k = int(2.5 * problem.k), problem.d, problem.k
    rs = cupy.random.default_rng(0)
    x = rs.standard_normal((n_cand, d), dtype=cupy.float32)
    w = rs.integers(1, 100, n_cand).astype(cupy.float64)
    seed_batched(x[: 4 * 256], 256, 0, w[: 4 * 256], precision="tf32")  # kernels loaded
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    seed_batched(x, k, 0, w, precision="tf32")
    cupy.cuda.Device().synchronize()
    prof.disable()
    wall = time.perf_counter() - t0
    # The distance passes' floor: every draw (trials per centre) and every pick against all
    # candidates, as one TF32 GEMM each.
    cols = (local_trials(k) + 1) * k
    c = rs.standard_normal((4096, d), dtype=cupy.float32)
    ms = meta.event_ms(lambda: x @ c.T, reps=10, warm=2)
    floor = ms / 1e3 * cols / 4096
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    print(f"{problem.label}: recluster of {n_cand} candidates to K={k}: {wall:.3f} s; "
          f"GEMM floor of its passes (fp32) {floor:.3f} s", flush=True)
    print(s.getvalue(), flush=True)


def main(argv=None):
    from benchmarks import meta

    meta.profile_main("profile-init", __doc__, PROBLEMS, "P4", profile, argv)


if __name__ == "__main__":
    main()
