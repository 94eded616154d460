"""The output's kind follows the input's: in-memory in, NumPy out; CuPy in, CuPy out; Dask
arrays and DataFrames and paths in, lazy Dask arrays out. The values are the same for every
kind, and those of scikit-learn from the same centroids."""

from __future__ import annotations

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans as SkKMeans

from daskmeans import KMeans


@pytest.fixture(scope="module")
def setup(client, tmp_path_factory):
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(c, 0.5, (50, 3)) for c in (0, 4, 8)])
    init = X[[0, 50, 100]]
    km = KMeans(3, init=init, tol=0, max_iter=30, client=client).fit(X)
    sk = SkKMeans(3, init=init, n_init=1, tol=0, max_iter=30, algorithm="lloyd").fit(X)
    path = str(tmp_path_factory.mktemp("out") / "x.npy")
    np.save(path, X)
    return X, km, sk, path


def kinds(X, path):
    columns = ["p", "q", "r"]
    return {
        "numpy": (X, np.ndarray),
        "list": (X.tolist(), np.ndarray),
        "pandas": (pd.DataFrame(X, columns=columns), np.ndarray),
        "sparse": (sp.csr_matrix(X), np.ndarray),
        "dask": (da.from_array(X, chunks=40), da.Array),
        "dask-dataframe": (dd.from_pandas(pd.DataFrame(X, columns=columns), npartitions=3), da.Array),
        "path": (path, da.Array),
    }


@pytest.mark.parametrize("kind", ["numpy", "list", "pandas", "sparse", "dask", "dask-dataframe", "path"])
@pytest.mark.filterwarnings("ignore:X has feature names:UserWarning")  # fitted on an ndarray
def test_predict_transform_fit_predict_follow_the_input(setup, kind, client):
    X, km, sk, path = setup
    data, expected = kinds(X, path)[kind]
    labels, dist = km.predict(data), km.transform(data)
    assert type(labels) is expected and type(dist) is expected
    if expected is da.Array:
        labels, dist = client.compute(labels).result(), client.compute(dist).result()
    assert labels.dtype == np.int32 and dist.shape == (150, 3)
    np.testing.assert_array_equal(labels, sk.predict(X))
    np.testing.assert_allclose(dist, sk.transform(X), rtol=1e-12, atol=1e-12)
    assert isinstance(km.score(data), float)
    np.testing.assert_allclose(km.score(data), sk.score(X), rtol=1e-12)
    again = KMeans(3, init=X[[0, 50, 100]], tol=0, max_iter=30, client=client)
    fp = again.fit_predict(data)
    assert type(fp) is expected
    np.testing.assert_array_equal(fp if expected is np.ndarray else client.compute(fp).result(), sk.labels_)


@pytest.mark.gpu
def test_cupy_in_cupy_out(setup, client):
    import cupy

    X, km, sk, _ = setup
    labels, dist = km.predict(cupy.asarray(X)), km.transform(cupy.asarray(X))
    assert isinstance(labels, cupy.ndarray) and isinstance(dist, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(labels), sk.predict(X))
    np.testing.assert_allclose(cupy.asnumpy(dist), sk.transform(X), rtol=1e-9)
