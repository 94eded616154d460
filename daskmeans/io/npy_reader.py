"""``.npy`` files: row blocks read as byte ranges of the file by several threads at once
(:func:`daskmeans.io.ranges.read_into`), each block by the task that needs it, or straight
into a caller's buffer (:func:`npy_into`, the reading pipelines')."""

from __future__ import annotations

import os

import dask.array as da
import numpy as np

from ..errors import DataError
from ..validation import check_2d_numeric
from .blocks import float_dtype, row_blocks, rows_per_chunk
from .ranges import read_into

SUFFIXES = (".npy",)


def open_npy(path: str, chunk_bytes: int | None, dtype: np.dtype | None = None) -> da.Array:
    """The 2-D array of the ``.npy`` file ``path`` in row chunks of about ``chunk_bytes`` (as
    the float data they become; default ``daskmeans.chunk-bytes``).

    Returns
    -------
    dask.array.Array, shape (n_samples, n_features)
        The file's dtype (``dtype`` is applied by :func:`daskmeans.io.readers.read`).
    """
    if os.path.getsize(path) == 0:
        raise DataError(f"{path} is empty")
    try:
        mm = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"cannot read {path} as .npy: {e}") from None
    check_2d_numeric(mm.shape, mm.dtype)
    n, d = mm.shape
    rows = rows_per_chunk(d, float_dtype(mm.dtype).itemsize, chunk_bytes)
    # One task per block opens the memory map itself: the array never travels in the graph.
    return row_blocks(npy_block, (path,), n, d, mm.dtype, rows, align=1, into=npy_into)


def npy_block(path: str, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the ``.npy`` file ``path``, shape (stop - start, n_features)."""
    mm = np.load(path, mmap_mode="r")
    out = np.empty((stop - start,) + mm.shape[1:], mm.dtype)
    _rows_into(path, mm, start, stop, out)
    return out


def npy_into(path: str, start: int, stop: int, out: np.ndarray) -> None:
    """Rows ``start:stop`` of the ``.npy`` file ``path`` into ``out``, a C-contiguous array
    of shape (stop - start, n_features) and the file's dtype (the caller's buffer: page-locked
    memory, a resident block's rows)."""
    _rows_into(path, np.load(path, mmap_mode="r"), start, stop, out)


def _rows_into(path: str, mm: np.memmap, start: int, stop: int, out: np.ndarray) -> None:
    if out.shape != (stop - start,) + mm.shape[1:] or out.dtype != mm.dtype or not out.flags.c_contiguous:
        raise ValueError(f"rows {start}:{stop} of {path} go into a C-contiguous {mm.dtype} array of shape "
                         f"{(stop - start,) + mm.shape[1:]}, got {out.dtype} {out.shape}")
    if not mm.flags.c_contiguous:  # Fortran order: the rows are not byte ranges
        out[...] = mm[start:stop]
        return
    row = mm.dtype.itemsize * int(np.prod(mm.shape[1:]))
    read_into(path, mm.offset + start * row, memoryview(out).cast("B"))
