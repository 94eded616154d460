"""The one place that switches between array libraries: the backends' registry.

A backend is a module of pure kernels on one in-memory block (no Dask, no I/O) that satisfies
:class:`.protocol.Backend` (the full contract, with shapes), and one entry of
:data:`REGISTRY` (or a call of :func:`register`): its name, its aliases for ``--backend``, and
the array package whose blocks it takes. In short:

``name``
    Its registry name (``"numpy"``, ``"cupy"``).
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

``available()`` / ``device_count()`` / ``device_budget()`` / ``collectives``
    Whether it runs here, on how many devices, the device memory a worker may use, and the
    collectives that can sum its buffers.

Everything above the backends calls :func:`get_backend` with a name or an array and never
branches on the array type itself, nor imports an array library to ask about devices.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..options import PRECISIONS  # noqa: F401  (re-exported)
from .protocol import Backend, Tunables  # noqa: F401  (re-exported)


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


@dataclass(frozen=True)
class Entry:
    """A backend of the registry.

    Attributes
    ----------
    module : str
        The module that satisfies :class:`.protocol.Backend` (imported on first use).
    aliases : tuple of str
        Other names it is asked for by (``--backend``), the first one shown in choices.
    arrays : str or None
        The top-level package of the array types it computes on (``"cupy"``): arrays of it
        get this backend (:func:`backend_name`); None: asked for by name only.
    """

    module: str
    aliases: tuple[str, ...] = ()
    arrays: str | None = None


# The backends by name, in the order ``auto`` prefers the device backends among them (and the
# first host backend where no device backend is usable): adding a backend is its module and
# one entry here (or :func:`register`).
REGISTRY: dict[str, Entry] = {
    "numpy": Entry("daskmeans.backends.numpy_backend", ("cpu",), "numpy"),
    "cupy": Entry("daskmeans.backends.cupy_backend", ("gpu",), "cupy"),
}
_HOST_DEFAULT = "numpy"  # the backend of arrays no entry claims (lists, pandas, Dask's NumPy meta)


def register(name: str, module: str, aliases: tuple[str, ...] = (), arrays: str | None = None) -> None:
    """Add the backend ``name`` (see :class:`Entry`), checked against the protocol now.

    Raises
    ------
    ValueError
        ``name`` or an alias is taken already.
    TypeError
        The module misses members of :class:`.protocol.Backend` (named).
    """
    taken = set(aliases_map())
    clash = [a for a in (name, *aliases) if a in taken or a == "auto"]
    if clash:
        raise ValueError(f"backend name {clash[0]!r} is taken: registered names and aliases are {sorted(taken)}")
    mod = importlib.import_module(module)
    from .protocol import capabilities, members

    missing = [m for m in [*members(), *capabilities()] if not hasattr(mod, m)]
    if missing:
        raise TypeError(f"backend module {module} should define every member of backends.protocol.Backend; "
                        f"it lacks {', '.join(missing)}")
    REGISTRY[name] = Entry(module, tuple(aliases), arrays)


def unregister(name: str) -> None:
    """Remove the backend ``name`` (:func:`register`'s); the built-in ones stay."""
    if name == _HOST_DEFAULT:
        raise ValueError(f"backend {name!r} is the default of host arrays and cannot be removed")
    if name not in REGISTRY:
        raise ValueError(f"backend {name!r} is not registered: registered are {sorted(REGISTRY)}")
    del REGISTRY[name]


def aliases_map() -> dict[str, str]:
    """Every name a backend is asked for by (its own, then its aliases) to its registry name."""
    out = {name: name for name in REGISTRY}
    for name, entry in REGISTRY.items():
        out.update({a: name for a in entry.aliases})
    return out


def choices() -> tuple[str, ...]:
    """The names a user picks a backend by (``--backend``): ``auto``, then each backend's
    first alias (or its name)."""
    return ("auto", *((e.aliases or (n,))[0] for n, e in REGISTRY.items()))


def names() -> tuple[str, ...]:
    """Every value ``backend=`` takes: :func:`choices` first, then the other names and aliases."""
    first = choices()
    return first + tuple(n for n in aliases_map() if n not in first)


def backend_name(obj: Any = "numpy") -> str:
    """The registry name of the backend :func:`get_backend` gives for ``obj`` (a name or alias,
    or an array), without importing it (the NumPy backend's compiled kernels would cost a GPU
    fit their imports: docs/performance.md, "Startup").

    Arrays are dispatched on their type's top-level package (Dask arrays on their meta, one
    block's type) to the entry that claims it (:attr:`Entry.arrays`), so a CuPy block gets the
    CuPy kernels without this module importing CuPy unless such a block exists.
    """
    if isinstance(obj, str):
        names = aliases_map()
        try:
            return names[obj]
        except KeyError:
            raise ValueError(f"backend={obj!r} should be one of {', '.join(map(repr, names))}") from None
    meta = getattr(obj, "_meta", obj)
    package = type(meta).__module__.split(".")[0]
    return next((n for n, e in REGISTRY.items() if e.arrays == package), _HOST_DEFAULT)


def requested_backend(requested: str = "auto", data_backend: str | None = None) -> str | None:
    """The backend name a request (``"auto"`` or a name or alias of the registry) settles
    before the workers are asked: its registry name; for ``"auto"`` the data's backend when
    its blocks are a device backend's already (``data_backend``), else None (the workers
    decide)."""
    if requested == "auto":
        if data_backend is None or data_backend not in aliases_map():
            return None
        name = backend_name(data_backend)
        return None if get_backend(name).on_host else name
    if requested not in aliases_map():
        raise ValueError(f"backend={requested!r} should be one of {', '.join(map(repr, choices()))}")
    return backend_name(requested)


def on_gpu(name: str) -> bool:
    """Whether the backend ``name`` (or alias) computes on a device: its module says so
    (``on_host``), imported only for this question."""
    return not get_backend(name).on_host


def get_backend(obj: Any = "numpy", tunables: Tunables | None = None) -> Any:
    """Backend module for a name or alias (``"numpy"``, ``"cupy"``, ``"cpu"``, ``"gpu"``, or a
    registered one) or an array (see :func:`backend_name`); with ``tunables``, the module with
    them bound (:class:`Tuned`: its ``prepare``, ``working_bytes`` and ``warm`` take them)."""
    module = importlib.import_module(REGISTRY[backend_name(obj)].module)
    return module if tunables is None else Tuned(module, tunables)


class Tuned:
    """A backend module with the kernels' settings bound: every member is the module's, but
    :meth:`prepare`, :meth:`working_bytes` and :meth:`warm` run with :attr:`tunables` (what
    ``prepare`` returns carries them to ``assign``, ``min_sqdist`` and ``sqdistances``).
    Satisfies :class:`.protocol.Backend` as its module does; compares equal to another view
    of the same module and tunables."""

    __slots__ = ("module", "tunables")

    def __init__(self, module: ModuleType, tunables: Tunables):
        self.module = module
        self.tunables = tunables

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.module, attr)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Tuned) and (self.module, self.tunables) == (other.module, other.tunables)

    def __hash__(self) -> int:
        return hash((self.module.__name__, self.tunables))

    def __repr__(self) -> str:
        return f"Tuned({self.module.__name__}, {self.tunables})"

    def __reduce__(self) -> tuple:  # by the module's name: a module does not pickle
        return (_tuned, (self.module.__name__, self.tunables))

    def prepare(self, centroids: Any, dtype: Any, precision: str = "fp32", tunables: Tunables | None = None) -> Any:
        return self.module.prepare(centroids, dtype, precision, tunables or self.tunables)

    def working_bytes(self, k: int, d: int, rows: int, sm_count: int = 0, tunables: Tunables | None = None) -> int:
        return self.module.working_bytes(k, d, rows, sm_count, tunables or self.tunables)

    def warm(self, k: int, d: int, dtype: Any, precision: str = "fp32", rows: int = 1 << 20,
             tunables: Tunables | None = None, algorithm: str = "lloyd") -> Any:
        return self.module.warm(k, d, dtype, precision, rows, tunables or self.tunables, algorithm)


def _tuned(module: str, tunables: Tunables) -> Tuned:
    return Tuned(importlib.import_module(module), tunables)


def device_backend_here() -> str | None:
    """The first device backend of the registry usable in this process (its ``available``),
    or None: what ``auto`` runs on this worker (asked by ``dask_cluster`` on each worker)."""
    for name in REGISTRY:
        be = get_backend(name)
        if not be.on_host and be.available():
            return name
    return None


def backend_here(requested: str | None = None) -> ModuleType:
    """The backend ``requested`` (a name or alias), or for None what ``auto`` would run here:
    :func:`device_backend_here`'s, else the host default."""
    if requested is not None:
        return get_backend(requested)
    return get_backend(device_backend_here() or _HOST_DEFAULT)


def gpu_count() -> int:
    """The devices this process sees for its device backend (0 without one usable)."""
    name = device_backend_here()
    return 0 if name is None else int(get_backend(name).device_count())


def gpu_available() -> bool:
    """True where a device backend of the registry is usable here (CuPy seeing a CUDA device)."""
    return device_backend_here() is not None
