// Per-cluster sums once the labels are known. Compile-time: T (data type), SS_MINB
// (sorted_sums' blocks per SM) and optionally RG (rows loaded ahead) from cuda_src.sums_source.
// Counting sort by label in three steps, block-local counters in shared memory (global
// atomics on K counters contend: docs/performance.md, "label sums"). Block b owns rows [b R, (b+1) R).
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
// 2a. Per label k (a thread each): off[b K + k] = rows of label k in blocks before b, and
// counts[k] = all rows of label k.
extern "C" __global__ void label_block_offsets(const int* __restrict__ hist, int nblk, int K,
                                               long long* __restrict__ off, long long* __restrict__ counts) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < K; k += gridDim.x * blockDim.x) {
        long long acc = 0;
        #pragma unroll 8
        for (int b = 0; b < nblk; ++b) {
            off[(long long)b * K + k] = acc;
            acc += hist[(long long)b * K + k];
        }
        counts[k] = acc;
    }
}
// 2b. One block: base[k] = rows of labels < k (an exclusive scan of counts, 1024 labels at a
// time), and where wshift >= 0 the unit weights counts[k] << wshift (every sample weight 1).
extern "C" __global__ void __launch_bounds__(1024) label_bases(const long long* __restrict__ counts, int K,
                                                               int wshift, long long* __restrict__ base,
                                                               long long* __restrict__ weights) {
    __shared__ long long sh[1024];
    long long carry = 0;
    for (int k0 = 0; k0 < K; k0 += 1024) {
        const int k = k0 + threadIdx.x;
        const long long c = k < K ? counts[k] : 0;
        sh[threadIdx.x] = c;
        __syncthreads();
        for (int off = 1; off < 1024; off <<= 1) {  // inclusive Hillis-Steele scan
            const long long v = threadIdx.x >= off ? sh[threadIdx.x - off] : 0;
            __syncthreads();
            sh[threadIdx.x] += v;
            __syncthreads();
        }
        if (k < K) {
            base[k] = carry + sh[threadIdx.x] - c;
            if (wshift >= 0) weights[k] = c << wshift;
        }
        const long long total = sh[1023];
        __syncthreads();
        carry += total;
    }
}
// 3. Each row to base[k] + off[b K + k] + its rank among block b's rows of label k (in no
// particular order).
extern "C" __global__ void label_scatter(const int* __restrict__ lab, long long n, int K, long long R,
                                         const long long* __restrict__ off, const long long* __restrict__ base,
                                         long long* __restrict__ perm, int* __restrict__ slab) {
    extern __shared__ unsigned int cur[];
    const long long o = (long long)blockIdx.x * K;
    for (int i = threadIdx.x; i < K; i += blockDim.x) cur[i] = 0u;
    __syncthreads();
    const long long r0 = (long long)blockIdx.x * R, r1 = r0 + R < n ? r0 + R : n;
    for (long long r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
        const int k = lab[r];
        const long long pos = base[k] + off[o + k] + atomicAdd(cur + k, 1u);
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

// Per-cluster sums, int64 on the fit's grid (S: the D scales 2^-e), from rows sorted by label (perm: row ids in label order, slab: the
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
        const double* __restrict__ S, long long* __restrict__ sums, double* __restrict__ stat) {
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
            long long acc[CPL];
            double cv[CPL], sc[CPL];
            int cur = __shfl_sync(FULL, myk, 0);
            #pragma unroll
            for (int t = 0; t < CPL; ++t) {
                const int j = c0 + lane + 32 * t;
                acc[t] = 0;
                sc[t] = j < D ? S[j] : 0.0;
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
                                    atomic_add_ll(sums + (long long)cur * D + j, acc[t]);
                                    if (stat) cv[t] = (double)C[(long long)k * D + j];
                                }
                                acc[t] = 0;
                            }
                            cur = k;
                        }
                        #pragma unroll
                        for (int t = 0; t < CPL; ++t) {
                            const double v = (double)xv[g][t];
                            acc[t] += on_grid(wr * v, sc[t]);
                            const double u = v - cv[t];  // 0 past D (both 0)
                            inert = fma(wr * u, u, inert);
                        }
                    }
                }
            }
            #pragma unroll
            for (int t = 0; t < CPL; ++t) {
                const int j = c0 + lane + 32 * t;
                if (j < D) atomic_add_ll(sums + (long long)cur * D + j, acc[t]);
            }
        }
    }
    if (stat) {
        inert = warp_sum(inert);
        if (lane == 0) atomicAdd(stat, inert);
    }
}
