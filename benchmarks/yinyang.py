"""``python -m benchmarks yinyang``: Yinyang's loop against Lloyd's in the same run, the same
data, init and settings, and whether their results are bitwise equal (issue 46).

For each problem (``--problems``, of :mod:`benchmarks.problems`; randn rows of seed 0 written
once to a Zarr store under ``--data-dir``, drawn on the GPU where CuPy is there; init the
first K rows), the fit runs with ``algorithm="lloyd"`` and ``algorithm="yinyang"``
(``--order`` decides which first; a warm-up fit of 2 iterations per algorithm on the same data
first loads both steps' kernels and places the data), ``--iters`` iterations at ``tol=0``, at
``--precision``, through the Python API on one local cluster (the machine's GPUs, or its
cores). Per algorithm: the whole loop's time (the sum of the iterations' wall times, rank 0's),
the fit's wall time, the median iteration and per iteration the rows reassigned; then whether
the centroids, the labels, the iteration count and the history's statistics are bitwise equal
(``history_but_inertia`` without the inertia: the GPU's step inertia is per chunk, float
atomics, and ``history_inertia_max_rel_diff`` says how far it is; on the CPU ``history`` holds
with it) and the ratio of the loops (the acceptance: W18 at tf32, Yinyang's loop at most 0.6
of Lloyd's; P3 and P4 never slower).

    python -m benchmarks yinyang --problems W18,P3,P4 --precision tf32 --iters 20
        [--backend auto] [--data-dir /tmp] [--out benchmarks/results/yinyang_h200.json [--merge]]

The CPU figures of performance.md (2 cores): ``--problems C10 --precision fp32``, with
``--data blobs`` too.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from benchmarks import meta, problems

SUMMARY = "Yinyang's loop against Lloyd's, same run, bitwise check"  # its line in --help

LAYOUT = meta.Layout(rows={"results": ("problem", "precision", "data")})
STATS = ("iteration", "inertia", "shift", "reassigned", "n_empty", "imbalance", "n_moved")
ALLOWED = problems.pick("W18", "W16", "W14", "P3", "P4", "P2", "C10")


def _store(problem: problems.Problem, data_dir: str, data: str) -> str:
    """The problem's rows (seed 0) as Zarr, written once: randn, or ``blobs`` (scikit-learn's
    ``make_blobs`` with K centres, float32: clusters, where bounds certify most rows)."""
    path = os.path.join(data_dir, f"daskmeans-yinyang-{problem.name}-{data}.zarr")
    if not os.path.exists(path):
        if data == "blobs":
            import zarr
            from sklearn.datasets import make_blobs

            X = make_blobs(n_samples=problem.n, n_features=problem.d, centers=problem.k, random_state=0)[0]
            z = zarr.create_array(path, shape=X.shape, chunks=(problems.BLOCK_ROWS, problem.d), dtype=np.float32)
            z[:] = X.astype(np.float32)
            return path
        try:
            import cupy as xp
        except ImportError:
            xp = np
        problem.write_zarr(path, 0, xp=xp)
    return path


def _init(problem: problems.Problem, path: str) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(path, mode="r")[: problem.k], np.float64)


def main(argv=None):
    ap = meta.parser("yinyang", __doc__)
    ap.add_argument("--problems", default="W18,P3,P4", help=f"comma-separated, of {', '.join(ALLOWED)}")
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--order", choices=("lloyd-first", "yinyang-first"), default="lloyd-first")
    ap.add_argument("--data-dir", default="/tmp")
    ap.add_argument("--data", choices=("randn", "blobs"), default="randn",
                    help="the rows: the problem's randn (the issue's cases), or make_blobs with K centres")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "yinyang")
    chosen = meta.chosen(ap, args.problems, ALLOWED)

    import daskmeans
    from daskmeans.dask_cluster import api_client

    algorithms = ("lloyd", "yinyang") if args.order == "lloyd-first" else ("yinyang", "lloyd")
    res = {"benchmark": "yinyang", "date": meta.now(), "commit": meta.commit(), "device": meta.device_name(),
           "cores": os.cpu_count(), "iters": args.iters, "results": []}
    client = api_client(None, args.backend)  # the local cluster the command would start, kept for every fit
    for problem in chosen:
        path = _store(problem, args.data_dir, args.data)
        init = _init(problem, path)
        common = dict(init=init, n_init=1, tol=0, precision=args.precision, backend=args.backend, client=client)
        for alg in algorithms:  # warm-up: both steps' kernels compiled or loaded, the data placed
            daskmeans.KMeans(problem.k, max_iter=2, algorithm=alg, **common).fit(path)
        # Yinyang's bound kernels run only once few rows move: a small fit of its own loads them.
        from sklearn.datasets import make_blobs

        small = make_blobs(n_samples=20_000, n_features=problem.d, centers=16, random_state=1)[0].astype(np.float32)
        daskmeans.KMeans(16, init=small[:16].astype(np.float64), n_init=1, tol=0, max_iter=15, algorithm="yinyang",
                         precision=args.precision, backend=args.backend, client=client).fit(small)
        row = {"problem": problem.name, "n": problem.n, "d": problem.d, "k": problem.k,
               "precision": args.precision, "data": args.data}
        fits = {}
        for alg in algorithms:
            t0 = time.perf_counter()
            km = daskmeans.KMeans(problem.k, max_iter=args.iters, algorithm=alg, **common).fit(path)
            wall = time.perf_counter() - t0
            fits[alg] = km
            secs = [h["seconds"] for h in km.history_]
            row[alg] = {"loop_s": float(sum(secs)), "fit_wall_s": wall, "median_iter_s": float(np.median(secs)),
                        "iter_s": secs, "kernel_s": [h["kernel_seconds"] for h in km.history_],
                        "reassigned": [h["reassigned"] for h in km.history_],
                        "n_iter": km.n_iter_, "inertia": km.inertia_}
            print(problem.name, alg, json.dumps({k: v for k, v in row[alg].items() if k not in ("iter_s", "kernel_s")}),
                  flush=True)
        a, b = fits["lloyd"], fits["yinyang"]
        row["bitwise"] = {
            "centroids": bool(np.array_equal(a.cluster_centers_, b.cluster_centers_)),
            "labels": bool(np.array_equal(client.compute(a.labels_).result(), client.compute(b.labels_).result())),
            "n_iter": a.n_iter_ == b.n_iter_,
            "history": [[h[s] for s in STATS] for h in a.history_] == [[h[s] for s in STATS] for h in b.history_],
            # The history but its inertia: on a backend whose step inertia is per chunk (the
            # GPU's float atomics) the inertia is reproducible to ~1e-9, not bitwise.
            "history_but_inertia": [[h[s] for s in STATS if s != "inertia"] for h in a.history_]
            == [[h[s] for s in STATS if s != "inertia"] for h in b.history_],
            "inertia": a.inertia_ == b.inertia_,
        }
        row["history_inertia_max_rel_diff"] = max(
            (abs(ha["inertia"] - hb["inertia"]) / max(abs(ha["inertia"]), 1e-300)
             for ha, hb in zip(a.history_, b.history_)), default=0.0)
        row["yinyang_over_lloyd_loop"] = row["yinyang"]["loop_s"] / row["lloyd"]["loop_s"]
        print(problem.name, json.dumps({"bitwise": row["bitwise"], "ratio": row["yinyang_over_lloyd_loop"]}),
              flush=True)
        res["results"].append(row)
    meta.write(res, args.out, LAYOUT, args.merge)


if __name__ == "__main__":
    main()
