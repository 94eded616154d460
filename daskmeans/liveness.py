"""Calls the client makes to the workers outside tasks (an abort, a release): to the workers the
scheduler still lists, within a time bound (:func:`run_bounded`), so that none waits for a
lost or stopped worker, nor for a lost scheduler (Dask would wait for a reconnection).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from distributed import Client

from .dask_cluster import check_scheduler

# How long a look at the scheduler may take (a scheduler that died since the client last heard
# from it refuses connections, and Dask retries them for its connect timeout: 30 s).
LOOK_SECONDS = 5.0


def run_bounded(client: Client, fn: Callable, *args: Any, workers: Sequence[str], seconds: float = LOOK_SECONDS,
                **kwargs: Any) -> dict:
    """``client.run(fn, *args, workers=workers, **kwargs)`` on those of ``workers`` the
    scheduler still lists, giving up after ``seconds`` (a stopped worker never answers):
    ``{worker: result or exception}``, ``{}`` when none is listed; TimeoutError after
    ``seconds``. The function still runs on every worker that gets it."""
    deadline = time.monotonic() + seconds
    check_scheduler(client)
    alive = set(client.sync(client.scheduler.ncores, callback_timeout=seconds))
    targets = sorted(set(workers) & alive)
    if not targets:
        return {}
    left = max(0.1, deadline - time.monotonic())
    return client.sync(client.run, fn, *args, workers=targets, on_error="return", callback_timeout=left, **kwargs)
