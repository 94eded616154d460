"""``daskmeans generate``: synthetic data written to Zarr (``generate blobs``)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..events import watching
from ..progress import Steps
from ..validation import float_option, int_option, path_option
from . import common


def add_parser(sub: Any) -> None:
    """The ``generate`` subcommand's parser (and its kinds of data), added to ``sub`` (what
    ``add_subparsers`` returned)."""
    g = sub.add_parser("generate", help="write synthetic data")
    gs = g.add_subparsers(dest="kind", required=True, help="what to generate")
    b = gs.add_parser("blobs", help="isotropic Gaussian blobs, written chunk by chunk to Zarr")
    b.add_argument("--n", type=int_option("--n"), required=True, help="rows")
    b.add_argument("--d", type=int_option("--d"), required=True, help="features")
    b.add_argument("--centers", type=int_option("--centers"), required=True,
                   help="number of blobs (centres drawn uniformly in [-10, 10] per feature)")
    b.add_argument("--std", type=float_option("--std"), default=1.0, help="each blob's standard deviation (default 1)")
    b.add_argument("--seed", type=int_option("--seed", **common.SEED_RANGE), default=0,
                   help="random seed (default 0); each chunk is drawn from (seed, chunk index)")
    b.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="the values' type (default float32)")
    b.add_argument("--chunk-rows", type=int_option("--chunk-rows"), metavar="R",
                   help="rows per Zarr chunk (default: about daskmeans.chunk-bytes per chunk)")
    b.add_argument("-o", "--output", type=path_option("-o"), required=True, metavar="DATA.zarr", help="the Zarr array to write")
    b.add_argument("--overwrite", action="store_true", help="replace an existing generated dataset")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress")


def run_generate(args: argparse.Namespace) -> int:
    """``daskmeans generate blobs``: the blobs drawn and written chunk by chunk."""
    from ..datasets import make_blobs
    from ..io.model_store import write_array
    from ..io.paths import Outputs

    with Outputs() as outputs:
        outputs.claim(args.output, "data", args.overwrite)
        X, _ = make_blobs(args.n, args.d, args.centers, cluster_std=args.std, random_state=args.seed, dtype=args.dtype,
                          chunk_rows=args.chunk_rows)
        t0 = time.perf_counter()
        with watching(Steps(args.quiet)):  # each block drawn and written
            write_array(X, args.output, kind="data")
    common.say(f"daskmeans: {args.n} x {args.d} {args.dtype} blobs ({args.centers} centers) written to {args.output} "
               f"in {time.perf_counter() - t0:.1f} s")
    return 0
