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

__all__ = ["gather_rows", "result", "row_parts", "rows_by_chunk", "shard_rows", "submit_per_shard", "take_rows"]


def chunk_rows(shard: Shard, picks: dict, host: bool = True) -> dict:
    """Copies of chosen rows of chosen chunks, read without a pass over the shard's other
    chunks (:meth:`~daskmeans.engine.tiers.base.Tier.take`: the storage tier reads only those
    chunks; a resident tier indexes its blocks where they are).

    Parameters
    ----------
    shard : Shard
    picks : dict of int to int64 ndarray (m_j,)
        Local row indices per chunk index ``j`` of the shard.
    host : bool
        Host NumPy arrays (True), or where the tier holds the rows (a device tier's on its
        device; the others' on the host).

    Returns
    -------
    dict of int to ndarray (m_j, d), the shard's dtype
    """
    if not picks:
        return {}
    if shard.tier.resident and not shard.pinned:  # as a pass would: check the blocks before use
        shard.pin_resident()
    return shard.tier.take(shard, picks, host=host)


def rows_by_chunk(shard: Shard, rows: np.ndarray) -> dict:
    """The global ``rows`` (sorted) that fall in this shard, as ``{chunk index: local rows}``
    for the chunks that hold some of them: each chunk's by two binary searches (not a scan of
    every row per chunk: AFK-MC²'s proposals are up to millions of rows, a shard's chunks
    hundreds)."""
    rows = np.asarray(rows)
    picks = {}
    for j, (off, n) in enumerate(zip(shard.offsets, shard.rows)):
        a, b = np.searchsorted(rows, [off, off + n])
        if b > a:
            picks[j] = rows[a:b] - off
    return picks


def shard_rows(shard: Shard, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host copies of the global ``rows`` (sorted) that fall in this shard; only the chunks
    that hold some of them are read."""
    picks = rows_by_chunk(shard, rows)
    if not picks:
        return np.empty(0, np.int64), np.empty((0, shard.n_features))
    got = chunk_rows(shard, picks)
    idx = np.concatenate([shard.offsets[j] + picks[j] for j in sorted(picks)])
    return idx, np.concatenate([got[j] for j in sorted(picks)]).astype(np.float64)


def gather_rows(parts: list, rows: np.ndarray) -> np.ndarray:
    """The rows ``rows`` ``(m, d)``, in that order, from the shards' parts ``(indices, data)``."""
    idx = np.concatenate([p[0] for p in parts])
    data = np.concatenate([p[1] for p in parts])
    pos = np.argsort(idx, kind="stable")  # every row once: where each of ``rows`` sits in ``data``
    return data[pos[np.searchsorted(idx[pos], rows)]]


def row_parts(client: Client, placement: Placement, rows: np.ndarray) -> list:
    """Futures of each shard's share of ``rows`` (:func:`shard_rows`), for :func:`gather_rows`."""
    uniq = rows if bool(np.all(rows[1:] > rows[:-1])) else np.unique(rows)
    return submit_per_shard(client, placement, shard_rows, [uniq] * len(placement.shards), name="daskmeans-take-rows")


def take_rows(client: Client, placement: Placement, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (global indices, in the given order) as a float64 host array."""
    parts = row_parts(client, placement, rows)
    return result(client, placement, client.submit(gather_rows, parts, rows, pure=False))
