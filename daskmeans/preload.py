"""A Dask worker preload: the modules a fit's tasks run, imported as the worker starts.

A worker process imports what a task needs when the task first arrives: the engine's modules
and, on a GPU worker, CuPy and the device backend (with Numba's and CuPy's own imports, most
of a second). Unloaded, that import is the first thing a fit waits for on every worker, in the
middle of its plan. Preloaded, it runs on a thread of the worker's own from the moment the
worker starts, while the client still imports and reads its data; a task that comes before it
is done waits on Python's import lock for the module it needs, never for the rest.

The local cluster of GPU worker processes that :func:`daskmeans.dask_cluster.connect` starts
loads it; a cluster of your own loads it with ``dask worker --preload daskmeans.preload``
(``dask cuda worker`` alike), as the recipes in ``deploy/`` do. It only imports: the device
context is dask-cuda's (``--create-cuda-context``), and nothing is computed.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any

# What a fit's first tasks import on a worker: the plan's budgets, placement and its readers,
# the moments pass, the init's rounds and the Lloyd step (their own imports follow).
MODULES = (
    "daskmeans.engine.plan",
    "daskmeans.engine.placement",
    "daskmeans.engine.moments",
    "daskmeans.engine.loop",
    "daskmeans.seeding.kmeans_parallel",
    "daskmeans.io.readers",
)


def load(modules: tuple[str, ...] = MODULES) -> None:
    """Import ``modules``, then the backend ``auto`` would run on this worker (its device
    backend where one is usable, which imports CuPy; no device context is made) and, with a
    device backend, NCCL's library, which the collective between GPU workers loads at its
    first use otherwise (inside the fit's first iteration)."""
    for name in modules:
        # A module that cannot be imported fails again, with its own error, in the task that
        # needs it; the preload has nothing to add to that.
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    with contextlib.suppress(Exception):
        from daskmeans.backends import backend_here

        if not backend_here().on_host:
            from daskmeans.engine.nccl_collective import nccl_available

            nccl_available()


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: :func:`load` on a thread, so that the worker registers at once."""
    threading.Thread(target=load, name="daskmeans-preload", daemon=True).start()
