"""The in-process collective: the sum of equal-sized int64 buffers between ranks that are
workers of one process (a local cluster's in-process workers: CPU threads, or one worker per
GPU, :mod:`.devices`).

Such ranks can read each other's buffers where they are. Each rank posts its buffer, by
reference, at a meeting the fit's ranks in this process share; once all have, rank ``r`` adds
slice ``r`` of every rank's buffer, in rank order, on its own device (a slice on another GPU
is copied GPU to GPU by the backend's ``asarray``), and posts that sum; once all have, each
rank gathers the summed slices into its result. Nothing goes through the host, the comms or a
serializer, and no message crosses the event loop the workers share. Integer sums: the bits of
every other collective.

A rank waits for the others at most the spec's timeout (:class:`~.mailbox.PeerTimeout` naming
the first rank that did not come), and gives up as soon as the client aborts the fit
(:class:`~.mailbox.CollectiveAborted`, through the worker's mailbox and :meth:`interrupt`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from ..backends import get_backend
from .mailbox import CollectiveSpec, PeerTimeout, mailbox

# The meetings of the open in-process collectives, by (fit_id, epoch): the ranks of one
# placement in this process meet at the same one.
_MEETINGS: dict[tuple[str, int], "_Meeting"] = {}
_MEETINGS_LOCK = threading.Lock()


def where(dask_worker: Any = None) -> tuple[str, int]:
    """``(host name, process id)`` of the worker this runs on (``client.run(where)``): ranks
    that all answer the same can sum through :class:`ProcessCollective`."""
    return socket.gethostname(), os.getpid()


def process_refusal(places: list[tuple[str, int]]) -> str | None:
    """Why ranks at ``places`` (each :func:`where`'s answer) cannot sum in-process, or None."""
    if len(set(places)) > 1:
        return "the in-process collective needs every worker in one process"
    return None


class _Meeting:
    """Where the ranks of one placement in this process post their buffers and sums: for each
    call (its sequence number) and stage, a slot per rank."""

    def __init__(self, size: int):
        self.size = size
        self.cond = threading.Condition()
        self.posts: dict[tuple[int, str], list] = {}
        self.taken: dict[tuple[int, str], int] = {}  # ranks that took a stage's posts
        self.opened = 0  # ranks that opened it and have not closed it

    def post(self, seq: int, stage: str, rank: int, value: Any) -> None:
        with self.cond:
            self.posts.setdefault((seq, stage), [None] * self.size)[rank] = value
            self.cond.notify_all()

    def gather(self, seq: int, stage: str, rank: int, give_up: Any, timeout: float, ranks: tuple[str, ...]) -> list:
        """Every rank's post of ``stage`` in call ``seq``, in rank order, once all are there.
        ``give_up()`` may raise (the fit aborted); past ``timeout`` seconds, PeerTimeout names
        the first rank missing (and its worker, of ``ranks``). The last rank to take a stage's
        posts drops them."""
        deadline = time.monotonic() + timeout
        key = (seq, stage)
        with self.cond:
            while True:
                slots = self.posts.setdefault(key, [None] * self.size)
                if all(s is not None for s in slots):
                    break
                give_up()
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = next(r for r, s in enumerate(slots) if s is None)
                    raise PeerTimeout(f"rank {rank}: rank {missing} (worker {ranks[missing]}) of this process did not "
                                      f"reach the in-process collective in {timeout:.0f} s: a worker may be hung",
                                      missing, ranks[missing], timeout)
                self.cond.wait(min(left, 1.0))
            self.taken[key] = self.taken.get(key, 0) + 1
            if self.taken[key] == self.size:  # every rank holds its references: the slots can go
                del self.posts[key], self.taken[key]
            return list(slots)

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()


class ProcessCollective:
    """One rank's end of the in-process collective (see the module's docstring).

    Parameters
    ----------
    spec : CollectiveSpec
        The placement's spec; its ranks are workers of this process.
    rank : int
    worker : distributed.Worker
        This rank's worker (its mailbox carries the client's abort).
    """

    def __init__(self, spec: CollectiveSpec, rank: int, worker: Any):
        self.spec, self.rank, self.size = spec, rank, len(spec.ranks)
        self.box = mailbox(worker)
        self.seq = 0
        key = (spec.fit_id, spec.epoch)
        with _MEETINGS_LOCK:
            self.meeting = _MEETINGS.setdefault(key, _Meeting(self.size))
            self.meeting.opened += 1
        self._key = key

    def _give_up(self) -> None:
        self.box.check(self.spec.fit_id, self.spec.epoch)

    def allreduce(self, buf: Any, wait: bool = True) -> Any:
        """The element-wise sum over ranks of ``buf`` (1-D int64, NumPy or the device's), as a
        new array of the same kind on this rank's device. Done on return (``wait`` is moot)."""
        be = get_backend(buf)
        xp = be.xp
        seq, self.seq = self.seq, self.seq + 1
        n = int(buf.shape[0])
        timeout = self.spec.timeout
        be.wait(be.mark())  # the buffer is complete before another rank's stream reads it
        self.meeting.post(seq, "buf", self.rank, buf)
        bufs = self.meeting.gather(seq, "buf", self.rank, self._give_up, timeout, self.spec.ranks)
        lo, hi = n * self.rank // self.size, n * (self.rank + 1) // self.size
        # Rank order; a slice on another device comes over to this one. The first add makes
        # the slice's sum (one pass, where zeros then adds took two).
        part = be.asarray(bufs[0][lo:hi]) + be.asarray(bufs[1][lo:hi])
        for b in bufs[2:]:
            part += be.asarray(b[lo:hi])
        be.wait(be.mark())  # the slice's sum is complete before the others copy it
        self.meeting.post(seq, "sum", self.rank, part)
        parts = self.meeting.gather(seq, "sum", self.rank, self._give_up, timeout, self.spec.ranks)
        out = xp.empty(n, xp.int64)
        for r, p in enumerate(parts):
            out[n * r // self.size:n * (r + 1) // self.size] = be.asarray(p)
        # The others' slices are copied before this rank returns: its caller may reuse them.
        be.wait(be.mark())
        return out

    def wait(self) -> None:
        pass

    def interrupt(self) -> None:
        """Wake this rank's waits so that they look at the fit's abort flag now."""
        self.meeting.wake()

    def close(self) -> None:
        with _MEETINGS_LOCK:
            self.meeting.opened -= 1
            if self.meeting.opened <= 0 and _MEETINGS.get(self._key) is self.meeting:
                del _MEETINGS[self._key]
