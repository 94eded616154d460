"""daskmeans: distributed, out-of-core k-means clustering on Dask, fast on GPUs.

The public names are imported on first use (PEP 562), so that ``daskmeans --help`` and
``import daskmeans`` do not pay for Dask and distributed until a fit needs them. The namespace
is the public API: ``dir(daskmeans)`` lists ``__all__`` (submodules stay importable by name).
"""

import typing as _typing

from .errors import DaskmeansError, DaskmeansWarning, DataError, InvalidParameterError, NotFittedError

from .version import __version__

if _typing.TYPE_CHECKING:  # pragma: no cover
    from .engine.reuse import release
    from .estimator import KMeans
    from .datasets import make_blobs
    from .io.model_store import write_data as write
    from .io.readers import read, read_table
    from .minibatch import MiniBatchKMeans
    from . import sweep

# Public name -> (module, attribute; None: the module itself), imported on first use.
# ``sweep`` is the module daskmeans.sweep, callable as its function sweep(X, ks): importing
# the submodule binds this name to it anyway, and a module also gives daskmeans.sweep.figure.
_LAZY = {"KMeans": ("estimator", "KMeans"), "read": ("io.readers", "read"), "read_table": ("io.readers", "read_table"),
         "MiniBatchKMeans": ("minibatch", "MiniBatchKMeans"), "sweep": ("sweep", None),
         "release": ("engine.reuse", "release"), "write": ("io.model_store", "write_data"),
         "make_blobs": ("datasets", "make_blobs")}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        from . import config  # noqa: F401  (registers the dask.config defaults first)

        mod, attr = _LAZY[name]
        module = importlib.import_module(f".{mod}", __name__)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'daskmeans' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


def load(path: str) -> "KMeans":
    """Load a model written by :meth:`KMeans.save` (a Zarr group).

    Parameters
    ----------
    path : str
        The model's directory.

    Returns
    -------
    KMeans
        Fitted (``labels_`` is not stored: use ``predict``).
    """
    from .estimator import KMeans

    return KMeans.load(path)


__all__ = ["KMeans", "MiniBatchKMeans", "sweep", "read", "read_table", "write", "make_blobs", "load", "release", "DaskmeansError", "DaskmeansWarning", "DataError", "InvalidParameterError",
           "NotFittedError"]
