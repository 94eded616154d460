"""``python -m benchmarks kernels``: one GPU kernel step against the cuBLAS GEMM floors and flash-kmeans.

On one GPU, data resident, per iteration: median time (CUDA events, after warm-up, fresh
random data per problem) of daskmeans' CuPy kernel step (``backends.cupy_backend.assign``) and, in
the same run, the floors: cuBLAS fp32 and tf32 GEMM of N x D x K (row-tiled like the kernel
where N x K would not fit), one HBM read of X (a device copy's time / 2), and a tiled PyTorch
step of the same precision (GEMM ``||c||^2 - 2 x c^T``, row argmin, ``index_add``; labels not
certified) for fp32 and TF32. Each is timed twice: between device synchronisations (wall
clock) and between CUDA events of the library doing the work (keys ``*_ev_s``). Writes JSON
with device, date and commit.

    python -m benchmarks kernels [--problems P2,P3,P4,S1,S2] [--modes fp32,tf32,bf16] [--skip-torch]
        [--skip-flash] [--out results/gpu_kernels_<device>.json [--merge]]

Committed results: ``results/gpu_kernels_<device>.json``, rows keyed by problem, each with its
commit and date (P4 may run as a second call with ``--merge``).

Per problem it also records, for each low-precision mode, the fraction of rows the kernel had
to re-rank exactly and whether its labels equal the fp32 mode's; where tf32 runs
``fused_select`` (the float16 GEMM and the selection in one kernel), also the float16 tile
path it replaces (``daskmeans_tf32_tile_s``, ``rechecked_tf32_tile``).

flash-kmeans (a peer, optional: imported by this benchmark only where it is installed, never a
daskmeans dependency) runs one Lloyd iteration (Triton assignment and sorted centroid update)
through its public ``flash_kmeans.batch_kmeans_Euclid`` on the same data and initial
centroids, with float16 and with float32 input (Triton's ``tl.dot`` multiplies float32 inputs
in TF32 unless ``TRITON_F32_DEFAULT`` says otherwise: the run records which). Its iteration is
the difference of a call of 1 + :data:`FLASH_EXTRA` iterations and a call of 1, divided by
:data:`FLASH_EXTRA`: what a fit pays per iteration, without the call's own set-up (the rows'
squared norms), which the one-iteration call (``call_s``) includes. A row's ``flash_kmeans``
is null where flash-kmeans is absent or ``--skip-flash`` was given; a precision whose kernel
flash-kmeans refuses (shared memory at large D in float16) records the error's first line.
Ratios: ``ratio_tf32_vs_flash_fp16`` and ``ratio_fp32_vs_flash_fp32`` (daskmeans' step over
flash-kmeans' iteration).

The wide-K acceptance (tf32 against flash-kmeans' float16 iteration and the float16 GEMM, tf32
against fp32 at K = 2^10 ... 2^18, fp32 against the fp32 GEMM) in one call:

    python -m benchmarks kernels --problems W10,W12,W14,W16,W18 --modes fp32,tf32 \\
        --out benchmarks/results/gpu_kernels_h200.json --merge
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from benchmarks import meta, problems

SUMMARY = ("one GPU kernel step on P2-P4, S1, S2, W10-W18, V12-V18 against the cuBLAS GEMM and HBM floors "
           "and flash-kmeans")  # its line in --help

PROBLEMS = problems.pick("P2", "P3", "P4", "S1", "S2", "W10", "W12", "W14", "W16", "W18", "V12", "V14", "V16", "V18")
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

# flash-kmeans' input precision each mode's step is compared with: the tf32 mode runs a
# (scaled) float16 GEMM, so its peer is flash-kmeans' float16 iteration; fp32 meets float32 input.
FLASH_PEERS = {"tf32": "fp16", "fp32": "fp32"}
FLASH_DTYPES = ("fp16", "fp32")

# Iterations beyond the first in the longer of the two flash-kmeans calls whose difference is
# its iteration (see the module's docstring).
FLASH_EXTRA = 3


def add_ratios(r: dict) -> None:
    """Add to a problem's row ``r`` each timed mode's step time over its :data:`FLOORS`
    (``ratio_<mode>_vs_<floor>``), over flash-kmeans' iteration of its :data:`FLASH_PEERS`
    precision (``ratio_<mode>_vs_flash_<precision>``, where ``r["flash_kmeans"]`` has that
    precision's time) and PyTorch's step time over it (``speedup_<mode>_vs_torch``), for
    synchronised wall times and for CUDA-event times (suffix ``_ev``)."""
    flash = r.get("flash_kmeans") or {}
    for ev in ("", "_ev"):
        for mode, floors in FLOORS.items():
            step = r.get(f"daskmeans_{mode}{ev}_s")
            if not step:
                continue
            for floor in floors:
                r[f"ratio_{mode}_vs_{floor}{ev}"] = step / r[f"{floor}{ev}_s"]
            peer = FLASH_PEERS[mode]
            iteration = (flash.get(peer) or {}).get(f"iteration{ev}_s")
            if iteration:
                r[f"ratio_{mode}_vs_flash_{peer}{ev}"] = step / iteration
            if f"torch_{mode}{ev}_s" in r:
                r[f"speedup_{mode}_vs_torch{ev}"] = r[f"torch_{mode}{ev}_s"] / step


def load_flash() -> tuple[object | None, str | None, str | None]:
    """flash-kmeans where it is installed with its Triton kernels.

    Returns
    -------
    module : module or None
        ``flash_kmeans``, or None where it is not installed.
    version : str or None
        Its version (None where not installed).
    error : str or None
        Why its Triton kernels cannot run where it is installed but they did not import (its
        package then falls back to a PyTorch loop, which is not the peer measured here), else
        None.
    """
    try:
        import flash_kmeans
    except ImportError:
        return None, None, None
    version = getattr(flash_kmeans, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version("flash-kmeans")
        except metadata.PackageNotFoundError:  # importable, but installed under another name
            version = "unknown"
    # The package's __init__ swallows a failed import of its Triton modules and binds its
    # PyTorch fallback under the same name: import the module itself for the reason.
    if getattr(flash_kmeans.batch_kmeans_Euclid, "__module__", "") != "flash_kmeans.kmeans_triton_impl":
        try:
            import flash_kmeans.kmeans_triton_impl  # noqa: F401
        except Exception as e:
            return flash_kmeans, version, first_line(e)
        return flash_kmeans, version, "flash_kmeans.batch_kmeans_Euclid is not its Triton implementation"
    return flash_kmeans, version, None


def first_line(e: BaseException) -> str:
    """``"TypeName: first line of the message"`` (Triton's resource errors run to many lines)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def time_flash(fk: object, X: object, C: object, dtype: str, extra: int = FLASH_EXTRA) -> dict:
    """One flash-kmeans Lloyd iteration on ``X`` from ``C``, in ``dtype``.

    Parameters
    ----------
    fk : module
        ``flash_kmeans`` (its Triton implementation, :func:`load_flash`).
    X : torch.Tensor
        ``(n, d)`` float32 on the GPU.
    C : torch.Tensor
        ``(k, d)`` float32 on the GPU: the initial centroids.
    dtype : str
        ``"fp16"`` or ``"fp32"``: the input precision flash-kmeans is given.
    extra : int
        Iterations beyond the first in the longer call.

    Returns
    -------
    dict
        ``iteration_s`` and ``iteration_ev_s`` (synchronised and by PyTorch's CUDA events: the
        difference of the two calls' medians over ``extra``), ``call_s`` and ``call_ev_s`` (one
        call of one iteration, its set-up included); or ``{"error": first line}`` where
        flash-kmeans refuses the shape.
    """
    import torch

    torch_dtype = {"fp16": torch.float16, "fp32": torch.float32}[dtype]
    k = C.shape[0]
    x = c = None
    try:
        # flash-kmeans takes a batch: (1, n, d) and (1, k, d); float32 input is X itself.
        x, c = X.to(torch_dtype)[None], C.to(torch_dtype)[None]

        def run(iters):
            # tol=0: the centre shift is never below it, so every iteration runs.
            return lambda: fk.batch_kmeans_Euclid(x, k, max_iters=iters, tol=0.0, init_centroids=c)

        run(1 + extra)()  # Triton compiles its kernels here: never in a timed call
        torch.cuda.synchronize()
        one, more = {}, {}
        both(one, "t_s", run(1), "torch")
        both(more, "t_s", run(1 + extra), "torch")
        return {"iteration_s": (more["t_s"] - one["t_s"]) / extra,
                "iteration_ev_s": (more["t_ev_s"] - one["t_ev_s"]) / extra,
                "call_s": one["t_s"], "call_ev_s": one["t_ev_s"], "iterations_per_call": [1, 1 + extra]}
    except Exception as e:  # a shape its kernels cannot run (shared memory): recorded, the run goes on
        return {"error": first_line(e)}
    finally:
        x = c = None
        torch.cuda.empty_cache()


def gemm_tiled(X, CT, rows):
    import torch

    out = torch.empty((rows, CT.shape[1]), device=X.device, dtype=X.dtype)
    for s in range(0, X.shape[0], rows):
        xt = X[s : s + rows]
        torch.matmul(xt, CT, out=out[: xt.shape[0]])


MODES = ("fp32", "tf32", "bf16")  # daskmeans.options.PRECISIONS, named here so that --help imports no daskmeans


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed and checked before any GPU library is imported.

    Returns
    -------
    args : argparse.Namespace
        ``problems`` (the chosen :class:`~benchmarks.problems.Problem` list), ``modes`` (list
        of str), ``skip_torch``, ``skip_flash``, ``out``, ``merge``.
    """
    ap = meta.parser("kernels", __doc__)
    ap.add_argument("--problems", default="P2,P3,P4,S1,S2", help=f"comma-separated, of {', '.join(PROBLEMS)}")
    ap.add_argument("--modes", default="fp32,tf32,bf16", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--skip-torch", action="store_true", help="no PyTorch step")
    ap.add_argument("--skip-flash", action="store_true",
                    help="no flash-kmeans iteration (rows record flash_kmeans: null, as where it is not installed)")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "gpu_kernel_step")
    args.problems = meta.chosen(ap, args.problems, PROBLEMS)
    args.modes = meta.names(ap, args.modes, MODES, "mode")
    return args


def _ms(r: dict, key: str) -> str:
    """``r[key]`` in milliseconds, 9 wide, or ``-`` where the row lacks it."""
    return f"{r[key] * 1e3:9.3f}" if r.get(key) is not None else f"{'-':>9s}"


def table(rows: list[dict]) -> str:
    """The run's table: per problem a synchronised line and an ``_ev`` (CUDA events) line.

    Parameters
    ----------
    rows : list of dict
        The results' rows (those of an older file lack the flash-kmeans keys; a row's
        ``flash_kmeans`` may be null, or a precision an ``error``): a missing figure shows ``-``.

    Returns
    -------
    str
        The header and two lines per row; flash-kmeans' errors follow, one line each.
    """
    lines = [f"{'prob':6s} {'fp32':>9s} {'tf32':>9s} {'gemm32':>9s} {'gemmtf32':>9s} {'hbm rd':>9s} {'torch':>9s} "
             f"{'flash16':>9s} {'flash32':>9s} {'x gemm':>7s} {'x tf32':>7s} {'x gm16':>7s} {'x hbm':>7s} "
             f"{'x fl16':>7s} {'x fl32':>7s} {'rchk tf32':>9s}"]
    errors = []
    for r in rows:
        flash = r.get("flash_kmeans") or {}
        for ev in ("", "_ev"):
            def ms(key):
                return _ms(r, key[:-2] + ev + "_s")

            def fl(dtype):
                return _ms(flash.get(dtype) or {}, f"iteration{ev}_s")

            def x(key):
                return f"{r[key + ev]:7.2f}" if r.get(key + ev) is not None else f"{'-':>7s}"

            lines.append(
                f"{r['problem'] + ev:6s} {ms('daskmeans_fp32_s')} {ms('daskmeans_tf32_s')} {ms('gemm_fp32_s')} "
                f"{ms('gemm_tf32_s')} {ms('hbm_read_s')} {ms('torch_tf32_s')} {fl('fp16')} {fl('fp32')} "
                f"{x('ratio_fp32_vs_gemm_fp32')} {x('ratio_tf32_vs_gemm_tf32')} {x('ratio_tf32_vs_gemm_fp16')} "
                f"{x('ratio_fp32_vs_hbm_read')} {x('ratio_tf32_vs_flash_fp16')} {x('ratio_fp32_vs_flash_fp32')} "
                f"{r.get('rechecked_tf32', float('nan')):9.4f}")
        for dtype in FLASH_DTYPES:
            if "error" in (flash.get(dtype) or {}):
                errors.append(f"{r['problem']}: flash-kmeans {dtype}: {flash[dtype]['error']}")
    return "\n".join(lines + errors)


def main(argv=None):
    args = parse_args(argv)
    chosen = args.problems
    import cupy
    import dask
    import torch

    from daskmeans.backends import get_backend
    from daskmeans.numerics.grid import Grid

    be = get_backend("cupy")
    dev = torch.cuda.get_device_name()
    fk = flash_version = flash_error = None
    if not args.skip_flash:
        fk, flash_version, flash_error = load_flash()
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
        for mode in args.modes:
            prep = be.prepare(Cc, np.float32, mode)
            both(r, f"daskmeans_{mode}_s", lambda: be.assign(Xc, prep, grid=grid), "cupy", reps=5, warm=2)
            out = be.assign(Xc, prep, grid=grid)
            labels[mode] = out["labels"].copy()
            r[f"rechecked_{mode}"] = float(out["rechecked"]) / n
            r[f"gemm_inputs_{mode}"] = ["as given", "tf32", "3xtf32", "bf16", "fp16 (scaled)"][prep.mode]
            r[f"regime_{mode}"] = ("fused-small" if prep.small is not None
                                   else "fused-fp16" if prep.fused is not None else "gemm-cublas")
            if prep.fused is not None:  # beside it, the float16 tile path it replaces
                with dask.config.set({"daskmeans.gpu-tf32-gemm": "fp16"}):
                    tile = be.prepare(Cc, np.float32, mode)
                both(r, f"daskmeans_{mode}_tile_s", lambda: be.assign(Xc, tile, grid=grid), "cupy", reps=5, warm=2)
                r[f"rechecked_{mode}_tile"] = float(be.assign(Xc, tile, grid=grid)["rechecked"]) / n
                tile = None
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
        cupy.get_default_memory_pool().free_all_blocks()  # the step's cached blocks, for flash-kmeans' PyTorch pool
        if fk is None:
            r["flash_kmeans"] = None
        elif flash_error is not None:
            r["flash_kmeans"] = {dtype: {"error": flash_error} for dtype in FLASH_DTYPES}
        else:
            r["flash_kmeans"] = {dtype: time_flash(fk, X, C, dtype) for dtype in FLASH_DTYPES}
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
        "flash_kmeans": flash_version,
        "results": rows_out,
    }
    if fk is not None and flash_error is None:
        import triton

        doc["triton"] = triton.__version__
        # What Triton's tl.dot does with flash-kmeans' float32 input (its default on tensor cores: TF32).
        doc["flash_kmeans_fp32_dot"] = os.environ.get("TRITON_F32_DEFAULT", "tf32")
    print(table(rows_out))
    meta.write(doc, args.out, LAYOUT, args.merge)


if __name__ == "__main__":
    sys.exit(main())
