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
    """No read-ahead or parsed rows left from another test."""
    monkeypatch.setattr(csv_ahead, "_STARTED", {})
    monkeypatch.setattr(csv_reader, "_AHEAD", {})


def write(path, x, header=True, delimiter=","):
    lines = [delimiter.join(repr(float(v)) if v != int(v) else str(int(v)) for v in row) for row in x]
    names = delimiter.join(f"c{j}" for j in range(x.shape[1]))
    path.write_text((names + "\n" if header else "") + "\n".join(lines) + "\n")
    return str(path)


def data(n=5000, d=4, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    x[:, 0] = np.arange(n) % 7  # a column of integers
    return x


def same_table(a, b):
    assert a.columns == b.columns and a.identifier_error == b.identifier_error
    assert a.array.chunks == b.array.chunks and a.array.dtype == b.array.dtype
    xa, xb = a.array.compute(), b.array.compute()
    np.testing.assert_array_equal(xa.view(np.uint8), xb.view(np.uint8))
    ra, rb = csv_reader.csv_rows_of(a.array), csv_reader.csv_rows_of(b.array)
    assert ra == rb  # the same spec, pieces and first rows
    for start, stop in [(0, ra.n), (1, 2), (ra.n // 3, ra.n - 5), (ra.n - 1, ra.n)]:
        got = np.full((stop - start, ra.d), np.nan, ra.dtype)
        a.rows.read_into(start, stop, got)
        np.testing.assert_array_equal(got.view(np.uint8), xb[start:stop].view(np.uint8))
    return xa


def ahead_then_reader(path, **options):
    """The table a read takes from a read-ahead, then the reader's own of the same file."""
    chunk_bytes = options.pop("chunk_bytes", 20_000)
    dtype = options.pop("dtype", None)
    assert csv_ahead.start(path, chunk_bytes=chunk_bytes, dtype=dtype, any_cores=True, **options)
    got = read_table(path, chunk_bytes=chunk_bytes, dtype=dtype, **options)
    assert csv_ahead._STARTED == {} and len(csv_reader._AHEAD) == 1  # taken, its rows held
    csv_reader._AHEAD.clear()
    return got, read_table(path, chunk_bytes=chunk_bytes, dtype=dtype, **options)


def test_a_read_takes_the_rows_parsed_ahead_bit_for_bit(tmp_path):
    x = data(120_000, 4)  # 7.3 MB: blocks of several pieces (a piece is at most a core's share)
    got, own = ahead_then_reader(write(tmp_path / "x.csv", x), chunk_bytes=5_000_000)
    assert got.array.numblocks[0] >= 2 and len(csv_reader.csv_rows_of(got.array).parts) > got.array.numblocks[0]
    np.testing.assert_array_equal(same_table(got, own), x)


@pytest.mark.parametrize("options", [
    {"columns": ["c1", "c3"]},
    {"drop_columns": ["c0"], "dtype": "float64"},
    {"chunk_bytes": None},
])
def test_options_and_dtypes(tmp_path, options):
    x = data(3000, 4, seed=1)
    got, own = ahead_then_reader(write(tmp_path / "x.csv", x), **options)
    same_table(got, own)


def test_no_header_and_tabs(tmp_path):
    x = data(2000, 3, seed=2)
    got, own = ahead_then_reader(write(tmp_path / "x.tsv", x, header=False, delimiter="\t"))
    assert got.columns is None
    np.testing.assert_array_equal(same_table(got, own), x)


def test_an_identifier_column_is_named_as_without_it(tmp_path):
    x = data(3000, 3, seed=3)
    x[:, 0] = np.arange(3000)
    path = tmp_path / "x.csv"
    path.write_text("id,a,b\n" + "\n".join(f"{int(r[0])},{r[1]!r},{r[2]!r}" for r in x.tolist()) + "\n")
    got, own = ahead_then_reader(str(path))
    assert got.identifier_error is not None and "id" in got.identifier_error
    same_table(got, own)


def test_a_read_with_other_options_reads_the_file_itself(tmp_path):
    path = write(tmp_path / "x.csv", data(1000, 3))
    assert csv_ahead.start(path, chunk_bytes=20_000, columns=["c1"], any_cores=True)
    got = read_table(path, chunk_bytes=20_000)  # all the columns: not what was read ahead
    assert got.array.shape == (1000, 3) and csv_reader._AHEAD == {}
    assert len(csv_ahead._STARTED) == 1  # still there for a read with its options


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
    assert not csv_ahead.start(str(tmp_path / "x.npy"), any_cores=True)
    assert not csv_ahead.start(path, dtype="float16", any_cores=True)
    monkeypatch.setattr(os, "cpu_count", lambda: csv_ahead.MIN_CORES - 1)
    assert not csv_ahead.start(path)  # too few cores, unless asked for on any
    monkeypatch.setattr(csv_ahead, "MAX_BYTES", 100)
    assert not csv_ahead.start(path, any_cores=True)
    monkeypatch.setattr(csv_ahead, "MAX_BYTES", 4 << 30)
    monkeypatch.setattr(csv_ahead, "_available", lambda: 1000)
    assert not csv_ahead.start(path, any_cores=True)  # its rows would not fit
    assert csv_ahead._STARTED == {}


def test_the_read_ahead_process_ends_with_the_command(tmp_path):
    """A command that ends before it reads the file leaves no read-ahead running: its process
    gets the parent-death signal. The "file" is a FIFO no one writes, so the read-ahead would
    wait on it for ever otherwise."""
    path = str(tmp_path / "x.csv")
    os.mkfifo(path)
    code = (f"import os, sys; from daskmeans.io import csv_ahead; assert csv_ahead.start({path!r}, any_cores=True); "
            f"print(next(iter(csv_ahead._STARTED.values())).proc.pid, flush=True); os._exit(0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.split()[0])
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


def test_the_command_reads_ahead_as_its_settings_say(tmp_path):
    """``common.read_ahead``: the command's own process, workers that are its threads, and
    ``daskmeans.csv-read-ahead`` not false; ``common.read`` then takes what was read ahead."""
    import argparse

    import dask

    from daskmeans.cli import common

    path = write(tmp_path / "x.csv", data(500, 3))
    args = argparse.Namespace(data=path, dataset=None, columns="c2,c0", drop_columns=None, chunk_bytes="64KiB",
                              process_exit=True)
    with dask.config.set({"daskmeans.csv-read-ahead": False}):
        assert not common.read_ahead(args)
    with dask.config.set({"daskmeans.csv-read-ahead": True, "daskmeans.local-cluster": "processes"}):
        assert not common.read_ahead(args)
    with dask.config.set({"daskmeans.csv-read-ahead": True}):
        assert not common.read_ahead(argparse.Namespace(**{**vars(args), "process_exit": False}))
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
        env = dict(os.environ, DASK_DASKMEANS__CSV_READ_AHEAD=how)
        r = subprocess.run([sys.executable, "-m", "daskmeans", "fit", str(path), "--k", "5", "--seed", "0",
                            "--drop-columns", "id", "-o", str(out / "m.zarr"), "--labels", str(out / "labels.csv"),
                            "--keep-columns", "id", "-q"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        g = zarr.open_group(str(out / "m.zarr"), mode="r")
        got[how] = (g["cluster_centers"][...], json.dumps(g.attrs.get("feature_names_in")),
                    (out / "labels.csv").read_text())
    (c1, names1, labels1), (c2, names2, labels2) = got["True"], got["False"]
    np.testing.assert_array_equal(c1.view(np.uint8), c2.view(np.uint8))
    assert names1 == names2 == json.dumps(["a", "b", "c"])
    assert labels1 == labels2 and labels1.startswith("id,")
