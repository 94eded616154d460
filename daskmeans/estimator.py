"""``KMeans``: the scikit-learn-style front of the engine.

``__init__`` only stores parameters; ``fit`` validates them (declarative constraints), then the
data, before any distributed work is submitted. The work itself is the engine's: the fit
driver (``engine/fit.py``) and inference by blocks (``engine/infer.py``, through
``BaseKMeans``), on the client that ``dask_cluster.using_client`` gives (the one passed, the
default one, or a local cluster started once per process).

Outputs follow the input: NumPy, pandas, lists and other in-memory data give NumPy arrays,
CuPy arrays give CuPy arrays, Dask arrays and DataFrames and paths give lazy Dask arrays. The
fit's labels come from the engine in that kind (the read says whether the data was in memory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from typing import Any, Callable

import numpy as np

from .backends import choices as backend_choices, names as backend_names
from .dask_cluster import using_client
from .engine.fit import fit_distributed
from .errors import DaskmeansError
from .io.readers import read_table, read_weights
from .numerics.hashing import column_keys, splitmix64
from . import config
from .conventions import DaskmeansRuntimeWarning, clusters_warning, init_data, random_state_for_init, resolve_n_init
from .kmeans_base import INIT_NAMES, BaseKMeans
from .params import KMeansParams, RunParams, constraints, doc_choices, record
from .events import watched, watching
from .progress import Progress, Steps
from .sampling import sample_size
from .timing import Phases
from .validation import Interval, Options, check_n_clusters, seed_of, validate_params

# The defaults of KMeans's signature: the records' (written once, in params.py).
_ALGO, _RUN = KMeansParams(), RunParams()




class KMeans(BaseKMeans):
    """K-means clustering on a Dask cluster (Lloyd's algorithm, NumPy or CuPy workers).

    Parameters
    ----------
    n_clusters : int, default 8
    init : {inits}, callable, array-like (n_clusters, n_features) or .npy path
        ``k-means||`` (Bahmani et al. 2012) runs distributed; ``k-means++`` is greedy
        k-means++ on a sample of ``daskmeans.init.sample-size`` rows. A callable is called as
        scikit-learn calls it, ``init(X, n_clusters, random_state)``, once per run: ``X`` as an
        array (a CSR matrix for sparse ``X``) when ``X`` is in memory, the lazy Dask array for
        Dask or file data; ``random_state`` a ``numpy.random.RandomState``. An array-like (an
        array, a list of rows) gives the centres themselves.
    n_init : "auto" or int, default "auto"
        Runs from different seeds; the one with the lowest inertia is kept. ``"auto"`` is
        scikit-learn's rule: 1 run for ``k-means||``, ``k-means++``, ``hierarchical`` and
        ``afk-mc2`` (and explicit centres), 10 for ``random`` and a callable. Explicit centres run once whatever ``n_init`` (with
        scikit-learn's RuntimeWarning when it asks for more).
    max_iter : int, default 300
    tol : float, default 1e-4
        As scikit-learn: stop when the summed squared centroid shift is at most
        ``tol * mean(var(X, axis=0))``. Also stops when no label changes.
    random_state : int, numpy.random.Generator, RandomState or None
        Seed of every random draw; the same seed gives the same result on any cluster layout.
    copy_x : bool, default True
        scikit-learn's: whether ``X`` may be centred in place during the fit. daskmeans never
        writes to ``X`` (its exact fixed-point sums need no centring), so ``X`` is left as it
        was with either value.
    algorithm : {"lloyd", "elkan", "yinyang"}, default "lloyd"
        scikit-learn's names run the engine's Lloyd loop: Elkan's bounds only skip distance
        computations and give Lloyd's result, which the engine computes exactly with one GEMM
        pass per iteration (see :data:`daskmeans.params.ALGORITHMS`). ``"elkan"`` with one cluster
        warns as scikit-learn does. ``"yinyang"`` runs Yinyang's bounded step: Lloyd's result
        bit for bit, the distances skipped for rows whose bounds certify their label (8 bytes
        per row and group of centroids kept on the workers).
    oversampling_factor : float, default 0.83
        k-means|| draws ``oversampling_factor * n_clusters`` points per round (3 rounds:
        about 2.5 candidates per cluster by default; the init's cost grows with it).
    max_samples_per_cluster : int, optional
        Train on at most ``max_samples_per_cluster * n_clusters`` rows (FAISS's
        ``max_points_per_centroid``): where the data has more, the fit runs on that many rows
        drawn from ``random_state`` (the rows of smallest per-row draw, the same rows for any
        chunking and worker count; with their weights), then labels every row and measures
        ``inertia_`` and ``cluster_sizes_`` over every row. Default
        ``daskmeans.max-samples-per-cluster`` (null: every row).
    max_imbalance : float, optional
        Balance the cluster sizes, as an inverted-file index wants its lists: while the
        largest cluster holds more than ``max_imbalance`` times the mean size (rows over
        ``n_clusters``), each iteration (whatever ``max_iter``: its first iterations are those
        of any longer fit) moves the centroids of as many of the smallest
        clusters (below the mean size) onto a row of each cluster above the bound, so the
        Lloyd steps that follow split it. A bound to approach, not a guarantee: the sizes
        are in ``history_[i]["imbalance"]`` and the moves in ``history_[i]["n_moved"]``; the
        inertia can rise in an iteration that moves centroids. Must be > 1; default None (off).
    backend : {backends}
        ``auto`` uses CuPy when the data is CuPy or every worker has a GPU.
    metric : {"euclidean", "cosine"}, default "euclidean"
        ``cosine`` is spherical k-means: rows are scaled to unit norm, centroids are unit
        vectors renormalised each iteration, and ``inertia_`` sums ``1 - cos(x, c)``.
    precision : {"fp32", "tf32", "bf16"}, default "fp32"
        GEMM precision of the GPU kernels. Labels are those of exact distances in every mode:
        rows whose margin the GEMM's certified error bound cannot separate are re-ranked
        exactly (their fraction is ``history_[i]["rechecked"]``; a few per mille in fp32,
        a few percent in tf32/bf16). fp32 runs as split TF32 on A100/H100-class GPUs
        (``daskmeans.gpu-fp32-gemm``). CPUs compute in the data dtype whatever the mode.
    tier : {"auto", "device", "host", "storage"}, default "auto"
        Where each worker keeps its rows: GPU memory, host memory (pinned, copied to the GPU
        chunk by chunk), or the source file (re-read every pass); ``auto`` takes the first
        that fits the budgets. The result is the same in every tier.
    memory_limit, device_memory_limit : int or str, optional
        Per-worker budgets for resident data in host and GPU memory (``"4GiB"``); default
        ``daskmeans.memory-limit`` / ``daskmeans.device-memory-limit`` (auto).
    checkpoint : str, optional
        A Zarr path where the fit's restart point (centroids, iteration, history) is written
        atomically every ``checkpoint_every`` iterations and when the fit is interrupted;
        ``fit(X, resume=True)`` continues from it, bitwise as if never stopped.
    checkpoint_every : int, default 10
    verbose : bool or int, default 0
        1 (or True): print one line per iteration on stdout (run, iteration, inertia, shift,
        reassigned, empty clusters, seconds), as the command line does; 2: also the
        cluster-size imbalance and the throughput.
    client : distributed.Client, optional
        The cluster to work on. Default: inside a Dask task, the worker's client (see
        below); else the default client (``distributed.default_client()``); else the local
        cluster the command line starts (up to ``daskmeans.local-threads-max-workers``
        in-process workers, one per GPU or single-threaded CPU workers; beyond, worker
        processes), started by the first ``fit``, ``predict``, ``transform`` or
        ``score`` of the process that needs it, reused after, made the default client, and
        closed at exit. Inside a Dask task (``joblib``'s Dask backend, ``client.submit``) the
        work runs in ``distributed.worker_client()``, and fits from tasks run one at a time.

    Notes
    -----
    Outputs follow the input's kind: NumPy arrays, pandas DataFrames, lists and SciPy sparse
    matrices give NumPy arrays, CuPy arrays CuPy arrays, and Dask arrays, Dask DataFrames and
    paths lazy Dask arrays (of NumPy blocks). A DataFrame's column names are kept in
    ``feature_names_in_`` and checked, as scikit-learn does, by ``predict``, ``transform`` and
    ``score``; so are a CSV file's header and a Zarr array's ``feature_names`` attribute
    where ``X`` is a path (the messages then name the file, in one line). A CSV column that
    looks like an identifier (integers, named ``id``, ``*_id``, ``row``, ``index``, or an
    unnamed first column) is refused by ``fit`` unless selected by ``columns``
    (:func:`daskmeans.io.readers.read_table`).

    The estimator follows scikit-learn's conventions where scikit-learn defines them
    (parameters, inits, errors and warnings, ``get_feature_names_out``, ``set_output``) and
    passes scikit-learn's own KMeans tests but those listed in ``docs/sklearn.md``, where it
    differs on purpose: results bitwise the same for any chunking and worker count, its own
    default init (``k-means||``), ``k-means++`` on a sample. :mod:`daskmeans.accel` runs
    unmodified scikit-learn code on it.

    Attributes
    ----------
    cluster_centers_ : ndarray (n_clusters, n_features)
    labels_ : ndarray (n_samples,) int32, or a lazy dask array
        Of the input's kind, as ``predict``'s: a NumPy array when ``X`` was in memory (NumPy,
        pandas, a list, a sparse matrix; CuPy for CuPy ``X``), computed at the end of the fit
        and kept when the model is pickled; a lazy Dask array when ``X`` was Dask data or a
        path, whose blocks live on the fitting client's cluster: compute it while that client
        is open (``client.compute(km.labels_)`` when it is not the default client). Settable,
        as scikit-learn's.
    inertia_ : float
        Sum over every row of ``X`` (weighted) of its distance to the nearest centroid, also
        when the fit trained on a sample (``max_samples_per_cluster``).
    sample_inertia_ : float
        The same over the rows the fit trained on (``history_`` follows these rows).
    n_samples_fit_ : int
        Rows the centroids were fitted on: ``n_samples``, or the sample's size.
    n_iter_ : int
    cluster_sizes_ : ndarray (n_clusters,) int64
        Rows per cluster under the final centroids (every row of ``X``).
    history_ : list of dict, one per iteration (iteration, inertia, shift, reassigned,
        n_empty, rechecked (fraction of rows), imbalance, n_moved (see ``max_imbalance``),
        seconds, kernel_seconds,
        collective_seconds, update_seconds, gb_per_s). ``seconds`` is rank 0's wall time;
        ``kernel_seconds`` the slowest worker's time from the iteration's start to its last
        assignment kernel (CUDA events on a GPU); ``collective_seconds`` and
        ``update_seconds`` rank 0's combine and centroid update.
    timings_ : dict of str to float
        Wall seconds of the fit's phases: read (open and check the data), plan (the
        workers' budgets and the tier), place, moments (the pass that checks the data and
        sets the tolerance), init, iterations (the Lloyd loop, with its final labels pass);
        training on a sample adds sample (drawing its rows) and all rows (the inertia and
        sizes of every row).
    n_features_in_ : int
    feature_names_in_ : ndarray (n_features_in_,) of str
        The column names of ``X`` in ``fit``, where it had columns (a pandas or Dask
        DataFrame, or anything with ``columns``) whose names are all strings, or where ``X``
        was a file that names them: a CSV header (the columns read), a Zarr array's
        ``feature_names`` attribute.
    _n_init : int
        The runs the fit made (``n_init`` resolved, scikit-learn's attribute).
    """

    # The records' constraints (params.py); the inits' names are the registry's (a live view).
    _parameter_constraints = constraints(KMeansParams, RunParams, registries={"inits": INIT_NAMES},
                                         omit=("collective",)) | {
        "backend": Options(backend_names)}  # the backends' registry, read when checked (a live view)

    def __init__(
        self,
        n_clusters: int = _ALGO.n_clusters,
        *,
        init: Any = _ALGO.init,
        n_init: int | str = _ALGO.n_init,
        max_iter: int = _ALGO.max_iter,
        tol: float = _ALGO.tol,
        random_state: int | None = _ALGO.random_state,
        copy_x: bool = _ALGO.copy_x,
        algorithm: str = _ALGO.algorithm,
        oversampling_factor: float = _ALGO.oversampling_factor,
        max_samples_per_cluster: int | None = _ALGO.max_samples_per_cluster,
        max_imbalance: float | None = _ALGO.max_imbalance,
        backend: str = _RUN.backend,
        metric: str = _ALGO.metric,
        precision: str = _ALGO.precision,
        tier: str = _RUN.tier,
        memory_limit: int | str | None = _RUN.memory_limit,
        device_memory_limit: int | str | None = _RUN.device_memory_limit,
        checkpoint: str | None = _RUN.checkpoint,
        checkpoint_every: int = _RUN.checkpoint_every,
        verbose: int | bool = _RUN.verbose,
        client: Any = None,
    ):
        self._store_params(locals())

    def _validate_params(self) -> None:
        """Check every parameter against its constraint (no data, no cluster needed)."""
        validate_params(self._constrained(), self._parameter_constraints)
        if self.checkpoint is not None and self.n_init not in (1, "auto"):
            raise DaskmeansError(f"n_init={self.n_init} should be 1 with checkpoint={os.fspath(self.checkpoint)!r}")
        self._per_cluster()

    def _runs(self) -> int:
        """``n_init`` resolved for this fit (``"auto"``, explicit centres: see ``n_init``),
        with scikit-learn's RuntimeWarnings; also kept as ``_n_init``."""
        if self.algorithm == "elkan" and self.n_clusters == 1:
            warnings.warn("algorithm='elkan' doesn't make sense for a single cluster. Using 'lloyd' instead.",
                          DaskmeansRuntimeWarning, stacklevel=4)
        self._n_init = resolve_n_init(self, default=10)
        if self.checkpoint is not None and self._n_init != 1:
            raise DaskmeansError(f"n_init={self.n_init} ({self._n_init} runs for init={self.init!r}) should be 1 "
                                 f"with checkpoint={os.fspath(self.checkpoint)!r}")
        return self._n_init

    def training_rows(self, n_samples: int) -> int:
        """Rows a fit on ``n_samples`` rows trains on (see ``max_samples_per_cluster``).

        Parameters
        ----------
        n_samples : int
            Rows of the data.

        Returns
        -------
        int
            ``n_samples``, or ``max_samples_per_cluster * n_clusters`` where that is fewer.

        Raises
        ------
        DaskmeansError
            A fit on a sample with a ``checkpoint`` but no int ``random_state``: the sample is
            part of the checkpoint's fingerprint (its row count and content digest), and only a
            seed the user gives draws it again on resume.
        """
        m = sample_size(n_samples, self.n_clusters, self._per_cluster())
        if m is None:
            return int(n_samples)
        if self.checkpoint is not None and not isinstance(self.random_state, int):
            raise DaskmeansError(
                f"max_samples_per_cluster={self._per_cluster()} with checkpoint={os.fspath(self.checkpoint)!r} "
                f"needs an int random_state (--seed): the sample is drawn from it, and a resumed fit must "
                f"draw the same one")
        return m

    def _per_cluster(self) -> int | None:
        """``max_samples_per_cluster``, or the configured default (checked as the parameter is)."""
        if self.max_samples_per_cluster is not None:
            return self.max_samples_per_cluster
        value = config.get("max-samples-per-cluster")
        if value is not None:
            Interval(1, None, integer=True).check("daskmeans.max-samples-per-cluster", value)
        return value

    def _read_checkpoint(self) -> dict:
        from .io.checkpoint import read_checkpoint

        if self.checkpoint is None:
            raise DaskmeansError("resume=True needs checkpoint=PATH (--checkpoint)")
        return read_checkpoint(os.fspath(self.checkpoint))

    # ------------------------------------------------------------ fit

    def fit(
        self,
        X: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        callback: Callable[[dict], None] | None = None,
        resume: bool = False,
    ) -> "KMeans":
        """Compute k-means clustering.

        Parameters
        ----------
        X : array (n_samples, n_features) (NumPy, CuPy, Dask; a pandas or Dask DataFrame, whose
            column names become ``feature_names_in_``) or a path (Zarr/CSV/.npy; a CSV header
            or a Zarr array's ``feature_names`` attribute become ``feature_names_in_``), or a
            Table from :func:`daskmeans.io.readers.read_table`
        y : ignored
        sample_weight : array (n_samples,), optional
        callback : callable(dict), optional
            Called with each iteration's statistics (see ``history_``), and ``run``: which
            of the ``n_init`` runs (from 1).
        resume : bool, default False
            Continue from ``checkpoint`` (written by an earlier fit of the same data and
            parameters) instead of initialising.
        """
        self._fit(X, sample_weight, callback, resume)
        return self

    def _fit(self, X: Any, sample_weight: Any, callback: Callable[[dict], None] | None, resume: bool,
             then: Callable[[Any], Any] | None = None) -> Any:
        """The fit; ``then(client)`` runs after it on the fit's client, its result returned."""
        self._validate_params()
        runs = self._runs()
        callbacks = [c for c in (self._printer(runs), callback) if c is not None]
        phase = Phases()
        seed = seed_of(self.random_state)
        with phase("read"):
            ck = self._read_checkpoint() if resume else None
            table = read_table(X)  # the columns' names from a DataFrame, a CSV header, a Zarr attribute
            table.refuse_identifiers()  # a CSV column that numbers rows is no feature
            # What a callable init is given: data given in memory as it was, else the lazy array read.
            like = X if table.in_memory else table.array
            names, X = table.feature_names, table.array
            path = table.file()  # a path given or an array read() from one: messages name it
            files = table.files()  # every file the rows come from: a re-fit checks them for changes
            n, d = (int(s) for s in X.shape)
            check_n_clusters(n, self.n_clusters)
            starts = self._starts(d, runs, init_data(like, X) if callable(self.init) else None, seed)
            w = None if sample_weight is None else read_weights(sample_weight, X)
            rows = self.training_rows(n)
            m = None if rows == n else rows
            if m is not None and seed is None:  # the sample and the runs draw from one seed
                seed = int(np.random.SeedSequence().generate_state(1)[0])
        # The records the engine runs (params.py): explicit centres as one array, or one per
        # run of a callable init; the seed the user chose, which a checkpoint records.
        algo = dataclasses.replace(
            record(KMeansParams, self), init=self.init if starts is None else starts[0] if len(starts) == 1 else starts,
            n_init=runs if starts is None else len(starts),
            random_state=self.random_state if isinstance(self.random_state, int) else None,
        )
        run = dataclasses.replace(record(RunParams, self), collective=config.get("collective"),
                                  checkpoint=None if self.checkpoint is None else os.fspath(self.checkpoint))
        # verbose >= 1: the long steps before the iterations (placing, moments, the init) as
        # lines too, where no command shows them already.
        steps = watching(Steps(False, stream=sys.stdout, live=False)) if self.verbose and not watched() \
            else contextlib.nullcontext()
        with using_client(self.client, self.backend, exclusive=True) as client, steps:
            best = fit_distributed(
                client, X, algo, run, seed=seed, sample_weight=w, path=path, files=files, train_rows=m, resume=ck,
                in_memory=table.in_memory, callback=_fanout(callbacks), phase=phase,
                on_checkpoint=lambda it: setattr(self, "checkpoint_iteration_", it),
            )
            self.sample_inertia_, self.n_samples_fit_ = best.sample_inertia, best.n_samples_fit
            self._fitted(best, client, d, names, X.dtype)  # labels_ of the input's kind, as predict(X) gives them
            return None if then is None else then(client)

    def _printer(self, runs: int) -> Callable[[dict], None] | None:
        """What ``verbose`` prints of each iteration (None when quiet): the command line's lines."""
        if not self.verbose:
            return None
        return Progress(False, self.verbose >= 2, self.max_iter, runs, stream=sys.stdout, live=False)

    def _starts(self, n_features: int, runs: int, data: Any, seed: int | None) -> list[np.ndarray] | None:
        """The explicit initial centres of each run: one array for array-like or file centres,
        one per run for a callable init (called with ``data`` and one RandomState for all
        runs, as scikit-learn calls it), None for a named init."""
        if not callable(self.init):
            arr = self._init_array(n_features)
            return None if arr is None else [arr]
        state = random_state_for_init(self.random_state, seed)
        return [self._init_array(n_features, data, state) for _ in range(runs)]

    def _fitted(self, best: Any, client: Any, d: int, names: np.ndarray | None, dtype: Any) -> None:
        """Set the fitted attributes from the engine's ``FitResult``."""
        self.cluster_centers_ = best.centroids.astype(dtype)
        self.inertia_ = best.inertia
        self.n_iter_ = best.n_iter
        self.history_ = best.history
        self.cluster_sizes_ = best.sizes
        self.n_features_in_ = d
        if names is not None:
            self.feature_names_in_ = names
        else:  # fitted again on data without names: the old ones no longer apply
            self.__dict__.pop("feature_names_in_", None)
        self.backend_ = best.backend
        self.tier_ = best.tier
        self.tier_plan_ = best.tier_plan
        self.best_run_ = best.best_run
        self.tol_abs_ = best.tol_abs
        self.converged_ = best.converged
        self.timings_ = best.timings
        self._n_features_out = int(best.centroids.shape[0])
        self._labels = (best.labels, client)
        # Fewer distinct points than clusters: some clusters end empty, or (ties between equal
        # centroids split on a GPU) as copies of others. Either way the user should know (in
        # scikit-learn's words too, and its ConvergenceWarning where it is in use).
        n_empty = int((best.sizes == 0).sum())
        n_copies = self.n_clusters - _distinct_rows(best.centroids)
        if n_empty or n_copies:
            warnings.warn(
                f"at the end of the fit {n_empty} of n_clusters={self.n_clusters} clusters are empty and {n_copies} "
                f"centroids are copies of others: the data has fewer distinct points than clusters (or they are too "
                f"close together to split). Number of distinct clusters ({self.n_clusters - n_empty}) found smaller "
                f"than n_clusters ({self.n_clusters}). Possibly due to duplicate points in X.",
                clusters_warning(), stacklevel=4,
            )



def _distinct_rows(a: np.ndarray) -> int:
    """The number of distinct rows of ``a`` (n, d) (values compared as numbers: -0.0 equals
    0.0), as ``len(np.unique(a, axis=0))`` counts them, without sorting rows, which at wide K
    took longer than a short fit's iterations: each row's value bits hashed
    (:mod:`daskmeans.numerics.hashing`'s mix), the rows of equal hashes compared with the first
    of them at once, and ``np.unique`` only for a hash shared by unequal rows. No copy of ``a``
    is made unless it holds a -0.0."""
    a = np.ascontiguousarray(a, np.float64)
    if a.shape[0] < 2:
        return int(a.shape[0])
    if (np.signbit(a) & (a == 0)).any():
        a = a + 0.0  # -0.0 becomes 0.0: equal values, equal bits
    with np.errstate(over="ignore"):
        h = splitmix64(np, a.view(np.uint64) @ column_keys(np, a.shape[1]))  # wraps modulo 2**64
    order = np.argsort(h, kind="stable")
    hs = h[order]
    new = np.concatenate(([True], hs[1:] != hs[:-1]))
    starts = np.flatnonzero(new)
    if starts.size == a.shape[0]:  # every hash its own: every row distinct
        return int(starts.size)
    run = np.cumsum(new) - 1  # each sorted row's run of equal hashes
    shared = np.flatnonzero(np.bincount(run)[run] > 1)  # the sorted rows whose hash others share
    unequal = ~(a[order[shared]] == a[order[starts[run[shared]]]]).all(axis=1)
    n = int(starts.size)
    ends = np.append(starts[1:], a.shape[0])
    for r in np.unique(run[shared[unequal]]):  # a hash of unequal rows (or NaN): counted as NumPy counts
        n += len(np.unique(a[order[starts[r]:ends[r]]], axis=0)) - 1
    return n


# The docstring's lists of inits and backends: the registries' (params.doc_choices).
KMeans.__doc__ = doc_choices(KMeans.__doc__, inits=INIT_NAMES, backends=backend_choices())


# ---------------------------------------------------------------- helpers


def _fanout(callbacks: list[Callable[[dict], None]]) -> Callable[[dict], None] | None:
    """One callback calling each of ``callbacks``; None where there is none."""
    if not callbacks:
        return None

    def each(stats: dict) -> None:
        for c in callbacks:
            c(stats)

    return each

