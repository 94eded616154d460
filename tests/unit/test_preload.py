"""The worker preload (``daskmeans.preload``): a worker process started with it has the
engine's modules imported before any task asks for them; one started without it has not."""

from __future__ import annotations

import sys
import threading

import pytest
from distributed import Client, LocalCluster


def _imported_after_preload() -> dict:
    """On a worker: wait for the preload's thread (if any), then which modules are loaded.
    Only the standard library here, so that running it imports nothing of daskmeans."""
    for t in threading.enumerate():
        if t.name == "daskmeans-preload":
            t.join(120)
    return {m: m in sys.modules for m in ("daskmeans.engine.plan", "daskmeans.engine.loop",
                                         "daskmeans.engine.placement", "daskmeans.backends.numpy_backend")}


@pytest.mark.parametrize("preload, expected", [(["daskmeans.preload"], True), ([], False)])
def test_a_preloaded_worker_has_the_engine_imported(preload, expected):
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      preload=preload) as cluster, Client(cluster) as client:
        (loaded,) = client.run(_imported_after_preload).values()
    assert loaded == dict.fromkeys(loaded, expected)
