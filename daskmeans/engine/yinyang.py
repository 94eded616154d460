"""Yinyang k-means's step (Ding et al. 2015, "Yinyang K-means"): Lloyd's result, with the
distance work skipped for the rows whose bounds certify their label.

Beside :func:`.step.lloyd_step`, with its signature (the segment runner picks the step by
``FitSpec.algorithm``); only the local pass differs (:func:`yinyang_pass`), the collective,
the update and the re-seeding are :func:`.step.run_step`'s. Per rank, in the shard's
workspace (``shard.yinyang``, :class:`YinyangState`):

- the centroids' groups (``t`` groups by a few Lloyd steps on the centroids of the step that
  set the bounds: :func:`centroid_groups`; :func:`.bounds.n_groups` says how many);
- per local chunk, each row's upper bound on the distance to its centroid, its lower bounds
  per group on the distances to the group's other centroids (float64, ``(n,)`` and
  ``(n, t)``) and its ``||x||^2``;
- the rank's partial sums, weights and counts (int64 on the fit's grid) under the labels of
  the last step.

A step moves the bounds by each centroid's drift (its group's largest for the lower bounds)
and keeps a row's label where the upper bound, tightened to the row's distance if need be,
stays below every group's lower bound by the backend's rounding margin
(:mod:`daskmeans.backends.bounds`): the label the full assignment would give. The other rows
go through the backend's own assignment (the same GEMM and selection as Lloyd's) and get new
bounds. The sums change by the rows that moved, subtracted from their old cluster and added
to their new one as the exact integers the kernels add: the same int64 totals as summing
every row again, so the centroids are Lloyd's bits. So do the per-cluster sums of
``w ||x||^2`` from which the step's inertia follows (``Grid.inertia``, on a backend that is
``inertia_from_sums``: the CPU's), so the inertia is Lloyd's bits too, with no distance
computed for a certified row. On a backend whose inertia is per chunk (the GPU's), each
chunk's is its rows' distances to their centroids (``owner_inertia``).

The bounds are set by a full assignment (every row's distances) where they are not known
to hold for the step's centroids: once the rank's last step moved at most
:data:`BOUND_START` of its rows, after the fit's first steps, a restart or a re-placement,
or a step given centroids other than those the last step returned (the state keeps that
array). Until then the step is Lloyd's pass itself: while the centroids still move far next
to no row stays certified, and the bounds cost more than the distances they would save.
Bounds under which the bounded step would cost more than :data:`ABANDON` of Lloyd's pass (the
uncertain rows' share times the backend's ``bounds_cost``) are dropped the same way, and set
again once the steps move a quarter as many rows (docs/performance.md, "Yinyang"). Setting
them costs ``bounds_cost`` passes, so before it is paid a probe predicts whether they will
hold: at the step that would set them, Lloyd's pass runs and bounds are set for every
:data:`PROBE_STRIDE`-th row of each chunk (:class:`Probe`); the next :data:`PROBE_STEPS` steps
run Yinyang's step on those rows alone beside Lloyd's pass, and the last of them sets every
row's bounds only where their uncertain share pays (:func:`_pays`) over the steps the fit is
expected to run after them (:func:`_steps_after`: the moved rows' decay), else it is Lloyd's
pass again and the rule waits for a quarter as many moved rows. On data whose
centroids keep moving by more than the gaps between them (wide K on unclustered rows) the
bounds then cost a sixty-fourth of a reset per attempt instead of two steps of several
passes each. A re-seeding (empty clusters, size balance) needs no reset: the bounds are
moved by the drift of whatever the update did, which the triangle inequality covers for any
move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..backends.bounds import n_groups
from .placement import Shard
from .reseed import Reseed
from .step import FitSpec, IterationStats, Layout, label_slot, check_chunk, lloyd_pass, run_step

GROUPING_STEPS = 5  # Lloyd steps of the centroids' grouping (it only steers the filter's strength)
# The bounds are set (every row's distances, ~3x a Lloyd pass on the CPU) only once the rank's
# last step moved at most this share of its rows: before that the centroids still drift so far
# that next to no row stays certified, and Lloyd's own pass is the cheaper step.
BOUND_START = 0.1
# Bounds whose step costs more than this share of Lloyd's pass (the uncertain rows' share times
# the backend's ``bounds_cost``: on the CPU, 0.3 of the rows) are dropped, or not set after a
# probe, and set again only once the steps move a quarter as many rows. ``math.inf``: never
# dropped, and set without a probe.
ABANDON = 0.9
# The probe's sample: every this-th row of each chunk (a share of the uncertain rows to within a
# few percent on a chunk of 10^5 rows, at a sixty-fourth of the full bounds' cost).
PROBE_STRIDE = 64
# Steps the probe's sample runs Yinyang's step before the verdict: the first step after the
# bounds are set certifies the most rows (they are as tight as they get), so one step alone
# would promise more than the later steps give.
PROBE_STEPS = 2


@dataclass
class Probe:
    """Bounds for a sample of the rank's rows (every :data:`PROBE_STRIDE`-th row of each
    chunk), set at the step before the full bounds would be: the next :data:`PROBE_STEPS`
    steps run Yinyang's step on them, which predicts the share of rows the full bounds would
    leave uncertain."""

    iteration: int  # the step it runs next
    steps_left: int  # steps it runs before its verdict, this one included
    cref: Any  # the centroids its bounds are for
    group_of: Any  # (K,) int32, backend array (the full bounds reuse the grouping)
    group_host: np.ndarray
    t: int
    rows: list = field(default_factory=list)  # per chunk the sampled rows (int64)
    x: list = field(default_factory=list)  # per chunk those rows, gathered (the judging steps read no chunk)
    labels: list = field(default_factory=list)  # their labels under ``cref``
    upper: list = field(default_factory=list)
    lower: list = field(default_factory=list)
    xnorm: list = field(default_factory=list)


@dataclass
class YinyangState:
    """A rank's Yinyang bounds and partial sums between steps (see the module docstring)."""

    next_iteration: int  # the step the state is for
    expect: Any  # the centroids that step must be given (the last step's result, by identity)
    cref: Any = None  # (K, D) the last step's centroids in the data dtype (the drift's origin)
    group_of: Any = None  # (K,) int32, backend array
    group_host: np.ndarray | None = None  # the same on the host (the groups' drifts)
    t: int = 1
    sums: Any = None  # (K, D) int64, this rank's under the last step's labels
    weights: Any = None  # (K,) int64 (weighted rows)
    counts: Any = None  # (K,) int64
    qsums: Any = None  # (K,) int64, the rows' w ||x||^2 on the grid (inertia_from_sums backends)
    weighted: bool = False
    bounded: bool = False  # the bounds and sums below hold (else the last step was Lloyd's pass)
    moved: float = 1.0  # the share of the rank's rows the last step moved
    moved_before: float | None = None  # the share the step before it moved (None: no such step)
    rows: int = 0  # the rank's rows at the last step
    threshold: float | None = None  # the bounds are set once ``moved`` is at most this (None: BOUND_START)
    upper: list = field(default_factory=list)  # per chunk (n,) float64
    lower: list = field(default_factory=list)  # per chunk (n, t) float64
    xnorm: list = field(default_factory=list)  # per chunk (n,) float64
    probe: Probe | None = None  # the sample bounds the next step judges (no full bounds meanwhile)


def centroid_groups(xp: Any, centroids: Any, t: int) -> Any:
    """Each centroid's group, ``(K,)`` int32: :data:`GROUPING_STEPS` Lloyd steps on the
    centroids (float64) from ``t`` of them evenly spaced by index (a group left empty keeps its
    centre). A function of the centroids alone, the same on every rank; it steers only how
    many rows the filter certifies, never a label."""
    c = centroids.astype(xp.float64)
    k = c.shape[0]
    if t <= 1 or k <= 1:
        return xp.zeros(k, xp.int32)
    centres = c[xp.asarray(np.linspace(0, k - 1, t).round().astype(np.int64))]
    csq = (c * c).sum(axis=1)
    group = xp.zeros(k, xp.int64)
    step = max(1, (1 << 24) // max(1, t))  # rows of the K x t distances at a time
    for _ in range(GROUPING_STEPS):
        zsq = (centres * centres).sum(axis=1)
        for s in range(0, k, step):
            dist = csq[s : s + step, None] - 2.0 * (c[s : s + step] @ centres.T) + zsq[None, :]
            group[s : s + step] = dist.argmin(axis=1)
        # The groups' means by sorted segments (float64 running sums; only the grouping depends on them).
        order = xp.argsort(group, kind="stable")
        g_sorted = group[order]
        cs = xp.concatenate([xp.zeros((1, c.shape[1]), xp.float64), xp.cumsum(c[order], axis=0)])
        counts = xp.bincount(g_sorted, minlength=t)
        ends = xp.cumsum(counts)
        starts = ends - counts
        filled = counts > 0
        means = (cs[ends] - cs[starts]) / xp.maximum(counts, 1)[:, None]
        centres = xp.where(filled[:, None], means, centres)
    return group.astype(xp.int32)


def _reset(st: YinyangState, shard: Shard, prep: Any, k: int, d: int, t: int, probe: Probe | None = None) -> None:
    """``st``'s groups (``probe``'s where given), zero sums and empty bounds, to be set by a
    pass over every row."""
    be = shard.be
    xp = be.xp
    if probe is not None:
        st.group_of, st.group_host, st.t = probe.group_of, probe.group_host, probe.t
    else:
        st.group_of = centroid_groups(xp, prep.centroids, t)
        st.group_host = be.to_numpy(st.group_of)
        st.t = t
    st.sums, st.weights, st.counts = xp.zeros((k, d), xp.int64), xp.zeros(k, xp.int64), xp.zeros(k, xp.int64)
    st.qsums = xp.zeros(k, xp.int64) if be.inertia_from_sums else None
    st.upper, st.lower, st.xnorm = [], [], []
    st.bounded = True


def _drifts(be: Any, cref: Any, centroids: Any, group_host: np.ndarray, t: int) -> tuple[Any, Any, float]:
    """``(drift, gdrift, cmax)``: each centroid's drift from ``cref`` (K,), each of the ``t``
    groups' largest (``group_host``: each centroid's group) and the largest centroid norm, as
    the backend's ``centroid_drift`` gives them."""
    drift, cmax = be.centroid_drift(cref, centroids)
    gd = np.zeros(t, np.float64)
    np.maximum.at(gd, group_host, be.to_numpy(drift))
    return drift, be.asarray(gd), cmax


def _pays(uncertain: float, cost: float, remaining: int) -> bool:
    """Whether bounds that leave the share ``uncertain`` of the rows uncertain pay on a backend
    whose uncertain row costs ``cost`` Lloyd rows: their step costs at most :data:`ABANDON` of
    Lloyd's pass, and the ``remaining`` steps after the one that sets them save more than
    setting them costs beyond a pass of Lloyd's (``cost - 1`` passes)."""
    step = uncertain * cost
    return step <= ABANDON and remaining * (1.0 - step) > cost - 1.0


def _steps_after(st: YinyangState, at: int, last: int, max_iter: int) -> int:
    """The steps expected after step ``at`` (which would set the bounds), from the rows the
    rank's last measured step ``last`` and the one before it moved: their ratio kept until
    fewer than one row would move, the step that finds no row moving included, and at most the
    steps ``max_iter`` leaves. Bounds set a step or two before the fit settles cannot repay
    their setting; where the moved rows do not shrink nothing is predicted but ``max_iter``."""
    cap = max(0, max_iter - at - 1)
    if st.moved_before is None or not 0.0 < st.moved < st.moved_before or st.rows <= 0:
        return cap
    count = st.moved * st.rows
    steps = math.ceil(math.log(count) / math.log(st.moved_before / st.moved)) + 1 if count > 1.0 else 1
    return max(0, min(cap, steps - (at - last)))


def _measured(st: YinyangState, moved_rows: int, rows: int) -> None:
    """``st``'s moved shares after a step that moved ``moved_rows`` of the rank's ``rows``."""
    st.moved_before, st.moved, st.rows = st.moved if st.rows else None, moved_rows / max(1, rows), rows


def _set_probe(st: YinyangState, shard: Shard, prep: Any, it: int,
               interrupt: Callable[[], None] | None) -> None:
    """``st.probe``: bounds under step ``it``'s centroids for every :data:`PROBE_STRIDE`-th
    row of each chunk, for step ``it + 1`` to judge."""
    be = shard.be
    xp = be.xp
    t = n_groups(prep.centroids.shape[0])
    group_of = centroid_groups(xp, prep.centroids, t)
    pr = Probe(iteration=it + 1, steps_left=PROBE_STEPS, cref=prep.centroids, group_of=group_of,
               group_host=be.to_numpy(group_of), t=t)
    _, cmax = be.centroid_drift(prep.centroids, prep.centroids)
    for _, _, block, _ in shard.items():
        sel = xp.arange(0, block.shape[0], PROBE_STRIDE, dtype=xp.int64)
        xs = block[sel]
        xn = be.row_sqnorms(xs)
        if sel.shape[0]:
            lab, up, lo = be.assign_bounds(xs, prep, group_of, t, xn, cmax, interrupt=interrupt)
        else:
            lab, up, lo = xp.empty(0, xp.int32), xp.empty(0, xp.float64), xp.empty((0, t), xp.float64)
        for into, v in zip((pr.rows, pr.x, pr.labels, pr.upper, pr.lower, pr.xnorm), (sel, xs, lab, up, lo, xn)):
            into.append(v)
    st.probe = pr


def _judge_probe(st: YinyangState, shard: Shard, prep: Any, it: int, fit: FitSpec,
                 interrupt: Callable[[], None] | None) -> Probe | bool | None:
    """Step ``it`` of the probe's sample, as Yinyang's step runs it on every row (the filter,
    then new bounds for the rows it leaves uncertain), and the verdict: None where there is no
    probe for this step; False where the share of uncertain rows would not pay (:func:`_pays`;
    the probe dropped); True where it pays and the probe runs the next step too; the probe
    itself where it pays at its last step."""
    pr, st.probe = st.probe, None
    if pr is None or pr.iteration != it or len(pr.rows) != len(shard.chunk_ids):
        return None
    be = shard.be
    drift, gdrift, cmax = _drifts(be, pr.cref, prep.centroids, pr.group_host, pr.t)
    uncertain = sampled = 0
    for j, sel in enumerate(pr.rows):
        if sel.shape[0]:
            xs = pr.x[j]
            cand = be.yinyang_filter(xs, prep, pr.labels[j], pr.upper[j], pr.lower[j], pr.xnorm[j], drift, gdrift, cmax)
            uncertain += int(cand.shape[0])
            sampled += int(sel.shape[0])
            if cand.shape[0] and pr.steps_left > 1:
                lab, up, lo = be.assign_bounds(xs[cand], prep, pr.group_of, pr.t, pr.xnorm[j][cand], cmax,
                                               interrupt=interrupt)
                pr.labels[j][cand], pr.upper[j][cand], pr.lower[j][cand] = lab, up, lo
    at = it + pr.steps_left - 1  # the step that would set the bounds; the steps after it repay them
    if not _pays(uncertain / max(1, sampled), be.bounds_cost, _steps_after(st, at, it - 1, fit.max_iter)):
        return False
    if pr.steps_left == 1:
        return pr
    pr.iteration, pr.steps_left, pr.cref = it + 1, pr.steps_left - 1, prep.centroids
    st.probe = pr
    return True


def _drop(st: YinyangState) -> None:
    """The bounds and sums freed: the next steps are Lloyd's passes."""
    st.bounded = False
    st.upper, st.lower, st.xnorm = [], [], []
    st.sums = st.weights = st.counts = st.qsums = None


def yinyang_pass(shard: Shard, prep: Any, centroids: Any, it: int, fit: FitSpec, buf: Any, lay: Layout,
                 interrupt: Callable[[], None] | None) -> None:
    """Yinyang's local work of step ``it`` (:func:`.step.lloyd_pass`'s contract: the same
    values in ``buf`` and the same labels in ``shard.labels[it % 2]``)."""
    be = shard.be
    xp = be.xp
    fv = buf.view(xp.float64)
    k, d = centroids.shape
    prev = label_slot(shard, it - 1) if it > 0 else None
    out_slot = label_slot(shard, it)
    st: YinyangState | None = getattr(shard, "yinyang", None)
    if st is None or st.next_iteration != it or st.expect is not centroids or prev is None:
        st = shard.yinyang = YinyangState(next_iteration=it, expect=None)  # this run's state starts here
    holds = st.bounded and st.sums.shape == (k, d) and len(st.upper) == len(shard.chunk_ids)
    rows = 0
    threshold = BOUND_START if st.threshold is None else st.threshold
    verdict = None if holds else _judge_probe(st, shard, prep, it, fit, interrupt)
    if verdict is False:  # the sample's bounds would not pay: wait as after dropping bounds
        st.threshold = threshold = min(threshold, st.moved) / 4
    due = verdict is None and st.moved <= threshold
    if not holds and not isinstance(verdict, Probe) and (not due or math.isfinite(ABANDON)):
        # No bounds, and the centroids still move far (or the bounds are due, or a probe of a
        # sample of rows runs to say whether they would pay): Lloyd's own pass (its bits, its cost).
        _drop(st)
        lloyd_pass(shard, prep, centroids, it, fit, buf, lay, interrupt)
        rows = sum(int(lab.shape[0]) for lab in shard.labels[it % 2])
        _measured(st, int(be.to_numpy(buf[lay.reassigned : lay.reassigned + 1])[0]), rows)
        if due and _pays(0.0, be.bounds_cost, _steps_after(st, it + PROBE_STEPS, it, fit.max_iter)):
            # (A probe whose bounds could not pay even with no row uncertain is not set.)
            _set_probe(st, shard, prep, it, interrupt)
        st.next_iteration = it + 1
        return
    if not holds:
        _reset(st, shard, prep, k, d, n_groups(k), verdict if isinstance(verdict, Probe) else None)
        _, cmax = be.centroid_drift(prep.centroids, prep.centroids)
        drift = gdrift = None
    else:
        drift, gdrift, cmax = _drifts(be, st.cref, prep.centroids, st.group_host, st.t)
    labels_out = []
    uncertain = 0
    for j, (cid, _, block, w) in enumerate(shard.items()):
        if interrupt is not None:
            interrupt()
        check_chunk(cid, fit)
        n = block.shape[0]
        rows += n
        if n == 0:
            lab = xp.empty(0, xp.int32)
            moved_rows = 0
            if not holds:
                st.upper.append(xp.empty(0, xp.float64))
                st.lower.append(xp.empty((0, st.t), xp.float64))
                st.xnorm.append(xp.empty(0, xp.float64))
        elif not holds:
            # Every row's distances: the labels of the backend's assignment, and the bounds.
            xnorm = be.row_sqnorms(block)
            new_lab, upper, lower = be.assign_bounds(block, prep, st.group_of, st.t, xnorm, cmax, interrupt=interrupt)
            lab = new_lab if out_slot is None or out_slot[j].shape[0] != n else out_slot[j]
            if lab is not new_lab:
                lab[...] = new_lab
            st.upper.append(upper)
            st.lower.append(lower)
            st.xnorm.append(xnorm)
            st.weighted = w is not None
            be.add_label_sums(block, lab, w, 1, fit.grid, st.sums, st.weights, st.counts, st.qsums, xnorm)
            moved_rows = n if prev is None else xp.count_nonzero(lab != prev[j])
        else:
            old = prev[j]
            lab = out_slot[j] if out_slot is not None and out_slot[j].shape[0] == n else xp.empty(n, xp.int32)
            lab[...] = old
            cand = be.yinyang_filter(block, prep, old, st.upper[j], st.lower[j], st.xnorm[j], drift, gdrift, cmax)
            uncertain += int(cand.shape[0])
            moved_rows = 0
            if cand.shape[0]:
                xu = block[cand]
                new_u, up_u, lo_u = be.assign_bounds(xu, prep, st.group_of, st.t, st.xnorm[j][cand], cmax,
                                                     interrupt=interrupt)
                st.upper[j][cand] = up_u
                st.lower[j][cand] = lo_u
                old_u = old[cand]
                moved = xp.flatnonzero(new_u != old_u)
                moved_rows = moved.shape[0]
                if moved_rows:
                    # The rows that changed cluster leave their old one and join the new one, as
                    # the exact integers the kernels add: the sums over every row again.
                    xm = xu[moved]
                    wm = None if w is None else w[cand[moved]]
                    xn = None if st.qsums is None else st.xnorm[j][cand[moved]]
                    be.add_label_sums(xm, old_u[moved], wm, -1, fit.grid, st.sums, st.weights, st.counts, st.qsums, xn)
                    be.add_label_sums(xm, new_u[moved], wm, 1, fit.grid, st.sums, st.weights, st.counts, st.qsums, xn)
                    lab[cand[moved]] = new_u[moved]
        labels_out.append(lab)
        if not be.inertia_from_sums:
            fv[lay.inertia + cid] = be.owner_inertia(block, prep, lab, w) if n else 0.0
        buf[lay.reassigned] += xp.asarray(moved_rows).astype(xp.int64)
    shard.labels[it % 2] = labels_out
    buf[lay.sums] += st.sums.reshape(-1)
    buf[lay.weights] += st.weights if st.weighted else fit.grid.unit_weights(st.counts)
    buf[lay.counts] += st.counts
    if st.qsums is not None:
        buf[lay.qsums] += st.qsums
    st.next_iteration = it + 1
    st.cref = prep.centroids
    _measured(st, int(be.to_numpy(buf[lay.reassigned : lay.reassigned + 1])[0]), rows)
    if holds and uncertain * be.bounds_cost > ABANDON * rows:
        # The bounds certify too few rows to pay: Lloyd's passes until the steps move a quarter
        # as many rows as now (this step's sums are in ``buf`` already, whole).
        st.threshold = min(threshold, st.moved) / 4
        _drop(st)


def yinyang_step(shard: Shard, centroids: Any, iteration: int, fit: FitSpec, comm: Any, host: np.ndarray,
                 reseed: Reseed, *, end_segment: bool = False,
                 interrupt: Callable[[], None] | None = None) -> tuple[Any, IterationStats]:
    """One Yinyang step on this rank: :func:`.step.lloyd_step`'s parameters and result, the
    same centroids, labels and statistics but the timings and ``rechecked`` (the rows a pass
    re-ranked by their exact distances: a bounded step's are not counted, its Lloyd passes'
    are)."""
    new, stats = run_step(yinyang_pass, shard, centroids, iteration, fit, comm, host, reseed,
                          end_segment=end_segment, interrupt=interrupt)
    shard.yinyang.expect = new  # the next step's bounds hold for these centroids alone
    return new, stats
