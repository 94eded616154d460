
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
