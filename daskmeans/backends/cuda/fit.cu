
// Kernels of a fit outside the assignment: the moments pass, the update, the cluster sizes, a
// chunk's pin.

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

// The moments pass (per-column mean, sum of squared deviations, largest |x|, first non-finite
// row) of one block X (n x D) in a fixed order: block (b, y) owns rows [b R, b R + R) and
// columns 32 y .. 32 y + 31 (lane l: column 32 y + l, so a warp reads 128 consecutive bytes of
// a row); warp w takes rows b R + w, + 8, ... and writes its partial to part[(8 b + w) D + c].
// Without mean: sums, largest |x| (pmax) and the first non-finite row (atomicMin into bad);
// with mean: sums of (x - mean)^2. col_reduce then adds (or takes the largest of) the
// partials of each column in partial order, dividing by div.
template <typename V>
__device__ __forceinline__ void col_pass(const V* __restrict__ X, long long n, int D, long long R,
                                         const double* __restrict__ mean, double* __restrict__ psum,
                                         double* __restrict__ pmax, unsigned long long* __restrict__ bad) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int c = blockIdx.y * 32 + lane;
    if (c >= D) return;
    const long long r0 = (long long)blockIdx.x * R, r1 = r0 + R < n ? r0 + R : n;
    const double mu = mean ? mean[c] : 0.0;
    double s = 0.0, m = 0.0;
    unsigned long long first = ~0ull;
    for (long long r = r0 + w; r < r1; r += 8) {
        const double v = (double)X[r * D + c];
        if (mean) {
            const double t = v - mu;
            s = fma(t, t, s);
        } else {
            s += v;
            const double a = fabs(v);
            m = a > m ? a : m;
            if (!isfinite(v) && first == ~0ull) first = (unsigned long long)r;
        }
    }
    const long long p = ((long long)blockIdx.x * 8 + w) * D + c;
    psum[p] = s;
    if (!mean) {
        pmax[p] = m;
        if (first != ~0ull) atomicMin(bad, first);
    }
}
#define COL_PASS(NAME, V) extern "C" __global__ void __launch_bounds__(256) NAME( \
        const V* __restrict__ X, long long n, int D, long long R, const double* __restrict__ mean, \
        double* __restrict__ psum, double* __restrict__ pmax, unsigned long long* __restrict__ bad) { \
    col_pass<V>(X, n, D, R, mean, psum, pmax, bad); }
COL_PASS(col_pass_f32, float)
COL_PASS(col_pass_f64, double)
extern "C" __global__ void __launch_bounds__(256) col_reduce(const double* __restrict__ part, int P, int D,
                                                            int take_max, double div, double* __restrict__ out) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) {
        double a = 0.0;
        for (int p = 0; p < P; ++p) {
            const double v = part[(long long)p * D + c];
            a = take_max ? (v > a ? v : a) : a + v;
        }
        out[c] = a / div;
    }
}
// A chunk's pin (a hash of its bytes, to see that a chunk read again is the chunk first read):
// the wrapped sum over 32-bit words w[i] of splitmix64's finaliser of w[i] + i * golden. The
// finaliser is a bijection, so a changed or moved word changes its term; addition modulo 2^64
// is associative, so the block count and the atomics' order do not change the result. One
// pass at memory speed, no host round trip but the result's 8 bytes.
extern "C" __global__ void __launch_bounds__(256) pin_words(const unsigned int* __restrict__ w, long long n,
                                                           unsigned long long* __restrict__ out) {
    unsigned long long acc = 0ull;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned long long h = (unsigned long long)w[i] + (unsigned long long)i * 0x9E3779B97F4A7C15ull;
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
        h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
        acc += h ^ (h >> 31);
    }
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(FULL, acc, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}
