"""One record per concern of a fit: its defaults, constraints and help written once.

- :class:`KMeansParams`: the algorithm (what decides the centroids: K, the init, the stop
  rule, the seed, the metric, the GEMM precision, ...);
- :class:`MiniBatchParams`: ``MiniBatchKMeans``'s algorithm;
- :class:`RunParams`: how and where a fit runs (backend, memory tier and budgets, the
  collective, the checkpoint, what it prints), which never changes its result.

Everything else derives from them: the estimators' signature defaults
(``KMeans.__init__``'s are ``KMeansParams()``'s and ``RunParams()``'s) and their
``_parameter_constraints`` (:func:`constraints`), the engine's arguments (``engine/fit.py``,
``engine/lloyd.py`` take the records), the checkpoint's fingerprint (the fields marked
``fingerprint``: :func:`fingerprint_values`), and the command's options (:func:`options`).

A field's choices that a registry of a higher layer holds (the inits, the collectives) are
named by ``registry`` and given by the caller, which has that registry at hand: this module is
the base layer's, and imports neither NumPy nor Dask, so ``--help`` stays light.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .options import METRICS, PRECISIONS, TIERS
from .validation import (AnyOf, Boolean, ByteSize, InitLike, Interval, NInit, NoneOr, Options, PathLike,
                         RandomStateLike, Verbose)

# ``algorithm``: the step each name runs (``engine.loop.STEPS``). Elkan's triangle-inequality
# bounds skip distance computations but give Lloyd's result (scikit-learn's own tests check
# that they agree); the engine's exact Lloyd loop, whose per-iteration cost is one GEMM pass,
# computes that result, so "elkan" runs it. "yinyang" runs Yinyang's bounded step
# (engine/yinyang.py): Lloyd's bits, the distances skipped for rows whose bounds certify their
# label (faster where few rows move, at wide K; docs/performance.md, "Yinyang").
ALGORITHMS = {"lloyd": "lloyd", "elkan": "lloyd", "yinyang": "yinyang"}
# ``backend``: "auto", scikit-learn-style device names, or the backend modules' names.
BACKENDS = ("auto", "cpu", "gpu", "numpy", "cupy")


@dataclass(frozen=True)
class Spec:
    """What a parameter is, besides its default (in ``dataclasses.field``'s metadata).

    Attributes
    ----------
    constraint : object with ``check(name, value)``, or None
        Its constraint (:mod:`daskmeans.validation`); None where ``registry`` gives it.
    help : str
        One line for the command's option and the docs.
    choices : tuple of str, optional
        The values a command option takes, where they are a fixed set.
    registry : str, optional
        The registry (``"inits"``, ``"collectives"``) whose names the value may take, given
        by the caller of :func:`constraints` and :func:`options`.
    fingerprint : {"always", "if_set"}, optional
        Part of a checkpoint's fingerprint: always, or only where not None (so that the
        checkpoints of fits without it stay valid).
    """

    constraint: Any
    help: str
    choices: tuple[str, ...] | None = None
    registry: str | None = None
    fingerprint: str | None = None


def spec_of(record: type, name: str) -> Spec:
    """The :class:`Spec` of ``record``'s field ``name``."""
    return record.__dataclass_fields__[name].metadata["spec"]


def _param(default: Any, constraint: Any, help: str, **spec: Any) -> Any:
    """A record's field: ``default`` with its :class:`Spec`."""
    return field(default=default, metadata={"spec": Spec(constraint, help, **spec)})


def _like(record: type, name: str, default: Any, help: str | None = None) -> Any:
    """A field of another record's kind (its constraint and fingerprint) with its own
    ``default`` (and ``help``): the constraint is written once for both records."""
    spec = spec_of(record, name)
    return field(default=default, metadata={"spec": dataclasses.replace(spec, help=help or spec.help)})


@dataclass(frozen=True)
class KMeansParams:
    """The k-means algorithm's parameters (``KMeans``'s, less how and where it runs).

    Within the engine, ``init`` is resolved: an init's name, a ``(K, D)`` float64 array, or a
    list of them (one per run of a callable init); ``n_init`` the runs (an int); and
    ``random_state`` the seed the user chose (an int) or None.
    """

    n_clusters: int = _param(8, Interval(1, None, integer=True), "number of clusters", fingerprint="always")
    init: Any = _param("k-means||", None, "the init: a registered name, centres (an array or .npy path) or a "
                       "callable", registry="inits", fingerprint="always")
    n_init: Any = _param("auto", NInit(), "runs from different seeds, the lowest inertia kept ('auto': "
                         "scikit-learn's rule)")
    max_iter: int = _param(300, Interval(1, None, integer=True), "Lloyd iterations at most")
    tol: float = _param(1e-4, Interval(0, None), "stop when the summed squared centroid shift is at most tol "
                        "times the mean feature variance", fingerprint="always")
    random_state: Any = _param(None, NoneOr(RandomStateLike()), "seed of every random draw",
                               fingerprint="always")
    copy_x: bool = _param(True, Boolean(), "scikit-learn's (X is never written to)")
    algorithm: str = _param("lloyd", Options(tuple(ALGORITHMS)), "scikit-learn's names run the exact Lloyd "
                            "loop; yinyang gives its result, skipping rows whose bounds certify their label",
                            choices=tuple(ALGORITHMS))
    oversampling_factor: float = _param(0.83, Interval(0, None, closed="neither"),
                                        "k-means|| candidates per cluster and round")
    max_samples_per_cluster: int | None = _param(None, NoneOr(Interval(1, None, integer=True)),
                                                 "train on at most this many rows per cluster")
    max_imbalance: float | None = _param(None, NoneOr(Interval(1, None, closed="neither")),
                                         "balance the sizes: the largest cluster at most this many times the "
                                         "mean", fingerprint="if_set")
    metric: str = _param("euclidean", Options(METRICS), "euclidean, or cosine (spherical k-means)",
                         choices=tuple(METRICS), fingerprint="always")
    precision: str = _param("fp32", Options(PRECISIONS), "GEMM precision of the GPU kernels (labels exact in "
                            "every mode)", choices=tuple(PRECISIONS), fingerprint="always")


@dataclass(frozen=True)
class RunParams:
    """How and where a fit runs: nothing here changes its result."""

    backend: str = _param("auto", Options(BACKENDS), "auto: the GPU where the data or every worker has one",
                          choices=("auto", "cpu", "gpu"))
    tier: str = _param("auto", Options(TIERS), "where each worker keeps its rows", choices=tuple(TIERS))
    memory_limit: Any = _param(None, NoneOr(ByteSize()), "host memory per worker for resident data (e.g. 8GiB)")
    device_memory_limit: Any = _param(None, NoneOr(ByteSize()), "GPU memory per worker for resident data")
    collective: str | None = _param(None, None, "how the workers sum (default daskmeans.collective)",
                                     registry="collectives")
    checkpoint: Any = _param(None, NoneOr(PathLike()), "a Zarr path the restart point is written to")
    checkpoint_every: int = _param(10, Interval(1, None, integer=True), "iterations between checkpoints")
    verbose: Any = _param(0, Verbose(), "a line per iteration (2: also the imbalance and throughput)")


@dataclass(frozen=True)
class MiniBatchParams:
    """``MiniBatchKMeans``'s algorithm: scikit-learn's parameters and defaults; those it
    shares with :class:`KMeansParams` keep their constraints."""

    n_clusters: int = _like(KMeansParams, "n_clusters", 8)
    init: Any = _like(KMeansParams, "init", "k-means++")
    max_iter: int = _like(KMeansParams, "max_iter", 100, "passes over the data at most")
    batch_size: int = _param(1024, Interval(1, None, integer=True), "rows per step")
    compute_labels: bool = _param(True, Boolean(), "label every row and compute the inertia after the steps")
    random_state: Any = _like(KMeansParams, "random_state", None)
    tol: float = _like(KMeansParams, "tol", 0.0, "stop when a step's summed squared shift is at most tol times "
                       "the mean feature variance (0: off)")
    max_no_improvement: int | None = _param(10, NoneOr(Interval(0, None, integer=True)),
                                            "stop after this many steps without a new low of the batch inertia")
    init_size: int | None = _param(None, NoneOr(Interval(1, None, integer=True)),
                                   "rows the inits are drawn from (default 3 * batch_size)")
    n_init: Any = _like(KMeansParams, "n_init", 3)
    reassignment_ratio: float = _param(0.01, Interval(0, None), "clusters below this fraction of the largest "
                                       "weight move to random rows")
    precision: str = _like(KMeansParams, "precision", "fp32")


RECORDS = (KMeansParams, MiniBatchParams, RunParams)


def defaults(*records: type) -> dict[str, Any]:
    """Each field's default, by name, over ``records`` in order."""
    return {f.name: f.default for record in records for f in dataclasses.fields(record)}


def _choices(spec: Spec, name: str, registries: Mapping[str, Iterable[str]]) -> tuple[str, ...] | Iterable[str]:
    if spec.registry is None:
        return spec.choices
    if spec.registry not in registries:
        raise KeyError(f"{name}'s choices are the {spec.registry!r} registry's: pass registries={{{spec.registry!r}: "
                       f"names}}")
    return registries[spec.registry]


def constraints(*records: type, registries: Mapping[str, Iterable[str]] | None = None,
                omit: Iterable[str] = ()) -> dict[str, Any]:
    """The constraints of ``records``' fields by name (an estimator's ``_parameter_constraints``).

    Parameters
    ----------
    *records : dataclass types
    registries : mapping of str to names, optional
        The names of each registry a field refers to (``{"inits": ..., "collectives": ...}``;
        a live view stays live).
    omit : iterable of str
        Fields the estimator does not take (``KMeans`` has no ``collective``).
    """
    registries = registries or {}
    out = {}
    for record in records:
        for f in dataclasses.fields(record):
            if f.name in omit:
                continue
            spec = f.metadata["spec"]
            out[f.name] = spec.constraint
            if spec.registry == "inits":  # a registered name or centres (array, .npy path, callable)
                out[f.name] = AnyOf(Options(_choices(spec, f.name, registries)), InitLike())
            elif spec.registry is not None:  # None: the configured one
                out[f.name] = NoneOr(Options(_choices(spec, f.name, registries)))
    return out


@dataclass(frozen=True)
class Option:
    """A command-line option derived from a field (:func:`options`).

    Attributes
    ----------
    name : str
        The field (and the estimator's parameter).
    flag : str
        ``--`` and the name with dashes (``--max-iter``).
    default : Any
    help : str
    choices : tuple of str or None
    constraint : object with ``check(name, value)``
        What a parsed value must satisfy (its message names the flag when given ``flag``).
    """

    name: str
    flag: str
    default: Any
    help: str
    choices: tuple[str, ...] | None
    constraint: Any


def options(*records: type, registries: Mapping[str, Iterable[str]] | None = None,
            omit: Iterable[str] = ()) -> list[Option]:
    """The command's options of ``records``' fields, in order: what ``daskmeans fit`` derives
    its ``--max-iter``, ``--tol``, ``--tier``, ... from (name, default, help, choices and the
    constraint a parsed value is checked against).

    Parameters
    ----------
    *records : dataclass types
    registries : mapping of str to names, optional
        As :func:`constraints` (the command reads its registries without NumPy or Dask).
    omit : iterable of str
        Fields the command has no option for (``copy_x``, ``algorithm``, ...).
    """
    checks = constraints(*records, registries=registries, omit=omit)
    out = []
    for record in records:
        for f in dataclasses.fields(record):
            if f.name in omit:
                continue
            spec = f.metadata["spec"]
            choices = _choices(spec, f.name, registries or {})
            out.append(Option(f.name, "--" + f.name.replace("_", "-"), f.default, spec.help,
                              None if choices is None else tuple(choices), checks[f.name]))
    return out


def doc_choices(doc: str | None, **lists: Iterable[str]) -> str | None:
    """``doc`` (a docstring) with each ``{key}`` of ``lists`` replaced by numpydoc's set of
    its names (``{"auto", "cpu", "gpu"}``): the estimators fill their docstrings' lists of
    backends and inits from the registries at import, as the command's help does.

    Parameters
    ----------
    doc : str or None
        The docstring (None under ``python -OO``, given back as it is).
    **lists : iterable of str
        The names each placeholder stands for, by the placeholder's key (``backends=...``).
    """
    if doc is None:
        return None
    for key, names in lists.items():
        doc = doc.replace("{" + key + "}", "{" + ", ".join(f'"{n}"' for n in names) + "}")
    return doc


def fingerprint_values(params: Any) -> dict[str, Any]:
    """The fields of ``params`` (a record) that a checkpoint's fingerprint names, as it
    records them: an explicit init as ``"array"``, a seed only where it is an int (a
    generator's draw is not the user's to repeat), ``if_set`` fields only where set."""
    out = {}
    for f in dataclasses.fields(params):
        mode = f.metadata["spec"].fingerprint
        value = getattr(params, f.name)
        if mode is None or (mode == "if_set" and value is None):
            continue
        if f.name == "init" and not isinstance(value, str):
            value = "array"
        elif f.name == "random_state" and (isinstance(value, bool) or not isinstance(value, int)):
            value = None
        out[f.name] = value
    return out


def split(values: Mapping[str, Any], *records: type) -> list[Any]:
    """One record of each type of ``records`` from ``values`` (an estimator's parameters, by
    name; names of no record's are ignored, a record's names absent keep its defaults)."""
    out = []
    for record in records:
        names = {f.name for f in dataclasses.fields(record)}
        out.append(record(**{k: v for k, v in values.items() if k in names}))
    return out


def record(kind: type, estimator: Any) -> Any:
    """The record ``kind`` of ``estimator``'s parameters, read as attributes by name (a
    subclass with scikit-learn's signature keeps daskmeans' others as class attributes); a
    field the estimator lacks keeps the record's default."""
    return kind(**{f.name: getattr(estimator, f.name) for f in dataclasses.fields(kind) if hasattr(estimator, f.name)})
