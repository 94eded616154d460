"""Prompt failure in every phase (issue 42, part 3), on real ``dask scheduler`` / ``dask
worker`` processes: with ``--checkpoint``, every worker killed at once (with and without a
nanny) or the scheduler killed ends the command within :data:`SOON` seconds of the kills, in
one line naming what was lost, with no Dask log line, no output, and a checkpoint that is
either absent or a valid earlier one. (Without ``--checkpoint``: test_worker_loss.py and
test_cluster_loss.py.)"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from faultkit import K, command_while_killing, daskmeans_cli, kill_on, kills, leftovers, one_error_line

SOON = 10.0  # seconds from the last kill to the command's exit (the old waits were 60 s each)


def last_kill(flags: Path) -> float:
    """When the last kill was recorded (its file's mtime, the wall clock of the test's host)."""
    return max(p.stat().st_mtime for p in flags.glob("killed*"))


def only_our_lines(err: str) -> None:
    """Every line on stderr is the command's own (``daskmeans: ...``): none of Dask's log."""
    foreign = [line for line in err.splitlines() if line.strip() and not line.startswith("daskmeans: ")]
    assert not foreign, err


def valid_or_absent(checkpoint: Path) -> None:
    """The checkpoint is absent, or one a resume would take (its checks passed), of at least
    one iteration."""
    if not checkpoint.exists():
        return
    from daskmeans.io.checkpoint import read_checkpoint

    ck = read_checkpoint(str(checkpoint))
    assert ck["iteration"] >= 1 and len(ck["history"]) == ck["iteration"], ck["iteration"]


@pytest.mark.parametrize("nanny, skip", [pytest.param(True, 0, id="nanny-first-segment"),
                                         pytest.param(False, 1, id="no-nanny-second-segment")])
def test_every_worker_killed_with_checkpoint_ends_soon(fresh_cluster, fault_data, tmp_path, nanny, skip):
    """Each worker kills itself at its own segment task ``skip + 1`` (a nanny restarts it at a
    new address within seconds): the command ends within SOON seconds of the last kill, in one
    line naming the three workers (the restart point is asked of live workers only, never of
    the dead ones for 60 s each); a checkpoint written before the kills stays as it was."""
    cluster = fresh_cluster(nanny=nanny)
    addresses = sorted(cluster.client.nthreads())
    model, ck = tmp_path / "model.zarr", tmp_path / "ck.zarr"
    with kill_on(cluster.client, tmp_path / "flags", "daskmeans-segment", skip=skip, every_worker=True) as flags:
        rc, _, err = daskmeans_cli(cluster, "fit", *fault_data.cli("npy", 9), "--k", str(K), "--seed", "0",
                                   "-o", str(model), "--checkpoint", str(ck), "--checkpoint-every", "1", "-q",
                                   cwd=tmp_path, timeout=60, stuck_after=SOON,
                                   env={"DASK_DASKMEANS__SEGMENT_SECONDS": "0"})  # the kills come however fast
    ended = time.time()
    assert len(kills(flags)) == 3, kills(flags)
    assert ended - last_kill(flags) < SOON, (ended - last_kill(flags), err)
    line = one_error_line(rc, err, "every worker of the fit was lost (")
    assert "()" not in line and all(a in line for a in addresses), (line, addresses)
    only_our_lines(err)
    assert not model.exists() and leftovers(tmp_path) == []
    valid_or_absent(ck)


@pytest.mark.parametrize("prefix, skip", [
    pytest.param("daskmeans-segment", 3, id="iterations"),
    # While the client fetches a checkpoint's restart point from a worker.
    pytest.param("daskmeans-restart", 0, id="restart-point"),
])
def test_scheduler_killed_with_checkpoint_ends_soon(fresh_cluster, fault_data, tmp_path, prefix, skip):
    """The scheduler SIGKILLed in the iterations of a fit with ``--checkpoint``: one line
    naming the scheduler within SOON seconds (it took 90 s: a restart point asked of the lost
    cluster, 60 s for each worker), and none of Dask's log lines (its client's failed
    reconnection)."""
    cluster = fresh_cluster(nanny=False)
    model, ck = tmp_path / "model.zarr", tmp_path / "ck.zarr"
    flags = tmp_path / "flags"
    argv = ["fit", *fault_data.cli("zarr", 9), "--k", str(K), "--seed", "0", "-o", str(model), "--checkpoint", str(ck),
            "--checkpoint-every", "1", "-q"]
    try:  # ample: the bound is checked below
        rc, err = command_while_killing(cluster, argv, flags, prefix, cwd=tmp_path, after_kill=3 * SOON, skip=skip,
                                        pid=cluster.scheduler.pid)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the command still ran {3 * SOON:.0f} s after the scheduler was killed") from None
    ended = time.time()
    assert ended - last_kill(flags) < SOON, (ended - last_kill(flags), err)
    one_error_line(rc, err, "lost the connection to the scheduler")
    only_our_lines(err)
    assert not model.exists() and leftovers(tmp_path) == []
    valid_or_absent(ck)
