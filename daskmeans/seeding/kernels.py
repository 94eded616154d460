"""Seeding kernels on one in-memory array (NumPy or CuPy, through its backend): greedy
k-means++, k-means++ in batches, and weighted Lloyd iterations. No Dask: the inits' tasks call
them on a worker."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..backends import get_backend
from ..numerics.grid import Grid, float_sums
from ..numerics.hashing import row_uniforms


def kmeans_plusplus(X: Any, k: int, seed: int | np.random.SeedSequence, sample_weight: Any = None) -> Any:
    """Greedy k-means++ (Arthur & Vassilvitskii 2007, with scikit-learn's local trials).

    Parameters
    ----------
    X : array, shape (n, d), NumPy or CuPy
    k : int, number of centres (<= n)
    seed : int or SeedSequence
    sample_weight : array, shape (n,), optional

    Returns
    -------
    centers : array, shape (k, d), float64, same library as ``X``
    """
    be = get_backend(X)
    xp = be.xp
    rng = np.random.default_rng(seed)
    x = xp.asarray(X, dtype=xp.float64)
    n = x.shape[0]
    w = xp.ones(n, xp.float64) if sample_weight is None else xp.asarray(sample_weight, dtype=xp.float64)
    xsq = (x * x).sum(axis=1)
    trials = local_trials(k)

    def sqdist(rows):  # (t, n) squared distances from x[rows] to every row
        c = x[rows]
        d = (c * c).sum(axis=1)[:, None] - 2 * (c @ x.T) + xsq[None, :]
        return xp.maximum(d, 0.0)

    wh = be.to_numpy(w)
    first = int(rng.choice(n, p=wh / wh.sum()))
    ids = [first]
    closest = sqdist(xp.asarray([first]))[0]
    pot = float(closest @ w)
    for _ in range(1, k):
        cum = xp.cumsum(w * closest)
        r = xp.asarray(rng.uniform(size=trials) * pot)
        cand = xp.minimum(xp.searchsorted(cum, r), n - 1)
        dist = xp.minimum(closest[None, :], sqdist(cand))
        pots = dist @ w
        best = int(xp.argmin(pots))
        pot = float(pots[best])
        closest = dist[best]
        ids.append(int(cand[best]))
    return x[xp.asarray(ids)]


# Up to this many centres (of a group) the seeding is greedy k-means++, a centre per step,
# whatever ``batches``: at small K a batch of two already missed one of 40 far-apart blobs
# (tests/unit/test_seeding.py), and the steps are few.
GREEDY_MAX_K = 64


def local_trials(k: int) -> int:
    """Draws per centre in k-means++ (scikit-learn's ``2 + log(k)``)."""
    return 2 + int(math.log(k)) if k > 1 else 1


def _draw(xp: Any, p: Any, m: int, u: Any, exclude: Any) -> Any:
    """``m`` rows drawn with probability proportional to ``p`` without replacement
    (Efraimidis-Spirakis keys ``log(u) / p``, the largest win), never one of ``exclude``; rows
    of probability 0 only when no other row is left, those of smallest ``u`` first. Sorted row
    indices, on ``p``'s device; ``m`` at most the rows not excluded.

    On the host, a partition of the live rows' keys; on a device, :func:`_draw_sorted` (the
    same rows)."""
    m = int(m)  # a Python int: NumPy's kth, and slicing
    if xp is not np:
        return _draw_sorted(xp, p, m, u, exclude)
    live = xp.flatnonzero((p > 0) & ~exclude)
    if live.size >= m:
        key = xp.log(u[live]) / p[live]
        return xp.sort(live[np.argpartition(-key, m - 1)[:m]])
    rest = xp.flatnonzero((p <= 0) & ~exclude)
    return xp.sort(xp.concatenate([live, rest[xp.argsort(u[rest], kind="stable")[: m - live.size]]]))


def _draw_sorted(xp: Any, p: Any, m: int, u: Any, exclude: Any) -> Any:
    """:func:`_draw` without reading how many rows are live, which on a device is a
    synchronisation with the host in every dependent step of the seeding: every row ordered by
    one 64-bit key, its class (live, of probability 0, excluded) above its key within the class
    (a non-negative float64's bits order as the float does: -0.0 made +0.0), ties by row; one
    sort of all the rows, on the device (two sorts, by key then by class, cost twice as much:
    a wide-K init runs a few hundred)."""
    live = (p > 0) & ~exclude
    key = xp.where(live, -xp.log(u) / xp.where(live, p, 1.0) + 0.0, u)  # >= 0, ascending within each class
    # live: [0, 2^63) (up to +inf's bits); of probability 0: 2^63 + u's bits (u <= 1: < 2^62);
    # excluded: 2^63 + 2^62 + u's bits
    top = xp.where(live, xp.uint64(0), xp.where(exclude, xp.uint64(3 << 62), xp.uint64(1 << 63)))
    order = xp.argsort(key.view(xp.uint64) + top, kind="stable")
    return xp.sort(order[:m])


def seed_batched(X: Any, k: int | Sequence[int], seed: int | np.random.SeedSequence, sample_weight: Any = None,
                 precision: str = "fp32", batches: int = 32, trials: int | None = None,
                 groups: Any = None, batch_trials: int | None = None, greedy_k: int = GREEDY_MAX_K) -> Any:
    """k-means++ seeding with local trials, in batches: k rows of X.

    Greedy k-means++ (scikit-learn's) adds one centre per step: it draws ``trials`` rows with
    probability proportional to ``w * d^2`` (the squared distance to the nearest centre so
    far) and keeps the one that lowers the potential most; k steps depend on each other (40,000
    at K = 40,000). Here a batch of ``b`` centres draws ``trials * b`` rows without
    replacement, assigns every row of X to its nearest drawn row, credits each drawn row with
    the potential its own rows would lose (``w * (d^2 - distance^2)`` where positive), and keeps
    the ``b`` best. Two draws from one uncovered region split its rows and so its credit,
    which makes a draw alone in another region win, as greedy steps would. Batches grow 1, 1,
    2, 4, ... up to ``ceil(k / batches)`` (1, greedy, up to ``greedy_k``); each costs one
    distance pass of X against its draws and one against its picks.

    With ``groups``, each group of rows gets its own count of centres (``k[g]``), drawn from its
    own rows with its own batch sizes; every group takes its batch in the same step, so a step
    is still two distance passes of X (against every group's draws, then picks). ``d^2`` and
    the credit are to the nearest draw or pick of any group.

    Everything per row (weights, ``d^2``, the draws' keys, the credit, the uniforms) stays on
    X's device and a step reads nothing back: the draws' sizes are known on the host, the draws
    are sorted rather than counted (:func:`_draw_sorted`), and the draws and picks are taken
    from X's rows prepared once (the backend's optional ``prepared_rows``), so a GPU's queue
    runs ahead of the host through the dependent steps.

    Parameters
    ----------
    X : array, shape (n, d), NumPy or CuPy, n >= k
    k : int, or with ``groups`` ints of shape (G,) (each at most its group's rows)
    seed : int or SeedSequence
    sample_weight : array, shape (n,), optional
    precision : GEMM precision of the distance passes (labels and distances are exact in all)
    batches : int, the number of batches of the largest size (32: with 3 draws per centre
        (``batch_trials``) within the spread of seeds of 64's in half the dependent steps,
        where 16 ends worse on blobs; docs/performance.md, "k-means‖'s recluster in batches")
    trials : int, draws per centre (default ``2 + log(k)`` of the group, as scikit-learn)
    batch_trials : int, optional
        Draws per centre in batches of more than one centre (default ``trials``); 1 keeps a
        batch's draws without their distance pass.
    greedy_k : int
        Up to this many centres (of a group), batches of one: greedy k-means++
        (:data:`GREEDY_MAX_K`).
    groups : host int array, shape (n,), optional
        Each row's group in ``[0, G)``, non-decreasing (a group's rows are contiguous).

    Returns
    -------
    centers : array, shape (sum(k), d), X's dtype and library; each batch's picks in row order
    """
    be = get_backend(X)
    xp = be.xp
    key = _seed_key(seed)
    n = X.shape[0]
    if groups is None:
        if not 0 < k <= n:
            raise ValueError(f"k={k} should be > 0 and <= n_samples={n}")
        ks, bounds = np.array([int(k)]), np.array([0, n])
    else:
        ks, bounds = _group_bounds(groups, k, n)
    rows = np.diff(bounds)
    tries = np.array([local_trials(int(q)) if trials is None else int(trials) for q in ks])
    batch_tries = tries if batch_trials is None else np.full(len(ks), int(batch_trials))
    w = xp.ones(n) if sample_weight is None else xp.asarray(sample_weight).astype(xp.float64)
    d2 = None
    chosen = xp.zeros(n, bool)
    picks = []
    bound = Grid.for_block(X)  # X's bound, for every distance pass (no reduction over X in each)
    # Every row prepared once as a centroid where the backend can (a device's preparation of
    # each step's draws and picks would read their maxima back to the host: the optional
    # ``prepared_rows``, backends.protocol); else each subset prepared on its own.
    ready = be.prepared_rows(X, precision) if hasattr(be, "prepared_rows") else None

    def prepared(idx: Any, m: int) -> Any:
        return be.prepare(X[idx], X.dtype, precision) if ready is None else ready.take(idx, m)

    total = np.zeros(len(ks), np.int64)
    cap = np.where(ks <= greedy_k, 1, np.maximum(1, -(-ks // batches)))
    step = 0
    while (total < ks).any():
        live = np.flatnonzero(total < ks)
        b = np.minimum(np.minimum(np.maximum(total[live], 1), cap[live]), ks[live] - total[live])
        # The step's uniforms in (0, 1] (log(u) finite), made on X's device: a copy from the
        # host's pageable memory would wait for the device's queue (the same bits on either).
        u = 1.0 - row_uniforms(key, step, 0, n, xp)
        step += 1
        spans = [slice(int(bounds[g]), int(bounds[g + 1])) for g in live]
        if d2 is None:  # the first centre of each group: a row drawn by weight
            pick = xp.concatenate([_draw(xp, w[s], m, u[s], chosen[s]) + s.start for s, m in zip(spans, b)])
        else:
            p = w * d2
            # Each group draws from its rows not chosen yet (at least b of them): exactly
            # ``sizes`` rows, known here without reading the draws' sizes from the device.
            t = np.where(b > 1, batch_tries[live], tries[live])
            sizes = [min(int(q * m), int(r)) for m, q, r in zip(b, t, rows[live] - total[live])]
            draws = [_draw(xp, p[s], size, u[s], chosen[s]) + s.start for s, size in zip(spans, sizes)]
            if all(size <= m for size, m in zip(sizes, b)):
                pick = xp.concatenate(draws)
            else:
                every = xp.concatenate(draws)
                lab, dn = be.min_sqdist(X, prepared(every, sum(sizes)), bound)
                gain = be.bin_sums(lab, w * xp.maximum(d2 - dn, 0.0), sum(sizes))
                ends = np.cumsum(sizes)
                pick = xp.concatenate([
                    dr if size <= m else xp.sort(dr[xp.argsort(-gain[end - size:end], kind="stable")[:m]])
                    for dr, size, m, end in zip(draws, sizes, b, ends)
                ])
        chosen[pick] = True
        picks.append(pick)
        total[live] += b
        if (total < ks).any():
            dn = be.min_sqdist(X, prepared(pick, int(b.sum())), bound)[1]
            d2 = dn if d2 is None else xp.minimum(d2, dn)
    return X[xp.concatenate(picks)]


def _seed_key(seed: int | np.random.SeedSequence) -> int:
    """The key of :func:`seed_batched`'s per-step uniforms (``row_uniforms``): 64 bits of the
    seed's ``SeedSequence``."""
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return int(ss.generate_state(1, np.uint64)[0])


def _group_bounds(groups: Any, k: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The counts ``(G,)`` int64 and the groups' row bounds ``(G + 1,)`` of :func:`seed_batched`'s
    ``groups``, checked."""
    g = np.asarray(groups)
    ks = np.asarray(k, np.int64).reshape(-1)
    if g.shape != (n,):
        raise ValueError(f"groups of shape {g.shape} should be of shape ({n},)")
    if n and (g[0] < 0 or g[-1] >= len(ks) or bool((g[1:] < g[:-1]).any())):
        raise ValueError(f"groups should be non-decreasing in [0, {len(ks)}) (one count of k per group)")
    bounds = np.searchsorted(g, np.arange(len(ks) + 1))
    rows = np.diff(bounds)
    for i in np.flatnonzero((ks < 0) | (ks > rows)):
        raise ValueError(f"k={ks[i]} of group {i} should be >= 0 and <= its n_samples={rows[i]}")
    if ks.sum() <= 0:
        raise ValueError(f"k={ks.tolist()} should have a positive sum")
    return ks, bounds


def weighted_lloyd(X: Any, centers: Any, sample_weight: Any, n_iter: int, precision: str = "fp32") -> Any:
    """A few weighted Lloyd iterations on a small in-memory set (the k-means|| recluster):
    float64 centres ``(k, d)`` from ``centers``; stops early once they no longer move."""
    be = get_backend(X)
    xp = be.xp
    c = xp.asarray(centers, dtype=xp.float64)
    grid = Grid.for_block(X, sample_weight)
    for _ in range(n_iter):
        out = be.assign(X, be.prepare(c, X.dtype, precision), sample_weight, grid=grid)
        sums, weights = float_sums(out)
        nonempty = out["counts"] > 0
        new = xp.where(nonempty[:, None], sums / xp.where(nonempty, weights, 1.0)[:, None], c)
        if bool((new == c).all()):
            break
        c = new
    return c
