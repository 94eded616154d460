"""Numerics on in-memory arrays, NumPy or CuPy alike (the same integer and IEEE operations, so
the same bits on either): the fixed-point grid of the exact sums (:mod:`.grid`), the package's
row hashing (:mod:`.hashing`: SplitMix64, the per-row Philox draws) and the data's content
digest (:mod:`.digest`). Pure functions and small value types, used by the kernels and the
engine alike; no Dask, no I/O.
"""
