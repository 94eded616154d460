"""Collectives: the registry (names, the choice for a placement, the protocol every kind
satisfies, the client's abort interrupting an open collective), and the Dask collective
(engine.dask_collective) on real worker processes: exact sums for any length and piece size
(slices of unequal length, empty ones, several pieces), through the comms and through shared
memory, calls that never mix, and waits that end when the client aborts the fit."""

from __future__ import annotations

import glob
import time

import numpy as np
import pytest

from daskmeans.engine import collective as coll
from daskmeans.engine import shm
from daskmeans.engine.dask_collective import _close_segments
from daskmeans.engine.mailbox import Collective
from daskmeans.errors import DaskmeansError
from daskmeans.engine.placement import Placement


def _buffers(rank: int, n: int, calls: int) -> list[np.ndarray]:
    rng = np.random.default_rng([rank, n])
    return [rng.integers(-(2**60), 2**60, n, dtype=np.int64) for _ in range(calls)]


def _is_open(fit_id, dask_worker):
    """On a worker: whether a collective of ``fit_id`` is open there."""
    from daskmeans.engine.mailbox import OPEN

    return any(k[0] == dask_worker.address and k[1] == fit_id for k in OPEN)


def _has_message(fit_id, dask_worker):
    """On a worker: whether its mailbox holds a message of ``fit_id`` not yet taken."""
    return any(tag[0] == fit_id for tag in coll.mailbox(dask_worker).messages)


def _until(condition, seconds=60):
    """Wait for ``condition()`` to hold, polling; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not so after {seconds} s"
        time.sleep(0.02)


# Far beyond the tests' deadlines: a wait that ends did so by the client's abort.
NEVER = 3600


def _allreduce_task(rank, spec, n, calls, piece_bytes, shared=None):
    """``calls`` all-reduces of this rank's buffers; with ``shared``, also whether the
    collective went through shared memory."""
    from distributed import get_worker

    c = coll.open_collective(spec, rank, get_worker())
    if piece_bytes is not None:
        c.piece_bytes = piece_bytes  # this collective only (released at the test's end)
    outs = [c.allreduce(buf) for buf in _buffers(rank, n, calls)]
    return outs if shared is None else (outs, bool(c._shm))


@pytest.mark.parametrize(
    "n, piece_bytes, shared_memory",
    [
        (2, None, True),  # shorter than the rank count: one piece, rank 0 sums it
        (2, 8, True),  # one element a piece: rank 0's slice is empty
        (7, 16, True),  # slices of 2, 2 and 3 elements, in pieces of 2
        (1000, 8 * 50, True),  # slices of 333, 333 and 334 elements, in pieces of 50
        (3 * 2**18 + 1, None, False),  # 6 MB through the comms, this host's default pieces
        (3 * 2**18 + 1, 2 << 20, False),  # 6 MB: slices of several 2 MB pieces, sent from the sender thread
        (3 * 2**18 + 1, None, True),  # 6 MB through shared memory (the workers share this host)
    ],
)
def test_dask_collective_sums_exactly_over_three_workers(client3, n, piece_bytes, shared_memory):
    client3.run(coll.install_mailbox)
    ws = sorted(client3.nthreads())
    assert len(ws) == 3
    fit_id = f"t-exact-{n}-{piece_bytes}-{shared_memory}"
    spec = coll.CollectiveSpec(fit_id, 0, tuple(ws), "dask", timeout=60, shared_memory=shared_memory)
    calls = 3  # consecutive calls of one collective: their messages never mix
    futs = [client3.submit(_allreduce_task, r, spec, n, calls, piece_bytes, True, workers=[w], pure=False)
            for r, w in enumerate(ws)]
    results = client3.gather(futs)
    # Shared memory for large buffers where it is on (and /dev/shm has room), never for small ones.
    want_shared = shared_memory and 8 * n >= coll.DaskCollective.shm_min_bytes and shm.room_for(2 * 8 * n)
    assert [shared for _, shared in results] == [want_shared] * 3
    assert glob.glob(f"/dev/shm/daskmeans-{fit_id}-*") == []  # unlinked once mapped
    client3.run(coll.release, fit_id)
    expected = [sum(parts) for parts in zip(*(_buffers(r, n, calls) for r in range(3)))]
    for rank_outs, _ in results:
        for got, want in zip(rank_outs, expected):
            assert got.dtype == np.int64 and got.shape == (n,)
            assert np.array_equal(got, want)


@pytest.mark.parametrize(
    "ranks, n, piece_bytes",
    [
        # Rank 1 of 2 waits for rank 0, which never runs.
        ("live", 3, None),
        # Rank 0 is an address nobody listens on: rank 1's sends to it keep trying to connect
        # while rank 1 waits for rank 0's part of its slice.
        ("dead", 2**18, 2**16),
    ],
)
def test_dask_collective_wait_ends_on_abort(client3, ranks, n, piece_bytes):
    client3.run(coll.install_mailbox)
    ws = sorted(client3.nthreads())
    fit_id = f"t-abort-{ranks}"
    peers = tuple(ws[:2]) if ranks == "live" else ("tcp://127.0.0.1:9", ws[1])
    spec = coll.CollectiveSpec(fit_id, 0, peers, "dask", timeout=NEVER)
    fut = client3.submit(_allreduce_task, 1, spec, n, 1, piece_bytes, workers=[ws[1]], pure=False)
    if ranks == "live":  # rank 1 has sent rank 0 its part: it waits for rank 0's
        _until(lambda: client3.run(_has_message, fit_id, workers=[ws[0]])[ws[0]])
    else:
        _until(lambda: client3.run(_is_open, fit_id, workers=[ws[1]])[ws[1]])
    assert not fut.done()
    client3.run(coll.abort, fit_id)  # the client's abort ends the wait
    with pytest.raises(coll.CollectiveAborted, match=rf"fit {fit_id} \(placement 0\) aborted by the client"):
        fut.result(timeout=60)
    client3.run(coll.release, fit_id)
    assert glob.glob(f"/dev/shm/daskmeans-{fit_id}-*") == []  # the large buffer's segments are gone too


def _second_call_never_comes(rank, spec, n):
    """Rank 0 makes one call (the segments are set up in it) and returns; rank 1 makes two."""
    return _allreduce_task(rank, spec, n, 2 if rank else 1, None, True)


def test_dask_collective_shared_memory_wait_ends_on_abort(client3):
    client3.run(coll.install_mailbox)
    ws = sorted(client3.nthreads())
    spec = coll.CollectiveSpec("t-abort-shm", 0, tuple(ws[:2]), "dask", timeout=NEVER)
    n = 2**18
    first = client3.submit(_second_call_never_comes, 0, spec, n, workers=[ws[0]], pure=False)
    second = client3.submit(_second_call_never_comes, 1, spec, n, workers=[ws[1]], pure=False)
    outs, shared = first.result(timeout=30)
    assert shared == shm.room_for(2 * 8 * n)
    # Rank 1 has told rank 0 of its second buffer: it waits for rank 0's part of that call.
    _until(lambda: client3.run(_has_message, "t-abort-shm", workers=[ws[0]])[ws[0]])
    assert not second.done()
    client3.run(coll.abort, "t-abort-shm")
    with pytest.raises(coll.CollectiveAborted, match=r"fit t-abort-shm \(placement 0\) aborted by the client"):
        second.result(timeout=60)
    client3.run(coll.release, "t-abort-shm")
    np.testing.assert_array_equal(outs[0], _buffers(0, n, 1)[0] + _buffers(1, n, 1)[0])


def test_dask_collective_wait_ends_on_timeout(client3):
    client3.run(coll.install_mailbox)
    ws = sorted(client3.nthreads())
    spec = coll.CollectiveSpec("t-timeout", 0, tuple(ws[:2]), "dask", timeout=1.0)
    fut = client3.submit(_allreduce_task, 1, spec, 3, 1, None, workers=[ws[1]], pure=False)
    with pytest.raises(coll.CollectiveAborted, match=r"no message from rank 0 of fit t-timeout in 1 s") as e:
        fut.result(timeout=30)
    # Typed, naming the peer waited for (the client looks whether that worker went silent).
    assert isinstance(e.value, coll.PeerTimeout) and (e.value.peer, e.value.address) == (0, ws[0])
    assert e.value.seconds == 1.0 and f"(worker {ws[0]})" in str(e.value)
    client3.run(coll.release, "t-timeout")


def test_messages_of_an_aborted_or_released_fit_are_dropped():
    """A peer that resumes after the client gave up on it (a stopped worker continued) sends
    messages of a placement aborted, or of a fit released: none is kept."""
    import asyncio

    from daskmeans.engine.mailbox import Mailbox

    box = Mailbox()
    box.abort("f", 0)
    asyncio.run(box.deliver(("f", 0, 0, 0, 0, 1), np.zeros(1)))
    asyncio.run(box.deliver(("f", 1, 0, 0, 0, 1), np.zeros(1)))  # the next placement's: kept
    assert list(box.messages) == [("f", 1, 0, 0, 0, 1)]
    box.forget("f")
    asyncio.run(box.deliver(("f", 1, 1, 0, 0, 1), np.zeros(1)))
    assert box.messages == {} and box.is_aborted("f", 2)


def test_closing_segments_unmaps_all_of_them_when_an_unlock_fails(tmp_path):
    """Every segment is unlocked and unmapped, the first unlock's failure raised after."""
    import uuid

    if not shm.room_for(1 << 20):
        pytest.skip("needs /dev/shm with room")
    segs = [shm.Segment(f"{shm.SHM_DIR}/daskmeans-test-{uuid.uuid4().hex}", 10, create=True) for _ in range(3)]
    called = []

    def unlock(i, fail):
        def f():
            called.append(i)
            if fail:
                raise RuntimeError(f"unlock {i} failed")
        return f

    with pytest.raises(RuntimeError, match="unlock 0 failed"):
        _close_segments((10, segs[:1], {1: segs[1:]}, [unlock(0, True), unlock(1, True), unlock(2, False)]))
    assert called == [0, 1, 2]
    assert all(seg.array is None for seg in segs)


# ---------------------------------------------------------------- the registry


def _placement(n_workers: int, backend: str = "numpy") -> Placement:
    return Placement([None] * n_workers, [f"tcp://w{i}" for i in range(n_workers)],
                     [(i,) for i in range(n_workers)], (10,) * n_workers, 2, np.dtype(np.float64), backend)


def test_the_choices_are_the_registry_names_after_auto():
    assert coll.COLLECTIVES == ("auto", *coll.REGISTRY) == ("auto", "nccl", "process", "dask")


@pytest.mark.parametrize("cls", [coll.SingleRank, coll.DaskCollective, coll.NcclCollective, coll.ProcessCollective])
def test_every_collective_has_the_protocol_members(cls):
    for member in ("allreduce", "wait", "interrupt", "close"):
        assert callable(getattr(cls, member)), member
    assert {"allreduce", "wait", "interrupt", "close"} <= {n for n in vars(Collective) if not n.startswith("_")}


def test_choice_for_cpu_workers(client):
    # No worker is asked anything for NCCL: host backends never take it.
    assert coll.choose_collective(None, _placement(1), "nccl") == "single"
    assert coll.choose_collective(None, _placement(2), "dask") == "dask"
    with pytest.raises(DaskmeansError, match=r"^collective='nccl' cannot combine this fit's sums: NCCL needs GPU "
                                             r"workers; backend is numpy$"):
        coll.choose_collective(None, _placement(2), "nccl")
    with pytest.raises(DaskmeansError, match=r"^collective='mpi' should be one of 'auto', 'nccl', 'process', 'dask'$"):
        coll.choose_collective(None, _placement(2), "mpi")
    # Worker processes (the session's cluster): each in a process of its own.
    processes = Placement([None] * 2, sorted(client.nthreads()), [(0,), (1,)], (10, 10), 2, np.dtype(np.float64),
                          "numpy")
    assert coll.choose_collective(client, processes, "auto") == "dask"
    with pytest.raises(DaskmeansError, match=r"^collective='process' cannot combine this fit's sums: the in-process "
                                             r"collective needs every worker in one process$"):
        coll.choose_collective(client, processes, "process")


def test_a_spec_of_an_unknown_kind_is_refused_on_the_worker(client):
    spec = coll.CollectiveSpec("t-unknown", 0, ("a",), "mpi")
    w = sorted(client.nthreads())[0]
    with pytest.raises(ValueError, match=r"^collective kind='mpi' should be one of 'single', 'nccl', 'process', "
                                         r"'dask'$"):
        client.submit(_open_on_worker, spec, workers=[w], pure=False).result()


def _open_on_worker(spec):
    from distributed import get_worker

    return coll.open_collective(spec, 0, get_worker())


class _Recorder:
    """A collective that records which of its protocol's calls it received."""

    rank, size = 0, 1

    def __init__(self, spec, rank, worker):
        self.calls = []

    def allreduce(self, buf, wait=True):
        self.calls.append("allreduce")
        return buf

    def wait(self):
        self.calls.append("wait")

    def interrupt(self):
        self.calls.append("interrupt")

    def close(self):
        self.calls.append("close")


def _register_recorder(dask_worker):
    coll.REGISTRY["recorder"] = coll.Kind(_Recorder)


def _unregister_recorder(dask_worker):
    coll.REGISTRY.pop("recorder", None)


def _calls(spec, dask_worker):
    c = coll.OPEN.get((dask_worker.address, spec.fit_id, spec.epoch))
    return None if c is None else list(c.calls)


def test_a_registered_kind_is_opened_interrupted_by_abort_and_closed_by_release(client):
    """One registry entry is all a new collective needs; the client's abort reaches its
    interrupt() (through the protocol), the end of the fit its close()."""
    w = sorted(client.nthreads())[0]
    client.run(coll.install_mailbox, workers=[w])
    client.run(_register_recorder, workers=[w])
    try:
        spec = coll.CollectiveSpec("t-recorder", 0, (w,), "recorder")
        client.submit(_open_on_worker, spec, workers=[w], pure=False).result()
        assert client.run(_calls, spec, workers=[w])[w] == []
        client.run(coll.abort, "t-recorder", epoch=1, workers=[w])  # another placement: not this one
        assert client.run(_calls, spec, workers=[w])[w] == []
        client.run(coll.abort, "t-recorder", workers=[w])
        assert client.run(_calls, spec, workers=[w])[w] == ["interrupt"]
        client.run(coll.release, "t-recorder", workers=[w])
        assert client.run(_calls, spec, workers=[w])[w] is None  # closed and forgotten
    finally:
        client.run(_unregister_recorder, workers=[w])
