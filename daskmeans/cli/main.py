"""The ``daskmeans`` command: its parser, the dispatch to a subcommand, exit codes and signals.

Expected failures (bad input, bad parameters, unreachable scheduler, an output that cannot
be written) print one line ``daskmeans: error: ...`` and exit 1, never a traceback; usage
errors (an unknown option, a value out of range) print one line and exit 2. Each output is
locked for the whole command (a second writer is refused) and written atomically: a failure
leaves nothing partial behind and every previous output as it was.

Each subcommand is a module of this package (its options and its work): :mod:`.fit`,
:mod:`.predict` (``predict``, ``info``, ``plot``: the commands that read a fitted model),
:mod:`.generate`, :mod:`.sweep`; what they share is :mod:`.common`'s. The subcommands call the
public API only: they plan, place and submit nothing themselves.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import warnings
from typing import Callable, Sequence

from .. import __version__
from . import common, fit, generate, predict, sweep


class Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (``daskmeans fit: error: --k 0: should be an
    integer >= 1``, exit 2): the option validators' messages name the option and value
    themselves, so argparse's ``argument --k:`` prefix is dropped from them."""

    def error(self, message: str):
        m = re.match(r"argument ([^:]+): ", message)
        if m and message[m.end():].startswith(tuple(f"{flag} " for flag in m.group(1).split("/"))):
            message = message[m.end():]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# Each subcommand's work: argparse.Namespace -> exit status.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "fit": fit.run_fit, "predict": predict.run_predict, "info": predict.run_info, "plot": predict.run_plot,
    "generate": generate.run_generate, "sweep": sweep.run_sweep,
}


def parser() -> argparse.ArgumentParser:
    """The command's parser: every subcommand with its options (subparsers are
    :class:`Parser` too, so their usage errors are one line as well)."""
    ap = Parser(prog="daskmeans", description="Distributed, out-of-core k-means on Dask (GPU or CPU).")
    ap.add_argument("--version", action="version", version=f"daskmeans {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, help="the command (each has its own --help)")
    fit.add_parser(sub)
    predict.add_parsers(sub)
    generate.add_parser(sub)
    sweep.add_parser(sub)
    return ap


# A command whose reader went away (``daskmeans info m.zarr | head``) ends quietly, with the
# status a shell reports for a tool stopped by SIGPIPE.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def run() -> None:
    """The ``daskmeans`` command: :func:`main`, then exit at once. The work is done and every
    output closed and renamed into place by then; Python's own shutdown (the in-process
    cluster's threads, CUDA's teardown, freeing every module) was a large part of a short
    command (performance.md, "The command and the readers"), so it is skipped (``os._exit``)
    once the streams are flushed."""
    argv = sys.argv[1:]
    args = parser().parse_args(argv)  # usage errors, --help and --version end here, as in main()
    command_process(dashboard=getattr(args, "dashboard", False))
    rc = main(argv, process_exit=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # what is left for a reader that went away
            rc = rc or EXIT_BROKEN_PIPE
    os._exit(rc)


def main(argv: Sequence[str] | None = None, *, process_exit: bool = False) -> int:
    """Run the command ``argv`` (default ``sys.argv[1:]``) and return its exit status: 0, 1 for
    an error (one line on stderr), 130 after Ctrl-C, 143 after SIGTERM, 141 when the reader of
    its output went away; usage errors exit 2 (SystemExit). ``process_exit``: the process ends
    right after (:func:`run`), and with it the local cluster's worker processes, which the
    command then starts while it reads and leaves to that exit rather than closing them."""
    args = parser().parse_args(argv)
    args.process_exit = process_exit
    from ..errors import DaskmeansError

    common.start(quiet=getattr(args, "quiet", False))
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, common.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            with warnings.catch_warnings(), common.quiet_dropped_signals():  # both restored when main() returns
                warnings.showwarning = common.show_warning
                rc = COMMANDS[args.command](args)
                sys.stdout.flush()  # a reader gone away is found here, not at exit
                return rc
        except DaskmeansError as e:
            common.tell(f"daskmeans: error: {e}")
            return 1
        except BrokenPipeError:
            raise
        except OSError as e:
            # The file system's or network's own refusal (a missing or unreadable file, a
            # full disk outside any output): one line, as any expected failure.
            common.tell(f"daskmeans: error: {os_error_line(e)}")
            return 1
        except KeyboardInterrupt as e:
            term = isinstance(e, common.Terminated)
            common.tell(f"daskmeans: {'terminated' if term else 'interrupted'}")
            return 143 if term else 130
    except BrokenPipeError:
        return EXIT_BROKEN_PIPE
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def os_error_line(e: OSError) -> str:
    """``PATH: reason`` for an OSError about a path, else its own text (its type where it has
    none: a bare TimeoutError)."""
    if e.strerror and isinstance(e.filename, (str, os.PathLike)):
        return f"{os.fspath(e.filename)}: {e.strerror}"
    return " ".join(str(e).split()) or f"{type(e).__name__} (no message)"


_OPTIONAL_IMPORTS = ("xarray", "scipy.sparse", "scipy.fftpack", "scipy.linalg.cython_blas")
_HTML_IMPORTS = ("jinja2",)


def command_process(dashboard: bool = False) -> None:
    """Settings of the command's own process, made by :func:`run` before Dask loads (never by
    :func:`main`, which may run inside a user's process):

    - Dask does not import xarray (and pandas with it), SciPy's sparse matrices or SciPy's FFT
      (their costs: performance.md, "The command and the readers"): it imports them, where installed, only to recognise
      such objects or to offer ``dask.array.fft`` over SciPy, and the command reads files
      (SciPy modules that import ``scipy.sparse``, e.g. ``scipy.stats``, and scikit-learn then
      cannot be imported in this process). CuPy's sparse matrices stay: CuPy loads ``cupyx``
      at its first ufunc call, and ``cupyx`` imports them;
    - Numba does not import SciPy's BLAS wrappers (and ``scipy.linalg`` with them) as it loads
      the first CPU kernel: it looks for them only to offer ``np.dot`` and ``np.linalg`` in
      compiled code, which daskmeans' kernels do not use (the cost: performance.md, "The
      command and the readers"; ``scipy.linalg`` then cannot be imported in this process);
    - without a ``dashboard``, nor Jinja: Dask and distributed load it only for
      their HTML views (notebook reprs, the dashboard's pages), which the command never shows;
    - Dask's own log lines (comm and worker events, with tracebacks when a fit is interrupted
      or its scheduler is lost) stay out of the command's output, where errors are one line;
      the user's ``DASK_DISTRIBUTED__LOGGING__DISTRIBUTED`` wins. Dask reads its environment
      once, when it is imported, and parsing a size option (``--chunk-bytes 4MiB``) has
      imported it already: the setting goes into its configuration too, before distributed
      sets up its loggers. It does not reach ``distributed.client``, which Dask configures on
      its own (``warning``): its errors (a lost scheduler's failed reconnection, 30 s on) are
      dropped by a filter, which Dask's set-up at import leaves in place.
    """
    for name in _OPTIONAL_IMPORTS + (() if dashboard else _HTML_IMPORTS):
        if name not in sys.modules:
            sys.modules[name] = None  # `import name` raises ImportError here: Dask goes on without it
    if "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED" not in os.environ:
        os.environ["DASK_DISTRIBUTED__LOGGING__DISTRIBUTED"] = "critical"  # and the processes started here
        if "dask.config" in sys.modules:
            import dask.config

            dask.config.set({"distributed.logging.distributed": "critical"})
        logging.getLogger("distributed.client").addFilter(below_critical)


def below_critical(record: "logging.LogRecord") -> bool:
    """A logging filter: only critical records pass (the command's Dask client)."""
    return record.levelno >= logging.CRITICAL
