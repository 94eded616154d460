"""``python -m benchmarks profile-cold``: when a first fit's kernels are compiled, on the clock of
the command's phases.

One ``daskmeans fit`` of a ``command`` problem (default ``w14``) on an empty kernel cache (a new
``CUPY_CACHE_DIR``), CuPy keeping each kernel's source beside its binary
(``CUPY_CACHE_SAVE_CUDA_SOURCE=1``). Then every binary in the cache, by when its file was
written (its modification time) relative to the command's start (``--timings``'
``main_started_at``: the same clock), with the kernels its source defines, and the warm-up
processes' markers (``daskmeans-warm-*``, one per op of :mod:`daskmeans.backends.gpu_warm_ops`
compiled). Printed: the command's phases, then the cache's files in the order they were
written, each with the phase it landed in, then how many landed in each phase.

A binary written during the moments pass or the init is one the fit waited for there, or
compiled itself (the timeline does not say which process wrote it); one written after the
command is one its warm-up processes compiled for later fits. Then it waits for those
processes (the temporary cache goes only once they are done) and counts what they wrote after
the listing (the rest of their list). Where the cold command's init is seconds longer than a
warm one's, this says which kernels it was waiting for (docs/performance.md, "A first fit").

    python -m benchmarks profile-cold [PROBLEM] [--gpus N]

Prints, writes no file.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Iterable

from benchmarks import meta

SUMMARY = "when a first fit's kernels are compiled, against the command's phases (empty kernel cache)"  # its line in --help

_KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def kernels(source: str) -> list[str]:
    """The names of the ``__global__`` functions that CUDA ``source`` defines, in order."""
    return _KERNEL.findall(source)


def spans(phases: dict[str, float]) -> list[tuple[str, float, float]]:
    """``(name, start, end)`` of each phase, in seconds from the command's start: the
    ``--timings`` phases run one after another from it."""
    out, t = [], 0.0
    for name, seconds in phases.items():
        out.append((name, t, t + float(seconds)))
        t += float(seconds)
    return out


def phase_at(t: float, timeline: list[tuple[str, float, float]]) -> str:
    """The phase that time ``t`` (seconds from the command's start) falls in; ``before`` or
    ``after`` the command."""
    if not timeline or t < timeline[0][1]:
        return "before"
    for name, start, end in timeline:
        if start <= t < end:
            return name
    return "after"


def cache_files(cache: str) -> list[tuple[float, str, list[str]]]:
    """``(written, file name, kernels)`` of every binary and warm-up marker under ``cache``, in
    the order they were written (``written``: seconds since the epoch)."""
    found = []
    for root, _, files in os.walk(cache):
        for f in files:
            path = os.path.join(root, f)
            if f.endswith(".cubin"):
                names = []
                if os.path.exists(path + ".cu"):
                    with open(path + ".cu", errors="replace") as src:
                        names = kernels(src.read())
                found.append((os.path.getmtime(path), f, names))
            elif f.startswith("daskmeans-warm"):
                found.append((os.path.getmtime(path), f, []))
    return sorted(found)


def report(files: Iterable[tuple[float, str, list[str]]], started_at: float,
           timeline: list[tuple[str, float, float]]) -> list[str]:
    """The printed lines: each file at its time from ``started_at`` with its phase and kernels,
    then the count of binaries that landed in each phase."""
    lines, counts = [], {}
    for written, name, names in files:
        t = written - started_at
        where = phase_at(t, timeline)
        if name.endswith(".cubin"):
            counts[where] = counts.get(where, 0) + 1
        shown = ", ".join(names[:3]) + (f" (+{len(names) - 3})" if len(names) > 3 else "")
        lines.append(f"{t:8.3f}  {where:<22} {name[:16] if name.endswith('.cubin') else name}  {shown}")
    order = ["before"] + [n for n, _, _ in timeline] + ["after"]
    lines.append("binaries written per phase: " + ", ".join(f"{p} {counts[p]}" for p in order if p in counts))
    return lines


def main(argv=None) -> None:
    from benchmarks import command

    ap = meta.parser("profile-cold", __doc__)
    ap.add_argument("problem", nargs="?", default="w14", help=f"of {', '.join(command.PROBLEMS)} (default w14)")
    ap.add_argument("--gpus", type=int, default=None, help="run on the first N GPUs (default: those the host shows)")
    args = ap.parse_args(argv)
    meta.names(ap, args.problem, command.PROBLEMS, "problem")
    spec = command.PROBLEMS[args.problem]
    os.environ["CUPY_CACHE_SAVE_CUDA_SOURCE"] = "1"
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as cache:
        path, ipath = command.make_data(args.problem, spec, folder)
        run = command.run_command(path, ipath, spec, folder, cache, args.gpus)
        started = run["main_started_at"]
        timeline = spans(run["command_phases"])
        print(f"{args.problem} on an empty kernel cache: {run['wall_s']:.3f} s, of which before main() and after it "
              f"{run['phases']['process start and exit']:.3f} s (commit {meta.commit()}, {meta.device_name()})")
        for name, a, b in timeline:
            print(f"  {name:<22} {a:8.3f} -> {b:8.3f}")
        files = cache_files(cache)
        for line in report(files, started, timeline):
            print(line)
        waited = command.settle(cache)  # the warm-up processes would write into the folder after it went
        print(f"the warm-up processes ended {waited:.1f} s after that, having written "
              f"{len(cache_files(cache)) - len(files)} more files")


if __name__ == "__main__":
    main()
