"""The ``daskmeans`` namespace of dask.config: numbers users may tune, with defaults in one YAML.

Every tunable (chunk and tile bytes, reduction fan-in, init sampling) is read through
:func:`get`; the defaults live in ``daskmeans.yaml`` beside this module.
"""

from __future__ import annotations

import os
from typing import Any

import dask
import dask.config
import yaml

from .validation import Options

_FN = os.path.join(os.path.dirname(__file__), "daskmeans.yaml")
with open(_FN) as _f:
    _DEFAULTS = yaml.safe_load(_f)

dask.config.update_defaults(_DEFAULTS)


def get(key: str, default: Any = None) -> Any:
    """Value of ``daskmeans.<key>`` from dask.config (e.g. ``get("split-every")``); the YAML
    default where dask.config has none (a ``dask.config.set({"daskmeans.x": ...})`` entered
    before this module was imported removes the whole namespace when it exits)."""
    if default is None:
        default = _DEFAULTS["daskmeans"]
        for part in key.split("."):
            default = default.get(part) if isinstance(default, dict) else None
    return dask.config.get(f"daskmeans.{key}", default=default)


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
    """Whether a local GPU cluster runs its worker in this process: one GPU (``local-cluster``
    auto or threads); several GPUs take a worker process each (LocalCUDACluster), as a worker
    thread of this process does not own a device of its own."""
    return n_gpus == 1 and local_in_process(1)
