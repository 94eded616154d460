"""CuPy's own kernels that a GPU fit launches, compiled ahead in separate processes.

CuPy compiles each elementwise, reduction, indexing and sorting kernel the first time it is
launched with a new signature (its dtypes, its number of dimensions, its contiguity), through
NVRTC, and caches the binary on disk (``CUPY_CACHE_DIR``). A first fit on a machine with an
empty cache launches dozens of them one after another from the moments pass, the init and the
first iterations, each compile on the fit's critical path (docs/performance.md, "A first fit"). Threads do not help: most of a compile of
CuPy's is Python work under the interpreter lock. This file is a script that
:func:`.cupy_backend.warm` runs in a few processes at once: each goes down :data:`OPS` in the
order the fit needs them and launches, on tiny arrays, every op that no other process has
claimed, so that the fit later loads their kernels from the disk cache and the ops the fit
needs first are compiled first, by whichever process is free (a fixed share per process
left one process's ops for the fit to compile while the others had finished).

It imports only NumPy and CuPy (never ``daskmeans``: a process that imports the package
starts a second slower), and is run by path::

    python gpu_warm_ops.py DTYPE

Each op is the expression a module of the fit evaluates, on arrays of the same dtypes and
dimensions (a kernel's signature holds no sizes, except where CuPy picks another algorithm for
a large array: those ops run at both sizes). ``tests/gpu/test_gpu_warm.py`` checks that a fit
after the warm compiles nothing of CuPy's: an op added to the fit's modules without its line
here fails there with the kernel's name.
"""

from __future__ import annotations

import os
import sys

SMALL, LARGE = 64, 1 << 17  # the sizes below and above CuPy's switch to its large-array algorithms


def _ops(cp, np, dt):  # noqa: C901 - one list
    """The ops, each a function of the row count ``n`` (``SMALL`` or ``LARGE``) or of none."""
    f64, i64, i32, u64 = cp.float64, cp.int64, cp.int32, cp.uint64

    def x2(n=SMALL, d=8):
        return cp.ones((n, d), dt)

    def v(dtype, n=SMALL):
        return cp.ones(n, dtype)

    def moments():  # backends.cupy_backend.moments
        cp.full((), np.iinfo(np.uint64).max, cp.uint64)

    def prepare():  # gpu_gemm.prepare, _max_abs, the centroids' norms
        c = x2()
        c64 = c.astype(f64)
        float(max(c.max(), -c.min()))
        rsq = v(f64)
        float(cp.sqrt(rsq.max()))
        sq = (c64 * c64).sum(axis=1)
        for t in (cp.float32, f64):
            csq = cp.full(SMALL, np.inf, t)
            csq[:8] = sq[:8]
            csq[:3] = csq[cp.arange(3, dtype=i64)]  # gpu_gemm.take: a subset of the prepared rows
        for t in (cp.uint16, cp.float32, dt):
            a = cp.zeros((8, 8), t)
            a[:3] = cp.ones((SMALL, 8), t)[cp.arange(3, dtype=i64)]

    def take_rows():  # seeding.rows: rows of a block by index
        x2()[cp.asarray(np.arange(3, dtype=np.int64))]

    def candidates():  # seeding.kmeans_parallel._candidates: the rounds' parts joined, then the kept ones
        # CuPy joins up to 8 arrays (or large ones) by a copy each, more small ones in one
        # kernel, of its own where they are all of one shape.
        for sizes in ((3, 5), tuple(range(1, 10)), (2,) * 9):
            raw = cp.concatenate([cp.asarray(np.ones((m, 8), dt)) for m in sizes])
            raw[cp.asarray(np.arange(4, dtype=np.int64))]

    def par_update():  # seeding.kmeans_parallel._par_update, _cand_weights
        d2, nearest = cp.full(SMALL, cp.inf), cp.full(SMALL, -1, i64)
        lab, dn = v(i32), v(f64)
        closer = dn < d2
        d2 = cp.where(closer, dn, d2)
        nearest = cp.where(closer, lab.astype(i64) + 3, nearest)
        phi = cp.zeros((), f64)
        phi + d2.sum()
        phi + d2 @ v(f64)
        total = cp.zeros(8, f64)
        total += bin_sums(nearest % 8, None, 8)
        total += bin_sums(nearest % 8, v(f64), 8)

    def par_draws(n):  # seeding.kmeans_parallel._par_draws: the draws from the resident state
        u, d2 = v(f64, n), v(f64, n)
        cp.flatnonzero(u < 0.5)
        # Some rows drawn: CuPy launches its index-writing kernel only where any is nonzero
        # (the incomplete scan's above 512 elements).
        cp.flatnonzero(u < 2.0)
        p = d2 * (3 / 7.0)
        p = p * v(f64, n)
        cp.flatnonzero(u < p)

    def bin_sums(labels, weights, m):  # cupy_backend.bin_sums
        out = cp.zeros(m, f64)
        cp.add.at(out, labels, cp.ones(labels.size, f64) if weights is None else weights)
        return out

    def grid(n):  # numerics.grid.Grid.for_block
        cp.abs(x2(n)).max(axis=0)
        v(f64, n).sum()

    def draw(n):  # seeding.kernels._draw_sorted
        p, u = v(f64, n), 1.0 - v(f64, n)
        exclude = cp.zeros(n, bool)
        live = (p > 0) & ~exclude
        key = cp.where(live, -cp.log(u) / cp.where(live, p, 1.0) + 0.0, u)
        top = cp.where(live, cp.uint64(0), cp.where(exclude, cp.uint64(3 << 62), cp.uint64(1 << 63)))
        order = cp.argsort(key.view(cp.uint64) + top, kind="stable")
        cp.sort(order[:4])
        bool((v(i64, n) < 3).any())

    def seed_batched(n):  # seeding.kernels.seed_batched
        w = v(f64, n).astype(f64)
        d2, dn = v(f64, n), v(f64, n)
        lab = v(i32, n)
        chosen = cp.zeros(n, bool)
        p = w * d2
        pick = cp.arange(0, 4, dtype=i64)
        chosen[pick] = True
        chosen[pick[:1]] = True
        every = cp.concatenate([pick, pick + 4])
        # Many arrays: CuPy's kernels of concatenation (a few arrays are copied slice by slice).
        cp.concatenate([pick] * 40)
        cp.concatenate([pick[: 1 + i % 3] for i in range(40)])
        gain = bin_sums(lab, w * cp.maximum(d2 - dn, 0.0), every.size)
        cp.concatenate([every[cp.sort(cp.argsort(-gain[0:4], kind="stable")[:2])] for _ in range(2)])
        cp.minimum(d2, dn)
        x2(n)[cp.concatenate([pick, pick])]
        del p

    def plusplus():  # seeding.kernels.kmeans_plusplus (greedy, one worker), two steps
        x = cp.asarray(x2(), dtype=f64)
        n = x.shape[0]
        w = cp.ones(n, f64)
        xsq = (x * x).sum(axis=1)

        def sqdist(rows):
            c = x[rows]
            d = (c * c).sum(axis=1)[:, None] - 2 * (c @ x.T) + xsq[None, :]
            return cp.maximum(d, 0.0)

        closest = sqdist(cp.asarray([0]))[0]
        pot = float(closest @ w)
        for _ in range(2):
            cum = cp.cumsum(w * closest)
            r = cp.asarray(np.random.default_rng(0).uniform(size=3) * pot)
            cand = cp.minimum(cp.searchsorted(cum, r), n - 1)
            dist = cp.minimum(closest[None, :], sqdist(cand))
            pots = dist @ w
            best = int(cp.argmin(pots))
            pot = float(pots[best])
            closest = dist[best]
            int(cand[best])
        x[cp.asarray([0, 1])]

    def weighted_lloyd():  # seeding.kernels.weighted_lloyd
        c, new = v(f64).reshape(8, 8), v(f64).reshape(8, 8)
        nonempty = v(i64, 8) > 0
        cp.where(nonempty[:, None], new / cp.where(nonempty, v(f64, 8), 1.0)[:, None], c)
        bool((new == c).all())

    def sums():  # backends.gpu_sums: counts by label, the grid's weights
        counts = cp.zeros(8, u64)
        cp.add.at(counts, v(i32) % 8, np.uint64(1))
        cursor = cp.cumsum(counts) - counts
        counts = counts.astype(i64, copy=False)
        counts << 3
        del cursor

    def small_stats():  # gpu_small: the per-block statistics' partial sums
        cp.ones((4, 2), f64).sum(axis=0)

    def step():  # engine.step.lloyd_step: the int64 buffer
        buf = cp.zeros(64, i64)
        fv = buf.view(f64)
        buf[3] = 1
        buf[0:8] += v(i64, 8)
        fv[9] = cp.ones((), f64)
        buf[10] += cp.asarray(cp.ones((), f64)).astype(i64)
        buf[11] += cp.asarray(cp.ones((), i64)).astype(i64)

    def yinyang(n):  # engine.yinyang and backends.bounds on CuPy (and cupy_backend's bounds' glue)
        k, d, t = 16, 8, 4
        X, cen = x2(n, d), x2(16, d)
        labels = cp.arange(n, dtype=i32) % k
        # bounds.centroid_drift, row_sqnorms, _owner_sq, upper_bounds, owner_inertia
        n64 = cen.astype(f64)
        diff = n64 - cen.astype(f64)
        drift = cp.sqrt((diff * diff).sum(axis=1)) * 1.5
        float(cp.sqrt((n64 * n64).sum(axis=1)).max())
        x64 = X.astype(f64)
        xnorm = (x64 * x64).sum(axis=1)

        def owner_sq(xs, labs):
            out = cp.empty(xs.shape[0], f64)
            dd = xs[0:xs.shape[0]].astype(f64) - cen[labs[0:xs.shape[0]]].astype(f64)
            out[0:xs.shape[0]] = (dd * dd).sum(axis=1)
            return out

        upper = cp.sqrt(owner_sq(X, labels)) * 1.5
        owner_sq(X, labels).sum()
        (v(dt, n).astype(f64) * owner_sq(X, labels)).sum()  # sample weights are the data's dtype
        # bounds.yinyang_filter
        lower = cp.ones((n, t), f64)
        gdrift = cp.asarray(np.ones(t), dtype=None)
        u = (upper + drift[labels]) * 1.5
        lower -= gdrift[None, :]
        cp.maximum(lower, 0.0, out=lower)
        lower *= 0.5
        lmin = lower.min(axis=1)
        xn = cp.sqrt(xnorm) * 1.5
        e = 0.5 * (2.0 * xn * 3.0 + 3.0 * 3.0)

        def certain(uu, lm, ee):
            return (lm > uu) & ((lm - uu) * (lm + uu) * 0.5 > ee)

        idx = cp.flatnonzero(~certain(u, lmin, e))
        idx = cp.arange(0, n, 2, dtype=i64)
        tight = cp.sqrt(owner_sq(X[idx], labels[idx])) * 1.5
        u[idx] = tight
        idx = idx[~certain(tight, lmin[idx], e[idx])]
        upper[...] = u
        cand = idx.astype(i64)
        # bounds.add_label_sums (weighted, with the squared norms' sums)
        order = cp.argsort(labels, kind="stable")
        lab = labels[order]
        head = cp.concatenate([cp.ones(1, bool), lab[1:] != lab[:-1]])
        starts = cp.flatnonzero(head)
        ends = cp.concatenate([starts[1:], cp.asarray([n])])
        segs = lab[starts]
        scales = cp.asarray(np.ldexp(1.0, -np.zeros(d, np.int64)))
        w = v(dt, n).astype(f64)[order]
        acc = cp.zeros((segs.shape[0], d), i64)
        rows = X[order[0:n]].astype(f64)
        vals = cp.rint((w[0:n, None] * rows) * scales).astype(i64)
        cs = cp.cumsum(vals, axis=0)
        lo = cp.clip(starts - 0, 0, n)
        hi = cp.clip(ends - 0, 0, n)
        csz = cp.concatenate([cp.zeros((1, d), i64), cs])
        acc += csz[hi] - csz[lo]
        cp.rint(rows * scales).astype(i64)
        sums, weights, counts = cp.zeros((k, d), i64), cp.zeros(k, i64), cp.zeros(k, i64)
        sums[segs] += -1 * acc
        counts[segs] += 1 * (ends - starts)
        iw = cp.rint(w * 0.5).astype(i64)
        csw = cp.concatenate([cp.zeros(1, i64), cp.cumsum(iw)])
        weights[segs] += -1 * (csw[ends] - csw[starts])
        # (the squared norms' sums are the CPU's: the GPU's inertia is per chunk)
        # engine.yinyang's step and probe: moved rows, kept bounds and labels by index
        old = cp.arange(n, dtype=i32) % (k - 1)  # some rows moved
        out = cp.empty(n, i32)
        out[...] = old
        xu = X[cand]
        xnorm[cand]
        upper[cand] = upper[cand]
        lower[cand] = lower[cand]
        moved = cp.flatnonzero(labels[cand] != old[cand])
        xu[moved]
        v(dt, n)[cand[moved]]
        xnorm[cand][moved]
        out[cand[moved]] = labels[cand][moved]
        cp.count_nonzero(out != old)
        X[cp.arange(0, n, 64, dtype=i64)]
        # engine.yinyang.centroid_groups, cupy_backend._grouped and assign_bounds' own-centroid positions
        c = cen.astype(f64)
        centres = c[cp.asarray(np.linspace(0, k - 1, t).round().astype(np.int64))]
        csqc = (c * c).sum(axis=1)
        group = cp.zeros(k, i64)
        zsq = (centres * centres).sum(axis=1)
        dist = csqc[0:k, None] - 2.0 * (c[0:k] @ centres.T) + zsq[None, :]
        group[0:k] = dist.argmin(axis=1)
        gorder = cp.argsort(group, kind="stable")
        g_sorted = group[gorder]
        ccs = cp.concatenate([cp.zeros((1, d), f64), cp.cumsum(c[gorder], axis=0)])
        gcounts = cp.bincount(g_sorted, minlength=t)
        gends = cp.cumsum(gcounts)
        gstarts = gends - gcounts
        filled = gcounts > 0
        means = (ccs[gends] - ccs[gstarts]) / cp.maximum(gcounts, 1)[:, None]
        cp.where(filled[:, None], means, centres)
        group_of = group.astype(i32)
        go = cp.argsort(group_of, kind="stable")
        gst = cp.zeros(t + 1, i32)
        gst[1:] = cp.cumsum(cp.bincount(group_of, minlength=t)[:t])
        pos = cp.empty(k, i32)
        pos[go] = cp.arange(k, dtype=i32)
        cp.ascontiguousarray(cen[go])
        cp.ascontiguousarray(c[go])
        pos[labels]
        cp.empty((n, t), f64)
        # bounds.assign_bounds at small K: float64 distances to every centroid, a piece of rows at
        # a time, the group minima by one gather
        c64 = cen.astype(f64)
        neg2 = -2.0 * c64.T
        g = cp.empty((n, k + 1), f64)
        g[:, k] = cp.inf
        gk = g[:, :k]
        gk[...] = x64 @ neg2
        gk += (c64 * c64).sum(axis=1)[None, :]
        gk += xnorm[:, None]
        gk[cp.arange(n), labels] = cp.inf
        mins = cp.take(g, cp.asarray(np.arange(2 * t, dtype=np.int64) % k), axis=1).reshape(n, t, 2).min(axis=2)
        vv = mins - xn[:, None]
        lower[...] = cp.where(cp.isinf(vv), vv, cp.sqrt(cp.maximum(vv, 0.0)) * 0.5)
        # Kernels whose code follows a size: the grouping's argmin past 128 groups, the axis-0
        # running sums and bincount's check of its labels at a few hundred to a thousand rows
        cp.ones((16, 160), f64).argmin(axis=1)
        for kk in (200, 400, 800, 1600):
            gg = cp.zeros(kk, i64)
            cp.bincount(gg, minlength=t)
            cp.bincount(gg.astype(i32), minlength=t)
            cp.cumsum(cp.ones((kk, d), f64), axis=0)
            cp.count_nonzero(cp.zeros(kk, i32) != 1)
        cp.cumsum(cp.ones((600, d), i64), axis=0)

    def sized(f):
        # Both sizes in one op, so in one process: they share every elementwise kernel, which
        # two processes would each compile. The large first: a fit's blocks are large, and its
        # worker, reaching an op still in flight, compiles what it needs itself.
        def both():
            return f(LARGE), f(SMALL)

        both.__name__ = f.__name__  # load()'s ``skip`` names ops
        return both

    # In the order a fit first needs them (the moments pass, k-means||'s draws and passes, its
    # recluster, the iterations; then the other inits'): each process claims the next op no
    # other has, so the ops the fit needs soonest start first. This package's own modules
    # are not here: the worker's :func:`.cupy_backend.warm` compiles those it needs, in threads,
    # and a process compiling them too would repeat seconds of NVRTC work beside it.
    return [moments, sized(grid), sized(par_draws), take_rows, prepare, par_update, sized(draw),
            candidates, sized(seed_batched), sums, step, small_stats, weighted_lloyd, plusplus, sized(yinyang)]


def _tag() -> str:
    """This list of ops (the file's hash): a marker left by another list does not count."""
    import hashlib

    with open(__file__, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()[:12]


def cache_dir() -> str:
    """CuPy's kernel cache (``CUPY_CACHE_DIR``, else CuPy's default)."""
    return os.environ.get("CUPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache")


def _marker_name(cupy: str, cuda: str, sm: str, dtype: str, index: int) -> str:
    """The name of the marker of op ``index`` of this list of ops, for CuPy version ``cupy``,
    CUDA runtime ``cuda`` and device architecture ``sm`` (or glob patterns of them)."""
    return f"daskmeans-warm-{_tag()}-cupy{cupy}-cuda{cuda}-sm{sm}-{dtype}-op{index}"


def _marker(cp, index: int, dtype: str) -> str:
    """The file in CuPy's cache that says op ``index`` is compiled there for this list of ops,
    CuPy, CUDA runtime and device architecture."""
    name = _marker_name(cp.__version__, str(cp.cuda.runtime.runtimeGetVersion()), cp.cuda.Device().compute_capability,
                        dtype, index)
    return os.path.join(cache_dir(), name)


def _cupy_version() -> str | None:
    """The installed CuPy's version, read from its ``_version.py`` (CuPy not imported)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("cupy")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(folder, "_version.py")) as f:
                got = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read())
        except OSError:
            continue
        if got:
            return got.group(1)
    return None


def compiled(dtype: str) -> bool:
    """Whether every op left its marker in the cache: then a launcher starts no process (each
    would import CuPy and open the driver only to find the markers, seconds of CPU beside a fit
    that has started). Without importing CuPy: the installed version's markers, for any CUDA
    runtime and device (a cache shared by hosts of other GPUs or CUDA versions then warms
    nothing ahead for them; their fits compile what they need)."""
    import glob

    n = count(dtype)
    cp = sys.modules.get("cupy")
    if cp is not None:
        try:
            return all(os.path.exists(_marker(cp, i, dtype)) for i in range(n))
        except Exception:  # no device here
            return False
    import fnmatch

    version = _cupy_version()
    cupy = glob.escape(version) if version else "*"
    try:
        names = os.listdir(cache_dir())
    except OSError:
        return False
    return all(fnmatch.filter(names, _marker_name(cupy, "*", "*", dtype, i)) for i in range(n))


def _claim(marker: str) -> int | None:
    """A lock on the op whose marker is ``marker`` (an open descriptor of its lock file, held
    by this process until it closes it), or None where the op is compiled (its marker is there)
    or another process holds the lock. The system releases a lock when its process ends, so an
    op whose process died is free again."""
    import fcntl

    if os.path.exists(marker):
        return None
    fd = os.open(marker + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another process compiles this op now
        os.close(fd)
        return None
    if os.path.exists(marker):  # compiled by the process that held the lock before
        os.close(fd)
        return None
    return fd


def main(argv: list[str]) -> int:
    """The process: :func:`work` for data of dtype ``argv[0]``, the first GPU's context made
    meanwhile (:func:`_open_context`)."""
    import threading

    threading.Thread(target=_open_context, name="daskmeans-warm-context", daemon=True).start()
    return work(argv[0])


def _open_context() -> None:
    """The first GPU's primary CUDA context made through the driver's library (``ctypes``,
    whose calls release the interpreter lock), on a thread while the process imports NumPy and
    CuPy: CuPy's first call then finds the context made (the runtime uses the primary context)
    instead of making it after the imports, and the processes' first compiles start sooner
    (docs/performance.md, "A first fit"). Nothing where the library cannot be loaded or
    refuses: CuPy makes the context, or says what is wrong. The driver calls of
    :func:`.gpu_device.open_context`, written here again: this script imports nothing of the
    package (see the module's docstring)."""
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0:
        cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)


def _cupy():
    """CuPy, where it imports and sees a device; else None (nothing to launch on)."""
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy or no device here
        return None
    return cp


def work(dtype: str) -> int:
    """Launch, in order, every op for data of ``dtype`` that no marker says is compiled and no
    other process or thread is compiling, on the calling thread's GPU, and leave each one's
    marker once its kernels are built. An op that fails is left without its marker (the fit
    compiles what it needs) and the others go on. Returns 0; 1 where there is nothing to
    compile on (no CuPy, no device); 2 where an op failed. Run by this file's processes, and
    by a thread of a command whose GPU workers are its threads
    (:func:`.cupy_backend.warm_ops_here`): a lock is held by an open file, so a thread's claim
    excludes the processes' as theirs exclude each other."""
    import numpy as np

    cp = _cupy()
    if cp is None:
        return 1
    dtype = np.dtype(dtype).name
    os.makedirs(cache_dir(), exist_ok=True)
    failed = False
    for index, op in enumerate(_ops(cp, np, np.dtype(dtype))):
        marker = _marker(cp, index, dtype)
        lock = _claim(marker)
        if lock is None:
            continue
        try:
            op()
            cp.cuda.Device().synchronize()
            with open(marker, "w"):
                pass
        except Exception:  # noqa: BLE001 - the other ops still warm; the fit compiles this one's kernels
            failed = True
        finally:
            os.close(lock)
    return 2 if failed else 0


def load(dtype: str, skip: tuple[str, ...] = ()) -> int:
    """Launch every op for data of ``dtype`` but those named in ``skip`` (the functions' names
    in :func:`_ops`), in order, on the calling thread's GPU, on a stream of its own (no
    synchronisation with the fit's streams), without markers or locks. Where every op is
    compiled (:func:`compiled`), this loads their kernels from the disk cache into this
    process, for this GPU: CuPy keeps a kernel per device and loads it at its first launch
    there, so a fit's first init on each GPU otherwise pays each of its dozens of loads on its
    path, GPU after GPU (docs/performance.md, "A first fit"). Run by a GPU worker's warm-up
    thread (:func:`.cupy_backend.warm`). Returns 0; 1 where there is no CuPy or device; 2
    where an op failed (the others still ran; the fit loads what it needs)."""
    import numpy as np

    cp = _cupy()
    if cp is None:
        return 1
    failed = False
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for op in _ops(cp, np, np.dtype(dtype)):
            if op.__name__ in skip:
                continue
            try:
                op()
            except Exception:  # noqa: BLE001 - the fit loads this op's kernels at their launch
                failed = True
        stream.synchronize()
    return 2 if failed else 0


def count(dtype: str = "float32") -> int:
    """The number of ops (no GPU needed: the list is built, not run)."""
    return len(names(dtype))


def names(dtype: str = "float32") -> list[str]:
    """The ops' names in order, as :func:`load`'s ``skip`` takes them (no GPU needed)."""
    import numpy as np

    class _Any:  # stands in for CuPy: the list's functions are defined, none is called
        def __getattr__(self, name):
            return None

    return [op.__name__ for op in _ops(_Any(), np, np.dtype(dtype))]


if __name__ == "__main__":  # pragma: no cover - run by cupy_backend.warm in its own process
    sys.path = [p for p in sys.path if os.path.abspath(p) != os.path.dirname(os.path.abspath(__file__))]
    sys.exit(main(sys.argv[1:]))
