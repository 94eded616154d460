"""Models on disk: a Zarr group with the centroids as an array and everything else as JSON
attributes. No pickle. Writes go to a temporary sibling that is renamed into place under the
output's lock (:mod:`daskmeans.io.paths`), so a failed write never leaves a partial model
behind and two writers never interleave.

A model is verified as it is read, as a checkpoint is (:mod:`daskmeans.io.checkpoint`, which
shares the checksum and the history's check from here): a damaged model would otherwise
predict garbage with exit 0 (a NaN centroid takes every row; centroids of 1e300 overflow
every distance) or end in a traceback. :func:`load_model` refuses, in one line naming the
path, what is wrong and what it should be:

- a model whose SHA-256 ``checksum`` (over its attributes and arrays) does not match its
  contents (changed after it was written);
- contents that contradict themselves (:func:`model_problem`): centroids that are not finite
  float32/float64 values of shape ``(n_clusters, n_features_in)``, or whose squared norms
  overflow the distances' dtype; cluster sizes that are not K counts; an unknown metric; a
  history that is not one well-formed record per iteration; an inertia or iteration count that
  is not a number; feature names that are not ``n_features_in`` strings.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import shutil
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import DataError
from ..events import advance, step
from .paths import FORMATS, atomic_dir, atomic_file, describe, output_lock  # noqa: F401  (the writers' helpers, here too)

FORMAT = FORMATS["model"]
# The model's format. 2: the checksum. A version-1 model (written before it) has none: it is
# still read, with every consistency check, since users keep such models.
FORMAT_VERSION = 2
# The version marked on labels and generated data (their format has not changed).
OUTPUT_VERSION = 1

# Every history entry has these numbers (the loop's per-iteration statistics); the counts
# among them are integers >= 0.
HISTORY_KEYS = ("iteration", "inertia", "shift", "reassigned", "n_empty")
_HISTORY_COUNTS = ("iteration", "reassigned", "n_empty")
# Numbers where present (``daskmeans info`` prints them).
_HISTORY_OPTIONAL = ("seconds", "imbalance", "gb_per_s")
# The backends a model may name (``backend_``: what predict asks for).
_BACKENDS = (None, "auto", "numpy", "cupy", "cpu", "gpu")


def checksum(attrs: dict, arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over the attributes (canonical JSON, without the checksum) and each array's
    name, dtype, shape and bytes: what a model and a checkpoint carry as ``checksum``."""
    h = hashlib.sha256()
    h.update(json.dumps({k: v for k, v in attrs.items() if k != "checksum"}, sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(_raw(a))  # the array's own memory: a copy of a wide model's centroids cost as much as the hash
    return h.hexdigest()


def _raw(a: np.ndarray) -> np.ndarray:
    """The bytes of C-contiguous ``a`` as a flat uint8 view (no copy): what ``a.tobytes()``
    holds, for a hash or a file's write."""
    return a.reshape(-1).view(np.uint8)


def is_number(v: Any) -> bool:
    """Whether ``v`` is a finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _short(v: Any, most: int = 60) -> str:
    """``repr(v)``, cut to ``most`` characters, for a message."""
    r = repr(v)
    return r if len(r) <= most else r[: most - 3] + "..."


def history_problem(history: Any, length: int) -> str | None:
    """What makes ``history`` no well-formed record of ``length`` completed iterations (one
    entry each, numbered from 1, with the numbers :data:`HISTORY_KEYS`), or None."""
    if not isinstance(history, list):
        return (f"its history is {_short(history)}, should be a list of one record per completed "
                f"iteration ({length})")
    if len(history) != length:
        return f"its history has {len(history)} entries, should have one per completed iteration ({length})"
    for i, h in enumerate(history, 1):
        if (not isinstance(h, dict) or not all(is_number(h.get(k)) for k in HISTORY_KEYS)
                or not all(_is_count(h[k]) for k in _HISTORY_COUNTS)
                or not all(is_number(h[k]) for k in _HISTORY_OPTIONAL if k in h)):
            return (f"history entry {i} should be a record of numbers {', '.join(HISTORY_KEYS)} "
                    f"({', '.join(_HISTORY_COUNTS)} integers >= 0), not {_short(h)}")
        if h["iteration"] != i:
            return f"history entry {i} is numbered {h['iteration']!r}"
    return None


def jsonable(obj: Any) -> Any:
    """Attributes as plain JSON (NumPy scalars and arrays become numbers and lists)."""
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def _write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def write_group(root: str, arrays: dict[str, np.ndarray], attrs: dict) -> None:
    """A Zarr (format 3) group at the new directory ``root``: each array ``(n,)`` or ``(n, d)``
    whole in one uncompressed chunk, and ``attrs`` as the group's JSON attributes.

    Written from the format's specification rather than through zarr-python, whose imports
    (zarr, numcodecs, fsspec: docs/performance.md, "Startup") cost a fit command more than writing its
    model; zarr-python reads what this writes (the readers use it).
    """
    _write_group(root, arrays, lambda: attrs)


def write_signed(root: str, arrays: dict[str, np.ndarray], attrs: dict) -> dict:
    """:func:`write_group` of ``attrs`` with their :func:`checksum` over ``attrs`` and
    ``arrays`` added as ``checksum``, the hash taken on a thread while the arrays are written
    (SHA-256 and the file writes both release the interpreter lock: a wide model's write
    then takes about the longer of the two, not their sum). Returns the attributes written."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="daskmeans-checksum") as pool:
        digest = pool.submit(checksum, attrs, arrays)
        return _write_group(root, arrays, lambda: {**attrs, "checksum": digest.result()})


def _write_group(root: str, arrays: dict[str, np.ndarray], attrs: Callable[[], dict]) -> dict:
    """The group at the new directory ``root``: each of ``arrays`` as a Zarr array of one
    uncompressed chunk, then ``attrs()`` (asked for once the arrays are written) as its JSON
    attributes; returns them."""
    os.mkdir(root)
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
            f.write(_raw(a.astype(a.dtype.newbyteorder("<"), copy=False)))
    done = attrs()
    _write_json(os.path.join(root, "zarr.json"), {"zarr_format": 3, "node_type": "group", "attributes": done})
    return done


def save_model(path: str, centroids: np.ndarray, attrs: dict, sizes: np.ndarray | None = None) -> None:
    """Write ``centroids`` (K, D), the rows per cluster ``sizes`` (K,) if known, and JSON
    ``attrs`` as a Zarr group at ``path``, with the ``checksum`` :func:`load_model` verifies.

    Parameters
    ----------
    path : str
    centroids : ndarray (K, D) float32 or float64
    attrs : dict
        JSON-able attributes; :func:`load_model` expects at least ``params`` (with
        ``n_clusters``), ``n_features_in``, ``inertia`` and ``n_iter`` (see
        :func:`model_problem`).
    sizes : ndarray (K,) of int, optional
    """
    arrays = {"cluster_centers": np.asarray(centroids)}
    if sizes is not None:
        arrays["cluster_sizes"] = np.asarray(sizes, np.int64)
    doc = jsonable({"format": FORMAT, "format_version": FORMAT_VERSION, **attrs})
    with atomic_dir(path, kind="model") as tmp:
        write_signed(tmp, arrays, doc)


def open_group(path: str, fmt: str, what: str, missing: str) -> tuple:
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
    """Read and verify a model written by :func:`save_model`: ``(centroids, attrs, sizes or None)``.

    Parameters
    ----------
    path : str

    Returns
    -------
    centroids : ndarray (n_clusters, n_features_in) float32 or float64
    attrs : dict
        The JSON attributes (``checksum`` among them for a version-2 model).
    sizes : ndarray (n_clusters,) int64 or None

    Raises
    ------
    DataError
        One line naming ``path``: no model there, a format newer than this daskmeans reads,
        a checksum that does not match the contents (``PATH is damaged: checksum mismatch
        ...``), or contents that contradict themselves (``PATH is damaged: cluster_centers
        has shape (3, 5); the attributes say n_clusters=3, n_features_in=4``; see
        :func:`model_problem`). A version-1 model (no checksum) gets the consistency checks
        only.
    """
    g, attrs = open_group(path, FORMAT, "model", f"no such model: {path}")
    version = attrs.get("format_version")
    if not _is_count(version, 1):
        raise DataError(f"{path} is damaged: format_version={_short(version)} should be an integer from 1 to "
                        f"{FORMAT_VERSION}")
    if version > FORMAT_VERSION:
        raise DataError(f"{path} has format_version={version}; this daskmeans reads <= {FORMAT_VERSION}")
    bad = f"{path} is damaged"
    try:
        arrays = {name: np.asarray(g[name][...]) for name in ("cluster_centers", "cluster_sizes") if name in g}
    except Exception as e:  # an array whose metadata or chunk cannot be read
        raise DataError(f"{bad}: its arrays cannot be read ({' '.join(str(e).split()) or type(e).__name__})") from None
    if "cluster_centers" not in arrays:
        raise DataError(f"{path} is not a daskmeans model: it has no cluster_centers array")
    if version >= 2 and attrs.get("checksum") != checksum(attrs, arrays):
        what = "it has no checksum" if "checksum" not in attrs else "checksum mismatch"
        raise DataError(f"{bad}: {what} (the model was changed after it was written); fit it again")
    centers, sizes = arrays["cluster_centers"], arrays.get("cluster_sizes")
    problem = model_problem(centers, attrs, sizes)
    if problem:
        raise DataError(f"{bad}: {problem}")
    return centers, attrs, sizes


def model_problem(centers: np.ndarray, attrs: dict, sizes: np.ndarray | None) -> str | None:
    """What makes a model's contents contradict themselves, or None.

    The centroids are finite float32 or float64 values of shape ``(params.n_clusters,
    n_features_in)`` whose squared norms stay within a quarter of the dtype's largest value:
    the kernels compute ``|x|^2 - 2 x.c + |c|^2`` in that dtype, and a larger centroid
    overflows every distance (centroids of 1e300 sent every row to cluster 0). A fit never
    writes one: the moments pass refuses data whose rows' squared norms can exceed that bound
    (:func:`daskmeans.numerics.grid.check_range`), and every centroid is a mean of rows, so
    no larger than they are.
    """
    from ..options import METRICS

    params = attrs.get("params")
    if not isinstance(params, dict):
        return f"params={_short(params)} should be a record of the estimator's parameters"
    k, d = params.get("n_clusters"), attrs.get("n_features_in")
    if not _is_count(k, 1):
        return f"params.n_clusters={_short(k)} should be an integer >= 1"
    if not _is_count(d, 1):
        return f"n_features_in={_short(d)} should be an integer >= 1"
    if centers.dtype not in (np.float32, np.float64):
        return f"cluster_centers have dtype {centers.dtype}, should be float32 or float64"
    if centers.shape != (k, d):
        return f"cluster_centers has shape {centers.shape}; the attributes say n_clusters={k}, n_features_in={d}"
    if attrs.get("dtype", centers.dtype.name) != centers.dtype.name:
        return f"dtype={_short(attrs['dtype'])} but cluster_centers are {centers.dtype.name}"
    finite = np.isfinite(centers)
    if not finite.all():
        i, j = (int(v) for v in np.argwhere(~finite)[0])
        return f"cluster_centers[{i}, {j}] is {centers[i, j]}; every centroid value should be finite"
    with np.errstate(over="ignore"):
        norms = np.square(centers.astype(np.float64)).sum(axis=1)
    limit = float(np.finfo(centers.dtype).max) / 4
    if not (norms <= limit).all():
        i = int(np.argmax(~(norms <= limit)))
        return (f"centroid {i} has a squared norm of {norms[i]:.3g} (values up to {np.abs(centers[i]).max():.3g}), "
                f"above {limit:.3g} (a quarter of the largest {centers.dtype.name}): every squared distance to it "
                f"overflows")
    if sizes is not None:
        if sizes.dtype.kind not in "iu" or sizes.shape != (k,) or (sizes < 0).any():
            return (f"cluster_sizes ({sizes.dtype}, shape {sizes.shape}) should be {k} counts (integers >= 0), one "
                    f"per cluster")
    metric = params.get("metric", "euclidean")
    if metric not in METRICS:
        return f"params.metric={_short(metric)} should be one of {', '.join(map(repr, METRICS))}"
    if not is_number(attrs.get("inertia")):
        return f"inertia={_short(attrs.get('inertia'))} should be a finite number"
    n_iter = attrs.get("n_iter")
    if not _is_count(n_iter):
        return f"n_iter={_short(n_iter)} should be an integer >= 0"
    if attrs.get("n_samples_fit") is not None:
        if not _is_count(attrs["n_samples_fit"], 1) or not is_number(attrs.get("sample_inertia")):
            return (f"n_samples_fit={_short(attrs['n_samples_fit'])} and sample_inertia="
                    f"{_short(attrs.get('sample_inertia'))} should be an integer >= 1 and a finite number")
    history = attrs.get("history", [])
    if history != []:  # a MiniBatchKMeans model has none; a KMeans model one entry per iteration
        problem = history_problem(history, n_iter)
        if problem:
            return problem
    names = attrs.get("feature_names_in")
    if names is not None and (not isinstance(names, list) or len(names) != d
                              or not all(isinstance(n, str) for n in names)):
        return f"feature_names_in={_short(names)} should be a list of n_features_in={d} strings"
    if attrs.get("backend") not in _BACKENDS:
        return f"backend={_short(attrs.get('backend'))} should be one of {', '.join(map(repr, _BACKENDS[1:]))}"
    return None


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
    marker = {"format": FORMATS[kind], "format_version": OUTPUT_VERSION} if kind else {}
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
            _run_writes(writes, tmp)


def write_data(X: Any, path: str) -> None:
    """Write the rows ``X`` (n, d) as a daskmeans data store at ``path``: a Zarr array in
    row chunks, written atomically block by block (nothing larger than one chunk in memory),
    the format :func:`daskmeans.read` reads fastest and ``daskmeans generate`` writes.

    Parameters
    ----------
    X : array (n, d)
        A Dask array, or anything :func:`daskmeans.read` takes (NumPy, a DataFrame...).
    path : str
        A new path, or a daskmeans data store to replace.
    """
    from .readers import read

    write_array(read(X), os.fspath(path), kind="data")


def _write_block(block: np.ndarray, root: str, name: str | None, start: tuple[int, ...]) -> None:
    """On a worker: write one block into the array at ``root`` (``name`` in its group).

    The client cannot stop a write already running on a worker. An abandoned write (failed or
    interrupted) removes the root's metadata first, then waits for the writes under way
    (:func:`_abandon`): a write counts as under way from before it looks for the metadata, so
    one that starts after the removal writes nothing, and the client removes the directory only
    once none still runs (a write recreates the directories of its chunk, and a process ending
    in the middle of one would leave them). Where the client cannot wait (a worker it no longer
    reaches), a write that finds the metadata gone once it has written removes what it made.
    """
    import zarr

    meta = os.path.join(root, "zarr.json")
    with _writing(root):
        if not os.path.exists(meta):  # abandoned: opening would make the directory again
            return
        try:
            arr = zarr.open_array(root, path=name or "", mode="r+").with_config({"write_empty_chunks": True})
            arr[tuple(slice(s, s + n) for s, n in zip(start, np.shape(block)))] = np.asarray(block)
        finally:
            if not os.path.exists(meta):
                shutil.rmtree(root, ignore_errors=True)


# The block writes running in this process (a worker's, or the in-process workers of a
# command's local cluster), per root directory: what :func:`_abandon` waits for.
_WRITING: dict[str, int] = {}
_WRITING_CHANGED = threading.Condition()
# How long an abandoned write waits for the block writes under way (each writes one chunk)
# before it removes the directory anyway.
ABANDON_WAIT_S = 60.0


@contextlib.contextmanager
def _writing(root: str) -> Iterator[None]:
    """Count a block write into ``root`` as under way in this process while the block runs."""
    with _WRITING_CHANGED:
        _WRITING[root] = _WRITING.get(root, 0) + 1
    try:
        yield
    finally:
        with _WRITING_CHANGED:
            _WRITING[root] -= 1
            if not _WRITING[root]:
                del _WRITING[root]
            _WRITING_CHANGED.notify_all()


def writes_under_way(root: str) -> int:
    """The block writes into ``root`` running in this process."""
    with _WRITING_CHANGED:
        return _WRITING.get(root, 0)


async def _await_writes(root: str, timeout: float) -> bool:
    """On a worker (:meth:`distributed.Client.run`, on its event loop, which a blocking wait
    would stall: in-process workers share it): whether the block writes into ``root`` here
    ended within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while writes_under_way(root):
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.005)
    return True


def _abandon(root: str, client: Any = None, futures: list = ()) -> None:
    """Stop the block writes into ``root`` before its directory is removed: remove its metadata
    (a write starting now writes nothing), cancel the ``futures`` of ``client`` not yet
    started, then wait on every worker, and in this process, for the writes under way (at most
    :data:`ABANDON_WAIT_S`; a worker or scheduler that cannot be reached is left to the
    writes' own clean-up)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, "zarr.json"))
    # A client that lost its scheduler ("connecting": Dask has cancelled every future) would
    # wait for it to come back; the workers' writes then clean up after themselves.
    if client is not None and getattr(client, "status", "running") == "running":
        with contextlib.suppress(Exception):
            client.cancel(list(futures), force=True)
        with contextlib.suppress(Exception):
            client.run(_await_writes, root, ABANDON_WAIT_S, on_error="ignore")
    with _WRITING_CHANGED:
        _WRITING_CHANGED.wait_for(lambda: root not in _WRITING, ABANDON_WAIT_S)


def _run_writes(writes: list, root: str) -> None:
    """Run the block writes into ``root``, each counted as done
    (:func:`daskmeans.progress.advance`): on the distributed client when there is one, else (or
    where ``dask.config`` names a local scheduler) on Dask's threads. Either way it returns or
    raises once no write still runs: at the first failure or interruption the writes not
    started are cancelled and those under way awaited (:func:`_abandon`; Dask's threaded
    scheduler raises at the first failure while other writes go on), since the caller then
    removes the directory they write into."""
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
        except BaseException:
            _abandon(root)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    from distributed import as_completed

    futs: list = []
    try:
        futs = client.compute(writes)
        for written, fut in enumerate(as_completed(futs), 1):
            if fut.status == "error":
                fut.result()  # raises the write's error
            advance(written)
        client.gather(futs)
    except BaseException:
        _abandon(root, client, futs)
        raise
