"""Synthetic data: Gaussian blobs generated chunk by chunk (any size, never whole in memory)."""

from __future__ import annotations

import dask.array as da
import numpy as np

from .errors import InvalidParameterError
from .io.readers import rows_per_chunk


def _blob_block(block_id_info, centers, std, seed, dtype, rows):
    i = block_id_info["chunk-location"][0]
    n = block_id_info["chunk-shape"][0]
    rng = np.random.default_rng([seed, i])
    lab = rng.integers(0, centers.shape[0], n)
    x = centers[lab] + std * rng.standard_normal((n, centers.shape[1]))
    return x.astype(dtype)


def make_blobs(
    n_samples: int,
    n_features: int,
    centers: int,
    *,
    cluster_std: float = 1.0,
    center_box: tuple[float, float] = (-10.0, 10.0),
    random_state: int = 0,
    dtype: str = "float32",
    chunk_rows: int | None = None,
) -> tuple[da.Array, np.ndarray]:
    """Isotropic Gaussian blobs as a lazy Dask array.

    Returns
    -------
    X : dask array, shape (n_samples, n_features); block ``i`` is drawn from the seed
        ``(random_state, i)`` so any block can be regenerated alone.
    centers : ndarray, shape (centers, n_features), float64
    """
    for name, v in (("n", n_samples), ("d", n_features), ("centers", centers)):
        if int(v) < 1:
            raise InvalidParameterError(f"{name}={v} should be >= 1")
    if cluster_std < 0:
        raise InvalidParameterError(f"std={cluster_std} should be >= 0")
    c = np.random.default_rng(random_state).uniform(*center_box, size=(centers, n_features))
    rows = chunk_rows or rows_per_chunk(n_features, np.dtype(dtype).itemsize)
    x = da.map_blocks(
        lambda block_info=None: _blob_block(block_info[None], c, cluster_std, random_state, dtype, rows),
        chunks=(da.core.normalize_chunks(rows, (n_samples,))[0], (n_features,)),
        dtype=dtype,
        meta=np.empty((0, 0), dtype),
    )
    return x, c
