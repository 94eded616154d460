"""One Lloyd step on a rank's shard, and the record it returns (:class:`IterationStats`).

::

    for each local chunk: assign + per-cluster partials (backend kernel, pure)
        buffer += the chunk's sums, int64 on the fit's grid (numerics.grid)
    total = collective.allreduce(buffer)           (identical bits on every rank)
    centroids = update(total)
    the re-seeding hook (engine.reseed): empty clusters, size balancing -> update again

The int64 buffer of one step (:class:`Layout`) carries everything the ranks combine: the
fixed-point sums and weights, the counts, the per-cluster sums of ``w ||x||^2`` on the grid
(the inertia follows from these exact sums: ``Grid.inertia``, on a backend that is
``inertia_from_sums``) or else each chunk's inertia (as float64 bits in the chunk's own slot,
so the total is added in chunk order on every rank), the reassigned and re-checked row
counts, and rank 0's "this is the segment's last iteration" flag. Nothing in the result
depends on how many workers there are or which chunks each holds; with the inertia from
sums, nothing depends on which rows a step re-assigned either (Yinyang's step).

A rank queues the step's work without waiting in between: the kernels, the collective (NCCL's;
the Dask collective adds on the host), the copy of the statistics to the host and the centroid
update (launched before the statistics are read; launched again in the rare step that
re-seeds). The host then waits for the collective (watching for a lost peer), for the
statistics, and for the shift. Each rank times its kernels with the backend's marks (CUDA
events on a GPU).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import DaskmeansError
from ..metric import get_metric, inertia_scale
from ..numerics.grid import Grid
from .placement import Shard
from .reseed import Reduced, Reseed


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
    # (:class:`.reseed.SizeBalance`); ``seed`` chooses the rows they move to.
    max_imbalance: float | None = None
    seed: int = 0
    # The step each iteration runs (``params.ALGORITHMS``' values): "lloyd" (:func:`lloyd_step`)
    # or "yinyang" (:func:`.yinyang.yinyang_step`: the same result, rows whose bounds certify
    # their label skip the distances).
    algorithm: str = "lloyd"


@dataclass(frozen=True)
class IterationStats:
    """One Lloyd step's statistics, identical on every rank but the timings (this rank's).

    FAISS's ``ClusteringIterationStats`` in this loop's terms: ``obj`` is :attr:`inertia`,
    ``time`` :attr:`seconds`, ``time_search`` :attr:`kernel_seconds`, ``imbalance_factor``
    :attr:`imbalance`, ``nsplit`` :attr:`n_moved`.

    Attributes
    ----------
    iteration : int
        Steps completed, this one included (1 for the first).
    inertia : float
        The objective under the step's centroids (before its update), summed in chunk order.
    shift : float
        The update's summed squared centroid shift (the metric's).
    reassigned : int
        Rows whose label changed in this step.
    n_empty : int
        Clusters without weight after the assignment.
    rechecked : float
        Rows whose label a low-precision GEMM left to an exact re-check, over the rows.
    imbalance : float
        The largest cluster's row count over the mean.
    n_moved : int
        Centroids moved to balance the sizes (no fixed point where not 0).
    kernel_seconds, collective_seconds, update_seconds, seconds : float
        This rank's time in the kernels, the collective, the update, the whole step.
    gb_per_s : float
        The data's bytes over :attr:`seconds`.
    end_segment : bool
        Rank 0 asked to end the segment after this step (the loop's, not a statistic).
    """

    iteration: int
    inertia: float
    shift: float
    reassigned: int
    n_empty: int
    rechecked: float
    imbalance: float
    n_moved: int
    kernel_seconds: float
    collective_seconds: float
    update_seconds: float
    seconds: float
    gb_per_s: float
    end_segment: bool = False

    def as_dict(self) -> dict:
        """The statistics as the fit's history and users' callbacks receive them: every
        attribute but :attr:`end_segment`, in this order."""
        out = dataclasses.asdict(self)
        del out["end_segment"]
        return out

    def settled(self, tol_abs: float) -> bool:
        """Scikit-learn's stop rule: no label changed or the shift is at most ``tol_abs``; a
        step that moved centroids to balance the sizes is no fixed point."""
        return (self.reassigned == 0 or self.shift <= tol_abs) and not self.n_moved


class Layout:
    """Offsets of the fields in one step's int64 buffer (K clusters, D features, the fit's
    chunks): sums ``(K*D)``, weights ``(K)``, counts ``(K)``, then the fields that travel to
    the host as they are: one inertia slot per chunk, or with ``qsums`` (a backend that is
    ``inertia_from_sums``) the per-cluster sums of ``w ||x||^2`` ``(K)`` in their place
    (``inertia`` then None), reassigned, re-checked, the segment's flag."""

    def __init__(self, k: int, d: int, n_chunks: int, qsums: bool = False):
        self.k, self.d = k, d
        o = 0
        self.sums = slice(o, o + k * d)
        o = self.sums.stop
        self.weights = slice(o, o + k)
        o = self.weights.stop
        self.counts = slice(o, o + k)
        self.small = o = self.counts.stop  # from here on the scalars travel to the host
        if qsums:
            self.qsums: slice | None = slice(o, o + k)
            self.inertia: int | None = None
            o += k
        else:
            self.qsums = None
            self.inertia = o  # n_chunks float64 slots
            o += n_chunks
        self.reassigned = o
        self.rechecked = self.reassigned + 1
        self.flag = self.rechecked + 1
        self.n = self.flag + 1

    @property
    def host_words(self) -> int:
        """int64 words of the host copy (weights onwards)."""
        return self.n - self.weights.start


def label_slot(shard: Shard, iteration: int) -> list | None:
    """Step ``iteration``'s label arrays in the shard's workspace, if present and whole."""
    labels = shard.labels.get(iteration % 2)
    return labels if labels is not None and len(labels) == len(shard.chunk_ids) else None


def kept_norms(shard: Shard, be: Any) -> list | None:
    """Each local chunk's row norms kept on the shard for the passes of its fits, where the
    backend keeps them (its ``row_norms``: the NumPy backend, whose step recomputed each
    row's ``||x||^2`` every iteration) and the tier keeps the rows in memory (the norms cost 8
    bytes a row, little beside rows held in memory, but unbounded beside a storage tier's).
    The shard's rows are the same values pass after pass (resident, and checked against their
    pins), so the norms of the first pass serve every later one; None otherwise (the kernels
    compute them). Kept as the shard's attribute ``row_norms``, beside the loop's state."""
    if getattr(be, "row_norms", None) is None or not shard.tier.resident:
        return None
    kept = getattr(shard, "row_norms", None)
    if kept is None or len(kept) != len(shard.chunk_ids):
        kept = shard.row_norms = [None] * len(shard.chunk_ids)
    return kept


def norms_argument(kept: list | None, j: int, block: Any, be: Any) -> dict:
    """``assign``'s keyword for local chunk ``j``'s kept norms (:func:`kept_norms`), made on
    its first pass; none where nothing is kept."""
    if kept is None:
        return {}
    if kept[j] is None or len(kept[j]) != block.shape[0]:
        kept[j] = be.row_norms(block.shape[0])
    return {"row_norms": kept[j]}


def lloyd_step(shard: Shard, centroids: Any, iteration: int, fit: FitSpec, comm: Any, host: np.ndarray,
               reseed: Reseed, *, end_segment: bool = False,
               interrupt: Callable[[], None] | None = None) -> tuple[Any, IterationStats]:
    """One Lloyd step on this rank.

    Parameters
    ----------
    shard : Shard
        This rank's chunks; the step's labels go to its workspace (``shard.labels``).
    centroids : backend array, shape (K, D) float64
        The step's centroids (identical on every rank).
    iteration : int
        Steps done before this one.
    fit : FitSpec
    comm : Collective
    host : ndarray, shape (Layout(K, D, fit.n_chunks, be.inertia_from_sums).host_words,) int64
        The rank's host buffer of the statistics (page-locked on a GPU, allocated before the
        collective is queued), reused step after step.
    reseed : Reseed
        Called once the sums are reduced (:func:`.reseed.for_fit`).
    end_segment : bool
        This rank asks every rank to end the segment after this step (rank 0 decides; the
        others' flags are 0, and every rank learns the sum).
    interrupt : callable, optional
        Called between the kernels' pieces of work; raises once the client gave up on the fit
        (an interrupt, a lost worker): a step of minutes stops within a tile, not at its end.

    Returns
    -------
    (centroids, IterationStats)
        The new centroids ``(K, D)`` float64 (backend array, the same bits on every rank) and
        the step's statistics.
    """
    return run_step(lloyd_pass, shard, centroids, iteration, fit, comm, host, reseed, end_segment=end_segment,
                    interrupt=interrupt)


def lloyd_pass(shard: Shard, prep: Any, centroids: Any, it: int, fit: FitSpec, buf: Any, lay: Layout,
               interrupt: Callable[[], None] | None) -> None:
    """Lloyd's local work of step ``it``: every local chunk assigned under the prepared
    centroids ``prep``, its sums, weights, counts, inertia (the chunk's slot), reassigned and
    re-checked rows added to ``buf`` (``lay``'s int64 fields), its labels kept in the shard's
    workspace (``shard.labels[it % 2]``)."""
    be = shard.be
    xp = be.xp
    fv = buf.view(xp.float64)
    prev = label_slot(shard, it - 1) if it > 0 else None
    out_slot = label_slot(shard, it)
    labels = []
    norms = kept_norms(shard, be)
    for j, (cid, _, block, w) in enumerate(shard.items()):
        out = be.assign(
            block, prep, w, want_sums=True, prev_labels=None if prev is None else prev[j],
            out_labels=None if out_slot is None else out_slot[j], grid=fit.grid, interrupt=interrupt,
            **norms_argument(norms, j, block, be),
        )
        labels.append(out["labels"])
        # Integers on the fit's grid: the total does not depend on chunking or placement.
        buf[lay.sums] += out["sums"].reshape(-1)
        buf[lay.weights] += out["weights"]
        buf[lay.counts] += out["counts"]
        check_chunk(cid, fit)
        if be.inertia_from_sums:
            buf[lay.qsums] += out["qsums"]
        else:
            fv[lay.inertia + cid] = out["inertia"]
        # Device scalars (0-d, some float64 on the GPU): added on the device, no synchronisation.
        buf[lay.reassigned] += xp.asarray(out["reassigned"]).astype(xp.int64)
        buf[lay.rechecked] += xp.asarray(out["rechecked"]).astype(xp.int64)
    shard.labels[it % 2] = labels


def check_chunk(cid: int, fit: FitSpec) -> None:
    """A chunk's id must name one of the fit's inertia slots."""
    if not 0 <= cid < fit.n_chunks:  # a slot of another field: the sums would be wrong
        raise DaskmeansError(f"chunk {cid} is outside the fit's {fit.n_chunks} chunks (ids 0 to {fit.n_chunks - 1})")


def run_step(local_pass: Callable[..., None], shard: Shard, centroids: Any, iteration: int, fit: FitSpec, comm: Any,
             host: np.ndarray, reseed: Reseed, *, end_segment: bool = False,
             interrupt: Callable[[], None] | None = None) -> tuple[Any, IterationStats]:
    """One step on this rank around its ``local_pass`` (:func:`lloyd_pass`'s signature: what
    differs between the algorithms): the buffer, the collective, the update, the re-seeding
    and the statistics, the same for every algorithm (parameters and result as
    :func:`lloyd_step`)."""
    be = shard.be
    xp = be.xp
    t_start = time.perf_counter()
    m_start = be.mark()
    k, d = centroids.shape
    lay = Layout(k, d, fit.n_chunks, be.inertia_from_sums)
    buf = xp.zeros(lay.n, xp.int64)
    if end_segment:
        buf[lay.flag] = 1
    prep = be.prepare(centroids, shard.dtype, fit.precision)
    it = iteration
    local_pass(shard, prep, centroids, it, fit, buf, lay, interrupt)
    m_kernels = be.mark()
    total = comm.allreduce(buf, wait=False)  # NCCL: queued; the host waits below, once the rest is queued too
    m_reduced = be.mark()
    # One copy to the host of the weights, counts and scalars (2K + a few int64): the empty
    # clusters and the largest one are counted on the host (on the GPU each needed a kernel and
    # a synchronisation, and CuPy's CUB reductions seconds of NVRTC on a cold kernel cache).
    host = be.to_numpy(total[lay.weights.start :], out=host, blocking=False)
    m_copied = be.mark()
    isums = total[lay.sums].reshape(k, d)
    iweights = total[lay.weights]
    old = centroids
    # Queued behind the copy, so that the GPU updates while the host reads the statistics.
    new, shift = be.update_centroids(isums, iweights, old, fit.grid)
    m_updated = be.mark()
    comm.wait()  # watches for a lost peer or an abort while it waits
    be.wait(m_copied)
    small = host[lay.small - lay.weights.start :]
    if be.inertia_from_sums:
        # The labels' inertia from the exact sums, under the centroids they were assigned
        # against (in the data dtype, as the distances): a function of labels and centroids.
        q = host[lay.qsums.start - lay.weights.start : lay.qsums.stop - lay.weights.start]
        inertia = fit.grid.inertia(be.to_numpy(isums), host[:k], q, be.to_numpy(prep.centroids))
    else:
        inertia = float(np.sum(small.view(np.float64)[: fit.n_chunks]))
    reduced = Reduced(shard, comm, it, old, isums, iweights, host[:k], host[k : 2 * k], fit.grid, fit.n_samples)
    n_empty = int(np.count_nonzero(reduced.weights <= 0))  # empty means no weight (as scikit-learn)
    n_moved = 0
    moved = reseed(reduced)
    if moved is not None:
        new = shift = None  # the update from the uncorrected sums: freed before the second one
        new, shift = be.update_centroids(moved.isums, moved.iweights, old, fit.grid)
        m_updated = be.mark()
        n_moved = moved.n_moved
    new, shift = get_metric(fit.metric).update(new, old, shift)
    shift = float(shift)
    be.wait(m_updated)
    seconds = time.perf_counter() - t_start
    stats = IterationStats(
        iteration=it + 1,
        inertia=inertia * inertia_scale(fit.metric),
        shift=shift,
        reassigned=int(small[lay.reassigned - lay.small]),
        n_empty=n_empty,
        rechecked=int(small[lay.rechecked - lay.small]) / max(1, fit.n_samples),
        imbalance=reduced.imbalance,
        n_moved=n_moved,
        kernel_seconds=be.elapsed(m_start, m_kernels),
        collective_seconds=be.elapsed(m_kernels, m_reduced),
        update_seconds=be.elapsed(m_reduced, m_updated),
        seconds=seconds,
        gb_per_s=fit.n_samples * d * np.dtype(shard.dtype).itemsize / max(seconds, 1e-12) / 1e9,
        end_segment=bool(small[lay.flag - lay.small]),
    )
    return new, stats
