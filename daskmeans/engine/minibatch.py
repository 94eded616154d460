"""``MiniBatchKMeans``'s rounds on a :class:`~daskmeans.engine.job.FitJob`: Sculley's mini-batch
k-means on the engine's placement and kernels.

A fit reads and places the data as a Lloyd fit does (the memory plan, the tiers, recovery from a
lost worker: the job's), checks it in the moments pass, then runs its steps in rounds:

::

    client: draw the batches of the round's steps (global row indices, from the seed alone)
    shards: take the rows of those batches that they hold              (one task per shard)
    worker: run the round's steps on them, one after another           (one task)
              assign(batch) -> per-cluster sums as exact integers (the backend's kernels)
              Sculley's update with per-cluster learning rates; reassignment; stop rule
    client: the next round, from the state returned

Each step's batch is ``batch_size`` rows drawn uniformly with replacement by global index
(``default_rng([seed, step])``), so the same rows, in the same order, make every batch whatever
the chunking or the workers; the batch's per-cluster sums are the kernels' exact integer sums
(:mod:`daskmeans.numerics.grid`), so centroids, counts and the step count are bitwise the same
for any chunking, worker count and tier. A round takes up to ``ROUND_BYTES`` of rows, so the
storage tier re-reads the data once per round rather than once per step.

``partial_fit``'s step (:func:`partial_step`) runs on one worker on the whole batch given.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable

import dask
import dask.array as da
import numpy as np
from distributed import Client

from ..backends import backend_name, get_backend
from ..numerics.grid import float_sums
from ..dask_cluster import resolve_backend
from ..errors import DataError
from ..params import MiniBatchParams, RunParams
from .placement import Placement
from .task import blas_capped, submit_per_shard
from .watch import gather
from ..seeding import resolve_init
from ..timing import Phases
from .job import FitJob

# Rows taken per round (bytes of float64 rows): fewer, larger rounds cost fewer tasks and, in
# the storage tier, fewer reads of the data.
ROUND_BYTES = 64 * 2**20
# A round never runs more steps than this, so that ``verbose`` reports and an interrupt are
# seen within a bounded number of steps.
ROUND_STEPS_MAX = 1000

# Inits drawn from ``init_size`` rows, as scikit-learn's; any other registered init runs over all rows.
SAMPLE_INITS = ("k-means++", "random")


@dataclass
class State:
    """Everything a step needs from the steps before it (travels to the round's task and back).

    Attributes
    ----------
    centers : ndarray (K, D) float64
    counts : ndarray (K,) float64
        Weight each cluster has received so far (its learning rate is ``w / counts``).
    step : int
        Steps done.
    since_reassign : int
        Rows seen since the last reassignment check fired.
    ewa, ewa_min : float or None
        The smoothed batch inertia (per row) and its lowest value so far.
    no_improvement : int
        Steps since ``ewa_min`` last fell.
    done : bool
        The stop rule fired.
    """

    centers: np.ndarray
    counts: np.ndarray
    step: int = 0
    since_reassign: int = 0
    ewa: float | None = None
    ewa_min: float | None = None
    no_improvement: int = 0
    done: bool = False
    stopped: str = ""  # why the stop rule fired (scikit-learn's words), for verbose


@dataclass(frozen=True)
class Rule:
    """The step's constants: reassignment and the stop rule (scikit-learn's)."""

    n_samples: int
    batch_size: int
    n_steps: int
    tol_abs: float
    max_no_improvement: int | None
    reassignment_ratio: float
    reassign_seed: int
    precision: str


@dataclass(frozen=True)
class InitDraw:
    """How the init is chosen: candidates on ``init_size`` rows, the one of lowest inertia on
    as many validation rows kept.

    Attributes
    ----------
    init : str or callable or array-like
        ``MiniBatchKMeans``'s ``init`` (a name: drawn on the init rows, or over all rows for
        an init outside :data:`SAMPLE_INITS`).
    candidates : list of ndarray (K, D) float64, or None
        Explicit centres (an array, one per run of a callable init); None for a named init.
    size : int
        Rows the candidates are drawn from (``init_size`` resolved), as many validation rows.
    seeds : list of int
        One per candidate drawn (``n_init``).
    sample_seed : int
        The seed of the init and validation rows.
    """

    init: Any
    candidates: list | None
    size: int
    seeds: list
    sample_seed: int

    def rows(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The init rows (size,) sorted, without repeats, and the validation rows (size,)."""
        rng = np.random.default_rng(self.sample_seed)
        return np.sort(rng.choice(n, self.size, replace=False)), rng.integers(0, n, self.size)


@dataclass
class MiniBatchResult:
    """A mini-batch fit.

    Attributes
    ----------
    state : State
        The steps' state at the end (centres, counts, steps run, why they stopped).
    n_steps : int
        Steps the fit could run at most (``max_iter * n // batch``).
    batch : int
        Rows per batch (``batch_size``, at most ``n``).
    backend, tier : str
    labels : array (n,) int32 or None
        Of the caller's kind (``compute_labels``; :meth:`FitJob.output`): computed, NumPy
        (CuPy for CuPy data), where the data was given in memory, else a lazy Dask array held
        by the workers; None without ``compute_labels``.
    inertia : float or None
        Over every row under the final centres (``compute_labels``); None otherwise.
    """

    state: State
    n_steps: int
    batch: int
    backend: str
    tier: str
    labels: Any
    inertia: float | None


def fit_minibatch(
    client: Client,
    X: da.Array,
    params: MiniBatchParams,
    run: RunParams,
    draw: InitDraw,
    *,
    step_seed: int,
    reassign_seed: int,
    sample_weight: da.Array | None = None,
    path: str | None = None,
    files: tuple[str, ...] | None = None,
    in_memory: bool = False,
    report: Callable[[State, int], None] | None = None,
    phase: Phases | None = None,
) -> MiniBatchResult:
    """Mini-batch steps on ``X`` from the init ``draw`` chooses, until ``max_iter`` passes or
    the stop rule, on a :class:`~daskmeans.engine.job.FitJob` of ``client``'s workers.

    Parameters
    ----------
    client : distributed.Client
    X : dask array (n, d), float32 or float64
    params : MiniBatchParams
        What the rounds read: ``n_clusters``, ``batch_size`` (at most ``n`` rows a batch),
        ``max_iter`` (passes), ``tol`` (relative: the stop rule's bound on a step's summed
        squared shift is ``tol`` times the mean feature variance; 0: off),
        ``max_no_improvement``, ``reassignment_ratio``, ``precision``, ``compute_labels``
        (label every row and measure the inertia after the steps, one pass).
    run : RunParams
        Backend, tier and budgets of the job.
    draw : InitDraw
    step_seed, reassign_seed : int
        The seeds of the batches' rows and of the reassignments.
    sample_weight : dask array (n,), optional
    path : str, optional
        The file ``X`` is read from (checked on every worker first).
    files : tuple of str, optional
        Every file ``X`` is read from (the read's ``Table.files()``), for the job's re-fit check.
    in_memory : bool
        ``X`` was given in memory (the read's ``Table.in_memory``): the labels are computed,
        an array of its kind; else they stay lazy on the workers.
    report : callable(State, int), optional
        Called after each round with the state and the most steps the fit may run.
    phase : Phases, optional
        Where the job's phases' seconds go.

    Returns
    -------
    MiniBatchResult
    """
    k, precision = int(params.n_clusters), params.precision
    n, d = (int(s) for s in X.shape)
    job = FitJob.open(client, X, k, run, sample_weight=sample_weight, path=path, files=files, precision=precision,
                      in_memory=in_memory, phase=phase)
    backend = job.backend
    with job:
        moments = job.moments()
        tol_abs = float(np.mean(moments["var"])) * float(params.tol)
        batch = min(int(params.batch_size), n)
        n_steps = max(1, int(params.max_iter) * n // batch)
        rule = Rule(n, batch, n_steps, tol_abs, params.max_no_improvement, float(params.reassignment_ratio),
                    reassign_seed, precision)
        # The init: candidates (one per n_init), the one of lowest inertia on validation rows kept.
        init_rows, valid_rows = draw.rows(n)
        fixed = draw.candidates
        if fixed is None and draw.init not in SAMPLE_INITS:  # the engine's inits over all rows (k-means||, ...)
            fixed = [job.survive(resolve_init, draw.init, k, int(s)) for s in draw.seeds]
        centers = job.survive(_on_rows, np.concatenate([init_rows, valid_rows]), _choose_init, init_rows, valid_rows,
                              fixed, draw.init, k, [int(s) for s in draw.seeds], backend, precision)
        st = State(centers, np.zeros(k))
        while st.step < n_steps and not st.done:
            per_round = max(1, min(ROUND_STEPS_MAX, ROUND_BYTES // (8 * d * batch)))
            steps = range(st.step, min(n_steps, st.step + per_round))
            idx = [batch_rows(step_seed, t, n, batch) for t in steps]
            prev = st
            st = job.survive(_on_rows, np.concatenate(idx), _run_steps, idx, prev, rule, backend)
            if report is not None:
                report(st, n_steps)
        labels = inertia = None
        if params.compute_labels:
            labels, inertia = job.survive(labels_inertia, st.centers, precision)
            labels = job.output(labels)  # of the caller's kind, computed while the shards hold them
        return MiniBatchResult(st, n_steps, batch, backend, job.tiers.tier, labels, inertia)


def partial_step(client: Client, X: da.Array, sample_weight: da.Array | None, state: State | None, rule: Rule,
                 n_clusters: int, backend: str, compute_labels: bool,
                 draw: InitDraw | None = None) -> tuple[State, np.ndarray | None, float | None, str]:
    """``partial_fit``'s step: one mini-batch step on all of ``X`` in one task (the first call
    also chooses the init from ``X``: ``draw``).

    Parameters
    ----------
    client : distributed.Client
    X : dask array (m, d), the batch
    sample_weight : dask array (m,), optional
    state : State, or None on the first call
    rule : Rule
    n_clusters : int
    backend : str
        As ``MiniBatchKMeans``'s (resolved here against the workers and the data).
    compute_labels : bool
        Also the batch's labels and inertia under the new centres.
    draw : InitDraw, optional
        The init (first call): an init outside :data:`SAMPLE_INITS` is drawn as k-means++
        on the init rows (the batch is a sample already).

    Returns
    -------
    state : State
    labels : ndarray (m,) int32 or None
    inertia : float or None
    backend : str
        The backend resolved ("numpy" or "cupy").
    """
    backend = resolve_backend(client, backend, backend_name(X))
    rows = client.compute(X.rechunk({0: -1, 1: -1}))
    weights = None if sample_weight is None else client.compute(sample_weight.rechunk(-1))
    start = None
    if draw is not None:
        init_rows, valid_rows = draw.rows(int(X.shape[0]))
        init = draw.init if isinstance(draw.init, str) and draw.init in SAMPLE_INITS else "k-means++"
        state = State(None, np.zeros(n_clusters))  # type: ignore[arg-type]
        start = (init_rows, valid_rows, draw.candidates, init, draw.seeds)
    fut = client.submit(blas_capped(_partial_task), rows, weights, state, start, rule, n_clusters, backend,
                        compute_labels, pure=False, key=f"daskmeans-partial-fit-{uuid.uuid4().hex}")
    st, labels, inertia = fut.result()
    return st, labels, inertia, backend


def batch_rows(seed: int, step: int, n: int, batch: int) -> np.ndarray:
    """The global rows of step ``step``'s batch (with replacement; drawn from the seed alone)."""
    return np.random.default_rng([seed, step]).integers(0, n, batch)


# ---------------------------------------------------------------- rows by global index


def _take(shard: Any, rows: np.ndarray) -> tuple:
    """The global ``rows`` (sorted, unique) that this shard holds: ``(rows, data, weights)``,
    host arrays in the data's dtype (weights float64, or None)."""
    be = shard.be
    idx, data, wts = [], [], []
    for _, off, block, wb in shard.items():
        lo, hi = np.searchsorted(rows, [off, off + block.shape[0]])
        if hi > lo:
            sel = be.xp.asarray(rows[lo:hi] - off)
            idx.append(rows[lo:hi])
            data.append(be.to_numpy(block[sel]))
            if wb is not None:
                wts.append(be.to_numpy(wb[sel]).astype(np.float64))
    if not idx:
        return np.empty(0, np.int64), np.empty((0, shard.n_features), shard.dtype), (np.empty(0) if shard.weights else None)
    return np.concatenate(idx), np.concatenate(data), (np.concatenate(wts) if wts else None)


def _merge(parts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The shards' parts (:func:`_take`) as one ``(rows, data, weights)`` in global row order."""
    idx = np.concatenate([p[0] for p in parts])
    pos = np.argsort(idx, kind="stable")
    data = np.concatenate([p[1] for p in parts])[pos]
    w = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])[pos]
    return idx[pos], data, w


def _rows_of(merged: tuple, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The data (and weights) of ``rows`` (global indices, any order, repeats allowed) from
    :func:`_merge`'s rows."""
    idx, data, w = merged
    at = np.searchsorted(idx, rows)
    return data[at], (None if w is None else w[at])


def _on_rows(client: Any, placement: Placement, rows: np.ndarray, fn: Any, *args: Any) -> Any:
    """``fn(parts, *args)`` in a task fed by the shards' parts of the global ``rows``."""
    uniq = np.unique(rows)
    parts = submit_per_shard(client, placement, _take, [uniq] * len(placement.shards), name="daskmeans-minibatch-take")
    fut = client.submit(blas_capped(fn), parts, *args, pure=False, key=f"daskmeans-minibatch-{uuid.uuid4().hex}")
    return gather(client, [fut], placement.workers)[0]


# ---------------------------------------------------------------- steps (on a worker)


def _choose_init(parts: list, init_rows: np.ndarray, valid_rows: np.ndarray, fixed: list | None, init: Any, k: int,
                 seeds: list, backend: str, precision: str) -> np.ndarray:
    """The init candidate of lowest inertia on ``valid_rows``: ``fixed`` centroids, or one
    ``init`` (k-means++ / random) on ``init_rows`` per seed. Returns (k, d) float64."""
    merged = _merge(parts)
    xi, wi = _rows_of(merged, init_rows)
    xv, wv = _rows_of(merged, valid_rows)
    return _best_init(xi, wi, xv, wv, fixed, init, k, seeds, backend, precision)


def _best_init(xi, wi, xv, wv, fixed, init, k, seeds, backend, precision) -> np.ndarray:
    from ..seeding.kernels import kmeans_plusplus

    be = get_backend(backend)
    candidates = fixed
    if candidates is None:
        candidates = []
        for s in seeds:
            if init == "random":
                pick = np.sort(np.random.default_rng(s).choice(len(xi), k, replace=False))
                candidates.append(np.asarray(xi[pick], np.float64))
            else:
                candidates.append(be.to_numpy(kmeans_plusplus(be.asarray(xi), k, s, None if wi is None else be.asarray(wi))))
    if len(candidates) == 1:
        return np.asarray(candidates[0], np.float64)
    xv_b = be.asarray(xv)
    wv_b = None if wv is None else be.asarray(wv)
    scores = [float(be.assign(xv_b, be.prepare(c, xv.dtype, precision), wv_b, want_sums=False)["inertia"])
              for c in candidates]
    return np.asarray(candidates[int(np.argmin(scores))], np.float64)


def _run_steps(parts: list, batches: list, st: State, rule: Rule, backend: str) -> State:
    """Steps ``st.step ...`` on ``batches`` (each the global rows of one batch)."""
    be = get_backend(backend)
    merged = _merge(parts)
    for rows in batches:
        if st.done:
            break
        xb, wb = _rows_of(merged, rows)
        st = _step(be, be.asarray(xb), None if wb is None else be.asarray(wb), st, rule)
    return st


def _partial_task(x: Any, w: Any, st: State, start: tuple | None, rule: Rule, k: int, backend: str,
                  labels: bool) -> tuple:
    """``partial_fit``'s task: the init on ``x`` (first call), one step on all of ``x``, and
    ``x``'s labels and inertia under the new centroids."""
    be = get_backend(backend)
    x = np.asarray(be.to_numpy(x))
    if not np.isfinite(x).all():
        raise DataError("X contains NaN or infinity: clean or drop those rows")
    if w is not None:
        w = np.asarray(w, np.float64)
        if not np.isfinite(w).all() or (w < 0).any():
            raise DataError("sample_weight should be finite and >= 0")
    if start is not None:
        init_rows, valid_rows, fixed, init, seeds = start
        c0 = _best_init(x[init_rows], None if w is None else w[init_rows], x[valid_rows],
                        None if w is None else w[valid_rows], fixed, init, k, seeds, backend, rule.precision)
        st = replace(st, centers=c0)
    xb = be.asarray(x)
    wb = None if w is None else be.asarray(w)
    st = _step(be, xb, wb, replace(st, done=False), rule)
    if not labels:
        return st, None, None
    out = be.assign(xb, be.prepare(st.centers, x.dtype, rule.precision), wb, want_sums=False)
    return st, be.to_numpy(out["labels"]), float(out["inertia"])


def _step(be: Any, xb: Any, wb: Any, st: State, rule: Rule) -> State:
    """One mini-batch step (scikit-learn's ``_mini_batch_step`` and its stop rule).

    Parameters
    ----------
    be : backend module
    xb : backend array (m, d), the batch
    wb : backend array (m,) float64 or None
    st : State before the step
    rule : Rule
    """
    k = st.centers.shape[0]
    m = int(xb.shape[0])
    since = st.since_reassign + m
    reassign = bool((st.counts == 0).any()) or since >= 10 * k
    if reassign:
        since = 0
    out = be.assign(xb, be.prepare(st.centers, xb.dtype, rule.precision), wb, want_sums=True)
    sums, weights = (be.to_numpy(a) for a in float_sums(out))  # exact integer sums, one rounding each
    old, counts = st.centers, st.counts
    hit = weights > 0
    centers = old.copy()
    # Sculley's update: c <- c + (w / n) (mean - c), per cluster, as (c n_old + s) / (n_old + w).
    centers[hit] = (old[hit] * counts[hit, None] + sums[hit]) / (counts[hit] + weights[hit])[:, None]
    counts = counts + weights
    if reassign and rule.reassignment_ratio > 0:
        low = counts < rule.reassignment_ratio * counts.max()
        if low.sum() > 0.5 * m:  # at most half the batch's rows become new centres
            low[np.argsort(counts, kind="stable")[int(0.5 * m):]] = False
        n_low = int(low.sum())
        if n_low:
            pick = np.random.default_rng([rule.reassign_seed, st.step]).choice(m, n_low, replace=False)
            centers[low] = be.to_numpy(xb[be.xp.asarray(pick)]).astype(np.float64)
            if (~low).any():  # not so small that they are moved again at once
                counts[low] = counts[~low].min()
    shift = float(((centers - old) ** 2).sum()) if rule.tol_abs > 0 else 0.0
    st = State(centers, counts, st.step + 1, since, st.ewa, st.ewa_min, st.no_improvement, st.done, st.stopped)
    _stop_rule(st, float(out["inertia"]) / rule.batch_size, shift, rule)
    return st


def _stop_rule(st: State, batch_inertia: float, shift: float, rule: Rule) -> None:
    """scikit-learn's ``_mini_batch_convergence``: the first step's inertia is the init's; an
    exponentially weighted average of the batch inertia, stopped by ``tol`` on the shift or
    by ``max_no_improvement`` steps without a new low."""
    if st.step == 1:
        return
    if st.ewa is None:
        st.ewa = batch_inertia
    else:
        alpha = min(1.0, rule.batch_size * 2.0 / (rule.n_samples + 1))
        st.ewa = st.ewa * (1 - alpha) + batch_inertia * alpha
    if rule.tol_abs > 0 and shift <= rule.tol_abs:
        st.done, st.stopped = True, "Converged (small centers change)"
        return
    if st.ewa_min is None or st.ewa < st.ewa_min:
        st.no_improvement, st.ewa_min = 0, st.ewa
    else:
        st.no_improvement += 1
    if rule.max_no_improvement is not None and st.no_improvement >= rule.max_no_improvement:
        st.done, st.stopped = True, "Converged (lack of improvement in inertia)"


# ---------------------------------------------------------------- the final labels


def _shard_labels(shard: Any, centers: np.ndarray, precision: str) -> list:
    """``(chunk_id, labels (n_i,) int32, inertia)`` of each of the shard's chunks."""
    be = shard.be
    p = be.prepare(centers, shard.dtype, precision)
    out = []
    for cid, _, block, wb in shard.items():
        res = be.assign(block, p, wb, want_sums=False)
        out.append((cid, be.to_numpy(res["labels"]).copy(), float(res["inertia"])))
    return out


def _pick(parts: list, j: int) -> np.ndarray:
    return parts[j][1]


def _inertias(parts: list) -> list:
    return [(cid, inertia) for cid, _, inertia in parts]


def labels_inertia(client: Any, placement: Placement, centers: np.ndarray, precision: str) -> tuple:
    """Every row's label (a lazy Dask array over results the workers hold) and the inertia,
    the chunks' added in chunk order."""
    futs = submit_per_shard(client, placement, _shard_labels, [centers] * len(placement.shards), [precision] * len(placement.shards),
                            name="daskmeans-minibatch-labels")
    per = gather(client, [client.submit(_inertias, f, pure=False) for f in futs], placement.workers)
    pieces = {}
    for f, chunk_ids in zip(futs, placement.chunk_ids):
        for j, cid in enumerate(chunk_ids):
            pieces[cid] = da.from_delayed(dask.delayed(_pick, pure=True)(f, j), shape=(placement.row_chunks[cid],),
                                          dtype=np.int32, meta=np.empty(0, np.int32))
    inertia = 0.0
    for _, v in sorted(c for p in per for c in p):
        inertia += v
    return da.concatenate([pieces[i] for i in range(len(placement.row_chunks))]), inertia
