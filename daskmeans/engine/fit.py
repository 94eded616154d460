"""The fit driver: plan, place, moments, init, the Lloyd loop, the labels; recovery and
checkpoints. What :class:`daskmeans.KMeans` and the command call once the data is read and the
parameters are checked.

::

    plan (budgets, tier, chunking fixed for the fit) -> place -> moments (tolerance, grid,
    digest) -> per run: init -> run_lloyd -> best run -> FitResult (labels lazy on the workers)

Every step that runs tasks on the placement's shards is run through :func:`_Driver.survive`:
a worker lost before or during it places the same chunks again on the workers left and
repeats the step (every step is deterministic given its seed, so the result is the same).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import dask
import dask.array as da
import numpy as np
from distributed import Client

from .. import config
from ..backends import backend_name, get_backend
from ..backends.grid import Grid, check_resolution
from ..dask_cluster import check_paths_on_workers, resolve_backend
from ..errors import DaskmeansError, DaskmeansWarning, InputChanged
from ..io.checkpoint import check_fingerprint, write_checkpoint
from ..io.readers import split_rows
from ..metric import get_metric
from ..placement import NO_WORKER_SECONDS, Placement, WorkerLost, balance_chunks, place, wait_a_little
from ..progress import note, step
from ..seeding import resolve_init
from ..timing import Phases
from . import reuse
from .driver import run_lloyd, warm_kernels
from .loop import Start
from .moments import data_moments
from .plan import budget_limits, iteration_warning, plan, worker_budgets

# Worker losses a fit outlives before its placement or init gives up (the loop has its own).
MAX_REPLANS = 8
# How long a fit waits for its labels to leave the shards before keeping them for a re-fit.
KEEP_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class FitParams:
    """Everything a fit needs besides its data and cluster (validated by the caller).

    ``init`` is an init's name or a ``(K, D)`` float64 array; ``seed`` the int every draw
    comes from (``seed_given``: the user chose it, so a checkpoint records it); ``checkpoint``
    a path or None; ``collective`` None for the configured one.
    """

    n_clusters: int
    init: Any = "k-means||"
    n_init: int = 1
    max_iter: int = 300
    tol: float = 1e-4
    seed: int = 0
    seed_given: bool = True
    oversampling_factor: float = 0.5
    backend: str = "auto"
    metric: str = "euclidean"
    precision: str = "fp32"
    tier: str = "auto"
    memory_limit: Any = None
    device_memory_limit: Any = None
    checkpoint: str | None = None
    checkpoint_every: int = 10
    collective: str | None = None
    max_imbalance: float | None = None


@dataclass
class FitResult:
    """The best run of a fit.

    Attributes
    ----------
    centroids : ndarray (K, D) float64
    inertia : float
    n_iter : int
    history : list of dict, one per iteration
    sizes : ndarray (K,) int64
    converged : bool
    labels : dask array (n,) int32, lazy, held by the fit's workers
    backend, tier, tier_plan : str
    tol_abs : float
    timings : dict of str to float (seconds of the phases)
    best_run : int
        Which of the ``n_init`` runs (from 1) gave this result.
    """

    centroids: np.ndarray
    inertia: float
    n_iter: int
    history: list
    sizes: np.ndarray
    converged: bool
    labels: da.Array
    backend: str
    tier: str
    tier_plan: str
    tol_abs: float
    timings: dict = field(default_factory=dict)
    best_run: int = 1


def _some_worker(client: Client, seconds: float = NO_WORKER_SECONDS) -> None:
    """Return once ``client``'s cluster has a worker; one that has none gets ``seconds`` for
    one to join (a nanny restarting it, an adaptive cluster scaling up), then the error."""
    if client.nthreads():
        return
    try:
        client.wait_for_workers(1, timeout=seconds)
    except TimeoutError:
        raise DaskmeansError(
            f"the cluster has no worker and none joined in {seconds:g} s: start workers (dask worker "
            f"{client.scheduler.address})"
        ) from None


def fit_distributed(
    client: Client,
    X: da.Array,
    params: FitParams,
    *,
    sample_weight: da.Array | None = None,
    path: str | None = None,
    resume: dict | None = None,
    callback: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    phase: Phases | None = None,
) -> FitResult:
    """Fit ``params.n_clusters`` centroids to ``X`` on ``client``'s workers.

    Parameters
    ----------
    client : distributed.Client
    X : dask array (n, d), float32 or float64 (rows already unit vectors for ``cosine``)
    params : FitParams
    sample_weight : dask array (n,), optional
    path : str, optional
        The file ``X`` is read from (checked on every worker before any work).
    resume : dict, optional
        A checkpoint read by :func:`daskmeans.io.checkpoint.read_checkpoint`: the fit goes on
        from it once its fingerprint matches this fit's.
    callback : callable(dict), optional
        Each iteration's statistics with ``run`` (which of ``n_init``, from 1).
    on_checkpoint : callable(int), optional
        Called with the iteration of each checkpoint written.
    phase : Phases, optional
        Where the phases' seconds go (plan, place, moments, init, iterations).
    """
    phase = phase if phase is not None else Phases()
    k = params.n_clusters
    n, d = (int(s) for s in X.shape)
    with phase("plan"):
        _some_worker(client)
        if path is not None:
            check_paths_on_workers(client, read=[path])
        backend = resolve_backend(client, params.backend, backend_name(X))
        limits = budget_limits(params.memory_limit, params.device_memory_limit)
        source = reuse.source_key(client, X, sample_weight, backend, params.tier, *limits, path)
        # The same data placed by an earlier fit on this client: its placement, budgets and
        # moments (taken out of the cache while this fit runs).
        kept = reuse.take(client, source)
        budgets = kept.budgets if kept is not None else worker_budgets(client, *limits)
        tiers = plan(client, X, backend, k, params.tier, *limits, budgets=budgets)
        slow = iteration_warning(n, k, d, params.max_iter, tiers, len(client.nthreads()))
        if slow:
            warnings.warn(slow, DaskmeansWarning, stacklevel=3)
        if tiers.chunk_rows:
            X = split_rows(X, tiers.chunk_rows)
        # The fit's chunking, fixed here for the whole fit: a worker lost later places the
        # same chunks on the workers left (never re-split), so no statistic kept per chunk
        # changes meaning mid-fit.
        X = balance_chunks(X.rechunk({1: -1}), len(client.nthreads()))
        w = None if sample_weight is None else sample_weight.rechunk((X.chunks[0],))
        warm_kernels(client, backend, k, d, X.dtype, params.precision, max(X.chunks[0]))
        key = reuse.placement_key(X, w, backend, tiers.tier)
        if kept is not None and kept.key != key:  # planned into another tier (a larger K): place again
            stale, kept = [kept], None
            reuse.drop(client, stale)
        if kept is None:
            reuse.make_room(client, 0 if tiers.tier == "storage" else tiers.share, tiers.host_budget)
    drv = _Driver(client, X, backend, w, tiers.tier, None if kept is None else kept.placement)
    digest = params.checkpoint is not None
    moments = reuse.moments_of(kept, key, digest)
    kept = None  # the driver holds the placement now: a failed fit releases it
    try:
        with phase("place"), step("place", unit="chunks"):
            drv.survive(lambda p: p)
        # The tier line, with the largest share a worker was given (the plan's is a bound).
        rows = max(sum(drv.placement.row_chunks[i] for i in ids) for ids in drv.placement.chunk_ids)
        tiers = dataclasses.replace(tiers, share=rows * d * X.dtype.itemsize)
        note(f"daskmeans: {tiers.describe()}")
        if moments is None:
            with phase("moments"), step("moments (one pass over the data)"):
                # A checkpoint written or resumed names the data by its content digest.
                moments = drv.survive(lambda p: data_moments(client, p, digest=digest))
        tol_abs = float(np.mean(moments["var"])) * float(params.tol)
        grid = Grid(moments["max_abs"], moments["weight"])
        seeds = np.random.SeedSequence(params.seed).generate_state(params.n_init)
        fingerprint = _fingerprint(params, n, d, X.dtype, moments, w is not None) if params.checkpoint else None
        start = None
        if resume is not None:
            check_fingerprint(params.checkpoint, resume["fingerprint"], fingerprint, resume["iteration"],
                              params.max_iter)
            start = Start(resume["iteration"], resume["centroids"], resume["prev"], resume["history"])
        best = None
        for run in range(params.n_init):
            if start is not None:
                c0 = start.centroids
            elif not isinstance(params.init, str):
                c0 = params.init
            else:
                of = f" (run {run + 1}/{params.n_init})" if params.n_init > 1 else ""
                with phase("init"), step(f"init {params.init}{of}", unit="steps"):
                    c0 = drv.survive(lambda p: resolve_init(
                        client, p, params.init, k, int(seeds[run]), params.oversampling_factor, grid))
                c0 = get_metric(params.metric).init(np.asarray(c0, np.float64))
            if run == 0:
                check_resolution(grid, np.median(np.abs(np.asarray(c0, np.float64)), axis=0), n)
            with phase("iterations"):
                res = run_lloyd(
                    client, drv.placement, c0, max_iter=params.max_iter, tol_abs=tol_abs, grid=grid,
                    callback=_numbered(callback, run + 1), precision=params.precision, metric=params.metric,
                    collective=params.collective or config.get("collective"), replan=drv.replan,
                    start=start, checkpoint=_saver(params, fingerprint, on_checkpoint),
                    checkpoint_every=params.checkpoint_every, max_imbalance=params.max_imbalance,
                    seed=int(seeds[run]),
                )
            if best is None or res.inertia < best.inertia:
                best, best_run = res, run + 1
        # Kept for the next fit of the same data once the labels are out of the shards (a
        # later fit's final pass replaces what they hold).
        wait_a_little(client, best.states, KEEP_WAIT_SECONDS)
        if all(f.status == "finished" for f in best.states):
            reuse.put(client, reuse.Entry(source, budgets, key, drv.placement, moments, digest, tiers.share))
    except InputChanged as e:  # raised on a worker, which knows chunks but not the file
        raise InputChanged(f"{path}: {e}" if path else str(e)) from None
    finally:
        drv.placement = None  # unless kept above, the shards (and so the persisted data) are released here
    return FitResult(
        best.centroids, best.inertia, best.n_iter, best.history, best.sizes, best.converged,
        _labels_array(best.states, best.row_chunks, best.layout), backend, tiers.tier, tiers.describe(), tol_abs,
        phase.seconds, best_run,
    )


class _Driver:
    """The fit's placement, made again (in the same chunks) on the workers left whenever one
    is lost."""

    def __init__(self, client: Client, X: da.Array, backend: str, w: da.Array | None, tier: str,
                 placement: Placement | None = None):
        self.client, self.X, self.backend, self.w, self.tier = client, X, backend, w, tier
        self.placement: Placement | None = placement  # given: the same chunks placed by an earlier fit
        self.pins: dict | None = None if placement is None else placement.pins

    def survive(self, step: Callable[[Placement], Any]) -> Any:
        """``step(placement)``, placing the data first (again, on the workers left) when a
        worker is lost before or during it."""
        last = None
        for _ in range(MAX_REPLANS):
            try:
                if self.placement is None:
                    # The chunks' pins from the passes over the placement lost: a chunk read
                    # again from the source is checked against its first read.
                    self.placement = place(self.client, self.X, self.backend, self.w, self.tier, balance=False,
                                           pins=self.pins)
                return step(self.placement)
            except WorkerLost as lost:
                last = lost.args[0]
                self.pins = self.placement.pins if self.placement is not None else self.pins
                self.placement = None
        raise DaskmeansError(f"workers kept leaving the cluster ({MAX_REPLANS} times; last {last})")

    def replan(self) -> Placement:
        """A new placement on the workers now present (the loop's hook after a loss)."""
        self.pins = self.placement.pins if self.placement is not None else self.pins
        self.placement = None
        return self.survive(lambda p: p)


def _fingerprint(params: FitParams, n: int, d: int, dtype: Any, moments: dict, weighted: bool) -> dict:
    """What a checkpoint of this fit is valid for (all exact, whatever the cluster)."""
    return {
        "n_samples": n, "n_features": d, "dtype": str(np.dtype(dtype)), "n_clusters": params.n_clusters,
        "init": params.init if isinstance(params.init, str) else "array", "random_state": params.seed if params.seed_given else None,
        "tol": params.tol, "metric": params.metric, "precision": params.precision, "weighted": weighted,
        "max_abs": [float(v) for v in moments["max_abs"]], "digest": moments["digest"],
        # Only where set: checkpoints of fits without it stay valid.
        **({} if params.max_imbalance is None else {"max_imbalance": params.max_imbalance}),
    }


def _saver(params: FitParams, fingerprint: dict | None, on_checkpoint: Callable[[int], None] | None) -> Callable | None:
    if params.checkpoint is None:
        return None

    def save(start: Start) -> None:
        write_checkpoint(params.checkpoint, start.iteration, start.centroids, start.prev, start.history or [],
                         fingerprint)
        if on_checkpoint is not None:
            on_checkpoint(start.iteration)

    return save


def _numbered(callback: Callable[[dict], None] | None, run: int) -> Callable[[dict], None] | None:
    """``callback`` given each iteration's statistics with the ``run`` (of ``n_init``) added."""
    if callback is None:
        return None
    return lambda stats: callback({**stats, "run": run})


def _state_labels(state: Any, j: int) -> np.ndarray:
    return get_backend(state.labels[j]).to_numpy(state.labels[j])


def _labels_array(states: list, row_chunks: tuple, layout: list) -> da.Array:
    """A lazy int32 array of the labels held by the final step states (in chunk order)."""
    pieces: dict[int, da.Array] = {}
    for state, chunk_ids in zip(states, layout):
        for j, cid in enumerate(chunk_ids):
            pieces[cid] = da.from_delayed(
                dask.delayed(_state_labels, pure=True)(state, j), shape=(row_chunks[cid],), dtype=np.int32
            )
    return da.concatenate([pieces[i] for i in range(len(row_chunks))])
