"""Facts of the current CUDA device and the launch helpers every GPU regime shares: cached
device properties, the GEMM and select streams, kernels' occupancy, NULL pointer arguments."""

from __future__ import annotations

import functools
from typing import Any

import numpy

from . import gpu_plan

NULL = numpy.uint64(0)  # a NULL pointer argument (optional kernel inputs and outputs)


def ptr(a: Any) -> Any:
    """A kernel argument for an optional array: the array, or NULL."""
    return NULL if a is None else a


def device_id() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDevice())


def current_device() -> int | None:
    """The calling thread's current GPU; None where CuPy cannot be imported (no thread of this
    process has a GPU to pass on)."""
    try:
        return device_id()
    except ImportError:
        return None


@functools.lru_cache(maxsize=None)
def driver() -> Any:
    """The CUDA driver's library through ``ctypes``, initialised (``cuInit``), or None where it
    cannot be loaded or refuses. Its calls release the interpreter lock, where CuPy's calls
    that first initialise the driver or make a context hold it: a command's thread makes them
    here while its main thread imports (:func:`open_context`)."""
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return cu if cu.cuInit(0) == 0 else None


def open_context(index: int) -> None:
    """Make GPU ``index``'s primary CUDA context from the calling thread without holding the
    interpreter lock, so that other threads' Python runs meanwhile.

    Since CUDA 12 ``cudaSetDevice`` makes the context, and CuPy calls it holding the lock: the
    command's imports on its main thread stopped for as long (performance.md, "The
    multi-GPU command's fixed costs"). Here the driver makes it (``cuDevicePrimaryCtxRetain``,
    the context the runtime uses; :func:`driver`) and makes it current on this thread; the
    runtime's own first call on it (a synchronisation, which CuPy makes without the lock)
    then sets up the runtime's side, so that a later ``cudaSetDevice`` only selects it. The
    retained context is never released: the runtime holds it for the process's life anyway.
    Where the driver's library cannot be loaded or refuses, the context is made through CuPy
    as usual; its errors are raised, as the worker's first call would."""
    import ctypes

    import cupy

    cu = driver()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if (cu is not None and cu.cuDeviceGet(ctypes.byref(dev), int(index)) == 0
            and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0):
        cupy.cuda.runtime.deviceSynchronize()
        return
    with cupy.cuda.Device(index):
        cupy.cuda.runtime.deviceSynchronize()


@functools.lru_cache(maxsize=None)
def sm_count(device: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"])


@functools.lru_cache(maxsize=None)
def shared_optin(device: int) -> int:
    """Most dynamic shared memory one block may opt in to on a device."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device).get("sharedMemPerBlockOptin", gpu_plan.SHARED_BYTES))


@functools.lru_cache(maxsize=None)
def compute_capability(device: int) -> str:
    """``"90"`` for 9.0."""
    import cupy

    return str(cupy.cuda.Device(device).compute_capability)


@functools.lru_cache(maxsize=None)
def streams(device: int) -> tuple:
    """``(gemm, select)`` non-blocking streams of a device, of equal (the default) priority:
    the GEMM of one tile overlaps the selection of the one before. Every figure of the tile
    path was measured so; a higher priority for the selection (CuPy has no
    ``deviceGetStreamPriorityRange``, but CUDA clamps a priority to the device's range) is
    untried (docs/performance.md, "Open gaps")."""
    import cupy

    with cupy.cuda.Device(device):
        return cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)


_OCCUPANCY: dict = {}


def blocks_per_sm(kern: Any, threads: int, shared: int) -> int:
    """Resident blocks per multiprocessor of a compiled kernel (:func:`gpu_plan.occupancy`
    from its registers and static shared memory), cached per kernel and launch shape."""
    key = (id(kern), threads, shared)
    if key not in _OCCUPANCY:
        try:
            attrs = kern.attributes
            _OCCUPANCY[key] = gpu_plan.occupancy(int(attrs["num_regs"]), int(attrs.get("shared_size_bytes", 0)),
                                                 threads, shared)
        except Exception:  # the occupancy estimate is an optimisation only
            _OCCUPANCY[key] = 2
    return _OCCUPANCY[key]
