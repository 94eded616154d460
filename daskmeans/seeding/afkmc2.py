"""``afk-mc2``: AFK-MC² (Bachem, Lucic, Hassani, Krause, "Fast and Provably Good Seedings
for k-Means", NeurIPS 2016): k-means++'s D² draws approximated by short Markov chains over
rows drawn from a fixed proposal, so that the data is read once and each centre costs ``m``
proposal rows, not a pass.

The proposal is ``q(x) = 1/2 w(x) d(x, c1)^2 / sum(w d^2) + 1/2 w(x) / sum(w)`` (``w`` the
sample weights, 1 without; ``c1`` a first row drawn by weight). Every proposal of every chain
is drawn at once, after the one pass that gives ``q``: proposal ``j`` is the row where ``q``'s
CDF over the global row order crosses a uniform of the seed. A float prefix sum depends on the
chunking, so each row's mass is rounded once to an int64 multiple of a power of two chosen from
the global maximum (:class:`daskmeans.numerics.grid.Grid`'s exponent rule): integer sums are
exact in any order, so the chunks' totals, gathered in chunk order, locate a proposal's chunk
by ``searchsorted``, and a task on the shard holding that chunk locates its row. The distinct
proposal rows then go to one worker, the first shard's (its own rows stay on its device; the
others' come through Dask as host rows), which runs the ``K - 1`` chains on its device in
blocks (:mod:`.afkmc2_chains`: CuPy on a GPU worker, NumPy and Numba on a CPU one; float64,
one kernel launch per block beside the GEMMs of its prior and its fold, nothing read back until
the end). Every draw is the seed's (the proposals' on the client, the acceptance uniforms' on
that worker from the seed), and every number a chain reads is either an exact integer or computed
on that one device from the rows' values, in an order and with shapes that depend on the
proposals alone: the same seed gives the same centroids bit for bit on any chunking and worker
(GPU) count of one kind of device. (The one pass's distances are the backend's exact ones,
``min_sqdist``, as k-means||'s.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client

from .. import config
from ..engine.placement import Placement, Shard
from ..engine.task import blas_capped, unique_key
from ..engine.watch import gather
from ..events import advance, note
from ..numerics.grid import Grid
from . import rows
from .kmeans_parallel import INIT_PRECISION
from .afkmc2_chains import chains_on_shard
from .rows import shard_rows, take_rows

# The chains' distinct proposal rows (at most (K - 1) m x d float64) are held on one worker's
# device (or host, a CPU worker's), twice (as gathered, and sorted by last use): beyond this
# many bytes the chain is shortened to fit (with a note), rather than the worker running out of
# memory (K = 40,000, m = 200, d = 480 would need 30 GB; it gets m = 27 here). A constant, not the
# plan's device budget: the budget is the data's, known to the plan on the client but not
# here, and a cap that moved with the workers' memory would make the centroids depend on them.
WORKER_BYTES = 4 << 30


# ---------------------------------------------------------------- on the shards


@dataclass
class _State:
    """A shard's masses of the proposal's d^2 half: ``w * d(x, c1)^2`` per chunk (float64,
    on the shard's device), by global chunk id."""

    mass: dict


def _masses(shard: Shard, state: _State | None, kind: str) -> list:
    """``[(chunk_id, row_offset, mass)]``: each chunk's row masses of the proposal's half
    ``kind`` (``"d2"``: ``w d^2`` from ``state``; ``"w"``: the sample weights), float64 on the
    shard's device; no pass over the data."""
    xp = shard.be.xp
    ws = shard.weights or [None] * len(shard.chunk_ids)
    out = []
    for cid, off, n, w in zip(shard.chunk_ids, shard.offsets, shard.rows, ws):
        if kind == "d2":
            out.append((cid, off, state.mass[cid]))
        else:
            out.append((cid, off, xp.ones(n, xp.float64) if w is None else w.astype(xp.float64)))
    return out


def _quantised(xp: Any, mass: Any, exp: int) -> Any:
    """``rint(mass / 2**exp)`` as int64: elementwise, so a row's integer is the same in a
    chunk's total, in its prefix sum and on its own."""
    return xp.rint(mass * (2.0 ** -exp)).astype(xp.int64)


def _d2_state(shard: Shard, c1: np.ndarray, grid: Grid | None) -> _State:
    """One pass: each row's ``w d(x, c1)^2`` (``c1``: ``(1, d)``), kept on the shard."""
    be = shard.be
    xp = be.xp
    prep = be.prepare(c1, shard.dtype, INIT_PRECISION)
    mass = {}
    for cid, _, block, w in shard.items():
        _, d2 = be.min_sqdist(block, prep, grid)
        d2 = d2.astype(xp.float64)
        mass[cid] = d2 if w is None else d2 * w.astype(xp.float64)
    return _State(mass)


def _max_mass(shard: Shard, state: _State | None, kind: str) -> tuple[bool, float]:
    """``(weighted, max mass)`` of the shard's rows for the half ``kind``."""
    parts = _masses(shard, state, kind)
    top = max((float(m.max()) for _, _, m in parts if m.shape[0]), default=0.0)
    return shard.weights is not None, top


def _chunk_totals(shard: Shard, state: _State | None, kind: str, exp: int) -> list:
    """``[(chunk_id, total)]``: each chunk's exact int64 sum of its rows' quantised masses."""
    xp = shard.be.xp
    return [(cid, int(_quantised(xp, m, exp).sum())) for cid, _, m in _masses(shard, state, kind)]


def _locate(shard: Shard, state: _State | None, kind: str, exp: int, chunk: np.ndarray,
            residual: np.ndarray) -> np.ndarray:
    """Global rows of the targets ``residual`` (int64, each below its chunk's total) in the
    chunks ``chunk`` (global ids): the first row whose inclusive prefix sum of quantised
    masses in its chunk exceeds the target, ``(len(residual),)`` int64 in the given order."""
    be = shard.be
    xp = be.xp
    out = np.empty(len(residual), np.int64)
    for cid, off, m in _masses(shard, state, kind):
        sel = np.flatnonzero(chunk == cid)
        if len(sel):
            cum = xp.cumsum(_quantised(xp, m, exp))
            pos = xp.searchsorted(cum, xp.asarray(residual[sel]), side="right")
            out[sel] = off + be.to_numpy(pos)
    return out


def _row_masses(shard: Shard, state: _State, exps: tuple[int, int], want: np.ndarray) -> tuple:
    """The quantised masses of both halves (``exps``: the d^2 half's and the weights') of the
    global rows ``want`` that this shard holds: ``(rows, d2 ints, w ints)``, int64."""
    be = shard.be
    idx, a, b = [], [], []
    for (cid, off, md), (_, _, mw) in zip(_masses(shard, state, "d2"), _masses(shard, None, "w")):
        sel = want[(want >= off) & (want < off + md.shape[0])]
        if len(sel):
            loc = be.xp.asarray(sel - off)
            idx.append(sel)
            a.append(be.to_numpy(_quantised(be.xp, md[loc], exps[0])))
            b.append(be.to_numpy(_quantised(be.xp, mw[loc], exps[1])))
    if not idx:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(idx), np.concatenate(a), np.concatenate(b)


# ---------------------------------------------------------------- on the client


def quantum_exp(max_mass: float, n: int) -> int:
    """The exponent ``e`` of the step ``2**e`` of ``n`` rows' masses of at most ``max_mass``:
    ``n * max_mass < 2**(e + 62)``, so that no sum of the int64 masses overflows (each
    rounded mass is at most ``2**62 / n + 1/2``), as :class:`Grid` chooses its steps.

    A row's mass is then known to within half a step, ``2**e / 2 <= n * max_mass * 2**-62``:
    a proposal's row differs from the one exact float CDF would give only where its uniform
    falls within that much of a boundary between two rows' masses.
    """
    return int(Grid(np.array([float(max_mass)]), float(n)).exps[0])


@dataclass(frozen=True)
class Cdf:
    """One half of the proposal as exact integers: each chunk's total in global chunk order.

    Attributes
    ----------
    kind : "d2" or "w"
    exp : int
        Rows' masses are int64 multiples of ``2**exp``.
    totals : ndarray of int64, shape (n_chunks,)
    ends : ndarray of int64, shape (n_chunks,)
        The inclusive prefix sums of ``totals`` (``ends[-1]``: the half's total).
    """

    kind: str
    exp: int
    totals: np.ndarray
    ends: np.ndarray

    @property
    def total(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0


def _per_shard(client: Client, placement: Placement, fn: Any, *per_shard: list, name: str) -> list:
    """``fn(shard, *args_i)`` on every shard (``per_shard``: a list of arguments each, one per
    shard), their results in shard order."""
    return gather(client, rows.submit_per_shard(client, placement, fn, *per_shard, name=name), placement.workers)


def _all(placement: Placement, value: Any) -> list:
    """``value`` for every shard."""
    return [value] * len(placement.shards)


def _cdf(client: Client, placement: Placement, states: list, kind: str, max_mass: float) -> Cdf:
    exp = quantum_exp(max_mass, placement.n_samples)
    totals = np.zeros(len(placement.row_chunks), np.int64)
    for part in _per_shard(client, placement, _chunk_totals, states, _all(placement, kind),
                           _all(placement, exp), name="daskmeans-afkmc2-totals"):
        for cid, t in part:
            totals[cid] = t
    return Cdf(kind, exp, totals, np.cumsum(totals))


def _draw(client: Client, placement: Placement, states: list, cdf: Cdf, targets: np.ndarray) -> np.ndarray:
    """Global rows where ``cdf`` crosses the int64 ``targets`` (each in ``[0, cdf.total)``):
    the chunk from the totals' prefix sums here, the row by a task on its shard."""
    targets = np.asarray(targets, np.int64)
    chunk = np.searchsorted(cdf.ends, targets, side="right")
    residual = targets - (cdf.ends[chunk] - cdf.totals[chunk])
    owner = np.empty(len(placement.row_chunks), np.int64)
    for i, ids in enumerate(placement.chunk_ids):
        owner[list(ids)] = i
    shard_of = owner[chunk]
    nshard = len(placement.shards)
    picks = [np.flatnonzero(shard_of == i) for i in range(nshard)]
    found = _per_shard(client, placement, _locate, states, _all(placement, cdf.kind), _all(placement, cdf.exp),
                       [chunk[p] for p in picks],
                       [residual[p] for p in picks], name="daskmeans-afkmc2-locate")
    out = np.empty(len(targets), np.int64)
    for p, r in zip(picks, found):
        out[p] = r
    return out


def fit_chain(k: int, d: int, m: int) -> int:
    """The chain length that runs: ``m``, or the longest whose ``(k - 1) m`` proposal rows of
    ``d`` float64 values fit in :data:`WORKER_BYTES` (at least 1: a chain of one proposal is
    a draw from ``q``)."""
    fits = WORKER_BYTES // max(1, (k - 1) * d * 8)
    return max(1, min(m, int(fits)))


def _chains_on_first_shard(client: Client, placement: Placement, uniq: np.ndarray, c1: np.ndarray,
                           chains: np.ndarray, q: np.ndarray, u_seed: list) -> tuple[np.ndarray, np.ndarray]:
    """The chains on the first shard's worker (:func:`.afkmc2_chains.chains_on_shard`): the
    other shards' rows of ``uniq`` come to it as host rows (with one worker nothing moves),
    the proposals' positions and probabilities are scattered to it. ``(picked, rows)``."""
    nshard = len(placement.shards)
    give = [np.empty(0, np.int64)] + [uniq] * (nshard - 1)  # the first shard's own rows stay on its device
    parts = rows.submit_per_shard(client, placement, shard_rows, give, name="daskmeans-afkmc2-rows")[1:]
    w0 = placement.workers[0]
    # ~(K - 1) m int64 and U float64: scattered, not in the graph
    uniq_f, chains_f, q_f = client.scatter([uniq, chains, q], workers=[w0], hash=False)
    fut = client.submit(blas_capped(chains_on_shard), placement.shards[0], parts, uniq_f, c1, chains_f, q_f, u_seed,
                        workers=[w0], allow_other_workers=False, pure=False,
                        key=unique_key("daskmeans-afkmc2-chains"))
    return rows.result(client, placement, fut)


def init_afkmc2(
    client: Client,
    placement: Placement,
    k: int,
    seed: int,
    *,
    chain_length: int | None = None,
    grid: Grid | None = None,
    **options: Any,
) -> np.ndarray:
    """AFK-MC² (Bachem et al. 2016): ``k`` centroids ``(k, d)`` float64, rows of the data.

    The first centre is a row drawn by weight; each of the others is the last state of a
    Metropolis-Hastings chain of ``chain_length`` proposals (``daskmeans.init.afkmc2-chain``,
    200 by default, as the paper) drawn from ``q(x) = 1/2 w d(x, c1)^2 / sum(w d^2) + 1/2 w /
    sum(w)``. Cost: one distance pass over the data (against ``c1``), a few tasks without a
    pass (the chunks' integer totals, the rows' locations), the distinct proposal rows (at most
    ``(k - 1) * chain_length``) to the first shard's worker, and there the chains on its device,
    at most ``O(U k d)`` float64 flops in GEMMs (``U`` distinct rows) and ``O(k b chain_length
    d)`` in the blocks of ``b`` chains (:mod:`.afkmc2_chains`).

    Where the ``(k - 1) * chain_length * d`` float64 proposals exceed :data:`WORKER_BYTES`
    (4 GiB) the chain is shortened automatically to the longest that fits (:func:`fit_chain`),
    with a note; the result is still a function of the seed, ``k``, ``d`` and the setting.

    Every draw depends on the seed and global rows only (see the module's docstring): the same
    centroids on any chunking and worker count. A row of weight 0 has no mass in
    either half of ``q`` and is never a centre. ``grid``, the fit's (or None), bounds the rows
    for the distance pass. ``options``: other inits' keyword options, not used here.
    """
    m = int(chain_length if chain_length is not None else config.get("init.afkmc2-chain"))
    if m < 1:
        raise ValueError(f"chain_length={m} should be >= 1")
    n, d = placement.n_samples, placement.n_features
    if k > n:
        raise ValueError(f"k={k} should be <= the rows ({n})")
    fit = fit_chain(k, d, m)
    if fit < m:
        note(f"afk-mc2: chains of {fit} proposals, not {m}: (k - 1) x m x d = {k - 1} x {m} x {d} float64 "
             f"proposals would take {(k - 1) * m * d * 8 / 2**30:.1f} GiB of a worker's memory "
             f"(at most {WORKER_BYTES / 2**30:.0f} GiB)")
        m = fit
    seed = int(np.random.SeedSequence(seed).generate_state(1)[0])
    advance(0, 3)

    # The weights' half: uniform over rows without weights (a row index drawn directly).
    stats = _per_shard(client, placement, _max_mass, _all(placement, None), _all(placement, "w"),
                       name="daskmeans-afkmc2-wmax")
    weighted = any(s[0] for s in stats)
    wcdf = _cdf(client, placement, _all(placement, None), "w", max(s[1] for s in stats)) if weighted else None
    if wcdf is not None and wcdf.total <= 0:
        raise ValueError("the sample weights should not all be 0")
    rng = np.random.default_rng([seed, 0])
    if weighted:
        row0 = _draw(client, placement, _all(placement, None), wcdf, rng.integers(0, wcdf.total, size=1))
    else:
        row0 = rng.integers(0, n, size=1)
    c1 = take_rows(client, placement, row0)
    if k == 1:
        return c1

    # The pass: each row's w d(x, c1)^2, kept on its shard for the draws.
    states = rows.submit_per_shard(client, placement, _d2_state, _all(placement, c1), _all(placement, grid),
                                   name="daskmeans-afkmc2-d2")
    top = max(s[1] for s in _per_shard(client, placement, _max_mass, states, _all(placement, "d2"),
                                       name="daskmeans-afkmc2-max"))
    acdf = _cdf(client, placement, states, "d2", top)
    advance(1, 3)

    # Every proposal at once: its half, its target in that half (both from the seed).
    nprop = (k - 1) * m
    rng = np.random.default_rng([seed, 1])
    half_d2 = rng.random(nprop) < 0.5
    ta = rng.integers(0, max(acdf.total, 1), size=nprop)
    tw = rng.integers(0, wcdf.total if weighted else n, size=nprop)
    if acdf.total == 0:  # every row at c1: q is the weights' half alone
        half_d2[:] = False
    prop = np.empty(nprop, np.int64)
    if half_d2.any():
        prop[half_d2] = _draw(client, placement, states, acdf, ta[half_d2])
    if (~half_d2).any():
        prop[~half_d2] = (_draw(client, placement, _all(placement, None), wcdf, tw[~half_d2]) if weighted
                          else tw[~half_d2])
    uniq, inv = np.unique(prop, return_inverse=True)

    # Their exact masses, hence q, and their values.
    exps = (acdf.exp, wcdf.exp if weighted else 0)
    a = np.zeros(len(uniq), np.int64)
    b = np.zeros(len(uniq), np.int64)
    for r, ai, bi in _per_shard(client, placement, _row_masses, states, _all(placement, exps), _all(placement, uniq),
                                name="daskmeans-afkmc2-masses"):
        pos = np.searchsorted(uniq, r)
        a[pos], b[pos] = ai, bi
    qw = b / wcdf.total if weighted else np.full(len(uniq), 1.0 / n)
    q = qw if acdf.total == 0 else 0.5 * (a / acdf.total) + 0.5 * qw
    advance(2, 3)

    # The chains on one worker's device; the acceptance uniforms drawn there from [seed, 2].
    _, centres = _chains_on_first_shard(client, placement, uniq, c1, inv.reshape(k - 1, m).astype(np.int64), q,
                                        [seed, 2])
    advance(3, 3)
    return np.concatenate([c1, centres])
