// select_cols: the selection on a column-major float32 GEMM tile, RPT rows per thread.
// Compile-time: T (data type), RPT, SC_MINB (blocks per SM) from cuda_src.select_cols_source.
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
