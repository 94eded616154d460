"""The fit: ``n_init`` Lloyd runs on a :class:`~daskmeans.engine.job.FitJob`, the best kept;
checkpoints written and resumed. What :class:`daskmeans.KMeans` calls once the data is read and
the parameters are checked.

::

    FitJob.open (the sample, plan, chunking fixed for the fit) -> place -> moments (tolerance,
    grid, digest) -> per run: init -> run_lloyd -> best run -> on a sample: every row's labels,
    inertia and sizes -> FitResult (labels lazy on the workers)

Every step that runs tasks on the placement's shards runs through ``job.survive``: a worker
lost before or during it places the same chunks again on the workers left and repeats the step
(every step is deterministic given its seed, so the result is the same).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import dask
import dask.array as da
import numpy as np
from distributed import Client

from .. import config
from ..backends import get_backend
from ..backends.grid import Grid, check_resolution
from ..errors import InputChanged
from ..io.checkpoint import check_fingerprint, write_checkpoint
from ..metric import get_metric
from ..events import step
from ..seeding import resolve_init
from ..timing import Phases
from .driver import run_lloyd
from .job import FitJob
from .loop import Start


@dataclass(frozen=True)
class FitParams:
    """Everything a fit needs besides its data and cluster (validated by the caller).

    ``init`` is an init's name, a ``(K, D)`` float64 array, or a list of them, one per run
    (a callable init's centres: ``n_init`` is then their number); ``seed`` the int every draw
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
    sample_inertia : float or None
        The inertia over the rows the fit trained on (``inertia`` is every row's).
    n_samples_fit : int
        Rows the fit trained on.
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
    sample_inertia: float | None = None
    n_samples_fit: int = 0


def fit_distributed(
    client: Client,
    X: da.Array,
    params: FitParams,
    *,
    sample_weight: da.Array | None = None,
    path: str | None = None,
    train_rows: int | None = None,
    resume: dict | None = None,
    callback: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    phase: Phases | None = None,
) -> FitResult:
    """Fit ``params.n_clusters`` centroids to ``X`` on ``client``'s workers.

    Parameters
    ----------
    client : distributed.Client
    X : dask array (n, d), float32 or float64 (the job scales them for the metric)
    params : FitParams
    sample_weight : dask array (n,), optional
    path : str, optional
        The file ``X`` is read from (checked on every worker before any work).
    train_rows : int, optional
        Train on this many rows of ``X`` drawn from ``params.seed`` (fewer than ``X`` has),
        then label every row and measure the inertia and sizes over every row.
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
    job = FitJob.open(client, X, k, sample_weight=sample_weight, path=path, backend=params.backend, tier=params.tier,
                      memory_limit=params.memory_limit, device_memory_limit=params.device_memory_limit,
                      precision=params.precision, max_iter=params.max_iter, metric=params.metric,
                      train_rows=train_rows, seed=params.seed, phase=phase)
    n, d = (int(s) for s in job.X.shape)
    # One run per explicit start (a callable init's), else n_init from a named init or one array.
    starts = params.init if isinstance(params.init, list) else None
    n_init = len(starts) if starts is not None else params.n_init
    # A checkpoint written or resumed names the data by its content digest.
    digest = params.checkpoint is not None
    with job:
        try:
            job.place()
            moments = job.moments(digest)
            tol_abs = float(np.mean(moments["var"])) * float(params.tol)
            grid = Grid(moments["max_abs"], moments["weight"])
            seeds = np.random.SeedSequence(params.seed).generate_state(n_init)
            fingerprint = (_fingerprint(params, n, d, job.X.dtype, moments, job.weights is not None)
                           if params.checkpoint else None)
            start = None
            if resume is not None:
                check_fingerprint(params.checkpoint, resume["fingerprint"], fingerprint, resume["iteration"],
                                  params.max_iter)
                start = Start(resume["iteration"], resume["centroids"], resume["prev"], resume["history"])
            best = None
            for run in range(n_init):
                if start is not None:
                    c0 = start.centroids
                elif starts is not None:
                    c0 = starts[run]
                elif not isinstance(params.init, str):
                    c0 = params.init
                else:
                    of = f" (run {run + 1}/{n_init})" if n_init > 1 else ""
                    with phase("init"), step(f"init {params.init}{of}", unit="steps"):
                        c0 = job.survive(lambda p: resolve_init(
                            client, p, params.init, k, int(seeds[run]), params.oversampling_factor, grid))
                    c0 = get_metric(params.metric).init(np.asarray(c0, np.float64))
                if run == 0:
                    check_resolution(grid, np.median(np.abs(np.asarray(c0, np.float64)), axis=0), n)
                with phase("iterations"):
                    res = run_lloyd(
                        client, job.placement, c0, max_iter=params.max_iter, tol_abs=tol_abs, grid=grid,
                        callback=_numbered(callback, run + 1), precision=params.precision, metric=params.metric,
                        collective=params.collective or config.get("collective"), replan=job.replan,
                        start=start, checkpoint=_saver(params, fingerprint, on_checkpoint),
                        checkpoint_every=params.checkpoint_every, max_imbalance=params.max_imbalance,
                        seed=int(seeds[run]),
                    )
                if best is None or res.inertia < best.inertia:
                    best, best_run = res, run + 1
            job.keep(best.states)
        except InputChanged as e:  # raised on a worker, which knows chunks but not the file
            raise InputChanged(f"{path}: {e}" if path else str(e)) from None
    labels, inertia, sizes = _labels_array(best.states, best.row_chunks, best.layout), best.inertia, best.sizes
    if job.sampled:  # the model is every row's: its labels, inertia and sizes
        every = job.labels(best.centroids, params.precision)
        labels, inertia, sizes = every.labels, every.inertia, every.sizes
    return FitResult(
        best.centroids, inertia, best.n_iter, best.history, sizes, best.converged, labels, job.backend,
        job.tiers.tier, job.tiers.describe(), tol_abs, phase.seconds, best_run, best.inertia, n,
    )


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
