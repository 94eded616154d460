"""Waits on a fit's tasks that never wait forever: a worker lost, hung or gone with the
scheduler ends them in one exception.

A shard's tasks are pinned to its worker, and a restarted worker comes back at a new
address: a plain ``distributed.wait`` on them would wait for it forever. :func:`watch` (tasks
pinned to known workers) and :func:`wait_on_cluster` (tasks any worker may run, a
placement's persisted chunks) look at the cluster's workers while they wait and raise
:class:`WorkerLost` (the engine places the data again, ``engine.job.FitJob.survive``),
:class:`~daskmeans.errors.SchedulerLost` or a one-line :class:`~daskmeans.errors.DaskmeansError`.
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError
from typing import Callable, Sequence

from distributed import Client, wait

from .. import config
from ..dask_cluster import check_scheduler
from ..errors import DaskmeansError
from ..events import advance



class WorkerLost(Exception):
    """A worker holding a shard of the placement left the cluster (``args[0]``: addresses).

    A shard's tasks are pinned to its worker, and a restarted worker comes back at a new
    address: without this, they would wait for it forever."""


def forget_traceback(e: BaseException | None) -> None:
    """Drop the tracebacks of a caught exception and of those it chains. Distributed's
    ``sync`` keeps the exception it raises in a local of a frame of its traceback: a cycle,
    which kept the frames' futures (a placement's shards and their data on the workers, tasks
    pinned to a lost worker) alive until the next garbage collection."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__


def wait_a_little(client: Client, futs: list, seconds: float = 0.5) -> None:
    """Wait up to ``seconds`` for ``futs`` on ``client`` (``wait()`` alone would use the
    default client, maybe another one). Returns early, without raising, when one of them is
    cancelled (a lost worker's pinned task, a lost scheduler): their statuses tell."""
    try:
        with client.as_current():
            wait(futs, timeout=seconds)
    except (TimeoutError, CancelledError) as e:
        forget_traceback(e)


def gather(client: Client, futs: list, workers: Sequence[str]) -> list:
    """Results of ``futs`` (tasks on the shards held by ``workers``, a placement's, or on their
    results), raising :class:`WorkerLost` (after cancelling them) as soon as one of
    ``workers`` is gone, or silent for longer than the collective's timeout (hung: see
    :func:`watch`). It needs the workers only: what they hold is the placement's business."""
    return watch(client, futs, workers, hung_after=config.get_seconds("collective-timeout"))


# How long a look at the worker list may take: a scheduler that died since the client last
# heard from it refuses connections, and Dask retries them for its connect timeout (30 s).
_LOOK_SECONDS = 5.0


def _workers(client: Client) -> dict | None:
    """The cluster's workers (address: threads); None when a live scheduler is too busy to
    answer within :data:`_LOOK_SECONDS`; :class:`SchedulerLost` if the scheduler is gone
    (also when it goes during the look)."""
    check_scheduler(client)
    try:
        return client.sync(client.scheduler.ncores, callback_timeout=_LOOK_SECONDS)
    except Exception as e:
        forget_traceback(e)
        check_scheduler(client)  # the connection dropped during the look
        if isinstance(e, TimeoutError):
            return None
        raise


def lost_ranks(client: Client, ranks: set) -> set:
    """Those of ``ranks`` no longer in the cluster (none when the scheduler does not answer in
    time: the next look tells); :class:`SchedulerLost` if the scheduler is gone."""
    alive = _workers(client)
    return set() if alive is None else ranks - set(alive)


# A cluster left without workers this long is given up on: a nanny restarts a killed worker
# within seconds, and without one the tasks would wait for a worker forever.
NO_WORKER_SECONDS = 10.0


def wait_on_cluster(client: Client, futs: list, no_worker_seconds: float = NO_WORKER_SECONDS,
                    hung_after: float | None = None) -> None:
    """Wait for ``futs``, tasks that any worker may run (a placement's persisted chunks), as
    ``distributed.wait`` does, but never forever: :class:`SchedulerLost` when the scheduler
    goes, a :class:`DaskmeansError` when the cluster has had no worker for
    ``no_worker_seconds``, a task's error raised, a cancellation a DaskmeansError. With
    ``hung_after`` (seconds), a worker silent that long is retired
    (:func:`daskmeans.liveness.retire`): the scheduler runs its tasks on the others."""
    from ..liveness import Silence, retire

    silence = Silence(client, None, hung_after) if hung_after is not None else None
    empty_since = None
    while True:
        wait_a_little(client, futs)
        status = [f.status for f in futs]
        advance(status.count("finished"), len(futs))  # chunks placed, for the command's progress
        if all(s == "finished" for s in status):
            return
        if "error" in status:
            futs[status.index("error")].result()  # raises the task's error
        if "cancelled" in status:
            check_scheduler(client)
            raise DaskmeansError(f"tasks of the fit were cancelled: {cancel_reason(futs)}")
        workers = _workers(client)
        if silence is not None:
            hung = silence.look()
            if hung:
                retire(client, sorted(hung), hung)
        now = time.monotonic()
        if workers is None or workers:
            empty_since = None
        elif empty_since is None:
            empty_since = now
        elif now - empty_since >= no_worker_seconds:
            raise _nothing_to_place_on(no_worker_seconds)


def _nothing_to_place_on(seconds: float) -> DaskmeansError:
    return DaskmeansError(
        f"every worker left the cluster and none came back in {seconds:.0f} s: there is nothing "
        f"to place the data on (start workers, or a cluster whose nannies restart them)"
    )


def some_workers(client: Client, no_worker_seconds: float = NO_WORKER_SECONDS) -> dict:
    """The cluster's workers (address: threads) once it has one: a placement with nothing to
    persist first (its shards read their files) waits here, as :func:`wait_on_cluster` would,
    for a worker to come back (a nanny restarting it), never forever: :class:`SchedulerLost`
    when the scheduler goes, a :class:`DaskmeansError` after ``no_worker_seconds`` without one."""
    empty_since = None
    while True:
        workers = _workers(client)
        if workers:
            return dict(workers)
        now = time.monotonic()
        if workers is None:
            empty_since = None
        elif empty_since is None:
            empty_since = now
        elif now - empty_since >= no_worker_seconds:
            raise _nothing_to_place_on(no_worker_seconds)
        time.sleep(0.1)


def _fetch(client: Client, futs: list, ranks: set) -> list:
    """``client.gather(futs)`` of finished futures, watching ``ranks`` meanwhile: a result
    whose worker goes before it is fetched would be computed again, and a task pinned to that
    worker would wait for it forever (:class:`WorkerLost` instead; :class:`SchedulerLost`
    when the scheduler goes)."""
    import asyncio
    import concurrent.futures

    done = asyncio.run_coroutine_threadsafe(client.gather(futs, asynchronous=True), client.loop.asyncio_loop)
    try:
        while True:
            try:
                return done.result(timeout=0.5)
            except concurrent.futures.TimeoutError as e:
                forget_traceback(e)
            except CancelledError as e:  # a result lost: its worker, or the scheduler, went
                forget_traceback(e)
                lost = lost_ranks(client, ranks)
                if not lost:  # the loss may reach the worker list a moment later
                    time.sleep(0.5)
                    lost = lost_ranks(client, ranks)
                if lost:
                    client.cancel(futs)
                    raise WorkerLost(sorted(lost)) from None
                raise DaskmeansError(f"tasks of the fit were cancelled: {' '.join(str(e).split())}") from None
            lost = lost_ranks(client, ranks)
            if lost:
                client.cancel(futs)
                raise WorkerLost(sorted(lost))
    finally:
        done.cancel()


def watch(
    client: Client,
    futs: list,
    workers: Sequence[str],
    *,
    fetch: bool = True,
    stop: Callable[[list], None] | None = None,
    peer_loss: tuple = (),
    hung_after: float | None = None,
    progress: Callable[[list], None] | None = None,
) -> list | None:
    """Wait for ``futs`` (tasks pinned to ``workers``, or on their results) while watching
    those workers; their results (``fetch``), or None.

    A worker gone: ``stop(survivors)``, the tasks cancelled, :class:`WorkerLost`; a task
    cancelled because its worker went (Dask may forget a task whose pinned dependency was
    lost) is such a loss too. The scheduler gone: :class:`SchedulerLost` at once (Dask has
    cancelled every task). A task's error: ``stop(workers left)`` (tasks that wait for their
    peers must not wait for it), then the error; an error of a ``peer_loss`` type (a task that
    gave up on a lost peer), or a cancellation, first gives a worker's loss time to reach the
    worker list.

    With ``hung_after`` (seconds; the collective's timeout), a worker that sends the scheduler
    no heartbeat for that long, or for half of it once a ``peer_loss`` error says a peer gave
    up waiting, is hung: a note says whom the wait is for while it lasts, then the worker is
    retired (:func:`daskmeans.liveness.retire`) and lost as above (``stop`` of the others,
    :class:`WorkerLost`): a stopped worker keeps its connections, and Dask would list it for
    its ``worker-ttl`` (5 minutes) while its tasks wait.

    ``progress(status)``, where given, is told each look's statuses (a placement's shards
    that read their chunks themselves report the chunks placed).
    """
    from ..liveness import Silence

    ranks = set(workers)
    silence = Silence(client, workers, hung_after) if hung_after is not None else None
    while True:
        wait_a_little(client, futs)
        status = [f.status for f in futs]  # one look: they change as we go
        if progress is not None:
            progress(status)
        if all(s == "finished" for s in status):  # the common case: no scheduler query
            return _fetch(client, futs, ranks) if fetch else None
        lost = lost_ranks(client, ranks)
        if lost:
            if stop is not None and ranks - lost:
                stop(sorted(ranks - lost))
            client.cancel(futs)
            raise WorkerLost(sorted(lost))
        if silence is not None:
            _give_up_on_hung(client, futs, workers, silence.look(), stop)
        if "error" not in status and "cancelled" not in status:
            continue
        failed = futs[status.index("error")] if "error" in status else None
        if failed is None or isinstance(failed.exception(), peer_loss):
            time.sleep(0.5)
            if lost_ranks(client, ranks):
                continue
            if silence is not None and failed is not None:
                _give_up_on_hung(client, futs, workers, silence.confirm(), stop)
        if stop is not None:
            stop(sorted(ranks - lost_ranks(client, ranks)))
        if failed is None:  # cancelled from elsewhere (another client, the scheduler)
            raise DaskmeansError(f"tasks of the fit were cancelled: {cancel_reason(futs)}")
        failed.result()  # raises the task's error, with its traceback


def _give_up_on_hung(client: Client, futs: list, workers: Sequence[str], hung: dict,
                     stop: Callable[[list], None] | None) -> None:
    """With ``hung`` (worker: seconds silent) not empty: retire those workers, ``stop`` the
    others, cancel ``futs`` and raise :class:`WorkerLost` naming them, as for workers killed."""
    if not hung:
        return
    from ..liveness import retire

    gone = sorted(hung)
    retire(client, gone, hung, workers)
    left = sorted(set(workers) - set(gone) - lost_ranks(client, set(workers)))
    if stop is not None and left:
        stop(left)
    client.cancel(futs)
    raise WorkerLost(gone)


def cancel_reason(futs: list) -> str:
    """Why a cancelled future among ``futs`` was cancelled, as one line."""
    for f in futs:
        if f.status == "cancelled":
            try:
                f.result(timeout=5)
            except CancelledError as e:
                forget_traceback(e)
                return " ".join(str(e).split())
            except Exception:
                pass
    return "reason unknown"

