"""CuPy kernels: the backend contract (:class:`.protocol.Backend`) on the GPU.

Two regimes, chosen in :func:`prepare` from K and D alone (:func:`.gpu_plan.small_config`):

fused (small K x D: the centroids fit in shared memory or registers)
    :mod:`.gpu_small`: one ``fused_small`` pass over X, nothing else.
GEMM (moderate and large K)
    :mod:`.gpu_gemm`: cuBLAS tiles of ``-2 X C^T``, a top-2 selection certified against each
    row's error bound with an exact re-rank of uncertain rows, then :mod:`.gpu_sums`.

Sums and weights are int64 multiples of the grid's steps (:mod:`.grid`): each ``w x`` is
rounded once, as the NumPy backend rounds it, and added exactly, so atomics in any order, any
chunking and either backend give the same integers.

Labels are those of exact distances in both regimes and in every ``precision``: "fp32"
(split TF32, three TF32 products in one tensor-core GEMM of depth 3D, or cuBLAS's fp32 GEMM;
``Tunables.gpu_fp32_gemm``, from ``daskmeans.gpu-fp32-gemm`` on the client), "tf32" (one TF32 product) and "bf16" (bfloat16 inputs) differ
in speed and in how many rows need the exact re-check (``rechecked``), never in labels.
CUDA sources are files under ``cuda/`` (:mod:`.cuda_src` compiles them). CuPy is imported
lazily so that importing daskmeans never needs a GPU.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any, Callable

import numpy

from . import bounds, cuda_src, gpu_device, gpu_gemm, gpu_plan, gpu_small, gpu_staging
from .gpu_plan import Prepared
from .gpu_staging import staged  # noqa: F401  (the host tier's half of the contract)
from .gpu_plan import uses_tiles  # noqa: F401  (asked by the memory plan)
from ..errors import DataError, InvalidParameterError
from ..numerics.grid import Grid
from .protocol import DeviceBudget, Tunables, tunables_in_force

__all__ = ["Prepared", "add_host", "asarray", "assign", "bin_sums", "current_device", "device_scope", "label_counts",
           "min_sqdist", "moments", "name", "page_lock",
           "pinned", "prepare", "sqdistances", "staged", "to_numpy", "update_centroids", "uses_tiles",
           "on_host", "tile_setting", "working_bytes", "collectives", "inertia_from_sums", "bounds_cost", "available", "device_count", "device_budget",
           "step_rate", "copy_in", "empty_host"]


def __getattr__(attr: str) -> Any:
    if attr == "xp":
        import cupy

        return cupy
    raise AttributeError(attr)


name = "cupy"
on_host = False
tile_setting = "gpu-tile-bytes"
# NCCL's all-reduce on the device buffers, one rank per GPU; Dask's comms through host memory.
collectives = ("nccl", "process", "dask")
# The step's inertia per chunk as the kernels sum it (float64 distances of the sums pass,
# Yinyang's by ``owner_inertia``), not from exact per-cluster sums of ``w ||x||^2``: the GPU
# kernels do not carry them yet (docs/performance.md, "inertia from exact sums").
inertia_from_sums = False
# An uncertain row of Yinyang's step against a row of Lloyd's pass: the GEMM tiles in group
# order, the group minima and the (n, groups) float64 bounds written (measured in
# docs/performance.md, "Yinyang": it varies with the shape, this is between its figures).
bounds_cost = 6.0
# The GEMM rate the preflight's estimate assumes: nominal (measuring would start cuBLAS during
# planning); the estimate only needs the order of magnitude.
NOMINAL_FLOPS = 50e12


def device_count() -> int:
    """CUDA devices CuPy sees here (0 without CuPy, a driver or a device)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver, or no device: all mean "no GPU here"
        return 0


def available() -> bool:
    """True where CuPy imports and sees at least one CUDA device."""
    return device_count() > 0


def device_budget() -> DeviceBudget | None:
    """The current GPU's free memory and what CuPy's pool holds free for reuse (within the
    pool's limit where one is set: ``CUPY_GPU_MEMORY_LIMIT`` or ``set_limit``, what the pool
    may still take), its total memory and multiprocessors; None where there is no GPU. The
    pool's cached blocks count: CuPy allocates from them (and frees them all and tries again
    before it reports a device out of memory), so a worker that ran a fit before has them."""
    if not available():
        return None
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    pool = cupy.get_default_memory_pool()
    free += pool.free_bytes()
    limit = pool.get_limit()
    if limit:
        free = min(free, limit - pool.used_bytes())
    return DeviceBudget(int(free), int(total), int(gpu_device.sm_count(gpu_device.device_id())))


def step_rate() -> float:
    """The nominal GEMM rate (:data:`NOMINAL_FLOPS`)."""
    return NOMINAL_FLOPS


def asarray(block: Any, dtype: Any = None) -> Any:
    """``block`` on the current GPU, C-contiguous (a large host array through page-locked
    buffers, :func:`.gpu_staging.upload`)."""
    import cupy

    if isinstance(block, numpy.ndarray):
        return gpu_staging.upload(numpy.asarray(block, dtype=dtype))
    if isinstance(block, cupy.ndarray) and block.device.id != cupy.cuda.Device().id:
        # Made on another device of this process (an in-process worker's, passed by
        # reference): a copy on this one, as a worker process receives a copy.
        with block.device:
            src = cupy.ascontiguousarray(block, dtype=dtype)
            cupy.cuda.get_current_stream().synchronize()
        out = cupy.empty(src.shape, src.dtype)
        out.data.copy_from_device(src.data, src.nbytes)
        return out
    return cupy.ascontiguousarray(cupy.asarray(block, dtype=dtype))


def device_scope(index: int) -> Any:
    """A context manager within which the calling thread's current GPU is ``index``
    (``cupy.cuda.Device``): an in-process worker's tasks run on its own GPU
    (:mod:`daskmeans.engine.devices`)."""
    import cupy

    return cupy.cuda.Device(int(index))


def current_device() -> int:
    """The calling thread's current GPU (what :func:`device_scope` enters)."""
    import cupy

    return int(cupy.cuda.Device().id)


def pinned(block: Any) -> numpy.ndarray:
    """A copy of host ``block`` in page-locked memory (the ``host`` tier): copies from it to
    the GPU run at the link's speed, several times a pageable copy's."""
    a = numpy.asarray(block)
    out = gpu_staging.empty_pinned(a.shape, a.dtype)
    out[...] = a
    return out


def empty_host(shape: tuple[int, ...], dtype: Any) -> numpy.ndarray:
    """An uninitialised host array in page-locked memory (:func:`.gpu_staging.empty_pinned`)."""
    return gpu_staging.empty_pinned(shape, dtype)


def copy_in(dst: Any, src: numpy.ndarray) -> Any:
    """Queue the copy of page-locked host ``src`` into the device array ``dst`` on the calling
    thread's copy stream (:func:`.gpu_staging.copy_in`); returns its event."""
    return gpu_staging.copy_in(dst, src)


_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable (driver_types.h)


def page_lock(a: numpy.ndarray) -> Any:
    """Page-lock host array ``a`` in place (``cudaHostRegister``): copies from and to it are
    then DMA at the link's speed instead of passing through the driver's staging buffers.
    Returns the unlock; where the driver refuses, a no-op (copies stay correct, only slower)."""
    import cupy

    ptr, nbytes = a.ctypes.data, a.nbytes
    device = current_device()
    try:
        # Portable: page-locked for every device of the process, as page-locked memory that
        # CUDA allocates is (in-process workers of several GPUs share the host's blocks).
        cupy.cuda.runtime.hostRegister(ptr, max(1, nbytes), _HOST_REGISTER_PORTABLE)
    except cupy.cuda.runtime.CUDARuntimeError:
        return lambda: None

    def unlock() -> None:
        with cupy.cuda.Device(device):  # the device whose copies read or write ``a``
            cupy.cuda.runtime.deviceSynchronize()  # none is still queued
        cupy.cuda.runtime.hostUnregister(ptr)

    return unlock


def add_host(acc: Any, part: numpy.ndarray) -> None:
    """``acc += part``: ``part`` copied to the device on the current stream, then added."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    tmp = cupy.empty(part.shape, part.dtype)
    tmp.set(part, stream=stream)
    acc += tmp


def to_numpy(a: Any, out: numpy.ndarray | None = None, blocking: bool = True) -> numpy.ndarray:
    """``a`` on the host; into ``out`` where given (page-locked: a direct copy, no staging
    through a driver buffer as for pageable memory), with ``blocking=False`` only queued on
    the current stream (see :func:`mark` and :func:`wait`)."""
    import cupy

    if out is None:
        return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else numpy.asarray(a)
    if isinstance(a, cupy.ndarray):
        cupy.asnumpy(a, out=out, blocking=blocking)
    else:
        numpy.copyto(out, a)
    return out


def mark() -> Any:
    """A CUDA event recorded on the current stream (timing enabled)."""
    import cupy

    return cupy.cuda.get_current_stream().record()


def wait(mark: Any) -> None:
    mark.synchronize()


def elapsed(start: Any, end: Any) -> float:
    """Seconds between two recorded events (``end`` done)."""
    import cupy

    return cupy.cuda.get_elapsed_time(start, end) / 1e3


def prepare(centroids: Any, dtype: Any, precision: str = "fp32", tunables: Tunables | None = None, *,
            _layout: str = "auto", _centroids: str = "auto") -> Prepared:
    """Cast centroids ``(K, D)`` to the data dtype and precompute what the kernels read.

    ``precision`` is one of :data:`~daskmeans.options.PRECISIONS`, checked once per fit by
    the estimator; ``tunables`` (None: those in force, :func:`.protocol.tunables_in_force`) pick its GEMM and size the tiles of every
    kernel on what this returns. ``_layout`` (:func:`.gpu_plan.select_layout`) and ``_centroids``
    (:func:`.gpu_plan.small_config`) force a kernel variant: for kernel benchmarks and tests.
    """
    import cupy

    c = cupy.ascontiguousarray(cupy.asarray(centroids, dtype=dtype))
    c64 = c.astype(cupy.float64)
    k, d = c.shape
    small = gpu_plan.small_config(k, d, gpu_device.shared_optin(gpu_device.device_id()), _centroids)
    if small is not None:
        return Prepared(c, c64, precision, small, tunables=tunables or tunables_in_force())  # c64: contiguous, as c
    return gpu_gemm.prepare(c, c64, precision, _layout, tunables)


class PreparedRows:
    """The rows of ``X`` ``(n, D)`` as centroids, prepared once for the GEMM regime; subsets of
    them (:meth:`take`) ready for the kernels without a reduction or a read back to the host
    (the backend's optional ``prepared_rows``: :mod:`.protocol`)."""

    def __init__(self, X: Any, precision: str, tunables: Tunables):
        import cupy

        self.X = cupy.ascontiguousarray(X)
        self.precision = precision
        self.tunables = tunables
        self.shared = gpu_device.shared_optin(gpu_device.device_id())
        self.full: dict = {}  # GEMM mode -> every row prepared in it (its float64 copy dropped)

    def take(self, rows: Any, k: int) -> Prepared:
        """:func:`prepare` of ``X[rows]``: ``rows`` int ``(k,)`` on the device, ``k`` its length
        (known on the host). The fused regime's preparation reads nothing back; the GEMM
        regime's is :func:`.gpu_gemm.take` from every row prepared once in the mode of ``k``
        centroids (the first subset of each mode pays the maxima's reads, once)."""
        import cupy

        c = self.X[rows]
        small = gpu_plan.small_config(k, c.shape[1], self.shared)
        if small is not None:
            return Prepared(c, c.astype(cupy.float64), self.precision, small, tunables=self.tunables)
        mode = gpu_gemm.mode_of(self.precision, c.dtype == cupy.float64, k, c.shape[1], self.tunables)
        if mode not in self.full:
            full = gpu_gemm.prepare(self.X, self.X.astype(cupy.float64), self.precision, "auto", self.tunables,
                                    mode_k=k, fused_copy=False)  # fused_select's copy: per subset (take)
            self.full[mode] = dataclasses.replace(full, centroids=None, c64=None)
        return gpu_gemm.take(self.full[mode], rows, c)


def prepared_rows(X: Any, precision: str = "fp32", tunables: Tunables | None = None) -> PreparedRows:
    """The rows of ``X`` ``(n, D)`` prepared once as centroids, for many subsets of them
    (:class:`PreparedRows`; the seeding's draws and picks)."""
    return PreparedRows(X, precision, tunables or tunables_in_force())


def working_bytes(k: int, d: int, rows: int, sm_count: int = 0, tunables: Tunables | None = None) -> int:
    """Where K x D takes the GEMM regime: two GEMM tiles (one GEMM overlaps the previous
    tile's selection), sized as :func:`.gpu_gemm.tile_rows` sizes them, and what a block of
    ``rows`` holds per row beside them: the tile path's error bounds (8 bytes a row) or, where
    ``fused_select`` may run, its list of rows left for the recheck
    (:func:`.gpu_plan.fused_list_bytes`). None in the fused regime."""
    if not uses_tiles(k, d):
        return 0
    t = tunables or tunables_in_force()
    per_row = gpu_plan.fused_list_bytes() if gpu_plan.fused_dp(d) <= gpu_plan.FUSED_MAX_DP else 8
    tiles = gpu_plan.tile_bytes(rows, -(-k // 4) * 4, 4, 0, 4, t.gpu_tile_bytes, t.gpu_tile_bytes_max, sm_count)
    return 2 * tiles + per_row * rows


def warm(k: int, d: int, dtype: Any, precision: str = "fp32", rows: int = 1 << 20,
         tunables: Tunables | None = None, algorithm: str = "lloyd") -> Any:
    """Start compiling, in the background, the kernels a fit of K x D (data ``dtype``, blocks
    of ``rows`` rows) launches. Returns the thread compiling this package's modules.

    - In a thread, this package's modules (NVRTC releases the interpreter lock, so they compile
      side by side): the moments and update module, the assignment's (fused, or selection and
      sums), and the labels-only passes of the inits against from one to K centroids in TF32
      (:func:`_distance_pass_compiles`); for ``algorithm`` "yinyang" the group bounds'
      kernel too (:func:`.gpu_gemm.bound_compiles`).
    - In a few processes, CuPy's own kernels that the fit launches (:mod:`.gpu_warm_ops`):
      compiling those is mostly Python work, so threads would take turns.

    With an empty kernel cache the fit otherwise waits for each compile in turn (seconds);
    started before the data is placed, they overlap the placement. A kernel asked for
    meanwhile waits for its compile in flight (:func:`.cuda_src._once`), or CuPy compiles it
    again itself; a compile error is raised there again, by the call that needs the kernel."""
    import threading

    shared = gpu_device.shared_optin(gpu_device.device_id())
    small = gpu_plan.small_config(k, d, shared)
    calls = gpu_small.compiles(small, d, dtype) if small else gpu_gemm.compiles(k, d, dtype, precision, rows, tunables)
    if algorithm == "yinyang" and not small:
        calls = calls + gpu_gemm.bound_compiles(k, d, dtype, precision, tunables)
    calls = calls + _distance_pass_compiles(k, d, dtype, rows, tunables, shared)
    warm_cupy_ops(dtype)

    device = current_device()
    load = load_ahead(dtype)

    def compile_all() -> None:
        try:
            # On the caller's GPU (this thread's is the process's first).
            cuda_src.compile_concurrently(cuda_src.fit_kernels, _row_uniforms_kernel, *calls, device=device)
        except Exception:  # raised again where the kernel is needed
            pass
        if load:
            from . import gpu_warm_ops

            try:
                with device_scope(device):
                    gpu_warm_ops.load(numpy.dtype(dtype).name, skip=() if algorithm == "yinyang" else ("yinyang",))
            except Exception:  # the fit loads each kernel at its launch
                pass

    t = threading.Thread(target=compile_all, name="daskmeans-compile", daemon=True)
    t.start()
    return t


def load_ahead(dtype: Any) -> bool:
    """Whether :func:`warm` has its thread launch CuPy's ops of a fit (:func:`.gpu_warm_ops.load`)
    on the worker's GPU once this package's modules are loaded: where every op is compiled
    (the markers of :func:`.gpu_warm_ops.compiled`, on the calling thread's GPU) and
    ``daskmeans.gpu-load-ahead`` is on. Each op's kernels then load during the placement and
    the moments pass rather than at their first launch in the init, where a fit's dozens of
    loads came one after another on each GPU (docs/performance.md, "A first fit"). Where the
    cache lacks them, the warm-up processes compile them and the fit loads each at its launch."""
    from .. import config
    from . import gpu_warm_ops

    return bool(config.get("gpu-load-ahead")) and gpu_warm_ops.compiled(numpy.dtype(dtype).name)


def _row_uniforms_kernel() -> None:
    """The seeded draws' kernel (:func:`daskmeans.numerics.hashing.row_uniforms` on CuPy), which
    every k-means|| round launches, compiled by drawing one row."""
    import cupy

    from ..numerics.hashing import row_uniforms

    row_uniforms(0, 0, 0, 1, xp=cupy)


_REG_K = 64  # the fused kernel's register configurations stop well below this many centroids


def _distance_pass_compiles(k: int, d: int, dtype: Any, rows: int, tunables: Tunables | None,
                            shared: int) -> list:
    """The compile calls of :func:`min_sqdist` against any number of centroids from 1 to K in
    TF32 (the inits' passes: k-means||'s rounds, the recluster's batches, k-means++'s steps).
    Each fused configuration that keeps the centroids in registers is compiled for its own K,
    so every such K up to ``k`` is one call; past them one configuration serves every K, then
    the GEMM regime's modules."""
    calls, seen = [], set()
    top = max(k, round_draws_bound(k))
    kk = 1
    while kk <= top:
        cfg = gpu_plan.small_config(kk, d, shared)
        if cfg is None:
            while kk <= top:  # the GEMM's mode (and so the selection's module) depends on K
                calls += gpu_gemm.compiles(kk, d, dtype, "tf32", rows, tunables)
                kk *= 2
            calls += gpu_gemm.compiles(top, d, dtype, "tf32", rows, tunables)
            break
        if cfg not in seen:
            seen.add(cfg)
            calls += gpu_small.compiles(cfg, d, dtype, mode=1)
        kk = kk + 1 if kk < _REG_K and cfg[2] else kk * 2
    return calls


def round_draws_bound(k: int) -> int:
    """The most candidates one k-means|| round draws in practice at the default
    ``oversampling_factor`` (``l = oversampling_factor * k`` expected, a sum of independent
    draws): ``l + 6 sqrt(l) + 6``, beyond which a round's count lies with a probability below
    1e-9. A round's distance pass runs against its own draws, which may outnumber K: their
    kernels are compiled ahead up to this count."""
    from ..params import KMeansParams

    ell = KMeansParams.oversampling_factor * k
    return int(math.ceil(ell + 6 * math.sqrt(ell) + 6))


# CuPy's switch of NVRTC's precompiled headers (CuPy 14.1 and later, NVRTC 12.8 and later):
# every compile then parses CuPy's headers once per process rather than once per kernel, and
# a first fit compiles dozens of CuPy's kernels, each mostly that parse (docs/performance.md,
# "A first fit"). Not part of CuPy's cache key: a cache filled either way serves both.
PCH_ENV = "CUPY_NVRTC_USE_PCH"


def nvrtc_pch(env: dict | None = None) -> dict:
    """``env`` (default: this process's environment) with :data:`PCH_ENV` on, unless it is set
    already (``CUPY_NVRTC_USE_PCH=0`` keeps it off). CuPy reads it once, when its compiler
    module is imported: the command sets it before importing CuPy, and the warm-up processes
    get it in their environment."""
    import os

    env = os.environ if env is None else env
    env.setdefault(PCH_ENV, "1")
    return env


_OPS_STARTED: set = set()  # the dtypes whose ops were sent to processes (warm_cupy_ops)
_OPS_HERE: set = set()  # and those this process compiles too (warm_ops_here)


def warm_ahead(dtype: Any = "float32", k: int | None = None, shape: tuple[int, int] | None = None,
               precision: str = "fp32", algorithm: str = "lloyd", chunk_bytes: int | str | None = None) -> list:
    """:func:`warm_cupy_ops` for a command about to start GPU workers on this host, where it
    has CuPy and an NVIDIA device (neither is imported or opened here): the compiles then
    overlap the command's own imports and the workers' start. Where the workers will be threads
    of this process (:func:`daskmeans.config.gpu_in_process`), this package's modules start
    compiling here too, in a thread: those that depend on the dtype alone (and on K's regime:
    the GEMM's preparation, sums and float16 selection only past the fused kernels' K); and
    where the kernel cache is empty (CuPy's ops went to new processes) and the data's
    ``shape`` is known (its header's: ``(n_samples, n_features)``), every module a fit of K
    clusters on it launches, as the worker's :func:`warm` would choose them (``precision``,
    ``algorithm``, blocks of the rows the plan is expected to give each GPU: ``chunk_bytes``,
    else ``daskmeans.gpu-chunk-bytes``). The worker's :func:`warm` finds them built, or waits
    for the compile in flight (:func:`.cuda_src._once`), rather than starting them seconds
    later after the cluster and the plan: on an empty kernel cache the init waited for them.
    From a warm cache they load in a moment during placement, where here their loads would
    take turns with the imports for the interpreter lock. Returns the processes started."""
    import importlib.util
    import os
    import threading

    if not os.path.exists("/dev/nvidiactl") or importlib.util.find_spec("cupy") is None:
        return []
    nvrtc_pch()  # before this process imports CuPy; its GPU worker processes inherit it
    procs = warm_cupy_ops(dtype)
    fit_shape = shape if procs else None
    threading.Thread(target=_modules_ahead, args=(dtype, k, fit_shape, precision, algorithm, chunk_bytes),
                     name="daskmeans-compile-ahead", daemon=True).start()
    return procs


def _modules_ahead(dtype: Any, k: int | None, shape: tuple[int, int] | None = None, precision: str = "fp32",
                   algorithm: str = "lloyd", chunk_bytes: int | str | None = None) -> None:
    """:func:`warm_ahead`'s thread: the fit's modules (:func:`warm`'s, where ``k`` and the
    data's ``shape`` are known), else the dtype's, compiled where the workers will be in this
    process, on the first GPU, and every other GPU's CUDA context made meanwhile, each in a
    thread (the plan's first question to a GPU's worker would otherwise make it, on the
    command's path); nothing where there is no device or the workers will be processes of their
    own (a context here would hold device memory that the worker on the same device then
    lacks). The driver's initialisation and the first GPU's context are made first, without
    the interpreter lock (:func:`.gpu_device.open_context`): the warm-up processes started just
    before make theirs at the same time, which makes each slower, and CuPy's calls would hold
    the lock that the command's imports need meanwhile."""
    import threading

    try:
        gpu_device.driver()
        n = _gpus_in_process()
        if n == 0:
            return
        others = [threading.Thread(target=_open_device, args=(i,), name=f"daskmeans-open-gpu-{i}", daemon=True)
                  for i in range(1, n)]
        for t in others:
            t.start()
        _open_device(0)
        if k is not None and shape is not None and 0 < k <= shape[0]:  # else the fit is refused first
            with device_scope(0):
                warm(k, shape[1], dtype, precision, ahead_rows(shape, dtype, n, chunk_bytes), algorithm=algorithm)
            return
        calls = [cuda_src.fit_kernels]
        if k is None or k > _REG_K:
            calls.append(lambda: cuda_src.select_rows_kernel(dtype, numpy.float16))
        cuda_src.compile_concurrently(*calls, device=0)
    except Exception:  # raised again where the kernel is needed
        pass


def _gpus_in_process() -> int:
    """The GPUs visible here, where the local cluster's GPU workers will be threads of this
    process (:func:`daskmeans.config.gpu_in_process`); 0 where none is visible (a driver but
    no GPU: no fit on one) or the workers will be processes of their own."""
    from .. import config

    n = device_count()
    return n if n > 0 and config.gpu_in_process(n) else 0


def ahead_rows(shape: tuple[int, int], dtype: Any, n_gpus: int, chunk_bytes: int | str | None = None) -> int:
    """The rows of the blocks a fit of ``shape`` on ``n_gpus`` in-process GPU workers is
    expected to run on, as the plan (:func:`daskmeans.engine.plan.plan`) cuts a file's chunks
    for GPU workers: about ``chunk_bytes`` (else ``daskmeans.gpu-chunk-bytes``) of rows, no
    more than each GPU's share (``chunk_bytes`` a count of bytes or a size such as ``"128MiB"``,
    as ``--chunk-bytes`` takes it). Only a guess for compiling ahead (the GPUs this process
    sees, the settings' tunables rather than the plan's): where the plan chooses other blocks,
    the worker's :func:`warm` compiles what they need."""
    from dask.utils import parse_bytes

    from .. import config

    n, d = (int(s) for s in shape)
    cap = int(parse_bytes(chunk_bytes)) if chunk_bytes else config.get_bytes("gpu-chunk-bytes")
    return max(1, min(-(-n // max(1, int(n_gpus))), cap // max(1, d * numpy.dtype(dtype).itemsize)))


def _open_device(index: int) -> None:
    """GPU ``index``'s primary CUDA context made (:func:`.gpu_device.open_context`), on a
    thread of the command while its main thread imports."""
    try:
        gpu_device.open_context(index)
    except Exception:  # the worker's own first call says what is wrong
        pass


def warm_processes() -> int:
    """How many processes compile CuPy's kernels ahead (``daskmeans.gpu-warm-processes``: auto
    is a quarter of this machine's cores, 2 to 4). Each compiles one kernel after another
    (CuPy's compile is mostly Python, under the interpreter lock), beside the command's and
    workers' own start, which a process per two cores slowed more than its compiles gained;
    and each makes a CUDA context on the first GPU, which the driver makes more slowly the more
    are made at once: 8 processes began compiling later than 4 and the command still waited
    for them (docs/performance.md, "A first fit")."""
    import os

    from .. import config

    how = config.get("gpu-warm-processes")
    if str(how) == "auto":
        return max(2, min(4, (os.cpu_count() or 4) // 4))
    try:
        n = int(how)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or str(n) != str(how).strip():
        raise InvalidParameterError(f"daskmeans.gpu-warm-processes={how!r} should be auto or a count of at least 1")
    return n


def warm_cupy_ops(dtype: Any, processes: int | None = None) -> list:
    """Compile CuPy's kernels of a fit on data of ``dtype`` (:mod:`.gpu_warm_ops`) in
    ``processes`` processes at once (default: :func:`warm_processes`), into
    CuPy's disk cache; once per process and dtype. The processes share the list of ops: each
    takes the next op that no other has taken, in the order the fit needs them, and leaves a
    marker in the cache when it is compiled; none is started where every op's marker is there.
    Returns the processes started (nothing waits for them). Needs no CuPy in this process: the
    command calls it before its own imports."""
    import os
    import subprocess
    import sys

    from . import gpu_warm_ops

    dt = numpy.dtype(dtype).name
    if dt in _OPS_STARTED:
        return []
    _OPS_STARTED.add(dt)
    if gpu_warm_ops.compiled(dt):
        return []
    n = min(processes or warm_processes(), gpu_warm_ops.count(dt))
    env = nvrtc_pch(dict(os.environ))
    return [subprocess.Popen([sys.executable, gpu_warm_ops.__file__, dt], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            for _ in range(n)]


def warm_ops_here(dtype: Any) -> "threading.Thread | None":
    """CuPy's kernels of a fit on ``dtype`` also compiled by a thread of this process, on its
    first GPU, where its GPU workers are threads of this process: the command calls this once
    its imports are done, where :func:`warm_ahead` started processes. The thread takes
    ops from the same list under the same locks as the processes (:func:`.gpu_warm_ops.work`),
    so it never compiles an op they hold; a kernel it compiles is in this process's memory
    when the worker launches it. It starts after the imports, whose Python it would slow,
    and while the processes are still making their CUDA contexts: the fit's init, a second
    later, found more of its kernels built (docs/performance.md, "A first fit"). Returns the
    thread, or None where nothing is to be done."""
    import threading

    dt = numpy.dtype(dtype).name
    if dt in _OPS_HERE or _gpus_in_process() == 0:
        return None
    _OPS_HERE.add(dt)
    t = threading.Thread(target=_ops_here, args=(dt,), name="daskmeans-compile-ops", daemon=True)
    t.start()
    return t


def _ops_here(dtype: str) -> None:
    from . import gpu_warm_ops

    try:
        with device_scope(0):
            gpu_warm_ops.work(dtype)
    except Exception:  # the fit compiles what it needs, and says what is wrong
        pass


def _run(X, p, sample_weight, prev_labels, labels, d2, want_sums, grid=None):
    import cupy

    if X.dtype != p.centroids.dtype:
        raise TypeError(f"X.dtype={X.dtype} should equal the prepared centroids' dtype {p.centroids.dtype}")
    w = None if sample_weight is None else cupy.ascontiguousarray(sample_weight, dtype=cupy.float64)
    if want_sums and grid is None:
        grid = Grid.for_block(X, w)
    run = gpu_small.run if p.small is not None else gpu_gemm.run
    out = run(X, p, w, prev_labels, labels, d2, want_sums, grid)
    if want_sums:
        out["grid"] = grid
    return out


def assign(
    X: Any,
    p: Prepared,
    sample_weight: Any = None,
    want_sums: bool = True,
    prev_labels: Any = None,
    out_labels: Any = None,
    grid: Grid | None = None,
    interrupt: Callable[[], None] | None = None,
    row_norms: Any = None,
) -> dict[str, Any]:
    """Assign each row to its nearest centroid and accumulate per-cluster statistics.

    Parameters
    ----------
    X : cupy.ndarray, shape (n, d), float32 or float64, C-contiguous
    p : Prepared centroids (K, d), same dtype as X
    sample_weight : cupy.ndarray, shape (n,), optional
    want_sums : bool
        If False, only labels and inertia are computed (prediction / scoring).
    prev_labels : cupy.ndarray of int32, shape (n,), optional
        Labels of the previous iteration: ``reassigned`` counts the rows that changed
        (all rows when not given).
    out_labels : cupy.ndarray of int32, shape (n,), optional
        Where to write the labels (may be ``prev_labels``: each row is read, then written).
    grid : Grid, optional
        The fixed-point grid of the sums (a fit's, the same for every block); by default the
        block's own.
    interrupt : callable, optional
        Called once before the block's kernels are queued (they run asynchronously: a
        block's work is not cut short once queued).
    row_norms : None
        Kept row norms are the host kernels' (this module has no ``row_norms``, so the
        engine never passes any); the GPU's kernels read each row once per pass anyway.

    Returns
    -------
    dict with ``labels`` (n,) int32, ``inertia``, ``reassigned`` and ``rechecked`` (rows
    re-ranked by exact distances; 0-d device arrays, no synchronisation), and when
    ``want_sums``: ``sums`` (K, d) and ``weights`` (K,) int64 multiples of the ``grid``'s
    steps (returned too), ``counts`` (K,) int64.
    """
    import cupy

    if interrupt is not None:
        interrupt()
    labels = out_labels if out_labels is not None else cupy.empty(X.shape[0], cupy.int32)
    out = _run(X, p, sample_weight, prev_labels, labels, None, want_sums, grid)
    out["labels"] = labels
    return out


_UPDATE_BLOCKS = 1024  # at most; a function of K x D only, so the shift's sum order is too


def update_centroids(isums: Any, iweights: Any, old: Any, grid: Grid) -> tuple:
    """The Lloyd update from a fit's combined sums: ``(new, shift)`` as in the NumPy backend
    (the same centroid bits), in one pass over K x d (cuda/fit.cu) that also sums the
    squared shift in a fixed order (``shift`` a 0-d device array: no synchronisation)."""
    import cupy

    k, d = old.shape
    kern = cuda_src.fit_kernels()
    update, sum_parts = kern["update_centroids"], kern["sum_parts"]
    new = cupy.empty((k, d), cupy.float64)
    nb = int(max(1, min(_UPDATE_BLOCKS, -(-k * d // 256))))
    part = cupy.empty(nb, cupy.float64)
    shift = cupy.empty((), cupy.float64)
    update((nb,), (256,), (isums, grid.exps_on(cupy), iweights, numpy.int32(grid.wexp), cupy.ascontiguousarray(old),
                           new, numpy.int64(k), numpy.int32(d), part))
    sum_parts((1,), (256,), (part, numpy.int32(nb), shift))
    return new, shift


def pin(X: Any) -> int:
    """A 64-bit hash of ``X``'s values in row order, on the device (``pin_words`` in
    ``cuda/fit.cu``: one pass over its 32-bit words; the block's bytes never leave the GPU)."""
    import cupy

    X = cupy.ascontiguousarray(X)
    if X.dtype.itemsize % 4:
        X = X.astype(cupy.float32)  # the engine's blocks are float32/float64; others are widened first
    words = X.reshape(-1).view(cupy.uint32)
    out = cupy.zeros(1, cupy.uint64)
    n = words.shape[0]
    nb = int(max(1, min(4 * gpu_device.sm_count(gpu_device.device_id()), -(-n // 256))))
    cuda_src.fit_kernels()["pin_words"]((nb,), (256,), (words, numpy.int64(n), out))
    return int(out.get()[0])


def label_counts(labels: Any, k: int) -> Any:
    """Rows per label: int64 ``(k,)`` for int32 ``labels`` ``(n,)`` in ``[0, k)``."""
    import cupy

    kern = cuda_src.fit_kernels()["label_counts"]
    n = labels.shape[0]
    counts = cupy.zeros(k, cupy.uint64)
    shared = k if 4 * k <= gpu_plan.SHARED_BYTES else 0
    nb = int(max(1, min(4 * gpu_device.sm_count(gpu_device.device_id()), -(-n // 256))))
    kern((nb,), (256,), (labels, numpy.int64(n), numpy.int32(k), numpy.int32(shared), counts), shared_mem=4 * shared)
    return counts.view(cupy.int64)


def bin_sums(labels: Any, weights: Any, m: int) -> Any:
    """Per-label sums of ``weights`` (None: counts), float64 ``(m,)``. Not ``cupy.bincount``:
    it reads the labels' minimum and maximum back to the host (two synchronisations), and its
    check of the minimum compiles CUB's block reduction, seconds of NVRTC on a cold cache."""
    import cupy

    out = cupy.zeros(m, cupy.float64)
    cupy.add.at(out, labels, cupy.ones(labels.shape[0], cupy.float64) if weights is None else weights)
    return out


def min_sqdist(X: Any, p: Prepared, grid: Grid | None = None) -> tuple[Any, Any]:
    """Nearest centroid (int32, shape (n,)) and its squared distance (float64, shape (n,));
    ``grid``, where given, bounds ``X`` (:attr:`.Grid.x_max`: the float16 GEMM's scale without a
    reduction over ``X`` and its synchronisation)."""
    import cupy

    n = X.shape[0]
    labels = cupy.empty(n, cupy.int32)
    d2 = cupy.empty(n, cupy.float64)
    _run(X, p, None, None, labels, d2, False, grid)
    return labels, d2


_MOMENT_BLOCKS = 256  # row blocks of the moments pass, at most: the sum order depends on n only


def moments(X: Any) -> tuple[Any, Any, Any, int | None]:
    """Per-column mean, sum of squared deviations and largest absolute value (float64, shape
    (d,) each) of a block ``X`` ``(n, d)``, and the index of its first row holding a NaN or
    infinity (None if all are finite): two passes over X (cuda/fit.cu), partial sums added in
    a fixed order."""
    import cupy

    n, d = X.shape
    if n == 0:
        z = cupy.zeros(d, cupy.float64)
        return z, z.copy(), z.copy(), None
    kern = cuda_src.fit_kernels()
    col_pass = kern["col_pass_f32" if X.dtype == cupy.float32 else "col_pass_f64"]
    X = cupy.ascontiguousarray(X, dtype=X.dtype if X.dtype in (cupy.float32, cupy.float64) else cupy.float64)
    nb = int(min(_MOMENT_BLOCKS, -(-n // 256)))
    rows = -(-n // nb)
    parts = nb * 8
    psum, pmax = cupy.empty((parts, d), cupy.float64), cupy.empty((parts, d), cupy.float64)
    bad = cupy.full((), numpy.iinfo(numpy.uint64).max, cupy.uint64)
    mean, m2, max_abs = (cupy.empty(d, cupy.float64) for _ in range(3))
    grid, red = (nb, -(-d // 32)), (-(-d // 256),)
    scalars = (numpy.int64(n), numpy.int32(d), numpy.int64(rows))
    col_pass(grid, (256,), (X, *scalars, gpu_device.NULL, psum, pmax, bad))
    kern["col_reduce"](red, (256,), (psum, numpy.int32(parts), numpy.int32(d), numpy.int32(0), numpy.float64(n), mean))
    kern["col_reduce"](red, (256,), (pmax, numpy.int32(parts), numpy.int32(d), numpy.int32(1), numpy.float64(1), max_abs))
    col_pass(grid, (256,), (X, *scalars, mean, psum, gpu_device.NULL, gpu_device.NULL))
    kern["col_reduce"](red, (256,), (psum, numpy.int32(parts), numpy.int32(d), numpy.int32(0), numpy.float64(1), m2))
    first = int(bad)
    if first != numpy.iinfo(numpy.uint64).max:
        return mean, m2, max_abs, first
    if not numpy.isfinite(cupy.asnumpy(mean)).all():
        raise DataError("X has values too large to average in float64 (a column sum overflows); rescale the data")
    return mean, m2, max_abs, None


def sqdistances(X: Any, p: Prepared) -> Any:
    """Squared distances ``(n, K)`` from every row to every centroid (float64, clamped at 0)."""
    import cupy

    x64 = X.astype(cupy.float64)
    g = x64 @ (-2.0 * p.c64.T)
    g += (p.c64 * p.c64).sum(axis=1)
    g += (x64 * x64).sum(axis=1)[:, None]
    return cupy.maximum(g, 0.0)


# ---------------------------------------------------------------- Yinyang's bounds
# Array-module versions (backends/bounds.py) on CuPy arrays, but for the bounds of rows in the
# GEMM regime: their group minima come from the GEMM's own tiles (gpu_gemm.group_lower), not
# from float64 distances to every centroid (a float64 GEMM and a gather per piece of rows:
# the cost of the array version at wide K).


def row_sqnorms(X: Any) -> Any:
    """``||x||^2`` of every row, float64 ``(n,)``."""
    import cupy

    return bounds.row_sqnorms(cupy, X)


def centroid_drift(old: Any, new: Any) -> tuple[Any, float]:
    """Each centroid's move (rounded up) and the largest norm of ``new`` (:func:`.bounds.centroid_drift`)."""
    import cupy

    return bounds.centroid_drift(cupy, old, new)


def yinyang_filter(X: Any, p: Prepared, labels: Any, upper: Any, lower: Any, xnorm: Any, drift: Any, gdrift: Any,
                   cmax: float) -> Any:
    """Yinyang's global filter (:func:`.bounds.yinyang_filter`)."""
    import cupy

    return bounds.yinyang_filter(cupy, X, p.centroids, labels, upper, lower, xnorm, drift, gdrift, cmax)


def assign_bounds(X: Any, p: Prepared, group_of: Any, n_groups: int, xnorm: Any, cmax: float,
                  interrupt: Callable[[], None] | None = None) -> tuple:
    """:func:`assign`'s labels and Yinyang's bounds (``numpy_backend.assign_bounds``'s
    contract). In the GEMM regime the group bounds come from GEMM tiles of the centroids in
    group order (:func:`.gpu_gemm.group_lower`): each group's smallest tile value less the
    row's certified error bound, so they are looser than float64 distances' by that bound
    (rows within it of a tie stay uncertain, as the selection re-ranks them). Small K:
    :func:`.bounds.assign_bounds` (float64 distances)."""
    import sys

    import cupy

    if interrupt is not None:
        interrupt()
    n, d = X.shape
    if p.small is not None or n == 0:
        return bounds.assign_bounds(sys.modules[__name__], X, p, group_of, n_groups, xnorm, cmax)
    labels = assign(X, p, want_sums=False)["labels"]
    pg, starts, pos = _grouped(p, group_of, n_groups)
    lower = cupy.empty((n, n_groups), cupy.float64)
    rel, delta = bounds.margins(d, numpy.float64)
    gpu_gemm.group_lower(X, pg, starts, n_groups, pos[labels], xnorm, cmax, lower, rel, delta)
    return labels, bounds.upper_bounds(cupy, X, p.centroids, labels), lower


# The centroids of a step in group order, by the id of the step's Prepared, while it lives (a
# weakref.finalize drops the entry with it): one preparation per step and worker for all of
# the step's blocks, none kept after the step.
_GROUPED: dict = {}


def _grouped(p: Prepared, group_of: Any, t: int) -> tuple[Prepared, Any, Any]:
    """``p``'s centroids prepared in the order of their groups ``group_of`` (K,) (stable;
    without their float64 copy), the groups' first positions ``(t + 1,)`` int32 and each
    centroid's position ``(K,)`` int32; the same objects for every block of a step."""
    import cupy

    hit = _GROUPED.get(id(p))
    if hit is not None and hit[0] is group_of:
        return hit[1]
    k = p.centroids.shape[0]
    order = cupy.argsort(group_of, kind="stable")
    starts = cupy.zeros(t + 1, cupy.int32)
    starts[1:] = cupy.cumsum(cupy.bincount(group_of, minlength=t)[:t])
    pos = cupy.empty(k, cupy.int32)
    pos[order] = cupy.arange(k, dtype=cupy.int32)
    pg = gpu_gemm.prepare(cupy.ascontiguousarray(p.centroids[order]), cupy.ascontiguousarray(p.c64[order]),
                          p.precision, p.layout, p.tunables, fused_copy=False)
    # Only gpu_gemm.group_lower reads it: its GEMM inputs and norms, never a selection's
    pg = dataclasses.replace(pg, c64=None, fused=None)
    out = (pg, starts, pos)
    if hit is None:
        weakref.finalize(p, _GROUPED.pop, id(p), None)
    _GROUPED[id(p)] = (group_of, out)
    return out


def add_label_sums(X: Any, labels: Any, sample_weight: Any, sign: int, grid: Grid, sums: Any, weights: Any,
                   counts: Any, qsums: Any = None, xnorm: Any = None) -> None:
    """The rows' values on the grid added (``sign``) to their labels' sums (:func:`.bounds.add_label_sums`)."""
    import cupy

    bounds.add_label_sums(cupy, X, labels, sample_weight, sign, grid, sums, weights, counts, qsums, xnorm)


def owner_inertia(X: Any, p: Prepared, labels: Any, sample_weight: Any = None) -> Any:
    """The rows' inertia under ``labels`` (0-d float64; its sum order CuPy's)."""
    import cupy

    return bounds.owner_inertia(cupy, X, p.centroids, labels, sample_weight)
