"""scikit-learn's conventions where scikit-learn defines them (issue 47 part 4, issue 49):
``algorithm``, ``copy_x``, ``n_init="auto"``, callable and array-like inits, ``verbose`` as a
bool, NumPy ``labels_`` for data in memory, scikit-learn's messages and warnings,
``get_feature_names_out`` and ``set_output``. scikit-learn's own KMeans tests run in
test_sklearn_suite.py; these pin each convention on its own, with daskmeans' estimators."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import make_blobs
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from daskmeans import DaskmeansWarning, InvalidParameterError, KMeans, MiniBatchKMeans, NotFittedError


@pytest.fixture(scope="module")
def blobs():
    X, _ = make_blobs(n_samples=600, n_features=4, centers=3, cluster_std=0.6, random_state=3)
    return X


# ---------------------------------------------------------------- parameters


def test_algorithm_elkan_is_lloyds_result_and_warns_for_one_cluster(client, blobs):
    a = KMeans(3, random_state=0, algorithm="lloyd", client=client).fit(blobs)
    b = KMeans(3, random_state=0, algorithm="elkan", client=client).fit(blobs)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.get_params()["algorithm"] == "lloyd" and b.get_params()["algorithm"] == "elkan"
    with pytest.warns(RuntimeWarning, match="algorithm='elkan' doesn't make sense for a single cluster") as seen:
        KMeans(1, algorithm="elkan", client=client).fit(blobs)
    assert all(isinstance(w.message, DaskmeansWarning) for w in seen if "elkan" in str(w.message))
    with pytest.raises(InvalidParameterError, match="algorithm='full' should be one of 'lloyd', 'elkan'"):
        KMeans(3, algorithm="full", client=client).fit(blobs)


def test_copy_x_leaves_x_as_it_was(client, blobs):
    X = blobs.copy()
    KMeans(3, copy_x=False, random_state=0, client=client).fit(X)
    np.testing.assert_array_equal(X, blobs)
    with pytest.raises(InvalidParameterError, match="copy_x='no' should be True or False"):
        KMeans(3, copy_x="no", client=client).fit(blobs)


@pytest.mark.parametrize("cls, default", [(KMeans, 10), (MiniBatchKMeans, 3)])
@pytest.mark.parametrize("init, runs", [("k-means++", 1), ("k-means||", 1), ("random", "default"),
                                        ("callable", "default"), ("array", 1)])
def test_n_init_auto_is_scikit_learns_rule(client, blobs, cls, default, init, runs):
    init = {"callable": lambda X, k, random_state: X[random_state.choice(len(X), k, replace=False)],
            "array": blobs[:3]}.get(init, init)
    km = cls(3, init=init, n_init="auto", random_state=0, client=client).fit(blobs)
    assert km._n_init == (default if runs == "default" else runs)


@pytest.mark.parametrize("cls", [KMeans, MiniBatchKMeans])
def test_explicit_centres_run_once_with_scikit_learns_warning(client, blobs, cls):
    with pytest.warns(RuntimeWarning, match=f"Explicit initial center position passed: performing only one init in "
                                            f"{cls.__name__} instead of n_init=10"):
        km = cls(3, init=blobs[:3], n_init=10, client=client).fit(blobs)
    assert km._n_init == 1


@pytest.mark.parametrize("value, message", [
    (0, "n_init=0 should be >= 1 (or 'auto')"),
    ("many", "n_init='many' should be an integer >= 1 or 'auto'"),
    (2.5, "n_init=2.5 should be an integer >= 1 or 'auto'"),
])
def test_bad_n_init_says_value_and_requirement(client, blobs, value, message):
    with pytest.raises(InvalidParameterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        KMeans(3, n_init=value, client=client).fit(blobs)


def test_verbose_takes_a_bool(client, blobs, capsys):
    KMeans(3, random_state=0, verbose=True, max_iter=2, client=client).fit(blobs)
    iterations = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("daskmeans: ")]  # not the steps
    assert iterations[0].startswith("iter    1  inertia ")
    with pytest.raises(InvalidParameterError, match=r"verbose=-1 should be True, False or an integer >= 0"):
        KMeans(3, verbose=-1, client=client).fit(blobs)


# ---------------------------------------------------------------- inits


def test_a_callable_init_is_called_as_scikit_learn_calls_it(client, blobs):
    calls = []

    def init(X, n_clusters, random_state):
        calls.append((type(X), X.dtype, n_clusters, type(random_state)))
        return X[random_state.choice(X.shape[0], n_clusters, replace=False)]

    km = KMeans(3, init=init, n_init=4, random_state=7, client=client).fit(blobs)
    assert calls == [(np.ndarray, np.float64, 3, np.random.RandomState)] * 4
    # each run from its own centres (the RandomState advances), the lowest inertia kept
    runs = [KMeans(3, init=c, n_init=1, client=client).fit(blobs).inertia_
            for c in _draws(blobs, 4, np.random.RandomState(7))]
    assert km.inertia_ == min(runs) and km.best_run_ == int(np.argmin(runs)) + 1
    calls.clear()
    KMeans(3, init=init, n_init=1, client=client).fit(sp.csr_matrix(blobs))
    assert calls[0][0] is sp.csr_matrix
    calls.clear()
    KMeans(3, init=init, n_init=1, client=client).fit(da.from_array(blobs, chunks=100))
    assert calls[0][0] is da.Array  # lazy data stays lazy: the callable takes what it needs


def _draws(X, n, rs):
    return [X[rs.choice(len(X), 3, replace=False)] for _ in range(n)]


def test_an_array_like_init_is_taken_and_never_written_to(client, blobs):
    rows = blobs[[0, 200, 400]]
    as_list = KMeans(3, init=rows.tolist(), client=client).fit(blobs)
    as_array = KMeans(3, init=rows, client=client).fit(blobs)
    np.testing.assert_array_equal(as_list.cluster_centers_, as_array.cluster_centers_)
    np.testing.assert_array_equal(rows, blobs[[0, 200, 400]])
    assert not np.may_share_memory(as_array.cluster_centers_, rows)


@pytest.mark.parametrize("init, message", [
    (lambda X, k, random_state: X[:2], r"The shape of the initial centers \(2, 4\) does not match the number of "
                                       r"clusters 3: init array has shape \(2, 4\), should be \(n_clusters, "
                                       r"n_features\) = \(3, 4\)"),
    ([[0.0, 1.0]] * 3, r"The shape of the initial centers \(3, 2\) does not match the number of features of the "
                       r"data 4"),
])
def test_an_init_of_another_shape_is_scikit_learns_value_error(client, blobs, init, message):
    with pytest.raises(ValueError, match=message):
        KMeans(3, init=init, n_init=1, client=client).fit(blobs)


def test_a_bad_init_names_every_kind_it_could_be(client, blobs):
    with pytest.raises(InvalidParameterError, match=r"init=3 should be one of 'k-means\|\|', 'k-means\+\+', 'random'.* "
                                                    r"or be an array-like of shape \(n_clusters, n_features\), a "
                                                    r"\.npy path or a callable init\(X, n_clusters, random_state\)"):
        KMeans(3, init=3, client=client).fit(blobs)


# ---------------------------------------------------------------- labels_ and warnings


@pytest.mark.parametrize("kind", ["numpy", "pandas", "list", "sparse"])
def test_labels_of_data_in_memory_are_numpy(client, blobs, kind):
    X = {"numpy": blobs, "pandas": pd.DataFrame(blobs, columns=list("abcd")), "list": blobs.tolist(),
         "sparse": sp.csr_matrix(blobs)}[kind]
    for cls in (KMeans, MiniBatchKMeans):
        km = cls(3, random_state=0, client=client).fit(X)
        assert isinstance(km.labels_, np.ndarray) and km.labels_.dtype == np.int32
        assert np.bincount(km.labels_).shape == (3,)
        np.testing.assert_array_equal(km.labels_, km.predict(X))


def test_labels_of_dask_data_stay_lazy_and_labels_can_be_set(client, blobs):
    km = KMeans(3, random_state=0, client=client).fit(da.from_array(blobs, chunks=100))
    assert isinstance(km.labels_, da.Array)
    km.labels_ = np.zeros(len(blobs), np.int32)  # as scikit-learn's plain attribute
    np.testing.assert_array_equal(km.labels_, 0)
    del km.labels_
    with pytest.raises(NotFittedError):
        km.labels_


def test_fewer_distinct_points_is_scikit_learns_convergence_warning(client):
    X = np.asarray([[0, 0], [0, 1], [1, 0], [1, 0]], dtype=float)
    with pytest.warns(ConvergenceWarning, match=r"Number of distinct clusters \(3\) found smaller than n_clusters "
                                                r"\(4\). Possibly due to duplicate points in X.") as seen:
        km = KMeans(4, random_state=0, client=client).fit(X)
    assert any(isinstance(w.message, DaskmeansWarning) for w in seen)
    assert set(km.labels_) == {0, 1, 2}


def test_mini_batch_init_size_below_n_clusters_warns_as_scikit_learn(client, blobs):
    with pytest.warns(RuntimeWarning, match=r"init_size=2 should be larger than n_clusters=3. Setting it to "
                                            r"min\(3\*n_clusters, n_samples\)"):
        km = MiniBatchKMeans(3, init_size=2, random_state=0, client=client).fit(blobs)
    assert km._init_size == 9
    assert MiniBatchKMeans(3, batch_size=5, n_init=1, client=client).fit(blobs)._init_size == 15


@pytest.mark.parametrize("tol, max_no_improvement, words", [
    (1e-4, None, "Converged (small centers change)"), (0, 3, "Converged (lack of improvement in inertia)")])
def test_mini_batch_says_why_it_stopped(client, blobs, capsys, tol, max_no_improvement, words):
    MiniBatchKMeans(3, batch_size=20, tol=tol, max_no_improvement=max_no_improvement, max_iter=10, n_init=1,
                    random_state=0, verbose=1, client=client).fit(blobs)
    assert words in capsys.readouterr().out


# ---------------------------------------------------------------- outputs


@pytest.mark.parametrize("cls", [KMeans, MiniBatchKMeans])
def test_feature_names_out_are_the_class_and_the_cluster(client, blobs, cls):
    km = cls(3, random_state=0, client=client)
    with pytest.raises(NotFittedError):
        km.get_feature_names_out()
    km.fit(pd.DataFrame(blobs, columns=list("abcd")))
    prefix = cls.__name__.lower()
    np.testing.assert_array_equal(km.get_feature_names_out(), [f"{prefix}0", f"{prefix}1", f"{prefix}2"])
    assert km.get_feature_names_out(list("abcd")).dtype == object
    with pytest.raises(ValueError, match="input_features is not equal to feature_names_in_"):
        km.get_feature_names_out(list("abce"))


def test_set_output_pandas_in_a_pipeline(client, blobs):
    """Issue 47 part 4: ``Pipeline.set_output(transform="pandas")`` was a ValueError."""
    df = pd.DataFrame(blobs, columns=list("abcd"), index=np.arange(1000, 1000 + len(blobs)))
    pipe = Pipeline([("scale", StandardScaler()), ("km", KMeans(3, random_state=0, client=client))])
    out = pipe.set_output(transform="pandas").fit_transform(df)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == ["kmeans0", "kmeans1", "kmeans2"]
    pd.testing.assert_index_equal(out.index, df.index)
    np.testing.assert_array_equal(out.to_numpy(), pipe["km"].set_output(transform="default").transform(
        pipe["scale"].transform(df)))
    assert clone(KMeans(3).set_output(transform="pandas"))._sklearn_output_config == {"transform": "pandas"}
    with pytest.raises(InvalidParameterError, match="transform='numpy' should be one of 'default', 'pandas', 'polars'"):
        KMeans(3).set_output(transform="numpy")


def test_scikit_learns_global_output_config_applies(client, blobs):
    import sklearn

    km = KMeans(3, random_state=0, client=client).fit(blobs)
    with sklearn.config_context(transform_output="pandas"):
        assert isinstance(km.transform(blobs), pd.DataFrame)
        assert isinstance(km.set_output(transform="default").transform(blobs), np.ndarray)


def test_the_same_labels_as_scikit_learn_from_the_same_centres(client, blobs):
    init = blobs[[0, 1, 2]]
    ours = KMeans(3, init=init, n_init=1, tol=0, client=client).fit(blobs)
    theirs = SkKMeans(3, init=init, n_init=1, tol=0).fit(blobs)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-12)
