"""Zero-code-change mode (issue 49): ``python -m daskmeans.accel script.py``,
``daskmeans.accel.install()`` and ``%load_ext daskmeans.accel`` route scikit-learn's
``KMeans``, ``MiniBatchKMeans`` and ``k_means`` to daskmeans, falling back to scikit-learn for
what daskmeans refuses, and say which ran at ``-v``."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import daskmeans
import daskmeans.accel as accel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# An unmodified scikit-learn script: fit, predict, GridSearchCV over n_clusters, k_means.
SCRIPT = """
import json, sys
import numpy as np
from sklearn.cluster import KMeans, k_means
from sklearn.datasets import make_blobs
from sklearn.model_selection import GridSearchCV

X, _ = make_blobs(n_samples=900, n_features=5, centers=4, cluster_std=1.5, random_state=int(sys.argv[1]))
init = X[:4]
km = KMeans(n_clusters=4, init=init, n_init=1).fit(X)
search = GridSearchCV(KMeans(init="k-means++", random_state=0), {"n_clusters": [2, 3, 4, 5]}, cv=3).fit(X)
centers, labels, inertia = k_means(X, 4, init=init, n_init=1)
print(json.dumps({
    "class": f"{type(km).__module__}.{type(km).__name__}",
    "labels": km.labels_.tolist(),
    "predict": km.predict(X[::7]).tolist(),
    "centers": km.cluster_centers_.tolist(),
    "inertia": km.inertia_,
    "best": search.best_params_,
    "function_labels": labels.tolist(),
}))
"""


def _run(args: list[str], tmp_path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, DASK_DISTRIBUTED__LOGGING__DISTRIBUTED="error")
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_an_unmodified_script_gives_scikit_learns_labels_on_daskmeans(tmp_path):
    script = tmp_path / "cluster.py"
    script.write_text(SCRIPT)
    theirs = json.loads(_run([str(script), "11"], tmp_path).stdout.splitlines()[-1])
    proc = _run(["-m", "daskmeans.accel", "-v", str(script), "11"], tmp_path)
    ours = json.loads(proc.stdout.splitlines()[-1])
    assert theirs["class"] == "sklearn.cluster._kmeans.KMeans"
    assert ours["class"] == "daskmeans.accel.KMeans"
    assert ours["labels"] == theirs["labels"] and ours["predict"] == theirs["predict"]
    assert ours["function_labels"] == theirs["function_labels"]
    np.testing.assert_allclose(ours["centers"], theirs["centers"], rtol=1e-10)
    assert ours["inertia"] == pytest.approx(theirs["inertia"], rel=1e-10)
    assert ours["best"] == theirs["best"] == {"n_clusters": 5}  # score is -inertia: more clusters, higher
    # -v: what is routed, and that the fits ran on daskmeans (once, however many fits)
    err = proc.stderr
    assert "daskmeans.accel: sklearn.cluster.KMeans, MiniBatchKMeans and k_means run on daskmeans" in err
    assert err.count("daskmeans.accel: KMeans.fit runs on daskmeans (numpy workers, client inproc://") == 1, err
    assert "scikit-learn:" not in err.replace("(scikit-learn", "")  # nothing fell back


def test_without_v_it_says_nothing_and_m_runs_a_module(tmp_path):
    (tmp_path / "clustermod.py").write_text(SCRIPT)
    proc = _run(["-m", "daskmeans.accel", "-m", "clustermod", "3"], tmp_path)
    assert json.loads(proc.stdout.splitlines()[-1])["class"] == "daskmeans.accel.KMeans"
    assert "daskmeans.accel" not in proc.stderr


@pytest.fixture
def routed():
    """The routing installed in this process for one test, then scikit-learn's own back."""
    accel.install(verbose=True)
    yield
    accel.uninstall()
    accel.forget_said()


def test_install_routes_sklearn_cluster_and_keeps_isinstance_and_pickles(routed, client, capsys):
    import sklearn.cluster
    import sklearn.cluster._kmeans as km_module
    from sklearn.base import clone

    original = accel._original("KMeans")
    assert sklearn.cluster.KMeans is accel.KMeans and km_module.KMeans is accel.KMeans
    assert sklearn.cluster.MiniBatchKMeans is accel.MiniBatchKMeans and sklearn.cluster.k_means is accel.k_means
    km = sklearn.cluster.KMeans(3, random_state=0)
    assert isinstance(km, original) and isinstance(km, daskmeans.KMeans)
    # scikit-learn's signature and defaults: get_params, clone and repr are scikit-learn's
    assert km.get_params() == original(3, random_state=0).get_params()
    assert repr(km) == repr(original(3, random_state=0)) == "KMeans(n_clusters=3, random_state=0)"
    assert clone(km).get_params() == km.get_params()
    X = np.random.default_rng(0).normal(size=(300, 3))
    km.fit(X)
    back = pickle.loads(pickle.dumps(km))
    assert type(back) is accel.KMeans
    np.testing.assert_array_equal(back.predict(X), km.labels_)
    assert "KMeans.fit runs on daskmeans" in capsys.readouterr().err
    mb = sklearn.cluster.MiniBatchKMeans(3, random_state=0, n_init=1).fit(X)
    assert isinstance(mb, accel._original("MiniBatchKMeans")) and mb.labels_.shape == (300,)


def test_what_daskmeans_refuses_runs_on_scikit_learn_unless_strict(routed, client, capsys):
    import sklearn.cluster

    X = np.random.default_rng(1).normal(size=(200, 2))
    w = np.ones(200)
    w[:5] = -1.0  # scikit-learn takes negative weights; daskmeans refuses them
    km = sklearn.cluster.KMeans(2, init=X[:2]).fit(X, sample_weight=w)
    ref = accel._original("KMeans")(2, init=X[:2]).fit(X, sample_weight=w)
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(km.predict(X), ref.predict(X))
    err = capsys.readouterr().err
    assert "daskmeans.accel: KMeans.fit runs on scikit-learn: daskmeans cannot take it (" in err
    # scikit-learn's private methods are scikit-learn's
    centres = km._init_centroids(X, x_squared_norms=(X ** 2).sum(1), init="random",
                                 random_state=np.random.RandomState(0), sample_weight=np.ones(200))
    assert centres.shape == (2, 2)
    # a parameter both refuse: scikit-learn's error, as without the routing
    with pytest.raises(ValueError, match="The 'n_clusters' parameter of KMeans must be an int in the range"):
        sklearn.cluster.KMeans(0).fit(X)
    accel.install(fallback=False)
    with pytest.raises(daskmeans.DataError):
        sklearn.cluster.KMeans(2, init=X[:2]).fit(X, sample_weight=w)
    with pytest.raises(AttributeError, match="_init_centroids"):
        sklearn.cluster.KMeans(2)._init_centroids


def test_load_ext_installs_the_routing(routed):
    import sklearn.cluster

    accel.uninstall()
    assert sklearn.cluster.KMeans is accel._original("KMeans")
    accel.load_ipython_extension(None)
    assert sklearn.cluster.KMeans is accel.KMeans


def test_a_script_name_is_needed(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "daskmeans.accel"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "a script (or -m MODULE) is needed" in proc.stderr
