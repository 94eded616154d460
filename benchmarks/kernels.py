"""``python -m benchmarks kernels``: one GPU kernel step against the cuBLAS GEMM floors.

On one GPU, data resident, per iteration: median time (CUDA events, after warm-up, fresh
random data per problem) of daskmeans' CuPy kernel step (``backends.cupy_backend.assign``) and, in
the same run, the floors: cuBLAS fp32 and tf32 GEMM of N x D x K (row-tiled like the kernel
where N x K would not fit), one HBM read of X (a device copy's time / 2), and a tiled PyTorch
step of the same precision (GEMM ``||c||^2 - 2 x c^T``, row argmin, ``index_add``; labels not
certified) for fp32 and TF32. Each is timed twice: between device synchronisations (wall
clock) and between CUDA events of the library doing the work (keys ``*_ev_s``). Writes JSON
with device, date and commit.

    python -m benchmarks kernels [--problems P2,P3,P4,S1,S2] [--modes fp32,tf32,bf16] [--skip-torch]
        [--out results/gpu_kernels_<device>.json [--merge]]

Committed results: ``results/gpu_kernels_<device>.json``, rows keyed by problem, each with its
commit and date (P4 may run as a second call with ``--merge``).

Per problem it also records, for each low-precision mode, the fraction of rows the kernel had
to re-rank exactly and whether its labels equal the fp32 mode's.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from benchmarks import meta, problems

SUMMARY = "one GPU kernel step on P2-P4, S1, S2 against the cuBLAS GEMM and HBM floors"  # its line in --help

PROBLEMS = problems.pick("P2", "P3", "P4", "S1", "S2", "W12", "W14", "W16", "W18", "V12", "V14", "V16", "V18")
LAYOUT = meta.Layout(rows={"results": ("problem",)})


def timeit(fn, reps=10, warm=3):
    reps, warm = _REPS.get("reps", reps), _REPS.get("warm", warm)
    return _timeit(fn, reps, warm)


_REPS: dict = {}


def _timeit(fn, reps, warm):
    """Median seconds of ``fn`` between full device synchronisations (``cudaDeviceSynchronize``
    waits for CuPy's and PyTorch's streams alike)."""
    return meta.synced_ms(fn, reps, warm) / 1e3


def timeit_events(fn, lib, reps=10, warm=3):
    """Median seconds of ``fn`` between two CUDA events of the library whose work it
    enqueues (``"cupy"``: CuPy's current stream; ``"torch"``: PyTorch's), after warm-up. The
    events bracket that stream's work, including any host time before its first launch, but
    not the host's wake-up from a synchronisation. (Events of one library do not order the
    other's work: measure each library with its own.)"""
    reps, warm = _REPS.get("reps", reps), _REPS.get("warm", warm)
    if lib == "cupy":
        return meta.event_ms(fn, reps, warm) / 1e3
    import torch

    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return float(np.median(ts))


def both(r, key, fn, lib, **kw):
    """``r[key]`` (``"..._s"``): synchronised wall time; ``r[key[:-2] + "_ev_s"]``: CUDA-event time."""
    r[key] = timeit(fn, **kw)
    r[key[:-2] + "_ev_s"] = timeit_events(fn, lib, **kw)


# The floors each mode's step is compared with: the GEMMs of its precision, and (fp32) one
# read of X.
FLOORS = {"fp32": ("gemm_fp32", "hbm_read"), "tf32": ("gemm_tf32", "gemm_fp16")}


def add_ratios(r: dict) -> None:
    """Add to a problem's row ``r`` each timed mode's step time over its :data:`FLOORS`
    (``ratio_<mode>_vs_<floor>``) and PyTorch's step time over it (``speedup_<mode>_vs_torch``),
    for synchronised wall times and for CUDA-event times (suffix ``_ev``)."""
    for ev in ("", "_ev"):
        for mode, floors in FLOORS.items():
            step = r.get(f"daskmeans_{mode}{ev}_s")
            if not step:
                continue
            for floor in floors:
                r[f"ratio_{mode}_vs_{floor}{ev}"] = step / r[f"{floor}{ev}_s"]
            if f"torch_{mode}{ev}_s" in r:
                r[f"speedup_{mode}_vs_torch{ev}"] = r[f"torch_{mode}{ev}_s"] / step


def gemm_tiled(X, CT, rows):
    import torch

    out = torch.empty((rows, CT.shape[1]), device=X.device, dtype=X.dtype)
    for s in range(0, X.shape[0], rows):
        xt = X[s : s + rows]
        torch.matmul(xt, CT, out=out[: xt.shape[0]])


def main(argv=None):
    ap = meta.parser("kernels", __doc__)
    ap.add_argument("--problems", default="P2,P3,P4,S1,S2", help=f"comma-separated, of {', '.join(PROBLEMS)}")
    ap.add_argument("--modes", default="fp32,tf32,bf16")
    ap.add_argument("--skip-torch", action="store_true", help="no PyTorch step")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "gpu_kernel_step")
    chosen = meta.chosen(ap, args.problems, PROBLEMS)
    import cupy
    import torch

    from daskmeans.backends import get_backend
    from daskmeans.numerics.grid import Grid

    be = get_backend("cupy")
    dev = torch.cuda.get_device_name()
    rows_out = []
    for problem in chosen:
        name, (n, d, k) = problem.name, problem.shape
        # P4's fp32 GEMM alone takes seconds: fewer repeats.
        _REPS.clear()
        if name in ("P4", "W16", "W18", "V16", "V18"):
            _REPS.update(reps=3, warm=1)
        # Seeded by the name's hash, which Python salts per process: fresh data each run.
        g = torch.Generator(device="cuda").manual_seed(hash(name) % 2**31)
        X = torch.randn((n, d), device="cuda", dtype=torch.float32, generator=g)
        C = X[torch.randperm(n, device="cuda", generator=g)[:k]].clone()
        rows = max(1024, min(n, (1 << 30) // (4 * k)))  # 1 GiB distance tile for the floors
        r = {"problem": name, "n": n, "d": d, "k": k}
        CT = C.T.contiguous()
        torch.backends.cuda.matmul.allow_tf32 = False
        both(r, "gemm_fp32_s", lambda: gemm_tiled(X, CT, rows), "torch")
        torch.backends.cuda.matmul.allow_tf32 = True
        both(r, "gemm_tf32_s", lambda: gemm_tiled(X, CT, rows), "torch")
        torch.backends.cuda.matmul.allow_tf32 = False
        # float16 in and out, float32 accumulation: the GEMM that tf32 precision runs by default
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        Xh, CTh = X.half(), CT.half()
        both(r, "gemm_fp16_s", lambda: gemm_tiled(Xh, CTh, rows), "torch")
        Xh = CTh = None
        Y = torch.empty_like(X)
        both(r, "hbm_read_s", lambda: Y.copy_(X), "torch")
        r["hbm_read_s"] /= 2
        r["hbm_read_ev_s"] /= 2
        Y = CT = None  # freed before the step (assigned, not deleted: the timing lambdas name them)
        Xc, Cc = cupy.from_dlpack(X), cupy.from_dlpack(C)
        grid = Grid.for_block(Xc)  # a fit's grid: computed once, before the loop
        labels = {}
        for mode in args.modes.split(","):
            prep = be.prepare(Cc, np.float32, mode)
            both(r, f"daskmeans_{mode}_s", lambda: be.assign(Xc, prep, grid=grid), "cupy", reps=5, warm=2)
            out = be.assign(Xc, prep, grid=grid)
            labels[mode] = out["labels"].copy()
            r[f"rechecked_{mode}"] = float(out["rechecked"]) / n
            r[f"gemm_inputs_{mode}"] = ["as given", "tf32", "3xtf32", "bf16", "fp16 (scaled)"][prep.mode]
            r[f"regime_{mode}"] = "fused-small" if prep.small is not None else "gemm-cublas"
            out = prep = None
        for mode in labels:
            if mode != "fp32" and "fp32" in labels:
                r[f"labels_equal_{mode}_fp32"] = bool((labels[mode] == labels["fp32"]).all())
        del labels

        CT = C.T.contiguous()
        csq = (C * C).sum(1)
        out = torch.empty((rows, k), device="cuda")

        def tiled():  # the yardstick: GEMM, row argmin, index_add per row tile
            sums = torch.zeros((k, d), device="cuda")
            for s in range(0, n, rows):
                xt = X[s : s + rows]
                o = out[: xt.shape[0]]
                torch.addmm(csq, xt, CT, beta=1.0, alpha=-2.0, out=o)
                sums.index_add_(0, o.argmin(1), xt)
            return sums

        if not args.skip_torch:
            for mode in ("fp32", "tf32"):
                if f"daskmeans_{mode}_s" in r:
                    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
                    both(r, f"torch_{mode}_s", tiled, "torch", reps=5, warm=2)
            torch.backends.cuda.matmul.allow_tf32 = False
        CT = out = None
        add_ratios(r)
        rows_out.append(r)
        X = C = Xc = Cc = None  # freed before the next problem's data
        torch.cuda.empty_cache()
        cupy.get_default_memory_pool().free_all_blocks()
        print(json.dumps(r), flush=True)
    doc = {
        "benchmark": "gpu_kernel_step",
        "device": dev,
        "date": meta.now(),
        "commit": meta.commit(),
        "cupy": cupy.__version__,
        "torch": torch.__version__,
        "results": rows_out,
    }
    print(f"{'prob':5s} {'fp32':>9s} {'tf32':>9s} {'gemm32':>9s} {'gemmtf32':>9s} {'hbm rd':>8s} {'torch':>9s} "
          f"{'x gemm':>7s} {'x tf32':>7s} {'x hbm':>7s} {'rchk tf32':>9s}")
    for r in rows_out:
        for ev in ("", "_ev"):
            def ms(key):
                key = key[:-2] + ev + "_s"
                return f"{r[key] * 1e3:9.3f}" if key in r else f"{'-':>9s}"

            def x(key):
                return f"{r[key + ev]:7.2f}" if key + ev in r else f"{'-':>7s}"

            print(f"{r['problem'] + ev:5s} {ms('daskmeans_fp32_s')} {ms('daskmeans_tf32_s')} {ms('gemm_fp32_s')} "
                  f"{ms('gemm_tf32_s')} {ms('hbm_read_s')} {ms('torch_tf32_s')} {x('ratio_fp32_vs_gemm_fp32')} "
                  f"{x('ratio_tf32_vs_gemm_tf32')} {x('ratio_fp32_vs_hbm_read')} {r.get('rechecked_tf32', float('nan')):9.4f}")
    meta.write(doc, args.out, LAYOUT, args.merge)


if __name__ == "__main__":
    sys.exit(main())
