// fused_select: the tf32 precision's float16 GEMM fused with select_rows' selection: the
// distance tile never leaves the SM. Compile-time: T (data type: float), DP (D padded to a
// multiple of BK, at most FUSED_MAX_DP of gpu_plan), NST (stages of the centroids' pipeline),
// BK (columns a stage: 32 or 64), WM x WN (the block's warps over rows x centroids: 4 x 2,
// each 32 rows by 64 centroids; 2 x 2, each 64 by 64; or 8 x 1, each 16 by 128).
//
// A block takes BM rows: it rounds them as gemm_prep MODE 4 does (x PS to float16, each row's
// error bound from ||x|| and ||x - xb||) into shared memory, where they stay, then streams the
// centroids (float16, CH: rows of DP values, zero past K and D) through NST shared-memory
// stages with cp.async, BN centroids and BK columns a stage. WM x WN warps each multiply
// BM / WM rows by BN / WN centroids with mma.sync m16n8k16 (float16 in, float32
// accumulated) and, at the end of each BN-centroid tile, fold their G + ||c||^2 into
// per-row top-3 states (only where the tile's minimum beats the state's third value). The
// float32 values are never rounded to float16 (the unfused path's output rounding): the bound
// (gpu_plan.error_bound, rounded_output=False) is tighter and fewer rows are re-ranked.
//
// After the last tile, the states merge (the quad's lanes, then the warps of a row band) and
// each warp certifies and re-ranks its share of rows with certify.cuh's exact_winner where at most two
// candidates remain; a row with three or more (its third value within the threshold) is
// listed. fused_recheck runs the same main loop on the listed rows and notes each one's
// candidates (any values within the bound serve: the threshold excludes exactly the centroids
// farther than the winner), fused_rerank re-ranks them exactly, and a row with more than FOUND
// is finished by fused_rescan's scan of every centroid on the CUDA cores. Either way the
// winner is the first exact float64 minimum, as on every path.
#ifndef FUSED_VOTE
#define FUSED_VOTE 0
#endif
#define BM 128
#define BN 128
#define NTH (32 * WM * WN)
#define WTM (BM / WM)     // a warp's rows
#define WTN (BN / WN)     // a warp's centroids
#define MT (WTM / 16)     // its 16-row mma tiles
#define NT (WTN / 8)      // its 8-centroid mma tiles (even: ldmatrix.x4 loads two)
#define SL (2 * MT)       // rows per thread: g and g + 8 of each 16-row tile
#define RPW (BM / (NTH / 32))  // rows a warp rounds and certifies
#define AST (DP + 8)  // row strides in halves: 16 bytes of padding, ldmatrix without conflicts
#define BST (BK + 8)
#define RT 256        // fused_rerank's and fused_rescan's threads, whatever the layout
#define FOUND 4       // candidates fused_recheck notes a row (its j1 aside); a row with more: fused_rescan
static_assert(DP % BK == 0 && BK % 16 == 0 && NST >= 2, "DP a multiple of BK, BK of 16, two stages or more");
static_assert(BM % (16 * WM) == 0 && BN % (16 * WN) == 0, "whole 16-row tiles and pairs of 8-centroid tiles");
static_assert((BN * (BK / 8)) % NTH == 0 && BM % (NTH / 32) == 0, "the loader and the rows even over the threads");

struct Cand {  // a row fused_rescan finishes
    long long r;
    int j1, j2;
    double thr;
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ void ldsm4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// One value of a row as gemm_prep MODE 4 rounds it: float16 bits of x PS (zero below TINY).
__device__ __forceinline__ unsigned short half_of(float f, float ps) { return f2h(fabsf(f) < TINY ? 0.0f : f * ps); }

// Stage ``step`` of a stream of the centroids' tiles from tile nt0 (tile nt0 + step / nk,
// columns (step % nk) BK on) into shared stage step % NST with cp.async; past the stream's
// ``nsteps`` an empty group, which keeps the wait counts uniform.
__device__ __forceinline__ void load_stage(const unsigned short* __restrict__ CH, int nt0, int step, int nsteps,
                                           unsigned b_base, int tid) {
    if (step < nsteps) {
        const int nk = DP / BK, nt = nt0 + step / nk, kk = step % nk, st = step % NST;
        #pragma unroll
        for (int i = tid; i < BN * (BK / 8); i += NTH) {
            const int n = i / (BK / 8), c = i % (BK / 8);
            cp16(b_base + ((st * BN + n) * BST + c * 8) * 2, CH + (long long)(nt * BN + n) * DP + kk * BK + c * 8);
        }
    }
    cp_commit();
}

// A block's BM rows as the GEMM reads them (row_of(lr): the data's row, or -1 for a zero row),
// rounded as gemm_prep MODE 4 rounds them into As; with BOUNDS, each row's error bound from
// ||x|| and ||x - xb|| into ebs (prep_rows' MODE 4).
template <bool BOUNDS, typename RowOf>
__device__ __forceinline__ void load_rows(const T* __restrict__ X, int D, float ps, RowOf row_of,
                                          unsigned short* As, double* ebs, double eA, double eR, double eB) {
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    for (int i = 0; i < RPW; ++i) {
        const int lr = wp * RPW + i;
        const long long r = row_of(lr);
        double s = 0.0, q = 0.0;
        for (int j = lane; j < DP; j += 32) {
            const T v = (r >= 0 && j < D) ? X[r * D + j] : (T)0;
            const float f = (float)v;
            const unsigned short hb = half_of(f, ps);
            if constexpr (BOUNDS) {
                const float e = fabsf(f) < TINY ? 0.0f : f - h2f(hb) / ps;
                s = fma((double)v, (double)v, s);
                q = fma((double)e, (double)e, q);
            }
            As[lr * AST + j] = hb;
        }
        if constexpr (BOUNDS) {
            s = warp_sum(s);
            q = warp_sum(q);
            if (lane == 0) ebs[lr] = eA * sqrt(s) + eR * sqrt(q) + eB;
        }
    }
}

// The block's rows (As) times ``nsteps`` stages of the centroids' tiles from tile nt0, their
// first NST - 1 stages already asked for (load_stage). WM x WN warps each multiply BM / WM rows
// by BN / WN centroids with mma.sync m16n8k16; at the end of each BN-centroid tile,
// epi(acc, cq, cb): the warp's accumulators (thread (g, t): rows g and g + 8 of each 16-row
// tile, centroids 8 j + 2 t and 8 j + 2 t + 1 of its WTN from the tile's start), the squared
// norms of those centroids, and cb, the first one's index (met in increasing order, as
// ins3_sel needs); then the accumulators are zeroed.
template <typename Epi>
__device__ __forceinline__ void stream_tiles(const unsigned short* __restrict__ CH, const float* __restrict__ csq,
                                             int nt0, int nsteps, unsigned a_base, unsigned b_base, Epi&& epi) {
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const int wm = wp / WN, wn = wp % WN, t = lane & 3;
    const int nk = DP / BK;
    float acc[MT][NT][4];
    auto zero = [&]() {
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int j = 0; j < NT; ++j)
                #pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;
    };
    zero();
    for (int step = 0; step < nsteps; ++step) {
        cp_wait<NST - 2>();
        __syncthreads();      // stage step % NST landed for every thread; stage (step - 1) % NST is free
        load_stage(CH, nt0, step + NST - 1, nsteps, b_base, tid);
        const int st = step % NST, nt = nt0 + step / nk, kk = step % nk;
        #pragma unroll
        for (int k16 = 0; k16 < BK / 16; ++k16) {
            unsigned a[MT][4];
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldsm4(a[mt], a_base + ((wm * WTM + mt * 16 + (lane & 15)) * AST + kk * BK + k16 * 16 + (lane >> 4) * 8) * 2);
            #pragma unroll
            for (int p = 0; p < NT / 2; ++p) {
                unsigned b[4];
                ldsm4(b, b_base + ((st * BN + wn * WTN + p * 16 + (lane & 7) + ((lane >> 4) << 3)) * BST + k16 * 16 +
                                   ((lane >> 3) & 1) * 8) * 2);
                #pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816(acc[mt][2 * p], a[mt], b[0], b[1]);
                    mma16816(acc[mt][2 * p + 1], a[mt], b[2], b[3]);
                }
            }
        }
        if (kk == nk - 1) {
            const int cb = nt * BN + wn * WTN + 2 * t;
            float2 cq[NT];
            #pragma unroll
            for (int j = 0; j < NT; ++j) cq[j] = *(const float2*)(csq + cb + 8 * j);
            epi(acc, cq, cb);
            zero();
        }
    }
}

extern "C" __global__ void __launch_bounds__(NTH, 2) fused_select(
        const T* __restrict__ X, int D, long long rows, float ps,  // ps: gemm_prep MODE 4's row scale
        const unsigned short* __restrict__ CH, int ntile,         // ntile BN x DP float16 centroids
        const float* __restrict__ csq,                             // ntile BN squared norms, +inf past K
        float fs,                                                  // G = fs x the accumulated products (normal)
        double eA, double eR, double eB,                           // eb = eA ||x|| + eR ||x - xb|| + eB
        const T* __restrict__ C,                                   // K x D centroids (data dtype)
        int exact, const double* __restrict__ w, const int* prev, int* labels,
        double* __restrict__ d2, double* __restrict__ stat, Cand* __restrict__ cands,
        unsigned long long* __restrict__ ncand) {
    extern __shared__ uint4 smem_raw[];
    unsigned short* As = (unsigned short*)smem_raw;           // BM x AST
    unsigned short* Bs = As + BM * AST;                       // NST x BN x BST
    double* ebs = (double*)(Bs + NST * BN * BST);             // BM error bounds
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const int wm = wp / WN, wn = wp % WN, g = lane >> 2, t = lane & 3;
    const long long r0 = (long long)blockIdx.x * BM;
    const int nsteps = ntile * (DP / BK);
    const unsigned a_base = smem_addr(As), b_base = smem_addr(Bs);

    #pragma unroll
    for (int s = 0; s < NST - 1; ++s) load_stage(CH, 0, s, nsteps, b_base, tid);
    load_rows<true>(X, D, ps, [&](int lr) { return r0 + lr < rows ? r0 + lr : -1LL; }, As, ebs, eA, eR, eB);

    const float inf = __int_as_float(0x7f800000);
    float b1[SL], b2[SL], b3[SL];
    int i1[SL], i2[SL];
    #pragma unroll
    for (int s = 0; s < SL; ++s) { b1[s] = b2[s] = b3[s] = inf; i1[s] = i2[s] = 0x7fffffff; }
    stream_tiles(CH, csq, 0, nsteps, a_base, b_base, [&](float (&acc)[MT][NT][4], const float2 (&cq)[NT], int cb) {
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int sl = 2 * mt + h;
                float m = inf;
                #pragma unroll
                for (int j = 0; j < NT; ++j)
                    m = fminf(m, fminf(fmaf(acc[mt][j][2 * h], fs, cq[j].x), fmaf(acc[mt][j][2 * h + 1], fs, cq[j].y)));
#ifdef FUSED_FOLD_MIN  // profile-step's variant: the tile's minimum alone (not the kernel's labels)
                if (m < b1[sl]) { b1[sl] = m; i1[sl] = cb; }
#elif FUSED_VOTE
                // The warp's vote, tile then pair of values: a branch the whole warp takes
                // or skips (a lane's insertion where its values do not beat its third is a
                // no-op), so a pair is inserted only where one of the warp's 32 lanes needs it.
                if (__any_sync(FULL, m < b3[sl])) {
                    #pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        const float v0 = fmaf(acc[mt][j][2 * h], fs, cq[j].x);
                        const float v1 = fmaf(acc[mt][j][2 * h + 1], fs, cq[j].y);
                        if (__any_sync(FULL, fminf(v0, v1) < b3[sl])) {
                            ins3_sel(v0, cb + 8 * j, b1[sl], i1[sl], b2[sl], i2[sl], b3[sl]);
                            ins3_sel(v1, cb + 8 * j + 1, b1[sl], i1[sl], b2[sl], i2[sl], b3[sl]);
                        }
                    }
                }
#else
                if (m < b3[sl]) {
                    #pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        ins3_sel(fmaf(acc[mt][j][2 * h], fs, cq[j].x), cb + 8 * j, b1[sl], i1[sl], b2[sl], i2[sl], b3[sl]);
                        ins3_sel(fmaf(acc[mt][j][2 * h + 1], fs, cq[j].y), cb + 8 * j + 1, b1[sl], i1[sl], b2[sl],
                                 i2[sl], b3[sl]);
                    }
                }
#endif
            }
        }
    });

    // Merge: the quad's four lanes share their rows; then the WN warps of a row band, one
    // after another into the band's first (merge3 is associative and commutative).
    #pragma unroll
    for (int sl = 0; sl < SL; ++sl) {
        shfl_merge3(b1[sl], i1[sl], b2[sl], i2[sl], b3[sl], 1);
        shfl_merge3(b1[sl], i1[sl], b2[sl], i2[sl], b3[sl], 2);
    }
    cp_wait<0>();
    __syncthreads();  // the stages are free: the merged states go there
    float* mb1 = (float*)Bs;
    float* mb2 = mb1 + BM;
    float* mb3 = mb2 + BM;
    int* mi1 = (int*)(mb3 + BM);
    int* mi2 = mi1 + BM;
    #pragma unroll
    for (int from = 1; from <= WN; ++from) {  // WN: the band's first writes the merged state
        if ((from < WN ? wn == from : wn == 0) && t == 0) {
            #pragma unroll
            for (int sl = 0; sl < SL; ++sl) {
                const int lr = wm * WTM + (sl >> 1) * 16 + g + (sl & 1) * 8;
                if (from > 1) merge3(b1[sl], i1[sl], b2[sl], i2[sl], b3[sl], mb1[lr], mi1[lr], mb2[lr], mi2[lr], mb3[lr]);
                mb1[lr] = b1[sl]; mb2[lr] = b2[sl]; mb3[lr] = b3[sl]; mi1[lr] = i1[sl]; mi2[lr] = i2[sl];
            }
        }
        __syncthreads();
    }

    // Certify and re-rank: a warp per row, RPW rows a warp.
    double inert = 0.0, moved = 0.0, checked = 0.0;
    for (int i = 0; i < RPW; ++i) {
        const int lr = wp * RPW + i;
        const long long r = r0 + lr;
        if (r >= rows) break;
        const double thr = rerank_threshold((double)mb1[lr], ebs[lr]);
        const bool sure = certain((double)mb2[lr], thr);
        const double v3 = (double)mb3[lr];
        if (!sure) checked += 1.0;
        // Three or more candidates: listed for fused_recheck. So is a row without a finite value
        // (every ||c||^2 beyond float32): each centroid a candidate (thr = +inf), which
        // fused_rerank leaves to fused_rescan's scan of every centroid.
        const bool none = !((double)mb1[lr] < (double)inf);
        if (none || (!sure && !(v3 > thr))) {
            if (lane == 0) {
                const unsigned long long at = atomicAdd(ncand, 1ull);
                cands[at] = none ? Cand{r, 0, 0, (double)inf} : Cand{r, mi1[lr], mi2[lr], thr};
            }
            continue;
        }
        int best = mi1[lr];
        double bd = 0.0;
        if (exact || !sure)
            best = exact_winner<1>(X + r * D, C, D, lane, thr, sure, v3, mi1[lr], mi2[lr], 0,
                                   [](int, double (&v)[1]) { v[0] = 0.0; }, bd);
        if (lane == 0) row_out(r, best, exact ? bd : 0.0, w, prev, labels, d2, inert, moved);
    }
    if (lane == 0) stat_out(stat, inert, moved, checked);
}

// The rows fused_select listed, BM at a time a block (grid-strided over the list, whose count
// is on the device), against the tiles [nt0, nt1) of the centroids that blockIdx.y of
// gridDim.y takes: fused_select's main loop on the tensor cores (the same float16 rows and
// centroids, float32 sums within the same bound), and every centroid whose value is within a
// row's threshold, but its j1 (whose exact distance fused_rerank starts from), noted in the
// row's list (FOUND of them at most; a row with more is counted on and left to fused_rescan,
// as is a row whose threshold is +inf). The counts (nfound) are zero at the start. One block per SM in its launch bounds:
// the main loop holds fused_select's 128 registers already, and the lists' bookkeeping would
// spill at two; the few listed rows leave the SMs' second block little to do.
extern "C" __global__ void __launch_bounds__(NTH, 1) fused_recheck(
        const T* __restrict__ X, int D, float ps, const unsigned short* __restrict__ CH, int ntile, int K,
        const float* __restrict__ csq, float fs, const Cand* __restrict__ cands,
        const unsigned long long* __restrict__ ncand, int* __restrict__ found, int* __restrict__ nfound) {
    extern __shared__ uint4 smem_raw[];
    unsigned short* As = (unsigned short*)smem_raw;
    unsigned short* Bs = As + BM * AST;
    float* sthr = (float*)(Bs + NST * BN * BST);  // BM thresholds and BM j1: fused_select's ebs
    int* sj1 = (int*)(sthr + BM);
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const int wm = wp / WN, g = lane >> 2;
    static_assert(NTH >= BM, "a thread per row loads the thresholds");
    const unsigned long long n = *ncand;
    const int per = (ntile + gridDim.y - 1) / gridDim.y;
    const int nt0 = blockIdx.y * per, nt1 = min(ntile, nt0 + per);
    if (nt0 >= nt1) return;  // the whole block: no tile of its share
    const int nsteps = (nt1 - nt0) * (DP / BK);
    const unsigned a_base = smem_addr(As), b_base = smem_addr(Bs);
    const float ninf = -__int_as_float(0x7f800000);
    for (unsigned long long b0 = (unsigned long long)blockIdx.x * BM; b0 < n; b0 += (unsigned long long)gridDim.x * BM) {
        __syncthreads();  // the last rows' readers of As and of the stages are done
        #pragma unroll
        for (int s = 0; s < NST - 1; ++s) load_stage(CH, nt0, s, nsteps, b_base, tid);
        load_rows<false>(X, D, ps, [&](int lr) { return b0 + lr < n ? cands[b0 + lr].r : -1LL; }, As, nullptr,
                         0.0, 0.0, 0.0);
        // The rows' thresholds (-inf: none to note, past the list, +inf, or already more than FOUND),
        // rounded up to float32 (a value it admits that the float64 threshold would not is one
        // more candidate, re-ranked exactly: any superset of the candidates gives the same
        // winner), and their j1, in shared memory where fused_select keeps its error bounds
        // (the main loop leaves no registers for them; stream_tiles' first barrier publishes them).
        if (tid < BM) {
            const unsigned long long c = b0 + tid;
            const bool live = c < n && cands[c].thr < -(double)ninf && nfound[c] <= FOUND;
            sthr[tid] = live ? __double2float_ru(cands[c].thr) : ninf;
            sj1[tid] = live ? cands[c].j1 : -1;
        }
        stream_tiles(CH, csq, nt0, nsteps, a_base, b_base, [&](float (&acc)[MT][NT][4], const float2 (&cq)[NT], int cb) {
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int lr = wm * WTM + mt * 16 + g + h * 8;
                    const float thr = sthr[lr];
                    const int j1 = sj1[lr];
                    // The tile's candidates of the row as bits (value 2 j + e: centroid cb + 8 j + e),
                    // noted one by one only where there are any (a few a row in all).
                    unsigned hit = 0u;
                    #pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        #pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int k = cb + 8 * j + e;
                            const float v = fmaf(acc[mt][j][2 * h + e], fs, e ? cq[j].y : cq[j].x);
                            hit |= (v <= thr && k < K && k != j1) ? 1u << (2 * j + e) : 0u;
                        }
                    }
                    if (hit) {
                        const unsigned long long c = b0 + lr;
                        #pragma unroll 1
                        for (; hit; hit &= hit - 1u) {
                            const int b = __ffs(hit) - 1;
                            const int at = atomicAdd(nfound + c, 1);
                            if (at >= FOUND) break;  // the row's list is full: fused_rescan's
                            found[c * FOUND + at] = cb + 8 * (b >> 1) + (b & 1);
                        }
                    }
                }
            }
        });
        cp_wait<0>();
    }
}

// The listed rows, a warp each (grid-strided): j1's exact distance, then each noted
// candidate's, the winner the first exact minimum (precedes: in any order, as exact_winner's
// scan finds it). A row with more than FOUND, or whose threshold is +inf, is listed for
// fused_rescan (its place in cands).
extern "C" __global__ void __launch_bounds__(RT, 2) fused_rerank(
        const T* __restrict__ X, int D, const T* __restrict__ C, int exact, const double* __restrict__ w,
        const int* prev, int* labels, double* __restrict__ d2, double* __restrict__ stat,
        const Cand* __restrict__ cands, const unsigned long long* __restrict__ ncand, const int* __restrict__ found,
        const int* __restrict__ nfound, unsigned long long* __restrict__ over, unsigned long long* __restrict__ nover) {
    const int lane = threadIdx.x & 31;
    const unsigned long long n = *ncand;
    const unsigned long long nwarp = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    double inert = 0.0, moved = 0.0;
    for (unsigned long long c = (((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5); c < n; c += nwarp) {
        const int m = nfound[c];
        const Cand q = cands[c];
        if (m > FOUND || !(q.thr < (double)__int_as_float(0x7f800000))) {
            if (lane == 0) over[atomicAdd(nover, 1ull)] = c;
            continue;
        }
        int best = q.j1;
        double bd = exact_d2(X + q.r * D, C + (long long)q.j1 * D, D, lane);
        for (int e = 0; e < m; ++e) {
            const int k = found[c * FOUND + e];
            const double dk = exact_d2(X + q.r * D, C + (long long)k * D, D, lane);
            if (precedes(dk, k, bd, best)) { bd = dk; best = k; }
        }
        if (lane == 0) row_out(q.r, best, exact ? bd : 0.0, w, prev, labels, d2, inert, moved);
    }
    if (lane == 0) stat_out(stat, inert, moved, 0.0);
}

// The rows fused_rerank left (more than FOUND candidates; ``over``: their places in cands), RG = 8 RW at a time a block (RW rows a warp), so that each
// centroid read serves RG rows: a warp per row read every centroid's float16 values once for
// each listed row (the whole float16 centroid matrix a row, from HBM where it exceeds L2). The
// block streams the centroids 32 at a time through shared memory (held in registers while the
// previous 32 are multiplied); lane l takes centroid k0 + l and computes its float32 value for
// each of the warp's rows (the rows' float16 values times the centroid's, as the tensor cores
// multiply them: exact products, a float32 sum within the same bound). Every centroid within a
// row's threshold is re-ranked by its exact float64 distance (the warp together); the winner
// is the first exact minimum (precedes), as exact_winner's scan finds it, in any order.
// Two blocks per SM: the bound gives it the registers it needs without spilling.
#define RW (DP <= 160 ? 4 : 2)  // rows a warp: xs and the centroid stage within 48 KiB of static shared memory
#define RG (RW * (RT / 32))
#define CST (DP + 8)            // a staged centroid's stride in halves: 16-byte loads without bank conflicts
#define NLD ((32 * (DP / 8) + RT - 1) / RT)  // 16-byte loads a thread per 32 centroids
extern "C" __global__ void __launch_bounds__(RT, 2) fused_rescan(
        const T* __restrict__ X, int D, float ps, const unsigned short* __restrict__ CH, int K,
        const float* __restrict__ csq, float fs, const T* __restrict__ C, int exact,
        const double* __restrict__ w, const int* prev, int* labels, double* __restrict__ d2,
        double* __restrict__ stat, const Cand* __restrict__ cands, const unsigned long long* __restrict__ over,
        const unsigned long long* __restrict__ nover) {
    __shared__ __align__(16) float xs[RG][DP];
    __shared__ __align__(16) unsigned short cs[32 * CST];
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const unsigned long long n = *nover;
    const float nan = __int_as_float(0x7fffffff);
    const int kpad = (K + 31) & ~31;  // CH holds whole tiles of FUSED_BN >= 32 rows: zero past K
    double inert = 0.0, moved = 0.0;
    for (unsigned long long g0 = (unsigned long long)blockIdx.x * RG; g0 < n; g0 += (unsigned long long)gridDim.x * RG) {
        long long r[RW];
        int best[RW], j1[RW];
        double thr[RW], bd[RW];
        __syncwarp();  // the warp's last reads of its rows' xs are done
        #pragma unroll
        for (int i = 0; i < RW; ++i) {
            const unsigned long long c = g0 + wp * RW + i;
            const bool live = c < n;
            const Cand q = live ? cands[over[c]] : Cand{0, 0, 0, -(double)__int_as_float(0x7f800000)};
            r[i] = live ? q.r : -1;
            thr[i] = q.thr;  // -inf past the list: no candidate
            best[i] = j1[i] = q.j1;
            for (int j = lane; j < DP; j += 32)
                xs[wp * RW + i][j] = live && j < D ? h2f(half_of((float)X[q.r * D + j], ps)) : 0.0f;
            bd[i] = live ? exact_d2(X + q.r * D, C + (long long)q.j1 * D, D, lane) : 0.0;
        }
        uint4 nxt[NLD];
        auto fetch = [&](int k0) {
            #pragma unroll
            for (int l = 0; l < NLD; ++l) {
                const int e = tid + l * RT;  // centroid e / (DP / 8), its 16-byte column e % (DP / 8)
                if (e < 32 * (DP / 8) && k0 < kpad)
                    nxt[l] = *(const uint4*)(CH + (long long)(k0 + e / (DP / 8)) * DP + (e % (DP / 8)) * 8);
            }
        };
        fetch(0);
        for (int k0 = 0; k0 < K; k0 += 32) {
            __syncthreads();  // the stage's last readers are done
            #pragma unroll
            for (int l = 0; l < NLD; ++l) {
                const int e = tid + l * RT;
                if (e < 32 * (DP / 8)) *(uint4*)(cs + (e / (DP / 8)) * CST + (e % (DP / 8)) * 8) = nxt[l];
            }
            __syncthreads();
            fetch(k0 + 32);
            float a[RW];
            #pragma unroll
            for (int i = 0; i < RW; ++i) a[i] = 0.0f;
            const unsigned short* cr = cs + lane * CST;
            #pragma unroll 2
            for (int j8 = 0; j8 < DP / 8; ++j8) {
                const uint4 u = *(const uint4*)(cr + 8 * j8);
                const float c8[8] = {h2f((unsigned short)(u.x & 0xffffu)), h2f((unsigned short)(u.x >> 16)),
                                     h2f((unsigned short)(u.y & 0xffffu)), h2f((unsigned short)(u.y >> 16)),
                                     h2f((unsigned short)(u.z & 0xffffu)), h2f((unsigned short)(u.z >> 16)),
                                     h2f((unsigned short)(u.w & 0xffffu)), h2f((unsigned short)(u.w >> 16))};
                #pragma unroll
                for (int i = 0; i < RW; ++i) {
                    const float4 xa = *(const float4*)(xs[wp * RW + i] + 8 * j8);
                    const float4 xb = *(const float4*)(xs[wp * RW + i] + 8 * j8 + 4);
                    a[i] = fmaf(xa.x, c8[0], a[i]); a[i] = fmaf(xa.y, c8[1], a[i]);
                    a[i] = fmaf(xa.z, c8[2], a[i]); a[i] = fmaf(xa.w, c8[3], a[i]);
                    a[i] = fmaf(xb.x, c8[4], a[i]); a[i] = fmaf(xb.y, c8[5], a[i]);
                    a[i] = fmaf(xb.z, c8[6], a[i]); a[i] = fmaf(xb.w, c8[7], a[i]);
                }
            }
            const int k = k0 + lane;
            const float cq = k < K ? csq[k] : nan;  // past K: NaN, never a candidate (not <= thr, also where thr is +inf)
            #pragma unroll
            for (int i = 0; i < RW; ++i) {
                const double v = (double)fmaf(a[i], fs, cq);
                // j1's exact distance is already bd's (a row past the list has none).
                unsigned m = __ballot_sync(FULL, r[i] >= 0 && k != j1[i] && v <= thr[i]);
                while (m) {
                    const int kk = k0 + __ffs(m) - 1;
                    m &= m - 1;
                    const double dk = exact_d2(X + r[i] * D, C + (long long)kk * D, D, lane);
                    if (precedes(dk, kk, bd[i], best[i])) { bd[i] = dk; best[i] = kk; }
                }
            }
        }
        #pragma unroll
        for (int i = 0; i < RW; ++i)
            if (lane == 0 && r[i] >= 0) row_out(r[i], best[i], exact ? bd[i] : 0.0, w, prev, labels, d2, inert, moved);
    }
    if (lane == 0) stat_out(stat, inert, moved, 0.0);
}
