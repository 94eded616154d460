"""Memory budgets, the memory tier of a fit, and the preflight check, before any data moves.

Each worker has a host budget (``memory_limit``: default half the Dask worker's memory limit,
or of the memory available) and, on a GPU worker, a device budget (``device_memory_limit``:
default the GPU's free memory, within CuPy's pool limit if one is set). The loop needs a
working set besides the data (centroids, the iteration buffers, the kernels' tiles); the
data's share per worker then decides the tier:

- ``device`` (GPU): the rows are resident on the GPU;
- ``host``: resident in host memory (pinned, on a GPU worker: copied to the GPU chunk by
  chunk each pass);
- ``storage``: re-read from the source each pass, a thread reading ahead.

The result is bitwise the same in every tier (the same chunks meet the same kernels). A
working set that fits no budget is refused here, in one line with the numbers and the flag
that would change them, rather than as an out-of-memory error in the middle of a fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask.array as da
from dask.utils import format_bytes, parse_bytes
from distributed import Client

from .. import config
from ..backends import get_backend
from ..errors import DaskmeansError
from ..placement import TIERS


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

    def describe(self) -> str:
        dev = "" if self.device_budget is None else f", device budget {format_bytes(self.device_budget)}"
        return (f"tier {self.tier}: {format_bytes(self.share)} of data per worker, host budget "
                f"{format_bytes(self.host_budget)}{dev}")


def _budget_on_worker(memory_limit: int | None, device_memory_limit: int | None, dask_worker: Any = None) -> dict:
    """On a worker: its host budget and, where CuPy sees a GPU, its device budget (bytes)."""
    host = memory_limit
    if host is None:
        limit = getattr(getattr(dask_worker, "memory_manager", None), "memory_limit", None)
        if not limit:
            import psutil

            limit = psutil.virtual_memory().available
        host = int(limit * 0.5)  # the other half: Dask, Python, labels, read-ahead, spikes
    try:
        import cupy

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device: a CPU worker
        has_gpu = False
    device = None
    if has_gpu:
        free, _ = cupy.cuda.runtime.memGetInfo()
        pool = cupy.get_default_memory_pool()
        limit = pool.get_limit()
        if limit:  # CUPY_GPU_MEMORY_LIMIT or set_limit(): what the pool may still take
            free = min(free + pool.free_bytes(), limit - pool.used_bytes())
        device = int(free) if device_memory_limit is None else int(device_memory_limit)
        from ..backends.gpu_device import sm_count as sms

        sm_count = sms(cupy.cuda.runtime.getDevice())
    return {"host": int(host), "device": device, "flops": _step_rate() if device is None else GPU_NOMINAL_FLOPS,
            "sm_count": int(sm_count) if device is not None else 0}


# A GPU's GEMM rate for the preflight estimate: nominal (measuring would start cuBLAS during
# planning); the estimate only needs the order of magnitude.
GPU_NOMINAL_FLOPS = 50e12


def _step_rate() -> float:
    """This CPU worker's rate at the iterations' own work, counted as 2 N K D FLOP/s: the NumPy
    backend's whole step (BLAS GEMM tiles, then the compiled pass with the exact sums) on 2048
    rows of 64 features against 512 centroids (a few ms), the best of three after a first call (which
    loads the compiled pass, as the fit's first iteration would), under the BLAS thread limit
    the worker's tasks run with. A bare 256^3 GEMM (in cache) said 150 GFLOP/s per worker on
    the 2-core CI host, where the iterations ran at 41: the warning then promised a third of
    the fit's time."""
    import time

    import numpy as np

    from ..backends import get_backend
    from ..backends.grid import Grid

    be = get_backend("numpy")
    rng = np.random.default_rng(0)
    n, d, k = 2048, 64, 512
    x = rng.standard_normal((n, d), dtype=np.float32)
    p = be.prepare(rng.standard_normal((k, d)), np.float32)
    grid = Grid(np.full(d, 8.0), float(n))
    be.assign(x, p, want_sums=True, grid=grid)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        be.assign(x, p, want_sums=True, grid=grid)
        best = min(best, time.perf_counter() - t)
    return 2 * n * k * d / max(best, 1e-9)


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


def working_parts(k: int, d: int, n_chunks: int, chunk_bytes: int, rows_per_worker: int, backend: str,
                  sm_count: int = 0) -> dict[str, int]:
    """What one worker's loop needs besides its data, part by part (bytes): ``model``, K x D
    float64 centroids (current, previous, new), the iteration buffer (one int64 per sum, sent
    and received), a chunk's sums and the update's temporaries; ``tiles``, the kernels' own
    buffers (the backend's ``working_bytes`` for a chunk's rows on a device of ``sm_count``
    SMs); ``chunks``, two chunks in flight (the host tier's copy buffers, one being filled, one
    computed on; the storage tier's reads); ``labels``, the worker's rows' labels (3 x int32)."""
    chunk_rows = max(1, chunk_bytes // max(1, d * 4))
    return {
        "model": k * d * 8 * (3 + 2 + 2) + n_chunks * 8,
        "tiles": int(get_backend(backend).working_bytes(k, d, chunk_rows, sm_count)),
        "chunks": 2 * chunk_bytes,
        "labels": rows_per_worker * 4 * 3,
    }


def working_bytes(k: int, d: int, n_chunks: int, chunk_bytes: int, rows_per_worker: int, backend: str,
                  sm_count: int = 0) -> int:
    """The sum of :func:`working_parts`."""
    return int(sum(working_parts(k, d, n_chunks, chunk_bytes, rows_per_worker, backend, sm_count).values()))


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
    backend : "numpy" or "cupy"
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

    Raises
    ------
    DaskmeansError
        When the working set fits no budget, or a forced tier cannot hold the data.
    """
    if tier not in TIERS:
        raise DaskmeansError(f"tier={tier!r} should be one of {', '.join(map(repr, TIERS))}")
    gpu = not get_backend(backend).on_host
    if tier == "device" and not gpu:
        raise DaskmeansError("tier='device' needs GPU workers; CPU workers hold data in the 'host' tier")
    if budgets is None:
        budgets = worker_budgets(client, memory_limit, device_memory_limit)
    n_workers = max(1, len(budgets))
    host_budget = min(b["host"] for b in budgets.values())
    device_budget = min((b["device"] for b in budgets.values() if b["device"] is not None), default=None)
    if gpu and device_budget is None:
        raise DaskmeansError("the GPU backend was chosen but no worker reports a GPU")
    from ..io.readers import split_rows
    from ..placement import balance_chunks

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
    parts = working_parts(k, d, X.numblocks[0], chunk_rows * d * item, min(n, rows), backend, sms)
    working = sum(parts.values())
    if working > limit:
        raise DaskmeansError(_too_small(k, d, parts, limit, "device" if gpu else "host", flag, chunk_rows,
                                        chunk_rows > cap, min(n, rows), get_backend(backend).tile_setting))
    fits_device = gpu and share + working <= device_budget
    # Host memory holds the data and, on a host backend, the loop's working set beside it: where
    # the budget holds the working set but not both, the storage tier streams the data.
    host_need = share + (0 if gpu else working)
    fits_host = host_need <= host_budget
    if tier == "auto":
        tier = "device" if fits_device else "host" if fits_host else "storage"
    elif tier == "device" and not fits_device:
        raise DaskmeansError(
            f"tier='device' needs {format_bytes(share + working)} per GPU worker, more than its device memory budget "
            f"{format_bytes(device_budget)} (--device-memory-limit): use tier 'host' or 'storage', or more GPUs"
        )
    elif tier == "host" and not fits_host:
        loop = "" if gpu else f" ({format_bytes(share)} of data, {format_bytes(working)} for the loop)"
        raise DaskmeansError(
            f"tier='host' needs {format_bytes(host_need)} of host memory per worker{loop}, more than its budget "
            f"{format_bytes(host_budget)} (--memory-limit): use tier 'storage', or more workers"
        )
    rate = min(float(b.get("flops") or GPU_NOMINAL_FLOPS) for b in budgets.values()) if budgets else None
    seconds = 2.0 * n * k * d / (rate * n_workers) if rate else None
    return TierPlan(tier, share, working, host_budget, device_budget, cut, seconds, rate)


def budget_limits(memory_limit: int | str | None = None,
                  device_memory_limit: int | str | None = None) -> tuple[int | None, int | None]:
    """The host and device budgets asked for, in bytes (from the arguments, else the
    ``daskmeans.memory-limit`` / ``device-memory-limit`` settings); None for ``auto``."""
    return _bytes(memory_limit, "memory-limit"), _bytes(device_memory_limit, "device-memory-limit")


def worker_budgets(client: Client, memory_limit: int | str | None = None,
                   device_memory_limit: int | str | None = None) -> dict:
    """Every worker's budgets and rate, measured on the worker: ``{address: {"host": bytes,
    "device": bytes or None, "flops": GEMM FLOP/s, "sm_count": int}}``."""
    return client.run(_budget_on_worker, *budget_limits(memory_limit, device_memory_limit))


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
