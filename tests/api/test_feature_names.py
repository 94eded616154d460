"""feature_names_in_ from DataFrames, checked by predict/transform/score as scikit-learn does
(the messages compared with scikit-learn's own KMeans on the same data)."""

from __future__ import annotations

import warnings

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from sklearn.cluster import KMeans as SkKMeans

import daskmeans
from daskmeans import DataError, KMeans

NAMES = ["a", "b", "c", "d"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return pd.DataFrame(np.concatenate([rng.normal(c, 0.3, (60, 4)) for c in (0, 3, 6)]), columns=NAMES)


@pytest.fixture(scope="module")
def fitted(data, client):
    init = data.to_numpy()[[0, 60, 120]]
    ours = KMeans(3, init=init, client=client).fit(data)
    theirs = SkKMeans(3, init=init, n_init=1).fit(data)
    return ours, theirs


def sklearn_error(est, X, method="predict") -> str:
    with pytest.raises(ValueError) as e:
        getattr(est, method)(X)
    return str(e.value)


def test_feature_names_in_from_pandas_and_dask_dataframes(data, fitted, client):
    ours, theirs = fitted
    assert ours.feature_names_in_.dtype == object and ours.feature_names_in_.tolist() == NAMES
    np.testing.assert_array_equal(ours.feature_names_in_, theirs.feature_names_in_)
    ddf = dd.from_pandas(data, npartitions=3)
    km = KMeans(3, init=data.to_numpy()[[0, 60, 120]], client=client).fit(ddf)
    assert km.feature_names_in_.tolist() == NAMES
    np.testing.assert_array_equal(km.cluster_centers_, ours.cluster_centers_)  # same fit whatever the container


def test_anything_with_string_columns_has_feature_names(data, client):
    class Table:
        """Not a DataFrame: only an array with named columns."""

        def __init__(self, values, columns):
            self.values, self.columns = values, columns
            self.shape, self.dtype, self.ndim = values.shape, values.dtype, values.ndim

        def __array__(self, dtype=None, copy=None):
            return self.values

        def __getitem__(self, index):
            return self.values[index]

    km = KMeans(3, random_state=0, client=client).fit(Table(data.to_numpy(), ("w", "x", "y", "z")))
    assert km.feature_names_in_.tolist() == ["w", "x", "y", "z"]


@pytest.mark.parametrize("columns", [NAMES[::-1], ["a", "b", "c", "e"], ["a", "b", "c", "d", "e"], ["a", "b"]],
                         ids=["reversed", "renamed", "added", "dropped"])
@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_other_columns_raise_scikit_learns_error(data, fitted, columns, method):
    ours, theirs = fitted
    frame = pd.DataFrame(np.ones((5, len(columns))), columns=columns)
    expected = sklearn_error(theirs, frame, method)
    with pytest.raises(DataError) as e:
        getattr(ours, method)(frame)
    assert str(e.value) == expected
    assert isinstance(e.value, ValueError)


def test_reversed_columns_message(data, fitted):
    ours, _ = fitted
    with pytest.raises(ValueError, match="^The feature names should match those that were passed during fit.\n"
                                         "Feature names must be in the same order as they were in fit.\n$"):
        ours.predict(data[list(reversed(data.columns))])


def test_same_columns_predict_as_scikit_learn_without_warning(data, fitted):
    ours, theirs = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels = ours.predict(data)
    np.testing.assert_array_equal(labels, theirs.predict(data))
    assert sorted(np.bincount(labels).tolist()) == [60, 60, 60]


def test_warnings_where_scikit_learn_warns(data, fitted, client):
    ours, theirs = fitted
    with pytest.warns(UserWarning) as sk_w:
        theirs.predict(data.to_numpy())
    with pytest.warns(UserWarning) as w:
        plain = ours.predict(data.to_numpy())
    assert [str(m.message) for m in w] == [str(m.message) for m in sk_w]
    assert str(w[0].message) == "X does not have valid feature names, but KMeans was fitted with feature names"
    assert w[0].filename == __file__  # points at the caller

    unnamed = KMeans(3, init=data.to_numpy()[[0, 60, 120]], client=client).fit(data.to_numpy())
    assert not hasattr(unnamed, "feature_names_in_")
    sk_unnamed = SkKMeans(3, init=data.to_numpy()[[0, 60, 120]], n_init=1).fit(data.to_numpy())
    with pytest.warns(UserWarning) as sk_w:
        sk_unnamed.transform(data)
    with pytest.warns(UserWarning, match="^X has feature names, but KMeans was fitted without feature names$") as w:
        named = unnamed.predict(data)
    assert [str(m.message) for m in w] == [str(m.message) for m in sk_w]
    np.testing.assert_array_equal(named, plain)


def test_non_string_names_are_no_names_and_mixed_names_are_refused(data, client):
    numbered = pd.DataFrame(data.to_numpy())  # columns 0..3
    km = KMeans(3, random_state=0, client=client).fit(numbered)
    assert not hasattr(km, "feature_names_in_")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        km.predict(numbered)
    mixed = pd.DataFrame(data.to_numpy(), columns=["a", 1, "c", "d"])
    with pytest.raises(TypeError) as sk:
        SkKMeans(3, n_init=1).fit(mixed)
    with pytest.raises(TypeError) as e:
        KMeans(3, client=client).fit(mixed)
    assert str(e.value) == str(sk.value)


def test_refit_without_names_forgets_them(data, client):
    km = KMeans(3, random_state=0, client=client).fit(data)
    assert hasattr(km, "feature_names_in_")
    km.fit(data.to_numpy())
    assert not hasattr(km, "feature_names_in_")


def test_names_are_saved_with_the_model(data, fitted, tmp_path, client):
    ours, _ = fitted
    ours.save(str(tmp_path / "m.zarr"))
    back = daskmeans.load(str(tmp_path / "m.zarr"))
    back.client = client
    assert back.feature_names_in_.tolist() == NAMES
    with pytest.raises(DataError, match="Feature names must be in the same order"):
        back.predict(data[NAMES[::-1]])
    np.testing.assert_array_equal(back.predict(data), ours.predict(data))


# ---------------------------------------------------------------- files that name their columns (issue 47)


@pytest.fixture(scope="module")
def files(data, tmp_path_factory):
    d = tmp_path_factory.mktemp("named")
    data.to_csv(d / "x.csv", index=False)
    data[["a", "c", "b", "d"]].to_csv(d / "swapped.csv", index=False)
    np.savetxt(d / "plain.csv", data.to_numpy(), delimiter=",")
    ids = data.copy()
    ids.insert(1, "user_id", np.arange(len(data)))
    ids.to_csv(d / "ids.csv", index=False)
    z = zarr_array(d / "x.zarr", data.to_numpy())
    z.attrs["feature_names"] = NAMES
    return d


def zarr_array(path, values):
    import zarr

    return zarr.create_array(str(path), data=values)


def test_a_fit_from_a_csv_or_zarr_path_keeps_its_names(files, fitted, client, tmp_path):
    ours, _ = fitted
    init = ours.cluster_centers_
    for name in ("x.csv", "x.zarr"):
        km = KMeans(3, init=init, client=client).fit(str(files / name))
        assert km.feature_names_in_.dtype == object and km.feature_names_in_.tolist() == NAMES, name
    km.save(str(tmp_path / "m.zarr"))
    back = daskmeans.load(str(tmp_path / "m.zarr"))
    assert back.feature_names_in_.tolist() == NAMES
    back.client = client
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(back.predict(str(files / "x.csv")).compute(), ours.predict(data_of(files)))
    # a CSV model checks a DataFrame's names in scikit-learn's words, and the reverse
    with pytest.raises(DataError, match="^The feature names should match"):
        back.predict(data_of(files)[NAMES[::-1]])


def data_of(files):
    return pd.read_csv(files / "x.csv")


@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_a_csv_with_other_columns_is_one_line_naming_it(files, fitted, method):
    from daskmeans.errors import FeatureNamesError

    ours, _ = fitted
    with pytest.raises(FeatureNamesError) as e:
        getattr(ours, method)(str(files / "swapped.csv"))
    assert str(e.value) == (f"the columns of {files / 'swapped.csv'} are not the model's: its 2nd column is 'c' where "
                            f"the model's is 'b' (the same names in another order); they should be the model's, in "
                            f"its order (a, b, c, d)")
    assert e.value.fitted == tuple(NAMES) and e.value.given == ("a", "c", "b", "d")
    assert isinstance(e.value, ValueError)


def test_a_csv_without_a_header_warns_in_one_line_at_the_caller(files, fitted):
    from daskmeans.errors import FeatureNamesWarning

    ours, _ = fitted
    with pytest.warns(FeatureNamesWarning) as w:
        ours.predict(str(files / "plain.csv"))
    assert [str(m.message) for m in w] == [
        f"{files / 'plain.csv'} does not name its columns, but the model was fitted on named columns (a, b, c, d): "
        f"they are taken in that order, unchecked"]
    assert w[0].filename == __file__ and issubclass(w[0].category, UserWarning)


def test_an_id_column_of_a_csv_path_is_refused_unless_selected(files, client):
    with pytest.raises(DataError, match=r"^column 'user_id' of .*ids\.csv looks like an identifier \(integer values, "
                                        r"name 'user_id'\): drop it with --drop-columns user_id, or select it with "
                                        r"--columns to cluster on it$"):
        KMeans(3, client=client).fit(str(files / "ids.csv"))
    with pytest.raises(DataError, match="looks like an identifier"):
        daskmeans.MiniBatchKMeans(3, client=client).fit(str(files / "ids.csv"))
    with pytest.raises(DataError, match="looks like an identifier"):
        daskmeans.read(str(files / "ids.csv"))  # an array alone goes to a fit without its names
    from daskmeans.io.readers import read_table

    table = read_table(str(files / "ids.csv"), drop_columns="user_id")
    km = KMeans(3, random_state=0, client=client).fit(table)
    assert km.feature_names_in_.tolist() == NAMES
    selected = read_table(str(files / "ids.csv"), columns="a,user_id")
    assert selected.identifier_error is None
    assert KMeans(3, random_state=0, client=client).fit(selected).feature_names_in_.tolist() == ["a", "user_id"]
