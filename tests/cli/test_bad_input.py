"""Bad input at the command line: one line naming the problem and the value, exit status 1,
no traceback, and nothing new written (an existing output stays byte-identical). Input
that is accepted but changed or odd is said so in a warning line."""

from __future__ import annotations

import contextlib
import io
import os

import numpy as np
import pytest
import zarr

from daskmeans.cli import main


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    np.save(d / "ok.npy", rng.normal(size=(100, 3)).astype(np.float32))
    (d / "empty.npy").write_bytes(b"")
    (d / "empty.csv").write_text("")
    (d / "notzarr").mkdir()
    (d / "notzarr" / "readme.txt").write_text("not a store")
    np.save(d / "zero.npy", np.zeros((0, 3), np.float32))
    np.save(d / "oned.npy", np.zeros(10, np.float32))
    np.save(d / "threed.npy", np.zeros((4, 3, 2), np.float32))
    raw = (d / "ok.npy").read_bytes()
    (d / "trunc.npy").write_bytes(raw[: len(raw) // 2])
    (d / "text.csv").write_text("a,b\n1,2\n3,x\n5,6\n")
    (d / "late.csv").write_text("a,b\n" + "".join(f"{i},{i}\n" for i in range(300)) + "7,oops\n")
    (d / "ragged.csv").write_text("a,b\n1,2\n3,4\n5\n7,8\n")
    x = rng.normal(size=(50, 2))
    x[7, 1], x[9, 0] = np.nan, np.inf
    np.save(d / "nan.npy", x)
    np.save(d / "init35.npy", np.zeros((3, 5)))
    g = zarr.open_group(str(d / "grp.zarr"), mode="w")
    g.create_array("a", data=np.ones((10, 2)))
    g.create_array("b", data=np.ones((10, 2)))
    zarr.open_group(str(d / "notmodel.zarr"), mode="w").create_array("x", data=np.ones((3, 2)))
    for out in ("model.zarr", "existing.zarr"):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(["fit", str(d / "ok.npy"), "--k", "3", "--workers", "1", "-q", "-o", str(d / out)])
        assert rc == 0, err.getvalue()
    # predict --overwrite replaces only a labels output: the one its bad input must leave intact
    with contextlib.redirect_stderr(io.StringIO()) as err:
        rc = main(["predict", str(d / "model.zarr"), str(d / "ok.npy"), "--workers", "1", "-o", str(d / "labels.zarr")])
    assert rc == 0, err.getvalue()
    return d


def _tree(path) -> dict:
    return {p: open(os.path.join(r, p), "rb").read() for r, _, fs in os.walk(path) for p in fs}


CASES = [
    # (argv with {d}, the message's parts). Option values out of range (--k 0, --tol -1...)
    # are usage errors found while parsing: tests/cli/test_options.py.
    (["fit", "{d}/missing.npy", "--k", "2"], ["no such file or directory: {d}/missing.npy"]),
    (["fit", "{d}/empty.npy", "--k", "2"], ["{d}/empty.npy is empty"]),
    (["fit", "{d}/empty.csv", "--k", "2"], ["{d}/empty.csv is empty"]),
    (["fit", "{d}/notzarr", "--k", "2"], ["cannot open {d}/notzarr as Zarr"]),
    (["fit", "{d}/grp.zarr", "--k", "2"], ["{d}/grp.zarr is a Zarr group with arrays ['a', 'b']", "--dataset"]),
    (["fit", "{d}/zero.npy", "--k", "2"], ["X has 0 sample(s) (shape=(0, 3)) while a minimum of 1 is required"]),
    (["fit", "{d}/oned.npy", "--k", "2"], ["X should be 2-D (n_samples, n_features), got shape (10,)"]),
    (["fit", "{d}/threed.npy", "--k", "2"], ["X should be 2-D (n_samples, n_features), got shape (4, 3, 2)"]),
    (["fit", "{d}/trunc.npy", "--k", "2"], ["cannot read {d}/trunc.npy as .npy"]),
    (["fit", "{d}/text.csv", "--k", "2"], ["column 'b' of {d}/text.csv is not numeric (line 3 has 'x')"]),
    (["fit", "{d}/late.csv", "--k", "2", "--workers", "1"],
     ["column 'b' of {d}/late.csv is not numeric (line 302 has 'oops')"]),
    (["fit", "{d}/ragged.csv", "--k", "2", "--workers", "1"],
     ["X contains 1 NaN or infinite value(s), the first in row 2 (rows of data counted from 0; in a CSV file with a "
      "header that is line 4)", "an empty or missing field reads as NaN"]),
    (["fit", "{d}/nan.npy", "--k", "2", "--workers", "1"], ["X contains 2 NaN or infinite value(s), the first in row 7"]),
    (["fit", "{d}/ok.npy", "--k", "101"], ["n_samples=100 should be >= n_clusters=101"]),
    (["fit", "{d}/ok.npy", "--k", "3", "--init", "{d}/init35.npy"],
     ["init array has shape (3, 5), should be (n_clusters, n_features) = (3, 3)"]),
    (["fit", "{d}/ok.npy", "--k", "3", "--init", "{d}/nope.npy"], ["--init '{d}/nope.npy' should be k-means||"]),
    (["fit", "{d}/ok.npy", "--k", "3", "-o", "{d}/no/such/dir/m.zarr"], ["{d}/no/such/dir does not exist"]),
    (["fit", "{d}/ok.npy", "--k", "3", "-o", "{d}/existing.zarr"], ["{d}/existing.zarr exists", "--overwrite"]),
    (["fit", "{d}/ok.npy", "--k", "3", "-o", "{d}/ok.npy", "--overwrite"], ["{d}/ok.npy"]),
    (["predict", "{d}/model.zarr", "{d}/nan.npy", "-o", "{d}/labels.zarr", "--overwrite"],
     ["X has 2 features, but KMeans is expecting 3 features as input"]),
    (["predict", "{d}/missing.zarr", "{d}/ok.npy", "-o", "{d}/labels.zarr", "--overwrite"],
     ["no such model: {d}/missing.zarr"]),
    (["predict", "{d}/notmodel.zarr", "{d}/ok.npy", "-o", "{d}/labels.zarr", "--overwrite"],
     ["{d}/notmodel.zarr is not a daskmeans model"]),
    (["info", "{d}/notmodel.zarr"], ["{d}/notmodel.zarr is not a daskmeans model"]),
    (["info", "{d}/missing.zarr"], ["no such model: {d}/missing.zarr"]),
]


@pytest.mark.parametrize("argv, needles", CASES, ids=[" ".join(a[:2]) + f" {i}" for i, (a, _) in enumerate(CASES)])
def test_bad_input_is_one_line_and_writes_nothing(d, capsys, argv, needles):
    argv = [a.format(d=d) for a in argv]
    if argv[0] == "fit" and "-o" not in argv:
        argv += ["-o", str(d / "never.zarr")]
    before = sorted(os.listdir(d))
    existing = _tree(d / "existing.zarr"), _tree(d / "labels.zarr")
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("daskmeans: error: ") and "Traceback" not in err, err
    for n in needles:
        assert n.format(d=d) in last, (n, last)
    assert sorted(os.listdir(d)) == before  # nothing new, not even a hidden temporary directory
    assert (_tree(d / "existing.zarr"), _tree(d / "labels.zarr")) == existing


@pytest.mark.parametrize("data, dtype", [("f16", np.float16), ("ints", np.int64)])
def test_float16_and_integer_data_are_converted_and_said_so(d, capsys, data, dtype):
    x = np.random.default_rng(1).normal(scale=20, size=(60, 2)).astype(dtype)
    np.save(d / f"{data}.npy", x)
    rc = main(["fit", str(d / f"{data}.npy"), "--k", "3", "--workers", "1", "-q", "-o", str(d / f"{data}-m.zarr")])
    err = capsys.readouterr().err
    want = "float32" if dtype == np.float16 else "float64"
    assert rc == 0, err
    assert f"daskmeans: warning: X is {np.dtype(dtype)}: converted to {want} for clustering" in err
    assert zarr.open_group(str(d / f"{data}-m.zarr"), mode="r")["cluster_centers"].dtype == want


def test_k_equal_to_n_samples_and_a_csv_header_are_accepted(d, capsys):
    (d / "hdr.csv").write_text("x,y\n" + "".join(f"{i},{i * i % 7}\n" for i in range(12)))
    rc = main(["fit", str(d / "hdr.csv"), "--k", "12", "--workers", "1", "-q", "-o", str(d / "all.zarr")])
    assert rc == 0, capsys.readouterr().err
    c = zarr.open_group(str(d / "all.zarr"), mode="r")
    assert c["cluster_centers"].shape == (12, 2) and c.attrs["inertia"] == 0


def test_fewer_distinct_points_than_clusters_is_a_warning(d, capsys):
    np.save(d / "dups.npy", np.ones((200, 2)))
    rc = main(["fit", str(d / "dups.npy"), "--k", "4", "--workers", "1", "-q", "-o", str(d / "dups.zarr")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert ("daskmeans: warning: at the end of the fit 3 of n_clusters=4 clusters are empty and 3 centroids are "
            "copies of others: the data has fewer distinct points than clusters") in err


@pytest.mark.parametrize("flags, message", [  # option values out of range: tests/cli/test_options.py
    (["--k", "3", "--resume"], "--resume needs --checkpoint PATH"),
    (["--k", "3", "--scheduler", "tcp://127.0.0.1:1", "--workers", "2"], "--workers 2 applies to a local cluster only"),
])
def test_invalid_parameters_fail_before_any_cluster_is_started_or_contacted(d, capsys, monkeypatch, flags, message):
    from daskmeans.cli import common

    def no_cluster(args):
        raise AssertionError("a cluster was started or contacted")

    monkeypatch.setattr(common, "connect", no_cluster)
    rc = main(["fit", str(d / "ok.npy"), *flags, "-o", str(d / "never.zarr")])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.strip().splitlines()[-1].startswith("daskmeans: error: ") and message in err, err
