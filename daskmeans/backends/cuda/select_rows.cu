// select_rows: the selection on a row-major GEMM tile, a warp per row.
// Compile-time: T (data type), GT (the type values are compared in), GV (the GEMM tile's 16-byte
// vector), VEC (its lanes), GS (the tile's element), CV (VEC squared norms). GH: the tile holds
// float16 values (gemm_prep MODE 4), scaled by the kernel's gsc on reading; CV is then two
// float4. B (vectors per lane per batch: B * 32 * VEC values of a row) and CH (top-3 states per
// lane) come from cuda_src.select_rows_source.
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

