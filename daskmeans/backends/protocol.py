"""The backend contract: what the engine may call on a block, whatever the array library,
and what it asks of the machine a backend runs on.

Both :mod:`.numpy_backend` and :mod:`.cupy_backend` are modules that satisfy
:class:`Backend`; ``tests/unit/test_backends.py`` checks that every member exists in each
with the same parameters. Shapes: ``X`` is one block ``(n, d)``, centroids ``(K, d)``.

Besides the kernels, a backend answers the questions the engine would otherwise ask an array
library itself (``engine/plan.py`` and ``dask_cluster.py`` import none): whether it can run
here and on how many devices (:meth:`Backend.available`, :meth:`Backend.device_count`), the
device memory this worker may still use (:meth:`Backend.device_budget`), its step rate for the
preflight's estimate (:meth:`Backend.step_rate`) and the collectives its buffers can be summed
by (``collectives``, names of :data:`daskmeans.engine.collective.REGISTRY`).

One member is optional, outside :class:`Backend`: ``row_norms(rows)``, an object that
``assign(..., row_norms=obj)`` (a parameter every backend's ``assign`` has) fills with a block's ``||x||^2`` on its first pass and reads on
the next passes over the same rows (the NumPy backend's :class:`.numpy_backend.RowNorms`). The
engine keeps one per resident chunk where a backend has it (``engine.step.kept_norms``) and
never passes the keyword to one that has not. Another is ``prepared_rows(X, precision)``: the
rows of ``X`` prepared once as centroids, whose ``take(rows, k)`` is ``prepare(X[rows])``
without reading anything back from a device (the CuPy backend's
:class:`.cupy_backend.PreparedRows`); the seeding's batches (``seeding.kernels.seed_batched``)
use it where a backend has it, and ``prepare`` otherwise. A backend of several devices in one
process has ``device_scope(index)``: a context manager within which the calling thread's
current device is ``index`` (the CuPy backend's ``cupy.cuda.Device``), by which in-process
workers each keep to their own GPU (:mod:`daskmeans.engine.devices`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, runtime_checkable

from ..numerics.grid import Grid

# The daskmeans settings behind each field of :class:`Tunables`.
TUNABLE_SETTINGS = {
    "tile_bytes": "tile-bytes",
    "gpu_tile_bytes": "gpu-tile-bytes",
    "gpu_tile_bytes_max": "gpu-tile-bytes-max",
    "gpu_fp32_gemm": "gpu-fp32-gemm",
    "gpu_tf32_gemm": "gpu-tf32-gemm",
}


@dataclass(frozen=True)
class Tunables:
    """The kernels' settings: resolved once on the client (``engine.plan.kernel_tunables``, from
    the ``daskmeans.*`` settings of :data:`TUNABLE_SETTINGS`) and passed to the backend with
    its work (:meth:`Backend.prepare`, :meth:`Backend.working_bytes`, :meth:`Backend.warm`,
    or bound by ``backends.get_backend(name, tunables)``), never read from the configuration
    where the kernels run. None of them changes a result: tiles and GEMM modes decide speed
    and memory, labels and sums are exact in each.

    Attributes
    ----------
    tile_bytes : int
        A CPU distance tile's rows and K distances, bytes (``daskmeans.tile-bytes``).
    gpu_tile_bytes, gpu_tile_bytes_max : int
        A GPU GEMM output tile, bytes, and the most it grows to at wide K.
    gpu_fp32_gemm, gpu_tf32_gemm : str
        The GEMM behind the fp32 and tf32 precisions (``"auto"`` or a mode's name).
    """

    tile_bytes: int
    gpu_tile_bytes: int
    gpu_tile_bytes_max: int
    gpu_fp32_gemm: str
    gpu_tf32_gemm: str

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "Tunables":
        """From ``daskmeans`` settings by dotted key (``config.snapshot()`` on the client, or the
        YAML's defaults); sizes such as ``"256MiB"`` become bytes.

        Raises
        ------
        ValueError
            A size that is not one, naming the setting and its value.
        """
        from dask.utils import parse_bytes

        values = {}
        for f in fields(cls):
            key = TUNABLE_SETTINGS[f.name]
            value = settings[key]
            if f.name.endswith("bytes") or f.name.endswith("bytes_max"):
                try:
                    value = int(parse_bytes(value)) if isinstance(value, str) else int(value)
                except (TypeError, ValueError):
                    raise ValueError(f"daskmeans.{key}={value!r} should be a size such as '256MiB'") from None
            else:
                value = str(value)
            values[f.name] = value
        return cls(**values)


def tunables_in_force() -> Tunables:
    """The tunables of the settings in force here (``config.snapshot()``: inside an engine task
    the client's, shipped with it): what a kernel called without any (``tunables=None``) runs
    with. The engine passes its own, resolved once on the client by the plan; this serves the
    callers that have none (kernels called directly, tasks outside a fit's placement)."""
    from ..config import snapshot

    return Tunables.from_settings(snapshot())


@dataclass(frozen=True)
class DeviceBudget:
    """What one worker's device offers a fit (:meth:`Backend.device_budget`).

    Attributes
    ----------
    free : int
        Bytes the backend may still allocate on the device: its free memory, within the
        library's own pool limit where one is set.
    total : int
        The device's memory, bytes.
    processors : int
        Its multiprocessors (SMs), which size some kernels' tiles (0: unknown).
    """

    free: int
    total: int
    processors: int = 0


@runtime_checkable
class Backend(Protocol):
    """Pure kernels on one in-memory block (no Dask, no I/O)."""

    name: str  # the registry's key ("numpy" or "cupy"): for messages, never compared
    # Capabilities: what the engine asks instead of a backend's name.
    on_host: bool  # buffers are host NumPy memory (no device budget, no device collective)
    tile_setting: str  # the daskmeans setting that bounds the kernels' tiles (working_bytes)
    # The collectives (names in engine.collective.REGISTRY) that can sum its buffers: "dask"
    # takes any backend's (through host memory where they are not); "nccl" CuPy's alone;
    # "process" those whose in-process ranks can add each other's buffers where they are.
    collectives: tuple[str, ...]
    # Whether the step's inertia comes from exact per-cluster sums (``assign``'s ``qsums``, the
    # rows' ``w ||x||^2`` on ``Grid.qexp``'s step; ``Grid.inertia``): the same bits whichever rows
    # a step re-assigned. Else each chunk's own inertia (``assign``'s, ``owner_inertia``).
    inertia_from_sums: bool
    # A row that Yinyang's filter leaves uncertain costs about this many rows of Lloyd's pass
    # (``assign_bounds``: its distances and its group bounds): the share of uncertain rows
    # above which the bounded step costs more than Lloyd's (engine/yinyang.py).
    bounds_cost: float

    def available(self) -> bool:
        """Whether the backend can run in this process: its library imports and, for a device
        backend, at least one device is visible (asked on each worker by ``dask_cluster``)."""

    def device_count(self) -> int:
        """The devices this process sees for the backend (0 for a host backend, and where its
        library, a driver or a device is missing)."""

    def device_budget(self) -> DeviceBudget | None:
        """The current device's memory this worker may still use and its multiprocessors, for
        the memory plan (asked on each worker); None for a host backend."""

    def step_rate(self) -> float:
        """This worker's rate at the iterations' own work, counted as 2 N K D FLOP/s (measured
        on the host, where it takes a few ms; a device's nominal GEMM rate, since measuring
        would start its libraries during planning): for the preflight's time estimate."""

    @property
    def xp(self) -> Any:
        """The array namespace (the ``numpy`` or ``cupy`` module), imported on first use."""

    def asarray(self, block: Any, dtype: Any = None) -> Any:
        """``block`` on the backend's device, C-contiguous (and aligned on the host)."""

    def to_numpy(self, a: Any, out: Any = None, blocking: bool = True) -> Any:
        """``a`` as a host NumPy array; into ``out`` (a host array of ``a``'s shape and dtype)
        where given: from a GPU, a page-locked ``out`` (:meth:`pinned`) is copied to directly.
        With ``blocking=False`` (``out`` given) a GPU only queues the copy: ``out`` holds ``a``
        once :meth:`wait` returns for a later :meth:`mark`."""

    def mark(self) -> Any:
        """A point in the work queued so far (a CUDA event on a GPU; the time on the host, where
        work is done when its call returns), for :meth:`wait` and :meth:`elapsed`."""

    def wait(self, mark: Any) -> None:
        """Return once the work queued before ``mark`` is done."""

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds from mark ``start`` to mark ``end``, once ``end`` is done (:meth:`wait`)."""

    def pinned(self, block: Any) -> Any:
        """A host copy of ``block`` kept by the ``host`` tier (page-locked for a GPU)."""

    def empty_host(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised host NumPy array of ``shape`` and ``dtype`` that copies to and from
        the backend's device read at the link's speed: page-locked for a GPU, C-contiguous and
        aligned on the host. Buffers that live long and are small beside the data (the
        collectives' host sums); the reading pipelines read rows into ordinary memory they lock
        in place once written (:meth:`page_lock`), which costs far less than allocating it
        page-locked."""

    def copy_in(self, dst: Any, src: Any) -> Any:
        """Queue ``dst[...] = src``: ``src`` a page-locked host array (:meth:`empty_host`, or
        locked by :meth:`page_lock`; pageable memory is copied too, only more slowly), ``dst`` a
        C-contiguous array of the backend of the same shape and dtype (rows of a larger one).
        On a GPU the copy runs on a stream of the calling thread's own, so copies from
        several threads overlap each other and the callers' reads; returns the mark
        :meth:`wait` takes (``src`` may be refilled and ``dst`` read once it is done). On the
        host it is done on return."""

    def page_lock(self, a: Any) -> Any:
        """Page-lock the existing host array ``a`` in place (memory another process shares, for
        one), so that copies between it and a GPU run at the link's speed; returns the callable
        that unlocks it, to be called before ``a``'s memory goes. A no-op on the host, and
        where the driver refuses (the copies then only take longer)."""

    def add_host(self, acc: Any, part: Any) -> None:
        """``acc += part`` for a 1-D int64 array ``acc`` of the backend and a host array
        ``part`` of its size (on a GPU, ``part`` is copied over on the current stream)."""

    def staged(self, blocks: list) -> Iterator[Any]:
        """The host tier's ``blocks`` as the kernels take them, one at a time (a GPU copies
        the next while the current one's kernels run); each valid until the next is asked for."""

    def working_bytes(self, k: int, d: int, rows: int, sm_count: int = 0, tunables: Tunables | None = None) -> int:
        """Bytes the kernels allocate for themselves while they assign blocks of up to
        ``rows`` rows of ``d`` features to ``k`` centroids (distance tiles), on a device of
        ``sm_count`` multiprocessors (0: unknown), with ``tunables``' tiles (None:
        :func:`tunables_in_force`): for the memory plan, on the client."""

    def warm(self, k: int, d: int, dtype: Any, precision: str = "fp32", rows: int = 1 << 20,
             tunables: Tunables | None = None, algorithm: str = "lloyd") -> Any:
        """Start, in the background, whatever the kernels of a fit of K x d (blocks of
        ``rows`` rows of ``dtype``, ``tunables``' tiles and GEMM modes, the loop's step
        ``algorithm``: ``params.ALGORITHMS``' values) need before their first call (a GPU
        compiles them); returns at once (a thread, or None where there is nothing to do)."""

    def prepare(self, centroids: Any, dtype: Any, precision: str = "fp32", tunables: Tunables | None = None) -> Any:
        """Centroids ``(K, d)`` cast to ``dtype`` and what every block's kernels read of them
        (one per iteration); ``precision`` one of :data:`~daskmeans.options.PRECISIONS`;
        ``tunables`` the kernels' settings for every call on what this returns (None:
        :func:`tunables_in_force`)."""

    def assign(self, X: Any, p: Any, sample_weight: Any = None, want_sums: bool = True,
               prev_labels: Any = None, out_labels: Any = None, grid: Grid | None = None,
               interrupt: Callable[[], None] | None = None, row_norms: Any = None) -> dict[str, Any]:
        """Labels ``(n,)`` int32 of the nearest centroids (exact distances, lowest index on
        ties), ``inertia``, ``reassigned`` (rows whose label differs from ``prev_labels``),
        ``rechecked``; with ``want_sums`` the per-cluster ``sums`` ``(K, d)`` and ``weights``
        ``(K,)`` as int64 multiples of ``grid``'s steps, ``counts`` ``(K,)`` int64, the
        ``grid`` and, where ``inertia_from_sums``, ``qsums`` ``(K,)`` int64 (the rows'
        ``w ||x||^2`` on the grid's ``qexp`` step). ``interrupt`` is called between the kernel's pieces of work (it raises to
        stop a long call early: a fit interrupted or aborted). ``row_norms``: an object of
        the backend's optional ``row_norms(rows)``, passed only to a backend that has it (the
        module docstring)."""

    def update_centroids(self, isums: Any, iweights: Any, old: Any, grid: Grid) -> tuple[Any, Any]:
        """``(new, shift)``: centroids ``(K, d)`` float64 from combined integer sums (``old``
        where a cluster has no weight) and the squared shift, the same bits on either backend."""

    def label_counts(self, labels: Any, k: int) -> Any:
        """Rows per label: int64 ``(k,)`` for int32 ``labels`` ``(n,)`` in ``[0, k)``."""

    def bin_sums(self, labels: Any, weights: Any, m: int) -> Any:
        """Per-label sums of ``weights`` (``(n,)`` float64; None: each row counts 1), float64
        ``(m,)``, for integer ``labels`` ``(n,)`` in ``[0, m)``: ``numpy.bincount``'s result,
        without a synchronisation with the host."""

    def min_sqdist(self, X: Any, p: Any, grid: Any = None) -> tuple[Any, Any]:
        """Labels ``(n,)`` int32 and squared distances ``(n,)`` float64 to the nearest centroid
        (``grid``: one whose bound covers ``X``, where the caller has it: a GPU's scaled float16
        GEMM then takes its scale from the grid instead of a reduction over ``X``)."""

    def moments(self, X: Any) -> tuple[Any, Any, Any, int | None]:
        """Per-column mean, sum of squared deviations and largest absolute value ``(d,)``
        float64, and the first row holding a NaN or infinity (None if none)."""

    def pin(self, X: Any) -> int:
        """A 64-bit hash of the block's values in row order (a chunk's pin: a chunk read again
        during a fit is checked against it, :class:`daskmeans.engine.placement.Shard`); computed where
        the block lives, so that a device block is never copied to be pinned."""

    def sqdistances(self, X: Any, p: Any) -> Any:
        """Squared distances ``(n, K)`` float64 from every row to every centroid."""

    # Yinyang's kernels (engine/yinyang.py; the contract of each is numpy_backend's, any array
    # module's versions in backends/bounds.py). Bounds are on Euclidean distances to the
    # prepared centroids in the data dtype, float64, rounded outwards.

    def row_sqnorms(self, X: Any) -> Any:
        """``||x||^2`` of every row, float64 ``(n,)``."""

    def centroid_drift(self, old: Any, new: Any) -> tuple[Any, float]:
        """Each centroid's move ``(K,)`` float64 (rounded up) between two steps' centroids in
        the data dtype, and the largest norm of ``new`` (rounded up)."""

    def yinyang_filter(self, X: Any, p: Any, labels: Any, upper: Any, lower: Any, xnorm: Any, drift: Any,
                       gdrift: Any, cmax: float) -> Any:
        """The bounds moved by the drift (in place) and the rows ``(m,)`` int64 whose label
        they leave uncertain: every other row's label is the one :meth:`assign` gives."""

    def assign_bounds(self, X: Any, p: Any, group_of: Any, n_groups: int, xnorm: Any, cmax: float,
                      interrupt: Any = None) -> tuple[Any, Any, Any]:
        """:meth:`assign`'s labels ``(n,)`` int32 of the rows, each row's upper bound ``(n,)``
        and its per-group lower bounds ``(n, n_groups)``."""

    def add_label_sums(self, X: Any, labels: Any, sample_weight: Any, sign: int, grid: Grid, sums: Any,
                       weights: Any, counts: Any, qsums: Any = None, xnorm: Any = None) -> None:
        """``sign`` times the rows' values on ``grid`` added to their labels' int64 sums
        ``(K, d)``, weights ``(K,)`` (weighted rows only) and counts ``(K,)`` in place: the
        integers :meth:`assign` adds; with ``qsums`` ``(K,)`` and the rows' ``xnorm`` ``(n,)``
        (:meth:`row_sqnorms`), their ``w ||x||^2`` on the grid too (``assign``'s ``qsums``)."""

    def owner_inertia(self, X: Any, p: Any, labels: Any, sample_weight: Any = None) -> Any:
        """The rows' inertia under ``labels`` (float64): a chunk's step inertia where the
        backend's is not ``inertia_from_sums``."""


def members() -> Iterable[str]:
    """The names a backend module must define (:func:`capabilities` and ``name`` last)."""
    return sorted(n for n in vars(Backend) if not n.startswith("_")) + ["name"]


def capabilities() -> dict[str, type]:
    """The capability attributes a backend module must define, with their types."""
    return {"on_host": bool, "tile_setting": str, "collectives": tuple, "inertia_from_sums": bool,
            "bounds_cost": float}
