"""AFK-MC² chains' inputs drawn as the init draws them, for the CPU and GPU tests of the chains
(``tests/`` is on ``sys.path`` once its ``conftest.py`` is loaded)."""

from __future__ import annotations

import numpy as np


def random_chains(X: np.ndarray, k: int, m: int, seed: int) -> tuple:
    """Proposals drawn as AFK-MC² draws them (half by d^2 to c1 = row 0, half uniform), as rows
    of their distinct rows: ``(Xu, c1, chains, qu, u)``."""
    rng = np.random.default_rng(seed)
    n = len(X)
    d2 = ((X - X[0]) ** 2).sum(axis=1)
    q = 0.5 * d2 / d2.sum() + 0.5 / n
    uniq, inv = np.unique(rng.choice(n, size=(k - 1) * m, p=q), return_inverse=True)
    return X[uniq], X[0], inv.reshape(k - 1, m), q[uniq], rng.random((k - 1, m - 1))
