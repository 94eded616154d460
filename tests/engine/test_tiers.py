"""Memory tiers and budgets (engine.plan, placement): data larger than a worker's memory
budget is re-read from its file every pass (the storage tier) with the same result, within
the budget; a working set that fits no budget is refused before any work."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from daskmeans import DaskmeansError, DataError, KMeans
from daskmeans.cli import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiers")
    rng = np.random.default_rng(9)
    centers = rng.normal(scale=5, size=(12, 16))
    x = (centers[rng.integers(0, 12, 400_000)] + rng.normal(size=(400_000, 16))).astype(np.float32)  # 25.6 MB
    zarr.create_array(str(d / "x.zarr"), data=x, chunks=(25_000, 16))
    np.save(d / "init.npy", x[:12].astype(np.float64))
    return d, x


def _trace_start(dask_worker=None):
    """On a worker: trace the Python heap (NumPy buffers included) from here on."""
    import tracemalloc

    tracemalloc.start()
    tracemalloc.reset_peak()
    return tracemalloc.get_traced_memory()[0]


def _trace_peak(dask_worker=None):
    import tracemalloc

    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_storage_tier_gives_the_resident_result_within_the_budget(store):
    d, x = store
    init = np.load(d / "init.npy")
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", processes=True) as lc, \
            Client(lc, set_as_default=False) as c:
        ref = KMeans(12, init=init, tol=0, max_iter=12, client=c).fit(str(d / "x.zarr"))
        assert ref.tier_ == "host"
        budget = 12 * 2**20  # per worker: its share of the data (12.8 MB) does not fit
        before = c.run(_trace_start)
        km = KMeans(12, init=init, tol=0, max_iter=12, memory_limit=budget, client=c).fit(str(d / "x.zarr"))
        peaks = c.run(_trace_peak)
    assert km.tier_ == "storage" and "tier storage" in km.tier_plan_
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    # The budget cuts the chunks smaller than the resident run's: the inertia, a float64 sum
    # per chunk, may differ in its last bits (the centroids, exact integer sums, do not).
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-9) and km.n_iter_ == ref.n_iter_
    # Within the budget, which holds less than the worker's rows: the heap's peak (the chunks
    # read ahead and in use, their decompression, the labels) counts every NumPy buffer, not
    # the allocator's slack, which depends on timing (resident set sizes did).
    for worker, peak in peaks.items():
        assert peak - before[worker] < budget, (worker, (peak - before[worker]) / 2**20)


def test_storage_tier_refuses_data_held_in_the_client(client, store):
    _, x = store
    with pytest.raises(DataError, match="the storage tier re-reads each chunk from its source"):
        KMeans(12, tier="storage", max_iter=2, client=client).fit(x[:50_000])


def test_forced_host_tier_too_small_is_refused(client, store):
    d, _ = store
    with pytest.raises(DaskmeansError, match=r"tier='host' needs \d+\.\d+ MiB of host memory per worker \(\d+\.\d+ MiB "
                                             r"of data, \d+\.\d+ MiB for the loop\), more than "
                                             r"its budget 12\.00 MiB \(--memory-limit\): use tier 'storage'"):
        KMeans(12, tier="host", memory_limit="12MiB", client=client).fit(str(d / "x.zarr"))


def _preflight_refusal(d, k, memory_limit, capsys):
    """The last line of the error of ``daskmeans fit`` of ``d/x.zarr`` into ``k`` clusters on
    one worker within ``memory_limit``, refused (exit 1, no traceback) before writing a model."""
    model = d / "never.zarr"
    rc = main(["fit", str(d / "x.zarr"), "--k", str(k), "--memory-limit", memory_limit, "--workers", "1",
               "-o", str(model)])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "Traceback" not in err
    assert not os.path.exists(model)
    return err.strip().splitlines()[-1]


def test_preflight_names_the_centroids_when_they_are_the_cost(store, capsys):
    d, _ = store
    # 400,000 rows read as one chunk, cut to 125,000 rows (an eighth of 64 MiB, in whole file
    # chunks of 25,000); K x D x 8 bytes x 7 of centroids and sums.
    assert _preflight_refusal(d, 60000, "64MiB", capsys) == (
        "daskmeans: error: K x D = 60000 x 16: the loop needs 72.11 MiB per worker besides its data, more than its "
        "host memory budget 64.00 MiB (--memory-limit): centroids and partial sums 51.27 MiB (fewer clusters or "
        "features), two chunks in flight 15.26 MiB (chunks of 125000 rows, cut to an eighth of the budget), labels "
        "of up to 400000 rows 4.58 MiB (more workers), kernel tiles 1.00 MiB (daskmeans.tile-bytes); or a larger "
        "budget")


@pytest.fixture(scope="module")
def coarse(tmp_path_factory):
    """200,000 x 16 float32 stored in two chunks of 100,000 rows (6.4 MB each)."""
    d = tmp_path_factory.mktemp("coarse")
    x = np.random.default_rng(4).standard_normal((200_000, 16)).astype(np.float32)
    zarr.create_array(str(d / "x.zarr"), data=x, chunks=(100_000, 16))
    return d


def test_preflight_names_the_files_chunks_when_they_are_the_cost(coarse, capsys):
    """K = 8, D = 16 under 10 MiB (issue 33): fewer clusters would not help; the file's chunks,
    read whole (two in flight: 2 x 6.4 MB), are the cost, and the message says so first."""
    assert _preflight_refusal(coarse, 8, "10MiB", capsys) == (
        "daskmeans: error: K x D = 8 x 16: the loop needs 15.50 MiB per worker besides its data, more than its host "
        "memory budget 10.00 MiB (--memory-limit): two chunks in flight 12.21 MiB (the file's chunks of 100000 rows, "
        "read whole: store it in smaller chunks), labels of up to 200000 rows 2.29 MiB (more workers), kernel tiles "
        "1.00 MiB (daskmeans.tile-bytes), centroids and partial sums 7.02 kiB (fewer clusters or features); or a "
        "larger budget")


def test_storage_is_chosen_where_the_budget_holds_the_loop_but_not_the_data_too(client, tmp_path):
    """Per worker (2 workers): 7.68 MB of data fits 11 MiB, and so does the loop's 5.06 MB, but
    not both: the storage tier, with the host tier's result."""
    x = np.random.default_rng(5).standard_normal((200_000, 16)).astype(np.float32)
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(10_000, 16))
    init = x[:8].astype(np.float64)
    ref = KMeans(8, init=init, tol=0, max_iter=5, client=client).fit(str(tmp_path / "x.zarr"))
    km = KMeans(8, init=init, tol=0, max_iter=5, memory_limit="11MiB", client=client).fit(str(tmp_path / "x.zarr"))
    assert (ref.tier_, km.tier_) == ("host", "storage")
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    with pytest.raises(DaskmeansError, match=r"^tier='host' needs 12\.15 MiB of host memory per worker \(7\.32 MiB "
                                             r"of data, 4\.82 MiB for the loop\), more than its budget 11\.00 MiB "
                                             r"\(--memory-limit\): use tier 'storage', or more workers$"):
        KMeans(8, init=init, max_iter=5, tier="host", memory_limit="11MiB", client=client).fit(str(tmp_path / "x.zarr"))


@pytest.mark.parametrize("value, message", [
    ("lots", r"memory_limit='lots' should be a size such as '4GiB'"),
    (0, r"memory_limit=0 should be a size such as '4GiB'"),
])
def test_budget_values_are_validated(client, value, message):
    from daskmeans import InvalidParameterError

    with pytest.raises(InvalidParameterError, match=message):
        KMeans(3, memory_limit=value, client=client).fit(np.ones((10, 2)))


def test_a_fit_that_may_take_hours_is_announced(client):
    """K = 200000 x D = 64 over 250000 rows is 6.4e12 operations an iteration (2 N K D): at
    50 GFLOP/s on 2 workers, max_iter=300 of them take ~5.3 h, which the fit says before it
    starts; under the hour it says nothing. Through a fit, with the threshold lowered."""
    import dataclasses
    import warnings

    import dask

    from daskmeans.engine.plan import TierPlan, iteration_warning
    from daskmeans.errors import DaskmeansWarning

    n, k, d = 250_000, 200_000, 64
    rate = 50e9
    p = TierPlan("host", 1, 1, 1, None, None, 2.0 * n * k * d / (rate * 2), rate)
    msg = iteration_warning(n, k, d, 300, p, 2)
    assert msg.startswith("this fit may take up to 5.3 h: each of up to max_iter=300 iterations computes "
                          "2 x N x K x D = 6.4e+12 floating-point operations, at least 64 s on 2 worker(s) at "
                          "50 GFLOP/s each"), msg
    assert iteration_warning(n, k, d, 5, p, 2) is None  # 320 s
    assert iteration_warning(n, k, d, 5, dataclasses.replace(p, iteration_seconds=None), 2) is None

    x = np.random.default_rng(0).random((2000, 4))
    with dask.config.set({"daskmeans.warn-hours": 1e-12}):
        with pytest.warns(DaskmeansWarning, match=r"this fit may take up to .* at [0-9.e+]+ GFLOP/s each"):
            KMeans(4, random_state=0, max_iter=2, client=client).fit(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DaskmeansWarning)
        KMeans(4, random_state=0, max_iter=2, client=client).fit(x)
