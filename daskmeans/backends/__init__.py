"""The one place that switches between array libraries.

A backend is a module of pure kernels on one in-memory block (no Dask, no I/O) that satisfies
:class:`.protocol.Backend` (the full contract, with shapes); in short:

``name``
    ``"numpy"`` or ``"cupy"``.
``xp``
    The array namespace (the ``numpy`` or ``cupy`` module), imported lazily.
``asarray(block)`` / ``to_numpy(a)``
    Move a block onto the backend's device / back to host NumPy.
``prepare(centroids, dtype)``
    Centroid-side precomputation shared by every block of one iteration.
``assign(X, prepared, sample_weight=None, want_sums=True, grid=None)``
    Nearest-centroid labels, min squared distances' sum (inertia), and per-cluster sums and
    weights as int64 multiples of a :class:`~daskmeans.numerics.grid.Grid`'s steps (each value
    rounded once, then added exactly: the same integers for any chunking) and int64 counts
    for one block.
``min_sqdist(X, prepared, grid=None)``
    Labels and squared distance to the nearest centroid, per row.

Everything above the backends calls :func:`get_backend` with a name or an array and never
branches on the array type itself.
"""

from __future__ import annotations

import importlib
import os
import re
from types import ModuleType
from typing import Any

from ..options import PRECISIONS  # noqa: F401  (re-exported)
from .protocol import Backend  # noqa: F401  (re-exported)


def _cupy_memory_limit_in_bytes() -> None:
    """Let ``CUPY_GPU_MEMORY_LIMIT`` be a size such as ``3GiB``, as daskmeans' own budgets are:
    CuPy reads it when it makes its memory pool and understands only bytes or a percentage
    (``3GiB`` made CuPy raise a ValueError inside the first allocation)."""
    value = os.environ.get("CUPY_GPU_MEMORY_LIMIT", "").strip()
    if re.fullmatch(r"[0-9.]+\s*[a-zA-Z]+", value):
        from dask.utils import parse_bytes

        try:
            os.environ["CUPY_GPU_MEMORY_LIMIT"] = str(int(parse_bytes(value)))
        except ValueError:
            pass  # not a size: CuPy's own message names it


_cupy_memory_limit_in_bytes()  # before any CuPy memory pool exists (workers import this too)


_MODULES = {"numpy": "daskmeans.backends.numpy_backend", "cupy": "daskmeans.backends.cupy_backend"}
# User-facing aliases (CLI --backend) for the backend names.
ALIASES = {"cpu": "numpy", "gpu": "cupy", "numpy": "numpy", "cupy": "cupy"}


def backend_name(obj: Any = "numpy") -> str:
    """``"numpy"`` or ``"cupy"``: the backend :func:`get_backend` gives for ``obj``, without
    importing it (the NumPy backend's compiled kernels cost a GPU fit ~0.3 s of imports).

    Arrays are dispatched on their type's module (Dask arrays on their meta, one block's type),
    so a CuPy block gets the CuPy kernels without this module importing CuPy unless such a
    block exists.
    """
    if isinstance(obj, str):
        try:
            return ALIASES[obj]
        except KeyError:
            raise ValueError(f"backend={obj!r} should be one of 'numpy', 'cupy', 'cpu', 'gpu'") from None
    meta = getattr(obj, "_meta", obj)
    return "cupy" if type(meta).__module__.split(".")[0] == "cupy" else "numpy"


def requested_backend(requested: str = "auto", data_backend: str | None = None) -> str | None:
    """The backend name a request (``"auto"``, ``"cpu"``, ``"gpu"``, ``"numpy"``, ``"cupy"``)
    settles before the workers are asked: its alias's name, ``"cupy"`` for ``"auto"`` when the
    data's blocks are CuPy already (``data_backend``), else None (the workers decide)."""
    if requested == "auto":
        return "cupy" if data_backend is not None and ALIASES.get(data_backend) == "cupy" else None
    if requested not in ALIASES:
        raise ValueError(f"backend={requested!r} should be one of 'auto', 'cpu', 'gpu'")
    return ALIASES[requested]


def on_gpu(name: str) -> bool:
    """Whether the backend ``name`` (or alias) computes on GPUs: its module says so
    (``on_host``), imported only for this question."""
    return not get_backend(name).on_host


def get_backend(obj: Any = "numpy") -> ModuleType:
    """Backend module for a name (``"numpy"``, ``"cupy"``, ``"cpu"``, ``"gpu"``) or an array
    (see :func:`backend_name`)."""
    return importlib.import_module(_MODULES[backend_name(obj)])


def gpu_count() -> int:
    """CUDA devices CuPy sees here (0 without CuPy, a driver or a device)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver, or no device: all mean "no GPU here"
        return 0


def gpu_available() -> bool:
    """True where CuPy imports and sees at least one CUDA device."""
    return gpu_count() > 0
