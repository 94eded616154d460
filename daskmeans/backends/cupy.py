"""CuPy kernels: the same contract as :mod:`daskmeans.backends.numpy`, on the GPU.

Per row tile: cuBLAS GEMM ``X (-2C)^T`` (cupy matmul), then one warp per row takes the fp32
argmin (lowest index on ties) and ``||x||^2``; per-cluster float64 sums come from one pass over
the tile, with block-private shared-memory accumulators when K x D is small and float64 atomics
otherwise. The fully fused regimes (no N x K tile in HBM) are tracked separately.
CuPy is imported lazily so that importing daskmeans never needs a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy

from .. import config


def __getattr__(attr: str) -> Any:
    if attr == "xp":
        import cupy

        return cupy
    raise AttributeError(attr)


name = "cupy"


def asarray(block: Any, dtype: Any = None) -> Any:
    import cupy

    return cupy.ascontiguousarray(cupy.asarray(block, dtype=dtype))


def to_numpy(a: Any) -> numpy.ndarray:
    import cupy

    return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else numpy.asarray(a)


@dataclass(frozen=True)
class Prepared:
    centroids: Any  # (K, D) cupy, data dtype
    neg2_ct: Any  # (D, K)
    sqnorm: Any  # (K,)

    @property
    def k(self) -> int:
        return self.centroids.shape[0]


def prepare(centroids: Any, dtype: Any) -> Prepared:
    import cupy

    c = cupy.ascontiguousarray(cupy.asarray(centroids, dtype=dtype))
    c64 = c.astype(cupy.float64)
    sq = (c64 * c64).sum(axis=1).astype(dtype)
    return Prepared(c, cupy.ascontiguousarray((-2 * c).T), sq)


_ARGMIN_SRC = r"""
extern "C" __global__ void argmin_rows(const float* __restrict__ G, const float* __restrict__ csq,
                                       const float* __restrict__ X, int D, long long rows, int K,
                                       int* __restrict__ labels, double* __restrict__ d2) {
    // One warp per row of the GEMM tile G = X (-2 C)^T: min over k of G[r,k] + ||c_k||^2
    // in float32, exactly as the NumPy backend rounds it; the lowest index wins ties.
    long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float* g = G + r * (long long)K;
    float best = __int_as_float(0x7f800000);
    int bi = 0x7fffffff;
    for (int k = lane; k < K; k += 32) {
        float v = g[k] + csq[k];
        if (v < best) { best = v; bi = k; }
    }
    const float* x = X + r * (long long)D;
    double sq = 0.0;
    for (int j = lane; j < D; j += 32) { double v = (double)x[j]; sq += v * v; }
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, best, off);
        int oi = __shfl_down_sync(0xffffffffu, bi, off);
        if (ov < best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        sq += __shfl_down_sync(0xffffffffu, sq, off);
    }
    if (lane == 0) {
        labels[r] = bi;
        double v = (double)best + sq;
        d2[r] = v > 0.0 ? v : 0.0;
    }
}
"""


_SUMS_SRC = r"""
// Per-cluster float64 sums of rows. X (rows x D, T = float or double) is read once, coalesced
// (thread e handles element e of the flattened tile). "shared": block-private K x D
// accumulators in shared memory, written as one partial per block and reduced in a fixed
// order on the host side (no global atomics; for small K x D). "global": float64 atomics into
// the K x D sums (large K, where collisions are rare).
// Calls add(cluster * D + d, value) for every element of the tile, grid-strided.
template <typename Add>
__device__ __forceinline__ void for_each_element(const T* __restrict__ X, const int* __restrict__ lab,
                                                 const double* __restrict__ w, int has_w,
                                                 long long rows, int D, Add add) {
    long long total = rows * (long long)D;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        long long r = e / D;
        int d = (int)(e - r * D);
        double v = (double)X[e];
        if (has_w) v *= w[r];
        add((long long)lab[r] * D + d, v);
    }
}

extern "C" __global__ void sums_shared(const T* __restrict__ X, const int* __restrict__ lab,
                                       const double* __restrict__ w, int has_w, long long rows,
                                       int D, int K, double* __restrict__ out) {
    extern __shared__ double sh[];
    int KD = K * D;
    for (int i = threadIdx.x; i < KD; i += blockDim.x) sh[i] = 0.0;
    __syncthreads();
    for_each_element(X, lab, w, has_w, rows, D, [&](long long i, double v) { atomicAdd(&sh[i], v); });
    __syncthreads();
    double* o = out + (long long)blockIdx.x * KD;
    for (int i = threadIdx.x; i < KD; i += blockDim.x) o[i] = sh[i];
}

extern "C" __global__ void sums_global(const T* __restrict__ X, const int* __restrict__ lab,
                                       const double* __restrict__ w, int has_w, long long rows,
                                       int D, double* __restrict__ sums) {
    for_each_element(X, lab, w, has_w, rows, D, [&](long long i, double v) { atomicAdd(&sums[i], v); });
}
"""
_SHARED_MAX_DOUBLES = 6144  # 48 KiB of shared memory per block
_MODULES: dict = {}


def _sums_kernels(dtype):
    import cupy

    key = numpy.dtype(dtype).name
    if key not in _MODULES:
        t = "float" if key == "float32" else "double"
        _MODULES[key] = cupy.RawModule(code=f"#define T {t}\n" + _SUMS_SRC, options=("--std=c++17",))
    m = _MODULES[key]
    return m.get_function("sums_shared"), m.get_function("sums_global")


@functools.lru_cache(maxsize=None)
def _sm_count(device_id: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def _accumulate(xt, lab, wt, sums):
    """Add the rows of ``xt`` (weighted by ``wt``) into ``sums[lab]`` (float64, K x D)."""
    import cupy

    rows, d = xt.shape
    k = sums.shape[0]
    shared, glob = _sums_kernels(xt.dtype)
    w = wt if wt is not None else cupy.empty(1, cupy.float64)
    has_w = cupy.int32(wt is not None)
    threads = 256
    blocks_needed = (rows * d + threads - 1) // threads
    sm = _sm_count(cupy.cuda.Device().id)
    if k * d <= _SHARED_MAX_DOUBLES:
        nb = int(max(1, min(blocks_needed, 4 * sm)))
        out = cupy.empty((nb, k * d), cupy.float64)
        shared((nb,), (threads,), (xt, lab, w, has_w, cupy.int64(rows), cupy.int32(d), cupy.int32(k), out),
               shared_mem=k * d * 8)
        sums += out.sum(axis=0).reshape(k, d)
    else:
        nb = int(max(1, min(blocks_needed, 32 * sm)))
        glob((nb,), (threads,), (xt, lab, w, has_w, cupy.int64(rows), cupy.int32(d), sums))


def _argmin_kernel():
    import cupy

    global _ARGMIN
    if "_ARGMIN" not in globals():
        _ARGMIN = cupy.RawKernel(_ARGMIN_SRC, "argmin_rows")
    return _ARGMIN


def _tile_rows(k: int, itemsize: int) -> int:
    # GPU tiles are larger than CPU cache tiles: 16x the CPU budget keeps the GEMM efficient.
    return max(1024, 16 * config.get_bytes("tile-bytes") // max(1, k * itemsize))


def _tile_nearest(xt, p):
    import cupy

    g = xt @ p.neg2_ct
    if g.dtype == cupy.float32:
        rows, k = g.shape
        lab = cupy.empty(rows, cupy.int32)
        d2 = cupy.empty(rows, cupy.float64)
        threads = 256
        blocks = (rows * 32 + threads - 1) // threads
        _argmin_kernel()(
            (blocks,), (threads,), (g, p.sqnorm, xt, cupy.int32(xt.shape[1]), cupy.int64(rows), cupy.int32(k), lab, d2)
        )
        return lab, d2
    xt64 = xt.astype(cupy.float64)
    xsq = (xt64 * xt64).sum(axis=1)
    g += p.sqnorm
    lab = g.argmin(axis=1).astype(cupy.int32)
    d2 = g[cupy.arange(len(lab)), lab].astype(cupy.float64)
    d2 += xsq
    cupy.maximum(d2, 0.0, out=d2)
    return lab, d2


def min_sqdist(X, p):
    import cupy

    n = X.shape[0]
    labels = cupy.empty(n, cupy.int32)
    d2 = cupy.empty(n, cupy.float64)
    step = _tile_rows(p.k, X.dtype.itemsize)
    for s in range(0, n, step):
        labels[s : s + step], d2[s : s + step] = _tile_nearest(X[s : s + step], p)
    return labels, d2


def assign(X, p, sample_weight=None, want_sums: bool = True) -> dict[str, Any]:
    import cupy

    n, d = X.shape
    k = p.k
    labels = cupy.empty(n, cupy.int32)
    inertia = cupy.zeros((), cupy.float64)
    if want_sums:
        sums = cupy.zeros((k, d), cupy.float64)
    step = _tile_rows(k, X.dtype.itemsize)
    for s in range(0, n, step):
        xt = X[s : s + step]
        wt = None if sample_weight is None else sample_weight[s : s + step].astype(cupy.float64)
        lab, d2 = _tile_nearest(xt, p)
        labels[s : s + step] = lab
        inertia += d2.sum() if wt is None else d2 @ wt
        if want_sums:
            _accumulate(xt, lab, wt, sums)
    out: dict[str, Any] = {"labels": labels, "inertia": float(inertia)}
    if want_sums:
        counts = cupy.bincount(labels, minlength=k).astype(cupy.int64)
        weights = (
            counts.astype(cupy.float64)
            if sample_weight is None
            else cupy.bincount(labels, weights=sample_weight.astype(cupy.float64), minlength=k)
        )
        out.update(sums=sums, weights=weights, counts=counts)
    return out


def sqdistances(X, p):
    """Squared distances ``(n, K)`` from every row to every centroid (float64, clamped at 0)."""
    import cupy

    g = (X @ p.neg2_ct).astype(cupy.float64)
    g += p.sqnorm
    x64 = X.astype(cupy.float64)
    g += (x64 * x64).sum(axis=1)[:, None]
    return cupy.maximum(g, 0.0)
