"""``python -m benchmarks hosts``: P3 on two simulated hosts of GPU workers, the Dask collective
against NCCL over sockets, measured in the same run.

The cluster is the multi-node tests' (``tests/multinode/hostkit.py``, :class:`GpuHosts`): a
``dask scheduler`` on 127.0.0.1 and ``dask worker`` processes listening on 127.0.0.2 and
127.0.0.3, one per GPU, 2 per host on a host with 4 GPUs or more (host i sees GPUs 2i and
2i + 1), else 1 per host; NCCL kept off NVLink and shared memory (``NCCL_P2P_DISABLE=1
NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo``), as between machines.

The data: P3 (300,000 x 408 float32 of :mod:`benchmarks.problems`, seed 0) and its init (the
first K rows) written as ``.npy`` to a temporary folder. Each fit is a whole ``daskmeans fit``
command through ``--scheduler-file`` (``--iters`` iterations, tol 0, ``--backend gpu``, the
collective of the variant), run with ``--timings``. Variants (``--variants``, the first is the
baseline of the ratios):

- ``nccl``: ``--collective nccl``, NCCL over sockets;
- ``dask``: ``--collective dask``: shared memory within a host, reduce-scatter and all-gather
  of each local rank's slice between the hosts;
- ``dask-comms``: ``--collective dask`` with ``daskmeans.collective-shared-memory`` off: every
  sum through Dask's comms.

Per precision (``--precisions``): ``--warmup`` untimed rounds of short fits of every variant
(kernels loaded, collectives opened once), then ``--repeats`` rounds of one fit of each
variant in turn (A B A B ...), so that every variant sees the same machine. Recorded per
variant: ``iteration_s``, the median over its fits' iterations (each fit's first, which loads
kernels and opens the collective, left out), ``kernel_s`` the same of the slowest rank's
kernel time, each fit's median and wall time; ``ratio_to_<baseline>``, its ``iteration_s``
over the baseline's; and ``bitwise_identical``, whether every fit of every variant wrote the
same centroids as the first.

``--cpu`` checks the harness, not the collectives: CPU workers (2 per host), the Dask
collective's variants only, with ``--rows`` and ``--k`` for a shape 2 cores fit in seconds;
its figures say nothing of GPUs.

    python -m benchmarks hosts [--precisions tf32,fp32] [--iters 20] [--repeats 3] [--out r.json [--merge]]

Committed results: ``results/hosts_<device kind>.json``, rows keyed by problem, precision,
backend and workers, each with its commit and date.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import meta, problems

SUMMARY = "P3 on two simulated hosts of GPU workers: the Dask collective against NCCL over sockets"  # its line in --help

LAYOUT = meta.Layout(rows={"results": ("problem", "precision", "backend", "workers")})
ROOT = Path(__file__).resolve().parents[1]

# variant: (--collective, the command's extra environment, what it is)
VARIANTS = {
    "nccl": ("nccl", {}, "NCCL over sockets"),
    "dask": ("dask", {}, "the Dask collective: shared memory within a host, reduce-scatter + all-gather between hosts"),
    "dask-comms": ("dask", {"DASK_DASKMEANS__COLLECTIVE_SHARED_MEMORY": "False"},
                   "the Dask collective through Dask's comms only"),
}
WARMUP_ITERS = 3


def _hostkit():
    """The multi-node tests' launcher (imported from ``tests/multinode``; it puts
    ``tests/faults`` on the path itself)."""
    here = str(ROOT / "tests" / "multinode")
    if here not in sys.path:
        sys.path.insert(0, here)
    import hostkit

    return hostkit


def write_data(folder: Path, rows: int | None, k: int | None) -> tuple[Path, Path, int, int, int]:
    """P3's rows (seed 0; its first ``rows`` where given) and init (the first K rows) as
    ``.npy`` in ``folder``: ``(data path, init path, n, d, k)``."""
    p = problems.get("P3")
    if rows is None:
        X, _ = p.data(0)
    else:  # the same generator's first rows: P3's own first rows
        _, X = next(p.randn_blocks(0, rows=min(rows, p.n)))
    k = p.k if k is None else k
    x_path, init_path = folder / "x.npy", folder / "init.npy"
    np.save(x_path, X)
    np.save(init_path, X[:k])
    return x_path, init_path, int(X.shape[0]), int(X.shape[1]), k


def run_fit(hostkit, cluster, argv: list[str], env: dict, cwd: Path, timeout: float) -> tuple[dict, np.ndarray]:
    """One ``daskmeans fit`` command through the cluster's scheduler file: its ``--timings``
    document and the centroids it wrote (the model and timings files removed)."""
    import daskmeans

    model, timings = cwd / "model.zarr", cwd / "timings.json"
    cmd = [sys.executable, "-m", "daskmeans", "fit", *argv, "-o", str(model), "--timings", str(timings),
           "--overwrite", "-q", "--scheduler-file", str(cluster.scheduler_file)]
    p = subprocess.Popen(cmd, cwd=cwd, env=hostkit.faultkit.environment(**env), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.perf_counter()
    rc, _, err = hostkit.faultkit.wait_process(p, timeout, cluster.client)
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}:\n{err[-3000:]}\n{cluster.logs()[-6000:]}")
    doc = json.loads(timings.read_text())
    doc["wall_s"] = wall
    centers = daskmeans.load(str(model)).cluster_centers_
    shutil.rmtree(model)
    timings.unlink()
    return doc, centers


def measure(hostkit, cluster, data: tuple, precision: str, variants: list[str], args, backend: str,
            cwd: Path) -> dict:
    """One precision's row: warm-up rounds, then ``repeats`` rounds of every variant in turn."""
    x_path, init_path, n, d, k = data
    base = [str(x_path), "--k", str(k), "--init", str(init_path), "--tol", "0", "--backend", backend,
            "--precision", precision]
    for _ in range(args.warmup):
        for v in variants:
            coll, env, _ = VARIANTS[v]
            run_fit(hostkit, cluster, [*base, "--max-iter", str(WARMUP_ITERS), "--collective", coll], env, cwd,
                    args.timeout)
    runs: dict[str, list] = {v: [] for v in variants}
    ref = None
    same = True
    for rep in range(args.repeats):
        for v in variants:
            coll, env, _ = VARIANTS[v]
            doc, centers = run_fit(hostkit, cluster, [*base, "--max-iter", str(args.iters), "--collective", coll],
                                   env, cwd, args.timeout)
            if ref is None:
                ref = centers
            bitwise = bool(centers.dtype == ref.dtype and np.array_equal(centers, ref))
            if doc["n_iter"] < 2:
                raise RuntimeError(f"the {v} fit stopped after {doc['n_iter']} iteration: no iteration to time "
                                   "past the first")
            same = same and bitwise
            its, kern = doc["iteration_seconds"][1:], doc["kernel_seconds"][1:]
            runs[v].append({
                "n_iter": doc["n_iter"], "wall_s": doc["wall_s"], "main_seconds": doc["main_seconds"],
                "median_iteration_s": statistics.median(its), "median_kernel_s": statistics.median(kern),
                "iteration_seconds": doc["iteration_seconds"], "kernel_seconds": doc["kernel_seconds"],
                "backend": doc["backend"], "tier": doc["tier"], "bitwise_same_as_first": bitwise,
            })
            last = runs[v][-1]
            print(f"P3 {precision} {v:10s} repeat {rep}: median iteration {last['median_iteration_s'] * 1e3:8.2f} ms"
                  f" (kernels {last['median_kernel_s'] * 1e3:.2f} ms), {doc['n_iter']} iterations, "
                  f"wall {doc['wall_s']:.1f} s, bitwise {bitwise}", flush=True)
    iteration_s = {v: statistics.median([t for r in runs[v] for t in r["iteration_seconds"][1:]]) for v in variants}
    kernel_s = {v: statistics.median([t for r in runs[v] for t in r["kernel_seconds"][1:]]) for v in variants}
    first = variants[0]
    row = {
        "problem": "P3", "n": n, "d": d, "k": k, "precision": precision, "backend": backend,
        "hosts": len(cluster.hosts), "workers_per_host": cluster.per_host, "workers": cluster.n,
        "iterations": args.iters, "repeats": args.repeats, "warmup_rounds": args.warmup,
        "order": [v for _ in range(args.repeats) for v in variants],
        "variants": {v: VARIANTS[v][2] for v in variants},
        "iteration_s": iteration_s, "kernel_s": kernel_s,
        f"ratio_to_{first}": {v: iteration_s[v] / iteration_s[first] for v in variants[1:]},
        "bitwise_identical": same, "runs": runs,
    }
    print(f"P3 {precision}: " + ", ".join(f"{v} {iteration_s[v] * 1e3:.2f} ms" for v in variants)
          + "".join(f"; {v}/{first} {r:.2f}" for v, r in row[f"ratio_to_{first}"].items())
          + f"; bitwise identical {same}", flush=True)
    return row


def main(argv=None):
    ap = meta.parser("hosts", __doc__)
    ap.add_argument("--precisions", default=None, help="comma-separated, of fp32, tf32 (default tf32,fp32; "
                    "with --cpu fp32)")
    ap.add_argument("--variants", default=None, help=f"comma-separated, of {', '.join(VARIANTS)}; the first is "
                    "the ratios' baseline (default nccl,dask; with --cpu dask,dask-comms)")
    ap.add_argument("--iters", type=int, default=20, help="iterations per timed fit (default 20)")
    ap.add_argument("--repeats", type=int, default=3, help="timed fits of each variant, alternated (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds of short fits first (default 1)")
    ap.add_argument("--per-host", type=int, default=None,
                    help="workers per simulated host (default: 2 on a host of 4 GPUs or more, else 1; --cpu 2)")
    ap.add_argument("--folder", default=None, help="where the temporary folder of the data, the models and the "
                    "cluster's files goes (removed after; default the system's)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one command may take (default 600)")
    ap.add_argument("--cpu", action="store_true", help="check the harness on CPU workers (not a measurement)")
    ap.add_argument("--rows", type=int, default=None, help="P3's first ROWS rows only (for --cpu)")
    ap.add_argument("--k", type=int, default=None, help="K other than P3's (for --cpu)")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "hosts")
    precisions = meta.names(ap, args.precisions or ("fp32" if args.cpu else "tf32,fp32"), ("fp32", "tf32"), "precision")
    variants = meta.names(ap, args.variants or ("dask,dask-comms" if args.cpu else "nccl,dask"), VARIANTS, "variant")
    if len(set(variants)) != len(variants):
        ap.error("--variants names a variant twice")
    if args.cpu and "nccl" in variants:
        ap.error("--cpu: NCCL needs GPU workers")
    if args.iters < 2 or args.repeats < 1 or args.warmup < 0:
        ap.error("--iters must be 2 or more (the first is left out), --repeats 1 or more, --warmup 0 or more")

    hostkit = _hostkit()
    if args.cpu:
        backend, device = "cpu", meta.device_name()
        per_host = args.per_host or 2
    else:
        from daskmeans.backends import gpu_count

        gpus = gpu_count()
        if gpus < 2:
            raise SystemExit(f"python -m benchmarks hosts: needs 2 GPUs or more (one per simulated host); "
                             f"this host has {gpus} (--cpu checks the harness on CPU workers)")
        per_host = args.per_host or (2 if gpus >= 4 else 1)
        if 2 * per_host > gpus:
            raise SystemExit(f"python -m benchmarks hosts: {per_host} GPU workers per host need {2 * per_host} GPUs; "
                             f"this host has {gpus}")
        import cupy

        backend = "gpu"
        device = f"{gpus} x " + cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()

    res = {"benchmark": "hosts", "device": device, "date": meta.now(), "commit": meta.commit(),
           "nccl_environment": None if args.cpu else hostkit.NCCL_SOCKETS, "results": []}
    work = Path(tempfile.mkdtemp(prefix="daskmeans-hosts-", dir=args.folder))
    cluster = None
    try:
        data = write_data(work, args.rows, args.k)
        print(f"data: {data[2]} x {data[3]} float32, K = {data[4]}, in {work}", flush=True)
        kind = hostkit.LoopbackHosts if args.cpu else hostkit.GpuHosts
        cluster = kind(work / "cluster", hostkit.HOSTS[:2], per_host=per_host)
        cluster.start()
        print(f"cluster: {cluster.n} {backend.upper()} workers on {', '.join(cluster.hosts)} "
              f"({per_host} each), scheduler {cluster.address}", flush=True)
        runs = work / "runs"
        runs.mkdir()
        for precision in precisions:
            res["results"].append(measure(hostkit, cluster, data, precision, variants, args, backend, runs))
            meta.write(dict(res), args.out, LAYOUT, args.merge)  # each precision kept as soon as it ran
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({**res, "results": [{k: v for k, v in r.items() if k != "runs"} for r in res["results"]]},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
