"""Collectives between the workers of one fit: one sum of equal-sized int64 buffers.

The loop needs a single operation, ``allreduce(buf)``: every rank contributes a 1-D int64
buffer of the same length and gets the element-wise sum. Integer sums are exact in any order,
so every implementation gives the same bits. Floats ride along in two ways: as integers on a
fixed-point grid (:mod:`daskmeans.backends.grid`), or as the bit pattern of a float64 in a slot
that only one rank fills
(the others leave 0, and ``x + 0`` is ``x``), which makes the same call an all-gather.

Implementations:

- :class:`SingleRank`: one worker, nothing to combine;
- :class:`DaskCollective`: through Dask's own comms (TCP/TLS/UCX, whatever the cluster uses),
  worker to worker: every rank sends its buffer to rank 0, which adds them and sends the sum
  back. Works on any cluster, CPU or GPU;
- :class:`NcclCollective`: NCCL's all-reduce between GPU workers (one rank per GPU), the
  unique id handed out through Dask; small messages still use Dask's comms.

A rank that waits too long, or whose fit the client aborted (a worker was lost), raises
:class:`CollectiveAborted`: no collective ever waits forever.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import DaskmeansError

COLLECTIVES = ("auto", "nccl", "dask")


class CollectiveAborted(DaskmeansError):
    """A collective could not complete: a peer is gone or the client aborted the fit."""


class Collective(Protocol):
    rank: int
    size: int

    def allreduce(self, buf: Any) -> Any:
        """Element-wise sum over ranks of a 1-D int64 buffer (NumPy or CuPy)."""

    def close(self) -> None:
        """Release the communicator."""


@dataclass(frozen=True)
class CollectiveSpec:
    """How the ranks of one placement talk: identical on every rank (built by the client).

    Attributes
    ----------
    fit_id : str
        Unique per fit; with ``epoch``, tags every message.
    epoch : int
        Placement generation: a new one after a lost worker (old messages are never mixed in).
    ranks : tuple of str
        Worker addresses, in rank order.
    kind : "single", "dask" or "nccl"
    nccl_id : tuple or None
        NCCL unique id (``cupy.cuda.nccl.get_unique_id()``) for ``kind="nccl"``.
    timeout : float
        Seconds a rank waits for its peers before giving up.
    """

    fit_id: str
    epoch: int
    ranks: tuple[str, ...]
    kind: str
    nccl_id: tuple | None = None
    timeout: float = 300.0


# ---------------------------------------------------------------- the worker-side mailbox


class Mailbox:
    """Messages received by one worker, by tag; the fits the client aborted."""

    def __init__(self) -> None:
        self.messages: dict[tuple, Any] = {}
        self.aborted: set[tuple] = set()  # (fit_id, epoch), epoch None: every epoch
        self.cond = threading.Condition()

    async def deliver(self, tag: tuple = (), payload: Any = None) -> None:
        """The worker's RPC handler (runs in the worker's event loop)."""
        with self.cond:
            self.messages[tuple(tag)] = payload
            self.cond.notify_all()

    def abort(self, fit_id: str, epoch: int | None = None) -> None:
        with self.cond:
            self.aborted.add((fit_id, epoch))
            self.cond.notify_all()

    def is_aborted(self, fit_id: str, epoch: int) -> bool:
        return (fit_id, None) in self.aborted or (fit_id, epoch) in self.aborted

    def check(self, fit_id: str, epoch: int) -> None:
        if self.is_aborted(fit_id, epoch):
            raise CollectiveAborted(f"fit {fit_id} (placement {epoch}) aborted by the client")

    def take(self, tag: tuple, fit_id: str, timeout: float) -> Any:
        """The message ``tag``, waiting at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while tag not in self.messages:
                self.check(fit_id, tag[1])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveAborted(
                        f"no message from rank {tag[-1]} of fit {fit_id} in {timeout:.0f} s: a worker may be lost"
                    )
                self.cond.wait(min(left, 1.0))
            return self.messages.pop(tag)

    def forget(self, fit_id: str) -> None:
        """Drop the fit's messages (an aborted fit stays aborted: a straggling task stops)."""
        with self.cond:
            for tag in [t for t in self.messages if t[0] == fit_id]:
                del self.messages[tag]


_HANDLER = "daskmeans_collective"
_MAILBOXES: dict[str, Mailbox] = {}  # by worker address (several workers may share a process)
_OPEN: dict[tuple, Any] = {}  # (worker address, fit_id, epoch) -> open collective


def install_mailbox(dask_worker: Any) -> None:
    """Give ``dask_worker`` a mailbox and the RPC handler that fills it (idempotent).

    Run on every worker with ``client.run(install_mailbox)`` before a fit's first segment.
    """
    box = _MAILBOXES.get(dask_worker.address)
    if box is None or dask_worker.handlers.get(_HANDLER) is None:
        box = _MAILBOXES.setdefault(dask_worker.address, Mailbox())
        dask_worker.handlers[_HANDLER] = box.deliver


def mailbox(worker: Any) -> Mailbox:
    """This worker's mailbox (installed by :func:`install_mailbox`)."""
    try:
        return _MAILBOXES[worker.address]
    except KeyError:
        raise CollectiveAborted(f"worker {worker.address} has no daskmeans mailbox: it joined after the fit began") from None


def abort(fit_id: str, dask_worker: Any, epoch: int | None = None) -> None:
    """Make every wait of ``fit_id`` (of its placement ``epoch``; None: of every placement) on
    this worker raise (``client.run(abort, fit_id, epoch)``)."""
    box = _MAILBOXES.get(dask_worker.address)
    if box is not None:
        box.abort(fit_id, epoch)
    for key in [k for k in _OPEN if k[0] == dask_worker.address and k[1] == fit_id and epoch in (None, k[2])]:
        _OPEN[key].interrupt()


def release(fit_id: str, dask_worker: Any) -> None:
    """Close the fit's collectives on this worker and drop its messages (end of a fit)."""
    for key in [k for k in _OPEN if k[0] == dask_worker.address and k[1] == fit_id]:
        _OPEN.pop(key).close()
    box = _MAILBOXES.get(dask_worker.address)
    if box is not None:
        box.forget(fit_id)


def nccl_unique_id() -> tuple:
    """A new NCCL unique id (run on a GPU worker: the client may have no CuPy)."""
    from cupy.cuda import nccl

    return nccl.get_unique_id()


def nccl_available() -> bool:
    try:
        from cupy.cuda import nccl

        return bool(nccl.available)
    except Exception:  # no CuPy or no NCCL build: the Dask collective is used
        return False


def open_collective(spec: CollectiveSpec, rank: int, worker: Any) -> "Collective":
    """The rank's collective for ``spec``, opened once per (fit, epoch) and kept on the worker."""
    key = (worker.address, spec.fit_id, spec.epoch)
    coll = _OPEN.get(key)
    if coll is None:
        if spec.kind == "single":
            coll = SingleRank()
        elif spec.kind == "dask":
            coll = DaskCollective(spec, rank, worker)
        elif spec.kind == "nccl":
            coll = NcclCollective(spec, rank, worker)
        else:
            raise ValueError(f"collective kind={spec.kind!r} should be one of 'single', 'dask', 'nccl'")
        _OPEN[key] = coll
    return coll


# ---------------------------------------------------------------- implementations


class SingleRank:
    """One worker: the sum is the buffer itself."""

    rank, size = 0, 1

    def allreduce(self, buf: Any) -> Any:
        return buf

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


class DaskCollective:
    """Reduce to rank 0 and broadcast, over the worker's Dask comms (``worker.rpc``)."""

    def __init__(self, spec: CollectiveSpec, rank: int, worker: Any):
        self.spec, self.rank, self.size, self.worker = spec, rank, len(spec.ranks), worker
        self.box = mailbox(worker)
        self.seq = 0

    def _send(self, dests: list[int], tag: tuple, payload: Any) -> None:
        from distributed.protocol import to_serialize
        from distributed.utils import sync

        fit_id, epoch, timeout = self.spec.fit_id, self.spec.epoch, self.spec.timeout

        async def send_all() -> None:
            sends = [
                asyncio.ensure_future(
                    self.worker.rpc(self.spec.ranks[d]).daskmeans_collective(tag=tag, payload=to_serialize(payload))
                )
                for d in dests
            ]
            deadline = time.monotonic() + timeout
            while True:
                done, pending = await asyncio.wait(sends, timeout=0.2)
                for t in done:
                    t.result()  # a peer's error (its address is gone: a killed worker) ends the send
                if not pending:
                    return
                # Connecting to a dead peer can take Dask's whole connect timeout: give up as
                # soon as the client aborts the fit (it watches the workers) or time is out.
                if self.box.is_aborted(fit_id, epoch) or time.monotonic() > deadline:
                    for t in pending:
                        t.cancel()
                    raise CollectiveAborted(f"rank {self.rank} of fit {fit_id}: send aborted (a peer may be lost)")

        try:
            sync(self.worker.loop, send_all)
        except CollectiveAborted:
            raise
        except Exception as e:  # the peer's address is gone (killed worker) or unreachable
            raise CollectiveAborted(f"rank {self.rank} could not reach its peers: {type(e).__name__}: {e}") from None

    def _take(self, seq: int, src: int) -> np.ndarray:
        return self.box.take((self.spec.fit_id, self.spec.epoch, seq, src), self.spec.fit_id, self.spec.timeout)

    def allreduce(self, buf: Any) -> Any:
        from ..backends import get_backend

        be = get_backend(buf)
        host = be.to_numpy(buf)
        seq, self.seq = self.seq, self.seq + 1
        fid, ep = self.spec.fit_id, self.spec.epoch
        if self.rank == 0:
            total = host.copy()
            for src in range(1, self.size):  # integer sums: the arrival order does not matter
                total += self._take(seq, src)
            self._send(list(range(1, self.size)), (fid, ep, seq, 0), total)
        else:
            self._send([0], (fid, ep, seq, self.rank), host)
            total = self._take(seq, 0)
        return be.asarray(total) if be.name != "numpy" else total

    def interrupt(self) -> None:
        pass  # waits poll the mailbox's abort flag

    def close(self) -> None:
        pass


class NcclCollective:
    """NCCL all-reduce (int64 sum) between GPU workers, on the current CuPy stream.

    The host waits by polling an event rather than blocking in a synchronisation, so that a
    lost peer or an abort from the client ends the wait (``ncclCommAbort``) instead of
    hanging the worker.
    """

    def __init__(self, spec: CollectiveSpec, rank: int, worker: Any):
        from cupy.cuda import nccl

        self.spec, self.rank, self.size = spec, rank, len(spec.ranks)
        self.box = mailbox(worker)
        self._nccl = nccl
        self._interrupted = False
        # Collective across ranks: every rank's first segment calls this at about the same time.
        self.comm = nccl.NcclCommunicator(self.size, spec.nccl_id, rank)

    def allreduce(self, buf: Any) -> Any:
        import cupy

        nccl = self._nccl
        out = cupy.empty_like(buf)
        stream = cupy.cuda.get_current_stream()
        self.comm.allReduce(buf.data.ptr, out.data.ptr, buf.size, nccl.NCCL_INT64, nccl.NCCL_SUM, stream.ptr)
        done = stream.record()
        deadline = time.monotonic() + self.spec.timeout
        spins = 0
        while not done.done:
            spins += 1
            if spins > 1000:  # after ~the first millisecond, poll gently
                time.sleep(1e-4)
            if self._interrupted or self.box.is_aborted(self.spec.fit_id, self.spec.epoch) or time.monotonic() > deadline:
                self.comm.abort()
                self._interrupted = True
                self.box.check(self.spec.fit_id, self.spec.epoch)
                raise CollectiveAborted(f"NCCL all-reduce of fit {self.spec.fit_id} did not complete: a peer may be lost")
        return out

    def interrupt(self) -> None:
        self._interrupted = True

    def close(self) -> None:
        if not self._interrupted:
            self.comm.destroy()
