"""An init that exists only for tests/unit/test_extension_init.py: one module and one
registry entry, as design.md says a new init is."""

from __future__ import annotations

from typing import Any

import numpy as np


def init_random_again(client: Any, placement: Any, k: int, seed: int, **options: Any) -> np.ndarray:
    """The "random" init under another name (its centroids, bitwise)."""
    from daskmeans.seeding import get_init

    return get_init("random")(client, placement, k, seed, **options)
