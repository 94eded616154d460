"""CUDA C++ sources of the CuPy backend's kernels, and their compile cache.

Pure source text and compilation (NVRTC through ``cupy.RawModule``, cached by CuPy on disk
too); the host-side logic that chooses and launches them is :mod:`daskmeans.backends.cupy`.

The kernels (see that module for when each runs):

``fused_small``
    One pass over X, nothing else: each group of ``L`` lanes holds one row (``DPL`` values
    per lane, float64), computes its float64 distance to every centroid, the argmin (lowest
    index wins ties), and accumulates the row into block-private float64 sums. Where K x DPL
    values fit in registers (``KACC`` = K): the centroids in registers and each lane group's
    sums in its own slice of shared memory (``CREG``), or the centroids in shared memory and
    the sums in registers; otherwise both in shared memory. Each block writes one partial
    (sums, weights, counts, inertia, reassigned) which ``reduce_parts`` sums in a fixed order:
    no global atomics.
``gemm_prep``
    Before each GEMM tile: the tile's rows as the GEMM reads them (rounded to nearest TF32 or
    bfloat16, or split into TF32 high and low parts for fp32 precision on tensor cores) and
    each row's certified error bound, from the row's norm and its actual rounding residual.
``select_rows``
    After the GEMM tile ``G = alpha * X C^T`` (alpha = -2): one warp per row takes the top-2
    of ``G + ||c||^2`` (16-byte loads), certifies the winner with the row's error bound, and
    re-ranks the uncertain rows by exact float64 distances to the few candidates that the
    bound cannot exclude (found by a second scan of the row).
``select_cols``
    The same selection on a column-major tile (cuBLAS writing G^T), a thread per 1, 2 or 4
    rows: chosen for float32 tiles in fp32 precision with K <= 2048 where the tile has rows
    enough for three blocks per SM (``_select_layout``).
``gemm_top2`` / ``finish_top2``
    The fused fp32 GEMM regime (off by default, ``daskmeans.gpu-fused-gemm-max-d: 0``: slower
    than cuBLAS + ``select_cols`` on an H200): a 128 x 128 x 8 FFMA tile GEMM whose epilogue
    keeps, per row, the two best (value, index) pairs and the third value of
    ``||c||^2 - 2 x.c`` across all centroid tiles (the N x K distances never leave the chip); then one warp per row certifies
    the winner with the error bound, or re-ranks {i1, i2}, or (three or more candidates)
    every centroid by exact float64 distances.
``label_hist`` / ``label_scatter`` (or ``scatter_by_label``, large K) / ``sorted_sums``
    Per-cluster float64 sums once the labels are known: the rows ordered by label (a
    block-local counting sort, or global counters for large K), then register accumulation
    along runs of equal labels, one atomic add per run and column instead of one per element.
"""

from __future__ import annotations

from typing import Any

_COMMON = r"""
#define FULL 0xffffffffu
__device__ __forceinline__ double warp_sum(double v) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL, v, off);
    return v;
}
// Exact squared distance of two D-vectors (float64), lanes striding over D, warp-reduced.
template <typename V>
__device__ __forceinline__ double exact_d2(const V* __restrict__ x, const V* __restrict__ c, int D, int lane) {
    double s = 0.0;
    for (int j = lane; j < D; j += 32) { const double t = (double)x[j] - (double)c[j]; s = fma(t, t, s); }
    return warp_sum(s);
}
// A row's running top-2 (value, index) pairs and third value, lowest index first on equal
// values. Insert (v, k), k larger than every index this thread has seen.
template <typename V>
__device__ __forceinline__ void ins3(V v, int k, V& b1, int& i1, V& b2, int& i2, V& b3) {
    if (v < b1) { b3 = b2; b2 = b1; i2 = i1; b1 = v; i1 = k; }
    else if (v < b2) { b3 = b2; b2 = v; i2 = k; }
    else if (v < b3) { b3 = v; }
}
// The same insertion without branches (selects only): in the streaming scans a warp's lanes
// insert at different values, and the divergent ins3 made select_rows issue-bound (ncu, P2
// tf32: 0.66 issued per scheduler-cycle, 19.5 active threads per warp).
template <typename V>
__device__ __forceinline__ void ins3_sel(V v, int k, V& b1, int& i1, V& b2, int& i2, V& b3) {
    const bool c1 = v < b1, c2 = v < b2, c3 = v < b3;  // c1 => c2 => c3
    b3 = c2 ? b2 : (c3 ? v : b3);
    b2 = c1 ? b1 : (c2 ? v : b2);
    i2 = c1 ? i1 : (c2 ? k : i2);
    b1 = c1 ? v : b1;
    i1 = c1 ? k : i1;
}
// Merge another sorted state (c1, j1, c2, j2, c3): the three smallest values of the union and
// the indices of the first two, in (value, index) order: associative and commutative.
template <typename V>
__device__ __forceinline__ void merge3(V& b1, int& i1, V& b2, int& i2, V& b3, V c1, int j1, V c2, int j2, V c3) {
    if (c1 < b1 || (c1 == b1 && j1 < i1)) {
        V t = b1; b1 = c1; c1 = t; int u = i1; i1 = j1; j1 = u;
        t = b2; b2 = c2; c2 = t; u = i2; i2 = j2; j2 = u;
        t = b3; b3 = c3; c3 = t;
    }
    if (c1 < b2 || (c1 == b2 && j1 < i2)) { b3 = b2 < c2 ? b2 : c2; b2 = c1; i2 = j1; }
    else { b3 = b3 < c1 ? b3 : c1; }
}
template <typename V>
__device__ __forceinline__ void shfl_merge3(V& b1, int& i1, V& b2, int& i2, V& b3, int off) {
    const V c1 = __shfl_xor_sync(FULL, b1, off), c2 = __shfl_xor_sync(FULL, b2, off);
    const V c3 = __shfl_xor_sync(FULL, b3, off);
    const int j1 = __shfl_xor_sync(FULL, i1, off), j2 = __shfl_xor_sync(FULL, i2, off);
    merge3(b1, i1, b2, i2, b3, c1, j1, c2, j2, c3);
}
// Row r's label and distance (one lane per row), and the running inertia and moved count.
__device__ __forceinline__ void row_out(long long r, int best, double bd, const double* __restrict__ w,
                                        const int* prev, int* labels, double* __restrict__ d2,
                                        double& inert, double& moved) {
    const double wr = w ? w[r] : 1.0;
    const int old = prev ? prev[r] : -1;  // read before the write: labels may alias prev
    if (labels) labels[r] = best;
    if (d2) d2[r] = bd;
    inert += wr * bd;
    moved += (prev == nullptr || old != best) ? 1.0 : 0.0;
}
// One warp's inertia, moved and re-checked counts into the kernel's three global totals.
__device__ __forceinline__ void stat_out(double* stat, double inert, double moved, double checked) {
    atomicAdd(stat, inert);
    atomicAdd(stat + 1, moved);
    atomicAdd(stat + 2, checked);
}
"""

SMALL_SRC = _COMMON + r"""
// Compile-time: T (data type), L (lanes per row, a power of 2 <= 32), DPL (values per lane),
// DFULL (D = L x DPL: no padding columns),
// KACC (K when each lane's K x DPL values fit in registers: the accumulators, or with CREG
// the centroids; else 0), NT (threads per block),
// U (rows per group per loop trip), TRED (KACC > 0 only: the K distances are reduced
// transposed, KP = K rounded up to a power of 2, at most L), MINB (resident blocks per SM
// the register allocation must allow), MODE (0: the fused pass; 1: labels, distances, inertia
// and moved count only: no accumulators, so fewer registers and more rows in flight),
// CREG (KACC > 0 only: each lane holds its K x DPL centroid values in registers and each group
// of L lanes accumulates its rows into a private slice of shared memory, summed over the
// groups in a fixed order at the end; else the centroids are in shared memory and the sums in
// registers. 64-bit shared loads are served per half-warp, so with L = 16 the two groups of a
// warp each paid for their own K x DPL centroid reads per row: ncu, S1, 37M of 46M L1
// wavefronts).
#define NG (NT / L)
#define DP (L * DPL)
#define DX (DFULL ? DP : D)  // the row stride, a compile-time constant where D = DP
// CREG: a group's slice of shared memory, K x DP sums, K weights, K counts (weights only with
// sample weights; else the counts are the weights). Groups of L >= 2 lanes: slices one after
// another, an odd number of doubles apart. One lane per row: the slices interleaved (element e
// of group g at e x NG + g), so that the 32 lanes' accesses are consecutive words whatever
// cluster each row went to; contiguous slices met random bank conflicts (S2 kernel, H200:
// 0.085 ms, no faster than register accumulators; interleaved 0.076).
#define GE (KACC * (DP + 2))  // elements of a slice
#if L == 1
#define GS GE
#define GIX(e) ((e) * NG)
#else
#define GS (GE | 1)
#define GIX(e) (e)
#endif
#define RACC (KACC > 0 && MODE != 1 && !CREG)  // register accumulators
#if CREG
#define CEN(k, j) cen[k][j]
#else
#define CEN(k, j) cs[(k) * DP + lane + (j) * L]
#endif
#if MINB > 1
#define BOUNDS __launch_bounds__(NT, MINB)
#else
#define BOUNDS __launch_bounds__(NT)
#endif
extern "C" __global__ void BOUNDS fused_small(
        const T* __restrict__ X, long long n, int D, int K,
        const double* __restrict__ C,      // K x D centroids (data-dtype values, as float64)
        const double* __restrict__ w,      // n sample weights, or NULL
        const int* prev,                   // n previous labels, or NULL
        int* labels,                       // n, or NULL; may alias prev (so neither is __restrict__)
        double* __restrict__ d2,           // n squared distances, or NULL
        double* __restrict__ part,         // gridDim.x x (K*D + 2K + 2) block partials, or NULL
        double* __restrict__ pstat) {      // gridDim.x x 2 (inertia, reassigned): MODE 1, or MODE 0 without part
    extern __shared__ double sh[];
    const int lane = threadIdx.x % L;
#if CREG
    // Shared: NG x GS group slices (MODE 0 only), K weights, K counts, 2 scalars.
    double* ssum = sh;
    double* sw = ssum + (MODE == 1 ? 0 : NG * GS);
    double* gsum = ssum + (L == 1 ? threadIdx.x : (threadIdx.x / L) * GS);  // this group's slice, at GIX(e)
    for (int i = threadIdx.x; i < (MODE == 1 ? 0 : NG * GS); i += NT) ssum[i] = 0.0;
    double cen[KACC][DPL];
    #pragma unroll
    for (int k = 0; k < KACC; ++k) {
        #pragma unroll
        for (int j = 0; j < DPL; ++j) {
            const int col = lane + j * L;
            cen[k][j] = col < D ? C[(long long)k * D + col] : 0.0;  // L = 1: uniform registers
        }
    }
#else
    double* cs = sh;                 // K x DP centroids, zero padded past D
    double* ssum = cs + K * DP;      // K x DP block sums (none in MODE 1)
    double* sw = ssum + (MODE == 1 ? 0 : K * DP);  // K block weights
    for (int i = threadIdx.x; i < K * DP; i += NT) {
        int k = i / DP, j = i - k * DP;
        cs[i] = j < D ? C[(long long)k * D + j] : 0.0;
        if (MODE != 1) ssum[i] = 0.0;
    }
#endif
    double* scnt = sw + K;           // K block counts (exact in float64 below 2^53)
    double* sst = scnt + K;          // inertia, reassigned
    const bool want = MODE != 1 && part != nullptr;
    for (int i = threadIdx.x; i < 2 * K + 2; i += NT) sw[i] = 0.0;
    __syncthreads();

    const int gw = (threadIdx.x & 31) / L;                       // group within the warp
    const long long warp = ((long long)blockIdx.x * NT + threadIdx.x) >> 5;
    const long long nwarp = ((long long)gridDim.x * NT) >> 5;
#if RACC
    double acc[KACC][DPL];
    double accw[KACC];  // only with sample weights (else the count is the weight)
    int accn[KACC];
    #pragma unroll
    for (int k = 0; k < KACC; ++k) {
        accw[k] = 0.0; accn[k] = 0;
        #pragma unroll
        for (int j = 0; j < DPL; ++j) acc[k][j] = 0.0;
    }
#endif
    double inert = 0.0, moved = 0.0;
    // U rows per group per trip: their loads are all issued before the first use
    // (memory-level parallelism). For one lane per row, one loop body in two passes: the warp's
    // whole trips without row checks, then at most one partial trip whose rows past n are
    // masked (S2: the checks and 64-bit row addresses were a fifth of the instructions per
    // row). With L >= 2 lanes per row those costs are shared, and with register accumulators
    // the second copy of the body costs registers (S1: 122 -> 132, one block per SM fewer;
    // S2 with shared centroids: 128 -> 139), so there is only the checked pass. The loop
    // bounds are uniform across the warp, so the width-L shuffles below always see every lane.
    const long long RW = (32 / L) * U;  // rows per warp trip
    long long base = warp * RW;
    #pragma unroll
    for (int pass = L == 1 && !RACC ? 0 : 1; pass < 2; ++pass) {
    const bool tail = pass == 1;
    for (; tail ? base < n : base + RW <= n; base += nwarp * RW) {
        T xr[U][DPL];
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long r = base + u * (32 / L) + gw;
            #pragma unroll
            for (int j = 0; j < DPL; ++j) {
                const int col = lane + j * L;
                xr[u][j] = ((!tail || r < n) && (DFULL || col < D)) ? X[r * DX + col] : (T)0;
            }
        }
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long r = base + u * (32 / L) + gw;
            const bool valid = !tail || r < n;
            double xv[DPL];
            #pragma unroll
            for (int j = 0; j < DPL; ++j) xv[j] = (double)xr[u][j];
            double best = __longlong_as_double(0x7ff0000000000000ll);
            int bk = 0;
#if TRED
            double s[KP];
            #pragma unroll
            for (int k = 0; k < KP; ++k) {
                double a = 0.0;
                if (k < KACC) {
                    #pragma unroll
                    for (int j = 0; j < DPL; ++j) {
                        const double t = xv[j] - CEN(k, j);
                        a = fma(t, t, a);
                    }
                }
                s[k] = a;
            }
            // Reduce-scatter: each step halves the k range a lane keeps and adds its partner's
            // share of it (KP - 1 + log2(L / KP) shuffles in all, not K log2 L); then a butterfly over the
            // lanes that hold the same k. Every k is summed by the same tree (up to the order
            // of two operands), so equal centroids give equal distances.
            int kb = 0;
            #pragma unroll
            for (int h = KP / 2, off = L / 2; h >= 1; h >>= 1, off >>= 1) {  // h: k values halved
                const bool up = (lane & off) != 0;
                #pragma unroll
                for (int i = 0; i < h; ++i) {
                    const double send = up ? s[i] : s[i + h];
                    const double keep = up ? s[i + h] : s[i];
                    s[i] = keep + __shfl_xor_sync(FULL, send, off, L);
                }
                if (up) kb += h;
            }
            #pragma unroll
            for (int off = L / (2 * KP); off > 0; off >>= 1) s[0] += __shfl_xor_sync(FULL, s[0], off, L);
            bk = kb;
            if (kb < K) best = s[0];  // padding k (>= K) keep +inf
            #pragma unroll
            for (int off = L / KP; off < L; off <<= 1) {  // argmin over the lanes' k, lowest on ties
                const double ob = __shfl_xor_sync(FULL, best, off, L);
                const int ok = __shfl_xor_sync(FULL, bk, off, L);
                if (ob < best || (ob == best && ok < bk)) { best = ob; bk = ok; }
            }
#else
#if KACC > 0
            #pragma unroll
            for (int k = 0; k < KACC; ++k) {
#else
            for (int k = 0; k < K; ++k) {
#endif
                double s = 0.0;
                #pragma unroll
                for (int j = 0; j < DPL; ++j) { double t = xv[j] - CEN(k, j); s = fma(t, t, s); }
                // Butterfly: every lane of the group ends with the same (commutative) sum.
                #pragma unroll
                for (int off = L / 2; off > 0; off >>= 1) s += __shfl_xor_sync(FULL, s, off, L);
                // k = 0 taken as is: comparing it with +inf cost ~5 instructions per row (the
                // compiler's NaN handling); distances of finite rows are never NaN.
                if (k == 0 || s < best) { best = s; bk = k; }
            }
#endif
            if (!valid) continue;
            const double wr = w ? w[r] : 1.0;
            if (lane == 0) {
                const int old = prev ? prev[r] : -1;
                if (labels) labels[r] = bk;
                if (d2) d2[r] = best;
                inert += wr * best;
                moved += (prev == nullptr || old != bk) ? 1.0 : 0.0;
            }
            if (!want) continue;
#if MODE == 1
        }
    }
    }
#else
#if CREG
            {
                double* o = gsum + GIX(bk * DP + lane);  // this group's slice: no other writer
                #pragma unroll
                for (int j = 0; j < DPL; ++j) o[GIX(j * L)] = fma(wr, xv[j], o[GIX(j * L)]);
                if (lane == 0) {
                    if (w) gsum[GIX(KACC * DP + bk)] += wr;
                    gsum[GIX(KACC * (DP + 1) + bk)] += 1.0;
                }
            }
#elif KACC > 0
            #pragma unroll
            for (int k = 0; k < KACC; ++k) {
                if (k == bk) {
                    #pragma unroll
                    for (int j = 0; j < DPL; ++j) acc[k][j] = fma(wr, xv[j], acc[k][j]);
                    if (w) accw[k] += wr;
                    accn[k] += 1;
                }
            }
#else
            double* o = ssum + bk * DP + lane;
            #pragma unroll
            for (int j = 0; j < DPL; ++j) if (lane + j * L < D) atomicAdd(o + j * L, wr * xv[j]);
            if (lane == 0) { atomicAdd(sw + bk, wr); atomicAdd(scnt + bk, 1.0); }
#endif
        }
    }
    }
#endif
    // Block reduction in a fixed order: shuffle across the groups of a warp, then warps one
    // after another.
    inert = warp_sum(inert);
    moved = warp_sum(moved);
#if RACC
    #pragma unroll
    for (int k = 0; k < KACC; ++k) {
        #pragma unroll
        for (int off = 16; off >= L; off >>= 1) {
            #pragma unroll
            for (int j = 0; j < DPL; ++j) acc[k][j] += __shfl_xor_sync(FULL, acc[k][j], off);
            if (w) accw[k] += __shfl_xor_sync(FULL, accw[k], off);
            accn[k] += __shfl_xor_sync(FULL, accn[k], off);
        }
    }
#endif
    for (int wi = 0; wi < NT / 32; ++wi) {
        if ((threadIdx.x >> 5) == wi) {
#if RACC
            if ((threadIdx.x & 31) < L) {
                #pragma unroll
                for (int k = 0; k < KACC; ++k) {
                    #pragma unroll
                    for (int j = 0; j < DPL; ++j) ssum[k * DP + lane + j * L] += acc[k][j];
                    if (lane == 0) { sw[k] += w ? accw[k] : (double)accn[k]; scnt[k] += (double)accn[k]; }
                }
            }
#endif
            if ((threadIdx.x & 31) == 0) { sst[0] += inert; sst[1] += moved; }
        }
        __syncthreads();
    }
    if (want) {
        const int KD = K * D;
        double* o = part + (long long)blockIdx.x * (KD + 2 * K + 2);
#if CREG
#if L == 1
        // Element e of the NG interleaved slices: one warp adds groups lane, lane + 32, ... in
        // order, then a fixed butterfly (deterministic), into group 0's place.
        for (int e = threadIdx.x >> 5; e < GE; e += NT / 32) {
            double t = 0.0;
            for (int g = threadIdx.x & 31; g < NG; g += 32) t += ssum[e * NG + g];
            t = warp_sum(t);
            if ((threadIdx.x & 31) == 0) ssum[e * NG] = t;
        }
        __syncthreads();
#else
        // The groups' slices summed by a fixed pairwise tree (NG is a power of 2; one slice per
        // thread walking all NG slices took ~4 us for L = 1).
        for (int st = 1; st < NG; st <<= 1) {
            for (int t = threadIdx.x; t < (NG / (2 * st)) * GS; t += NT) {
                const int q = (t / GS) * 2 * st, i = t % GS;
                ssum[q * GS + i] += ssum[(q + st) * GS + i];
            }
            __syncthreads();
        }
#endif
        for (int i = threadIdx.x; i < KD + 2 * K; i += NT) {
            const int k = i / D;
            // Without sample weights the weight of a cluster is its count (slot K further on).
            const int e = i < KD ? k * DP + (i - k * D) : KACC * DP + (i - KD) + (!w && i < KD + K ? KACC : 0);
            o[i] = ssum[GIX(e)];
        }
        if (threadIdx.x < 2) o[KD + 2 * K + threadIdx.x] = sst[threadIdx.x];
#else
        for (int i = threadIdx.x; i < KD; i += NT) { int k = i / D; o[i] = ssum[k * DP + (i - k * D)]; }
        for (int i = threadIdx.x; i < 2 * K + 2; i += NT) o[KD + i] = sw[i];
#endif
    } else if (threadIdx.x < 2) {
        pstat[2 * blockIdx.x + threadIdx.x] = sst[threadIdx.x];
    }
}

// Column i of the block partials summed over blocks by one warp: lane l adds blocks l, l+32,
// ... in order, then a fixed butterfly (deterministic; a thread per column walking all blocks
// was latency-bound: ~20 us). The count columns [K*D + K, K*D + 2K) also go to int64.
extern "C" __global__ void reduce_parts(const double* __restrict__ part, int nb, int width, int K, int KD,
                                        double* __restrict__ out, long long* __restrict__ cnt) {
    const int i = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (i >= width) return;  // uniform across the warp
    double s = 0.0;
    #pragma unroll 4
    for (int b = lane; b < nb; b += 32) s += part[(long long)b * width + i];
    s = warp_sum(s);
    if (lane == 0) {
        out[i] = s;
        if (i >= KD + K && i < KD + 2 * K) cnt[i - KD - K] = (long long)s;
    }
}
"""

SELECT_SRC = _COMMON + r"""
// Compile-time: T (data type), GT (GEMM output type), GV (its 16-byte vector), VEC (lanes of GV).
// B (vectors per lane per batch: B * 32 * VEC values of a row), CH (top-3 states per lane,
// select_rows) and SS_MINB (sorted_sums' blocks per SM) come from select_source.
__device__ __forceinline__ GV vinf() {
    const GT i = (GT)__longlong_as_double(0x7ff0000000000000ll);
#if VEC == 4
    return make_float4(i, i, i, i);
#else
    return make_double2(i, i);
#endif
}
__device__ __forceinline__ GT comp(const GV& v, int e) {
#if VEC == 4
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
#else
    return e == 0 ? v.x : v.y;
#endif
}
// GEMM inputs of a row tile and each row's certified error bound (a warp per row, lanes over
// D). gemm_prep<MODE>, MODE 0: no rounded copy (the GEMM reads X itself: fp32 SGEMM, float64);
// 1: xb = X rounded to TF32 (to nearest even; the tensor cores then take xb exactly);
// 2: split TF32, out = [xb | xb | xs] per row (xs = x - xb exactly), or [xb | xs | xb]
// when CEN (the centroid side): one TF32 GEMM of inner dimension 3D sums xb.cb + xb.cs +
// xs.cb, fp32-accurate up to xs.cs; 3: xb rounded to bfloat16, written as its bits.
// Values below TINY in magnitude flush to zero (so no input or residual is subnormal for the
// tensor cores); the bound's absolute terms cover them. Per row: ||x||^2 and ||x - xb||^2
// (float64, optional) and eb = eA ||x|| + eR ||x - xb|| + eB (optional).
#define TINY 7.888609052210118e-31f  // 2^-100
__device__ __forceinline__ float round_mant(float v, int keep) {  // keep mantissa bits, RN-even
    if (fabsf(v) < TINY) return 0.0f;
    unsigned u = __float_as_uint(v);
    const int sh = 23 - keep;
    u += ((1u << (sh - 1)) - 1u) + ((u >> sh) & 1u);
    return __uint_as_float(u & ~((1u << sh) - 1u));
}
// A warp takes 4 consecutive rows at a time and loads 4 values of each per lane before
// using any (16 loads in flight: a warp per row alone kept too few bytes in flight for D ~ 100).
template <int M>
__device__ __forceinline__ void prep_rows(const T* __restrict__ X, long long rows, int D, int cen,
                                          void* __restrict__ out, double* __restrict__ sq,
                                          double* __restrict__ rsq, double* __restrict__ eb,
                                          double eA, double eR, double eB) {
    const int lane = threadIdx.x & 31;
    const long long nwarp = ((long long)gridDim.x * blockDim.x) >> 5;
    float* o = (float*)out;
    unsigned short* h = (unsigned short*)out;
    for (long long r0 = (((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5) * 4; r0 < rows; r0 += nwarp * 4) {
        double s[4] = {0.0, 0.0, 0.0, 0.0}, q[4] = {0.0, 0.0, 0.0, 0.0};
        for (int j0 = 0; j0 < D; j0 += 128) {
            T v[4][4];
            #pragma unroll
            for (int a = 0; a < 4; ++a) {
                #pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int j = j0 + lane + 32 * u;
                    v[a][u] = (r0 + a < rows && j < D) ? X[(r0 + a) * D + j] : (T)0;
                }
            }
            #pragma unroll
            for (int a = 0; a < 4; ++a) {
                #pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int j = j0 + lane + 32 * u;
                    s[a] = fma((double)v[a][u], (double)v[a][u], s[a]);
                    if constexpr (M != 0) {
                        if (r0 + a < rows && j < D) {
                            const long long r = r0 + a;
                            const float f = (float)v[a][u], b = round_mant(f, M == 3 ? 7 : 10);
                            const float e = fabsf(f) < TINY ? 0.0f : f - b;  // exact (Sterbenz)
                            q[a] = fma((double)e, (double)e, q[a]);
                            if constexpr (M == 1) o[r * D + j] = b;
                            else if constexpr (M == 3) h[r * D + j] = (unsigned short)(__float_as_uint(b) >> 16);
                            else {
                                float* t = o + r * 3 * D;
                                t[j] = b; t[D + j] = cen ? e : b; t[2 * D + j] = cen ? b : e;
                            }
                        }
                    }
                }
            }
        }
        #pragma unroll
        for (int a = 0; a < 4; ++a) {
            const double sa = warp_sum(s[a]), qa = warp_sum(q[a]);
            const long long r = r0 + a;
            if (lane == 0 && r < rows) {
                if (sq) sq[r] = sa;
                if (rsq) rsq[r] = qa;
                if (eb) eb[r] = eA * sqrt(sa) + eR * sqrt(qa) + eB;
            }
        }
    }
}
#define PREP(M) extern "C" __global__ void __launch_bounds__(256, 3) gemm_prep##M( \
        const T* __restrict__ X, long long rows, int D, int cen, void* __restrict__ out, double* __restrict__ sq, \
        double* __restrict__ rsq, double* __restrict__ eb, double eA, double eR, double eB) { \
    prep_rows<M>(X, rows, D, cen, out, sq, rsq, eb, eA, eR, eB); }
PREP(0)
PREP(1)
PREP(2)
PREP(3)

// One warp per row, rows grid-strided. A row's values come in batches of B vectors per lane;
// batch t+1 (possibly the next row's first, with its x) is loaded before batch t is compared,
// so a warp always has a batch in flight, also while it merges and certifies a row.
extern "C" __global__ void __launch_bounds__(256, 2) select_rows(
        const GT* __restrict__ G, int ldg,          // rows x ldg tile, ldg % VEC == 0
        const GT* __restrict__ csq,                 // ldg squared norms, +inf past K
        const T* __restrict__ X, int D, long long rows,
        const T* __restrict__ C,                    // K x D centroids (data dtype)
        const double* __restrict__ eb,              // per row: |G+csq - exact| <= eb (gemm_prep)
        int exact,                                  // 1: the winner's exact distance here (inertia, d2)
        const double* __restrict__ w,
        const int* prev, int* labels,               // may alias (so neither is __restrict__)
        double* __restrict__ d2, double* __restrict__ stat) {   // stat: inertia, reassigned, rechecked
    const int lane = threadIdx.x & 31;
    const long long nwarp = ((long long)gridDim.x * blockDim.x) >> 5;
    const int nv = ldg / VEC, nbat = (nv + 32 * B - 1) / (32 * B);
    const GV* cq = (const GV*)csq;
    const GT inf = (GT)__longlong_as_double(0x7ff0000000000000ll);
    double inert = 0.0, moved = 0.0, checked = 0.0;
    // CH independent top-3 states per lane (value e of vector b feeds state (b VEC + e) % CH),
    // merged at the row's end: shorter dependency chains through the inserts.
    GV cur[B], nxt[B];
    auto load = [&](GV (&buf)[B], long long r, int bt) {
        const GV* g = (const GV*)(G + r * (long long)ldg);
        #pragma unroll
        for (int b = 0; b < B; ++b) {
            const int q = bt * 32 * B + 32 * b + lane;
            buf[b] = q < nv ? g[q] : vinf();
        }
    };
    long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int bt = 0;
    double ebc = 0.0, ebn = 0.0;
    if (r < rows) { load(cur, r, 0); ebc = eb[r]; }
    GT b1[CH], b2[CH], b3[CH];
    int i1[CH], i2[CH];
    #pragma unroll
    for (int c = 0; c < CH; ++c) { b1[c] = b2[c] = b3[c] = inf; i1[c] = i2[c] = 0x7fffffff; }
    while (r < rows) {
        long long rn = r;
        int bn = bt + 1;
        if (bn == nbat) { bn = 0; rn += nwarp; }
        if (rn < rows) { load(nxt, rn, bn); if (bn == 0) ebn = eb[rn]; }
        // Indices reach a lane (and a state) in increasing order: ins3_sel keeps the lowest index
        // on ties, and a tie lands in b2 (a zero margin, hence an exact re-check).
        #pragma unroll
        for (int b = 0; b < B; ++b) {
            const int q = bt * 32 * B + 32 * b + lane;
            const GV cv = q < nv ? cq[q] : vinf();
            #pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const GT v = comp(cur[b], e) + comp(cv, e);
                const int c = (b * VEC + e) % CH;
                ins3_sel(v, q * VEC + e, b1[c], i1[c], b2[c], i2[c], b3[c]);
            }
        }
        if (bn == 0) {  // row r is complete
            #pragma unroll
            for (int c = 1; c < CH; ++c) merge3(b1[0], i1[0], b2[0], i2[0], b3[0], b1[c], i1[c], b2[c], i2[c], b3[c]);
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) shfl_merge3(b1[0], i1[0], b2[0], i2[0], b3[0], off);
            const T* x = X + r * D;
            // Any k with G+csq > b1 + 2E is certainly farther than the winner i1.
            const double thr = (double)b1[0] + 2.0 * ebc;
            const bool certain = (double)b2[0] > thr;
            int best = i1[0];
            double bd = 0.0;
            if (exact || !certain) bd = exact_d2(x, C + (long long)i1[0] * D, D, lane);
            if (!certain) {
                checked += 1.0;
                if ((double)b3[0] > thr) {  // two candidates
                    const double dk = exact_d2(x, C + (long long)i2[0] * D, D, lane);
                    if (dk < bd || (dk == bd && i2[0] < best)) { bd = dk; best = i2[0]; }
                } else {  // three or more (rare): every k within the bound, from a second scan
                    const GV* g = (const GV*)(G + r * (long long)ldg);
                    for (int qb = 0; qb < nv; qb += 32) {
                        const int q = qb + lane;
                        const bool ok = q < nv;
                        GV gv, cv;
                        if (ok) { gv = g[q]; cv = cq[q]; }
                        #pragma unroll
                        for (int e = 0; e < VEC; ++e) {
                            const bool cand = ok && (q * VEC + e) != i1[0] && (double)(comp(gv, e) + comp(cv, e)) <= thr;
                            unsigned m = __ballot_sync(FULL, cand);
                            while (m) {
                                const int src = __ffs(m) - 1;
                                m &= m - 1;
                                const int k = (qb + src) * VEC + e;
                                const double dk = exact_d2(x, C + (long long)k * D, D, lane);
                                if (dk < bd || (dk == bd && k < best)) { bd = dk; best = k; }
                            }
                        }
                    }
                }
            }
            if (lane == 0) row_out(r, best, exact ? bd : 0.0, w, prev, labels, d2, inert, moved);
            #pragma unroll
            for (int c = 0; c < CH; ++c) { b1[c] = b2[c] = b3[c] = inf; i1[c] = i2[c] = 0x7fffffff; }
            ebc = ebn;
        }
        #pragma unroll
        for (int b = 0; b < B; ++b) cur[b] = nxt[b];
        r = rn;
        bt = bn;
    }
    if (lane == 0) stat_out(stat, inert, moved, checked);
}

#ifdef RPT
// The same selection on a column-major tile (Gt[k * ldr + r], cuBLAS writing G^T): a block
// owns 32 RPT rows, thread (warp w, lane l) rows RPT l .. RPT l + RPT - 1 of the block, scanning the centroids of warp w's eighth of [0, kpad) with coalesced RPT-float
// loads (KU centroids in flight) and keeping each row's top-2 + third value in registers: no
// per-row warp merge on the streaming path. Then the eight states of a row merge in shared
// memory, one thread per row certifies it (its bound from gemm_prep), and the uncertain
// rows (all rows when ``exact``) get a warp each for the exact re-rank.
#define KU 8
#if RPT == 4
typedef float4 RV;
#elif RPT == 2
typedef float2 RV;
#else
typedef float RV;
#endif
__device__ __forceinline__ float rcomp(const RV& v, int e) {
#if RPT == 4
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
#elif RPT == 2
    return e == 0 ? v.x : v.y;
#else
    return v;
#endif
}
__device__ __forceinline__ RV rinf() {
    const float i = __int_as_float(0x7f800000);
#if RPT == 4
    return make_float4(i, i, i, i);
#elif RPT == 2
    return make_float2(i, i);
#else
    return i;
#endif
}
#define BR (32 * RPT)
extern "C" __global__ void __launch_bounds__(256, SC_MINB) select_cols(
        const float* __restrict__ Gt, long long ldr, int kpad,  // column-major rows x kpad, ldr % 4 == 0
        const float* __restrict__ csq,
        const T* __restrict__ X, int D, long long rows,
        const T* __restrict__ C,
        const double* __restrict__ eb, int exact,
        const double* __restrict__ w, const int* prev, int* labels,
        double* __restrict__ d2, double* __restrict__ stat) {
    __shared__ float sb1[8][BR], sb2[8][BR], sb3[8][BR];
    __shared__ int si1[8][BR], si2[8][BR];
    __shared__ double sthr[BR];
    __shared__ int flist[BR];
    __shared__ int nflag;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float inf = __int_as_float(0x7f800000);
    double inert = 0.0, moved = 0.0, checked = 0.0;
    const int kc = (kpad + 7) / 8, kb = wid * kc, ke = kb + kc < kpad ? kb + kc : kpad;
    for (long long r0 = (long long)blockIdx.x * BR; r0 < rows; r0 += (long long)gridDim.x * BR) {
        const long long g0 = r0 + RPT * lane;  // this thread's first row
        float b1[RPT], b2[RPT], b3[RPT];
        int i1[RPT], i2[RPT];
        #pragma unroll
        for (int e = 0; e < RPT; ++e) { b1[e] = b2[e] = b3[e] = inf; i1[e] = i2[e] = 0x7fffffff; }
        const RV* gp = (const RV*)(Gt + g0);
        const long long step = ldr / RPT;
        const bool in = g0 < ldr;
        for (int k = kb; k < ke; k += KU) {
            RV v[KU];
            float cq[KU];
            #pragma unroll
            for (int u = 0; u < KU; ++u) {
                const bool ok = in && k + u < ke;
                v[u] = ok ? gp[(long long)(k + u) * step] : rinf();
                cq[u] = k + u < ke ? csq[k + u] : inf;
            }
            #pragma unroll
            for (int u = 0; u < KU; ++u) {
                #pragma unroll
                for (int e = 0; e < RPT; ++e) {
                    const float val = rcomp(v[u], e) + cq[u];
                    ins3_sel(val, k + u, b1[e], i1[e], b2[e], i2[e], b3[e]);
                }
            }
        }
        #pragma unroll
        for (int e = 0; e < RPT; ++e) {
            const int i = RPT * lane + e;
            sb1[wid][i] = b1[e]; sb2[wid][i] = b2[e]; sb3[wid][i] = b3[e]; si1[wid][i] = i1[e]; si2[wid][i] = i2[e];
        }
        if (threadIdx.x == 0) nflag = 0;
        __syncthreads();
        if (threadIdx.x < BR) {
            const int i = threadIdx.x;
            const long long r = r0 + i;
            float a1 = sb1[0][i], a2 = sb2[0][i], a3 = sb3[0][i];
            int j1 = si1[0][i], j2 = si2[0][i];
            for (int q = 1; q < 8; ++q) merge3(a1, j1, a2, j2, a3, sb1[q][i], si1[q][i], sb2[q][i], si2[q][i], sb3[q][i]);
            if (r < rows) {
                const double thr = (double)a1 + 2.0 * eb[r];
                const bool certain = (double)a2 > thr;
                if (exact || !certain) {
                    flist[atomicAdd(&nflag, 1)] = i;
                    checked += certain ? 0.0 : 1.0;
                } else {
                    row_out(r, j1, 0.0, w, prev, labels, d2, inert, moved);
                }
                sb1[0][i] = a1; sb2[0][i] = a2; sb3[0][i] = a3; si1[0][i] = j1; si2[0][i] = j2;
                sthr[i] = thr;
            }
        }
        __syncthreads();
        // Exact work, a warp per listed row: the winner's distance, then the candidates the
        // bound cannot exclude ({i2} when the third value exceeds it, else a scan of the row).
        for (int f = wid; f < nflag; f += 8) {
            const int i = flist[f];
            const long long r = r0 + i;
            const T* x = X + r * D;
            const float a2 = sb2[0][i], a3 = sb3[0][i];
            const int j1 = si1[0][i], j2 = si2[0][i];
            const double thr = sthr[i];
            int best = j1;
            double bd = exact_d2(x, C + (long long)j1 * D, D, lane);
            if (!((double)a2 > thr)) {
                if ((double)a3 > thr) {
                    const double dk = exact_d2(x, C + (long long)j2 * D, D, lane);
                    if (dk < bd || (dk == bd && j2 < best)) { bd = dk; best = j2; }
                } else {
                    for (int kb2 = 0; kb2 < kpad; kb2 += 32) {
                        const int k = kb2 + lane;
                        const bool cand = k < kpad && k != j1 && (double)(Gt[(long long)k * ldr + r] + csq[k]) <= thr;
                        unsigned m = __ballot_sync(FULL, cand);
                        while (m) {
                            const int kk = kb2 + __ffs(m) - 1;
                            m &= m - 1;
                            const double dk = exact_d2(x, C + (long long)kk * D, D, lane);
                            if (dk < bd || (dk == bd && kk < best)) { bd = dk; best = kk; }
                        }
                    }
                }
            }
            if (lane == 0) row_out(r, best, exact ? bd : 0.0, w, prev, labels, d2, inert, moved);
        }
        __syncthreads();
    }
    inert = warp_sum(inert);
    moved = warp_sum(moved);
    checked = warp_sum(checked);
    if (lane == 0) stat_out(stat, inert, moved, checked);
}
#endif

// Counting sort by label in three steps, block-local counters in shared memory (global
// atomics on K counters cost ~0.1 ms per 1e6 rows each). Block b owns rows [b R, (b+1) R).
// 1. hist[b K + k]: how many of block b's rows have label k.
extern "C" __global__ void label_hist(const int* __restrict__ lab, long long n, int K, long long R,
                                      int* __restrict__ hist) {
    extern __shared__ unsigned int h[];
    for (int i = threadIdx.x; i < K; i += blockDim.x) h[i] = 0u;
    __syncthreads();
    const long long r0 = (long long)blockIdx.x * R, r1 = r0 + R < n ? r0 + R : n;
    for (long long r = r0 + threadIdx.x; r < r1; r += blockDim.x) atomicAdd(h + lab[r], 1u);
    __syncthreads();
    for (int i = threadIdx.x; i < K; i += blockDim.x) hist[(long long)blockIdx.x * K + i] = (int)h[i];
}
// 3. (2 is an exclusive scan on the host: off[b K + k] = rows of labels < k + block b's
// predecessors' rows of label k.) Each row to off[b K + k] + its rank among block b's rows
// of label k (in no particular order).
extern "C" __global__ void label_scatter(const int* __restrict__ lab, long long n, int K, long long R,
                                         const long long* __restrict__ off, long long* __restrict__ perm,
                                         int* __restrict__ slab) {
    extern __shared__ unsigned int cur[];
    const long long o = (long long)blockIdx.x * K;
    for (int i = threadIdx.x; i < K; i += blockDim.x) cur[i] = 0u;
    __syncthreads();
    const long long r0 = (long long)blockIdx.x * R, r1 = r0 + R < n ? r0 + R : n;
    for (long long r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
        const int k = lab[r];
        const long long pos = off[o + k] + atomicAdd(cur + k, 1u);
        perm[pos] = r;
        slab[pos] = k;
    }
}

// Counting sort by label with global counters (K too large for shared memory): cursor starts
// at each cluster's first position.
extern "C" __global__ void scatter_by_label(const int* __restrict__ lab, long long n,
                                            unsigned long long* __restrict__ cursor,
                                            long long* __restrict__ perm, int* __restrict__ slab) {
    for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += (long long)gridDim.x * blockDim.x) {
        const int k = lab[r];
        const unsigned long long pos = atomicAdd(cursor + k, 1ull);
        perm[pos] = r;
        slab[pos] = k;
    }
}

// Per-cluster float64 sums from rows sorted by label (perm: row ids in label order, slab: the
// sorted labels), and, when stat is given, the inertia sum w ||x - c_label||^2 (exact float64).
// Each warp runs through 32 consecutive sorted rows (their ids, labels and weights one per
// lane), lanes owning columns, RG rows' values loaded before any is used; sums accumulate in
// registers and go to sums[k] only when the label changes: a few atomics per warp instead of
// one per element.
#define CPL 4
#ifndef RG
#define RG 1
#endif
extern "C" __global__ void __launch_bounds__(256, SS_MINB) sorted_sums(
        const T* __restrict__ X, int D, long long n, const long long* __restrict__ perm,
        const int* __restrict__ slab, const double* __restrict__ w, const T* __restrict__ C,
        double* __restrict__ sums, double* __restrict__ stat) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarp = ((long long)gridDim.x * blockDim.x) >> 5;
    double inert = 0.0;
    for (long long s = warp * 32; s < n; s += nwarp * 32) {
        const int m = n - s < 32 ? (int)(n - s) : 32;
        const long long myr = lane < m ? perm[s + lane] : 0;
        const int myk = lane < m ? slab[s + lane] : 0;
        const double myw = (w && lane < m) ? w[myr] : 1.0;
        for (int c0 = 0; c0 < D; c0 += 32 * CPL) {
            double acc[CPL], cv[CPL];
            int cur = __shfl_sync(FULL, myk, 0);
            #pragma unroll
            for (int t = 0; t < CPL; ++t) {
                const int j = c0 + lane + 32 * t;
                acc[t] = 0.0;
                cv[t] = (stat && j < D) ? (double)C[(long long)cur * D + j] : 0.0;
            }
            for (int i0 = 0; i0 < m; i0 += RG) {
                T xv[RG][CPL];
                #pragma unroll
                for (int g = 0; g < RG; ++g) {
                    const long long r = __shfl_sync(FULL, myr, (i0 + g) & 31);
                    #pragma unroll
                    for (int t = 0; t < CPL; ++t) {
                        const int j = c0 + lane + 32 * t;
                        xv[g][t] = (i0 + g < m && j < D) ? X[r * D + j] : (T)0;
                    }
                }
                #pragma unroll
                for (int g = 0; g < RG; ++g) {
                    const int k = __shfl_sync(FULL, myk, (i0 + g) & 31);
                    const double wr = __shfl_sync(FULL, myw, (i0 + g) & 31);
                    if (i0 + g < m) {
                        if (k != cur) {
                            #pragma unroll
                            for (int t = 0; t < CPL; ++t) {
                                const int j = c0 + lane + 32 * t;
                                if (j < D) {
                                    atomicAdd(sums + (long long)cur * D + j, acc[t]);
                                    if (stat) cv[t] = (double)C[(long long)k * D + j];
                                }
                                acc[t] = 0.0;
                            }
                            cur = k;
                        }
                        #pragma unroll
                        for (int t = 0; t < CPL; ++t) {
                            const double v = (double)xv[g][t];
                            acc[t] = fma(wr, v, acc[t]);
                            const double u = v - cv[t];  // 0 past D (both 0)
                            inert = fma(wr * u, u, inert);
                        }
                    }
                }
            }
            #pragma unroll
            for (int t = 0; t < CPL; ++t) {
                const int j = c0 + lane + 32 * t;
                if (j < D) atomicAdd(sums + (long long)cur * D + j, acc[t]);
            }
        }
    }
    if (stat) {
        inert = warp_sum(inert);
        if (lane == 0) atomicAdd(stat, inert);
    }
}
"""

FUSED_GEMM_SRC = _COMMON + r"""
// Fused fp32 GEMM + top-2 (the distance tile never reaches HBM). Each block owns BM = 128 rows
// and walks every centroid tile of BN = 128, keeping per row the two best (value, index) pairs
// and the third best value of v_k = ||c_k||^2 - 2 x.c_k (lowest index first on equal values).
#define BM 128
#define BN 128
#define INF __int_as_float(0x7f800000)

// Row state in shared memory: one entry per row of the block.
struct RowState { float b1[BM], b2[BM], b3[BM]; int i1[BM], i2[BM]; };
__device__ __forceinline__ void state_merge(RowState& s, int r, float b1, int i1, float b2, int i2, float b3) {
    float a1 = s.b1[r], a2 = s.b2[r], a3 = s.b3[r];
    int k1 = s.i1[r], k2 = s.i2[r];
    merge3(a1, k1, a2, k2, a3, b1, i1, b2, i2, b3);
    s.b1[r] = a1; s.b2[r] = a2; s.b3[r] = a3; s.i1[r] = k1; s.i2[r] = k2;
}

// The classic 128 x 128 x 8 SIMT tile, 8 x 8 outputs per thread (rows ty*4+i and
// 64+ty*4+i, columns tx*4+j and 64+tx*4+j), double-buffered through registers.
#define BK 8
#define SP (BM + 4)
extern "C" __global__ void __launch_bounds__(256, 2) gemm_top2(
        const float* __restrict__ X, long long n, int D,
        const float* __restrict__ C, int K,
        const float* __restrict__ csq,     // >= ceil(K / BN) * BN squared norms, +inf past K
        int* __restrict__ o_i1, int* __restrict__ o_i2,
        float* __restrict__ o_b1, float* __restrict__ o_b2, float* __restrict__ o_b3) {
    __shared__ __align__(16) float As[2][BK][SP];
    __shared__ __align__(16) float Bs[2][BK][SP];
    __shared__ RowState st[1];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const long long row0 = (long long)blockIdx.x * BM;
    const int lr = tid >> 1, lc = (tid & 1) * 4;
    const bool xok = row0 + lr < n;
    const float* xp = X + (xok ? row0 + lr : 0) * (long long)D;
    const int nds = (D + BK - 1) / BK, nkt = (K + BN - 1) / BN, steps = nds * nkt;
    if (tid < BM) { st[0].b1[tid] = st[0].b2[tid] = st[0].b3[tid] = INF; st[0].i1[tid] = st[0].i2[tid] = 0x7fffffff; }
    float pa[4], pb[4];
    auto load = [&](int kt, int ds) {
        const int d0 = ds * BK + lc, kr = kt * BN + lr;
        const float* cp = C + (long long)(kr < K ? kr : 0) * D;
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = d0 + i;
            pa[i] = (xok && d < D) ? __ldg(xp + d) : 0.f;
            pb[i] = (kr < K && d < D) ? __ldg(cp + d) : 0.f;
        }
    };
    auto store = [&](int buf) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) { As[buf][lc + i][lr] = pa[i]; Bs[buf][lc + i][lr] = pb[i]; }
    };
    float acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    load(0, 0);
    store(0);
    __syncthreads();
    int kt = 0, ds = 0;
    for (int s = 0; s < steps; ++s) {
        const int buf = s & 1;
        int nkt2 = kt, nds2 = ds + 1;
        if (nds2 == nds) { nds2 = 0; ++nkt2; }
        const bool more = s + 1 < steps;
        if (more) load(nkt2, nds2);
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float4 a0 = *(const float4*)&As[buf][kk][ty * 4];
            const float4 a1 = *(const float4*)&As[buf][kk][64 + ty * 4];
            const float4 c0 = *(const float4*)&Bs[buf][kk][tx * 4];
            const float4 c1 = *(const float4*)&Bs[buf][kk][64 + tx * 4];
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) store(buf ^ 1);
        if (ds == nds - 1) {
            // Epilogue of centroid tile kt: v = csq - 2 acc (one rounding), top-2 per row over
            // this thread's 8 columns (increasing k), merged across the 16 threads of the row.
            const float* cq = csq + kt * BN;
            float cv[8];
            #pragma unroll
            for (int j = 0; j < 4; ++j) { cv[j] = __ldg(cq + tx * 4 + j); cv[4 + j] = __ldg(cq + 64 + tx * 4 + j); }
            #pragma unroll
            for (int i = 0; i < 8; ++i) {
                // Only values below the row's third best so far can change its state (tiles
                // come in increasing k): most tiles of most rows have none, and skip the merge.
                const int r = i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4;
                const float lim = st[0].b3[r];
                bool any = false;
                #pragma unroll
                for (int j = 0; j < 8; ++j) any |= fmaf(-2.f, acc[i][j], cv[j]) < lim;
                if (__any_sync(FULL, any)) {
                    float b1 = INF, b2 = INF, b3 = INF;
                    int i1 = 0x7fffffff, i2 = 0x7fffffff;
                    #pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const int k = kt * BN + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
                        const float v = fmaf(-2.f, acc[i][j], cv[j]);
                        if (v < lim) ins3(v, k, b1, i1, b2, i2, b3);
                    }
                    #pragma unroll
                    for (int off = 8; off > 0; off >>= 1) shfl_merge3(b1, i1, b2, i2, b3, off);
                    if (tx == 0 && b1 < lim) state_merge(st[0], r, b1, i1, b2, i2, b3);
                }
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
            }
        }
        __syncthreads();
        kt = nkt2; ds = nds2;
    }
    if (tid < BM && row0 + tid < n) {
        const long long r = row0 + tid;
        o_i1[r] = st[0].i1[tid]; o_i2[r] = st[0].i2[tid];
        o_b1[r] = st[0].b1[tid]; o_b2[r] = st[0].b2[tid]; o_b3[r] = st[0].b3[tid];
    }
}

// One warp per row: certify the fused kernel's winner with the error bound (candidates are
// the k with v_k <= b1 + 2E: {i1} if b2 exceeds it, {i1, i2} if b3 does, else every centroid)
// and take the lowest-index argmin of exact float64 distances among the candidates.
extern "C" __global__ void __launch_bounds__(256) finish_top2(
        const float* __restrict__ X, int D, long long n, const float* __restrict__ C, int K,
        const int* __restrict__ o_i1, const int* __restrict__ o_i2,
        const float* __restrict__ o_b1, const float* __restrict__ o_b2, const float* __restrict__ o_b3,
        double errA, double errB, const double* __restrict__ w,
        const int* prev, int* labels, double* __restrict__ d2, double* __restrict__ stat) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarp = ((long long)gridDim.x * blockDim.x) >> 5;
    double inert = 0.0, moved = 0.0, checked = 0.0;
    for (long long r = warp; r < n; r += nwarp) {
        const float* x = X + r * D;
        const int i1 = o_i1[r];
        const float* cb = C + (long long)i1 * D;
        // ||x||^2 (for the bound) and the exact distance to the winner in one pass.
        double sq = 0.0, bd = 0.0;
        for (int j = lane; j < D; j += 32) {
            const double v = (double)x[j], u = v - (double)cb[j];
            sq = fma(v, v, sq);
            bd = fma(u, u, bd);
        }
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            sq += __shfl_xor_sync(FULL, sq, off);
            bd += __shfl_xor_sync(FULL, bd, off);
        }
        int best = i1;
        const double thr = (double)o_b1[r] + 2.0 * (errA * sqrt(sq) + errB);
        if (!((double)o_b2[r] > thr)) {
            checked += 1.0;
            if ((double)o_b3[r] > thr) {
                const int i2 = o_i2[r];
                const double dk = exact_d2(x, C + (long long)i2 * D, D, lane);
                if (dk < bd || (dk == bd && i2 < best)) { bd = dk; best = i2; }
            } else {
                // Three or more candidates (rare): every centroid, four at a time so that
                // their reductions overlap; in increasing k, so the lowest index wins ties.
                double mb = __longlong_as_double(0x7ff0000000000000ll);
                int mk = 0x7fffffff;
                int k = 0;
                for (; k + 4 <= K; k += 4) {
                    double s4[4] = {0.0, 0.0, 0.0, 0.0};
                    for (int j = lane; j < D; j += 32) {
                        const double v = (double)x[j];
                        #pragma unroll
                        for (int q = 0; q < 4; ++q) { const double u = v - (double)C[(long long)(k + q) * D + j]; s4[q] = fma(u, u, s4[q]); }
                    }
                    #pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const double dk = warp_sum(s4[q]);
                        if (dk < mb) { mb = dk; mk = k + q; }
                    }
                }
                for (; k < K; ++k) {
                    const double dk = exact_d2(x, C + (long long)k * D, D, lane);
                    if (dk < mb) { mb = dk; mk = k; }
                }
                best = mk;
                bd = mb;
            }
        }
        if (lane == 0) row_out(r, best, bd, w, prev, labels, d2, inert, moved);
    }
    if (lane == 0) stat_out(stat, inert, moved, checked);
}
"""

_CACHE: dict = {}


def _ctype(dtype: Any) -> str:
    import numpy

    return {"float32": "float", "float64": "double"}[numpy.dtype(dtype).name]


def small_source(dtype: Any, lanes: int, dpl: int, kacc: int, tred: bool, threads: int,
                 rows: int | None = None, min_blocks: int | None = None, mode: int = 0,
                 creg: bool = False, dfull: bool = False) -> str:
    """CUDA source of ``fused_small`` (``mode`` 0 fused, 1 labels only) and ``reduce_parts``
    for one configuration (``creg``: centroids in registers, sums in shared memory; needs
    ``kacc`` > 0; ``dfull``: D = ``lanes`` x ``dpl`` exactly, the row stride compiled in);
    ``rows`` (U) and ``min_blocks`` (MINB) default to the measured choices (profiling scripts
    vary them)."""
    creg = bool(creg and kacc)
    if rows is None:
        # Rows per group per loop trip (U x DPL registers). Measured on an H200 (S1, S2): 8 or 24
        # values per lane were no faster than 8 (register pressure costs occupancy); with the
        # centroids in registers (no accumulators there) 16: S1 (DPL 7) 0.242 ms at U = 2
        # against 0.277 at U = 1.
        rows = max(1, min(4, (16 if creg else 8) // dpl))
    if min_blocks is None:
        # S1 (TRED, 16 lanes x 7 values, U = 1): the same kernel compiled for 2 blocks per SM
        # took 0.294 ms against 0.312 ms when the compiler was free (126-128 registers either
        # way). With U > 1 the bound would spill (K=5, 4 values x 2 rows: 88 bytes); S2 ran
        # 0.13 ms instead of 0.10 with it.
        min_blocks = 2 if tred and rows == 1 and mode == 0 and not creg else 1
    kp = 1 << max(0, kacc - 1).bit_length()  # K rounded up to a power of 2
    return (f"#define T {_ctype(dtype)}\n#define L {lanes}\n#define DPL {dpl}\n#define KACC {kacc}\n"
            f"#define NT {threads}\n#define U {rows}\n#define TRED {int(bool(tred))}\n"
            f"#define KP {kp}\n#define MINB {min_blocks}\n#define MODE {mode}\n"
            f"#define CREG {int(creg)}\n#define DFULL {int(bool(dfull))}\n" + SMALL_SRC)


def _functions(key: tuple, src: str, names: tuple[str, ...]) -> tuple[Any, ...]:
    """The kernels ``names`` of the module compiled from ``src``, once per process (CuPy also
    caches the binary on disk); the same objects every call, as the launch code keys its
    occupancy cache by them."""
    if key not in _CACHE:
        import cupy

        mod = cupy.RawModule(code=src, options=("--std=c++17",))
        _CACHE[key] = tuple(mod.get_function(f) for f in names)
    return _CACHE[key]


def small_kernels(dtype: Any, lanes: int, dpl: int, kacc: int, tred: bool, threads: int,
                  mode: int = 0, creg: bool = False, dfull: bool = False) -> tuple[Any, Any]:
    """``(fused_small, reduce_parts)`` for one (dtype, L, DPL, KACC, TRED, NT, MODE, CREG,
    DFULL) configuration."""
    key = ("small", _ctype(dtype), lanes, dpl, kacc, bool(tred), threads, mode, bool(creg), bool(dfull))
    return _functions(key, small_source(dtype, lanes, dpl, kacc, tred, threads, mode=mode, creg=creg, dfull=dfull),
                      ("fused_small", "reduce_parts"))


def select_source(dtype: Any, gemm_dtype: Any, batch: int = 8, rows_per_thread: int = 0,
                  sum_rows: int | None = None, sum_min_blocks: int | None = None,
                  chains: int = 2) -> str:
    """CUDA source of the selection module for data of ``dtype`` and a GEMM tile of
    ``gemm_dtype``: ``batch`` 16-byte vectors per lane per buffer in ``select_rows`` (8: two
    buffers in 128 registers without spilling on sm_90, float32) and its ``chains``
    independent top-3 states per lane (measured on an H200, select alone on P3 tf32 tiles:
    1 state 3.40 ms, 2 states 2.68, 4 states 2.73; P3 fp32 2.87 / 2.54 / 2.37; P2 tf32
    1.51 / 1.49 / 1.59; see docs/performance.md for the variants dropped); ``rows_per_thread`` (1, 2
    or 4) adds ``select_cols`` (column-major float32 tiles); ``sum_rows`` (RG) and
    ``sum_min_blocks`` (SS_MINB) of ``sorted_sums`` default to the measured choices
    (profiling scripts vary them)."""
    t, gt = _ctype(dtype), _ctype(gemm_dtype)
    vec = 4 if gt == "float" else 2
    if sum_min_blocks is None:
        # 4 blocks per SM (64 registers) for float32 rows; float64 rows spill there.
        sum_min_blocks = 4 if t == "float" else 3
    head = f"#define T {t}\n#define GT {gt}\n#define GV {gt}{vec}\n#define VEC {vec}\n#define B {batch}\n"
    head += f"#define SS_MINB {sum_min_blocks}\n#define CH {chains}\n"
    if sum_rows is not None:
        head += f"#define RG {sum_rows}\n"
    if rows_per_thread:
        # Resident blocks per SM the registers allow without spilling (sm_90, ptxas).
        head += f"#define RPT {rows_per_thread}\n#define SC_MINB {({1: 4, 2: 3, 4: 2})[rows_per_thread]}\n"
    return head + SELECT_SRC


def select_kernels(dtype: Any, gemm_dtype: Any, batch: int = 8) -> tuple[Any, ...]:
    """``(select_rows, scatter_by_label, sorted_sums, label_hist, label_scatter)`` for data of
    ``dtype`` and a GEMM tile of ``gemm_dtype`` (see :func:`select_source`)."""
    return _select_module(dtype, gemm_dtype, batch)[:5]


def prep_kernel(dtype: Any, mode: int) -> Any:
    """``gemm_prep`` of ``mode`` (0-3, see the source) for data of ``dtype``."""
    return _select_module(dtype, dtype)[5 + mode]


def _select_module(dtype: Any, gemm_dtype: Any, batch: int = 8) -> tuple[Any, ...]:
    key = ("select", _ctype(dtype), _ctype(gemm_dtype), batch)
    return _functions(key, select_source(dtype, gemm_dtype, batch),
                      ("select_rows", "scatter_by_label", "sorted_sums", "label_hist", "label_scatter",
                       "gemm_prep0", "gemm_prep1", "gemm_prep2", "gemm_prep3"))


def select_cols_kernel(dtype: Any, rows_per_thread: int) -> Any:
    """``select_cols`` for data of ``dtype``, a column-major float32 GEMM tile and
    ``rows_per_thread`` (1, 2 or 4) rows per thread."""
    key = ("select_cols", _ctype(dtype), rows_per_thread)
    return _functions(key, select_source(dtype, "float32", rows_per_thread=rows_per_thread), ("select_cols",))[0]


def fused_gemm_kernels() -> tuple[Any, Any]:
    """``(gemm_top2, finish_top2)``: the fused fp32 GEMM + top-2 kernel for float32 data and
    its certification pass."""
    return _functions(("fused",), FUSED_GEMM_SRC, ("gemm_top2", "finish_top2"))
