"""The re-seeding of an iteration: the hook the Lloyd step calls once its sums are reduced.

A :class:`Reseed` looks at the iteration's reduced facts (:class:`Reduced`: the int64 sums and
weights, every cluster's weight and row count on the host, identical on every rank) and either
leaves them (None) or returns corrected sums and weights (:class:`Reseeded`), from which the
step computes the centroids again. Two variants, both moving a centroid onto one row (the
row's values alone become the cluster's sums, and leave the cluster the row was in:
:func:`relocate`):

- :class:`EmptyClusters`: a cluster without weight takes one of the rows farthest from their
  centroid (as scikit-learn's Lloyd), gathered from every rank.
- :class:`SizeBalance` (``max_imbalance``): while the largest cluster holds more than the
  bound times the mean, the smallest clusters' centroids move, one each, onto a row of each
  cluster above the bound (its member of smallest :func:`~daskmeans.numerics.hashing.row_keys`
  key), and the steps that follow split it.

:func:`for_fit` chains them (:class:`FirstOf`): empty clusters first; the sizes are balanced
only in an iteration without one. Every choice is a function of global rows and the reduced
sums, so the moves are the same for any chunking and worker count, and every rank makes the
same collective calls (:mod:`.allgather`) in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..numerics.grid import Grid
from ..numerics.hashing import row_keys
from .placement import Shard
from .allgather import gather_far, gather_members


@dataclass(frozen=True)
class Reduced:
    """One iteration's facts once its sums are reduced, what a :class:`Reseed` reads.

    Attributes
    ----------
    shard : Shard
        This rank's chunks, with the iteration's labels in its workspace.
    comm : Collective
        The loop's collective (the variants' all-gathers).
    iteration : int
        The step's index (0 for the first step of the fit).
    centroids : backend array, shape (K, D) float64
        The centroids the step assigned the rows to.
    isums : backend array, shape (K, D) int64
        The per-cluster sums on ``grid``, summed over every rank.
    iweights : backend array, shape (K,) int64
        The per-cluster weights on ``grid``.
    weights : ndarray, shape (K,) int64
        ``iweights`` on the host.
    counts : ndarray, shape (K,) int64
        Rows per cluster, on the host.
    grid : Grid
        The fit's fixed-point grid.
    n_samples : int
        Rows of the fit.
    """

    shard: Shard
    comm: Any
    iteration: int
    centroids: Any
    isums: Any
    iweights: Any
    weights: np.ndarray
    counts: np.ndarray
    grid: Grid
    n_samples: int

    @property
    def imbalance(self) -> float:
        """The largest cluster's row count over the mean (FAISS's ``imbalance_factor``)."""
        k = len(self.counts)
        return int(self.counts.max()) * k / max(1, self.n_samples)


@dataclass(frozen=True)
class Reseeded:
    """Sums and weights after a re-seeding, on the grid (backend arrays), and how many
    centroids moved to balance the sizes (0 for empty clusters: no fixed point is left)."""

    isums: Any  # (K, D) int64
    iweights: Any  # (K,) int64
    n_moved: int = 0


class Reseed(Protocol):
    """The hook the step calls after the sums are reduced, on every rank alike."""

    def __call__(self, reduced: Reduced) -> Reseeded | None:
        """Corrected sums and weights, or None where nothing moves."""
        ...


# ---------------------------------------------------------------- the variants


@dataclass(frozen=True)
class EmptyClusters:
    """Clusters without weight take the rows farthest from their centroids (as scikit-learn's),
    only rows at a distance from it: a row at its centroid is no better start for an empty
    cluster than where it is (moving it would empty its own cluster or copy a centroid, and the
    fit would not settle), and the clusters left without one stay where they are."""

    def __call__(self, r: Reduced) -> Reseeded | None:
        empty = np.flatnonzero(r.weights <= 0)  # empty means no weight (as scikit-learn)
        if not empty.size:
            return None
        be = r.shard.be
        n, d = len(empty), r.isums.shape[1]
        cands = gather_far(far_points(r.shard, r.centroids, n, r.iteration, be), n, d, r.comm, be)
        cands = [c for c in cands if c[0] > 0]
        isums, iweights = relocate(r.isums, r.iweights, empty[: len(cands)], [(c[2], c[3], c[4]) for c in cands],
                                   r.grid, be)
        return Reseeded(isums, iweights)


@dataclass(frozen=True)
class SizeBalance:
    """While the largest cluster holds more than ``bound`` times the mean row count, the
    clusters above the bound each get the centroid of one of the smallest clusters (the
    donors, :func:`balance`), moved onto the member of smallest key (``seed`` plus the
    iteration salts the keys: :func:`members`)."""

    bound: float
    seed: int

    def __call__(self, r: Reduced) -> Reseeded | None:
        if not r.imbalance > self.bound:
            return None
        k = len(r.counts)
        over, donors = balance(r.counts, r.n_samples / k, self.bound)
        if not len(over):
            return None
        be = r.shard.be
        mine = members(r.shard, over, k, r.iteration, self.seed + r.iteration, be)
        rows = gather_members(mine, over, r.isums.shape[1], r.comm, be)
        cands = [(int(c), x, w) for c, (x, w) in zip(over, rows)]
        isums, iweights = relocate(r.isums, r.iweights, donors, cands, r.grid, be)
        return Reseeded(isums, iweights, n_moved=len(over))


@dataclass(frozen=True)
class FirstOf:
    """The first of ``variants`` that re-seeds (returns sums), the others not asked."""

    variants: tuple

    def __call__(self, r: Reduced) -> Reseeded | None:
        for variant in self.variants:
            out = variant(r)
            if out is not None:
                return out
        return None


def for_fit(max_imbalance: float | None, seed: int) -> Reseed:
    """A fit's hook: empty clusters re-seeded, then (``max_imbalance`` not None) the sizes
    balanced in an iteration without an empty cluster."""
    if max_imbalance is None:
        return EmptyClusters()
    return FirstOf((EmptyClusters(), SizeBalance(float(max_imbalance), int(seed))))


# ---------------------------------------------------------------- what the variants share


def relocate(isums: Any, iweights: Any, targets: np.ndarray, cands: list, grid: Grid, be: Any) -> tuple[Any, Any]:
    """Re-seed clusters ``targets`` with rows ``cands``, in order: each target's sums become
    its row alone, which leaves the cluster it was assigned to. On the grid, as the kernels
    added the row.

    Parameters
    ----------
    isums : backend array, shape (K, D) int64
    iweights : backend array, shape (K,) int64
    targets : int ndarray, shape (m,)
    cands : list of ``(label, x, w)``, at least m
        Each row's cluster, values ``(D,)`` and weight.
    grid : Grid
    be : module

    Returns
    -------
    (isums, iweights)
        New backend arrays of the same shapes.
    """
    s, w = be.to_numpy(isums).copy(), be.to_numpy(iweights).copy()
    for j, (lab, x, wt) in zip(targets, cands):
        v, u = grid.on_grid(x, wt)
        s[lab] -= v
        w[lab] -= u
        s[j], w[j] = v, u
    return be.asarray(s), be.asarray(w)


def far_points(shard: Shard, centroids: Any, n_far: int, iteration: int, be: Any) -> list:
    """The ``n_far`` local rows farthest from their centroid in step ``iteration``.

    Returns
    -------
    list of ``(d2, row, label, x, w)``
        Squared distance, global row, label, host values ``(D,)`` float64 and weight;
        farthest first (ties: lower row first).
    """
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


def balance(counts: np.ndarray, mean: float, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """The clusters above ``bound * mean`` rows, largest first, and as many of the smallest
    clusters below ``mean`` rows (smallest first; ties: lower index), whose centroids move to a
    row of each (the donors).

    Returns
    -------
    (over, donors)
        Host int ndarrays of the same length.
    """
    over = np.flatnonzero(counts > bound * mean)
    over = over[np.argsort(-counts[over], kind="stable")]
    under = np.flatnonzero(counts < mean)
    under = under[np.argsort(counts[under], kind="stable")]
    m = min(len(over), len(under))
    return over[:m], under[:m]


def members(shard: Shard, over: np.ndarray, k: int, iteration: int, salt: int, be: Any) -> dict:
    """For each cluster of ``over`` (host ints, of ``k``), its local row of the smallest key
    (:func:`~daskmeans.numerics.hashing.row_keys` of the global row and ``salt``) in step
    ``iteration``.

    Returns
    -------
    dict
        ``{cluster: (key, row, x, w)}``: the key (53 bits), global row, host values ``(D,)``
        float64 and weight, for the clusters this rank holds rows of.
    """
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
