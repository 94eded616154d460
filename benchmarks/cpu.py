"""``python -m benchmarks cpu``: the CPU pipeline against scikit-learn and dask-ml, one run on
one machine.

1. Per-iteration time of daskmeans' NumPy path (a 2-worker, 1-thread-per-worker LocalCluster,
   i.e. all of a 2-core machine) on problem ``cpu`` (1e6 x 100 float32) with K=4 and K=256, against
   scikit-learn's Lloyd (all cores) per iteration, same data and initial centroids.
2. Whole-fit time against dask-ml's KMeans (same data, same init, same max_iter, tol=0).
3. Orchestration overhead: iteration wall time minus kernel time (the slowest shard's time
   inside the backend kernels) with the data in 1000 chunks on the 2-worker LocalCluster.

Fresh random data (standard normal) per run; iteration times are medians after the first.
Both libraries first fit a small array once on the same cluster (imports and compiled
kernels loaded in the workers, as in any session after its first fit); each whole-fit time
is the median of ``--repeats`` fits from the same init.

    python -m benchmarks cpu [--n N] [--d D] [--ks 4,256] [--iters 10] [--no-dask-ml] [--repeats 3]
        [--out benchmarks/results/cpu_<cores>core.json [--merge]]

Rows are keyed by K, each with its commit and date; the ``overhead`` part is replaced by each run.
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

from benchmarks import meta, problems

SUMMARY = "the CPU kernels against scikit-learn and dask-ml on 2 cores"  # its line in --help

LAYOUT = meta.Layout(rows={"results": ("k",)}, parts=("overhead",))


def main(argv=None):
    problem = problems.get("cpu")
    ap = meta.parser("cpu", __doc__)
    ap.add_argument("--n", type=int, default=problem.n)
    ap.add_argument("--d", type=int, default=problem.d)
    ap.add_argument("--ks", default=f"4,{problem.k}", help="comma-separated K values")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-dask-ml", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "cpu_pipeline")
    import dask.array as da
    from distributed import Client, LocalCluster, wait
    from sklearn.cluster import KMeans as SKKMeans

    import daskmeans
    from daskmeans.io.readers import rows_per_chunk

    rng = np.random.default_rng(int(time.time()))
    X = rng.standard_normal((args.n, args.d), dtype=np.float32)
    res = {"benchmark": "cpu_pipeline", "date": meta.now(),
           "commit": meta.commit(), "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "n": args.n, "d": args.d, "max_iter": args.iters, "repeats": args.repeats, "results": []}
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as lc, Client(lc) as client:
        Xd = da.from_array(X, chunks=(rows_per_chunk(args.d, 4), args.d)).persist()
        wait(Xd)
        # Warm-up on a small array: worker imports, compiled kernels, first-task costs.
        Xw = da.from_array(X[:20_000], chunks=(5_000, args.d))
        daskmeans.KMeans(4, init=X[:4].astype(np.float64), max_iter=2, client=client).fit(Xw)
        if not args.no_dask_ml:
            from dask_ml.cluster import KMeans as DMKMeans

            DMKMeans(n_clusters=4, init=X[:4].astype(np.float64), max_iter=2, random_state=0).fit(Xw)
        for k in [int(s) for s in args.ks.split(",")]:
            init = X[rng.choice(args.n, k, replace=False)].astype(np.float64)
            r = {"k": k}
            t0 = time.perf_counter()
            sk = SKKMeans(k, init=init, n_init=1, max_iter=args.iters, tol=0, algorithm="lloyd").fit(X)
            r["sklearn_fit_s"] = time.perf_counter() - t0
            r["sklearn_iter_s"] = r["sklearn_fit_s"] / sk.n_iter_
            fits = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                km = daskmeans.KMeans(k, init=init, max_iter=args.iters, tol=0, client=client).fit(Xd)
                fits.append(time.perf_counter() - t0)
            r["daskmeans_fit_s"] = float(np.median(fits))
            r["daskmeans_fit_s_all"] = fits
            hist = km.history_[1:] or km.history_
            r["daskmeans_iter_s"] = float(np.median([h["seconds"] for h in hist]))
            r["daskmeans_n_iter"] = km.n_iter_
            r["ratio_iter_vs_sklearn"] = r["daskmeans_iter_s"] / r["sklearn_iter_s"]
            r["labels_equal_sklearn"] = float((km.labels_.compute() == sk.labels_).mean())
            if not args.no_dask_ml:
                fits = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    dm = DMKMeans(n_clusters=k, init=init, max_iter=args.iters, tol=0, random_state=0).fit(Xd)
                    fits.append(time.perf_counter() - t0)
                r["dask_ml_fit_s"] = float(np.median(fits))
                r["dask_ml_fit_s_all"] = fits
                r["dask_ml_n_iter"] = int(dm.n_iter_)
                r["speedup_fit_vs_dask_ml"] = r["dask_ml_fit_s"] / r["daskmeans_fit_s"]
            res["results"].append(r)
            print(json.dumps(r), flush=True)
        # Orchestration overhead with 1000 chunks.
        X1000 = da.from_array(X, chunks=(args.n // 1000, args.d)).persist()
        init = X[:4].astype(np.float64)
        km = daskmeans.KMeans(4, init=init, max_iter=args.iters + 5, tol=0, client=client).fit(X1000)
        hist = km.history_[1:]
        wall = np.array([h["seconds"] for h in hist])
        kern = np.array([h["kernel_seconds"] for h in hist])
        res["overhead"] = {
            "chunks": int(X1000.numblocks[0]), "workers": 2, "iterations": len(hist),
            "median_wall_s": float(np.median(wall)), "median_kernel_s": float(np.median(kern)),
            "median_overhead_ms": float(np.median(wall - kern) * 1e3),
        }
        print(json.dumps(res["overhead"]), flush=True)
    meta.write(res, args.out, LAYOUT, args.merge)


if __name__ == "__main__":
    main()
