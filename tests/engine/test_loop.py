"""The one Lloyd loop (engine.loop), its exact sums (numerics.grid) and its collectives
(engine.collective): hand-computed cases, equivalence, and the properties that matter —
bitwise the same result for any number of workers, and a lost worker changes nothing."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster
from hypothesis import given, settings
from hypothesis import strategies as st

from daskmeans import DaskmeansError, KMeans
from daskmeans.backends import numpy_backend as nb
from daskmeans.numerics.grid import Grid, float_sums


# ---------------------------------------------------------------- the sums' grid (pure)


def test_grid_by_hand():
    # max |x| = 11 over W = 4 rows: every sum is below 44 < 2**6, so the step is 2**(6 - 62).
    g = Grid(np.array([11.0, 0.0]), 4.0)
    assert g.exps.tolist() == [6 - 62, -1000] and g.wexp == 3 - 62
    X = np.array([[1.0, 0.0], [2.0, 0.0], [10.0, 0.0], [11.0, 0.0]])
    out = nb.assign(X, nb.prepare(np.array([[0.0, 0.0], [10.0, 0.0]]), X.dtype), grid=g)
    assert out["sums"].dtype == np.int64 and out["sums"][:, 0].tolist() == [3 * 2**56, 21 * 2**56]
    assert out["weights"].tolist() == [2 * 2**59, 2 * 2**59]
    sums, weights = float_sums(out)
    np.testing.assert_array_equal(sums, [[3.0, 0.0], [21.0, 0.0]])
    np.testing.assert_array_equal(weights, [2.0, 2.0])


def test_values_round_to_the_nearest_step_ties_to_even():
    g = Grid(np.array([1.0]), 1.0)  # bound 1 < 2**1: step 2**-61
    step = 2.0**-61
    X = np.array([[0.4 * step], [0.5 * step], [1.5 * step], [2.5 * step]])
    for row, expected in zip(X, [0, 0, 2, 2]):
        out = nb.assign(row[None, :], nb.prepare(np.zeros((1, 1)), X.dtype), grid=g)
        assert out["sums"][0, 0] == expected


def test_grid_bounds_every_sum():
    g = Grid(np.array([0.0, 1.0, 3.0, 1e-300, 1e300]), 1000.0)
    for m, e in zip([1.0, 3.0, 1e-300, 1e300], g.exps[1:]):
        assert 2.0 ** (int(e) + 62) > m * 1000 or e == -1000
    assert 2.0 ** (g.wexp + 62) > 1000


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.booleans(), st.integers(0, 2**32 - 1))
def test_sums_do_not_depend_on_chunking(n_parts, weighted, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((300, 3)) * rng.choice([1e-6, 1.0, 1e3], size=3)).astype(np.float32)
    w = rng.uniform(0.1, 3.0, len(x)) if weighted else None
    c = x[:4].astype(np.float64)
    g = Grid(np.abs(x).max(axis=0), len(x) if w is None else w.sum())
    p = nb.prepare(c, x.dtype)
    whole = nb.assign(x, p, w, grid=g)
    cuts = np.sort(rng.choice(np.arange(1, len(x)), size=min(n_parts, len(x) - 1), replace=False))
    parts = [nb.assign(xp, p, None if w is None else wp, grid=g) for xp, wp in
             zip(np.split(x, cuts), np.split(np.ones(len(x)) if w is None else w, cuts))]
    order = rng.permutation(len(parts))
    np.testing.assert_array_equal(sum(parts[i]["sums"] for i in order), whole["sums"])
    np.testing.assert_array_equal(sum(parts[i]["weights"] for i in order), whole["weights"])
    # ... and the value is the float64 sum to within half a step per row.
    ref = np.zeros((4, 3))
    np.add.at(ref, whole["labels"], x.astype(np.float64) * (1.0 if w is None else w[:, None]))
    np.testing.assert_allclose(float_sums(whole)[0], ref, rtol=1e-15, atol=len(x) * np.ldexp(0.5, g.exps).max())


# ---------------------------------------------------------------- collectives on real workers


def _cluster(n, **kw):
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                        silence_logs=logging.ERROR, **kw)


# ---------------------------------------------------------------- the loop: invariance


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    centers = rng.normal(scale=4, size=(10, 5))
    x = centers[rng.integers(0, 10, 12_000)] + rng.normal(scale=1.5, size=(12_000, 5))
    return x.astype(np.float32)


@pytest.mark.parametrize("algorithm", ["lloyd", "yinyang"])
@pytest.mark.parametrize("init", ["array", "k-means||"])
def test_bitwise_identical_on_one_two_and_three_workers(client1, client, client3, data, init, algorithm):
    spec = data[:10].astype(np.float64) if init == "array" else init
    X = da.from_array(data, chunks=(700, -1))
    fits = [KMeans(10, init=spec, random_state=7, tol=0, algorithm=algorithm, client=c).fit(X)
            for c in (client1, client, client3)]
    one = fits[0]
    assert one.n_iter_ > 5
    for other, c in zip(fits[1:], (client, client3)):
        np.testing.assert_array_equal(other.cluster_centers_, one.cluster_centers_)
        # 18 chunks of 700 rows do not share out over 3 workers: they are cut into 18 equal
        # ones there, and the inertia (a float64 sum per chunk) may differ in its last bits.
        assert other.inertia_ == pytest.approx(one.inertia_, rel=1e-12) and other.n_iter_ == one.n_iter_
        assert [h["reassigned"] for h in other.history_] == [h["reassigned"] for h in one.history_]
        np.testing.assert_array_equal(c.compute(other.labels_).result(), client1.compute(one.labels_).result())


@pytest.mark.parametrize("algorithm", ["lloyd", "yinyang"])
@pytest.mark.parametrize("weighted", [False, True])
def test_bitwise_identical_for_any_chunking(client, data, weighted, algorithm):
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(data)) if weighted else None
    fits = []
    for chunks in [(700,), (12_000,), ((5000, 333, 6667),)]:
        X = da.from_array(data, chunks=chunks + (-1,))
        sw = None if w is None else da.from_array(w, chunks=X.chunks[0])
        km = KMeans(10, init=data[:10].astype(np.float64), tol=0, algorithm=algorithm,
                    client=client).fit(X, sample_weight=sw)
        fits.append((km, client.compute(km.labels_).result()))
    (one, labels), rest = fits[0], fits[1:]
    assert one.n_iter_ > 5
    for km, lab in rest:
        np.testing.assert_array_equal(km.cluster_centers_, one.cluster_centers_)
        np.testing.assert_array_equal(lab, labels)
        assert km.n_iter_ == one.n_iter_


def test_shared_memory_and_the_comms_give_the_same_bits(client):
    """On CPU worker processes of one host the Dask collective has two paths for a large
    buffer: shared memory (``collective-shared-memory``, the default) and the workers' comms.
    K x D = 300 x 440 makes the iteration's buffer over the 1 MiB the shared-memory path
    starts at; both paths give the same fit bit for bit. (NCCL against the Dask collective is
    compared on GPUs: tests/gpu.)"""
    from daskmeans.engine import shm
    from daskmeans.engine.dask_collective import DaskCollective

    k, d = 300, 440
    if not shm.room_for(2 * 8 * k * d):
        pytest.skip("/dev/shm has no room for the shared-memory path's segments")
    assert 8 * k * d >= DaskCollective.shm_min_bytes
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4000, d)).astype(np.float32)  # no clusters: rows still move after 5 iterations
    X = da.from_array(x, chunks=(1000, -1))
    fits = []
    for shared in (True, False):
        with dask.config.set({"daskmeans.collective": "dask", "daskmeans.collective-shared-memory": shared}):
            fits.append(KMeans(k, init=x[:k].astype(np.float64), max_iter=5, tol=0, client=client).fit(X))
    np.testing.assert_array_equal(fits[0].cluster_centers_, fits[1].cluster_centers_)
    assert fits[0].n_iter_ == fits[1].n_iter_ == 5
    assert [h["reassigned"] for h in fits[0].history_] == [h["reassigned"] for h in fits[1].history_]
    assert fits[0].history_[-1]["reassigned"] > 0  # the centroids still move: a real comparison


def test_large_centroids_reach_the_workers_outside_the_graph(client, monkeypatch):
    """K x D = 2100 x 700 float64 centroids (11.8 MB) are scattered to the workers, not put in
    every segment task through the scheduler (Dask warns of a graph over 10 MB); the result is
    that of centroids sent inside the tasks."""
    import warnings

    from daskmeans.engine import lloyd as driver

    X = da.random.default_rng(0).standard_normal((6000, 700), chunks=(1500, 700)).astype(np.float32)
    init = X[:2100].compute().astype(np.float64)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Sending large graph")
        scattered = KMeans(2100, init=init, max_iter=2, tol=0, client=client).fit(X)
    monkeypatch.setattr(driver, "_SCATTER_BYTES", 1 << 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inline = KMeans(2100, init=init, max_iter=2, tol=0, client=client).fit(X)
    np.testing.assert_array_equal(scattered.cluster_centers_, inline.cluster_centers_)


def test_one_chunk_is_split_so_every_worker_gets_rows(client, data):
    from daskmeans.engine.placement import place

    p = place(client, da.from_array(data, chunks=(len(data), -1)), "numpy")
    assert p.row_chunks == (6000, 6000)  # one chunk per worker
    assert len(set(p.workers)) == 2
    rows = {w: sum(p.row_chunks[i] for i in ids) for w, ids in zip(p.workers, p.chunk_ids)}
    assert max(rows.values()) / min(rows.values()) < 1.25


def test_segments_deliver_every_iteration_once_in_order(client, data):
    seen = []
    with dask.config.set({"daskmeans.segment-seconds": 0}):  # one iteration per segment
        km = KMeans(10, init=data[:10].astype(np.float64), tol=0, client=client).fit(
            da.from_array(data, chunks=(1000, -1)), callback=seen.append)
    assert [s["iteration"] for s in seen] == list(range(1, km.n_iter_ + 1))
    assert all(s.pop("run") == 1 for s in seen)  # the callback's own key: which of n_init runs
    assert seen == km.history_
    # kernel_seconds is the slowest rank's; seconds is rank 0's wall time (ranks start a
    # segment at different moments, so neither bounds the other).
    assert all(s["kernel_seconds"] > 0 and s["seconds"] > 0 for s in seen)


def _set_clock(seconds):
    """On a worker: the NumPy backend's marks measure ``seconds`` between any two (None: real)."""
    from daskmeans.backends import numpy_backend

    real = getattr(numpy_backend, "_real_elapsed", numpy_backend.elapsed)
    numpy_backend._real_elapsed = real
    numpy_backend.elapsed = real if seconds is None else (lambda start, end: seconds)


def test_a_segment_reports_the_slowest_ranks_kernel_time():
    """Rank 0's statistics go to the history in order, each with the largest of the ranks'
    kernel times, also where rank 0 is the fastest."""
    from daskmeans.engine.lloyd import _report

    results = [
        {"history": [{"iteration": 1, "kernel_seconds": 1.0}, {"iteration": 2, "kernel_seconds": 1.5}],
         "kernel_seconds": [1.0, 1.5]},
        {"history": [], "kernel_seconds": [5.0, 0.5]},
        {"history": [], "kernel_seconds": [2.0, 3.0]},
    ]
    history, seen = [{"iteration": 0}], []
    _report(results, history, seen.append)
    assert history[1:] == seen == [{"iteration": 1, "kernel_seconds": 5.0}, {"iteration": 2, "kernel_seconds": 3.0}]


def test_kernel_seconds_is_the_slowest_ranks(client, data, tmp_path):
    """Each rank times its own kernels; the history keeps the slowest rank's time whichever
    worker is slower, and so do the checkpoints (their history comes from one rank's state)."""
    from daskmeans.io.checkpoint import read_checkpoint

    a, b = sorted(client.nthreads())
    X = da.from_array(data, chunks=(1000, -1))
    try:
        for slow, fast in ((a, b), (b, a)):
            client.run(_set_clock, 5.0, workers=[slow])
            client.run(_set_clock, 1.0, workers=[fast])
            ckpt = str(tmp_path / f"ckpt-{slow == a}.zarr")
            with dask.config.set({"daskmeans.segment-seconds": 0}):
                km = KMeans(10, init=data[:10].astype(np.float64), max_iter=4, tol=0, client=client,
                            checkpoint=ckpt, checkpoint_every=2).fit(X)
            assert [h["kernel_seconds"] for h in km.history_] == [5.0] * 4
            assert {h["collective_seconds"] for h in km.history_} <= {1.0, 5.0}  # rank 0's own clock
            assert [h["kernel_seconds"] for h in read_checkpoint(ckpt)["history"]] == [5.0] * 2
    finally:
        client.run(_set_clock, None)


# ---------------------------------------------------------------- the loop: a worker lost


def _finishes_within(seconds, fn, *args, **kw):
    """``fn(*args, **kw)``, run on a thread the test waits for at most ``seconds``: a hang
    guard (the property is that a wait ends, not a speed). Its exception is re-raised here."""
    out: dict = {}
    done = threading.Event()

    def run():
        try:
            out["value"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            out["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(seconds), f"{getattr(fn, '__name__', fn)} still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


# Below the collective's own timeout (300 s), which is how a fit stuck on a lost peer would end.
RECOVERY_DEADLINE = 120


def _kill_one(client, victims):
    pids = client.run(os.getpid)
    addr = sorted(pids)[victims]
    os.kill(pids[addr], signal.SIGKILL)
    return addr


@pytest.mark.parametrize("algorithm", ["lloyd", "yinyang"])
@pytest.mark.parametrize("rows", [1334, 4000])  # 9 and 3 chunks: 2 workers left cannot share them evenly
@pytest.mark.parametrize("when", ["between-segments", "mid-segment"])
def test_killed_worker_is_recovered_bitwise(data, when, rows, algorithm):
    """A worker killed mid-fit: the chunks are placed again on the workers left, in the same
    chunks, and the fit goes on from the segment's start. Chunkings the survivors cannot
    share evenly used to be re-split, and the loop mixed the two chunkings' statistics."""
    X = da.from_array(data, chunks=(rows, -1))
    init = data[:10].astype(np.float64)
    with _cluster(3) as cluster, Client(cluster, set_as_default=False) as c:
        ref = KMeans(10, init=init, tol=0, client=c).fit(X)
        ref_labels = c.compute(ref.labels_).result()  # before a worker holding them is killed
        killed = []

        def at_iteration(stats):
            if when == "between-segments" and stats["iteration"] == 3 and not killed:
                killed.append(_kill_one(c, 1))

        def kill_when_a_segment_runs():
            # One long segment (the whole loop): kill a worker while it computes.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if any(str(k).startswith("daskmeans-segment") for ks in c.processing().values() for k in ks):
                    time.sleep(0.05)
                    killed.append(_kill_one(c, 2))
                    return
                time.sleep(0.005)

        watcher = threading.Thread(target=kill_when_a_segment_runs, daemon=True)
        # The nanny restarts the worker at a new address; the fit must not wait for it forever.
        with dask.config.set({"daskmeans.segment-seconds": 0.05 if when == "between-segments" else 60}):
            if when == "mid-segment":
                watcher.start()
            km = _finishes_within(RECOVERY_DEADLINE, KMeans(10, init=init, tol=0, algorithm=algorithm,
                                                            client=c).fit, X, callback=at_iteration)
        assert killed, "no worker was killed during the fit"
        np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
        assert km.inertia_ == ref.inertia_ and km.n_iter_ == ref.n_iter_
        assert [h["reassigned"] for h in km.history_] == [h["reassigned"] for h in ref.history_]
        np.testing.assert_array_equal(c.compute(km.labels_).result(), ref_labels)


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_worker_killed_during_init_is_recovered_bitwise(data, init, monkeypatch):
    """The init's tasks run on the shards, pinned to their workers: a worker killed while
    they run is seen, the data placed again on the workers left, and the init started over
    with the same seed, giving the undisturbed run's model bit for bit."""
    import daskmeans.seeding.rows as init_module

    X = da.from_array(data, chunks=(500, -1))
    with _cluster(3) as cluster, Client(cluster, set_as_default=False) as c:
        ref = KMeans(10, init=init, random_state=7, client=c).fit(X)
        killed = []
        submit = init_module.submit_per_shard

        def submit_then_kill(client, placement, fn, *args, name, **kw):
            futs = submit(client, placement, fn, *args, name=name, **kw)
            if not killed:  # the init's first tasks on the shards are under way
                killed.append(_kill_one(client, 1))
            return futs

        monkeypatch.setattr(init_module, "submit_per_shard", submit_then_kill)
        km = _finishes_within(RECOVERY_DEADLINE, KMeans(10, init=init, random_state=7, client=c).fit, X)
    assert killed
    np.testing.assert_array_equal(km.cluster_centers_, ref.cluster_centers_)
    assert km.inertia_ == ref.inertia_ and km.n_iter_ == ref.n_iter_


def test_every_worker_lost_is_a_clear_error(data):
    X = da.from_array(data, chunks=(500, -1))
    with _cluster(2) as cluster, Client(cluster, set_as_default=False) as c:
        def kill_all(stats):
            if stats["iteration"] == 2:
                for pid in c.run(os.getpid).values():
                    os.kill(pid, signal.SIGKILL)

        with dask.config.set({"daskmeans.segment-seconds": 0}):
            with pytest.raises(DaskmeansError, match="every worker of the fit was lost|left the cluster"):
                # Ends once the cluster has had no worker for watch.NO_WORKER_SECONDS (10 s).
                _finishes_within(60, KMeans(10, init=data[:10].astype(np.float64), tol=0, max_iter=10_000,
                                            client=c).fit, X, callback=kill_all)


def test_telemetry_per_iteration(client, data):
    """Each iteration records the largest cluster over the mean (from that step's counts) and
    the data throughput; ``daskmeans info`` prints them as a table."""
    X = da.from_array(data, chunks=(500, -1))
    km = KMeans(10, init=data[:10].astype(np.float64), tol=0, client=client).fit(X)
    assert km.history_[-1]["reassigned"] == 0  # converged: the last step's counts are the final sizes
    sizes = np.bincount(client.compute(km.labels_).result(), minlength=10)
    assert km.history_[-1]["imbalance"] == pytest.approx(sizes.max() / sizes.mean(), rel=1e-12)
    for h in km.history_:
        assert h["imbalance"] >= 1.0
        assert h["gb_per_s"] == pytest.approx(data.nbytes / h["seconds"] / 1e9, rel=1e-9)


@pytest.mark.parametrize("rows", [1334, 4000])
def test_labels_outlive_a_worker_lost_after_the_fit(data, rows):
    """The labels the final pass left on a worker that is then lost are made again from the
    data on a worker left (the same labels: those of the final centroids), instead of
    waiting forever for a task pinned to the lost worker."""
    X = da.from_array(data, chunks=(rows, -1))
    with _cluster(3) as cluster, Client(cluster, set_as_default=False) as c:
        km = KMeans(10, init=data[:10].astype(np.float64), max_iter=5, client=c).fit(X)
        expected = km.predict(data)
        _kill_one(c, 1)
        labels = c.compute(km.labels_).result(timeout=120)
    np.testing.assert_array_equal(labels, expected)
