"""Which chunks live where: persisted row chunks grouped into one shard per worker.

The engine must not pay one task per chunk per iteration (each task costs the scheduler's
time: docs/performance.md, "Dask facts"). After the data
is persisted, each worker's local chunks are grouped into one :class:`Shard` (the worker's
rank in the loop), built by a task pinned to that worker. A shard holds the worker's blocks
(copied only where a block is not already contiguous and aligned for the kernels); the loop's
one long task per worker then runs over its blocks (:mod:`daskmeans.engine.loop`).

Balance: rows are spread evenly over the workers; data whose whole chunks cannot be shared
out within 2% (one large chunk, or 15 chunks on 2 workers) is cut into equal chunks first
(:func:`daskmeans.engine.plan.balance_chunks`), so that no worker waits on another because of chunk sizes.

Data a reader opened from a file (its array's ``RowSource``) is not persisted: each shard's
task reads its chunks on its worker, several threads filling the memory the rows are kept in
(:mod:`daskmeans.engine.reading`); data in memory, and arrays derived from a file, are
persisted and grouped as above.

What a shard keeps of its chunks and how it yields them in a pass are its tier's
(:mod:`daskmeans.engine.tiers`); the waits that see a lost worker are
:mod:`daskmeans.engine.watch`'s; the wrapper every task on a shard runs in is
:mod:`daskmeans.engine.task`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import dask.array as da
import numpy as np
from dask.sizeof import sizeof
from distributed import Client, futures_of

from .. import config
from ..backends import backend_name, get_backend
from ..errors import InputChanged
from ..events import advance
from ..io.blocks import rows_of
from ..io.ranges import on_cores
from . import tiers
from .owned import balance_owners, own_keys
from .plan import balance_chunks
from .reading import host_peers, read_blocks, read_threads, threads_setting
from .task import unique_key
from .tiers import Tier
from .watch import WorkerLost, some_workers, wait_on_cluster, watch


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
    tier : Tier (or its registered name, turned into the object)
        What the shard keeps and how it yields its blocks (:mod:`daskmeans.engine.tiers`):
        ``device``, chunks resident as backend arrays (for NumPy, host memory); ``host``,
        resident in pinned host memory, copied to the GPU chunk by chunk each pass;
        ``storage``, re-read from the source each pass, read ahead by a thread.
    blocks : list of arrays, or None
        The resident chunks (a tier whose ``resident`` is true).
    readers : list, or None
        The chunk readers of a tier that keeps no rows (``Tier.readers``).
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
    tier: Tier
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
    # The worker's reading threads (daskmeans.read-threads: its cores shared among the
    # workers of its host), for the reads of a file in placement and in the storage tier's passes.
    read_threads: int = 1
    # The storage tier's host buffers, each [buffer, locked], kept from one pass to the next
    # (engine.reading.stream_chunks).
    buffers: list = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.tier = tiers.get(self.tier)

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
        ws = self.weights or [None] * len(self.chunk_ids)
        # Resident blocks are checked once, before the first pass; a tier that reads its
        # chunks again checks each as it is read (Tier.stream).
        if self.tier.resident and not self.pinned:
            self.pin_resident()
        yield from zip(self.chunk_ids, self.offsets, self.tier.stream(self), ws)

    def expect(self, pins: dict | None) -> None:
        """Check this shard's chunks against the client's ``pins`` (a shard made again by
        Dask's lineage, after its worker was lost, was made without them)."""
        for cid in self.chunk_ids:
            if pins and cid in pins and cid not in self.pins:
                self.pins[cid] = pins[cid]
                self.pinned = False

    def pin_resident(self) -> None:
        """Pin (or check) every resident block, where it lives: host memory's several at once
        (XXH3 releases the GIL), a device's on the device."""
        be = get_backend(self.tier.resident_backend(self.backend))  # the backend of the blocks as held
        n = len(self.chunk_ids)
        if be.on_host and n > 1:
            on_cores(lambda j: self.check_pin(j, be, self.blocks[j]), range(n))
        else:
            for j in range(n):
                self.check_pin(j, be, self.blocks[j])
        self.pinned = True

    def check_pin(self, j: int, be: Any, block: Any) -> None:
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
                *arrays, tunables=None, threads=None) -> Shard:
    """The shard of a worker (a task on it): its chunks held (``tier.hold``) from the placed
    ``arrays`` (the first ``n_blocks``; the weights after them), or, where ``readers`` are
    given and the tier is resident, read from their file by the worker's reading pipeline
    (:func:`daskmeans.engine.reading.read_blocks`) straight into the memory they are kept in.
    ``threads``: ``(daskmeans.read-threads, workers on this host)``."""
    be = get_backend(backend)
    nthreads = read_threads(*threads) if threads is not None else 1
    if tier.resident and readers is not None:  # a file's chunks, read here
        on_host = get_backend(tier.resident_backend(backend)).on_host
        blocks = read_blocks(be, on_host, readers, n_features, dtype, nthreads)
        readers = None
    else:
        blocks = [tier.hold(be, a) for a in arrays[:n_blocks]] if tier.resident else None
    weights = [be.asarray(a) for a in arrays[n_blocks:]] or None
    return Shard(tuple(chunk_ids), tuple(offsets), tuple(rows), n_features, np.dtype(dtype), backend, tier,
                 blocks, readers, weights, pins=dict(pins or {}), tunables=tunables, read_threads=nthreads)


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
    tier: Tier = tiers.device.TIER  # or a registered name, turned into its object
    # The collective chosen for these ranks, by the name asked for (asking the workers costs
    # round trips: each run of a fit, and each re-fit of kept data, asks once per placement).
    collectives: dict = field(default_factory=dict, compare=False, repr=False)
    # Each chunk's pin once a pass has read it (``Shard.pins``): a placement made again gives
    # them to its shards, so that a chunk read again from the source is checked.
    pins: dict | None = field(default=None, compare=False, repr=False)
    # The in-memory chunks scattered for it (engine/owned.py): kept while the shards may need
    # to be made again from them.
    sources: list = field(default_factory=list, compare=False, repr=False)

    # The rows placed (a field, not a property: the loop, the inits and the driver read it often).
    n_samples: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        self.tier = tiers.get(self.tier)
        self.n_samples = int(sum(self.row_chunks))


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
    tier: str | Tier = tiers.device.TIER,
    *,
    balance: bool = True,
    pins: dict | None = None,
    tunables: Any = None,
    source: str | None = None,
) -> Placement:
    """Put ``X`` (and weights) on the cluster in ``tier`` and group chunks into one shard per
    worker.

    Parameters
    ----------
    client : distributed.Client
    X : dask array, shape (n, d), one chunk along columns
    backend : "numpy" or "cupy"
    sample_weight : dask array, shape (n,), chunked like X's rows, optional
    tier : str or Tier
        A registered tier's name or object (see :class:`Shard`; :func:`daskmeans.engine.plan.plan`
        chooses)
    balance : bool, default True
        Cut ``X`` first so that every worker gets a near-equal share (:func:`daskmeans.engine.plan.balance_chunks`).
        A fit balances once and places its chunks with ``False``, also again on the workers
        left after a loss: its chunking is fixed, so every statistic kept per chunk (the
        loop's inertia slots, the labels' layout) means the same before and after the loss.
    pins : dict of int to int, optional
        The chunks' pins from a pass over an earlier placement of the same chunks (see
        :class:`Shard`): the shards check their chunks against them.
    tunables : backends.protocol.Tunables, optional
        The kernels' settings (the plan's), which each shard's backend runs with.
    source : str, optional
        The file ``X`` was read from (the job's path; None: data in memory). Where ``X`` is
        the reader's array itself (its ``RowSource``: not a sample or rows scaled for the
        metric) and the tier resident, the shards' workers read their chunks from it
        (:mod:`daskmeans.engine.reading`) rather than the chunks being persisted.
    """
    tier = tiers.get(tier)
    X = X.rechunk({1: -1})
    if balance:
        X = balance_chunks(X, len(client.nthreads()))
    held = tier.resident_backend(backend_name(backend))  # None: the shards read their chunks each pass
    # A file a reader opened is read by each shard's worker, its reading threads filling the
    # memory the rows are kept in (engine/reading.py); other data is persisted and held.
    src = rows_of(X) if held is not None and source is not None else None
    persist_x = held is not None and src is None
    arrays = [to_backend(X, held)] if persist_x else []
    if sample_weight is not None:
        arrays.append(to_backend(sample_weight.rechunk((X.chunks[0],)), backend))
    # Under daskmeans' own keys (the user's keys, known to the scheduler with another run_spec,
    # made distributed warn on the user's next computation of X), and in-memory chunks
    # scattered rather than sent inside the graph (engine/owned.py).
    owned = [own_keys(a, client, scatter=True) for a in arrays]
    arrays, sources = [a for a, _ in owned], [f for _, fs in owned for f in fs]
    persisted = client.persist(arrays) if arrays else []
    xfuts = futures_of(persisted[0]) if persist_x else []
    wfuts = futures_of(persisted[-1]) if sample_weight is not None else None
    # Never forever: a lost scheduler, or no worker left, ends the wait in one line; a hung
    # worker is retired (its tasks run elsewhere).
    wait_on_cluster(client, xfuts + (wfuts or []), hung_after=config.get_seconds("collective-timeout"))
    # futures_of does not promise an order: index them by the block's key.
    by_key = {f.key: f for f in xfuts}
    xkeys = list(_row_keys(persisted[0])) if persist_x else [None] * X.numblocks[0]
    wkeys = list(_row_keys(persisted[-1])) if wfuts is not None else None
    wby_key = {f.key: f for f in wfuts} if wfuts is not None else {}
    who = client.who_has(list(by_key.values())) if by_key else {}
    # Where nothing was persisted (the shards read their files), no wait above saw the workers.
    nthreads = client.nthreads() or some_workers(client)

    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(int).tolist()
    holders = [sorted(who[key])[0] if key is not None and who.get(key) else None for key in xkeys]
    owner = balance_owners(holders, list(X.chunks[0]), dict.fromkeys(nthreads, 1))
    xf = [by_key[k] for k in xkeys] if persist_x else [None] * len(xkeys)
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
    setting = threads_setting()
    peers = host_peers(list(nthreads))
    for w, ids in groups:
        if src is not None:
            readers = [src.chunk(offsets[i], offsets[i] + rows[i]) for i in ids]
        else:
            readers = tier.readers(X, ids)
        args = [xf[i] for i in ids] if persist_x else []
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
                threads=(setting, peers.get(w, 1)),
                workers=[w],
                allow_other_workers=True,
                pure=False,
                key=unique_key("daskmeans-shard"),
            )
        )
    # A worker lost meanwhile is a WorkerLost (the fit places its data again), not a shard
    # made elsewhere: each rank's shard must live on its rank's worker.
    ranks = [w for w, _ in groups]

    def placed(status: list) -> None:
        # Chunks the shards read themselves are placed once their shard is: the command's
        # progress (persisted chunks were counted by wait_on_cluster).
        advance(sum(len(ids) for (_, ids), s in zip(groups, status) if s == "finished"), len(rows))

    watch(client, shards, ranks, fetch=False, hung_after=config.get_seconds("collective-timeout"),
          progress=None if persist_x else placed)
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


def _identity(x: Any) -> Any:
    return x


def _row_keys(x: da.Array) -> Sequence:
    keys = x.__dask_keys__()
    # 2-D: keys[i][0] is row block i (one column block); 1-D: keys[i].
    return [k[0] if isinstance(k, list) else k for k in keys]


