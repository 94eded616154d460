"""Zarr stores (v2/v3; an array, or an array in a group): row blocks of whole Zarr chunks, each
read by the task that needs it; a chunk absent from the store is an error, not fill values.

Chunks of plain layouts in a local store are decompressed straight into the block's rows
(:mod:`daskmeans.io.zarr_chunks`); others are read by zarr-python.

Column names: Zarr has no convention of its own for them (xarray keeps labels in coordinate
arrays beside the data, AnnData in a separate ``var`` group). daskmeans takes the array's
attribute ``feature_names``, a list of one string per column (scikit-learn's word), where it
is present: ``zarr.open_array(path).attrs["feature_names"] = ["a", "b", "c"]``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import dask.array as da
import numpy as np

from ..errors import DaskmeansWarning, DataError
from ..validation import check_2d_numeric
from . import zarr_chunks
from .blocks import Table, float_dtype, row_blocks, rows_per_chunk

SUFFIXES = (".zarr", ".zip")


FEATURE_NAMES = "feature_names"  # the array attribute naming its columns


def open_zarr(path: str, chunk_bytes: int | None, dtype: np.dtype | None = None, *,
              dataset: str | None = None) -> da.Array | Table:
    """The 2-D array in the Zarr store ``path`` (``dataset``: its path in a group) in row chunks
    of about ``chunk_bytes`` (whole chunks of the store; default ``daskmeans.chunk-bytes``).

    Returns
    -------
    dask.array.Array, shape (n_samples, n_features), or a Table of it
        The stored dtype (``dtype`` is applied by :func:`daskmeans.io.readers.read`); a
        :class:`~daskmeans.io.readers.Table` with the columns' names where the array has the
        attribute ``feature_names``.

    Raises
    ------
    DataError
        Not a store, no such array, or a ``feature_names`` attribute that is not one string
        per column.
    """
    import zarr

    cb = chunk_bytes
    try:
        node = zarr.open(path, mode="r")
    except Exception as e:  # zarr raises several types for "not a store"
        raise DataError(f"cannot open {path} as Zarr: {e}") from None
    if isinstance(node, zarr.Group):
        names = sorted(array_paths(node))
        if dataset is None:
            if len(names) != 1:
                raise DataError(
                    f"{path} is a Zarr group with arrays {names}: choose one with dataset= (--dataset)"
                )
            dataset = names[0]
        if dataset not in names:
            raise DataError(f"dataset={dataset!r} is not an array in {path}; arrays: {names}")
        arr = node[dataset]
    else:
        if dataset is not None:
            raise DataError(f"{path} is a Zarr array, not a group: drop dataset={dataset!r}")
        arr = node
    check_2d_numeric(arr.shape, arr.dtype)
    zrows = int(arr.chunks[0])
    n, d = (int(s) for s in arr.shape)
    itemsize = float_dtype(arr.dtype).itemsize
    rows = rows_per_chunk(d, itemsize, cb, align=zrows)
    if cb is not None and cb < zrows * d * itemsize:
        # A task reads whole Zarr chunks: smaller row chunks would decompress each one repeatedly.
        warnings.warn(
            f"chunk_bytes={cb} (--chunk-bytes) is smaller than a chunk of {path} ({zrows} rows x {d} x {itemsize} bytes = "
            f"{zrows * d * itemsize} bytes): its own chunks ({zrows} rows) are used",
            DaskmeansWarning, stacklevel=3,
        )
    # One task per block opens the store itself (nothing but the path travels) and refuses a
    # missing chunk: Zarr reads an absent chunk as the fill value, which would silently turn
    # rows of a damaged or half-copied store into zeros.
    x = row_blocks(zarr_block, (path, arr.path), n, d, arr.dtype, rows, align=zrows, into=zarr_into)
    names = arr.attrs.get(FEATURE_NAMES)
    if names is None:
        return x
    if not (isinstance(names, list) and len(names) == d and all(isinstance(v, str) for v in names)):
        raise DataError(f"the attribute {FEATURE_NAMES!r} of {path} should be a list of {d} strings, one per column, "
                        f"got {str(names)[:80]}")
    return Table(x, tuple(names))


def zarr_block(path: str, array_path: str, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the Zarr array ``array_path`` in the store at ``path``; a
    DataError if a chunk they lie in is absent from the store."""
    return zarr_into(path, array_path, start, stop, None)


def zarr_into(path: str, array_path: str, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
    """Rows ``start:stop`` of the Zarr array ``array_path`` in the store at ``path`` into
    ``out`` (the caller's buffer: a C-contiguous array (stop - start, n_features) of the
    array's dtype; None: a new array), which it returns; a DataError if a chunk they lie in is
    absent from the store."""
    import zarr

    try:
        arr = zarr.open_array(store=path, path=array_path or None, mode="r")
    except Exception as e:  # deleted or unreadable since the client opened it
        raise DataError(f"cannot open {path} as Zarr on this worker: {e}") from None
    # Keys name storage objects: whole shards where the array is sharded.
    grid = getattr(arr, "shards", None) or arr.chunks
    zrows, zcols = int(grid[0]), int(grid[1])
    d = int(arr.shape[1])
    for i in range(start // zrows, -(-stop // zrows)):
        for j in range(-(-d // zcols)):
            key = arr.metadata.encode_chunk_key((i, j))
            if not store_has(arr, key):
                full = "/".join(p for p in (array_path, key) if p)
                raise DataError(
                    f"Zarr chunk {full} of {path} is missing (rows {i * zrows} to "
                    f"{min((i + 1) * zrows, int(arr.shape[0])) - 1}): the store is incomplete"
                )
    dtype = np.dtype(arr.dtype)
    if out is not None and (out.shape != (stop - start, d) or out.dtype != dtype or not out.flags.c_contiguous):
        raise ValueError(f"rows {start}:{stop} of {path} go into a C-contiguous {dtype} array of shape "
                         f"{(stop - start, d)}, got {out.dtype} {out.shape}")
    lay = zarr_chunks.layout(arr)
    try:
        if lay is not None:
            return zarr_chunks.read_rows(lay, start, stop, out)
        rows = np.asarray(arr[start:stop])
        if out is None:
            return rows
        out[...] = rows
        return out
    except DataError:
        raise
    except Exception as e:  # a corrupt chunk: a codec error names no row
        raise DataError(f"cannot read rows {start} to {stop - 1} of {path}: {type(e).__name__}: {e}") from None


def store_has(arr: Any, key: str) -> bool:
    """Whether the store of ``arr`` holds chunk ``key`` (a file test for local stores)."""
    local = zarr_chunks.chunk_file(arr, key)
    if local is not None:
        return os.path.exists(local)
    from zarr.core.sync import sync  # other stores' API is async only

    sp = arr.store_path
    return bool(sync(sp.store.exists("/".join(p for p in (sp.path, key) if p))))


def array_paths(group: Any, prefix: str = "") -> list[str]:
    out = []
    for name, arr in group.arrays():
        out.append(prefix + name)
    for name, sub in group.groups():
        out += array_paths(sub, prefix + name + "/")
    return out
