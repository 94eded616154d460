"""What the subcommands share: the lines they print, the signal a command received, the
options several of them take, and their way to read DATA and reach a cluster.

Light at import (``daskmeans --help`` loads neither NumPy nor Dask): whatever needs Dask is
imported inside the function that uses it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import sys
import warnings
from typing import Any, Iterator

from ..errors import InvalidParameterError
from ..options import TIERS
from ..params import Option, RunParams, options, spec_of
from ..validation import ByteSize, Interval, NInit, NoneOr, PathLike, RandomStateLike, int_option, size_option

# The integer seeds ``random_state`` takes (``validation.RandomStateLike``'s range; its
# Generator and RandomState have no command-line spelling), checked without loading NumPy,
# which RandomStateLike imports to recognise them: ``--seed`` of every subcommand.
SEED = Interval(0, 2**32 - 1, integer=True)
SEED_RANGE = dict(low=SEED.low, high=SEED.high)


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


# ---------------------------------------------------------------- options derived from the parameter records

def field(record: type, name: str, **registries: Any) -> Option:
    """The command-line :class:`~daskmeans.params.Option` of ``record``'s field ``name``
    (:func:`daskmeans.params.options`): its default, help, choices and constraint.

    Parameters
    ----------
    record : dataclass type
        ``KMeansParams`` or ``RunParams``.
    name : str
        The field (``"max_iter"``).
    **registries : iterable of str
        The names of the registry the field's choices come from (``inits=seeding.names()``),
        for a field with one.
    """
    spec = spec_of(record, name)
    if spec.registry is not None and spec.registry not in registries:
        # A registry the command reads only once the option is given (its module may load
        # NumPy or Dask, and --help loads neither): no choices, and the caller's type= checks.
        return Option(name, "--" + name.replace("_", "-"), record.__dataclass_fields__[name].default, spec.help,
                      None, None)
    others = [f for f in record.__dataclass_fields__ if f != name]
    (option,) = options(record, registries=registries, omit=others)
    return option


def _command_form(constraint: Any) -> Any:
    """The constraint a command-line value of a field meets: ``constraint`` without its None
    (an option left out keeps its default), and, for the fields whose Python values have
    no spelling on a command line, the part that has one: ``n_init``'s integers (the
    command's runs are counted; ``"auto"`` is the estimators' rule) and ``random_state``'s
    integer seeds."""
    inner = constraint.inner if isinstance(constraint, NoneOr) else constraint
    if isinstance(inner, NInit):
        return Interval(1, None, integer=True)
    if isinstance(inner, RandomStateLike):
        return SEED
    return inner


def requirement(constraint: Any) -> str:
    """What a command-line value of a field with ``constraint`` should be, in the words of
    the command's usage errors (``an integer >= 1``, ``a finite number > 1``, ``a size > 0
    such as 512MiB or auto``).

    Raises
    ------
    TypeError
        ``constraint`` is of a kind no option value is checked against (its option takes
        ``choices``, or its own ``type=``).
    """
    form = _command_form(constraint)
    if isinstance(form, Interval):
        low, high = form.low, form.high
        low_open, high_open = form.closed in ("right", "neither"), form.closed in ("left", "neither")
        if form.integer:
            # An open bound of an integer is the next integer in: "> 0" reads ">= 1".
            low = None if low is None else int(low) + low_open
            high = None if high is None else int(high) - high_open
            if low is not None and high is not None:
                return f"an integer from {low} to {high}"
            if low is not None or high is not None:
                return f"an integer {'>=' if low is not None else '<='} {low if low is not None else high}"
            return "an integer"
        bounds = ([f"{'>' if low_open else '>='} {low:g}"] if low is not None else []) + \
                 ([f"{'<' if high_open else '<='} {high:g}"] if high is not None else [])
        return " ".join(["a finite number", " and ".join(bounds)]).strip()
    if isinstance(form, ByteSize):
        return "a size > 0 such as 512MiB or auto"
    if isinstance(form, PathLike):
        return "a non-empty path"
    raise TypeError(f"a value checked against {type(form).__name__} has no command-line requirement: give the "
                    f"option choices or its own type=")


def field_type(option: Option, flag: str | None = None):
    """The argparse ``type=`` of a field's option: the value read (an int, a finite float,
    a size or path kept as given) and checked against the field's constraint (the
    estimator's check of the same parameter), a usage error ``--tol -1: should be a finite
    number >= 0`` otherwise. Light: a size's check loads ``dask.utils`` only when one is
    given.

    Parameters
    ----------
    option : Option
        The field's option (:func:`field`).
    flag : str, optional
        The flag the message names, where the command spells it otherwise (``--k``, ``--seed``).
    """
    flag = flag or option.flag
    form = _command_form(option.constraint)
    need = requirement(option.constraint)

    def read(value: str) -> Any:
        if isinstance(form, Interval) and form.integer:
            return int(value, 10)
        if isinstance(form, Interval):
            x = float(value)
            # A command line's inf or nan is a typing slip, never a bound the user means.
            if not math.isfinite(x):
                raise ValueError(value)
            return x
        if isinstance(form, PathLike) and not value:
            raise ValueError(value)
        return value  # a size: kept as given, parsed where it is used

    def parse(value: str) -> Any:
        try:
            x = read(value)
            form.check(flag, x)
        except (ValueError, TypeError, InvalidParameterError):
            raise argparse.ArgumentTypeError(f"{flag} {value or repr('')}: should be {need}") from None
        return x

    # argparse's name for the type in its own messages
    parse.__name__ = "integer" if getattr(form, "integer", False) else {
        Interval: "number", ByteSize: "size", PathLike: "path"}.get(type(form), "value")
    return parse


_FIELD = object()  # "the field's own": the command keeps the record's default


def field_help(option: Option, text: str | None = None, default: Any = _FIELD) -> str:
    """An option's help: the field's, or the command's ``text`` where it says more on a
    command line (argparse's ``%(choices)s`` may stand in it), then the default (``default``:
    as the command shows it; the field's own where not given; None: not shown)."""
    shown = text if text is not None else option.help.replace("%", "%%")  # argparse formats help with %
    default = option.default if default is _FIELD else default
    return shown if default is None else f"{shown} (default {default})"


def add_field(p: argparse.ArgumentParser, option: Option, *flags: str, text: str | None = None,
              default: Any = _FIELD, shown_default: Any = _FIELD, **kwargs: Any) -> None:
    """Add the option of a record's field to ``p``: its flag (or the command's ``flags``,
    where it spells it otherwise, with aliases), its default (or the command's ``default``,
    where the command differs on purpose), its help, and its choices or its checked type.

    Parameters
    ----------
    p : argparse.ArgumentParser
    option : Option
        The field's option (:func:`field`).
    *flags : str
        The command's flags for it; default ``option.flag``.
    text : str, optional
        The command's help where it says more than the field's.
    default : Any, optional
        The command's own default (commented where it is given); default the field's.
    shown_default : Any, optional
        How the help shows the default (``a fresh one``; None: not shown); default the value.
    **kwargs
        argparse's other arguments (``metavar``, ``required``, ``type`` for a field checked
        otherwise, ``choices`` for a registry read otherwise).
    """
    flags = flags or (option.flag,)
    value = option.default if default is _FIELD else default
    if option.choices is not None:
        kwargs.setdefault("choices", option.choices)
    elif "type" not in kwargs:
        kwargs["type"] = field_type(option, flags[0])
    if kwargs.get("required"):
        value, shown_default = None, None
    p.add_argument(*flags, default=value, help=field_help(option, text, value if shown_default is _FIELD
                                                          else shown_default), **kwargs)


def tier_help() -> str:
    """``--tier``'s help: each memory tier and what it means, and the field's default."""
    return ("where workers keep the rows: " + "; ".join(f"{name}: {what}" for name, what in TIERS.items())
            + f" (default {field(RunParams, 'tier').default})")


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
    # The choices: params' light copy of the backends' registry's (``backends.choices()``,
    # whose module loads NumPy; tests/cli/test_options_from_params.py keeps them equal).
    add_field(p, field(RunParams, "backend"), text="auto: GPU when the workers have one")
    p.add_argument("--workers", type=int_option("--workers"), help="local CPU cluster: number of workers (default: one per core)")
    p.add_argument("--dashboard", action="store_true",
                   help="local cluster: serve Dask's dashboard (needs bokeh; about a second to start)")
    add_field(p, field(RunParams, "collective"),
              type=registered_option("--collective", "daskmeans.engine.collective", "COLLECTIVES"), metavar="NAME",
              text="how workers combine partial sums each iteration: nccl (GPU workers, a process each), "
                   "process (workers of one process, CPU or GPU), dask (any), or auto (the first of these that can "
                   "serve the workers; default daskmeans.collective)")


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


def read_ahead(args: argparse.Namespace) -> bool:
    """Start reading DATA ahead where it is a CSV file that the command's own in-process
    workers will fit (:mod:`daskmeans.io.csv_ahead`): its rows are parsed in a process of its
    own while this one imports, and :func:`read` then finds them. Not inside another program
    (``main`` without ``process_exit``: its process does not end with the command's), nor where
    the local cluster's workers will be processes (the rows would not be shared:
    :func:`_workers_in_process`), nor with ``daskmeans.csv-read-ahead`` false ("auto": with
    enough cores, :data:`~daskmeans.io.csv_ahead.MIN_CORES`; true: on any). Returns whether it
    started."""
    from .. import config
    from ..io import csv_ahead

    how = config.choice("csv-read-ahead", ("auto", "True", "False"))
    if how == "False" or not getattr(args, "process_exit", False) or not _workers_in_process(args):
        return False
    import dask.utils

    try:
        cb = None if args.chunk_bytes is None else int(dask.utils.parse_bytes(args.chunk_bytes))
    except (TypeError, ValueError):
        return False  # the read refuses it
    return csv_ahead.start(args.data, chunk_bytes=cb, columns=split(args.columns),
                           drop_columns=split(args.drop_columns), any_cores=how == "True")


def _workers_in_process(args: argparse.Namespace) -> bool:
    """Whether the local cluster the command will start has its workers in this process, as
    :func:`daskmeans.dask_cluster.starts_in_process` decides, from what is known before any
    import: GPU workers where the driver is there (``/dev/nvidiactl``) unless ``--backend``
    names a CPU backend, as many as ``CUDA_VISIBLE_DEVICES`` lists or the driver's device
    files; else ``--workers`` or a worker per core. Only a guess for the read-ahead: a wrong
    one costs a read-ahead the workers do not use, or misses one."""
    import glob

    from .. import config
    from ..backends import on_gpu, requested_backend

    wanted = requested_backend(args.backend)
    if os.path.exists("/dev/nvidiactl") if wanted is None else on_gpu(wanted):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        n = len([d for d in visible.split(",") if d.strip()]) if visible is not None else \
            len(glob.glob("/dev/nvidia[0-9]*"))
    else:
        n = args.workers or os.cpu_count() or 1
    return config.local_in_process(max(1, n))


def check_cluster_args(args: argparse.Namespace) -> None:
    """Refuse cluster options that contradict each other, before any cluster is contacted:
    ``--workers`` with a scheduler, ``--dashboard`` without bokeh."""
    from ..config import scheduler_address
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


def starting(args: argparse.Namespace):
    """The command's local cluster, started now on a thread while the command imports and
    reads its data (:class:`daskmeans.dask_cluster.Starting`; its ``connected()`` gives the
    client), or None: on a scheduler the command did not start, or where the command runs
    inside another program (:func:`~daskmeans.cli.main.main` without ``process_exit``, whose
    process does not end with the command's, so a cluster left starting would outlive an
    error). A cluster started here is left to the process's exit, not closed
    (:func:`daskmeans.dask_cluster.end_with_process`)."""
    from ..dask_cluster import Starting, end_with_process

    if external(args) or not getattr(args, "process_exit", False):
        return None
    end_with_process()
    return Starting(backend=args.backend, n_workers=args.workers, dashboard=args.dashboard)


def external(args: argparse.Namespace) -> bool:
    """Whether the command runs on a scheduler it did not start."""
    from ..config import scheduler_address  # not dask_cluster's module: distributed loads later

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
