"""AFK-MC² (``init="afk-mc2"``): the chains by hand on a toy, the quantised CDF sampler against
a float64 reference, the same centroids bit for bit on any chunking and worker count (with and
without weights), and the fit's quality against k-means++'s."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from afkchains import random_chains

from daskmeans import KMeans, make_blobs
from daskmeans.engine.placement import place
from daskmeans.io.readers import read
from daskmeans.seeding import REGISTRY, resolve_init
from daskmeans.seeding.afkmc2 import WORKER_BYTES, Cdf, _draw, fit_chain, init_afkmc2, quantum_exp
from daskmeans.backends import cpu_kernels
from daskmeans.backends.cpu_kernels import afkmc2_block
from daskmeans.seeding.afkmc2_chains import CPU_BLOCK, chain_block, run_chains


def _placed(client, X, chunks, w=None):
    rows = -(-len(X) // chunks)
    Xd = read(da.from_array(X, chunks=(rows, -1)))
    assert Xd.numblocks[0] == chunks
    wd = None if w is None else da.from_array(w, chunks=rows)
    placed = place(client, Xd, "numpy", sample_weight=wd, balance=False)  # the chunks as cut here
    assert len(placed.row_chunks) == chunks
    return placed


def test_registered_with_its_setting():
    assert REGISTRY["afk-mc2"].load() is init_afkmc2
    assert dask.config.get("daskmeans.init.afkmc2-chain") == 200


# ---------------------------------------------------------------- the chains by hand


def test_four_separated_points_are_the_four_centres(client):
    """K = 4 on 4 distinct points (repeated): once a point is a centre it has d^2 = 0, and a
    chain leaves such a state for any other point it is offered; 200 proposals always offer
    one of the points left (q gives each at least 1/8 · 1/4)."""
    pts = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0], [100.0, 100.0]])
    X = np.repeat(pts, [3, 5, 2, 6], axis=0)
    p = _placed(client, X, 2)
    for seed in range(4):
        c = init_afkmc2(client, p, 4, seed)
        assert c.shape == (4, 2) and c.dtype == np.float64
        assert sorted(map(tuple, c)) == sorted(map(tuple, pts)), seed


def test_chain_of_one_is_the_proposals(client):
    """m = 1: no move, each centre is its chain's one proposal, the seed's draw from q."""
    X = np.random.default_rng(0).standard_normal((300, 3))
    p = _placed(client, X, 3)
    c = init_afkmc2(client, p, 6, 5, chain_length=1)
    seed = int(np.random.SeedSequence(5).generate_state(1)[0])
    c1 = X[np.random.default_rng([seed, 0]).integers(0, 300, size=1)[0]]
    np.testing.assert_array_equal(c[0], c1)
    # q by hand (float64): half d^2 to c1, half uniform; the seed's halves and targets. Each d^2
    # is the backend's exact one (its fixed-order float64 sum, whose products a CPU with FMA
    # fuses): the proposal's integers, and so the targets' range, follow its every bit.
    d2 = np.array([cpu_kernels.owner_sqdist(x, c1) for x in X])
    exp = quantum_exp(d2.max(), 300)
    ints = np.rint(d2 * 2.0 ** -exp).astype(np.int64)
    ends = np.cumsum(ints)
    rng = np.random.default_rng([seed, 1])
    half = rng.random(5) < 0.5
    ta, tw = rng.integers(0, ends[-1], size=5), rng.integers(0, 300, size=5)
    want = np.where(half, np.searchsorted(ends, ta, side="right"), tw)
    np.testing.assert_array_equal(c[1:], X[want])


def test_run_chains_by_hand():
    """Two chains on the line, proposals 0, 1, 2: chain 1 from state 0 (d^2 = 1 to c1 = 0) moves
    to proposal 2 (d^2 = 9) when u * 1 * q2 < 9 * q0; chain 2 must then see centre 3 too."""
    X = np.array([[1.0], [2.0], [3.0]])
    q = np.array([0.5, 0.25, 0.25])
    chains = np.array([[0, 2], [1, 2]])
    got = run_chains(X, np.zeros(1), chains, q, np.array([[0.9], [0.5]]))
    # chain 1: 0.9 * 1 * 0.25 < 9 * 0.5: moves to row 2 (x = 3). chain 2: state row 1 (x = 2,
    # d^2 = min(4, 1) = 1), proposal row 2, now a centre (d^2 = 0): 0.5 * 1 * 0.25 < 0: stays.
    np.testing.assert_array_equal(got, [2, 1])
    got = run_chains(X, np.zeros(1), chains, q, np.array([[0.9], [0.5]]) * 0 + 1.0)
    # u = 1 accepts where d^2(y) q(x) > d^2(x) q(y): 9 * 0.5 > 1 * 0.25 moves; 0 < 0.25 stays.
    np.testing.assert_array_equal(got, [2, 1])


def run_chains_reference(X, c1, chains, q, u):
    """The chains one after another in float64, each proposal's squared distance to every
    centre so far computed directly (no blocks, no GEMM, no suffix): the rule of
    :func:`run_chains`, written plainly."""
    centres = [np.asarray(c1, np.float64)]
    picked = []
    for i, idx in enumerate(chains):
        d2 = np.min([((X[idx] - c) ** 2).sum(axis=1) for c in centres], axis=0)
        x = 0
        for j in range(1, len(idx)):
            if u[i, j - 1] * d2[x] * q[idx[j]] < d2[j] * q[idx[x]]:
                x = j
        picked.append(idx[x])
        centres.append(X[idx[x]])
    return np.array(picked, np.int64)


# Three chains of four proposals on the line (rows 0, 1, 3, 6, 10; c1 = 0), by hand:
# chain 0, proposals rows 1, 2, 0, 4 (d^2 1, 9, 0, 100; q .2, .3, .1, .2), u .5 .5 .5: from row 1,
#   .5 * 1 * .3 < 9 * .2 takes row 2; .5 * 9 * .1 < 0 * .3 keeps it; .5 * 9 * .2 < 100 * .3 takes
#   row 4 (x = 10): the pick.
# chain 1, rows 3, 4, 2, 1; d^2 with centre 10: 16, 0, 9, 1; u .9 .1 .15: row 4 (a centre) is
#   refused (.9 * 16 * .2 < 0); .1 * 16 * .3 < 9 * .2 takes row 2; .15 * 9 * .2 = .27 < 1 * .3
#   takes row 1 (x = 1; with q uniform, 1.35 < 1 would not): the pick.
# chain 2, rows 4, 2, 3, 1; d^2 with centres 10 and 1: 0, 4, 16, 0; u .3 .99 .99: the state at
#   distance 0 is left for row 2 (0 < 4 * .2), then row 3 (.99 * 4 * .2 < 16 * .3); row 1, a
#   centre, is refused: the pick is row 3 (x = 6).
TOY_X = np.array([[0.0], [1.0], [3.0], [6.0], [10.0]])
TOY_Q = np.array([0.1, 0.2, 0.3, 0.2, 0.2])
TOY_CHAINS = np.array([[1, 2, 0, 4], [3, 4, 2, 1], [4, 2, 3, 1]], np.int64)
TOY_U = np.array([[0.5, 0.5, 0.5], [0.9, 0.1, 0.15], [0.3, 0.99, 0.99]])


def test_in_block_chains_by_hand():
    """One block of three chains in the compiled kernel: each chain sees the block's earlier
    picks (the prior holds the proposals' distances to c1 alone)."""
    picks = np.full(5, -1, np.int64)
    afkmc2_block(TOY_X, (TOY_X[:, 0] ** 2)[TOY_CHAINS], TOY_Q, TOY_CHAINS, TOY_U, picks, 2)
    np.testing.assert_array_equal(picks, [-1, -1, 4, 1, 3])  # written at [s, s + b) only
    for block in (1, 2, 3, 64):  # every split into blocks: in the block, or folded by the GEMM
        np.testing.assert_array_equal(run_chains(TOY_X, np.zeros(1), TOY_CHAINS, TOY_Q, TOY_U, block=block),
                                      [4, 1, 3], err_msg=str(block))
    np.testing.assert_array_equal(run_chains_reference(TOY_X, np.zeros(1), TOY_CHAINS, TOY_Q, TOY_U), [4, 1, 3])


@pytest.mark.parametrize("integers", [True, False])
def test_blocks_give_the_reference_chains(integers):
    """Small integers: every distance exact in any order, so every block size gives the plain
    float64 chains' picks exactly; Gaussian rows (these seeds): no decision within rounding of
    a tie either."""
    rng = np.random.default_rng(4)
    X = rng.integers(-20, 20, (2000, 6)).astype(np.float64) if integers else rng.standard_normal((2000, 6))
    Xu, c1, chains, qu, u = random_chains(X, 60, 25, 8)
    ref = run_chains_reference(Xu, c1, chains, qu, u)
    assert len(np.unique(ref)) > 50  # the chains do move
    for block in (1, 5, 16, CPU_BLOCK, 59, 64):
        np.testing.assert_array_equal(run_chains(Xu, c1, chains, qu, u, block=block), ref, err_msg=str(block))


def test_chain_of_one_proposal_and_the_block_sizes():
    """m = 1 (no uniforms): each pick is its chain's proposal. The GPU's block size is a
    function of the shapes alone, within its bounds (P3: sqrt(2 x 6.8e9 x (0.77 x 3e5 x 408 x 8 /
    4.8e12 + 1e-4) / (200 x 408)) = 6.5, so 7)."""
    X = np.arange(12.0).reshape(6, 2)
    chains = np.array([[3], [5], [0]])
    np.testing.assert_array_equal(run_chains(X, X[1], chains, np.full(6, 1 / 6), np.empty((3, 0))), [3, 5, 0])
    assert chain_block(True, 300_000, 408, 200) == 14
    assert chain_block(True, 10, 2, 10**6) == 4 and chain_block(True, 10**9, 1, 1) == 256
    assert chain_block(False, 300_000, 408, 200) == CPU_BLOCK
    from daskmeans.backends.cuda_src import afkmc2_dch

    # the GPU kernel's columns per lane in registers: ceil(d / 32) up to 512 features
    assert [afkmc2_dch(d) for d in (1, 32, 33, 408, 512, 513, 4096)] == [1, 1, 2, 13, 16, 0, 0]
    with pytest.raises(ValueError, match="block=0 should be >= 1"):
        run_chains(X, X[1], chains, np.full(6, 1 / 6), np.empty((3, 0)), block=0)


# ---------------------------------------------------------------- the quantised CDF sampler


def test_quantum_bound():
    """Every rounded mass fits int64 sums of n rows, and the step is within 2^-61 of the
    largest mass times n (the sampler's error bound: half a step per row)."""
    for top, n in ((1.0, 1), (3.7e5, 10**6), (1e-200, 7), (2.0**40, 2**20)):
        e = quantum_exp(top, n)
        assert n * top < 2.0 ** (e + 62) <= 2 * n * top
        assert n * (top * 2.0 ** -e + 0.5) < 2.0**63
    assert quantum_exp(0.0, 10) == quantum_exp(0.0, 1)  # no mass: the finest step, every row 0


def test_sampler_matches_a_float64_reference(client):
    """Targets by u in [0, 1): the integer CDF over 3 chunks picks the row that float64's CDF
    picks for the same u, for every u not within a quantum of a boundary (checked here)."""
    # small integers: every d^2 (to c1 = 0, the pass's) exact in any order of the kernel's sums
    X = np.random.default_rng(3).integers(0, 16, (500, 2)).astype(np.float64)
    mass = (X ** 2).sum(axis=1)
    u = np.random.default_rng(9).random(2000)
    ref = np.searchsorted(np.cumsum(mass) / mass.sum(), u, side="right")
    exp = quantum_exp(mass.max(), len(X))
    ints = np.rint(mass * 2.0 ** -exp).astype(np.int64)
    total = int(ints.sum())
    targets = np.floor(u * total).astype(np.int64)
    # the float and integer boundaries of each row differ by at most n half-steps, a relative
    # n * 2^-62 of the total or so: no u lands that close to one
    bounds = np.cumsum(mass) / mass.sum()
    gap = np.abs(u[:, None] - bounds[None, :]).min(axis=1)
    assert gap.min() > len(X) * 2.0 ** -50
    p = _placed(client, X, 3)
    from daskmeans.seeding.afkmc2 import _cdf, _d2_state
    from daskmeans.seeding import rows

    states = rows.submit_per_shard(client, p, _d2_state, [np.zeros((1, 2))] * len(p.shards), [None] * len(p.shards),
                                   name="test-afkmc2-d2")
    cdf = _cdf(client, p, states, "d2", mass.max())
    assert isinstance(cdf, Cdf) and cdf.total == total and cdf.exp == exp
    np.testing.assert_array_equal(_draw(client, p, states, cdf, targets), ref)


# ---------------------------------------------------------------- properties


@pytest.fixture(scope="module")
def blobs():
    X, _ = make_blobs(3000, 5, 12, random_state=2, dtype="float64")
    return X.compute()


def test_same_centroids_on_any_chunking_and_worker_count(client, client1, client3, blobs):
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(blobs))
    runs = {}
    for chunks in (1, 3):
        for c in (client, client1, client3):
            for weighted in (False, True):
                p = _placed(c, blobs, chunks, w if weighted else None)
                runs[chunks, len(c.nthreads()), weighted] = init_afkmc2(c, p, 12, 7, chain_length=50)
    ref = runs[1, 2, False]
    assert ref.shape == (12, 5) and len(np.unique(ref, axis=0)) == 12
    assert {tuple(r) for r in ref} <= {tuple(r) for r in blobs}  # seeds are rows
    for key, c0 in runs.items():
        np.testing.assert_array_equal(c0, runs[1, 2, key[2]], err_msg=str(key))
    assert not np.array_equal(runs[1, 2, True], ref)


@pytest.mark.parametrize("tier", ["host", "storage"])
def test_same_centroids_in_every_tier(client, blobs, tier):
    """The chains' worker takes its own rows where its tier keeps them (the device tier's
    blocks in place; the storage tier reads them): the same rows, the same centroids."""
    Xd = read(da.from_array(blobs, chunks=(1000, -1)))
    ref = init_afkmc2(client, place(client, Xd, "numpy", balance=False), 12, 3, chain_length=40)
    got = init_afkmc2(client, place(client, Xd, "numpy", tier=tier, balance=False), 12, 3, chain_length=40)
    np.testing.assert_array_equal(got, ref)


def test_seed_decides_the_centroids(client, blobs):
    p = _placed(client, blobs, 2)
    a, b = init_afkmc2(client, p, 8, 1), init_afkmc2(client, p, 8, 1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, init_afkmc2(client, p, 8, 2))
    with dask.config.set({"daskmeans.init.afkmc2-chain": 20}):
        np.testing.assert_array_equal(resolve_init(client, p, "afk-mc2", 8, 1),
                                      init_afkmc2(client, p, 8, 1, chain_length=20))


def test_rows_of_weight_zero_are_never_centres(client, blobs):
    w = np.ones(len(blobs))
    w[::2] = 0.0  # half the rows, in every blob
    p = _placed(client, blobs, 3, w)
    allowed = {tuple(r) for r in blobs[w > 0]}
    for seed in range(3):
        c = init_afkmc2(client, p, 12, seed, chain_length=30)
        assert {tuple(r) for r in c} <= allowed


def test_a_shorter_chain_where_the_proposals_would_not_fit():
    assert fit_chain(5000, 408, 200) == 200  # P3: 3.3 GB
    m = fit_chain(40_000, 480, 200)
    assert m == WORKER_BYTES // (39_999 * 480 * 8) == 27
    assert fit_chain(10**9, 10**4, 200) == 1


@pytest.mark.parametrize("centers, tolerance", [(100, 1.05), (20, 1.01)])
def test_fit_inertia_within_a_few_percent_of_kmeans_plusplus(client, centers, tolerance):
    """K = 40 on more blobs than K and on fewer: the fit from AFK-MC²'s centres ends within a
    few % of the fit from k-means++'s (median of 3 seeds, 20 iterations). (With exactly as many
    separated blobs as K, D^2 draws without k-means++'s local trials miss blobs: design.md, "The
    AFK-MC² init".)"""
    X, _ = make_blobs(20_000, 8, centers, random_state=5)
    X = X.compute()
    out = {}
    for init in ("afk-mc2", "k-means++"):
        out[init] = np.median([KMeans(40, init=init, n_init=1, max_iter=20, random_state=s, client=client)
                               .fit(X).inertia_ for s in range(3)])
    assert out["afk-mc2"] <= tolerance * out["k-means++"], out


def test_the_block_size_the_docs_state_at_p3_is_the_one_chosen():
    """``chain_block``'s docstring, the module's and design.md state the GPU's block size at
    P3 (U = 3e5, d = 408, m = 200): that figure is the one the cost model gives."""
    import re
    from pathlib import Path

    from daskmeans.seeding import afkmc2_chains

    b = chain_block(True, 300_000, 408, 200)
    assert re.findall(r"\bb = (\d+)\)", afkmc2_chains.chain_block.__doc__) == [str(b)]
    assert re.findall(r"= [\d.e]+ at b = (\d+)\b", afkmc2_chains.__doc__) == [str(b)]
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    assert re.findall(r"from the cost model on a GPU,\s+(\d+) at P3", design) == [str(b)]


@pytest.mark.parametrize("block", [1, 5, CPU_BLOCK])
def test_the_folds_gemm_output_is_bounded(monkeypatch, block):
    """A block's fold reads its GEMM ``-2 X C^T`` (rows x b float64) in slabs of at most
    ``FOLD_BYTES``: at small d it would otherwise be b / d times the rows themselves, beyond
    the cap the proposals are shortened to (``afkmc2.WORKER_BYTES``). The picks are the
    reference's for every slab size."""
    from daskmeans.seeding import afkmc2_chains

    rng = np.random.default_rng(4)
    X = rng.integers(-20, 20, (2000, 2)).astype(np.float64)  # d = 2 < b: the GEMM's output the larger
    Xu, c1, chains, qu, u = random_chains(X, 60, 25, 8)
    ref = run_chains_reference(Xu, c1, chains, qu, u)
    real = afkmc2_chains._kernels
    for bound in (8 * block * 37, 8 * block, 1):  # slabs of 37 rows, of one row, and below one row
        seen = []

        def kernels(xp, m, d, block):
            run, fold = real(xp, m, d, block)

            def fold_seen(g, xsq, csq, dmin):
                seen.append(g.nbytes)
                fold(g, xsq, csq, dmin)

            return run, fold_seen

        monkeypatch.setattr(afkmc2_chains, "FOLD_BYTES", bound)
        monkeypatch.setattr(afkmc2_chains, "_kernels", kernels)
        np.testing.assert_array_equal(run_chains(Xu, c1, chains, qu, u, block=block), ref, err_msg=str(bound))
        assert seen and max(seen) <= max(bound, 8 * block), (bound, max(seen))


def test_chains_that_the_device_cannot_hold_are_refused_before_allocating():
    """The chains' device bytes by hand (10 rows x 4 float64 twice, 4 values a row, 2 chains of
    3 proposals, 2 uniforms and a pick, a block of 2 chains' 3 proposal rows with their norms,
    distances and the chains' scratch, one fold's output), and a device with less free is refused with the need,
    the free memory and what needs less; a CPU worker (no device budget) is not. (That the
    chains hold no more on a GPU: tests/gpu/test_gpu_afkmc2.py.)"""
    from daskmeans.backends.protocol import DeviceBudget
    from daskmeans.errors import DaskmeansError
    from daskmeans.seeding.afkmc2_chains import FOLD_BYTES, chains_bytes, check_device_memory

    need = 8 * (2 * 10 * 4 + 4 * 10 + 2 * 6 + 2 * 3 * (4 + 3)) + FOLD_BYTES
    assert chains_bytes(10, 4, 2, 3, 2) == need
    check_device_memory(None, 10, 4, 2, 3, 2)
    check_device_memory(DeviceBudget(free=need, total=2 * need), 10, 4, 2, 3, 2)
    with pytest.raises(DaskmeansError, match=r"afk-mc2's chains need 0\.06 GiB on the device of the worker that runs "
                                             r"them \(10 distinct proposal rows x 4 float64, held twice, and 2 chains "
                                             r"of 3\), and 0\.06 GiB are free: a shorter chain "
                                             r"\(daskmeans.init.afkmc2-chain, now 3\) or init='k-means\|\|' needs less"):
        check_device_memory(DeviceBudget(free=need - 1, total=2 * need), 10, 4, 2, 3, 2)

def test_rows_are_put_together_in_slices_within_the_fold_bound(monkeypatch):
    """put_rows: each global row lands at its place in ``uniq``, in slices whose float64 copy
    stays within FOLD_BYTES (whole rows, at least one), whatever dtype the values come in."""
    from daskmeans.seeding import afkmc2_chains

    monkeypatch.setattr(afkmc2_chains, "FOLD_BYTES", 8 * 5 * 3)  # three rows of 5 float64
    uniq = np.array([2, 5, 7, 11, 13, 17, 19, 23])
    idx = np.array([5, 11, 13, 17, 23])
    values = np.arange(25, dtype=np.float32).reshape(5, 5)
    seen = []

    def rows_of(a, b):
        seen.append((a, b))
        return values[a:b]

    X = np.full((8, 5), -1.0)
    afkmc2_chains.put_rows(X, uniq, idx, rows_of)
    assert seen == [(0, 3), (3, 6)]
    np.testing.assert_array_equal(X[[1, 3, 4, 5, 7]], values.astype(np.float64))
    assert (X[[0, 2, 6]] == -1).all()
    monkeypatch.setattr(afkmc2_chains, "FOLD_BYTES", 1)  # less than a row: a row at a time
    seen.clear()
    afkmc2_chains.put_rows(X, uniq, idx[:2], rows_of)
    assert seen == [(0, 1), (1, 2)]
