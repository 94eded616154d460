"""A CSV file read ahead in a process of its own (:mod:`daskmeans.io.csv_ahead`): the table a
read then takes is the one the reader makes itself, bit for bit (its array, its rows read again
in any range, its columns, its pieces); a read with other options, or a read-ahead that failed,
leaves the file to the reader, whose errors are unchanged; and files it cannot help are not
read ahead."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from daskmeans import DataError, read_table
from daskmeans.io import csv_ahead, csv_reader


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No read-ahead or parsed rows left from another test; any this test left is ended."""
    monkeypatch.setattr(csv_ahead, "_STARTED", {})
    monkeypatch.setattr(csv_ahead, "TAKEN", [])
    monkeypatch.setattr(csv_reader, "_AHEAD", {})
    yield
    for ahead in list(csv_ahead._STARTED.values()):
        ahead.discard()


def write(path, x, header=True, delimiter=","):
    lines = [delimiter.join(repr(float(v)) if v != int(v) else str(int(v)) for v in row) for row in x]
    names = delimiter.join(f"c{j}" for j in range(x.shape[1]))
    path.write_text((names + "\n" if header else "") + "\n".join(lines) + "\n")
    return str(path)


def data(n=5000, d=4, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    x[:, 0] = np.arange(n) % 7  # a column of integers
    return x


RANGES = [(0, None), (1, 2), (1 / 3, -5), (-1, None)]  # row ranges (fractions, from the end) read again


def contents(table):
    """The table's array, and its rows read again in each of :data:`RANGES`."""
    rows = csv_reader.csv_rows_of(table.array)
    out = [table.array.compute()]
    for a, b in RANGES:
        start = int(a * rows.n) if isinstance(a, float) else a % rows.n
        stop = rows.n if b is None else b % rows.n
        got = np.full((stop - start, rows.d), np.nan, rows.dtype)
        table.rows.read_into(start, stop, got)
        out.append(got)
    return out


def ahead_then_reader(path, monkeypatch, **options):
    """(the table a read takes from a read-ahead, its contents read while the rows parsed ahead
    are held and the parser refuses any call, the reader's own table of the same file)."""
    chunk_bytes = options.pop("chunk_bytes", 20_000)
    dtype = options.pop("dtype", None)
    assert csv_ahead.start(path, chunk_bytes=chunk_bytes, dtype=dtype, any_cores=True, **options)
    got = read_table(path, chunk_bytes=chunk_bytes, dtype=dtype, **options)
    assert csv_ahead._STARTED == {} and len(csv_reader._AHEAD) == 1 and csv_ahead.TAKEN == [os.path.abspath(path)]
    with monkeypatch.context() as m:  # every row comes from the read-ahead, none from a parse here
        m.setattr(csv_reader, "_parse_piece", lambda *a: pytest.fail("parsed, not copied"))
        taken = contents(got)
    csv_reader._AHEAD.clear()
    return got, taken, read_table(path, chunk_bytes=chunk_bytes, dtype=dtype, **options)


def same_table(got, taken, own):
    """``got`` (with ``taken``, its contents) is ``own``: columns, chunks, spec, pieces, and
    every byte of the array and of each range read again."""
    assert got.columns == own.columns and got.identifier_error == own.identifier_error
    assert got.array.chunks == own.array.chunks and got.array.dtype == own.array.dtype
    assert csv_reader.csv_rows_of(got.array) == csv_reader.csv_rows_of(own.array)  # spec, pieces, first rows
    for a, b in zip(taken, contents(own), strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    return taken[0]


def test_a_read_takes_the_rows_parsed_ahead_bit_for_bit(tmp_path, monkeypatch):
    x = data(120_000, 4)  # 7.3 MB: blocks of several pieces (a piece is at most a core's share)
    got, taken, own = ahead_then_reader(write(tmp_path / "x.csv", x), monkeypatch, chunk_bytes=5_000_000)
    assert got.array.numblocks[0] >= 2 and len(csv_reader.csv_rows_of(got.array).parts) > got.array.numblocks[0]
    np.testing.assert_array_equal(same_table(got, taken, own), x)


@pytest.mark.parametrize("options", [
    {"columns": ["c1", "c3"]},
    {"drop_columns": ["c0"], "dtype": "float64"},
    {"chunk_bytes": None},
])
def test_options_and_dtypes(tmp_path, monkeypatch, options):
    x = data(3000, 4, seed=1)
    same_table(*ahead_then_reader(write(tmp_path / "x.csv", x), monkeypatch, **options))


def test_no_header_and_tabs(tmp_path, monkeypatch):
    x = data(2000, 3, seed=2)
    got, taken, own = ahead_then_reader(write(tmp_path / "x.tsv", x, header=False, delimiter="\t"), monkeypatch)
    assert got.columns is None
    np.testing.assert_array_equal(same_table(got, taken, own), x)


def test_an_identifier_column_is_named_as_without_it(tmp_path, monkeypatch):
    x = data(3000, 3, seed=3)
    x[:, 0] = np.arange(3000)
    path = tmp_path / "x.csv"
    path.write_text("id,a,b\n" + "\n".join(f"{int(r[0])},{r[1]!r},{r[2]!r}" for r in x.tolist()) + "\n")
    got, taken, own = ahead_then_reader(str(path), monkeypatch)
    assert got.identifier_error is not None and "id" in got.identifier_error
    same_table(got, taken, own)


def test_a_read_with_other_options_reads_the_file_itself(tmp_path):
    """A read-ahead serves a read of the same options only; the read of the file with others
    parses it, and ends the read-ahead."""
    path = write(tmp_path / "x.csv", data(1000, 3))
    assert csv_ahead.start(path, chunk_bytes=20_000, columns=["c1"], any_cores=True)
    got = read_table(path, chunk_bytes=20_000)  # all the columns: not what was read ahead
    assert got.array.shape == (1000, 3) and csv_reader._AHEAD == {} and csv_ahead.TAKEN == []
    assert csv_ahead._STARTED == {}  # the file is read: its read-ahead with other options is ended


def test_a_file_changed_after_its_read_ahead_is_read_again(tmp_path):
    """Rewritten between the read-ahead and the read: the reader reads the file as it is now;
    rewritten after the read: its rows are refused as a parse would refuse them."""
    path = tmp_path / "x.csv"
    write(path, data(1000, 3))
    assert csv_ahead.start(str(path), chunk_bytes=20_000, any_cores=True)
    assert next(iter(csv_ahead._STARTED.values())).proc.wait(timeout=120) == 0  # it has read the file
    x = data(1200, 3, seed=5)
    write(path, x)
    got = read_table(str(path), chunk_bytes=20_000)
    assert csv_reader._AHEAD == {} and csv_ahead.TAKEN == [str(path)]  # taken, and not used
    np.testing.assert_array_equal(got.array.compute(), x)
    assert csv_ahead.start(str(path), chunk_bytes=20_000, any_cores=True)
    got = read_table(str(path), chunk_bytes=20_000)
    assert len(csv_reader._AHEAD) == 1
    with open(path, "a") as f:
        f.write("1,2,3\n")
    with pytest.raises(DataError, match=r"x.csv changed since it was opened: \d+ bytes, was \d+; read it again"):
        got.array.compute()


def test_the_same_file_opened_in_other_blocks_is_parsed(tmp_path, monkeypatch):
    """Rows held from a read-ahead serve the pieces it counted; a second open of the same file
    in other blocks (other pieces) parses them."""
    x = data(120_000, 4)
    path = write(tmp_path / "x.csv", x)
    assert csv_ahead.start(path, chunk_bytes=5_000_000, any_cores=True)
    read_table(path, chunk_bytes=5_000_000)
    other = read_table(path, chunk_bytes=1_700_000)
    assert len(csv_reader._AHEAD) == 1
    np.testing.assert_array_equal(other.array.compute(), x)


def test_a_failed_read_ahead_leaves_the_error_to_the_reader(tmp_path):
    """A cell past the sample that is no number: the read-ahead process fails, and the read
    raises the reader's own error, naming the line and the cell."""
    n = 120_000
    lines = [f"{i},{i}.5" for i in range(n)]
    lines[n - 10] = f"{n},word"
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n" + "\n".join(lines) + "\n")
    assert csv_ahead.start(str(path), chunk_bytes=400_000, any_cores=True)
    table = read_table(str(path), chunk_bytes=400_000)
    assert csv_ahead._STARTED == {} and csv_reader._AHEAD == {}  # taken, and failed: nothing held
    with pytest.raises(DataError, match=rf"column 'b' of .*bad.csv is not numeric \(line {n - 10 + 2} has 'word'\)"):
        table.array.compute()


def test_files_it_cannot_help_are_not_read_ahead(tmp_path, monkeypatch):
    path = write(tmp_path / "x.csv", data(100, 2))
    (tmp_path / "x.csv.gz").write_bytes(b"")
    assert not csv_ahead.start(str(tmp_path / "x.csv.gz"), any_cores=True)  # compressed: one stream
    assert not csv_ahead.start(str(tmp_path / "missing.csv"), any_cores=True)
    np.save(tmp_path / "x.npy", np.zeros((4, 2)))
    assert not csv_ahead.start(str(tmp_path / "x.npy"), any_cores=True)  # not a CSV file
    assert not csv_ahead.start(path, dtype="float16", any_cores=True)
    monkeypatch.setattr(os, "cpu_count", lambda: csv_ahead.MIN_CORES - 1)
    assert not csv_ahead.start(path)  # too few cores, unless asked for on any
    monkeypatch.setattr(csv_ahead, "MAX_BYTES", 100)
    assert not csv_ahead.start(path, any_cores=True)
    monkeypatch.setattr(csv_ahead, "MAX_BYTES", 4 << 30)
    monkeypatch.setattr(csv_ahead, "_available", lambda: 1000)
    assert not csv_ahead.start(path, any_cores=True)  # its rows would not fit
    assert csv_ahead._STARTED == {}


def test_the_read_ahead_process_leaves_scipys_linear_algebra_unloaded(tmp_path):
    """Numba loading the parser would import SciPy's BLAS (and ``scipy.linalg``) only to offer
    ``np.linalg`` in compiled code: the read-ahead process keeps it out, as the command's own
    process does (its cost is on the command's path)."""
    import json

    path = write(tmp_path / "x.csv", data(200))
    options = {"path": path, "chunk_bytes": None, "dtype": "float32", "columns": None, "drop_columns": None,
               "delimiter": None, "parent": os.getpid()}
    code = ("import json, os, sys; from daskmeans.io import csv_reader; fd = os.memfd_create('t'); "
            "rc = csv_reader.read_ahead([str(fd), sys.argv[1]]); "
            "print(); print(rc, 'scipy.linalg' in sys.modules, 'numba' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(options)], capture_output=True, text=True, timeout=120)
    survey, last = p.stdout.rstrip("\n").rsplit("\n", 1)
    assert json.loads(survey)["rows"] == 200, p.stderr
    assert last == "0 False True", p.stderr


def test_the_read_ahead_process_ends_with_the_command(tmp_path):
    """A command that ends before it reads the file leaves no read-ahead running: its process
    gets the parent-death signal. The "file" is a FIFO that this test holds open for writing
    and never writes: once the read-ahead has opened it (this test's open returns then) it
    waits on it for ever, unless it is ended with its command."""
    path = str(tmp_path / "x.csv")
    os.mkfifo(path)
    code = (f"import os, sys; from daskmeans.io import csv_ahead; assert csv_ahead.start({path!r}, any_cores=True); "
            f"print(next(iter(csv_ahead._STARTED.values())).proc.pid, flush=True); sys.stdin.read(); os._exit(0)")
    command = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pid = int(command.stdout.readline())
    writer = os.open(path, os.O_WRONLY)  # returns once the read-ahead process has opened the FIFO
    try:
        command.stdin.close()  # the command ends
        assert command.wait(timeout=60) == 0
        for _ in range(600):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[-1].split()[0] == "Z":  # ended; not yet reaped
                        break
            except FileNotFoundError:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            pytest.fail(f"read-ahead process {pid} still runs 30 s after its command ended")
    finally:
        os.close(writer)


def test_the_command_reads_ahead_as_its_settings_say(tmp_path):
    """``common.read_ahead``: the command's own process, workers that are its threads, and
    ``daskmeans.csv-read-ahead`` not false; ``common.read`` then takes what was read ahead."""
    import argparse

    import dask

    from daskmeans.cli import common

    path = write(tmp_path / "x.csv", data(500, 3))
    args = argparse.Namespace(data=path, dataset=None, columns="c2,c0", drop_columns=None, chunk_bytes="64KiB",
                              process_exit=True, backend="cpu", workers=2)
    with dask.config.set({"daskmeans.csv-read-ahead": False}):
        assert not common.read_ahead(args)
    with dask.config.set({"daskmeans.csv-read-ahead": True, "daskmeans.local-cluster": "processes"}):
        assert not common.read_ahead(args)
    with dask.config.set({"daskmeans.csv-read-ahead": True}):
        assert not common.read_ahead(argparse.Namespace(**{**vars(args), "process_exit": False}))
        assert not common.read_ahead(argparse.Namespace(**{**vars(args), "workers": 64}))  # worker processes
        assert common.read_ahead(args)
    table = common.read(args)
    assert len(csv_reader._AHEAD) == 1 and csv_ahead._STARTED == {}
    assert table.columns == ("c2", "c0")
    np.testing.assert_array_equal(table.array.compute(), data(500, 3)[:, [2, 0]])


def test_a_fit_command_gives_the_same_bits_with_and_without_it(tmp_path):
    """``daskmeans fit`` of a CSV file, read ahead or not: the same model and labels, and the
    columns written beside the labels read from the file as before."""
    import json

    import zarr

    x = data(20_000, 4, seed=4)
    x[:, 0] = np.arange(20_000)
    path = tmp_path / "x.csv"
    path.write_text("id,a,b,c\n" + "\n".join(f"{int(r[0])},{r[1]!r},{r[2]!r},{r[3]!r}" for r in x.tolist()) + "\n")
    got = {}
    for how in ("True", "False"):
        out = tmp_path / how
        out.mkdir()
        env = dict(os.environ, DASK_DASKMEANS__CSV_READ_AHEAD=how, DASK_DASKMEANS__LOCAL_CLUSTER="threads")
        r = subprocess.run([sys.executable, "-m", "daskmeans", "fit", str(path), "--k", "5", "--seed", "0",
                            "--drop-columns", "id", "-o", str(out / "m.zarr"), "--labels", str(out / "labels.csv"),
                            "--keep-columns", "id", "--backend", "cpu", "-v", "--timings", str(out / "t.json")],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert (f"daskmeans: {path} parsed ahead, while the command started" in r.stderr) == (how == "True"), r.stderr
        assert json.loads((out / "t.json").read_text())["read_ahead"] == ([str(path)] if how == "True" else [])
        g = zarr.open_group(str(out / "m.zarr"), mode="r")
        got[how] = (g["cluster_centers"][...], json.dumps(g.attrs.get("feature_names_in")),
                    (out / "labels.csv").read_text())
    (c1, names1, labels1), (c2, names2, labels2) = got["True"], got["False"]
    np.testing.assert_array_equal(c1.view(np.uint8), c2.view(np.uint8))
    assert names1 == names2 == json.dumps(["a", "b", "c"])
    assert labels1 == labels2 and labels1.startswith("id,")
