// group_min: Yinyang's per-group lower bounds from a row-major GEMM tile, a warp per row.
// Compile-time: GT (the type the values are compared in: float, or double for float64 data;
// also the squared norms' type) and GH (defined where the tile holds float16 bits: gemm_prep
// MODE 4, scaled by gsc on reading; else the tile's elements are GT). The tile's columns are
// the centroids sorted by group, so that group q is the columns [starts[q], starts[q + 1]).
//
// For row r and group q, the smallest value v = G[r, c] gsc + ||c||^2 over the group's columns
// but the row's own centroid's (column own[r]), computed as the selections compute it (in GT:
// the value whose distance from ||c||^2 - 2 x.c the row's certified bound eb[r], gemm_prep's
// output, covers), so v - eb[r] + ||x||^2 is at most the group's smallest exact squared
// distance; less err for the float64 arithmetic of that sum (rel, as backends/bounds.py's
// margins). Written as a distance rounded down by (1 - delta); +inf where the group holds no
// other centroid. A NaN value is skipped by fmin (a row with one has a NaN upper bound, and
// stays uncertain whatever its lower bounds).
#ifdef GH
typedef unsigned short GS;
__device__ __forceinline__ GT gval(GS g, GT gsc) { return h2f(g) * gsc; }
#else
typedef GT GS;
__device__ __forceinline__ GT gval(GS g, GT gsc) { return g * gsc; }
#endif

extern "C" __global__ void __launch_bounds__(256) group_min(
        const GS* __restrict__ G, long long ldg, long long rows, const GT* __restrict__ csq,
        const int* __restrict__ starts, int t, const int* __restrict__ own,
        const double* __restrict__ eb, const double* __restrict__ xnorm, GT gsc, double rel,
        double cmax, double delta, double* __restrict__ lower) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarp = ((long long)gridDim.x * blockDim.x) >> 5;
    const GT ginf = (GT)__longlong_as_double(0x7ff0000000000000ll);
    const double inf = __longlong_as_double(0x7ff0000000000000ll);
    for (long long r = warp; r < rows; r += nwarp) {
        const GS* __restrict__ g = G + r * ldg;
        const int mine = own[r];
        const double xn2 = xnorm[r];
        const double xn = sqrt(xn2) * (1.0 + delta);
        // the float64 rounding of v - eb + ||x||^2 (backends/bounds.py's err, rel its eps)
        const double shift = xn2 - eb[r] - rel * (2.0 * xn * cmax + cmax * cmax + xn2);
        int s = starts[0];
        for (int q = 0; q < t; ++q) {
            const int e = starts[q + 1];
            GT m = ginf;
            for (int c = s + lane; c < e; c += 32) {
                if (c != mine) {
                    m = fmin(m, gval(g[c], gsc) + csq[c]);
                }
            }
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                m = fmin(m, __shfl_xor_sync(FULL, m, o));
            }
            if (lane == 0) {
                lower[r * t + q] = m == ginf ? inf : sqrt(fmax((double)m + shift, 0.0)) * (1.0 - delta);
            }
            s = e;
        }
    }
}
