"""``daskmeans`` command line: parse, preflight, call the Python API, report.

Expected failures (bad input, bad parameters, unreachable scheduler, an output that cannot
be written) print one line ``daskmeans: error: ...`` and exit 1, never a traceback; usage
errors (an unknown option, a value out of range) print one line and exit 2. Each output is
locked for the whole command (a second writer is refused) and written atomically: a failure
leaves nothing partial behind and every previous output as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import warnings
from typing import Sequence

from . import __version__
from . import seeding
from .options import PRECISIONS, TIERS
from .events import watching
from .progress import Progress, Steps
from .timing import Phases
from .validation import float_option, int_option, labels_path_option, path_option, size_option

_SEED = dict(low=0, high=2**32 - 1)  # numpy's seeds


class _Registered:
    """The names of a registry (``module.attribute``, a mapping) as argparse's ``choices``,
    looked up when argparse first needs them (to check a value, or for a subcommand's
    ``--help``): the metrics' module loads NumPy, and ``daskmeans --help`` loads nothing heavy."""

    def __init__(self, module: str, attribute: str):
        self.module, self.attribute = module, attribute

    def _names(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module, __package__), self.attribute))

    def __iter__(self):
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()


def _init_help() -> str:
    names = [f"{n} (default)" if n == seeding.DEFAULT else n for n in seeding.names()]
    return ", ".join(names) + ", or a .npy file of K x D centroids"


def _tier_help() -> str:
    return ("where workers keep the rows: " + "; ".join(f"{name}: {what}" for name, what in TIERS.items())
            + " (default auto)")


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (``daskmeans fit: error: --k 0: should be an
    integer >= 1``, exit 2): the option validators' messages name the option and value
    themselves, so argparse's ``argument --k:`` prefix is dropped from them."""

    def error(self, message: str):
        m = re.match(r"argument ([^:]+): ", message)
        if m and message[m.end():].startswith(tuple(f"{flag} " for flag in m.group(1).split("/"))):
            message = message[m.end():]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", help="array inside a Zarr group")
    p.add_argument("--columns", help="CSV: comma-separated feature columns to keep (names or positions)")
    p.add_argument("--drop-columns", help="CSV: comma-separated columns to drop, e.g. a label column")
    p.add_argument("--chunk-bytes", type=size_option("--chunk-bytes"), help="target bytes per row chunk (e.g. 128MiB; default daskmeans.chunk-bytes, "
                                         "or daskmeans.gpu-chunk-bytes for a local GPU cluster)")


def _add_keep_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-columns", metavar="A,B",
                   help="CSV input, .csv or .parquet labels: write these columns of DATA (names or positions, e.g. an "
                        "id) beside the labels, as written in DATA, in its row order")


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--collective", choices=_Registered(".engine.collective", "COLLECTIVES"), default=None,
                   metavar="NAME",
                   help="how workers combine partial sums each iteration: nccl (GPU workers), dask (any), "
                        "or auto (nccl where every worker has a GPU with NCCL; default daskmeans.collective)")


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="daskmeans", description="Distributed, out-of-core k-means on Dask (GPU or CPU).")
    ap.add_argument("--version", action="version", version=f"daskmeans {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, help="the command (each has its own --help)")

    f = sub.add_parser("fit", help="fit a model to DATA (.zarr, .csv or .npy)")
    f.add_argument("data", help="the rows to cluster: a .zarr array or group (see --dataset), a .csv or a .npy file")
    f.add_argument("--k", type=int_option("--k"), required=True, help="number of clusters")
    f.add_argument("-o", "--output", type=path_option("-o"), default="model.zarr", help="model to write (Zarr group; default model.zarr)")
    f.add_argument("--init", default=seeding.DEFAULT, help=_init_help())
    f.add_argument("--n-init", type=int_option("--n-init"), default=1, metavar="N",
                   help="runs from different seeds; the run of lowest inertia is kept (default 1)")
    f.add_argument("--max-iter", type=int_option("--max-iter"), default=300, metavar="N",
                   help="most iterations of a run (default 300)")
    f.add_argument("--tol", type=float_option("--tol"), default=1e-4, metavar="T",
                   help="stop once the centroids move less than T x the mean feature variance (default 1e-4)")
    f.add_argument("--seed", type=int_option("--seed", **_SEED), default=None, metavar="S",
                   help="random seed: the same seed gives the same model for any chunking and worker count "
                        "(default: a fresh one)")
    # A metavar: argparse would otherwise list the choices (load the registry) as it adds the option.
    f.add_argument("--metric", choices=_Registered(".metric", "REGISTRY"), default="euclidean", metavar="NAME",
                   help="the distance, one of %(choices)s (default euclidean)")
    f.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="GPU GEMM precision; labels are exact in every mode (uncertain rows are re-checked)")
    f.add_argument("--max-samples-per-cluster", type=int_option("--max-samples-per-cluster"), default=None,
                   metavar="N",
                   help="train on N x K rows drawn from --seed where the data has more (FAISS's "
                        "max_points_per_centroid), then label every row (default daskmeans.max-samples-per-cluster: "
                        "every row)")
    f.add_argument("--max-imbalance", type=float_option("--max-imbalance", low=1.0, strict=True), default=None, metavar="R",
                   help="balance the cluster sizes (as an IVF index wants): while the largest cluster holds more "
                        "than R x the mean size, each iteration moves the smallest clusters' centroids into the "
                        "clusters above it (R > 1; default off)")
    f.add_argument("--labels", metavar="LABELS", type=labels_path_option("--labels"),
                   help="also write the training labels here, in the format of its suffix (as predict -o)")
    _add_keep_arg(f)
    f.add_argument("--tier", choices=tuple(TIERS), default="auto", help=_tier_help())
    f.add_argument("--memory-limit", metavar="SIZE", type=size_option("--memory-limit", auto=True), help="host memory per worker for resident data (e.g. 8GiB; default auto)")
    f.add_argument("--device-memory-limit", metavar="SIZE", type=size_option("--device-memory-limit", auto=True),
                   help="GPU memory per worker (e.g. 40GiB; default auto)")
    f.add_argument("--checkpoint", type=path_option("--checkpoint"), metavar="CKPT.zarr",
                   help="write the fit's restart point here every --checkpoint-every iterations and on Ctrl-C/SIGTERM")
    f.add_argument("--checkpoint-every", type=int_option("--checkpoint-every"), default=10, metavar="N", help="iterations between checkpoints (default 10)")
    f.add_argument("--resume", action="store_true", help="continue from --checkpoint (same data and parameters)")
    f.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    f.add_argument("--timings", type=path_option("--timings"), metavar="FILE.json",
                   help="write the command's phases (imports, cluster start, read, place, init, iterations, "
                        "outputs...) and their wall seconds here")
    f.add_argument("-q", "--quiet", action="store_true", help="no progress")
    f.add_argument("-v", "--verbose", action="store_true",
                   help="one line per iteration, with imbalance and throughput, also on a terminal")
    _add_data_args(f)
    _add_cluster_args(f)

    p = sub.add_parser("predict", help="label DATA with a fitted MODEL")
    p.add_argument("model", help="a model written by daskmeans fit")
    p.add_argument("data", help="the rows to label (.zarr, .csv or .npy), with the model's number of features")
    p.add_argument("-o", "--output", required=True, metavar="LABELS", type=labels_path_option("-o"),
                   help="where to write the labels, in the format of its suffix: .zarr (or no suffix) a Zarr group "
                        "holding the int32 array 'labels' (one per row); .npy a 1-D int32 array; .csv or .parquet a "
                        "column 'label' after the --keep-columns")
    _add_keep_arg(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing labels output")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress")
    _add_data_args(p)
    _add_cluster_args(p)

    i = sub.add_parser("info", help="describe a fitted MODEL")
    i.add_argument("model", help="a model written by daskmeans fit")
    i.add_argument("--json", action="store_true", help="print the model's attributes as JSON")

    pl = sub.add_parser("plot", help="draw a fitted MODEL: convergence, cluster sizes and, with DATA, a 2-D projection")
    pl.add_argument("model", help="a model written by daskmeans fit")
    pl.add_argument("data", nargs="?", help="also draw a PCA projection of a sample of these rows, coloured by cluster")
    pl.add_argument("-o", "--output", type=path_option("-o"), required=True, metavar="REPORT.png", help="the image (.png, .svg or .pdf)")
    pl.add_argument("--sample", type=int_option("--sample"), default=None, metavar="N",
                    help="rows of DATA drawn (default 20000)")
    pl.add_argument("--overwrite", action="store_true", help="replace an existing image")
    _add_data_args(pl)

    g = sub.add_parser("generate", help="write synthetic data")
    gs = g.add_subparsers(dest="kind", required=True, help="what to generate")
    b = gs.add_parser("blobs", help="isotropic Gaussian blobs, written chunk by chunk to Zarr")
    b.add_argument("--n", type=int_option("--n"), required=True, help="rows")
    b.add_argument("--d", type=int_option("--d"), required=True, help="features")
    b.add_argument("--centers", type=int_option("--centers"), required=True,
                   help="number of blobs (centres drawn uniformly in [-10, 10] per feature)")
    b.add_argument("--std", type=float_option("--std"), default=1.0, help="each blob's standard deviation (default 1)")
    b.add_argument("--seed", type=int_option("--seed", **_SEED), default=0,
                   help="random seed (default 0); each chunk is drawn from (seed, chunk index)")
    b.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="the values' type (default float32)")
    b.add_argument("--chunk-rows", type=int_option("--chunk-rows"), metavar="R",
                   help="rows per Zarr chunk (default: about daskmeans.chunk-bytes per chunk)")
    b.add_argument("-o", "--output", type=path_option("-o"), required=True, metavar="DATA.zarr", help="the Zarr array to write")
    b.add_argument("--overwrite", action="store_true", help="replace an existing generated dataset")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress")
    _add_sweep_parser(sub)
    return ap


def _add_sweep_parser(sub) -> None:
    """The ``sweep`` subcommand's parser (the command's; the sweep itself is :mod:`daskmeans.sweep`)."""
    sweep = importlib.import_module(".sweep", __package__)  # light: NumPy and Dask load in the sweep

    def ks_option(text: str) -> list[int]:
        try:
            return sweep.parse_ks(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"--k {text}: {e}") from None

    s = sub.add_parser("sweep", help="fit DATA for several K and pick the elbow (inertia, silhouette, Davies-Bouldin)")
    s.add_argument("data", help="the rows to cluster (.zarr, .csv or .npy)")
    s.add_argument("--k", type=ks_option, required=True, metavar="K,K,...",
                   help="the numbers of clusters to fit: a list (8,16,32) or ranges (2-12)")
    s.add_argument("-o", "--output", type=path_option("-o"), default="sweep.json", metavar="SWEEP.json",
                   help="the summary: each K's inertia, scores, iterations and seconds, and the elbow, rewritten "
                        "after each K (the Ks done so far: kept on Ctrl-C) (default sweep.json)")
    s.add_argument("--plot", type=path_option("--plot"), metavar="ELBOW.png", help="also draw the elbow plot here (.png, .svg or .pdf)")
    s.add_argument("--sample", type=int_option("--sample"), default=sweep.SAMPLE_ROWS, metavar="N",
                   help=f"rows drawn for the silhouette and Davies-Bouldin scores (default {sweep.SAMPLE_ROWS})")
    s.add_argument("--init", default="k-means||", help="each fit's init (as fit's --init)")
    s.add_argument("--n-init", type=int_option("--n-init"), default=1, help="runs per K, the best kept")
    s.add_argument("--max-iter", type=int_option("--max-iter"), default=300, help="iterations per fit at most")
    s.add_argument("--seed", type=int_option("--seed", **_SEED), default=0,
                   help="seed of every fit and of the sample (default 0)")
    s.add_argument("--overwrite", action="store_true", help="replace an existing summary and plot")
    s.add_argument("-q", "--quiet", action="store_true", help="no line per K")
    _add_data_args(s)
    _add_cluster_args(s)


def _check_cluster_args(args) -> None:
    from .dask_cluster import scheduler_address
    from .errors import DaskmeansError

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


def _connect(args):
    from .dask_cluster import connect

    # Importing distributed routes warnings to logging (logging.captureWarnings): ours stay lines.
    warnings.showwarning = _show_warning
    return connect(args.scheduler, args.backend, args.workers, scheduler_file=args.scheduler_file,
                   tls=(args.tls_ca_file, args.tls_cert, args.tls_key), dashboard=args.dashboard)


def _external(args) -> bool:
    from .dask_cluster import scheduler_address

    return scheduler_address(args.scheduler, args.scheduler_file)[0] is not None


def _config(args):
    """The dask.config settings the command's flags stand for (a context manager)."""
    import dask

    return dask.config.set({"daskmeans.collective": args.collective} if args.collective else {})


def _split(s: str | None) -> list[str] | None:
    return None if s is None else [c.strip() for c in s.split(",") if c.strip()]


def _read(args):
    """DATA as a :class:`~daskmeans.io.readers.Table`: the rows, and the columns' names that
    the model keeps (fit) or checks (predict, plot)."""
    from .io.readers import read_table

    return read_table(
        args.data, dataset=args.dataset, columns=_split(args.columns), drop_columns=_split(args.drop_columns),
        chunk_bytes=args.chunk_bytes or _gpu_chunk_bytes(args),
    )


@contextlib.contextmanager
def _columns_checked(km, table, args):
    """Check DATA's columns against the model before any output or cluster (names as
    scikit-learn does, then their number): another set or order of names is an error in one
    line, with the ``--columns`` that selects the model's columns where the file has them
    all; a warning (only one side names its columns) is printed once, here, and not again
    by the inference that runs inside the context."""
    from .errors import DaskmeansError, FeatureNamesError, FeatureNamesWarning
    from .io.csv_reader import SUFFIXES

    try:
        km.check_features(table)
    except FeatureNamesError as e:
        chosen = ",".join(e.fitted)
        if (str(args.data).lower().endswith(SUFFIXES) and set(e.fitted) <= set(e.given)
                and chosen.count(",") == len(e.fitted) - 1):  # no name holds a comma
            raise DaskmeansError(f"{e}: select them with --columns {chosen}") from None
        raise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FeatureNamesWarning)
        yield


def _gpu_chunk_bytes(args) -> str | None:
    """Larger chunks when the local cluster will be GPU workers: fewer, larger kernel calls
    (the GEMM tiles fill up) and fewer tasks; None keeps the general default."""
    from dask.utils import parse_bytes

    from . import config
    from .dask_cluster import local_uses_gpu

    if _external(args) or not local_uses_gpu(args.backend):
        return None
    size = config.get_bytes("gpu-chunk-bytes")
    limit = getattr(args, "device_memory_limit", None)
    if limit and limit.strip().lower() != "auto":  # a small device budget holds two chunks in flight among its working set
        size = min(size, max(2**20, int(parse_bytes(limit)) // 8))
    return size


class _Progress(Progress):
    """The fit's progress (:class:`daskmeans.progress.Progress`), and where a signal whose
    exception Python dropped is raised again (:func:`_check_interrupt`)."""

    iteration = 0  # the last iteration reported

    def __call__(self, s: dict) -> None:
        self.iteration = s["iteration"]
        _check_interrupt()
        super().__call__(s)


# -q: a command that succeeds prints nothing (errors, warnings and interruptions still do).
_quiet = False


def _say(msg: str) -> None:
    """A line about the work, on stderr; none under ``-q``."""
    if not _quiet:
        print(msg, file=sys.stderr, flush=True)


def _tell(msg: str) -> None:
    """A line the user must see even under ``-q``: an error, a warning, an interruption."""
    print(msg, file=sys.stderr, flush=True)


def fit_seconds(timings: dict) -> float:
    """A fit's time, the one every output states (the summary line, ``--timings``'
    ``fit_seconds``, ``info``): the fit's own phases (plan, place, moments, init, iterations...,
    as ``KMeans.timings_`` records them), without the command's imports, cluster and writes."""
    return float(sum(v for k, v in timings.items() if k != "read"))


_OPTIONAL_IMPORTS = ("xarray", "scipy.sparse", "scipy.fftpack")
_HTML_IMPORTS = ("jinja2",)


def _command_process(dashboard: bool = False) -> None:
    """Settings of the command's own process, made by :func:`run` before Dask loads (never by
    :func:`main`, which may run inside a user's process):

    - Dask does not import xarray (and pandas with it: ~0.35 s on a GPU host), SciPy's sparse
      matrices or SciPy's FFT (~0.15 s): it imports them, where installed, only to recognise
      such objects or to offer ``dask.array.fft`` over SciPy, and the command reads files
      (SciPy modules that import ``scipy.sparse``, e.g. ``scipy.stats``, and scikit-learn then
      cannot be imported in this process). CuPy's sparse matrices stay: CuPy loads ``cupyx``
      at its first ufunc call, and ``cupyx`` imports them;
    - without a ``dashboard``, nor Jinja (~0.02 s): Dask and distributed load it only for
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
        logging.getLogger("distributed.client").addFilter(_below_critical)


def _below_critical(record: "logging.LogRecord") -> bool:
    """A logging filter: only critical records pass (the command's Dask client)."""
    return record.levelno >= logging.CRITICAL


def _cmd_fit(args) -> int:
    t_main = time.perf_counter()
    phase = Phases()
    with phase("imports"):
        from .dask_cluster import check_paths_on_workers, describe
        from .errors import DaskmeansError
        from .estimator import KMeans
        from .io.labels import labels_output, write_labels
        from .io.paths import Outputs
        from .validation import check_n_clusters

    # Every output is locked from here to the end (another writer is refused) and renamed
    # into place only once all are written: a failure leaves each previous output as it was.
    with Outputs() as outputs:
        with phase("read"):
            init = args.init
            if init not in seeding.REGISTRY and not os.path.exists(init):
                raise DaskmeansError(f"--init {init!r} should be {', '.join(seeding.names())} or an existing .npy file")
            km = KMeans(args.k, init=init, n_init=args.n_init, max_iter=args.max_iter, tol=args.tol,
                        random_state=args.seed, backend=args.backend, metric=args.metric, precision=args.precision,
                        checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every, tier=args.tier,
                        memory_limit=args.memory_limit, device_memory_limit=args.device_memory_limit,
                        max_samples_per_cluster=args.max_samples_per_cluster, max_imbalance=args.max_imbalance)
            km.check_params()  # fail fast: before reading data or starting a cluster
            _check_cluster_args(args)
            # The inputs first: a missing input is the error to report, whatever the outputs.
            table = _read(args)  # preflight: the file opens, is numeric, and has enough rows
            table.refuse_identifiers()  # an id column is no feature: refused before any work
            X = table.array
            check_n_clusters(int(X.shape[0]), args.k)
            km.training_rows(int(X.shape[0]))  # a checkpointed fit on a sample without --seed
            km.initial_centroids(int(X.shape[1]))  # an init file of the wrong shape, before any cluster starts
            inputs = [args.data] + ([init] if init not in seeding.REGISTRY else [])
            if args.keep_columns and not args.labels:
                raise DaskmeansError(f"--keep-columns {args.keep_columns} writes columns beside the labels: it needs "
                                     f"--labels PATH")
            target = labels_output(args.labels, _split(args.keep_columns), table) if args.labels else None
            outputs.claim(args.output, "model", args.overwrite, inputs)
            outputs.claim(args.labels, "labels", args.overwrite, inputs + [args.output])
            outputs.claim(args.timings, "timings", args.overwrite, inputs + [args.output, args.labels])
            if args.resume and not args.checkpoint:
                raise DaskmeansError("--resume needs --checkpoint PATH")
            # A checkpoint is rewritten as the fit goes, each at once: it may exist (a
            # checkpoint only), but never be an input or another output.
            outputs.claim(args.checkpoint, "checkpoint", True, inputs + [args.output, args.labels, args.timings],
                          defer=False, by="--checkpoint")
        with contextlib.ExitStack() as cluster:
            with phase("cluster"):
                client = cluster.enter_context(_connect(args))
                _say(f"daskmeans: {describe(client)}")
                check_paths_on_workers(client, read=[args.data], write=[args.labels] if args.labels else [])
            link = f"; dashboard {client.dashboard_link}" if args.dashboard or _external(args) else ""
            _say(f"daskmeans: {X.shape[0]} x {X.shape[1]} {X.dtype}, {X.numblocks[0]} chunks{link}")
            km.client = client
            if target is not None and target.format == "zarr":
                # The labels' writer (zarr, ~0.4 s of imports) loads while the fit waits on its workers.
                threading.Thread(target=importlib.import_module, args=("zarr",), daemon=True).start()
            progress = _Progress(args.quiet, args.verbose, args.max_iter, args.n_init)
            cluster.enter_context(watching(Steps(args.quiet)))  # placing, the init, the labels' write
            with _config(args), contextlib.closing(progress):
                try:
                    km.fit(table, callback=progress, resume=args.resume)  # the header's names with it
                except KeyboardInterrupt:
                    if getattr(km, "checkpoint_iteration_", None):
                        _tell(f"daskmeans: checkpoint of iteration {km.checkpoint_iteration_} in {args.checkpoint}; "
                              f"continue with --resume")
                    elif not args.checkpoint and progress.iteration:
                        _tell(f"daskmeans: {progress.iteration} iterations were not kept: with --checkpoint PATH a "
                              f"fit writes a restart point on Ctrl-C, and --resume continues from it")
                    raise
                _check_interrupt()
            phase.update({f"fit {k}": v for k, v in km.timings_.items()})
            if args.verbose and args.n_init > 1:
                _say(f"daskmeans: run {km.best_run_} of {args.n_init} has the lowest inertia: its model is kept")
            if km.n_samples_fit_ < X.shape[0]:
                _say(f"daskmeans: trained on a sample of {km.n_samples_fit_} of {X.shape[0]} rows "
                     f"(sample inertia {km.sample_inertia_:.6e}); the inertia below is over every row")
            _say(
                f"daskmeans: fit in {fit_seconds(km.timings_):.2f} s ({km.n_iter_} iterations in "
                f"{km.timings_.get('iterations', 0.0):.2f} s) on {km.backend_}, "
                f"inertia {km.inertia_:.6e}{'' if km.converged_ else ' (not converged: max_iter reached)'}"
            )
            km.client = None
            with phase("write"):
                if target is not None:
                    write_labels(km.labels_, target)
                km.save(args.output)
            t_close = time.perf_counter()
        phase.update({"close": time.perf_counter() - t_close})
        if args.timings:
            _write_timings(args.timings, phase, time.perf_counter() - t_main, km)
        _check_interrupt()
    # Renamed into place: only now are they written.
    if args.labels:
        _say(f"daskmeans: labels written to {args.labels}")
    _say(f"daskmeans: model written to {args.output}")
    if args.verbose:
        _say(f"daskmeans: {phase.describe()}")
    return 0


def _write_timings(path: str, phase: Phases, main_s: float, km) -> None:
    """The ``--timings`` file: phases in order, the command's seconds from main() on, and the
    iterations' own seconds (the first one's excess over the median is the kernels' compile or
    load). Written as the other outputs are (atomically, renamed with them)."""
    from .io.paths import atomic_file

    hist = km.history_
    doc = {
        "phases": phase.seconds, "main_seconds": main_s, "fit_seconds": fit_seconds(km.timings_),
        "n_iter": km.n_iter_,
        "iteration_seconds": [h["seconds"] for h in hist],
        "kernel_seconds": [h["kernel_seconds"] for h in hist],
        "backend": km.backend_, "tier": km.tier_,
    }
    with atomic_file(path, kind="timings") as tmp, open(tmp, "w") as f:
        json.dump(doc, f, indent=1)


def _cmd_sweep(args) -> int:
    """``daskmeans sweep``: the outputs claimed before any work, a line per K (a bar on a
    terminal), the summary rewritten after each K (kept on Ctrl-C), the elbow."""
    from .dask_cluster import check_paths_on_workers, describe
    from .errors import DaskmeansError
    from .events import note
    from .io.paths import Outputs, atomic_file, check_output

    sweep = importlib.import_module(".sweep", __package__)
    with Outputs() as outputs:
        _check_cluster_args(args)
        if args.overwrite and os.path.isfile(args.output) and not sweep.is_summary(args.output):
            raise DaskmeansError(f"{args.output} is not a daskmeans sweep summary: --overwrite replaces only one")
        # The summary is rewritten after each K (each write atomic, at once, not at the end):
        # checked as any output first, then claimed as replaceable by the sweep's own writes.
        check_output(args.output, args.overwrite, [args.data])
        outputs.claim(args.output, None, True, [args.data], defer=False)
        if args.plot:
            outputs.claim(args.plot, "plot", args.overwrite, [args.data, args.output])
            _check_image_suffix(args.plot)
        table = _read(args)
        table.refuse_identifiers()  # a CSV id column is no feature, as for fit
        X = table.array
        with _connect(args) as client:
            _say(f"daskmeans: {describe(client)}")
            check_paths_on_workers(client, read=[args.data])
            _say(f"daskmeans: {X.shape[0]} x {X.shape[1]} {X.dtype}, K in {args.k}")

            def line(s: dict) -> None:
                _check_interrupt()
                if not args.quiet:
                    note(sweep.describe_line(s))  # above the bar on a terminal

            try:
                with _config(args), watching(Steps(args.quiet)):
                    res = sweep.sweep(X, args.k, sample=args.sample, random_state=args.seed, client=client,
                                      callback=line, output=args.output, init=args.init, n_init=args.n_init,
                                      max_iter=args.max_iter, backend=args.backend)
            except KeyboardInterrupt as e:
                part = getattr(e, "result", None)
                if part is not None and part.ks:
                    _tell(f"daskmeans: {len(part.ks)} of {len(args.k)} K fitted before the interrupt "
                          f"(K={', '.join(map(str, part.ks))}): their summary is in {args.output}")
                else:
                    _tell(f"daskmeans: no K was fitted before the interrupt: {args.output} not written")
                raise
        if args.plot:
            with atomic_file(args.plot, kind="plot") as tmp:
                sweep.figure(res).savefig(tmp, format=os.path.splitext(args.plot)[1].lstrip(".").lower())
        _check_interrupt()
    _say(f"daskmeans: elbow at K={res.elbow}" if res.elbow is not None else
         f"daskmeans: no elbow: {sweep.no_elbow_reason(res)}")
    _say(f"daskmeans: {len(res.ks)} K in {res.wall_seconds:.2f} s (fits {sum(res.fit_seconds):.2f} s, scores "
         f"{sum(res.score_seconds):.2f} s, sample {res.sample_seconds:.2f} s); summary written to {args.output}"
         + (f", plot to {args.plot}" if args.plot else ""))
    return 0


def _cmd_predict(args) -> int:
    from . import load
    from .dask_cluster import check_paths_on_workers
    from .io.labels import labels_output, write_labels
    from .io.paths import Outputs

    _check_cluster_args(args)
    with Outputs() as outputs:
        km = load(args.model)  # the inputs before the output
        table = _read(args)
        X = table.array
        target = labels_output(args.output, _split(args.keep_columns), table)  # its format, the columns kept
        with _columns_checked(km, table, args):  # before the output is claimed and the cluster started
            outputs.claim(args.output, "labels", args.overwrite, [args.model, args.data])
            with _connect(args) as client, watching(Steps(args.quiet)):
                check_paths_on_workers(client, read=[args.data], write=[args.output])
                km.client = client
                km.backend_ = args.backend
                labels = km.predict(table)  # lazy: computed block by block as they are written
                _check_interrupt()
                write_labels(labels, target)
        _check_interrupt()
    _say(f"daskmeans: {X.shape[0]} labels written to {args.output}")
    return 0


def _cmd_plot(args) -> int:
    from . import load
    from .io.paths import Outputs, atomic_file
    from .io.readers import read_table

    with Outputs() as outputs, contextlib.ExitStack() as checked:
        km = load(args.model)  # the inputs before the output
        X = None
        if args.data is not None:
            X = read_table(args.data, dataset=args.dataset, columns=_split(args.columns),
                           drop_columns=_split(args.drop_columns), chunk_bytes=args.chunk_bytes)
            checked.enter_context(_columns_checked(km, X, args))
        outputs.claim(args.output, "plot", args.overwrite, [args.model, args.data])
        _check_image_suffix(args.output)
        fig = km.plot(X, sample=args.sample)
        with atomic_file(args.output, kind="plot") as tmp:
            fig.savefig(tmp, format=os.path.splitext(args.output)[1].lstrip(".").lower())
    _say(f"daskmeans: report written to {args.output}")
    return 0


def _check_image_suffix(path: str) -> None:
    """Refuse a plot path whose suffix names no image format Matplotlib writes, before any
    work (and naming the path, not its temporary)."""
    from . import report
    from .errors import DaskmeansError

    formats = report.image_formats()
    if os.path.splitext(path)[1].lstrip(".").lower() not in formats:
        raise DaskmeansError(f"cannot write {path}: the suffix should name an image format, one of "
                                    f"{', '.join('.' + f for f in sorted(formats))}")


def _cmd_info(args) -> int:
    from .io.model_store import load_model

    centers, attrs, _ = load_model(args.model)  # verified: a damaged model is one error line, not a table
    if args.json:
        print(json.dumps(attrs, indent=2))
        return 0
    p = attrs.get("params", {})
    hist = attrs.get("history", [])
    print(f"model        {args.model}")
    print(f"clusters     {centers.shape[0]}  features {centers.shape[1]}  dtype {attrs.get('dtype')}")
    if attrs.get("feature_names_in"):
        print(f"columns      {', '.join(attrs['feature_names_in'])}")
    print(f"inertia      {attrs.get('inertia'):.6e}")
    print(f"iterations   {attrs.get('n_iter')}  (max_iter {p.get('max_iter')}, tol {p.get('tol')})")
    print(f"init         {p.get('init')}  seed {p.get('random_state')}  backend {attrs.get('backend')}  "
          f"tier {attrs.get('tier')}")
    if attrs.get("best_run") is not None:
        print(f"best run     {attrs['best_run']} of {p.get('n_init')} (the lowest inertia of the --n-init runs)")
    timings = attrs.get("timings") or {}
    if timings:
        print(f"fit time     {fit_seconds(timings):.2f} s ({len(hist)} iterations in "
              f"{timings.get('iterations', 0.0):.2f} s)")
    elif hist and all("seconds" in h for h in hist):  # a model saved without its phases
        print(f"fit time     {sum(h['seconds'] for h in hist):.2f} s in {len(hist)} iterations")
    print(f"version      daskmeans {attrs.get('daskmeans_version')}  format {attrs.get('format_version')}")
    print("parameters   " + "  ".join(f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"
                                      for name, value in p.items()))
    if hist:
        print()
        print(f"{'iter':>5} {'inertia':>14} {'shift':>10} {'reassigned':>11} {'empty':>6} {'imbalance':>9} "
              f"{'seconds':>9} {'GB/s':>8}")
        for h in hist:
            print(f"{h['iteration']:5d} {h['inertia']:14.6e} {h['shift']:10.3e} {h['reassigned']:11d} "
                  f"{h['n_empty']:6d} {h.get('imbalance', float('nan')):9.2f} {h.get('seconds', float('nan')):9.4f} "
                  f"{h.get('gb_per_s', float('nan')):8.2f}")
    return 0


def _cmd_generate(args) -> int:
    from .datasets import make_blobs
    from .io.model_store import write_array
    from .io.paths import Outputs

    with Outputs() as outputs:
        outputs.claim(args.output, "data", args.overwrite)
        X, _ = make_blobs(args.n, args.d, args.centers, cluster_std=args.std, random_state=args.seed, dtype=args.dtype,
                          chunk_rows=args.chunk_rows)
        t0 = time.perf_counter()
        with watching(Steps(args.quiet)):  # each block drawn and written
            write_array(X, args.output, kind="data")
    _say(f"daskmeans: {args.n} x {args.d} {args.dtype} blobs ({args.centers} centers) written to {args.output} in "
         f"{time.perf_counter() - t0:.1f} s")
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    from .errors import DaskmeansWarning

    if issubclass(category, DaskmeansWarning):
        _tell(f"daskmeans: warning: {message}")
    else:
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so that the same clean-up runs (exit 143)."""


_pending: type[KeyboardInterrupt] | None = None


def _on_signal(signum, frame):
    global _pending
    _pending = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    raise _pending()


def _check_interrupt() -> None:
    """Raise again a signal whose exception Python dropped: one raised while a finaliser runs
    (a Dask future's ``__del__``, say) is printed as 'Exception ignored' and lost, and the fit
    would go on to write its output with exit 0. Called every iteration and before any output."""
    if _pending is not None:
        raise _pending()


@contextlib.contextmanager
def _quiet_dropped_signals():
    """While the command runs, a signal's exception that Python drops because it was raised
    inside a finaliser is not printed ('Exception ignored in ...' and a traceback, where the
    user should read one line): :func:`_check_interrupt` raises it again. Any other exception
    a finaliser drops is printed as usual."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _pending is not None:
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


# A command whose reader went away (``daskmeans info m.zarr | head``) ends quietly, with the
# status a shell reports for a tool stopped by SIGPIPE.
_EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def run() -> None:
    """The ``daskmeans`` command: :func:`main`, then exit at once. The work is done and every
    output closed and renamed into place by then; Python's own shutdown (the in-process
    cluster's threads, CUDA's teardown, freeing every module) took ~0.6 s of a command on a GPU
    host, so it is skipped (``os._exit``) once the streams are flushed."""
    argv = sys.argv[1:]
    args = _parser().parse_args(argv)  # usage errors, --help and --version end here, as in main()
    _command_process(dashboard=getattr(args, "dashboard", False))
    rc = main(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # what is left for a reader that went away
            rc = rc or _EXIT_BROKEN_PIPE
    os._exit(rc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default ``sys.argv[1:]``) and return its exit status: 0, 1 for
    an error (one line on stderr), 130 after Ctrl-C, 143 after SIGTERM, 141 when the reader of
    its output went away; usage errors exit 2 (SystemExit)."""
    args = _parser().parse_args(argv)
    from .errors import DaskmeansError

    global _pending, _quiet
    _pending = None
    _quiet = bool(getattr(args, "quiet", False))
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            with warnings.catch_warnings(), _quiet_dropped_signals():  # both restored when main() returns
                warnings.showwarning = _show_warning
                rc = {"fit": _cmd_fit, "predict": _cmd_predict, "info": _cmd_info, "plot": _cmd_plot,
                      "generate": _cmd_generate,
                      "sweep": _cmd_sweep}[args.command](args)
                sys.stdout.flush()  # a reader gone away is found here, not at exit
                return rc
        except DaskmeansError as e:
            _tell(f"daskmeans: error: {e}")
            return 1
        except BrokenPipeError:
            raise
        except OSError as e:
            # The file system's or network's own refusal (a missing or unreadable file, a
            # full disk outside any output): one line, as any expected failure.
            _tell(f"daskmeans: error: {_os_error_line(e)}")
            return 1
        except KeyboardInterrupt as e:
            term = isinstance(e, Terminated)
            _tell(f"daskmeans: {'terminated' if term else 'interrupted'}")
            return 143 if term else 130
    except BrokenPipeError:
        return _EXIT_BROKEN_PIPE
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _os_error_line(e: OSError) -> str:
    """``PATH: reason`` for an OSError about a path, else its own text (its type where it has
    none: a bare TimeoutError)."""
    if e.strerror and isinstance(e.filename, (str, os.PathLike)):
        return f"{os.fspath(e.filename)}: {e.strerror}"
    return " ".join(str(e).split()) or f"{type(e).__name__} (no message)"
