"""Damaged models as issue 42 met them: each once predicted garbage with exit 0 (a NaN
centroid took every row, centroids of 1e300 sent every row to cluster 0, 7 centroids under
``n_clusters=3`` wrote 7 labels) or ended in a traceback (a bad metric, a garbage history,
centroids of shape (3, 5) or transposed). Each is now refused in one line naming the path and
what is wrong, by ``predict``, ``info`` and ``plot`` (rc 1, nothing written) and by
``daskmeans.load``; and every model the fronts write loads verified."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

import daskmeans
from clirun import run
from daskmeans.cli import main
from daskmeans.errors import DataError
from daskmeans.io import model_store


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A model of 3 clusters over 300 x 4 float64 rows written by ``daskmeans fit``, and its
    data: ``(directory, centroids, attributes, sizes)``."""
    d = tmp_path_factory.mktemp("model")
    rng = np.random.default_rng(0)
    np.save(d / "x.npy", rng.normal(size=(3, 4))[rng.integers(0, 3, 300)] * 5 + rng.normal(size=(300, 4)))
    assert main(["fit", str(d / "x.npy"), "--k", "3", "--seed", "0", "--workers", "1", "-q",
                               "-o", str(d / "good.zarr")]) == 0
    centers, attrs, sizes = model_store.load_model(str(d / "good.zarr"))
    assert centers.dtype == np.float64 and attrs["format_version"] == 2
    return d, centers, attrs, sizes


def _version_1(path, centers, attrs, sizes):
    """The model as daskmeans wrote it before the checksum (format_version 1, as users keep
    them), with whatever was changed in it."""
    attrs = {k: v for k, v in attrs.items() if k != "checksum"}
    arrays = {"cluster_centers": centers} if sizes is None else {"cluster_centers": centers, "cluster_sizes": sizes}
    model_store.write_group(str(path), arrays, {**attrs, "format_version": 1})


def _nan(c, a):
    c[1, 2] = np.nan


def _huge(c, a):
    c[:] = 1e300


def _seven(c, a):
    return np.concatenate([c, c, c[:1]]), a


def _bad_metric(c, a):
    a["params"]["metric"] = "manhattan"


def _garbage_history(c, a):
    a["history"] = [f"iteration {i}" for i in range(a["n_iter"])]


def _five_features(c, a):
    return np.concatenate([c, c[:, :1]], axis=1), a


def _transposed(c, a):
    return c.T.copy(), a


# The damage, and what the message says is wrong (after "PATH is damaged: ").
DAMAGE = {
    "nan centroid": (_nan, "cluster_centers[1, 2] is nan; every centroid value should be finite"),
    "1e300 centroids": (_huge, "centroid 0 has a squared norm of inf (values up to 1e+300), above 4.49e+307 "
                               "(a quarter of the largest float64): every squared distance to it overflows"),
    "7 centroids": (_seven, "cluster_centers has shape (7, 4); the attributes say n_clusters=3, n_features_in=4"),
    "bad metric": (_bad_metric, "params.metric='manhattan' should be one of 'euclidean', 'cosine'"),
    "garbage history": (_garbage_history, "history entry 1 should be a record of numbers iteration, inertia, shift, "
                                          "reassigned, n_empty"),
    "shape (3, 5)": (_five_features, "cluster_centers has shape (3, 5); the attributes say n_clusters=3, "
                                     "n_features_in=4"),
    "transposed": (_transposed, "cluster_centers has shape (4, 3); the attributes say n_clusters=3, n_features_in=4"),
}


@pytest.fixture(params=list(DAMAGE))
def damaged(request, fitted, tmp_path):
    """``(directory, model path, message)``: a version-1 model with one of :data:`DAMAGE`, in
    a directory of its own beside a copy of the data."""
    d, centers, attrs, sizes = fitted
    edit, message = DAMAGE[request.param]
    c, a = centers.copy(), json.loads(json.dumps(attrs))
    c, a = edit(c, a) or (c, a)
    _version_1(tmp_path / "m.zarr", c, a, sizes)
    os.symlink(d / "x.npy", tmp_path / "x.npy")
    return tmp_path, str(tmp_path / "m.zarr"), message


COMMANDS = {
    "info": lambda m, d: ["info", m],
    "info --json": lambda m, d: ["info", m, "--json"],
    "predict": lambda m, d: ["predict", m, d / "x.npy", "-o", d / "labels.zarr", "--workers", "1", "-q"],
    "plot": lambda m, d: ["plot", m, "-o", d / "report.png"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_damaged_model_is_one_error_line(capsys, damaged, command):
    d, model, message = damaged
    before = sorted(os.listdir(d))
    rc, out, err = run(capsys, *COMMANDS[command](model, d))
    assert rc == 1 and out == "", (out, err)
    assert err.startswith(f"daskmeans: error: {model} is damaged: {message}") and err.count("\n") == 1, err
    assert err.endswith("\n") and "Traceback" not in err
    assert sorted(os.listdir(d)) == before  # no labels, no image, no lock or temporary left


def test_daskmeans_load_raises_the_same_error(damaged):
    d, model, message = damaged
    for load in (daskmeans.load, daskmeans.KMeans.load, daskmeans.MiniBatchKMeans.load):
        with pytest.raises(DataError, match=f"^{model} is damaged: ") as e:
            load(model)
        assert message in str(e.value)


def test_a_changed_attribute_fails_the_checksum(fitted, capsys, tmp_path):
    """A model of format 2 whose attribute was edited after it was written (still consistent:
    only the checksum can tell)."""
    d, centers, attrs, sizes = fitted
    model = tmp_path / "m.zarr"
    model_store.save_model(str(model), centers, {k: v for k, v in attrs.items() if k not in ("format", "checksum")},
                           sizes)
    meta = model / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["params"]["n_clusters"] = 3  # unchanged: the checksum still holds
    meta.write_text(json.dumps(doc))
    assert daskmeans.load(str(model)).n_clusters == 3
    doc["attributes"]["inertia"] /= 2
    meta.write_text(json.dumps(doc))
    message = f"{model} is damaged: checksum mismatch (the model was changed after it was written); fit it again"
    for command in ("info", "predict"):
        rc, out, err = run(capsys, *COMMANDS[command](str(model), d))
        assert (rc, out, err) == (1, "", f"daskmeans: error: {message}\n")
    with pytest.raises(DataError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        daskmeans.load(str(model))
    assert sorted(os.listdir(tmp_path)) == ["m.zarr"]


def test_a_parameter_its_constraint_refuses(fitted, capsys, tmp_path):
    """What predict reads of the parameters (precision, tier...) is checked as the model
    loads, not met as a traceback inside predict."""
    d, centers, attrs, sizes = fitted
    a = json.loads(json.dumps(attrs))
    a["params"]["precision"] = "fp99"
    _version_1(tmp_path / "m.zarr", centers, a, sizes)
    rc, out, err = run(capsys, *COMMANDS["predict"](str(tmp_path / "m.zarr"), d))
    assert rc == 1 and err.startswith(f"daskmeans: error: {tmp_path / 'm.zarr'} is damaged: its parameters: "
                                      f"precision='fp99' should be") and err.count("\n") == 1, err


def test_a_consistent_version_1_model_still_predicts(fitted, capsys, tmp_path):
    """Users keep models of format 1 (no checksum): read with the consistency checks only."""
    d, centers, attrs, sizes = fitted
    _version_1(tmp_path / "v1.zarr", centers, attrs, sizes)
    os.symlink(d / "x.npy", tmp_path / "x.npy")
    rc, out, err = run(capsys, "info", tmp_path / "v1.zarr")
    assert rc == 0 and "format 1" in out, err
    rc, out, err = run(capsys, *COMMANDS["predict"](str(tmp_path / "v1.zarr"), tmp_path))
    assert rc == 0, err
    import zarr

    labels = zarr.open_group(str(tmp_path / "labels.zarr"), mode="r")["labels"][:]
    np.testing.assert_array_equal(labels, daskmeans.load(str(d / "good.zarr")).predict(np.load(d / "x.npy")))


# ---------------------------------------------------------------- every front's model loads verified


def _fronts(client, x):
    """Each front's fit: ``(estimator, the data it was fitted on)``."""
    x32 = x.astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
    return {
        "KMeans float32": lambda: (daskmeans.KMeans(3, random_state=0, client=client).fit(x32), x32),
        "KMeans cosine, n_init 2, a sample": lambda: (daskmeans.KMeans(
            3, metric="cosine", n_init=2, max_samples_per_cluster=40, random_state=1, client=client).fit(x), x),
        "KMeans init array, balanced, names": lambda: (daskmeans.KMeans(
            3, init=x[:3], max_imbalance=1.5, client=client).fit(frame), frame),
        "MiniBatchKMeans": lambda: (daskmeans.MiniBatchKMeans(3, batch_size=64, random_state=0, client=client).fit(x), x),
        "MiniBatchKMeans no labels": lambda: (daskmeans.MiniBatchKMeans(
            3, batch_size=64, compute_labels=False, random_state=0, client=client).fit(x32), x32),
    }


FRONTS = ["KMeans float32", "KMeans cosine, n_init 2, a sample", "KMeans init array, balanced, names",
          "MiniBatchKMeans", "MiniBatchKMeans no labels"]


@pytest.mark.parametrize("front", FRONTS)
def test_every_model_a_front_saves_loads_verified(client, fitted, capsys, tmp_path, front):
    est, x = _fronts(client, np.load(fitted[0] / "x.npy"))[front]()
    est.save(str(tmp_path / "m.zarr"))
    centers, attrs, sizes = model_store.load_model(str(tmp_path / "m.zarr"))
    assert attrs["format_version"] == 2 and len(attrs["checksum"]) == 64
    np.testing.assert_array_equal(centers, est.cluster_centers_)
    loaded = daskmeans.load(str(tmp_path / "m.zarr"))
    np.testing.assert_array_equal(loaded.predict(x), est.predict(x))
    assert run(capsys, "info", tmp_path / "m.zarr")[0] == 0


def test_the_command_s_model_loads_verified(fitted, capsys, tmp_path):
    """``daskmeans fit`` (checkpointed, balanced, float32 data, with labels): its model loads
    verified, and the one of the module's fixture is this front's too."""
    d = fitted[0]
    np.save(tmp_path / "x32.npy", np.load(d / "x.npy").astype(np.float32))
    rc, out, err = run(capsys, "fit", tmp_path / "x32.npy", "--k", "3", "--seed", "0", "--workers", "1", "-q",
                       "--max-imbalance", "1.5", "--checkpoint", tmp_path / "c.zarr", "--labels", tmp_path / "l.zarr",
                       "-o", tmp_path / "m.zarr")
    assert rc == 0, err
    centers, attrs, _ = model_store.load_model(str(tmp_path / "m.zarr"))
    assert centers.dtype == np.float32 and attrs["format_version"] == 2 and len(attrs["checksum"]) == 64
    assert run(capsys, "info", tmp_path / "m.zarr")[0] == 0


def test_the_fit_refuses_data_that_would_make_an_overflowing_model(client):
    """The bound a model's centroids are held to is the one the fit puts on the data: every
    centroid is a mean of rows, so no fit writes a model that load refuses."""
    x = np.ones((20, 2))
    x[0, 0] = 1e300
    with pytest.raises(DataError, match="X's values are too large for float64 distances"):
        daskmeans.KMeans(2, client=client).fit(x)
