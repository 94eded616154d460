"""``MiniBatchKMeans``: Sculley's mini-batch k-means, scikit-learn's API over the engine's rounds.

This module holds the front: parameters and their checks, the data read, ``init_size`` and
``n_init`` resolved, the outputs of the input's kind. The rounds themselves (batches drawn by
global row, steps on the shards, the stop rule, the final labels and inertia) run on a
:class:`~daskmeans.engine.job.FitJob` in :mod:`daskmeans.engine.minibatch`, which says why the
result is bitwise the same for any chunking, worker count and tier.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import dask.array as da
import numpy as np

from .dask_cluster import using_client
from .engine.minibatch import InitDraw, Rule, State, fit_minibatch, partial_step
from .conventions import DaskmeansRuntimeWarning, init_data, random_state_for_init, resolve_n_init
from .errors import DataError, not_fitted
from .kmeans_base import INIT_NAMES, BaseKMeans, in_memory, output_like
from .params import MiniBatchParams, RunParams, constraints, record
from .io.readers import read_table, read_weights
from .validation import check_n_clusters, seed_of

# The defaults of MiniBatchKMeans's signature: the records' (written once, in params.py).
_ALGO, _RUN = MiniBatchParams(), RunParams()


class MiniBatchKMeans(BaseKMeans):
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

    # The records' constraints (params.py): MiniBatchParams and the run's settings it takes.
    _parameter_constraints = constraints(MiniBatchParams, RunParams, registries={"inits": INIT_NAMES},
                                         omit=("collective", "checkpoint", "checkpoint_every"))

    def __init__(
        self,
        n_clusters: int = _ALGO.n_clusters,
        *,
        init: Any = _ALGO.init,
        max_iter: int = _ALGO.max_iter,
        batch_size: int = _ALGO.batch_size,
        verbose: int = _RUN.verbose,
        compute_labels: bool = _ALGO.compute_labels,
        random_state: Any = _ALGO.random_state,
        tol: float = _ALGO.tol,
        max_no_improvement: int | None = _ALGO.max_no_improvement,
        init_size: int | None = _ALGO.init_size,
        n_init: int | str = _ALGO.n_init,
        reassignment_ratio: float = _ALGO.reassignment_ratio,
        backend: str = _RUN.backend,
        precision: str = _ALGO.precision,
        tier: str = _RUN.tier,
        memory_limit: int | str | None = _RUN.memory_limit,
        device_memory_limit: int | str | None = _RUN.device_memory_limit,
        client: Any = None,
    ):
        self._store_params(locals())

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
        data, state = init_data(output_like(X), x), random_state_for_init(self.random_state, seed_of(self.random_state))
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

    def _rule(self, n: int, batch: int, n_steps: int, tol_abs: float, seed: int) -> Rule:
        return Rule(n, batch, n_steps, tol_abs, self.max_no_improvement, float(self.reassignment_ratio), seed,
                     self.precision)

    def _finish(self, st: State, dtype: Any, d: int, backend: str) -> None:
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
        self._validate_params()
        runs = self._runs()
        table = read_table(X)  # the columns' names from a DataFrame, a CSV header, a Zarr attribute
        table.refuse_identifiers()
        names, x = table.feature_names, table.array
        n, d = (int(s) for s in x.shape)
        k = self.n_clusters
        check_n_clusters(n, k)
        cands = self._candidates(d, runs, X, x)
        w = None if sample_weight is None else read_weights(sample_weight, x)
        self._seeds = self._draw_seeds(runs)
        step_seed, reassign_seed, sample_seed = self._seeds[:3]
        draw = InitDraw(self.init, cands, self._resolve_init_size(n, min(int(self.batch_size), n)), self._seeds[4:],
                        sample_seed)
        with using_client(self.client, self.backend, exclusive=True) as client:
            res = fit_minibatch(
                client, x, record(MiniBatchParams, self), record(RunParams, self), draw, step_seed=step_seed,
                reassign_seed=reassign_seed, sample_weight=w, path=table.source, files=table.files(),
                in_memory=table.in_memory, report=self._round_line if self.verbose else None,
            )
            st = res.state
            if self.verbose and st.stopped:
                print(f"{st.stopped} at step {st.step}/{res.n_steps}", file=sys.stdout, flush=True)
            self._finish(st, x.dtype, d, res.backend)
            self.n_steps_ = st.step
            self.n_iter_ = int(np.ceil(st.step * res.batch / n))
            self.tier_ = res.tier
            if self.compute_labels:  # labels_ of the input's kind (the engine's), as KMeans's
                self._labels, self.inertia_ = (res.labels, client), res.inertia
            else:
                self.__dict__.pop("_labels", None)
                self.inertia_ = float(st.ewa or 0.0) * n
            if names is not None:
                self.feature_names_in_ = names
            else:
                self.__dict__.pop("feature_names_in_", None)
            return None if then is None else then(client)

    def _draw_seeds(self, runs: int) -> list[int]:
        """The fit's seeds from ``random_state``: batches, reassignments, the init's rows, one
        spare, then one per init candidate (``runs``); kept as ``_seeds`` for ``partial_fit``."""
        return [int(s) for s in np.random.SeedSequence(seed_of(self.random_state)).generate_state(4 + runs)]

    @staticmethod
    def _round_line(st: State, n_steps: int) -> None:
        """``verbose``'s line after a round of steps."""
        print(f"MiniBatchKMeans: step {st.step}/{n_steps}, smoothed batch inertia per row "
              f"{float('nan') if st.ewa is None else st.ewa:.6e}", file=sys.stdout, flush=True)

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
        draw = None
        if first:
            runs = self._runs()
            table.refuse_identifiers()
            check_n_clusters(n, self.n_clusters)
            cands = self._candidates(d, runs, X, x)
            self._seeds = self._draw_seeds(runs)
            size = self._resolve_init_size(n, min(int(self.batch_size), n))
            draw = InitDraw(self.init, cands, size, self._seeds[4:], self._seeds[2])
            st = None
        else:
            self._check_feature_names(table)
            _check_features(self, d)
            st = self._state
        w = None if sample_weight is None else read_weights(sample_weight, x)
        rule = self._rule(n, n, (0 if st is None else st.step) + 1, 0.0, self._seeds[1])
        with using_client(self.client, self.backend, exclusive=True) as client:
            st, labels, inertia, backend = partial_step(client, x, w, st, rule, self.n_clusters, self.backend,
                                                        bool(self.compute_labels), draw)
            self._finish(st, x.dtype, d, backend)
            self.n_steps_ = st.step
            if self.compute_labels:  # of the input's kind, as fit's
                self._labels = (labels if in_memory(output_like(X)) else da.from_array(labels, chunks=x.chunks[0]), client)
                self.inertia_ = inertia
        if first:
            names = table.feature_names
            if names is not None:
                self.feature_names_in_ = names
        return self


def _check_features(est: MiniBatchKMeans, got: int) -> None:
    if got != est.n_features_in_:
        raise DataError(f"X has {got} features, but {type(est).__name__} is expecting {est.n_features_in_} features "
                        f"as input")
