"""``python -m benchmarks command``: ``daskmeans fit`` timed as users run it (a subprocess,
wall clock), next to the sum of its kernel steps and scikit-learn's whole script on the same
host, in one run.

Each problem's data is written once (fresh, seeded) to a file; then, alternating with the
reference script, the command runs ``--repeats`` times with a warm kernel cache and once with
an empty one (CuPy's and Numba's caches pointed at a new folder). The warm cache is filled by a
first run of the command, and is warm once the kernel warm-up processes that run started have
ended (they outlive a short command: ``warm_up_after_fill_s`` is how long they went on). The command's own
``--timings`` file gives the breakdown: process start and exit (wall minus the command's
main()), imports, reading, cluster start, placement, data moments, init, iterations (the first
iteration's excess over the median one is the kernels' compile or load), outputs, close; and
``read_ahead``, whether a CSV file's rows were parsed ahead while the command started
(``daskmeans.csv-read-ahead``).

Runs (``--problems``, comma-separated), each a problem of :mod:`benchmarks.problems` with its
data (seed 0) in a file format and the command's options:

- ``p1``: P1 (scikit-learn's ``make_classification``) from ``.npy``, init rows 1, 3, 6, 8,
  tol 1e-4;
- ``p1csv``: the same rows as ``pyarrow.csv.write_csv`` writes them (a quoted header ``"f0"``..., each
  value's shortest text: 1.09 GB), issue 44's file;
- ``blobs``: 2-D blobs, k-means++ init, up to 300 iterations, tol 0;
- ``randn1k``: init the first K rows, 10 iterations;
- ``p3``: P3, init the first K rows, 20 iterations;
- ``p4``: P4, init the first K rows, 3 iterations;
- ``p4init``: P4 from ``.npy``, the default init, 2 iterations, seed 0 (issue 45: with ``--gpus
  1,2``, the whole command and its init on 2 GPUs against 1);
- ``p4zarr``: P4 as Zarr, the default init (k-means||), 3 iterations: the init's cost in
  iteration-times (``init_iteration_times``: the init phase over the median iteration);
- ``w14``: W14 (2e6 x 128, K = 2^14), the default init, tf32, 5 iterations: a first fit's
  compiles (``cold_wall_s`` against ``wall_s``: at most 2 s more is the target);
- ``w16``, ``w18``: W16 and W18 (2e6 x 128, K = 2^16 and 2^18), as ``w14``: with it, the
  default init at wide K in iteration-times (``init_iteration_times``; issue 46's target: at
  most 5 each, warm cache, one GPU: ``--warm-only``, ``CUDA_VISIBLE_DEVICES=0``).

- ``p3afk``, ``p3pp``: P3 with ``--init afk-mc2`` and with ``--init k-means++``, tf32, 20
  iterations, seed 0: AFK-MC²'s init in iteration-times (``init_iteration_times``; issue 46's
  target: at most 3, warm cache, one GPU) beside k-means++'s.

- ``w18ll``, ``w18yy``, ``p3ll``, ``p3yy``, ``p4ll``, ``p4yy``: W18, P3 and P4 with
  ``--algorithm lloyd`` and ``--algorithm yinyang``, the default init, tf32, 20 iterations,
  tol 0, seed 0: Yinyang's whole command and its iterations' phase beside Lloyd's (issue 46:
  its loop at most 0.6 of Lloyd's at W18, never slower at P3 and P4; one GPU).

The reference (p1, p1csv, blobs) is a Python script doing what the command does: start,
import scikit-learn, load the file (``np.load``; pandas for the CSV), fit from the same init.

The out-of-core tiers' runs (issue 44): ``storage16`` and ``host16``, a 7.7 GB Zarr (3e7 x 64
float32 randn, K = 16), the default init in the ``storage`` and ``host`` tiers, 5 iterations,
seed 0: the init's cost in iteration-times (``init_iteration_times``) where each pass reads
the data (one GPU: ``CUDA_VISIBLE_DEVICES=0``).

With ``--gpus 1,2`` each run's command is timed with ``CUDA_VISIBLE_DEVICES`` set to the first
1 and then 2 GPUs, alternating within each repeat (the local cluster starts a worker per GPU);
the entries are then keyed ``<run>-<n>gpu`` and record ``gpus``, and those past the first count
record ``wall_over_first`` and ``init_over_first`` (issue 45: P3's whole command on 2 GPUs at
most 1.1x of 1 GPU's; P4's ``p4init`` at most 0.7x, its init at most 0.65x). An item ``N:KIND``
runs N GPUs with ``DASK_DASKMEANS__LOCAL_CLUSTER=KIND`` (``threads``: a worker per GPU in the
command's process, the default; ``processes``: a worker process per GPU), keyed
``<run>-<N>gpu-KIND``: ``--gpus 1,2,2:processes``.

With ``--api``, P1 is also fitted through the Python API on an open local cluster, the array
in memory, against scikit-learn's fit of the same array.

    python -m benchmarks command --problems p1,blobs [--repeats 3] [--api] [--warm-only] [--gpus 1,2] [--out r.json [--merge]]
    python -m benchmarks command --problems p3,p4init --gpus 1,2 --repeats 3 --warm-only
    CUDA_VISIBLE_DEVICES=0 python -m benchmarks command --problems w14,w16,w18 --repeats 3 --warm-only
    CUDA_VISIBLE_DEVICES=0 python -m benchmarks command --problems p3afk,p3pp --repeats 3 --warm-only

Committed results: ``results/command_<device>.json`` (``command_cpu_<cores>core.json`` on a
CPU host), entries keyed by run, each with its commit and date.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import meta, problems

SUMMARY = "whole `daskmeans fit` commands (warm and cold kernel cache) against scikit-learn's script"  # its line in --help


def _spec(name: str, **kw) -> dict:
    p = problems.get(name)
    return dict(problem=p, n=p.n, d=p.d, k=p.k, **kw)


# Run name: the problem, its file format, the command's options, whether scikit-learn's script runs too.
PROBLEMS = {
    "p1": _spec("P1", fmt="npy", args=["--tol", "1e-4"], sk=True),
    "p1csv": _spec("P1", fmt="csv", args=["--tol", "1e-4"], sk=True),
    "blobs": _spec("blobs", fmt="npy", args=["--init", "k-means++", "--seed", "0", "--max-iter", "300", "--tol", "0"], sk=True),
    "randn1k": _spec("randn1k", fmt="npy", args=["--max-iter", "10", "--tol", "0"], sk=False),
    "p3": _spec("P3", fmt="npy", args=["--max-iter", "20", "--tol", "0"], sk=False),
    "p4": _spec("P4", fmt="npy", args=["--max-iter", "3", "--tol", "0"], sk=False),
    "p4zarr": _spec("P4", fmt="zarr", args=["--max-iter", "3", "--tol", "0"], sk=False, own_init=True),
    # Issue 45's short P4 fit: the default init (k-means||) and two iterations.
    "p4init": _spec("P4", fmt="npy", args=["--max-iter", "2", "--tol", "0", "--seed", "0"], sk=False, own_init=True),
}
# The default init at wide K (issue 46): tf32, 5 iterations, seed 0.
PROBLEMS.update({
    name.lower(): _spec(name, fmt="npy", args=["--precision", "tf32", "--seed", "0", "--max-iter", "5", "--tol", "0"],
                        sk=False, own_init=True)
    for name in ("W14", "W16", "W18")
})
# AFK-MC² at P3 (issue 46), beside k-means++: tf32, 20 iterations, seed 0.
PROBLEMS.update({
    f"p3{tag}": _spec("P3", fmt="npy", args=["--init", init, "--precision", "tf32", "--seed", "0", "--max-iter", "20",
                                             "--tol", "0"], sk=False, own_init=True)
    for tag, init in (("afk", "afk-mc2"), ("pp", "k-means++"))
})
# Yinyang against Lloyd's loop in whole commands (issue 46): tf32, 20 iterations, tol 0, seed 0.
PROBLEMS.update({
    f"{name.lower()}{tag}": _spec(name, fmt="npy", args=["--algorithm", algorithm, "--precision", "tf32", "--seed", "0",
                                                        "--max-iter", "20", "--tol", "0"], sk=False, own_init=True)
    for name in ("W18", "P3", "P4") for tag, algorithm in (("ll", "lloyd"), ("yy", "yinyang"))
})
LAYOUT = meta.Layout(entries=("problems",), parts=("api_p1",))

# The out-of-core tiers' runs (issue 44): the default init in the tiers that read the data each pass.
PROBLEMS.update({
    f"{tier}16": _spec("limits", fmt="zarr", args=["--tier", tier, "--max-iter", "5", "--tol", "0", "--seed", "0"],
                       sk=False, own_init=True)
    for tier in ("storage", "host")
})

SKLEARN = """
import sys
import numpy as np
from sklearn.cluster import KMeans
path, init, k, max_iter, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
if path.endswith(".csv"):
    import pandas as pd
    X = pd.read_csv(path, dtype=np.float32, engine="pyarrow").to_numpy()
else:
    X = np.load(path)
C = np.load(init) if init.endswith(".npy") else init
KMeans(k, init=C, n_init=1, max_iter=max_iter, tol=tol, random_state=0).fit(X)
"""


def make_data(name: str, spec: dict, folder: str) -> tuple[str, str | None]:
    """The problem's data file and its init (.npy of centroids, or None for the command's own)."""
    path = os.path.join(folder, f"{name}.{spec['fmt']}")
    if spec["fmt"] == "zarr":
        _write_zarr(spec["problem"], path)
        return path, None
    X, init = spec["problem"].data(seed=0)
    if spec.get("own_init"):
        init = None
    if spec["fmt"] == "csv":
        _write_csv(path, X)
    else:
        np.save(path, X)
    ipath = None
    if init is not None:
        ipath = os.path.join(folder, f"{name}-init.npy")
        np.save(ipath, init)
    return path, ipath


def _write_csv(path: str, X: np.ndarray) -> None:
    """``X`` as ``pyarrow.csv.write_csv`` writes a table of float32 columns ``f0``, ``f1``, ...
    (the issue's P1 file: a quoted header, each value's shortest text that reads back exactly)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    pcsv.write_csv(pa.table({f"f{j}": X[:, j] for j in range(X.shape[1])}), path)


def _write_zarr(problem: problems.Problem, path: str) -> None:
    """The problem's randn rows (seed 0; drawn on the GPU where there is one) as a Zarr array."""
    try:
        import cupy as xp
    except ImportError:
        xp = np
    problem.write_zarr(path, 0, rows=problems.BLOCK_ROWS // 8, xp=xp)


def run_command(path: str, ipath: str | None, spec: dict, folder: str, cache: str, gpus: int | None = None,
                local_cluster: str | None = None) -> dict:
    out, timings = os.path.join(folder, "model.zarr"), os.path.join(folder, "timings.json")
    argv = ["daskmeans", "fit", path, "--k", str(spec["k"]), "-o", out, "--overwrite", "-q", "--timings", timings,
            *(["--init", ipath] if ipath else []), *spec["args"]]
    env = dict(os.environ, CUPY_CACHE_DIR=os.path.join(cache, "cupy"), NUMBA_CACHE_DIR=os.path.join(cache, "numba"))
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    if local_cluster is not None:
        env["DASK_DASKMEANS__LOCAL_CLUSTER"] = local_cluster
    started_at = time.time()
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr[-2000:]}")
    with open(timings) as f:
        t = json.load(f)
    its = t["iteration_seconds"]
    med = statistics.median(its)
    phases = {"process start and exit": wall - t["main_seconds"], **t["phases"]}
    if its:  # the first iteration's excess: kernels compiled (empty cache) or loaded
        phases["fit iterations"] -= its[0] - med
        phases["first iteration's excess (compile, load)"] = its[0] - med
    return {"wall_s": wall, "phases": phases, "started_at": started_at, "main_started_at": t.get("main_started_at"),
            "command_phases": dict(t["phases"]), "n_iter": t["n_iter"], "median_iteration_s": med,
            "kernel_s": float(sum(t["kernel_seconds"])), "backend": t["backend"], "tier": t["tier"],
            "read_ahead": bool(t.get("read_ahead"))}


def gpu_run(item: str | None) -> tuple[int | None, str | None]:
    """``--gpus``' item ``"N"`` or ``"N:KIND"`` (N GPUs, the local cluster's kind) as
    ``(N, kind or None)``; None: ``(None, None)``, the GPUs the host shows."""
    if item is None:
        return None, None
    count, _, how = item.partition(":")
    return int(count), how or None


def _entry(spec: dict, runs: list[dict], cold: dict, sk: list[float]) -> dict:
    """One run's results entry: the median command of ``runs`` with its phases, the cold run's,
    and scikit-learn's script where it ran."""
    walls = [r["wall_s"] for r in runs]
    med = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
    entry = {"n": spec["n"], "d": spec["d"], "k": spec["k"], "format": spec["fmt"], "args": spec["args"],
             "wall_s": med["wall_s"], "walls_s": walls, "cold_wall_s": cold["wall_s"],
             "cold_phases": cold["phases"], **{k: med[k] for k in ("phases", "n_iter", "median_iteration_s",
                                                                    "kernel_s", "backend", "tier", "read_ahead")}}
    if "fit init" in med["phases"]:
        entry["init_iteration_times"] = med["phases"]["fit init"] / med["median_iteration_s"]
    entry["largest_phase_share_besides_iterations"] = max(
        v for k, v in med["phases"].items() if k != "fit iterations") / med["wall_s"]
    if sk:
        entry["sklearn_script_s"] = statistics.median(sk)
        entry["sklearn_scripts_s"] = sk
        entry["ratio_to_sklearn"] = med["wall_s"] / entry["sklearn_script_s"]
    return entry


def settle(cache: str, timeout: float = 600.0) -> float:
    """Wait for the kernel warm-up processes still compiling into ``cache`` (``gpu_warm_ops``,
    started by a command and by its workers; they outlive a short command by design, so that
    the next one finds the kernels built); the seconds waited. A run timed while they compile
    shares the host's cores with them and is no warm run."""
    import psutil

    t0 = time.perf_counter()
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(c).endswith("gpu_warm_ops.py") for c in proc.info["cmdline"] or ()) and \
                    proc.environ().get("CUPY_CACHE_DIR", "").startswith(cache):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    psutil.wait_procs(found, timeout=timeout)
    return time.perf_counter() - t0


def run_sklearn(path: str, ipath: str | None, spec: dict) -> float:
    max_iter = spec["args"][spec["args"].index("--max-iter") + 1] if "--max-iter" in spec["args"] else "300"
    tol = spec["args"][spec["args"].index("--tol") + 1]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", SKLEARN, path, ipath or "k-means++", str(spec["k"]), max_iter, tol],
                   check=True)
    return time.perf_counter() - t0


def api_fit(repeats: int) -> dict:
    """P1 through the Python API on the local cluster daskmeans starts (data already in memory,
    cluster already up) against scikit-learn's fit of the same array, alternating."""
    from sklearn.cluster import KMeans as SkKMeans

    from daskmeans import KMeans
    from daskmeans.dask_cluster import connect

    X, C = problems.get("P1").data(seed=0)
    ours, theirs = [], []
    with connect() as client:
        KMeans(4, init=C, max_iter=2, client=client).fit(X[:10000])  # kernels loaded, as after a first fit
        for _ in range(repeats):
            t0 = time.perf_counter()
            KMeans(4, init=C, tol=1e-4, client=client).fit(X)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            SkKMeans(4, init=C, n_init=1, tol=1e-4).fit(X)
            theirs.append(time.perf_counter() - t0)
    return {"fit_s": statistics.median(ours), "fits_s": ours, "sklearn_fit_s": statistics.median(theirs),
            "sklearn_fits_s": theirs, "ratio_to_sklearn": statistics.median(ours) / statistics.median(theirs)}


def timed_help() -> float:
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run(["daskmeans", "--help"], check=True, capture_output=True)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> None:
    ap = meta.parser("command", __doc__)
    ap.add_argument("--problems", default="p1,blobs", help=f"comma-separated, of {', '.join(PROBLEMS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--api", action="store_true", help="also P1 through the Python API (in memory)")
    ap.add_argument("--warm-only", action="store_true",
                    help="no run with an empty kernel cache (its phases then missing: cold_wall_s is null)")
    ap.add_argument("--gpus", help="comma-separated GPU counts, each command run on the first N GPUs in turn "
                                   "(entries <run>-<N>gpu); N:KIND runs N GPUs with local-cluster KIND, threads or "
                                   "processes (entries <run>-<N>gpu-KIND)")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "command")
    names = meta.names(ap, args.problems, PROBLEMS, "problem")
    res = {"benchmark": "command", "date": meta.now(),
           "commit": meta.commit(), "machine": platform.machine(), "cores": os.cpu_count(),
           "device": meta.device_name(), "help_s": timed_help(), "problems": {}}
    print(f"daskmeans --help: {res['help_s']:.3f} s", flush=True)
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as warm_cache:
        for name in names:
            spec = PROBLEMS[name]
            path, ipath = make_data(name, spec, folder)
            counts = args.gpus.split(",") if args.gpus else [None]
            cold = {g: {"wall_s": None, "phases": None} for g in counts}
            if not args.warm_only:
                for g in counts:
                    with tempfile.TemporaryDirectory() as cold_cache:
                        cold[g] = run_command(path, ipath, spec, folder, cold_cache, *gpu_run(g))
                        settle(cold_cache)  # its compiles would share the next runs' cores
            settled = 0.0
            for g in counts:
                run_command(path, ipath, spec, folder, warm_cache, *gpu_run(g))  # fills the warm cache
                settled += settle(warm_cache)
            runs, sk = {g: [] for g in counts}, []
            for _ in range(args.repeats):  # alternating, so that all see the same machine
                for g in counts:
                    runs[g].append(run_command(path, ipath, spec, folder, warm_cache, *gpu_run(g)))
                if spec["sk"]:
                    sk.append(run_sklearn(path, ipath, spec))
            first = None
            for g in counts:
                entry = _entry(spec, runs[g], cold[g], sk)
                entry["warm_up_after_fill_s"] = settled  # the fill's compiles still running after it
                n_gpus, how = gpu_run(g)
                key = name if g is None else f"{name}-{n_gpus}gpu" + (f"-{how}" if how else "")
                if g is not None:
                    entry["gpus"] = n_gpus
                    if how is not None:
                        entry["local_cluster"] = how
                    if first is None:
                        first = entry
                    else:
                        entry["wall_over_first"] = entry["wall_s"] / first["wall_s"]
                        if "fit init" in entry["phases"]:
                            entry["init_over_first"] = entry["phases"]["fit init"] / first["phases"]["fit init"]
                res["problems"][key] = entry
                print(key, json.dumps({k: v for k, v in entry.items() if k not in ("cold_phases",)}), flush=True)
            for f in (path, ipath):
                if f and os.path.isdir(f):
                    shutil.rmtree(f)
                elif f:
                    os.remove(f)
    if args.api:
        res["api_p1"] = api_fit(args.repeats)
        print("api", json.dumps(res["api_p1"]), flush=True)
    meta.write(res, args.out, LAYOUT, args.merge)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
