"""The command's local cluster of worker processes (``daskmeans.local-cluster: processes``,
or several GPUs): started on a thread while the command imports and reads its data
(``dask_cluster.Starting``) and left to the command's exit rather than closed
(``dask_cluster.end_with_process``). Real ``daskmeans fit`` subprocesses: the workers end with
the command whether the fit succeeds or fails, nothing of them reaches its output, and the
model is bitwise the in-process workers' model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import numpy as np
import psutil
import pytest
import zarr

ENV = dict(os.environ, PYTHONUNBUFFERED="1")
PROCESSES = dict(ENV, DASK_DASKMEANS__LOCAL_CLUSTER="processes")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("procs")
    x = np.random.default_rng(3).standard_normal((6000, 5)).astype(np.float32)
    np.save(d / "x.npy", x)
    np.save(d / "bad-init.npy", x[:4, :3].astype(np.float64))  # 3 columns for data of 5
    return d


def _argv(d, out, *extra):
    return [sys.executable, "-m", "daskmeans", "fit", str(d / "x.npy"), "--k", "4", "--backend", "cpu",
            "--workers", "2", "--seed", "0", "--max-iter", "8", "-o", str(d / out), *extra]


def _marked(mark: str) -> list[psutil.Process]:
    """The processes whose environment carries ``mark`` (a command's and its children's)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("DASKMEANS_TEST_MARK") == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def _none_left(mark: str, timeout: float = 30.0) -> list[psutil.Process]:
    """The processes still marked ``mark`` after ``timeout`` s (none, once they have ended)."""
    left = _marked(mark)
    _, alive = psutil.wait_procs(left, timeout=timeout)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_the_workers_end_with_the_command_and_the_model_is_the_in_process_one(data):
    mark = uuid.uuid4().hex
    p = subprocess.Popen(_argv(data, "m-procs.zarr", "-v", "--timings", str(data / "t.json")),
                         env=dict(PROCESSES, DASKMEANS_TEST_MARK=mark), stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    lines, children = [], []
    seen = threading.Event()

    def read():
        for line in p.stderr:
            lines.append(line)
            if not seen.is_set() and "worker(s)" in line:  # the cluster is up: its processes exist
                children.extend(psutil.Process(p.pid).children(recursive=True))
                seen.set()

    t = threading.Thread(target=read)
    t.start()
    rc = p.wait(timeout=300)
    t.join()
    err = "".join(lines)
    assert rc == 0, err
    assert seen.is_set() and "2 worker(s) (2 CPU)" in err, err
    assert len(children) >= 2, children  # each worker's process (and its nanny's)
    assert not _none_left(mark), ("orphans", err)
    assert "Traceback" not in err and "leaked" not in err and "resource_tracker" not in err, err
    assert "close" in json.load(open(data / "t.json"))["phases"]
    subprocess.run(_argv(data, "m-threads.zarr", "-q"), env=ENV, check=True, timeout=300)
    got, want = (zarr.open_group(str(data / m), mode="r")["cluster_centers"][:] for m in ("m-procs.zarr", "m-threads.zarr"))
    np.testing.assert_array_equal(got, want)


def test_an_error_after_the_cluster_started_is_one_line_and_leaves_no_worker(data):
    """The init file is read after the workers' start has begun (the command starts them first
    thing): the error is the command's one line, and the processes end with it."""
    mark = uuid.uuid4().hex
    p = subprocess.run(_argv(data, "m-bad.zarr", "--init", str(data / "bad-init.npy")),
                       env=dict(PROCESSES, DASKMEANS_TEST_MARK=mark), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("daskmeans: error: ") and p.stderr.count("\n") == 1, p.stderr
    assert "should be (n_clusters, n_features) = (4, 5)" in p.stderr, p.stderr
    assert not (data / "m-bad.zarr").exists()
    assert not _none_left(mark), "orphans"


@pytest.mark.parametrize("how, n, expected", [("threads", 2, True), ("processes", 2, False), ("auto", 2, True),
                                              ("auto", 64, False)])
def test_whether_the_local_cpu_cluster_is_in_process(how, n, expected):
    import dask

    from daskmeans.dask_cluster import starts_in_process

    with dask.config.set({"daskmeans.local-cluster": how}):
        assert starts_in_process("cpu", n) is expected


def test_a_start_that_failed_is_told_where_the_client_is_asked_for():
    """``backend='gpu'`` without a GPU (CI's machine): the error comes from ``connected()``,
    in the caller's thread, with connect()'s words."""
    from daskmeans.backends import gpu_available
    from daskmeans.dask_cluster import Starting
    from daskmeans.errors import DaskmeansError

    if gpu_available():
        pytest.skip("a GPU is visible: backend='gpu' starts")
    start = Starting(backend="gpu")
    with pytest.raises(DaskmeansError, match=r"^backend='gpu' but no CUDA device is visible to CuPy$"):
        with start.connected():
            pass
