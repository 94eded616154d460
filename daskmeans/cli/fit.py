"""``daskmeans fit``: fit a model to DATA and write it (with ``--labels``, ``--timings``).

Everything it does is the API's (:class:`daskmeans.KMeans`): it reads DATA and checks the
parameters before any cluster starts, claims the outputs, connects, and shows progress; the
fit's plan, chunking, placement and its check of DATA's path on the workers are the engine's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import threading
import time
import warnings
from typing import Any

from .. import seeding
from ..events import watching
from ..params import KMeansParams, RunParams
from ..progress import Progress, Steps
from ..timing import Phases
from ..validation import labels_path_option, path_option
from . import common


def init_help() -> str:
    """``--init``'s help: the registered inits (the default marked), or a file of centroids."""
    names = [f"{n} (default)" if n == seeding.DEFAULT else n for n in seeding.names()]
    return ", ".join(names) + ", or a .npy file of K x D centroids"


def add_parser(sub: Any) -> None:
    """The ``fit`` subcommand's parser, added to ``sub`` (what ``add_subparsers`` returned)."""
    f = sub.add_parser("fit", help="fit a model to DATA (.zarr, .csv or .npy)")
    f.add_argument("data", help="the rows to cluster: a .zarr array or group (see --dataset), a .csv or a .npy file")
    # The options of the records' fields (params.py): default, help, choices and the check
    # of a value (the field's constraint) written once for the estimators and the command.
    common.add_field(f, common.field(KMeansParams, "n_clusters"), "--k", required=True)
    f.add_argument("-o", "--output", type=path_option("-o"), default="model.zarr", help="model to write (Zarr group; default model.zarr)")
    # A registered name or a .npy file: no choices; run_fit checks it (the file exists).
    common.add_field(f, common.field(KMeansParams, "init", inits=seeding.names()), text=init_help(),
                     shown_default=None, choices=None)
    # The command's own default: one run (KMeans's n_init="auto" is scikit-learn's rule, and
    # the command's --n-init counts runs).
    common.add_field(f, common.field(KMeansParams, "n_init"), default=1, metavar="N",
                     text="runs from different seeds; the run of lowest inertia is kept")
    common.add_field(f, common.field(KMeansParams, "max_iter"), metavar="N")
    common.add_field(f, common.field(KMeansParams, "tol"), metavar="T")
    common.add_field(f, common.field(KMeansParams, "random_state"), "--seed", metavar="S", shown_default="a fresh one",
                     text="random seed: the same seed gives the same model for any chunking and worker count")
    # The metrics' names from the light registry (daskmeans.metric checks them against its
    # hooks): the help lists them without loading NumPy.
    common.add_field(f, common.field(KMeansParams, "metric"), metavar="NAME",
                     text="the distance, one of %(choices)s; cosine: spherical k-means")
    common.add_field(f, common.field(KMeansParams, "precision"),
                     text="GPU GEMM precision; labels are exact in every mode (uncertain rows are re-checked)")
    common.add_field(f, common.field(KMeansParams, "max_samples_per_cluster"), metavar="N",
                     shown_default="daskmeans.max-samples-per-cluster: every row",
                     text="train on N x K rows drawn from --seed where the data has more (FAISS's "
                          "max_points_per_centroid), then label every row")
    common.add_field(f, common.field(KMeansParams, "algorithm"),
                     text="the loop, one of %(choices)s: yinyang gives lloyd's result, skipping the rows whose "
                          "bounds certify their label")
    common.add_field(f, common.field(KMeansParams, "max_imbalance"), metavar="R", shown_default="off",
                     text="balance the cluster sizes (as an IVF index wants): while the largest cluster holds more "
                          "than R x the mean size, each iteration moves the smallest clusters' centroids into the "
                          "clusters above it (R > 1)")
    f.add_argument("--labels", metavar="LABELS", type=labels_path_option("--labels"),
                   help="also write the training labels here, in the format of its suffix (as predict -o)")
    common.add_keep_arg(f)
    common.add_field(f, common.field(RunParams, "tier"), text=common.tier_help(), shown_default=None)
    common.add_field(f, common.field(RunParams, "memory_limit"), metavar="SIZE", shown_default="auto",
                     text="host memory per worker for resident data (e.g. 8GiB)")
    common.add_field(f, common.field(RunParams, "device_memory_limit"), metavar="SIZE", shown_default="auto",
                     text="GPU memory per worker for resident data (e.g. 40GiB)")
    common.add_field(f, common.field(RunParams, "checkpoint"), metavar="CKPT.zarr",
                     text="write the fit's restart point here every --checkpoint-every iterations and on "
                          "Ctrl-C/SIGTERM")
    common.add_field(f, common.field(RunParams, "checkpoint_every"), metavar="N")
    f.add_argument("--resume", action="store_true", help="continue from --checkpoint (same data and parameters)")
    f.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    f.add_argument("--timings", type=path_option("--timings"), metavar="FILE.json",
                   help="write the command's phases (imports, cluster start, read, place, init, iterations, "
                        "outputs...) and their wall seconds here")
    f.add_argument("-q", "--quiet", action="store_true", help="no progress")
    f.add_argument("-v", "--verbose", action="store_true",
                   help="one line per iteration, with imbalance and throughput, also on a terminal")
    common.add_data_args(f)
    common.add_cluster_args(f)


class FitProgress(Progress):
    """The fit's progress (:class:`daskmeans.progress.Progress`), and where a signal whose
    exception Python dropped is raised again (:func:`.common.check_interrupt`)."""

    iteration = 0  # the last iteration reported

    def __call__(self, s: dict) -> None:
        self.iteration = s["iteration"]
        common.check_interrupt()
        super().__call__(s)


def write_timings(path: str, phase: Phases, main_s: float, km, started_at: float) -> None:
    """The ``--timings`` file: phases in order, the command's seconds from main() on and when
    main() started (``started_at``, seconds since the epoch: other processes' events, such as
    the kernel cache's files, on the same clock), the iterations' own seconds (the first one's
    excess over the median is the kernels' compile or load), and the files whose rows were
    parsed ahead (:mod:`daskmeans.io.csv_ahead`). Written as the other outputs are
    (atomically, renamed with them)."""
    from ..io import csv_ahead
    from ..io.paths import atomic_file

    hist = km.history_
    doc = {
        "phases": phase.seconds, "main_seconds": main_s, "main_started_at": started_at,
        "fit_seconds": common.fit_seconds(km.timings_),
        "n_iter": km.n_iter_,
        "iteration_seconds": [h["seconds"] for h in hist],
        "kernel_seconds": [h["kernel_seconds"] for h in hist],
        "backend": km.backend_, "tier": km.tier_, "read_ahead": list(csv_ahead.TAKEN),
    }
    with atomic_file(path, kind="timings") as tmp, open(tmp, "w") as f:
        json.dump(doc, f, indent=1)


def run_fit(args: argparse.Namespace) -> int:
    """``daskmeans fit``: exit status 0 once the model (and labels, timings) are in place."""
    t_main, started_at = time.perf_counter(), time.time()
    phase = Phases()
    warming = None  # the data's dtype, where CuPy's kernels are being compiled ahead
    with phase("imports"):
        if not common.external(args):
            common.read_ahead(args)  # a CSV file parsed in a process of its own meanwhile
            from ..backends import on_gpu, requested_backend

            wanted = requested_backend(args.backend)
            if wanted is None or on_gpu(wanted):
                # CuPy's kernels of a fit compiled into its disk cache by a few processes while
                # this one imports and starts its GPU workers (a first fit compiles dozens), and
                # this package's for the data's shape, which its header gives before any import.
                from ..backends.cupy_backend import warm_ahead
                from ..io.headers import peek

                seen = peek(args.data, args.dataset)
                shape, dtype = seen if seen is not None else (None, "float32")
                if warm_ahead(dtype, k=args.k, shape=shape, precision=args.precision, algorithm=args.algorithm,
                              chunk_bytes=args.chunk_bytes):
                    warming = dtype
        early = common.starting(args)
        from ..dask_cluster import check_paths_on_workers, describe
        from ..errors import DaskmeansError
        from ..estimator import KMeans
        from ..io import csv_ahead
        from ..io.labels import labels_output, write_labels
        from ..io.paths import Outputs
        from ..validation import check_n_clusters

    if warming is not None:  # and by a thread of this process, now that its imports are done
        from ..backends.cupy_backend import warm_ops_here

        warm_ops_here(warming)
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
                        max_samples_per_cluster=args.max_samples_per_cluster, max_imbalance=args.max_imbalance,
                        algorithm=args.algorithm)
            km.check_params()  # fail fast: before reading data or starting a cluster
            common.check_cluster_args(args)
            # The inputs first: a missing input is the error to report, whatever the outputs.
            table = common.read(args)  # preflight: the file opens, is numeric, and has enough rows
            table.refuse_identifiers()  # an id column is no feature: refused before any work
            X = table.array
            check_n_clusters(int(X.shape[0]), args.k)
            km.training_rows(int(X.shape[0]))  # a checkpointed fit on a sample without --seed
            km.initial_centroids(int(X.shape[1]))  # an init file of the wrong shape, before any cluster starts
            inputs = [args.data] + ([init] if init not in seeding.REGISTRY else [])
            if args.keep_columns and not args.labels:
                raise DaskmeansError(f"--keep-columns {args.keep_columns} writes columns beside the labels: it needs "
                                     f"--labels PATH")
            target = labels_output(args.labels, common.split(args.keep_columns), table) if args.labels else None
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
                warnings.showwarning = common.show_warning  # distributed routes warnings to logging
                client = cluster.enter_context(early.connected() if early is not None else common.connect(args))
                common.say(f"daskmeans: {describe(client)}")
                if args.labels:
                    # The workers write the labels: a directory they cannot write into is
                    # found before the fit (the fit's own job checks DATA on them).
                    check_paths_on_workers(client, write=[args.labels])
            link = f"; dashboard {client.dashboard_link}" if args.dashboard or common.external(args) else ""
            common.say(f"daskmeans: {X.shape[0]} x {X.shape[1]} {X.dtype}, {X.numblocks[0]} chunks{link}")
            if args.verbose and csv_ahead.TAKEN:
                common.say(f"daskmeans: {csv_ahead.TAKEN[-1]} parsed ahead, while the command started")
            km.client = client
            if target is not None and target.format == "zarr":
                # The labels' writer (zarr, whose imports are long: performance.md, "Startup") loads
                # while the fit waits on its workers.
                threading.Thread(target=importlib.import_module, args=("zarr",), daemon=True).start()
            progress = FitProgress(args.quiet, args.verbose, args.max_iter, args.n_init)
            cluster.enter_context(watching(Steps(args.quiet)))  # placing, the init, the labels' write
            with common.settings(args), contextlib.closing(progress):
                try:
                    km.fit(table, callback=progress, resume=args.resume)  # the header's names with it
                except KeyboardInterrupt:
                    if getattr(km, "checkpoint_iteration_", None):
                        common.tell(f"daskmeans: checkpoint of iteration {km.checkpoint_iteration_} in "
                                    f"{args.checkpoint}; continue with --resume")
                    elif not args.checkpoint and progress.iteration:
                        common.tell(f"daskmeans: {progress.iteration} iterations were not kept: with --checkpoint "
                                    f"PATH a fit writes a restart point on Ctrl-C, and --resume continues from it")
                    raise
                common.check_interrupt()
            phase.update({f"fit {k}": v for k, v in km.timings_.items()})
            if args.verbose and args.n_init > 1:
                common.say(f"daskmeans: run {km.best_run_} of {args.n_init} has the lowest inertia: its model is kept")
            if km.n_samples_fit_ < X.shape[0]:
                common.say(f"daskmeans: trained on a sample of {km.n_samples_fit_} of {X.shape[0]} rows "
                           f"(sample inertia {km.sample_inertia_:.6e}); the inertia below is over every row")
            common.say(
                f"daskmeans: fit in {common.fit_seconds(km.timings_):.2f} s ({km.n_iter_} iterations in "
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
            write_timings(args.timings, phase, time.perf_counter() - t_main, km, started_at)
        common.check_interrupt()
    # Renamed into place: only now are they written.
    if args.labels:
        common.say(f"daskmeans: labels written to {args.labels}")
    common.say(f"daskmeans: model written to {args.output}")
    if args.verbose:
        common.say(f"daskmeans: {phase.describe()}")
    return 0
