"""The Dask collective between simulated hosts (127.0.0.2 and 127.0.0.3, two workers each):
large buffers are summed within each host through shared memory and between the hosts by a
reduce-scatter and all-gather of each local rank's slice, exactly; the bytes each rank sends
over the network are measured (half of a flat exchange's with two ranks per host), and a fit
whose sums take that path is one worker's model bit for bit."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import daskmeans
import faultkit
import hostkit
from daskmeans.engine import collective as coll
from daskmeans.engine import shm
from faultkit import K
from hostkit import HOSTS, SEED

N = 3 * 2**18 + 1  # 6 MB: above the shared-memory threshold, slices of unequal lengths
CALLS = 3  # consecutive calls of one collective: alternate segments, messages never mixed


def _run(cluster, fit_id: str, n: int, shared_memory: bool) -> list[dict]:
    c = cluster.client
    c.run(coll.install_mailbox)
    ranks = tuple(sorted(c.nthreads()))
    spec = coll.CollectiveSpec(fit_id, 0, ranks, "dask", timeout=60, shared_memory=shared_memory)
    futs = [c.submit(hostkit.allreduce_on_rank, r, spec, n, CALLS, workers=[w], pure=False)
            for r, w in enumerate(ranks)]
    try:
        return c.gather(futs)
    finally:
        c.run(coll.release, fit_id)


def _expected(n: int, size: int) -> list[np.ndarray]:
    return [sum(parts) for parts in zip(*(hostkit.rank_buffers(r, n, CALLS) for r in range(size)))]


def _slices(n: int, size: int) -> list[int]:
    return [n * (i + 1) // size - n * i // size for i in range(size)]


@pytest.mark.skipif(not shm.room_for(2 * 8 * N * 4), reason="/dev/shm has no room for the segments")
def test_hierarchical_sums_are_exact_and_send_half_the_network_bytes(two_hosts):
    two_hosts.restore()
    ranks = sorted(two_hosts.client.nthreads())
    hosts = hostkit.by_host(ranks)
    assert [len(h) for h in hosts.values()] == [2, 2]
    want = _expected(N, 4)
    hier = _run(two_hosts, "mn-hier", N, shared_memory=True)
    flat = _run(two_hosts, "mn-flat", N, shared_memory=False)
    for res in hier + flat:
        for got, w in zip(res["sums"], want):
            assert got.dtype == np.int64 and np.array_equal(got, w)
    assert [r["shared"] for r in hier] == [True] * 4 and [r["shared"] for r in flat] == [False] * 4

    # Bytes per rank and call (after the first, which also opens the shared memory).
    # Hierarchical: local rank j owns slice j of the buffer (2 per host) and exchanges it with
    # rank j of the other host: half of the slice out, the other half's sum back; nothing over
    # the comms within the host (its signals are empty).
    local_slices = _slices(N, 2)
    for rank, res in enumerate(hier):
        j = hosts[hostkit.host_of(ranks[rank])].index(ranks[rank])
        halves = _slices(local_slices[j], 2)
        mine = halves[[h for h in hosts].index(hostkit.host_of(ranks[rank]))]
        sent = (local_slices[j] - mine) + mine  # the other host's half, then this half's sum
        assert res["sent"][1:] == [{"host": 0, "network": 8 * sent}] * (CALLS - 1), (rank, res["sent"])
    # Flat reduce-scatter + all-gather over the 4 ranks (shared memory off): each rank sends
    # every owner its slice and its own slice's sum, to the other host's two ranks as well.
    quarters = _slices(N, 4)
    for rank, res in enumerate(flat):
        others = [d for d in range(4) if d != rank]
        far = [d for d in others if hostkit.host_of(ranks[d]) != hostkit.host_of(ranks[rank])]
        near = [d for d in others if d not in far]
        assert res["sent"] == [{"host": 8 * sum(quarters[d] + quarters[rank] for d in near),
                                "network": 8 * sum(quarters[d] + quarters[rank] for d in far)}] * CALLS
    # What a rank sends between the hosts: 2 (H - 1) / H of 1 / L of the buffer (H = L = 2),
    # half of the flat exchange's.
    per_rank = {"hierarchical": [r["sent"][-1]["network"] for r in hier],
                "flat": [r["sent"][-1]["network"] for r in flat]}
    assert max(per_rank["hierarchical"]) <= 8 * (N // 2 + 1)
    assert sum(per_rank["hierarchical"]) * 2 == pytest.approx(sum(per_rank["flat"]), rel=1e-5), per_rank


def test_small_buffers_between_hosts_are_exact(two_hosts):
    two_hosts.restore()
    want = _expected(7, 4)
    for res in _run(two_hosts, "mn-small", 7, shared_memory=True):
        assert not res["shared"]
        for got, w in zip(res["sums"], want):
            assert np.array_equal(got, w)


def test_a_fit_summed_through_both_hosts_shared_memory_is_one_workers_model(two_hosts, host_data, one_worker):
    """Every all-reduce of the fit (a threshold of 64 bytes on the workers) goes within the
    hosts through shared memory and between them through the comms: one worker's model."""
    two_hosts.restore()
    c = two_hosts.client
    c.run(hostkit.probe_host_path, 64)
    try:
        km = faultkit.run_guarded(c, lambda: daskmeans.KMeans(K, random_state=SEED, client=c).fit(
            host_data.api("npy", 9)), timeout=120)
    finally:
        calls = c.run(hostkit.probed_host_path)
    assert len(calls) == 4 and min(calls.values()) >= km.n_iter_, calls
    centers, inertia, n_iter = one_worker("npy", 9)
    np.testing.assert_array_equal(km.cluster_centers_, centers)
    assert km.n_iter_ == n_iter and km.inertia_ == pytest.approx(inertia, rel=1e-12)


def test_a_host_lost_while_its_sums_go_between_hosts_is_recovered_bitwise(two_hosts, host_data, one_worker,
                                                                          tmp_path):
    """Both workers of 127.0.0.3 SIGKILLed as their second segment starts, the sums going
    through the hosts' shared memory and the network: the survivors' waits end, the fit goes
    on on 127.0.0.2 (one host: shared memory alone) and gives one worker's model."""
    two_hosts.restore()
    c = two_hosts.client
    c.run(hostkit.probe_host_path, 64)
    try:
        with hostkit.kill_hosts(c, tmp_path / "flags", "daskmeans-segment", [HOSTS[1]], skip=1) as flags, \
                dask.config.set({"daskmeans.segment-seconds": 0.02}):
            km = faultkit.run_guarded(c, lambda: daskmeans.KMeans(K, random_state=SEED, client=c).fit(
                host_data.api("zarr", 9)), timeout=120)
    finally:
        calls = c.run(hostkit.probed_host_path)
    assert len(faultkit.kills(flags)) == 2
    assert set(hostkit.by_host(calls)) == {HOSTS[0]} and min(calls.values()) >= 1, calls
    centers, inertia, n_iter = one_worker("zarr", 9)
    np.testing.assert_array_equal(km.cluster_centers_, centers)
    assert km.n_iter_ == n_iter and km.inertia_ == pytest.approx(inertia, rel=1e-12)
