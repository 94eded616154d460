"""Re-fits on the same data reuse its placement: a small cache per client.

A fit spends, besides its init and iterations, a plan (the workers' budgets), a placement
(the chunks persisted and grouped into shards) and a moments pass. ``n_init`` runs inside one
fit share them already; fits one after another on the same data (an elbow loop,
:func:`daskmeans.sweep`, ``GridSearchCV`` over ``n_clusters``, ``KMeans.fit`` run again in a
notebook) would repeat them. After a fit that ends well its placement stays on the workers,
held here with what planning measured (the workers' budgets) and the moments, and the next fit
of the same data on the same client takes it instead of placing again.

The same data means, on the same client and the same workers:

- before planning (:func:`source_key`): the Dask keys and chunks of the array and of the
  weights, the dtype, the backend, the requested tier, the memory budgets asked for, and for
  the files daskmeans reads (the read's ``Table.files()``: the path read and those the array's
  graph names) their size and modification times, since those readers' keys name the path,
  not the contents;
- after planning (:class:`Placed`, the entry's key): what the plan chose for the data found
  by the source key, the rows of each chunk placed (its chunking), the tier and the kernels'
  tunables. A fit whose plan chooses another tier (a larger K) places again.

A fit takes the entry out of the cache for its duration (two fits at once never share shards:
the second places its own) and puts its placement back only when it ends without error, once
its labels are out of the shards. Entries are dropped when a worker of theirs has left the
cluster, when their client is closed, by :func:`release`, and beyond :data:`KEEP` datasets per
client or what the workers' host budget holds. Data held in GPU memory is released before a
fit of other data is planned: a GPU's budget is its free memory, and planning with cached data
resident would plan around memory the fit could have had.

Results are bitwise those of a fit that places afresh: every step is deterministic given the
chunks, and the shards' workspaces are overwritten by each run before they are read.
"""

from __future__ import annotations

import atexit
import collections
import copy
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import dask.array as da
from distributed import Client

from ..backends import get_backend
from .placement import Placement

# Datasets kept per client (the most recently fitted last).
KEEP = 2

_LOCK = threading.Lock()
# client.id -> (weak reference to the client, its entries by source key, oldest first)
_CACHES: dict[str, tuple[weakref.ref, collections.OrderedDict]] = {}


class Source(NamedTuple):
    """What identifies a fit's data and resources before planning (:func:`source_key`)."""

    data: tuple  # the array's name, chunks and dtype
    weights: tuple | None  # the weights' name and chunks
    backend: str
    tier: str  # as requested
    budgets: tuple  # the memory budgets asked for (bytes or None)
    workers: tuple  # (address, threads) of every worker, sorted
    files: tuple  # (path, signature) of the files read


class Placed(NamedTuple):
    """What identifies a placement of the data of one :class:`Source` (an entry is found by the
    source, then compared by this): the plan's choices, made without looking at the data again.
    The chunks placed follow from the source's array and weights, the plan's rows per chunk
    and the workers' balance, so their rows identify them."""

    chunks: tuple  # the rows of each chunk placed (the fit's chunking)
    tier: str  # as planned
    tunables: Any  # the kernels' settings its shards run with (backends.protocol.Tunables)


@dataclass
class Entry:
    """A placement kept for the next fit of the same data.

    Attributes
    ----------
    source : Source
        :func:`source_key` of the fit that placed it.
    budgets : dict of str to dict
        The workers' budgets its plan measured (``engine.plan.worker_budgets``).
    key : Placed
        What the plan chose for the placement.
    placement : Placement
    moments : dict or None
        The moments pass's result (``engine.moments.data_moments``); ``digest`` says whether
        it holds the content digest.
    digest : bool
    share : int
        Bytes of data per worker it holds (the plan's largest share).
    """

    source: Source
    budgets: dict
    key: Placed
    placement: Placement
    moments: dict | None
    digest: bool
    share: int

    @property
    def on_device(self) -> bool:
        """Whether the data is held in GPU memory (the device tier of a GPU backend)."""
        held = self.placement.tier.resident_backend(self.placement.backend)
        return held is not None and not get_backend(held).on_host

    @property
    def host_bytes(self) -> int:
        """Bytes per worker held in host memory (a tier that re-reads its rows holds none)."""
        return 0 if self.on_device else self.placement.tier.kept_bytes(self.share)


def source_key(client: Client, X: da.Array, sample_weight: da.Array | None, backend: str, tier: str,
               memory_limit: int | None, device_memory_limit: int | None, files: tuple[str, ...] = ()) -> Source:
    """What identifies a fit's data and resources before planning (see the module docstring).

    Parameters
    ----------
    client : distributed.Client
    X : dask array (n, d), as the fit receives it
    sample_weight : dask array (n,) or None
    backend : str
        The resolved backend ("numpy", "cupy").
    tier : str
        The requested tier ("auto", "device", "host", "storage").
    memory_limit, device_memory_limit : int or None
        The budgets asked for, resolved (``engine.plan.budget_limits``).
    files : tuple of str
        The files ``X`` is read from (absolute paths: the reader's ``Table.files()``, the path
        read and those its graph names), found once by the read.
    """
    w = None if sample_weight is None else (sample_weight.name, sample_weight.chunks)
    return Source((X.name, X.chunks, str(X.dtype)), w, backend, tier, (memory_limit, device_memory_limit),
                  tuple(sorted(client.nthreads().items())), _files(files))


def _files(files: tuple[str, ...]) -> tuple:
    """Size and modification times of the files daskmeans reads the data from (``files``): a
    reader's keys name the path, so a file written again would otherwise look like the same
    data."""
    paths = {os.path.abspath(p) for p in files if os.path.exists(p)}
    return tuple((p, _signature(p)) for p in sorted(paths))


def _signature(path: str) -> tuple:
    """(files, bytes, latest modification in ns) of a file or of every file under a directory."""
    if not os.path.isdir(path):
        st = os.stat(path)
        return (1, st.st_size, st.st_mtime_ns, st.st_ino)
    n = size = latest = 0
    for root, dirs, files in os.walk(path):
        latest = max(latest, os.stat(root).st_mtime_ns)
        for f in files:
            st = os.stat(os.path.join(root, f))
            n, size, latest = n + 1, size + st.st_size, max(latest, st.st_mtime_ns)
    return (n, size, latest)


def _open(client: Client | None) -> bool:
    return client is not None and client.status in ("running", "connecting", "newly-created")


def _entries(client: Client) -> collections.OrderedDict:
    """``client``'s entries (made on first use; none kept for a closed client); the caches of
    closed clients are dropped (the scheduler released their data when they closed)."""
    for cid, (ref, _) in list(_CACHES.items()):
        if not _open(ref()):
            del _CACHES[cid]
    if not _open(client):
        return collections.OrderedDict()
    if client.id not in _CACHES:
        _CACHES[client.id] = (weakref.ref(client), collections.OrderedDict())
    return _CACHES[client.id][1]


def _usable(entry: Entry, workers: set) -> bool:
    """Every shard still in memory, on a worker of the cluster."""
    p = entry.placement
    return set(p.workers) <= workers and all(f.status == "finished" for f in p.shards)


def take(client: Client, source: Source) -> Entry | None:
    """The entry of ``source`` on ``client``, taken out of the cache for the fit (put it back
    with :func:`put`), or None. Entries whose workers left the cluster are dropped; on a miss,
    so are those held in GPU memory (see the module docstring)."""
    workers = {w for w, _ in source.workers}
    with _LOCK:
        entries = _entries(client)
        dropped = [entries.pop(s) for s, e in list(entries.items()) if not _usable(e, workers)]
        entry = entries.pop(source, None)
        if entry is None:
            dropped += [entries.pop(s) for s, e in list(entries.items()) if e.on_device]
    _wait_dropped(client, dropped, wait=any(e.on_device for e in dropped))
    return entry


def make_room(client: Client, host_bytes: int, host_budget: int) -> None:
    """Drop the oldest entries of ``client`` until those left and a placement of
    ``host_bytes`` per worker fit the workers' host budget ``host_budget``, with room for
    this one among :data:`KEEP`."""
    with _LOCK:
        entries = _entries(client)
        dropped = []
        while entries and (len(entries) >= KEEP
                           or sum(e.host_bytes for e in entries.values()) + host_bytes > host_budget):
            dropped.append(entries.popitem(last=False)[1])
    _wait_dropped(client, dropped)


def put(client: Client, entry: Entry) -> None:
    """Keep ``entry`` for the next fit of its data on ``client`` (the newest; the oldest
    beyond :data:`KEEP` are dropped)."""
    with _LOCK:
        entries = _entries(client)
        entries.pop(entry.source, None)
        entries[entry.source] = entry
        while len(entries) > KEEP:
            entries.popitem(last=False)


# ---------------------------------------------------------------- the end of the process


def _release_at_exit() -> None:
    """At the interpreter's exit, release what is kept (before distributed closes the clusters
    still open: this module registers after distributed's own exit handlers, which run later).

    Kept data is wanted by its client until :func:`release`; a script that ends with its
    cluster and client open had distributed close the cluster first, and the scheduler logged
    per worker "Removing worker ... caused the cluster to lose already computed task(s), which
    will be recomputed elsewhere: {'daskmeans-shard-...'}": alarming, and about nothing."""
    try:
        release(timeout=5.0)
    except Exception:  # noqa: BLE001  (a client closing meanwhile: nothing is left to release)
        pass


atexit.register(_release_at_exit)


def drop(client: Client, entries: list) -> None:
    """Release ``entries`` (taken out of the cache; the list, emptied here, must hold their
    last references), waiting for the workers to drop what is held in GPU memory."""
    _wait_dropped(client, entries, wait=any(e.on_device for e in entries))


def moments_of(entry: Entry | None, key: Placed, digest: bool) -> dict | None:
    """The moments ``entry`` holds for placement ``key`` (with the digest when asked), a copy;
    None when it holds none."""
    if entry is None or entry.key != key or entry.moments is None or (digest and not entry.digest):
        return None
    return copy.deepcopy(entry.moments)


def held(client: Client) -> list[dict]:
    """What ``client``'s cache holds, oldest first: per dataset its Dask ``name`` (of the
    data's array, before the fit's chunking), ``tier``, ``workers`` and the keys of its ``shards``."""
    with _LOCK:
        return [{"name": e.source.data[0], "tier": e.placement.tier.name, "workers": list(e.placement.workers),
                 "shards": [f.key for f in e.placement.shards]} for e in _entries(client).values()]


def release(client: Client | None = None, timeout: float = 10.0) -> int:
    """Release the data that fits keep on the workers for the next fit of the same data.

    After a fit its data stays placed on the workers (at most the last two datasets per
    client), so that fitting the same data again on the same client (``n_init`` across calls,
    an elbow loop, ``GridSearchCV`` over ``n_clusters``, a notebook) does not read, place and
    scan it again. Call this to give that memory back.

    Parameters
    ----------
    client : distributed.Client, optional
        Release only what was kept for this client's fits; default every client's.
    timeout : float, default 10
        Seconds to wait for the workers to drop the data before returning.

    Returns
    -------
    int
        How many datasets were released.
    """
    with _LOCK:
        if client is None:
            groups = [(ref(), list(entries.values())) for ref, entries in _CACHES.values()]
            for _, entries in _CACHES.values():
                entries.clear()
        else:
            entries = _entries(client)
            groups = [(client, list(entries.values()))]
            entries.clear()
    n = 0
    for c, dropped in groups:
        n += len(dropped)
        if c is None:
            dropped.clear()
        else:
            _wait_dropped(c, dropped, timeout=timeout)
    return n


def _holding(keys: list, dask_worker: Any) -> list:
    return [k for k in keys if k in dask_worker.data]


def _wait_dropped(client: Client, entries: list, *, wait: bool = True, timeout: float = 10.0) -> None:
    """Forget ``entries`` (the list holds the last references to their shards: it is emptied)
    and, with ``wait``, wait up to ``timeout`` seconds until no worker holds their shards any
    more (the memory is back before the next plan measures it)."""
    keys = [f.key for e in entries for f in e.placement.shards]
    entries.clear()
    if not wait or not keys or client.status != "running":
        return
    deadline = time.monotonic() + timeout
    # The workers usually let go almost at once: looks close together at first, then further
    # apart (a fixed pause between looks cost every fit of new data once two datasets were
    # kept, a large share of suites of many small fits: docs/performance.md, "Kept placements
    # released").
    pause = 0.001
    while time.monotonic() < deadline:
        try:
            if not any(client.run(_holding, keys).values()):
                return
        except Exception:  # a worker leaving meanwhile: its data is gone with it
            return
        time.sleep(pause)
        pause = min(0.05, 2 * pause)
