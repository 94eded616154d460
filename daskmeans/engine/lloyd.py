"""The client's side of the Lloyd loop: segments submitted, progress, recovery, checkpoints.

Per segment::

    client:   submit loop.run_segment once per worker (rank)  ->  wait, watching for lost workers
              receive rank 0's per-iteration statistics; callback(stats) for each, in order;
              a checkpoint every ``checkpoint_every`` iterations (at a segment's end)

Centroids stay on the workers between segments; only statistics travel to the client. When a
worker is lost the client aborts the segment on the others (their collectives raise instead of
waiting), takes the restart point from a survivor (the centroids every rank had when the
segment began), places the data again on the workers left, and restarts the segment: the
result is bitwise that of an undisturbed run. A worker silent for the collective's timeout (a
stopped process) is retired and lost the same way (:mod:`daskmeans.liveness`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from distributed import Client, wait

from .. import config
from ..numerics.grid import Grid
from ..dask_cluster import check_scheduler
from ..errors import DaskmeansError
from ..liveness import LOOK_SECONDS, run_bounded
from ..params import ALGORITHMS, KMeansParams, RunParams
from .placement import Placement
from .task import blas_capped, submit_per_shard
from .watch import WorkerLost, forget_traceback, watch
from . import collective as coll
from .loop import Start, final_labels, restart_state, run_segment, warm
from .step import FitSpec


def warm_kernels(client: Client, backend: str, k: int, d: int, dtype: Any, precision: str, rows: int,
                 tunables: Any = None, algorithm: str = "lloyd") -> None:
    """Have every worker start compiling the kernels of the fit (blocks of up to ``rows``
    rows, the plan's ``tunables``: default those of the client's settings; the loop's step
    ``algorithm``) in the background, and return: the compiles overlap the placement and the
    moments pass instead of delaying the first iteration (an empty kernel cache)."""
    if tunables is None:
        from .plan import kernel_tunables

        tunables = kernel_tunables()
    client.run(warm, backend, k, d, str(np.dtype(dtype)), precision, int(rows), tunables, algorithm)




@dataclass
class LloydResult:
    centroids: np.ndarray  # (K, D) float64
    inertia: float
    n_iter: int
    history: list
    states: list  # futures of FinalLabels, one per rank
    converged: bool
    layout: list  # global chunk ids of each state's chunks
    row_chunks: tuple  # rows of each global chunk
    sizes: np.ndarray  # (K,) int64: rows per cluster under the final centroids
    settings: dict  # the daskmeans settings the workers ran with (config.snapshot(), the client's)


def _spec(client: Client, placement: Placement, fit_id: str, epoch: int, requested: str) -> coll.CollectiveSpec:
    kind = placement.collectives.get(requested)
    if kind is None:
        kind = placement.collectives[requested] = coll.choose_collective(client, placement, requested)
    return coll.make_spec(client, placement, fit_id, epoch, kind, config.get_seconds("collective-timeout"),
                          bool(config.get("collective-shared-memory")))


def _await(client: Client, futs: list, placement: Placement, spec: coll.CollectiveSpec) -> list:
    """Results of one segment's tasks; :class:`WorkerLost` when a rank's worker leaves the
    cluster or is hung (silent for the collective's timeout: see :func:`watch`), or a rank's
    error: either way the other ranks' collectives are aborted first (within a bound: the
    abort reaches every listed worker that still answers, and waits for none that does not)."""

    def stop(ranks: list) -> None:
        with contextlib.suppress(TimeoutError):
            run_bounded(client, coll.abort, spec.fit_id, epoch=spec.epoch, workers=ranks)

    return watch(client, futs, placement.workers, stop=stop, peer_loss=(coll.CollectiveAborted,),
                 hung_after=spec.timeout)


def run_lloyd(
    client: Client,
    placement: Placement,
    centroids: np.ndarray,
    params: KMeansParams = KMeansParams(),
    run: RunParams = RunParams(),
    *,
    tol_abs: float,
    grid: Grid,
    callback: Callable[[dict], None] | None = None,
    replan: Callable[[], Placement] | None = None,
    start: Start | None = None,
    checkpoint: Callable[[Start], None] | None = None,
    seed: int = 0,
) -> LloydResult:
    """Run Lloyd iterations from ``centroids`` (K, D) until convergence or ``max_iter``.

    Parameters
    ----------
    client : distributed.Client
    placement : Placement of the data (see :func:`daskmeans.engine.placement.place`)
    centroids : ndarray, shape (K, D)
    params : KMeansParams
        What the loop reads of the algorithm: ``max_iter``, ``precision``, ``metric`` (with
        "cosine" the data rows must already be unit vectors, see :mod:`daskmeans.metric`) and
        ``max_imbalance``: while the largest cluster holds more than this multiple of the mean
        size, each iteration moves the centroids of as many of the smallest clusters (below the
        mean) to a row of each cluster above it, drawn by ``seed`` and the iteration (the same
        rows on any cluster layout; ``n_moved`` in the statistics).
    run : RunParams
        What it reads of the run: ``collective`` ("auto" or a name of the registry; None: the configured
        ``daskmeans.collective``) and ``checkpoint_every``.
    tol_abs : float
        Absolute tolerance on the summed squared centroid shift (scikit-learn's ``tol`` times
        the mean feature variance).
    grid : Grid
        The fixed-point grid of the per-cluster sums and weights (from the data's largest
        absolute values and total weight, :class:`daskmeans.numerics.grid.Grid`).
    callback : callable(stats dict), optional
        Called with each iteration's statistics (``iteration, inertia, shift, reassigned,
        n_empty, rechecked, imbalance`` (largest cluster over the mean), ``n_moved``
        (centroids moved to balance the sizes), ``kernel_seconds,
        seconds, gb_per_s`` (data bytes over seconds)), in order, after each segment.
    replan : callable() -> Placement, optional
        Places the data again on the workers left after one is lost; without it a lost
        worker is an error.
    start : Start, optional
        Resume after ``start.iteration`` iterations (a checkpoint) instead of from ``centroids``.
    checkpoint : callable(Start), optional
        Called with the run's restart point at the end of a segment once
        ``run.checkpoint_every`` iterations have passed since the last call, and when the run
        is interrupted.
    seed : int
        The run's seed (``max_imbalance``'s draws).
    """
    fit_id = f"daskmeans-fit-{uuid.uuid4().hex}"
    precision, tol_abs = params.precision, float(tol_abs)
    collective = run.collective or config.get("collective")
    # The workers' record of the fit (loop.py's), built from the records here.
    fit = FitSpec(
        int(params.max_iter), tol_abs, params.metric, precision, grid,
        len(placement.row_chunks), placement.n_samples, float(config.get_seconds("segment-seconds")),
        None if params.max_imbalance is None else float(params.max_imbalance), int(seed),
        ALGORITHMS[params.algorithm],
    )
    history: list[dict] = list(start.history or []) if start is not None else []
    start = start if start is not None else Start(0, np.asarray(centroids, np.float64))
    saver = _Checkpointer(client, checkpoint, run.checkpoint_every, len(history))
    failing = 0.0  # once the run fails: the deadline of what is done before the error goes on
    epoch = 0
    workers_seen: set[str] = set()
    try:
        while True:
            new = set(placement.workers) - workers_seen
            if new:
                client.run(coll.install_mailbox, workers=sorted(new))
                workers_seen |= new
            # The buffer's layout (one inertia slot per chunk) follows the placement it runs on.
            fit = dataclasses.replace(fit, n_chunks=len(placement.row_chunks), n_samples=placement.n_samples)
            try:
                results = _segments(client, placement, (fit_id, epoch, collective), fit, start, history, callback,
                                    saver)
                break
            except WorkerLost as lost:
                if replan is None:
                    raise DaskmeansError(f"worker(s) {lost.args[0]} left the cluster during the fit") from None
                start = _restart_point(client, placement, lost.args[0], history) or start
                if start.history is not None:
                    # Iterations a segment finished on every rank but never reported.
                    for stats in start.history[len(history) :]:
                        history.append(stats)
                        if callback is not None:
                            callback(stats)
                del history[start.iteration :]
                placement = replan()
                epoch += 1
    except BaseException:
        # Interrupted, or a rank failed: no segment may go on running on the others, and the
        # last checkpoint is brought up to date where a live worker has a later restart point.
        # Each call is bounded (FAILING_SECONDS) and goes to the workers the scheduler still
        # lists: the error (or the interrupt) is never held up by a lost or stopped worker,
        # and with the scheduler gone nothing is tried (each call would wait for a reconnection).
        failing = time.monotonic() + FAILING_SECONDS  # for all of it, the release below too
        with contextlib.suppress(Exception):  # never mask the error or the interrupt
            # Delivered at once to every worker that answers; the bound only ends the wait
            # for the answers of those that do not.
            run_bounded(client, coll.abort, fit_id, workers=sorted(workers_seen), seconds=ABORT_SECONDS)
        if saver.wanted:
            with contextlib.suppress(Exception):
                saver.save(_restart_point(client, placement, [], history, seconds=_left(failing)))
        raise
    finally:
        with contextlib.suppress(Exception):
            run_bounded(client, coll.release, fit_id, workers=sorted(workers_seen),
                        seconds=_left(failing) if failing else FAILING_SECONDS)
    res0 = results[0]
    final = _final_states(client, placement, np.asarray(res0["centroids"]), precision)
    last = history[-1] if history else {"reassigned": 1, "shift": np.inf}
    return LloydResult(
        np.asarray(res0["centroids"]), float(res0["inertia"]), len(history), history, final,
        last["reassigned"] == 0 or last["shift"] <= tol_abs, placement.chunk_ids, placement.row_chunks,
        np.asarray(res0["sizes"], np.int64), res0["settings"],
    )


def _final_states(client: Client, placement: Placement, centroids: np.ndarray, precision: str) -> list:
    """Futures of each rank's :class:`FinalLabels`, on the rank's worker, or anywhere once
    it is gone (made again from the data there: labels never wait for a lost worker)."""
    c = client.scatter(centroids, broadcast=True, hash=False) if centroids.nbytes > _SCATTER_BYTES else centroids
    return [
        client.submit(blas_capped(final_labels), shard, c, precision, placement.pins, workers=[w],
                      allow_other_workers=True, pure=False, key=f"daskmeans-labels-{uuid.uuid4().hex}")
        for shard, w in zip(placement.shards, placement.workers)
    ]


class _Checkpointer:
    """Calls the checkpoint hook every ``every`` iterations (at segment ends) and on demand,
    only ever with a later restart point than the last one written (or resumed from): a
    failing fit's restart point never replaces a checkpoint with an earlier one."""

    def __init__(self, client: Client, hook: Callable[[Start], None] | None, every: int, done: int):
        self.client, self.hook, self.every, self.last = client, hook, max(1, int(every or 1)), done
        self.wanted = hook is not None
        self.saved: Start | None = None

    def maybe(self, placement: Placement, history: list) -> None:
        if self.wanted and len(history) - self.last >= self.every:
            # Every rank has just finished the segment: one answer is enough.
            self.save(_restart_point(self.client, placement, [], history, width=1))

    def save(self, start: Start | None) -> None:
        if start is not None and start.iteration > max(0, self.last):
            self.hook(start)
            self.last, self.saved = start.iteration, start


_SCATTER_BYTES = 8 << 20  # a restart point larger than this is scattered, not put in the tasks


def _segments(client, placement, epoch, fit, start, history, callback, saver=None) -> list:
    """Segments on one placement until the run is done; their statistics go to ``history``.
    ``epoch``: (fit id, epoch, requested collective), what the placement's collective is
    opened for (:func:`_spec`, chosen once per placement) before its first segment."""
    spec = _spec(client, placement, *epoch)
    first: Any = start
    if start.centroids.nbytes + (0 if start.prev is None else start.prev.nbytes) > _SCATTER_BYTES:
        # Large centroids (P4: 146 MiB) go to the workers directly, not inside every task of
        # the graph through the scheduler.
        first = client.scatter(start, workers=list(placement.workers), broadcast=True, hash=False)
    while True:
        futs = submit_per_shard(
            client, placement, run_segment, list(range(len(placement.shards))), [spec] * len(placement.shards),
            [fit] * len(placement.shards), [first] * len(placement.shards), name="daskmeans-segment",
        )
        first = None
        results = _await(client, futs, placement, spec)
        _report(results, history, callback)
        if results[0]["done"]:
            return results
        if saver is not None:
            saver.maybe(placement, history)


def _report(results: list, history: list, callback: Callable[[dict], None] | None) -> None:
    """A segment's statistics (rank 0's) into ``history`` and to ``callback``, in order, each
    with the slowest rank's kernel time."""
    for i, stats in enumerate(results[0]["history"]):
        stats["kernel_seconds"] = max(r["kernel_seconds"][i] for r in results)
        history.append(stats)
        if callback is not None:
            callback(stats)


# How long the restart point may take: after a lost worker (the survivors' aborted segments
# stop, then answer: a GPU survivor's ncclCommAbort with a peer killed mid all-reduce returns
# only after tens of seconds (docs/performance.md, "Open gaps", recovery after a GPU worker is
# killed), so the bound is generous; a survivor that stops sending heartbeats is
# retired sooner by the liveness watch), and when the fit fails or is interrupted (its last
# checkpoint: the error is never held up longer).
RESTART_SECONDS = 120.0
FAILING_SECONDS = 5.0
ABORT_SECONDS = 2.0  # the abort of a failing fit's segments, within FAILING_SECONDS


def _restart_point(client: Client, placement: Placement, lost: list, history: list, *,
                   seconds: float = RESTART_SECONDS, width: int | None = None) -> Start | None:
    """The state every rank had when the aborted segment began, from a surviving rank (None:
    no rank got as far as a segment, so the placement's own start stands). Its statistics are
    the client's ``history`` where the client has them (a rank's own carry its own kernel
    times, not the slowest rank's), then the survivor's for iterations never reported.

    Asked of the ranks whose workers the scheduler still lists and are not in ``lost``, up to
    ``width`` at once (default: all), the next asked as one leaves or fails; the first answer
    (the lowest rank among those in) is taken: any survivor's is a valid restart point, and
    the run from it is bitwise the same. Never longer than ``seconds``.

    Raises
    ------
    DaskmeansError
        No listed worker is left (naming the workers lost, never an empty list), or none of
        those left answered within ``seconds`` (naming them).
    SchedulerLost
        The scheduler is gone.
    """
    deadline = time.monotonic() + seconds
    check_scheduler(client)
    alive = _listed(client, seconds)
    ranks = list(enumerate(zip(placement.shards, placement.workers)))
    queue = [(r, shard, w) for r, (shard, w) in ranks if w not in lost and (alive is None or w in alive)]
    gone = [w for _, (_, w) in ranks if w in lost or (alive is not None and w not in alive)]
    asked: dict[int, tuple[Any, str]] = {}  # rank: (future of its restart state, worker)
    width = len(queue) if width is None else max(1, int(width))
    try:
        while True:
            while queue and len(asked) < width:
                r, shard, w = queue.pop(0)
                asked[r] = (client.submit(restart_state, shard, workers=[w], allow_other_workers=False, pure=False,
                                          key=f"daskmeans-restart-{uuid.uuid4().hex}"), w)
            if not asked:
                who = ", ".join(gone) or ", ".join(placement.workers)
                raise DaskmeansError(f"every worker of the fit was lost ({who}); nothing to restart from")
            for r in sorted(asked):
                fut, w = asked[r]
                if fut.status == "finished":
                    try:
                        start = fut.result(timeout=max(0.1, deadline - time.monotonic()))
                    except Exception as e:  # its worker went as the answer was fetched
                        forget_traceback(e)
                        gone.append(w)
                        del asked[r]
                        continue
                    if start is not None and start.history is not None:
                        start.history = history[: start.iteration] + start.history[len(history) :]
                    return start
                if fut.status in ("error", "cancelled"):  # that worker went too: the next one
                    gone.append(w)
                    del asked[r]
            if not asked:
                continue
            if time.monotonic() > deadline:
                slow = ", ".join(w for _, w in asked.values())
                raise DaskmeansError(
                    f"no restart point: worker(s) {slow} did not answer in {seconds:.0f} s"
                    + (f" and the others were lost ({', '.join(gone)})" if gone else "")
                )
            pending = [f for f, _ in asked.values()]
            try:
                with client.as_current():
                    wait(pending, timeout=0.1, return_when="FIRST_COMPLETED")
            except (TimeoutError, CancelledError) as e:
                forget_traceback(e)
            check_scheduler(client)
            alive = _listed(client, max(0.5, deadline - time.monotonic()))
            if alive is not None:
                for r in [r for r, (_, w) in asked.items() if w not in alive]:
                    gone.append(asked.pop(r)[1])
    finally:
        client.cancel([f for f, _ in asked.values()])


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (time.monotonic()), at least a moment for one call."""
    return max(0.5, deadline - time.monotonic())


def _listed(client: Client, seconds: float) -> set | None:
    """The workers the scheduler lists (None: it did not answer within ``seconds``, at most
    LOOK_SECONDS)."""
    try:
        return set(client.sync(client.scheduler.ncores, callback_timeout=min(seconds, LOOK_SECONDS)))
    except Exception as e:
        forget_traceback(e)
        check_scheduler(client)
        if isinstance(e, TimeoutError):
            return None
        raise
