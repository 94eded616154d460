"""The ``daskmeans`` namespace of dask.config: numbers users may tune, with defaults in one YAML.

Every tunable (chunk and tile bytes, reduction fan-in, init sampling) is read through
:func:`get`; the defaults live in ``daskmeans.yaml`` beside this module.

A worker in another process does not see the client's ``dask.config.set``: every engine task
carries the client's :func:`snapshot` of the namespace (:class:`daskmeans.engine.task.blas_capped`)
and runs under :func:`applied`, so that :func:`get` on the worker answers what the client set.
The kernels' settings (tile bytes, GEMM modes) do not take this path in a fit: the plan
resolves them on the client into ``backends.protocol.Tunables`` and passes them to the backend
(``engine.plan.kernel_tunables``); a kernel called without them reads :func:`snapshot`.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Iterator, Mapping

import dask
import dask.config
import yaml

from .validation import Options

_FN = os.path.join(os.path.dirname(__file__), "daskmeans.yaml")
with open(_FN) as _f:
    _DEFAULTS = yaml.safe_load(_f)

dask.config.update_defaults(_DEFAULTS)


# The settings shipped with the task this thread runs (None: outside an engine task).
_SHIPPED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("daskmeans_settings", default=None)


def get(key: str, default: Any = None) -> Any:
    """Value of ``daskmeans.<key>`` (e.g. ``get("split-every")``): the shipped settings' inside
    an engine task (:func:`applied`), else dask.config's, else the YAML default (a
    ``dask.config.set({"daskmeans.x": ...})`` entered before this module was imported removes
    the whole namespace when it exits)."""
    shipped = _SHIPPED.get()
    if shipped is not None and key in shipped:
        return shipped[key]
    if default is None:
        default = _DEFAULTS["daskmeans"]
        for part in key.split("."):
            default = default.get(part) if isinstance(default, dict) else None
    return dask.config.get(f"daskmeans.{key}", default=default)


def _flat(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def snapshot() -> dict[str, Any]:
    """Every ``daskmeans`` setting as :func:`get` answers it here, by dotted key (``tile-bytes``,
    ``init.rounds``): taken on the client, it travels with each engine task."""
    shipped = _SHIPPED.get()
    if shipped is not None:  # inside an engine task: the settings it was given
        return dict(shipped)
    values = _flat(_DEFAULTS["daskmeans"])
    values.update(_flat(dask.config.get("daskmeans", default=None) or {}))
    return values


@contextlib.contextmanager
def applied(settings: Mapping[str, Any] | None) -> Iterator[None]:
    """Within the block, and in this thread only, :func:`get` answers from ``settings`` (a
    :func:`snapshot`, usually the client's); None changes nothing."""
    if settings is None:
        yield
        return
    token = _SHIPPED.set(dict(settings))
    try:
        yield
    finally:
        _SHIPPED.reset(token)


def get_bytes(key: str) -> int:
    """A byte-size setting (``"128MiB"`` or an integer) as an integer number of bytes."""
    return int(dask.utils.parse_bytes(get(key)))


def get_seconds(key: str) -> float:
    """A duration setting (``"300s"``, ``"1.5s"`` or a number of seconds) in seconds."""
    return float(dask.utils.parse_timedelta(get(key), default="seconds"))


def choice(key: str, options: tuple[str, ...]) -> str:
    """A setting that takes one of ``options`` (e.g. ``choice("gpu-fp32-gemm", ("auto",
    "sgemm", "3xtf32"))``); any other value is a ValueError naming it and the options."""
    value = str(get(key))
    Options(options).check(f"daskmeans.{key}", value)
    return value


def local_in_process(n_workers: int) -> bool:
    """Whether a local cluster of ``n_workers`` runs its workers in this process
    (``local-cluster``: auto up to ``local-threads-max-workers``, threads or processes)."""
    how = choice("local-cluster", ("auto", "threads", "processes"))
    if how == "auto":
        return n_workers <= int(get("local-threads-max-workers"))
    return how == "threads"


def gpu_in_process(n_gpus: int) -> bool:
    """Whether a local GPU cluster of ``n_gpus`` GPUs runs its workers in this process (a worker
    per GPU, each running its tasks on its own: :mod:`daskmeans.engine.devices`) rather than a
    worker process per GPU (dask-cuda's LocalCUDACluster): as :func:`local_in_process` decides
    for that many workers. In-process workers start no process, create no second CUDA context
    per GPU and share the data without copies (docs/performance.md, "In-process GPU
    workers")."""
    return local_in_process(n_gpus)


def numba_cache_dir(numba_setting: str | None) -> str:
    """Where Numba caches this package's compiled CPU code (the kernels' and the CSV
    parser's): Numba's own setting (``NUMBA_CACHE_DIR``, ``numba_setting``) where given, else
    ``daskmeans/numba`` in the user's cache (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return numba_setting or os.path.join(base, "daskmeans", "numba")


def scheduler_address(scheduler: str | None = None, scheduler_file: str | None = None) -> tuple[str | None, str]:
    """The scheduler to connect to, and where it came from: ``scheduler`` (an address, or a
    scheduler JSON file for compatibility), ``scheduler_file``, or Dask's ``scheduler-address``
    setting (``DASK_SCHEDULER_ADDRESS``); ``(None, "")`` for a local cluster. Here, where Dask's
    settings are, not beside the cluster's code: the command asks it first, before distributed
    loads (its kernels' compiles start once it knows the cluster is its own)."""
    import json

    from .errors import DaskmeansError

    if scheduler and scheduler_file:
        raise DaskmeansError("give --scheduler or --scheduler-file, not both")
    if scheduler and scheduler.endswith(".json"):
        scheduler, scheduler_file = None, scheduler
    if scheduler_file:
        try:
            with open(scheduler_file) as f:
                info = json.load(f)
            return str(info["address"]), f"scheduler file {scheduler_file}"
        except FileNotFoundError:
            raise DaskmeansError(f"scheduler file {scheduler_file} does not exist (is the scheduler running?)") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DaskmeansError(f"scheduler file {scheduler_file} is not a Dask scheduler file: {e}") from None
    if scheduler:
        return scheduler, "--scheduler"
    env = dask.config.get("scheduler-address", None)
    if env:
        return str(env), "DASK_SCHEDULER_ADDRESS"
    return None, ""
