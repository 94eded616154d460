"""Option values checked while the command line is parsed (issue 31): a value that is not a
number or size, or out of range, is a usage error (exit 2) on one line naming the option, the
value and what it should be, before anything is read or started; and a reader that goes away
(``daskmeans info m.zarr | head``) ends the command quietly."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from daskmeans.cli import main
from daskmeans.cli.main import parser as command_parser

FIT = ["fit", "x.npy", "--k", "3"]
PREDICT = ["predict", "m.zarr", "x.npy", "-o", "l.zarr"]
PLOT = ["plot", "m.zarr", "-o", "r.png"]
GENERATE = ["generate", "blobs", "--n", "10", "--d", "2", "--centers", "2", "-o", "g.zarr"]
INT = "an integer >= 1"
SIZE = "a size > 0 such as 512MiB"
FINITE = "a finite number >= 0"
SEED = "an integer from 0 to 4294967295"
PATH = "a non-empty path"  # -o "" was taken for the working directory: "output  would overwrite the input"
LABELS = "a path ending in .zarr, .npy, .csv or .parquet (no suffix: Zarr)"

# (command, option, the values it refuses, requirement)
REFUSED = [
    (["fit", "x.npy"], "--k", ["0", "-3", "three"], INT),
    (FIT, "--n-init", ["0"], INT),
    (FIT, "--max-iter", ["0", "2.5"], INT),
    (FIT, "--tol", ["-1", "nan", "abc"], FINITE),
    (FIT, "--seed", ["-1", "4294967296"], SEED),
    (FIT, "--chunk-bytes", ["abc", "5XB", "-1", "0"], SIZE),
    (FIT, "--memory-limit", ["lots", "0.5"], SIZE + " or auto"),  # 0.5: half a byte, 0
    (FIT, "--device-memory-limit", ["0"], SIZE + " or auto"),
    (FIT, "--checkpoint-every", ["0"], INT),
    (FIT, "--max-imbalance", ["1", "0.5", "-1", "many", "inf"], "a finite number > 1"),
    (FIT, "--max-samples-per-cluster", ["0", "-2", "2.5", "many"], INT),
    (FIT, "--workers", ["0"], INT),
    (PREDICT, "--chunk-bytes", ["-1"], SIZE),
    (PREDICT, "--workers", ["-2"], INT),
    (PREDICT, "-o", ["l.txt", "l.csv.gz", "l.json"], LABELS),  # l.csv was a Zarr directory named l.csv
    (FIT, "--labels", ["l.tsv", "l.npz"], LABELS),
    (PLOT, "--sample", ["0"], INT),
    (PLOT, "--chunk-bytes", ["1XB"], SIZE),
    (FIT, "-o", [""], PATH),
    (FIT, "--labels", [""], PATH),
    (FIT, "--checkpoint", [""], PATH),
    (FIT, "--timings", [""], PATH),
    (["predict", "m.zarr", "x.npy"], "-o", [""], PATH),
    (["plot", "m.zarr"], "-o", [""], PATH),
    (["sweep", "x.npy", "--k", "2,3"], "-o", [""], PATH),
    (["sweep", "x.npy", "--k", "2,3"], "--plot", [""], PATH),
    (GENERATE, "-o", [""], PATH),
    (GENERATE, "--chunk-rows", ["0"], INT),
    (GENERATE, "--std", ["-0.5", "inf"], FINITE),
    (GENERATE, "--seed", ["-5"], SEED),
    (["generate", "blobs", "--d", "2", "--centers", "2", "-o", "g.zarr"], "--n", ["0"], INT),
    (["generate", "blobs", "--n", "10", "--centers", "2", "-o", "g.zarr"], "--d", ["x"], INT),
    (["generate", "blobs", "--n", "10", "--d", "2", "-o", "g.zarr"], "--centers", ["-1"], INT),
]
BAD = [(argv, option, value, requirement) for argv, option, values, requirement in REFUSED for value in values]


@pytest.mark.parametrize("argv, option, value, requirement", BAD,
                         ids=[f"{a[0]} {o} {v}" for a, o, v, _ in BAD])
def test_a_bad_option_value_is_a_one_line_usage_error(tmp_path, monkeypatch, capsys, argv, option, value,
                                                      requirement):
    """``--chunk-bytes abc`` and ``5XB`` were ValueError tracebacks; ``--chunk-bytes -1`` and
    ``--chunk-rows 0`` were accepted."""
    monkeypatch.chdir(tmp_path)  # nothing there: a value check that came later would fail otherwise
    with pytest.raises(SystemExit) as e:
        main([*argv, option, value])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    command = " ".join(argv[:2] if argv[0] == "generate" else argv[:1])
    shown = value or "''"  # the empty value, quoted
    assert err == f"daskmeans {command}: error: {option} {shown}: should be {requirement} " \
                  f"(see daskmeans {command} --help)\n", err
    assert out == "" and os.listdir(tmp_path) == []


GOOD = [
    (FIT + ["--chunk-bytes", "512MiB", "--memory-limit", "auto", "--device-memory-limit", "40GiB", "--tol", "0",
            "--seed", "0", "--checkpoint-every", "1", "--workers", "1", "--n-init", "2", "--max-iter", "1"],
     {"k": 3, "chunk_bytes": "512MiB", "memory_limit": "auto", "device_memory_limit": "40GiB", "tol": 0.0,
      "seed": 0, "checkpoint_every": 1, "workers": 1, "n_init": 2, "max_iter": 1}),
    (FIT + ["--chunk-bytes", "1e6", "--seed", "4294967295"], {"chunk_bytes": "1e6", "seed": 2**32 - 1}),
    (GENERATE + ["--chunk-rows", "5", "--std", "0", "--seed", "7"],
     {"n": 10, "d": 2, "centers": 2, "chunk_rows": 5, "std": 0.0, "seed": 7}),
    (PLOT + ["--sample", "1"], {"sample": 1}),
    (PREDICT + ["-o", "l.parquet", "--keep-columns", "id,key"], {"output": "l.parquet", "keep_columns": "id,key"}),
    (PREDICT + ["-o", "L.NPY"], {"output": "L.NPY"}),
    (PREDICT + ["-o", "out/labels"], {"output": "out/labels"}),  # no suffix: Zarr, as a directory is read
    (FIT + ["--labels", "l.csv", "--keep-columns", "id"], {"labels": "l.csv", "keep_columns": "id"}),
]


@pytest.mark.parametrize("argv, parsed", GOOD)
def test_good_option_values_are_parsed(argv, parsed):
    args = vars(command_parser().parse_args(argv))
    assert {k: args[k] for k in parsed} == parsed


@pytest.mark.parametrize("argv, settings", [
    (FIT, {}),
    (FIT + ["--chunk-bytes", "64MiB", "--collective", "dask"],
     {"daskmeans.gpu-chunk-bytes": "64MiB", "daskmeans.collective": "dask"}),
])
def test_the_flags_reach_the_fit_as_settings(argv, settings):
    """The command plans no chunk size: --chunk-bytes, the user's, is the size DATA is read
    in and the one the engine keeps on GPU workers (daskmeans.gpu-chunk-bytes)."""
    import dask

    from daskmeans.cli import common

    before = {key: dask.config.get(key, None) for key in ("daskmeans.gpu-chunk-bytes", "daskmeans.collective")}
    with common.settings(command_parser().parse_args(argv)):
        assert {key: dask.config.get(key, None) for key in before} == {**before, **settings}


def test_a_collective_is_checked_against_its_registry_when_given(capsys):
    with pytest.raises(SystemExit) as e:
        main(FIT + ["--collective", "mpi"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("daskmeans fit: error: --collective mpi: should be one of auto, nccl, process, dask "
                                       "(see daskmeans fit --help)\n")


def test_other_usage_errors_are_one_line_too(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "x.npy"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "daskmeans fit: error: the following arguments are required: --k (see daskmeans fit --help)\n"


# ---------------------------------------------------------------- a reader that goes away


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from daskmeans.io.model_store import save_model

    path = tmp_path_factory.mktemp("pipe") / "m.zarr"
    hist = [{"iteration": i, "inertia": 1.0 / i, "shift": 0.1, "reassigned": 3, "n_empty": 0, "seconds": 0.01}
            for i in range(1, 3001)]  # ~250 kB of `info` table: more than a pipe holds
    save_model(str(path), np.zeros((3, 2)), {"inertia": 1.0, "n_iter": 3000, "params": {"n_clusters": 3, "max_iter": 3000},
                                              "n_features_in": 2, "history": hist, "dtype": "float64"})
    return path


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_info_into_a_closed_pipe_ends_quietly(model, flags):
    """``daskmeans info m.zarr | head``: the reader is gone before the command writes (its end
    of the pipe closed before the command starts), so every write fails with EPIPE. The
    command exits 141 (128 + SIGPIPE, a shell's status for a tool SIGPIPE stopped) and prints
    nothing; it was a BrokenPipeError traceback."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "daskmeans", "info", str(model), *flags], stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert p.stderr == "" and p.returncode == 141, p.stderr


def test_info_through_head_prints_the_first_lines(model):
    """Through a real ``head``: the first lines, then (the table is more than the pipe holds)
    the pipe breaks under the command, which ends quietly."""
    info = subprocess.Popen([sys.executable, "-m", "daskmeans", "info", str(model)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-n", "2"], stdin=info.stdout, capture_output=True, text=True, timeout=120)
    info.stdout.close()  # head's end only: when head exits, the pipe has no reader
    err = info.stderr.read().decode()
    info.wait(timeout=120)
    assert head.stdout.splitlines()[0].startswith("model ") and len(head.stdout.splitlines()) == 2
    assert err == "" and info.returncode == 141, err
