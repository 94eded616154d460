"""Daskmeans' own copy of a user's Dask graph: its tasks under keys of daskmeans' own.

A fit persists its data and builds shards from it; the shards (kept for the next fit of the
same data, :mod:`daskmeans.engine.reuse`) and the lazy ``labels_`` depend on those keys, so the
scheduler keeps knowing them after the fit. Persisted under the user's own keys, they were
known with the run_spec that daskmeans' persist made of them (optimised: the reader's tasks
fused, the user's key an alias of the fused task); the user's next computation on the same
``X`` (``X.sum().compute()``, a dask-ml fit, one update_graph per iteration) sends those keys
again with another run_spec, and distributed warns on every such call "Detected different
`run_spec` ... can cause failures and deadlocks". :func:`own_keys` renames every task of the
(optimised) graph with a prefix and a token of its key and of the placement, so no key
daskmeans submits is a key of the user's graph, nor one of an earlier placement (whose keys
the scheduler may still know, with other scattered data under them: the same run_spec
problem on daskmeans' own keys). Re-fits still reuse a placement: the cache
(:mod:`daskmeans.engine.reuse`) identifies data by the user's names, before renaming.

Keys that are already futures (an array the user persisted or scattered) are left as they are:
their data is on the cluster and the scheduler holds no run_spec for them. The renamed array's
own chunks that are futures (``X.persist()``) are aliases of them under the new name.

In-memory data (a NumPy array cut into row chunks by :func:`daskmeans.io.blocks.from_memory`)
is made of data nodes that would travel inside the graph (distributed warns "Sending large
graph of size 61.04 MiB" for a 1e6 x 16 array): with ``scatter``, data of that size is
scattered instead, each chunk to the worker that will hold it, and the futures are returned so
that the placement keeps them alive (its shards are made again from them if Dask needs to).
"""

from __future__ import annotations

import uuid
from typing import Any

import dask
import dask.array as da

PREFIX = "daskmeans-data"
# The name prefix of the chunks of an array in memory (io/blocks.py's from_memory).
MEMORY = "daskmeans-memory-"


def _is_future(value: Any) -> bool:
    return type(value).__name__ == "Future" and hasattr(value, "key") and hasattr(value, "client")


def _renamed(key: Any, token: str) -> Any:
    """``key`` under daskmeans' name: ``(name, i, j)`` keeps its indices (an array's chunk),
    any other key becomes one string."""
    from dask.base import tokenize

    if isinstance(key, tuple) and key and isinstance(key[0], str):
        return (f"{PREFIX}-{tokenize(key[0], token)}",) + key[1:]
    return f"{PREFIX}-{tokenize(key, token)}"


def own_keys(x: da.Array, client: Any = None, *, scatter: bool = False) -> tuple[da.Array, list]:
    """``x`` with every task under a key of daskmeans' own (see the module docstring).

    Parameters
    ----------
    x : dask array
    client : distributed.Client, optional
        Needed with ``scatter``.
    scatter : bool, default False
        Scatter the chunks of an array in memory (:data:`MEMORY`) found in the graph
        instead of sending them inside it, where they would make a graph distributed warns of
        (``distributed.admin.large-graph-warning-threshold``): in row order, equal rows per
        worker (so that the placement moves none). Smaller data, and a user's own graph, keep
        their data nodes: they are the lineage from which Dask makes a chunk lost with a worker
        again, also after the fit (``labels_``); scattered data lost with a worker is placed
        again by a fit under way (engine/job.py), but a finished fit's lazy results that need
        it cannot be computed.

    Returns
    -------
    (dask array, list of futures)
        The same values, chunks and meta, named ``daskmeans-data-<token>`` (new names at
        each call); the scattered futures (keep them for as long as results made from the
        array may be made again).
    """
    from dask._task_spec import Alias, DataNode, convert_legacy_graph
    from dask.core import flatten

    (opt,) = dask.optimize(x)
    dsk = dict(opt.__dask_graph__())
    # dask.optimize drops the chunks of a persisted array whose futures have finished (its
    # graph comes back empty): they are taken from the graph as given (only then: a graph's
    # materialisation costs as much as the optimisation).
    if any(k not in dsk for k in flatten(opt.__dask_keys__())):
        dsk.update((k, v) for k, v in dict(x.__dask_graph__()).items() if _is_future(v) and k not in dsk)
    futures = {k: v for k, v in dsk.items() if _is_future(v)}
    nodes = convert_legacy_graph({k: v for k, v in dsk.items() if k not in futures}, all_keys=set(dsk))
    token = uuid.uuid4().hex  # see the module docstring: new keys for each placement
    rename = {k: _renamed(k, token) for k in nodes}
    held: list = []
    data = sorted((k for k, v in nodes.items() if isinstance(v, DataNode) and _name(k).startswith(MEMORY)), key=str)
    if scatter and client is not None and data and _nbytes(nodes, data) > _large_graph_bytes():
        data.sort(key=lambda k: k[1:] if isinstance(k, tuple) else ())  # row order
        rows = [int(getattr(nodes[k].value, "shape", (1,))[0]) for k in data]
        owner = balance_owners([None] * len(data), rows, dict.fromkeys(sorted(client.nthreads()), 1))
        for w in dict.fromkeys(owner):
            mine = [k for k, o in zip(data, owner) if o == w]
            for k, f in zip(mine, client.scatter([nodes[k].value for k in mine], hash=False, workers=[w])):
                futures[f.key] = f
                nodes[k] = Alias(k, f.key)
                held.append(f)
    out: dict = {rename[k]: node.substitute(rename, key=rename[k]) for k, node in nodes.items()}
    out.update(futures)
    # A chunk that is itself a future (the array persisted: every chunk) is the renamed
    # array's chunk through an alias: the new name's keys must exist in the graph.
    for k in futures:
        if _name(k) == opt.name:
            new = _renamed(k, token)
            out[new] = Alias(new, k)
    name = _renamed((opt.name,), token)[0]
    return da.Array(out, name, x.chunks, meta=x._meta), held


def _nbytes(nodes: dict, keys: list) -> int:
    return int(sum(getattr(nodes[k].value, "nbytes", 0) for k in keys))


def _large_graph_bytes() -> int:
    """The size of graph from which distributed warns ("Sending large graph")."""
    from dask.utils import parse_bytes

    return parse_bytes(dask.config.get("distributed.admin.large-graph-warning-threshold", "10MB"))


def _name(key: Any) -> str:
    return str(key[0] if isinstance(key, tuple) and key else key)


def balance_owners(holders: list, rows: list[int], nthreads: dict[str, int]) -> list[str]:
    """A worker for each chunk: rows spread in proportion to ``nthreads`` (weights), keeping
    each chunk where it already is unless its holder is full (then it moves to the emptiest).

    Persisting does not balance by itself: chunks of an in-memory array all depend on one
    key and land on one worker.
    """
    total_threads = sum(nthreads.values())
    total_rows = sum(rows)
    target = {w: total_rows * t / total_threads for w, t in nthreads.items()}
    load = dict.fromkeys(nthreads, 0.0)
    owner: list[str | None] = [None] * len(rows)
    for i, h in enumerate(holders):
        if h in load and load[h] + rows[i] / 2 <= target[h]:
            owner[i] = h
            load[h] += rows[i]
    for i in range(len(rows)):
        if owner[i] is None:
            w = max(load, key=lambda w: (target[w] - load[w], w))
            owner[i] = w
            load[w] += rows[i]
    return owner  # type: ignore[return-value]
