"""``hierarchical``: K centres for wide K from mesoclusters of a sample of the rows.

k-means|| at K = 2^18 reduces its 2.5 K candidates to K on one worker in ~80 dependent batches,
each a distance pass of every candidate against a batch's draws, none of it shared by more
GPUs. Here (cuVS's mesoclusters; FAISS trains on a sample too):

1. **Sample** (one pass, one task per shard): a row belongs to it when its uniform draw
   (:func:`~daskmeans.numerics.hashing.row_uniforms`, by global row) is below ``m / n``, ``m =
   min(n, init.hierarchical-sample-per-centre * K)``; each shard keeps its sampled rows in place.
2. **Mesoclusters**: ``M = round(sqrt(K))`` centres by k-means (:func:`seed_batched`, then
   :func:`weighted_lloyd`) of the nested subsample of at most ``256 M`` rows, on one worker.
3. **Split**: each shard labels its sampled rows with their nearest mesocentre; K is split
   over the mesoclusters in proportion to their weights, by largest remainder, never more
   centres than a mesocluster has sampled rows (:func:`split_k`).
4. **Seeding** (one task per worker): the mesoclusters are dealt into
   ``init.hierarchical-bundles`` bundles (by their sizes: the same bundles on any number of
   workers) and the bundles to the workers; a bundle is one :func:`seed_batched` call on its
   rows, each mesocluster drawing its share of centres from its own rows, all of them in the
   same batches.

Cost: the seeding's distance passes come to about ``(trials + 1) / bundles`` of one Lloyd
iteration over the sample (``trials = 2 + log(K / M)``), split over the workers; the passes
over the data are the sample's and the labels'. Every draw depends on the seed and global row
indices, and every sum is taken in global row order: the same centroids bit for bit on any
chunking and number of workers.
"""

from __future__ import annotations

import itertools
import math
import uuid
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

import numpy as np
from distributed import Client

from .. import config
from ..backends import get_backend
from ..engine.placement import Placement, Shard
from ..engine.task import blas_capped, submit_per_shard
from ..engine.watch import gather
from ..events import advance
from ..numerics.hashing import row_uniforms
from .kernels import seed_batched, weighted_lloyd
from .kmeans_parallel import INIT_PRECISION
from .rows import result

# The mesoclusters' k-means: at most this many sampled rows per mesocentre (FAISS's default
# ``max_points_per_centroid``) and this many weighted Lloyd iterations after their seeding.
_COARSE_PER_CENTRE = 256
_COARSE_ITER = 10
_STEPS = 4  # progress: sample and mesoclusters, labels and split, the bundles' rows, seeding


def mesoclusters(k: int) -> int:
    """The number of mesoclusters for ``k`` centres: ``round(sqrt(k))``, in ``[1, k]``."""
    return max(1, min(int(k), round(math.sqrt(k))))


def split_k(k: int, sizes: Sequence[float], rows: Sequence[int]) -> np.ndarray:
    """``k`` centres split over groups in proportion to their ``sizes``, never more than a
    group's ``rows``.

    Largest remainder: each group gets the floor of its exact share ``k * size / sum(sizes)``,
    and the centres left go one each to the largest fractional parts (the lower index first on
    ties). A group whose share exceeds its rows gets its rows; the rest of ``k`` is split again
    over the other groups, until none exceeds its rows. Groups of zero size share by their
    rows where no group of positive size is left to take the centres.

    Parameters
    ----------
    k : int
    sizes : floats >= 0, shape (G,)
        The groups' (weighted) sizes; shares are computed exactly (as fractions).
    rows : ints >= 0, shape (G,), summing to at least ``k``

    Returns
    -------
    counts : ndarray of int64, shape (G,), summing to ``k``
    """
    rows = np.asarray(rows, np.int64)
    exact = [Fraction(float(s)) for s in sizes]
    if len(exact) != len(rows):
        raise ValueError(f"sizes of length {len(exact)} should match rows of length {len(rows)}")
    if int(rows.sum()) < k:
        raise ValueError(f"k={k} should be <= the groups' rows ({int(rows.sum())})")
    counts = np.zeros(len(rows), np.int64)
    free = np.ones(len(rows), bool)
    while True:
        idx = np.flatnonzero(free)
        left = int(k - counts[~free].sum())
        share = [exact[i] for i in idx]
        if sum(share) == 0:
            share = [Fraction(int(rows[i])) for i in idx]
        total = sum(share)
        if left == 0 or total == 0:
            counts[idx] = 0
            return counts
        quota = [left * s / total for s in share]
        base = [math.floor(q) for q in quota]
        for j in sorted(range(len(idx)), key=lambda j: (base[j] - quota[j], j))[: left - sum(base)]:
            base[j] += 1
        over = np.array(base) > rows[idx]
        if not over.any():
            counts[idx] = base
            return counts
        counts[idx[over]] = rows[idx[over]]
        free[idx[over]] = False


def deal(load: Sequence[float], n_bins: int) -> list[np.ndarray]:
    """Items dealt into ``n_bins`` bins of near-equal ``load``: the largest first, each to the
    bin of least load so far (the lower index on ties). Each bin's items ascending."""
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    loads = np.zeros(n_bins)
    for i in sorted(range(len(load)), key=lambda i: (-load[i], i)):
        j = int(np.argmin(loads))
        bins[j].append(i)
        loads[j] += load[i]
    return [np.array(sorted(b), np.int64) for b in bins]


@dataclass
class _Sample:
    """A shard's sampled rows, kept on its worker."""

    rows: np.ndarray  # (m_s,) int64: global row indices, ascending
    u: np.ndarray  # (m_s,) float64: their draws
    blocks: list  # backend arrays (m_i, d) of the shard's dtype, in row order
    weights: list | None  # backend arrays (m_i,), or None


def _sample(shard: Shard, key: int, stream: int, rate: float) -> _Sample:
    """The shard's rows whose draw is below ``rate``: resident blocks taken whole are not copied."""
    xp = shard.be.xp
    rows, us, blocks = [np.empty(0, np.int64)], [np.empty(0)], []
    weights: list | None = None if shard.weights is None else []
    for _, off, block, w in shard.items():
        u = row_uniforms(key, stream, off, block.shape[0])
        sel = np.flatnonzero(u < rate)
        if not len(sel):
            continue
        whole = len(sel) == block.shape[0] and shard.tier.yields_resident
        rows.append(off + sel)
        us.append(u[sel])
        blocks.append(block if whole else block[xp.asarray(sel)])
        if weights is not None:
            weights.append(w if whole else w[xp.asarray(sel)])
    return _Sample(np.concatenate(rows), np.concatenate(us), blocks, weights)


def _host(shard: Shard, sample: _Sample, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Host copies of the sampled rows at positions ``sel`` (ascending) and their weights
    (None where unweighted), taken on the device before the copy."""
    be = shard.be
    xs, ws = [np.empty((0, shard.n_features), shard.dtype)], [np.empty(0)]
    start = 0
    for j, block in enumerate(sample.blocks):
        mine = sel[(sel >= start) & (sel < start + block.shape[0])] - start
        start += block.shape[0]
        if len(mine):
            at = be.xp.asarray(mine)
            xs.append(be.to_numpy(block[at]))
            if sample.weights is not None:
                ws.append(be.to_numpy(sample.weights[j][at]).astype(np.float64))
    return np.concatenate(xs), None if sample.weights is None else np.concatenate(ws)


def _coarse_part(shard: Shard, sample: _Sample, rate: float) -> tuple:
    """``(sampled rows, global rows, data, weights)`` of the rows drawn below ``rate``: the
    mesoclusters' subsample."""
    sel = np.flatnonzero(sample.u < rate)
    x, w = _host(shard, sample, sel)
    return len(sample.rows), sample.rows[sel], x, w


def _in_row_order(parts: list, first: int = 0) -> tuple:
    """The per-shard parts' arrays from ``first`` on (global rows, then data aligned with them,
    None where unweighted) concatenated in global row order."""
    rows = np.concatenate([p[first] for p in parts])
    order = np.argsort(rows, kind="stable")
    out: list = [rows[order]]
    for j in range(first + 1, len(parts[0])):
        cols = [p[j] for p in parts]
        out.append(None if any(c is None for c in cols) else np.concatenate(cols)[order])
    return tuple(out)


def _coarse(parts: list, k: int, m: int, seed: np.random.SeedSequence, backend: str) -> np.ndarray | None:
    """The ``m`` mesocentres ``(m, d)`` float64 of the subsample; None where the sample holds
    fewer than ``k`` rows or the subsample fewer than ``m`` (the caller draws again)."""
    _, x, w = _in_row_order(parts, first=1)
    if sum(p[0] for p in parts) < k or len(x) < m:
        return None
    be = get_backend(backend)
    xs, ws = be.asarray(x), None if w is None else be.asarray(w)
    c = seed_batched(xs, m, seed, ws, precision=INIT_PRECISION)
    return be.to_numpy(weighted_lloyd(xs, c, ws, _COARSE_ITER, precision=INIT_PRECISION))


def _labels(shard: Shard, sample: _Sample, centres: np.ndarray) -> tuple:
    """``(global rows, nearest mesocentre (int32), weights or None)`` of the sampled rows."""
    be = shard.be
    p = be.prepare(be.asarray(centres), shard.dtype, INIT_PRECISION)
    labels = np.concatenate([np.empty(0, np.int32)] + [be.to_numpy(be.min_sqdist(b, p)[0]) for b in sample.blocks])
    w = None if sample.weights is None else np.concatenate(
        [np.empty(0)] + [be.to_numpy(a).astype(np.float64) for a in sample.weights])
    return sample.rows, labels, w


def _split(parts: list, k: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The mesoclusters' sampled rows ``(m,)`` and their share of ``k`` (:func:`split_k`), their
    weights summed in global row order."""
    _, labels, w = _in_row_order(parts)
    rows = np.bincount(labels, minlength=m)
    sizes = rows.astype(np.float64) if w is None else np.bincount(labels, weights=w, minlength=m)
    return rows, split_k(k, sizes, rows)


def _bundle_part(shard: Shard, sample: _Sample, labelled: tuple, take: np.ndarray) -> tuple:
    """``(global rows, mesocluster, data, weights)`` of the sampled rows whose mesocluster is in
    ``take`` (``(m,)`` bool)."""
    sel = np.flatnonzero(take[labelled[1]])
    x, w = _host(shard, sample, sel)
    return sample.rows[sel], labelled[1][sel], x, w


def _seed_bundles(shard: Shard, parts: list, bundles: list, meso: list, quotas: np.ndarray, key: int) -> dict:
    """The centres of each of this worker's bundles (``bundles``: their numbers; ``meso``: their
    mesoclusters, ascending): ``{bundle: (k_b, d) float64}``, on the shard's backend."""
    if not bundles:
        return {}
    be = shard.be
    rows, labels, x, w = _in_row_order(parts)
    out = {}
    for b, ids in zip(bundles, meso):
        pos = np.searchsorted(ids, labels)
        mine = np.flatnonzero((pos < len(ids)) & (ids[np.minimum(pos, len(ids) - 1)] == labels))
        order = mine[np.lexsort((rows[mine], pos[mine]))]  # by mesocluster, then global row
        xs = be.asarray(x[order])
        ws = None if w is None else be.asarray(w[order])
        c = seed_batched(xs, quotas[ids], np.random.SeedSequence([key, 2, b]), ws, precision=INIT_PRECISION,
                         groups=pos[order])
        out[b] = be.to_numpy(c).astype(np.float64)
    return out


def init_hierarchical(client: Client, placement: Placement, k: int, seed: int, **options: Any) -> np.ndarray:
    """K centres ``(k, d)`` float64: k-means++ inside the mesoclusters of a sample, each
    mesocluster's share of K in proportion to its weight (module docstring).

    ``options``: other inits' keyword options, not used here.
    """
    n = placement.n_samples
    m = mesoclusters(k)
    key = int(np.random.SeedSequence(seed).generate_state(1)[0])
    rate = min(1.0, float(config.get("init.hierarchical-sample-per-centre")) * k / n)
    rate_c = min(rate, _COARSE_PER_CENTRE * m / n)
    nshard = len(placement.shards)

    def per_shard(fn: Any, *args: Sequence, name: str) -> list:
        return submit_per_shard(client, placement, fn, *args, name=f"daskmeans-hier-{name}")

    # A draw of fewer than k sampled rows (or m subsampled) is drawn again from the next stream:
    # the counts are the same on any chunking, so is the stream that is kept. With rate < 1 the
    # sample's expected size is 16 K, so a second stream is as good as never needed.
    for stream in itertools.count():
        samples = per_shard(_sample, [key] * nshard, [stream] * nshard, [rate] * nshard, name="sample")
        coarse = per_shard(_coarse_part, samples, [rate_c] * nshard, name="coarse-part")
        fut = client.submit(blas_capped(_coarse), coarse, k, m, np.random.SeedSequence([key, 1, stream]),
                            placement.backend, pure=False, key=f"daskmeans-hier-coarse-{uuid.uuid4().hex}")
        centres = result(client, placement, fut)
        if centres is not None:
            break
    advance(1, _STEPS)
    labelled = per_shard(_labels, samples, [centres] * nshard, name="labels")
    rows, quotas = result(client, placement, client.submit(blas_capped(_split), labelled, k, m, pure=False,
                                                          key=f"daskmeans-hier-split-{uuid.uuid4().hex}"))
    advance(2, _STEPS)
    used = np.flatnonzero(quotas > 0)
    meso = [used[b] for b in deal(rows[used].tolist(), min(len(used), int(config.get("init.hierarchical-bundles"))))]
    # Bundles to workers by their rows: which worker seeds a bundle does not change its centres.
    ranks = deal([float(rows[b].sum()) for b in meso], nshard)
    parts = []
    for bundles in ranks:
        take = np.zeros(m, bool)
        for b in bundles:
            take[meso[b]] = True
        parts.append(per_shard(_bundle_part, samples, labelled, [take] * nshard, name="bundle-part")
                     if len(bundles) else [])
    advance(3, _STEPS)
    futs = per_shard(_seed_bundles, parts, [b.tolist() for b in ranks], [[meso[b] for b in r] for r in ranks],
                     [quotas] * nshard, [key] * nshard, name="seed")
    out: dict = {}
    for part in gather(client, futs, placement.workers):
        out.update(part)
    advance(_STEPS, _STEPS)
    return np.concatenate([out[b] for b in range(len(meso))])
