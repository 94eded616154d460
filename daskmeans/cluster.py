"""Connect to a scheduler, or start a local cluster: dask-cuda's ``LocalCUDACluster`` (one
worker per GPU) where a GPU is visible, else a NumPy ``LocalCluster`` (one single-threaded
worker per core, so BLAS and the engine do not oversubscribe the cores)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from distributed import Client, LocalCluster

from .backends import ALIASES, gpu_available
from .errors import DaskmeansError


def workers_have_gpus(client: Client) -> bool:
    """True when every worker of ``client`` sees a CUDA device through CuPy."""
    res = client.run(gpu_available)
    return bool(res) and all(res.values())


def resolve_backend(client: Client, requested: str = "auto", data_backend: str | None = None) -> str:
    """``"numpy"`` or ``"cupy"`` for ``requested`` in auto/cpu/gpu/numpy/cupy.

    ``auto`` follows the data when its blocks are already CuPy, else uses the GPUs when every
    worker has one.
    """
    if requested == "auto":
        if data_backend == "cupy":
            return "cupy"
        return "cupy" if workers_have_gpus(client) else "numpy"
    name = ALIASES.get(requested)
    if name is None:
        raise DaskmeansError(f"backend={requested!r} should be one of 'auto', 'cpu', 'gpu'")
    if name == "cupy" and not workers_have_gpus(client):
        raise DaskmeansError("backend='gpu' but the cluster's workers have no usable GPU (CuPy + CUDA device)")
    return name


def local_uses_gpu(backend: str) -> bool:
    """Whether a local cluster started for ``backend`` ("auto", "cpu", "gpu") is GPU workers."""
    return backend in ("gpu", "cupy") or (backend == "auto" and gpu_available())


@contextlib.contextmanager
def connect(scheduler: str | None = None, backend: str = "auto", n_workers: int | None = None) -> Iterator[Client]:
    """A client on ``scheduler``, or on a local cluster started (and closed) here.

    Parameters
    ----------
    scheduler : str, optional
        Address (``tcp://host:8786``) or a scheduler JSON file; if omitted a local cluster
        is started.
    backend : "auto", "cpu" or "gpu"
        For a local cluster: ``auto`` starts ``LocalCUDACluster`` when a GPU is visible.
    n_workers : int, optional
        Local CPU cluster size (default: one per core).
    """
    if scheduler:
        kwargs = {"scheduler_file": scheduler} if scheduler.endswith(".json") else {"address": scheduler}
        try:
            client = Client(timeout="30s", **kwargs)
        except (OSError, TimeoutError) as e:
            raise DaskmeansError(f"cannot connect to scheduler {scheduler}: {e}") from None
        try:
            yield client
        finally:
            client.close()
        return
    if local_uses_gpu(backend):
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise DaskmeansError(
                "a GPU cluster needs dask-cuda: pip install 'daskmeans[cuda13]' (or [cuda12])"
            ) from None
        if not gpu_available():
            raise DaskmeansError("backend='gpu' but no CUDA device is visible to CuPy")
        cluster = LocalCUDACluster(dashboard_address=":0")
    else:
        n = n_workers or os.cpu_count() or 1
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=":0")
    try:
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()
