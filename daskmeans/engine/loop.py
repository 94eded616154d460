"""The one Lloyd loop, on the workers: one long task per worker, a collective every iteration.

Per segment (a few iterations, about ``daskmeans.segment-seconds`` long; the client's side is
:mod:`.driver`)::

    rank r:   for each iteration of the segment:
                  for each local chunk: assign + per-cluster partials (backend kernel, pure)
                      buffer += the chunk's sums, int64 on the fit's grid (numerics.grid)
                  total = collective.allreduce(buffer)      (identical bits on every rank)
                  centroids = update(total); stop rule, identically on every rank
              return the segment's per-iteration statistics (rank 0)

The int64 buffer of one iteration carries everything the ranks combine: the fixed-point sums
and weights, the counts, each chunk's inertia (as float64 bits in the chunk's own slot, so the total
is added in chunk order on every rank), the reassigned and re-checked row counts, and rank 0's
"this is the segment's last iteration" flag. Nothing in the result depends on how many workers
there are or which chunks each holds.

A rank queues an iteration's work without waiting in between: the kernels, the collective
(NCCL's; the Dask collective adds on the host), the copy of the statistics to the host and the
centroid update (launched before the statistics are read; launched again in the rare
iteration that re-seeds empty clusters). The host then waits for the collective (watching for
a lost peer), for the statistics, and for the shift. Each rank times its kernels with
the backend's marks (CUDA events on a GPU); the client keeps the slowest rank's time.

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
from ..numerics.grid import Grid
from ..numerics.hashing import row_keys
from ..errors import DaskmeansError
from ..metric import get_metric, inertia_scale
from ..placement import Shard
from . import collective as coll


@dataclass(frozen=True)
class FitSpec:
    """What every rank needs to run iterations identically (one record per run)."""

    max_iter: int
    tol_abs: float
    metric: str
    precision: str
    grid: Grid  # the fixed-point grid of the per-cluster sums and weights
    n_chunks: int
    n_samples: int
    segment_seconds: float
    # Balance (None: off): while the largest cluster holds more than this multiple of the mean
    # cluster size, the smallest clusters' centroids move into the clusters above it
    # (:func:`_balance`); ``seed`` chooses the rows they move to.
    max_imbalance: float | None = None
    seed: int = 0


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


class _Layout:
    """Offsets of the fields in one iteration's int64 buffer."""

    def __init__(self, k: int, d: int, n_chunks: int):
        self.k, self.d = k, d
        o = 0
        self.sums = slice(o, o + k * d)
        o = self.sums.stop
        self.weights = slice(o, o + k)
        o = self.weights.stop
        self.counts = slice(o, o + k)
        self.small = o = self.counts.stop  # from here on the scalars travel to the host
        self.inertia = o  # n_chunks float64 slots
        self.reassigned = o + n_chunks
        self.rechecked = self.reassigned + 1
        self.flag = self.rechecked + 1
        self.n = self.flag + 1


# ---------------------------------------------------------------- on the workers


def _slot(shard: Shard, iteration: int) -> list | None:
    """Step ``iteration``'s label arrays in the shard's workspace, if present and whole."""
    labels = shard.labels.get(iteration % 2)
    return labels if labels is not None and len(labels) == len(shard.chunk_ids) else None


def _labels_under(shard: Shard, centroids: Any, precision: str, be: Any,
                  interrupt: Callable[[], None] | None = None) -> tuple[list, list]:
    """Labels and per-chunk inertia (0-d or float) of every local chunk under ``centroids``
    (``interrupt``: see :func:`_iterate`)."""
    prep = be.prepare(centroids, shard.dtype, precision)
    labels, inertia = [], []
    for _, _, block, w in shard.items():
        out = be.assign(block, prep, w, want_sums=False, interrupt=interrupt)
        labels.append(out["labels"])
        inertia.append(out["inertia"])
    return labels, inertia


def _far_points(shard: Shard, centroids: Any, n_far: int, iteration: int, be: Any) -> list:
    """The ``n_far`` local rows farthest from their centroid in step ``iteration``:
    ``(d2, row, label, x, w)``, farthest first (ties: lower row first)."""
    xp = be.xp
    c = xp.asarray(centroids, dtype=xp.float64)
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


def _all_gather(mine: np.ndarray, comm: Any, be: Any) -> np.ndarray:
    """Every rank's float64 rows ``(m, width)`` as ``(ranks, m, width)``: an all-gather through
    the sum collective (each rank fills its own slot; the others add zeros). A row whose first
    value is -1 stands for none."""
    slots = np.zeros((comm.size,) + mine.shape)
    slots[comm.rank] = mine
    total = be.to_numpy(comm.allreduce(be.asarray(slots.reshape(-1).view(np.int64)))).view(np.float64)
    return total.reshape(slots.shape)


def _gather_far(cands: list, n_far: int, d: int, comm: Any, be: Any) -> list:
    """Every rank's far points, merged."""
    mine = np.zeros((n_far, d + 4))
    mine[:, 0] = -1.0  # no candidate (real distances are >= 0)
    for i, (d2, row, lab, x, w) in enumerate(cands):
        mine[i, :4] = (d2, row, lab, w)
        mine[i, 4:] = x
    rows = [r for r in _all_gather(mine, comm, be).reshape(-1, d + 4) if r[0] >= 0]
    merged = [(float(r[0]), int(r[1]), int(r[2]), r[4:], float(r[3])) for r in rows]
    merged.sort(key=lambda t: (-t[0], t[1]))
    return merged[:n_far]


def _members(shard: Shard, over: np.ndarray, k: int, iteration: int, salt: int, be: Any) -> dict:
    """For each cluster of ``over`` (host ints, of ``k``), its local row of the smallest key
    (:func:`~daskmeans.numerics.hashing.row_keys`) in step ``iteration``: ``{cluster: (key, row, x, w)}``."""
    xp = be.xp
    is_over = xp.zeros(k, bool)
    is_over[xp.asarray(over)] = True
    best: dict = {}
    for j, (_, off, block, w) in enumerate(shard.items()):
        lab = shard.labels[iteration % 2][j]
        idx = xp.flatnonzero(is_over[lab])
        if not idx.size:
            continue
        keys = row_keys(xp, idx + off, salt) >> xp.uint64(11)  # 53 bits: exact as float64 too
        labs = lab[idx]
        # By cluster, then key, then row (idx ascends; both sorts are stable).
        order = xp.argsort(keys, kind="stable")
        order = order[xp.argsort(labs[order], kind="stable")]
        labs_sorted = labs[order]
        first = order[xp.flatnonzero(xp.concatenate([xp.ones(1, bool), labs_sorted[1:] != labs_sorted[:-1]]))]
        rows_h, keys_h, labs_h = be.to_numpy(idx[first]), be.to_numpy(keys[first]), be.to_numpy(labs[first])
        xs = be.to_numpy(block[idx[first]]).astype(np.float64)
        ws = np.ones(len(rows_h)) if w is None else be.to_numpy(w[idx[first]]).astype(np.float64)
        for i, c in enumerate(labs_h.tolist()):
            cand = (int(keys_h[i]), off + int(rows_h[i]), xs[i], float(ws[i]))
            if c not in best or cand[:2] < best[c][:2]:
                best[c] = cand
    return best


def _gather_members(mine: dict, over: np.ndarray, d: int, comm: Any, be: Any) -> list:
    """Every rank's :func:`_members` merged: per cluster of ``over``, ``(x, w)`` of the row of
    the smallest key (then row) on any rank."""
    slots = np.zeros((len(over), d + 3))
    slots[:, 0] = -1.0  # no row of that cluster here
    for i, c in enumerate(over.tolist()):
        if c in mine:
            key, row, x, w = mine[c]
            slots[i, :3] = (key, row, w)
            slots[i, 3:] = x
    total = _all_gather(slots, comm, be)
    out = []
    for i in range(len(over)):
        rows = [r for r in total[:, i] if r[0] >= 0]
        r = min(rows, key=lambda r: (r[0], r[1]))  # every cluster of ``over`` has rows somewhere
        out.append((r[3:], float(r[2])))
    return out


def _balance(counts: np.ndarray, mean: float, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """The clusters above ``bound * mean`` rows, largest first, and as many of the smallest
    clusters below ``mean`` rows (smallest first; ties: lower index), whose centroids move to a
    row of each (the donors). Host ints ``(over, donors)``, of the same length."""
    over = np.flatnonzero(counts > bound * mean)
    over = over[np.argsort(-counts[over], kind="stable")]
    under = np.flatnonzero(counts < mean)
    under = under[np.argsort(counts[under], kind="stable")]
    m = min(len(over), len(under))
    return over[:m], under[:m]


def _iterate(shard: Shard, st: LoopState, fit: FitSpec, comm: Any, seg_t0: float,
             interrupt: Callable[[], None] | None = None) -> dict:
    """One Lloyd iteration on this rank; returns its statistics (identical on every rank but
    the timings: ``kernel_seconds`` is this rank's). ``interrupt`` is called between the
    kernels' pieces of work and raises once the client gave up on the fit (an interrupt, a
    lost worker): an iteration of minutes stops within a tile, not at its end."""
    be = shard.be
    xp = be.xp
    t_start = time.perf_counter()
    m_start = be.mark()
    k, d = st.centroids.shape
    lay = _Layout(k, d, fit.n_chunks)
    buf = xp.zeros(lay.n, xp.int64)
    fv = buf.view(xp.float64)
    if comm.rank == 0 and t_start - seg_t0 + st.last_seconds >= fit.segment_seconds:
        # This iteration (as long as the last one) ends the segment's time: decided before the
        # kernels, every rank learns it from the sum.
        buf[lay.flag] = 1
    n_host = lay.n - lay.weights.start
    if st.stats_host is None or st.stats_host.shape[0] != n_host:
        st.stats_host = be.pinned(np.empty(n_host, np.int64))  # before the collective is queued
    prep = be.prepare(st.centroids, shard.dtype, fit.precision)
    it = st.iteration
    prev = _slot(shard, it - 1) if it > 0 else None
    out_slot = _slot(shard, it)
    labels = []
    for j, (cid, _, block, w) in enumerate(shard.items()):
        out = be.assign(
            block, prep, w, want_sums=True, prev_labels=None if prev is None else prev[j],
            out_labels=None if out_slot is None else out_slot[j], grid=fit.grid, interrupt=interrupt,
        )
        labels.append(out["labels"])
        # Integers on the fit's grid: the total does not depend on chunking or placement.
        buf[lay.sums] += out["sums"].reshape(-1)
        buf[lay.weights] += out["weights"]
        buf[lay.counts] += out["counts"]
        if not 0 <= cid < fit.n_chunks:  # a slot of another field: the sums would be wrong
            raise DaskmeansError(f"chunk {cid} is outside the fit's {fit.n_chunks} chunks")
        fv[lay.inertia + cid] = out["inertia"]
        # Device scalars (0-d, some float64 on the GPU): added on the device, no synchronisation.
        buf[lay.reassigned] += xp.asarray(out["reassigned"]).astype(xp.int64)
        buf[lay.rechecked] += xp.asarray(out["rechecked"]).astype(xp.int64)
    shard.labels[it % 2] = labels
    m_kernels = be.mark()
    total = comm.allreduce(buf, wait=False)  # NCCL: queued; the host waits below, once the rest is queued too
    m_reduced = be.mark()
    # One copy to the host of the weights, counts and scalars (2K + a few int64): the empty
    # clusters and the largest one are counted on the host (on the GPU each needed a kernel and
    # a synchronisation, and CuPy's CUB reductions seconds of NVRTC on a cold kernel cache).
    host = be.to_numpy(total[lay.weights.start :], out=st.stats_host, blocking=False)
    m_copied = be.mark()
    isums = total[lay.sums].reshape(k, d)
    iweights = total[lay.weights]
    old = st.centroids
    # Queued behind the copy, so that the GPU updates while the host reads the statistics.
    new, shift = be.update_centroids(isums, iweights, old, fit.grid)
    m_updated = be.mark()
    comm.wait()  # watches for a lost peer or an abort while it waits
    be.wait(m_copied)
    small = host[lay.small - lay.weights.start :]
    smallf = small.view(np.float64)
    n_empty = int(np.count_nonzero(host[:k] <= 0))  # empty means no weight (as scikit-learn)
    largest = int(host[k : 2 * k].max())
    imbalance = largest * k / max(1, fit.n_samples)  # the largest cluster over the mean
    n_moved = 0
    if n_empty:
        new = shift = None  # the update from the uncorrected sums: freed before the second one
        cands = _gather_far(_far_points(shard, st.centroids, n_empty, it, be), n_empty, d, comm, be)
        # A row at its centroid (distance 0) is no better start for an empty cluster than where
        # it is: moving it would empty its own cluster or copy a centroid (duplicate points), and
        # the fit would not settle. As scikit-learn, empty clusters take only rows at a distance
        # from their centroid, and the others stay where they are.
        cands = [c for c in cands if c[0] > 0]
        targets = np.flatnonzero(host[:k] <= 0)[: len(cands)]
        isums, iweights = _relocate(isums, iweights, targets, [(c[2], c[3], c[4]) for c in cands], fit.grid, be)
        new, shift = be.update_centroids(isums, iweights, old, fit.grid)
        m_updated = be.mark()
    elif fit.max_imbalance is not None and imbalance > fit.max_imbalance:
        over, donors = _balance(host[k : 2 * k], fit.n_samples / k, fit.max_imbalance)
        if len(over):
            new = shift = None
            members = _gather_members(_members(shard, over, k, it, fit.seed + it, be), over, d, comm, be)
            cands = [(int(c), x, w) for c, (x, w) in zip(over, members)]
            isums, iweights = _relocate(isums, iweights, donors, cands, fit.grid, be)
            new, shift = be.update_centroids(isums, iweights, old, fit.grid)
            m_updated = be.mark()
            n_moved = len(over)
    new, shift = get_metric(fit.metric).update(new, old, shift)
    shift = float(shift)
    be.wait(m_updated)
    st.prev, st.centroids, st.iteration = old, new, it + 1
    n_chunks = fit.n_chunks
    seconds = st.last_seconds = time.perf_counter() - t_start
    return {
        "iteration": it + 1,
        "inertia": float(np.sum(smallf[:n_chunks])) * inertia_scale(fit.metric),
        "shift": shift,
        "reassigned": int(small[lay.reassigned - lay.small]),
        "n_empty": n_empty,
        "rechecked": int(small[lay.rechecked - lay.small]) / max(1, fit.n_samples),
        "imbalance": imbalance,
        "n_moved": n_moved,
        "kernel_seconds": be.elapsed(m_start, m_kernels),
        "collective_seconds": be.elapsed(m_kernels, m_reduced),
        "update_seconds": be.elapsed(m_reduced, m_updated),
        "seconds": seconds,
        "gb_per_s": fit.n_samples * d * np.dtype(shard.dtype).itemsize / max(seconds, 1e-12) / 1e9,
        "_end_segment": bool(small[lay.flag - lay.small]),
    }


def _relocate(isums: Any, iweights: Any, targets: np.ndarray, cands: list, grid: Grid, be: Any) -> tuple:
    """Re-seed clusters ``targets`` with rows ``cands`` (``(label, x, w)`` each, in order):
    each target's sums become its row alone, which leaves the cluster it was assigned to. On
    the grid, as the kernels added the row. Empty clusters take the rows farthest from their
    centroid (as scikit-learn's); balancing donors, a row of each cluster too large."""
    s, w = be.to_numpy(isums).copy(), be.to_numpy(iweights).copy()
    for j, (lab, x, wt) in zip(targets, cands):
        v, u = grid.on_grid(x, wt)
        s[lab] -= v
        w[lab] -= u
        s[j], w[j] = v, u
    return be.asarray(s), be.asarray(w)


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
    history = []
    while not st.done and st.iteration < fit.max_iter:
        interrupt()
        stats = _iterate(shard, st, fit, comm, seg_t0, interrupt)
        end = stats.pop("_end_segment")
        history.append(stats)
        # A step that moved centroids to balance the clusters is no fixed point.
        st.done = (stats["reassigned"] == 0 or stats["shift"] <= fit.tol_abs) and not stats["n_moved"]
        if end:
            break
    st.history += history
    result: dict = {
        "history": history if rank == 0 else [], "kernel_seconds": [h["kernel_seconds"] for h in history],
        "done": st.done or st.iteration >= fit.max_iter,
    }
    if result["done"]:
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


def warm(backend: str, k: int, d: int, dtype: str, precision: str, rows: int, settings: dict | None = None) -> None:
    """On a worker (``client.run``): start compiling the kernels of a fit (returns at once),
    chosen under the client's ``settings`` (tile sizes and GEMM modes pick the kernels)."""
    from ..backends import get_backend

    with config.applied(settings):
        get_backend(backend).warm(k, d, np.dtype(dtype), precision, rows)
