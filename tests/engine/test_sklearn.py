"""scikit-learn compatibility: its estimator checks, Pipeline, clone, pickling, its NotFittedError.

scikit-learn is a test dependency, not a runtime one (importing it costs a fit command about
as much as Dask does): ``KMeans`` implements the estimator protocol itself (``get_params``,
``set_params``, ``__sklearn_tags__``) instead of inheriting ``BaseEstimator``.
"""

import pickle

import dask.array as da
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from daskmeans import KMeans, NotFittedError

# The random inits (k-means||, k-means++) draw per row: a row of weight 2 is one candidate,
# two copies of it are two, so the init, and from there the result, differ. The same holds for
# scikit-learn's own KMeans, which lists the same check. With a fixed init, weights and
# repeated rows give the same fit: test_weights_equal_repeated_rows_from_a_fixed_init.
_WEIGHTS_VS_REPEATS = "the random init draws per row, so weights and repeated rows start from different centroids"
EXPECTED_FAILED = {
    "check_sample_weight_equivalence_on_dense_data": _WEIGHTS_VS_REPEATS,
    "check_sample_weight_equivalence_on_sparse_data": _WEIGHTS_VS_REPEATS,
}


@pytest.mark.usefixtures("client")  # the checks build their own estimators: the default client
@pytest.mark.filterwarnings("ignore:Estimator KMeans does not inherit from")  # by design, see the module docstring
@parametrize_with_checks([KMeans(n_clusters=3, random_state=0, max_iter=20)],
                         expected_failed_checks=lambda est: EXPECTED_FAILED)
def test_scikit_learn_estimator_checks(estimator, check, monkeypatch):
    # The array API check runs (NumPy namespace only, as for any estimator without array API
    # support) where SciPy's array API mode is on; otherwise scikit-learn skips it.
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    check(estimator)


def test_weights_equal_repeated_rows_from_a_fixed_init(client):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 3))
    w = rng.integers(0, 4, 60)
    w[:3] = 1
    repeated = np.repeat(X, w, axis=0)
    a = KMeans(3, init=X[:3], tol=0, max_iter=100, client=client).fit(X, sample_weight=w.astype(float))
    b = KMeans(3, init=X[:3], tol=0, max_iter=100, client=client).fit(repeated)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.inertia_, b.inertia_, rtol=1e-12)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


def test_pipeline_clone_and_nested_params(client):
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 0.1, (200, 2)) for c in ((0, 0), (5, 5), (0, 5))]) * [1.0, 100.0]
    pipe = Pipeline([("scale", StandardScaler()), ("km", KMeans(5, random_state=1, client=client))])
    pipe.set_params(km__n_clusters=3)
    labels = pipe.fit(X).predict(X)
    assert sorted(np.bincount(labels)) == [200, 200, 200]
    direct = KMeans(3, random_state=1, client=client).fit(StandardScaler().fit_transform(X))
    np.testing.assert_array_equal(pipe["km"].cluster_centers_, direct.cluster_centers_)
    twin = clone(pipe["km"])
    assert twin.get_params() == pipe["km"].get_params() and not hasattr(twin, "cluster_centers_")
    assert twin.client is client  # shared: a handle to the cluster, not copied
    assert pipe.transform(X).shape == (600, 3)
    search = GridSearchCV(KMeans(random_state=0, client=client), {"n_clusters": [2, 3]}, cv=2).fit(X)
    assert search.best_params_ == {"n_clusters": 3}  # score is -inertia: more clusters, higher


def test_pickled_model_predicts_the_same_and_keeps_only_labels_in_memory(client):
    """Labels of in-memory data are NumPy and travel with the model, as scikit-learn's; lazy
    labels (of Dask data) are held by the fit's workers and do not."""
    X = np.random.default_rng(1).standard_normal((500, 4)).astype(np.float32)
    km = KMeans(4, random_state=0, client=client).fit(X)
    back = pickle.loads(pickle.dumps(km))
    assert back.client is None  # the client stays in its process
    np.testing.assert_array_equal(back.cluster_centers_, km.cluster_centers_)
    np.testing.assert_array_equal(back.predict(X), km.predict(X))
    assert back.transform(X).dtype == np.float32
    np.testing.assert_array_equal(back.labels_, km.labels_)
    lazy = pickle.loads(pickle.dumps(KMeans(4, random_state=0, client=client).fit(da.from_array(X, chunks=100))))
    with pytest.raises(NotFittedError, match=r"labels_ exists after fit\(\)"):
        lazy.labels_


def test_not_fitted_is_also_scikit_learns_error():
    with pytest.raises(SklearnNotFittedError, match="this KMeans is not fitted yet") as e:
        KMeans(2).predict(np.zeros((3, 2)))
    assert isinstance(e.value, NotFittedError) and isinstance(e.value, AttributeError)


def test_grid_search_with_two_processes_and_a_given_client(client):
    """The client stays in its process (it cannot be pickled): loky's processes fit on a local
    cluster of their own, with the same results as the given client's fits."""
    rng = np.random.default_rng(2)
    X = np.concatenate([rng.normal(c, 0.3, (80, 2)) for c in ((0, 0), (5, 0), (0, 5))])
    grid = {"n_clusters": [2, 3, 4]}
    two = GridSearchCV(KMeans(random_state=0, client=client), grid, cv=2, n_jobs=2).fit(X)
    one = GridSearchCV(KMeans(random_state=0, client=client), grid, cv=2, n_jobs=1).fit(X)
    np.testing.assert_array_equal(two.cv_results_["mean_test_score"], one.cv_results_["mean_test_score"])
    assert two.best_params_ == {"n_clusters": 4} and two.best_estimator_.client is client
