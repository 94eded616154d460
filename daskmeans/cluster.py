"""Connect to a scheduler, or start a local cluster: dask-cuda's ``LocalCUDACluster`` (one
worker per GPU) where a GPU is visible, else a NumPy ``LocalCluster`` (one single-threaded
worker per core, so BLAS and the engine do not oversubscribe the cores)."""

from __future__ import annotations

import contextlib
import logging
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


def _path_problems(read: list[str], write: list[str]) -> list[str]:
    """On a worker: what it cannot do with the given absolute paths."""
    out = [f"read {p} (no such file or directory here)" for p in read if not os.path.exists(p)]
    out += [f"read {p} (permission denied)" for p in read if os.path.exists(p) and not os.access(p, os.R_OK)]
    for p in write:
        parent = os.path.dirname(p.rstrip(os.sep))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            out.append(f"write into {parent} (missing or not writable here)")
    return out


def check_paths_on_workers(client: Client, read: list[str] = (), write: list[str] = ()) -> None:
    """Raise unless every worker can read ``read`` and write beside ``write`` (absolute paths).

    Workers read the data and write labels themselves: on an external cluster they may not
    see the client's filesystem, and a store they cannot see must never be read as empty.
    """
    read = [os.path.abspath(p) for p in read]
    write = [os.path.abspath(p) for p in write]
    if not read and not write:
        return
    res = client.run(_path_problems, read, write)
    for worker, problems in sorted(res.items()):
        if problems:
            raise DaskmeansError(
                f"worker {worker} cannot {problems[0]}: every worker needs the same paths as the "
                f"client (a shared filesystem)"
            )


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
        # Worker logs stay quiet: errors reach the client as exceptions (one line from the
        # CLI), and an interrupted fit's aborted tasks are expected, not news.
        cluster = LocalCUDACluster(dashboard_address=":0", silence_logs=logging.CRITICAL)
    else:
        n = n_workers or os.cpu_count() or 1
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.CRITICAL)
    try:
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()
