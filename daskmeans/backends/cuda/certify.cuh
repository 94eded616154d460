// The certify-and-re-rank step both selections (select_rows.cu, select_cols.cu) share.
// Compile-time: T (data type).
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
