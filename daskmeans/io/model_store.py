"""Models on disk: a Zarr group with the centroids as an array and everything else as JSON
attributes. No pickle. Writes go to a temporary sibling that is renamed into place under the
output's lock (:mod:`daskmeans.io.paths`), so a failed write never leaves a partial model
behind and two writers never interleave."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np

from ..errors import DataError
from ..progress import advance, step
from .paths import FORMATS, atomic_dir, atomic_file, describe, output_lock  # noqa: F401  (the writers' helpers, here too)

FORMAT = FORMATS["model"]
FORMAT_VERSION = 1


def _jsonable(obj: Any) -> Any:
    """Attributes as plain JSON (NumPy scalars and arrays become numbers and lists)."""
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def _write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def write_group(root: str, arrays: dict[str, np.ndarray], attrs: dict) -> None:
    """A Zarr (format 3) group at the new directory ``root``: each array ``(n,)`` or ``(n, d)``
    whole in one uncompressed chunk, and ``attrs`` as the group's JSON attributes.

    Written from the format's specification rather than through zarr-python, whose imports
    (zarr, numcodecs, fsspec: ~0.4 s on a GPU host) cost a fit command more than writing its
    model; zarr-python reads what this writes (the readers use it).
    """
    os.mkdir(root)
    _write_json(os.path.join(root, "zarr.json"), {"zarr_format": 3, "node_type": "group", "attributes": attrs})
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        if a.dtype.kind not in "biuf" or a.ndim not in (1, 2) or 0 in a.shape:
            raise ValueError(f"array {name!r} of dtype {a.dtype} and shape {a.shape} should be a non-empty "
                             "1-D or 2-D array of booleans, integers or floats")
        node = os.path.join(root, name)
        os.makedirs(os.path.join(node, "c", *("0",) * (a.ndim - 1)))
        _write_json(os.path.join(node, "zarr.json"), {
            "shape": list(a.shape),
            "data_type": a.dtype.name,  # Zarr's names of these types are NumPy's
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(a.shape)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": {"b": False, "i": 0, "u": 0, "f": 0.0}[a.dtype.kind],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "attributes": {},
            "zarr_format": 3,
            "node_type": "array",
            "storage_transformers": [],
        })
        with open(os.path.join(node, "c", *("0",) * a.ndim), "wb") as f:
            f.write(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


def save_model(path: str, centroids: np.ndarray, attrs: dict, sizes: np.ndarray | None = None) -> None:
    """Write ``centroids`` (K, D), the rows per cluster ``sizes`` (K,) if known, and JSON
    ``attrs`` as a Zarr group at ``path``."""
    arrays = {"cluster_centers": np.asarray(centroids)}
    if sizes is not None:
        arrays["cluster_sizes"] = np.asarray(sizes, np.int64)
    with atomic_dir(path, kind="model") as tmp:
        write_group(tmp, arrays, _jsonable({"format": FORMAT, "format_version": FORMAT_VERSION, **attrs}))


def _open(path: str, fmt: str, what: str, missing: str) -> tuple:
    """``(group, attrs)`` of a daskmeans Zarr group of format ``fmt``, else a DataError: one
    that says what the path holds instead (data, labels, a plain Zarr array...)."""
    import zarr

    if not os.path.exists(path):
        raise DataError(missing)
    found = describe(path)
    if found != f"a daskmeans {what}":
        raise DataError(f"{path} is not a daskmeans {what}: it is {found}")
    try:
        g = zarr.open_group(path, mode="r")
        attrs = dict(g.attrs)
    except Exception as e:  # not a Zarr group
        raise DataError(f"{path} is not a daskmeans {what}: {e}") from None
    if attrs.get("format") != fmt:
        raise DataError(f"{path} is not a daskmeans {what} (format={attrs.get('format')!r})")
    return g, attrs


def load_model(path: str) -> tuple[np.ndarray, dict, np.ndarray | None]:
    """Read a model written by :func:`save_model`: ``(centroids, attrs, sizes or None)``."""
    g, attrs = _open(path, FORMAT, "model", f"no such model: {path}")
    try:
        centers = np.asarray(g["cluster_centers"][...])
    except Exception as e:  # no centroids array
        raise DataError(f"{path} is not a daskmeans model: {e}") from None
    if int(attrs.get("format_version", 0)) > FORMAT_VERSION:
        raise DataError(
            f"{path} has format_version={attrs['format_version']}; this daskmeans reads <= {FORMAT_VERSION}"
        )
    sizes = np.asarray(g["cluster_sizes"][...]) if "cluster_sizes" in g else None
    return centers, attrs, sizes


def write_array(x, path: str, name: str | None = None, *, kind: str | None = None) -> None:
    """Write a host-backed Dask array to Zarr at ``path`` (atomically), chunk by chunk.

    With ``name`` the array goes into a new group under that name; without, ``path`` is the
    array itself. Nothing larger than one chunk is held in memory.

    ``kind`` ("labels", "data") marks the output as daskmeans' (the attribute ``format``,
    ``daskmeans-labels`` or ``daskmeans-data``, of the group, or of the array without
    ``name``), and an existing ``path`` is then replaced only if it is marked the same.
    The blocks written are the step ``write <kind>`` of a command's progress.
    """
    import dask
    import zarr

    # Zarr chunks are regular: rechunk so no two Dask blocks write into one Zarr chunk.
    x = x.rechunk(tuple(max(c) for c in x.chunks))
    # Every chunk is written, also one equal to the fill value: the readers refuse a store
    # with an absent chunk rather than read it as zeros.
    spec = dict(shape=x.shape, chunks=x.chunksize, dtype=x.dtype, config={"write_empty_chunks": True})
    starts = [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(int).tolist() for c in x.chunks]
    marker = {"format": FORMATS[kind], "format_version": FORMAT_VERSION} if kind else {}
    with atomic_dir(path, kind=kind) as tmp:
        if name is None:
            zarr.create_array(tmp, attributes=marker, **spec)
        else:
            zarr.open_group(tmp, mode="w", attributes=marker).create_array(name, **spec)
        blocks = x.to_delayed()
        writes = [
            dask.delayed(_write_block, pure=False)(
                blocks[idx], tmp, name, tuple(starts[a][i] for a, i in enumerate(idx)),
            )
            for idx in np.ndindex(*x.numblocks)
        ]
        with step(f"write {kind or 'array'}", total=len(writes), unit="blocks"):
            _run_writes(writes)


def _write_block(block: np.ndarray, root: str, name: str | None, start: tuple[int, ...]) -> None:
    """On a worker: write one block into the array at ``root`` (``name`` in its group).

    The client cannot stop a write already running on a worker: a write that starts after the
    client removed the temporary directory (an interrupted or failed write) writes nothing,
    and one under way when it is removed (its chunk recreates the directories it needs) removes
    what it made once it sees the metadata gone, so nothing is left behind.
    """
    import zarr

    meta = os.path.join(root, "zarr.json")
    if not os.path.exists(meta):  # abandoned: opening would make the directory again
        return
    try:
        arr = zarr.open_array(root, path=name or "", mode="r+").with_config({"write_empty_chunks": True})
        arr[tuple(slice(s, s + n) for s, n in zip(start, np.shape(block)))] = np.asarray(block)
    finally:
        if not os.path.exists(meta):
            shutil.rmtree(root, ignore_errors=True)


def _run_writes(writes: list) -> None:
    """Run the block writes, each counted as done (:func:`daskmeans.progress.advance`): on the
    distributed client when there is one (the writes not started are cancelled at the first
    failure or interruption; a write under way there ends on its own and, finding the directory
    gone, removes what it made), else (or where ``dask.config`` names a local scheduler) on
    Dask's threads, returning or raising once none still
    runs (Dask's threaded scheduler raises at the first failure while other writes go on,
    which would then write into the directory the caller is removing)."""
    import dask
    from concurrent.futures import ThreadPoolExecutor

    try:
        from distributed import get_client

        if dask.config.get("scheduler", None) not in (None, "dask.distributed", "distributed"):
            raise ValueError("a local scheduler is configured")  # dask.config.set(scheduler="threads")
        client = get_client()
    except (ImportError, ValueError):
        from dask.callbacks import Callback
        from dask.utils import key_split

        written = 0

        def posttask(key, *_: Any) -> None:  # called in this thread, by the threaded scheduler's loop
            nonlocal written
            if key_split(key) == "write_block":  # _write_block's tasks (key_split drops the underscore)
                written += 1
                advance(written)

        pool = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="daskmeans-write")
        try:
            with Callback(posttask=posttask):
                dask.compute(*writes, scheduler="threads", pool=pool)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    from distributed import as_completed

    futs = client.compute(writes)
    try:
        for written, fut in enumerate(as_completed(futs), 1):
            if fut.status == "error":
                fut.result()  # raises the write's error
            advance(written)
        client.gather(futs)
    except BaseException:
        client.cancel(futs, force=True)  # the writes not yet started are dropped with them
        raise
