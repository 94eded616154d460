"""Training on a sample (FAISS's ``max_points_per_centroid``): which rows a fit keeps, the
sample as a Dask array, and the pass over every row once the centroids are fitted.

Row ``i`` draws ``u_i`` from :func:`daskmeans.numerics.hashing.row_uniforms` (a counter-based
generator jumped to the row, keyed by the seed), and the sample is the ``m`` rows of smallest
``(u_i, i)``: a function of the seed, ``n`` and ``m`` alone, so the same rows for any
chunking and worker count. The cut (the ``m``-th smallest pair) is found without sorting all
``n`` draws: each chunk counts its draws below ``lo`` and returns only those in ``[lo, hi)``,
a band of a few ``sqrt(m)`` around ``m / n`` that holds the cut (widened and drawn again in
the rare case it does not).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
from distributed import Client

from .backends import get_backend
from .metric import inertia_scale
from .engine.task import blas_capped
from .numerics.hashing import row_uniforms

# The Philox stream of the sample's draws, apart from the inits' streams (small integers).
SAMPLE_STREAM = 0x73616D706C65  # "sample"

# Half-width of the first band around m / n, in standard deviations of the count below it.
_BAND_SIGMAS = 8.0


@dataclass(frozen=True)
class Cut:
    """The last kept row of a sample: row ``i`` is kept when ``(u_i, i) <= (u, row)``.

    Attributes
    ----------
    seed : int
        The key of the rows' draws.
    u : float
        The ``m``-th smallest draw.
    row : int
        Its row (the tie-break between equal draws).
    counts : tuple of int, one per row chunk
        Rows kept in each chunk of the array the cut was drawn for.
    """

    seed: int
    u: float
    row: int
    counts: tuple[int, ...]


def sample_size(n_samples: int, n_clusters: int, per_cluster: int | None) -> int | None:
    """Rows a fit trains on: ``per_cluster * n_clusters`` where that is fewer than
    ``n_samples``; None (every row) otherwise or when ``per_cluster`` is None."""
    if per_cluster is None or n_samples <= per_cluster * n_clusters:
        return None
    return int(per_cluster) * int(n_clusters)


def kept(u: np.ndarray, rows: np.ndarray, cut: Cut) -> np.ndarray:
    """Which of the draws ``u`` (r,) of global ``rows`` (r,) the sample keeps (bool (r,))."""
    return (u < cut.u) | ((u == cut.u) & (rows <= cut.row))


def _band(seed: int, start: int, size: int, lo: float, hi: float) -> tuple[int, np.ndarray, np.ndarray]:
    """The rows ``start .. start + size - 1``: how many draw below ``lo``, and the draws
    (float64) and rows (int64) of those in ``[lo, hi)``."""
    u = row_uniforms(seed, SAMPLE_STREAM, start, size)
    inside = np.flatnonzero((u >= lo) & (u < hi))
    return int(np.count_nonzero(u < lo)), u[inside], inside.astype(np.int64) + start


def draw_cut(client: Client, row_chunks: tuple[int, ...], m: int, seed: int) -> Cut:
    """The cut that keeps ``m`` of the ``sum(row_chunks)`` rows, drawn from ``seed``.

    Parameters
    ----------
    client : distributed.Client
        Where each chunk's draws are made (one task per chunk; no data is read).
    row_chunks : tuple of int
        Rows per chunk of the array to sample, in order.
    m : int
        Rows to keep, ``1 <= m <= n``.
    seed : int
        Key of the draws, in ``[0, 2**64)``.

    Returns
    -------
    Cut
        The same ``(u, row)`` for any ``row_chunks`` of the same total; ``counts`` per chunk.
    """
    n = int(sum(row_chunks))
    if not 1 <= m <= n:
        raise ValueError(f"m={m} should be from 1 to n_samples={n}")
    starts = np.concatenate([[0], np.cumsum(row_chunks)[:-1]]).astype(np.int64)
    half = (_BAND_SIGMAS * math.sqrt(m * (1.0 - m / n)) + _BAND_SIGMAS) / n
    lo, hi = max(0.0, m / n - half), min(1.0, m / n + half)
    while True:
        tag = uuid.uuid4().hex
        futs = [client.submit(_band, seed, int(s), int(r), lo, hi, key=f"daskmeans-sample-{tag}-{i}")
                for i, (s, r) in enumerate(zip(starts, row_chunks))]
        parts = client.gather(futs)
        below = sum(p[0] for p in parts)
        inside = sum(len(p[1]) for p in parts)
        width = max(hi - lo, 1.0 / n)
        if below >= m:  # the band sits above the cut: move it down (about never)
            lo, hi = max(0.0, lo - 4 * width), lo
        elif below + inside < m:  # below it
            lo, hi = hi, min(1.0, hi + 4 * width)
        else:
            break
    u = np.concatenate([p[1] for p in parts])
    rows = np.concatenate([p[2] for p in parts])
    last = np.lexsort((rows, u))[m - below - 1]  # by draw, ties by row
    cut = Cut(int(seed), float(u[last]), int(rows[last]), ())
    counts = tuple(p[0] + int(np.count_nonzero(kept(p[1], p[2], cut))) for p in parts)
    return Cut(cut.seed, cut.u, cut.row, counts)


def _select(block: Any, cut: Cut, block_info: dict | None = None) -> Any:
    """The rows of ``block`` (a chunk of rows, 1-D or 2-D) that ``cut`` keeps, in order."""
    start = block_info[0]["array-location"][0][0]
    keep = kept(row_uniforms(cut.seed, SAMPLE_STREAM, start, block.shape[0]),
                np.arange(start, start + block.shape[0], dtype=np.int64), cut)
    return block[get_backend(block).xp.asarray(np.flatnonzero(keep))]


def take(x: da.Array, cut: Cut) -> da.Array:
    """The rows of ``x`` (n, ...) that ``cut`` keeps, in their order: a lazy Dask array
    (m, ...) whose chunks are ``x``'s less the rows left out (chunks left empty dropped)."""
    if len(cut.counts) != x.numblocks[0]:
        raise ValueError(f"the cut was drawn for {len(cut.counts)} chunks, x has {x.numblocks[0]}")
    out = x.map_blocks(_select, cut, chunks=(cut.counts,) + x.chunks[1:], dtype=x.dtype, meta=x._meta)
    nonempty = [j for j, c in enumerate(cut.counts) if c]
    return da.concatenate([out.blocks[j] for j in nonempty]) if len(nonempty) < len(cut.counts) else out


def sample_rows(n_samples: int, m: int, seed: int) -> np.ndarray:
    """The kept rows' global indices (m,) int64, ascending, drawn on this process from all
    ``n_samples`` draws at once: the rule :func:`draw_cut` follows, for small data and tests."""
    u = row_uniforms(seed, SAMPLE_STREAM, 0, n_samples)
    return np.sort(np.lexsort((np.arange(n_samples), u))[:m]).astype(np.int64)


def _all_rows_block(block: Any, weights: Any, centers: np.ndarray, precision: str) -> np.ndarray:
    """``[inertia, count_0, ..., count_{K-1}]`` (1, K + 1) float64 of one chunk under ``centers``
    (K, d): the chunk's (weighted) sum of squared distances and its rows per cluster."""
    be = get_backend(block)
    block = be.asarray(block)  # on this task's device (a chunk may come from another GPU of the process)
    p = be.prepare(centers, block.dtype, precision)
    w = None if weights is None else be.asarray(weights.reshape(-1))
    out = be.assign(block, p, sample_weight=w, want_sums=False)
    counts = be.to_numpy(be.label_counts(out["labels"], centers.shape[0]))
    return np.concatenate([[float(out["inertia"])], counts.astype(np.float64)])[None, :]


def all_rows_stats(client: Client, x: da.Array, w: da.Array | None, centers: np.ndarray, precision: str,
                   metric: str) -> tuple[float, np.ndarray]:
    """Inertia and cluster sizes of every row of ``x`` under the fitted ``centers``.

    Parameters
    ----------
    client : distributed.Client
    x : dask array (n, d)
        Rows as the kernels take them (``engine.infer.blocks``).
    w : dask array (n,), optional
        The rows' weights (``x``'s row chunks).
    centers : ndarray (K, d) float64
    precision : str
        GEMM precision (labels are exact in every precision).
    metric : str
        The inertia is in the metric's units (``1 - cos`` for cosine).

    Returns
    -------
    inertia : float
        The weighted sum over rows of the squared distance to the nearest centroid (per
        chunk, then added by Dask's reduction tree: fixed for a given chunking).
    sizes : ndarray (K,) int64
        Rows per cluster.
    """
    k = int(centers.shape[0])
    x = x.rechunk({1: -1})
    fn = blas_capped(_all_rows_block)
    chunks = ((1,) * x.numblocks[0], (k + 1,))
    if w is None:
        parts = x.map_blocks(fn, None, centers, precision, chunks=chunks, dtype=np.float64, meta=np.empty((0, 0)))
    else:
        w = w.rechunk((x.chunks[0],))
        parts = da.map_blocks(fn, x, w[:, None], centers, precision, chunks=chunks, dtype=np.float64,
                              meta=np.empty((0, 0)))
    # Summed on the cluster (K + 1 values come back, not one row per chunk); the counts are
    # integers far below 2**53, exact in float64.
    total = np.asarray(client.compute(parts.sum(axis=0)).result())
    return float(total[0]) * inertia_scale(metric), np.rint(total[1:]).astype(np.int64)
