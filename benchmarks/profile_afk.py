"""``python -m benchmarks profile-afk``: AFK-MC²'s chains on one GPU (``run_chains`` of
``daskmeans/seeding/afkmc2_chains.py``, the part of ``init="afk-mc2"`` after the proposals are
drawn) at P3 (randn 3e5 x 408, K = 5000, chains of 200): the wall time of the chains for
several blocks of chains and for the block the cost model chooses (``chain_block``), each in
iteration-times (one tf32 assignment with sums of the problem's rows against K centroids,
:mod:`.profile_init`'s), with the cost model's terms beside them. The proposals are drawn as
the init draws them (half by squared distance to a first row, half uniform), in float64 on the
GPU. Then the whole ``init="afk-mc2"`` of a fit on one GPU worker, by its Dask tasks' run
times (:mod:`.profile_init`'s): what the init spends besides the chains. For tuning; prints,
writes no file. The whole init as users run it: ``CUDA_VISIBLE_DEVICES=0 python -m benchmarks
command --problems p3afk,p3pp --warm-only``.

    python -m benchmarks profile-afk [P3]
"""

from __future__ import annotations

import time

from benchmarks import problems

SUMMARY = "AFK-MC²'s chains on one GPU at P3 by block size, in iteration-times"  # its line in --help

PROBLEMS = problems.pick("P3")
CHAIN = 200  # daskmeans.init.afkmc2-chain's default
BLOCKS = (8, 16, 24, 32, 48, 64)


def _proposals(X, k: int, m: int):
    """``(Xu, c1, chains, qu, u)`` as the init gives them to ``run_chains``: the distinct
    proposal rows (float64, on the GPU), the first centre, each chain's proposals as rows of
    ``Xu``, their probabilities and the uniforms (host)."""
    import cupy
    import numpy as np

    n = X.shape[0]
    c1 = X[0].astype(cupy.float64)
    d2 = ((X.astype(cupy.float64) - c1) ** 2).sum(axis=1)
    q = 0.5 * d2 / d2.sum() + 0.5 / n
    cdf = cupy.cumsum(q)
    rs = cupy.random.default_rng(1)
    prop = cupy.minimum(cupy.searchsorted(cdf, rs.random((k - 1) * m) * cdf[-1], side="right"), n - 1)
    uniq, inv = cupy.unique(prop, return_inverse=True)
    Xu = X[uniq].astype(cupy.float64)
    u = np.random.default_rng(2).random((k - 1, m - 1))
    return Xu, c1.get(), inv.reshape(k - 1, m).get(), q[uniq].get(), u


def profile(problem: problems.Problem) -> None:
    """Print the chains' wall time at ``problem``'s shape for each block size."""
    import cupy

    from benchmarks.profile_init import _iteration_s, _whole_init
    from daskmeans.seeding import afkmc2_chains as ac

    it = _iteration_s(problem)
    X, _ = problems.cupy_randn(problem)
    k, d, m = problem.k, problem.d, CHAIN
    Xu, c1, chains, qu, u = _proposals(X, k, m)
    del X
    cupy.get_default_memory_pool().free_all_blocks()
    U = Xu.shape[0]
    chosen = ac.chain_block(True, U, d, m)
    ac.run_chains(Xu[:4096], c1, chains[:8] % 4096, qu[:4096], u[:8], block=4)  # kernels loaded
    print(f"{problem.label}: one iteration {it:.4f} s; {U} distinct proposal rows of {(k - 1) * m}; "
          f"cost model's block {chosen}", flush=True)
    ref = ref_b = None
    for b in sorted(set(BLOCKS) | {chosen}):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        picks = ac.run_chains(Xu, c1, chains, qu, u, block=b)  # reads the picks back: synchronised
        s = time.perf_counter() - t0
        read_s = 0.77 * U * d * 8 / ac.GPU_BYTES_S + ac.GPU_BLOCK_LAUNCH_S
        model = k * max(read_s / b, b * m * d / (2 * ac.GPU_SM_FMA))  # the fold beside the chains
        # Against the first block timed (the chosen one where it is the smallest, not BLOCKS[0]).
        same = "" if ref is None else f", the same picks as block {ref_b}: {bool((picks == ref).all())}"
        if ref is None:
            ref, ref_b = picks, b
        print(f"  block {b:3d}{' (chosen)' if b == chosen else ''}: {s:.3f} s = {s / it:.1f} iterations "
              f"(model {model:.3f} s){same}", flush=True)
    Xu = chains = u = None  # the proposals' device memory back to the pool, for the fit's
    cupy.get_default_memory_pool().free_all_blocks()
    _whole_init(problem, it, "afk-mc2")


def main(argv=None):
    from benchmarks import meta

    meta.profile_main("profile-afk", __doc__, PROBLEMS, "P3", profile, argv)


if __name__ == "__main__":
    main()
