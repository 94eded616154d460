"""Workers of one process that each own a device: a local GPU cluster of in-process workers.

A worker process of ``LocalCUDACluster`` owns its GPU by ``CUDA_VISIBLE_DEVICES``: every thread
of it sees that one device. Workers that share a process see every device, and a thread's
current device is device 0 until the thread says otherwise. Each worker of
:func:`device_worker_specs` therefore runs its tasks in a :class:`DeviceThreadPoolExecutor`, whose
``submit`` enters the worker's device around the task (a task that secedes keeps its thread and
its device; the pool's replacement thread enters it for the next task). What runs on a worker
outside its tasks, ``client.run``'s functions on the event loop the in-process workers share,
enters the device itself: :func:`on_worker_device` with the ``dask_worker`` Dask passes.

The device is entered through the device backend (its optional ``device_scope(index)``,
:mod:`daskmeans.backends`): nothing here imports an array library.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from distributed import Worker
from distributed.threadpoolexecutor import ThreadPoolExecutor

from ..backends import get_backend


class DeviceThreadPoolExecutor(ThreadPoolExecutor):
    """Dask's thread pool (secede and rejoin work as with the default one) running every task
    on device ``device`` of backend ``backend`` (a backend with ``device_scope``).

    The name ends in ``ThreadPoolExecutor`` on purpose: a worker runs its tasks with their
    context (``get_worker()``, which ``secede`` and the engine's tasks use) only in an
    executor whose type's name says it is a thread pool.

    Parameters
    ----------
    backend : str
        The device backend's name (``"cupy"``).
    device : int
        The device's index in this process.
    *args, **kwargs
        ``ThreadPoolExecutor``'s.
    """

    def __init__(self, backend: str, device: int, *args: Any, **kwargs: Any):
        scope = getattr(get_backend(backend), "device_scope", None)
        if scope is None:
            raise ValueError(f"backend {backend!r} has no devices to give workers (no device_scope)")
        super().__init__(*args, **kwargs)
        self.backend, self.device = backend, int(device)

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        return super().submit(_on_device, self.backend, self.device, fn, args, kwargs)


def _on_device(backend: str, device: int, fn: Callable, args: tuple, kwargs: dict) -> Any:
    with get_backend(backend).device_scope(device):
        return fn(*args, **kwargs)


def worker_device(dask_worker: Any) -> tuple[str, int] | None:
    """``(backend, device index)`` of a worker of :func:`device_worker_specs`; None for any
    other worker (a process of its own sees its device as the current one)."""
    executors = getattr(dask_worker, "executors", None) or {}
    ex = executors.get("default")
    return (ex.backend, ex.device) if isinstance(ex, DeviceThreadPoolExecutor) else None


@contextlib.contextmanager
def on_worker_device(dask_worker: Any) -> Iterator[None]:
    """Within the block, the calling thread's current device is ``dask_worker``'s (a worker of
    :func:`device_worker_specs`); nothing changes for other workers or None. For the functions
    that ``client.run`` runs on a worker's event loop and that ask the device something."""
    dev = None if dask_worker is None else worker_device(dask_worker)
    if dev is None:
        yield
        return
    with get_backend(dev[0]).device_scope(dev[1]):
        yield


def carried(be: Any, fn: Callable) -> Callable:
    """``fn`` to run on other threads (a reading pipeline's) under the calling thread's current
    device of backend ``be``: its copies go to the device of the task that asked for them. ``fn``
    itself where ``be`` has no devices to choose from (no ``device_scope``)."""
    current, scope = getattr(be, "current_device", None), getattr(be, "device_scope", None)
    if current is None or scope is None:
        return fn
    device = current()

    def on_device(*args: Any, **kwargs: Any) -> Any:
        with scope(device):
            return fn(*args, **kwargs)

    return on_device


class DeviceWorker(Worker):
    """A worker of one thread that runs its tasks on device ``device`` of backend
    ``device_backend`` (:class:`DeviceThreadPoolExecutor`); ``Worker``'s other keywords.

    The executor is made with the worker, not held in the cluster's spec: a worker shuts its
    executor down when it closes, and a worker the cluster starts again from its spec needs a
    new one.

    Its ``memory_limit`` (bytes, a size such as ``"8GiB"``, or None) is kept as
    :attr:`memory_share`, which sizes the tiers' budgets (:mod:`daskmeans.engine.plan`); Dask is
    given none. A Dask limit would count device arrays as host memory: the memory manager
    would spill placed shards to disk through the serializer and pause the worker on the whole
    process's memory, which holds every worker's data, and the scheduler would fail a task
    whose inputs (a shard's chunks on the GPU) outsize the host's share.
    """

    def __init__(self, *args: Any, device_backend: str, device: int, **kwargs: Any):
        from dask.utils import parse_bytes

        name = kwargs.get("name", f"{device_backend}-{device}")
        share = kwargs.pop("memory_limit", None)
        self.memory_share: int | None = parse_bytes(share) if isinstance(share, str) else share
        ex = DeviceThreadPoolExecutor(device_backend, device, 1, thread_name_prefix=f"{name}-Dask-Default-Threads")
        super().__init__(*args, **{**kwargs, "nthreads": 1, "executor": ex, "memory_limit": 0})


def device_worker_specs(backend: str, devices: list[int], options: dict) -> dict:
    """``SpecCluster``'s worker specs of one in-process worker per device in ``devices`` (named
    ``<backend>-<index>``), each a :class:`DeviceWorker` with ``options`` besides (``Worker``'s
    keywords: memory limit, protocol, logs)."""
    return {f"{backend}-{i}": {"cls": DeviceWorker,
                               "options": {**options, "name": f"{backend}-{i}", "device_backend": backend,
                                           "device": i}}
            for i in devices}
