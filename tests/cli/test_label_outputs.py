"""Labels outputs by suffix (issue 47): ``predict -o`` and ``fit --labels`` write ``.zarr``,
``.npy``, ``.csv`` or ``.parquet`` (``-o labels.csv`` wrote a Zarr directory named
``labels.csv``), with ``--keep-columns`` of a CSV input beside the labels; an unknown suffix
is refused (tests/cli/test_options.py), and a failed write leaves nothing behind."""

from __future__ import annotations

import errno
import os

import numpy as np
import pandas as pd
import pytest
import zarr

from clirun import run
from daskmeans.cli import main

N = 300


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """A CSV with a text id (some with a comma: quoted), a model fitted on its features, and
    the Zarr labels every other format should equal."""
    d = tmp_path_factory.mktemp("labels")
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(m, 0.4, (N // 3, 2)) for m in (0, 4, 8)])
    df = pd.DataFrame(x, columns=["a", "b"])
    df.insert(0, "key", [f"u{i:04d}" if i % 7 else f"u{i:04d}, x" for i in range(N)])
    df.insert(1, "n", np.arange(N) * 3)
    df.to_csv(d / "data.csv", index=False)
    np.save(d / "data.npy", x)
    base = ["--workers", "1", "-q"]
    assert main([str(a) for a in ("fit", d / "data.csv", "--k", "3", "--seed", "0", "--drop-columns", "key,n",
                                  "-o", d / "m.zarr", "--labels", d / "train.zarr", *base)]) == 0
    assert main([str(a) for a in ("predict", d / "m.zarr", d / "data.csv", "--drop-columns", "key,n",
                                  "-o", d / "ref.zarr", *base)]) == 0
    return d


def predict(d, out, *flags):
    return ("predict", d / "m.zarr", d / "data.csv", "--drop-columns", "key,n", "-o", d / out, "--workers", "1", "-q",
            "--chunk-bytes", "2000", *flags)  # several chunks: the rows must come out in order


def zarr_labels(path):
    return zarr.open_group(str(path), mode="r")["labels"][:]


def read_back(path):
    """The labels of a file, as its own reader reads them."""
    suffix = os.path.splitext(str(path))[1]
    if suffix == ".npy":
        return np.load(path)
    if suffix == ".csv":
        return pd.read_csv(path)["label"].to_numpy()
    return pd.read_parquet(path)["label"].to_numpy()


@pytest.mark.parametrize("suffix", [".npy", ".csv", ".parquet", ".zarr", ""])
def test_each_suffix_is_its_format_and_equals_the_zarr_labels(d, capsys, suffix):
    rc, _, err = run(capsys, *predict(d, f"p{suffix}"))
    assert rc == 0 and err == "", err  # -q: nothing printed on success
    ref = zarr_labels(d / "ref.zarr")
    if suffix in (".zarr", ""):
        np.testing.assert_array_equal(zarr_labels(d / f"p{suffix}"), ref)
        return
    assert os.path.isfile(d / f"p{suffix}")  # a file its reader opens, not a Zarr directory
    got = read_back(d / f"p{suffix}")
    assert got.dtype == np.int32 or suffix == ".csv"
    np.testing.assert_array_equal(got, ref)
    if suffix == ".npy":
        assert np.load(d / "p.npy", mmap_mode="r").shape == (N,)
    if suffix == ".csv":
        assert (d / "p.csv").read_text().splitlines()[:2] == ["label", str(ref[0])]


def test_keep_columns_go_beside_the_labels_as_written(d, capsys):
    ref = zarr_labels(d / "ref.zarr")
    data = pd.read_csv(d / "data.csv", dtype={"key": str})
    rc, _, err = run(capsys, *predict(d, "k.csv", "--keep-columns", "key,n"))
    assert rc == 0, err
    got = pd.read_csv(d / "k.csv", dtype={"key": str})
    assert list(got.columns) == ["key", "n", "label"]
    assert got["key"].tolist() == data["key"].tolist() and got["n"].tolist() == data["n"].tolist()
    np.testing.assert_array_equal(got["label"].to_numpy(), ref)
    lines = (d / "k.csv").read_text().splitlines()
    assert lines[1] == f'"u0000, x",0,{ref[0]}' and lines[2] == f"u0001,3,{ref[1]}"  # quoted only where needed
    rc, _, err = run(capsys, *predict(d, "k.parquet", "--keep-columns", "n,key"))
    assert rc == 0, err
    pq = pd.read_parquet(d / "k.parquet")
    assert list(pq.columns) == ["n", "key", "label"] and pq["n"].dtype == np.int64
    assert pq["key"].tolist() == data["key"].tolist()
    np.testing.assert_array_equal(pq["label"].to_numpy(), ref)


def test_fit_writes_its_labels_by_suffix_with_kept_columns(d, capsys):
    rc, _, err = run(capsys, "fit", d / "data.csv", "--k", "3", "--seed", "0", "--drop-columns", "key,n",
                     "-o", d / "m2.zarr", "--labels", d / "train.csv", "--keep-columns", "key", "--workers", "1", "-q",
                     "--chunk-bytes", "2000")
    assert rc == 0, err
    got = pd.read_csv(d / "train.csv", dtype={"key": str})
    assert got["key"].tolist() == pd.read_csv(d / "data.csv", dtype={"key": str})["key"].tolist()
    np.testing.assert_array_equal(got["label"].to_numpy(), zarr_labels(d / "train.zarr"))


@pytest.mark.parametrize("argv, message", [
    (["predict", "{d}/m.zarr", "{d}/data.csv", "--drop-columns", "key,n", "-o", "{d}/x.npy", "--keep-columns", "key"],
     "--keep-columns writes columns beside the labels in a .csv or .parquet output, not {d}/x.npy"),
    (["predict", "{d}/m.zarr", "{d}/data.npy", "-o", "{d}/x.csv", "--keep-columns", "key"],
     "--keep-columns applies to CSV input only, not to {d}/data.npy"),
    (["predict", "{d}/m.zarr", "{d}/data.csv", "--drop-columns", "key,n", "-o", "{d}/x.csv", "--keep-columns", "id"],
     "column 'id' is not in {d}/data.csv; columns: ['key', 'n', 'a', 'b']"),
    (["fit", "{d}/data.csv", "--k", "3", "--drop-columns", "key,n", "-o", "{d}/x.zarr", "--keep-columns", "key"],
     "--keep-columns key writes columns beside the labels: it needs --labels PATH"),
], ids=["npy-output", "npy-input", "no-such-column", "fit-without-labels"])
def test_keep_columns_refused_where_they_cannot_go(d, capsys, argv, message):
    before = sorted(os.listdir(d))
    rc, out, err = run(capsys, *[a.format(d=d) for a in argv], "--workers", "1", "-q")
    assert rc == 1 and out == "" and err == f"daskmeans: error: {message.format(d=d)}\n"
    assert sorted(os.listdir(d)) == before


@pytest.mark.parametrize("suffix", [".npy", ".csv", ".parquet"])
def test_a_failed_write_leaves_nothing_and_the_previous_labels_intact(d, capsys, monkeypatch, suffix):
    """A full disk after the first block: one error line, no temporary or lock file, and an
    output that existed (--overwrite) byte for byte as it was."""
    from daskmeans.io import labels

    writer = {".npy": labels._NpyWriter, ".csv": labels._CsvWriter, ".parquet": labels._ParquetWriter}[suffix]
    calls = []

    def full(self, data):
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(self, data)

    original = writer.write
    monkeypatch.setattr(writer, "write", full)
    before = sorted(os.listdir(d))
    rc, _, err = run(capsys, *predict(d, f"fail{suffix}"))
    assert rc == 1 and err == f"daskmeans: error: cannot write {d / f'fail{suffix}'}: No space left on device\n", err
    assert sorted(os.listdir(d)) == before
    monkeypatch.undo()
    assert run(capsys, *predict(d, f"old{suffix}"))[0] == 0
    old = (d / f"old{suffix}").read_bytes()
    monkeypatch.setattr(writer, "write", full)
    calls.clear()
    before = sorted(os.listdir(d))
    rc, _, err = run(capsys, *predict(d, f"old{suffix}", "--overwrite"))
    assert rc == 1, err
    assert sorted(os.listdir(d)) == before and (d / f"old{suffix}").read_bytes() == old


@pytest.mark.parametrize("name, content, replaced", [
    ("user.csv", "id,label\n1,cat\n", False),  # a user's labels: not integers
    ("user2.csv", "a,b\n1,2\n", False),
    ("floats.npy", np.zeros(N, np.float32), False),
    ("matrix.npy", np.zeros((N, 1), np.int32), False),
    ("ints.npy", np.zeros(N, np.int32), True),  # as daskmeans writes them: the format has no mark
    ("old.csv", "label\n3\n", True),
], ids=lambda v: v if isinstance(v, str) else "")
def test_overwrite_replaces_only_labels(d, capsys, name, content, replaced):
    path = d / name
    if isinstance(content, str):
        path.write_text(content)
    else:
        np.save(path, content)
    before = path.read_bytes()
    rc, _, err = run(capsys, *predict(d, name, "--overwrite"))
    if replaced:
        assert rc == 0, err
        np.testing.assert_array_equal(read_back(path), zarr_labels(d / "ref.zarr"))
    else:
        assert rc == 1 and err == (f"daskmeans: error: {path} is not a daskmeans labels output (a file): --overwrite "
                                   f"replaces only a daskmeans labels output\n"), err
        assert path.read_bytes() == before
