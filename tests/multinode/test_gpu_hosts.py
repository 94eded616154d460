"""GPU workers on two simulated hosts (127.0.0.2 and 127.0.0.3; two GPU workers each on a host
with 4 GPUs or more, else one each), NCCL kept off NVLink and shared memory (sockets over the
loopback device, as between real hosts; :class:`hostkit.GpuHosts`): the fit is bitwise that of
one GPU, through NCCL and through the Dask collective, and a host lost mid-fit (all of its GPU
workers SIGKILLed at once) is recovered bitwise (run on a host with two GPUs or more:
``pytest -m gpu tests/multinode``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import daskmeans
import faultkit
import hostkit
from faultkit import daskmeans_cli, kills, leftovers
from hostkit import HOSTS

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    from daskmeans.backends import gpu_count

    return gpu_count()


def _per_host() -> int:
    """GPU workers per simulated host: 2 where the host has 4 GPUs (hosts 0-1 and 2-3), else 1."""
    return 2 if _gpus() >= 4 else 1


needs_two_gpus = pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs: one GPU worker per simulated host at least")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-hosts")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((120_000, 96)).astype(np.float32)
    np.save(d / "x.npy", x)
    np.save(d / "init.npy", x[:300].astype(np.float64))
    return d


def _fit(d, out, *extra):
    return [str(d / "x.npy"), "--k", "300", "--init", str(d / "init.npy"), "--max-iter", "8", "--tol", "0",
            "--backend", "gpu", "-o", str(out), "-q", *extra]


@pytest.fixture(scope="module")
def one_gpu(data, tmp_path_factory):
    """``model(precision)``: the model the command writes fitting ``data`` on GPU 0 alone (its
    own one-GPU cluster), made once per precision: the reference of every fit over the hosts."""
    made: dict = {}

    def model(precision: str) -> Path:
        if precision not in made:
            out = tmp_path_factory.mktemp("one-gpu") / "one.zarr"
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
            p = subprocess.run([sys.executable, "-m", "daskmeans", "fit", *_fit(data, out, "--precision", precision)],
                               env=env, capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stderr
            made[precision] = out
        return made[precision]

    return model


@pytest.fixture(scope="module")
def gpu_hosts(tmp_path_factory):
    """Two simulated hosts of :func:`_per_host` GPU workers each, without nannies. Tests that
    kill workers leave fewer: each test starts with ``gpu_hosts.restore()``."""
    c = hostkit.GpuHosts(tmp_path_factory.mktemp("gpu-hosts-cluster"), HOSTS[:2], per_host=_per_host())
    c.start()
    try:
        yield c
    finally:
        c.stop()


def assert_same_model(model: Path, ref: Path) -> None:
    """Centroids bitwise and the same iterations; the inertia within rounding (the GPU kernels
    add a chunk's inertia with float atomics: its last bits vary from run to run, and the
    chunks follow the worker count)."""
    got, want = daskmeans.load(str(model)), daskmeans.load(str(ref))
    np.testing.assert_array_equal(got.cluster_centers_, want.cluster_centers_)
    assert got.cluster_centers_.dtype == want.cluster_centers_.dtype
    assert got.n_iter_ == want.n_iter_
    assert got.inertia_ == pytest.approx(want.inertia_, rel=1e-12)


@needs_two_gpus
@pytest.mark.parametrize("collective", ["nccl", "dask"])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_gpu_workers_on_two_hosts_fit_bitwise_as_one_gpu(gpu_hosts, one_gpu, data, tmp_path, collective, precision):
    gpu_hosts.restore()
    model = tmp_path / "two.zarr"
    # Without -q (silent on success), so that the command says which workers it found.
    argv = [a for a in _fit(data, model, "--precision", precision, "--collective", collective, "-v") if a != "-q"]
    rc, _, err = daskmeans_cli(gpu_hosts, "fit", *argv, cwd=tmp_path, timeout=300)
    assert rc == 0 and "Traceback" not in err, err + gpu_hosts.logs()
    assert f"{gpu_hosts.n} worker(s) ({gpu_hosts.n} GPU)" in err, err
    assert {h: len(ws) for h, ws in gpu_hosts.workers_by_host().items()} == {h: _per_host() for h in HOSTS[:2]}
    assert_same_model(model, one_gpu(precision))


@needs_two_gpus
def test_a_gpu_host_lost_mid_fit_is_recovered_bitwise(gpu_hosts, one_gpu, data, tmp_path):
    """Every GPU worker of 127.0.0.3 SIGKILLed as its third segment of the Lloyd loop starts
    (one iteration per segment), NCCL over sockets: the survivors' all-reduce is aborted, the
    fit goes on on 127.0.0.2's workers, exit status 0, one GPU's model."""
    gpu_hosts.restore()
    model = tmp_path / "model.zarr"
    argv = [sys.executable, "-m", "daskmeans", "fit", *_fit(data, model, "--precision", "fp32", "--collective", "nccl"),
            "--scheduler-file", str(gpu_hosts.scheduler_file)]
    with hostkit.kill_hosts(gpu_hosts.client, tmp_path / "flags", "daskmeans-segment", [HOSTS[1]], skip=2) as flags:
        # faultkit.daskmeans_cli's run but for the segments: one iteration each, so that the
        # third starts mid-fit however fast the GPUs iterate.
        p = subprocess.Popen(argv, cwd=tmp_path, env=faultkit.environment(DASK_DASKMEANS__SEGMENT_SECONDS="0"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        rc, _, err = faultkit.wait_process(p, 300, gpu_hosts.client)
    assert rc == 0 and "Traceback" not in err, err + gpu_hosts.logs()
    killed = kills(flags)
    assert len(killed) == _per_host() and all(hostkit.host_of(line.split()[1]) == HOSTS[1] for line in killed), killed
    assert set(gpu_hosts.workers_by_host()) == {HOSTS[0]}
    assert_same_model(model, one_gpu("fp32"))
    assert leftovers(tmp_path) == []
