"""The scheduler SIGKILLed mid-fit (real ``dask scheduler`` / ``dask worker`` processes, the
command with ``--scheduler-file``): one ``daskmeans: error: ...`` line naming the scheduler,
exit status 1, soon, and no output (whole or partial) left behind. (Every worker killed:
test_worker_loss.py.)"""

from __future__ import annotations

import subprocess

import pytest

from faultkit import K, command_while_killing, leftovers, one_error_line

SOON = 20  # seconds from the kill to the command's exit (the issue asks for 35 s of the command)


class TooSlow(AssertionError):
    """The command did not end soon enough after the scheduler was killed."""


CASES = [
    # (what runs when the scheduler dies, the task whose start kills it, starts let pass)
    pytest.param("kmeans||", "daskmeans-kpar-sample", 2, id="kmeans||"),
    pytest.param("iterations", "daskmeans-segment", 3, id="iterations"),
    pytest.param("labels-write", "_write_block", 0, id="labels-write"),
]


@pytest.mark.parametrize("phase, prefix, skip", CASES)
def test_scheduler_killed_mid_fit_is_one_line_soon(fresh_cluster, fault_data, tmp_path, phase, prefix, skip):
    """The scheduler SIGKILLed (by a worker, as a task starts): Dask cancels every task at
    once, then tries to reconnect for 30 s."""
    cluster = fresh_cluster(nanny=False)
    model, labels = tmp_path / "model.zarr", tmp_path / "labels.zarr"
    flags = tmp_path / "flags"
    argv = ["fit", *fault_data.cli("zarr", 9), "--k", str(K), "--seed", "0", "-o", str(model), "--labels", str(labels),
            "-q"]
    try:
        rc, err = command_while_killing(cluster, argv, flags, prefix, cwd=tmp_path, after_kill=SOON, skip=skip,
                                        pid=cluster.scheduler.pid)
    except subprocess.TimeoutExpired:
        raise TooSlow(f"the command still ran {SOON} s after the scheduler was killed") from None
    one_error_line(rc, err, "lost the connection to the scheduler")
    assert not model.exists() and not labels.exists() and leftovers(tmp_path) == []


def test_a_cluster_without_workers_is_one_error(monkeypatch):
    """A scheduler with no worker: the fit waits a moment for one to join, then says so in one
    line (it was a ValueError from the memory plan)."""
    from distributed import Client, LocalCluster

    import numpy as np

    import daskmeans
    from daskmeans.engine import job as engine_job

    monkeypatch.setattr(engine_job.some_worker, "__defaults__", (0.5,))
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as c:
        with pytest.raises(daskmeans.DaskmeansError,
                           match=r"^the cluster has no worker and none joined in 0.5 s: start workers "
                                 r"\(dask worker inproc://"):
            daskmeans.KMeans(2, client=c).fit(np.zeros((10, 2), np.float32))
