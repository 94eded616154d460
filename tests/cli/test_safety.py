"""The three ways a run could once end with rc 0 and a wrong result, each now refused or
right: a relative path on an external cluster, a missing Zarr chunk, and an output that is
the input. The external cluster is a real ``dask scheduler`` and ``dask worker`` started as
processes in another directory than the client's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import zarr

from daskmeans import dask_cluster
from clirun import run


def one_line_error(rc, err, *needles):
    assert rc == 1, err
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert lines[-1].startswith("daskmeans: error:") and "Traceback" not in err, err
    for n in needles:
        assert n in lines[-1], lines[-1]
    return lines[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """A scheduler and two workers started as processes whose working directory is not the
    test's: a path the client gives relative to its own directory means nothing to them."""
    where = tmp_path_factory.mktemp("elsewhere")
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen(
        [os.path.join(bindir, "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--dashboard-address", ":0"], cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )]
    for _ in range(2):
        procs.append(subprocess.Popen(
            [os.path.join(bindir, "dask"), "worker", addr, "--nthreads", "1", "--nworkers", "1",
             "--host", "127.0.0.1", "--no-dashboard"],
            cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
    from distributed import Client

    try:
        with Client(addr, timeout="30s") as c:
            c.wait_for_workers(2, timeout=60)
        yield addr
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


@pytest.fixture()
def data_dir(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=10, size=(4, 5))
    x = (centers[rng.integers(0, 4, 6000)] + rng.normal(size=(6000, 5))).astype(np.float32)
    zarr.create_array(str(tmp_path / "data.zarr"), data=x, chunks=(1000, 5))
    np.save(tmp_path / "data.npy", x)
    np.save(tmp_path / "init.npy", x[[0, 1, 2, 3]].astype(np.float64))
    monkeypatch.chdir(tmp_path)
    return tmp_path, x


def _centers(path):
    return zarr.open_group(str(path), mode="r")["cluster_centers"][:]


@pytest.mark.parametrize("name", ["data.zarr", "data.npy"])
def test_relative_path_on_external_cluster_gives_the_local_model(external, data_dir, capsys, name):
    d, _ = data_dir
    rc, _, err = run(capsys, "fit", name, "--k", "4", "--init", "init.npy", "-o", "ext.zarr", "--scheduler", external, "-q")
    assert rc == 0, err
    rc, _, err = run(capsys, "fit", name, "--k", "4", "--init", "init.npy", "-o", "loc.zarr", "--workers", "2", "-q")
    assert rc == 0, err
    ext, loc = _centers(d / "ext.zarr"), _centers(d / "loc.zarr")
    assert np.abs(ext).max() > 1  # not the all-zero model of a store read as empty
    np.testing.assert_array_equal(ext, loc)
    rc, _, err = run(capsys, "predict", "ext.zarr", name, "-o", "lab.zarr", "--scheduler", external)
    assert rc == 0, err
    lab = zarr.open_group(str(d / "lab.zarr"), mode="r")["labels"][:]
    assert len(np.unique(lab)) == 4


def test_path_the_workers_cannot_see_is_one_clear_line(external, data_dir, capsys):
    from distributed import Client

    from daskmeans.dask_cluster import check_paths_on_workers
    from daskmeans.errors import DaskmeansError

    with Client(external, timeout="30s") as c:
        with pytest.raises(DaskmeansError, match=r"worker tcp://127\.0\.0\.1:\d+ cannot read /nonexistent/x\.zarr"):
            check_paths_on_workers(c, read=["/nonexistent/x.zarr"])
        with pytest.raises(DaskmeansError, match=r"cannot write into /nonexistent"):
            check_paths_on_workers(c, write=["/nonexistent/labels.zarr"])


def test_missing_zarr_chunk_is_an_error_never_zeros(data_dir, capsys):
    d, _ = data_dir
    os.remove(d / "data.zarr" / "c" / "3" / "0")
    rc, _, err = run(capsys, "fit", "data.zarr", "--k", "4", "--init", "init.npy", "-o", "m.zarr", "--workers", "2", "-q")
    one_line_error(rc, err, "Zarr chunk c/3/0", "is missing (rows 3000 to 3999)")
    assert not (d / "m.zarr").exists()
    assert not [p for p in os.listdir(d) if p.startswith(".")]  # no temporary directory left


def test_missing_chunk_in_a_group_names_the_array(tmp_path):
    import daskmeans

    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    g.create_array("feat/x", data=np.ones((40, 3), np.float32), chunks=(10, 3))
    os.remove(tmp_path / "g.zarr" / "feat" / "x" / "c" / "1" / "0")
    with pytest.raises(daskmeans.DataError, match=r"Zarr chunk feat/x/c/1/0 of .*g\.zarr is missing \(rows 10 to 19\)"):
        daskmeans.read(str(tmp_path / "g.zarr")).compute(scheduler="sync")


def test_all_zero_chunks_are_written_so_they_read_back(tmp_path, capsys):
    """The readers refuse absent chunks, so daskmeans' writers must write chunks equal to the
    fill value (zarr skips them by default)."""
    import dask.array as da

    import daskmeans
    from daskmeans.io.model_store import write_array

    x = da.zeros((40, 3), chunks=(10, 3), dtype=np.float32)
    write_array(x, str(tmp_path / "z.zarr"))
    np.testing.assert_array_equal(daskmeans.read(str(tmp_path / "z.zarr")).compute(scheduler="sync"), 0)


@pytest.mark.parametrize("argv, victim", [
    (["fit", "data.npy", "--k", "4", "-o", "data.npy", "--overwrite"], "data.npy"),
    (["fit", "data.zarr", "--k", "4", "-o", "data.zarr", "--overwrite"], "data.zarr"),
    (["fit", "data.zarr", "--k", "4", "-o", "data.zarr/inner.zarr", "--overwrite"], "data.zarr"),
    (["fit", "data.zarr", "--k", "4", "-o", "m.zarr", "--labels", "data.zarr", "--overwrite"], "data.zarr"),
    (["fit", "data.zarr", "--k", "4", "--init", "init.npy", "-o", "init.npy", "--overwrite"], "init.npy"),
    (["predict", "model.zarr", "data.zarr", "-o", "model.zarr", "--overwrite"], "model.zarr"),
    (["predict", "model.zarr", "data.zarr", "-o", "data.zarr", "--overwrite"], "data.zarr"),
])
def test_output_over_an_input_is_refused_even_with_overwrite(data_dir, capsys, monkeypatch, argv, victim):
    d, _ = data_dir
    rc, _, err = run(capsys, "fit", "data.zarr", "--k", "4", "--init", "init.npy", "-o", "model.zarr", "--workers", "1", "-q")
    assert rc == 0, err

    def snapshot():
        p = d / victim
        if p.is_dir():
            return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}
        return p.read_bytes()

    before = snapshot()

    def no_cluster(*args, **kw):
        raise AssertionError("a cluster was started for a command that must be refused first")

    monkeypatch.setattr(dask_cluster, "connect", no_cluster)  # refused before any cluster starts
    rc, _, err = run(capsys, *argv)
    one_line_error(rc, err, "would overwrite the input", "--overwrite never replaces an input")
    assert snapshot() == before


def test_output_check_resolves_links(tmp_path):
    from daskmeans.errors import DaskmeansError
    from daskmeans.io.paths import check_output

    (tmp_path / "data.npy").write_bytes(b"x")
    os.symlink(tmp_path / "data.npy", tmp_path / "alias.npy")
    with pytest.raises(DaskmeansError, match="would overwrite the input"):
        check_output(str(tmp_path / "alias.npy"), True, [str(tmp_path / "data.npy")])
    check_output(str(tmp_path / "other.zarr"), False, [str(tmp_path / "data.npy")])
    shutil.rmtree(tmp_path)
