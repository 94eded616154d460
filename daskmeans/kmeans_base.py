"""``BaseKMeans``: what :class:`~daskmeans.KMeans` and :class:`~daskmeans.MiniBatchKMeans` share
(scikit-learn's ``_BaseKMeans``).

Parameters stored and read back by name (``get_params``/``set_params``, ``clone``, the repr, a
pickle without the client), their checks against ``_parameter_constraints``, explicit inits,
the training labels, feature-name and width checks, inference by blocks (``predict``,
``transform``, ``score``; outputs of the input's kind), ``set_output``, the report, and the
model store (``save``/``load``). Each estimator adds its parameters, its fit and its fitted
attributes; nothing here plans, places or submits tasks.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
from typing import Any, Callable, Iterator

import dask.array as da
import numpy as np

from .backends import get_backend
from .dask_cluster import api_client, using_client
from .engine import infer
from .errors import DaskmeansError, DataError, not_fitted
from .io.model_store import load_model, save_model
from .io.memory_reader import column_names as feature_names
from .io.readers import Table, read, read_table, read_weights
from .conventions import OUTPUTS, call_init, check_init_shape, feature_names_out, wrap_output
from .metric import get_metric, inertia_scale
from .seeding import REGISTRY as INITS
from .validation import Interval, Options, check_feature_names, check_n_features, validate_params

INIT_NAMES = INITS.keys()  # the registered inits' names (a live view)


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


class BaseKMeans:
    """The estimator protocol and inference of the k-means estimators (scikit-learn's
    ``_BaseKMeans``): a subclass gives ``__init__`` (its parameters, stored by
    :meth:`_store_params`), ``_parameter_constraints``, ``fit`` and ``_fit``, and sets
    ``cluster_centers_``, ``n_features_in_``, ``backend_`` and the training labels.

    ``metric`` is the class's default for estimators without the parameter (Euclidean).
    """

    metric = "euclidean"
    _parameter_constraints: dict[str, Any] = {}

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
                raise ValueError(f"invalid parameter {k!r} for {type(self).__name__}; valid: {self._param_names()}")
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
            if in_memory(labels):
                state["_labels"] = (labels, None)  # without the client it came from
        state["client"] = None
        return state

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.get_params().items() if not _same(v, inspect.signature(type(self).__init__).parameters[k].default)}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

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

    def _constrained(self) -> dict[str, Any]:
        """The values of the constrained parameters, by name (a subclass with scikit-learn's
        signature keeps daskmeans' other parameters as class attributes)."""
        return {name: getattr(self, name) for name in self._parameter_constraints}

    @property
    def labels_(self) -> Any:
        """The training labels (n_samples,) int32: an array of the input's kind when ``X`` was
        in memory; for Dask or path ``X`` a lazy Dask array over the labels the workers keep
        from the fit (compute it while that cluster's client is open)."""
        if "_labels" not in self.__dict__:
            raise not_fitted("labels_ exists after fit() (a loaded model has none: use predict(X))")
        labels, client = self.__dict__["_labels"]
        if client is not None and not in_memory(labels) and client.status in ("closing", "closed"):
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
            raise not_fitted(f"this {type(self).__name__} is not fitted yet: call fit() first, or daskmeans.load()")

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

    def _fit(self, X: Any, sample_weight: Any, callback: Callable[[dict], None] | None, resume: bool,
             then: Callable[[Any], Any] | None = None) -> Any:
        """The fit (each estimator's); ``then(client)`` runs after it on the fit's client, its result returned."""
        raise NotImplementedError

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
        return self._labels_of(self._blocks(X), output_like(X))

    def _labels_of(self, x: da.Array, like: Any) -> Any:
        """The labels of the rows ``x`` (checked already), of ``like``'s kind."""
        with self._inference(x) as (client, xb):
            return infer.materialise(client, infer.labels(xb, self.cluster_centers_, self.precision), like)

    @_inference_doc('Distances to every centroid: Euclidean, or ``1 - cos`` for ``metric="cosine"``.',
                    "distances : (n_samples, n_clusters), in X's float dtype")
    def transform(self, X: Any) -> Any:
        with self._inference(self._blocks(X)) as (client, xb):
            out = infer.materialise(client, infer.distances(xb, self.cluster_centers_, self.metric), output_like(X))
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
        from .version import __version__

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


# ---------------------------------------------------------------- helpers


def output_like(X: Any) -> Any:
    """What outputs follow (see the class's Notes): a Table's array (lazy, as its source), else ``X``."""
    return X.array if isinstance(X, Table) else X


def in_memory(x: Any) -> bool:
    """Whether ``x`` (data given to a fit, or labels) is in memory rather than lazy (a Dask
    collection, a Table read from a source, a path)."""
    import dask

    return not (dask.is_dask_collection(x) or isinstance(x, (Table, str, bytes)) or hasattr(x, "__fspath__"))


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b
