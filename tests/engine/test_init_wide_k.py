"""The hierarchical (mesocluster) init for wide K: the split of K over the mesoclusters by hand,
the same centroids bit for bit on any chunking and worker count, quality against the first K
rows, and the default k-means|| switching to it at ``daskmeans.init.hierarchical-min-k``."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import make_blobs

from daskmeans import KMeans
from daskmeans.io.readers import read
from daskmeans.engine.placement import place
from daskmeans.seeding import chosen_init, resolve_init
from daskmeans.seeding.hierarchical import deal, mesoclusters, split_k


def test_split_k_by_largest_remainder_capped_at_the_rows():
    # shares 3.5, 2.1, 1.05, 0.35: floors 3, 2, 1, 0; the centre left goes to the largest remainder (0.5)
    np.testing.assert_array_equal(split_k(7, [10, 6, 3, 1], [9, 9, 9, 9]), [4, 2, 1, 0])
    # group 0 holds 2 rows: 5 left over sizes 6, 3, 1: 3, 1.5, 0.5, a tie of remainders to the lower index
    np.testing.assert_array_equal(split_k(7, [10, 6, 3, 1], [2, 9, 9, 9]), [2, 3, 2, 0])
    # weighted sizes, shares 0.75, 1.5, 0.75: the two remainders of 0.75 win
    np.testing.assert_array_equal(split_k(3, [0.25, 0.5, 0.25], [5, 5, 5]), [1, 1, 1])
    # group 0 capped at 2; the 3 left fall to groups of zero size, by their rows 4 and 1: 2.4, 0.6
    np.testing.assert_array_equal(split_k(5, [1.0, 0.0, 0.0], [2, 4, 1]), [2, 2, 1])
    # caps that cascade: 10 over 1:1:1:1 gives 2.5 each; 1 and 2 rows capped, then 7 over two
    np.testing.assert_array_equal(split_k(10, [1, 1, 1, 1], [1, 2, 9, 9]), [1, 2, 4, 3])
    np.testing.assert_array_equal(split_k(4, [3, 1], [4, 0]), [4, 0])
    with pytest.raises(ValueError, match=r"^k=10 should be <= the groups' rows \(7\)$"):
        split_k(10, [1, 1], [3, 4])


def test_mesoclusters_and_bundles():
    assert [mesoclusters(k) for k in (1, 2, 64, 4096, 65536, 2**18)] == [1, 1, 8, 64, 256, 512]
    # largest first, each to the bin of least load (loads after): 5 -> bin 0 (5, 0); 4 -> bin 1
    # (5, 4); 3 (item 0) -> bin 1 (5, 7); 3 (item 4) -> bin 0 (8, 7); 1 -> bin 1 (8, 8)
    assert [b.tolist() for b in deal([3, 5, 1, 4, 3], 2)] == [[1, 4], [0, 2, 3]]


@pytest.fixture(scope="module")
def blobs():
    X, _ = make_blobs(n_samples=20_000, n_features=8, centers=64, cluster_std=1.0, center_box=(-20, 20),
                      random_state=0)
    return X.astype(np.float32)


def test_same_centroids_on_any_chunking_and_worker_count(client, client1, blobs):
    """3 and 7 chunks, 1 and 2 workers, unweighted and weighted: the same centroids bit for
    bit. 48 rows per centre of 12,000: a sample of about 3072 rows, the mesoclusters' subsample
    of about 2048 (256 per mesocentre) within it, 8 mesoclusters in 8 bundles."""
    X = blobs[:12_000]
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    runs = {}
    for chunks in (3, 7):
        rows = -(-len(X) // chunks)
        Xd = read(da.from_array(X, chunks=(rows, -1)))
        assert Xd.numblocks[0] == chunks
        for c in (client, client1):
            for weighted in (False, True):
                wd = da.from_array(w, chunks=rows) if weighted else None
                p = place(c, Xd, "numpy", sample_weight=wd)
                with dask.config.set({"daskmeans.init.hierarchical-sample-per-centre": 48}):
                    runs[chunks, len(c.nthreads()), weighted] = resolve_init(c, p, "hierarchical", 64, 11)
    ref = runs[3, 2, False]
    assert ref.shape == (64, 8) and ref.dtype == np.float64 and len(np.unique(ref, axis=0)) == 64
    assert {tuple(r) for r in ref} <= {tuple(r) for r in X.astype(np.float64)}  # seeds are rows
    for key, c0 in runs.items():
        np.testing.assert_array_equal(c0, runs[3, 2, key[2]], err_msg=str(key))
    assert not np.array_equal(runs[3, 2, True], ref)


def test_seed_changes_the_centroids(client, blobs):
    p = place(client, read(da.from_array(blobs[:6000], chunks=(1000, -1))), "numpy")
    a, b = resolve_init(client, p, "hierarchical", 32, 1), resolve_init(client, p, "hierarchical", 32, 2)
    assert not np.array_equal(a, b)


def test_quality_after_ten_iterations_beats_the_first_rows(client, blobs):
    """K = 64 true centres, n = 20,000, D = 8: 10 Lloyd iterations from the hierarchical init
    end at or below 10 from the first 64 rows, for each of three seeds."""
    first = KMeans(64, init=blobs[:64], max_iter=10, tol=0, client=client).fit(blobs).inertia_
    for seed in range(3):
        km = KMeans(64, init="hierarchical", max_iter=10, tol=0, random_state=seed, client=client).fit(blobs)
        assert km.inertia_ <= first, (seed, km.inertia_, first)


def test_k_means_parallel_runs_hierarchical_from_the_threshold(client, blobs):
    assert chosen_init("k-means||", 2**20) == "k-means||"  # off by default (0)
    assert chosen_init("k-means++", 2**20) == "k-means++" and chosen_init("random", 2**20) == "random"
    p = place(client, read(da.from_array(blobs[:6000], chunks=(1000, -1))), "numpy")
    hier = resolve_init(client, p, "hierarchical", 32, 5)
    assert not np.array_equal(resolve_init(client, p, "k-means||", 32, 5), hier)
    with dask.config.set({"daskmeans.init.hierarchical-min-k": 32}):
        assert chosen_init("k-means||", 31) == "k-means||" and chosen_init("k-means||", 32) == "hierarchical"
        np.testing.assert_array_equal(resolve_init(client, p, "k-means||", 32, 5), hier)
        km = KMeans(32, max_iter=1, random_state=3, client=client).fit(blobs[:6000])
        ref = KMeans(32, init="hierarchical", max_iter=1, random_state=3, client=client).fit(blobs[:6000])
    assert km.init == "k-means||"
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)


@pytest.mark.gpu
def test_gpu_quality_at_k_4096():
    """On CuPy workers (a LocalCUDACluster), K = 4096, N = 2e5, D = 64 (blobs of 4096 true
    centres): 10 iterations from the hierarchical init end at or below 10 from the first K
    rows; two fits of one iteration from the same seed end at the same centroids."""
    import cupy
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    X, _ = make_blobs(n_samples=200_000, n_features=64, centers=4096, cluster_std=1.0, center_box=(-20, 20),
                      random_state=0)
    X = X.astype(np.float32)
    with LocalCUDACluster(dashboard_address=":0") as lc, Client(lc) as client:
        Xg = da.from_array(cupy.asarray(X), chunks=(25_000, 64), asarray=False)
        kw = dict(max_iter=10, tol=0, client=client)
        first = KMeans(4096, init=X[:4096], **kw).fit(Xg)
        hier = KMeans(4096, init="hierarchical", random_state=0, **kw).fit(Xg)
        once, again = (KMeans(4096, init="hierarchical", random_state=0, max_iter=1, tol=0, client=client).fit(Xg)
                       for _ in range(2))
    assert hier.backend_ == "cupy"
    assert hier.inertia_ <= first.inertia_, (hier.inertia_, first.inertia_)
    np.testing.assert_array_equal(again.cluster_centers_, once.cluster_centers_)
