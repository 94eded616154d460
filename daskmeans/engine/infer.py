"""Inference with fitted centroids: labels, distances and inertia of new rows, block by block.

What ``KMeans.predict``, ``transform`` and ``score`` run: one task per row chunk of ``X``
(no placement, no collective: each block needs only the centroids), with BLAS capped to the
worker's threads. Results are lazy Dask arrays of NumPy blocks; :func:`materialise` computes
one through the given client when the caller's input was in memory. The kernels' settings
(``Tunables``: tile bytes, GEMM modes) are resolved here on the client and travel in the graph
with each block's task, as a fit's travel with its shards.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
from distributed import Client

from ..backends import backend_name, get_backend
from ..dask_cluster import resolve_backend
from ..errors import DataError
from ..metric import get_metric
from ..numerics.grid import check_range
from .placement import to_backend
from .plan import kernel_tunables
from .task import blas_capped


def blocks(client: Client, x: da.Array, requested: str, metric: str) -> da.Array:
    """``x`` (n, d) ready for the kernels: finite rows, within the distances' range, checked as
    each block is computed, rows as ``metric`` takes them (unit rows for cosine), blocks on the
    backend ``requested`` resolves to on ``client``'s workers (``"auto"``: the data's, else the
    workers' kind)."""
    # As in fit: a NaN or infinite row has no nearest centroid (and the GPU kernels' top-2
    # states would keep no index for it), and a row whose squared norm can overflow the
    # distances' dtype would be ranked by overflowed values.
    x = x.map_blocks(_finite_rows, dtype=x.dtype, meta=x._meta)
    x = get_metric(metric).rows(x)
    return to_backend(x, resolve_backend(client, requested, backend_name(x)))


def labels(x: da.Array, centers: np.ndarray, precision: str) -> da.Array:
    """Nearest-centroid labels (n,) int32 of :func:`blocks`' ``x`` under ``centers`` (k, d)."""
    return x.map_blocks(blas_capped(_predict_block), centers, precision, kernel_tunables(), drop_axis=1, dtype=np.int32,
                        meta=np.empty(0, np.int32))


def distances(x: da.Array, centers: np.ndarray, metric: str) -> da.Array:
    """Distances (n, k) in ``x``'s dtype from each row to each of ``centers`` (k, d), as
    ``metric`` defines them (Euclidean, or ``1 - cos``)."""
    k = int(centers.shape[0])
    return x.map_blocks(blas_capped(_transform_block), centers, metric, kernel_tunables(), chunks=(x.chunks[0], (k,)),
                        dtype=x.dtype, meta=np.empty((0, 0), x.dtype))


def inertia(client: Client, x: da.Array, centers: np.ndarray, precision: str, w: da.Array | None = None) -> float:
    """The sum over rows of the squared distance (n,) to the nearest of ``centers`` (k, d),
    each weighted by ``w`` (n,) where given, added in chunk order, computed on ``client``."""
    chunks = ((1,) * x.numblocks[0], (1,))
    tunables = kernel_tunables()
    if w is None:
        parts = x.map_blocks(blas_capped(_inertia_block), centers, precision, tunables, chunks=chunks, dtype=np.float64,
                             meta=np.empty((0, 0)))
    else:
        w = w.rechunk((x.chunks[0],))[:, None]  # (n, 1): blocks aligned with x's
        parts = da.map_blocks(blas_capped(_inertia_block_weighted), x, w, centers, precision, tunables, chunks=chunks,
                              dtype=np.float64, meta=np.empty((0, 0)))
    return float(parts.sum().compute(scheduler=client))


def materialise(client: Client, result: da.Array, like: Any) -> Any:
    """``result`` computed on ``client`` as an array of ``like``'s kind (NumPy, or CuPy for
    CuPy ``like``) when ``like`` is in memory; the lazy ``result`` itself when ``like`` is a
    Dask collection or a path (data that may not fit the client's memory)."""
    import dask

    if dask.is_dask_collection(like) or isinstance(like, (str, bytes)) or hasattr(like, "__fspath__"):
        return result
    return get_backend(like).asarray(result.compute(scheduler=client))


def _finite_rows(block, block_info=None):
    """``block`` itself; a row with a NaN or infinity is a DataError naming its global index,
    and values whose squared row norms can overflow the distances' dtype one as fit's
    (:func:`~daskmeans.numerics.grid.check_range` of the block's largest values)."""
    be = get_backend(block)
    block = be.asarray(block)  # on this task's device (a chunk may come from another GPU of the process)
    xp = be.xp
    if block.shape[0] == 0:
        return block
    # each feature's largest |value| without a block-sized copy (NaN or infinity where a row has one)
    top = np.maximum(be.to_numpy(block.max(axis=0)), -be.to_numpy(block.min(axis=0))).astype(np.float64)
    if not np.isfinite(top).all():
        bad = xp.flatnonzero(~xp.isfinite(block).all(axis=1))
        offset = block_info[0]["array-location"][0][0] if block_info and block_info.get(0) else 0
        raise DataError(f"X contains NaN or infinity (first at row {int(bad[0]) + offset}); clean or drop those rows")
    check_range(top, block.dtype)
    return block


def _prep(block, centers, precision, tunables):
    """The block's backend with the client's kernel settings bound, the block on this task's
    device (:func:`_finite_rows`' may have run on another worker's GPU of the same process), and
    ``centers`` prepared."""
    be = get_backend(block, tunables)
    return be, be.asarray(block), be.prepare(centers, block.dtype, precision)


def _predict_block(block, centers, precision, tunables):
    be, block, p = _prep(block, centers, precision, tunables)
    return be.to_numpy(be.assign(block, p, want_sums=False)["labels"])


def _transform_block(block, centers, metric, tunables):
    be, block, p = _prep(block, centers, "fp32", tunables)
    d2 = be.to_numpy(_exact_near_zero(be, block, centers, be.sqdistances(block, p)))
    out = get_metric(metric).distances(d2)
    return out.astype(block.dtype, copy=False)  # computed in float64, given in X's dtype (as scikit-learn)


def _exact_near_zero(be, block, centers, d2):
    """``d2`` (n, k) with the entries the GEMM expansion ``|x|^2 - 2 x.c + |c|^2`` cannot tell
    from 0 recomputed as ``sum((x - c)^2)`` in float64: its cancellation leaves an error of a
    few ulps of ``|x|^2 + |c|^2``, whose square root (a row at a centroid: 8e-8 instead of 0 in
    float64) is no distance. Such entries are rare (rows at or next to a centroid)."""
    xp = be.xp
    n, d = block.shape
    if n == 0:
        return d2
    c64 = xp.asarray(centers, dtype=xp.float64)
    xx = (block * block).sum(axis=1, dtype=xp.float64)
    cc = (c64 * c64).sum(axis=1)
    bound = (4 * d * float(np.finfo(block.dtype).eps)) * (xx[:, None] + cc[None, :])
    rows, cols = xp.nonzero(d2 <= bound)
    if rows.size:
        diff = block[rows].astype(xp.float64) - c64[cols]
        d2[rows, cols] = (diff * diff).sum(axis=1)
    return d2


def _inertia_block(block, centers, precision, tunables):
    be, block, p = _prep(block, centers, precision, tunables)
    return np.array([[float(be.assign(block, p, want_sums=False)["inertia"])]])


def _inertia_block_weighted(block, w, centers, precision, tunables):
    be, block, p = _prep(block, centers, precision, tunables)
    weights = be.asarray(w[:, 0]).astype(block.dtype)  # as the fit's kernels take sample weights
    return np.array([[float(be.assign(block, p, weights, want_sums=False)["inertia"])]])
