
// Compile-time: T (data type), GT (the type values are compared in), GV (the GEMM tile's 16-byte
// vector), VEC (its lanes), GS (the tile's element), CV (VEC squared norms). GH: the tile holds float16 values
// (gemm_prep MODE 4), scaled by the kernel's gsc on reading; CV is then two float4.
// B (vectors per lane per batch: B * 32 * VEC values of a row), CH (top-3 states per lane,
// select_rows) and SS_MINB (sorted_sums' blocks per SM) come from select_source.
// float16 conversions (PTX: no header needed under NVRTC), round to nearest even.
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#ifdef GH
typedef unsigned short GS;  // the tile's element: float16 bits
struct f8 { float4 a, b; };
typedef f8 CV;
__device__ __forceinline__ GV vinf() { return make_uint4(0x7c007c00u, 0x7c007c00u, 0x7c007c00u, 0x7c007c00u); }
__device__ __forceinline__ CV cvinf() {
    const float i = __int_as_float(0x7f800000);
    return CV{make_float4(i, i, i, i), make_float4(i, i, i, i)};
}
__device__ __forceinline__ GT comp(const GV& v, int e) {
    const unsigned w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
    return h2f((unsigned short)((e & 1) ? w >> 16 : w & 0xffffu));
}
__device__ __forceinline__ GT ccomp(const CV& v, int e) {
    const float4& h = e < 4 ? v.a : v.b;
    const int f = e & 3;
    return f == 0 ? h.x : f == 1 ? h.y : f == 2 ? h.z : h.w;
}
#define GSCALE(x) ((x) * gsc)
#else
typedef GT GS;
typedef GV CV;
__device__ __forceinline__ GV vinf() {
    const GT i = (GT)__longlong_as_double(0x7ff0000000000000ll);
#if VEC == 4
    return make_float4(i, i, i, i);
#else
    return make_double2(i, i);
#endif
}
__device__ __forceinline__ CV cvinf() { return vinf(); }
__device__ __forceinline__ GT comp(const GV& v, int e) {
#if VEC == 4
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
#else
    return e == 0 ? v.x : v.y;
#endif
}
__device__ __forceinline__ GT ccomp(const CV& v, int e) { return comp(v, e); }
#define GSCALE(x) (x)
#endif
// GEMM inputs of a row tile and each row's certified error bound (a warp per row, lanes over
// D). gemm_prep<MODE>, MODE 0: no rounded copy (the GEMM reads X itself: fp32 SGEMM, float64);
// 1: xb = X rounded to TF32 (to nearest even; the tensor cores then take xb exactly);
// 2: split TF32, out = [xb | xb | xs] per row (xs = x - xb exactly), or [xb | xs | xb]
// when CEN (the centroid side): one TF32 GEMM of inner dimension 3D sums xb.cb + xb.cs +
// xs.cb, fp32-accurate up to xs.cs; 3: xb rounded to bfloat16, written as its bits; 4: x PS
// (PS a power of two that keeps the values in range) rounded to float16 (TF32's 10-bit
// mantissa), written as its bits, xb = that value / PS.
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
                                          double eA, double eR, double eB, float ps) {
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
                            const float f = (float)v[a][u];
                            float b;
                            if constexpr (M == 4) {
                                const unsigned short hb = f2h(fabsf(f) < TINY ? 0.0f : f * ps);
                                b = h2f(hb) / ps;  // exact: ps is a power of two
                                h[r * D + j] = hb;
                            } else {
                                b = round_mant(f, M == 3 ? 7 : 10);
                            }
                            // exact: Sterbenz, or b = 0, or both on float16's subnormal grid
                            const float e = fabsf(f) < TINY ? 0.0f : f - b;
                            q[a] = fma((double)e, (double)e, q[a]);
                            if constexpr (M == 1) o[r * D + j] = b;
                            else if constexpr (M == 4) {}
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
// The select_cols module (RPT defined) holds select_cols alone: the rest is compiled once, in
// the module without RPT.
#ifndef RPT
#define PREP(M) extern "C" __global__ void __launch_bounds__(256, 3) gemm_prep##M( \
        const T* __restrict__ X, long long rows, int D, int cen, void* __restrict__ out, double* __restrict__ sq, \
        double* __restrict__ rsq, double* __restrict__ eb, double eA, double eR, double eB, float ps) { \
    prep_rows<M>(X, rows, D, cen, out, sq, rsq, eb, eA, eR, eB, ps); }
PREP(0)
PREP(1)
PREP(2)
PREP(3)
PREP(4)
#endif  // !RPT

// Certify and re-rank: the one place a row's winner is decided from its top-2 and third value
// (v1 <= v2 <= v3 of G + csq, indices j1, j2) and its error bound eb (|G + csq - exact| <= eb).
// Any k whose G + csq exceeds thr = v1 + 2 eb is certainly farther than j1:
// certain(v2, thr): j1 wins without an exact distance.
__device__ __forceinline__ double rerank_threshold(double v1, double eb) { return v1 + 2.0 * eb; }
__device__ __forceinline__ bool certain(double v2, double thr) { return v2 > thr; }
// Otherwise (and for any row whose exact distance is wanted) a warp computes exact float64
// distances: to j1, to j2 as well where v3 > thr (two candidates), else to every k that the
// bound cannot exclude, found by a scan of the row: lane l loads W values of G + csq at a
// time, those of centroids (q0 + l) W .. (q0 + l) W + W - 1 (load(q, v); +inf past K), for q
// below nq. The winner is the first minimum of the exact distances (precedes), so the result
// does not depend on the order candidates are found in. Returns the winner; bd its exact
// distance.
template <int W, typename Load>
__device__ __forceinline__ int exact_winner(const T* __restrict__ x, const T* __restrict__ C, int D, int lane,
                                            double thr, bool sure, double v3, int j1, int j2, int nq,
                                            Load load, double& bd) {
    int best = j1;
    bd = exact_d2(x, C + (long long)j1 * D, D, lane);
    if (sure) return best;
    if (v3 > thr) {
        const double dk = exact_d2(x, C + (long long)j2 * D, D, lane);
        if (precedes(dk, j2, bd, best)) { bd = dk; best = j2; }
        return best;
    }
    for (int q0 = 0; q0 < nq; q0 += 32) {
        double v[W];
        load(q0 + lane, v);
        #pragma unroll
        for (int e = 0; e < W; ++e) {
            unsigned m = __ballot_sync(FULL, (q0 + lane) * W + e != j1 && v[e] <= thr);
            while (m) {
                const int k = (q0 + __ffs(m) - 1) * W + e;
                m &= m - 1;
                const double dk = exact_d2(x, C + (long long)k * D, D, lane);
                if (precedes(dk, k, bd, best)) { bd = dk; best = k; }
            }
        }
    }
    return best;
}

#ifndef RPT
// One warp per row, rows grid-strided. A row's values come in batches of B vectors per lane;
// batch t+1 (possibly the next row's first, with its x) is loaded before batch t is compared,
// so a warp always has a batch in flight, also while it merges and certifies a row.
extern "C" __global__ void __launch_bounds__(256, 2) select_rows(
        const GS* __restrict__ G, int ldg,          // rows x ldg tile, ldg % VEC == 0
        const GT* __restrict__ csq,                 // ldg squared norms, +inf past K
        const T* __restrict__ X, int D, long long rows,
        const T* __restrict__ C,                    // K x D centroids (data dtype)
        const double* __restrict__ eb,              // per row: |G+csq - exact| <= eb (gemm_prep)
        int exact,                                  // 1: the winner's exact distance here (inertia, d2)
        const double* __restrict__ w,
        const int* prev, int* labels,               // may alias (so neither is __restrict__)
        double* __restrict__ d2, double* __restrict__ stat,     // stat: inertia, reassigned, rechecked
        float gsc) {                                // GH: G = gsc x the tile's float16 values
    const int lane = threadIdx.x & 31;
    const long long nwarp = ((long long)gridDim.x * blockDim.x) >> 5;
    const int nv = ldg / VEC, nbat = (nv + 32 * B - 1) / (32 * B);
    const CV* cq = (const CV*)csq;
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
            const CV cv = q < nv ? cq[q] : cvinf();
            #pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const GT v = GSCALE(comp(cur[b], e)) + ccomp(cv, e);
                const int c = (b * VEC + e) % CH;
                ins3_sel(v, q * VEC + e, b1[c], i1[c], b2[c], i2[c], b3[c]);
            }
        }
        if (bn == 0) {  // row r is complete
            #pragma unroll
            for (int c = 1; c < CH; ++c) merge3(b1[0], i1[0], b2[0], i2[0], b3[0], b1[c], i1[c], b2[c], i2[c], b3[c]);
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) shfl_merge3(b1[0], i1[0], b2[0], i2[0], b3[0], off);
            const double thr = rerank_threshold((double)b1[0], ebc);
            const bool sure = certain((double)b2[0], thr);
            int best = i1[0];
            double bd = 0.0;
            if (exact || !sure) {
                const GV* g = (const GV*)(G + r * (long long)ldg);
                best = exact_winner<VEC>(X + r * D, C, D, lane, thr, sure, (double)b3[0], i1[0], i2[0], nv,
                                         [&](int q, double (&v)[VEC]) {
                                             const bool ok = q < nv;
                                             const GV gv = ok ? g[q] : vinf();
                                             const CV cv = ok ? cq[q] : cvinf();
                                             #pragma unroll
                                             for (int e = 0; e < VEC; ++e) v[e] = (double)(GSCALE(comp(gv, e)) + ccomp(cv, e));
                                         }, bd);
                checked += sure ? 0.0 : 1.0;
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

#endif  // !RPT

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
                const double thr = rerank_threshold((double)a1, eb[r]);
                const bool sure = certain((double)a2, thr);
                if (exact || !sure) {
                    flist[atomicAdd(&nflag, 1)] = i;
                    checked += sure ? 0.0 : 1.0;
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
            const double thr = sthr[i];
            double bd;
            const int best = exact_winner<1>(X + r * D, C, D, lane, thr, certain((double)sb2[0][i], thr),
                                             (double)sb3[0][i], si1[0][i], si2[0][i], kpad,
                                             [&](int k, double (&v)[1]) {
                                                 v[0] = k < kpad ? (double)(Gt[(long long)k * ldr + r] + csq[k]) : (double)inf;
                                             }, bd);
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

#ifndef RPT
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
#endif  // !RPT
