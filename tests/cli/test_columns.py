"""The columns' names at the command line (issue 47): a model fitted from a CSV keeps its
header's names, ``predict`` refuses DATA whose columns are other names or in another order
(one line, exit 1, nothing written) and warns in one line where only one side has names, and
``fit`` refuses a column that numbers rows (an id) unless ``--columns`` selects it."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import zarr

import daskmeans
from clirun import run
from daskmeans.cli import main

NAMES = ["a", "b", "c"]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """Three blobs apart along b alone (so that a swap of b and c moves rows), as CSVs: the
    columns in order, swapped, renamed, without a header, with an id, with pandas' index."""
    d = tmp_path_factory.mktemp("columns")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 0.3, (40, 3)) + [0, m, 0] for m in (0, 5, 10)])
    df = pd.DataFrame(x, columns=NAMES)
    df.to_csv(d / "data.csv", index=False)
    df[["a", "c", "b"]].to_csv(d / "swapped.csv", index=False)
    df.rename(columns={"c": "z"}).to_csv(d / "renamed.csv", index=False)
    np.savetxt(d / "plain.csv", x, delimiter=",")
    np.save(d / "data.npy", x)
    ided = df.copy()
    ided.insert(0, "id", np.arange(1000, 1000 + len(df)))
    ided.to_csv(d / "ids.csv", index=False)
    df.to_csv(d / "indexed.csv")  # pandas writes its index as an unnamed first column
    return d


def _fit(d, data, out, *flags):
    assert main([str(a) for a in ("fit", d / data, "--k", "3", "--seed", "0", "--workers", "1", "-q", "-o", d / out,
                                  *flags)]) == 0


@pytest.fixture(scope="module")
def models(d, client):
    """A model fitted from data.csv by the command, one fitted in Python from a DataFrame, one
    from a .npy file (no names)."""
    _fit(d, "data.csv", "csv.zarr")
    _fit(d, "data.npy", "npy.zarr")
    km = daskmeans.KMeans(3, random_state=0, client=client).fit(pd.read_csv(d / "data.csv"))
    km.save(str(d / "frame.zarr"))
    return d


def _labels(path):
    return zarr.open_group(str(path), mode="r")["labels"][:]


def _nothing_new(d, before):
    assert sorted(os.listdir(d)) == before  # no output, no lock file, no temporary


def test_a_csv_fit_keeps_the_header_and_info_shows_it(models, capsys):
    d = models
    rc, out, _ = run(capsys, "info", d / "csv.zarr", "--json")
    assert rc == 0 and json.loads(out)["feature_names_in"] == NAMES
    assert daskmeans.load(str(d / "csv.zarr")).feature_names_in_.tolist() == NAMES
    rc, out, _ = run(capsys, "info", d / "csv.zarr")
    assert "columns      a, b, c\n" in out
    assert json.loads(run(capsys, "info", d / "npy.zarr", "--json")[1]).get("feature_names_in") is None


@pytest.mark.parametrize("model", ["csv.zarr", "frame.zarr"])
def test_swapped_columns_are_one_error_line_and_nothing_written(models, capsys, model):
    """Was exit 0 with other labels for half the rows."""
    d = models
    before = sorted(os.listdir(d))
    rc, out, err = run(capsys, "predict", d / model, d / "swapped.csv", "-o", d / "p.zarr", "--workers", "1", "-q")
    assert rc == 1 and out == ""
    assert err == (f"daskmeans: error: the columns of {d / 'swapped.csv'} are not the model's: its 2nd column is 'c' "
                   f"where the model's is 'b' (the same names in another order); they should be the model's, in its "
                   f"order (a, b, c): select them with --columns a,b,c\n")
    _nothing_new(d, before)


def test_the_columns_option_selects_the_models_order(models, capsys):
    d = models
    rc, _, err = run(capsys, "predict", d / "csv.zarr", d / "data.csv", "-o", d / "p1.zarr", "--workers", "1", "-q")
    assert rc == 0 and "warning" not in err, err
    rc, _, err = run(capsys, "predict", d / "csv.zarr", d / "swapped.csv", "--columns", "a,b,c", "-o", d / "p2.zarr",
                     "--workers", "1", "-q")
    assert rc == 0 and "warning" not in err, err
    np.testing.assert_array_equal(_labels(d / "p1.zarr"), _labels(d / "p2.zarr"))
    assert sorted(np.bincount(_labels(d / "p1.zarr")).tolist()) == [40, 40, 40]


def test_renamed_columns_are_one_error_line(models, capsys):
    d = models
    before = sorted(os.listdir(d))
    rc, _, err = run(capsys, "predict", d / "csv.zarr", d / "renamed.csv", "-o", d / "p.zarr", "--workers", "1", "-q")
    assert rc == 1
    assert err == (f"daskmeans: error: the columns of {d / 'renamed.csv'} are not the model's: its 3rd column is 'z' "
                   f"where the model's is 'c' (not in the model: z; missing: c); they should be the model's, in its "
                   f"order (a, b, c)\n")
    _nothing_new(d, before)


def test_a_dataframe_model_on_a_csv_checks_its_header(models, capsys):
    """Was a raw UserWarning with a source line, then labels whatever the columns."""
    d = models
    rc, _, err = run(capsys, "predict", d / "frame.zarr", d / "data.csv", "-o", d / "p3.zarr", "--workers", "1", "-q")
    assert rc == 0 and err == ""  # no warning; -q prints nothing else on success
    assert (d / "p3.zarr").is_dir()


@pytest.mark.parametrize("model, data, warning", [
    ("csv.zarr", "plain.csv", "{d}/plain.csv does not name its columns, but the model was fitted on named columns "
                              "(a, b, c): they are taken in that order, unchecked"),
    ("frame.zarr", "data.npy", "{d}/data.npy does not name its columns, but the model was fitted on named columns "
                               "(a, b, c): they are taken in that order, unchecked"),
    ("npy.zarr", "data.csv", "{d}/data.csv names its columns (a, b, c), but the model was fitted without column "
                             "names: they are taken in their order, unchecked"),
], ids=["csv-model-plain-csv", "frame-model-npy", "npy-model-csv"])
def test_names_on_one_side_only_are_one_warning_line(models, capsys, model, data, warning):
    d = models
    out = d / f"w-{model}-{data}.zarr"
    rc, _, err = run(capsys, "predict", d / model, d / data, "-o", out, "--workers", "1", "-q")
    assert rc == 0, err
    assert err.splitlines() == [f"daskmeans: warning: {warning.format(d=d)}"]  # -q: the warning alone
    assert out.is_dir()


def test_plot_checks_the_columns_too(models, capsys):
    pytest.importorskip("matplotlib")
    d = models
    rc, _, err = run(capsys, "plot", d / "csv.zarr", d / "swapped.csv", "-o", d / "r.png")
    assert rc == 1 and err.startswith("daskmeans: error: the columns of ") and err.count("\n") == 1
    rc, _, err = run(capsys, "plot", d / "csv.zarr", d / "data.csv", "-o", d / "r.png")
    assert rc == 0 and "warning" not in err, err


def test_an_id_column_is_refused_with_the_drop_columns_hint(d, capsys):
    """Was clustered as a feature: an inertia of 1.67e14 where the features give 8.0e5."""
    before = sorted(os.listdir(d))
    rc, out, err = run(capsys, "fit", d / "ids.csv", "--k", "3", "-o", d / "m-id.zarr", "--workers", "1", "-q")
    assert rc == 1 and out == ""
    assert err == (f"daskmeans: error: column 'id' of {d / 'ids.csv'} looks like an identifier (integer values, "
                   f"name 'id'): drop it with --drop-columns id, or select it with --columns to cluster on it\n")
    _nothing_new(d, before)
    rc, _, err = run(capsys, "fit", d / "indexed.csv", "--k", "3", "-o", d / "m-ix.zarr", "--workers", "1", "-q")
    assert rc == 1 and err == (
        f"daskmeans: error: column 'Unnamed: 0' of {d / 'indexed.csv'} looks like an identifier (integer values, an "
        f"unnamed first column as pandas writes its index): drop it with --drop-columns 0, or select it with "
        f"--columns to cluster on it\n")


def test_an_id_column_dropped_or_selected_is_accepted(d, capsys):
    rc, _, err = run(capsys, "fit", d / "ids.csv", "--k", "3", "--seed", "0", "-o", d / "m-drop.zarr", "--workers", "1",
                     "-q", "--drop-columns", "id")
    assert rc == 0, err
    assert daskmeans.load(str(d / "m-drop.zarr")).feature_names_in_.tolist() == NAMES
    rc, _, err = run(capsys, "fit", d / "ids.csv", "--k", "3", "--seed", "0", "-o", d / "m-sel.zarr", "--workers", "1",
                     "-q", "--columns", "id,a,b,c")
    assert rc == 0, err
    assert daskmeans.load(str(d / "m-sel.zarr")).feature_names_in_.tolist() == ["id", *NAMES]
    # predict on the file with its id: the model's names pick the columns (--columns), or say which
    rc, _, err = run(capsys, "predict", d / "m-drop.zarr", d / "ids.csv", "-o", d / "p-id.zarr", "--workers", "1", "-q")
    assert rc == 1 and err.endswith("(not in the model: id); they should be the model's, in its order (a, b, c): "
                                    "select them with --columns a,b,c\n"), err
