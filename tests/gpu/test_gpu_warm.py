"""A fit after the kernel warm-up compiles nothing (issue: a first fit on a fresh machine).

Each case runs in its own process with an empty CuPy kernel cache (``CUPY_CACHE_DIR``, the
sources kept beside the binaries): :func:`cupy_backend.warm` and its processes run to the end,
then a whole fit on an in-process GPU worker; any kernel that the fit compiled after the warm is
a kernel the warm-up misses (:mod:`daskmeans.backends.gpu_warm_ops` or
:func:`cupy_backend._distance_pass_compiles`), named in the failure.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent("""
    import glob, json, os, sys
    import numpy as np
    from distributed import Client, LocalCluster
    from daskmeans import KMeans
    from daskmeans.backends import cupy_backend

    k, d, n, precision, init, algorithm = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                           sys.argv[5], sys.argv[6])
    if algorithm == "yinyang-bounded":  # bounds from the second step on, never dropped: the bounded step's ops
        from daskmeans.engine import yinyang
        yinyang.BOUND_START, yinyang.ABANDON, algorithm = 1.0, float("inf"), "yinyang"
    cache = os.environ["CUPY_CACHE_DIR"]
    procs = cupy_backend.warm_cupy_ops("float32")
    cupy_backend.warm(k, d, np.float32, precision, n, algorithm=algorithm).join()
    codes = [p.wait() for p in procs]
    warmed = set(glob.glob(os.path.join(cache, "*.cubin")))
    x = np.random.default_rng(0).standard_normal((n, d), dtype=np.float32)
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as lc, Client(lc):
        KMeans(k, init=init, precision=precision, max_iter=3 if algorithm == "lloyd" else 10, tol=0, random_state=0,
               algorithm=algorithm, backend="gpu").fit(x)
    new = sorted(set(glob.glob(os.path.join(cache, "*.cubin"))) - warmed)
    names = []
    for f in new:
        src = open(f + ".cu").read() if os.path.exists(f + ".cu") else ""
        names.append(" ".join(__import__("re").findall(r"__global__\\s+void\\s+(?:__launch_bounds__\\([^)]*\\)\\s+)?(\\w+)", src)[:3]))
    print(json.dumps({"codes": codes, "warmed": len(warmed), "new": names}))
""")


@pytest.mark.parametrize("k, d, n, precision, init, algorithm", [
    (2048, 64, 200_000, "tf32", "k-means||", "lloyd"),  # the GEMM regime, the recluster's batches
    (16, 64, 200_000, "fp32", "k-means||", "lloyd"),  # the fused regime, few candidates a round
    (16, 64, 200_000, "fp32", "k-means++", "lloyd"),
    # Yinyang's steps to its probe and past it (the group bounds from GEMM tiles, the filter)
    (2048, 64, 200_000, "tf32", "k-means||", "yinyang"),
    # its bounded steps (every row's bounds set, the moved rows' sums, the drop rule's reads)
    (2048, 64, 200_000, "tf32", "k-means||", "yinyang-bounded"),
])
def test_a_fit_after_the_warm_up_compiles_nothing(tmp_path, k, d, n, precision, init, algorithm):
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "kernels"), CUPY_CACHE_SAVE_CUDA_SOURCE="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(k), str(d), str(n), precision, init, algorithm], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["codes"] and all(c == 0 for c in out["codes"]), out
    assert out["warmed"] > 20, out
    assert out["new"] == [], f"compiled after the warm-up: {out['new']}"


def test_a_second_warm_up_on_the_same_cache_compiles_nothing(tmp_path):
    """A second warm-up on the same cache finds the markers of the first and starts no
    process (each would import CuPy and open the driver beside the fit)."""
    code = ("from daskmeans.backends import cupy_backend as c; ps = c.warm_cupy_ops('float32'); "
            "print(len(ps), [p.wait() for p in ps])")
    cache = tmp_path / "kernels"
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    started, codes = first.stdout.split(" ", 1)
    assert int(started) >= 2 and re.fullmatch(r"\[(0, )*0\]\n?", codes), first.stdout
    files = sorted(os.listdir(cache))
    assert sum(f.endswith(".cubin") for f in files) > 20 and any(f.startswith("daskmeans-warm-") for f in files)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and second.stdout.strip() == "0 []", second.stdout
    assert sorted(os.listdir(cache)) == files


def test_loading_the_ops_ahead_runs_every_op_and_leaves_the_stream():
    """``gpu_warm_ops.load`` (a GPU worker's warm, from a warm cache) launches every op but the
    skipped ones without an error (on a stream of its own, which the ops' code must accept) and
    leaves the calling thread's current stream as it was."""
    import cupy

    from daskmeans.backends import gpu_warm_ops

    before = cupy.cuda.get_current_stream()
    assert gpu_warm_ops.load("float32", skip=("yinyang",)) == 0
    assert cupy.cuda.get_current_stream() == before
