"""Per-cluster sums of a labelled block on the GPU (the GEMM regime's second pass): rows in
label order by a counting sort, then run-length accumulation along runs of equal labels
(``sorted_sums``: one integer atomic per run and column instead of one per element)."""

from __future__ import annotations

from typing import Any

import numpy

from . import cuda_src, gpu_device
from .gpu_device import ptr
from .gpu_plan import HIST_MAX_K


def label_sums(X: Any, labels: Any, w: Any, k: int, grid: Any, C: Any = None, stat: Any = None) -> dict:
    """Per-cluster sums ``(K, d)`` and weights ``(K,)`` (int64 on ``grid``) and int64 counts
    ``(K,)`` of a block ``X`` ``(n, d)`` labelled by ``labels`` ``(n,)``. With centroids ``C``
    and ``stat``, the same pass adds the block's inertia (exact float64 distances) to
    ``stat[0]``."""
    import cupy

    n, d = X.shape
    kernels = cuda_src.sums_kernels(X.dtype)
    sm = gpu_device.sm_count(gpu_device.device_id())
    blocks_max = 8 * sm
    perm = cupy.empty(n, cupy.int64)
    slab = cupy.empty(n, cupy.int32)
    weights = None
    if k <= HIST_MAX_K:
        # Block-local counters: per-block label histograms, each label's offsets over the
        # blocks and its base (an exclusive scan over labels), then each block scatters its
        # rows. Our own kernels: no CuPy kernel to compile on a cold cache, no host round trip.
        hist_k, scatter_k = kernels["label_hist"], kernels["label_scatter"]
        offsets_k, bases_k = kernels["label_block_offsets"], kernels["label_bases"]
        nblk = int(max(1, min(2 * sm, -(-n // 4096))))
        rows = -(-n // nblk)
        hist = cupy.empty((nblk, k), cupy.int32)
        args = (labels, cupy.int64(n), cupy.int32(k), cupy.int64(rows))
        hist_k((nblk,), (512,), args + (hist,), shared_mem=4 * k)
        off = cupy.empty((nblk, k), cupy.int64)
        counts = cupy.empty(k, cupy.int64)
        base = cupy.empty(k, cupy.int64)
        offsets_k((-(-k // 256),), (256,), (hist, cupy.int32(nblk), cupy.int32(k), off, counts))
        if w is None:
            weights = cupy.empty(k, cupy.int64)
        bases_k((1,), (1024,), (counts, cupy.int32(k), cupy.int32(-grid.wexp if w is None else -1), base,
                                ptr(weights)))
        scatter_k((nblk,), (512,), args + (off, base, perm, slab), shared_mem=4 * k)
    else:
        # Global counters. Not cupy.bincount: it synchronises with the host twice (the labels'
        # minimum and maximum), stalling the launches queued behind it.
        counts = cupy.zeros(k, cupy.uint64)  # atomicAdd has no signed 64-bit form
        cupy.add.at(counts, labels, numpy.uint64(1))
        cursor = cupy.cumsum(counts) - counts
        kernels["scatter_by_label"]((int(max(1, min(blocks_max, -(-n // 256)))),), (256,),
                                    (labels, cupy.int64(n), cursor, perm, slab))
    sums = cupy.zeros((k, d), cupy.int64)
    nb = int(max(1, min(blocks_max, -(-n // (8 * 32)))))  # 8 warps of 32 sorted rows
    kernels["sorted_sums"]((nb,), (256,), (X, cupy.int32(d), cupy.int64(n), perm, slab, ptr(w), ptr(C), grid.scales(cupy), sums,
                                ptr(stat)))
    counts = counts.astype(cupy.int64, copy=False)
    if w is None:
        if weights is None:
            weights = grid.unit_weights(counts)
    else:  # on the grid (integer atomics: any order, the same bits); weights are never negative
        weights = cupy.zeros(k, cupy.uint64)
        cupy.add.at(weights, labels, cupy.rint(w * grid.wscale).astype(cupy.uint64))
        weights = weights.view(cupy.int64)
    return {"sums": sums, "weights": weights, "counts": counts}
