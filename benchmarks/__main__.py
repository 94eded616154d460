"""``python -m benchmarks SUBCOMMAND [options]``: run one subcommand's ``main(argv)`` (see
``--help``). A subcommand's module imports its GPU libraries itself once its options are
parsed, so ``--help`` (which reads every module's ``SUMMARY``) imports none."""

import importlib
import sys

# Each is the module of its name (``-`` read as ``_``), whose ``SUMMARY`` says what it measures.
SUBCOMMANDS = ("kernels", "command", "multigpu", "tiers", "placement", "cpu", "scale", "hosts", "csv-read", "pins", "gridsearch", "table",
               "profile-step", "profile-small", "profile-host", "profile-init", "profile-afk", "profile-yinyang",
               "profile-command", "profile-cold", "yinyang", "ab")


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {_module(name).SUMMARY}" for name in SUBCOMMANDS)
    return f"usage: python -m benchmarks SUBCOMMAND [options]  (SUBCOMMAND --help for its options)\n\n{rows}"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(f"unknown subcommand {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return _module(argv[0]).main(argv[1:]) or 0


def _module(name: str):
    return importlib.import_module(f"benchmarks.{name.replace('-', '_')}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
