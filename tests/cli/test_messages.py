"""What the command says (issue 33): inputs checked before outputs, one clear line for a path
that holds something other than a model, every parameter and the winning run in ``info``,
the tier line before the iterations with a worker's true share, help for every option, the
registries' names in the choices, the help and the README, and progress for every long step."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from daskmeans import KMeans, config
from daskmeans.cli import main
from daskmeans.cli.main import parser as command_parser
from daskmeans.datasets import make_blobs
from daskmeans.io.model_store import write_array
from terminal import on_a_terminal
from clirun import run

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """32,000 x 6 float32 blobs in Zarr chunks of 4,000 rows."""
    d = tmp_path_factory.mktemp("messages")
    X, _ = make_blobs(32_000, 6, 5, cluster_std=3.0, random_state=2, chunk_rows=4000)
    write_array(X, str(d / "x.zarr"), kind="data")
    return d, str(d / "x.zarr")


# ---------------------------------------------------------------- inputs before outputs


def test_a_missing_input_is_the_error_even_where_the_output_exists(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.zarr").mkdir()  # the default output, present
    rc, _, err = run(capsys, "fit", "missing.zarr", "--k", "3")
    assert (rc, err) == (1, f"daskmeans: error: no such file or directory: {tmp_path}/missing.zarr\n")


def test_predict_and_plot_check_their_inputs_before_their_output(data, tmp_path, capsys):
    d, x = data
    (tmp_path / "labels.zarr").mkdir()
    (tmp_path / "r.png").write_bytes(b"x")
    rc, _, err = run(capsys, "predict", tmp_path / "none.zarr", x, "-o", tmp_path / "labels.zarr")
    assert (rc, err) == (1, f"daskmeans: error: no such model: {tmp_path}/none.zarr\n")
    rc, _, err = run(capsys, "plot", tmp_path / "none.zarr", "-o", tmp_path / "r.png")
    assert (rc, err) == (1, f"daskmeans: error: no such model: {tmp_path}/none.zarr\n")


# ---------------------------------------------------------------- info


def test_info_on_something_else_than_a_model_says_what_it_is(data, tmp_path, capsys):
    d, x = data
    zarr.create_array(str(tmp_path / "plain.zarr"), shape=(4, 2), dtype="f4")
    write_array(make_blobs(100, 2, 2)[0][:, 0].astype("int32"), str(tmp_path / "l.zarr"), name="labels",
                kind="labels")
    (tmp_path / "dir").mkdir()
    for path, what in ((x, "a daskmeans generated dataset"),
                       (tmp_path / "plain.zarr", "a Zarr array that daskmeans did not write"),
                       (tmp_path / "l.zarr", "a daskmeans labels output"),
                       (tmp_path / "dir", "a directory that is not a Zarr store")):
        rc, out, err = run(capsys, "info", path)
        assert (rc, out, err) == (1, "", f"daskmeans: error: {path} is not a daskmeans model: it is {what}\n")


def test_info_shows_every_parameter_and_the_winning_run(data, tmp_path, capsys):
    d, x = data
    model = tmp_path / "m.zarr"
    rc, _, err = run(capsys, "fit", x, "--k", "5", "--n-init", "3", "--seed", "4", "--max-iter", "4", "--tol", "0",
                     "--metric", "cosine", "--init", "k-means++", "-v", "--workers", "2", "-o", model)
    assert rc == 0, err
    won = re.findall(r"^daskmeans: run (\d) of 3 has the lowest inertia: its model is kept$", err, re.M)
    assert len(won) == 1, err
    best = int(won[0])
    # The kept model is that run's: its history is the run's iterations as the -v lines showed them.
    runs = {r: [float(v) for v in re.findall(rf"^run {r}/3 iter +\d+ +inertia (\S+)", err, re.M)] for r in (1, 2, 3)}
    hist = [h["inertia"] for h in zarr.open_group(str(model), mode="r").attrs["history"]]
    assert runs[best] == [float(f"{v:.6e}") for v in hist]
    assert min(runs[r][-1] for r in runs) == runs[best][-1]

    rc, out, _ = run(capsys, "info", model)
    assert rc == 0
    lines = out.splitlines()
    assert f"best run     {best} of 3 (the lowest inertia of the --n-init runs)" in lines
    shown = next(line for line in lines if line.startswith("parameters   "))
    params = dict(p.split("=", 1) for p in shown[len("parameters   "):].split("  "))
    expected = {k: v for k, v in KMeans(5).get_params().items() if k != "client"}
    assert set(params) == set(expected)
    assert (params["metric"], params["n_init"], params["init"], params["precision"], params["tol"],
            params["random_state"], params["max_iter"]) == ("'cosine'", "3", "'k-means++'", "'fp32'", "0.0", "4", "4")


# ---------------------------------------------------------------- the tier line


def test_the_tier_line_comes_before_the_iterations_with_a_workers_share(data, tmp_path, capsys):
    """32,000 rows x 6 float32, read as one chunk and cut in two for 2 workers: 16,000 rows,
    384,000 bytes a worker (the plan's bound, half the rows plus a chunk, is the whole data)."""
    d, x = data
    rc, _, err = run(capsys, "fit", x, "--k", "5", "--seed", "0", "-v", "--workers", "2", "-o", tmp_path / "m.zarr")
    assert rc == 0, err
    lines = err.splitlines()
    tier = [i for i, line in enumerate(lines) if line.startswith("daskmeans: tier ")]
    first_iter = next(i for i, line in enumerate(lines) if line.startswith("iter "))
    assert len(tier) == 1 and tier[0] < first_iter, err
    assert lines[tier[0]].startswith("daskmeans: tier host: 375.00 kiB of data per worker, host budget "), err


# ---------------------------------------------------------------- help


def _actions(parser: argparse.ArgumentParser, path: tuple = ("daskmeans",)):
    for action in parser._actions:  # argparse has no public listing of a parser's actions
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for pseudo in action._choices_actions:  # each subcommand's line in its parent's help
                yield path + (pseudo.dest,), pseudo
            for name, sub in action.choices.items():
                yield from _actions(sub, path + (name,))


def test_every_option_and_argument_has_help():
    empty = [f"{' '.join(path)} {a.option_strings or a.dest}" for path, a in _actions(command_parser())
             if not (a.help or "").strip()]
    assert empty == []


def test_predict_help_and_readme_say_what_the_labels_output_holds(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "a Zarr group holding the int32 array 'labels' (one per row)" in out
    assert "a Zarr group holding the int32 array `labels` (one per row)" in " ".join(README.split())
    # the other formats, by suffix (issue 47: -o labels.csv wrote a Zarr directory)
    assert ".npy a 1-D int32 array; .csv or .parquet a column 'label' after the --keep-columns" in out
    for row in ("| `labels.npy` | a 1-D int32 array |", "| `labels.csv` | a column `label`, after the `--keep-columns`",
                "| `labels.parquet` | the same columns"):
        assert row in README


# ---------------------------------------------------------------- registries


def _readme_choices(flag: str) -> list[str]:
    row = next(line for line in README.splitlines() if line.startswith(f"| `{flag} "))
    return re.search(r"\{([^}]*)\}", row).group(1).split(",")


def test_choices_help_and_readme_come_from_the_registries(capsys):
    from daskmeans import seeding
    from daskmeans.metric import REGISTRY as METRICS
    from daskmeans.options import TIERS

    options = {a.dest: a for _, a in _actions(command_parser()) if a.option_strings}
    assert list(options["metric"].choices) == list(METRICS) == _readme_choices("--metric")
    assert list(options["tier"].choices) == list(TIERS) == _readme_choices("--tier")
    init_row = next(line for line in README.splitlines() if line.startswith("| `--init "))
    cell = init_row.replace("\\|", "\0").split("|")[2].replace("\0", "|")  # a table cell's \| is a |
    assert re.findall(r"`([^`]+)`", cell) == [*seeding.names(), ".npy"]
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"--init INIT {', '.join(n + ' (default)' if n == seeding.DEFAULT else n for n in seeding.names())}" \
           in help_text
    assert all(f"{name}: {' '.join(what.split())}" in help_text for name, what in TIERS.items())


def test_a_registered_init_is_accepted_by_the_command(data, tmp_path, capsys, monkeypatch):
    from daskmeans import seeding

    monkeypatch.setitem(seeding.REGISTRY, "random-again", seeding.Init(
        "random-again", "daskmeans.seeding.random_rows", "init_random", "the random init under another name"))
    d, x = data
    for init in ("random-again", "random"):
        rc, _, err = run(capsys, "fit", x, "--k", "5", "--seed", "3", "--init", init, "-q", "--workers", "1",
                         "-o", tmp_path / f"{init}.zarr")
        assert rc == 0, err
    a, b = (zarr.open_group(str(tmp_path / f"{i}.zarr"), mode="r") for i in ("random-again", "random"))
    np.testing.assert_array_equal(a["cluster_centers"][:], b["cluster_centers"][:])
    rc, _, err = run(capsys, "fit", x, "--k", "5", "--init", "nope", "-o", tmp_path / "n.zarr")
    assert err == ("daskmeans: error: --init 'nope' should be k-means||, k-means++, random, hierarchical, afk-mc2, random-again or an "
                   "existing .npy file\n")


# ---------------------------------------------------------------- progress of every long step


def test_every_long_step_shows_progress_on_a_terminal(data, tmp_path):
    """On a terminal: bars for placing the data, the init's rounds, the labels' write, predict
    and generate, each ending at its total."""
    d, x = data
    py = [sys.executable, "-m", "daskmeans"]
    out = on_a_terminal(py + ["fit", x, "--k", "5", "--seed", "0", "--workers", "2", "--labels", tmp_path / "l.zarr",
                              "-o", tmp_path / "m.zarr"])
    assert re.search(r"place: 100%\|[^|]+\| 2/2 ", out), out  # one chunk as read, cut in two for 2 workers
    steps = int(config.get("init.rounds")) + 1  # the rounds, then the recluster
    assert re.search(rf"init k-means\|\|: 100%\|[^|]+\| {steps}/{steps} ", out), out
    assert re.search(r"write labels: 100%\|[^|]+\| 2/2 ", out), out
    out = on_a_terminal(py + ["predict", tmp_path / "m.zarr", x, "--workers", "2", "-o", tmp_path / "p.zarr"])
    assert re.search(r"write labels: 100%\|[^|]+\| (\d+)/\1 ", out), out
    out = on_a_terminal(py + ["generate", "blobs", "--n", "50000", "--d", "3", "--centers", "2", "--chunk-rows", "10000",
                              "-o", tmp_path / "g.zarr"])
    assert re.search(r"write data: 100%\|[^|]+\| 5/5 ", out), out


def test_steps_are_plain_lines_off_a_terminal_and_nothing_with_quiet(data, tmp_path, capsys):
    d, x = data
    rc, _, err = run(capsys, "generate", "blobs", "--n", "50000", "--d", "3", "--centers", "2", "--chunk-rows", "10000",
                     "-o", tmp_path / "g.zarr")
    assert rc == 0 and re.search(r"^daskmeans: write data: 5/5 blocks in [\d.]+ s$", err, re.M), err
    rc, _, err = run(capsys, "fit", x, "--k", "5", "--workers", "2", "--seed", "0", "-o", tmp_path / "m.zarr")
    assert rc == 0
    assert re.search(r"^daskmeans: place: 2/2 chunks in [\d.]+ s$", err, re.M), err
    steps = int(config.get("init.rounds")) + 1
    assert re.search(rf"^daskmeans: init k-means\|\|: {steps}/{steps} steps in [\d.]+ s$", err, re.M), err
    rc, _, err = run(capsys, "predict", tmp_path / "m.zarr", x, "-q", "--workers", "2", "-o", tmp_path / "p.zarr")
    assert rc == 0 and err == ""  # -q: a command that succeeds prints nothing


def test_an_init_that_falls_back_to_kmeans_plus_plus_says_so(tmp_path, capsys):
    """k-means|| whose rounds drew fewer distinct rows than K (here: 3,000 copies of one row
    and five others, seed 2) seeds with k-means++ instead, and the command says so; the init's
    step still ends with all its steps."""
    X = np.repeat(np.array([[0, 0], [10, 0], [0, 10], [10, 10], [5, 5], [20, 20]], np.float32), [3000] + [1] * 5, axis=0)
    np.save(tmp_path / "x.npy", X)
    args = ["fit", tmp_path / "x.npy", "--k", "5", "--workers", "1", "-o", tmp_path / "m.zarr", "--overwrite"]
    said = "daskmeans: init k-means||: fewer than n_clusters=5 distinct candidates drawn; seeding with k-means++ instead"
    rc, _, err = run(capsys, *args, "--seed", "2")
    assert rc == 0 and said in err.splitlines(), err
    steps = int(config.get("init.rounds")) + 1
    assert re.search(rf"^daskmeans: init k-means\|\|: {steps}/{steps} steps in [\d.]+ s$", err, re.M), err
    rc, _, err = run(capsys, *args, "--seed", "0")  # its rounds drew all six rows
    assert rc == 0 and said not in err.splitlines(), err


def test_quiet_prints_nothing_on_success_but_errors_and_warnings(data, tmp_path, capsys):
    d, x = data
    rc, out, err = run(capsys, "fit", x, "--k", "5", "--workers", "2", "-q", "-o", tmp_path / "m.zarr")
    assert (rc, out, err) == (0, "", "")
    rc, out, err = run(capsys, "generate", "blobs", "--n", "1000", "--d", "2", "--centers", "2", "-q",
                       "-o", tmp_path / "g.zarr")
    assert (rc, out, err) == (0, "", "")
    rc, _, err = run(capsys, "fit", x, "--k", "5", "--workers", "2", "-q", "-o", tmp_path / "m.zarr")
    assert rc == 1 and err.startswith("daskmeans: error: ") and err.count("\n") == 1, err


def test_one_fit_time_in_the_summary_the_timings_and_info(data, tmp_path, capsys):
    """The summary line, ``--timings``' ``fit_seconds`` and ``info`` state one fit time (the
    fit's own phases), and each says the iterations' part of it."""
    import json

    d, x = data
    rc, _, err = run(capsys, "fit", x, "--k", "5", "--workers", "2", "-o", tmp_path / "m.zarr",
                     "--timings", tmp_path / "t.json")
    assert rc == 0
    summary = re.search(r"^daskmeans: fit in ([\d.]+) s \((\d+) iterations in ([\d.]+) s\) on numpy", err, re.M)
    assert summary, err
    timings = json.loads((tmp_path / "t.json").read_text())
    fit = timings["fit_seconds"]
    assert summary.group(1) == f"{fit:.2f}"
    assert fit == pytest.approx(sum(v for k, v in timings["phases"].items() if k.startswith("fit ") and k != "fit read"))
    rc, out, _ = run(capsys, "info", tmp_path / "m.zarr")
    line = re.search(r"^fit time +([\d.]+) s \((\d+) iterations in ([\d.]+) s\)$", out, re.M)
    assert line and line.groups() == summary.groups(), out
