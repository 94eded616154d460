"""The package's row hashing: pseudo-random values keyed by a row's global index (and, for the
content digest, by its values), never by the chunk or worker that holds the row.

- :func:`splitmix64`: SplitMix64's finaliser, the one integer mix (the digest's terms, the
  size balancing's per-row keys; the GPU pin ``pin_words`` in ``backends/cuda/fit.cu`` applies
  the same finaliser to 32-bit words).
- :func:`row_hashes`: the content digest's per-row hash of a row's value bits and its index.
- :func:`row_keys`: one uint64 per global row and salt (the balancing's choice of rows).
- :func:`row_uniforms`: uniform draws per global row from a counter-based generator (Philox),
  for the inits' and the sample's draws; on a device array module (CuPy) the same bits,
  computed where the rows' other per-row state lives (:func:`philox_uniforms`).

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


def row_uniforms(seed: int, stream: int, start: int, n: int, xp: Any = np) -> Any:
    """Uniform draws in [0, 1) for the global rows ``start .. start + n - 1`` of a stream.

    A row's draw depends on the row alone, not on the chunk or worker holding it, so a seed
    samples the same rows for any chunking and worker count: a counter-based generator
    (Philox, keyed by ``(seed, stream)``) jumped to the row. (``phi``, a float sum whose
    rounding depends on the chunking, can only change a row whose draw lies within an ulp of
    its probability.)

    Parameters
    ----------
    seed, stream : int
        The generator's key (each below 2**64).
    start, n : int
        The first global row and the number of rows.
    xp : module, default numpy
        The array module of the result: NumPy draws with its own Philox generator; another
        (CuPy) computes the same bits on its device (one CUDA kernel; another module's
        integer arithmetic: :func:`philox_uniforms`), so that a per-row draw on a GPU needs no
        copy of the rows' state to the host.

    Returns
    -------
    float64 array of ``xp``, shape (n,)
    """
    if xp is not np:
        if hasattr(xp, "ElementwiseKernel"):  # CuPy: one kernel (the same bits)
            return _device_uniforms(xp, seed, stream, start, n)
        return philox_uniforms(xp, seed, stream, start, n)
    bg = np.random.Philox(key=np.array([seed, stream], dtype=np.uint64))
    q, r = divmod(int(start), 4)  # a Philox counter step gives 4 draws
    bg.advance(q)
    return np.random.Generator(bg).random(n + r)[r:]


# Philox4x64-10's multipliers and key increments (Salmon et al. 2011, Random123; NumPy's Philox).
_PHILOX_M = (np.uint64(0xD2E7470EE14C6C93), np.uint64(0xCA5A826395121157))
_PHILOX_W = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBB67AE8584CAA73B))
_LOW32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def _mulhilo(m: np.uint64, a: Any) -> tuple:
    """The high and low 64-bit words of the 128-bit products ``m * a`` (uint64 ``a``), from
    32-bit halves: no array module has a 64x64->128 multiply."""
    m0, m1 = m & _LOW32, m >> _32
    a0, a1 = a & _LOW32, a >> _32
    p00, p01, p10, p11 = a0 * m0, a0 * m1, a1 * m0, a1 * m1
    mid = (p00 >> _32) + (p01 & _LOW32) + (p10 & _LOW32)  # < 3 * 2**32: no carry lost
    return p11 + (p01 >> _32) + (p10 >> _32) + (mid >> _32), a * m


def philox_uniforms(xp: Any, seed: int, stream: int, start: int, n: int) -> Any:
    """:func:`row_uniforms` computed with the array module ``xp`` (NumPy or CuPy): the same
    bits as NumPy's ``Generator(Philox(key=[seed, stream])).random`` jumped to ``start``.

    NumPy's Philox increments its 256-bit counter before each block of four 64-bit words, so
    row ``i``'s draw is word ``i % 4`` of the block of counter ``i // 4 + 1`` (rows below
    ``2**66``: the counter's upper words stay 0), and ``random`` takes its top 53 bits times
    ``2**-53``.

    Returns
    -------
    float64 array of ``xp``, shape (n,)
    """
    first, r = divmod(int(start), 4)
    nblocks = (r + n + 3) // 4
    with np.errstate(over="ignore"):
        c0 = xp.arange(first + 1, first + 1 + nblocks, dtype=xp.uint64)
        zero = xp.zeros_like(c0)
        c1, c2, c3 = zero, zero, zero
        k0, k1 = np.uint64(seed), np.uint64(stream)
        for i in range(10):
            if i:
                k0, k1 = k0 + _PHILOX_W[0], k1 + _PHILOX_W[1]
            hi0, lo0 = _mulhilo(_PHILOX_M[0], c0)
            hi1, lo1 = _mulhilo(_PHILOX_M[1], c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        words = xp.stack([c0, c1, c2, c3], axis=1).ravel()[r:r + n]
        return (words >> np.uint64(11)).astype(xp.float64) * (1.0 / 9007199254740992.0)


# philox_uniforms in one CUDA kernel, a thread per row (each computes its four-draw block and
# keeps its own word): the array-module version costs about 400 launches per call.
_PHILOX_CUDA = """
unsigned long long row = start + i;
unsigned long long c0 = row / 4 + 1, c1 = 0, c2 = 0, c3 = 0, k0 = seed, k1 = stream;
for (int r = 0; r < 10; r++) {
    if (r) { k0 += 0x9E3779B97F4A7C15ULL; k1 += 0xBB67AE8584CAA73BULL; }
    unsigned long long hi0 = __umul64hi(0xD2E7470EE14C6C93ULL, c0), lo0 = 0xD2E7470EE14C6C93ULL * c0;
    unsigned long long hi1 = __umul64hi(0xCA5A826395121157ULL, c2), lo1 = 0xCA5A826395121157ULL * c2;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
}
unsigned long long w = row % 4 == 0 ? c0 : row % 4 == 1 ? c1 : row % 4 == 2 ? c2 : c3;
out = (double)(w >> 11) * (1.0 / 9007199254740992.0);
"""
_KERNELS: dict = {}


def _device_uniforms(xp: Any, seed: int, stream: int, start: int, n: int) -> Any:
    """:func:`philox_uniforms` on CuPy as one elementwise kernel: ``(n,)`` float64."""
    kernel = _KERNELS.get(xp)
    if kernel is None:
        kernel = _KERNELS[xp] = xp.ElementwiseKernel("uint64 start, uint64 seed, uint64 stream", "float64 out",
                                                     _PHILOX_CUDA, "daskmeans_row_uniforms")
    out = xp.empty(n, xp.float64)
    if n:
        kernel(np.uint64(start), np.uint64(seed), np.uint64(stream), out)
    return out
