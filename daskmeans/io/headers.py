"""What a data file says about its rows before it is read: its shape and the float dtype a fit
reads it as, from the header alone (a ``.npy`` file's, a Zarr array's metadata), with NumPy
only. The command asks this before its imports, so that the kernels of a fit of that shape
start compiling while the rest of the command starts (:func:`daskmeans.backends.cupy_backend.warm_ahead`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import DataError
from ..validation import check_2d_numeric


def float_dtype(dtype: Any) -> np.dtype:
    """float32/float64 stay; float16 becomes float32; integers and bools become float64."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.dtype(np.float64) if dt.itemsize >= 8 else np.dtype(np.float32)
    if dt.kind in "iub":
        return np.dtype(np.float64)
    raise DataError(f"X should be numeric, got dtype {dt}")


def peek(path: str, dataset: str | None = None) -> tuple[tuple[int, int], np.dtype] | None:
    """``((n_samples, n_features), dtype)`` of the 2-D numeric array in the ``.npy`` file or
    Zarr store ``path`` (``dataset``: its path in a Zarr group), the dtype as a fit reads it
    (:func:`float_dtype`); None for anything else (another format, a group without
    ``dataset``, a missing or unreadable file, what the read refuses: not 2-D, not numeric, no rows): the read itself then says
    what is wrong, this never raises.

    Parameters
    ----------
    path : str
    dataset : str, optional

    Returns
    -------
    ((int, int), numpy.dtype) or None
    """
    try:
        if path.endswith(".npy") and os.path.isfile(path):
            mm = np.load(path, mmap_mode="r")  # the header read, the rows only mapped
            shape, dtype = mm.shape, mm.dtype
        elif os.path.isdir(path):
            shape, dtype = _zarr_array(os.path.join(path, *(dataset.strip("/").split("/") if dataset else ())))
        else:
            return None
        check_2d_numeric(shape, dtype)  # what the read refuses (then in its own words)
        return (int(shape[0]), int(shape[1])), float_dtype(dtype)
    except Exception:  # the read says what is wrong with the file
        return None


def _zarr_array(node: str) -> tuple[tuple, Any]:
    """The shape and dtype in a Zarr array's metadata (format 3's ``zarr.json``, format 2's
    ``.zarray``); a ValueError for a group or anything else."""
    v3 = os.path.join(node, "zarr.json")
    if os.path.isfile(v3):
        with open(v3) as f:
            meta = json.load(f)
        if meta.get("node_type") != "array" or not isinstance(meta.get("data_type"), str):
            raise ValueError(f"{node} is no Zarr array of a plain dtype")
        return tuple(meta["shape"]), np.dtype(meta["data_type"])
    with open(os.path.join(node, ".zarray")) as f:
        meta = json.load(f)
    return tuple(meta["shape"]), np.dtype(meta["dtype"])
