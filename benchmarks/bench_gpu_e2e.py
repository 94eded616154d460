"""End-to-end GPU check: ``daskmeans fit`` on a one-GPU LocalCUDACluster (data resident on the
GPU after loading) against the kernel step alone, same data, same run.

Writes P3-shaped data (randn 3e5 x 408 float32, fresh) to Zarr and an init .npy (K = 5000 rows
of the data), runs the CLI in-process with ``--max-iter N --tol 0``, and reads the per-
iteration wall times from the model's history. The kernel step (``backends.cupy_backend.assign`` on
the whole array, already on the GPU) is timed in the same process beforehand. Reports the
median iteration wall time (iterations 2..N: the first one compiles nothing new but warms the
workers) and its ratio to the kernel step.

    python benchmarks/bench_gpu_e2e.py [--n 300000 --d 408 --k 5000] [--precision fp32] [--out r.json]

Committed result: ``results/gpu_end_to_end_<device>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import benchmeta
import numpy as np


def main(argv=None):
    import cupy
    import zarr

    from daskmeans.backends.grid import Grid
    from daskmeans.backends import get_backend
    from daskmeans.cli import main as cli

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--d", type=int, default=408)
    ap.add_argument("--k", type=int, default=5000)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    n, d, k = args.n, args.d, args.k
    tmp = tempfile.mkdtemp(prefix="daskmeans-e2e-")
    data, init, model = (os.path.join(tmp, f) for f in ("x.zarr", "init.npy", "m.zarr"))
    Xg = cupy.random.default_rng(int(time.time())).standard_normal((n, d), dtype=cupy.float32)
    X = cupy.asnumpy(Xg)
    z = zarr.create_array(data, shape=X.shape, chunks=(25_000, d), dtype=X.dtype)
    z[...] = X
    C = X[np.random.default_rng(0).choice(n, k, replace=False)].astype(np.float64)
    np.save(init, C)

    be = get_backend("cupy")
    prep = be.prepare(C, np.float32, args.precision)
    grid = Grid.for_block(Xg)  # a fit's grid: computed once, before the loop
    # The step as the engine runs it: its inertia read back (one synchronisation) every time.
    kernel = benchmeta.synced_ms(lambda: float(be.assign(Xg, prep, grid=grid)["inertia"]), reps=4, warm=2) / 1e3
    del Xg, prep
    cupy.get_default_memory_pool().free_all_blocks()

    rc = cli(["fit", data, "--k", str(k), "--init", init, "--max-iter", str(args.iters), "--tol", "0",
              "--backend", "gpu", "--precision", args.precision, "-o", model])
    if rc != 0:
        raise SystemExit(f"daskmeans fit exited {rc}")
    hist = zarr.open_group(model, mode="r").attrs["history"]
    secs = [h["seconds"] for h in hist]
    kern = [h["kernel_seconds"] for h in hist]
    it_wall = float(np.median(secs[1:]))
    commit = benchmeta.commit()
    res = {
        "benchmark": "gpu_end_to_end",
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "n": n, "d": d, "k": k, "precision": args.precision,
        "kernel_step_s": kernel,
        "iteration_wall_s": secs,
        "iteration_kernel_s": kern,
        "median_iteration_wall_s": it_wall,
        "ratio_iteration_vs_kernel_step": it_wall / kernel,
    }
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
