"""The sweep's scores on the cluster: the scored sample's rows taken from the data, the sample
shared with every worker once, and the silhouette's row sums of distances a block of rows per
task. No placement and no fit: the fits themselves run on a :class:`~daskmeans.engine.job.FitJob`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .task import blas_capped

# Rows of the sample per silhouette task: a (rows x sample) float64 block of distances (80 MB
# at the sweep's default sample) per task at once.
SCORE_BLOCK_ROWS = 1024


def block_sums(x: np.ndarray, lab: np.ndarray, k: int, start: int, stop: int) -> np.ndarray:
    """``out[i, j]`` for rows ``start:stop`` of ``x`` (n, d): the sum of Euclidean distances
    from row ``start + i`` to the rows of label ``j`` (float64, (stop - start, k)); a row's
    distance to itself is 0. One block of the silhouette's sums, on a worker or here."""
    sq = np.einsum("ij,ij->i", x, x)
    d = x[start:stop] @ x.T  # distances squared, built in place: one block-sized array
    d *= -2.0
    d += sq[start:stop, None]
    d += sq[None, :]
    np.maximum(d, 0.0, out=d)
    np.sqrt(d, out=d)
    d[np.arange(stop - start), np.arange(start, stop)] = 0.0
    onehot = np.zeros((len(x), k))
    onehot[np.arange(len(x)), lab] = 1.0
    return d @ onehot


def pairwise_sums(x: np.ndarray, labels: np.ndarray, k: int, client: Any = None, rows: Any = None,
                  block: int = SCORE_BLOCK_ROWS) -> np.ndarray:
    """``out[i, j]``: the sum of Euclidean distances from row ``i`` of ``x`` (n, d) to the rows
    of label ``j`` (n, k) float64, in blocks of ``block`` rows (never the whole n x n matrix):
    on the workers of ``client`` where given (``rows``: ``x`` shared with them, :func:`share`),
    a task per block (the same values, to the rounding of BLAS's threads)."""
    stops = [min(s + block, len(x)) for s in range(0, len(x), block)]
    starts = list(range(0, len(x), block))
    if client is None or rows is None:
        return np.concatenate([block_sums(x, labels, k, a, b) for a, b in zip(starts, stops)])
    m = len(starts)
    tag = os.urandom(6).hex()
    futs = client.map(blas_capped(block_sums), [rows] * m, [labels] * m, [k] * m, starts, stops, pure=False,
                      key=[f"daskmeans-silhouette-{tag}-{i}" for i in range(m)])
    return np.concatenate(client.gather(futs))


def share(client: Any, scored: np.ndarray, block: int = SCORE_BLOCK_ROWS) -> Any:
    """``scored`` (m, d) float64 on every worker of ``client`` once (a future to
    :meth:`release`), where the silhouette's sums run there (more than one ``block`` of
    rows); None where they run here."""
    return client.scatter(scored, broadcast=True, hash=False) if len(scored) > block else None


def sample_rows(client: Any, x: Any, idx: np.ndarray) -> Any:
    """Rows ``idx`` (sorted global indices) of the dask array ``x``: taken here from an array
    held in this process's memory (its graph only data: sending it to the cluster would send
    the whole array), else computed on the cluster under daskmeans' own keys
    (:mod:`daskmeans.engine.owned`: never a key of the user's graph)."""
    import dask

    from .owned import own_keys

    if in_memory(x):
        return dask.compute(x[idx], scheduler="sync")[0]
    owned, _ = own_keys(x)
    return client.compute(owned[idx]).result()


def in_memory(x: Any) -> bool:
    """Whether every node of the dask array ``x``'s graph is data (no task to run)."""
    from dask._task_spec import DataNode

    graph = x.__dask_graph__()
    return all(isinstance(v, DataNode) or type(v).__module__.startswith(("numpy", "cupy")) for v in dict(graph).values())
