"""Memory budgets, the memory tier of a fit, the kernels' settings, and the preflight check,
before any data moves.

Each worker has a host budget (``memory_limit``: default half the Dask worker's memory limit,
or of the memory available) and, for a device backend, a device budget (``device_memory_limit``:
default what the backend says its device has free, :meth:`Backend.device_budget
<daskmeans.backends.protocol.Backend.device_budget>`: on a GPU its free memory and what
CuPy's pool holds free for reuse, within the pool's limit if one is set). Nothing here
imports an array library. The loop needs a working set besides the data (centroids, the
iteration buffers, the kernels' tiles); the data's share per worker then decides the tier:

- ``device`` (GPU): the rows are resident on the GPU;
- ``host``: resident in host memory (pinned, on a GPU worker: copied to the GPU chunk by
  chunk each pass);
- ``storage``: re-read from the source each pass, a thread reading ahead.

The kernels' settings (:func:`kernel_tunables`: tile bytes, GEMM modes) are resolved here, on
the client, once per plan (``TierPlan.tunables``), and travel to the backend with the fit's
shards: the workers never read them from their configuration.

The result is bitwise the same in every tier (the same chunks meet the same kernels). A
working set that fits no budget is refused here, in one line with the numbers and the flag
that would change them, rather than as an out-of-memory error in the middle of a fit.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Sequence

import dask.array as da
from dask.utils import format_bytes, parse_bytes
from distributed import Client

from .. import config
from ..backends import backend_here, get_backend
from .devices import on_worker_device
from ..backends.bounds import bound_bytes
from ..backends.protocol import Tunables
from ..errors import DaskmeansError
from ..io.readers import split_rows
from . import tiers as tier_registry


@dataclass(frozen=True)
class TierPlan:
    """The chosen tier and the figures behind it (bytes per worker)."""

    tier: str
    share: int  # the largest data share of one worker
    working: int  # what the loop needs besides the data
    host_budget: int
    device_budget: int | None
    chunk_rows: int | None = None  # rows per chunk to place (cut to fit the budget, grown for GPU workers), or as read
    iteration_seconds: float | None = None  # an estimate of one iteration's time (2 N K D at the workers' step rate)
    flop_rate: float | None = None  # the slowest worker's step rate (2 N K D FLOP/s), measured, or a GPU's nominal one
    tunables: Tunables | None = None  # the kernels' settings, resolved here on the client (kernel_tunables)

    def describe(self) -> str:
        dev = "" if self.device_budget is None else f", device budget {format_bytes(self.device_budget)}"
        return (f"tier {self.tier}: {format_bytes(self.share)} of data per worker, host budget "
                f"{format_bytes(self.host_budget)}{dev}")


def _budget_on_worker(memory_limit: int | None, device_memory_limit: int | None, backend: str | None = None,
                      dask_worker: Any = None) -> dict:
    """On a worker: its host budget and, where ``backend`` (None: what ``auto`` would run
    here) has a device, its device budget (bytes), its step rate and its multiprocessors,
    asked of the backend (:meth:`~daskmeans.backends.protocol.Backend.device_budget`)."""
    host = memory_limit
    if host is None:
        # A device worker's share of the host (engine/devices.py: it gives Dask no limit), else
        # the Dask worker's limit.
        limit = getattr(dask_worker, "memory_share", None) or getattr(
            getattr(dask_worker, "memory_manager", None), "memory_limit", None)
        if not limit:
            import psutil

            limit = psutil.virtual_memory().available
        host = int(limit * 0.5)  # the other half: Dask, Python, labels, read-ahead, spikes
    be = backend_here(backend)
    with on_worker_device(dask_worker):  # an in-process worker's own GPU, not the thread's
        budget = be.device_budget()
    device = None if budget is None else int(budget.free) if device_memory_limit is None else int(device_memory_limit)
    return {"host": int(host), "device": device, "flops": float(be.step_rate()),
            "sm_count": 0 if budget is None else int(budget.processors)}


def iteration_warning(n: int, k: int, d: int, max_iter: int, plan: "TierPlan", n_workers: int) -> str | None:
    """A warning when a fit may run for more than ``daskmeans.warn-hours`` hours (the floor
    of one iteration, its GEMM of 2 N K D operations at the workers' rate, times
    ``max_iter``), else None."""
    if plan.iteration_seconds is None:
        return None
    total = plan.iteration_seconds * max_iter
    hours = float(config.get("warn-hours"))
    if total <= hours * 3600:
        return None
    return (f"this fit may take up to {total / 3600:.1f} h: each of up to max_iter={max_iter} iterations computes "
            f"2 x N x K x D = {2.0 * n * k * d:.3g} floating-point operations, at least {plan.iteration_seconds:.3g} s "
            f"on {n_workers} worker(s) at {plan.flop_rate / 1e9:.3g} GFLOP/s each; fewer clusters, a sample of the "
            f"rows or a lower max_iter shorten it")


def kernel_tunables() -> Tunables:
    """The kernels' settings (tile bytes, GEMM modes: :class:`~daskmeans.backends.protocol.Tunables`)
    from the ``daskmeans.*`` settings, resolved on the client once per plan and passed to the
    backend with the fit's work, so that no worker reads them from its configuration.

    Raises
    ------
    DaskmeansError
        A tile size that is not a size (naming the setting and its value).
    """
    try:
        return Tunables.from_settings(config.snapshot())
    except ValueError as e:
        raise DaskmeansError(str(e)) from None


def working_parts(k: int, d: int, n_chunks: int, chunk_bytes: int, rows_per_worker: int, backend: str,
                  sm_count: int = 0, tunables: Tunables | None = None, algorithm: str = "lloyd") -> dict[str, int]:
    """What one worker's loop needs besides its data, part by part (bytes): ``model``, K x D
    float64 centroids (current, previous, new), the iteration buffer (one int64 per sum, sent
    and received), a chunk's sums and the update's temporaries; ``tiles``, the kernels' own
    buffers (the backend's ``working_bytes`` for a chunk's rows on a device of ``sm_count``
    SMs); ``chunks``, two chunks in flight (the host tier's copy buffers, one being filled, one
    computed on; the storage tier's reads); ``labels``, the worker's rows' labels (3 x int32);
    with ``algorithm`` "yinyang", ``bounds``: its per-row bounds, the rank's kept partial
    sums (:func:`daskmeans.backends.bounds.bound_bytes`) and a GPU's centroids in group order. ``tunables``: the kernels' (None: :func:`kernel_tunables`)."""
    chunk_rows = max(1, chunk_bytes // max(1, d * 4))
    tunables = tunables if tunables is not None else kernel_tunables()
    parts = {
        "model": k * d * 8 * (3 + 2 + 2) + n_chunks * 8,
        "tiles": int(get_backend(backend).working_bytes(k, d, chunk_rows, sm_count, tunables)),
        "chunks": 2 * chunk_bytes,
        "labels": rows_per_worker * 4 * 3,
    }
    if algorithm == "yinyang":
        # the rank's kept sums (K x D int64, weights, counts), and on a GPU the step's centroids
        # in group order (their copy in the data dtype and the GEMM's: up to 3 D float32 a centroid)
        parts["bounds"] = bound_bytes(rows_per_worker, k) + (k * d + 2 * k) * 8 + k * d * 16
    return parts


def working_bytes(k: int, d: int, n_chunks: int, chunk_bytes: int, rows_per_worker: int, backend: str,
                  sm_count: int = 0, tunables: Tunables | None = None, algorithm: str = "lloyd") -> int:
    """The sum of :func:`working_parts`."""
    return int(sum(working_parts(k, d, n_chunks, chunk_bytes, rows_per_worker, backend, sm_count,
                                 tunables, algorithm).values()))


def _too_small(k: int, d: int, parts: dict[str, int], limit: int, memory: str, flag: str, chunk_rows: int,
               file_chunks: bool, rows: int, tile_setting: str) -> str:
    """The preflight's refusal: each part of the working set with what shrinks it, largest first."""
    chunks = (f"the file's chunks of {chunk_rows} rows, read whole: store it in smaller chunks" if file_chunks
              else f"chunks of {chunk_rows} rows, cut to an eighth of the budget")
    named = [
        (parts["chunks"], f"two chunks in flight {format_bytes(parts['chunks'])} ({chunks})"),
        (parts["labels"], f"labels of up to {rows} rows {format_bytes(parts['labels'])} (more workers)"),
        (parts["tiles"], f"kernel tiles {format_bytes(parts['tiles'])} (daskmeans.{tile_setting})"),
        (parts["model"], f"centroids and partial sums {format_bytes(parts['model'])} (fewer clusters or features)"),
    ]
    if "bounds" in parts:
        named.append((parts["bounds"], f"Yinyang's bounds {format_bytes(parts['bounds'])} (algorithm='lloyd' "
                                       f"needs none; more workers)"))
    named.sort(key=lambda p: -p[0])  # stable: ties keep the order above
    return (f"K x D = {k} x {d}: the loop needs {format_bytes(sum(parts.values()))} per worker besides its data, "
            f"more than its {memory} memory budget {format_bytes(limit)} ({flag}): "
            + ", ".join(text for _, text in named) + "; or a larger budget")


def plan(
    client: Client,
    X: da.Array,
    backend: str,
    k: int,
    tier: str = "auto",
    memory_limit: int | str | None = None,
    device_memory_limit: int | str | None = None,
    *,
    budgets: dict | None = None,
    own_chunks: bool = False,
    algorithm: str = "lloyd",
) -> TierPlan:
    """Choose the tier of ``X`` on the workers of ``client``, the fit's chunk size, and check
    the budgets.

    Chunks larger than an eighth of the budget are cut. On GPU workers, ``X`` read by
    daskmeans from a file (``own_chunks``) is read again in chunks of about
    ``daskmeans.gpu-chunk-bytes``, within that eighth of the workers' measured device budget:
    fewer, larger kernel calls (the GEMM tiles fill up) and fewer tasks. A caller's own
    chunks are only cut.

    Parameters
    ----------
    client : distributed.Client
    X : dask array (n, d)
    backend : str
        A registry name (``backends.REGISTRY``): its capabilities decide the budget that bounds
        the loop (``on_host``) and its tiles (``working_bytes``, ``tile_setting``).
    k : int
        Number of clusters (the working set grows with K x D).
    tier : {"auto", "device", "host", "storage"}
    memory_limit, device_memory_limit : int or str (``"4GiB"``), optional
        Per-worker budgets; default ``daskmeans.memory-limit`` / ``daskmeans.device-memory-limit``
        (``auto``: see the module docstring).
    budgets : dict of str to dict, optional
        The workers' budgets as :func:`worker_budgets` measured them for these limits (a
        re-fit of data still placed plans with those its placement was planned with); default:
        measured now.
    own_chunks : bool
        Whether ``X``'s row chunks are daskmeans' choice (a file it read, at
        ``daskmeans.chunk-bytes`` or the command's ``--chunk-bytes``) rather than the caller's.
    algorithm : str
        The loop's step (``params.ALGORITHMS``' values): "yinyang" keeps bounds per row.

    Raises
    ------
    DaskmeansError
        When the working set fits no budget, or a forced tier cannot hold the data.
    """
    asked = tier_registry.lookup(tier)  # None: "auto"; a name not registered is refused here
    tunables = kernel_tunables()  # once, here on the client: the fit's kernels get these
    gpu = not get_backend(backend).on_host
    unusable = None if asked is None else asked.unusable(gpu)
    if unusable is not None:  # before measuring the workers' budgets
        raise DaskmeansError(unusable)
    if budgets is None:
        budgets = worker_budgets(client, memory_limit, device_memory_limit)
    n_workers = max(1, len(budgets))
    host_budget = min(b["host"] for b in budgets.values())
    device_budget = min((b["device"] for b in budgets.values() if b["device"] is not None), default=None)
    if gpu and device_budget is None:
        raise DaskmeansError("the GPU backend was chosen but no worker reports a GPU")
    X = balance_chunks(X, n_workers)  # as place() will split it
    n, d = (int(s) for s in X.shape)
    item = X.dtype.itemsize
    limit, flag = (device_budget, "--device-memory-limit") if gpu else (host_budget, "--memory-limit")
    # Two chunks are in flight when a tier streams: chunks larger than an eighth of the budget
    # are cut (the result does not depend on the chunking).
    cap = max(int(config.get("min-chunk-rows")), limit // 8 // max(1, d * item))
    cut = cap if max(X.chunks[0]) > cap else None
    if cut is None and gpu and own_chunks and X.numblocks[0] > 1:
        # GPU kernels want large blocks: chunks of daskmeans.gpu-chunk-bytes where the file was
        # read in chunks of half that or less (the command's --chunk-bytes sets both).
        grown = min(cap, max(1, config.get_bytes("gpu-chunk-bytes") // max(1, d * item)))
        cut = grown if 2 * max(X.chunks[0]) <= grown else None
    if cut:
        X = balance_chunks(split_rows(X, cut), n_workers)
    chunk_rows = max(X.chunks[0])
    rows = -(-n // n_workers) + chunk_rows  # the balance keeps whole chunks: at most one more
    share = min(n, rows) * d * item
    sms = max(int(b.get("sm_count") or 0) for b in budgets.values()) if budgets else 0
    parts = working_parts(k, d, X.numblocks[0], chunk_rows * d * item, min(n, rows), backend, sms, tunables,
                          algorithm)
    working = sum(parts.values())
    if working > limit:
        raise DaskmeansError(_too_small(k, d, parts, limit, "device" if gpu else "host", flag, chunk_rows,
                                        chunk_rows > cap, min(n, rows), get_backend(backend).tile_setting))
    # The tier asked for where the data fits it (else its refusal), or auto's first that fits;
    # each tier weighs its own need (engine/tiers).
    tier = tier_registry.choose(tier, tier_registry.Need(share, working, gpu, host_budget, device_budget)).name
    rates = [float(b["flops"]) for b in budgets.values() if b.get("flops")]
    rate = min(rates) if rates else None
    seconds = 2.0 * n * k * d / (rate * n_workers) if rate else None
    return TierPlan(tier, share, working, host_budget, device_budget, cut, seconds, rate, tunables)


def budget_limits(memory_limit: int | str | None = None,
                  device_memory_limit: int | str | None = None) -> tuple[int | None, int | None]:
    """The host and device budgets asked for, in bytes (from the arguments, else the
    ``daskmeans.memory-limit`` / ``device-memory-limit`` settings); None for ``auto``."""
    return _bytes(memory_limit, "memory-limit"), _bytes(device_memory_limit, "device-memory-limit")


def worker_budgets(client: Client, memory_limit: int | str | None = None,
                   device_memory_limit: int | str | None = None, backend: str | None = None) -> dict:
    """Every worker's budgets and rate, measured on the worker by ``backend`` (a registry
    name; None: what ``auto`` runs on each): ``{address: {"host": bytes, "device": bytes or
    None, "flops": 2 N K D FLOP/s, "sm_count": int}}``."""
    return client.run(_budget_on_worker, *budget_limits(memory_limit, device_memory_limit), backend)


def _bytes(value: int | str | None, key: str) -> int | None:
    """A budget from an argument, else from ``daskmeans.<key>``; None for ``auto``."""
    if value is None:
        value = config.get(key)
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        out = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    except ValueError:
        raise DaskmeansError(f"{key}={value!r} should be a size such as '4GiB', or 'auto'") from None
    if out <= 0:
        raise DaskmeansError(f"{key}={value!r} should be > 0")
    return out


def balance_chunks(X: da.Array, n_workers: int) -> da.Array:
    """``X`` in chunks that give each of ``n_workers`` workers a near-equal share of rows.

    Chunks are kept when whole chunks already come within 2% of an equal share (a kernel call
    has a fixed cost, so chunks are never split without need); otherwise ``X`` is cut into
    ``n_workers`` times as many equal chunks as the largest share held (of at least
    ``daskmeans.min-chunk-rows`` rows): one chunk becomes one per worker, 15 chunks on 2
    workers become 16. The result does not depend on the chunking (the sums are exact
    integers, :mod:`daskmeans.numerics.grid`), so this is free to follow the worker count."""
    n, nb = int(X.shape[0]), X.numblocks[0]
    if n == 0 or _largest_share(X.chunks[0], n_workers) <= 1.02 * n / n_workers:
        return X
    per = -(-nb // n_workers)  # the most chunks one worker holds
    target = min(per * n_workers, max(1, n // max(1, int(config.get("min-chunk-rows")))))
    return split_rows(X, -(-n // target))


def _largest_share(rows: Sequence[int], n_workers: int) -> int:
    """The most rows a worker holds when whole chunks go, largest first, to the emptiest."""
    loads = [0] * n_workers
    for r in sorted(rows, reverse=True):
        heapq.heapreplace(loads, loads[0] + r)
    return max(loads)
