"""``k-means++``: greedy k-means++ (with scikit-learn's local trials) on a uniform sample of
``daskmeans.init.sample-size`` rows, on one worker."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
from distributed import Client

from .. import config
from ..backends import get_backend
from ..engine.placement import Placement
from ..engine.task import blas_capped
from .kernels import kmeans_plusplus, local_trials
from .rows import gather_rows, result, row_parts


def _seed_sample(parts: list, rows: np.ndarray, k: int, seed: Any, backend: str) -> np.ndarray:
    """k-means++ (:func:`kmeans_plusplus`) on the sampled ``rows``, gathered from their shards."""
    be = get_backend(backend)
    return be.to_numpy(kmeans_plusplus(be.asarray(gather_rows(parts, rows)), k, seed))


_HOST_KMEANSPP_FLOPS = 2**27


def init_kmeans_plusplus(client: Client, placement: Placement, k: int, seed: int, **options: Any) -> np.ndarray:
    """Greedy k-means++ on a uniform sample of ``daskmeans.init.sample-size`` rows (at least k).

    ``options``: other inits' keyword options, not used here.
    """
    n = placement.n_samples
    m = min(n, max(k, int(config.get("init.sample-size"))))
    ss = np.random.SeedSequence(seed)
    s1, s2 = ss.spawn(2)
    rows = np.arange(n) if m == n else np.sort(np.random.default_rng(s1).choice(n, size=m, replace=False))
    # A small seeding runs on the host: on a GPU its K dependent steps cost more in kernel
    # loads, the BLAS handle and synchronisations than the arithmetic (docs/performance.md,
    # "Small k-means++ on the host").
    small = k * local_trials(k) * m * placement.n_features <= _HOST_KMEANSPP_FLOPS
    fut = client.submit(blas_capped(_seed_sample), row_parts(client, placement, rows), rows, k, s2,
                        "numpy" if small else placement.backend, pure=False,
                        key=f"daskmeans-kmeans++-{uuid.uuid4().hex}")
    return result(client, placement, fut)
