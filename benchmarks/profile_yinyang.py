"""``python -m benchmarks profile-yinyang``: Yinyang's step on one GPU in its pieces, beside
Lloyd's step on the same rows and centroids: the centroids' grouping, the setting of every
row's bounds (``assign_bounds``: Lloyd's labels, the centroids prepared in group order, the
group bounds from GEMM tiles, the upper bounds) and the probe's (every ``PROBE_STRIDE``-th
row's), then the next step's filter, its uncertain rows' share and their new bounds. The
centroids are the problem's rows after a few Lloyd steps (float64 updates), so that the
drift is that of a late step; the data randn (the
problem's) or ``--data blobs`` (K centres uniform in [-10, 10]^D, unit spread). Each piece
once cold (its first call in the process: where the kernel cache is empty, compilation
included) and as the median of repeats between device synchronisations. For planning the
GPU's Yinyang work; prints one JSON line per problem, writes no file.

    python -m benchmarks profile-yinyang [W18] [P3] [--data randn|blobs] [--precision tf32]
"""

from __future__ import annotations

import json
import time

from benchmarks import meta, problems

SUMMARY = "Yinyang's step on one GPU in pieces (grouping, bounds, filter) beside Lloyd's"  # its line in --help

PROBLEMS = problems.pick("P3", "P4", "W14", "W16", "W18")
LLOYD_STEPS = 3  # float64 Lloyd updates of the drawn rows before the pieces are timed


def _rows(problem: problems.Problem, data: str):
    """``(X, C)``: float32 rows on the GPU and K of them as float64 centroids."""
    import cupy

    if data == "randn":
        return problems.cupy_randn(problem)
    n, d, k = problem.shape
    rs = cupy.random.RandomState(0)
    X = rs.uniform(-10.0, 10.0, (k, d)).astype(cupy.float32)[rs.randint(0, k, n)]
    X += rs.standard_normal((n, d), dtype=cupy.float32)
    return X, X[rs.permutation(n)[:k]].astype(cupy.float64)


def _cold(fn):
    """Milliseconds of ``fn``'s first call, synchronised, and its result."""
    import cupy

    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    out = fn()
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - t0) * 1e3, out


def profile(problem: problems.Problem, data: str, precision: str) -> dict:
    """The pieces' times (ms) and shares at ``problem``'s shape; printed as one JSON line."""
    import cupy
    import numpy as np

    from daskmeans.backends import bounds, gpu_gemm
    from daskmeans.backends import cupy_backend as be
    from daskmeans.engine import yinyang
    from daskmeans.numerics.grid import Grid

    def timed(fn):
        return meta.synced_ms(fn, reps=5, warm=1)

    X, C = _rows(problem, data)
    n, d = X.shape
    k = C.shape[0]
    grid = Grid.for_block(X)
    for _ in range(LLOYD_STEPS):
        C = problems.lloyd_update(X, C, be.assign(X, be.prepare(C, np.float32, precision), want_sums=False)["labels"])
    p = be.prepare(C, np.float32, precision)
    r = {"problem": problem.name, "n": n, "d": d, "k": k, "data": data, "precision": precision,
         "regime": "small" if p.small is not None else ("fused" if p.fused is not None else "tiles")}
    r["lloyd_ms"] = timed(lambda: be.assign(X, p, grid=grid))
    t = bounds.n_groups(k)
    r["groups"] = t
    r["groups_cold_ms"], group_of = _cold(lambda: yinyang.centroid_groups(cupy, p.centroids, t))
    r["groups_ms"] = timed(lambda: yinyang.centroid_groups(cupy, p.centroids, t))
    xnorm = be.row_sqnorms(X)
    _, cmax = be.centroid_drift(p.centroids, p.centroids)
    r["reset_cold_ms"], (lab, up, lo) = _cold(lambda: be.assign_bounds(X, p, group_of, t, xnorm, cmax))
    r["reset_ms"] = timed(lambda: be.assign_bounds(X, p, group_of, t, xnorm, cmax))
    # The probe's share of it: every PROBE_STRIDE-th row, gathered (its fixed costs show here).
    xs = X[:: yinyang.PROBE_STRIDE].copy()
    xns = xnorm[:: yinyang.PROBE_STRIDE].copy()
    r["probe_rows"] = int(xs.shape[0])
    r["probe_bounds_ms"] = timed(lambda: be.assign_bounds(xs, p, group_of, t, xns, cmax))
    del xs, xns
    if p.small is None:  # the GEMM regime's pieces of the reset
        r["reset_labels_ms"] = timed(lambda: be.assign(X, p, want_sums=False))

        def grouped():
            be._GROUPED.pop(id(p), None)
            return be._grouped(p, group_of, t)

        r["grouped_prep_ms"] = timed(grouped)
        pg, starts, pos = be._grouped(p, group_of, t)
        own = pos[lab]
        lower = cupy.empty((n, t), cupy.float64)
        rel, delta = bounds.margins(d, np.float64)
        r["group_lower_ms"] = timed(lambda: gpu_gemm.group_lower(X, pg, starts, t, own, xnorm, cmax, lower, rel,
                                                                 delta))
        r["upper_ms"] = timed(lambda: bounds.upper_bounds(cupy, X, p.centroids, lab))
        del lower, own
    # The next step: the filter on the moved centroids, then the uncertain rows' bounds.
    p2 = be.prepare(problems.lloyd_update(X, C, lab), np.float32, precision)
    drift, gdrift, cmax2 = yinyang._drifts(be, p.centroids, p2.centroids, be.to_numpy(group_of), t)
    r["lloyd_next_ms"] = timed(lambda: be.assign(X, p2, grid=grid))

    def filtered():
        return be.yinyang_filter(X, p2, lab, up.copy(), lo.copy(), xnorm, drift, gdrift, cmax2)

    r["filter_with_copies_ms"] = timed(filtered)
    r["bound_copies_ms"] = timed(lambda: (up.copy(), lo.copy()))
    cand = filtered()
    r["uncertain"] = int(cand.shape[0]) / max(1, n)
    if cand.shape[0]:
        xu, xnu = X[cand], xnorm[cand]
        r["uncertain_bounds_cold_ms"], _ = _cold(lambda: be.assign_bounds(xu, p2, group_of, t, xnu, cmax2))
        r["uncertain_bounds_ms"] = timed(lambda: be.assign_bounds(xu, p2, group_of, t, xnu, cmax2))
    else:
        r["uncertain_bounds_ms"] = 0.0
    bounded = r["filter_with_copies_ms"] - r["bound_copies_ms"] + r["uncertain_bounds_ms"]
    r["bounded_over_lloyd"] = bounded / r["lloyd_next_ms"]
    r["reset_over_lloyd"] = r["reset_ms"] / r["lloyd_ms"]
    # An uncertain row's cost in Lloyd rows (cupy_backend's bounds_cost is a rule of this).
    r["uncertain_row_cost"] = (r["uncertain_bounds_ms"] / max(r["uncertain"], 1e-12)) / r["lloyd_next_ms"]
    print(json.dumps({key: (round(v, 4) if isinstance(v, float) else v) for key, v in r.items()}), flush=True)
    return r


def main(argv=None):
    ap = meta.parser("profile-yinyang", __doc__)
    meta.problems_arg(ap, PROBLEMS, "W18")
    ap.add_argument("--data", choices=("randn", "blobs"), default="randn")
    ap.add_argument("--precision", choices=("fp32", "tf32"), default="tf32")
    args = ap.parse_args(argv)
    for problem in meta.chosen(ap, args.problems):
        profile(problem, args.data, args.precision)


if __name__ == "__main__":
    main()
