"""``python -m benchmarks gridsearch``: scikit-learn's ``GridSearchCV`` over daskmeans' ``KMeans``
with ``n_jobs=1`` and ``n_jobs=2``, each as a user runs it: a fresh interpreter that starts its
own local cluster (and, with ``n_jobs=2``, joblib's loky processes, each with its own).

Issue 47's acceptance: 4 values of ``n_clusters`` (2 to 5), ``cv=3``, 6,000 x 4 rows of four
blobs; ``n_jobs=2`` no slower than ``n_jobs=1`` on a 2-core host, with room for noise
(``ratio_fastest``: the fastest ``n_jobs=2`` run over the fastest ``n_jobs=1`` run, at most
1.35). Each loky process takes its share of the cores (a cluster of ``cores // 2`` workers:
``tests/api/test_dask_habits.py`` checks that cause itself); before, each started a worker per
core, and ``n_jobs=2`` took 1.4x to 2x as long.

The two run in turn, ``--repeats`` times each, the host's one-minute load average recorded
before each: wall-clock parallelism cannot be measured where other work already fills the
cores (``n_jobs=2`` does more work in all: two more interpreters import daskmeans and load its
kernels, and the refit starts a cluster in the parent), so a run whose least load exceeded the
cores is marked ``busy``.

    python -m benchmarks gridsearch [--repeats 3] [--out benchmarks/results/gridsearch_cpu_<cores>core_<cpu>.json]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap

from benchmarks import meta

SUMMARY = "GridSearchCV over KMeans with n_jobs=2 against n_jobs=1, each from a fresh interpreter"  # its line in --help

LAYOUT = meta.Layout()

SCRIPT = """
    import json, time
    import numpy as np
    from sklearn.model_selection import GridSearchCV
    from daskmeans import KMeans

    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 0.5, (1500, 4)) for c in range(4)])
    t = time.perf_counter()
    gs = GridSearchCV(KMeans(random_state=0), {"n_clusters": [2, 3, 4, 5]}, cv=3, n_jobs=N_JOBS).fit(X)
    print(json.dumps({"seconds": time.perf_counter() - t, "best": gs.best_params_["n_clusters"]}))
"""

# Issue 47: n_jobs=2's fastest run within this factor of n_jobs=1's.
TARGET = 1.35


def run_once(n_jobs: int) -> float:
    """Seconds of one grid search with ``n_jobs`` from a fresh interpreter (its fit alone, not
    the interpreter's start); raises where it fails or picks another best K than 5."""
    env = dict(os.environ)
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT.replace("N_JOBS", str(n_jobs)))],
                          capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"n_jobs={n_jobs}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["best"] != 5:
        raise RuntimeError(f"n_jobs={n_jobs}: best n_clusters={out['best']}, should be 5")
    return float(out["seconds"])


def main(argv=None):
    ap = meta.parser("gridsearch", __doc__)
    ap.add_argument("--repeats", type=int, default=3)
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "gridsearch")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    seconds: dict[int, list[float]] = {1: [], 2: []}
    loads: list[float] = []
    for _ in range(args.repeats):
        for n_jobs in (1, 2):
            loads.append(os.getloadavg()[0])
            seconds[n_jobs].append(run_once(n_jobs))
            print(f"n_jobs={n_jobs}: {seconds[n_jobs][-1]:.2f} s (load {loads[-1]:.1f})", flush=True)
    ratio = min(seconds[2]) / min(seconds[1])
    res = {"benchmark": "gridsearch", "date": meta.now(), "commit": meta.commit(),
           "machine": platform.machine(), "cores": cores, "device": meta.device_name(),
           "repeats": args.repeats, "n_jobs_1_s": seconds[1], "n_jobs_2_s": seconds[2],
           "median_n_jobs_1_s": statistics.median(seconds[1]), "median_n_jobs_2_s": statistics.median(seconds[2]),
           "ratio_fastest": ratio, "target": TARGET, "held": ratio <= TARGET,
           "loads": loads, "busy": min(loads) > cores}
    print(json.dumps({k: res[k] for k in ("ratio_fastest", "held", "busy", "loads")}), flush=True)
    meta.write(res, args.out, LAYOUT, args.merge)


if __name__ == "__main__":
    main()
