"""Shared fixtures: local process-based Dask clusters, and the ``gpu`` marker skip.

Tests pass ``client=`` explicitly to :class:`daskmeans.KMeans`, so which client is the
"default" one never matters. The session ``client`` is the default client for the whole run;
``client3`` is created with ``set_as_default=False`` so it can never shadow it.
"""

from __future__ import annotations

import logging

import pytest
from distributed import Client, LocalCluster

from daskmeans.backends import gpu_available


def _cluster(n_workers: int) -> LocalCluster:
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )


@pytest.fixture(scope="session")
def client():
    """A Client on a 2-worker, 1-thread-per-worker process cluster (the default client)."""
    cluster = _cluster(2)
    c = Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def _other_client(n_workers: int):
    cluster = _cluster(n_workers)
    c = Client(cluster, set_as_default=False)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


@pytest.fixture(scope="module")
def client3(client):
    """A second, 3-worker cluster for worker-count invariance (never the default client).

    Depends on ``client`` so that the session cluster (and the default client) exists first.
    """
    yield from _other_client(3)


@pytest.fixture(scope="module")
def client1(client):
    """A 1-worker cluster (never the default client), for worker-count invariance."""
    yield from _other_client(1)


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy (daskmeans.backends.gpu_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)

