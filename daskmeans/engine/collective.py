"""Collectives between the workers of one fit, by name: one sum of equal-sized int64 buffers.

The loop needs a single operation, ``allreduce(buf)``: every rank contributes a 1-D int64
buffer of the same length and gets the element-wise sum. Integer sums are exact in any order,
so every collective gives the same bits. Floats ride along in two ways: as integers on a
fixed-point grid (:mod:`daskmeans.numerics.grid`), or as the bit pattern of a float64 in a
slot that only one rank fills (the others leave 0, and ``x + 0`` is ``x``), which makes the
same call an all-gather.

:data:`REGISTRY` maps a name to a :class:`Kind`: how a rank opens it, what it needs of the
placement, and what the client makes for it once (a token every rank connects with).
``auto`` takes the first kind, in the registry's order, that can serve the placement:

- ``nccl`` (:mod:`.nccl_collective`): NCCL's all-reduce between GPU workers, one per GPU, each
  in a process of its own;
- ``process`` (:mod:`.process_collective`): workers of one process (a local cluster's
  in-process workers) add each other's buffers where they are, for backends that say so;
- ``dask`` (:mod:`.dask_collective`): Dask's comms, or shared memory on one host; any workers.

One worker takes :class:`SingleRank`. Adding a collective is one module and one entry here;
the command's ``--collective`` choices are :data:`COLLECTIVES`. The mailbox, the client's
abort and the :class:`Collective` protocol every kind satisfies are in :mod:`.mailbox`: a rank
whose fit the client aborted raises :class:`CollectiveAborted`, one that waited the
collective's timeout for a peer :class:`PeerTimeout`, naming the peer where it knows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from distributed import Client

from ..backends import get_backend
from ..errors import DaskmeansError
from .placement import Placement
from .dask_collective import DaskCollective
from .mailbox import (  # re-exported: the engine's one door to collectives
    OPEN, Collective, CollectiveAborted, CollectiveSpec, PeerTimeout, abort, install_mailbox, mailbox, release,
)
from .nccl_collective import NcclCollective, gpu_device, nccl_available, nccl_unique_id
from .process_collective import ProcessCollective, process_refusal, where

__all__ = ["COLLECTIVES", "REGISTRY", "SINGLE", "Collective", "CollectiveAborted", "CollectiveSpec", "DaskCollective",
           "Kind", "NcclCollective", "PeerTimeout", "ProcessCollective", "SingleRank", "abort", "choose_collective",
           "install_mailbox", "mailbox", "make_spec", "nccl_refusal", "nccl_unique_id", "open_collective", "release"]


class SingleRank:
    """One worker: the sum is the buffer itself."""

    rank, size = 0, 1

    def allreduce(self, buf: Any, wait: bool = True) -> Any:
        return buf

    def wait(self) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Kind:
    """A collective the registry makes.

    Attributes
    ----------
    open : callable(spec, rank, worker) -> Collective
        Run on each rank's worker at the placement's first segment.
    unusable : callable(client, placement) -> str or None, optional
        On the client: why this kind cannot serve ``placement`` (None: it can).
    token : callable(client, placement) -> object, optional
        On the client, once per placement: what every rank needs to connect (in the spec).
    """

    open: Callable[[CollectiveSpec, int, Any], Collective]
    unusable: Callable[[Client, Placement], str | None] | None = None
    token: Callable[[Client, Placement], Any] | None = None


def _nccl_unusable(client: Client, placement: Placement) -> str | None:
    if "nccl" not in get_backend(placement.backend).collectives:  # the backend's buffers: not NCCL's
        return f"NCCL needs GPU workers; backend is {placement.backend}"
    workers = list(placement.workers)
    if not all(client.run(nccl_available, workers=workers).values()):
        return "NCCL needs GPU workers whose CuPy has NCCL (cupy.cuda.nccl.available)"
    return nccl_refusal(list(client.run(gpu_device, workers=workers).values()))


def nccl_refusal(devices: list[tuple]) -> str | None:
    """Why NCCL cannot sum the buffers of workers on ``devices`` (each ``(host, PCI bus id,
    process id)``, :func:`.nccl_collective.gpu_device`), or None."""
    if len({(host, bus) for host, bus, _ in devices}) < len(devices):
        # NCCL refuses two ranks on one GPU (invalid usage): they add through Dask's comms.
        return "NCCL needs a GPU of its own per worker, and workers share a GPU"
    if len({(host, pid) for host, _, pid in devices}) < len(devices):
        # CuPy's communicator init holds the interpreter lock while it waits for the other
        # ranks: two ranks of one process would wait for each other for ever.
        return "NCCL needs a process of its own per worker, and workers share a process"
    return None


def _process_unusable(client: Client, placement: Placement) -> str | None:
    if "process" not in get_backend(placement.backend).collectives:
        return f"backend {placement.backend} does not sum its buffers in-process"
    return process_refusal(list(client.run(where, workers=list(placement.workers)).values()))


def _nccl_token(client: Client, placement: Placement) -> Any:
    return client.submit(nccl_unique_id, workers=[placement.workers[0]], pure=False).result()


# In the order ``auto`` tries them.
REGISTRY: dict[str, Kind] = {
    "nccl": Kind(NcclCollective, _nccl_unusable, _nccl_token),
    "process": Kind(ProcessCollective, _process_unusable),
    "dask": Kind(DaskCollective),
}
SINGLE = "single"  # one worker: not a choice, what any choice becomes
COLLECTIVES = ("auto", *REGISTRY)  # the values of daskmeans.collective and --collective


def choose_collective(client: Client, placement: Placement, requested: str = "auto") -> str:
    """The collective's name for ``placement``: ``requested`` (one of :data:`COLLECTIVES`)
    where it can serve it, ``auto``'s first usable kind, or ``single`` for one worker.

    Raises
    ------
    DaskmeansError
        ``requested`` is unknown, or cannot serve the placement (naming why).
    """
    if requested not in COLLECTIVES:
        raise DaskmeansError(f"collective={requested!r} should be one of {', '.join(map(repr, COLLECTIVES))}")
    if len(placement.workers) == 1:
        return SINGLE
    for name in REGISTRY if requested == "auto" else [requested]:
        check = REGISTRY[name].unusable
        why = None if check is None else check(client, placement)
        if why is None:
            return name
        if requested != "auto":
            raise DaskmeansError(f"collective={requested!r} cannot combine this fit's sums: {why}")
    raise DaskmeansError("no collective can combine this fit's sums")  # the registry ends with one for any workers


def make_spec(client: Client, placement: Placement, fit_id: str, epoch: int, kind: str, timeout: float,
              shared_memory: bool) -> CollectiveSpec:
    """The spec every rank of ``placement`` opens ``kind`` with (its token made here, once)."""
    entry = REGISTRY.get(kind)
    token = entry.token(client, placement) if entry is not None and entry.token is not None else None
    return CollectiveSpec(fit_id, epoch, tuple(placement.workers), kind, token, float(timeout), bool(shared_memory))


def open_collective(spec: CollectiveSpec, rank: int, worker: Any) -> Collective:
    """The rank's collective for ``spec``, opened once per (fit, epoch) and kept on the worker."""
    key = (worker.address, spec.fit_id, spec.epoch)
    coll = OPEN.get(key)
    if coll is None:
        if spec.kind == SINGLE:
            coll = SingleRank()
        elif spec.kind in REGISTRY:
            coll = REGISTRY[spec.kind].open(spec, rank, worker)
        else:
            names = ", ".join(map(repr, (SINGLE, *REGISTRY)))
            raise ValueError(f"collective kind={spec.kind!r} should be one of {names}")
        OPEN[key] = coll
    return coll
