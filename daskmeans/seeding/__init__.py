"""Initial centroids: one module per init, registered by name in :data:`REGISTRY`.

An init is a function ``init(client, placement, k, seed, **options) -> (k, d) float64``
that draws k centroids from the placed data (``options``: ``oversampling_factor``, and
``grid``, the fit's grid or None; an init ignores the options it does not use). Its draws depend on the seed and on global row indices
only, so a seed gives the same centroids on any chunking and worker count.

The default, ``k-means||``, can run as ``hierarchical`` from K =
``daskmeans.init.hierarchical-min-k`` on (:func:`chosen_init`, in :func:`resolve_init`; the
name the user gave stays the estimator's ``init``). It is off by default (0): measured at wide
K, the hierarchical init was slower than k-means|| and its fit converged at a higher inertia
(docs/performance.md, "The default init at wide K").

Adding an init is one module here and one :class:`Init` entry in :data:`REGISTRY`; the
estimator's ``init=`` values, the command's ``--init`` help and the README's list come from
the registry. This module loads nothing heavy (the command's ``--help`` reads the registry):
an init's module is imported when it is first run, and the package's public functions on
first use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..params import KMeansParams

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    from distributed import Client

    from ..engine.placement import Placement
    from ..numerics.grid import Grid


@dataclass(frozen=True)
class Init:
    """A registered init: its ``name`` (the ``init=`` value), its module (a dotted name) and
    the function in it, and a one-line ``summary`` for the help."""

    name: str
    module: str
    function: str
    summary: str

    def load(self) -> Callable[..., "np.ndarray"]:
        """The init's function (its module imported now)."""
        return getattr(importlib.import_module(self.module), self.function)


REGISTRY: dict[str, Init] = {e.name: e for e in (
    Init("k-means||", f"{__name__}.kmeans_parallel", "init_kmeans_parallel",
         "k-means|| (Bahmani et al.): a few sampling rounds over all rows, the candidates reduced to K"),
    Init("k-means++", f"{__name__}.kmeans_plusplus", "init_kmeans_plusplus",
         "greedy k-means++ on a uniform sample of daskmeans.init.sample-size rows"),
    Init("random", f"{__name__}.random_rows", "init_random", "K distinct rows drawn uniformly"),
    Init("hierarchical", f"{__name__}.hierarchical", "init_hierarchical",
         "k-means++ inside sqrt(K) mesoclusters of a sample, K split by their sizes"),
    Init("afk-mc2", f"{__name__}.afkmc2", "init_afkmc2",
         "AFK-MC2 (Bachem et al. 2016): Markov chains of daskmeans.init.afkmc2-chain rows drawn after one pass"),
)}

DEFAULT = "k-means||"


def names() -> tuple[str, ...]:
    """The registered inits' names, the default first."""
    return tuple(REGISTRY)


def get_init(name: str) -> Callable[..., "np.ndarray"]:
    """The function of the registered init ``name``."""
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise ValueError(f"init={name!r} should be one of {', '.join(map(repr, REGISTRY))}") from None
    return entry.load()


def chosen_init(init: str, k: int) -> str:
    """The init that runs for ``init=`` and ``k`` clusters: ``hierarchical`` for the default
    ``k-means||`` from ``k = daskmeans.init.hierarchical-min-k`` on (0: never), else ``init``
    itself."""
    from .. import config

    threshold = int(config.get("init.hierarchical-min-k"))
    if init == DEFAULT and 0 < threshold <= k:
        return "hierarchical"
    return init


def resolve_init(client: "Client", placement: "Placement", init: str, k: int, seed: int,
                 oversampling_factor: float = KMeansParams.oversampling_factor, grid: "Grid | None" = None) -> "np.ndarray":
    """Initial centroids ``(k, d)`` float64 from the registered init named ``init``
    (:func:`chosen_init`: k-means|| at wide K runs the hierarchical init); ``grid``, the fit's,
    bounds the data (its distance passes then need no reduction of their own per block)."""
    return get_init(chosen_init(init, k))(client, placement, k, seed, oversampling_factor=oversampling_factor,
                                          grid=grid)


# Public functions of the modules, imported on first use (PEP 562).
_LAZY = {
    "kmeans_plusplus": "kernels", "seed_batched": "kernels", "weighted_lloyd": "kernels",
    "take_rows": "rows",
    "init_kmeans_parallel": "kmeans_parallel", "init_kmeans_plusplus": "kmeans_plusplus", "init_random": "random_rows",
    "init_hierarchical": "hierarchical", "split_k": "hierarchical", "init_afkmc2": "afkmc2",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Init", "REGISTRY", "DEFAULT", "names", "get_init", "chosen_init", "resolve_init", *_LAZY]
