"""Lloyd iterations orchestrated on a distributed cluster.

Per iteration (see ``DESIGN.md``):

1. one task per shard (a worker thread's local chunks) runs the backend kernel over its blocks
   with the current centroids and returns a :class:`StepState` (labels kept on the worker, one
   :class:`~daskmeans.partials.Partial`);
2. the partials are combined by a tree of tasks (fan-in ``daskmeans.split-every``);
3. a root task computes the new centroids and the scalar statistics; the centroids stay on the
   cluster as a future, only the scalars travel to the client, which decides to stop or go on.

The number of tasks per iteration depends on the number of worker threads, not of chunks.
When all the data is one shard (one worker thread: one GPU, or a one-thread CPU worker) and
``daskmeans.local-loop`` is on, the whole loop runs in one task on that worker (cuML's "one
long task per worker"): each iteration would otherwise wait for a scheduler round trip
(measured ~6 ms on a one-GPU LocalCUDACluster, ~20% of a P3 iteration); per-iteration stats
reach the client as events on a topic.
Stopping follows scikit-learn's Lloyd: stop when no label changes ("strict convergence") or
when the squared centroid shift summed over clusters is at most ``tol_abs``.
"""

from __future__ import annotations

import contextlib
import queue
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from distributed import Client, Event, get_client, get_worker

from . import config
from .backends import get_backend
from .errors import DataError
from .metric import inertia_scale, unit_centroids
from .partials import Partial, combine
from .placement import Placement, Shard, submit_per_shard
from .reduction import tree_reduce


@dataclass
class ModelState:
    """Centroids (float64, on the cluster's backend) and the stats of the step that made them."""

    centroids: Any  # (K, D) float64
    stats: dict = field(default_factory=dict)


@dataclass
class StepState:
    """A shard's labels under the step's centroids (kept on the worker) and its partial."""

    labels: list  # one int32 array per block
    partial: Partial


# ---------------------------------------------------------------- tasks (run on workers)


def _slot(shard: Shard, iteration: int) -> list | None:
    """Step ``iteration``'s label arrays in the shard's workspace, if present and whole."""
    labels = shard.labels.get(iteration % 2)
    return labels if labels is not None and len(labels) == len(shard.blocks) else None


def _step(
    shard: Shard, model: ModelState, want_sums: bool = True, iteration: int = 0, precision: str = "fp32"
) -> Partial | StepState:
    """One Lloyd step over a shard's blocks.

    With ``want_sums`` (step ``iteration`` of a run, from 0) returns the shard's
    :class:`Partial`, counting the rows whose label differs from step ``iteration - 1``'s and
    keeping this step's labels in the shard's workspace; without (the final E-step) returns
    a :class:`StepState` whose labels become ``labels_``.
    """
    be = get_backend(shard.blocks[0])
    t0 = time.perf_counter()
    prep = be.prepare(model.centroids, shard.blocks[0].dtype, precision)
    prev = _slot(shard, iteration - 1) if iteration > 0 else None
    out_slot = _slot(shard, iteration) if want_sums else None
    labels, total = [], None
    inertia = reassigned = rechecked = 0
    for j, (_, _, block, w) in enumerate(shard.items()):
        # Kernel scalars stay on the device until the end of the shard: one synchronisation.
        out = be.assign(
            block, prep, w, want_sums=want_sums, prev_labels=None if prev is None else prev[j],
            out_labels=None if out_slot is None else out_slot[j],
        )
        labels.append(out["labels"])
        inertia = inertia + out["inertia"]
        reassigned = reassigned + out["reassigned"]
        rechecked = rechecked + out["rechecked"]
        if want_sums:
            p = Partial(out["sums"], out["weights"], out["counts"], 0.0, 0)
            total = p if total is None else total + p
    if total is None:
        total = Partial(None, None, None, 0.0, 0)
    total.inertia = float(inertia)  # synchronises: kernel_seconds covers the kernels' work
    total.reassigned = int(reassigned)
    total.rechecked = int(rechecked)
    total.n = shard.n
    total.kernel_seconds = time.perf_counter() - t0
    if not want_sums:
        return StepState(labels, total)
    shard.labels[iteration % 2] = labels
    return total


def _update(
    partial: Partial, prev: ModelState, iteration: int, to_host: bool = False, metric: str = "euclidean"
) -> ModelState:
    """New centroids = sums / weights (renormalised for ``metric="cosine"``); empty clusters
    keep their centroid (relocated later).

    ``to_host`` returns NumPy centroids (for small models that travel to the client)."""
    be = get_backend(partial.sums)
    xp = be.xp
    old = xp.asarray(prev.centroids, dtype=xp.float64)
    # Empty means no weight (as scikit-learn): rows of weight 0 cannot define a centroid.
    nonempty = partial.weights > 0
    safe = xp.where(nonempty, partial.weights, 1.0)
    new = xp.where(nonempty[:, None], partial.sums / safe[:, None], old)
    if metric == "cosine":
        new = unit_centroids(new, old)
    shift = float(((new - old) ** 2).sum())
    stats = {
        "iteration": iteration,
        "inertia": float(partial.inertia) * inertia_scale(metric),
        "shift": shift,
        "reassigned": int(partial.reassigned),
        "n_empty": int((~nonempty).sum()),
        "rechecked": partial.rechecked / max(1, partial.n),
        "kernel_seconds": float(partial.kernel_seconds),
    }
    return ModelState(be.to_numpy(new) if to_host else new, stats)


def _far_points(shard: Shard, model: ModelState, n_far: int, iteration: int) -> list:
    """The ``n_far`` rows farthest from their centroid in step ``iteration``:
    ``(d2, row, label, x, w)``."""
    be = get_backend(shard.blocks[0])
    xp = be.xp
    c = xp.asarray(model.centroids, dtype=xp.float64)
    out = []
    for j, (_, off, block, w) in enumerate(shard.items()):
        lab = shard.labels[iteration % 2][j]
        d2 = ((block.astype(xp.float64) - c[lab]) ** 2).sum(axis=1)
        m = min(n_far, d2.shape[0])
        idx = xp.argpartition(d2, d2.shape[0] - m)[d2.shape[0] - m :] if m < d2.shape[0] else xp.arange(m)
        d2h, idxh, labh = be.to_numpy(d2[idx]), be.to_numpy(idx), be.to_numpy(lab[idx])
        xh = be.to_numpy(block[idx]).astype(np.float64)
        wh = np.ones(m) if w is None else be.to_numpy(w[idx]).astype(np.float64)
        out += [(float(d2h[i]), off + int(idxh[i]), int(labh[i]), xh[i], float(wh[i])) for i in range(m)]
    out.sort(key=lambda t: (-t[0], t[1]))
    return out[:n_far]


def _merge_far(lists: list, n_far: int) -> list:
    merged = [c for lst in lists for c in lst]
    merged.sort(key=lambda t: (-t[0], t[1]))
    return merged[:n_far]


def _relocate(
    partial: Partial, prev: ModelState, candidates: list, iteration: int, to_host: bool, metric: str = "euclidean"
) -> ModelState:
    """Re-seed empty clusters with the points farthest from their centroid (as scikit-learn).

    Each empty cluster, in increasing index, takes the next farthest point, which is removed
    from the sums of the cluster it was assigned to.
    """
    be = get_backend(partial.sums)
    xp = be.xp
    sums = be.to_numpy(partial.sums).copy()
    weights = be.to_numpy(partial.weights).copy()
    counts = be.to_numpy(partial.counts).copy()
    empty = np.flatnonzero(weights <= 0)
    for j, (_, _, lab, x, w) in zip(empty, candidates):
        sums[lab] -= w * x
        weights[lab] -= w
        counts[lab] -= 1
        sums[j] = w * x
        weights[j] = w
        counts[j] = 1
    fixed = Partial(
        xp.asarray(sums), xp.asarray(weights), xp.asarray(counts), partial.inertia, partial.n,
        partial.reassigned, partial.kernel_seconds, partial.rechecked,
    )
    state = _update(fixed, prev, iteration, to_host, metric)
    state.stats["n_empty"] = int(len(empty))
    return state


def _moments(shard: Shard) -> dict:
    """Row count, per-feature mean and M2 (float64), the first non-finite row if any, and
    whether any sample weight is negative (all checks ride on this one pass)."""
    be = get_backend(shard.blocks[0])
    xp = be.xp
    n, mean, m2, bad, neg_w = 0, None, None, None, False
    for _, off, block, w in shard.items():
        mb, m2b, bad_row = be.moments(block)
        if w is not None:
            neg_w = neg_w or bool((w < 0).any())
            bad_w = xp.flatnonzero(~xp.isfinite(w))
            if bad_w.size:
                bad_row = int(bad_w[0]) if bad_row is None else min(bad_row, int(bad_w[0]))
        if bad is None and bad_row is not None:
            bad = off + bad_row
        nb = block.shape[0]
        mb, m2b = be.to_numpy(mb), be.to_numpy(m2b)
        if mean is None:
            n, mean, m2 = nb, mb, m2b
        else:  # Chan et al. pairwise update
            delta = mb - mean
            tot = n + nb
            mean = mean + delta * nb / tot
            m2 = m2 + m2b + delta**2 * n * nb / tot
            n = tot
    return {"n": n, "mean": mean, "m2": m2, "bad": bad, "neg_w": neg_w}


def _merge_moments(items: list) -> dict:
    acc = None
    for it in items:
        if acc is None:
            acc = dict(it)
            continue
        n, nb = acc["n"], it["n"]
        delta = it["mean"] - acc["mean"]
        tot = n + nb
        acc = {
            "n": tot,
            "mean": acc["mean"] + delta * nb / tot,
            "m2": acc["m2"] + it["m2"] + delta**2 * n * nb / tot,
            "bad": acc["bad"] if acc["bad"] is not None else it["bad"],
            "neg_w": acc["neg_w"] or it["neg_w"],
        }
    return acc


def _converged(stats: dict, tol_abs: float) -> bool:
    """scikit-learn's stopping rule: no label changed, or the summed squared shift <= tol_abs."""
    return stats["reassigned"] == 0 or stats["shift"] <= tol_abs


def _drop(client: Client, submitted: tuple | None) -> None:
    """Cancel a speculatively submitted step (its futures); returns None."""
    if submitted is not None:
        partials, new_model, stats_f = submitted
        client.cancel([*partials, new_model, stats_f])
    return None


def _get_stats(model: ModelState) -> dict:
    return model.stats


def _get_centroids(model: ModelState) -> np.ndarray:
    return get_backend(model.centroids).to_numpy(model.centroids)


def _sum_inertia(states: list) -> float:
    return float(sum(s.partial.inertia for s in states))


@dataclass
class LocalRun:
    """Outcome of :func:`_lloyd_local`, kept on the worker (the labels never travel)."""

    model: ModelState
    history: list
    state: StepState  # the final E-step: labels and inertia under the final centroids


_STOP_POLL_S = 2.0  # how often a long local loop asks whether the client gave up


def _lloyd_local(
    shard: Shard, centroids: np.ndarray, max_iter: int, tol_abs: float, metric: str, precision: str,
    topic: str | None, stop: str,
) -> LocalRun:
    """Every Lloyd iteration of a single-shard run, then the final E-step, in this one task.

    Same steps, relocation and stopping rule as the client-driven loop of :func:`run_lloyd`;
    each iteration's stats (with ``seconds``: wall time since the previous iteration ended)
    are logged as an event on ``topic`` (None: no events, nobody listens). Every ``_STOP_POLL_S`` seconds the loop checks the
    distributed Event ``stop``, set by a client that was interrupted.
    """
    be = get_backend(shard.blocks[0])
    model = ModelState(be.xp.asarray(centroids, dtype=be.xp.float64))
    try:
        worker = get_worker()
    except ValueError:  # not on a worker (direct call): no events
        worker = None
    history: list[dict] = []
    t_prev = t_poll = time.perf_counter()
    for it in range(max_iter):
        # One shard: its partial is the whole sum (no reduction), the far points are local.
        partial = _step(shard, model, True, it, precision)
        state = _update(partial, model, it + 1, False, metric)
        if state.stats["n_empty"]:
            cands = _far_points(shard, model, state.stats["n_empty"], it)
            state = _relocate(partial, model, cands, it + 1, False, metric)
        now = time.perf_counter()
        stats = dict(state.stats, seconds=now - t_prev)
        t_prev = now
        history.append(stats)
        if worker is not None and topic is not None:
            worker.log_event(topic, stats)
        model = state
        if _converged(stats, tol_abs):
            break
        if worker is not None and now - t_poll > _STOP_POLL_S:
            t_poll = now
            if Event(stop, client=get_client()).is_set():
                break
    final = _step(shard, model, want_sums=False, precision=precision)
    return LocalRun(model, history, final)


def _local_summary(run: LocalRun) -> dict:
    """The small part of a :class:`LocalRun` that travels to the client."""
    return {
        "history": run.history,
        "centroids": _get_centroids(run.model),
        "inertia": _sum_inertia([run.state]),
    }


def _local_state(run: LocalRun) -> StepState:
    return run.state


# ---------------------------------------------------------------- client-side driver


def data_moments(client: Client, placement: Placement) -> dict:
    """Mean and variance per feature (float64) in one pass; raises on NaN/inf (in X or the
    weights) and on negative weights."""
    futs = submit_per_shard(client, placement, _moments, name="daskmeans-moments")
    res = client.submit(_merge_moments, futs, pure=False).result()
    if res["bad"] is not None:
        raise DataError(f"X contains NaN or infinity (first at row {res['bad']}); clean or drop those rows")
    if res["neg_w"]:
        raise DataError("sample_weight should be >= 0")
    return {"n": res["n"], "mean": res["mean"], "var": res["m2"] / res["n"]}


@dataclass
class LloydResult:
    centroids: np.ndarray  # (K, D) float64
    inertia: float
    n_iter: int
    history: list
    states: list  # futures of StepState, labels under the final centroids
    converged: bool
    layout: list  # global chunk ids of each state's blocks


def run_lloyd(
    client: Client,
    placement: Placement,
    centroids: np.ndarray,
    *,
    max_iter: int,
    tol_abs: float,
    callback: Callable[[dict], None] | None = None,
    precision: str = "fp32",
    metric: str = "euclidean",
) -> LloydResult:
    """Run Lloyd iterations from ``centroids`` (K, D) until convergence or ``max_iter``.

    Parameters
    ----------
    client : distributed.Client
    placement : Placement of the data (see :func:`daskmeans.placement.place`)
    centroids : ndarray, shape (K, D)
    max_iter : int
    tol_abs : float
        Absolute tolerance on the summed squared centroid shift (scikit-learn's ``tol``
        times the mean feature variance).
    callback : callable(stats dict), optional
        Called after each iteration with ``iteration, inertia, shift, reassigned, n_empty,
        rechecked, seconds, kernel_seconds``.
    precision : {"fp32", "tf32", "bf16"}
        GEMM precision of the GPU kernels (labels are the same in every mode).
    metric : {"euclidean", "cosine"}
        With "cosine" the data rows must already be unit vectors (see :mod:`daskmeans.metric`).
    """
    if len(placement.shards) == 1 and config.get("local-loop"):
        return _run_local(client, placement, centroids, max_iter, tol_abs, callback, precision, metric)
    small = centroids.size * 8 <= config.get_bytes("small-model-bytes")
    model = ModelState(np.asarray(centroids, np.float64))
    if not small:
        model = client.scatter(model, hash=False)
    history: list[dict] = []
    nshard = len(placement.shards)

    def submit(model: Any, it: int) -> tuple:
        """Step ``it`` from ``model``, its reduction + update, and the stats' future."""
        partials = submit_per_shard(
            client, placement, _step, [model] * nshard, name="daskmeans-lloyd-step", iteration=it, precision=precision
        )
        new_model = tree_reduce(
            client, partials, combine, name="daskmeans-lloyd-update", finalize=_update,
            finalize_args=(model, it + 1, small, metric),
        )
        # Small models come back whole (one scheduling hop fewer); large ones stay on the
        # cluster and only their scalar stats travel.
        return partials, new_model, new_model if small else client.submit(_get_stats, new_model, pure=False)

    stale = None  # last iteration's centroids, released with the next submits
    ahead = None  # step it+1, submitted before step it's stats came back (large models)
    it = 0
    for it in range(max_iter):
        t0 = time.perf_counter()
        partials, new_model, stats_f = ahead if ahead is not None else submit(model, it)
        # Large models: submit the next step from the new centroids' future right away, so
        # the workers never wait for the client's round trip; it is dropped if this step
        # converges or needs relocation (its labels go to the other workspace slot).
        ahead = submit(new_model, it + 1) if not small and it + 1 < max_iter else None
        # Release the previous iteration's futures now, so that message rides with these
        # submits (the client sends at most one message per 10 ms).
        stale = None
        stats = stats_f.result()
        if small:
            # Ship the small centroids inside the next tasks: a future would make each step
            # wait for a transfer from the worker that computed it, whose compute thread
            # holds the GIL (measured: 10+ ms of skew between workers).
            new_model, stats = stats, stats.stats
        if stats["n_empty"]:
            ahead = _drop(client, ahead)
            root = tree_reduce(client, partials, combine, name="daskmeans-lloyd-combine")
            far = submit_per_shard(
                client, placement, _far_points, [model] * nshard, [stats["n_empty"]] * nshard, [it] * nshard,
                name="daskmeans-far-points",
            )
            cands = client.submit(_merge_far, far, stats["n_empty"], pure=False)
            new_model = client.submit(
                _relocate, root, model, cands, it + 1, small, metric, pure=False,
                key=f"daskmeans-relocate-{uuid.uuid4().hex}",
            )
            stats = client.submit(_get_stats, new_model, pure=False).result()
            if small:
                new_model = new_model.result()
        stats = dict(stats, seconds=time.perf_counter() - t0)
        history.append(stats)
        if callback is not None:
            callback(stats)
        model, stale = new_model, model
        if _converged(stats, tol_abs):
            ahead = _drop(client, ahead)
            break
    del stale
    # Final E-step: labels and inertia under the final centroids. After a step where no label
    # changed this repeats the last assignment, as scikit-learn's result does.
    final_states = submit_per_shard(
        client, placement, _step, [model] * nshard, name="daskmeans-lloyd-estep", want_sums=False,
        precision=precision
    )
    inertia = client.submit(_sum_inertia, final_states, pure=False).result() * inertia_scale(metric)
    centers = _get_centroids(model) if small else client.submit(_get_centroids, model, pure=False).result()
    converged = _converged(history[-1], tol_abs)
    return LloydResult(
        np.asarray(centers), float(inertia), it + 1, history, final_states, converged, placement.chunk_ids
    )


def _run_local(
    client: Client,
    placement: Placement,
    centroids: np.ndarray,
    max_iter: int,
    tol_abs: float,
    callback: Callable[[dict], None] | None,
    precision: str,
    metric: str,
) -> LloydResult:
    """:func:`run_lloyd` for one shard: one task runs the loop (:func:`_lloyd_local`).

    The callback still sees every iteration once and in order, in the caller's thread: events
    arrive through a queue while the task runs, and whatever the events did not deliver comes
    from the returned history. On an interrupt the task is asked to stop (a distributed Event
    it polls) and cancelled.
    """
    token = uuid.uuid4().hex
    # Progress events only for a callback (the scheduler keeps every topic it has seen).
    topic = None if callback is None else f"daskmeans-progress-{token}"
    stop = f"daskmeans-stop-{token}"
    events: queue.SimpleQueue = queue.SimpleQueue()
    if callback is not None:
        # The scheduler adds the sending worker's address to a dict event: not a statistic.
        client.subscribe_topic(topic, lambda ev: events.put({k: v for k, v in ev[1].items() if k != "worker"}))
    worker = placement.workers[0]
    run = client.submit(
        _lloyd_local, placement.shards[0], np.asarray(centroids, np.float64), max_iter, tol_abs, metric, precision,
        topic, stop, workers=[worker], allow_other_workers=False, pure=False, key=f"daskmeans-lloyd-local-{token}",
    )
    delivered = 0
    pending: dict[int, dict] = {}

    def deliver(stats: dict) -> None:
        nonlocal delivered
        pending[int(stats["iteration"])] = stats
        while delivered + 1 in pending:
            delivered += 1
            callback(pending.pop(delivered))

    try:
        while callback is not None and not run.done():
            try:
                deliver(events.get(timeout=0.05))
            except queue.Empty:
                pass
        summary = client.submit(_local_summary, run, workers=[worker], pure=False).result()
    except BaseException:
        with contextlib.suppress(Exception):  # never mask the interrupt or the task's error
            Event(stop, client=client).set()
            client.cancel([run])
        raise
    finally:
        if callback is not None:
            client.unsubscribe_topic(topic)
    history = summary["history"]
    if callback is not None:
        for stats in history[delivered:]:
            deliver(stats)
    state = client.submit(_local_state, run, workers=[worker], allow_other_workers=False, pure=False)
    return LloydResult(
        np.asarray(summary["centroids"]), summary["inertia"] * inertia_scale(metric), len(history), history,
        [state], _converged(history[-1], tol_abs), placement.chunk_ids,
    )
