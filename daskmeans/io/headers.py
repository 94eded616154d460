"""What a data file says about its rows before it is read: its shape and the float dtype a fit
reads it as, from the header alone (a ``.npy`` file's, a Zarr array's metadata), with NumPy
only. The command asks this before its imports, so that the kernels of a fit of that shape
start compiling while the rest of the command starts
(:func:`daskmeans.backends.cupy_backend.warm_ahead`).
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
    local Zarr store ``path`` (``dataset``: its path in a Zarr group; a group of one array
    needs none, as for the reader), the dtype as a fit reads it (:func:`float_dtype`).

    None for anything else: another format, a group of several arrays without ``dataset``,
    a missing or unreadable file, what the read refuses (not 2-D, not numeric, no rows). The
    read itself then says what is wrong: this never raises.

    Parameters
    ----------
    path : str
    dataset : str, optional

    Returns
    -------
    ((int, int), numpy.dtype) or None
    """
    try:
        if path.lower().endswith(".npy") and os.path.isfile(path):
            mm = np.load(path, mmap_mode="r")  # the header read, the rows only mapped
            shape, dtype = mm.shape, mm.dtype
        elif os.path.isdir(path):
            node = os.path.join(path, *(dataset.strip("/").split("/") if dataset else ()))
            if dataset is None and _kind(node) == "group":
                arrays = _arrays(node)
                if len(arrays) != 1:
                    return None
                node = os.path.join(node, *arrays[0].split("/"))
            shape, dtype = _array_meta(node)
        else:
            return None
        check_2d_numeric(shape, dtype)  # what the read refuses (then in its own words)
        return (int(shape[0]), int(shape[1])), float_dtype(dtype)
    except Exception:  # the read says what is wrong with the file
        return None


def _meta(node: str) -> tuple[str | None, dict]:
    """A Zarr node's kind ("array", "group", None: no Zarr node) and its metadata (format 3's
    ``zarr.json``, format 2's ``.zarray`` or ``.zgroup``)."""
    v3 = os.path.join(node, "zarr.json")
    if os.path.isfile(v3):
        with open(v3) as f:
            meta = json.load(f)
        return meta.get("node_type"), meta
    for kind, name in (("array", ".zarray"), ("group", ".zgroup")):
        if os.path.isfile(os.path.join(node, name)):
            with open(os.path.join(node, name)) as f:
                return kind, json.load(f)
    return None, {}


def _kind(node: str) -> str | None:
    return _meta(node)[0]


def _arrays(group: str, prefix: str = "") -> list[str]:
    """The paths of the arrays below a Zarr group's directory (groups within it walked; an
    array's own chunk directories never listed)."""
    out = []
    for entry in sorted(os.scandir(group), key=lambda e: e.name):
        if entry.is_dir():
            kind = _kind(entry.path)
            if kind == "array":
                out.append(prefix + entry.name)
            elif kind == "group":
                out += _arrays(entry.path, prefix + entry.name + "/")
    return out


def _array_meta(node: str) -> tuple[tuple, Any]:
    """The shape and dtype in a Zarr array's metadata; a ValueError for anything else (a
    group, a dtype given as anything but a plain name)."""
    kind, meta = _meta(node)
    if kind != "array":
        raise ValueError(f"{node} is no Zarr array")
    dtype = meta.get("data_type", meta.get("dtype"))
    if not isinstance(dtype, str):
        raise ValueError(f"{node}'s dtype {dtype!r} is not a plain name")
    return tuple(meta["shape"]), np.dtype(dtype)
