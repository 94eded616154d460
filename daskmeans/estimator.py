"""``KMeans``: the scikit-learn-style front of the engine.

``__init__`` only stores parameters; ``fit`` validates them (declarative constraints), then the
data, before any distributed work is submitted. The work itself is the engine's: the fit
driver (``engine/fit.py``) and inference by blocks (``engine/infer.py``), on the client that
``dask_cluster.using_client`` gives (the one passed, the default one, or a local cluster
started once per process).

Outputs follow the input: NumPy, pandas, lists and other in-memory data give NumPy arrays,
CuPy arrays give CuPy arrays, Dask arrays and DataFrames and paths give lazy Dask arrays.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import os
import sys
import warnings
from typing import Any, Callable, Iterator

import dask.array as da
import numpy as np

from .backends import PRECISIONS, get_backend
from .dask_cluster import api_client, using_client
from .engine import infer
from .engine.fit import FitParams, fit_distributed
from .errors import DaskmeansError, DataError, not_fitted
from .io.model_store import load_model, save_model
from .io.memory_reader import column_names as feature_names
from .io.readers import Table, file_of, read, read_table, read_weights
from . import config
from .conventions import (Boolean, InitLike, NInit, DaskmeansRuntimeWarning, Verbose, call_init, check_init_shape,
                          clusters_warning, feature_names_out, init_data, random_state_for_init,
                          resolve_n_init, wrap_output, OUTPUTS)
from .metric import METRICS, get_metric, inertia_scale
from .options import TIERS
from .events import watched, watching
from .progress import Progress, Steps
from .sampling import sample_size
from .seeding import REGISTRY as INITS
from .timing import Phases
from .validation import (AnyOf, ByteSize, Interval, NoneOr, Options, PathLike, RandomStateLike, check_feature_names,
                         check_n_clusters, check_n_features, seed_of, validate_params)

INIT_NAMES = INITS.keys()  # the registered inits' names (a live view)
# ``algorithm``: the loop each name runs. Elkan's triangle-inequality bounds skip distance
# computations but give Lloyd's result (scikit-learn's own tests check that they agree); the
# engine's exact Lloyd loop, whose per-iteration cost is one GEMM pass, computes that result,
# so "elkan" runs it. A bounded loop (Yinyang) would be one more entry here.
ALGORITHMS = {"lloyd": "lloyd", "elkan": "lloyd"}


def _inference_doc(summary: str, returns: str) -> Callable[[Callable], Callable]:
    """A decorator giving an inference method (``predict``, ``transform``) its docstring:
    ``summary``, the ``X`` it takes, and ``returns`` (numpydoc's ``name : type``), an array of
    ``X``'s kind."""
    def give(method: Callable) -> Callable:
        method.__doc__ = f"""{summary}

        Parameters
        ----------
        X : array (n_samples, n_features) (NumPy, CuPy, Dask, DataFrame) or a path

        Returns
        -------
        {returns}
            NumPy for in-memory ``X``, CuPy for CuPy ``X``, a lazy Dask array for Dask or path
            ``X``.
        """
        return method

    return give


class KMeans:
    """K-means clustering on a Dask cluster (Lloyd's algorithm, NumPy or CuPy workers).

    Parameters
    ----------
    n_clusters : int, default 8
    init : {"k-means||", "k-means++", "random"}, callable, array-like (n_clusters, n_features) or .npy path
        ``k-means||`` (Bahmani et al. 2012) runs distributed; ``k-means++`` is greedy
        k-means++ on a sample of ``daskmeans.init.sample-size`` rows. A callable is called as
        scikit-learn calls it, ``init(X, n_clusters, random_state)``, once per run: ``X`` as an
        array (a CSR matrix for sparse ``X``) when ``X`` is in memory, the lazy Dask array for
        Dask or file data; ``random_state`` a ``numpy.random.RandomState``. An array-like (an
        array, a list of rows) gives the centres themselves.
    n_init : "auto" or int, default "auto"
        Runs from different seeds; the one with the lowest inertia is kept. ``"auto"`` is
        scikit-learn's rule: 1 run for ``k-means||`` and ``k-means++`` (and explicit centres),
        10 for ``random`` and a callable. Explicit centres run once whatever ``n_init`` (with
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
    algorithm : {"lloyd", "elkan"}, default "lloyd"
        scikit-learn's names. Both run the engine's Lloyd loop: Elkan's bounds only skip
        distance computations and give Lloyd's result, which the engine computes exactly with
        one GEMM pass per iteration (see :data:`ALGORITHMS`). ``"elkan"`` with one cluster
        warns as scikit-learn does.
    oversampling_factor : float, default 0.5
        k-means|| draws ``oversampling_factor * n_clusters`` points per round (5 rounds:
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
    backend : {"auto", "cpu", "gpu"}
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
        cluster the command line starts (one in-process worker per GPU for one GPU, else up
        to ``daskmeans.local-threads-max-workers`` single-threaded CPU workers; several GPUs:
        a ``LocalCUDACluster``), started by the first ``fit``, ``predict``, ``transform`` or
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

    _parameter_constraints = {
        "n_clusters": Interval(1, None, integer=True),
        "init": AnyOf(Options(INIT_NAMES), InitLike()),
        "n_init": NInit(),
        "max_iter": Interval(1, None, integer=True),
        "tol": Interval(0, None),
        "random_state": NoneOr(RandomStateLike()),
        "copy_x": Boolean(),
        "algorithm": Options(tuple(ALGORITHMS)),
        "oversampling_factor": Interval(0, None, closed="neither"),
        "max_samples_per_cluster": NoneOr(Interval(1, None, integer=True)),
        "max_imbalance": NoneOr(Interval(1, None, closed="neither")),
        "backend": Options(("auto", "cpu", "gpu", "numpy", "cupy")),
        "metric": Options(METRICS),
        "precision": Options(PRECISIONS),
        "tier": Options(TIERS),
        "memory_limit": NoneOr(ByteSize()),
        "device_memory_limit": NoneOr(ByteSize()),
        "checkpoint": NoneOr(PathLike()),
        "checkpoint_every": Interval(1, None, integer=True),
        "verbose": Verbose(),
    }

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        init: Any = "k-means||",
        n_init: int | str = "auto",
        max_iter: int = 300,
        tol: float = 1e-4,
        random_state: int | None = None,
        copy_x: bool = True,
        algorithm: str = "lloyd",
        oversampling_factor: float = 0.5,
        max_samples_per_cluster: int | None = None,
        max_imbalance: float | None = None,
        backend: str = "auto",
        metric: str = "euclidean",
        precision: str = "fp32",
        tier: str = "auto",
        memory_limit: int | str | None = None,
        device_memory_limit: int | str | None = None,
        checkpoint: str | None = None,
        checkpoint_every: int = 10,
        verbose: int | bool = 0,
        client: Any = None,
    ):
        self._store_params(locals())

    # ------------------------------------------------------------ sklearn plumbing

    @classmethod
    def _param_names(cls) -> list[str]:
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def _store_params(self, values: dict[str, Any]) -> None:
        """Store each parameter of ``__init__``'s signature as the attribute of its name,
        taken unchanged from ``values`` (that ``__init__``'s ``locals()``): scikit-learn's
        estimators only store their parameters, and read them back by the same names."""
        for name in self._param_names():
            setattr(self, name, values[name])

    def get_params(self, deep: bool = True) -> dict:
        return {p: getattr(self, p) for p in self._param_names()}

    def set_params(self, **params: Any) -> "KMeans":
        for k, v in params.items():
            if k not in self._param_names():
                raise ValueError(f"invalid parameter {k!r} for KMeans; valid: {self._param_names()}")
            setattr(self, k, v)
        return self

    def __sklearn_tags__(self):
        """scikit-learn's estimator tags (scikit-learn is needed only by whoever asks for them:
        its checks, ``Pipeline``, ``clone``)."""
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags

        return Tags(estimator_type="clusterer", target_tags=TargetTags(required=False),
                    transformer_tags=TransformerTags(preserves_dtype=["float64", "float32"]),
                    input_tags=InputTags(sparse=True))

    def __sklearn_clone__(self) -> "KMeans":
        """An unfitted copy with the same parameters (``sklearn.base.clone``): copies of them,
        but the same client, a handle to the cluster that cannot be copied."""
        params = self.get_params()
        shared = {"client": params.pop("client")} if "client" in params else {}
        # A callable init is kept, not copied (as sklearn.base.clone keeps it).
        copied = {k: v if callable(v) else copy.deepcopy(v) for k, v in params.items()}
        twin = type(self)(**copied, **shared)
        if hasattr(self, "_sklearn_output_config"):  # set_output's choice is kept, as clone keeps it
            twin._sklearn_output_config = dict(self._sklearn_output_config)
        return twin

    def __getstate__(self) -> dict:
        """Pickled (by joblib, or to travel to a Dask worker) without what lives only in this
        process: the client, and lazy ``labels_``, which its cluster's workers hold (labels in
        memory travel, as scikit-learn's)."""
        state = dict(self.__dict__)
        if "_labels" in state:
            labels = state.pop("_labels")[0]
            if _in_memory(labels):
                state["_labels"] = (labels, None)  # without the client it came from
        state["client"] = None
        return state

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.get_params().items() if not _same(v, inspect.signature(type(self).__init__).parameters[k].default)}
        return f"KMeans({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    # ------------------------------------------------------------ helpers

    def _client(self):
        """The client to work on (see ``client``); a local cluster is started where there is none."""
        return api_client(self.client, self.backend)

    def check_params(self) -> None:
        """Check every parameter against its constraint, without data or a cluster.

        Raises
        ------
        InvalidParameterError
            Naming the parameter, its value and the requirement (``n_clusters=0 should be
            >= 1``); ``fit`` runs the same checks first.
        """
        self._validate_params()

    def initial_centroids(self, n_features: int) -> np.ndarray | None:
        """The explicit initial centroids ``init`` gives, checked for ``n_features`` features.

        Parameters
        ----------
        n_features : int
            The data's number of features.

        Returns
        -------
        ndarray (n_clusters, n_features) float64, or None
            ``init`` as an array (unit rows for ``metric="cosine"``) when it is an array or a
            .npy path; None for a named init.

        Raises
        ------
        DataError
            The file is missing, or the array has another shape or a NaN or infinity.
        """
        return self._init_array(n_features)

    def _init_array(self, n_features: int, data: Any = None, random_state: Any = None) -> np.ndarray | None:
        """``init`` as centres (n_clusters, n_features) float64, or None for a named init.

        A callable init is called with ``data`` (:func:`~daskmeans.conventions.init_data`'s)
        and ``random_state``; without ``data`` (before a fit, :meth:`initial_centroids`) it
        gives None, like a named init.
        """
        init = self.init
        if isinstance(init, str) and init in INIT_NAMES:
            return None
        if callable(init):
            if data is None:
                return None
            arr = call_init(init, data, self.n_clusters, random_state)
        else:
            if isinstance(init, (str, os.PathLike)):
                if not os.path.exists(init):
                    raise DataError(f"init={init!r}: no such file")
                init = np.load(init, allow_pickle=False)
            if isinstance(init, (list, tuple)):  # array-like rows (scikit-learn takes them)
                init = np.asarray(init)
            arr = get_backend(init).to_numpy(init.compute() if hasattr(init, "compute") else init)
            arr = np.array(arr, dtype=np.float64)  # a copy: the user's centres are never written to
        check_init_shape(arr.shape, self.n_clusters, n_features)
        if not np.isfinite(arr).all():
            raise DataError("init array contains NaN or infinity")
        return get_metric(self.metric).check_init(arr)

    def _validate_params(self) -> None:
        """Check every parameter against its constraint (no data, no cluster needed)."""
        validate_params(self._constrained(), self._parameter_constraints)
        if self.checkpoint is not None and self.n_init not in (1, "auto"):
            raise DaskmeansError(f"n_init={self.n_init} should be 1 with checkpoint={os.fspath(self.checkpoint)!r}")
        self._per_cluster()

    def _constrained(self) -> dict[str, Any]:
        """The values of the constrained parameters, by name (a subclass with scikit-learn's
        signature keeps daskmeans' other parameters as class attributes)."""
        return {name: getattr(self, name) for name in self._parameter_constraints}

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

    @property
    def labels_(self) -> Any:
        """The training labels (n_samples,) int32: an array of the input's kind when ``X`` was
        in memory; for Dask or path ``X`` a lazy Dask array over the labels the workers keep
        from the fit (compute it while that cluster's client is open)."""
        if "_labels" not in self.__dict__:
            raise not_fitted("labels_ exists after fit() (a loaded model has none: use predict(X))")
        labels, client = self.__dict__["_labels"]
        if client is not None and not _in_memory(labels) and client.status in ("closing", "closed"):
            raise DaskmeansError(
                "labels_ is held by the workers of the fit's cluster, whose client is closed: compute it "
                "(client.compute(km.labels_) or km.labels_.compute()) before closing the client, or use "
                "km.predict(X)"
            )
        return labels

    @labels_.setter
    def labels_(self, value: Any) -> None:
        """Replace the training labels (scikit-learn's ``labels_`` is a plain attribute)."""
        self._labels = (value, None)

    @labels_.deleter
    def labels_(self) -> None:
        self.__dict__.pop("_labels", None)

    def _check_fitted(self) -> None:
        if not hasattr(self, "cluster_centers_"):
            raise not_fitted("this KMeans is not fitted yet: call fit() first, or daskmeans.load()")

    def _check_feature_names(self, X: Any, stacklevel: int = 4) -> None:
        """Compare the column names of ``X`` (a :class:`~daskmeans.io.readers.Table`, or data
        in memory) with ``feature_names_in_`` as scikit-learn does
        (:func:`~daskmeans.validation.check_feature_names`): an error when both have names
        that differ (in name, number or order), a warning when only one of them has names;
        scikit-learn's words for data in memory, one line naming the file for a file.
        ``stacklevel`` is the warning's, counted from the function that warns (this method
        is 2, its caller 3): the warning should name the frame that called the public method."""
        given, source = (X.columns, X.source) if isinstance(X, Table) else (feature_names(X), None)
        check_feature_names(getattr(self, "feature_names_in_", None), given, estimator=type(self).__name__,
                            source=source, stacklevel=stacklevel - 1)

    def check_features(self, X: Any) -> None:
        """Check the columns of ``X`` as ``predict``, ``transform`` and ``score`` do, without a
        cluster: their names against ``feature_names_in_`` (as scikit-learn does), then their
        number against ``n_features_in_``.

        Parameters
        ----------
        X : array (n_samples, n_features), a DataFrame, a path, or a Table from
            :func:`daskmeans.io.readers.read_table`

        Raises
        ------
        FeatureNamesError
            Both name their columns and the names differ (renamed, reordered, added, dropped).
        DataError
            Another number of columns than the model's.

        Warns
        -----
        FeatureNamesWarning
            Only one of them names its columns.
        """
        self._blocks(X)

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
        like = _like(X)  # what labels_ follows: in memory, or lazy
        callbacks = [c for c in (self._printer(runs), callback) if c is not None]
        phase = Phases()
        seed = seed_of(self.random_state)
        with phase("read"):
            ck = self._read_checkpoint() if resume else None
            table = read_table(X)  # the columns' names from a DataFrame, a CSV header, a Zarr attribute
            table.refuse_identifiers()  # a CSV column that numbers rows is no feature
            names, X = _names(table), table.array
            path = table.source or file_of(X.name)  # a path given or an array read() from one: messages name it
            n, d = (int(s) for s in X.shape)
            check_n_clusters(n, self.n_clusters)
            starts = self._starts(d, runs, init_data(like, X) if callable(self.init) else None, seed)
            w = None if sample_weight is None else read_weights(sample_weight, X)
            rows = self.training_rows(n)
            m = None if rows == n else rows
            if m is not None and seed is None:  # the sample and the runs draw from one seed
                seed = int(np.random.SeedSequence().generate_state(1)[0])
        params = FitParams(
            # Explicit centres: one array, or one per run of a callable init (the engine runs each).
            self.n_clusters, self.init if starts is None else starts[0] if len(starts) == 1 else starts,
            runs if starts is None else len(starts),
            self.max_iter, self.tol,
            seed, isinstance(self.random_state, int), self.oversampling_factor, self.backend,
            self.metric, self.precision, self.tier, self.memory_limit, self.device_memory_limit,
            None if self.checkpoint is None else os.fspath(self.checkpoint), self.checkpoint_every,
            max_imbalance=self.max_imbalance,
        )
        # verbose >= 1: the long steps before the iterations (placing, moments, the init) as
        # lines too, where no command shows them already.
        steps = watching(Steps(False, stream=sys.stdout, live=False)) if self.verbose and not watched() \
            else contextlib.nullcontext()
        with using_client(self.client, self.backend, exclusive=True) as client, steps:
            best = fit_distributed(
                client, X, params, sample_weight=w, path=path, train_rows=m, resume=ck, callback=_fanout(callbacks),
                phase=phase, on_checkpoint=lambda it: setattr(self, "checkpoint_iteration_", it),
            )
            self.sample_inertia_, self.n_samples_fit_ = best.sample_inertia, best.n_samples_fit
            self._fitted(best, client, d, names, X.dtype)
            if _in_memory(like):  # labels_ of the input's kind, as predict(X) gives them
                self._labels = (infer.materialise(client, best.labels, like), client)
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
        n_copies = self.n_clusters - len(np.unique(best.centroids, axis=0))
        if n_empty or n_copies:
            warnings.warn(
                f"at the end of the fit {n_empty} of n_clusters={self.n_clusters} clusters are empty and {n_copies} "
                f"centroids are copies of others: the data has fewer distinct points than clusters (or they are too "
                f"close together to split). Number of distinct clusters ({self.n_clusters - n_empty}) found smaller "
                f"than n_clusters ({self.n_clusters}). Possibly due to duplicate points in X.",
                clusters_warning(), stacklevel=4,
            )

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Fit, then return the training labels.

        Returns
        -------
        labels : (n_samples,) int32
            ``labels_``, computed to NumPy (CuPy) for in-memory (CuPy) ``X``, lazy for Dask
            or path ``X`` (see the class's Notes).
        """
        self._fit(X, sample_weight, None, False)
        return self.labels_

    # ------------------------------------------------------------ inference

    def _blocks(self, X: Any, stacklevel: int = 4) -> da.Array:
        """``X`` read as a Dask array (n_samples, n_features_in_), its names and width checked;
        ``stacklevel`` as :meth:`_check_feature_names`' less the frame of this method (4:
        the caller of the public method that called this one)."""
        self._check_fitted()
        table = read_table(X)
        self._check_feature_names(table, stacklevel + 1)
        check_n_features(self.n_features_in_, int(table.array.shape[1]))
        return table.array

    @contextlib.contextmanager
    def _inference(self, x: da.Array) -> Iterator[tuple[Any, da.Array]]:
        """The client inference runs on (the fit's backend's) and ``x``'s blocks ready there
        for :mod:`~daskmeans.engine.infer` (scaled for the metric, on its backend).

        ``x`` is :meth:`_blocks`' result, which the public method takes itself: its
        feature-name warnings name the frame two above it, the method's caller.
        """
        backend = getattr(self, "backend_", "auto")
        with using_client(self.client, backend) as client:
            yield client, infer.blocks(client, x, backend, self.metric)

    @_inference_doc("The index of each row's nearest centroid.", "labels : (n_samples,) int32")
    def predict(self, X: Any) -> Any:
        return self._labels_of(self._blocks(X), _like(X))

    def _labels_of(self, x: da.Array, like: Any) -> Any:
        """The labels of the rows ``x`` (checked already), of ``like``'s kind."""
        with self._inference(x) as (client, xb):
            return infer.materialise(client, infer.labels(xb, self.cluster_centers_, self.precision), like)

    @_inference_doc('Distances to every centroid: Euclidean, or ``1 - cos`` for ``metric="cosine"``.',
                    "distances : (n_samples, n_clusters), in X's float dtype")
    def transform(self, X: Any) -> Any:
        with self._inference(self._blocks(X)) as (client, xb):
            out = infer.materialise(client, infer.distances(xb, self.cluster_centers_, self.metric), _like(X))
        return wrap_output(self, out, X)  # the container set_output chose

    def fit_transform(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Fit, then :meth:`transform` ``X``."""
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        """Names of :meth:`transform`'s columns, one per cluster, as scikit-learn names them.

        Parameters
        ----------
        input_features : array-like of str, optional
            Checked against ``feature_names_in_`` (or their number against
            ``n_features_in_``) as scikit-learn checks them; not used otherwise.

        Returns
        -------
        ndarray (n_clusters,) of str (object)
            The class's name in lower case and the cluster's index: ``kmeans0``, ``kmeans1``,
            ... (``minibatchkmeans0``, ... for :class:`~daskmeans.MiniBatchKMeans`).
        """
        return feature_names_out(self, input_features)

    def set_output(self, *, transform: str | None = None) -> "KMeans":
        """The container of :meth:`transform` and :meth:`fit_transform`'s output
        (scikit-learn's ``set_output``, which ``Pipeline.set_output`` calls on each step).

        Parameters
        ----------
        transform : {"default", "pandas", "polars"}, optional
            ``"default"``: arrays of the input's kind (see the class's Notes); ``"pandas"``:
            a pandas DataFrame with :meth:`get_feature_names_out`'s columns and the index of
            ``X`` where it is a DataFrame (a Dask DataFrame for Dask or path ``X``);
            ``"polars"``: a polars DataFrame. None: unchanged (also scikit-learn's global
            ``transform_output`` applies while this estimator has none of its own).

        Returns
        -------
        self
        """
        if transform is None:
            return self
        Options(OUTPUTS).check("transform", transform)
        self._sklearn_output_config = {**getattr(self, "_sklearn_output_config", {}), "transform": transform}
        return self

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the inertia of ``X`` (n_samples, n_features) under the fitted centroids
        (a float, for any kind of ``X``), each row weighted by ``sample_weight`` (n_samples,)
        where given, as scikit-learn's."""
        x = self._blocks(X)
        w = None if sample_weight is None else read_weights(sample_weight, x)
        with self._inference(x) as (client, xb):
            return -infer.inertia(client, xb, self.cluster_centers_, self.precision, w) * inertia_scale(self.metric)

    def plot(self, X: Any = None, path: str | None = None, sample: int | None = None):
        """A report of the fit: convergence (inertia and shift per iteration), cluster sizes
        and, with ``X``, a PCA projection of a sample of ``X`` coloured by cluster with the
        centroids. Needs matplotlib.

        Parameters
        ----------
        X : array (n_samples, n_features) or a path, optional
        path : str, optional
            Also write the figure there (.png, .svg, .pdf).
        sample : int, optional
            Rows of ``X`` drawn (default ``daskmeans.report.SAMPLE_ROWS``).

        Returns
        -------
        matplotlib.figure.Figure
        """
        from . import report

        self._check_fitted()
        if sample is not None:
            Interval(1, None, integer=True).check("sample", sample)
        rows = labels = None
        if X is not None:
            x = self._blocks(X)  # its columns checked once, here: the sample has no names
            rows = report.sample_rows(x, sample or report.SAMPLE_ROWS)
            labels = self._labels_of(read(rows), rows)
        fig = report.figure(getattr(self, "history_", []), getattr(self, "cluster_sizes_", None),
                            self.cluster_centers_, rows, labels,
                            title=f"KMeans(n_clusters={self.n_clusters}), inertia {self.inertia_:.4e}")
        if path is not None:
            report.write(fig, os.fspath(path))
        return fig

    # ------------------------------------------------------------ persistence

    def save(self, path: str) -> None:
        """Write the fitted model as a Zarr group (centroids array + JSON attributes)."""
        self._check_fitted()
        params = {k: v for k, v in self.get_params().items() if k not in ("client", "init")}
        if params.get("checkpoint") is not None:
            params["checkpoint"] = os.fspath(params["checkpoint"])
        params["init"] = self.init if isinstance(self.init, str) and self.init in INIT_NAMES else "array"
        from . import __version__

        save_model(
            path,
            self.cluster_centers_,
            {
                "params": params,
                "inertia": self.inertia_,
                "sample_inertia": getattr(self, "sample_inertia_", None),
                "n_samples_fit": getattr(self, "n_samples_fit_", None),
                "n_iter": self.n_iter_,
                "n_features_in": self.n_features_in_,
                "feature_names_in": None if getattr(self, "feature_names_in_", None) is None
                else [str(n) for n in self.feature_names_in_],
                "dtype": str(self.cluster_centers_.dtype),
                "backend": getattr(self, "backend_", None),
                "tier": getattr(self, "tier_", None),
                "best_run": getattr(self, "best_run_", None),
                "history": getattr(self, "history_", []),
                "timings": getattr(self, "timings_", {}),
                "daskmeans_version": __version__,
            },
            sizes=getattr(self, "cluster_sizes_", None),
        )

    @classmethod
    def load(cls, path: str) -> "KMeans":
        """A fitted estimator from :meth:`save`'s output (``labels_`` is not stored).

        Parameters
        ----------
        path : str
            The model's directory.

        Returns
        -------
        KMeans
            Of this class (a MiniBatchKMeans model loads as a KMeans too).

        Raises
        ------
        DataError
            One line naming ``path`` when it holds no model, or a damaged one: a checksum that
            does not match its contents, contents that contradict themselves
            (:func:`daskmeans.io.model_store.load_model`), or parameters their constraints
            refuse.
        """
        centers, attrs, sizes = load_model(path)
        params = dict(attrs["params"])
        if params.get("init") == "array":
            params["init"] = centers
        km = cls(**{k: v for k, v in params.items() if k in cls._param_names()})
        try:  # a parameter predict or a later fit reads (precision, tier...) is checked now, not there
            validate_params(km.get_params(), km._parameter_constraints)
        except DaskmeansError as e:
            raise DataError(f"{path} is damaged: its parameters: {e}") from None
        km.cluster_centers_ = centers
        km.inertia_ = float(attrs["inertia"])
        km.n_iter_ = int(attrs["n_iter"])
        if attrs.get("n_samples_fit") is not None:
            km.sample_inertia_ = float(attrs["sample_inertia"])
            km.n_samples_fit_ = int(attrs["n_samples_fit"])
        km.n_features_in_ = int(attrs["n_features_in"])
        if attrs.get("feature_names_in"):
            km.feature_names_in_ = np.asarray(attrs["feature_names_in"], dtype=object)
        km.history_ = list(attrs.get("history", []))
        km.backend_ = attrs.get("backend") or "auto"
        if sizes is not None:
            km.cluster_sizes_ = sizes
        return km


# ---------------------------------------------------------------- block functions


def _fanout(callbacks: list[Callable[[dict], None]]) -> Callable[[dict], None] | None:
    """One callback calling each of ``callbacks``; None where there is none."""
    if not callbacks:
        return None

    def each(stats: dict) -> None:
        for c in callbacks:
            c(stats)

    return each


def _like(X: Any) -> Any:
    """What outputs follow (see the class's Notes): a Table's array (lazy, as its source), else ``X``."""
    return X.array if isinstance(X, Table) else X


def _in_memory(x: Any) -> bool:
    """Whether ``x`` (data given to a fit, or labels) is in memory rather than lazy (a Dask
    collection, a Table read from a source, a path)."""
    import dask

    return not (dask.is_dask_collection(x) or isinstance(x, (Table, str, bytes)) or hasattr(x, "__fspath__"))


def _names(table: Table) -> np.ndarray | None:
    """A table's column names as ``feature_names_in_`` holds them (an object array), or None."""
    return None if table.columns is None else np.asarray(table.columns, dtype=object)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b
