"""The notebook workflow as a script: an existing Client, a Zarr file, scikit-learn-style API.

    python examples/notebook_workflow.py
"""

import tempfile

from distributed import Client, LocalCluster

import daskmeans
from daskmeans.datasets import make_blobs
from daskmeans.io.model_store import write_array

if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        path = tempfile.mkdtemp() + "/blobs.zarr"
        X, true_centers = make_blobs(500_000, 10, 6, random_state=0)
        write_array(X, path)
        X = daskmeans.read(path)
        km = daskmeans.KMeans(6, random_state=0).fit(X, callback=lambda s: print(s["iteration"], s["inertia"]))
        print("centres\n", km.cluster_centers_.round(2))
        print("cluster sizes", __import__("numpy").bincount(km.labels_.compute()))
        print("score", km.score(X))
