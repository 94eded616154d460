"""``python -m benchmarks profile-init``: the k-means|| recluster (``seed_batched`` on about
2.5 K weighted candidates, reduced to K on one GPU) at the shapes where the init costs most:
its wall time with the init's draws per centre in batches (``RECLUSTER_BATCH_TRIALS``) and
with scikit-learn's ``2 + ln K`` (the recluster before), each in iteration-times (one tf32
assignment of the problem's rows against K centroids, with its sums: a Lloyd step's kernels),
the host functions that take the time (cProfile, sorted by their own time), and the fp32 GEMM
floor of its distance passes; then the whole default init as a fit runs it on in-process
workers of 1 GPU (``--gpus 1,2``: then of 2; the rows made on the devices, or with ``--npy``
read from a ``.npy`` file as the command reads them), its wall time in iteration-times (and
the first fit's, which loads the kernels, as a command's only fit does), its Dask tasks' run
times by name (the rounds' folds and draws, the candidates' weights, the recluster) and each
worker's busy time, the rest being the waits between them, for both fits. For planning init work; prints, writes no
file. The whole init in iteration-times, as users run it: ``python -m benchmarks command
--problems w14,w16,w18 --warm-only``. P1 (K = 4) shows the init's fixed costs, which its
command pays (issue 44's CSV command). ``--batches 64,32``: the recluster alone and the whole
init with ``seed_batched``'s batches of K/64 and of K/32 (the init's: half the dependent steps;
docs/performance.md, "k-means‖'s recluster in batches", for their quality).

    python -m benchmarks profile-init [P1] [P4] [W14] [W16] [W18] [--gpus 1,2] [--npy] [--batches 64,32]
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
import tempfile
import time

from benchmarks import problems

SUMMARY = "the k-means|| recluster at P4 and wide K: wall time in iteration-times, host profile, GEMM floor"  # its line in --help

PROBLEMS = problems.pick("P1", "P4", "W14", "W16", "W18")


def _init_batches() -> int:
    """The recluster's batch count as the init runs it (``seed_batched``'s default)."""
    import inspect

    from daskmeans.seeding.kernels import seed_batched

    return inspect.signature(seed_batched).parameters["batches"].default


def _recluster_s(x, w, k: int, batch_trials: int | None, prof: cProfile.Profile | None = None,
                 batches: int | None = None) -> float:
    """Seconds of one ``seed_batched`` of the candidates ``x`` (weights ``w``) to ``k``, in
    ``batches`` batches of the largest size (default the init's)."""
    import cupy

    from daskmeans.seeding.kernels import seed_batched
    from daskmeans.seeding.kmeans_parallel import INIT_PRECISION

    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    seed_batched(x, k, 0, w, precision=INIT_PRECISION, batch_trials=batch_trials,
                 **({} if batches is None else {"batches": batches}))
    cupy.cuda.Device().synchronize()
    if prof is not None:
        prof.disable()
    return time.perf_counter() - t0


def _iteration_s(problem: problems.Problem) -> float:
    """Seconds of a tf32 assignment with sums of the problem's rows against K centroids (the
    kernels of one Lloyd step on one GPU), the median of 5 after one to load them."""
    from benchmarks import meta
    from daskmeans.backends import cupy_backend as cb
    from daskmeans.numerics.grid import Grid

    X, C = problems.cupy_randn(problem)
    p = cb.prepare(C, X.dtype, "tf32")
    grid = Grid.for_block(X)  # the fit's bound, found once
    return meta.synced_ms(lambda: cb.assign(X, p, grid=grid), reps=5, warm=1) / 1e3


def profile(problem: problems.Problem, args) -> None:
    """Print the recluster's wall time at ``problem``'s K and D (the init's setting and the
    one before) against an iteration, its profile, and its floor; then the whole init on each
    of ``args.gpus``' GPU counts."""
    import cupy

    from benchmarks import meta
    from daskmeans.seeding.kernels import local_trials
    from daskmeans.seeding.kmeans_parallel import RECLUSTER_BATCH_TRIALS

    it = _iteration_s(problem)
    cupy.get_default_memory_pool().free_all_blocks()  # the rows of the iteration's pass
    n_cand, d, k = int(2.5 * problem.k), problem.d, problem.k
    rs = cupy.random.default_rng(0)
    x = rs.standard_normal((n_cand, d), dtype=cupy.float32)
    w = rs.integers(1, 100, n_cand).astype(cupy.float64)
    init_batches = _init_batches()
    batches = [int(b) for b in args.batches.split(",")] if args.batches else [init_batches]
    for trials in (RECLUSTER_BATCH_TRIALS, None):  # every kernel the run takes loaded (or compiled)
        for b in batches:
            _recluster_s(x, w, k, trials, batches=b)
    prof = cProfile.Profile()
    now = _recluster_s(x, w, k, RECLUSTER_BATCH_TRIALS, prof)
    before = _recluster_s(x, w, k, None)
    other = {b: _recluster_s(x, w, k, RECLUSTER_BATCH_TRIALS, batches=b) for b in batches if b != init_batches}
    # The distance passes' floor: every draw (trials per centre) and every pick against all
    # candidates, as one TF32 GEMM each.
    c = rs.standard_normal((4096, d), dtype=cupy.float32)
    ms = meta.event_ms(lambda: x @ c.T, reps=10, warm=2)
    floor = {t: ms / 1e3 * (t + 1) * k / 4096 for t in (RECLUSTER_BATCH_TRIALS, local_trials(k))}
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    print(f"{problem.label}: one iteration {it:.3f} s; recluster of {n_cand} candidates to K={k}: "
          f"{now:.3f} s = {now / it:.2f} iterations with {RECLUSTER_BATCH_TRIALS} draws per centre "
          f"(GEMM floor, fp32: {floor[RECLUSTER_BATCH_TRIALS]:.3f} s), {before:.3f} s = {before / it:.2f} "
          f"iterations with {local_trials(k)} (floor {floor[local_trials(k)]:.3f} s); in batches of K/{init_batches}"
          + "".join(f"; of K/{b}: {t:.3f} s = {t / it:.2f} iterations" for b, t in other.items()), flush=True)
    print(s.getvalue(), flush=True)
    x = w = c = None  # the candidates' memory back to the pool, for the fit's
    cupy.get_default_memory_pool().free_all_blocks()
    for b in batches:
        _whole_init(problem, it, gpus=tuple(int(g) for g in args.gpus.split(",")), npy=args.npy,
                    batches=None if b == init_batches else b)


def _rows(n: int, d: int, seed: int, block_id=None):
    """A block of standard normal float32 rows made on the worker's device (cuRAND's generator:
    CuPy's ``default_rng`` held the interpreter lock for seconds a block)."""
    import cupy

    return cupy.random.RandomState(seed * 1_000_003 + block_id[0]).standard_normal((n, d), dtype=cupy.float32)


# The names of the inits' own tasks (k-means||'s rounds and recluster, AFK-MC²'s chains).
INIT_TASKS = ("daskmeans-kpar", "daskmeans-afkmc2")


def _whole_init(problem: problems.Problem, it: float, init: str = "k-means||", gpus: tuple[int, ...] = (1,),
                npy: bool = False, batches: int | None = None) -> None:
    """Print the init ``init`` (the default's) of a one-iteration fit on in-process workers of
    the first ``n`` GPUs for each ``n`` of ``gpus`` (the second of two fits, the first loading
    the kernels; the first's init time too) in iteration-times of ``it`` seconds (one GPU's),
    its tasks' run times by name and each worker's busy time (the rest of the wall time: waits
    between dependent tasks), and the first fit's beside them (what a command's only fit pays
    beyond them: kernels loaded, memory pools grown; the first GPU's kernels that this
    process's own measurements launched are loaded already). With ``npy``, the rows are written to a ``.npy`` file and each
    fit is given its path, as the command is (its chunks and placement). ``batches``: the
    recluster's (:func:`_batched`; default the init's)."""
    import collections

    import cupy
    import dask.array as da
    import numpy as np
    from distributed import Client, Scheduler, SpecCluster, get_task_stream

    import daskmeans
    from daskmeans.engine.devices import device_worker_specs

    n, d, k = problem.n, problem.d, problem.k
    for n_gpus in gpus:
        blocks = 4 * n_gpus
        specs = device_worker_specs("cupy", list(range(n_gpus)), {"protocol": "inproc://"})
        scheduler = {"cls": Scheduler, "options": {"protocol": "inproc://", "dashboard": False}}
        with contextlib.ExitStack() as stack, SpecCluster(workers=specs, scheduler=scheduler) as lc, \
                Client(lc) as client, _batched(batches):
            X = da.map_blocks(_rows, n // blocks, d, 0, dtype=np.float32, chunks=((n // blocks,) * blocks, (d,)),
                              meta=cupy.empty((0, d), cupy.float32)).persist()
            if npy:  # removed with the cluster (a P4 file is 7.7 GB)
                tmp = stack.enter_context(tempfile.TemporaryDirectory())
                path = os.path.join(tmp, "rows.npy")
                np.save(path, X.map_blocks(cupy.asnumpy, meta=np.empty((0, d), np.float32)).compute())
                X = path

            def fit():
                return daskmeans.KMeans(k, init=init, n_init=1, max_iter=1, tol=0, precision="tf32",
                                        random_state=0, client=client).fit(X)

            names = {a: info["name"] for a, info in client.scheduler_info()["workers"].items()}
            with get_task_stream(client) as ts0:
                first = fit().timings_.get("init", float("nan"))
            parts: dict = collections.defaultdict(float)
            with get_task_stream(client) as ts, _timed_recluster(parts):
                km = fit()
        tasks, busy = _task_times(ts.data, names, it)
        tasks0, busy0 = _task_times(ts0.data, names, it)
        wall = km.timings_.get("init", float("nan"))
        print(f"{problem.label}: the whole {init} init on {n_gpus} in-process GPU worker(s)"
              f"{f' (recluster in batches of K/{batches})' if batches is not None else ''}"
              f"{' from a .npy file' if npy else ''} {wall:.3f} s = {wall / it:.2f} one-GPU iterations (the first "
              f"fit's {first:.3f} s); its tasks' run times (all workers) in iterations: {tasks} (the first fit's: "
              f"{tasks0}); each worker's busy time in the init's tasks (s): {busy} (the first fit's: {busy0}); "
              f"the fit's phases (s): { {p: round(v, 3) for p, v in km.timings_.items()} }; the recluster's "
              f"task in parts (s, its GPU synchronised after each): { {p: round(v, 3) for p, v in parts.items()} }",
              flush=True)


def _task_times(records: list, names: dict, it: float) -> tuple[dict, dict]:
    """A task stream's compute time by task name in iterations of ``it`` seconds (the init's
    tasks and any name over a twentieth of an iteration), largest first, and each worker's
    (by ``names``: address to name) busy seconds in the init's tasks (:data:`INIT_TASKS`)."""
    import collections

    from dask.utils import key_split

    by: dict = collections.defaultdict(float)
    busy: dict = collections.defaultdict(float)
    for rec in records:
        for ss in rec.get("startstops", ()):
            if ss.get("action") == "compute":
                name = key_split(rec["key"])
                by[name] += ss["stop"] - ss["start"]
                if name.startswith(INIT_TASKS):
                    busy[names.get(rec.get("worker"), rec.get("worker"))] += ss["stop"] - ss["start"]
    tasks = {name: round(sec / it, 2) for name, sec in sorted(by.items(), key=lambda kv: -kv[1])
             if name.startswith(INIT_TASKS) or sec > 0.05 * it}
    return tasks, {w: round(v, 3) for w, v in sorted(busy.items())}


@contextlib.contextmanager
def _batched(batches: int | None):
    """Within the block, the recluster of this process's in-process workers seeds in
    ``batches`` batches of the largest size (``seed_batched``, as k-means|| calls it by name;
    None: as the init does)."""
    import functools

    from daskmeans.seeding import kmeans_parallel as kp

    saved = kp.seed_batched
    if batches is not None:
        kp.seed_batched = functools.partial(saved, batches=batches)
    try:
        yield
    finally:
        kp.seed_batched = saved


# The recluster task's steps (module attributes of seeding.kmeans_parallel it calls by name).
RECLUSTER_PARTS = ("_candidates", "seed_batched", "weighted_lloyd")


@contextlib.contextmanager
def _timed_recluster(parts: dict):
    """Within the block, the recluster's steps (:data:`RECLUSTER_PARTS`) of this process's
    in-process workers add their wall time to ``parts`` by name, each step's GPU work
    synchronised before its clock stops (so a step's time is its own, not the next one's)."""
    import cupy

    from daskmeans.seeding import kmeans_parallel as kp

    def timed(name, fn):
        def run(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            cupy.cuda.Device().synchronize()
            parts[name] += time.perf_counter() - t
            return out

        return run

    saved = {name: getattr(kp, name) for name in RECLUSTER_PARTS}
    for name, fn in saved.items():
        setattr(kp, name, timed(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(kp, name, fn)


def main(argv=None):
    from benchmarks import meta

    def options(ap):
        ap.add_argument("--gpus", default="1", help="comma-separated GPU counts of the whole init's runs (default 1)")
        ap.add_argument("--npy", action="store_true",
                        help="the whole init's rows written to a .npy file and fitted from it, placed as the command "
                             "places them (default: made on the devices, in 4 blocks a GPU)")
        ap.add_argument("--batches", default="",
                        help="comma-separated batch counts of the recluster's seeding (default: the init's)")

    meta.profile_main("profile-init", __doc__, PROBLEMS, "P4", profile, argv, options)


if __name__ == "__main__":
    main()
