"""Initial centroids: ``k-means||`` (default), greedy ``k-means++`` on a sample, ``random``,
or an explicit array.

Random draws depend on the seed and on the global chunk index only, never on which worker
holds a chunk, so the same seed gives the same centroids on any cluster layout.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client

from . import config
from .backends import get_backend
from .backends.grid import Grid, float_sums
from .placement import Placement, Shard, blas_capped, submit_per_shard
from .reduction import tree_reduce


# ---------------------------------------------------------------- kernels on one array (xp-generic)


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
    trials = _trials(k)

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


def _trials(k: int) -> int:
    """Draws per centre in k-means++ (scikit-learn's ``2 + log(k)``)."""
    return 2 + int(math.log(k)) if k > 1 else 1


def _draw(p: np.ndarray, m: int, u: np.ndarray, exclude: np.ndarray) -> np.ndarray:
    """``m`` rows drawn with probability proportional to ``p`` without replacement
    (Efraimidis-Spirakis keys ``log(u) / p``, the largest win), never one of ``exclude``; rows
    of probability 0 only when no other row is left. Sorted row indices."""
    live = np.flatnonzero((p > 0) & ~exclude)
    if len(live) >= m:
        key = np.log(u[live]) / p[live]
        return np.sort(live[np.argpartition(-key, m - 1)[:m]])
    rest = np.flatnonzero((p <= 0) & ~exclude)
    return np.sort(np.concatenate([live, rest[np.argsort(u[rest], kind="stable")[: m - len(live)]]]))


def seed_batched(X: Any, k: int, seed: int | np.random.SeedSequence, sample_weight: Any = None,
                 precision: str = "fp32", batches: int = 128, trials: int | None = None) -> Any:
    """k-means++ seeding with local trials, in batches: k rows of X.

    Greedy k-means++ (scikit-learn's) adds one centre per step: it draws ``trials`` rows with
    probability proportional to ``w * d^2`` (the squared distance to the nearest centre so
    far) and keeps the one that lowers the potential most; k steps depend on each other (40,000
    at K = 40,000). Here a batch of ``b`` centres draws ``trials * b`` rows without
    replacement, assigns every row of X to its nearest drawn row, credits each drawn row with
    the potential its own rows would lose (``w * (d^2 - distance^2)`` where positive), and keeps
    the ``b`` best. Two draws from one uncovered region split its rows and so its credit,
    which makes a draw alone in another region win, as greedy steps would. Batches grow 1, 1,
    2, 4, ... up to ``ceil(k / batches)``; each costs one distance pass of X against its draws
    and one against its picks.

    Parameters
    ----------
    X : array, shape (n, d), NumPy or CuPy, n >= k
    k : int
    seed : int or SeedSequence
    sample_weight : array, shape (n,), optional
    precision : GEMM precision of the distance passes (labels and distances are exact in all)
    batches : int, the number of batches of the largest size
    trials : int, draws per centre (default ``2 + log(k)``, as scikit-learn)

    Returns
    -------
    centers : array, shape (k, d), X's dtype and library
    """
    be = get_backend(X)
    xp = be.xp
    rng = np.random.default_rng(seed)
    n = X.shape[0]
    if not 0 < k <= n:
        raise ValueError(f"k={k} should be > 0 and <= n_samples={n}")
    trials = _trials(k) if trials is None else int(trials)
    w = np.ones(n) if sample_weight is None else be.to_numpy(sample_weight).astype(np.float64)
    d2 = None
    chosen = np.zeros(n, bool)
    picks = []
    total, cap = 0, max(1, -(-k // batches))
    while total < k:
        b = min(max(total, 1), cap, k - total)
        u = 1.0 - rng.random(n)  # in (0, 1]: log(u) is finite
        if d2 is None:  # the first centre: a row drawn by weight
            pick = _draw(w, b, u, chosen)
        else:
            p = w * d2
            draws = _draw(p, min(trials * b, n - total), u, chosen)
            if len(draws) <= b:
                pick = draws
            else:
                lab, dn = be.min_sqdist(X, be.prepare(X[xp.asarray(draws)], X.dtype, precision))
                gain = np.bincount(be.to_numpy(lab), weights=w * np.maximum(d2 - be.to_numpy(dn), 0.0),
                                   minlength=len(draws))
                pick = np.sort(draws[np.argsort(-gain, kind="stable")[:b]])
        chosen[pick] = True
        picks.append(pick)
        total += b
        if total < k:
            dn = be.to_numpy(be.min_sqdist(X, be.prepare(X[xp.asarray(pick)], X.dtype, precision))[1])
            d2 = dn if d2 is None else np.minimum(d2, dn)
    return X[xp.asarray(np.concatenate(picks))]


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


# ---------------------------------------------------------------- tasks


def _take_rows(shard: Shard, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host copies of the global ``rows`` (sorted) that fall in this shard."""
    be = shard.be
    idx, data = [], []
    for _, off, block, _ in shard.items():
        sel = rows[(rows >= off) & (rows < off + block.shape[0])]
        if len(sel):
            idx.append(sel)
            data.append(be.to_numpy(block[be.xp.asarray(sel - off)]))
    if not idx:
        return np.empty(0, np.int64), np.empty((0, shard.n_features))
    return np.concatenate(idx), np.concatenate(data).astype(np.float64)


def _gather_rows(parts: list, rows: np.ndarray) -> np.ndarray:
    idx = np.concatenate([p[0] for p in parts])
    data = np.concatenate([p[1] for p in parts])
    pos = np.argsort(idx, kind="stable")  # every row once: where each of ``rows`` sits in ``data``
    return data[pos[np.searchsorted(idx[pos], rows)]]


def _row_parts(client: Client, placement: Placement, rows: np.ndarray) -> list:
    """Futures of each shard's share of ``rows`` (:func:`_take_rows`), for :func:`_gather_rows`."""
    uniq = rows if bool(np.all(rows[1:] > rows[:-1])) else np.unique(rows)
    return submit_per_shard(client, placement, _take_rows, [uniq] * len(placement.shards), name="daskmeans-take-rows")


def take_rows(client: Client, placement: Placement, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (global indices, in the given order) as a float64 host array."""
    parts = _row_parts(client, placement, rows)
    return _result(client, placement, client.submit(_gather_rows, parts, rows, pure=False))


def _seed_sample(parts: list, rows: np.ndarray, k: int, seed: Any, backend: str) -> np.ndarray:
    """k-means++ (:func:`kmeans_plusplus`) on the sampled ``rows``, gathered from their shards."""
    be = get_backend(backend)
    return be.to_numpy(kmeans_plusplus(be.asarray(_gather_rows(parts, rows)), k, seed))


# The distance passes of the init run in TF32 on GPUs: labels and distances are exact in
# every precision (backends.cupy_backend), so this is the fastest way to the same bits.
_INIT_PRECISION = "tf32"


@dataclass
class _ParState:
    d2: list  # per block: squared distance to the nearest candidate so far (float64)
    nearest: list  # per block: that candidate's index in the list of all candidates (int64)
    phi: float  # weighted sum of d2 over the shard


def _par_update(shard: Shard, state: _ParState | None, parts: list, offset: int) -> _ParState:
    """Fold a round's candidates (``parts``: every shard's draws, :func:`_concat_by_row`;
    numbered from ``offset``) into each row's nearest candidate: a row keeps an earlier
    candidate on ties, so the nearest is the first of the nearest in candidate order, as one
    pass over all of them would find it."""
    be = shard.be
    xp = be.xp
    new = _concat_by_row(parts)
    d2s, near, phi = [], [], 0.0
    prep = be.prepare(new, shard.dtype, _INIT_PRECISION) if new.shape[0] else None
    for j, (_, _, block, w) in enumerate(shard.items()):
        if state is not None:
            d2, nearest = state.d2[j], state.nearest[j]
        else:
            d2, nearest = xp.full(block.shape[0], xp.inf), xp.full(block.shape[0], -1, xp.int64)
        if prep is not None:
            lab, dn = be.min_sqdist(block, prep)
            closer = dn < d2
            d2 = xp.where(closer, dn, d2)
            nearest = xp.where(closer, lab.astype(xp.int64) + offset, nearest)
        d2s.append(d2)
        near.append(nearest)
        phi += float(d2.sum() if w is None else d2 @ w.astype(xp.float64))
    return _ParState(d2s, near, phi)


def _next_offset(offset: int, parts: list) -> int:
    return offset + sum(p[0].shape[0] for p in parts)


def _par_sample(shard: Shard, state: _ParState, phi: float, ell: float, seed: int, rnd: int) -> tuple:
    """Rows drawn with probability ``min(1, ell * w * d2 / phi)``: ``(global_rows, data)``, the
    data in the shard's dtype."""
    be = shard.be
    xp = be.xp
    idx, out = [], []
    for j, (_, off, block, w) in enumerate(shard.items()):
        p = be.to_numpy(state.d2[j]) * (ell / phi)
        if w is not None:
            p = p * be.to_numpy(w)
        pick = np.flatnonzero(row_uniforms(seed, rnd, off, p.shape[0]) < p)
        if len(pick):
            idx.append(off + pick)
            out.append(be.to_numpy(block[xp.asarray(pick)]))
    if not out:
        return np.empty(0, np.int64), np.empty((0, shard.n_features), shard.dtype)
    return np.concatenate(idx), np.concatenate(out)


def row_uniforms(seed: int, stream: int, start: int, n: int) -> np.ndarray:
    """Uniform draws in [0, 1) for the global rows ``start .. start + n - 1`` of a stream.

    A row's draw depends on the row alone, not on the chunk or worker holding it, so a seed
    samples the same rows for any chunking and worker count: a counter-based generator
    (Philox) jumped to the row. (``phi``, a float sum whose rounding depends on the chunking,
    can only change a row whose draw lies within an ulp of its probability.)
    """
    bg = np.random.Philox(key=np.array([seed, stream], dtype=np.uint64))
    q, r = divmod(int(start), 4)  # a Philox counter step gives 4 draws
    bg.advance(q)
    return np.random.Generator(bg).random(n + r)[r:]


def _concat_by_row(parts: list) -> np.ndarray:
    """Sampled rows in global row order, whichever shard (worker) drew them."""
    idx = np.concatenate([p[0] for p in parts])
    data = np.concatenate([p[1] for p in parts])
    return data[np.argsort(idx, kind="stable")]


def _candidates(rounds: list, dtype: Any) -> np.ndarray:
    """Every round's draws (lists of per-shard parts), in candidate order."""
    return np.concatenate([_concat_by_row(parts) for parts in rounds]).astype(dtype, copy=False)


def _phi_total(states: list) -> float:
    return float(sum(s.phi for s in states))


def _cand_weights(shard: Shard, state: _ParState, n_cands: int) -> np.ndarray:
    """Weight of the rows nearest to each candidate, ``(n_cands,)`` float64."""
    be = shard.be
    xp = be.xp
    total = xp.zeros(n_cands, xp.float64)
    for j, w in enumerate(shard.weights or [None] * len(shard.chunk_ids)):  # no pass over the data
        total += xp.bincount(state.nearest[j], weights=None if w is None else w.astype(xp.float64), minlength=n_cands)
    return be.to_numpy(total)


def _sum_arrays(items: list) -> np.ndarray:
    return np.sum(items, axis=0)


def _recluster(rounds: list, dtype: Any, weights: np.ndarray, k: int, seed: int, n_iter: int, backend: str) -> np.ndarray:
    """k centres of the weighted candidates on this worker's device (float64 ``(k, d)``):
    k-means++ with local trials in batches (:func:`seed_batched`), then ``n_iter`` weighted
    Lloyd iterations (``daskmeans.init.recluster-iter``, 0 by default)."""
    be = get_backend(backend)
    cands = _candidates(rounds, dtype)
    keep = weights > 0
    x = be.asarray(cands[keep])
    w = be.asarray(weights[keep])
    c = seed_batched(x, k, seed, w, precision=_INIT_PRECISION)
    c = weighted_lloyd(x, c, w, n_iter, precision=_INIT_PRECISION)
    return be.to_numpy(c)


# ---------------------------------------------------------------- drivers


def _result(client: Client, placement: Placement, fut: Any) -> Any:
    """``fut``'s result; :class:`~daskmeans.engine.loop.WorkerLost` if a shard's worker goes
    meanwhile (the caller places the data again and starts the init over)."""
    from .placement import gather

    return gather(client, [fut], placement)[0]


def init_random(client: Client, placement: Placement, k: int, seed: int) -> np.ndarray:
    """``k`` distinct rows drawn uniformly."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(placement.n_samples, size=k, replace=False)
    return take_rows(client, placement, rows)


_HOST_KMEANSPP_FLOPS = 2**27


def init_kmeans_plusplus(client: Client, placement: Placement, k: int, seed: int) -> np.ndarray:
    """Greedy k-means++ on a uniform sample of ``daskmeans.init.sample-size`` rows (at least k)."""
    n = placement.n_samples
    m = min(n, max(k, int(config.get("init.sample-size"))))
    ss = np.random.SeedSequence(seed)
    s1, s2 = ss.spawn(2)
    rows = np.arange(n) if m == n else np.sort(np.random.default_rng(s1).choice(n, size=m, replace=False))
    # A small seeding runs on the host: on a GPU its K dependent steps cost more in kernel
    # loads, the BLAS handle and synchronisations than the arithmetic (2-D blobs, K = 5: ~0.15 s).
    small = k * _trials(k) * m * placement.n_features <= _HOST_KMEANSPP_FLOPS
    fut = client.submit(blas_capped(_seed_sample), _row_parts(client, placement, rows), rows, k, s2,
                        "numpy" if small else placement.backend, pure=False,
                        key=f"daskmeans-kmeans++-{uuid.uuid4().hex}")
    return _result(client, placement, fut)


def init_kmeans_parallel(
    client: Client,
    placement: Placement,
    k: int,
    seed: int,
    *,
    rounds: int | None = None,
    oversampling_factor: float = 0.5,
) -> np.ndarray:
    """k-means|| (Bahmani et al. 2012): ``rounds`` rounds drawing each row with probability
    ``min(1, l * w * d^2 / phi)``, ``l = oversampling_factor * k``; the candidates, weighted by
    the rows nearest to each, are reduced to ``k`` on one worker (:func:`_recluster`).

    Every round is one distance pass of the shards against that round's new candidates only;
    each row carries its nearest candidate along, so the weights cost no pass of their own.
    All passes together cost an assignment against ``1 + rounds * l`` centres (2.5 K by
    default), whatever the number of workers.
    """
    rounds = int(rounds if rounds is not None else config.get("init.rounds"))
    ell = float(oversampling_factor) * k
    n = placement.n_samples
    seed = int(np.random.SeedSequence(seed).generate_state(1)[0])
    row0 = np.random.default_rng([seed, 0]).integers(0, n, size=1)
    first = take_rows(client, placement, row0)
    # A round's draws stay where they were drawn, one part per shard: each worker fetches the
    # others' parts itself (one hop, not two through a concatenating task).
    new: list | None = [client.scatter((row0, first.astype(placement.dtype)), hash=False)]
    rounds_drawn = [new]
    nshard = len(placement.shards)
    states: list = [None] * nshard
    offset: Any = 0

    def fold(states: list, new: list, offset: Any) -> tuple[list, Any]:
        states = submit_per_shard(client, placement, _par_update, states, [new] * nshard, [offset] * nshard,
                                  name="daskmeans-kpar-update")
        return states, client.submit(_next_offset, offset, new, pure=False)

    for r in range(1, rounds + 1):
        states, offset = fold(states, new, offset)
        new = None
        phi = _result(client, placement, client.submit(_phi_total, states, pure=False))
        if phi <= 0:  # fewer distinct points than candidates: every row is a candidate already
            break
        samples = submit_per_shard(
            client, placement, _par_sample, states, [phi] * nshard, [ell] * nshard, [seed] * nshard,
            [r] * nshard, name="daskmeans-kpar-sample",
        )
        new = samples
        rounds_drawn.append(new)
    if new is not None:  # the last round's draws
        states, offset = fold(states, new, offset)
    weights = tree_reduce(
        client, submit_per_shard(client, placement, _cand_weights, states, [offset] * nshard, name="daskmeans-kpar-weights"),
        _sum_arrays, name="daskmeans-kpar-wsum",
    )
    n_cand = int(_result(client, placement, client.submit(lambda w: int((w > 0).sum()), weights, pure=False)))
    if n_cand < k:
        # Too few distinct candidates (tiny or highly duplicated data): fall back to k-means++.
        return init_kmeans_plusplus(client, placement, k, seed)
    fut = client.submit(
        blas_capped(_recluster), rounds_drawn, placement.dtype, weights, k, seed, int(config.get("init.recluster-iter")), placement.backend,
        pure=False, key=f"daskmeans-kpar-recluster-{uuid.uuid4().hex}",
    )
    return _result(client, placement, fut)


def resolve_init(
    client: Client, placement: Placement, init: Any, k: int, seed: int, oversampling_factor: float = 0.5
) -> np.ndarray:
    """Initial centroids ``(k, d)`` float64 for an ``init`` spec (name, array or .npy path)."""
    if isinstance(init, str) and init == "k-means||":
        return init_kmeans_parallel(client, placement, k, seed, oversampling_factor=oversampling_factor)
    if isinstance(init, str) and init == "k-means++":
        return init_kmeans_plusplus(client, placement, k, seed)
    if isinstance(init, str) and init == "random":
        return init_random(client, placement, k, seed)
    raise ValueError(f"unknown init {init!r}")
