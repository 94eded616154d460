"""AFK-MC²'s Markov chains on one worker's device, in blocks (:mod:`.afkmc2` draws their
proposals; this module runs them).

The distinct proposal rows are gathered on one worker, the first shard's (its own rows taken
where they live, on its device; the other shards' come as host rows through Dask), and the
``K - 1`` chains run there with the backend's array module (CuPy on a GPU worker, NumPy on a
CPU one), in blocks of ``b`` chains, every step enqueued without reading anything back until
the last block:

- the rows are sorted by the last chain that reads them, so the rows that chains from ``e`` on
  still read are a suffix; ``dmin`` holds each row's squared distance to every centre chosen so
  far;
- block ``t`` (chains ``[s, e)``): its proposals' distances to the centres before it, the
  minimum of ``dmin`` and one GEMM of its ``b m`` proposals against block ``t - 1``'s picks
  (the prior); then one launch runs its chains in order (the GPU's ``afkmc2_block``, one CTA,
  ``backends/cuda/afkmc2.cu``; the CPU's Numba ``afkmc2_block``, ``backends/cpu_kernels.py``):
  each chain's proposals' distances to the block's earlier picks (directly, ``sum (x - c)^2``
  in a fixed order), their minimum with the prior, then the Metropolis-Hastings chain; its
  pick goes to a device array the next steps index;
- one GEMM folds block ``t - 1``'s picks into ``dmin`` of the suffix the chains after block
  ``t`` read. It waits only for block ``t``'s prior, and runs beside block ``t``'s chains:
  on a GPU the chains' launch (one CTA, no cuBLAS) goes to a side stream, while every GEMM,
  gather and fold stays on the caller's stream, since cuBLAS gives the same bits run to run
  only where one stream is active on its handle (its "Results reproducibility"), and the same
  centres for a seed come first. No operand depends on the order, so the CPU's one queue
  computes the same values.

Which scheme for the centres before a block (flops at P3: K = 5000, m = 200, d = 408, U = 3e5
distinct rows of the (K - 1) m = 1e6 proposals): the lazy one, each block's b m proposals
against every centre before it, costs ``sum_s b m s d = m K^2 d / 2`` = 1.0e12 FMA; the suffix
one above, each block's picks against the rows later chains read, at most ``U K d`` and about
``0.77 U K d`` = 4.7e11 FMA at P3 (a row drawn ~3.3 times has its last use late: about 77% of
the rows are in the mean suffix), plus the priors' GEMMs, ``K m b d`` = 5.7e9 at b = 14. The
suffix scheme has fewer flops wherever ``U < m K / 2``
(the proposals repeat rows or not: ``U <= (K - 1) m``), and its GEMM shapes (suffix x d x b) are
a function of the proposals alone.

Precision: float64 throughout. A data-centre GPU's float64 GEMM (on its tensor cores) runs at
its float32 rate, so float32 would save only the suffix's bytes (the GEMM reads the suffix
once per block); float64 keeps every distance the host reference's to within rounding, so a
chain's decisions are those of exact arithmetic except within a few ulps of a tie. The result is
deterministic for a seed: it is computed on one device, in a fixed order, with shapes and a block
size that depend only on the proposals (not on the chunking, the worker count or which worker),
so the same seed gives the same centroids bit for bit on any chunking and worker count of a
kind of device; a GPU and a CPU may differ where rounding decides a near-tie (fused multiply-adds
in the GPU's sums).

The block size ``b`` (:func:`chain_block`) balances the two costs per block: the suffix GEMM
reads the suffix once per block (``K / b`` reads of ~0.77 U d 8 bytes) while the in-block work,
``b^2 m d / 2`` FMA per block on one CTA (one SM) or one core, grows with ``b``; a block
costs their sum on one queue and their maximum where the two overlap (the GPU's side stream),
least where they are equal either way. See docs/performance.md,
"AFK-MC²'s chains on one worker's device".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import DaskmeansError

# The GPU cost model's rates (docs/performance.md, "AFK-MC²'s chains on one worker's device";
# the block size is a function of the shapes alone, so these are constants, not the device's
# measurement: a measured rate would make the result depend on the worker that ran it). The
# in-block kernel's float64 FMA rate and a block's fixed cost beside the suffix's read (its
# kernel, the gather of the picks, the GEMM and its minimum: the launches and what waits on
# them), both fitted to the chains' times at blocks of 16, 24 and 32 (profile-afk at P3); the
# device's memory bandwidth.
GPU_SM_FMA = 1.5e10
GPU_BYTES_S = 4.8e12
GPU_BLOCK_LAUNCH_S = 400e-6
# On the CPU the suffix GEMM is bound by flops (not by the suffix's bytes) and its rate falls
# for narrow blocks, while the in-block distances run on one core: the block size measured
# best at 1e5 x 64, K = 1000, m = 200 on 2 shared cores (docs/performance.md).
CPU_BLOCK = 32
# The block size's range: at least a few chains (launches), at most where one CTA's in-block
# work would dominate any GEMM.
MIN_BLOCK, MAX_BLOCK = 4, 256
# The most bytes of a fold's GEMM output ``-2 X C^T`` (rows x b float64) at a time: the rows go
# through it in slabs. Unsliced it is b / d times the rows it folds, beyond the proposals' cap
# (``afkmc2.WORKER_BYTES``) wherever b > d; a constant, so the slabs (the GEMMs' shapes) are a
# function of the proposals alone.
FOLD_BYTES = 64 << 20


def chain_block(gpu: bool, n_rows: int, d: int, m: int) -> int:
    """Chains per block: :data:`CPU_BLOCK` on the CPU; on the GPU the ``b`` where the cost per
    chain of the suffix GEMM's read and launches, ``(0.77 U d 8 / BW + launch) / b``, equals the
    in-block work's, ``b m d / 2`` FMA on one SM (a block costs their sum, or their maximum
    where they overlap: least where they are equal): ``b = sqrt(2 R_sm (0.77 U d 8 / BW +
    launch) / (m d))`` (P3, U = 3e5, d = 408, m = 200: b = 14).

    Parameters
    ----------
    gpu : bool
        The chains run on a GPU.
    n_rows : int
        Distinct proposal rows (U).
    d, m : int
        Features; proposals per chain.

    Returns
    -------
    int in [MIN_BLOCK, MAX_BLOCK]
    """
    if not gpu:
        return CPU_BLOCK
    read_s = 0.77 * n_rows * d * 8 / GPU_BYTES_S + GPU_BLOCK_LAUNCH_S
    b = math.sqrt(2.0 * GPU_SM_FMA * read_s / max(1, m * d))
    return int(min(MAX_BLOCK, max(MIN_BLOCK, round(b))))


def _xp_of(X: Any) -> Any:
    """The array module of ``X``: NumPy's, or CuPy's for a device array (imported only then)."""
    if isinstance(X, np.ndarray):
        return np
    import cupy

    return cupy.get_array_module(X)


def _kernels(xp: Any, m: int, d: int, block: int) -> tuple[Any, Any]:
    """``(run, fold)`` on ``xp``'s device: ``run(X, prior, q, chains, u, picks, s)``, one
    block's chains (at most ``block``; the CPU's Numba kernel, or one CTA of the GPU's), and ``fold(g, xsq, csq,
    dmin)``, a block's picks from their GEMM ``g`` into the distances ``dmin`` (both kernels of
    ``backends/cpu_kernels.py`` or ``backends/cuda/afkmc2.cu``)."""
    if xp is np:
        from ..backends.cpu_kernels import afkmc2_block, afkmc2_fold

        return afkmc2_block, afkmc2_fold
    from ..backends import cuda_src

    kern = cuda_src.afkmc2_kernels(d)
    # The chains' scratch, allocated here on the caller's stream and kept for the whole run:
    # the chains run on the side stream, where nothing is allocated (run_chains).
    work = xp.empty((block, m), xp.float64)

    def run(X: Any, prior: Any, q: Any, chains: Any, u: Any, picks: Any, s: int) -> None:
        b = chains.shape[0]
        kern["afkmc2_block"]((1,), (cuda_src.AFKMC2_THREADS,),
                             (X, prior, q, chains, u, picks, work[:b], np.int32(X.shape[1]), np.int32(m),
                              np.int32(b), np.int64(s)))

    def fold(g: Any, xsq: Any, csq: Any, dmin: Any) -> None:
        g = xp.ascontiguousarray(g)  # the kernel reads rows of b (cuBLAS's output already is)
        n, b = g.shape
        kern["afkmc2_fold"]((max(1, min(-(-n // 256), 8192)),), (256,), (g, xsq, csq, dmin, np.int64(n), np.int32(b)))

    return run, fold


def run_chains(X: Any, c1: np.ndarray, chains: np.ndarray, q: np.ndarray, u: Any, *,
               block: int | None = None) -> np.ndarray:
    """The K - 1 Metropolis-Hastings chains of AFK-MC², in blocks on ``X``'s device.

    Chain ``i`` starts at its first proposal and moves to its proposal ``y`` from state ``x``
    when ``u * d(x, C)^2 q(y) < d(y, C)^2 q(x)``, ``C`` the centres so far (``c1`` and the
    earlier chains' last states); its last state is centre ``i + 1``. A state at distance 0
    (a centre already) is left for any proposal that is not.

    Block ``t`` (chains ``[s, e)``) reads each proposal's distance to the centres before it as
    the minimum of ``dmin`` (``c1`` and the blocks before ``t - 1``: the suffix folds) and its
    distances to block ``t - 1``'s picks (one GEMM of the block's ``b m`` proposals against
    them: the prior), then its own chains' picks in its launch. Block ``t - 1``'s fold into
    ``dmin`` (for the chains after block ``t``) waits only for block ``t``'s prior to have read
    ``dmin``. On a GPU the chains' launch (one CTA: the rest of the device idle) runs on a side
    stream, beside block ``t - 1``'s fold into ``dmin``, which it does not read; every GEMM,
    gather and fold stays on the caller's stream, in that order, since cuBLAS gives the same
    bits run to run only with one stream active on its handle. Nothing is allocated on the side
    stream, and what its launch reads is kept until the caller's stream has waited for it. The
    values and their order are those of one queue: the CPU computes the same.

    Parameters
    ----------
    X : array (U, d), float64, NumPy or CuPy
        The distinct proposal rows; the chains run where they are.
    c1 : ndarray, shape (d,), float64
        The first centre.
    chains : ndarray of int, shape (K - 1, m)
        Each chain's proposals, as rows of ``X``.
    q : ndarray, shape (U,), float64
        Each row's proposal probability (positive).
    u : array, shape (K - 1, m - 1), float64 (host or ``X``'s device)
        The acceptance uniforms.
    block : int, optional
        Chains per block (:func:`chain_block` by default).

    Returns
    -------
    ndarray of int64, shape (K - 1,)
        Each chain's last state, a row of ``X`` (host).
    """
    xp = _xp_of(X)
    nchain, m = chains.shape
    U, d = X.shape
    b = int(block) if block is not None else chain_block(xp is not np, U, d, m)
    if b < 1:
        raise ValueError(f"block={b} should be >= 1")
    # Rows by the last chain that reads them (host, from the proposals alone): the distances
    # the chains from e on still need are then a suffix, whose start per block is known here.
    chains = np.asarray(chains, np.int64)
    last = np.full(U, -1, np.int64)
    np.maximum.at(last, chains.ravel(), np.repeat(np.arange(nchain), m))
    order = np.argsort(last, kind="stable")
    where = np.empty_like(order)
    where[order] = np.arange(U)
    starts = np.arange(0, nchain, b)
    ends = np.minimum(starts + b, nchain)
    suffix = np.searchsorted(last[order], ends)  # rows that chains from e on read: [suffix, U)

    X = X[xp.asarray(order)]  # on X's device
    q_d = xp.asarray(np.asarray(q, np.float64)[order])
    chains_d = xp.asarray(where[chains])
    u_d = xp.ascontiguousarray(xp.asarray(u, xp.float64).reshape(nchain, max(m - 1, 0)))
    xsq = xp.einsum("nd,nd->n", X, X)
    picks = xp.zeros(nchain, xp.int64)
    run, fold = _kernels(xp, m, d, min(b, nchain))

    def fold_rows(C: Any, rows: Any, xsq_rows: Any, into: Any) -> None:
        """The centres ``C`` into ``into``, the distances of ``rows``, by slabs of rows whose
        GEMM output fits :data:`FOLD_BYTES`."""
        ct, csq = -2.0 * C.T, xp.einsum("kd,kd->k", C, C)
        slab = max(1, FOLD_BYTES // (8 * C.shape[0]))
        for a in range(0, rows.shape[0], slab):
            fold(rows[a:a + slab] @ ct, xsq_rows[a:a + slab], csq, into[a:a + slab])

    def fold_picks(s: int, e: int, rows: Any, xsq_rows: Any, into: Any) -> None:
        """Chains ``[s, e)``'s picks into ``into`` (:func:`fold_rows`)."""
        fold_rows(X[picks[s:e]], rows, xsq_rows, into)

    dmin = xp.full(U, np.inf)  # the distances to c1, by the same fold as every later centre's
    fold_rows(xp.asarray(c1, xp.float64).reshape(1, d), X, xsq, dmin)

    side = None if xp is np else _side_stream()
    main = None if xp is np else xp.cuda.get_current_stream()
    chained = None  # the event of the last block's chains on the side stream
    try:
        for t, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
            if chained is not None:  # block t - 1's picks are read below, and its operands freed
                main.wait_event(chained)
            idx = chains_d[s:e]
            prior = dmin[idx]  # (e - s, m), a new array: dmin holds c1 and the blocks before t - 1
            if t > 0:  # block t - 1's picks: distances of this block's proposals alone
                flat = idx.ravel()
                fold_picks(int(starts[t - 1]), s, X[flat], xsq[flat], prior.reshape(-1))
            if side is None:
                run(X, prior, q_d, idx, u_d[s:e], picks, s)
            else:
                side.wait_event(main.record())
                with side:
                    run(X, prior, q_d, idx, u_d[s:e], picks, s)
                chained = side.record()
            lo = int(suffix[t])
            if t > 0 and lo < U:  # block t - 1's picks into the rows the chains after block t read
                fold_picks(int(starts[t - 1]), s, X[lo:], xsq[lo:], dmin[lo:])
    finally:
        # also on an error: the chains' operands go back to the caller's stream's pool only
        # once their launch is done with them
        if chained is not None:
            main.wait_event(chained)
    picked = picks if xp is np else picks.get()  # the one read back
    return order[picked]


_SIDE: dict = {}


def _side_stream() -> Any:
    """The current device's stream for the chains' launches (one per device and process:
    nothing is allocated on it, so CuPy's pool keeps nothing for it)."""
    import cupy

    dev = cupy.cuda.Device().id
    if dev not in _SIDE:
        _SIDE[dev] = cupy.cuda.Stream(non_blocking=True)
    return _SIDE[dev]


# ---------------------------------------------------------------- on the chosen worker


def put_rows(X: Any, uniq: np.ndarray, idx: np.ndarray, rows_of: Any) -> None:
    """``X[i] =`` the row of global index ``uniq[i]``, for the global rows ``idx`` (sorted, in
    ``uniq``), whose values ``rows_of(a, b)`` gives for ``idx[a:b]`` (host or ``X``'s device,
    any dtype): in slices whose float64 copy stays within :data:`FOLD_BYTES`, so that putting
    the rows together holds little beside ``X``."""
    xp = _xp_of(X)
    pos = np.searchsorted(uniq, idx)
    step = max(1, FOLD_BYTES // (8 * max(1, X.shape[1])))
    for a in range(0, len(pos), step):
        X[xp.asarray(pos[a:a + step])] = xp.asarray(rows_of(a, a + step), xp.float64)


def put_own_rows(shard: Any, uniq: np.ndarray, X: Any) -> None:
    """:func:`put_rows` of the rows of ``uniq`` (sorted) that ``shard`` holds: from its blocks
    on its device where they live there (the device tier: indexed in place, no host copy),
    else read as the tier reads chosen rows (:func:`.rows.chunk_rows`) and copied to the
    device, a chunk at a time."""
    from .rows import chunk_rows, rows_by_chunk

    xp = shard.be.xp
    picks = rows_by_chunk(shard, uniq)
    if not picks:
        return
    tier = shard.tier
    if tier.resident and tier.resident_backend(shard.backend) == shard.backend:
        if not shard.pinned:  # as a pass would: check the blocks before use
            shard.pin_resident()
        for j in sorted(picks):
            loc, block = picks[j], shard.blocks[j]
            put_rows(X, uniq, shard.offsets[j] + loc, lambda a, b, loc=loc, block=block: block[xp.asarray(loc[a:b])])
    else:
        got = chunk_rows(shard, picks)
        for j in sorted(picks):
            put_rows(X, uniq, shard.offsets[j] + picks[j], lambda a, b, rows=got[j]: rows[a:b])


def chains_bytes(n_rows: int, d: int, n_chains: int, m: int, block: int) -> int:
    """What the chains hold on their worker's device at most (bytes): the ``n_rows`` distinct
    proposal rows of ``d`` float64 twice (as put together, then sorted by last use), four
    8-byte values a row (norms, distances so far, ``q``, the order), each chain's ``m``
    proposals, ``m - 1`` uniforms and pick, a block's ``block x m`` proposal rows, their
    distances and the chains' scratch, and one fold's GEMM output (:data:`FOLD_BYTES`).
    Putting the rows together holds less: the rows once and slices within :data:`FOLD_BYTES`
    (:func:`put_rows`)."""
    return 8 * (2 * n_rows * d + 4 * n_rows + n_chains * 2 * m + block * m * (d + 3)) + FOLD_BYTES


def check_device_memory(budget: Any, n_rows: int, d: int, n_chains: int, m: int, block: int) -> None:
    """Refuse, before allocating, chains that the worker's device cannot hold (``budget``: the
    backend's :class:`~daskmeans.backends.protocol.DeviceBudget`, None on a CPU worker: host
    memory is the proposals' cap's, ``afkmc2.WORKER_BYTES``)."""
    if budget is None:
        return
    need = chains_bytes(n_rows, d, n_chains, m, block)
    if need > budget.free:
        raise DaskmeansError(
            f"afk-mc2's chains need {need / 2**30:.2f} GiB on the device of the worker that runs them "
            f"({n_rows} distinct proposal rows x {d} float64, held twice, and {n_chains} chains of {m}), "
            f"and {budget.free / 2**30:.2f} GiB are free: a shorter chain (daskmeans.init.afkmc2-chain, now {m}) "
            f"or init='k-means||' needs less")


def chains_on_shard(shard: Any, parts: list, uniq: np.ndarray, c1: np.ndarray, chains: np.ndarray,
                    q: np.ndarray, u_seed: list, block: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The task on the chosen shard's worker: the proposal rows put together on its device,
    the chains run there (:func:`run_chains`).

    Parameters
    ----------
    shard : Shard
        The chosen shard (its worker runs the chains; its own rows are taken in place).
    parts : list of (ndarray (r_i,) int64, ndarray (r_i, d) float64)
        The other shards' rows of ``uniq`` (global indices and host values).
    uniq : ndarray of int64, shape (U,)
        The distinct proposal rows (global, sorted).
    c1 : ndarray (1, d) float64
    chains : ndarray of int64, shape (K - 1, m)
        Each chain's proposals, as positions in ``uniq``.
    q : ndarray (U,) float64
    u_seed : list of int
        The seed of the acceptance uniforms, ``(K - 1, m - 1)`` from
        ``numpy.random.default_rng(u_seed)``, drawn here (not shipped).
    block : int, optional
        Chains per block (:func:`chain_block` by default).

    Returns
    -------
    picked : ndarray of int64, shape (K - 1,)
        Each chain's last state, a position in ``uniq``.
    rows : ndarray (K - 1, d) float64
        Those rows' values (the centres after ``c1``).
    """
    xp = shard.be.xp
    nchain, m = chains.shape
    d = c1.shape[1]
    b = int(block) if block is not None else chain_block(xp is not np, len(uniq), d, m)
    check_device_memory(shard.be.device_budget(), len(uniq), d, nchain, m, b)
    X = xp.empty((len(uniq), d), xp.float64)
    put_own_rows(shard, uniq, X)  # every row of uniq is in exactly one shard's part
    for idx, data in parts:
        put_rows(X, uniq, idx, lambda a, e, data=data: data[a:e])
    u = np.random.default_rng(u_seed).random((nchain, m - 1))
    picked = run_chains(X, c1[0], chains, q, u, block=b)
    got = X[xp.asarray(picked)]
    return picked, got if xp is np else got.get()
