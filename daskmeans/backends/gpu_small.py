"""The fused small-K regime of the CuPy backend: one ``fused_small`` pass over X (float64
distances, argmin, labels, block-private sums in registers or shared memory, one partial per
block) and ``reduce_parts`` summing the partials in a fixed order. No GEMM, no N x K tile, no
global atomics. Chosen where K x D fits (:func:`.gpu_plan.small_config`)."""

from __future__ import annotations

from typing import Any

from . import cuda_src, gpu_device, gpu_plan
from .gpu_device import ptr
from .gpu_plan import THREADS, Prepared

_PLANS: dict = {}


def _kernels(dtype: Any, small: tuple, d: int, mode: int = 0) -> tuple:
    lanes, dpl, kacc, tred, creg = small
    return cuda_src.small_kernels(dtype, lanes, dpl, kacc, tred, THREADS, mode, creg, d == lanes * dpl)


def compiles(small: tuple, d: int, dtype: Any, mode: int = 0) -> list:
    """The compile call of the fused kernel a fit launches (``small``: a
    :func:`.gpu_plan.small_config`; ``mode`` 1: labels only, as :func:`min_sqdist`'s callers
    launch it), for :func:`.cupy_backend.warm`."""
    return [lambda: _kernels(dtype, small, d, mode)]


def _plan(X: Any, p: Prepared, mode: int = 0) -> tuple:
    """Launch plan of the fused kernel (``mode`` 0 fused, 1 labels only) for a block:
    ``(kern, reduce, shared, nb, width, scalars)``, cached per shape, dtype, configuration and
    device: building it is Python work comparable to a small block's whole step."""
    import cupy

    n, d = X.shape
    dev = gpu_device.device_id()
    key = (n, d, X.dtype.char, p.k, p.small, mode, dev)
    plan = _PLANS.get(key)
    if plan is None:
        k = p.k
        lanes, dpl, kacc, tred, creg = p.small
        kern, reduce = _kernels(X.dtype, p.small, d, mode)
        shared = gpu_plan.shared_bytes(k, lanes, dpl, creg, mode)
        if shared > gpu_plan.SHARED_BYTES:  # past the default 48 KiB: opt in (CREG's group sums)
            kern.max_dynamic_shared_size_bytes = shared
        # Every resident block slot filled once (a persistent grid): the partials to reduce
        # grow with the grid, not with n.
        slots = gpu_device.blocks_per_sm(kern, THREADS, shared) * gpu_device.sm_count(dev)
        nb = int(max(1, min(slots, -(-n // (THREADS // lanes)))))
        width = k * d + 2 * k + 2
        scalars = (cupy.int64(n), cupy.int32(d), cupy.int32(k), cupy.int32(nb), cupy.int32(width), cupy.int32(k * d))
        if len(_PLANS) > 1024:  # many block shapes (e.g. predictions on varied arrays)
            _PLANS.clear()
        plan = _PLANS[key] = (kern, reduce, shared, nb, width, scalars)
    return plan


def run(X: Any, p: Prepared, w: Any, prev: Any, labels: Any, d2: Any, want_sums: bool, grid: Any = None) -> dict:
    """Labels (into ``labels``), distances (into ``d2`` where given), inertia and reassigned
    count, and with ``want_sums`` the block's sums, weights and counts (see
    ``cupy_backend.assign``)."""
    import cupy

    k, d = p.k, X.shape[1]
    # Without sums, the labels-only variant (MODE 1: no accumulators, more rows in flight).
    kern, reduce, shared, nb, width, (n64, d32, k32, nb32, width32, kd32) = _plan(X, p, 0 if want_sums else 1)
    part = cupy.empty((nb, width), cupy.int64) if want_sums else None
    pstat = None if want_sums else cupy.empty((nb, 2), cupy.float64)
    scales, ws = (grid.scales(cupy), grid.wscale) if want_sums else (None, 0.0)
    kern(
        (nb,), (THREADS,),
        (X, n64, d32, k32, p.c64, ptr(w), ptr(scales), cupy.float64(ws), ptr(prev), ptr(labels), ptr(d2),
         ptr(part), ptr(pstat)),
        shared_mem=shared,
    )
    if not want_sums:
        st = pstat.sum(axis=0)
        return {"inertia": st[0], "reassigned": st[1], "rechecked": 0}
    kd = k * d
    tot = cupy.empty(kd + 2 * k, cupy.int64)
    stat = cupy.empty(2, cupy.float64)
    # One warp per column.
    reduce((-(-width * 32 // 256),), (256,), (part, nb32, width32, k32, kd32, tot, stat))
    counts = tot[kd + k :]
    return {
        "sums": tot[:kd].reshape(k, d),
        "weights": tot[kd : kd + k] if w is not None else grid.unit_weights(counts),
        "counts": counts,
        "inertia": stat[0],
        "reassigned": stat[1],
        "rechecked": 0,
    }
