"""``daskmeans fit --max-samples-per-cluster N``: the fit trains on N x K rows drawn
from ``--seed`` and writes every row's labels (bad values are one usage line: ``test_options.py``)."""

from __future__ import annotations


import numpy as np
import pytest
import zarr

from daskmeans import KMeans
from daskmeans.io.model_store import load_model
from clirun import run

N_ROWS, K = 6000, 5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("sample")
    rng = np.random.default_rng(4)
    centres = rng.uniform(-6, 6, size=(K, 3))
    X = (centres[rng.integers(0, K, N_ROWS)] + rng.normal(size=(N_ROWS, 3))).astype(np.float32)
    np.save(d / "x.npy", X)
    return X, str(d / "x.npy")


def test_the_fit_trains_on_the_sample_and_labels_every_row(data, tmp_path, capsys, client):
    X, x = data
    model, labels = tmp_path / "m.zarr", tmp_path / "l.zarr"
    rc, _, err = run(capsys, "fit", x, "--k", K, "--seed", "3", "--max-samples-per-cluster", "60", "--workers", "2",
                     "--labels", labels, "-o", model)  # not -q: the sample's line is part of the summary
    assert rc == 0, err
    centers, attrs, _ = load_model(str(model))
    # The API's model of the same parameters, on another cluster and chunking.
    km = KMeans(K, random_state=3, max_samples_per_cluster=60, client=client).fit(X)
    assert np.array_equal(centers, km.cluster_centers_)
    assert (attrs["n_samples_fit"], attrs["params"]["max_samples_per_cluster"]) == (300, 60)
    assert f"daskmeans: trained on a sample of 300 of {N_ROWS} rows (sample inertia {km.sample_inertia_:.6e}); " \
           f"the inertia below is over every row\n" in err
    assert f"inertia {km.inertia_:.6e}" in err
    written = zarr.open_group(str(labels), mode="r")["labels"][:]
    assert written.shape == (N_ROWS,) and np.array_equal(written, km.predict(X))


def test_a_checkpointed_fit_on_a_sample_without_a_seed_is_one_line(data, tmp_path, capsys):
    _, x = data
    ck = tmp_path / "ck.zarr"
    rc, _, err = run(capsys, "fit", x, "--k", K, "--max-samples-per-cluster", "60", "--checkpoint", ck,
                     "--workers", "1", "-o", tmp_path / "m.zarr", "-q")
    # Refused before any cluster starts: the error is the command's only line.
    assert (rc, err) == (1, f"daskmeans: error: max_samples_per_cluster=60 with checkpoint='{ck}' needs an int "
                            f"random_state (--seed): the sample is drawn from it, and a resumed fit must draw the "
                            f"same one\n")
    assert not ck.exists() and not (tmp_path / "m.zarr").exists()
