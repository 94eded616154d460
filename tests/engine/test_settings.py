"""Settings made on the client apply in worker processes: every engine task carries the
client's ``daskmeans`` settings (config.snapshot), and the kernels there read them."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np

from daskmeans.numerics.grid import Grid
from daskmeans.engine.lloyd import run_lloyd
from daskmeans.params import KMeansParams
from daskmeans.engine.moments import data_moments
from daskmeans.engine.placement import place
from daskmeans.engine.task import blas_capped


def _tile_bytes_seen() -> int:
    """On a worker: the tile the NumPy kernels would use for a huge block (tile-bytes itself)."""
    from daskmeans.backends import numpy_backend

    return numpy_backend.working_bytes(30, 2, 10**9)


def test_a_client_setting_reaches_the_kernels_of_process_workers(client):
    with dask.config.set({"daskmeans.tile-bytes": "64KiB"}):
        shipped = client.submit(blas_capped(_tile_bytes_seen), pure=False).result()
        plain = client.submit(_tile_bytes_seen, pure=False).result()
    assert plain == 2**20  # a worker process does not see the client's dask.config by itself
    assert shipped == 64 * 2**10
    # Made outside the setting: the default again.
    assert client.submit(blas_capped(_tile_bytes_seen), pure=False).result() == 2**20


def _fit(client, X, settings):
    with dask.config.set(settings):
        p = place(client, X, "numpy")
        m = data_moments(client, p)
        return run_lloyd(client, p, X[:6].compute().astype(np.float64), KMeansParams(max_iter=20), tol_abs=0.0,
                         grid=Grid(m["max_abs"], m["weight"]))


def test_the_loop_runs_with_the_clients_settings_and_they_change_no_bit(client):
    X = da.from_array(np.random.default_rng(3).standard_normal((4000, 5)).astype(np.float32), chunks=(500, -1))
    small = _fit(client, X, {"daskmeans.tile-bytes": "4KiB", "daskmeans.read-ahead": 5})
    default = _fit(client, X, {})
    assert (small.settings["tile-bytes"], small.settings["read-ahead"]) == ("4KiB", 5)
    assert (default.settings["tile-bytes"], default.settings["read-ahead"]) == ("1MiB", 2)
    # Tiles of 4 KiB (64 rows) or 1 MiB: the same exact sums, so the same centroids.
    np.testing.assert_array_equal(small.centroids, default.centroids)
    assert small.n_iter == default.n_iter
