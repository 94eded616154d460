"""The commands that read a fitted model: ``daskmeans predict`` (labels of DATA), ``info``
(what the model holds) and ``plot`` (its pictures). None of them fits, and only ``predict``
starts a cluster."""

from __future__ import annotations

import argparse
import contextlib
import json
import warnings
from typing import Any, Iterator

from ..events import watching
from ..progress import Steps
from ..validation import int_option, labels_path_option, path_option
from . import common


def add_parsers(sub: Any) -> None:
    """The ``predict``, ``info`` and ``plot`` subcommands' parsers, added to ``sub`` (what
    ``add_subparsers`` returned)."""
    p = sub.add_parser("predict", help="label DATA with a fitted MODEL")
    p.add_argument("model", help="a model written by daskmeans fit")
    p.add_argument("data", help="the rows to label (.zarr, .csv or .npy), with the model's number of features")
    p.add_argument("-o", "--output", required=True, metavar="LABELS", type=labels_path_option("-o"),
                   help="where to write the labels, in the format of its suffix: .zarr (or no suffix) a Zarr group "
                        "holding the int32 array 'labels' (one per row); .npy a 1-D int32 array; .csv or .parquet a "
                        "column 'label' after the --keep-columns")
    common.add_keep_arg(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing labels output")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress")
    common.add_data_args(p)
    common.add_cluster_args(p)

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
    common.add_data_args(pl)


@contextlib.contextmanager
def columns_checked(km: Any, table: Any, args: argparse.Namespace) -> Iterator[None]:
    """Check DATA's columns (``table``, a :class:`~daskmeans.io.readers.Table`) against the
    model ``km`` before any output or cluster (names as scikit-learn does, then their
    number): another set or order of names is an error in one line, with the ``--columns``
    that selects the model's columns where the file has them all; a warning (only one side
    names its columns) is printed once, here, and not again by the inference that runs
    inside the context."""
    from ..errors import DaskmeansError, FeatureNamesError, FeatureNamesWarning
    from ..io.csv_reader import SUFFIXES

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


def run_predict(args: argparse.Namespace) -> int:
    """``daskmeans predict``: the labels of DATA written block by block to ``-o``."""
    from .. import load
    from ..dask_cluster import check_paths_on_workers
    from ..io.labels import labels_output, write_labels
    from ..io.paths import Outputs

    common.check_cluster_args(args)
    with Outputs() as outputs:
        km = load(args.model)  # the inputs before the output
        table = common.read(args)
        X = table.array
        target = labels_output(args.output, common.split(args.keep_columns), table)  # its format, the columns kept
        with columns_checked(km, table, args):  # before the output is claimed and the cluster started
            outputs.claim(args.output, "labels", args.overwrite, [args.model, args.data])
            with common.connect(args) as client, watching(Steps(args.quiet)):
                # Inference runs no fit job (engine/infer.py: a task per block), so nothing
                # else checks that the workers see DATA and can write the labels.
                check_paths_on_workers(client, read=[args.data], write=[args.output])
                km.client = client
                km.backend_ = args.backend
                labels = km.predict(table)  # lazy: computed block by block as they are written
                common.check_interrupt()
                write_labels(labels, target)
        common.check_interrupt()
    common.say(f"daskmeans: {X.shape[0]} labels written to {args.output}")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    """``daskmeans plot``: the model's report (and DATA's projection) as one image."""
    from .. import load
    from ..io.paths import Outputs, atomic_file

    with Outputs() as outputs, contextlib.ExitStack() as checked:
        km = load(args.model)  # the inputs before the output
        X = None
        if args.data is not None:
            X = common.read(args)
            checked.enter_context(columns_checked(km, X, args))
        outputs.claim(args.output, "plot", args.overwrite, [args.model, args.data])
        common.check_image_suffix(args.output)
        fig = km.plot(X, sample=args.sample)
        with atomic_file(args.output, kind="plot") as tmp:
            fig.savefig(tmp, format=common.image_format(args.output))
    common.say(f"daskmeans: report written to {args.output}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    """``daskmeans info``: the model's parameters, fit and history on stdout (or its
    attributes as JSON)."""
    from ..io.model_store import load_model

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
        print(f"fit time     {common.fit_seconds(timings):.2f} s ({len(hist)} iterations in "
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
