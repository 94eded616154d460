"""What the subcommands share: the lines they print, the signal a command received, the
options several of them take, and their way to read DATA and reach a cluster.

Light at import (``daskmeans --help`` loads neither NumPy nor Dask): whatever needs Dask is
imported inside the function that uses it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import warnings
from typing import Any, Iterator

from ..options import TIERS
from ..validation import int_option, size_option

# The seeds NumPy accepts: ``--seed`` of every subcommand.
SEED_RANGE = dict(low=0, high=2**32 - 1)


# ---------------------------------------------------------------- lines for the user

class _State:
    """The running command's state: ``-q`` and the signal received but not yet acted on."""

    quiet = False
    pending: type[KeyboardInterrupt] | None = None


def start(quiet: bool) -> None:
    """Begin a command: ``quiet`` (``-q``) for :func:`say`, and no signal received yet."""
    _State.quiet = bool(quiet)
    _State.pending = None


def say(msg: str) -> None:
    """A line about the work, on stderr; none under ``-q``."""
    if not _State.quiet:
        print(msg, file=sys.stderr, flush=True)


def tell(msg: str) -> None:
    """A line the user must see even under ``-q``: an error, a warning, an interruption."""
    print(msg, file=sys.stderr, flush=True)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` while a command runs: daskmeans' own warnings as one line
    ``daskmeans: warning: ...`` (even under ``-q``), any other as Python prints it."""
    from ..errors import DaskmeansWarning

    if issubclass(category, DaskmeansWarning):
        tell(f"daskmeans: warning: {message}")
    else:
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def fit_seconds(timings: dict) -> float:
    """A fit's time, the one every output states (the summary line, ``--timings``'
    ``fit_seconds``, ``info``): the fit's own phases (plan, place, moments, init, iterations...,
    as ``KMeans.timings_`` records them), without the command's imports, cluster and writes."""
    return float(sum(v for k, v in timings.items() if k != "read"))


# ---------------------------------------------------------------- signals

class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so that the same clean-up runs (exit 143)."""


def on_signal(signum: int, frame: Any) -> None:
    """The command's handler of SIGINT and SIGTERM: the signal is remembered (for
    :func:`check_interrupt`) and raised as an interrupt (:class:`Terminated` for SIGTERM)."""
    import signal

    _State.pending = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    raise _State.pending()


def set_pending(kind: type[KeyboardInterrupt] | None) -> None:
    """Record ``kind`` as the interrupt received and not yet acted on (None: none)."""
    _State.pending = kind


def check_interrupt() -> None:
    """Raise again a signal whose exception Python dropped: one raised while a finaliser runs
    (a Dask future's ``__del__``, say) is printed as 'Exception ignored' and lost, and the fit
    would go on to write its output with exit 0. Called every iteration and before any output."""
    if _State.pending is not None:
        raise _State.pending()


@contextlib.contextmanager
def quiet_dropped_signals() -> Iterator[None]:
    """While the command runs, a signal's exception that Python drops because it was raised
    inside a finaliser is not printed ('Exception ignored in ...' and a traceback, where the
    user should read one line): :func:`check_interrupt` raises it again. Any other exception
    a finaliser drops is printed as usual."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _State.pending is not None:
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


# ---------------------------------------------------------------- options several subcommands take

def registered_option(flag: str, module: str, attribute: str):
    """An option's ``type=`` whose values are the names of a registry (``module.attribute``,
    a mapping), looked up only when the option is given: the registry's module may load
    NumPy or Dask, and a subcommand's ``--help`` loads neither (argparse reads every option's
    ``choices`` to format the help, so the names are no ``choices``).

    Parameters
    ----------
    flag : str
        The option (``--collective``), for the message.
    module : str
        The registry's module, absolute (``daskmeans.engine.collective``).
    attribute : str
        The registry's name in it (``COLLECTIVES``).
    """

    def parse(value: str) -> str:
        names = tuple(getattr(importlib.import_module(module), attribute))
        if value not in names:
            raise argparse.ArgumentTypeError(f"{flag} {value}: should be one of {', '.join(names)}")
        return value

    parse.__name__ = "name"  # argparse's name for the type in its own messages
    return parse


def tier_help() -> str:
    """``--tier``'s help: each memory tier and what it means."""
    return ("where workers keep the rows: " + "; ".join(f"{name}: {what}" for name, what in TIERS.items())
            + " (default auto)")


def add_data_args(p: argparse.ArgumentParser) -> None:
    """How DATA is read: ``--dataset``, ``--columns``, ``--drop-columns``, ``--chunk-bytes``."""
    p.add_argument("--dataset", help="array inside a Zarr group")
    p.add_argument("--columns", help="CSV: comma-separated feature columns to keep (names or positions)")
    p.add_argument("--drop-columns", help="CSV: comma-separated columns to drop, e.g. a label column")
    p.add_argument("--chunk-bytes", type=size_option("--chunk-bytes"),
                   help="bytes per row chunk (e.g. 128MiB; default daskmeans.chunk-bytes, and for a fit on GPU workers "
                        "daskmeans.gpu-chunk-bytes within an eighth of their device memory budget)")


def add_keep_arg(p: argparse.ArgumentParser) -> None:
    """``--keep-columns``: columns of DATA written beside the labels."""
    p.add_argument("--keep-columns", metavar="A,B",
                   help="CSV input, .csv or .parquet labels: write these columns of DATA (names or positions, e.g. an "
                        "id) beside the labels, as written in DATA, in its row order")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """Where the work runs: a scheduler (plain or TLS) or a local cluster, its backend and
    workers, the dashboard, the collective."""
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="scheduler address (tcp://HOST:PORT, tls://HOST:PORT); default: DASK_SCHEDULER_ADDRESS if set, "
                        "else start a local cluster")
    p.add_argument("--scheduler-file", metavar="FILE", help="the JSON file of a running scheduler (dask scheduler --scheduler-file)")
    p.add_argument("--tls-ca-file", metavar="PEM", help="TLS: the certificate authority (with --tls-cert and --tls-key)")
    p.add_argument("--tls-cert", metavar="PEM", help="TLS: the client's certificate")
    p.add_argument("--tls-key", metavar="PEM", help="TLS: the client's private key")
    p.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto", help="auto: GPU when the workers have one")
    p.add_argument("--workers", type=int_option("--workers"), help="local CPU cluster: number of workers (default: one per core)")
    p.add_argument("--dashboard", action="store_true",
                   help="local cluster: serve Dask's dashboard (needs bokeh; about a second to start)")
    p.add_argument("--collective", type=registered_option("--collective", "daskmeans.engine.collective", "COLLECTIVES"),
                   default=None, metavar="NAME",
                   help="how workers combine partial sums each iteration: nccl (GPU workers), dask (any), "
                        "or auto (nccl where every worker has a GPU with NCCL; default daskmeans.collective)")


# ---------------------------------------------------------------- the data and the cluster

def split(s: str | None) -> list[str] | None:
    """A comma-separated option (``--columns a,b``) as its names; None when not given."""
    return None if s is None else [c.strip() for c in s.split(",") if c.strip()]


def read(args: argparse.Namespace):
    """DATA as a :class:`~daskmeans.io.readers.Table`: the rows, and the columns' names that
    the model keeps (fit) or checks (predict, plot). Read in chunks of ``--chunk-bytes``, else
    of ``daskmeans.chunk-bytes``: the fit's chunking on its workers is the engine's to choose
    (:func:`daskmeans.engine.plan.plan`), not the command's."""
    from ..io.readers import read_table

    return read_table(args.data, dataset=args.dataset, columns=split(args.columns),
                      drop_columns=split(args.drop_columns), chunk_bytes=args.chunk_bytes)


def check_cluster_args(args: argparse.Namespace) -> None:
    """Refuse cluster options that contradict each other, before any cluster is contacted:
    ``--workers`` with a scheduler, ``--dashboard`` without bokeh."""
    from ..dask_cluster import scheduler_address
    from ..errors import DaskmeansError

    address, source = scheduler_address(args.scheduler, args.scheduler_file)
    if address and args.workers is not None:
        raise DaskmeansError(
            f"--workers {args.workers} applies to a local cluster only: with a scheduler ({source}) the cluster's "
            f"own workers are used"
        )
    if getattr(args, "dashboard", False) and not address:
        # Without bokeh the local cluster still starts and prints a URL whose pages are errors.
        try:
            import bokeh  # noqa: F401
        except ImportError as e:
            raise DaskmeansError(f"--dashboard needs bokeh, which cannot be imported ({e}): pip install "
                                 f"'bokeh>=3.1', or leave out --dashboard") from None


def connect(args: argparse.Namespace):
    """The cluster the command's options name (a context manager giving its client)."""
    from ..dask_cluster import connect as connect_cluster

    # Importing distributed routes warnings to logging (logging.captureWarnings): ours stay lines.
    warnings.showwarning = show_warning
    return connect_cluster(args.scheduler, args.backend, args.workers, scheduler_file=args.scheduler_file,
                           tls=(args.tls_ca_file, args.tls_cert, args.tls_key), dashboard=args.dashboard)


def external(args: argparse.Namespace) -> bool:
    """Whether the command runs on a scheduler it did not start."""
    from ..dask_cluster import scheduler_address

    return scheduler_address(args.scheduler, args.scheduler_file)[0] is not None


def settings(args: argparse.Namespace):
    """The ``dask.config`` settings the command's flags stand for (a context manager):
    ``--collective``, and ``--chunk-bytes``, the user's chunk size, which the engine then
    keeps on GPU workers too (``daskmeans.gpu-chunk-bytes``) rather than its own."""
    import dask

    chosen: dict[str, Any] = {}
    if args.collective:
        chosen["daskmeans.collective"] = args.collective
    if getattr(args, "chunk_bytes", None):
        chosen["daskmeans.gpu-chunk-bytes"] = args.chunk_bytes
    return dask.config.set(chosen)


def check_image_suffix(path: str) -> None:
    """Refuse a plot path whose suffix names no image format Matplotlib writes, before any
    work (and naming the path, not its temporary)."""
    from .. import report
    from ..errors import DaskmeansError

    formats = report.image_formats()
    if os.path.splitext(path)[1].lstrip(".").lower() not in formats:
        raise DaskmeansError(f"cannot write {path}: the suffix should name an image format, one of "
                             f"{', '.join('.' + f for f in sorted(formats))}")


def image_format(path: str) -> str:
    """The image format ``path``'s suffix names (``png``), as Matplotlib's ``savefig`` takes it."""
    return os.path.splitext(path)[1].lstrip(".").lower()
