"""Fixtures of the fault-injection tests: the data (12,000 x 5 float32 blobs, 10 centres, as
.npy, Zarr and in memory) and clusters of real ``dask scheduler`` / ``dask worker`` processes
(:mod:`faultkit`)."""

from __future__ import annotations

import pytest

import faultkit
from faultkit import Data


@pytest.fixture(scope="session")
def fault_data(tmp_path_factory) -> Data:
    data = Data.make(tmp_path_factory.mktemp("fault-data"))
    for kind in faultkit.KINDS:
        for n in faultkit.CHUNKS:
            assert data.api(kind, n).numblocks[0] == n, (kind, n)
    return data


@pytest.fixture
def fresh_cluster(tmp_path):
    """A factory of clusters of their own (``fresh_cluster(nanny=False)``), stopped at the end."""
    made = []

    def make(nanny: bool = False, n: int = 3) -> faultkit.DaskProcesses:
        c = faultkit.DaskProcesses(tmp_path / f"cluster{len(made)}", n, nanny)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.stop()
