"""``python -m benchmarks placement``: placement and the storage tier's passes (the workers'
reading pipeline) against the floors of the same run, on a GPU or on the CPU.

Data (issue 44): ``daskmeans generate blobs --n N --d 64 --centers 16`` (Zarr, Zstd, chunks
of 131072 rows), and the same rows as ``.npy``. Page cache as the run leaves it: every file is
read once before the floors (the figures are page-cache reads, not a cold disk's).

Floors, measured in this run, with 1 and ``--threads`` threads (default 16, at most the cores):

- raw read: the ``.npy`` file's bytes read by ``os.preadv`` into one array, the threads each
  reading 32 MiB ranges;
- decode: the Zarr store's chunk files read and decompressed by numcodecs (what zarr-python
  calls) into one array, one chunk file per task;
- on a GPU, the link (a page-locked host array copied to the device), the allocation of
  page-locked host memory (what the host tier's blocks cost before any read), and the
  locking of memory already written (``cudaHostRegister``, the alternative to it).

Then ``daskmeans fit DATA --k 16 --max-iter 5 --tol 0 --seed 0 --tier T --timings`` (a
subprocess, the command's own local cluster on ``--backend``) for T in host and storage and
DATA each format: the placement's seconds (``fit place``) and rate against the floor of its
format (decode for Zarr, raw read for ``.npy``), and the storage tier's median iteration
(after the first) and rate against the same floor; the centroids of every run compared
bitwise with the first's.

Every run also records its init (k-means||, the fit's default) in iteration-times
(``init_iteration_times``: the init phase over the median iteration). On a GPU the runs use the
GPUs the process sees (``CUDA_VISIBLE_DEVICES``); runs on more than one are keyed
``<format>-<tier>-<n>gpu``. ``--runs`` picks some of ``zarr-host``, ``zarr-storage``,
``npy-host`` and ``npy-storage`` (default all four).

    python -m benchmarks placement [--backend gpu|cpu] [--n 30000000] [--threads 16] [--workers W] [--runs R] [--out r.json]
    CUDA_VISIBLE_DEVICES=0,1 python -m benchmarks placement --keep DIR --runs zarr-storage --out r.json --merge

Acceptance (issue 44): host-tier placement at least 50% of the same run's decode floor at 16
threads (Zarr), of its raw-read floor at 16 threads (``.npy``); the storage tier's iterations
at least 80% of the decode floor and its init at most 6 iteration-times, on 1 and 2 GPUs. Committed results: ``results/placement_<device>.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import meta, tiers

SUMMARY = "placement and the storage tier's passes against the same run's raw-read and decode floors (GPU or CPU)"

LAYOUT = meta.Layout(entries=("runs",), parts=("floors",))
RUNS = ("zarr-host", "zarr-storage", "npy-host", "npy-storage")
PIECE = 32 << 20


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


def _pool_map(fn, items, threads: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as ex:
        for _ in ex.map(fn, items):
            pass


def raw_read_gbs(path: str, threads: int) -> float:
    """The ``.npy`` file's bytes read into one array by ``threads`` threads (32 MiB ranges)."""
    size = os.path.getsize(path)
    buf = np.empty(size, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        def piece(a: int) -> None:
            view, at = memoryview(buf)[a:min(size, a + PIECE)], a
            while view:
                got = os.preadv(fd, [view], at)
                view, at = view[got:], at + got

        t0 = time.perf_counter()
        _pool_map(piece, range(0, size, PIECE), threads)
        return size / (time.perf_counter() - t0) / 1e9
    finally:
        os.close(fd)


def decode_gbs(path: str, threads: int) -> float:
    """Every chunk file of the Zarr array ``path`` read and decompressed by numcodecs into one
    array (decoded bytes per second), one chunk file per task on ``threads`` threads."""
    import numcodecs
    import zarr

    a = zarr.open_array(path, mode="r")
    codecs = list(a.metadata.codecs)
    codec = numcodecs.Zstd() if len(codecs) > 1 else None
    rows, d = int(a.chunks[0]), int(a.shape[1])
    n_chunks = -(-int(a.shape[0]) // rows)
    chunk_bytes = rows * d * np.dtype(a.dtype).itemsize
    out = np.empty(n_chunks * chunk_bytes, np.uint8)

    def one(i: int) -> None:
        with open(os.path.join(path, "c", str(i), "0"), "rb") as f:
            data = f.read()
        dest = out[i * chunk_bytes:(i + 1) * chunk_bytes]
        if codec is None:
            dest[: len(data)] = np.frombuffer(data, np.uint8)
        else:
            codec.decode(data, out=dest)

    t0 = time.perf_counter()
    _pool_map(one, range(n_chunks), threads)
    return int(a.nbytes) / (time.perf_counter() - t0) / 1e9


def pinned_alloc_gbs(nbytes: int = 2**30, times: int = 4) -> float:
    """Page-locked host memory allocated and first written (what the host tier's blocks cost
    before any read), fresh each time (CuPy's pool freed): GB/s."""
    import cupy

    pool = cupy.get_default_pinned_memory_pool()
    pool.free_all_blocks()
    t0 = time.perf_counter()
    for _ in range(times):
        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        np.frombuffer(mem, np.uint8, nbytes)[::4096] = 1
        del mem
        pool.free_all_blocks()
    return nbytes * times / (time.perf_counter() - t0) / 1e9


def page_lock_gbs(nbytes: int = 2**30, times: int = 4) -> float:
    """Ordinary host memory already written, then page-locked in place (``cudaHostRegister``,
    the backends' ``page_lock``) and unlocked: the alternative to allocating the host tier's
    blocks page-locked, GB/s of the locking alone."""
    import cupy

    total = 0.0
    for _ in range(times):
        a = np.empty(nbytes, np.uint8)
        a[::4096] = 1
        t0 = time.perf_counter()
        cupy.cuda.runtime.hostRegister(a.ctypes.data, nbytes, 0)
        total += time.perf_counter() - t0
        cupy.cuda.runtime.hostUnregister(a.ctypes.data)
    return nbytes * times / total / 1e9


def warm(paths: list[str]) -> None:
    """Every file under ``paths`` read once (the page cache holds them, where it can)."""
    for p in paths:
        files = [p] if os.path.isfile(p) else [os.path.join(r, f) for r, _, fs in os.walk(p) for f in fs]
        for f in files:
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass


def fit(path: str, tier: str, backend: str, workers: int | None, folder: str, k: int) -> dict:
    """``daskmeans fit`` of ``path`` in ``tier``: its phases, iterations and centroids."""
    import zarr

    model, timings = os.path.join(folder, "model.zarr"), os.path.join(folder, "timings.json")
    argv = [sys.executable, "-m", "daskmeans", "fit", path, "--k", str(k), "--max-iter", "5", "--tol", "0",
            "--seed", "0", "--tier", tier, "--backend", backend, "--timings", timings, "-o", model, "-q",
            "--overwrite"]
    if workers:
        argv += ["--workers", str(workers)]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"rc": p.returncode, "stderr_tail": p.stderr[-600:]}
    with open(timings) as f:
        t = json.load(f)
    centers = np.asarray(zarr.open_group(model, mode="r")["cluster_centers"][...])
    iters = t.get("iteration_seconds") or []
    return {"rc": 0, "wall_s": wall, "tier": t.get("tier"), "backend": t.get("backend"),
            "place_s": t["phases"].get("fit place"), "phases": t["phases"], "iteration_s": iters,
            "median_iteration_s": statistics.median(iters[1:] or iters) if iters else None, "centers": centers}


def main(argv=None):
    ap = meta.parser("placement", __doc__)
    ap.add_argument("--backend", choices=("gpu", "cpu"), default="gpu", help="the command's --backend")
    ap.add_argument("--n", type=int, default=30_000_000, help="rows (64 float32 features each)")
    ap.add_argument("--threads", type=int, default=16, help="threads of the floors (at most the cores)")
    ap.add_argument("--workers", type=int, default=None, help="the command's --workers (default its own)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    ap.add_argument("--keep", metavar="DIR", help="write (or reuse) the data in DIR rather than a temporary folder")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "placement")
    wanted = [r for r in args.runs.split(",") if r]
    if not wanted or set(wanted) - set(RUNS):
        ap.error(f"--runs {args.runs!r}: each should be one of {', '.join(RUNS)}")
    import zarr

    d, k = 64, 16
    threads = max(1, min(args.threads, _cores()))
    folder = args.keep or tempfile.mkdtemp(prefix="daskmeans-placement-")
    os.makedirs(folder, exist_ok=True)
    zpath, npath = os.path.join(folder, f"blobs{args.n}.zarr"), os.path.join(folder, f"blobs{args.n}.npy")
    if not os.path.exists(zpath):
        subprocess.run([sys.executable, "-m", "daskmeans", "generate", "blobs", "--n", str(args.n), "--d", str(d),
                        "--centers", str(k), "-o", zpath, "-q"], check=True)
    if not os.path.exists(npath):
        np.save(npath, zarr.open_array(zpath, mode="r")[...])
    nbytes = args.n * d * 4
    warm([zpath, npath])
    floors = {"threads": threads, "cores": _cores(), "data_bytes": nbytes,
              "zarr_files": sum(len(fs) for _, _, fs in os.walk(zpath)),
              "zarr_stored_bytes": sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(zpath) for f in fs)}
    for t in sorted({1, threads}):
        floors[f"raw_read_GBps_{t}"] = raw_read_gbs(npath, t)
        floors[f"decode_GBps_{t}"] = decode_gbs(zpath, t)
    gpus = 1
    if args.backend == "gpu":
        import cupy

        gpus = cupy.cuda.runtime.getDeviceCount()
        floors["h2d_pinned_GBps"] = tiers.h2d_pinned_gbs()  # the tiers benchmark's floor
        floors["pinned_alloc_GBps"] = pinned_alloc_gbs()
        floors["page_lock_GBps"] = page_lock_gbs()
    print("floors", json.dumps(floors), flush=True)
    runs, ref = {}, None
    for fmt, path, floor in (("zarr", zpath, f"decode_GBps_{threads}"), ("npy", npath, f"raw_read_GBps_{threads}")):
        for tier in ("host", "storage"):
            if f"{fmt}-{tier}" not in wanted:
                continue
            with tempfile.TemporaryDirectory(dir=folder) as run_dir:
                r = fit(path, tier, args.backend, args.workers, run_dir, k)
            entry = {key: v for key, v in r.items() if key != "centers"}
            entry["gpus"] = gpus if args.backend == "gpu" else None
            if r["rc"] == 0:
                if ref is None:
                    ref = r["centers"]
                entry["bitwise_same_as_first"] = bool(np.array_equal(r["centers"], ref))
                entry["floor"] = floor
                # What each tier's acceptance line is about: the host tier's placement (its
                # iterations read memory), the storage tier's passes (it places no rows).
                if tier == "host" and r["place_s"]:
                    entry["place_GBps"] = nbytes / r["place_s"] / 1e9
                    entry["place_over_floor"] = entry["place_GBps"] / floors[floor]
                if r["median_iteration_s"] and "fit init" in r["phases"]:
                    entry["init_iteration_times"] = r["phases"]["fit init"] / r["median_iteration_s"]
                if tier == "storage" and r["median_iteration_s"]:
                    entry["iteration_GBps"] = nbytes / r["median_iteration_s"] / 1e9
                    entry["iteration_over_floor"] = entry["iteration_GBps"] / floors[floor]
            key = f"{fmt}-{tier}" + (f"-{gpus}gpu" if gpus > 1 else "")
            runs[key] = entry
            print(key, json.dumps({key: v for key, v in entry.items() if key not in ("phases", "iteration_s")}),
                  flush=True)
    res = {"benchmark": "placement", "device": meta.device_name() if args.backend == "gpu" else
           f"cpu {_cores()} cores", "date": meta.now(), "commit": meta.commit(), "backend": args.backend,
           "n": args.n, "d": d, "k": k, "floors": floors, "runs": runs}
    meta.write(res, args.out, LAYOUT, args.merge)
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
