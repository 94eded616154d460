"""Shared fixtures: local process-based Dask clusters, and the ``gpu`` marker skip.

Tests pass ``client=`` explicitly to :class:`daskmeans.KMeans`, so which client is the
"default" one never matters. The session ``client`` is the default client for the whole run;
``client3`` is created with ``set_as_default=False`` so it can never shadow it.
"""

from __future__ import annotations

import pytest

from daskmeans.backends import gpu_available
from localclient import local_client


@pytest.fixture(scope="session")
def client():
    """A Client on a 2-worker, 1-thread-per-worker process cluster (the default client)."""
    with local_client(2, set_as_default=True) as c:
        yield c


@pytest.fixture(scope="module")
def client3(client):
    """A second, 3-worker cluster for worker-count invariance (never the default client).

    Depends on ``client`` so that the session cluster (and the default client) exists first.
    """
    with local_client(3) as c:
        yield c


@pytest.fixture(scope="module")
def client1(client):
    """A 1-worker cluster (never the default client), for worker-count invariance."""
    with local_client(1) as c:
        yield c


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy (daskmeans.backends.gpu_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)

