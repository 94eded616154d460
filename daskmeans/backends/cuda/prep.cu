// gemm_prep: the GEMM's inputs of a row tile. Compile-time: T (data type).
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
#define PREP(M) extern "C" __global__ void __launch_bounds__(256, 3) gemm_prep##M( \
        const T* __restrict__ X, long long rows, int D, int cen, void* __restrict__ out, double* __restrict__ sq, \
        double* __restrict__ rsq, double* __restrict__ eb, double eA, double eR, double eB, float ps) { \
    prep_rows<M>(X, rows, D, cen, out, sq, rsq, eb, eA, eR, eB, ps); }
PREP(0)
PREP(1)
PREP(2)
PREP(3)
PREP(4)
