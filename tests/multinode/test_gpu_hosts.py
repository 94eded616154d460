"""GPU workers on two simulated hosts (127.0.0.2 and 127.0.0.3, one GPU each), NCCL kept off
NVLink and shared memory (sockets over the loopback device, as between real hosts): the fit
is bitwise that of one GPU, through NCCL and through the Dask collective (run on a host with
two GPUs: ``pytest -m gpu tests/multinode``)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import hostkit
from faultkit import daskmeans_cli

pytestmark = pytest.mark.gpu

# NCCL between the "hosts" as between machines: no peer-to-peer, no shared memory, sockets.
NCCL_SOCKETS = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"}


class GpuHosts(hostkit.LoopbackHosts):
    """One GPU worker per simulated host: host i sees GPU i only."""

    def start_host(self, host: str, count: int | None = None, wait: bool = True) -> None:
        self.env.update(NCCL_SOCKETS, CUDA_VISIBLE_DEVICES=str(self.hosts.index(host)))
        super().start_host(host, count, wait)


def _gpus() -> int:
    from daskmeans.backends import gpu_count

    return gpu_count()


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


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("collective", ["nccl", "dask"])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_gpu_workers_on_two_hosts_fit_bitwise_as_one_gpu(tmp_path, data, collective, precision):
    import zarr

    one = tmp_path / "one.zarr"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    p = subprocess.run([sys.executable, "-m", "daskmeans", "fit", *_fit(data, one, "--precision", precision)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    hosts = GpuHosts(tmp_path / "hosts", hostkit.HOSTS[:2], per_host=1)
    hosts.start()
    try:
        two = tmp_path / "two.zarr"
        rc, _, err = daskmeans_cli(hosts, "fit", *_fit(data, two, "--precision", precision, "--collective",
                                                       collective, "-v"), cwd=tmp_path, timeout=300)
        assert rc == 0 and "Traceback" not in err, err + hosts.logs()
        assert "2 worker(s) (2 GPU)" in err, err
    finally:
        hosts.stop()
    a, b = zarr.open_group(str(one), mode="r"), zarr.open_group(str(two), mode="r")
    np.testing.assert_array_equal(a["cluster_centers"][:], b["cluster_centers"][:])
