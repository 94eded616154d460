"""``k-means||`` (the default): rounds of rows drawn by their squared distance to the
candidates so far, on every shard, then the weighted candidates reduced to K on one worker.

Random draws depend on the seed and on the global row only, never on which worker holds a
chunk, so the same seed gives the same centroids on any cluster layout.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from distributed import Client

from .. import config
from ..backends import get_backend
from ..engine.placement import Placement, Shard
from ..engine.task import blas_capped
from ..engine.watch import watch
from ..numerics.grid import Grid
from ..numerics.hashing import row_uniforms
from ..params import KMeansParams
from ..events import advance, note
from ..reduction import tree_reduce
from . import rows
from .kernels import seed_batched, weighted_lloyd
from .kmeans_plusplus import init_kmeans_plusplus
from .rows import result


# The distance passes of the init run in TF32 on GPUs: labels and distances are exact in
# every precision (backends.cupy_backend), so this is the fastest way to the same bits.
INIT_PRECISION = "tf32"

# Draws per centre in the recluster's batches of several centres (greedy steps keep
# scikit-learn's 2 + ln K): fits from it ended within 0.11% of 2 + ln K's on randn and 6-17%
# lower on blobs of K true centres, for a third to a quarter of the recluster's distance
# passes at K = 2^14..2^18 (docs/performance.md, "Inits", "The recluster's draws per centre").
RECLUSTER_BATCH_TRIALS = 3


@dataclass
class _ParState:
    d2: list  # per block: squared distance to the nearest candidate so far (float64)
    nearest: list  # per block: that candidate's index in the list of all candidates (int64)
    phi: float  # weighted sum of d2 over the shard
    n_cands: int  # the candidates so far (every shard's state counts the same ones)


def _par_update(shard: Shard, state: _ParState | None, parts: list, grid: Grid | None) -> _ParState:
    """Fold a round's candidates (``parts``: every shard's draws, :func:`_candidates`;
    numbered on from the candidates so far) into each row's nearest candidate: a row keeps an
    earlier candidate on ties, so the nearest is the first of the nearest in candidate order,
    as one pass over all of them would find it. ``phi`` is added on the device and read once
    (no synchronisation per block: the host tier's copies of the next block keep overlapping).
    A round that drew no rows leaves the state as it is, without a pass (the pass would give
    the same arrays and the same ``phi``)."""
    be = shard.be
    xp = be.xp
    new = _candidates(be, [parts], shard.dtype)
    if state is not None and not new.shape[0]:
        return state
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


def _par_last(shard: Shard, state: _ParState, parts: list, grid: Grid | None) -> np.ndarray:
    """The last round's fold (:func:`_par_update`) and the candidates' weights
    (:func:`_cand_weights`) in one task: the state, a shard's per-row arrays, is not kept."""
    return _cand_weights(shard, _par_update(shard, state, parts, grid))


def _phi(shard: Shard, state: _ParState) -> float:
    return state.phi


def _picks(shard: Shard, state: _ParState | None, phi: float, ell: float, seed: int, rnd: int) -> dict:
    """The rows drawn with probability ``min(1, ell * w * d2 / phi)`` (without a state, the
    first round's ``min(1, ell / phi)``), as local row indices per chunk index of the shard
    (chunks with no draw left out), int64 on the host.

    The draws are made where the per-row state lives (on a GPU, ``row_uniforms`` on the
    device, the same bits as the host's): only the indices drawn, a few per round, come to the
    host, not the rows' ``d2``. The comparison is the same float64 arithmetic on either
    device (``d2 * (ell / phi)``, then times the weight), so the same rows are drawn."""
    be = shard.be
    xp = be.xp
    ws = shard.weights or [None] * len(shard.chunk_ids)
    picks = {}
    for j, u in enumerate(_uniforms(shard, seed, rnd, xp)):
        if state is None:
            p = ell / phi
        else:
            p = state.d2[j] * (ell / phi)
            if ws[j] is not None:
                p = p * ws[j]
        pick = be.to_numpy(xp.flatnonzero(u < p)).astype(np.int64, copy=False)
        if len(pick):
            picks[j] = pick
    return picks


# Rows of one call of row_uniforms on a device: each call has a fixed cost (CuPy's kernel: a
# launch; another array module's integer arithmetic: about 400 launches), so a shard's
# consecutive chunks share calls of up to this many rows (64 MB of draws; the arithmetic's
# temporaries about 200 MB). Figures: performance.md, "Inits", "k-means‖'s passes".
DEVICE_DRAW_ROWS = 2**23


def _uniforms(shard: Shard, seed: int, rnd: int, xp: Any) -> Iterator[Any]:
    """Each chunk's ``row_uniforms`` in the shard's chunk order, as arrays of ``xp`` (float64
    ``(n_i,)``): on the host one call per chunk; on a device calls of up to
    :data:`DEVICE_DRAW_ROWS` rows over consecutive chunks (the same bits: a row's draw is
    its own)."""
    limit = 0 if xp is np else DEVICE_DRAW_ROWS
    offs, ns = shard.offsets, shard.rows
    buf, first, end = None, 0, 0
    for j, (off, m) in enumerate(zip(offs, ns)):
        if buf is None or not (first <= off and off + m <= end):
            first, end = off, off + m
            for o, k in zip(offs[j + 1:], ns[j + 1:]):  # the next chunks, while they follow on
                if o != end or o + k - first > limit:
                    break
                end = o + k
            buf = row_uniforms(seed, rnd, first, end - first, xp)
        yield buf[off - first:off - first + m]


def _par_sample(shard: Shard, state: _ParState | None, phis: list | None, ell: float, seed: int, rnd: int,
                first: int | None = None) -> tuple:
    """One round's draws on this shard (:func:`_picks`): ``(global_rows, data)``, the data in
    the shard's dtype, read from the chunks that hold a drawn row only (``rows.chunk_rows``),
    and left where the tier holds them: a device tier's draws stay on the device that drew
    them, for its own passes and the recluster (on one GPU a round's draws never cross to the
    host; from another worker they arrive as Dask moves a device array).
    ``phi`` is every shard's ``phis`` (their futures' floats) added in shard order (what the
    client added before: the same on any number of workers); None where this shard is the only
    one (its own ``state.phi``, the same float: no task between its fold and its draws). A
    round with ``phi <= 0`` (every row at a candidate already) draws nothing. ``first``: one
    more global row taken where this shard holds it (the first round's row drawn by the
    seed)."""
    phi = float(state.phi if phis is None else sum(phis))
    picks = _picks(shard, state, phi, ell, seed, rnd) if phi > 0 else {}
    if first is not None:
        for j, (off, m) in enumerate(zip(shard.offsets, shard.rows)):
            if off <= first < off + m:
                picks[j] = np.concatenate([[first - off], picks.get(j, np.empty(0, np.int64))]).astype(np.int64)
    order = sorted(picks)
    if not picks:
        return np.empty(0, np.int64), np.empty((0, shard.n_features), shard.dtype)
    got = rows.chunk_rows(shard, picks, host=False)
    idx = np.concatenate([shard.offsets[j] + picks[j] for j in order])
    return idx, get_backend(got[order[0]]).xp.concatenate([got[j] for j in order])


@dataclass
class _Round:
    """A round of the only shard: its state after the fold, and the rows it then drew
    (:func:`_par_sample`'s ``(global_rows, data)``)."""

    state: _ParState
    part: tuple


def _par_round(shard: Shard, prev: _Round | None, parts: list | None, grid: Grid | None, ell: float, seed: int,
               rnd: int) -> _Round:
    """The only shard's round in one task: the fold (:func:`_par_update`) of the previous
    round's draws (``prev``'s; without it, ``parts``: the first round's), then this round's
    draws (:func:`_par_sample`, with the shard's own ``phi``). The same state and rows as the
    two tasks of a round on several shards, one dependent task instead of two."""
    state = _par_update(shard, None if prev is None else prev.state, parts if prev is None else [prev.part], grid)
    return _Round(state, _par_sample(shard, state, None, ell, seed, rnd))


def _round_part(shard: Shard, rnd: _Round) -> tuple:
    """A round's draws, for the recluster (off the chain of rounds)."""
    return rnd.part


def _round_last(shard: Shard, rnd: _Round, grid: Grid | None) -> np.ndarray:
    """:func:`_par_last` after the only shard's last round."""
    return _par_last(shard, rnd.state, [rnd.part], grid)


def _row_order(parts: list) -> np.ndarray:
    """The order that puts a round's draws (its per-shard parts, concatenated) in global row
    order, whichever shard (worker) drew them: the candidates' order."""
    return np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")


def _candidates(be: Any, rounds: list, dtype: Any, keep: np.ndarray | None = None) -> Any:
    """The candidates of ``rounds`` (each a list of per-shard parts ``(global_rows, data)``),
    each round's in global row order (:func:`_row_order`), round after round, that ``keep``
    selects (a mask over them; None: all), as ``be``'s array ``(m, d)`` of ``dtype``. Only
    their indices are ordered on the host: each part's rows go to ``be``'s device as they are
    (a part drawn there stays there) and are gathered there (the recluster's task, on the
    init's critical path, made three host copies of every candidate; a round's fold sent its
    draws to the host and back)."""
    order, blocks, offset = [], [], 0
    for parts in rounds:
        order.append(_row_order(parts) + offset)
        offset += sum(len(p[0]) for p in parts)
        blocks += [p[1] for p in parts if len(p[1])]
    if not blocks:
        return be.xp.empty((0, rounds[0][0][1].shape[1]), dtype)
    take = np.concatenate(order)
    raw = be.xp.concatenate([be.asarray(b, dtype) for b in blocks])
    return raw[be.asarray(take if keep is None else take[keep])]


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


def _recluster(rounds: list, dtype: Any, weights: np.ndarray, k: int, seed: int, n_iter: int,
               backend: str) -> np.ndarray | None:
    """k centres of the weighted candidates on this worker's device (float64 ``(k, d)``):
    k-means++ with local trials in batches (:func:`seed_batched`; :data:`RECLUSTER_BATCH_TRIALS`
    draws per centre in batches of several), then ``n_iter`` weighted
    Lloyd iterations (``daskmeans.init.recluster-iter``, 0 by default). None where fewer than
    ``k`` candidates have a positive weight (tiny or highly duplicated data: the caller falls
    back to k-means++), said in the same task rather than in a round trip of its own."""
    keep = weights > 0
    if int(keep.sum()) < k:
        return None
    be = get_backend(backend)
    x = _candidates(be, rounds, dtype, keep)
    w = be.asarray(weights[keep])
    c = seed_batched(x, k, seed, w, precision=INIT_PRECISION, batch_trials=RECLUSTER_BATCH_TRIALS)
    c = weighted_lloyd(x, c, w, n_iter, precision=INIT_PRECISION)
    return be.to_numpy(c)


def init_kmeans_parallel(
    client: Client,
    placement: Placement,
    k: int,
    seed: int,
    *,
    rounds: int | None = None,
    oversampling_factor: float = KMeansParams.oversampling_factor,
    grid: Grid | None = None,
    **options: Any,
) -> np.ndarray:
    """k-means|| (Bahmani et al. 2012): ``rounds`` rounds of draws, the first of each row with
    probability ``min(1, l / n)`` and each later one with probability ``min(1, l * w * d^2 /
    phi)``, ``l = oversampling_factor * k``; the candidates, weighted by the rows nearest to
    each, are reduced to ``k`` on one worker (:func:`_recluster`).

    Every round but the first is one distance pass of the shards against the previous round's
    new candidates only, and one more pass folds in the last round's and gives the weights
    (each row carries its nearest candidate along): ``rounds`` passes in all, which together
    cost an assignment against ``rounds * l`` centres (2.5 K by default), whatever the number
    of workers. The draws themselves cost no pass: the first round's are uniform, and a later
    round's come from the per-row state each shard keeps (``d2`` and the seeded per-row
    uniforms), so only the chunks that hold a drawn row are read (in the storage tier; the
    resident tiers index their blocks). (The paper's first round is one row drawn at random,
    and so a whole pass over the data against one candidate; that row is drawn here too, in
    the first round, and read with its draws.) ``grid``, the fit's (or None), bounds the rows
    for the passes' scaled float16 GEMM. ``options``: other inits' keyword options, not used
    here.

    Every round's tasks are submitted at once: each round's fold, ``phi`` and draws follow
    one another on the workers (a shard's draws take every shard's ``phi`` as futures), with
    no round trip through the client; the client follows the rounds for progress and for a
    lost worker.
    """
    rounds = int(rounds if rounds is not None else config.get("init.rounds"))
    ell = float(oversampling_factor) * k
    n = placement.n_samples
    seed = int(np.random.SeedSequence(seed).generate_state(1)[0])
    nshard = len(placement.shards)
    submitted: list = []

    def per_shard(fn, *args, name: str) -> list:
        futs = rows.submit_per_shard(client, placement, fn, *args, name=name)
        submitted.extend(futs)
        return futs

    def sample(states: list, phis: list, r: int, first: int | None = None) -> list:
        # A round's draws stay where they were drawn, one part per shard: each worker fetches
        # the others' parts itself (one hop, not two through a concatenating task).
        return per_shard(_par_sample, states, [phis] * nshard, [ell] * nshard, [seed] * nshard, [r] * nshard,
                         [first] * nshard, name="daskmeans-kpar-sample")

    # The first round draws uniformly (no pass over the data before it), so each of the
    # ``rounds`` passes folds l candidates in and the last one gives the weights; with it one
    # row drawn by the seed, so that there is a candidate however small l / n is.
    row0 = int(np.random.default_rng([seed, 0]).integers(0, n, size=1)[0])
    states: list = [None] * nshard
    new = sample(states, [float(n)], 0, row0)
    rounds_drawn = [new]
    try:
        if nshard == 1 and rounds > 1:
            # The only shard folds and draws in one task a round, with its own phi: at wide K on
            # one GPU the rounds waited between their dependent tasks about as long as they
            # computed. Its draws reach the recluster through a task off that chain.
            last: list = [None]
            for r in range(1, rounds):
                last = per_shard(_par_round, last, [new if r == 1 else None], [grid], [ell], [seed], [r],
                                 name="daskmeans-kpar-update")
                new = per_shard(_round_part, last, name="daskmeans-kpar-sample")
                rounds_drawn.append(new)
            parts = per_shard(_round_last, last, [grid], name="daskmeans-kpar-update")
        else:
            for r in range(1, rounds):
                states = per_shard(_par_update, states, [new] * nshard, [grid] * nshard, name="daskmeans-kpar-update")
                # Only each shard's float moves (the states keep their arrays where they are),
                # added in shard order by every shard's draws: the same phi on any number of workers.
                phis = per_shard(_phi, states, name="daskmeans-kpar-phi")
                new = sample(states, phis, r)
                rounds_drawn.append(new)
            parts = per_shard(_par_last, states, [new] * nshard, [grid] * nshard, name="daskmeans-kpar-update")
        weights = tree_reduce(client, parts, _sum_arrays, name="daskmeans-kpar-wsum")
        fut = client.submit(
            blas_capped(_recluster), rounds_drawn, placement.dtype, weights, k, seed,
            int(config.get("init.recluster-iter")), placement.backend,
            pure=False, key=f"daskmeans-kpar-recluster-{uuid.uuid4().hex}",
        )
        submitted.append(fut)
        for r, drawn in enumerate(rounds_drawn):  # the rounds, then the recluster
            watch(client, drawn, placement.workers, fetch=False, hung_after=config.get_seconds("collective-timeout"))
            advance(r + 1, rounds + 1)
        centers = result(client, placement, fut)
    except BaseException:
        client.cancel(submitted)  # the rounds after a lost worker's or an interrupt's would wait
        raise
    if centers is None:
        # Too few distinct candidates (tiny or highly duplicated data, or, at small K, rounds
        # that happened to draw fewer than K rows): k-means++ takes the recluster's place, and
        # the person watching is told why.
        note(f"daskmeans: init k-means||: fewer than n_clusters={k} distinct candidates drawn; "
             f"seeding with k-means++ instead")
        centers = init_kmeans_plusplus(client, placement, k, seed)
    advance(rounds + 1)
    return centers
