"""The Lloyd loop's segment runner, on the workers: one long task per worker per segment.

Per segment (a few iterations, about ``daskmeans.segment-seconds`` long; the client's side is
:mod:`.lloyd`)::

    rank r:   for each iteration of the segment:
                  the step (STEPS[fit.algorithm]: engine.step's lloyd_step, engine.yinyang's
                  yinyang_step): assign, allreduce, update, re-seed
                  stop rule, identically on every rank
              return the segment's per-iteration statistics (rank 0)

The step (:func:`.step.lloyd_step`) returns a typed record (:class:`.step.IterationStats`);
the history and the client receive its :meth:`~.step.IterationStats.as_dict`. The client keeps
the slowest rank's kernel time.

Centroids stay on the workers between segments, in the shard's :class:`LoopState`, with the
point the current segment began from (:func:`restart_state`: a lost peer's restart point).

Stopping follows scikit-learn's Lloyd: stop when no label changes or when the summed squared
centroid shift is at most ``tol_abs``; the final E-step then gives labels and inertia under
the final centroids.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from distributed import get_worker

from .. import config
from ..metric import inertia_scale
from .placement import Shard
from . import collective as coll
from .reseed import for_fit
from .step import FitSpec, Layout, kept_norms, lloyd_step, norms_argument
from .yinyang import yinyang_step

# The step each ``FitSpec.algorithm`` runs: the same signature and result (Lloyd's bits), the
# variants beside Lloyd's step rather than branches inside it.
STEPS = {"lloyd": lloyd_step, "yinyang": yinyang_step}


@dataclass
class Start:
    """Where a placement's first segment starts: after ``iteration`` completed iterations,
    from ``centroids``; ``prev`` (the centroids of the iteration before) restores the labels
    that count reassigned rows, after a re-placement."""

    iteration: int
    centroids: np.ndarray  # (K, D) float64
    prev: np.ndarray | None = None
    history: list | None = None  # the statistics of iterations 1..iteration (a restart point)


@dataclass
class LoopState:
    """A rank's progress, kept in its shard between segments."""

    fit_id: str
    iteration: int
    centroids: Any  # (K, D) float64, backend array
    prev: Any = None
    history: list = field(default_factory=list)  # every iteration's statistics (this rank's timings)
    # Where the current segment began: (iteration, centroids, prev, len(history)). References
    # only (each iteration makes new centroid arrays): copied to the host only when asked for.
    segment_start: tuple | None = None
    running: bool = False  # a segment is under way (or was aborted)
    done: bool = False
    stats_host: Any = None  # host (page-locked on a GPU) copy of each iteration's weights, counts, scalars
    last_seconds: float = 0.0  # the last iteration's wall time (rank 0 ends a segment by it)


@dataclass
class FinalLabels:
    """A rank's labels under the final centroids, one int32 array per local chunk."""

    labels: list = field(default_factory=list)


# ---------------------------------------------------------------- on the workers


def _labels_under(shard: Shard, centroids: Any, precision: str, be: Any,
                  interrupt: Callable[[], None] | None = None) -> tuple[list, list]:
    """Labels and per-chunk inertia (0-d or float) of every local chunk under ``centroids``
    (``interrupt``: see :func:`.step.lloyd_step`)."""
    prep = be.prepare(centroids, shard.dtype, precision)
    labels, inertia = [], []
    norms = kept_norms(shard, be)
    for j, (_, _, block, w) in enumerate(shard.items()):
        out = be.assign(block, prep, w, want_sums=False, interrupt=interrupt,
                        **norms_argument(norms, j, block, be))
        labels.append(out["labels"])
        inertia.append(out["inertia"])
    return labels, inertia


def run_segment(shard: Shard, rank: int, spec: coll.CollectiveSpec, fit: FitSpec, start: Start | None) -> dict:
    """Iterations on this rank until the stop rule, ``max_iter``, or the segment's time is up.

    Parameters
    ----------
    shard : Shard
        This rank's chunks (the task runs where the shard lives).
    rank : int
    spec : CollectiveSpec
    fit : FitSpec
    start : Start or None
        Given for a placement's first segment; later segments go on from the shard's state.

    Returns
    -------
    dict
        ``history`` (rank 0: one statistics dict per iteration; others: empty), this rank's
        ``kernel_seconds`` per iteration, ``done``, and when done ``inertia`` (under the final
        centroids).
    """
    worker = get_worker()
    be = shard.be
    xp = be.xp
    comm = coll.open_collective(spec, rank, worker)
    box = coll.mailbox(worker)

    def interrupt() -> None:  # the client gave up (interrupt, lost worker): stop here
        box.check(spec.fit_id, spec.epoch)

    if start is not None:
        st = LoopState(
            spec.fit_id, start.iteration, xp.asarray(start.centroids, dtype=xp.float64),
            history=list(start.history or []),
        )
        if start.prev is not None:
            # After a re-placement: the labels of the iteration before, so that "reassigned"
            # (and with it the stop rule) is what an undisturbed run sees.
            st.prev = xp.asarray(start.prev, dtype=xp.float64)
            shard.labels[(start.iteration - 1) % 2] = _labels_under(shard, st.prev, fit.precision, be, interrupt)[0]
        shard.loop = st
    st = shard.loop
    st.segment_start = (st.iteration, st.centroids, st.prev, len(st.history))
    st.running = True
    seg_t0 = time.perf_counter()
    reseed = for_fit(fit.max_imbalance, fit.seed)
    step = STEPS[fit.algorithm]
    history = []
    while not st.done and st.iteration < fit.max_iter:
        interrupt()
        k, d = st.centroids.shape
        n_host = Layout(k, d, fit.n_chunks, be.inertia_from_sums).host_words
        if st.stats_host is None or st.stats_host.shape[0] != n_host:
            st.stats_host = be.pinned(np.empty(n_host, np.int64))  # before the collective is queued
        # This iteration (as long as the last one) ends the segment's time: decided by rank 0
        # before the kernels, every rank learns it from the sum.
        end = comm.rank == 0 and time.perf_counter() - seg_t0 + st.last_seconds >= fit.segment_seconds
        new, stats = step(shard, st.centroids, st.iteration, fit, comm, st.stats_host, reseed,
                          end_segment=end, interrupt=interrupt)
        st.prev, st.centroids, st.iteration = st.centroids, new, stats.iteration
        st.last_seconds = stats.seconds
        history.append(stats.as_dict())
        st.done = stats.settled(fit.tol_abs)
        if stats.end_segment:
            break
    st.history += history
    result: dict = {
        "history": history if rank == 0 else [], "kernel_seconds": [h["kernel_seconds"] for h in history],
        "done": st.done or st.iteration >= fit.max_iter,
    }
    if result["done"]:
        shard.yinyang = None  # the bounds are the run's (memory of the rows' size): not kept past it
        labels, inertia = _labels_under(shard, st.centroids, fit.precision, be, interrupt)
        shard.final = FinalLabels(labels)
        # Per-chunk inertia (float64 bits, summed on the client in chunk order) and the
        # cluster sizes (int64), in one collective.
        k = int(st.centroids.shape[0])
        buf = xp.zeros(fit.n_chunks + k, xp.int64)
        fv = buf[: fit.n_chunks].view(xp.float64)
        for cid, v in zip(shard.chunk_ids, inertia):
            fv[cid] = v
        for lab in labels:
            buf[fit.n_chunks :] += be.label_counts(lab, k)
        total = be.to_numpy(comm.allreduce(buf))
        result["inertia"] = float(np.sum(total[: fit.n_chunks].view(np.float64))) * inertia_scale(fit.metric)
        result["sizes"] = total[fit.n_chunks :] if rank == 0 else None
        result["centroids"] = be.to_numpy(st.centroids) if rank == 0 else None
        # The settings the rank's kernels read (the client's, shipped with the task).
        result["settings"] = config.snapshot() if rank == 0 else None
    st.running = False
    return result


def restart_state(shard: Shard) -> Start | None:
    """Where this rank's last whole segment left the run, on the host (None: it never started
    one)."""
    st = getattr(shard, "loop", None)
    if st is None:
        return None
    it, cen, prev, n_hist = st.segment_start if st.running else (st.iteration, st.centroids, st.prev, len(st.history))
    be = shard.be
    return Start(it, be.to_numpy(cen), None if prev is None else be.to_numpy(prev), st.history[:n_hist])


def final_labels(shard: Shard, centroids: Any, precision: str, pins: dict | None = None) -> FinalLabels:
    """The labels the final pass left in ``shard``; computed under the final ``centroids``
    (the same labels) where the shard was made again after its worker was lost, its chunks
    read again and checked against their ``pins``."""
    final = getattr(shard, "final", None)
    if final is None:
        shard.expect(pins)
        be = shard.be
        final = FinalLabels(_labels_under(shard, be.asarray(np.asarray(centroids, np.float64)), precision, be)[0])
    return final


def warm(backend: str, k: int, d: int, dtype: str, precision: str, rows: int, tunables: Any = None,
         algorithm: str = "lloyd", dask_worker: Any = None) -> None:
    """On a worker (``client.run``): start compiling the kernels of a fit (returns at once),
    chosen under the plan's ``tunables`` (tile sizes and GEMM modes pick the kernels) and by
    the loop's step ``algorithm``, on the worker's device."""
    from ..backends import get_backend
    from .devices import on_worker_device

    with on_worker_device(dask_worker):
        get_backend(backend, tunables).warm(k, d, np.dtype(dtype), precision, rows, algorithm=algorithm)
