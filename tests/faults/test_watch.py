"""How the client waits on a fit's tasks (``placement.watch``, ``placement.wait_on_cluster``),
with a stand-in client: a task cancelled because its worker went is a lost worker, a lost
scheduler ends the wait at once, naming it, a result whose worker goes before it is fetched
is a lost worker, and a cluster left without workers is an error, never a wait forever. The
wait keeps no futures alive after it returns. BLAS's cap applies inside workers' tasks only."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import weakref
from types import SimpleNamespace

import pytest
from distributed.client import CancelledFuturesGroup, FutureCancelledError, FuturesCancelledError

import daskmeans.placement as placement
from daskmeans.dask_cluster import SchedulerLost
from daskmeans.placement import WorkerLost

A, B, C = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1", "tcp://10.0.0.3:1"


class Fut:
    def __init__(self, status: str = "pending", key: str = "daskmeans-segment-x"):
        self.status, self.key = status, key

    def exception(self):
        return None

    def result(self, timeout=None):
        raise cancelled([self.key], "already forgotten")


def cancelled(keys: list, reason: str) -> FuturesCancelledError:
    """What distributed's ``wait`` raises for cancelled futures."""
    return FuturesCancelledError([CancelledFuturesGroup([FutureCancelledError(k, reason) for k in keys], reason)])


class Client:
    """What watch() uses of a distributed.Client."""

    def __init__(self, workers, status="running"):
        self.workers, self.status = dict.fromkeys(workers, 1), status
        self.cancelled = []
        self.looks = 0
        self.scheduler = SimpleNamespace(address="tcp://10.0.0.9:8786", ncores=self._ncores)
        self.loop = None

    def _ncores(self):
        self.looks += 1
        return dict(self.workers)

    def sync(self, fn, callback_timeout=None):
        return fn()

    @contextlib.contextmanager
    def as_current(self):
        yield

    def cancel(self, futs):
        self.cancelled += list(futs)


@pytest.fixture
def waits(monkeypatch):
    """``placement.wait`` replaced: each call runs the next of the given actions."""
    actions = []

    def wait(futs, timeout=None):
        action = actions.pop(0) if actions else None  # None: nothing happens
        if action is not None:
            action(futs)
        raise TimeoutError

    monkeypatch.setattr(placement, "wait", wait)
    return actions


def test_a_task_cancelled_with_its_lost_worker_is_a_lost_worker(waits):
    """Dask forgets a task whose pinned input went with its worker, and ``wait`` raises
    FuturesCancelledError ('already forgotten'): the fit places its data again."""
    client = Client([A, C])  # B is gone
    futs = [Fut("finished"), Fut("cancelled"), Fut("pending")]

    def forgotten(fs):
        raise cancelled([fs[1].key], "already forgotten")

    waits.append(forgotten)
    with pytest.raises(WorkerLost) as e:
        placement.watch(client, futs, [A, B, C])
    assert e.value.args[0] == [B] and client.cancelled == futs


def test_a_lost_scheduler_ends_the_wait_at_once_naming_it(waits):
    client = Client([A, B], status="connecting")
    client.scheduler.ncores = None  # never asked: it would wait for Dask's connect timeout
    t0 = time.monotonic()
    with pytest.raises(SchedulerLost, match=r"scheduler tcp://10\.0\.0\.9:8786"):
        placement.watch(client, [Fut("cancelled"), Fut("cancelled")], [A, B])
    assert time.monotonic() - t0 < 2


def test_a_scheduler_lost_during_the_look_is_a_lost_scheduler(waits):
    client = Client([A, B])

    def sync(fn, callback_timeout=None):
        assert callback_timeout is not None and callback_timeout <= 10  # never Dask's 30 s
        client.status = "connecting"
        raise TimeoutError

    client.sync = sync
    with pytest.raises(SchedulerLost):
        placement.watch(client, [Fut()], [A, B])


def test_a_busy_scheduler_is_asked_again(waits):
    client = Client([A, B])
    calls = []

    def sync(fn, callback_timeout=None):
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError  # no answer in time, but the client is still connected
        return {A: 1}

    client.sync = sync
    with pytest.raises(WorkerLost):
        placement.watch(client, [Fut()], [A, B])
    assert len(calls) == 2


def test_a_result_lost_before_it_is_fetched_is_a_lost_worker(waits):
    """Every task finished, then a worker went before its result came: the gather would wait
    for the pinned task to run again on a worker that is gone."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        client = Client([A])  # B went after its task finished
        client.loop = SimpleNamespace(asyncio_loop=loop)
        client.gather = lambda futs, asynchronous: asyncio.sleep(3600)  # never comes
        futs = [Fut("finished"), Fut("finished")]
        t0 = time.monotonic()
        with pytest.raises(WorkerLost) as e:
            placement.watch(client, futs, [A, B])
        assert e.value.args[0] == [B] and client.cancelled == futs and time.monotonic() - t0 < 5
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_the_wait_keeps_no_futures_alive():
    """Distributed's ``sync`` keeps the exception it raises in a frame of its own traceback:
    a timed-out wait held its futures (a placement's shards and their data on the workers)
    until a garbage collection."""
    from distributed import Client as DaskClient, LocalCluster

    gc.disable()
    try:
        with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, \
                DaskClient(cluster, set_as_default=False) as client:
            def wait_once():
                futs = [client.submit(time.sleep, 2, pure=False)]
                placement.wait_a_little(client, futs, 0.05)
                return weakref.ref(futs[0])

            assert wait_once()() is None
    finally:
        gc.enable()


def test_placing_on_a_cluster_left_without_workers_ends(waits):
    """``wait_on_cluster`` (what place() should wait on its persisted chunks with) gives up
    once no worker has been seen for the given time: Dask would keep the tasks forever."""
    client = Client([])
    t0 = time.monotonic()
    with pytest.raises(placement.DaskmeansError, match="every worker left the cluster"):
        placement.wait_on_cluster(client, [Fut("pending")], no_worker_seconds=0.3)
    assert time.monotonic() - t0 < 5


def test_placing_waits_for_a_worker_that_comes_back(waits):
    client = Client([])
    futs = [Fut("pending")]

    def back(fs):
        client.workers[A] = 1

    def done(fs):
        futs[0].status = "finished"

    waits += [None, back, done]
    placement.wait_on_cluster(client, futs, no_worker_seconds=30)


def test_a_lost_scheduler_ends_the_placement_wait(waits):
    client = Client([A], status="connecting")
    with pytest.raises(SchedulerLost):
        placement.wait_on_cluster(client, [Fut("cancelled")])


def test_blas_is_capped_only_inside_a_workers_task():
    """Outside a Dask worker, ``worker_blas_threads`` changes nothing; ``blas_capped`` keeps
    its function's name (``map_blocks`` names its tasks after it), tokenizes and pickles."""
    import pickle

    from dask.base import tokenize

    from faultkit import blas_threads

    before = blas_threads()
    with placement.worker_blas_threads():
        assert blas_threads() == before
    f = placement.blas_capped(len)
    assert f.__name__ == "len" and f([1, 2]) == 2
    assert tokenize(f) == tokenize(placement.blas_capped(len)) != tokenize(placement.blas_capped(sum))
    assert pickle.loads(pickle.dumps(f))([1]) == 1
