"""What people see of a command's work: a live bar on a terminal, or plain lines.

:class:`Progress` shows a fit's iterations; it is used by the command line (on stderr) and by
``KMeans(verbose=...)`` (on stdout, as in a notebook). The statistics are the loop's (see
``KMeans.history_``), plus ``run``.

:class:`Steps` shows the other long steps of a command (placing the data, the init, writing
labels, generating data). The code doing a step reports it through the events of
:mod:`daskmeans.events` (``step``, ``advance``, ``note``), which do nothing unless a command
watches them with a :class:`Steps` (``events.watching``): the library itself prints nothing.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


class Progress:
    """A fit's progress, called with each iteration's statistics: a live bar on a terminal
    (iteration, inertia, shift, seconds per iteration, time left to ``max_iter``, an upper
    bound), one line per iteration otherwise or with ``verbose`` (which adds the cluster-size
    imbalance and the throughput), nothing when ``quiet``. Runs of ``n_init`` are numbered.

    Parameters
    ----------
    quiet, verbose : bool
    max_iter, n_init : int
        The fit's, for the bar's length and the run numbers.
    stream : file, default sys.stderr
    live : bool, optional
        Whether to draw the bar; default: when ``stream`` is a terminal and neither ``quiet``
        nor ``verbose``.
    """

    def __init__(self, quiet: bool, verbose: bool, max_iter: int, n_init: int, stream=None,
                 live: bool | None = None):
        self.stream = stream or sys.stderr
        self.quiet, self.verbose, self.max_iter, self.n_init = quiet, verbose, max_iter, n_init
        self.live = (not quiet and not verbose and self.stream.isatty()) if live is None else live
        self.bar = None
        self.run = None

    def __call__(self, s: dict) -> None:
        if self.quiet:
            return
        run = s.get("run", 1)
        tag = f"run {run}/{self.n_init} " if self.n_init > 1 else ""
        if not self.live:
            print(
                f"{tag}iter {s['iteration']:4d}  inertia {s['inertia']:.6e}  shift {s['shift']:.3e}  "
                f"reassigned {s['reassigned']:>10d}  empty {s['n_empty']}  {s['seconds']:.3f} s"
                + (f"  rechecked {100 * s['rechecked']:.2f}%" if s.get("rechecked") else "")
                + (f"  imbalance {s['imbalance']:.2f}  {s['gb_per_s']:.2f} GB/s" if self.verbose and "gb_per_s" in s else ""),
                file=self.stream, flush=True,
            )
            return
        if self.bar is None or run != self.run:
            self.close()
            from tqdm import tqdm

            size = shutil.get_terminal_size()  # 80 x 24 where the terminal says 0 x 0 (tqdm then draws nothing)
            self.run, self.seconds = run, 0.0
            # Speed and time left from the iterations' own seconds: statistics arrive in bursts
            # (one per segment), so a rate from their arrival times would be wrong.
            self.bar = tqdm(total=self.max_iter, initial=s["iteration"] - 1, desc=(tag or "fit ").strip(),
                            bar_format=self._format(""), file=self.stream, leave=True, ncols=size.columns,
                            nrows=size.lines)
        self.seconds += s["seconds"]
        per = self.seconds / max(1, s["iteration"] - self.bar.initial)
        left = self.bar.format_interval((self.max_iter - s["iteration"]) * per)
        self.last = f"inertia {s['inertia']:.4e} shift {s['shift']:.1e} {per:.3f}s/it"
        self.bar.bar_format = self._format(f"{self.last} ETA<{left}")
        self.bar.update(s["iteration"] - self.bar.n)

    @staticmethod
    def _format(text: str) -> str:
        return "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}" + (f" [{text}]" if text else "")

    def close(self) -> None:
        """End the bar: a converged fit's bar ends at its last iteration."""
        if self.bar is not None:
            self.bar.total = self.bar.n
            self.bar.bar_format = self._format(self.last)
            self.bar.close()
            self.bar = None


class Steps:
    """The long steps of a command besides the iterations, each shown while it runs: a tqdm
    bar on a terminal (with a count and ETA where the step knows its total), else one line
    when it ends (``daskmeans: place: 12/12 chunks in 0.53 s``, ``daskmeans: init random in
    0.20 s``); nothing when ``quiet``.
    Notes (``events.note``) are lines, none when ``quiet``.

    Parameters
    ----------
    quiet : bool
    stream : file, default sys.stderr
    live : bool, optional
        Whether to draw bars; default: when ``stream`` is a terminal and not ``quiet``.
    """

    def __init__(self, quiet: bool, stream: TextIO | None = None, live: bool | None = None):
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.live = (not quiet and self.stream.isatty()) if live is None else live
        self.name: str | None = None
        self.bar = None

    def start(self, name: str, total: int | None, unit: str) -> None:
        self.name, self.total, self.unit, self.done, self.t0 = name, total, unit, 0, time.perf_counter()
        if self.live and not self.quiet:
            from tqdm import tqdm

            size = shutil.get_terminal_size()
            # A step of unknown length shows the time it has taken.
            fmt = None if total is not None else "{desc}: {elapsed}"
            self.bar = tqdm(total=total, desc=name, unit=f" {unit}" if unit else "it", file=self.stream,
                            leave=True, ncols=size.columns, nrows=size.lines, bar_format=fmt)

    def advance(self, done: int, total: int | None = None) -> None:
        if self.name is None:
            return
        if total is not None and total != self.total:
            self.total = total
            if self.bar is not None:
                self.bar.total = total
                self.bar.bar_format = None  # now with its count and ETA
                self.bar.refresh()
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done

    def end(self, failed: bool = False) -> None:
        """The step is over: its bar closed, or its line printed (none for a step that
        failed: the error's line says what happened)."""
        if self.name is None:
            return
        seconds = time.perf_counter() - self.t0
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif not self.quiet and not failed:
            count = f": {self.done}/{self.total}" + (f" {self.unit}" if self.unit else "") if self.total else ""
            print(f"daskmeans: {self.name}{count} in {seconds:.2f} s", file=self.stream, flush=True)
        self.name = None

    def note(self, line: str) -> None:
        if self.quiet:  # -q: a command that succeeds prints nothing
            return
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)
