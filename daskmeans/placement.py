"""Which chunks live where: persisted row chunks grouped into one shard per worker.

The engine must not pay one task per chunk per iteration (~1 ms each in Dask). After the data
is persisted, each worker's local chunks are grouped into one :class:`Shard` (the worker's
rank in the loop), built by a task pinned to that worker. A shard holds the worker's blocks
(copied only where a block is not already contiguous and aligned for the kernels); the loop's
one long task per worker then runs over its blocks (:mod:`daskmeans.engine.loop`).

Balance: rows are spread evenly over the workers; data whose whole chunks cannot be shared
out within 2% (one large chunk, or 15 chunks on 2 workers) is cut into equal chunks first
(:func:`balance_chunks`), so that no worker waits on another because of chunk sizes.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import heapq
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import dask
import dask.array as da
import numpy as np
from dask.sizeof import sizeof
from distributed import Client, futures_of, wait

from . import config
from .backends import backend_name, get_backend
from .dask_cluster import check_scheduler
from .errors import DaskmeansError, InputChanged
from .io.ranges import on_cores
from .io.readers import split_rows
from .options import TIERS  # noqa: F401  (the tiers' registry, re-exported)
from .events import advance


class ChunkReader:
    """Reads one row chunk from its source on the worker (the storage tier): the chunk's
    culled task graph, run in the calling thread. Only the path and offsets travel."""

    def __init__(self, block: da.Array):
        (block,) = dask.optimize(block)
        self.graph = dict(block.__dask_graph__())
        self.key = block.__dask_keys__()[0][0]
        if sizeof(self.graph) > 2**20:  # a file reader's graph is a few hundred bytes
            from .errors import DataError

            raise DataError(
                "the storage tier re-reads each chunk from its source, but this array is held in the "
                "client's memory: read the data from a file (Zarr, .npy, CSV) or give the workers more memory"
            )

    def read(self) -> np.ndarray:
        from dask.local import get_sync

        return np.asarray(get_sync(self.graph, self.key))


def _read_ahead(readers: list, depth: int, check: Callable[[int, np.ndarray], None]) -> Iterator[np.ndarray]:
    """The readers' chunks in order, up to ``depth`` read ahead by a thread while the caller
    computes (storage tier: reading and decompressing overlap the kernels); ``check(j,
    block)`` runs on each chunk ``j`` in that thread, as it is read (its pin)."""

    def read(j: int) -> np.ndarray:
        block = readers[j].read()
        check(j, block)
        return block

    with ThreadPoolExecutor(1, thread_name_prefix="daskmeans-read-ahead") as ex:
        pending = collections.deque(ex.submit(read, j) for j in range(min(depth, len(readers))))
        nxt = len(pending)
        while pending:
            block = pending.popleft().result()
            if nxt < len(readers):
                pending.append(ex.submit(read, nxt))
                nxt += 1
            yield block


@dataclass
class Shard:
    """A worker's run of row chunks, in global chunk order, in one memory tier.

    Attributes
    ----------
    chunk_ids : tuple of int
        Global index of each chunk along the row axis.
    offsets, rows : tuple of int
        Global row offset and row count of each chunk.
    n_features : int
    dtype : numpy dtype
    backend : "numpy" or "cupy"
        Where the kernels run (``items()`` yields the backend's arrays).
    tier : "device", "host" or "storage"
        ``device``: chunks resident as backend arrays (for NumPy, host memory); ``host``:
        resident in pinned host memory, copied to the GPU chunk by chunk each pass;
        ``storage``: re-read from the source each pass, read ahead by a thread.
    blocks : list of arrays, or None
        The resident chunks (device and host tiers).
    readers : list of ChunkReader, or None
        The storage tier's chunk readers.
    weights : list of arrays (n_i,), or None
        Sample weights (small: always resident, as backend arrays).
    pins : dict of int to int
        Each chunk's pin (a hash of its values, the backend's ``pin``), by global chunk id:
        given by the client for a fit's chunks read before (a shard placed again after a lost
        worker), else recorded by the first pass. A chunk read again whose pin differs is an
        :class:`~daskmeans.errors.InputChanged`: the storage tier checks every read; the
        resident tiers check their blocks once, before the shard's first pass (a block made
        again from the source by Dask's lineage is read again).
    """

    chunk_ids: tuple[int, ...]
    offsets: tuple[int, ...]
    rows: tuple[int, ...]
    n_features: int
    dtype: Any
    backend: str
    tier: str
    blocks: list | None = None
    readers: list | None = None
    weights: list | None = None
    # Workspace of the loop: the labels of Lloyd step i in ``labels[i % 2]`` (a list per
    # chunk), so that reassigned rows can be counted; the loop's state and final labels are
    # set as attributes by engine.loop.
    labels: dict = field(default_factory=dict)
    pins: dict = field(default_factory=dict)
    # The resident blocks were checked against (or gave) their pins.
    pinned: bool = False
    tunables: Any = None  # the kernels' settings the plan resolved on the client (backends.protocol.Tunables)

    @property
    def be(self) -> Any:
        return get_backend(self.backend, self.tunables)

    @property
    def n(self) -> int:
        return int(sum(self.rows))

    def items(self) -> Iterator[tuple]:
        """Yield ``(chunk_id, row_offset, block, weights_or_None)`` in order, ``block`` on the
        backend (copied or read here for the host and storage tiers: valid until the next
        chunk is requested)."""
        be = self.be
        ws = self.weights or [None] * len(self.chunk_ids)
        if self.tier == "storage":  # each chunk checked against its pin as it is read
            source = (be.asarray(b) for b in _read_ahead(
                self.readers, int(config.get("read-ahead")), lambda j, b: self._pin(j, get_backend("numpy"), b)))
        else:
            if not self.pinned:
                self.pin_resident()
            # host tier on a GPU: copies overlap the previous chunk's kernels
            source = be.staged(self.blocks) if self.tier == "host" else iter(self.blocks)
        yield from zip(self.chunk_ids, self.offsets, source, ws)

    def expect(self, pins: dict | None) -> None:
        """Check this shard's chunks against the client's ``pins`` (a shard made again by
        Dask's lineage, after its worker was lost, was made without them)."""
        for cid in self.chunk_ids:
            if pins and cid in pins and cid not in self.pins:
                self.pins[cid] = pins[cid]
                self.pinned = False

    def pin_resident(self) -> None:
        """Pin (or check) every resident block, where it lives: the host tier's (and a host
        backend's) several at once (XXH3 releases the GIL), a device's on the device."""
        be = self.be if self.tier != "host" else get_backend("numpy")  # the host tier's blocks are host memory
        n = len(self.chunk_ids)
        if be.on_host and n > 1:
            on_cores(lambda j: self._pin(j, be, self.blocks[j]), range(n))
        else:
            for j in range(n):
                self._pin(j, be, self.blocks[j])
        self.pinned = True

    def _pin(self, j: int, be: Any, block: Any) -> None:
        """Record chunk ``j``'s pin (``be.pin``), or raise where it differs from the one recorded."""
        cid = self.chunk_ids[j]
        pin = be.pin(block)
        first = self.pins.setdefault(cid, pin)
        if first != pin:
            off, rows = self.offsets[j], self.rows[j]
            raise InputChanged(
                f"the data changed during the fit: row chunk {cid} (rows {off} to {off + rows - 1}) read again "
                f"differs from its first read; the input must not change while a fit reads it"
            )


@sizeof.register(Shard)
def _sizeof_shard(s: Shard) -> int:
    return int(sum(sizeof(b) for b in (s.blocks or [])) + sum(sizeof(w) for w in (s.weights or [])))


def _make_shard(chunk_ids, offsets, rows, n_features, dtype, backend, tier, n_blocks, readers, pins,
                *arrays, tunables=None) -> Shard:
    be = get_backend(backend)
    if tier == "device":
        # The backend's asarray makes each block contiguous and aligned, once, for the kernels.
        blocks = [be.asarray(a) for a in arrays[:n_blocks]]
    elif tier == "host":
        blocks = [be.pinned(a) for a in arrays[:n_blocks]]
    else:
        blocks = None
    weights = [be.asarray(a) for a in arrays[n_blocks:]] or None
    return Shard(tuple(chunk_ids), tuple(offsets), tuple(rows), n_features, np.dtype(dtype), backend, tier,
                 blocks, readers, weights, pins=dict(pins or {}), tunables=tunables)


@dataclass
class Placement:
    """Shard futures, the workers that hold them, and the global chunk layout."""

    shards: list  # futures of Shard, ordered by their first chunk
    workers: list[str]
    chunk_ids: list[tuple[int, ...]]
    row_chunks: tuple[int, ...]
    n_features: int
    dtype: np.dtype
    backend: str
    tier: str = "device"
    # The collective chosen for these ranks, by the name asked for (asking the workers costs
    # round trips: each run of a fit, and each re-fit of kept data, asks once per placement).
    collectives: dict = field(default_factory=dict, compare=False, repr=False)
    # Each chunk's pin once a pass has read it (``Shard.pins``): a placement made again gives
    # them to its shards, so that a chunk read again from the source is checked.
    pins: dict | None = field(default=None, compare=False, repr=False)
    # The in-memory chunks scattered for it (engine/owned.py): kept while the shards may need
    # to be made again from them.
    sources: list = field(default_factory=list, compare=False, repr=False)

    @property
    def n_samples(self) -> int:
        return int(sum(self.row_chunks))


def to_backend(X: da.Array, backend: str) -> da.Array:
    """Map every block onto the backend's device arrays (a no-op for matching blocks)."""
    be = get_backend(backend)
    if get_backend(X) is be:
        return X
    try:
        meta = be.asarray(np.empty((0,) * X.ndim, X.dtype))
    except Exception:  # the client may lack the GPU library; Dask infers meta lazily then
        meta = None
    return X.map_blocks(be.asarray, dtype=X.dtype, meta=meta)


def place(
    client: Client,
    X: da.Array,
    backend: str,
    sample_weight: da.Array | None = None,
    tier: str = "device",
    *,
    balance: bool = True,
    pins: dict | None = None,
    tunables: Any = None,
) -> Placement:
    """Put ``X`` (and weights) on the cluster in ``tier`` and group chunks into one shard per
    worker.

    Parameters
    ----------
    client : distributed.Client
    X : dask array, shape (n, d), one chunk along columns
    backend : "numpy" or "cupy"
    sample_weight : dask array, shape (n,), chunked like X's rows, optional
    tier : "device", "host" or "storage" (see :class:`Shard`; :func:`daskmeans.engine.plan.plan`
        chooses)
    balance : bool, default True
        Cut ``X`` first so that every worker gets a near-equal share (:func:`balance_chunks`).
        A fit balances once and places its chunks with ``False``, also again on the workers
        left after a loss: its chunking is fixed, so every statistic kept per chunk (the
        loop's inertia slots, the labels' layout) means the same before and after the loss.
    pins : dict of int to int, optional
        The chunks' pins from a pass over an earlier placement of the same chunks (see
        :class:`Shard`): the shards check their chunks against them.
    tunables : backends.protocol.Tunables, optional
        The kernels' settings (the plan's), which each shard's backend runs with.
    """
    X = X.rechunk({1: -1})
    if balance:
        X = balance_chunks(X, len(client.nthreads()))
    resident = X if tier == "storage" else to_backend(X, backend if tier == "device" else "numpy")
    arrays = [] if tier == "storage" else [resident]
    if sample_weight is not None:
        arrays.append(to_backend(sample_weight.rechunk((X.chunks[0],)), backend))
    # Under daskmeans' own keys (the user's keys, known to the scheduler with another run_spec,
    # made distributed warn on the user's next computation of X), and in-memory chunks
    # scattered rather than sent inside the graph (engine/owned.py).
    from .engine.owned import own_keys

    owned = [own_keys(a, client, scatter=True) for a in arrays]
    arrays, sources = [a for a, _ in owned], [f for _, fs in owned for f in fs]
    persisted = client.persist(arrays) if arrays else []
    xfuts = futures_of(persisted[0]) if tier != "storage" else []
    wfuts = futures_of(persisted[-1]) if sample_weight is not None else None
    # Never forever: a lost scheduler, or no worker left, ends the wait in one line; a hung
    # worker is retired (its tasks run elsewhere).
    wait_on_cluster(client, xfuts + (wfuts or []), hung_after=config.get_seconds("collective-timeout"))
    # futures_of does not promise an order: index them by the block's key.
    by_key = {f.key: f for f in xfuts}
    xkeys = list(_row_keys(persisted[0])) if tier != "storage" else [None] * X.numblocks[0]
    wkeys = list(_row_keys(persisted[-1])) if wfuts is not None else None
    wby_key = {f.key: f for f in wfuts} if wfuts is not None else {}
    who = client.who_has(list(by_key.values())) if by_key else {}
    nthreads = client.nthreads()

    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(int).tolist()
    holders = [sorted(who[key])[0] if key is not None and who.get(key) else None for key in xkeys]
    owner = _balance(holders, list(X.chunks[0]), dict.fromkeys(nthreads, 1))
    xf = [by_key[k] for k in xkeys] if tier != "storage" else [None] * len(xkeys)
    wf = [wby_key[k] for k in wkeys] if wkeys is not None else None
    # The moves and shards go to their workers, or (loose restrictions) anywhere once their
    # worker is gone: a result made from a shard later (the labels) is then made again from
    # the data on a worker left, never waits for one that is gone.
    for i, w in enumerate(owner):
        if w != holders[i]:  # move the chunk: one transfer, once per fit
            if xf[i] is not None:
                xf[i] = client.submit(_identity, xf[i], workers=[w], allow_other_workers=True, pure=False)
            if wf is not None:
                wf[i] = client.submit(_identity, wf[i], workers=[w], allow_other_workers=True, pure=False)
    per_worker: dict[str, list[int]] = {}
    for i, w in enumerate(owner):
        per_worker.setdefault(w, []).append(i)

    # One shard (one rank of the loop) per worker, ranks ordered by their first chunk.
    groups = sorted(per_worker.items(), key=lambda g: g[1][0])

    shards = []
    rows = [int(c) for c in X.chunks[0]]
    for w, ids in groups:
        readers = [ChunkReader(X.blocks[i]) for i in ids] if tier == "storage" else None
        args = [xf[i] for i in ids] if tier != "storage" else []
        if wf is not None:
            args += [wf[i] for i in ids]
        shards.append(
            client.submit(
                _make_shard,
                ids,
                [offsets[i] for i in ids],
                [rows[i] for i in ids],
                int(X.shape[1]),
                str(X.dtype),
                backend_name(backend),
                tier,
                len(args) - (len(ids) if wf is not None else 0),
                readers,
                {i: pins[i] for i in ids if i in pins} if pins else None,
                *args,
                tunables=tunables,
                workers=[w],
                allow_other_workers=True,
                pure=False,
                key=f"daskmeans-shard-{_token()}",
            )
        )
    # A worker lost meanwhile is a WorkerLost (the fit places its data again), not a shard
    # made elsewhere: each rank's shard must live on its rank's worker.
    ranks = [w for w, _ in groups]
    watch(client, shards, ranks, fetch=False, hung_after=config.get_seconds("collective-timeout"))
    where = client.who_has(shards)
    astray = [w for f, w in zip(shards, ranks) if w not in where.get(f.key, ())]
    if astray:
        raise WorkerLost(astray)
    return Placement(
        shards=shards,
        workers=[w for w, _ in groups],
        chunk_ids=[tuple(ids) for _, ids in groups],
        row_chunks=tuple(int(c) for c in X.chunks[0]),
        n_features=int(X.shape[1]),
        dtype=np.dtype(X.dtype),
        backend=backend_name(backend),
        tier=tier,
        pins=pins,
        sources=sources,
    )


def balance_chunks(X: da.Array, n_workers: int) -> da.Array:
    """``X`` in chunks that give each of ``n_workers`` workers a near-equal share of rows.

    Chunks are kept when whole chunks already come within 2% of an equal share (a kernel call
    has a fixed cost, so chunks are never split without need); otherwise ``X`` is cut into
    ``n_workers`` times as many equal chunks as the largest share held (of at least
    ``daskmeans.min-chunk-rows`` rows): one chunk becomes one per worker, 15 chunks on 2
    workers become 16. The result does not depend on the chunking (the sums are exact
    integers, :mod:`daskmeans.backends.grid`), so this is free to follow the worker count."""
    n, nb = int(X.shape[0]), X.numblocks[0]
    if n == 0 or _largest_share(X.chunks[0], n_workers) <= 1.02 * n / n_workers:
        return X
    per = -(-nb // n_workers)  # the most chunks one worker holds
    target = min(per * n_workers, max(1, n // max(1, int(config.get("min-chunk-rows")))))
    return split_rows(X, -(-n // target))


def _largest_share(rows: Sequence[int], n_workers: int) -> int:
    """The most rows a worker holds when whole chunks go, largest first, to the emptiest."""
    loads = [0] * n_workers
    for r in sorted(rows, reverse=True):
        heapq.heapreplace(loads, loads[0] + r)
    return max(loads)


def _identity(x: Any) -> Any:
    return x


def _balance(holders: list, rows: list[int], nthreads: dict[str, int]) -> list[str]:
    """A worker for each chunk: rows spread in proportion to ``nthreads`` (weights), keeping
    each chunk where it already is unless its holder is full (then it moves to the emptiest).

    Persisting does not balance by itself: chunks of an in-memory array all depend on one
    key and land on one worker.
    """
    total_threads = sum(nthreads.values())
    total_rows = sum(rows)
    target = {w: total_rows * t / total_threads for w, t in nthreads.items()}
    load = dict.fromkeys(nthreads, 0.0)
    owner: list[str | None] = [None] * len(rows)
    for i, h in enumerate(holders):
        if h in load and load[h] + rows[i] / 2 <= target[h]:
            owner[i] = h
            load[h] += rows[i]
    for i in range(len(rows)):
        if owner[i] is None:
            w = max(load, key=lambda w: (target[w] - load[w], w))
            owner[i] = w
            load[w] += rows[i]
    return owner  # type: ignore[return-value]


def _row_keys(x: da.Array) -> Sequence:
    keys = x.__dask_keys__()
    # 2-D: keys[i][0] is row block i (one column block); 1-D: keys[i].
    return [k[0] if isinstance(k, list) else k for k in keys]


def _token() -> str:
    import uuid

    return uuid.uuid4().hex


class WorkerLost(Exception):
    """A worker holding a shard of the placement left the cluster (``args[0]``: addresses).

    A shard's tasks are pinned to its worker, and a restarted worker comes back at a new
    address: without this, they would wait for it forever."""


def _forget_traceback(e: BaseException | None) -> None:
    """Drop the tracebacks of a caught exception and of those it chains. Distributed's
    ``sync`` keeps the exception it raises in a local of a frame of its traceback: a cycle,
    which kept the frames' futures (a placement's shards and their data on the workers, tasks
    pinned to a lost worker) alive until the next garbage collection."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__


def wait_a_little(client: Client, futs: list, seconds: float = 0.5) -> None:
    """Wait up to ``seconds`` for ``futs`` on ``client`` (``wait()`` alone would use the
    default client, maybe another one). Returns early, without raising, when one of them is
    cancelled (a lost worker's pinned task, a lost scheduler): their statuses tell."""
    try:
        with client.as_current():
            wait(futs, timeout=seconds)
    except (TimeoutError, CancelledError) as e:
        _forget_traceback(e)


def gather(client: Client, futs: list, placement: "Placement") -> list:
    """Results of ``futs`` (tasks on the placement's shards, or on their results), raising
    :class:`WorkerLost` (after cancelling them) as soon as a shard's worker is gone, or silent
    for longer than the collective's timeout (hung: see :func:`watch`)."""
    return watch(client, futs, placement.workers, hung_after=config.get_seconds("collective-timeout"))


# How long a look at the worker list may take: a scheduler that died since the client last
# heard from it refuses connections, and Dask retries them for its connect timeout (30 s).
_LOOK_SECONDS = 5.0


def _workers(client: Client) -> dict | None:
    """The cluster's workers (address: threads); None when a live scheduler is too busy to
    answer within :data:`_LOOK_SECONDS`; :class:`SchedulerLost` if the scheduler is gone
    (also when it goes during the look)."""
    check_scheduler(client)
    try:
        return client.sync(client.scheduler.ncores, callback_timeout=_LOOK_SECONDS)
    except Exception as e:
        _forget_traceback(e)
        check_scheduler(client)  # the connection dropped during the look
        if isinstance(e, TimeoutError):
            return None
        raise


def _lost_ranks(client: Client, ranks: set) -> set:
    """Those of ``ranks`` no longer in the cluster (none when the scheduler does not answer in
    time: the next look tells); :class:`SchedulerLost` if the scheduler is gone."""
    alive = _workers(client)
    return set() if alive is None else ranks - set(alive)


# A cluster left without workers this long is given up on: a nanny restarts a killed worker
# within seconds, and without one the tasks would wait for a worker forever.
NO_WORKER_SECONDS = 10.0


def wait_on_cluster(client: Client, futs: list, no_worker_seconds: float = NO_WORKER_SECONDS,
                    hung_after: float | None = None) -> None:
    """Wait for ``futs``, tasks that any worker may run (a placement's persisted chunks), as
    ``distributed.wait`` does, but never forever: :class:`SchedulerLost` when the scheduler
    goes, a :class:`DaskmeansError` when the cluster has had no worker for
    ``no_worker_seconds``, a task's error raised, a cancellation a DaskmeansError. With
    ``hung_after`` (seconds), a worker silent that long is retired
    (:func:`daskmeans.liveness.retire`): the scheduler runs its tasks on the others."""
    from .liveness import Silence, retire

    silence = Silence(client, None, hung_after) if hung_after is not None else None
    empty_since = None
    while True:
        wait_a_little(client, futs)
        status = [f.status for f in futs]
        advance(status.count("finished"), len(futs))  # chunks placed, for the command's progress
        if all(s == "finished" for s in status):
            return
        if "error" in status:
            futs[status.index("error")].result()  # raises the task's error
        if "cancelled" in status:
            check_scheduler(client)
            raise DaskmeansError(f"tasks of the fit were cancelled: {cancel_reason(futs)}")
        workers = _workers(client)
        if silence is not None:
            hung = silence.look()
            if hung:
                retire(client, sorted(hung), hung)
        now = time.monotonic()
        if workers is None or workers:
            empty_since = None
        elif empty_since is None:
            empty_since = now
        elif now - empty_since >= no_worker_seconds:
            raise DaskmeansError(
                f"every worker left the cluster and none came back in {no_worker_seconds:.0f} s: there is nothing "
                f"to place the data on (start workers, or a cluster whose nannies restart them)"
            )


def _fetch(client: Client, futs: list, ranks: set) -> list:
    """``client.gather(futs)`` of finished futures, watching ``ranks`` meanwhile: a result
    whose worker goes before it is fetched would be computed again, and a task pinned to that
    worker would wait for it forever (:class:`WorkerLost` instead; :class:`SchedulerLost`
    when the scheduler goes)."""
    import asyncio
    import concurrent.futures

    done = asyncio.run_coroutine_threadsafe(client.gather(futs, asynchronous=True), client.loop.asyncio_loop)
    try:
        while True:
            try:
                return done.result(timeout=0.5)
            except concurrent.futures.TimeoutError as e:
                _forget_traceback(e)
            except CancelledError as e:  # a result lost: its worker, or the scheduler, went
                _forget_traceback(e)
                lost = _lost_ranks(client, ranks)
                if not lost:  # the loss may reach the worker list a moment later
                    time.sleep(0.5)
                    lost = _lost_ranks(client, ranks)
                if lost:
                    client.cancel(futs)
                    raise WorkerLost(sorted(lost)) from None
                raise DaskmeansError(f"tasks of the fit were cancelled: {' '.join(str(e).split())}") from None
            lost = _lost_ranks(client, ranks)
            if lost:
                client.cancel(futs)
                raise WorkerLost(sorted(lost))
    finally:
        done.cancel()


def watch(
    client: Client,
    futs: list,
    workers: Sequence[str],
    *,
    fetch: bool = True,
    stop: Callable[[list], None] | None = None,
    peer_loss: tuple = (),
    hung_after: float | None = None,
) -> list | None:
    """Wait for ``futs`` (tasks pinned to ``workers``, or on their results) while watching
    those workers; their results (``fetch``), or None.

    A worker gone: ``stop(survivors)``, the tasks cancelled, :class:`WorkerLost`; a task
    cancelled because its worker went (Dask may forget a task whose pinned dependency was
    lost) is such a loss too. The scheduler gone: :class:`SchedulerLost` at once (Dask has
    cancelled every task). A task's error: ``stop(workers left)`` (tasks that wait for their
    peers must not wait for it), then the error; an error of a ``peer_loss`` type (a task that
    gave up on a lost peer), or a cancellation, first gives a worker's loss time to reach the
    worker list.

    With ``hung_after`` (seconds; the collective's timeout), a worker that sends the scheduler
    no heartbeat for that long, or for half of it once a ``peer_loss`` error says a peer gave
    up waiting, is hung: a note says whom the wait is for while it lasts, then the worker is
    retired (:func:`daskmeans.liveness.retire`) and lost as above (``stop`` of the others,
    :class:`WorkerLost`): a stopped worker keeps its connections, and Dask would list it for
    its ``worker-ttl`` (5 minutes) while its tasks wait.
    """
    from .liveness import Silence

    ranks = set(workers)
    silence = Silence(client, workers, hung_after) if hung_after is not None else None
    while True:
        wait_a_little(client, futs)
        status = [f.status for f in futs]  # one look: they change as we go
        if all(s == "finished" for s in status):  # the common case: no scheduler query
            return _fetch(client, futs, ranks) if fetch else None
        lost = _lost_ranks(client, ranks)
        if lost:
            if stop is not None and ranks - lost:
                stop(sorted(ranks - lost))
            client.cancel(futs)
            raise WorkerLost(sorted(lost))
        if silence is not None:
            _give_up_on_hung(client, futs, workers, silence.look(), stop)
        if "error" not in status and "cancelled" not in status:
            continue
        failed = futs[status.index("error")] if "error" in status else None
        if failed is None or isinstance(failed.exception(), peer_loss):
            time.sleep(0.5)
            if _lost_ranks(client, ranks):
                continue
            if silence is not None and failed is not None:
                _give_up_on_hung(client, futs, workers, silence.confirm(), stop)
        if stop is not None:
            stop(sorted(ranks - _lost_ranks(client, ranks)))
        if failed is None:  # cancelled from elsewhere (another client, the scheduler)
            raise DaskmeansError(f"tasks of the fit were cancelled: {cancel_reason(futs)}")
        failed.result()  # raises the task's error, with its traceback


def _give_up_on_hung(client: Client, futs: list, workers: Sequence[str], hung: dict,
                     stop: Callable[[list], None] | None) -> None:
    """With ``hung`` (worker: seconds silent) not empty: retire those workers, ``stop`` the
    others, cancel ``futs`` and raise :class:`WorkerLost` naming them, as for workers killed."""
    if not hung:
        return
    from .liveness import retire

    gone = sorted(hung)
    retire(client, gone, hung, workers)
    left = sorted(set(workers) - set(gone) - _lost_ranks(client, set(workers)))
    if stop is not None and left:
        stop(left)
    client.cancel(futs)
    raise WorkerLost(gone)


def cancel_reason(futs: list) -> str:
    """Why a cancelled future among ``futs`` was cancelled, as one line."""
    for f in futs:
        if f.status == "cancelled":
            try:
                f.result(timeout=5)
            except CancelledError as e:
                _forget_traceback(e)
                return " ".join(str(e).split())
            except Exception:
                pass
    return "reason unknown"


def submit_per_shard(client: Client, placement: Placement, fn, *args_per_shard: Sequence, name: str, **kwargs) -> list:
    """Submit ``fn(shard, *extra)`` once per shard on the shard's worker, with BLAS's threads
    capped to the worker's (:class:`blas_capped`); returns futures."""
    futs = []
    for i, (shard, w) in enumerate(zip(placement.shards, placement.workers)):
        extra = [a[i] for a in args_per_shard]
        futs.append(
            client.submit(
                blas_capped(fn),
                shard,
                *extra,
                # Pinned: a shard never moves (moving it would copy its data, and the step's
                # label workspace lives in the worker's copy).
                workers=[w],
                allow_other_workers=False,
                pure=False,
                key=f"{name}-{_token()}",
                **kwargs,
            )
        )
    return futs


# ---------------------------------------------------------------- BLAS threads on the workers

_BLAS_LOCK = threading.Lock()
_BLAS: dict = {"users": 0, "limiter": None, "controller": None}


def _worker_threads() -> int | None:
    """The calling Dask worker's thread count; None outside a worker's task."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return None
    state = getattr(worker, "state", None)
    n = getattr(state, "nthreads", None) or getattr(worker, "nthreads", None)
    return int(n) if n else None


@contextlib.contextmanager
def worker_blas_threads() -> Iterator[None]:
    """While the block runs in a Dask worker's task, BLAS's thread pools are capped to the
    worker's threads (threadpoolctl), restored when the last such block of the process ends.

    A nanny starts its worker with ``OMP_NUM_THREADS=1`` and the like, and the command's
    in-process workers cap BLAS for as long as their cluster runs
    (:func:`daskmeans.dask_cluster._local`); a worker started otherwise (``dask worker
    --no-nanny``, a user's own cluster) runs BLAS on every core from each of its threads,
    oversubscribing the cores (docs/performance.md, "CPU path"). Outside a worker: no effect."""
    n = _worker_threads()
    if n is None:
        yield
        return
    with _BLAS_LOCK:
        if _BLAS["users"] == 0:
            if _BLAS["controller"] is None:  # the loaded libraries, looked up once (~1 ms)
                from threadpoolctl import ThreadpoolController

                _BLAS["controller"] = ThreadpoolController()
            _BLAS["limiter"] = _BLAS["controller"].limit(limits=n, user_api="blas")
        _BLAS["users"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS["users"] -= 1
            if _BLAS["users"] == 0:
                limiter, _BLAS["limiter"] = _BLAS["limiter"], None
                limiter.restore_original_limits()


class blas_capped:
    """``fn`` run under :func:`worker_blas_threads` and the daskmeans settings of the process
    that made it (:func:`daskmeans.config.snapshot`, taken here: the client's): the picklable
    body of every engine task (submitted, or mapped: ``map_blocks`` names its tasks after
    ``fn``), so that a setting made on the client applies in worker processes too."""

    def __init__(self, fn: Callable, settings: dict | None = None):
        self.fn = fn
        self.settings = config.snapshot() if settings is None else dict(settings)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with config.applied(self.settings), worker_blas_threads():
            return self.fn(*args, **kwargs)

    def __dask_tokenize__(self) -> Any:
        from dask.base import tokenize

        return ("daskmeans-blas-capped", tokenize(self.fn), tokenize(sorted(self.settings.items())))

    def __reduce__(self):
        return (blas_capped, (self.fn, self.settings))
