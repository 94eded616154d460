"""Which chunks live where: persisted row chunks grouped into one shard per worker.

The engine must not pay one task per chunk per iteration (~1 ms each in Dask). After the data
is persisted, each worker's local chunks are grouped into one :class:`Shard` (the worker's
rank in the loop), built by a task pinned to that worker. A shard holds the worker's blocks
(copied only where a block is not already contiguous and aligned for the kernels); the loop's
one long task per worker then runs over its blocks (:mod:`daskmeans.engine.loop`).

Balance: rows are spread evenly over the workers, and data of fewer chunks than workers is
split first (into ``daskmeans.min-chunks``), so that no worker sits idle because the data
came as one large chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import dask.array as da
import numpy as np
from dask.sizeof import sizeof
from distributed import Client, futures_of, wait

from . import config
from .backends import get_backend


@dataclass
class Shard:
    """A worker-local run of row chunks, in global chunk order.

    Attributes
    ----------
    chunk_ids : tuple of int
        Global index of each block along the row axis.
    offsets : tuple of int
        Global row offset of each block.
    blocks : list of arrays, each shape (n_i, d)
        The data, as the backend's arrays (NumPy or CuPy).
    weights : list of arrays, each shape (n_i,), or None
        Sample weights aligned with ``blocks``.
    """

    chunk_ids: tuple[int, ...]
    offsets: tuple[int, ...]
    blocks: list
    weights: list | None = None
    # Workspace: the labels of Lloyd step i in ``labels[i % 2]`` (a list per block). Kept
    # here rather than in a task result so that only the small partial sums travel to the
    # reduction (a result carrying labels would be serialized whole). Two slots, because the
    # engine may run step i+1 speculatively while step i's outcome is still being decided:
    # a re-run of step i+1 then still finds step i's labels. Lost if the shard is recomputed
    # or spilled; the engine then counts every row of the shard as reassigned.
    labels: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(sum(b.shape[0] for b in self.blocks))

    def items(self):
        """Yield ``(chunk_id, row_offset, block, weights_or_None)`` in order."""
        ws = self.weights or [None] * len(self.blocks)
        yield from zip(self.chunk_ids, self.offsets, self.blocks, ws)


@sizeof.register(Shard)
def _sizeof_shard(s: Shard) -> int:
    return int(sum(sizeof(b) for b in s.blocks) + sum(sizeof(w) for w in (s.weights or [])))


def _make_shard(chunk_ids, offsets, n_blocks, *arrays) -> Shard:
    # The backend's asarray makes each block contiguous and aligned, once, for the kernels.
    blocks = [get_backend(a).asarray(a) for a in arrays[:n_blocks]]
    weights = [get_backend(a).asarray(a) for a in arrays[n_blocks:]] or None
    return Shard(tuple(chunk_ids), tuple(offsets), blocks, weights)


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

    @property
    def n_samples(self) -> int:
        return int(sum(self.row_chunks))


def to_backend(X: da.Array, backend: str) -> da.Array:
    """Map every block onto the backend's device arrays (a no-op for matching blocks)."""
    be = get_backend(backend)
    if get_backend(X).name == be.name:
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
) -> Placement:
    """Persist ``X`` (and weights) on the cluster and group chunks into per-thread shards.

    Parameters
    ----------
    client : distributed.Client
    X : dask array, shape (n, d), one chunk along columns
    backend : "numpy" or "cupy"
    sample_weight : dask array, shape (n,), chunked like X's rows, optional
    """
    X = to_backend(balance_chunks(X.rechunk({1: -1}), len(client.nthreads())), backend)
    arrays = [X] if sample_weight is None else [X, to_backend(sample_weight.rechunk((X.chunks[0],)), backend)]
    persisted = client.persist(arrays)
    xfuts = futures_of(persisted[0])
    wfuts = futures_of(persisted[1]) if sample_weight is not None else None
    with client.as_current():  # wait() would use the default client, maybe another one
        wait(xfuts + (wfuts or []))
    # futures_of does not promise an order: index them by the block's key.
    by_key = {f.key: f for f in xfuts}
    xkeys = list(_row_keys(persisted[0]))
    wkeys = list(_row_keys(persisted[1])) if wfuts is not None else None
    wby_key = {f.key: f for f in wfuts} if wfuts is not None else {}
    who = client.who_has(list(by_key.values()))
    nthreads = client.nthreads()

    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(int).tolist()
    holders = [sorted(who[key])[0] if who.get(key) else None for key in xkeys]
    owner = _balance(holders, list(X.chunks[0]), dict.fromkeys(nthreads, 1))
    xf = [by_key[k] for k in xkeys]
    wf = [wby_key[k] for k in wkeys] if wkeys is not None else None
    for i, w in enumerate(owner):
        if w != holders[i]:  # move the chunk: one transfer, once per fit
            xf[i] = client.submit(_identity, xf[i], workers=[w], allow_other_workers=False, pure=False)
            if wf is not None:
                wf[i] = client.submit(_identity, wf[i], workers=[w], allow_other_workers=False, pure=False)
    per_worker: dict[str, list[int]] = {}
    for i, w in enumerate(owner):
        per_worker.setdefault(w, []).append(i)

    # One shard (one rank of the loop) per worker, ranks ordered by their first chunk.
    groups = sorted(per_worker.items(), key=lambda g: g[1][0])

    shards = []
    for w, ids in groups:
        args = [xf[i] for i in ids]
        if wf is not None:
            args += [wf[i] for i in ids]
        shards.append(
            client.submit(
                _make_shard,
                ids,
                [offsets[i] for i in ids],
                len(ids),
                *args,
                workers=[w],
                allow_other_workers=False,
                pure=False,
                key=f"daskmeans-shard-{_token()}",
            )
        )
    with client.as_current():
        wait(shards)
    return Placement(
        shards=shards,
        workers=[w for w, _ in groups],
        chunk_ids=[tuple(ids) for _, ids in groups],
        row_chunks=tuple(int(c) for c in X.chunks[0]),
        n_features=int(X.shape[1]),
        dtype=np.dtype(X.dtype),
        backend=get_backend(backend).name,
    )


def balance_chunks(X: da.Array, n_workers: int) -> da.Array:
    """``X`` split so that each of ``n_workers`` workers gets rows: data of fewer chunks than
    workers becomes ``max(n_workers, daskmeans.min-chunks)`` chunks (of at least
    ``daskmeans.min-chunk-rows`` rows); otherwise unchanged.

    Chunks are not split further: every kernel call has a fixed cost (measured: a 3e5 x 408,
    K = 5000 step on an H200 took 16 ms as one block and 31 ms as 16), and results are bitwise
    the same for any number of workers for a given chunking (engine.exact)."""
    if X.numblocks[0] >= n_workers:
        return X
    n = int(X.shape[0])
    target = min(max(n_workers, int(config.get("min-chunks"))), max(1, n // max(1, int(config.get("min-chunk-rows")))))
    if X.numblocks[0] >= target:
        return X
    return X.rechunk({0: -(-n // target)})


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


def submit_per_shard(client: Client, placement: Placement, fn, *args_per_shard: Sequence, name: str, **kwargs) -> list:
    """Submit ``fn(shard, *extra)`` once per shard on the shard's worker; returns futures."""
    futs = []
    for i, (shard, w) in enumerate(zip(placement.shards, placement.workers)):
        extra = [a[i] for a in args_per_shard]
        futs.append(
            client.submit(
                fn,
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
