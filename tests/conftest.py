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


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run every N-th collected test from the I-th (0-based): N processes that each take one "
                          "shard run a set together (.ci/gpu)")


def _shard(config, items) -> None:
    """Keep shard ``I/N`` of ``items`` (``--shard``): every N-th from the I-th, in collection
    order, so that each shard gets a share of every module's slow tests."""
    how = config.getoption("--shard")
    if how is None:
        return
    try:
        i, n = (int(x) for x in how.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard={how!r} should be I/N with 0 <= I < N") from None
    if not 0 <= i < n:
        raise pytest.UsageError(f"--shard={how!r} should be I/N with 0 <= I < N")
    keep = [item for j, item in enumerate(items) if j % n == i]
    config.hook.pytest_deselected(items=[item for j, item in enumerate(items) if j % n != i])
    items[:] = keep


def pytest_collection_modifyitems(config, items):
    _shard(config, items)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy (daskmeans.backends.gpu_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)

