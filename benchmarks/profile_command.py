"""``python -m benchmarks profile-command``: where a ``daskmeans`` command's main thread spends
its time, within its phases and between them. The command runs in this process as the
``daskmeans`` script runs it (``main`` with the process's exit), its main thread's stack
sampled every ``--every`` milliseconds by a thread; printed: the seconds of each stack of the
package's frames (the ``--top`` largest), then a timeline of the frames below the command's
``run_fit`` (or the engine's ``fit_distributed``, where it is on the stack) as they change;
with ``--threads``, every other thread's stacks as well (an in-process worker runs its tasks
on threads of the command's process: the init's and the iterations' host work there).
The phases of ``fit --timings`` leave out what runs between them; this found the host work of
a wide-K fit there (docs/performance.md, "Several GPUs"). Without ``--threads`` only the main
thread is sampled: a wait for the workers shows as the call that waits. Prints, writes no
file.

``--during NAME`` keeps, of the other threads, the samples taken while the main thread was in
a function of that name (e.g. ``init_kmeans_parallel``: a fit's init), and prints each
thread's timeline there: the function its task runs (below ``task.py``'s ``__call__``) and
what below it took the time, as they change.

    python -m benchmarks profile-command [--every MS] [--top N] [--threads [--during NAME]] -- fit DATA --k K [fit's options]
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

SUMMARY = "where a whole `daskmeans` command's main thread spends its time, its phases and between them"


def _frames(frame) -> tuple[str, ...]:
    """The package's frames of a stack, outermost first, as ``module/path.py:function:line``."""
    out = []
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/daskmeans/" in path:
            out.append(f"{path.rsplit('/daskmeans/', 1)[1]}:{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return tuple(reversed(out))


def sample(run, every_s: float, threads: bool = False) -> tuple[object, list, dict]:
    """``run()`` in this thread while another records this thread's package frames every
    ``every_s`` seconds: its result, the samples ``(seconds since the start, frames)``, and with
    ``threads`` every other thread's too (the in-process workers' task threads, the
    compiles'), by thread name: ``{name: [(seconds, frames, seconds since the sample
    before), ...]}``, the samples where the thread was in the package's code."""
    main_id = threading.get_ident()
    samples: list[tuple[float, tuple[str, ...]]] = []
    others: dict[str, list] = collections.defaultdict(list)
    done = threading.Event()
    t0 = time.perf_counter()

    def sampler() -> None:
        me, last = threading.get_ident(), 0.0
        while not done.is_set():
            now = sys._current_frames()
            t = time.perf_counter() - t0
            dt, last = t - last, t
            samples.append((t, _frames(now.get(main_id))))
            if threads:
                names = {th.ident: th.name for th in threading.enumerate()}
                for ident, frame in now.items():
                    if ident not in (main_id, me):
                        frames = _frames(frame)
                        if frames:
                            others[names.get(ident, str(ident))].append((t, frames, dt))
            done.wait(every_s)

    th = threading.Thread(target=sampler, name="profile-command-sampler", daemon=True)
    th.start()
    try:
        result = run()
    finally:
        done.set()
        th.join()
    return result, samples, dict(others)


def report_threads(others: dict, top: int) -> str:
    """Each other thread's stacks of the package's frames, the threads in the package longest
    first, each with its ``top`` largest stacks (a sample counts the time since the one
    before)."""
    lines = []
    for name, got in sorted(others.items(), key=lambda kv: -sum(dt for _, _, dt in kv[1])):
        spent: collections.Counter = collections.Counter()
        for _, frames, dt in got:
            spent[" > ".join(frames)] += dt
        lines.append(f"thread {name}: {sum(spent.values()):.3f} s in the package's code, from "
                     f"{got[0][0]:.3f} s to {got[-1][0]:.3f} s")
        lines += [f"{sec:7.3f}  {stack}" for stack, sec in spent.most_common(top)]
    return "\n".join(lines)


def window(samples: list[tuple[float, tuple[str, ...]]], name: str) -> tuple[float, float] | None:
    """The first and last time the main thread's ``samples`` show a frame of function ``name``
    (None where none does)."""
    hits = [t for t, frames in samples if any(f.split(":")[-2] == name for f in frames)]
    return (hits[0], hits[-1]) if hits else None


def report_timelines(others: dict, span: tuple[float, float]) -> str:
    """Each worker thread's samples within ``span``: the two frames below its task's call
    (``task.py:__call__``) as they change, with when and how long (runs under 5 ms left out);
    ``(idle)`` where the thread was out of the package's code (no sample for over 10 ms),
    ``(outside a task)`` where it ran the package's code outside a task."""
    lines = []
    for name, got in sorted(others.items()):
        inside = [(t, frames) for t, frames, _ in got if span[0] <= t <= span[1]]
        if not any(any(":__call__:" in f and f.startswith("engine/task.py") for f in fr) for _, fr in inside):
            continue
        lines.append(f"thread {name} from {span[0]:.3f} s to {span[1]:.3f} s:")
        runs: list = []  # [key, start, end]
        prev = None
        for t, frames in inside:
            calls = [i for i, f in enumerate(frames) if f.startswith("engine/task.py") and ":__call__:" in f]
            key = " > ".join(f.rsplit(":", 1)[0] for f in frames[calls[0] + 1:calls[0] + 3]) if calls else \
                "(outside a task)"
            if prev is not None and t - prev > 0.01:  # no sample in between: not in the package's code
                runs.append(["(idle)", prev, t])
                runs.append([key, t, t])
            elif runs and runs[-1][0] == key:
                runs[-1][2] = t
            else:
                if runs:
                    runs[-1][2] = t
                runs.append([key, t, t])
            prev = t
        shown: list = []  # runs of 5 ms or more, neighbours of one key joined
        for key, t0, t1 in runs:
            if t1 - t0 < 0.005:
                continue
            if shown and shown[-1][0] == key:
                shown[-1][2] = t1
            else:
                shown.append([key, t0, t1])
        lines += [f"{t0:7.3f}  {t1 - t0:7.3f}  {key}" for key, t0, t1 in shown]
    return "\n".join(lines)


def report(samples: list[tuple[float, tuple[str, ...]]], top: int) -> str:
    """The seconds of each stack (each sample counts until the next), the ``top`` largest, and
    the timeline of the three frames below the deepest ``run_fit`` or ``fit_distributed``
    (changes shorter than 20 ms left out)."""
    spent: collections.Counter = collections.Counter()
    for (t, frames), (t2, _) in zip(samples, samples[1:]):
        spent[" > ".join(frames)] += t2 - t
    lines = ["seconds  stack of the package's frames (outermost first)"]
    lines += [f"{s:7.3f}  {stack or '(none of the package)'}" for stack, s in spent.most_common(top)]
    lines += ["", "   from   lasting  below run_fit / fit_distributed"]
    last, since = None, 0.0
    for t, frames in samples + [(samples[-1][0] if samples else 0.0, ("(end)",))]:
        anchors = [i for i, f in enumerate(frames) if ":run_fit:" in f or ":fit_distributed:" in f]
        key = " > ".join(f.rsplit(":", 1)[0] for f in frames[anchors[-1] + 1:anchors[-1] + 4]) if anchors else \
            ("(end)" if frames == ("(end)",) else "(outside run_fit)")
        if key != last:
            if last is not None and t - since >= 0.02:
                lines.append(f"{since:7.3f}  {t - since:7.3f}  {last or '(in the function itself)'}")
            last, since = key, t
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks import meta

    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = meta.parser("profile-command", __doc__)
    ap.add_argument("--every", type=float, default=2.0, help="milliseconds between samples (default 2)")
    ap.add_argument("--top", type=int, default=40, help="stacks to print, the largest first (default 40)")
    ap.add_argument("--threads", action="store_true",
                    help="every other thread's stacks too, by thread (the in-process workers' tasks, the compiles)")
    ap.add_argument("--during", metavar="NAME",
                    help="with --threads: only the other threads' samples while the main thread is in function NAME, "
                         "and each worker thread's timeline there")
    args = ap.parse_args(own)
    if args.during and not args.threads:
        ap.error("--during needs --threads")
    if not command:
        ap.error("give the daskmeans command after --, e.g. -- fit data.npy --k 8")
    import importlib

    cli = importlib.import_module("daskmeans.cli.main")
    cli.parser().parse_args(command)  # usage errors end here, as the script's do
    cli.command_process(dashboard=False)
    rc, samples, others = sample(lambda: cli.main(command, process_exit=True), args.every / 1e3, args.threads)
    print(report(samples, args.top), flush=True)
    if args.threads:
        span = window(samples, args.during) if args.during else None
        if args.during and span is None:
            print(f"\nthe main thread was never in {args.during}", flush=True)
        elif span is not None:
            others = {name: [s for s in got if span[0] <= s[0] <= span[1]] for name, got in others.items()}
            others = {name: got for name, got in others.items() if got}
            print(f"\nwhile the main thread was in {args.during}: {span[0]:.3f} s to {span[1]:.3f} s", flush=True)
            print(report_timelines(others, span), flush=True)
        print("\n" + report_threads(others, max(1, args.top // 4)), flush=True)
    sys.stderr.flush()
    # As the script ends: the command's own local cluster is left to the process's exit.
    os._exit(rc)


if __name__ == "__main__":
    main()
