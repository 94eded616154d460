"""What every collective shares on a worker: the mailbox its messages arrive in, the client's
abort, and the ``Collective`` protocol with its spec.

The client installs a :class:`Mailbox` on every worker of a fit (:func:`install_mailbox`);
peers deliver tagged messages into it through a worker RPC handler, and a rank's waits take
them from it. :func:`abort` marks a fit (or one placement of it) aborted there and interrupts
its open collectives, so that no wait outlives a lost peer or an interrupted fit;
:func:`release` closes them at the end of a fit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..errors import DaskmeansError

class CollectiveAborted(DaskmeansError):
    """A collective could not complete: a peer is gone or the client aborted the fit."""


class PeerTimeout(CollectiveAborted):
    """A rank waited the collective's whole timeout for one peer (``peer``: its rank;
    ``address``: its worker, where known; ``seconds``: the wait): the peer is lost without the
    scheduler noticing, or hung (a stopped process keeps its connections open). The client
    then looks which worker has gone silent and takes it for lost
    (:mod:`daskmeans.liveness`): the peer named here may itself be waiting for another."""

    def __init__(self, message: str, peer: int | None = None, address: str | None = None, seconds: float = 0.0):
        super().__init__(message)
        self.peer, self.address, self.seconds = peer, address, float(seconds)

    def __reduce__(self):  # the task's error travels to the client pickled, with its fields
        return (type(self), (self.args[0], self.peer, self.address, self.seconds))


class Collective(Protocol):
    """One rank's end of a collective (:mod:`.collective` makes them by kind)."""

    rank: int
    size: int

    def allreduce(self, buf: Any, wait: bool = True) -> Any:
        """Element-wise sum over ranks of a 1-D int64 buffer (NumPy or CuPy). With
        ``wait=False`` a collective that runs on the device (NCCL) only queues it on the current
        stream, so that later work queues behind it; :meth:`wait` then blocks until it is done."""

    def wait(self) -> None:
        """Block until the last all-reduce queued with ``wait=False`` is done."""

    def interrupt(self) -> None:
        """Make a wait in progress (on another thread) look at the fit's abort flag now:
        called by :func:`abort`, from the worker's event loop."""

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
    kind : str
        The collective's name in :data:`daskmeans.engine.collective.REGISTRY`.
    token : object or None
        What every rank needs to connect, made once on the client by the kind's ``token``
        hook (NCCL's unique id).
    timeout : float
        Seconds a rank waits for its peers before giving up.
    shared_memory : bool
        The Dask collective may exchange large buffers through ``/dev/shm`` between ranks of
        one host (:mod:`.shm`; used only where every rank can map every other's segments).
    """

    fit_id: str
    epoch: int
    ranks: tuple[str, ...]
    kind: str
    token: Any = None
    timeout: float = 300.0
    shared_memory: bool = True


# ---------------------------------------------------------------- the worker-side mailbox


class Mailbox:
    """Messages received by one worker, by tag; the fits the client aborted."""

    def __init__(self) -> None:
        self.messages: dict[tuple, Any] = {}
        self.aborted: set[tuple] = set()  # (fit_id, epoch), epoch None: every epoch
        self.cond = threading.Condition()

    async def deliver(self, tag: tuple = (), payload: Any = None) -> None:
        """The worker's RPC handler (runs in the worker's event loop). A message of a fit (or
        placement) aborted or released is dropped: a peer that resumes after the client gave
        up on it (a stopped worker continued) would otherwise leave its messages here."""
        tag = tuple(tag)
        with self.cond:
            if len(tag) >= 2 and self.is_aborted(tag[0], tag[1]):
                return
            self.messages[tag] = payload
            self.cond.notify_all()

    def abort(self, fit_id: str, epoch: int | None = None) -> None:
        with self.cond:
            self.aborted.add((fit_id, epoch))
            self.cond.notify_all()

    def wake(self) -> None:
        """Make waiting ranks look again at their abort flags and checks."""
        with self.cond:
            self.cond.notify_all()

    def is_aborted(self, fit_id: str, epoch: int) -> bool:
        return (fit_id, None) in self.aborted or (fit_id, epoch) in self.aborted

    def check(self, fit_id: str, epoch: int) -> None:
        if self.is_aborted(fit_id, epoch):
            raise CollectiveAborted(f"fit {fit_id} (placement {epoch}) aborted by the client")

    def take(self, tag: tuple, fit_id: str, timeout: float, check: Callable[[], None] | None = None,
             ranks: tuple[str, ...] = ()) -> Any:
        """The message ``tag`` (whose last field is the sending rank, an address in ``ranks``),
        waiting at most ``timeout`` seconds (``check`` may raise to give up): else
        :class:`PeerTimeout` naming the sender."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while tag not in self.messages:
                self.check(fit_id, tag[1])
                if check is not None:
                    check()
                left = deadline - time.monotonic()
                if left <= 0:
                    src = tag[-1]
                    address = ranks[src] if isinstance(src, int) and 0 <= src < len(ranks) else None
                    raise PeerTimeout(
                        f"no message from rank {src} of fit {fit_id} in {timeout:.0f} s"
                        + (f" (worker {address})" if address else "") + ": a worker may be lost or hung",
                        src if isinstance(src, int) else None, address, timeout,
                    )
                self.cond.wait(min(left, 1.0))
            return self.messages.pop(tag)

    def forget(self, fit_id: str) -> None:
        """Drop the fit's messages; the fit counts as aborted from now on (an aborted fit stays
        aborted): a straggling task stops, and its messages, and those of a peer resumed
        later, are dropped on arrival."""
        with self.cond:
            self.aborted.add((fit_id, None))
            for tag in [t for t in self.messages if t[0] == fit_id]:
                del self.messages[tag]


HANDLER = "daskmeans_collective"  # the workers' RPC handler that fills their mailbox
_MAILBOXES: dict[str, Mailbox] = {}  # by worker address (several workers may share a process)
OPEN: dict[tuple, Collective] = {}  # (worker address, fit_id, epoch) -> open collective


def install_mailbox(dask_worker: Any) -> None:
    """Give ``dask_worker`` a mailbox and the RPC handler that fills it (idempotent).

    Run on every worker with ``client.run(install_mailbox)`` before a fit's first segment.
    """
    box = _MAILBOXES.get(dask_worker.address)
    if box is None or dask_worker.handlers.get(HANDLER) is None:
        box = _MAILBOXES.setdefault(dask_worker.address, Mailbox())
        dask_worker.handlers[HANDLER] = box.deliver


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
    for key in [k for k in OPEN if k[0] == dask_worker.address and k[1] == fit_id and epoch in (None, k[2])]:
        OPEN[key].interrupt()


def release(fit_id: str, dask_worker: Any) -> None:
    """Close the fit's collectives on this worker and drop its messages (end of a fit)."""
    for key in [k for k in OPEN if k[0] == dask_worker.address and k[1] == fit_id]:
        OPEN.pop(key).close()
    box = _MAILBOXES.get(dask_worker.address)
    if box is not None:
        box.forget(fit_id)
