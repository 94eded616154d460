"""Quick start on a CPU: synthetic data to Zarr, a fit on a local Dask cluster, the model
saved, loaded, used, and drawn.

    python examples/quickstart.py [OUT_DIR]     # default: a new temporary directory
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
from distributed import Client, LocalCluster

import daskmeans

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster):
        # 200,000 rows around 6 centres, written chunk by chunk: nothing is held whole in memory.
        X, true_centers = daskmeans.make_blobs(200_000, 10, 6, random_state=0)
        daskmeans.write(X, str(out / "blobs.zarr"))

        X = daskmeans.read(out / "blobs.zarr")  # lazy (n, d) Dask array of row chunks
        km = daskmeans.KMeans(n_clusters=6, random_state=0).fit(X)
        print(f"{km.n_iter_} iterations, inertia {km.inertia_:.6e}, converged {km.converged_}")
        print("cluster sizes", km.cluster_sizes_.tolist())

        # Each true centre has one fitted centroid next to it.
        gap = np.linalg.norm(true_centers[:, None, :] - km.cluster_centers_[None, :, :], axis=2).min(axis=1)
        print(f"largest distance from a true centre to its centroid {gap.max():.3f}")

        km.save(str(out / "model.zarr"))
        model = daskmeans.load(str(out / "model.zarr"))
        labels = model.predict(X).compute()
        print("labels equal to the training labels:", bool((labels == km.labels_.compute()).all()))
        model.plot(X, path=str(out / "report.png"))
        print(f"model, report and data in {out}")
