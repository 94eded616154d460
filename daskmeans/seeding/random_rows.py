"""``random``: k distinct rows drawn uniformly."""

from __future__ import annotations

from typing import Any

import numpy as np
from distributed import Client

from ..engine.placement import Placement
from .rows import take_rows


def init_random(client: Client, placement: Placement, k: int, seed: int, **options: Any) -> np.ndarray:
    """``k`` distinct rows drawn uniformly.

    ``options``: other inits' keyword options, not used here.
    """
    rng = np.random.default_rng(seed)
    rows = rng.choice(placement.n_samples, size=k, replace=False)
    return take_rows(client, placement, rows)
