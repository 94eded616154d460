"""Out-of-core on GPUs: a Zarr store larger than the GPU memory each worker may use.

With a device budget smaller than its rows, a GPU worker keeps them in pinned host memory and
streams them to the GPU each iteration (tier ``host``); with a host budget smaller too, it
re-reads them from the store each iteration (tier ``storage``). The centroids are bitwise the
same in every tier. Needs a CUDA GPU, CuPy and dask-cuda (``pip install '.[cuda13]'``).

    python examples/gpu_out_of_core.py [OUT_DIR]     # default: a new temporary directory
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
from dask_cuda import LocalCUDACluster
from distributed import Client

import daskmeans

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    # 16 million rows x 16 float32 features: 1 GiB, written chunk by chunk.
    X, _ = daskmeans.make_blobs(16_000_000, 16, 64, cluster_std=2.0, random_state=0)
    daskmeans.write(X, str(out / "big.zarr"))

    with LocalCUDACluster(dashboard_address=":0") as cluster, Client(cluster):
        X = daskmeans.read(out / "big.zarr")
        # Half of a worker's share of the rows (1 GiB over the GPUs): the rows no longer fit.
        limit = f"{1024 // (2 * len(cluster.workers))}MiB"
        budgets = {
            "device": {},
            "host": {"device_memory_limit": limit},
            "storage": {"device_memory_limit": limit, "memory_limit": "256MiB"},
        }
        fits = {}
        for name, limits in budgets.items():
            km = daskmeans.KMeans(64, random_state=0, max_iter=20, tol=0, **limits).fit(X)  # same seed, same start
            print(f"{name:8s} {km.tier_plan_}")
            print(f"{'':8s} {km.n_iter_} iterations, {np.mean([h['seconds'] for h in km.history_]):.3f} s each, "
                  f"{np.median([h['gb_per_s'] for h in km.history_]):.1f} GB/s, inertia {km.inertia_:.6e}")
            fits[name] = km
        same = all(np.array_equal(km.cluster_centers_, fits["device"].cluster_centers_) for km in fits.values())
        print("tiers used:", [km.tier_ for km in fits.values()], "- centroids bitwise equal:", same)
