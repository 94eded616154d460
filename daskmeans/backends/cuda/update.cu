
// The Lloyd update from a fit's combined integer sums, and the squared shift, summed in a fixed
// order (the same bits on every rank and run; no CUB: its reductions cost seconds of NVRTC on a
// cold kernel cache). c = s 2^e[j] / (w 2^we) where w > 0, else the old value (as the NumPy
// backend, bit for bit). Each block sums its elements' (c - old)^2 into part[block] in a fixed
// tree; sum_parts adds the parts in a fixed tree (one block). The grid size is a function of
// K x D only, so the order does not depend on the device either.
__device__ __forceinline__ double block_sum(double v, double* sh) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.0;
    if (wid == 0) v = warp_sum(v);
    return v;  // in thread 0
}
extern "C" __global__ void __launch_bounds__(256) update_centroids(
        const long long* __restrict__ s, const int* __restrict__ e, const long long* __restrict__ w, int we,
        const double* __restrict__ old, double* __restrict__ c, long long K, int D, double* __restrict__ part) {
    __shared__ double sh[8];
    double acc = 0.0;
    const long long n = K * D;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long k = i / D;
        const int j = (int)(i - k * D);
        const double o = old[i];
        const double v = w[k] > 0 ? ldexp((double)s[i], e[j]) / ldexp((double)w[k], we) : o;
        c[i] = v;
        acc = fma(v - o, v - o, acc);
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
extern "C" __global__ void __launch_bounds__(256) sum_parts(const double* __restrict__ part, int n,
                                                           double* __restrict__ out) {
    __shared__ double sh[8];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += part[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = acc;
}
// Rows per label (the cluster sizes under the final centroids): block-local counters in
// shared memory where K fits (SK = K), else global ones (SK = 0). Not cupy.bincount: it
// checks the labels with CuPy's CUB reduction (seconds of NVRTC on a cold kernel cache) and
// synchronises with the host.
extern "C" __global__ void __launch_bounds__(256) label_counts(const int* __restrict__ lab, long long n, int K,
                                                              int SK, unsigned long long* __restrict__ counts) {
    extern __shared__ unsigned int h[];
    for (int i = threadIdx.x; i < SK; i += blockDim.x) h[i] = 0u;
    __syncthreads();
    for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += (long long)gridDim.x * blockDim.x) {
        if (SK) atomicAdd(h + lab[r], 1u);
        else atomicAdd(counts + lab[r], 1ull);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < SK; i += blockDim.x)
        if (h[i]) atomicAdd(counts + i, (unsigned long long)h[i]);
}
