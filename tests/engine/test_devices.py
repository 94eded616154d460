"""In-process workers that each own a device (``engine/devices.py``): every task, every
``client.run`` function that asks the device and every reading thread a task starts runs on its
worker's device, and a fit on such workers gives the bits of one on ordinary workers.

No GPU here: the devices are those of a NumPy backend under another name whose
``device_scope`` sets a thread's current "device" (a thread-local index), as
``cupy.cuda.Device`` sets a thread's current GPU. ``tests/gpu/test_gpu_multi.py`` runs the same
cluster on real GPUs."""

from __future__ import annotations

import contextlib
import sys
import threading
import types

import numpy as np
import pytest
from distributed import Client, Scheduler, SpecCluster, get_worker, secede

from daskmeans import KMeans, backends
from daskmeans.backends import numpy_backend, protocol
from daskmeans.engine import collective, devices, reading

NAME = "numpy-dev"
MODULE = "daskmeans_test_numpy_devices_backend"
_CURRENT = threading.local()


def _current() -> int | None:
    return getattr(_CURRENT, "device", None)


@contextlib.contextmanager
def _scope(index: int):
    before = _current()
    _CURRENT.device = int(index)
    try:
        yield
    finally:
        _CURRENT.device = before


@pytest.fixture
def device_backend():
    """The NumPy backend with devices: ``device_scope``/``current_device`` as the CuPy backend's,
    and an ``assign`` that records the device it ran on, by worker."""
    module = types.ModuleType(MODULE)
    for member in [*protocol.members(), *protocol.capabilities(), "Prepared"]:
        setattr(module, member, getattr(numpy_backend, member))
    module.name = NAME
    module.device_scope = _scope
    module.current_device = _current
    module.seen = []

    def assign(*args, **kwargs):
        module.seen.append((get_worker().name, _current()))
        return numpy_backend.assign(*args, **kwargs)

    module.assign = assign
    sys.modules[MODULE] = module
    backends.register(NAME, MODULE)
    try:
        yield module
    finally:
        backends.unregister(NAME)
        del sys.modules[MODULE]


@contextlib.contextmanager
def _device_client(n: int, backend: str = NAME, memory_limit: int | str = 2 << 30):
    workers = devices.device_worker_specs(backend, list(range(n)), {"protocol": "inproc://", "memory_limit": memory_limit})
    scheduler = {"cls": Scheduler, "options": {"protocol": "inproc://", "dashboard": False}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, Client(cluster) as client:
        yield client


def _by_name(client: Client) -> dict[str, str]:
    return {info["name"]: address for address, info in client.scheduler_info()["workers"].items()}


def test_each_worker_runs_its_tasks_and_its_run_calls_on_its_own_device(device_backend):
    with _device_client(3) as c:
        names = _by_name(c)
        assert sorted(names) == [f"{NAME}-0", f"{NAME}-1", f"{NAME}-2"]

        def seceded():
            secede()  # the task leaves the pool's thread count, not its thread or device
            return _current()

        def in_a_thread():  # what a task's reading threads see (engine/reading.py)
            out = []
            t = threading.Thread(target=devices.carried(get_worker_backend(), lambda: out.append(_current())))
            t.start()
            t.join()
            return out[0]

        for i in range(3):
            w = names[f"{NAME}-{i}"]
            assert c.submit(_current, workers=[w], pure=False).result() == i
            assert c.submit(seceded, workers=[w], pure=False).result() == i
            assert c.submit(in_a_thread, workers=[w], pure=False).result() == i

        def on_device(dask_worker):
            with devices.on_worker_device(dask_worker):
                return _current()

        assert c.run(on_device) == {names[f"{NAME}-{i}"]: i for i in range(3)}
        assert c.run(_current) == {names[f"{NAME}-{i}"]: None for i in range(3)}  # the event loop's own
    assert _current() is None


def test_workers_started_again_from_the_same_specs_get_executors_of_their_own(device_backend):
    """A worker shuts its executor down when it closes; the specs make a new one with each
    worker, so a cluster started again from them runs its tasks (on each worker's device)."""
    specs = devices.device_worker_specs(NAME, [0, 1], {"protocol": "inproc://", "memory_limit": 2 << 30})
    scheduler = {"cls": Scheduler, "options": {"protocol": "inproc://", "dashboard": False}}
    for _ in range(2):
        with SpecCluster(workers=specs, scheduler=scheduler) as cluster, Client(cluster) as c:
            names = _by_name(c)
            got = [c.submit(_current, workers=[names[f"{NAME}-{i}"]], pure=False).result(timeout=30) for i in (0, 1)]
            assert got == [0, 1]


def get_worker_backend():
    return backends.get_backend(NAME)


def test_a_plain_worker_and_a_thread_of_no_device_backend_change_nothing(device_backend):
    assert devices.worker_device(None) is None
    with devices.on_worker_device(None):
        assert _current() is None
    fn = lambda: 1  # noqa: E731
    assert devices.carried(numpy_backend, fn) is fn  # the NumPy backend has no devices


def test_an_executor_needs_a_backend_with_devices():
    with pytest.raises(ValueError, match="backend 'numpy' has no devices to give workers"):
        devices.DeviceThreadPoolExecutor("numpy", 0)


def test_a_fit_on_device_workers_gives_the_bits_of_ordinary_workers(device_backend):
    """Each worker's kernels ran on its own device only, and the centroids, labels and inertia
    are those of the same fit on in-process workers without devices."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((6000, 5)).astype(np.float32)
    init = X[:7].astype(np.float64)
    from localclient import local_client

    with local_client(2, processes=False) as c:
        ref = KMeans(7, init=init, max_iter=12, tol=0, client=c).fit(X)
    with _device_client(2) as c:
        km = KMeans(7, init=init, max_iter=12, tol=0, client=c, backend=NAME).fit(X)
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(np.asarray(km.labels_), np.asarray(ref.labels_))
    assert km.inertia_ == ref.inertia_
    seen = set(device_backend.seen)
    assert seen == {(f"{NAME}-0", 0), (f"{NAME}-1", 1)}


def test_nccl_is_refused_for_workers_of_one_process_or_one_gpu():
    assert collective.nccl_refusal([("h", "0000:01", 10), ("h", "0000:02", 11)]) is None
    assert collective.nccl_refusal([("h", "0000:01", 10), ("g", "0000:01", 11)]) is None
    assert collective.nccl_refusal([("h", "0000:01", 10), ("h", "0000:01", 11)]) == (
        "NCCL needs a GPU of its own per worker, and workers share a GPU")
    assert collective.nccl_refusal([("h", "0000:01", 10), ("h", "0000:02", 10)]) == (
        "NCCL needs a process of its own per worker, and workers share a process")


def test_the_reading_pipeline_copies_on_the_device_of_the_task(device_backend):
    """``read_blocks``' threads (placement of a file's rows) run their copies under the device
    of the task that placed them."""
    seen = []
    be = backends.get_backend(NAME)

    class Source:
        rows, align = 64, 1

        def read_into(self, start, stop, out):
            seen.append(_current())
            out[...] = 1.0

    with _scope(1):
        blocks = reading.read_blocks(be, False, [Source(), Source()], 3, np.float32, 2)
    assert [b.shape for b in blocks] == [(64, 3), (64, 3)]
    assert seen and set(seen) == {1}


def _nbytes(a):
    return int(a.nbytes)


def test_device_workers_leave_memory_to_the_plan(device_backend):
    """A device worker's memory limit is its host budget's base (``memory_share``), but Dask is
    given none, however the cluster was made: no spill buffer (placed shards would be written
    to disk through the serializer), no pause on the whole process's memory, and no task
    refused by the scheduler because its inputs (on a device) outsize the host's share."""
    import dask

    from daskmeans.engine.plan import _budget_on_worker

    settings = {"distributed.worker.memory.spill": 0.7, "distributed.worker.memory.pause": 0.8,
                "distributed.worker.memory.terminate": 0.95}
    with dask.config.set(settings), _device_client(2, memory_limit="1MiB") as client:
        def memory(dask_worker):
            mm = dask_worker.memory_manager
            return (dask_worker.memory_share, mm.memory_limit, type(mm.data).__name__,
                    "memory_monitor" in dask_worker.periodic_callbacks)

        assert set(client.run(memory).values()) == {(1 << 20, None, "dict", False)}
        assert {w["memory_limit"] for w in client.scheduler_info()["workers"].values()} == {0}
        budgets = client.run(lambda dask_worker: _budget_on_worker(None, None, NAME, dask_worker)["host"])
        assert set(budgets.values()) == {1 << 19}  # half the share
        big = client.submit(np.ones, 1 << 19, pure=False)  # 4 MiB, over the 1 MiB share
        assert client.submit(_nbytes, big).result() == 4 << 20
