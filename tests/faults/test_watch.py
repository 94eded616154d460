"""How the client waits on a fit's tasks (``watch.watch``, ``watch.wait_on_cluster``),
with a stand-in client: a task cancelled because its worker went is a lost worker, a lost
scheduler ends the wait at once, naming it, a result whose worker goes before it is fetched
is a lost worker, and a cluster left without workers is an error, never a wait forever. A
worker silent (no heartbeat) for the collective's timeout, or for half of it once a peer gave
up waiting, is hung: named while the wait lasts, then retired and lost. The wait keeps no
futures alive after it returns. BLAS's cap applies inside workers' tasks only."""

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

import daskmeans.liveness as liveness
import daskmeans.engine.task as task
import daskmeans.engine.watch as watch
from daskmeans.dask_cluster import SchedulerLost
from daskmeans.engine.mailbox import PeerTimeout
from daskmeans.events import watching
from daskmeans.progress import Steps
from daskmeans.engine.watch import WorkerLost

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

    def sync(self, fn, *args, callback_timeout=None, **kwargs):
        return fn(*args, **kwargs)

    @contextlib.contextmanager
    def as_current(self):
        yield

    def cancel(self, futs):
        self.cancelled += list(futs)


@pytest.fixture
def waits(monkeypatch):
    """``watch.wait`` replaced: each call runs the next of the given actions."""
    actions = []

    def wait(futs, timeout=None):
        action = actions.pop(0) if actions else None  # None: nothing happens
        if action is not None:
            action(futs)
        raise TimeoutError

    monkeypatch.setattr(watch, "wait", wait)
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
        watch.watch(client, futs, [A, B, C])
    assert e.value.args[0] == [B] and client.cancelled == futs


def test_a_lost_scheduler_ends_the_wait_at_once_naming_it(waits):
    client = Client([A, B], status="connecting")
    client.scheduler.ncores = None  # never asked: it would wait for Dask's connect timeout
    t0 = time.monotonic()
    with pytest.raises(SchedulerLost, match=r"scheduler tcp://10\.0\.0\.9:8786"):
        watch.watch(client, [Fut("cancelled"), Fut("cancelled")], [A, B])
    assert time.monotonic() - t0 < 2


def test_a_scheduler_lost_during_the_look_is_a_lost_scheduler(waits):
    client = Client([A, B])

    def sync(fn, callback_timeout=None):
        assert callback_timeout is not None and callback_timeout <= 10  # never Dask's 30 s
        client.status = "connecting"
        raise TimeoutError

    client.sync = sync
    with pytest.raises(SchedulerLost):
        watch.watch(client, [Fut()], [A, B])


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
        watch.watch(client, [Fut()], [A, B])
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
            watch.watch(client, futs, [A, B])
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
                watch.wait_a_little(client, futs, 0.05)
                return weakref.ref(futs[0])

            assert wait_once()() is None
    finally:
        gc.enable()


def test_placing_on_a_cluster_left_without_workers_ends(waits):
    """``wait_on_cluster`` (what place() should wait on its persisted chunks with) gives up
    once no worker has been seen for the given time: Dask would keep the tasks forever."""
    client = Client([])
    t0 = time.monotonic()
    with pytest.raises(watch.DaskmeansError, match="every worker left the cluster"):
        watch.wait_on_cluster(client, [Fut("pending")], no_worker_seconds=0.3)
    assert time.monotonic() - t0 < 5


def test_placing_waits_for_a_worker_that_comes_back(waits):
    client = Client([])
    futs = [Fut("pending")]

    def back(fs):
        client.workers[A] = 1

    def done(fs):
        futs[0].status = "finished"

    waits += [None, back, done]
    watch.wait_on_cluster(client, futs, no_worker_seconds=30)


def test_a_lost_scheduler_ends_the_placement_wait(waits):
    client = Client([A], status="connecting")
    with pytest.raises(SchedulerLost):
        watch.wait_on_cluster(client, [Fut("cancelled")])


def test_blas_is_capped_only_inside_a_workers_task():
    """Outside a Dask worker, ``worker_blas_threads`` changes nothing; ``blas_capped`` keeps
    its function's name (``map_blocks`` names its tasks after it), tokenizes and pickles."""
    import pickle

    from dask.base import tokenize

    from faultkit import blas_threads

    before = blas_threads()
    with task.worker_blas_threads():
        assert blas_threads() == before
    f = task.blas_capped(len)
    assert f.__name__ == "len" and f([1, 2]) == 2
    assert tokenize(f) == tokenize(task.blas_capped(len)) != tokenize(task.blas_capped(sum))
    assert pickle.loads(pickle.dumps(f))([1]) == 1


# ---------------------------------------------------------------- hung workers


class Heartbeats(Client):
    """A stand-in client whose scheduler reports heartbeats: every worker's ``last_seen`` is
    now, but for ``silent`` (worker: seconds since its last heartbeat); ``run_on_scheduler``
    removes the worker it is given (what :func:`daskmeans.liveness.retire` runs)."""

    def __init__(self, workers, silent):
        super().__init__(workers)
        self.silent, self.removed, self.stopped = dict(silent), [], []
        self.scheduler.identity = self._identity
        self.t0 = time.time()

    def _identity(self, n_workers=-1):
        now = time.time()
        return {"workers": {w: {"last_seen": self.t0 - self.silent[w] if w in self.silent else now}
                            for w in self.workers}}

    def run_on_scheduler(self, fn, address, stimulus_id):
        self.removed.append(address)
        del self.workers[address]


class Failed(Fut):
    """A task that ended in ``error``."""

    def __init__(self, error):
        super().__init__("error")
        self.error = error

    def exception(self):
        return self.error

    def result(self, timeout=None):
        raise self.error


@pytest.fixture
def quick_looks(monkeypatch):
    """Heartbeats looked at from the first round of the wait, Dask's interval 10 ms."""
    monkeypatch.setattr(liveness, "LOOK_AFTER", 0.0)
    monkeypatch.setattr(liveness, "FIRST_LOOK", 0.0)
    monkeypatch.setattr(liveness, "_heartbeat_interval", lambda n: 0.01)


def _noted(run) -> str:
    import io

    out = io.StringIO()
    with watching(Steps(quiet=False, stream=out, live=False)):
        run()
    return out.getvalue()


def test_a_worker_silent_for_the_timeout_is_retired_and_lost(waits, quick_looks):
    """B sends no heartbeat for longer than the collective's timeout while its task waits:
    the scheduler is told to remove it, the others are stopped, the wait is a WorkerLost."""
    client = Heartbeats([A, B, C], {B: 40})
    futs = [Fut("finished"), Fut("pending"), Fut("pending")]
    stopped = []
    with pytest.raises(WorkerLost) as e:
        watch.watch(client, futs, [A, B, C], stop=stopped.append, hung_after=30)
    assert e.value.args[0] == [B] and client.removed == [B] and stopped == [[A, C]] and client.cancelled == futs


def test_the_wait_names_the_silent_worker_then_gives_it_up(waits, quick_looks):
    """B was last heard from 12 s ago: named at once (a note of the command's progress; -q
    shows none), given up on half a second later, at the timeout of 12.5 s."""
    import re

    client = Heartbeats([A, B, C], {B: 12})
    futs = [Fut("pending")] * 3

    def run():
        with pytest.raises(WorkerLost):
            watch.watch(client, futs, [A, B, C], hung_after=12.5)

    t0 = time.monotonic()
    out = _noted(run)
    assert time.monotonic() - t0 < 5
    assert out.startswith(f"daskmeans: waiting for worker {B} (rank 1), no reply for 12 s\n"), out
    assert re.search(rf"daskmeans: worker {B} \(rank 1\) gave no reply for 1[23] s: taken for lost", out), out
    assert out.count("waiting for worker") == 1 and client.removed == [B]


def test_after_a_peer_timeout_the_silent_worker_is_lost_not_the_one_named(waits, quick_looks):
    """Rank 2 (C) waited for rank 0 (A), which itself waits for the stopped B: B, silent for
    more than half the timeout, is retired; A, named but heard from, is not."""
    client = Heartbeats([A, B, C], {B: 160})
    error = PeerTimeout("no message from rank 0", 0, A, 300.0)
    futs = [Fut("pending"), Fut("pending"), Failed(error)]
    with pytest.raises(WorkerLost) as e:
        watch.watch(client, futs, [A, B, C], stop=lambda r: None, peer_loss=(PeerTimeout,), hung_after=300)
    assert e.value.args[0] == [B] and client.removed == [B]


def test_a_peer_timeout_with_every_worker_heard_from_is_the_error(waits, quick_looks):
    client = Heartbeats([A, B, C], {})
    error = PeerTimeout("no message from rank 0", 0, A, 300.0)
    stopped = []
    with pytest.raises(PeerTimeout, match="no message from rank 0"):
        watch.watch(client, [Fut("pending"), Failed(error), Fut("pending")], [A, B, C], stop=stopped.append,
                        peer_loss=(PeerTimeout,), hung_after=300)
    assert client.removed == [] and stopped == [[A, B, C]]


def test_placing_retires_a_silent_worker_and_waits_on(waits, quick_looks):
    """wait_on_cluster's tasks may run anywhere: a silent worker is removed (the scheduler
    runs its tasks on the others) and the wait goes on."""
    client = Heartbeats([A, B], {B: 40})
    futs = [Fut("pending")]
    waits += [None, lambda fs: setattr(futs[0], "status", "finished")]
    watch.wait_on_cluster(client, futs, hung_after=30)
    assert client.removed == [B]
