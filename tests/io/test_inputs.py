"""Inputs people have: pandas and Dask DataFrames, lists, SciPy sparse matrices, Dask arrays of
unknown chunk sizes, and random_state as a Generator or RandomState. Each gives the model the
same data as a NumPy array gives (bit for bit, from the same initial centroids)."""

from __future__ import annotations

import warnings

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from daskmeans import DaskmeansWarning, DataError, KMeans


@pytest.fixture(scope="module")
def X():
    rng = np.random.default_rng(4)
    # float32: the CPU path's result is then the same bits for any chunking (a DataFrame's
    # partitions are another chunking than the array's).
    return (rng.normal(scale=3, size=(5, 3))[rng.integers(0, 5, 900)] + rng.normal(size=(900, 3))).astype(np.float32)


@pytest.fixture(scope="module")
def reference(client, X):
    return KMeans(5, init=X[:5], client=client).fit(X)


@pytest.mark.parametrize("kind", ["pandas", "dask-dataframe", "list", "sparse", "unknown-chunks"])
def test_input_kinds_give_the_numpy_model(client, X, reference, kind):
    if kind == "pandas":
        inp = pd.DataFrame(X, columns=["a", "b", "c"])
    elif kind == "dask-dataframe":
        inp = dd.from_pandas(pd.DataFrame(X, columns=["a", "b", "c"]), npartitions=4)
    elif kind == "list":
        inp = X.tolist()
    elif kind == "sparse":
        inp = sp.csr_matrix(np.where(np.abs(X) > 1, X, 0.0))
    else:
        d = da.from_array(X, chunks=(200, 3))
        inp = d[da.from_array(np.ones(len(X), bool), chunks=200)]  # a boolean mask: unknown sizes
        assert np.isnan(inp.chunks[0][0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        km = KMeans(5, init=X[:5], client=client).fit(inp)
    if kind == "sparse":
        ref = KMeans(5, init=X[:5], client=client).fit(np.where(np.abs(X) > 1, X, 0.0))
    elif kind == "list":  # Python floats: float64, chunked as the array
        ref = KMeans(5, init=X[:5], client=client).fit(np.asarray(inp))
    else:
        ref = reference
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    assert km.n_iter_ == ref.n_iter_
    said = [str(w.message) for w in caught if issubclass(w.category, DaskmeansWarning)]
    assert ("X has unknown chunk sizes: computing them (one pass over X)" in said) == (kind == "unknown-chunks")


def test_dataframe_with_a_text_column_is_refused_by_name(client, X):
    df = pd.DataFrame({"a": X[:, 0], "name": ["x"] * len(X)})
    with pytest.raises(DataError, match=r"column 'name' of the DataFrame is not numeric \(dtype .*\): pass its "
                                        r"numeric columns"):
        KMeans(2, client=client).fit(df)


def test_other_objects_are_refused(client):
    with pytest.raises(DataError, match="X should be an array, a DataFrame or a path, got dict"):
        KMeans(2, client=client).fit({"a": [1, 2]})


@pytest.mark.parametrize("make", [np.random.default_rng, np.random.RandomState])
def test_random_state_generators_are_consumed_as_scikit_learn_does(client, X, make):
    seed = make(3).integers(0, 2**32) if make is np.random.default_rng else make(3).randint(0, 2**32, dtype=np.uint64)
    by_seed = KMeans(5, random_state=int(seed), client=client).fit(X)
    rs = make(3)
    by_gen = KMeans(5, random_state=rs, client=client).fit(X)
    np.testing.assert_array_equal(by_gen.cluster_centers_, by_seed.cluster_centers_)
    again = KMeans(5, random_state=rs, client=client).fit(X)  # the generator moved on
    assert again.get_params()["random_state"] is rs


def test_labels_after_the_client_closes_say_what_to_do(X):
    import logging

    from distributed import Client, LocalCluster

    from daskmeans import DaskmeansError, NotFittedError

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR) as lc, Client(lc, set_as_default=False) as c:
        # Dask input: labels_ stays lazy, held by the workers (NumPy input's labels_ are NumPy).
        km = KMeans(3, init=X[:3], client=c).fit(da.from_array(X, chunks=(len(X) // 2, -1)))
        labels = c.compute(km.labels_).result()
        assert labels.shape == (len(X),)
    with pytest.raises(DaskmeansError, match=r"labels_ is held by the workers of the fit's cluster, whose client "
                                             r"is closed: compute it .* before closing the client, or use "
                                             r"km.predict\(X\)"):
        km.labels_
    with pytest.raises(NotFittedError, match=r"labels_ exists after fit\(\)"):
        KMeans(3).labels_
