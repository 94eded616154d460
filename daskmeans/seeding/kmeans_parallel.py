"""``k-means||`` (the default): rounds of rows drawn by their squared distance to the
candidates so far, on every shard, then the weighted candidates reduced to K on one worker.

Random draws depend on the seed and on the global row only, never on which worker holds a
chunk, so the same seed gives the same centroids on any cluster layout.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client

from .. import config
from ..backends import get_backend
from ..engine.placement import Placement, Shard
from ..engine.task import blas_capped
from ..engine.watch import gather
from ..numerics.grid import Grid
from ..numerics.hashing import row_uniforms
from ..events import advance
from ..reduction import tree_reduce
from . import rows
from .kernels import seed_batched, weighted_lloyd
from .kmeans_plusplus import init_kmeans_plusplus
from .rows import result, take_rows


# The distance passes of the init run in TF32 on GPUs: labels and distances are exact in
# every precision (backends.cupy_backend), so this is the fastest way to the same bits.
INIT_PRECISION = "tf32"


@dataclass
class _ParState:
    d2: list  # per block: squared distance to the nearest candidate so far (float64)
    nearest: list  # per block: that candidate's index in the list of all candidates (int64)
    phi: float  # weighted sum of d2 over the shard
    n_cands: int  # the candidates so far (every shard's state counts the same ones)


def _par_update(shard: Shard, state: _ParState | None, parts: list, grid: Grid | None) -> _ParState:
    """Fold a round's candidates (``parts``: every shard's draws, :func:`_concat_by_row`;
    numbered on from the candidates so far) into each row's nearest candidate: a row keeps an
    earlier candidate on ties, so the nearest is the first of the nearest in candidate order,
    as one pass over all of them would find it. ``phi`` is added on the device and read once
    (no synchronisation per block: the host tier's copies of the next block keep overlapping)."""
    be = shard.be
    xp = be.xp
    new = _concat_by_row(parts)
    offset = 0 if state is None else state.n_cands
    d2s, near, phi = [], [], xp.zeros((), xp.float64)
    prep = be.prepare(new, shard.dtype, INIT_PRECISION) if new.shape[0] else None
    for j, (_, _, block, w) in enumerate(shard.items()):
        if state is not None:
            d2, nearest = state.d2[j], state.nearest[j]
        else:
            d2, nearest = xp.full(block.shape[0], xp.inf), xp.full(block.shape[0], -1, xp.int64)
        if prep is not None:
            lab, dn = be.min_sqdist(block, prep, grid)
            closer = dn < d2
            d2 = xp.where(closer, dn, d2)
            nearest = xp.where(closer, lab.astype(xp.int64) + offset, nearest)
        d2s.append(d2)
        near.append(nearest)
        phi = phi + (d2.sum() if w is None else d2 @ w.astype(xp.float64))
    return _ParState(d2s, near, float(phi), offset + new.shape[0])


def _phi(shard: Shard, state: _ParState) -> float:
    return state.phi


def _par_sample(shard: Shard, state: _ParState | None, phi: float, ell: float, seed: int, rnd: int) -> tuple:
    """Rows drawn with probability ``min(1, ell * w * d2 / phi)``: ``(global_rows, data)``, the
    data in the shard's dtype. Without a state (the first round, no candidates yet) every row is
    drawn with probability ``min(1, ell / phi)``, ``phi`` the number of rows."""
    be = shard.be
    xp = be.xp
    idx, out = [], []
    for j, (_, off, block, w) in enumerate(shard.items()):
        if state is None:
            p = np.full(block.shape[0], ell / phi)
        else:
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


def _concat_by_row(parts: list) -> np.ndarray:
    """Sampled rows in global row order, whichever shard (worker) drew them."""
    idx = np.concatenate([p[0] for p in parts])
    data = np.concatenate([p[1] for p in parts])
    return data[np.argsort(idx, kind="stable")]


def _candidates(rounds: list, dtype: Any) -> np.ndarray:
    """Every round's draws (lists of per-shard parts), in candidate order."""
    return np.concatenate([_concat_by_row(parts) for parts in rounds]).astype(dtype, copy=False)


def _cand_weights(shard: Shard, state: _ParState) -> np.ndarray:
    """Weight of the rows nearest to each candidate, ``(n_cands,)`` float64."""
    be = shard.be
    xp = be.xp
    total = xp.zeros(state.n_cands, xp.float64)
    for j, w in enumerate(shard.weights or [None] * len(shard.chunk_ids)):  # no pass over the data
        total += be.bin_sums(state.nearest[j], None if w is None else w.astype(xp.float64), state.n_cands)
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
    c = seed_batched(x, k, seed, w, precision=INIT_PRECISION)
    c = weighted_lloyd(x, c, w, n_iter, precision=INIT_PRECISION)
    return be.to_numpy(c)


def init_kmeans_parallel(
    client: Client,
    placement: Placement,
    k: int,
    seed: int,
    *,
    rounds: int | None = None,
    oversampling_factor: float = 0.5,
    grid: Grid | None = None,
    **options: Any,
) -> np.ndarray:
    """k-means|| (Bahmani et al. 2012): ``rounds`` rounds of draws, the first of each row with
    probability ``min(1, l / n)`` and each later one with probability ``min(1, l * w * d^2 /
    phi)``, ``l = oversampling_factor * k``; the candidates, weighted by the rows nearest to
    each, are reduced to ``k`` on one worker (:func:`_recluster`).

    Every round but the first is one distance pass of the shards against the previous round's
    new candidates only, and one more pass folds in the last round's; each row carries its
    nearest candidate along, so the weights cost no pass of their own. All ``rounds`` passes
    together cost an assignment against ``rounds * l`` centres (2.5 K by default), whatever
    the number of workers. (The paper's first round is one row drawn at random, and so a
    whole pass over the data against one candidate, which in the host and storage tiers costs
    as much as any other; that row is drawn here too, in the first round.) ``grid``, the fit's (or None), bounds the rows
    for the passes' scaled float16 GEMM. ``options``: other inits' keyword options, not used
    here.
    """
    rounds = int(rounds if rounds is not None else config.get("init.rounds"))
    ell = float(oversampling_factor) * k
    n = placement.n_samples
    seed = int(np.random.SeedSequence(seed).generate_state(1)[0])
    nshard = len(placement.shards)
    states: list = [None] * nshard

    def sample(states: list, phi: float, r: int) -> list:
        # A round's draws stay where they were drawn, one part per shard: each worker fetches
        # the others' parts itself (one hop, not two through a concatenating task).
        return rows.submit_per_shard(
            client, placement, _par_sample, states, [phi] * nshard, [ell] * nshard, [seed] * nshard,
            [r] * nshard, name="daskmeans-kpar-sample",
        )

    def fold(states: list, new: list) -> list:
        return rows.submit_per_shard(client, placement, _par_update, states, [new] * nshard, [grid] * nshard,
                                     name="daskmeans-kpar-update")

    # The first round draws uniformly (no pass over the data before it), so each of the
    # ``rounds`` passes folds l candidates in and the last one gives the weights; with it one
    # row drawn by the seed, so that there is a candidate however small l / n is.
    row0 = np.random.default_rng([seed, 0]).integers(0, n, size=1)
    first = take_rows(client, placement, row0).astype(placement.dtype)
    new: list | None = [client.scatter((row0, first), hash=False), *sample(states, float(n), 0)]
    rounds_drawn = [new]
    advance(1, rounds + 1)
    for r in range(1, rounds):
        states = fold(states, new)
        new = None
        # Only each shard's float comes to the client (the states keep their arrays where they
        # are), added in shard order: the same phi on any number of workers.
        phis = gather(client, rows.submit_per_shard(client, placement, _phi, states, name="daskmeans-kpar-phi"),
                      placement.workers)
        phi = float(sum(phis))
        if phi <= 0:  # fewer distinct points than candidates: every row is a candidate already
            break
        new = sample(states, phi, r)
        rounds_drawn.append(new)
        advance(r + 1, rounds + 1)  # the rounds, then the recluster
    if new is not None:  # the last round's draws
        states = fold(states, new)
    weights = tree_reduce(
        client, rows.submit_per_shard(client, placement, _cand_weights, states, name="daskmeans-kpar-weights"),
        _sum_arrays, name="daskmeans-kpar-wsum",
    )
    n_cand = int(result(client, placement, client.submit(lambda w: int((w > 0).sum()), weights, pure=False)))
    if n_cand < k:
        # Too few distinct candidates (tiny or highly duplicated data): fall back to k-means++.
        return init_kmeans_plusplus(client, placement, k, seed)
    advance(rounds, rounds + 1)
    fut = client.submit(
        blas_capped(_recluster), rounds_drawn, placement.dtype, weights, k, seed, int(config.get("init.recluster-iter")), placement.backend,
        pure=False, key=f"daskmeans-kpar-recluster-{uuid.uuid4().hex}",
    )
    centers = result(client, placement, fut)
    advance(rounds + 1)
    return centers
