"""daskmeans' benchmarks: one harness, ``python -m benchmarks SUBCOMMAND [options]`` from the
repository root (``--help`` lists the subcommands). Problems are in :mod:`benchmarks.problems`;
results go to ``benchmarks/results/<benchmark>_<device>.json``, one current file per benchmark
and device kind (git keeps the history)."""
