
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
// warp would each pay for their own K x DPL centroid reads per row; docs/performance.md,
// "Small K").
#define NG (NT / L)
#define DP (L * DPL)
#define DX (DFULL ? DP : D)  // the row stride, a compile-time constant where D = DP
// Sums and weights are int64 multiples of the fit's grid steps (grid.py): each w x rounded once
// (on_grid), then added exactly, so any order of addition (atomics included) gives the same bits.
// CREG: a group's slice of shared memory, K x DP sums, K weights, K counts (weights only with
// sample weights; else the host derives them from the counts). Groups of L >= 2 lanes: slices one after
// another, an odd number of doubles apart. One lane per row: the slices interleaved (element e
// of group g at e x NG + g), so that the 32 lanes' accesses are consecutive words whatever
// cluster each row went to (contiguous slices meet random bank conflicts; docs/performance.md,
// "Small K").
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
        const double* __restrict__ S,      // D grid scales 2^-e (the sums' steps), or NULL without part
        double ws,                         // the weights' grid scale
        const int* prev,                   // n previous labels, or NULL
        int* labels,                       // n, or NULL; may alias prev (so neither is __restrict__)
        double* __restrict__ d2,           // n squared distances, or NULL
        long long* __restrict__ part,      // gridDim.x x (K*D + 2K + 2) block partials, or NULL
        double* __restrict__ pstat) {      // gridDim.x x 2 (inertia, reassigned): MODE 1, or MODE 0 without part
    extern __shared__ double sh[];
    const int lane = threadIdx.x % L;
#if CREG
    // Shared: NG x GS group slices (MODE 0 only), K weights, K counts, 2 scalars.
    long long* ssum = (long long*)sh;
    long long* sw = ssum + (MODE == 1 ? 0 : NG * GS);
    long long* gsum = ssum + (L == 1 ? threadIdx.x : (threadIdx.x / L) * GS);  // this group's slice, at GIX(e)
    for (int i = threadIdx.x; i < (MODE == 1 ? 0 : NG * GS); i += NT) ssum[i] = 0;
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
    long long* ssum = (long long*)(cs + K * DP);  // K x DP block sums (none in MODE 1)
    long long* sw = ssum + (MODE == 1 ? 0 : K * DP);  // K block weights
    for (int i = threadIdx.x; i < K * DP; i += NT) {
        int k = i / DP, j = i - k * DP;
        cs[i] = j < D ? C[(long long)k * D + j] : 0.0;
        if (MODE != 1) ssum[i] = 0;
    }
#endif
    long long* scnt = sw + K;        // K block counts
    double* sst = (double*)(scnt + K);  // inertia, reassigned
    const bool want = MODE != 1 && part != nullptr;
    for (int i = threadIdx.x; i < 2 * K + 2; i += NT) sw[i] = 0;  // all-zero bits: 0.0 for sst
#if MODE != 1
    double sc[DPL];  // this lane's columns' grid scales
    #pragma unroll
    for (int j = 0; j < DPL; ++j) sc[j] = (want && lane + j * L < D) ? S[lane + j * L] : 0.0;
#endif
    __syncthreads();

    const int gw = (threadIdx.x & 31) / L;                       // group within the warp
    const long long warp = ((long long)blockIdx.x * NT + threadIdx.x) >> 5;
    const long long nwarp = ((long long)gridDim.x * NT) >> 5;
#if RACC
    long long acc[KACC][DPL];
    long long accw[KACC];  // only with sample weights
    int accn[KACC];
    #pragma unroll
    for (int k = 0; k < KACC; ++k) {
        accw[k] = 0; accn[k] = 0;
        #pragma unroll
        for (int j = 0; j < DPL; ++j) acc[k][j] = 0;
    }
#endif
    double inert = 0.0, moved = 0.0;
    // U rows per group per trip: their loads are all issued before the first use
    // (memory-level parallelism). For one lane per row, one loop body in two passes: the warp's
    // whole trips without row checks, then at most one partial trip whose rows past n are
    // masked (with one lane per row, the checks and 64-bit row addresses are a large share of
    // the instructions per row). With L >= 2 lanes per row those costs are shared, and with
    // register accumulators the second copy of the body costs registers (enough to lose a
    // block per SM: docs/performance.md, "Small K"), so there is only the checked pass. The loop
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
                if (precedes(ob, ok, best, bk)) { best = ob; bk = ok; }
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
                // k = 0 taken as is: comparing it with +inf costs instructions per row (the
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
                long long* o = gsum + GIX(bk * DP + lane);  // this group's slice: no other writer
                #pragma unroll
                for (int j = 0; j < DPL; ++j) o[GIX(j * L)] += on_grid(wr * xv[j], sc[j]);
                if (lane == 0) {
                    if (w) gsum[GIX(KACC * DP + bk)] += on_grid(wr, ws);
                    gsum[GIX(KACC * (DP + 1) + bk)] += 1;
                }
            }
#elif KACC > 0
            #pragma unroll
            for (int k = 0; k < KACC; ++k) {
                if (k == bk) {
                    #pragma unroll
                    for (int j = 0; j < DPL; ++j) acc[k][j] += on_grid(wr * xv[j], sc[j]);
                    if (w) accw[k] += on_grid(wr, ws);
                    accn[k] += 1;
                }
            }
#else
            long long* o = ssum + bk * DP + lane;
            #pragma unroll
            for (int j = 0; j < DPL; ++j) if (lane + j * L < D) atomic_add_ll(o + j * L, on_grid(wr * xv[j], sc[j]));
            if (lane == 0) {
                if (w) atomic_add_ll(sw + bk, on_grid(wr, ws));
                atomic_add_ll(scnt + bk, 1);
            }
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
                    if (lane == 0) { sw[k] += accw[k]; scnt[k] += accn[k]; }
                }
            }
#endif
            if ((threadIdx.x & 31) == 0) { sst[0] += inert; sst[1] += moved; }
        }
        __syncthreads();
    }
    if (want) {
        const int KD = K * D;
        long long* o = part + (long long)blockIdx.x * (KD + 2 * K + 2);
#if CREG
#if L == 1
        // Element e of the NG interleaved slices: one warp adds groups lane, lane + 32, ... in
        // order, then a fixed butterfly (deterministic), into group 0's place.
        for (int e = threadIdx.x >> 5; e < GE; e += NT / 32) {
            long long t = 0;
            for (int g = threadIdx.x & 31; g < NG; g += 32) t += ssum[e * NG + g];
            t = warp_sum_ll(t);
            if ((threadIdx.x & 31) == 0) ssum[e * NG] = t;
        }
        __syncthreads();
#else
        // The groups' slices summed by a fixed pairwise tree (NG is a power of 2; a thread
        // walking all NG slices is latency-bound).
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
            const int e = i < KD ? k * DP + (i - k * D) : KACC * DP + (i - KD);
            o[i] = ssum[GIX(e)];
        }
        if (threadIdx.x < 2) o[KD + 2 * K + threadIdx.x] = __double_as_longlong(sst[threadIdx.x]);
#else
        for (int i = threadIdx.x; i < KD; i += NT) { int k = i / D; o[i] = ssum[k * DP + (i - k * D)]; }
        for (int i = threadIdx.x; i < 2 * K + 2; i += NT) o[KD + i] = sw[i];  // sst as its bits
#endif
    } else if (threadIdx.x < 2) {
        pstat[2 * blockIdx.x + threadIdx.x] = sst[threadIdx.x];
    }
}

// Column i of the block partials summed over blocks by one warp: lane l adds blocks l, l+32,
// ... in order, then a fixed butterfly (a thread per column walking all blocks is
// latency-bound). Sums, weights and counts [0, K*D + 2K) are int64 (out); the last two
// columns hold float64 bits (inertia, reassigned: stat).
extern "C" __global__ void reduce_parts(const long long* __restrict__ part, int nb, int width, int K, int KD,
                                        long long* __restrict__ out, double* __restrict__ stat) {
    const int i = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (i >= width) return;  // uniform across the warp
    if (i < KD + 2 * K) {
        long long s = 0;
        #pragma unroll 4
        for (int b = lane; b < nb; b += 32) s += part[(long long)b * width + i];
        s = warp_sum_ll(s);
        if (lane == 0) out[i] = s;
    } else {
        double s = 0.0;
        #pragma unroll 4
        for (int b = lane; b < nb; b += 32) s += __longlong_as_double(part[(long long)b * width + i]);
        s = warp_sum(s);
        if (lane == 0) stat[i - KD - 2 * K] = s;
    }
}
