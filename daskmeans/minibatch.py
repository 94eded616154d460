"""``MiniBatchKMeans``: Sculley's mini-batch k-means on the engine's placement and kernels.

A fit reads and places the data as :class:`~daskmeans.KMeans` does (the memory plan, the tiers,
recovery from a lost worker), checks it in the moments pass, then runs its steps in rounds:

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
"""

from __future__ import annotations

import sys
import uuid
import warnings
from dataclasses import dataclass, replace
from typing import Any

import dask
import dask.array as da
import numpy as np

from .backends import backend_name, get_backend
from .numerics.grid import float_sums
from .dask_cluster import resolve_backend, using_client
from .engine import infer
from .conventions import Boolean, DaskmeansRuntimeWarning, init_data, random_state_for_init, resolve_n_init
from .errors import DataError, not_fitted
from .estimator import KMeans, _in_memory, _like, _names
from .io.readers import read_table, read_weights
from .engine.placement import Placement
from .engine.task import blas_capped, submit_per_shard
from .engine.watch import gather
from .validation import Interval, NoneOr, check_n_clusters, seed_of, validate_params

# Rows taken per round (bytes of float64 rows): fewer, larger rounds cost fewer tasks and, in
# the storage tier, fewer reads of the data.
ROUND_BYTES = 64 * 2**20
# A round never runs more steps than this, so that ``verbose`` reports and an interrupt are
# seen within a bounded number of steps.
ROUND_STEPS_MAX = 1000


# Inits drawn from ``init_size`` rows, as scikit-learn's; any other registered init runs over all rows.
_SAMPLE_INITS = ("k-means++", "random")


@dataclass
class _State:
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
class _Rule:
    """The step's constants: reassignment and the stop rule (scikit-learn's)."""

    n_samples: int
    batch_size: int
    n_steps: int
    tol_abs: float
    max_no_improvement: int | None
    reassignment_ratio: float
    reassign_seed: int
    precision: str


class MiniBatchKMeans(KMeans):
    """Mini-batch k-means (Sculley 2010) on a Dask cluster, with scikit-learn's API.

    Each step assigns a batch of ``batch_size`` rows to the nearest centroids and moves each
    centroid towards the mean of its batch rows with a per-cluster learning rate (the weight
    the cluster received in the batch over all it received so far). Batches are drawn by
    global row index from ``random_state``: the same for any chunking and cluster, and the
    result (centroids, counts, steps) is bitwise the same too.

    Parameters
    ----------
    n_clusters : int, default 8
    init : {"k-means++", "random", "k-means||"}, callable, array-like (n_clusters, n_features) or .npy path
        ``k-means++`` and ``random`` draw from ``init_size`` rows (as scikit-learn);
        ``k-means||`` is the distributed init over all rows (:class:`~daskmeans.KMeans`'s); a
        callable is called as :class:`~daskmeans.KMeans` calls it, once per ``n_init``.
    max_iter : int, default 100
        Passes over the data: the fit runs at most ``max_iter * n_samples // batch_size`` steps.
    batch_size : int, default 1024
    verbose : bool or int, default 0
        1 (or True): a line per round of steps on stdout, and why the steps stopped
        (scikit-learn's "Converged (small centers change)" or "Converged (lack of improvement
        in inertia)").
    compute_labels : bool, default True
        After the steps, label every row and compute ``inertia_`` (one pass); otherwise
        ``inertia_`` is the smoothed batch inertia times ``n_samples`` and there is no ``labels_``.
    random_state : int, numpy.random.Generator, RandomState or None
    tol : float, default 0.0
        Stop when the summed squared centroid shift of a step is at most ``tol`` times the
        mean feature variance (0: off).
    max_no_improvement : int or None, default 10
        Stop after this many steps without a new low of the smoothed batch inertia.
    init_size : int, optional
        Rows drawn for ``k-means++``/``random`` and for choosing among ``n_init`` inits
        (default ``3 * batch_size``, at least ``3 * n_clusters``, at most ``n_samples``; one
        below ``n_clusters`` warns and becomes ``3 * n_clusters``, as scikit-learn's).
    n_init : "auto" or int, default 3
        Inits tried; the one with the lowest inertia on ``init_size`` validation rows is kept
        (cheap for the inits on ``init_size`` rows; one k-means++ draw alone can merge two
        clusters, and a mini-batch fit rarely splits them again). ``"auto"``: scikit-learn's
        rule (1 for k-means++, k-means|| and explicit centres, 3 for random and a callable).
    reassignment_ratio : float, default 0.01
        Every ``10 * n_clusters`` rows (or when a cluster has no weight), clusters whose
        weight is below this fraction of the largest are moved to random rows of the batch.
    backend, precision, tier, memory_limit, device_memory_limit, client
        As :class:`~daskmeans.KMeans`.

    Attributes
    ----------
    cluster_centers_ : ndarray (n_clusters, n_features), X's dtype
    counts_ : ndarray (n_clusters,) float64
        Weight each cluster received over all steps (and ``partial_fit`` calls).
    n_steps_ : int
        Steps (batches) run.
    n_iter_ : int
        Passes over the data those steps amount to (``ceil(n_steps_ * batch_size / n_samples)``).
    inertia_ : float
    labels_ : ndarray (n_samples,) int32, or a lazy dask array (with ``compute_labels``)
        Of the input's kind, as :class:`~daskmeans.KMeans`'s.
    n_features_in_ : int
    _n_init, _init_size : int
        The inits tried and the rows they were drawn from (scikit-learn's attributes).
    """

    metric = "euclidean"  # what the inherited predict/transform/score read

    _parameter_constraints = {
        **{name: KMeans._parameter_constraints[name] for name in (
            "n_clusters", "init", "max_iter", "verbose", "random_state", "tol", "n_init", "backend", "precision", "tier",
            "memory_limit", "device_memory_limit")},
        "batch_size": Interval(1, None, integer=True),
        "compute_labels": Boolean(),
        "max_no_improvement": NoneOr(Interval(0, None, integer=True)),
        "init_size": NoneOr(Interval(1, None, integer=True)),
        "reassignment_ratio": Interval(0, None),
    }

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        init: Any = "k-means++",
        max_iter: int = 100,
        batch_size: int = 1024,
        verbose: int = 0,
        compute_labels: bool = True,
        random_state: Any = None,
        tol: float = 0.0,
        max_no_improvement: int | None = 10,
        init_size: int | None = None,
        n_init: int | str = 3,
        reassignment_ratio: float = 0.01,
        backend: str = "auto",
        precision: str = "fp32",
        tier: str = "auto",
        memory_limit: int | str | None = None,
        device_memory_limit: int | str | None = None,
        client: Any = None,
    ):
        self._store_params(locals())

    def __repr__(self) -> str:
        return type(self).__name__ + super().__repr__()[len("KMeans"):]

    def _validate_params(self) -> None:
        validate_params(self._constrained(), self._parameter_constraints)

    def _runs(self) -> int:
        """``n_init`` resolved (scikit-learn's ``"auto"``: 3 for random and callable inits),
        kept as ``_n_init``."""
        self._n_init = resolve_n_init(self, default=3)
        return self._n_init

    def _candidates(self, n_features: int, runs: int, X: Any, x: Any) -> list | None:
        """The explicit init candidates: the centres of an array-like or file init, one per
        run from a callable init (called with ``X``'s data and one RandomState, see
        :class:`~daskmeans.KMeans`), None for a named init."""
        if not callable(self.init):
            arr = self._init_array(n_features)
            return None if arr is None else [arr]
        data, state = init_data(_like(X), x), random_state_for_init(self.random_state, seed_of(self.random_state))
        return [self._init_array(n_features, data, state) for _ in range(runs)]

    def _check_fitted(self) -> None:
        if not hasattr(self, "cluster_centers_"):
            raise not_fitted(f"this {type(self).__name__} is not fitted yet: call fit() or partial_fit() first")

    def _blocks(self, X: Any, stacklevel: int = 4) -> da.Array:
        self._check_fitted()
        table = read_table(X)
        _check_features(self, int(table.array.shape[1]))
        return super()._blocks(table, stacklevel + 1)  # one frame more: this one

    def _resolve_init_size(self, n: int, batch: int) -> int:
        """The rows the inits are drawn from (see ``init_size``), kept as ``_init_size``."""
        size = self.init_size if self.init_size is not None else 3 * batch
        if size < self.n_clusters:
            if self.init_size is not None:
                warnings.warn(f"init_size={self.init_size} should be larger than n_clusters={self.n_clusters}. "
                              f"Setting it to min(3*n_clusters, n_samples)", DaskmeansRuntimeWarning, stacklevel=4)
            size = 3 * self.n_clusters
        self._init_size = min(size, n)
        return self._init_size

    def _rule(self, n: int, batch: int, n_steps: int, tol_abs: float, seed: int) -> _Rule:
        return _Rule(n, batch, n_steps, tol_abs, self.max_no_improvement, float(self.reassignment_ratio), seed,
                     self.precision)

    def _finish(self, st: _State, dtype: Any, d: int, backend: str) -> None:
        self.cluster_centers_ = st.centers.astype(dtype)
        self.counts_ = st.counts.copy()
        self._state = st
        self.n_features_in_ = d
        self._n_features_out = int(st.centers.shape[0])
        self.backend_ = backend

    # ------------------------------------------------------------ fit

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> "MiniBatchKMeans":
        """Run mini-batch steps from a fresh init until ``max_iter`` passes or the stop rule.

        Parameters
        ----------
        X : array (n_samples, n_features) (NumPy, CuPy, Dask, DataFrame) or a path (Zarr/CSV/.npy)
        y : ignored
        sample_weight : array (n_samples,), optional
        """
        self._fit(X, sample_weight, None, False)
        return self

    def _fit(self, X: Any, sample_weight: Any, callback: Any, resume: bool, then: Any = None) -> Any:
        """The fit (``callback`` and ``resume``, KMeans's, are not used); ``then(client)`` runs
        after it on the fit's client, its result returned (``fit_predict``)."""
        from .engine.job import FitJob
        from .seeding import resolve_init

        self._validate_params()
        runs = self._runs()
        table = read_table(X)  # the columns' names from a DataFrame, a CSV header, a Zarr attribute
        table.refuse_identifiers()
        names, x = _names(table), table.array
        n, d = (int(s) for s in x.shape)
        k = self.n_clusters
        check_n_clusters(n, k)
        cands = self._candidates(d, runs, X, x)
        w = None if sample_weight is None else read_weights(sample_weight, x)
        with using_client(self.client, self.backend, exclusive=True) as client:
            job = FitJob.open(client, x, k, sample_weight=w, path=table.source, backend=self.backend, tier=self.tier,
                              memory_limit=self.memory_limit, device_memory_limit=self.device_memory_limit,
                              precision=self.precision)
            backend, tiers = job.backend, job.tiers
            with job:
                moments = job.moments()
                tol_abs = float(np.mean(moments["var"])) * float(self.tol)
                batch = min(int(self.batch_size), n)
                n_steps = max(1, int(self.max_iter) * n // batch)
                seeds = np.random.SeedSequence(seed_of(self.random_state)).generate_state(4 + runs)
                self._seeds = [int(s) for s in seeds]
                step_seed, reassign_seed, sample_seed = self._seeds[:3]
                rule = self._rule(n, batch, n_steps, tol_abs, reassign_seed)
                # The init: candidates (one per n_init), the one of lowest inertia on validation rows kept.
                m = self._resolve_init_size(n, batch)
                rng = np.random.default_rng(sample_seed)
                init_rows = np.sort(rng.choice(n, m, replace=False))
                valid_rows = rng.integers(0, n, m)
                fixed = cands
                if fixed is None and self.init not in _SAMPLE_INITS:  # the engine's inits over all rows (k-means||, ...)
                    fixed = [job.survive(lambda p: resolve_init(client, p, self.init, k, int(s))) for s in seeds[4:]]
                centers = job.survive(lambda p: _on_rows(
                    client, p, np.concatenate([init_rows, valid_rows]), _choose_init, init_rows, valid_rows, fixed,
                    self.init, k, [int(s) for s in seeds[4:]], backend, self.precision))
                st = _State(centers, np.zeros(k))
                while st.step < n_steps and not st.done:
                    per_round = max(1, min(ROUND_STEPS_MAX, ROUND_BYTES // (8 * d * batch)))
                    steps = range(st.step, min(n_steps, st.step + per_round))
                    idx = [_batch_rows(step_seed, t, n, batch) for t in steps]
                    prev = st
                    st = job.survive(lambda p: _on_rows(client, p, np.concatenate(idx), _run_steps, idx, prev, rule,
                                                        backend))
                    if self.verbose:
                        print(f"MiniBatchKMeans: step {st.step}/{n_steps}, smoothed batch inertia per row "
                              f"{float('nan') if st.ewa is None else st.ewa:.6e}", file=sys.stdout, flush=True)
                if self.verbose and st.stopped:
                    print(f"{st.stopped} at step {st.step}/{n_steps}", file=sys.stdout, flush=True)
                self._finish(st, x.dtype, d, backend)
                self.n_steps_ = st.step
                self.n_iter_ = int(np.ceil(st.step * batch / n))
                self.tier_ = tiers.tier
                if self.compute_labels:
                    labels, self.inertia_ = job.survive(lambda p: _labels_inertia(client, p, st.centers, self.precision))
                    like = _like(X)  # labels_ of the input's kind, as KMeans's
                    self._labels = (infer.materialise(client, labels, like) if _in_memory(like) else labels, client)
                else:
                    self.__dict__.pop("_labels", None)
                    self.inertia_ = float(st.ewa or 0.0) * n
            if names is not None:
                self.feature_names_in_ = names
            else:
                self.__dict__.pop("feature_names_in_", None)
            return None if then is None else then(client)

    def partial_fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> "MiniBatchKMeans":
        """One mini-batch step on all of ``X`` (the first call also initialises from ``X``).

        Parameters
        ----------
        X : array (n_samples, n_features) (NumPy, CuPy, Dask, DataFrame) or a path: the batch
        y : ignored
        sample_weight : array (n_samples,), optional
        """
        self._validate_params()
        table = read_table(X)
        x = table.array
        n, d = (int(s) for s in x.shape)
        first = not hasattr(self, "cluster_centers_")
        if first:
            runs = self._runs()
            table.refuse_identifiers()
            check_n_clusters(n, self.n_clusters)
            cands = self._candidates(d, runs, X, x)
        else:
            self._check_feature_names(table)
            _check_features(self, d)
        w = None if sample_weight is None else read_weights(sample_weight, x)
        with using_client(self.client, self.backend, exclusive=True) as client:
            backend = resolve_backend(client, self.backend, backend_name(x))
            rows = client.compute(x.rechunk({0: -1, 1: -1}))
            weights = None if w is None else client.compute(w.rechunk(-1))
            if first:
                seeds = np.random.SeedSequence(seed_of(self.random_state)).generate_state(4 + runs)
                self._seeds = [int(s) for s in seeds]
                m = self._resolve_init_size(n, min(int(self.batch_size), n))
                rng = np.random.default_rng(self._seeds[2])
                init_rows, valid_rows = np.sort(rng.choice(n, m, replace=False)), rng.integers(0, n, m)
                init = self.init if isinstance(self.init, str) and self.init in _SAMPLE_INITS else "k-means++"  # a sample already
                st = _State(None, np.zeros(self.n_clusters))  # type: ignore[arg-type]
                start = (init_rows, valid_rows, cands, init, self._seeds[4:])
            else:
                st, start = self._state, None
            rule = self._rule(n, n, st.step + 1, 0.0, self._seeds[1])
            fut = client.submit(blas_capped(_partial_step), rows, weights, st, start, rule, self.n_clusters, backend,
                                self.compute_labels, pure=False, key=f"daskmeans-partial-fit-{uuid.uuid4().hex}")
            st, labels, inertia = fut.result()
            self._finish(st, x.dtype, d, backend)
            self.n_steps_ = st.step
            if self.compute_labels:  # of the input's kind, as fit's
                self._labels = (labels if _in_memory(_like(X)) else da.from_array(labels, chunks=x.chunks[0]), client)
                self.inertia_ = inertia
        if first:
            names = _names(table)
            if names is not None:
                self.feature_names_in_ = names
        return self


def _check_features(est: MiniBatchKMeans, got: int) -> None:
    if got != est.n_features_in_:
        raise DataError(f"X has {got} features, but {type(est).__name__} is expecting {est.n_features_in_} features "
                        f"as input")


def _batch_rows(seed: int, step: int, n: int, batch: int) -> np.ndarray:
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
    return gather(client, [fut], placement)[0]


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
    from .seeding.kernels import kmeans_plusplus

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


def _run_steps(parts: list, batches: list, st: _State, rule: _Rule, backend: str) -> _State:
    """Steps ``st.step ...`` on ``batches`` (each the global rows of one batch)."""
    be = get_backend(backend)
    merged = _merge(parts)
    for rows in batches:
        if st.done:
            break
        xb, wb = _rows_of(merged, rows)
        st = _step(be, be.asarray(xb), None if wb is None else be.asarray(wb), st, rule)
    return st


def _partial_step(x: Any, w: Any, st: _State, start: tuple | None, rule: _Rule, k: int, backend: str,
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


def _step(be: Any, xb: Any, wb: Any, st: _State, rule: _Rule) -> _State:
    """One mini-batch step (scikit-learn's ``_mini_batch_step`` and its stop rule).

    Parameters
    ----------
    be : backend module
    xb : backend array (m, d), the batch
    wb : backend array (m,) float64 or None
    st : _State before the step
    rule : _Rule
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
    st = _State(centers, counts, st.step + 1, since, st.ewa, st.ewa_min, st.no_improvement, st.done, st.stopped)
    _stop_rule(st, float(out["inertia"]) / rule.batch_size, shift, rule)
    return st


def _stop_rule(st: _State, batch_inertia: float, shift: float, rule: _Rule) -> None:
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


def _labels_inertia(client: Any, placement: Placement, centers: np.ndarray, precision: str) -> tuple:
    """Every row's label (a lazy Dask array over results the workers hold) and the inertia,
    the chunks' added in chunk order."""
    futs = submit_per_shard(client, placement, _shard_labels, [centers] * len(placement.shards), [precision] * len(placement.shards),
                            name="daskmeans-minibatch-labels")
    per = gather(client, [client.submit(_inertias, f, pure=False) for f in futs], placement)
    pieces = {}
    for f, chunk_ids in zip(futs, placement.chunk_ids):
        for j, cid in enumerate(chunk_ids):
            pieces[cid] = da.from_delayed(dask.delayed(_pick, pure=True)(f, j), shape=(placement.row_chunks[cid],),
                                          dtype=np.int32, meta=np.empty(0, np.int32))
    inertia = 0.0
    for _, v in sorted(c for p in per for c in p):
        inertia += v
    return da.concatenate([pieces[i] for i in range(len(placement.row_chunks))]), inertia
