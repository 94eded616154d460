"""Workers that cannot run daskmeans (issue 42): a ``dask worker`` whose ``import daskmeans``
fails, and one with another daskmeans version, beside a healthy one (real scheduler and worker
processes). Before any work, the command and the API name each such worker and what failed in
one line; it was a traceback (the first function sent to the workers failed to unpickle)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import daskmeans
from daskmeans.cli import main
from faultkit import daskmeans_cli, leftovers, one_error_line


def _fake_daskmeans(root, init: str) -> str:
    """A directory holding a package ``daskmeans`` whose ``__init__.py`` is ``init``."""
    (root / "daskmeans").mkdir(parents=True)
    (root / "daskmeans" / "__init__.py").write_text(init)
    return str(root)


@pytest.fixture
def mixed(fresh_cluster, tmp_path):
    """A cluster of three workers: ``(cluster, {"broken": address, "old": address, "good":
    address})``, the first with a ``daskmeans`` that raises ImportError ahead on its
    ``PYTHONPATH``, the second with a ``daskmeans`` of version 0.0.1 there."""
    cluster = fresh_cluster(nanny=False, n=1)  # the healthy worker
    base = dict(cluster.env)
    pids = {cluster.procs[-1].pid: "good"}  # without a nanny the worker runs in the process started
    for name, init in (("broken", "raise ImportError('no compiled kernels here')\n"), ("old", "__version__ = '0.0.1'\n")):
        ahead = _fake_daskmeans(tmp_path / "fakes" / name, init)
        cluster.env = dict(base, PYTHONPATH=os.pathsep.join([ahead, base["PYTHONPATH"]]))
        cluster.n += 1
        cluster.add_workers(1)
        pids[cluster.procs[-1].pid] = name
    cluster.env = base
    return cluster, {pids[pid]: address for address, pid in cluster.worker_pids().items()}


def test_workers_without_the_client_s_daskmeans_are_named_in_one_line(mixed, tmp_path, capsys):
    cluster, workers = mixed
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    version = daskmeans.__version__
    expected = (f"worker {workers['broken']} cannot import daskmeans: ImportError: no compiled kernels here",
                f"worker {workers['old']} has daskmeans 0.0.1, the client {version}",
                f"every worker needs the client's daskmeans ({version}) importable")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(200, 2)))
    assert main(["fit", str(tmp_path / "x.npy"), "--k", "2", "--workers", "1", "-q", "-o",
                 str(tmp_path / "m.zarr")]) == 0, capsys.readouterr().err
    for argv in (["predict", "m.zarr", "x.npy", "-o", "labels.zarr"],
                 ["fit", "x.npy", "--k", "2", "-o", "m2.zarr", "--labels", "l2.zarr"]):
        rc, out, err = daskmeans_cli(cluster, *argv, cwd=tmp_path)
        line = one_error_line(rc, err, *expected)
        assert workers["good"] not in line, line
    assert sorted(os.listdir(tmp_path)) == ["m.zarr", "x.npy"] and leftovers(tmp_path) == []
    # The API: the same line, whichever backend is asked for (a host backend asks no worker
    # for its kind, but still checks them).
    for backend in ("auto", "cpu"):
        with pytest.raises(daskmeans.DaskmeansError) as e:
            daskmeans.KMeans(2, backend=backend, client=cluster.client).fit(np.load(tmp_path / "x.npy"))
        assert all(s in str(e.value) for s in expected) and "\n" not in str(e.value), str(e.value)


def test_the_probe_needs_no_daskmeans_on_the_worker():
    """The probe travels by value: a worker unpickles it without importing daskmeans."""
    import pickle

    from distributed.protocol.pickle import dumps

    from daskmeans import dask_cluster

    blob = dumps(dask_cluster._probe)
    saved = {k: v for k, v in sys.modules.items() if k == "daskmeans" or k.startswith("daskmeans.")}
    try:
        for k in saved:
            sys.modules[k] = None  # `import daskmeans` raises ImportError now
        probe = pickle.loads(blob)
        result = probe("0.1.0", ("daskmeans.backends", "gpu_available"), [])
    finally:
        sys.modules.update(saved)
    assert result["error"].startswith("cannot import daskmeans: ModuleNotFoundError: "), result
