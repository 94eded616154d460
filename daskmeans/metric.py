"""Distance metrics, as objects with the hooks a fit calls, registered by name (:data:`REGISTRY`).

``"euclidean"`` is plain k-means; ``"cosine"`` is spherical k-means: rows are scaled to unit
norm once, centroids are renormalised after every update, and the reported inertia is the sum
of cosine distances ``1 - cos(x, c) = ||x - c||^2 / 2`` (for unit vectors), so the kernels are
the Euclidean ones for both metrics. A new metric is one :class:`Metric` subclass and one
registry entry (the estimator's ``metric=`` values and the command's ``--metric`` choices
come from :data:`REGISTRY`).
"""

from __future__ import annotations

from typing import Any


import numpy as np

from .backends import get_backend
from . import options
from .errors import DataError


def inertia_scale(metric: str) -> float:
    """Factor from summed squared Euclidean distances to the metric's inertia."""
    return get_metric(metric).inertia_scale


def _nonzero_norms(a: Any, what: str, offset: int = 0) -> Any:
    """Float64 Euclidean norms of the rows of ``a`` (n, d); a zero row is a DataError naming
    its index (plus ``offset``, the block's first global row)."""
    xp = get_backend(a).xp
    norm = xp.sqrt((a.astype(xp.float64) ** 2).sum(axis=1))
    zero = xp.flatnonzero(norm == 0)
    if zero.size:
        raise DataError(f"metric='cosine' needs {what} of nonzero norm; row {int(zero[0]) + offset} is all zeros")
    return norm


def _unit_rows(block: Any, block_info: Any = None) -> Any:
    offset = block_info[0]["array-location"][0][0] if block_info is not None and block_info.get(0) else 0
    return (block / _nonzero_norms(block, "rows", offset)[:, None]).astype(block.dtype)


def unit_rows(X: "da.Array") -> "da.Array":
    """Rows of ``X`` (n, d) scaled to unit Euclidean norm (lazy; zero rows raise DataError)."""
    return X.map_blocks(_unit_rows, dtype=X.dtype, meta=X._meta)


def unit_centroids(c: Any, fallback: Any = None) -> Any:
    """Rows of ``c`` (K, d) scaled to unit norm; a zero row takes ``fallback``'s row (or stays)."""
    xp = get_backend(c).xp
    norm = xp.sqrt((c * c).sum(axis=1))
    ok = norm > 0
    out = c / xp.where(ok, norm, 1.0)[:, None]
    if fallback is not None:
        out = xp.where(ok[:, None], out, fallback)
    return out


def check_unit_init(c: np.ndarray) -> np.ndarray:
    """An explicit cosine init: rows scaled to unit norm; zero rows are an error."""
    return c / _nonzero_norms(c, "init rows")[:, None]


class Metric:
    """Euclidean k-means: every hook leaves its input as it is."""

    name = "euclidean"
    inertia_scale = 1.0  # from summed squared Euclidean distances to the metric's inertia

    def rows(self, X: Any) -> Any:
        """The data ``X`` (n, d) (a lazy Dask array) as the kernels see it."""
        return X

    def init(self, c: np.ndarray) -> np.ndarray:
        """Centroids ``(K, d)`` float64 of a named init as the loop starts from them."""
        return c

    def check_init(self, c: np.ndarray) -> np.ndarray:
        """A user's explicit initial centroids ``(K, d)`` float64, checked for the metric."""
        return c

    def update(self, new: Any, old: Any, shift: Any) -> tuple[Any, Any]:
        """``(centroids, squared shift)`` after an update from ``old`` to ``new``."""
        return new, shift

    def distances(self, d2: np.ndarray) -> np.ndarray:
        """The metric's distances from squared Euclidean ones (``transform``)."""
        return np.sqrt(d2)


class Cosine(Metric):
    """Spherical k-means on unit rows (see the module docstring)."""

    name = "cosine"
    inertia_scale = 0.5

    def rows(self, X: Any) -> Any:
        return unit_rows(X)

    def init(self, c: np.ndarray) -> np.ndarray:
        return unit_centroids(c)

    def check_init(self, c: np.ndarray) -> np.ndarray:
        return check_unit_init(c)

    def update(self, new: Any, old: Any, shift: Any) -> tuple[Any, Any]:
        new = unit_centroids(new, old)
        return new, ((new - old) ** 2).sum()

    def distances(self, d2: np.ndarray) -> np.ndarray:
        return d2 * self.inertia_scale


REGISTRY: dict[str, Metric] = {m.name: m for m in (Metric(), Cosine())}
METRICS = options.METRICS  # the registered names, listed where no kernel need be loaded to read them
if tuple(REGISTRY) != METRICS:
    raise ImportError(f"daskmeans.options.METRICS={METRICS} should name the metrics of REGISTRY, {tuple(REGISTRY)}")


def get_metric(name: str) -> Metric:
    """The registered metric ``name``."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"metric={name!r} should be one of {', '.join(map(repr, REGISTRY))}") from None
