"""``python -m benchmarks SUBCOMMAND [options]``: run one subcommand's ``main(argv)`` (see
``--help``). Imports only the chosen subcommand's module, which imports its GPU libraries
itself once its options are parsed."""

import importlib
import sys

# subcommand: (module, what it measures)
SUBCOMMANDS = {
    "kernels": ("kernels", "one GPU kernel step on P2-P4, S1, S2 against the cuBLAS GEMM and HBM floors"),
    "command": ("command", "whole `daskmeans fit` commands (warm and cold kernel cache) against scikit-learn's script"),
    "multigpu": ("multigpu", "P3 and P4 per iteration on 1 and 2 (or more) GPUs, NCCL and Dask collectives"),
    "tiers": ("tiers", "host and storage tiers against the pinned copy and the store's read floors; P4 host vs device"),
    "cpu": ("cpu", "the CPU kernels against scikit-learn and dask-ml on 2 cores"),
    "scale": ("scale", "the largest fits (154 GB host tier; K = 2^20) as whole commands against the kernel step"),
    "hosts": ("hosts", "P3 on two simulated hosts of GPU workers: the Dask collective against NCCL over sockets"),
    "csv-read": ("csv_read", "P1 read from CSV on all cores against pyarrow's whole-file parse"),
    "table": ("table", "the README's performance tables from benchmarks/results/ (--check: fail where they differ)"),
    "profile-step": ("profile_step", "the GEMM regime's step in pieces (GEMM, select, prep, sums)"),
    "profile-small": ("profile_small", "compile-time variants of the fused small-K kernel"),
    "profile-host": ("profile_host", "host-side cost of a small-K step"),
    "profile-init": ("profile_init", "the k-means|| recluster at P4 and wide K: wall time, host profile, GEMM floor"),
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
    module = importlib.import_module(f"benchmarks.{SUBCOMMANDS[argv[0]][0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
