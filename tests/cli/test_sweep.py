"""``daskmeans sweep`` and ``daskmeans.sweep``: the elbow rule on a hand-made curve, the
scores against scikit-learn's, and the command end to end on blobs (summary, elbow, PNG)."""

import json
import struct

import numpy as np
import pytest
from sklearn.metrics import davies_bouldin_score, silhouette_score

pytest.importorskip("matplotlib")  # the [plot] extra; CI installs it with [test]

from daskmeans.cli import main  # noqa: E402
from daskmeans.datasets import make_blobs  # noqa: E402
from daskmeans.io.model_store import write_array  # noqa: E402
from daskmeans.sweep import davies_bouldin, elbow, parse_ks, silhouette, sweep  # noqa: E402


def test_elbow_is_the_point_farthest_below_the_chord():
    # Normalised: x = 0, .25, .5, .75, 1 and log(inertia) y = 1, .579, .458, .292, 0; the chord is
    # y = 1 - x, so the points lie .171, .042, -.042 below it: K = 2 is the elbow.
    assert elbow([1, 2, 3, 4, 5], [110, 40, 30, 20, 10]) == 2
    assert elbow([2, 4, 8, 16], [100, 50, 5, 4]) == 8
    assert elbow([1, 2], [10, 1]) is None and elbow([1, 2, 3], [5, 5, 5]) is None


def test_parse_ks():
    assert parse_ks("8, 2-4,16,3") == [2, 3, 4, 8, 16]
    with pytest.raises(ValueError, match="'0' should be K >= 1"):
        parse_ks("0,2")
    with pytest.raises(ValueError, match="'x' is not an integer or a range such as 2-10"):
        parse_ks("2,x")


def test_scores_equal_scikit_learns():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, 1.0, (150, 3)) for c in (0, 4, 9)])
    for labels in (np.repeat([0, 1, 2], 150), rng.integers(0, 5, 450), np.r_[np.zeros(449, int), 7]):
        assert silhouette(x, labels) == pytest.approx(silhouette_score(x, labels), rel=1e-8)
        assert davies_bouldin(x, labels) == pytest.approx(davies_bouldin_score(x, labels), rel=1e-8)
    assert silhouette(x, np.zeros(450, int)) is None and davies_bouldin(x, np.zeros(450, int)) is None


def test_api_sweep_is_deterministic_and_keeps_the_models(client):
    X, _ = make_blobs(6000, 4, 5, random_state=3)
    a = sweep(X, [7, 3, 5, 1], sample=500, random_state=1, client=client)
    b = sweep(X.rechunk(1000), [1, 3, 5, 7], sample=500, random_state=1, client=client)
    assert a.ks == [1, 3, 5, 7] and [m.n_clusters for m in a.models] == a.ks
    assert a.inertia == pytest.approx(b.inertia, rel=1e-10) and a.silhouette == b.silhouette
    assert a.silhouette[0] is None and a.inertia[0] > a.inertia[-1]
    assert a.elbow == 5 and a.to_dict()["format"] == "daskmeans-sweep"


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_command_picks_8_on_blobs_and_writes_the_plot(tmp_path, capsys):
    # 2e5 x 16 here (the 1e6 x 16 case behaves the same, run by hand); 8 well-separated centres.
    data = str(tmp_path / "blobs.zarr")
    assert main(["generate", "blobs", "--n", "200000", "--d", "16", "--centers", "8", "--seed", "5", "-o", data]) == 0
    out, png = tmp_path / "sweep.json", tmp_path / "elbow.png"
    rc = main(["sweep", data, "--k", "2,4,6,8,10,12,16", "-o", str(out), "--plot", str(png), "--sample", "2000",
               "--workers", "2", "--n-init", "2"])
    err = capsys.readouterr().err
    assert rc == 0, err
    doc = json.loads(out.read_text())
    assert doc["elbow"] == 8 and doc["ks"] == [2, 4, 6, 8, 10, 12, 16] and doc["n_samples"] == 200000
    assert doc["sample_rows"] == 2000 and max(doc["silhouette"]) == doc["silhouette"][3]  # also best at 8
    assert "daskmeans: elbow at K=8" in err and "daskmeans: K=8: inertia " in err
    assert _png_size(png) == (1040, 440)  # the figure's 10.4 x 4.4 inches at 100 dpi
    # A file that is not a summary is never replaced, even with --overwrite.
    other = tmp_path / "notes.json"
    other.write_text("{}")
    assert main(["sweep", data, "--k", "2,3", "-o", str(other), "--overwrite", "--workers", "1"]) == 1
    assert capsys.readouterr().err == (f"daskmeans: error: {other} is not a daskmeans sweep summary: --overwrite "
                                       f"replaces only one\n")


def test_command_errors_are_one_line(tmp_path, capsys):
    data = str(tmp_path / "small.zarr")
    write_array(make_blobs(50, 2, 2, random_state=0)[0], data)
    with pytest.raises(SystemExit) as e:
        main(["sweep", data, "--k", "0,4"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--k 0,4: '0' should be K >= 1 (or a range low-high with 1 <= "
                                                    "low <= high) (see daskmeans sweep --help)")
    assert main(["sweep", data, "--k", "2,60", "-o", str(tmp_path / "s.json"), "--workers", "1"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == "daskmeans: error: n_samples=50 should be >= n_clusters=60"
    assert not (tmp_path / "s.json").exists()
