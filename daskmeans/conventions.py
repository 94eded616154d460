"""scikit-learn's conventions for the estimators, without scikit-learn at run time.

What :class:`~daskmeans.KMeans` and :class:`~daskmeans.MiniBatchKMeans` share with
scikit-learn's ``KMeans`` beyond the estimator protocol: ``n_init="auto"`` and the one run an
explicit init gets, callable and array-like inits, the shape errors of an init (scikit-learn's
words), ``get_feature_names_out`` (``kmeans0``, ``kmeans1``, ...), ``set_output`` containers,
and warnings that are also scikit-learn's classes where scikit-learn is in use (so that
``pytest.warns(ConvergenceWarning)`` and ``warnings.filterwarnings(category=...)`` written
for scikit-learn see them). scikit-learn is never imported here: whoever catches its classes
or configures its output has imported it already.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any

import numpy as np

from .errors import DaskmeansWarning, DataError
# The parameter constraints scikit-learn's conventions ask for live with the others (the base layer's,
# without NumPy); named here too, where the estimators have always found them.
from .validation import Boolean, InitLike, NInit, Verbose, is_array_like  # noqa: F401

# Inits that draw one good start by themselves: n_init="auto" runs them once (scikit-learn's
# rule for k-means++; k-means|| and its wide-K form hierarchical are k-means++'s distributed kin,
# AFK-MC² its approximation by Markov chains).
_ONE_RUN_INITS = ("k-means++", "k-means||", "hierarchical", "afk-mc2")
OUTPUTS = ("default", "pandas", "polars")


# ---------------------------------------------------------------- n_init


def resolve_n_init(estimator: Any, default: int) -> int:
    """The runs a fit makes: ``n_init``, or for ``"auto"`` scikit-learn's rule (1 for
    k-means++ and daskmeans' k-means||, ``default`` for ``random`` and a callable, 1 for
    explicit centres). Explicit centres run once whatever ``n_init`` says, with scikit-learn's
    RuntimeWarning when it asked for more.

    Parameters
    ----------
    estimator : KMeans or MiniBatchKMeans
        Its ``init`` and ``n_init`` (checked already).
    default : int
        The runs of ``"auto"`` for a random or callable init (KMeans 10, MiniBatchKMeans 3).
    """
    init, n_init = estimator.init, estimator.n_init
    named = isinstance(init, str) and not init.endswith(".npy")
    if isinstance(n_init, str):  # "auto"
        if named:
            return 1 if init in _ONE_RUN_INITS else default
        return default if callable(init) else 1
    if not named and not callable(init) and n_init != 1:
        warnings.warn(f"Explicit initial center position passed: performing only one init in "
                      f"{type(estimator).__name__} instead of n_init={n_init}.", RuntimeWarning, stacklevel=4)
        return 1
    return int(n_init)


# ---------------------------------------------------------------- inits


def init_data(X: Any, x: Any) -> Any:
    """The data a callable init is called with, as scikit-learn gives it: in-memory ``X`` (what
    the user passed; a Table's array for a Table) as a
    C-ordered array (or a CSR matrix) of ``x``'s float dtype; Dask and file data as ``x``, the
    lazy Dask array read from it (the callable may only touch part of it)."""
    import dask

    dtype = x.dtype
    if dask.is_dask_collection(X) or isinstance(X, (str, bytes)) or hasattr(X, "__fspath__"):
        return x  # lazy data (a Table's array is a Dask array)
    if type(X).__module__.startswith("scipy.sparse"):
        return X.tocsr().astype(dtype, copy=False)
    if hasattr(X, "__cuda_array_interface__"):
        return X.astype(dtype, copy=False)
    return np.ascontiguousarray(np.asarray(X), dtype=dtype)


def random_state_for_init(random_state: Any, seed: int | None) -> np.random.RandomState:
    """The ``random_state`` a callable init is given: the user's RandomState itself, else one
    seeded with the fit's seed (scikit-learn gives ``check_random_state(random_state)``)."""
    if isinstance(random_state, np.random.RandomState):
        return random_state
    return np.random.RandomState(seed)


def check_init_shape(shape: tuple, n_clusters: int, n_features: int) -> None:
    """An init of another shape than ``(n_clusters, n_features)`` is a DataError (a
    ValueError) in scikit-learn's words, then daskmeans' requirement."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2:
        raise DataError(f"init array has shape {shape}, should be 2-D (n_clusters, n_features) = "
                        f"({n_clusters}, {n_features})")
    if shape[0] != n_clusters:
        what = f"does not match the number of clusters {n_clusters}"
    elif shape[1] != n_features:
        what = f"does not match the number of features of the data {n_features}"
    else:
        return
    raise DataError(f"The shape of the initial centers {shape} {what}: init array has shape {shape}, should be "
                    f"(n_clusters, n_features) = ({n_clusters}, {n_features})")


def call_init(init: Any, data: Any, n_clusters: int, random_state: np.random.RandomState) -> np.ndarray:
    """``init(data, n_clusters, random_state=random_state)`` as a float64 host array (a Dask,
    CuPy or sparse result computed or copied back)."""
    centers = init(data, n_clusters, random_state=random_state)
    if hasattr(centers, "compute"):
        centers = centers.compute()
    if hasattr(centers, "toarray"):
        centers = centers.toarray()
    if hasattr(centers, "get") and hasattr(centers, "__cuda_array_interface__"):
        centers = centers.get()
    return np.array(centers, dtype=np.float64)


# ---------------------------------------------------------------- outputs


def feature_names_out(estimator: Any, input_features: Any = None) -> np.ndarray:
    """scikit-learn's ``ClassNamePrefixFeaturesOutMixin``: one name per cluster, the class's
    name in lower case and the cluster's index (``kmeans0``, ``kmeans1``, ...).

    ``input_features``, where given, must be the fitted columns (``feature_names_in_``, or
    ``n_features_in_`` names), as scikit-learn checks them.
    """
    estimator._check_fitted()
    if input_features is not None:
        given = [str(f) for f in np.asarray(input_features, dtype=object).ravel()]
        fitted = getattr(estimator, "feature_names_in_", None)
        if fitted is not None and given != [str(f) for f in fitted]:
            raise ValueError(f"input_features is not equal to feature_names_in_: got {given}, should be "
                             f"{[str(f) for f in fitted]}")
        if fitted is None and len(given) != estimator.n_features_in_:
            raise ValueError(f"input_features should have length equal to number of features "
                             f"({estimator.n_features_in_}), got {len(given)}")
    prefix = type(estimator).__name__.lower()
    return np.asarray([f"{prefix}{i}" for i in range(int(estimator.cluster_centers_.shape[0]))], dtype=object)


def output_kind(estimator: Any, method: str = "transform") -> str:
    """The container ``method``'s output is given in: the estimator's ``set_output``, else
    scikit-learn's global ``transform_output`` where scikit-learn is in use, else "default"."""
    own = getattr(estimator, "_sklearn_output_config", {}).get(method)
    if own is not None:
        return own
    sk = sys.modules.get("sklearn")
    if sk is not None and hasattr(sk, "get_config"):
        return sk.get_config().get(f"{method}_output", "default")
    return "default"


def wrap_output(estimator: Any, data: Any, X: Any, method: str = "transform") -> Any:
    """``data`` (n_samples, n_clusters) in the container ``set_output`` chose: a pandas
    DataFrame (``X``'s index where ``X`` has one, the ``get_feature_names_out`` columns), a
    polars DataFrame, a Dask DataFrame where ``data`` is lazy; ``data`` itself by default."""
    kind = output_kind(estimator, method)
    if kind == "default":
        return data
    import dask

    columns = [str(c) for c in estimator.get_feature_names_out()]
    if dask.is_dask_collection(data):
        import dask.dataframe as dd

        return dd.from_dask_array(data, columns=columns)
    if hasattr(data, "__cuda_array_interface__"):
        data = data.get()
    if kind == "pandas":
        import pandas as pd

        index = X.index if isinstance(X, pd.DataFrame) else None
        return pd.DataFrame(data, index=index, columns=columns, copy=False)
    import polars as pl

    return pl.DataFrame(data, schema=columns, orient="row")


# ---------------------------------------------------------------- warnings


class DaskmeansRuntimeWarning(DaskmeansWarning, RuntimeWarning):
    """A parameter was overridden for this fit (explicit centres with ``n_init`` > 1,
    ``init_size`` below ``n_clusters``, elkan with one cluster): scikit-learn's RuntimeWarning,
    and a daskmeans warning the command prints in one line."""


class ClustersWarning(DaskmeansWarning):
    """The fit ended with fewer distinct clusters than ``n_clusters`` (duplicate points); where
    scikit-learn is in use also its ``ConvergenceWarning``, as scikit-learn warns."""


def clusters_warning() -> type:
    """:class:`ClustersWarning`, made a subclass of scikit-learn's ConvergenceWarning too
    where ``sklearn.exceptions`` is loaded."""
    sk = sys.modules.get("sklearn.exceptions")
    return ClustersWarning if sk is None else _with_base(sk.ConvergenceWarning)


@functools.cache
def _with_base(base: type) -> type:
    return type("ClustersWarning", (ClustersWarning, base), {"__module__": __name__, "__doc__": ClustersWarning.__doc__})
