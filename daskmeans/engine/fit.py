"""The fit: ``n_init`` Lloyd runs on a :class:`~daskmeans.engine.job.FitJob`, the best kept;
checkpoints written and resumed. What :class:`daskmeans.KMeans` calls once the data is read and
the parameters are checked.

::

    FitJob.open (the sample, plan, chunking fixed for the fit) -> place -> moments (tolerance,
    grid, digest) -> per run: init -> run_lloyd -> best run -> on a sample: every row's labels,
    inertia and sizes -> FitResult (labels of the caller's kind: ``job.output``)

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

from ..backends import get_backend
from ..numerics.grid import TYPICAL_ROWS, Grid, check_resolution
from ..errors import InputChanged
from ..io.checkpoint import check_fingerprint, fingerprint, write_checkpoint
from ..metric import get_metric
from ..params import ALGORITHMS, KMeansParams, RunParams
from ..events import step
from ..seeding import resolve_init
from ..timing import Phases
from .lloyd import run_lloyd
from .job import FitJob
from .loop import Start


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
    labels : array (n,) int32
        Of the caller's kind (:meth:`FitJob.output`): computed, NumPy (CuPy for CuPy data),
        where the data was given in memory (``in_memory``); else a lazy Dask array whose
        blocks the fit's workers hold.
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
    labels: Any
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
    params: KMeansParams,
    run: RunParams = RunParams(),
    *,
    seed: int | None = None,
    sample_weight: da.Array | None = None,
    path: str | None = None,
    files: tuple[str, ...] | None = None,
    train_rows: int | None = None,
    resume: dict | None = None,
    in_memory: bool = False,
    callback: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    phase: Phases | None = None,
) -> FitResult:
    """Fit ``params.n_clusters`` centroids to ``X`` on ``client``'s workers.

    Parameters
    ----------
    client : distributed.Client
    X : dask array (n, d), float32 or float64 (the job scales them for the metric)
    params : KMeansParams
        The algorithm, validated and resolved by the caller: ``init`` an init's name, a
        ``(K, D)`` float64 array, or a list of them, one per run (a callable init's centres:
        the runs are then their number); ``n_init`` an int; ``random_state`` the seed the
        user chose (an int: a checkpoint records it) or None.
    run : RunParams
        Backend, tier, budgets, collective, checkpoint (a path or None) and its period.
    seed : int, optional
        The int every draw comes from (the sample, each run's init); None: fresh entropy.
    sample_weight : dask array (n,), optional
    path : str, optional
        The file ``X`` is read from (checked on every worker before any work).
    files : tuple of str, optional
        Every file ``X`` is read from (the read's ``Table.files()``: a re-fit checks them for
        changes); None: found by the job from ``path`` and ``X``'s graph.
    train_rows : int, optional
        Train on this many rows of ``X`` drawn from ``seed`` (fewer than ``X`` has),
        then label every row and measure the inertia and sizes over every row.
    resume : dict, optional
        A checkpoint read by :func:`daskmeans.io.checkpoint.read_checkpoint`: the fit goes on
        from it once its fingerprint matches this fit's.
    in_memory : bool
        ``X`` was given in memory (the read's ``Table.in_memory``): the labels are computed,
        an array of its kind (:meth:`FitJob.output`); else they stay lazy on the workers.
    callback : callable(dict), optional
        Each iteration's statistics with ``run`` (which of ``n_init``, from 1).
    on_checkpoint : callable(int), optional
        Called with the iteration of each checkpoint written.
    phase : Phases, optional
        Where the phases' seconds go (plan, place, moments, init, iterations).
    """
    phase = phase if phase is not None else Phases()
    k = params.n_clusters
    job = FitJob.open(client, X, k, run, sample_weight=sample_weight, path=path, files=files,
                      precision=params.precision, max_iter=params.max_iter, metric=params.metric,
                      train_rows=train_rows, seed=seed, in_memory=in_memory, phase=phase,
                      algorithm=ALGORITHMS[params.algorithm])
    n, d = (int(s) for s in job.X.shape)
    # One run per explicit start (a callable init's), else n_init from a named init or one array.
    starts = params.init if isinstance(params.init, list) else None
    n_init = len(starts) if starts is not None else params.n_init
    # A checkpoint written or resumed names the data by its content digest.
    digest = run.checkpoint is not None
    with job:
        try:
            moments = job.moments(digest)  # placed by its first pass
            tol_abs = float(np.mean(moments["var"])) * float(params.tol)
            grid = Grid(moments["max_abs"], moments["weight"])
            seeds = np.random.SeedSequence(seed).generate_state(n_init)
            names = (fingerprint(params, n_samples=n, n_features=d, dtype=job.X.dtype, weighted=job.weights is not None,
                                 moments=moments) if run.checkpoint else None)
            start = None
            if resume is not None:
                check_fingerprint(run.checkpoint, resume["fingerprint"], names, resume["iteration"], params.max_iter)
                start = Start(resume["iteration"], resume["centroids"], resume["prev"], resume["history"])
            best = None
            for i in range(n_init):
                if start is not None:
                    c0 = start.centroids
                elif starts is not None:
                    c0 = starts[i]
                elif not isinstance(params.init, str):
                    c0 = params.init
                else:
                    of = f" (run {i + 1}/{n_init})" if n_init > 1 else ""
                    with phase("init"), step(f"init {params.init}{of}", unit="steps"):
                        c0 = job.survive(resolve_init, params.init, k, int(seeds[i]), params.oversampling_factor, grid)
                    c0 = get_metric(params.metric).init(np.asarray(c0, np.float64))
                if i == 0:
                    # Each feature's median |value| over evenly spaced centres (TYPICAL_ROWS),
                    # its values contiguous: NumPy's median along rows walks strided columns.
                    c = np.asarray(c0, np.float64)
                    c = c[:: max(1, -(-c.shape[0] // TYPICAL_ROWS))]
                    check_resolution(grid, np.median(np.ascontiguousarray(np.abs(c).T), axis=1), n)
                # The run's restart point, made here for every run: a checkpoint's, or the
                # start from the init's centres.
                begin = start if start is not None else Start(0, np.asarray(c0, np.float64))
                with phase("iterations"):
                    res = run_lloyd(
                        client, job.placement, c0, params, run, tol_abs=tol_abs, grid=grid,
                        callback=_numbered(callback, i + 1), replan=job.replan, start=begin,
                        checkpoint=_saver(run.checkpoint, names, on_checkpoint), seed=int(seeds[i]),
                    )
                if best is None or res.inertia < best.inertia:
                    best, best_run = res, i + 1
            # The labels as the caller gets them (computed here while the shards hold them, for
            # data given in memory); on a sample, every row's come after.
            labels = None if job.sampled else job.output(_labels_array(best.states, best.row_chunks, best.layout))
            job.keep(best.states)
        except InputChanged as e:  # raised on a worker, which knows chunks but not the file
            raise InputChanged(f"{path}: {e}" if path else str(e)) from None
    inertia, sizes = best.inertia, best.sizes
    if job.sampled:  # the model is every row's: its labels, inertia and sizes
        every = job.labels(best.centroids, params.precision)
        labels, inertia, sizes = job.output(every.labels), every.inertia, every.sizes
    return FitResult(
        best.centroids, inertia, best.n_iter, best.history, sizes, best.converged, labels, job.backend,
        job.tiers.tier, job.tiers.describe(), tol_abs, phase.seconds, best_run, best.inertia, n,
    )


def _saver(path: str | None, names: dict | None, on_checkpoint: Callable[[int], None] | None) -> Callable | None:
    """The loop's checkpoint hook: the restart point written to ``path`` with the fit's
    fingerprint ``names`` (None without a checkpoint)."""
    if path is None:
        return None

    def save(start: Start) -> None:
        write_checkpoint(path, start.iteration, start.centroids, start.prev, start.history or [], names)
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
