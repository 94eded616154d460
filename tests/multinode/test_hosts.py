"""Fits across hosts, simulated on one: a scheduler on 127.0.0.1 and worker sets on 127.0.0.2
and 127.0.0.3 (real ``dask worker`` processes, one started with ``--host``, the other with
``--listen-address``/``--contact-address``), plain and TLS.

What must hold across hosts as on one: the workers of every host read the same file paths,
the placement spreads the rows over the hosts' workers, the Dask collective adds the hosts'
sums, and the model is bit for bit that of one worker; a host lost mid-fit (all of its
workers SIGKILLed at once) is recovered bit for bit, and a cluster left without workers ends
in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import daskmeans
import daskmeans.engine.placement as placement
import daskmeans.engine.task as task
import daskmeans.engine.watch as watch
import faultkit
import hostkit
from faultkit import K, daskmeans_cli, kills, leftovers, one_error_line
from hostkit import HOSTS, SEED


def assert_same_model(model: Path, ref: tuple, same_chunks: bool = False) -> None:
    """Centroids and iterations bit for bit; the inertia too where the fit's chunking is the
    reference's (it adds per-chunk float64 sums in chunk order, and a fit cuts the data for
    its worker count: across worker counts its last bits follow the chunking)."""
    km = daskmeans.load(str(model))
    centers, inertia, n_iter = ref
    np.testing.assert_array_equal(km.cluster_centers_, centers)
    assert km.cluster_centers_.dtype == centers.dtype
    assert km.n_iter_ == n_iter
    if same_chunks:
        assert km.inertia_ == inertia
    else:
        assert km.inertia_ == pytest.approx(inertia, rel=1e-12)


@pytest.fixture(scope="module")
def undisturbed(two_hosts, host_data):
    """``fit(kind, n_chunks)``: the model of an undisturbed fit on the two hosts' four
    workers (through the API), made once per case."""
    made: dict = {}

    def fit(kind: str, n: int) -> tuple:
        if (kind, n) not in made:
            two_hosts.restore()
            c = two_hosts.client
            km = faultkit.run_guarded(c, lambda: daskmeans.KMeans(K, random_state=SEED, client=c).fit(
                host_data.api(kind, n)), timeout=90)
            made[kind, n] = (km.cluster_centers_, km.inertia_, km.n_iter_)
        return made[kind, n]

    return fit


def assert_same_model_values(got: tuple, ref: tuple) -> None:
    np.testing.assert_array_equal(got[0], ref[0])
    assert got[2] == ref[2] and got[1] == pytest.approx(ref[1], rel=1e-12)


def fit_argv(data, kind: str, n: int, model: Path, *extra: str) -> list[str]:
    return ["fit", *data.cli(kind, n), "--k", str(K), "--seed", str(SEED), "-o", str(model), *extra]


def test_the_hosts_are_distinct_addresses_of_this_host(two_hosts):
    two_hosts.restore()
    hosts = two_hosts.workers_by_host()
    assert sorted(hosts) == list(HOSTS[:2]) and [len(ws) for ws in hosts.values()] == [2, 2], hosts
    # The scheduler's view: every worker announced the address it listens on.
    info = two_hosts.client.scheduler_info()["workers"]
    assert {hostkit.host_of(w["host"] if "://" in w["host"] else f"tcp://{w['host']}:0") for w in info.values()} \
        == set(HOSTS[:2])
    assert hostkit.host_of(two_hosts.address) == hostkit.SCHEDULER_HOST


@pytest.mark.parametrize("kind, n, tier", [("npy", 9, "storage"), ("zarr", 3, "host")])
def test_a_fit_over_two_hosts_is_bitwise_that_of_one_worker(two_hosts, host_data, one_worker, tmp_path, kind, n,
                                                            tier):
    """The command through ``--scheduler-file``: workers of both hosts read the file (the
    storage tier re-reads it every pass), the Dask collective adds across hosts."""
    two_hosts.restore()
    model = tmp_path / "model.zarr"
    rc, _, err = daskmeans_cli(two_hosts, *fit_argv(host_data, kind, n, model, "--tier", tier, "--collective",
                                                     "dask", "-v"), cwd=tmp_path)
    assert rc == 0 and "Traceback" not in err, err
    assert f"daskmeans: tier {tier}: " in err, err
    assert "4 worker(s)" in err, err
    assert_same_model(model, one_worker(kind, n))


@pytest.mark.parametrize("tier", ["storage", "host"])
def test_every_host_reads_the_file_and_holds_its_share_of_rows(two_hosts, host_data, tier):
    """The placement over the hosts' workers: each of the 4 workers holds a shard (so both
    hosts do), shares within one chunk of each other, and every shard's rows, read on its
    own worker from the .npy path (storage) or held there (host), are the file's rows."""
    two_hosts.restore()
    c = two_hosts.client
    X = daskmeans.read(str(host_data.npy()), chunk_bytes=faultkit.EQUAL[9] * faultkit.N_FEATURES * 4)
    p = placement.place(c, X, "numpy", tier=tier)
    try:
        assert sorted(p.workers) == sorted(c.nthreads())
        assert {hostkit.host_of(w) for w in p.workers} == set(HOSTS[:2])
        shares = [sum(p.row_chunks[i] for i in ids) for ids in p.chunk_ids]
        assert sum(shares) == faultkit.N_ROWS and max(shares) - min(shares) <= max(p.row_chunks), shares
        futs = task.submit_per_shard(c, p, hostkit.read_shard, name="multinode-read")
        seen = set()
        for worker, (address, blocks) in zip(p.workers, c.gather(futs)):
            assert address == worker
            for off, block in blocks:
                np.testing.assert_array_equal(block, host_data.x[off:off + len(block)])
                seen.update(range(off, off + len(block)))
        assert seen == set(range(faultkit.N_ROWS))
    finally:
        p = None


def test_a_host_lost_mid_fit_is_recovered_bitwise(two_hosts, host_data, one_worker, undisturbed, tmp_path):
    """Both workers of 127.0.0.3 SIGKILLed as their third segment of the Lloyd loop starts:
    the fit goes on on 127.0.0.2's two workers, exit status 0, the undisturbed model (the
    same chunks: the inertia too, bit for bit)."""
    ref = undisturbed("zarr", 9)
    assert_same_model_values(ref, one_worker("zarr", 9))
    model = tmp_path / "model.zarr"
    with hostkit.kill_hosts(two_hosts.client, tmp_path / "flags", "daskmeans-segment", [HOSTS[1]], skip=2) as flags:
        rc, _, err = daskmeans_cli(two_hosts, *fit_argv(host_data, "zarr", 9, model, "-q"), cwd=tmp_path)
    assert rc == 0 and "Traceback" not in err, err
    killed = kills(flags)
    assert len(killed) == 2 and all(hostkit.host_of(line.split()[1]) == HOSTS[1] for line in killed), killed
    assert set(two_hosts.workers_by_host()) == {HOSTS[0]}
    assert_same_model(model, ref, same_chunks=True)
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_every_host_lost_is_one_line(two_hosts, host_data, tmp_path):
    """Both hosts' workers SIGKILLed in the loop: one line, exit status 1, no model. (The fit
    waits watch.NO_WORKER_SECONDS for a worker to come back: the guard gives it longer.)"""
    two_hosts.restore()
    model = tmp_path / "model.zarr"
    with hostkit.kill_hosts(two_hosts.client, tmp_path / "flags", "daskmeans-segment", HOSTS[:2]) as flags:
        rc, _, err = daskmeans_cli(two_hosts, *fit_argv(host_data, "npy", 3, model, "-q"), cwd=tmp_path,
                                   timeout=90, stuck_after=watch.NO_WORKER_SECONDS + 5)
    assert len(kills(flags)) == 4
    one_error_line(rc, err, "every worker")
    assert not model.exists() and leftovers(tmp_path) == []
    two_hosts.restore()


def test_tls_across_hosts_fits_bitwise(fresh_hosts, host_data, one_worker, tmp_path):
    """Scheduler and both hosts' workers speak tls:// with certificates of one authority (the
    TLS tests' helper): the fit through them is that of one worker, bit for bit."""
    tls = hostkit.certificates(tmp_path / "pki", "site")
    c = fresh_hosts(hosts=HOSTS[:2], per_host=1, tls=tls, contact=HOSTS[1:2])
    assert c.address.startswith("tls://127.0.0.1:")
    hosts = c.workers_by_host()
    assert sorted(hosts) == list(HOSTS[:2]) and all(w.startswith("tls://") for ws in hosts.values() for w in ws)
    model = tmp_path / "model.zarr"
    rc, _, err = daskmeans_cli(c, *fit_argv(host_data, "npy", 3, model, "-q", *c.tls_flags()), cwd=tmp_path)
    assert rc == 0 and "Traceback" not in err, err
    assert_same_model(model, one_worker("npy", 3))
