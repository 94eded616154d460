"""``python -m benchmarks scale``: the largest fits run here, each as a whole ``daskmeans fit``
command on every GPU of the host, against the compute-bound estimate measured in the same run.

Cases (``--cases``, comma-separated):

- ``host154``: 1e8 x 384 float32 (154 GB as ``.npy``), K = 40,000, tf32, the default init,
  5 iterations, the host tier forced by ``--device-memory-limit`` (half of each GPU's share
  of the rows: data larger than the GPUs' budget): the rows stream from pinned host memory
  every iteration.
- ``widek20``: 2e7 x 128 float32 (10 GB ``.npy``), K = 2^20, tf32, the default init,
  3 iterations: the IVF-training shape at its widest.

Each case's data is drawn on the GPU (standard normal, block by block from one seed) and
written to a local ``.npy`` by several threads. The command runs with ``--timings``; the
results keep its phases, the median iteration and the init in iteration-times.

The floor (``estimate_iteration_s``): the kernel step (``assign``, tf32, resident data,
CUDA events, median of repeats) at the case's D and K on ``--sample-rows`` rows of one GPU,
before the command runs, scaled to the rows each GPU holds: ``step x (n / gpus) /
sample_rows``. ``ratio_to_estimate`` is the command's median iteration over it.

    python -m benchmarks scale --cases host154,widek20 [--folder /tmp] [--out r.json [--merge]]

Committed results: ``results/scale_<device kind>.json``, entries keyed by case.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass

import numpy as np

from benchmarks import meta

SUMMARY = "the largest fits (154 GB host tier; K = 2^20) as whole commands against the kernel step"  # its line in --help

LAYOUT = meta.Layout(entries=("cases",))


@dataclass(frozen=True)
class Case:
    """A scale case: its data's shape, K and the command's options."""

    n: int
    d: int
    k: int
    iterations: int
    args: tuple[str, ...] = ()
    device_share: float | None = None  # the device budget as a share of a GPU's rows (forces the host tier)


CASES = {
    "host154": Case(100_000_000, 384, 40_000, 5, device_share=0.5),
    "widek20": Case(20_000_000, 128, 1 << 20, 3),
}

_BLOCK_ROWS = 1 << 20


def write_npy(path: str, n: int, d: int, seed: int = 0, threads: int = 8) -> float:
    """Standard normal float32 ``(n, d)`` rows drawn on the GPU, one generator per block of
    :data:`_BLOCK_ROWS` rows (seeded ``(seed, block)``), written to ``path`` as ``.npy`` by
    ``threads`` threads; returns the seconds it took."""
    import cupy

    t0 = time.perf_counter()
    header = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    offset = header.offset
    del header
    fd = os.open(path, os.O_WRONLY)

    def one(b: int) -> None:
        s = b * _BLOCK_ROWS
        rows = min(_BLOCK_ROWS, n - s)
        with cupy.cuda.Device(0):
            block = cupy.random.default_rng([seed, b]).standard_normal((rows, d), dtype=cupy.float32)
            host = cupy.asnumpy(block)
        os.pwrite(fd, memoryview(host).cast("B"), offset + s * d * 4)

    try:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(-(-n // _BLOCK_ROWS))))
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def estimate_step_s(d: int, k: int, rows: int) -> float:
    """Seconds of one tf32 kernel step over ``rows`` resident rows of ``d`` features against
    ``k`` centroids on GPU 0 (CUDA events, median of 3 after a warm-up)."""
    import cupy

    from daskmeans.backends import get_backend
    from daskmeans.numerics.grid import Grid

    be = get_backend("cupy")
    rng = cupy.random.default_rng(1)
    X = rng.standard_normal((rows, d), dtype=cupy.float32)
    C = X[cupy.asarray(np.random.default_rng(1).choice(rows, k, replace=False))].astype(cupy.float64)
    grid = Grid.for_block(X)
    prep = be.prepare(C, np.float32, "tf32")
    s = meta.event_ms(lambda: be.assign(X, prep, grid=grid), reps=3, warm=1) / 1e3
    X = C = prep = None
    cupy.get_default_memory_pool().free_all_blocks()
    return s


def gpu_facts() -> tuple[int, int]:
    """The GPUs' count and one GPU's memory in bytes."""
    import cupy

    return cupy.cuda.runtime.getDeviceCount(), int(cupy.cuda.Device(0).mem_info[1])


def run_case(name: str, case: Case, folder: str, sample_rows: int) -> dict:
    """Write the case's data, measure the floor, run the command; the case's entry."""
    gpus, gpu_bytes = gpu_facts()
    data_bytes = case.n * case.d * 4
    entry = {"n": case.n, "d": case.d, "k": case.k, "gpus": gpus, "data_bytes": data_bytes,
             "iterations": case.iterations, "precision": "tf32", "init": "k-means|| (default)"}
    step = estimate_step_s(case.d, case.k, sample_rows)
    entry.update(sample_rows=sample_rows, sample_step_s=step,
                 estimate_iteration_s=step * (case.n / gpus) / sample_rows)
    print(name, "estimate", json.dumps(entry), flush=True)
    path = os.path.join(folder, f"{name}.npy")
    entry["write_s"] = write_npy(path, case.n, case.d)
    print(name, f"wrote {data_bytes / 1e9:.1f} GB in {entry['write_s']:.1f} s", flush=True)
    args = list(case.args)
    if case.device_share is not None:
        budget = int(data_bytes / gpus * case.device_share)
        args += ["--device-memory-limit", str(budget)]
        entry["device_memory_limit"] = budget
    model, timings = os.path.join(folder, f"{name}-model.zarr"), os.path.join(folder, f"{name}-timings.json")
    argv = ["daskmeans", "fit", path, "--k", str(case.k), "--precision", "tf32", "--max-iter", str(case.iterations),
            "--tol", "0", "-o", model, "--overwrite", "--timings", timings, *args]
    entry["argv"] = argv[2:]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    entry["wall_s"] = time.perf_counter() - t0
    entry["rc"] = p.returncode
    entry["stderr_tail"] = p.stderr[-1500:]
    if p.returncode == 0:
        with open(timings) as f:
            t = json.load(f)
        its = t["iteration_seconds"]
        med = statistics.median(its)
        entry.update(phases=t["phases"], iteration_seconds=its, median_iteration_s=med, tier=t["tier"],
                     n_iter=t["n_iter"], ratio_to_estimate=med / entry["estimate_iteration_s"],
                     tflops_per_gpu=2.0 * case.n * case.d * case.k / med / gpus / 1e12)
        init = t["phases"].get("fit init")
        if init is not None:
            entry["init_s"] = init
            entry["init_iteration_times"] = init / med
    for p_ in (path, model):
        if os.path.isdir(p_):
            shutil.rmtree(p_)
        elif os.path.exists(p_):
            os.remove(p_)
    print(name, json.dumps({k: v for k, v in entry.items() if k != "stderr_tail"}), flush=True)
    if entry["rc"]:
        print(entry["stderr_tail"], flush=True)
    return entry


def main(argv=None) -> None:
    ap = meta.parser("scale", __doc__)
    ap.add_argument("--cases", default="widek20", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--folder", default="/tmp", help="where the data and the model are written (removed after)")
    ap.add_argument("--sample-rows", type=int, default=1 << 21, help="rows of the one-GPU kernel step (the floor)")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "scale")
    names = meta.names(ap, args.cases, CASES, "case")
    res = {"benchmark": "scale", "device": meta.device_name(), "date": meta.now(), "commit": meta.commit(),
           "cases": {}}
    for name in names:
        res["cases"][name] = run_case(name, CASES[name], args.folder, args.sample_rows)
        meta.write(dict(res), args.out, LAYOUT, args.merge)  # each case kept as soon as it ran
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
