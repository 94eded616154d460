
#define FULL 0xffffffffu
__device__ __forceinline__ double warp_sum(double v) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL, v, off);
    return v;
}
__device__ __forceinline__ long long warp_sum_ll(long long v) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL, v, off);
    return v;
}
// A weighted value w x as an int64 multiple of its grid step (scale = 2^-e): rounded once, to
// nearest, ties to even (the CPU kernels' np.rint), so sums of these are exact in any order.
__device__ __forceinline__ long long on_grid(double v, double scale) { return __double2ll_rn(v * scale); }
// int64 atomic add (two's complement: the unsigned form's bits).
__device__ __forceinline__ void atomic_add_ll(long long* a, long long v) {
    atomicAdd((unsigned long long*)a, (unsigned long long)v);
}
// Exact squared distance of two D-vectors (float64), lanes striding over D, warp-reduced.
template <typename V>
__device__ __forceinline__ double exact_d2(const V* __restrict__ x, const V* __restrict__ c, int D, int lane) {
    double s = 0.0;
    for (int j = lane; j < D; j += 32) { const double t = (double)x[j] - (double)c[j]; s = fma(t, t, s); }
    return warp_sum(s);
}
// (v, k) comes before (b, i): a smaller value, or the lower index on equal values. Every argmin,
// merge and re-rank breaks ties with it, as NumPy's argmin does (the first minimum).
template <typename V>
__device__ __forceinline__ bool precedes(V v, int k, V b, int i) { return v < b || (v == b && k < i); }
// A row's running top-2 (value, index) pairs and third value, lowest index first on equal
// values. Insert (v, k), k larger than every index this thread has seen.
template <typename V>
__device__ __forceinline__ void ins3(V v, int k, V& b1, int& i1, V& b2, int& i2, V& b3) {
    if (v < b1) { b3 = b2; b2 = b1; i2 = i1; b1 = v; i1 = k; }
    else if (v < b2) { b3 = b2; b2 = v; i2 = k; }
    else if (v < b3) { b3 = v; }
}
// The same insertion without branches (selects only): in the streaming scans a warp's lanes
// insert at different values, and the divergent ins3 made select_rows issue-bound
// (docs/performance.md, "select_rows").
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
    if (precedes(c1, j1, b1, i1)) {
        V t = b1; b1 = c1; c1 = t; int u = i1; i1 = j1; j1 = u;
        t = b2; b2 = c2; c2 = t; u = i2; i2 = j2; j2 = u;
        t = b3; b3 = c3; c3 = t;
    }
    if (precedes(c1, j1, b2, i2)) { b3 = b2 < c2 ? b2 : c2; b2 = c1; i2 = j1; }
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
// gemm_prep (and fused_select, which rounds as it does) flushes inputs below this to zero.
#define TINY 7.888609052210118e-31f  // 2^-100
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
