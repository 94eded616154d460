"""Zero-code-change mode: scikit-learn's ``KMeans``, ``MiniBatchKMeans`` and ``k_means`` run
on daskmeans, in an unmodified script or notebook.

::

    python -m daskmeans.accel [-v] [--strict] script.py [args...]   # or: -m module [args...]
    %load_ext daskmeans.accel                                         # IPython / Jupyter
    import daskmeans.accel; daskmeans.accel.install()                 # before sklearn.cluster is used

How the routing works:

- :func:`install` replaces ``KMeans``, ``MiniBatchKMeans`` and ``k_means`` on the modules
  ``sklearn.cluster`` and ``sklearn.cluster._kmeans`` by this module's. A script run by
  ``python -m daskmeans.accel`` imports them after that, so ``from sklearn.cluster import
  KMeans`` gives daskmeans' class (a name imported before :func:`install` keeps
  scikit-learn's). scikit-learn's own ``k_means`` and anything else that builds a
  ``KMeans`` through ``sklearn.cluster._kmeans`` builds this one too.
- This module's classes have scikit-learn's signature and defaults (``init="k-means++"``,
  ``n_init="auto"``, ...), so ``get_params``, ``clone``, ``GridSearchCV`` and reprs are
  scikit-learn's; daskmeans' other parameters keep their defaults (class attributes). Their
  fits run on daskmeans' engine, on the user's Dask client where there is one (the default
  client), else on the local cluster daskmeans starts once per process.
- ``isinstance(est, KMeans)`` holds with either class: this module's classes are registered
  as virtual subclasses of scikit-learn's (its ``_BaseKMeans`` is an ABC).
- Pickles name this module's classes (``daskmeans.accel.KMeans``): they load wherever
  daskmeans is installed, with or without the routing.
- What daskmeans refuses (a parameter value or an input it cannot take: an
  :class:`~daskmeans.InvalidParameterError` or :class:`~daskmeans.DataError` from its fit, on
  data in memory) runs on scikit-learn instead, with the same parameters: the estimator then
  predicts, transforms and scores through scikit-learn's fitted model. scikit-learn's private
  methods (``_init_centroids``, ...) are scikit-learn's too. ``--strict`` (``fallback=False``)
  turns this off: daskmeans' error is raised. Data in Dask collections or files never falls
  back (scikit-learn would load all of it into memory).
- ``-v`` (``verbose=True``) says once on stderr what is routed, and then once per estimator
  class and engine which one ran a fit and why scikit-learn did.
"""

from __future__ import annotations

import argparse
import inspect
import os
import runpy
import sys
from typing import Any


from .errors import DataError, InputChanged, InvalidParameterError
from .estimator import KMeans as _DaskKMeans
from .minibatch import MiniBatchKMeans as _DaskMiniBatchKMeans

ROUTED = ("KMeans", "MiniBatchKMeans", "k_means")
_MODULES = ("sklearn.cluster", "sklearn.cluster._kmeans")

_state: dict[str, Any] = {"installed": False, "verbose": False, "fallback": True, "originals": {}, "said": set()}


def _say(key: Any, line: str) -> None:
    """``line`` on stderr once per ``key`` (a class, an engine, a reason), at ``-v`` only."""
    if _state["verbose"] and key not in _state["said"]:
        _state["said"].add(key)
        print(f"daskmeans.accel: {line}", file=sys.stderr, flush=True)


def _original(name: str) -> Any:
    """scikit-learn's own ``name`` (``KMeans``...), from before :func:`install` replaced it."""
    if name not in _state["originals"]:
        import sklearn.cluster._kmeans as km

        value = getattr(km, name)
        if getattr(value, "__module__", None) == __name__:  # another copy of this module routed it
            raise RuntimeError(f"sklearn.cluster._kmeans.{name} is routed already, by {value!r}: scikit-learn's own "
                               f"is unknown here")
        _state["originals"][name] = value
    return _state["originals"][name]


def _lazy_input(X: Any) -> bool:
    """Data scikit-learn cannot take without loading it all: Dask collections and paths."""
    import dask

    return dask.is_dask_collection(X) or isinstance(X, (str, bytes)) or hasattr(X, "__fspath__")


class _Routed:
    """What both routed classes add to daskmeans' estimators: scikit-learn's signature (in
    the subclasses), daskmeans' other parameters at their defaults, the fallback to
    scikit-learn, and the ``-v`` lines."""

    _sklearn_name = ""  # the scikit-learn class this one stands for

    @classmethod
    def _sklearn_class(cls) -> type:
        return _original(cls._sklearn_name)

    def _fallen_back(self) -> Any:
        """scikit-learn's fitted model where the last fit fell back to it, else None."""
        return self.__dict__.get("_sk")

    def _fall_back(self, method: str, error: Exception, X: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on scikit-learn's class with this estimator's parameters instead of
        daskmeans (which raised ``error``), and take its fitted attributes."""
        if not _state["fallback"] or _lazy_input(X):
            raise error
        sk = self._fallen_back() if method == "partial_fit" else None
        sk = sk if sk is not None else self._sklearn_class()(**self.get_params())
        try:
            getattr(sk, method)(X, *args, **kwargs)
        except Exception as theirs:  # scikit-learn refuses it too: its error, as without the routing
            raise theirs from None
        _say((type(self).__name__, "sklearn", str(error)),
             f"{type(self).__name__}.{method} runs on scikit-learn: daskmeans cannot take it ({error})")
        self.__dict__["_sk"] = sk
        for name, value in vars(sk).items():
            if name.endswith("_") and not name.startswith("__") or name in ("_n_init", "_init_size", "_n_features_out"):
                setattr(self, name, value)
        return self

    def _ran(self, method: str) -> None:
        self.__dict__.pop("_sk", None)
        key = (type(self).__name__, "daskmeans")
        if _state["verbose"] and key not in _state["said"]:  # the client's address costs a round trip: -v only
            _say(key, f"{type(self).__name__}.{method} runs on daskmeans ({getattr(self, 'backend_', '?')} workers, "
                      f"client {_client_address(self)})")

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        try:
            super().fit(X, y, sample_weight=sample_weight)
        except (InvalidParameterError, DataError) as e:
            if isinstance(e, InputChanged):
                raise
            return self._fall_back("fit", e, X, y, sample_weight=sample_weight)
        self._ran("fit")
        return self

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return self.fit(X, sample_weight=sample_weight).labels_

    def predict(self, X: Any) -> Any:
        sk = self._fallen_back()
        return super().predict(X) if sk is None else sk.predict(X)

    def transform(self, X: Any) -> Any:
        sk = self._fallen_back()
        if sk is None:
            return super().transform(X)
        if hasattr(self, "_sklearn_output_config"):
            sk.set_output(**self._sklearn_output_config)
        return sk.transform(X)

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        sk = self._fallen_back()
        return super().score(X, y, sample_weight=sample_weight) if sk is None else sk.score(X, y, sample_weight)

    def __getattr__(self, name: str) -> Any:
        """scikit-learn's private methods (``_init_centroids``, ``_check_test_data``...) that
        daskmeans does not have: scikit-learn's, on a copy of this estimator's parameters.
        Any other missing name raises as it would without this method (a fitted attribute
        before the fit: the NotFittedError of its property)."""
        cls = type(self)
        member = None
        if name.startswith("_") and not name.startswith("__") and not name.endswith("_") and _state["fallback"]:
            member = getattr(cls._sklearn_class(), name, None)
        if member is None or not callable(member):
            return object.__getattribute__(self, name)  # raises the original AttributeError
        sk = self._fallen_back()
        if sk is None:
            sk = cls._sklearn_class()(**self.get_params())
            for attr in ("cluster_centers_", "n_features_in_", "feature_names_in_", "_n_threads"):
                if attr in self.__dict__:
                    setattr(sk, attr, self.__dict__[attr])
            if not hasattr(sk, "_n_threads"):
                sk._n_threads = 1
        _say((cls.__name__, "private", name), f"{cls.__name__}.{name} is scikit-learn's (daskmeans has none)")
        return getattr(sk, name)


def _client_address(est: Any) -> str:
    try:
        client = est._client()
        return f"{client.scheduler.address}, {len(client.nthreads())} workers"
    except Exception:  # only words for -v: never fail a fit for them
        return "?"


def _daskmeans_defaults(cls: type, keep: tuple[str, ...]) -> dict[str, Any]:
    """daskmeans' parameters of ``cls`` that scikit-learn's signature lacks, at their defaults."""
    params = inspect.signature(cls.__init__).parameters
    return {k: p.default for k, p in params.items() if k != "self" and k not in keep}


_SK_KMEANS = ("n_clusters", "init", "n_init", "max_iter", "tol", "verbose", "random_state", "copy_x", "algorithm")


class KMeans(_Routed, _DaskKMeans):
    """scikit-learn's ``KMeans`` (its signature and defaults) running on daskmeans.

    See :class:`daskmeans.KMeans` for the parameters and attributes, and this module's
    docstring for the routing. ``verbose`` prints scikit-learn's lines ("Initialization
    complete", "Iteration i, inertia x.", "Converged at iteration i: ...").
    """

    _sklearn_name = "KMeans"

    def __init__(self, n_clusters: int = 8, *, init: Any = "k-means++", n_init: int | str = "auto",
                 max_iter: int = 300, tol: float = 1e-4, verbose: int = 0, random_state: Any = None,
                 copy_x: bool = True, algorithm: str = "lloyd"):
        self._store_params(locals())

    def _printer(self, runs: int) -> Any:
        return _SklearnLines(self.verbose) if self.verbose else None

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> "KMeans":
        super().fit(X, y, sample_weight=sample_weight)
        if self.verbose and self._fallen_back() is None:
            _SklearnLines.converged(self)
        return self


class _SklearnLines:
    """``verbose`` output in scikit-learn's words, from daskmeans' per-iteration statistics."""

    def __init__(self, verbose: int):
        self.run = None

    def __call__(self, s: dict) -> None:
        if s.get("run", 1) != self.run:
            self.run = s.get("run", 1)
            print("Initialization complete", flush=True)
        # scikit-learn numbers iterations from 0
        print(f"Iteration {s['iteration'] - 1}, inertia {s['inertia']}.", flush=True)

    @staticmethod
    def converged(est: Any) -> None:
        """The best run's stop, as scikit-learn words it."""
        last = est.history_[-1] if est.history_ else None
        if last is None or not est.converged_:
            return
        i = last["iteration"] - 1
        if last["reassigned"] == 0:
            print(f"Converged at iteration {i}: strict convergence.", flush=True)
        else:
            print(f"Converged at iteration {i}: center shift {last['shift']} within tolerance {est.tol_abs_}.",
                  flush=True)


_SK_MINIBATCH = ("n_clusters", "init", "max_iter", "batch_size", "verbose", "compute_labels", "random_state", "tol",
                 "max_no_improvement", "init_size", "n_init", "reassignment_ratio")


class MiniBatchKMeans(_Routed, _DaskMiniBatchKMeans):
    """scikit-learn's ``MiniBatchKMeans`` (its signature and defaults) running on daskmeans.

    See :class:`daskmeans.MiniBatchKMeans` for the parameters and attributes, and this
    module's docstring for the routing.
    """

    _sklearn_name = "MiniBatchKMeans"

    def __init__(self, n_clusters: int = 8, *, init: Any = "k-means++", max_iter: int = 100, batch_size: int = 1024,
                 verbose: int = 0, compute_labels: bool = True, random_state: Any = None, tol: float = 0.0,
                 max_no_improvement: int | None = 10, init_size: int | None = None, n_init: int | str = "auto",
                 reassignment_ratio: float = 0.01):
        self._store_params(locals())

    def partial_fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> "MiniBatchKMeans":
        if self._fallen_back() is not None:
            return self._fall_back("partial_fit", DataError("the first fit ran on scikit-learn"), X, y,
                                   sample_weight=sample_weight)
        try:
            super().partial_fit(X, y, sample_weight=sample_weight)
        except (InvalidParameterError, DataError) as e:
            if isinstance(e, InputChanged) or hasattr(self, "cluster_centers_"):
                raise
            return self._fall_back("partial_fit", e, X, y, sample_weight=sample_weight)
        self._ran("partial_fit")
        return self


def k_means(X: Any, n_clusters: int, *, sample_weight: Any = None, init: Any = "k-means++", n_init: int | str = "auto",
            max_iter: int = 300, verbose: bool = False, tol: float = 1e-4, random_state: Any = None,
            copy_x: bool = True, algorithm: str = "lloyd", return_n_iter: bool = False) -> tuple:
    """scikit-learn's ``k_means`` function on daskmeans: :class:`KMeans` fitted to ``X``.

    Returns
    -------
    tuple
        ``(cluster_centers, labels, inertia)``, and ``n_iter`` with ``return_n_iter``.
    """
    est = KMeans(n_clusters=n_clusters, init=init, n_init=n_init, max_iter=max_iter, verbose=verbose, tol=tol,
                 random_state=random_state, copy_x=copy_x, algorithm=algorithm).fit(X, sample_weight=sample_weight)
    out = (est.cluster_centers_, est.labels_, est.inertia_)
    return out + (est.n_iter_,) if return_n_iter else out


_ROUTES = {"KMeans": KMeans, "MiniBatchKMeans": MiniBatchKMeans, "k_means": k_means}
# daskmeans' own parameters, which scikit-learn's signatures lack: their defaults, read where
# the fit reads them (as attributes), never listed by get_params.
for _cls, _base, _theirs in ((KMeans, _DaskKMeans, _SK_KMEANS), (MiniBatchKMeans, _DaskMiniBatchKMeans, _SK_MINIBATCH)):
    for _name, _value in _daskmeans_defaults(_base, _theirs).items():
        setattr(_cls, _name, _value)


# ---------------------------------------------------------------- switching it on


def install(verbose: bool = False, fallback: bool = True) -> None:
    """Route ``sklearn.cluster``'s ``KMeans``, ``MiniBatchKMeans`` and ``k_means`` to
    daskmeans (see the module's docstring). Safe to call again (it updates the options).

    Parameters
    ----------
    verbose : bool, default False
        Say on stderr what is routed, and once per class and engine which ran.
    fallback : bool, default True
        Run on scikit-learn what daskmeans refuses (False: raise daskmeans' error).
    """
    import sklearn
    import sklearn.cluster
    import sklearn.cluster._kmeans as km

    _state["verbose"], _state["fallback"] = bool(verbose), bool(fallback)
    for name in ROUTED:
        _original(name)  # kept before it is replaced
    for module in (sklearn.cluster, km):
        for name, value in _ROUTES.items():
            setattr(module, name, value)
    if not _state["installed"]:
        for name in ("KMeans", "MiniBatchKMeans"):
            _original(name).register(_ROUTES[name])  # isinstance(ours, scikit-learn's class)
        _state["installed"] = True
    _say("install", f"sklearn.cluster.{', '.join(ROUTED[:-1])} and {ROUTED[-1]} run on daskmeans "
                    f"(scikit-learn {sklearn.__version__} for what daskmeans cannot take"
                    f"{'' if fallback else ': off, --strict'})")


def uninstall() -> None:
    """Give ``sklearn.cluster`` its own ``KMeans``, ``MiniBatchKMeans`` and ``k_means`` back
    (the virtual-subclass registration stays: ABCs cannot forget one)."""
    import sklearn.cluster
    import sklearn.cluster._kmeans as km

    for module in (sklearn.cluster, km):
        for name in ROUTED:
            if name in _state["originals"]:
                setattr(module, name, _state["originals"][name])


def forget_said() -> None:
    """Say the ``-v`` lines again, as for a new process (tests install and uninstall)."""
    _state["said"].clear()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext daskmeans.accel``: :func:`install` for the notebook's session."""
    install()


def main(argv: list[str] | None = None) -> int:
    """``python -m daskmeans.accel [-v] [--strict] script.py [args...]`` (or ``-m module``):
    run the script as ``__main__`` with the routing installed."""
    parser = argparse.ArgumentParser(prog="python -m daskmeans.accel",
                                     description="Run a scikit-learn script with sklearn.cluster's KMeans, "
                                                 "MiniBatchKMeans and k_means on daskmeans.")
    parser.add_argument("-v", "--verbose", action="store_true", help="say what runs on daskmeans and what on "
                                                                      "scikit-learn (on stderr)")
    parser.add_argument("--strict", action="store_true", help="raise daskmeans' error instead of running on "
                                                              "scikit-learn what daskmeans cannot take")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module (as python -m) instead of a script")
    parser.add_argument("script", nargs="?", help="the script, then its arguments")
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.module is None and ns.script is None:
        parser.error("a script (or -m MODULE) is needed")
    install(verbose=ns.verbose, fallback=not ns.strict)
    if ns.module is not None:
        sys.argv = [ns.module] + ([ns.script] if ns.script else []) + ns.args
        runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
    else:
        if not os.path.exists(ns.script):
            parser.error(f"{ns.script}: no such file")
        sys.argv = [ns.script] + ns.args
        sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))  # as python script.py puts it first
        runpy.run_path(ns.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    # Run as ``python -m daskmeans.accel``: the classes the routing installs are those of the
    # module ``daskmeans.accel`` (what pickles name), not this ``__main__`` copy's.
    from daskmeans.accel import main as _main

    sys.exit(_main())
