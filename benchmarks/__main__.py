"""``python -m benchmarks SUBCOMMAND [options]``: run one benchmark (see ``--help``)."""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# subcommand: (script, what it measures)
SUBCOMMANDS = {
    "kernels": ("bench_gpu_kernels.py", "one GPU kernel step on P2-P4, S1, S2 against the cuBLAS GEMM and HBM floors"),
    "command": ("bench_command.py", "whole `daskmeans fit` commands (warm and cold kernel cache) against scikit-learn's script"),
    "multigpu": ("bench_multigpu.py", "P3 and P4 per iteration on 1 and 2 (or more) GPUs, NCCL and Dask collectives"),
    "tiers": ("bench_tiers.py", "host and storage tiers against the pinned copy and the store's read floors; P4 host vs device"),
    "cpu": ("bench_cpu.py", "the CPU kernels against scikit-learn and dask-ml on 2 cores"),
    "profile-step": ("profile_gpu_step.py", "the GEMM regime's step in pieces (GEMM, select, prep, sums)"),
    "profile-small": ("profile_fused_small.py", "compile-time variants of the fused small-K kernel"),
    "profile-host": ("profile_host_overhead.py", "host-side cost of a small-K step"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in SUBCOMMANDS.items())
    return f"usage: python -m benchmarks SUBCOMMAND [options]  (SUBCOMMAND --help for its options)\n\n{rows}"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(f"unknown subcommand {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    script = os.path.join(HERE, SUBCOMMANDS[argv[0]][0])
    sys.path.insert(0, HERE)  # the scripts import their shared helpers by plain name
    sys.argv = [script] + argv[1:]
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
