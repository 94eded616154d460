"""What every init needs from the placed data: rows by global index, gathered from the
shards that hold them (the per-row draws that do not depend on the chunking are
:func:`daskmeans.numerics.hashing.row_uniforms`).

The inits submit their tasks on the shards through :data:`submit_per_shard` here (one place
to watch them: the fault tests kill a worker as the first of them starts) and wait for what
they make of them with :data:`result`: both are the engine's (:mod:`daskmeans.engine.task`),
so that a round's submissions and waits are one module's.
"""

from __future__ import annotations


import numpy as np
from distributed import Client

from ..engine.placement import Placement, Shard
from ..engine.task import result, submit_per_shard

__all__ = ["gather_rows", "result", "row_parts", "submit_per_shard", "take_rows"]


def _take_rows(shard: Shard, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host copies of the global ``rows`` (sorted) that fall in this shard."""
    be = shard.be
    idx, data = [], []
    for _, off, block, _ in shard.items():
        sel = rows[(rows >= off) & (rows < off + block.shape[0])]
        if len(sel):
            idx.append(sel)
            data.append(be.to_numpy(block[be.xp.asarray(sel - off)]))
    if not idx:
        return np.empty(0, np.int64), np.empty((0, shard.n_features))
    return np.concatenate(idx), np.concatenate(data).astype(np.float64)


def gather_rows(parts: list, rows: np.ndarray) -> np.ndarray:
    """The rows ``rows`` ``(m, d)``, in that order, from the shards' parts ``(indices, data)``."""
    idx = np.concatenate([p[0] for p in parts])
    data = np.concatenate([p[1] for p in parts])
    pos = np.argsort(idx, kind="stable")  # every row once: where each of ``rows`` sits in ``data``
    return data[pos[np.searchsorted(idx[pos], rows)]]


def row_parts(client: Client, placement: Placement, rows: np.ndarray) -> list:
    """Futures of each shard's share of ``rows`` (:func:`_take_rows`), for :func:`gather_rows`."""
    uniq = rows if bool(np.all(rows[1:] > rows[:-1])) else np.unique(rows)
    return submit_per_shard(client, placement, _take_rows, [uniq] * len(placement.shards), name="daskmeans-take-rows")


def take_rows(client: Client, placement: Placement, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (global indices, in the given order) as a float64 host array."""
    parts = row_parts(client, placement, rows)
    return result(client, placement, client.submit(gather_rows, parts, rows, pure=False))
