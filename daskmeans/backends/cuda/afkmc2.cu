// AFK-MC2's chains of one block on one CTA (daskmeans/seeding/afkmc2_chains.py: the host side,
// which launches this once per block of b chains on a side stream, beside the previous block's
// fold on the caller's stream, nothing read back until the last block).
//
// X (U, d) float64: the distinct proposal rows; prior (b, m): each proposal's squared distance
// to every centre chosen before the block (the host side's GEMMs, enqueued before this launch);
// q (U,): each row's proposal probability (> 0); chains (b, m): this block's chains' proposals,
// rows of X; u (b, m - 1): their acceptance uniforms; picks: every chain's pick (a row of X),
// this block's written at [s, s + b); work (b, m): each chain's squared distances, scratch.
//
// Chain i of the block: each warp takes AFK_R proposals j at a time; its lanes sum (x_j - c)^2
// over strided columns t = lane + 32 k, k ascending, by fused multiply-adds, for each earlier
// pick c of the block, then a butterfly (every lane has the same bits); the minimum with the prior
// is d2[j]. Where d <= 32 AFK_DCH (AFK_DCH > 0, compiled for the data's width), the proposals'
// values are read once per chain into registers and each pick's values once per AFK_R
// proposals (the block's picks stay in L1): one SM's loads, not its float64 lanes, would
// otherwise bound the block. A column past d adds fma(0, 0, acc) = acc: the same bits as the
// loop over global memory (AFK_DCH = 0, any d). Then warp 0 runs the
// Metropolis-Hastings chain: from state x, proposal j is taken when u[j-1] d2[x] q[j] < d2[j] q[x]
// (the host reference's expression, left to right, without contraction: __dmul_rn), the lanes
// testing 32 proposals against the same state at once; the first lane that accepts is the next
// state (the ones before it rejected it), and the lanes after it test again against the new one:
// exactly the sequential chain, in (accepts + m/32) ballots rather than m dependent steps. A state
// at distance 0 (a centre) is left for any proposal that is not (0 < d2[j] q[x]).
// One CTA runs at a time (the blocks are in order): the bounds let it have every register a
// thread may, where the default bound spilled the proposals' values at some widths.
extern "C" __global__ void __launch_bounds__(AFK_THREADS, 1) afkmc2_block(
        const double* __restrict__ X, const double* __restrict__ prior, const double* __restrict__ q,
        const long long* __restrict__ chains, const double* __restrict__ u, long long* picks,
        double* work, const int d, const int m, const int b, const long long s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
    for (int i = 0; i < b; ++i) {
        const long long* idx = chains + (long long)i * m;
        double* d2 = work + (long long)i * m;
#if AFK_DCH > 0
        for (int j0 = warp * AFK_R; j0 < m; j0 += nwarp * AFK_R) {
            double xv[AFK_R][AFK_DCH], v[AFK_R];
            #pragma unroll
            for (int r = 0; r < AFK_R; ++r) {
                const int j = j0 + r < m ? j0 + r : 0;  // past m: any proposal, its result unused
                const double* xr = X + idx[j] * d;
                #pragma unroll
                for (int k = 0; k < AFK_DCH; ++k) {
                    const int t = lane + 32 * k;
                    xv[r][k] = t < d ? xr[t] : 0.0;
                }
                v[r] = prior[(long long)i * m + j];
            }
            for (int p = 0; p < i; ++p) {
                const double* xc = X + picks[s + p] * d;
                double acc[AFK_R];
                #pragma unroll
                for (int r = 0; r < AFK_R; ++r) acc[r] = 0.0;
                #pragma unroll
                for (int k = 0; k < AFK_DCH; ++k) {
                    const int t = lane + 32 * k;
                    const double cv = t < d ? __ldg(xc + t) : 0.0;
                    #pragma unroll
                    for (int r = 0; r < AFK_R; ++r) {
                        const double diff = xv[r][k] - cv;
                        acc[r] = fma(diff, diff, acc[r]);
                    }
                }
                #pragma unroll
                for (int r = 0; r < AFK_R; ++r) {
                    const double a = warp_sum(acc[r]);
                    v[r] = a < v[r] ? a : v[r];
                }
            }
            if (lane == 0) {
                #pragma unroll
                for (int r = 0; r < AFK_R; ++r)
                    if (j0 + r < m) d2[j0 + r] = v[r];
            }
        }
#else
        for (int j = warp; j < m; j += nwarp) {
            const double* xr = X + idx[j] * d;
            double v = prior[(long long)i * m + j];
            for (int p = 0; p < i; ++p) {
                const double* xc = X + picks[s + p] * d;
                double acc = 0.0;
                for (int t = lane; t < d; t += 32) {
                    const double diff = xr[t] - xc[t];
                    acc = fma(diff, diff, acc);
                }
                acc = warp_sum(acc);
                v = acc < v ? acc : v;
            }
            if (lane == 0) d2[j] = v;
        }
#endif
        __syncthreads();  // d2 of every proposal (global writes, visible to the block after this)
        if (warp == 0) {
            const double* ui = u + (long long)i * (m - 1);
            int x = 0;
            double dx = d2[0], qx = q[idx[0]];
            for (int base = 1; base < m; base += 32) {
                const int j = base + lane;
                const bool valid = j < m;
                const double dj = valid ? d2[j] : 0.0, qj = valid ? q[idx[j]] : 0.0, uj = valid ? ui[j - 1] : 0.0;
                int start = 0;
                for (;;) {
                    const bool take = valid && lane >= start && __dmul_rn(__dmul_rn(uj, dx), qj) < __dmul_rn(dj, qx);
                    const unsigned mask = __ballot_sync(FULL, take);
                    if (mask == 0u) break;
                    const int l = __ffs(mask) - 1;
                    x = base + l;
                    dx = __shfl_sync(FULL, dj, l);
                    qx = __shfl_sync(FULL, qj, l);
                    start = l + 1;
                }
            }
            if (lane == 0) picks[s + i] = idx[x];
        }
        __syncthreads();  // the pick, for the next chain's distances
    }
}

// A block's picks folded into the distances of n rows (the next block's proposals, or the
// suffix of rows the chains after it read). g (n, b): the GEMM -2 X C^T of those rows against
// the block's picks; each row's squared distance to a pick is (g + ||x||^2) + ||c||^2 clipped
// at 0 (the host's expression, in its order: two rounded adds), and dmin takes its minimum. One
// thread per row. Four blocks per SM: the registers it needs without spilling.
extern "C" __global__ void __launch_bounds__(256, 4) afkmc2_fold(
        const double* __restrict__ g, const double* __restrict__ xsq, const double* __restrict__ csq,
        double* __restrict__ dmin, const long long n, const int b) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const double* gi = g + i * b;
        const double xi = xsq[i];
        double v = dmin[i];
        for (int j = 0; j < b; ++j) {
            double t = __dadd_rn(__dadd_rn(gi[j], xi), csq[j]);
            t = t > 0.0 ? t : 0.0;
            v = t < v ? t : v;
        }
        dmin[i] = v;
    }
}
