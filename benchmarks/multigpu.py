"""``python -m benchmarks multigpu``: the multi-GPU data plane, P3 and P4 on 1 and 2 GPUs
(more where the host has them) in one run.

For each GPU count a ``LocalCUDACluster`` over the first N GPUs; the data are generated on the
workers chunk by chunk (the same bits whatever N: each chunk's generator is seeded by its
index), placed once, and the engine's loop (:func:`daskmeans.engine.lloyd.run_lloyd`) runs a
fixed number of iterations (``tol=0``) from the first K rows. Recorded per configuration:

- ``iteration_s``: median wall time of an iteration on rank 0 (assign, collective, update);
- ``loop_wall_per_iteration_s``: the loop's wall time as the client sees it (segments' round
  trips included) over its iterations plus one (the final E-step counted as one);
- ``kernel_s``: median over iterations of the slowest rank's kernel time (on a GPU, CUDA
  events from the iteration's start to its last assign kernel);
- ``orchestration_s``: median over iterations of the iteration's time minus its kernel time
  (collective, statistics, update; per iteration, so that the kernels' own spread, ~1 ms in a
  1 s iteration, does not enter), and its parts ``collective_s`` (the all-reduce) and
  ``update_s`` (the centroid update and the shift, after the all-reduce);
- the speed-up over 1 GPU, and whether the centroids are bitwise those of 1 GPU in the
  generated chunking (for every GPU count, collective and, with ``--chunkings``, chunking);
- ``init_s``: the default init (k-means||, seed 0) on the placed data, timed after the loop's
  warm-up and after a first init (``init_first_s``, which loads the init's kernels), and
  ``init_iteration_times``, the same over ``iteration_s`` (``--no-init`` skips it).

With ``--refit N`` (issue 45's notebook line) the run also fits P3 ``N`` times through the
public API (``KMeans(...).fit``, first-K init, 20 iterations, ``tol=0``) on one client of the
most GPUs, twice over: with the rows as a NumPy array held by the notebook and as a Dask array
persisted on the workers. Each fit's cost beyond its init and iterations (its wall time minus
``timings_``'s ``init`` and ``iterations``) is recorded; the fits after the first are the
re-fits (the ``refit`` part; target: at most 0.3 s on 2 GPUs).

    python -m benchmarks multigpu [--problems P3,P4] [--gpus 1,2] [--iters 5] [--dask-collective]
        [--chunkings split,irregular] [--refit 3] [--out r.json [--merge]]

Committed results: ``results/multigpu_<device>x<gpus>.json``, rows keyed by problem,
precision, GPU count, collective and chunking, each with its commit and date.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from benchmarks import meta, problems

SUMMARY = "P3 and P4 per iteration on 1 and 2 (or more) GPUs, NCCL and Dask collectives"  # its line in --help

PROBLEMS = problems.pick("P3", "P4")
LAYOUT = meta.Layout(rows={"results": ("problem", "precision", "gpus", "collective", "chunking")}, parts=("refit",))


def _gen(block_info=None, d=0):
    """One chunk of standard normal rows, seeded by the chunk's index (the workers import this
    module to run it)."""
    import cupy

    (r0, r1), _ = block_info[None]["array-location"]
    i = block_info[None]["chunk-location"][0]
    return cupy.random.default_rng(1000 + i).standard_normal((r1 - r0, d), dtype=cupy.float32)


def _data(n, d, n_chunks):
    import cupy
    import dask.array as da

    rows = -(-n // n_chunks)
    return da.map_blocks(_gen, d=d, chunks=((rows,) * (n // rows) + ((n % rows,) if n % rows else ()), (d,)),
                         dtype=np.float32, meta=cupy.empty((0, 0), np.float32))


def _chunked(X, chunking):
    """The same data (generated in X's chunks) in another chunking: ``default`` as generated,
    ``split`` twice as many chunks, ``irregular`` three unequal ones."""
    n = X.shape[0]
    if chunking == "split":
        return X.rechunk({0: -(-X.chunks[0][0] // 2)})
    if chunking == "irregular":
        a = n // 5 + 12_345
        return X.rechunk({0: (a, n // 2 - 777, n - a - (n // 2 - 777))})
    return X


def run_one(n_gpus, problem, precision, iters, collective, chunking="default", time_init=True):
    import dask
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from daskmeans.numerics.grid import Grid
    from daskmeans.engine.collective import choose_collective
    from daskmeans.engine.lloyd import run_lloyd
    from daskmeans.params import KMeansParams, RunParams
    from daskmeans.engine.moments import data_moments
    from daskmeans.engine.placement import place

    n, d, k = PROBLEMS[problem].shape
    devices = ",".join(str(i) for i in range(n_gpus))
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, dashboard_address=":0") as lc, Client(lc) as c:
        # Chunked as a fit on GPU workers reads a file (daskmeans.gpu-chunk-bytes: engine/plan.py).
        from daskmeans import config
        from daskmeans.io.readers import rows_per_chunk

        X = _chunked(_data(n, d, -(-n // rows_per_chunk(d, 4, config.get_bytes("gpu-chunk-bytes")))), chunking)
        t0 = time.perf_counter()
        p = place(c, X, "cupy")
        t_place = time.perf_counter() - t0
        init = X[:k].compute().get().astype(np.float64)
        mom = data_moments(c, p)
        grid = Grid(mom["max_abs"], mom["weight"])
        kind = choose_collective(c, p, collective)
        out = {}
        for rep in ("warm", "timed"):
            t0 = time.perf_counter()
            with dask.config.set({"daskmeans.segment-seconds": 1.0}):
                res = run_lloyd(c, p, init, KMeansParams(max_iter=iters if rep == "timed" else 2, precision=precision),
                                RunParams(collective=collective), tol_abs=0.0, grid=grid)
            wall = time.perf_counter() - t0
            out[rep] = (res, wall)
        res, wall = out["timed"]
        init_s = init_first_s = None
        if time_init:
            from daskmeans.seeding import resolve_init

            times = []
            for _ in range(2):  # the first loads (or compiles) the init's kernels
                t0 = time.perf_counter()
                resolve_init(c, p, "k-means||", k, 0)
                times.append(time.perf_counter() - t0)
            init_first_s, init_s = times
        hist = res.history
        it_s = float(np.median([h["seconds"] for h in hist[1:]]))
        kern = float(np.median([h["kernel_seconds"] for h in hist[1:]]))
        orch = float(np.median([h["seconds"] - h["kernel_seconds"] for h in hist[1:]]))
        coll = float(np.median([h["collective_seconds"] for h in hist[1:]]))
        upd = float(np.median([h["update_seconds"] for h in hist[1:]]))
        return {
            "gpus": n_gpus, "problem": problem, "n": n, "d": d, "k": k, "precision": precision,
            "collective": kind, "chunking": chunking, "chunks": len(p.row_chunks), "iterations": len(hist), "placement_s": t_place,
            "loop_wall_s": wall, "loop_wall_per_iteration_s": wall / (len(hist) + 1), "iteration_s": it_s, "kernel_s": kern, "orchestration_s": orch,
            "collective_s": coll, "update_s": upd, "max_empty_clusters": max(h["n_empty"] for h in hist),
            "iteration_wall_s": [h["seconds"] for h in hist], "kernel_wall_s": [h["kernel_seconds"] for h in hist],
            "init_s": init_s, "init_first_s": init_first_s,
            "init_iteration_times": None if init_s is None else init_s / it_s,
        }, res.centroids


def refit(n_gpus: int, fits: int) -> dict:
    """P3 fitted ``fits`` times through the public API on one client of ``n_gpus`` GPUs, from a
    NumPy array and from a persisted Dask array: each fit's wall time and its cost beyond its
    init and iterations (``timings_``)."""
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client, wait

    from daskmeans import KMeans

    problem = problems.get("P3")
    X, C = problem.data(seed=0)
    out = {"gpus": n_gpus, "problem": "P3", "fits": fits, "date": meta.now(), "commit": meta.commit()}
    devices = ",".join(str(i) for i in range(n_gpus))
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, dashboard_address=":0") as lc, Client(lc) as c:
        Xd = da.from_array(X, chunks=(-(-X.shape[0] // (4 * n_gpus)), X.shape[1])).persist()
        wait(Xd)
        for kind, data in (("numpy", X), ("dask", Xd)):
            walls, beyond = [], []
            for _ in range(fits):
                km = KMeans(problem.k, init=C, max_iter=20, tol=0.0, client=c)
                t0 = time.perf_counter()
                km.fit(data)
                wall = time.perf_counter() - t0
                walls.append(wall)
                beyond.append(wall - km.timings_.get("init", 0.0) - km.timings_["iterations"])
            out[kind] = {"wall_s": walls, "beyond_init_and_iterations_s": beyond,
                         "refit_beyond_s": float(np.median(beyond[1:])) if fits > 1 else None}
            print(f"refit {n_gpus} GPUs {kind}: walls {[round(w, 3) for w in walls]} s, beyond init and iterations "
                  f"{[round(b, 3) for b in beyond]} s", flush=True)
    return out


def main(argv=None):
    ap = meta.parser("multigpu", __doc__)
    ap.add_argument("--problems", default="P3,P4", help=f"comma-separated, of {', '.join(PROBLEMS)}")
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--precisions", default="fp32,tf32")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--dask-collective", action="store_true", help="also time the Dask collective on the most GPUs")
    ap.add_argument("--chunkings", default="", help="also run 1 GPU in these chunkings (split, irregular)")
    ap.add_argument("--no-init", action="store_true", help="do not time the k-means|| init")
    ap.add_argument("--refit", type=int, default=0, metavar="N",
                    help="also fit P3 N times through the API on one client of the most GPUs (re-fits' cost)")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "multigpu")
    chosen = meta.chosen(ap, args.problems, PROBLEMS) if args.problems else []  # '' with --refit: re-fits alone
    import cupy

    gpus = [int(g) for g in args.gpus.split(",") if int(g) <= cupy.cuda.runtime.getDeviceCount()]
    rows = []
    for problem in (p.name for p in chosen):
        for precision in args.precisions.split(","):
            ref = None
            base = None
            configs = [(g, "auto", "default") for g in gpus]
            if args.dask_collective and max(gpus) > 1:
                configs.append((max(gpus), "dask", "default"))
            configs += [(1, "auto", c) for c in args.chunkings.split(",") if c]
            for g, coll, chunking in configs:
                row, cen = run_one(g, problem, precision, args.iters, coll, chunking,
                                   time_init=not args.no_init and coll == "auto" and chunking == "default")
                if ref is None:
                    ref, base = cen, row["iteration_s"]
                row["bitwise_same_as_1_gpu"] = bool(np.array_equal(cen, ref))
                row["speedup_vs_1_gpu"] = base / row["iteration_s"]
                rows.append(row)
                print(f"{problem} {precision} {g} GPU {row['collective']:6s} {chunking:9s} {row['chunks']:3d} chunks iteration {row['iteration_s'] * 1e3:9.2f} ms "
                      f"kernel {row['kernel_s'] * 1e3:9.2f} ms orchestration {row['orchestration_s'] * 1e3:7.2f} ms "
                      f"(collective {row['collective_s'] * 1e3:.2f}, update {row['update_s'] * 1e3:.2f}, "
                      f"empty {row['max_empty_clusters']}) "
                      f"speed-up {row['speedup_vs_1_gpu']:.2f} bitwise {row['bitwise_same_as_1_gpu']}"
                      + (f" init {row['init_s']:.2f} s = {row['init_iteration_times']:.2f} iterations" if row["init_s"] else ""),
                      flush=True)
    res = {
        "benchmark": "multigpu",
        "device": f"{len(gpus) and cupy.cuda.runtime.getDeviceCount()} x "
                  + cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "date": meta.now(),
        "commit": meta.commit(),
        "results": rows,
    }
    if args.refit:
        res["refit"] = refit(max(gpus), args.refit)
    meta.write(res, args.out, LAYOUT, args.merge)


if __name__ == "__main__":
    sys.exit(main())
