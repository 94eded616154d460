"""A Client on a local cluster of single-threaded workers, for the fixtures of every test
directory (``tests/`` is on ``sys.path`` once its ``conftest.py`` is loaded)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from distributed import Client, LocalCluster


@contextlib.contextmanager
def local_client(n_workers: int, *, processes: bool = True, set_as_default: bool = False) -> Iterator[Client]:
    """A Client on a new cluster of ``n_workers`` one-thread workers (processes, or threads of
    this process), with no dashboard port of its own and only its errors logged; the client
    and the cluster are closed on exit.

    Parameters
    ----------
    n_workers : int
    processes : bool, default True
        Worker processes; False: workers in this process.
    set_as_default : bool, default False
        Make the client the default one (``distributed.default_client()``).
    """
    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=processes, dashboard_address=":0",
                           silence_logs=logging.ERROR)
    client = Client(cluster, set_as_default=set_as_default)
    try:
        yield client
    finally:
        client.close()
        cluster.close()
