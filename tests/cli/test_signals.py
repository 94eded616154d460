"""A signal ends the command within seconds in any phase, also while a worker runs a long
task that cannot look at the signal itself (here the greedy k-means++ init on one worker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

ENV = dict(os.environ, PYTHONUNBUFFERED="1")


@pytest.mark.parametrize("sig, rc_expected", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_a_long_init_task_ends_the_command_at_once(tmp_path, sig, rc_expected):
    x = np.random.default_rng(3).standard_normal((200_000, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "model.zarr"
    argv = [sys.executable, "-m", "daskmeans", "fit", str(tmp_path / "x.npy"), "--k", "5000", "--init", "k-means++",
            "--workers", "2", "-o", str(out)]
    p = subprocess.Popen(argv, env=ENV, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    proc = psutil.Process(p.pid)
    lines: list[str] = []
    moments = threading.Event()

    def read():
        for line in p.stderr:
            lines.append(line)
            if "moments" in line:
                moments.set()

    t = threading.Thread(target=read)
    t.start()
    assert moments.wait(120), "".join(lines)  # the init starts right after the moments pass
    # The event that the init's task is running: the process burns a further second of CPU
    # with no line printed (the seeding alone takes about a minute here).
    cpu0 = sum(proc.cpu_times()[:2])
    deadline = time.monotonic() + 60
    while sum(proc.cpu_times()[:2]) < cpu0 + 1.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any("init" in line for line in lines), "".join(lines)  # still seeding
    sent = time.monotonic()
    p.send_signal(sig)
    rc = p.wait(timeout=120)
    took = time.monotonic() - sent
    t.join()
    assert rc == rc_expected, "".join(lines)
    # Closing the cluster waited for the seeding task to finish (~a minute) before.
    assert took < 15, (took, "".join(lines))
    assert not out.exists() and os.listdir(tmp_path) == ["x.npy"]


def test_ctrl_c_without_a_checkpoint_says_how_to_keep_the_iterations(tmp_path):
    """SIGINT after some iterations of a fit without ``--checkpoint``: exit 130, and a line
    saying how many iterations were lost and that ``--checkpoint`` would keep them."""
    x = np.random.default_rng(4).random((40_000, 3)).astype(np.float32)  # uniform: many iterations
    np.save(tmp_path / "x.npy", x)
    argv = [sys.executable, "-m", "daskmeans", "fit", str(tmp_path / "x.npy"), "--k", "200", "--tol", "0",
            "--max-iter", "100000", "--workers", "1", "-v", "-o", str(tmp_path / "m.zarr")]
    env = dict(ENV, DASK_DASKMEANS__SEGMENT_SECONDS="0")  # a segment per iteration: lines as they go
    p = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    third = threading.Event()

    def read(stream):
        for line in stream:
            lines.append(line)
            if line.startswith("iter    3 "):
                third.set()

    readers = [threading.Thread(target=read, args=(s,)) for s in (p.stdout, p.stderr)]
    for t in readers:
        t.start()
    assert third.wait(120), "".join(lines)
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=60)
    for t in readers:
        t.join()
    assert rc == 130, "".join(lines)
    hint = [line for line in lines if "were not kept" in line]
    assert len(hint) == 1 and "--checkpoint PATH" in hint[0] and "--resume" in hint[0], "".join(lines)
    assert int(hint[0].split()[1]) >= 3
