"""KMeans without a Client: the local cluster the CLI starts, once per process; scikit-learn's
model selection with loky processes and with joblib's Dask backend.

Each case runs in a fresh interpreter (a real subprocess): "no default client" and "once per
process, closed at exit" are properties of a process, and the test session's own default
client would hide them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(code: str, timeout: float = 240) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    env = dict(os.environ, PYTHONPATH=ROOT, DASK_DISTRIBUTED__LOGGING__DISTRIBUTED="error")
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_client_numpy_pandas_dask_reuse_one_cluster_closed_at_exit():
    out = run_script("""
        import json, warnings
        import numpy as np, pandas as pd, dask.array as da
        from distributed import Client, LocalCluster, default_client
        from daskmeans import KMeans
        from daskmeans.dask_cluster import api_client

        rng = np.random.default_rng(0)
        X = np.concatenate([rng.normal(c, 0.2, (100, 2)) for c in ((0, 0), (4, 0), (0, 4))])
        init = X[[0, 100, 200]]
        a = KMeans(3, init=init, random_state=0).fit(X)
        client = default_client()                     # the cluster the fit started
        b = KMeans(3, init=init, random_state=0).fit(pd.DataFrame(X, columns=["u", "v"]))
        c = KMeans(3, init=init, random_state=0).fit(da.from_array(X, chunks=70))
        same = api_client() is client and default_client() is client
        labels = a.labels_                            # NumPy: X was in memory
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as lc, \\
                Client(lc, set_as_default=False) as other:
            ref = KMeans(3, init=init, random_state=0, client=other).fit(X)
            ref_labels = ref.labels_
            ref_score = ref.score(X)
        print(json.dumps({
            "same_client": same,
            "n_workers": len(client.nthreads()),
            "threads": sorted(set(client.nthreads().values())),
            "inproc": client.scheduler.address.startswith("inproc://"),
            "centers_equal": bool((a.cluster_centers_ == b.cluster_centers_).all()
                                  and (a.cluster_centers_ == c.cluster_centers_).all()
                                  and (a.cluster_centers_ == ref.cluster_centers_).all()),
            "labels_equal": type(labels).__name__ == "ndarray" and bool((labels == ref_labels).all()),
            "sizes": sorted(np.bincount(labels).tolist()),
            "predict": type(KMeans(3, random_state=0).fit(X).predict(X)).__name__,
            "score": a.score(X) == ref_score,
        }))
    """)
    ncpu = os.cpu_count() or 1
    assert out["same_client"] is True
    assert out["inproc"] is True and out["threads"] == [1] and out["n_workers"] == min(ncpu, 8)
    assert out["centers_equal"] and out["labels_equal"] and out["score"]
    assert out["sizes"] == [100, 100, 100]
    assert out["predict"] == "ndarray"


def test_predict_transform_score_of_a_loaded_model_without_a_client(tmp_path):
    X = np.random.default_rng(1).standard_normal((300, 4))
    np.save(tmp_path / "x.npy", X)
    out = run_script(f"""
        import json
        import numpy as np
        from sklearn.cluster import KMeans as SkKMeans
        import daskmeans

        X = np.load({str(tmp_path / "x.npy")!r})
        init = X[:5]
        daskmeans.KMeans(5, init=init, tol=0, max_iter=50).fit(X).save({str(tmp_path / "m.zarr")!r})
        km = daskmeans.load({str(tmp_path / "m.zarr")!r})
        sk = SkKMeans(5, init=init, n_init=1, tol=0, max_iter=50, algorithm="lloyd").fit(X)
        print(json.dumps({{
            "labels": bool((km.predict(X) == sk.predict(X)).all()),
            "transform": float(np.abs(km.transform(X) - sk.transform(X)).max()),
            "score": abs(km.score(X) - sk.score(X)) / abs(sk.score(X)),
        }}))
    """)
    assert out["labels"] and out["transform"] < 1e-9 and out["score"] < 1e-10


def test_grid_search_and_cross_val_score_with_two_loky_processes():
    out = run_script("""
        import json
        import numpy as np
        from sklearn.model_selection import GridSearchCV, cross_val_score
        from daskmeans import KMeans

        rng = np.random.default_rng(0)
        X = np.concatenate([rng.normal(c, 0.3, (150, 2)) for c in ((0, 0), (5, 0), (0, 5))])
        two = GridSearchCV(KMeans(random_state=0), {"n_clusters": [2, 3, 4]}, cv=3, n_jobs=2).fit(X)
        one = GridSearchCV(KMeans(random_state=0), {"n_clusters": [2, 3, 4]}, cv=3, n_jobs=1).fit(X)
        scores = cross_val_score(KMeans(3, random_state=0), X, cv=3, n_jobs=2)
        print(json.dumps({
            "best": two.best_params_,
            "scores_two": two.cv_results_["mean_test_score"].tolist(),
            "scores_one": one.cv_results_["mean_test_score"].tolist(),
            "cv": scores.tolist(),
            "cv_ref": one.cv_results_["split0_test_score"][1],
        }))
    """, timeout=400)
    assert out["best"] == {"n_clusters": 4}  # score is -inertia: more clusters, higher
    # Fits in the loky processes (each with its own local cluster) give the same scores as here.
    assert out["scores_two"] == out["scores_one"]
    assert len(out["cv"]) == 3 and out["cv"][0] == out["cv_ref"]


def test_joblib_dask_backend_runs_fits_inside_tasks():
    out = run_script("""
        import json, logging, time
        import joblib
        import numpy as np
        from distributed import Client, LocalCluster
        from sklearn.model_selection import GridSearchCV
        from daskmeans import KMeans

        if __name__ == "__main__":
            rng = np.random.default_rng(0)
            X = np.concatenate([rng.normal(c, 0.3, (100, 2)) for c in ((0, 0), (5, 0), (0, 5))])
            ref = GridSearchCV(KMeans(random_state=0), {"n_clusters": [2, 3]}, cv=2).fit(X)  # no client yet
            with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                              silence_logs=logging.ERROR) as lc, Client(lc) as client:
                t = time.perf_counter()
                with joblib.parallel_backend("dask"):
                    s = GridSearchCV(KMeans(random_state=0), {"n_clusters": [2, 3]}, cv=2).fit(X)
                seconds = time.perf_counter() - t
                # A fit submitted as a task runs in worker_client too.
                km = client.submit(KMeans(3, random_state=0).fit, X).result()
            print(json.dumps({
                "best": s.best_params_,
                "scores": s.cv_results_["mean_test_score"].tolist(),
                "ref": ref.cv_results_["mean_test_score"].tolist(),
                "submitted": bool(np.allclose(km.cluster_centers_, ref.best_estimator_.cluster_centers_)),
                "seconds": seconds,
            }))
    """, timeout=300)
    assert out["best"] == {"n_clusters": 3}
    assert out["scores"] == out["ref"]  # the same fits, run as tasks of the cluster
    assert out["submitted"]
