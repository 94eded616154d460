"""The NCCL collective: NCCL's int64 all-reduce between GPU workers, one rank per GPU.

The unique id every rank connects with is made once by a worker (:func:`nccl_unique_id`: the
client may have no CuPy) and travels in the spec; small messages of the fit still use Dask.
"""

from __future__ import annotations

import time
from typing import Any

from .mailbox import CollectiveAborted, CollectiveSpec, mailbox


def nccl_unique_id() -> tuple:
    """A new NCCL unique id (run on a GPU worker: the client may have no CuPy)."""
    from cupy.cuda import nccl

    return nccl.get_unique_id()


def nccl_available() -> bool:
    """Whether this worker's CuPy has NCCL."""
    try:
        from cupy.cuda import nccl

        return bool(nccl.available)
    except Exception:  # no CuPy or no NCCL build: the Dask collective is used
        return False


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
        self._pending: Any = None  # the event after the last queued all-reduce, until waited for
        # Collective across ranks: every rank's first segment calls this at about the same time.
        self.comm = nccl.NcclCommunicator(self.size, spec.token, rank)

    def allreduce(self, buf: Any, wait: bool = True) -> Any:
        import cupy

        nccl = self._nccl
        out = cupy.empty_like(buf)
        stream = cupy.cuda.get_current_stream()
        self.comm.allReduce(buf.data.ptr, out.data.ptr, buf.size, nccl.NCCL_INT64, nccl.NCCL_SUM, stream.ptr)
        self._pending = stream.record()
        if wait:
            self.wait()
        return out

    def wait(self) -> None:
        done, self._pending = self._pending, None
        if done is None:
            return
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

    def interrupt(self) -> None:
        self._interrupted = True

    def close(self) -> None:
        if not self._interrupted:
            self.comm.destroy()


def gpu_device(dask_worker: Any = None) -> tuple:
    """This worker's GPU and process: its host, PCI bus id (the same for workers sharing a GPU)
    and process id (the same for workers of one process, :mod:`.devices`)."""
    import cupy

    from .devices import on_worker_device
    from .process_collective import where

    host, pid = where()
    with on_worker_device(dask_worker):
        return host, cupy.cuda.Device().pci_bus_id, pid
