"""The in-process collective (``engine/process_collective.py``) on workers of this process:
exact sums for any length (slices of unequal length, empty ones) over consecutive calls, a
rank that never comes named after the timeout, the client's abort ending the wait, the choice
``auto`` makes for in-process workers, and a fit through it giving the bits of the Dask
collective."""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest
from localclient import local_client

from daskmeans import KMeans
from daskmeans.engine import collective as coll
from daskmeans.engine import process_collective
from daskmeans.engine.placement import Placement

NEVER = 3600  # far beyond the tests' deadlines: a wait that ends did so by the client's abort


@pytest.fixture(scope="module")
def inproc():
    """Three single-threaded workers in this process."""
    with local_client(3, processes=False) as c:
        c.run(coll.install_mailbox)
        yield c


def _buffers(rank: int, n: int, calls: int) -> list[np.ndarray]:
    rng = np.random.default_rng([rank, n, 7])
    return [rng.integers(-(2**60), 2**60, n, dtype=np.int64) for _ in range(calls)]


def _allreduce_task(rank, spec, n, calls):
    from distributed import get_worker

    c = coll.open_collective(spec, rank, get_worker())
    assert isinstance(c, coll.ProcessCollective)
    outs = []
    for buf in _buffers(rank, n, calls):
        before = buf.copy()
        outs.append(c.allreduce(buf))
        assert np.array_equal(buf, before)  # the caller's buffer is left as it was
    return outs


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000, 3 * 2**18 + 1])
def test_sums_exactly_over_three_workers_of_one_process(inproc, n):
    ws = sorted(inproc.nthreads())
    fit_id = f"t-process-{n}"
    spec = coll.CollectiveSpec(fit_id, 0, tuple(ws), "process", timeout=60)
    calls = 4  # consecutive calls: their posts never mix
    futs = [inproc.submit(_allreduce_task, r, spec, n, calls, workers=[w], pure=False) for r, w in enumerate(ws)]
    results = inproc.gather(futs)
    inproc.run(coll.release, fit_id)
    expected = [sum(parts) for parts in zip(*(_buffers(r, n, calls) for r in range(3)))]
    for outs in results:
        for got, want in zip(outs, expected):
            assert got.dtype == np.int64 and got.shape == (n,)
            assert np.array_equal(got, want)
    assert (fit_id, 0) not in process_collective._MEETINGS  # the last rank's close dropped it


def test_sums_by_hand():
    """Two ranks as two threads: [1, 2, 3] + [10, 20, 30], slices of 1 and 2 elements."""
    import threading

    from daskmeans.engine.mailbox import _MAILBOXES, Mailbox

    class Worker:
        def __init__(self, address):
            self.address = address

    spec = coll.CollectiveSpec("t-hand", 0, ("w0", "w1"), "process", timeout=30)
    outs = {}
    for w in ("w0", "w1"):
        _MAILBOXES[w] = Mailbox()
    try:
        ranks = [coll.ProcessCollective(spec, r, Worker(f"w{r}")) for r in range(2)]
        bufs = [np.array([1, 2, 3], np.int64), np.array([10, 20, 30], np.int64)]
        threads = [threading.Thread(target=lambda r=r: outs.__setitem__(r, ranks[r].allreduce(bufs[r])))
                   for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [outs[r].tolist() for r in range(2)] == [[11, 22, 33], [11, 22, 33]]
        for c in ranks:
            c.close()
        assert ("t-hand", 0) not in process_collective._MEETINGS
    finally:
        for w in ("w0", "w1"):
            del _MAILBOXES[w]


def test_a_rank_that_never_comes_is_named_after_the_timeout(inproc):
    ws = sorted(inproc.nthreads())
    spec = coll.CollectiveSpec("t-process-timeout", 0, tuple(ws), "process", timeout=1.0)
    futs = [inproc.submit(_allreduce_task, r, spec, 5, 1, workers=[ws[r]], pure=False) for r in (0, 1)]
    for fut in futs:
        with pytest.raises(coll.PeerTimeout, match=rf"rank 2 \(worker {ws[2]}\) of this process did not reach the "
                                                   r"in-process collective in 1 s") as e:
            fut.result(timeout=30)
        assert (e.value.peer, e.value.address, e.value.seconds) == (2, ws[2], 1.0)
    inproc.run(coll.release, "t-process-timeout")


def test_the_clients_abort_ends_the_wait(inproc):
    ws = sorted(inproc.nthreads())
    fit_id = "t-process-abort"
    spec = coll.CollectiveSpec(fit_id, 0, tuple(ws), "process", timeout=NEVER)
    fut = inproc.submit(_allreduce_task, 0, spec, 5, 1, workers=[ws[0]], pure=False)
    deadline = time.monotonic() + 30
    while (fit_id, 0) not in process_collective._MEETINGS:  # rank 0 waits at the meeting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not fut.done()
    inproc.run(coll.abort, fit_id)
    with pytest.raises(coll.CollectiveAborted, match=rf"fit {fit_id} \(placement 0\) aborted by the client"):
        fut.result(timeout=30)
    inproc.run(coll.release, fit_id)


def test_auto_chooses_it_for_workers_of_one_process(inproc):
    ws = sorted(inproc.nthreads())
    p = Placement([None] * 3, ws, [(0,), (1,), (2,)], (10,) * 3, 2, np.dtype(np.float64), "numpy")
    assert coll.choose_collective(inproc, p, "auto") == "process"
    assert coll.choose_collective(inproc, p, "dask") == "dask"


def test_a_fit_through_it_gives_the_bits_of_the_dask_collective(inproc):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((9000, 6)).astype(np.float32)
    init = X[:9].astype(np.float64)
    fits = {}
    for kind in ("process", "dask"):
        with dask.config.set({"daskmeans.collective": kind}):
            fits[kind] = KMeans(9, init=init, max_iter=15, tol=0, client=inproc).fit(X)
    a, b = fits["process"], fits["dask"]
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    assert (a.inertia_, a.n_iter_) == (b.inertia_, b.n_iter_)
