"""``daskmeans fit --max-imbalance R``: the command's model is the API's, with the moves in
its history (a bad bound is one usage line: ``test_options.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans import KMeans
from daskmeans.io.model_store import load_model
from clirun import run

K = 12


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("balance")
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(0, 1, (3000, 3)), rng.normal(8, 3, (300, 3))]).astype(np.float32)
    np.save(d / "x.npy", X)
    return X, str(d / "x.npy")


def test_the_command_balances_as_the_api_does(data, tmp_path, capsys, client):
    X, x = data
    model = tmp_path / "m.zarr"
    rc, _, err = run(capsys, "fit", x, "--k", K, "--seed", "2", "--max-iter", "20", "--max-imbalance", "1.5",
                     "--workers", "2", "-o", model, "-q")
    assert rc == 0, err
    centers, attrs, _ = load_model(str(model))
    km = KMeans(K, random_state=2, max_iter=20, max_imbalance=1.5, client=client).fit(X)
    assert np.array_equal(centers, km.cluster_centers_)
    assert attrs["params"]["max_imbalance"] == 1.5
    assert [h["n_moved"] for h in attrs["history"]] == [h["n_moved"] for h in km.history_]
    assert sum(h["n_moved"] for h in km.history_) > 0
