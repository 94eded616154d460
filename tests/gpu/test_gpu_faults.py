"""A GPU worker SIGKILLed in each phase of a fit (placement, the k-means|| init, the
iterations, the labels) on a LocalCUDACluster: the fit goes on on the workers left (the nanny
brings the killed one back at a new address) and gives bitwise the undisturbed model and
labels. A worker per GPU (up to four) where there are several, else two workers sharing one."""

from __future__ import annotations

import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest

from daskmeans.backends import gpu_available

sys.path.insert(0, str(Path(__file__).parents[1] / "faults"))
import faultkit  # noqa: E402  (the fault-injection kit of tests/faults)

pytestmark = pytest.mark.gpu

# The first task of each phase whose start kills its worker (key prefixes).
PHASES = {
    "placement": "daskmeans-shard",
    "init": "daskmeans-kpar-sample",
    "iterations": "daskmeans-segment",
    "labels": "",  # the first task of computing labels_ after the fit, whatever its name
}


def _cluster():
    import cupy
    from dask_cuda import LocalCUDACluster
    from distributed import LocalCluster

    gpus = min(4, cupy.cuda.runtime.getDeviceCount())
    if gpus >= 2:
        return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(map(str, range(gpus))), dashboard_address=":0")
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(21)
    centers = rng.normal(scale=3, size=(64, 48))
    x = (centers[rng.integers(0, 64, 90_000)] + rng.normal(size=(90_000, 48))).astype(np.float32)
    return x


def _fit(c, x, kill=None, flags=None):
    import cupy
    from daskmeans import KMeans

    X = da.from_array(x, chunks=(10_000, -1)).map_blocks(cupy.asarray)  # 9 chunks: 2 workers share them unevenly
    km = KMeans(64, random_state=3, max_iter=12, tol=0, client=c)
    with dask.config.set({"daskmeans.segment-seconds": 0.05}):
        if kill is not None and kill != "labels":
            with faultkit.kill_on(c, flags, PHASES[kill]):
                km.fit(X)
        else:
            km.fit(X)
    if kill == "labels":
        with faultkit.kill_on(c, flags, PHASES[kill]):
            labels = c.compute(km.labels_).result(timeout=180)
    else:
        labels = c.compute(km.labels_).result(timeout=180)
    return km, labels


@pytest.fixture(scope="module")
def reference(problem):
    from distributed import Client

    with _cluster() as lc, Client(lc, set_as_default=False) as c:
        return _fit(c, problem)


@pytest.mark.skipif(not gpu_available(), reason="needs a GPU")
@pytest.mark.parametrize("phase", list(PHASES))
def test_a_gpu_worker_killed_in_each_phase_is_recovered_bitwise(problem, reference, phase, tmp_path):
    from distributed import Client

    ref, ref_labels = reference
    with _cluster() as lc, Client(lc, set_as_default=False) as c:
        km, labels = _fit(c, problem, phase, tmp_path / "flags")
    assert faultkit.kills(tmp_path / "flags"), f"no worker was killed in the {phase} phase"
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    assert km.n_iter_ == ref.n_iter_
    # The GPU kernels add a chunk's inertia with float atomics: its last bits vary from run
    # to run, disturbed or not (as in test_gpu_multi); centroids and labels are bitwise.
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)
    np.testing.assert_array_equal(labels, ref_labels)
