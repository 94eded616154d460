"""The wrapper every engine task runs in, the submission of one task per shard and the wait
for a result made from the shards.

:class:`blas_capped` carries the client's daskmeans settings to the worker
(:func:`daskmeans.config.snapshot`, applied around the call) and caps BLAS's threads to the
worker's (:func:`worker_blas_threads`); :func:`submit_per_shard` runs a function on each
shard of a placement, on the shard's worker; :func:`result` waits for a future made from the
shards, watching their workers (the inits' rounds submit and wait through these two alone).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from distributed import Client

from .. import config
from .watch import gather

if TYPE_CHECKING:  # pragma: no cover
    from .placement import Placement


def unique_key(prefix: str) -> str:
    """A task key ``prefix-<32 hex digits>`` no other task has (a task of a fit is never
    the same computation as another's: each must run)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def submit_per_shard(client: Client, placement: Placement, fn, *args_per_shard: Sequence, name: str, **kwargs) -> list:
    """Submit ``fn(shard, *extra)`` once per shard on the shard's worker, with BLAS's threads
    capped to the worker's (:class:`blas_capped`); returns futures."""
    futs = []
    for i, (shard, w) in enumerate(zip(placement.shards, placement.workers)):
        extra = [a[i] for a in args_per_shard]
        futs.append(
            client.submit(
                blas_capped(fn),
                shard,
                *extra,
                # Pinned: a shard never moves (moving it would copy its data, and the step's
                # label workspace lives in the worker's copy).
                workers=[w],
                allow_other_workers=False,
                pure=False,
                key=unique_key(name),
                **kwargs,
            )
        )
    return futs


def result(client: Client, placement: Placement, fut: Any) -> Any:
    """``fut``'s result (a future made from ``placement``'s shards);
    :class:`~daskmeans.engine.watch.WorkerLost` if a shard's worker goes meanwhile (the caller
    places the data again and starts the step over: ``engine.job.FitJob.survive``)."""
    return gather(client, [fut], placement.workers)[0]


# ---------------------------------------------------------------- BLAS threads on the workers

_BLAS_LOCK = threading.Lock()
_BLAS: dict = {"users": 0, "limiter": None, "controller": None}


def _worker_threads() -> int | None:
    """The calling Dask worker's thread count; None outside a worker's task."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return None
    state = getattr(worker, "state", None)
    n = getattr(state, "nthreads", None) or getattr(worker, "nthreads", None)
    return int(n) if n else None


@contextlib.contextmanager
def worker_blas_threads() -> Iterator[None]:
    """While the block runs in a Dask worker's task, BLAS's thread pools are capped to the
    worker's threads (threadpoolctl), restored when the last such block of the process ends.

    A nanny starts its worker with ``OMP_NUM_THREADS=1`` and the like, and the command's
    in-process workers cap BLAS for as long as their cluster runs
    (:func:`daskmeans.dask_cluster._local`); a worker started otherwise (``dask worker
    --no-nanny``, a user's own cluster) runs BLAS on every core from each of its threads,
    oversubscribing the cores (docs/performance.md, "CPU path"). Outside a worker: no effect."""
    n = _worker_threads()
    if n is None:
        yield
        return
    with _BLAS_LOCK:
        if _BLAS["users"] == 0:
            if _BLAS["controller"] is None:  # the loaded libraries, looked up once per process (a walk of them all)
                from threadpoolctl import ThreadpoolController

                _BLAS["controller"] = ThreadpoolController()
            _BLAS["limiter"] = _BLAS["controller"].limit(limits=n, user_api="blas")
        _BLAS["users"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS["users"] -= 1
            if _BLAS["users"] == 0:
                limiter, _BLAS["limiter"] = _BLAS["limiter"], None
                limiter.restore_original_limits()


class blas_capped:
    """``fn`` run under :func:`worker_blas_threads` and the daskmeans settings of the process
    that made it (:func:`daskmeans.config.snapshot`, taken here: the client's): the picklable
    body of every engine task (submitted, or mapped: ``map_blocks`` names its tasks after
    ``fn``), so that a setting made on the client applies in worker processes too."""

    def __init__(self, fn: Callable, settings: dict | None = None):
        self.fn = fn
        self.settings = config.snapshot() if settings is None else dict(settings)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with config.applied(self.settings), worker_blas_threads():
            return self.fn(*args, **kwargs)

    def __dask_tokenize__(self) -> Any:
        from dask.base import tokenize

        return ("daskmeans-blas-capped", tokenize(self.fn), tokenize(sorted(self.settings.items())))

    def __reduce__(self):
        return (blas_capped, (self.fn, self.settings))

