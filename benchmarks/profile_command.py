"""``python -m benchmarks profile-command``: where a ``daskmeans`` command's main thread spends
its time, within its phases and between them. The command runs in this process as the
``daskmeans`` script runs it (``main`` with the process's exit), its main thread's stack
sampled every ``--every`` milliseconds by a thread; printed: the seconds of each stack of the
package's frames (the ``--top`` largest), then a timeline of the frames below the command's
``run_fit`` (or the engine's ``fit_distributed``, where it is on the stack) as they change.
The phases of ``fit --timings`` leave out what runs between them; this found the host work of
a wide-K fit there (docs/performance.md, "Several GPUs"). Only the main thread is sampled: a
wait for the workers shows as the call that waits. Prints, writes no file.

    python -m benchmarks profile-command [--every MS] [--top N] -- fit DATA --k K [fit's options]
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


def sample(run, every_s: float) -> tuple[object, list[tuple[float, tuple[str, ...]]]]:
    """``run()`` in this thread while another records this thread's package frames every
    ``every_s`` seconds: its result and the samples ``(seconds since the start, frames)``."""
    main_id = threading.get_ident()
    samples: list[tuple[float, tuple[str, ...]]] = []
    done = threading.Event()
    t0 = time.perf_counter()

    def sampler() -> None:
        while not done.is_set():
            samples.append((time.perf_counter() - t0, _frames(sys._current_frames().get(main_id))))
            done.wait(every_s)

    th = threading.Thread(target=sampler, name="profile-command-sampler", daemon=True)
    th.start()
    try:
        result = run()
    finally:
        done.set()
        th.join()
    return result, samples


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
    args = ap.parse_args(own)
    if not command:
        ap.error("give the daskmeans command after --, e.g. -- fit data.npy --k 8")
    import importlib

    cli = importlib.import_module("daskmeans.cli.main")
    cli.parser().parse_args(command)  # usage errors end here, as the script's do
    cli.command_process(dashboard=False)
    rc, samples = sample(lambda: cli.main(command, process_exit=True), args.every / 1e3)
    print(report(samples, args.top), flush=True)
    sys.stderr.flush()
    # As the script ends: the command's own local cluster is left to the process's exit.
    os._exit(rc)


if __name__ == "__main__":
    main()
