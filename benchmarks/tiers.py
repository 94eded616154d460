"""``python -m benchmarks tiers``: out-of-core tiers on one GPU, throughput of the ``host``
and ``storage`` tiers against their floors, measured in the same run.

- floor of the host tier: a pinned host-to-device copy (CuPy, 1 GiB, median of 5);
- floor of the storage tier: the Zarr store's read speed (every chunk read and decompressed
  by one thread, as the tier's read-ahead does, page cache as the run finds it);
- the fit (problem ``tiers``): data-bound K=16, D=64 with the data 3x the device budget
  (``device_memory_limit``), ``tol=0``, a few iterations; effective throughput = data bytes /
  median iteration time.
- optionally P4 (4e6 x 480, K=40000) in the device and host tiers (``--p4``);
- optionally the command under memory limits (``--limits``, problem ``limits``): ``daskmeans
  fit`` of a 7.7 GB Zarr (3e7 x 64 float32, K = 16) unlimited, with
  ``CUPY_GPU_MEMORY_LIMIT=3GiB`` and with ``--device-memory-limit 3GiB``: exit status, the tier
  printed, centroids bitwise those of the unlimited run.

    python -m benchmarks tiers [--gib 3] [--iters 4] [--p4] [--limits] [--skip-tiers] [--out r.json [--merge]]

The results have three parts, ``throughput``, ``p4`` and ``limits``, each with its commit and
date; ``--merge`` replaces the parts a run measured and keeps the others. Committed results:
``results/tiers_<device>.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks import meta, problems

SUMMARY = "host and storage tiers against the pinned copy and the store's read floors; P4 host vs device"  # its line in --help

LAYOUT = meta.Layout(parts=("throughput", "p4", "limits"), top_commit=False)


def h2d_pinned_gbs(nbytes: int = 2**30) -> float:
    import cupy
    import cupyx

    host = cupyx.empty_pinned((nbytes // 4,), np.float32)
    host[...] = 1.0
    dev = cupy.empty_like(host, shape=host.shape)
    ts = []
    for _ in range(6):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        dev.set(host)
        cupy.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t0)
    return nbytes / float(np.median(ts[1:])) / 1e9


def store_read_gbs(path: str) -> float:
    import zarr

    a = zarr.open_array(path, mode="r")
    rows = a.chunks[0]
    t0 = time.perf_counter()
    total = 0
    for s in range(0, a.shape[0], rows):
        total += np.asarray(a[s : s + rows]).nbytes
    return total / (time.perf_counter() - t0) / 1e9


def fit(path_or_x, k, init, iters, **kw):
    """A fit on the local cluster ``daskmeans fit`` starts (one GPU: an in-process worker)."""
    from daskmeans import KMeans
    from daskmeans.dask_cluster import connect

    with connect(backend="gpu") as c:
        km = KMeans(k, init=init, tol=0, max_iter=iters, client=c, **kw).fit(path_or_x)
    secs = [h["seconds"] for h in km.history_]
    return km, float(np.median(secs[1:])), secs


def tiers(problem: problems.Problem, tmp: str, iters: int) -> dict:
    """The host and storage tiers of a K=16, D=64 fit whose data is 3x the device budget."""
    import cupy

    n, d, k = problem.shape
    path = os.path.join(tmp, "x.zarr")
    z = problem.write_zarr(path, 0, rows=2**20, xp=cupy)
    init = z[:k].astype(np.float64)
    nbytes = n * d * 4
    budget = int(nbytes / 3)
    res = {"n": n, "d": d, "k": k, "data_bytes": nbytes, "device_budget": budget}
    res["h2d_pinned_GBps"] = h2d_pinned_gbs()
    res["store_read_GBps"] = store_read_gbs(path)
    km, it, secs = fit(path, k, init, iters, device_memory_limit=budget)
    res["host"] = {"tier": km.tier_, "iteration_s": it, "GBps": nbytes / it / 1e9, "iterations_s": secs,
                   "ratio_to_h2d_floor": nbytes / it / 1e9 / res["h2d_pinned_GBps"]}
    centers = km.cluster_centers_
    km, it, secs = fit(path, k, init, iters, device_memory_limit=budget, memory_limit=budget // 4)
    res["storage"] = {"tier": km.tier_, "iteration_s": it, "GBps": nbytes / it / 1e9, "iterations_s": secs,
                      "ratio_to_store_floor": nbytes / it / 1e9 / res["store_read_GBps"],
                      "bitwise_same_as_host_tier": bool(np.array_equal(km.cluster_centers_, centers))}
    print(json.dumps({k: v for k, v in res.items() if k not in ("host", "storage")}), flush=True)
    for t in ("host", "storage"):
        print(t, {k: v for k, v in res[t].items() if k != "iterations_s"}, flush=True)
    return res


def limits(tmp: str) -> dict:
    """``daskmeans fit`` of 3e7 x 64 float32 (7.7 GB) as Zarr, K = 16, 5 iterations: unlimited,
    under ``CUPY_GPU_MEMORY_LIMIT=3GiB``, and with ``--device-memory-limit 3GiB``."""
    import subprocess

    import zarr

    problem = problems.get("limits")
    n, d, k = problem.shape
    path = os.path.join(tmp, "big.zarr")
    z = problem.write_zarr(path, 2, rows=2**20)
    init = os.path.join(tmp, "big-init.npy")
    np.save(init, z[:k])
    out = {"n": n, "d": d, "k": k, "data_bytes": n * d * 4}
    ref = None
    for name, env, extra in (("unlimited", {}, []), ("CUPY_GPU_MEMORY_LIMIT=3GiB", {"CUPY_GPU_MEMORY_LIMIT": "3GiB"}, []),
                             ("--device-memory-limit 3GiB", {}, ["--device-memory-limit", "3GiB"])):
        model = os.path.join(tmp, f"model-{len(out)}.zarr")
        argv = ["daskmeans", "fit", path, "--k", str(k), "--init", init, "--max-iter", "5", "--tol", "0", "-q",
                "-o", model, *extra]
        t0 = time.perf_counter()
        p = subprocess.run(argv, env=dict(os.environ, **env), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        tier = [line for line in p.stderr.splitlines() if line.startswith("daskmeans: tier ")]
        entry = {"rc": p.returncode, "wall_s": wall, "tier_line": tier[0] if tier else None,
                 "traceback": "Traceback" in p.stderr, "stderr_tail": p.stderr[-400:] if p.returncode else ""}
        if p.returncode == 0:
            c = zarr.open_group(model, mode="r")["cluster_centers"][:]
            if ref is None:
                ref = c
            entry["bitwise_same_as_unlimited"] = bool(np.array_equal(c, ref))
        out[name] = entry
    return out


def main(argv=None):
    ap = meta.parser("tiers", __doc__)
    ap.add_argument("--gib", type=float, default=3.0, help="data size; the device budget is a third of it")
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--p4", action="store_true")
    ap.add_argument("--limits", action="store_true")
    ap.add_argument("--skip-tiers", action="store_true", help="only --p4 / --limits")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "tiers")
    import cupy

    problem = problems.get("tiers")
    problem = dataclasses.replace(problem, n=int(args.gib * 2**30 / (problem.d * 4)))
    tmp = tempfile.mkdtemp(prefix="daskmeans-tiers-")
    res = {"benchmark": "tiers", "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "date": meta.now(), "commit": meta.commit()}
    if not args.skip_tiers:
        res["throughput"] = tiers(problem, tmp, args.iters)
    if args.limits:
        res["limits"] = limits(tmp)
        print("limits", json.dumps(res["limits"]), flush=True)

    if args.p4:
        p4_problem = problems.get("P4")
        x4, init4 = p4_problem.data(seed=1)
        init4 = init4.astype(np.float64)
        p4 = {}
        for tier in ("device", "host"):
            km, it, secs = fit(x4, p4_problem.k, init4, 3, tier=tier)
            p4[tier] = {"tier": km.tier_, "iteration_s": it, "iterations_s": secs}
        p4["host_over_device"] = p4["host"]["iteration_s"] / p4["device"]["iteration_s"]
        res["p4"] = p4
        print("p4", p4, flush=True)
    meta.write(res, args.out, LAYOUT, args.merge)


if __name__ == "__main__":
    sys.exit(main())
