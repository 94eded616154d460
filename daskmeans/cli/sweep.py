"""``daskmeans sweep``: fit DATA for several K and name the elbow.

The sweep itself is the API's (:mod:`daskmeans.sweep`, which imports nothing of the command);
this module adds the options, the outputs claimed before any work, a line per K (a bar on a
terminal) and the line naming the Ks kept on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import seeding
from ..events import watching
from ..params import KMeansParams
from ..progress import Steps
from ..sweep import SAMPLE_ROWS, parse_ks  # light: NumPy and Dask load in the sweep itself
from ..validation import int_option, path_option
from . import common


def ks_option(text: str) -> list[int]:
    """``--k``'s value: the Ks of a list (``8,16,32``) or ranges (``2-12``)."""
    try:
        return parse_ks(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--k {text}: {e}") from None


def add_parser(sub: Any) -> None:
    """The ``sweep`` subcommand's parser, added to ``sub`` (what ``add_subparsers`` returned)."""
    s = sub.add_parser("sweep", help="fit DATA for several K and pick the elbow (inertia, silhouette, Davies-Bouldin)")
    s.add_argument("data", help="the rows to cluster (.zarr, .csv or .npy)")
    s.add_argument("--k", type=ks_option, required=True, metavar="K,K,...",
                   help="the numbers of clusters to fit: a list (8,16,32) or ranges (2-12)")
    s.add_argument("-o", "--output", type=path_option("-o"), default="sweep.json", metavar="SWEEP.json",
                   help="the summary: each K's inertia, scores, iterations and seconds, and the elbow, rewritten "
                        "after each K (the Ks done so far: kept on Ctrl-C) (default sweep.json)")
    s.add_argument("--plot", type=path_option("--plot"), metavar="ELBOW.png", help="also draw the elbow plot here (.png, .svg or .pdf)")
    s.add_argument("--sample", type=int_option("--sample"), default=SAMPLE_ROWS, metavar="N",
                   help=f"rows drawn for the silhouette and Davies-Bouldin scores (default {SAMPLE_ROWS})")
    # The options of the records' fields (params.py), as fit's. The init is checked by each
    # fit (a registered name or a .npy file): no choices here.
    common.add_field(s, common.field(KMeansParams, "init", inits=seeding.names()),
                     text="each fit's init (as fit's --init)", choices=None)
    # The command's own defaults: one run per K (KMeans's n_init="auto" is scikit-learn's
    # rule), and the API sweep's seed 0 (``daskmeans.sweep``'s random_state), which its
    # sample is drawn from too: a sweep run again scores the same rows.
    common.add_field(s, common.field(KMeansParams, "n_init"), default=1, text="runs per K, the best kept")
    common.add_field(s, common.field(KMeansParams, "max_iter"), text="iterations per fit at most")
    common.add_field(s, common.field(KMeansParams, "random_state"), "--seed", default=0,
                     text="seed of every fit and of the sample")
    s.add_argument("--overwrite", action="store_true", help="replace an existing summary and plot")
    s.add_argument("-q", "--quiet", action="store_true", help="no line per K")
    common.add_data_args(s)
    common.add_cluster_args(s)


def run_sweep(args: argparse.Namespace) -> int:
    """``daskmeans sweep``: the outputs claimed before any work, a line per K (a bar on a
    terminal), the summary rewritten after each K (kept on Ctrl-C), the elbow."""
    from .. import sweep
    from ..dask_cluster import describe
    from ..errors import DaskmeansError
    from ..events import note
    from ..io.paths import Outputs, atomic_file, check_output

    with Outputs() as outputs:
        common.check_cluster_args(args)
        if args.overwrite and os.path.isfile(args.output) and not sweep.is_summary(args.output):
            raise DaskmeansError(f"{args.output} is not a daskmeans sweep summary: --overwrite replaces only one")
        # The summary is rewritten after each K (each write atomic, at once, not at the end):
        # checked as any output first, then claimed as replaceable by the sweep's own writes.
        check_output(args.output, args.overwrite, [args.data])
        outputs.claim(args.output, None, True, [args.data], defer=False)
        if args.plot:
            outputs.claim(args.plot, "plot", args.overwrite, [args.data, args.output])
            common.check_image_suffix(args.plot)
        table = common.read(args)
        table.refuse_identifiers()  # a CSV id column is no feature, as for fit
        X = table.array
        with common.connect(args) as client:
            # Each K's fit checks DATA on the workers (its engine job), before any work.
            common.say(f"daskmeans: {describe(client)}")
            common.say(f"daskmeans: {X.shape[0]} x {X.shape[1]} {X.dtype}, K in {args.k}")

            def line(s: dict) -> None:
                common.check_interrupt()
                if not args.quiet:
                    note(sweep.describe_line(s))  # above the bar on a terminal

            try:
                with common.settings(args), watching(Steps(args.quiet)):
                    res = sweep.sweep(X, args.k, sample=args.sample, random_state=args.seed, client=client,
                                      callback=line, output=args.output, init=args.init, n_init=args.n_init,
                                      max_iter=args.max_iter, backend=args.backend)
            except KeyboardInterrupt as e:
                part = getattr(e, "result", None)
                if part is not None and part.ks:
                    common.tell(f"daskmeans: {len(part.ks)} of {len(args.k)} K fitted before the interrupt "
                                f"(K={', '.join(map(str, part.ks))}): their summary is in {args.output}")
                else:
                    common.tell(f"daskmeans: no K was fitted before the interrupt: {args.output} not written")
                raise
        if args.plot:
            with atomic_file(args.plot, kind="plot") as tmp:
                sweep.figure(res).savefig(tmp, format=common.image_format(args.plot))
        common.check_interrupt()
    common.say(f"daskmeans: elbow at K={res.elbow}" if res.elbow is not None else
               f"daskmeans: no elbow: {sweep.no_elbow_reason(res)}")
    common.say(f"daskmeans: {len(res.ks)} K in {res.wall_seconds:.2f} s (fits {sum(res.fit_seconds):.2f} s, scores "
               f"{sum(res.score_seconds):.2f} s, sample {res.sample_seconds:.2f} s); summary written to {args.output}"
               + (f", plot to {args.plot}" if args.plot else ""))
    return 0
