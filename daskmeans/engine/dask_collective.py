"""The Dask collective: the sum of equal-sized int64 buffers through Dask's own comms
(TCP/TLS/UCX, whatever the cluster uses), or through shared memory between ranks of one host.

Worker to worker, a reduce-scatter then an all-gather: each rank owns a contiguous slice of the
buffer, gets every other rank's part of it, adds them in rank order and sends the sum to all
the others. Slices travel in pieces (2 MB), so that the adds overlap the transfers, and from a
thread of their own, so that a rank sends while its worker's event loop receives; a GPU buffer
goes through page-locked host memory. A buffer of one piece (any buffer, on a host of fewer
than 4 cores) is summed by rank 0 alone and sent back: the fewest messages and threads (except
a large buffer between hosts, which always goes in slices).

Buffers of 1 MiB and more go through ``/dev/shm`` (:mod:`.shm`) where the ranks of one host
(the host part of their addresses) map each other's segments: each rank writes its buffer to
its own segment, tells the others, and sums every rank's segment in rank order (a GPU rank adds
the peers' page-locked segments on the device).

Ranks on several hosts, each with the same number ``L`` of ranks, sum a large buffer
hierarchically: within each host through shared memory (local rank ``j`` adds slice ``j`` of
every local segment), then between hosts a reduce-scatter and all-gather of that slice among
the ranks of index ``j`` (one per host), whose sum goes back into the segment for the host's
other ranks. Each rank sends ``2 (H - 1) / H`` of ``1 / L`` of the buffer over the network
(``H`` hosts): bandwidth-optimal, and ``L`` times less per host than a flat exchange. Other
layouts (hosts of unequal rank counts, no shared memory) take the comms, still as a
reduce-scatter and all-gather for large buffers. Integer sums: the same bits on every path,
and on any cluster, CPU or GPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from typing import Any

import numpy as np
from distributed.comm import get_address_host

from . import shm
from .mailbox import HANDLER, CollectiveAborted, CollectiveSpec, PeerTimeout, mailbox

_SEND_LOOP: list[asyncio.AbstractEventLoop] = []
_SEND_LOOP_LOCK = threading.Lock()
_SEND_POOLS: dict[str, Any] = {}  # by worker address: its connections from the sender loop


def _send_loop() -> asyncio.AbstractEventLoop:
    """The process's sender loop: an event loop on a thread of its own (started on first use).

    A worker's own event loop serves all of its sockets; the Dask collective sends its large
    buffers from this one instead, so that a rank sends and receives at the same time."""
    with _SEND_LOOP_LOCK:
        if not _SEND_LOOP:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="daskmeans-collective-send", daemon=True).start()
            _SEND_LOOP.append(loop)
        return _SEND_LOOP[0]


async def _send_pool(worker: Any) -> Any:
    """The worker's connection pool on the sender loop (run there)."""
    from distributed.core import ConnectionPool

    pool = _SEND_POOLS.get(worker.address)
    if pool is None:
        pool = _SEND_POOLS[worker.address] = ConnectionPool(connection_args=worker.connection_args)
        await pool.start()
    return pool


class DaskCollective:
    """Reduce-scatter then all-gather over Dask's comms, in pieces.

    Rank ``r`` owns the ``r``-th of ``size`` contiguous slices of the buffer. Every rank sends
    each slice to its owner; the owner adds the slices in rank order and sends the sum of its
    slice to every other rank. Slices travel in pieces of at most ``piece_bytes``: the owner
    adds a piece and passes it on while the next ones are on their way. To each peer, the
    pieces go back to back on one connection, the last one answered (which tells that all of
    them arrived). A buffer of several pieces is sent from the process's sender thread
    (:func:`_send_loop`), so that the worker's event loop, which receives, does not also have
    to send; the task's thread adds.
    """

    # Pieces pay off where a rank's three threads (event loop, sender, adds) have cores of
    # their own; on a host of fewer cores the whole buffer is one piece, reduced at rank 0.
    piece_bytes = 2 << 20 if (os.cpu_count() or 1) >= 4 else 1 << 40

    def __init__(self, spec: CollectiveSpec, rank: int, worker: Any):
        self.spec, self.rank, self.size, self.worker = spec, rank, len(spec.ranks), worker
        # The ranks by host (the host part of their addresses), hosts in order of their first
        # rank: the same on every rank.
        by_host: dict[str, list[int]] = {}
        for r, address in enumerate(spec.ranks):
            by_host.setdefault(get_address_host(address), []).append(r)
        self.hosts: list[list[int]] = list(by_host.values())
        self.local = next(h for h in self.hosts if rank in h)  # this rank's host, in rank order
        # Bytes this rank handed to the comms, to ranks of its own host and of other hosts.
        self.sent_bytes = {"host": 0, "network": 0}
        self.box = mailbox(worker)
        self.seq = 0
        self._sends: list[concurrent.futures.Future] = []
        self._staging: np.ndarray | None = None  # a GPU buffer's page-locked host copy
        self._sum: np.ndarray | None = None  # the host sum of GPU buffers (it goes on to the device)
        # Shared-memory segments: None until the first large buffer, then (n, own segments by
        # parity, {peer rank: its segments}) or False (some rank cannot share memory).
        self._shm: Any = None
        # Held while this rank's task copies between the device and page-locked segments, and
        # by close() (the client's release, on the worker's event loop, may come while an
        # aborted task still runs): the segments are unlocked and unmapped after the copies.
        self._shm_lock = threading.Lock()

    def _pieces(self, n: int, owner: int, size: int | None = None, split: bool = False) -> list[tuple[int, int]]:
        """The element ranges of ``owner``'s slice (of ``size`` ranks, default all) of a buffer of
        ``n`` elements, piece by piece. A buffer of one piece is the first owner's alone, unless
        ``split``: the fewest messages (reduce and broadcast), where bandwidth does not count."""
        size = self.size if size is None else size
        if 8 * n <= self.piece_bytes and not split:
            lo, hi = (0, n) if owner == 0 else (0, 0)
        else:
            lo, hi = n * owner // size, n * (owner + 1) // size
        step = max(1, self.piece_bytes // 8)
        return [(a, min(a + step, hi)) for a in range(lo, hi, step)]

    def _sender(self, dest: int, count: int, loop: asyncio.AbstractEventLoop) -> asyncio.Queue:
        """Start sending to rank ``dest``, from ``loop``, the ``count`` (tag, array) pairs that
        will be put in the returned queue (through ``loop.call_soon_threadsafe``), in order."""
        from distributed.core import send_recv
        from distributed.protocol import to_serialize

        queue: asyncio.Queue = asyncio.Queue()
        worker, addr = self.worker, self.spec.ranks[dest]

        async def send() -> None:
            pool = worker.rpc if loop is worker.loop.asyncio_loop else await _send_pool(worker)
            comm = await pool.connect(addr)
            try:
                for k in range(count):
                    tag, payload = await queue.get()  # contiguous arrays travel as frames, uncopied
                    await send_recv(comm, op=HANDLER, tag=tag, payload=to_serialize(payload), reply=k == count - 1)
            except BaseException:
                comm.abort()
                raise
            finally:
                pool.reuse(addr, comm)

        fut = asyncio.run_coroutine_threadsafe(send(), loop)
        fut.add_done_callback(lambda _: self.box.wake())  # a failed send ends the rank's waits
        fut.daskmeans_dest = dest  # whom a send that never ends waits for (_wait_sends)
        self._sends.append(fut)
        return queue

    def _put(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, dest: int, tag: tuple,
             payload: np.ndarray) -> None:
        """Hand ``payload`` to the sender of rank ``dest`` (:meth:`_sender`), counting its bytes."""
        where = "host" if dest in self.local else "network"
        self.sent_bytes[where] += int(payload.nbytes)
        loop.call_soon_threadsafe(queue.put_nowait, (tag, payload))

    def _check_sends(self) -> None:
        for fut in self._sends:
            if fut.done() and not fut.cancelled() and fut.exception() is not None:
                e = fut.exception()  # the peer's address is gone (killed worker) or unreachable
                raise CollectiveAborted(f"rank {self.rank} could not reach its peers: {type(e).__name__}: {e}")

    def _wait_sends(self) -> None:
        """Until every send is answered; gives up when the client aborts the fit, or, naming the
        peer (:class:`PeerTimeout`), when time is out (connecting to a dead peer can take Dask's
        whole connect timeout; a stopped peer accepts the bytes but never answers)."""
        fit_id, epoch = self.spec.fit_id, self.spec.epoch
        timeout = self.spec.timeout
        deadline = time.monotonic() + timeout
        pending = set(self._sends)
        while pending:
            _, pending = concurrent.futures.wait(pending, timeout=0.2, return_when=concurrent.futures.FIRST_EXCEPTION)
            self._check_sends()
            if pending and self.box.is_aborted(fit_id, epoch):
                raise CollectiveAborted(f"rank {self.rank} of fit {fit_id}: send aborted (a peer may be lost)")
            if pending and time.monotonic() > deadline:
                peer = min(getattr(f, "daskmeans_dest", self.size) for f in pending)
                address = self.spec.ranks[peer] if peer < self.size else None
                who = f"rank {peer}" + (f" (worker {address})" if address else "")
                raise PeerTimeout(
                    f"rank {self.rank} of fit {fit_id}: no answer from {who} in {timeout:.0f} s: a worker may be "
                    f"lost or hung", peer if peer < self.size else None, address, timeout,
                )

    def _take(self, tag: tuple) -> np.ndarray:
        return self.box.take(tag, self.spec.fit_id, self.spec.timeout, check=self._check_sends, ranks=self.spec.ranks)

    def _out(self, n: int, be: Any) -> np.ndarray:
        """An int64 array of ``n`` for the sum: the caller's own for NumPy buffers; for GPU
        buffers, whose sum goes on to the device, one page-locked host array kept for the next
        call (fresh memory for every sum took a page fault per 4 KiB written: 154 MB at P4),
        which the device copies at the link's speed (from pageable memory the copy goes
        through the driver's buffers or CuPy's, on the iteration's path between hosts)."""
        if be.on_host:
            return np.empty(n, np.int64)
        if self._sum is None or self._sum.size < n:
            self._sum = be.empty_host((n,), np.int64)
        return self._sum[:n]

    def _host(self, buf: Any, be: Any) -> tuple[np.ndarray, np.ndarray]:
        """The buffer on the host and an array for the sum (:meth:`_out`). A GPU buffer is
        copied into a page-locked array kept for the next call."""
        n = int(buf.size)
        if be.on_host:
            return np.ascontiguousarray(buf), self._out(n, be)
        if self._staging is None or self._staging.size < n:
            self._staging = be.pinned(np.empty(n, np.int64))
        return be.to_numpy(buf, out=self._staging[:n]), self._out(n, be)

    # Buffers of at least this many bytes go through shared memory where the ranks share a host.
    shm_min_bytes = 1 << 20

    def _hierarchical(self) -> bool:
        """Whether large buffers are summed within hosts, then between them: ranks on several
        hosts, every host with the same number of ranks, more than one."""
        counts = {len(h) for h in self.hosts}
        return len(self.hosts) > 1 and len(counts) == 1 and counts.pop() > 1

    def allreduce(self, buf: Any, wait: bool = True) -> Any:
        """The sum, on the host and back (``wait`` has no effect: the host adds)."""
        n = int(buf.size)
        large = self.size > 1 and 8 * n >= self.shm_min_bytes
        # Shared memory on one host, or within each of several hosts of equal rank counts.
        if large and self.spec.shared_memory and (len(self.hosts) == 1 or self._hierarchical()):
            if self._shm is None:  # decided once, by all ranks together: they take the same path
                self._shm = self._shm_open(n, buf)
            if self._shm and n <= self._shm[0]:
                return self._allreduce_hosts(buf) if len(self.hosts) > 1 else self._allreduce_shm(buf)
        # Between hosts a large buffer always travels as a reduce-scatter and all-gather.
        return self._allreduce_comms(buf, split=large and len(self.hosts) > 1)

    def wait(self) -> None:
        pass

    def _allreduce_comms(self, buf: Any, group: list[int] | None = None, split: bool = False,
                         seq: int | None = None, phase: int = 0) -> Any:
        """Reduce-scatter then all-gather of ``buf`` among the ranks of ``group`` (default: all),
        in slices even when one piece would do (``split``); ``seq`` and ``phase``: the tags of a
        step of a call already counted (:meth:`_allreduce_hosts`)."""
        from ..backends import get_backend

        be = get_backend(buf)
        host, out = self._host(buf, be)
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        rank = self.rank
        group = list(range(self.size)) if group is None else group
        tag = (self.spec.fit_id, self.spec.epoch, seq)  # + (phase, piece, source rank)
        pieces = dict(zip(group, (self._pieces(host.size, i, len(group), split) for i in range(len(group)))))
        mine = pieces[rank]
        # A buffer of one piece goes from the worker's loop (a hop to another thread would
        # cost more than it saves), larger ones from the sender loop.
        loop = _send_loop() if 8 * host.size > self.piece_bytes else self.worker.loop.asyncio_loop
        self._sends = []
        try:
            # Reduce-scatter: each other owner gets this rank's part of its slice...
            queues = {}
            for d in group:
                if d != rank and pieces[d] + mine:
                    queues[d] = self._sender(d, len(pieces[d]) + len(mine), loop)
                    for i, (a, b) in enumerate(pieces[d]):
                        self._put(loop, queues[d], d, tag + (phase, i, rank), host[a:b])
            # ... and this rank sums its own slice, piece by piece, in rank order, and passes
            # each sum on (all-gather).
            for i, (a, b) in enumerate(mine):
                parts = [host[a:b] if src == rank else self._take(tag + (phase, i, src)) for src in group]
                acc = _sum_in_rank_order(parts, out[a:b])
                for d, q in queues.items():
                    self._put(loop, q, d, tag + (phase + 1, i, rank), acc)
            for src in group:
                if src != rank:
                    for i, (a, b) in enumerate(pieces[src]):
                        part = self._take(tag + (phase + 1, i, src))
                        if b - a == host.size and be.on_host:
                            out = part  # the whole sum in one message: no copy
                        else:
                            out[a:b] = part
            self._wait_sends()  # before the buffers are handed back (or reused)
        finally:
            for fut in self._sends:
                fut.cancel()  # only those still running: an aborted call
        return out if be.on_host else be.asarray(out)

    def interrupt(self) -> None:
        self.box.wake()  # waits look at the mailbox's abort flag

    def _shm_path(self, rank: int, parity: int) -> str:
        return os.path.join(shm.SHM_DIR, f"daskmeans-{self.spec.fit_id}-{self.spec.epoch}-{rank}-{parity}")

    def _agree(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank (a small all-reduce through the comms)."""
        flags = np.zeros(self.size, np.int64)
        flags[self.rank] = int(ok)
        return bool(self._allreduce_comms(flags).all())

    def _shm_open(self, n: int, buf: Any) -> Any:
        """Two segments per rank (alternate calls write alternate ones) for buffers of up to
        ``n`` values, each mapped by every rank of its host; False where any rank cannot create
        its own or map a local peer's (no room in /dev/shm, a /dev/shm of its own, shared memory
        switched off). For GPU buffers (``buf``'s backend) every segment is page-locked: the
        device copies to and from them directly."""
        from ..backends import get_backend

        mine: list = []
        peers: dict = {}
        ok = False
        try:
            ok = shm.room_for(2 * 8 * n)
            try:
                if ok:
                    mine = [shm.Segment(self._shm_path(self.rank, p), n, create=True) for p in (0, 1)]
            except OSError:
                ok = False
            if self._agree(ok):
                try:
                    peers = {r: [shm.Segment(self._shm_path(r, p), n, create=False) for p in (0, 1)]
                             for r in self.local if r != self.rank}
                except OSError:
                    ok = False
                ok = self._agree(ok)
            else:
                ok = False
        finally:  # also when a wait is aborted: no file is left in /dev/shm
            for seg in mine:  # every rank has mapped them (or given up): the files can go
                seg.unlink()
            if not ok:
                _close_segments((n, mine, peers, []))
        if not ok:
            return False
        be = get_backend(buf)
        unlocks: list = []
        try:
            for seg in mine + [s for ss in peers.values() for s in ss]:
                unlocks.append(be.page_lock(seg.array))
        except BaseException:
            _close_segments((n, mine, peers, unlocks))
            raise
        return n, mine, peers, unlocks

    def _allreduce_shm(self, buf: Any) -> Any:
        """Each rank writes its buffer to its segment and tells the others, then sums every
        rank's segment in rank order: the same integers as through the comms. A GPU rank adds
        the peers' segments to its own buffer on the device, each copied straight from the
        page-locked segment (integer sums: the same in any order); the host only signals."""
        from ..backends import get_backend

        be = get_backend(buf)
        n = int(buf.size)
        _, mine, peers, _ = self._shm
        seq, self.seq = self.seq, self.seq + 1
        # A segment written at call s is read by the peers during call s; it is written again
        # at call s + 2 at the earliest, after every rank has finished call s + 1 (so call s).
        parity = seq % 2
        with self._shm_lock:
            self._check_open()
            be.to_numpy(buf, out=mine[parity].array[:n])
        tag = (self.spec.fit_id, self.spec.epoch, seq, 2, 0)
        loop = self.worker.loop.asyncio_loop
        self._sends = []
        try:
            self._signal(tag, peers, loop)
            if be.on_host:
                parts = [mine[parity].array[:n] if r == self.rank else peers[r][parity].array[:n]
                         for r in range(self.size)]
                out = _sum_in_rank_order(parts, self._out(n, be))
                del parts
            else:
                # The copies are queued on the stream that writes this rank's segment at the next
                # call, after them: a peer's segment is read before this rank says it wrote its
                # own for the next call, and so before the peer can write that one again.
                with self._shm_lock:
                    self._check_open()
                    out = be.xp.array(buf, copy=True)
                    for r in sorted(peers):
                        be.add_host(out, peers[r][parity].array[:n])
            self._wait_sends()
        finally:
            for fut in self._sends:
                fut.cancel()
        return out

    def _signal(self, tag: tuple, peers: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Tell ``peers`` (ranks of this host) that ``tag``'s step is done here, and wait until
        each of them says the same."""
        for d in peers:
            self._put(loop, self._sender(d, 1, loop), d, tag + (self.rank,), np.zeros(0, np.int64))
        for src in peers:
            self._take(tag + (src,))

    def _allreduce_hosts(self, buf: Any) -> Any:
        """Within each host through shared memory, between hosts through the comms: local rank
        ``j`` of ``L`` adds slice ``j`` of its host's segments, reduces that slice with the ranks
        of index ``j`` on the other hosts (reduce-scatter + all-gather), and writes the sum over
        its own contribution in its segment, where the host's ranks read it. The same integers
        as every other path."""
        from ..backends import get_backend

        be = get_backend(buf)
        n = int(buf.size)
        _, mine, peers, _ = self._shm
        seq, self.seq = self.seq, self.seq + 1
        parity = seq % 2  # a segment is written again two calls later: see _allreduce_shm
        with self._shm_lock:
            self._check_open()
            be.to_numpy(buf, out=mine[parity].array[:n])
        segments = {r: (mine if r == self.rank else peers[r])[parity].array[:n] for r in self.local}
        size, j = len(self.local), self.local.index(self.rank)
        bounds = [(n * i // size, n * (i + 1) // size) for i in range(size)]
        a, b = bounds[j]
        column = [h[j] for h in self.hosts]  # the ranks of local index j, one per host
        tag = (self.spec.fit_id, self.spec.epoch, seq)
        loop = self.worker.loop.asyncio_loop
        self._sends = []
        try:
            self._signal(tag + (2, 0), peers, loop)  # every local buffer is in its segment
            self._wait_sends()
            part = _sum_in_rank_order([segments[r][a:b] for r in self.local], np.empty(b - a, np.int64))
            total = self._allreduce_comms(part, group=column, split=True, seq=seq, phase=3)
            segments[self.rank][a:b] = total  # only this rank reads slice j of its segment before
            self._sends = []
            self._signal(tag + (5, 0), peers, loop)  # every slice's sum is in its owner's segment
            out = self._out(n, be)
            for i, r in enumerate(self.local):
                lo, hi = bounds[i]
                out[lo:hi] = segments[r][lo:hi]
            self._wait_sends()
        finally:
            for fut in self._sends:
                fut.cancel()
        return out if be.on_host else be.asarray(out)

    def _check_open(self) -> None:
        if not self._shm:
            raise CollectiveAborted(f"rank {self.rank} of fit {self.spec.fit_id}: the collective was closed")

    def close(self) -> None:
        self._staging = None
        self._sum = None
        with self._shm_lock:  # after any copy in flight from the task's thread has been queued
            state, self._shm = self._shm, False
            if state:
                _close_segments(state)


def _sum_in_rank_order(parts: list, out: np.ndarray) -> np.ndarray:
    """``out`` = the ranks' int64 ``parts`` added in rank order (the same integers on every rank)."""
    if len(parts) == 1:
        out[...] = parts[0]
        return out
    np.add(parts[0], parts[1], out=out)
    for part in parts[2:]:
        out += part
    return out


def _close_segments(state: tuple) -> None:
    """Unlock, then unmap, a rank's own and its peers' segments (``(n, own, {peer: segments},
    unlocks)``): every one of them, then the first failure is raised."""
    _, mine, peers, unlocks = state
    errors = []
    for unlock in unlocks:
        try:
            unlock()
        except Exception as e:  # a CUDA error: the segments are still unmapped
            errors.append(e)
    for seg in mine + [seg for segs in peers.values() for seg in segs]:
        seg.close()
    if errors:
        raise errors[0]
