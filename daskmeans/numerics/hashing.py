"""The package's row hashing: pseudo-random values keyed by a row's global index (and, for the
content digest, by its values), never by the chunk or worker that holds the row.

- :func:`splitmix64`: SplitMix64's finaliser, the one integer mix (the digest's terms, the
  size balancing's per-row keys; the GPU pin ``pin_words`` in ``backends/cuda/fit.cu`` applies
  the same finaliser to 32-bit words).
- :func:`row_hashes`: the content digest's per-row hash of a row's value bits and its index.
- :func:`row_keys`: one uint64 per global row and salt (the balancing's choice of rows).
- :func:`row_uniforms`: uniform draws per global row from a counter-based generator (Philox),
  for the inits' and the sample's draws.

The integer functions run on NumPy and CuPy arrays alike (``xp`` is the array module) with the
same bits on either; every product and sum wraps modulo 2**64 by design.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd: SplitMix64's increment
_GOLDEN = np.uint64(GOLDEN)


def splitmix64(xp: Any, h: Any) -> Any:
    """SplitMix64's finaliser, elementwise on uint64 (a bijection that spreads every bit).

    Parameters
    ----------
    xp : module
        NumPy or CuPy (unused by the arithmetic; kept so every function here has the same
        first parameter).
    h : uint64 array, any shape

    Returns
    -------
    uint64 array, the shape of ``h``
    """
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def column_keys(xp: Any, d: int) -> Any:
    """An odd, well-mixed uint64 multiplier per column: a value's weight in its row's hash
    by position (odd, so that no bit of a value is lost to the product).

    Returns
    -------
    uint64 array, shape (d,)
    """
    with np.errstate(over="ignore"):
        return splitmix64(xp, xp.arange(1, d + 1, dtype=xp.uint64) * _GOLDEN) | np.uint64(1)


def row_hashes(xp: Any, bits: Any, keys: Any, first_row: int) -> Any:
    """The content digest's hash of each row: ``mix(mix(sum_j bits_ij * key_j) + i * golden)``
    with ``i`` the row's global index (a changed value, a swapped pair of rows or a shifted
    block all change it).

    Parameters
    ----------
    bits : uint64 array, shape (n, d)
        The rows' values as unsigned integers of their own width, widened to uint64.
    keys : uint64 array, shape (d,)
        :func:`column_keys` of ``d``.
    first_row : int
        The global index of ``bits``' first row.

    Returns
    -------
    uint64 array, shape (n,)
    """
    with np.errstate(over="ignore"):
        row = splitmix64(xp, (bits * keys[None, :]).sum(axis=1, dtype=xp.uint64))
        idx = xp.arange(first_row, first_row + bits.shape[0], dtype=xp.uint64)
        return splitmix64(xp, row + idx * _GOLDEN)


def row_keys(xp: Any, rows: Any, salt: int) -> Any:
    """A pseudo-random uint64 per global row: SplitMix64 of the row plus ``salt`` times the
    golden increment. The same bits with NumPy and CuPy: which chunk or worker holds a row does
    not change its key.

    Parameters
    ----------
    rows : integer array, shape (m,)
        Global row indices.
    salt : int
        Chooses the keys (the balancing passes its seed plus the iteration).

    Returns
    -------
    uint64 array, shape (m,)
    """
    with np.errstate(over="ignore"):
        return splitmix64(xp, rows.astype(xp.uint64) + xp.uint64((salt * GOLDEN) % (1 << 64)))


def row_uniforms(seed: int, stream: int, start: int, n: int) -> np.ndarray:
    """Uniform draws in [0, 1) for the global rows ``start .. start + n - 1`` of a stream.

    A row's draw depends on the row alone, not on the chunk or worker holding it, so a seed
    samples the same rows for any chunking and worker count: a counter-based generator
    (Philox, keyed by ``(seed, stream)``) jumped to the row. (``phi``, a float sum whose
    rounding depends on the chunking, can only change a row whose draw lies within an ulp of
    its probability.)

    Returns
    -------
    float64 ndarray, shape (n,)
    """
    bg = np.random.Philox(key=np.array([seed, stream], dtype=np.uint64))
    q, r = divmod(int(start), 4)  # a Philox counter step gives 4 draws
    bg.advance(q)
    return np.random.Generator(bg).random(n + r)[r:]
