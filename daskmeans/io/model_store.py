"""Models on disk: a Zarr group with the centroids as an array and everything else as JSON
attributes. No pickle. Writes go to a temporary sibling that is renamed into place, so a
failed write never leaves a partial model behind."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any

import numpy as np

from ..errors import DataError

FORMAT = "daskmeans-model"
FORMAT_VERSION = 1


def _jsonable(obj: Any) -> Any:
    """Attributes as plain JSON (NumPy scalars and arrays become numbers and lists)."""
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def atomic_dir(path: str):
    """Context manager yielding a temporary directory path that replaces ``path`` on success."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        parent = os.path.dirname(os.path.abspath(path)) or "."
        if not os.path.isdir(parent):
            raise DataError(f"cannot write {path}: directory {parent} does not exist")
        tmp = os.path.join(parent, f".{os.path.basename(path.rstrip('/'))}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if os.path.exists(path):
            old = tmp + ".old"
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)

    return cm()


def save_model(path: str, centroids: np.ndarray, attrs: dict) -> None:
    """Write ``centroids`` (K, D) and JSON ``attrs`` as a Zarr group at ``path``."""
    import zarr

    with atomic_dir(path) as tmp:
        g = zarr.open_group(tmp, mode="w")
        g.create_array("cluster_centers", data=np.asarray(centroids))
        g.attrs.update(_jsonable({"format": FORMAT, "format_version": FORMAT_VERSION, **attrs}))


def load_model(path: str) -> tuple[np.ndarray, dict]:
    """Read a model written by :func:`save_model`: ``(centroids, attrs)``."""
    import zarr

    if not os.path.exists(path):
        raise DataError(f"no such model: {path}")
    try:
        g = zarr.open_group(path, mode="r")
        attrs = dict(g.attrs)
        centers = np.asarray(g["cluster_centers"][...])
    except Exception as e:  # not a group, or no centroids array
        raise DataError(f"{path} is not a daskmeans model: {e}") from None
    if attrs.get("format") != FORMAT:
        raise DataError(f"{path} is not a daskmeans model (format={attrs.get('format')!r})")
    if int(attrs.get("format_version", 0)) > FORMAT_VERSION:
        raise DataError(
            f"{path} has format_version={attrs['format_version']}; this daskmeans reads <= {FORMAT_VERSION}"
        )
    return centers, attrs


def write_array(x, path: str, name: str | None = None) -> None:
    """Write a host-backed Dask array to Zarr at ``path`` (atomically), chunk by chunk.

    With ``name`` the array goes into a new group under that name; without, ``path`` is the
    array itself. Nothing larger than one chunk is held in memory.
    """
    import dask.array as da
    import zarr

    # Zarr chunks are regular: rechunk so no two Dask blocks write into one Zarr chunk.
    x = x.rechunk(tuple(max(c) for c in x.chunks))
    # Every chunk is written, also one equal to the fill value: the readers refuse a store
    # with an absent chunk rather than read it as zeros.
    spec = dict(shape=x.shape, chunks=x.chunksize, dtype=x.dtype, config={"write_empty_chunks": True})
    with atomic_dir(path) as tmp:
        if name is None:
            arr = zarr.create_array(tmp, **spec)
        else:
            arr = zarr.open_group(tmp, mode="w").create_array(name, **spec)
        da.store(x, arr, lock=False)
