"""A worker's reading pipeline: the chunks of a file-backed shard read by several threads
straight into the memory they are kept or staged in (:mod:`daskmeans.io.fill`), with the
buffers the fit's backend supplies.

- :func:`read_blocks` (placement of a resident tier): every chunk read into the blocks a shard
  keeps. Where they are kept in host memory (the host tier; the device tier of a host backend)
  the pieces land in them directly (page-locked on a GPU worker: no second copy into
  page-locked memory); where they are kept on a device, each thread reads into a staging
  buffer of its own, page-locked in place after its first piece, whose copy to the device
  (``Backend.copy_in``) overlaps the thread's next read and the other threads' reads.
- :func:`stream_chunks` (a pass of the storage tier): the chunks in order, each read into one
  of ``ahead + 1`` host buffers kept for the shard's passes, ``ahead`` chunks read meanwhile by
  the threads, each checked against its pin by the thread that completes it.

The I/O layer knows nothing of devices (it reads rows into a caller's array); the kernels
nothing of files (they receive blocks).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .. import config
from ..io import fill
from ..io.ranges import cores
from .devices import carried


def read_threads(setting: Any, peers: int) -> int:
    """The threads of one worker's reading pipeline: ``setting`` (``daskmeans.read-threads``)
    where it is a count, else (``"auto"``) this process's cores shared among the ``peers``
    workers of its host, at least one."""
    if setting is None or str(setting).strip().lower() == "auto":
        return max(1, cores() // max(1, int(peers)))
    n = int(setting)
    if n < 1:
        raise ValueError(f"daskmeans.read-threads={setting!r} should be 'auto' or a count of threads of at least 1")
    return n


def host_peers(workers: Sequence[str]) -> dict[str, int]:
    """For each worker address, the workers of ``workers`` on its host (itself included)."""
    from distributed.comm import get_address_host

    hosts = {w: get_address_host(w) for w in workers}
    count = Counter(hosts.values())
    return {w: count[h] for w, h in hosts.items()}


def threads_setting() -> Any:
    """``daskmeans.read-threads`` as the client sets it (checked here, used on the workers)."""
    setting = config.get("read-threads")
    read_threads(setting, 1)  # a bad value fails on the client, in one line
    return setting


def _pieces(sources: Sequence[Any], d: int, dtype: np.dtype) -> list[list[fill.Piece]]:
    row_bytes = int(d) * np.dtype(dtype).itemsize
    return [fill.pieces(j, s, row_bytes) for j, s in enumerate(sources)]


def read_blocks(be: Any, on_host: bool, sources: Sequence[Any], d: int, dtype: Any, threads: int) -> list:
    """Every chunk of ``sources`` (:class:`daskmeans.io.fill.ChunkSource`) read into a block a
    shard keeps, shape (rows_j, d) of ``dtype``.

    Parameters
    ----------
    be : backend module
        The fit's backend: it locks the host blocks and the staging buffers in place
        (``page_lock``: on a GPU) and copies the staging buffers to its device
        (``copy_in``).
    on_host : bool
        The blocks are kept in host memory (page-locked in place once filled: :func:`locked`),
        else as ``be``'s device arrays.
    threads : int
        Reads at once.

    Returns
    -------
    list of arrays (rows_j, d)
        Host arrays where ``on_host``, else the backend's; every copy done.
    """
    dtype = np.dtype(dtype)
    chunks = _pieces(sources, d, dtype)
    n = len(sources)
    if on_host:
        # Ordinary memory, filled by the threads, then page-locked in place (``be.page_lock``)
        # for as long as each block lives: allocating page-locked memory runs at a fraction
        # of the decode's rate in the driver, locking memory already written at several times
        # it (docs/performance.md, "placement of a file, the storage tier's passes").
        blocks: list = [None] * n
        locks = [threading.Lock() for _ in range(n)]

        def block(j: int) -> np.ndarray:
            with locks[j]:  # made by the first thread that reads into it
                if blocks[j] is None:
                    blocks[j] = np.empty((int(sources[j].rows), int(d)), dtype)
                return blocks[j]

        # Each block is locked by the thread that filled its last piece, while the others
        # still read: the locks overlap the reads instead of following them.
        fill.fill(chunks, lambda p: sources[p.chunk].read_into(p.start, p.stop, block(p.chunk)[p.start:p.stop]),
                  threads, finished=carried(be, lambda j: locked(be, block(j))))
        return [b if b is not None else np.empty((0, int(d)), dtype) for b in blocks]

    blocks = [be.xp.empty((int(s.rows), int(d)), dtype) for s in sources]
    piece_rows = max([p.stop - p.start for ps in chunks for p in ps] or [0])
    local = threading.local()
    staging: list[list] = []
    lock = threading.Lock()

    def read(p: fill.Piece) -> None:
        st = getattr(local, "staging", None)
        if st is None:  # this thread's buffer, the mark of its last copy, and its unlock
            st = local.staging = [np.empty((piece_rows, int(d)), dtype), None, None]
            with lock:
                staging.append(st)
        buf, last, unlock = st
        if last is not None:
            be.wait(last)  # its previous copy has left the buffer
        view = buf[: p.stop - p.start]
        sources[p.chunk].read_into(p.start, p.stop, view)
        if unlock is None:
            # Ordinary memory locked in place once its first piece is written, as the host
            # tier's blocks are: page-locked memory allocated for every thread's buffer ran at
            # the driver's allocation rate, a fraction of the reads', and the same for any
            # number of GPUs (docs/performance.md, "placement of a file, the storage tier's
            # passes").
            st[2] = be.page_lock(buf)
        st[1] = be.copy_in(blocks[p.chunk][p.start:p.stop], view)

    try:
        fill.fill(chunks, carried(be, read), threads)
    finally:
        for _, last, _ in staging:  # no copy still reads a buffer about to be unlocked and freed
            if last is not None:
                be.wait(last)
        for _, _, unlock in staging:
            if unlock is not None:
                unlock()
    return blocks


def locked(be: Any, a: np.ndarray) -> np.ndarray:
    """``a`` page-locked in place by the backend (a no-op on the host's) until it is freed:
    the unlock runs when the array goes (``weakref.finalize``), never while a view of it
    lives. Returns ``a``."""
    if a.nbytes:
        # Not at the interpreter's exit: the process's memory goes with it, and the device
        # may be gone before the finalizers run.
        weakref.finalize(a, be.page_lock(a)).atexit = False
    return a


def stream_chunks(be: Any, sources: Sequence[Any], d: int, dtype: Any, threads: int, ahead: int,
                  check: Callable[[int, np.ndarray], None], ring: list) -> Iterator[np.ndarray]:
    """The chunks of ``sources`` in order, each a host array (rows_j, d) valid until the next
    is asked for, read by ``threads`` threads up to ``ahead`` chunks ahead of the caller.

    ``check(j, block)`` runs on each chunk as it is complete, in the thread that completed it
    (its pin). ``ring`` holds the ``ahead + 1`` host buffers, made on the first pass and kept by
    the caller for the next, each as ``[buffer, locked]``: ordinary memory, page-locked in place
    (``be.page_lock``: on a GPU worker) once its first chunk is read into it, by the caller's
    thread before the chunk is handed over, and unlocked when the buffer is freed.
    """
    dtype = np.dtype(dtype)
    slots = max(0, int(ahead)) + 1
    most = max([int(s.rows) for s in sources] or [0])
    if len(ring) != slots or any(b.shape[0] < most or b.dtype != dtype for b, _ in ring):
        # Page-locked allocations of the ring (``ahead + 1`` chunks of up to a GPU's chunk
        # size, per worker) ran at the driver's allocation rate in the first pass, a fraction
        # of the reads'; locking memory the reads have written runs at many times it
        # (docs/performance.md, "placement of a file, the storage tier's passes").
        ring[:] = [[np.empty((most, int(d)), dtype), False] for _ in range(slots)]
    views: dict[int, np.ndarray] = {}

    def start(j: int) -> None:  # chunk j goes into the buffer chunk j - slots held
        views[j] = ring[j % slots][0][: int(sources[j].rows)]

    def read(p: fill.Piece) -> None:
        sources[p.chunk].read_into(p.start, p.stop, views[p.chunk][p.start:p.stop])

    for j in fill.ordered(_pieces(sources, d, dtype), read, threads, slots - 1,
                          finished=lambda j: check(j, views[j]), start=start):
        slot = ring[j % slots]
        if not slot[1]:  # under the caller's device, as its copies are
            locked(be, slot[0])
            slot[1] = True
        yield views.pop(j)
