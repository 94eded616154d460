"""A hung worker is a lost worker (issue 42, part 4), on real ``dask scheduler`` / ``dask
worker`` processes: a worker SIGSTOPped for good as a segment of the fit starts (its process
keeps its connections open, and the scheduler lists it for its worker-ttl, 5 minutes) is given
up on after the collective's timeout: the command says whom it waits for, retires the worker,
and finishes on the two left with the model of the undisturbed fit, bit for bit. The stopped
worker continued afterwards changes nothing."""

from __future__ import annotations

import os
import signal
import time

import numpy as np

import daskmeans
from faultkit import K, StopOnTask, daskmeans_cli, end_stopped, kill_on, leftovers, stopped_pids

TIMEOUT = 5  # the collective's timeout, seconds: the fit waits about this long for the stopped worker


def test_a_stopped_worker_is_retired_and_the_fit_is_bitwise_the_same(fresh_cluster, fault_data, tmp_path):
    cluster = fresh_cluster(nanny=False)
    argv = ["fit", *fault_data.cli("zarr", 9), "--k", str(K), "--seed", "0"]
    # Segments of one iteration each: the stop comes in the fit's second iteration.
    env = {"DASK_DASKMEANS__COLLECTIVE_TIMEOUT": f"{TIMEOUT}s", "DASK_DASKMEANS__SEGMENT_SECONDS": "0"}
    ref = tmp_path / "ref.zarr"
    rc, _, err = daskmeans_cli(cluster, *argv, "-o", str(ref), "-q", cwd=tmp_path, env=env)
    assert rc == 0, err
    addresses = set(cluster.client.nthreads())
    model = tmp_path / "model.zarr"
    flags = tmp_path / "flags"
    try:
        # The fourth segment task to start (the second segment) stops its worker's process.
        with kill_on(cluster.client, flags, "daskmeans-segment", plugin=StopOnTask("daskmeans-segment", flags, 3)):
            t0 = time.monotonic()
            rc, _, err = daskmeans_cli(cluster, *argv, "-o", str(model), cwd=tmp_path, env=env, timeout=60)
            seconds = time.monotonic() - t0
        assert rc == 0 and "Traceback" not in err, err
        (pid,) = stopped_pids(flags)
        (stopped,) = [line.split()[1] for line in (flags / "killed").read_text().splitlines()]
        assert stopped in addresses
        # Progress names the worker waited for, then gives it up.
        assert f"daskmeans: waiting for worker {stopped} (rank " in err, err
        assert f"daskmeans: worker {stopped} (rank " in err and "taken for lost" in err, err
        assert seconds < 4 * TIMEOUT + 20, (seconds, err)
        got, want = daskmeans.load(str(model)), daskmeans.load(str(ref))
        np.testing.assert_array_equal(got.cluster_centers_, want.cluster_centers_)
        assert got.inertia_ == want.inertia_ and got.n_iter_ == want.n_iter_
        assert stopped not in cluster.client.nthreads()  # the scheduler was told
        # Continued, the worker finds itself removed and closes; the model stays as written.
        before = sorted(p.read_bytes() for p in model.rglob("*") if p.is_file())
        os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling for the continued worker's exit, with a deadline
        assert not _alive(pid), "the continued worker did not close"
        assert sorted(p.read_bytes() for p in model.rglob("*") if p.is_file()) == before
        assert len(cluster.client.nthreads()) == 2 and leftovers(tmp_path) == []
    finally:
        end_stopped(flags)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
