"""Fixtures of the multi-node tests: the fault tests' data (12,000 x 5 float32 blobs, 10
centres, as .npy and Zarr), its fits on one worker (the references every multi-host fit must
equal bit for bit), and clusters of worker sets on distinct loopback addresses
(:mod:`hostkit`)."""

from __future__ import annotations

import pytest

import hostkit  # noqa: F401  (puts tests/faults on sys.path)
from faultkit import K, Data
from hostkit import SEED
from localclient import local_client


@pytest.fixture(scope="session")
def host_data(tmp_path_factory) -> Data:
    return Data.make(tmp_path_factory.mktemp("multinode-data"))


@pytest.fixture(scope="session")
def one_worker(host_data):
    """``reference(kind, n_chunks)``: the model (centroids, inertia, n_iter) of the fit of
    ``host_data`` on one in-process worker, made once per case."""
    import daskmeans

    made: dict = {}
    with local_client(1, processes=False) as client:
        def reference(kind: str, n_chunks: int):
            if (kind, n_chunks) not in made:
                km = daskmeans.KMeans(K, random_state=SEED, client=client).fit(host_data.api(kind, n_chunks))
                assert km.n_iter_ >= 4
                made[kind, n_chunks] = (km.cluster_centers_, km.inertia_, km.n_iter_)
            return made[kind, n_chunks]

        yield reference


@pytest.fixture(scope="session")
def two_hosts(tmp_path_factory):
    """Two simulated hosts of two workers each, without nannies: 127.0.0.2 started with
    ``--host``, 127.0.0.3 with ``--listen-address``/``--contact-address``. Tests that kill
    workers leave fewer: each test starts with ``two_hosts.restore()``."""
    c = hostkit.LoopbackHosts(tmp_path_factory.mktemp("two-hosts"), hostkit.HOSTS[:2], per_host=2,
                              contact=hostkit.HOSTS[1:2])
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def fresh_hosts(tmp_path):
    """A factory of clusters of simulated hosts of their own (:class:`hostkit.LoopbackHosts`'s
    arguments), stopped at the end."""
    made = []

    def make(**kwargs) -> hostkit.LoopbackHosts:
        c = hostkit.LoopbackHosts(tmp_path / f"hosts{len(made)}", **kwargs)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.stop()
