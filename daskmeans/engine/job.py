"""A fit's job: the one owner of a fit's data on the cluster, whichever front asked for it.

::

    FitJob.open: a worker to run on -> the path seen by every worker -> the backend -> the data
      kept by an earlier fit of it (reuse) -> the plan (budgets, tier, chunking) -> the fit's
      chunks (split, balanced; fixed for the whole fit) -> the kernels compiling meanwhile
    job.survive(step, *args): step(client, placement, *args), the data placed (again, on the
      workers left, its chunks checked against their pins) whenever a worker is lost before or
      during the step
    job.moments(): the pass before a fit (tolerance, grid, digest, the chunks' pins), which places
      the data (the job's place phase) where nothing placed it before
    FitJob.subsample: the rows a fit on a sample trains on (``train_rows`` of ``open``), drawn
      before the plan; job.labels(centroids): the labels, inertia and sizes of every row after
    job.output(labels): a fit's labels as its caller gets them: computed into an array of the
      data's kind where the data was given in memory (``in_memory`` of ``open``), else lazy
    job.keep(states): the placement to be kept for the next fit of the same data
    job.close(), the job's end: the placement kept (engine/reuse.py) after a fit that asked it and
      ended without error, else released

The Lloyd runs (:mod:`daskmeans.engine.fit`), ``MiniBatchKMeans``'s rounds and the sweep's fits
all run on a job: none of them plans, places or waits for workers itself.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import dask.array as da
import numpy as np
from distributed import Client

from ..backends import backend_name, get_backend, on_gpu
from ..dask_cluster import check_paths_on_workers, resolve_backend
from ..errors import DaskmeansError, DaskmeansWarning
from ..io.readers import files_of, split_rows
from . import tiers as tier_registry
from .placement import Placement, place
from .watch import NO_WORKER_SECONDS, WorkerLost, wait_a_little
from ..events import note, step
from ..metric import get_metric
from ..params import RunParams
from ..sampling import all_rows_stats, draw_cut, take
from ..timing import Phases
from . import infer, reuse
from .lloyd import warm_kernels
from .moments import data_moments
from .plan import TierPlan, balance_chunks, budget_limits, iteration_warning, plan, worker_budgets

# Worker losses a fit outlives before its placement or init gives up (the loop has its own).
MAX_REPLANS = 8
# How long a fit waits for its labels to leave the shards before keeping them for a re-fit.
KEEP_WAIT_SECONDS = 5.0


def some_worker(client: Client, seconds: float = NO_WORKER_SECONDS) -> None:
    """Return once ``client``'s cluster has a worker; one that has none gets ``seconds`` for
    one to join (a nanny restarting it, an adaptive cluster scaling up), then the error."""
    if client.nthreads():
        return
    try:
        client.wait_for_workers(1, timeout=seconds)
    except TimeoutError:
        raise DaskmeansError(
            f"the cluster has no worker and none joined in {seconds:g} s: start workers (dask worker "
            f"{client.scheduler.address})"
        ) from None


@dataclass
class EveryRow:
    """Every row of a fit's data under its centroids (:meth:`FitJob.labels`).

    Attributes
    ----------
    labels : dask array (n,) int32
        Lazy, computed by blocks as ``predict`` computes them.
    inertia : float
        The weighted sum over every row of the distance to its centroid (the metric's units).
    sizes : ndarray (K,) int64
        Rows per cluster.
    """

    labels: da.Array
    inertia: float
    sizes: np.ndarray


def _placement(client: Client, placement: Placement) -> Placement:
    """The step that only places the data (:meth:`FitJob.place`, :meth:`FitJob.replan`)."""
    return placement


class FitJob:
    """The data of one fit on ``client``'s workers, placed in the fit's chunks.

    Make one with :meth:`open`; use it as a context manager (its placement is released at the
    end unless :meth:`keep` kept it for the next fit of the same data).

    Attributes
    ----------
    client : distributed.Client
    X : dask array (n, d)
        The data in the fit's chunks (fixed for the whole fit: a worker lost later places the
        same chunks on the workers left, never re-split, so no statistic kept per chunk
        changes meaning mid-fit).
    weights : dask array (n,) or None
    every : tuple of (dask array (N, d), dask array (N,) or None)
        Every row of the data and its weights, before the metric's scaling: ``X`` is a sample
        of them where the job trains on one (``train_rows``), else their scaled rows.
    backend : str
        "numpy" or "cupy": the fit's.
    outputs : str or None
        The backend whose arrays :meth:`output` gives (the data's own kind: "numpy", or
        "cupy" for CuPy blocks) where the data was given in memory; None: outputs stay lazy.
    tiers : TierPlan
        The memory plan (tier, budgets, the largest share a worker holds once placed).
    placement : Placement or None
        The data on the workers, made by :meth:`survive` when first needed.
    path : str or None
        The file the data is read from (None: data in memory): a placement's shards read the
        reader's array from it on their workers (:func:`daskmeans.engine.placement.place`).
    phase : Phases
        Where the job's phases go (plan, place, moments).
    """

    def __init__(self, client: Client, X: da.Array, weights: da.Array | None, backend: str, tiers: TierPlan,
                 source: Any, budgets: dict, key: reuse.Placed, kept: reuse.Entry | None, phase: Phases,
                 every: tuple[da.Array, da.Array | None] | None = None, metric: str = "euclidean",
                 path: str | None = None, outputs: str | None = None):
        self.client, self.X, self.weights, self.backend, self.tiers = client, X, weights, backend, tiers
        self.outputs = outputs
        self.path = path  # the file the data is read from (its shards read it there): None in memory
        self.phase, self.metric = phase, metric
        self.every = every if every is not None else (X, weights)
        self.sampled = every is not None and int(every[0].shape[0]) != int(X.shape[0])
        self._source, self._budgets, self._key = source, budgets, key
        self.placement: Placement | None = None if kept is None else kept.placement
        self._moments: dict | None = None if kept is None else kept.moments
        self._digest = False if kept is None else kept.digest
        # Each chunk's pin once a pass has read it: a placement made again is given them.
        self.pins: dict | None = None if kept is None else kept.placement.pins
        self._told = False  # whether the tier line was said (once the data is placed)
        self._keep: list | None = None  # the final states of a fit whose placement is kept at the end

    @classmethod
    def open(
        cls,
        client: Client,
        X: da.Array,
        n_clusters: int,
        run: RunParams = RunParams(),
        *,
        sample_weight: da.Array | None = None,
        path: str | None = None,
        files: tuple[str, ...] | None = None,
        precision: str = "fp32",
        max_iter: int | None = None,
        metric: str = "euclidean",
        train_rows: int | None = None,
        seed: int | None = None,
        in_memory: bool = False,
        phase: Phases | None = None,
        algorithm: str = "lloyd",
    ) -> "FitJob":
        """Plan a fit of ``n_clusters`` centroids to ``X`` on ``client``'s workers.

        Parameters
        ----------
        client : distributed.Client
        X : dask array (n, d), float32 or float64
        n_clusters : int
        run : RunParams
            Where the fit runs: its ``backend``, ``tier``, ``memory_limit`` and
            ``device_memory_limit`` (the record's other fields are the fit's loop's).
        sample_weight : dask array (n,), optional
        path : str, optional
            The file ``X`` is read from: checked on every worker before any work.
        files : tuple of str, optional
            Every file ``X`` is read from (the read's ``Table.files()``), whose sizes and
            modification times tell a re-fit whether the data changed; None: found here, from
            ``path`` and the files ``X``'s graph names.
        precision : str
            The GEMM precision, for the kernels compiled while the data is placed.
        max_iter : int, optional
            Lloyd iterations at most: a fit that may take more than an hour says so (none
            for fits of other kinds).
        metric : str
            The fit's rows are the metric's (unit rows for cosine); ``every`` keeps them as given.
        train_rows : int, optional
            Train on this many rows drawn from ``seed`` (:meth:`subsample`), fewer than ``X``
            has; None: every row.
        seed : int, optional
            The sample's seed (needed with ``train_rows``).
        in_memory : bool
            The caller gave the data in memory (the read's ``Table.in_memory``): its outputs
            (:meth:`output`) are arrays of the data's kind, computed on ``client``, as
            scikit-learn gives them; else lazy Dask arrays (data that may not fit the client).
        phase : Phases, optional
            Where the seconds of sample, plan, place and moments go.
        algorithm : str
            The loop's step (``params.ALGORITHMS``' values), whose memory the plan counts.
        """
        phase = phase if phase is not None else Phases()
        if files is None:
            files = tuple(sorted({*files_of(X), *([os.path.abspath(path)] if path is not None else [])}))
        every = (X, sample_weight)
        if train_rows is not None:
            with phase("sample"):
                X, sample_weight = cls.subsample(client, X, sample_weight, train_rows, seed)
        X = get_metric(metric).rows(X)
        k = int(n_clusters)
        n, d = (int(s) for s in X.shape)
        with phase("plan"):
            some_worker(client)
            if path is not None:
                check_paths_on_workers(client, read=[path])
            kind = backend_name(X)  # the data's own arrays' backend: what outputs in memory are made of
            backend = resolve_backend(client, run.backend, kind)
            tier = run.tier
            limits = budget_limits(run.memory_limit, run.device_memory_limit)
            source = reuse.source_key(client, X, sample_weight, backend, tier, *limits, files)
            # The same data placed by an earlier fit on this client: its placement, budgets and
            # moments (taken out of the cache while this fit runs).
            kept = reuse.take(client, source)
            budgets = kept.budgets if kept is not None else worker_budgets(client, *limits, backend)
            # Data daskmeans read from a file is in chunks of its own choosing, which the plan
            # may grow for GPU workers; a caller's chunks are only ever cut.
            tiers = plan(client, X, backend, k, tier, *limits, budgets=budgets, own_chunks=path is not None,
                         algorithm=algorithm)
            if max_iter is not None:
                slow = iteration_warning(n, k, d, max_iter, tiers, len(client.nthreads()))
                if slow:
                    warnings.warn(slow, DaskmeansWarning, stacklevel=4)
            if algorithm == "yinyang" and on_gpu(backend):
                # Lloyd's bits either way, and no GPU measurement has shown it faster yet.
                warnings.warn(f"algorithm='yinyang' on the {backend} backend: measured slower than Lloyd's step on a "
                              f"GPU so far (docs/performance.md, \"Yinyang\"); algorithm='lloyd' gives the same "
                              f"centroids and labels", DaskmeansWarning, stacklevel=4)
            if tiers.chunk_rows:
                X = split_rows(X, tiers.chunk_rows)
            X = balance_chunks(X.rechunk({1: -1}), len(client.nthreads()))
            w = None if sample_weight is None else sample_weight.rechunk((X.chunks[0],))
            warm_kernels(client, backend, k, d, X.dtype, precision, max(X.chunks[0]), tiers.tunables, algorithm)
            # The data is the source's (the entry was found by it): the plan's choices identify the placement.
            key = reuse.Placed(X.chunks[0], tiers.tier, tiers.tunables)
            if kept is not None and kept.key != key:  # planned into another tier (a larger K): place again
                reuse.drop(client, [kept])
                kept = None
            if kept is None:
                reuse.make_room(client, tier_registry.get(tiers.tier).kept_bytes(tiers.share), tiers.host_budget)
        return cls(client, X, w, backend, tiers, source, budgets, key, kept, phase, every, metric, path,
                   kind if in_memory else None)

    @staticmethod
    def subsample(client: Client, X: da.Array, weights: da.Array | None, m: int,
                  seed: int) -> tuple[da.Array, da.Array | None]:
        """The ``m`` rows of ``X`` (n, d) a fit on a sample trains on, and their weights (m,):
        the rows of smallest per-row draw from ``seed`` (:mod:`daskmeans.sampling`: the same
        rows for any chunking and worker count), lazy, in row order."""
        cut = draw_cut(client, X.chunks[0], int(m), int(seed))
        return take(X, cut), (None if weights is None else take(weights, cut))

    # ------------------------------------------------------------ the data on the workers

    def place(self) -> Placement:
        """The placement, made now if there is none yet (see :meth:`survive`)."""
        return self.survive(_placement)

    def survive(self, step_: Callable[..., Any], *args: Any, during: tuple[str, str] | None = None,
                **kwargs: Any) -> Any:
        """``step_(client, placement, *args, **kwargs)`` on the job's client and placement,
        placing the data first (again, on the workers left) when a worker is lost before or
        during it (every step is deterministic given its seed, so the result is the same).

        The step is a function of the engine (an init, the moments pass, a round) given its
        arguments here, as an executor takes them: the job hands the placement to the step
        itself, so that no caller holds a placement that a lost worker made stale. The job's
        first placement, made by whichever step needs the data first, is its ``place`` phase
        and progress step, and says the tier line once (also for a placement kept by an
        earlier fit); ``during``: the (phase, progress step) the step's own time goes to."""
        last = None
        for _ in range(MAX_REPLANS):
            try:
                if not self._told:  # the job's place phase: the data placed now, or kept by an earlier fit
                    with self.phase("place"), step("place", unit="chunks"):
                        if self.placement is None:
                            self._place()
                    # The tier line, with the largest share a worker was given (the plan's is a bound).
                    rows = max(sum(self.placement.row_chunks[i] for i in ids) for ids in self.placement.chunk_ids)
                    self.tiers = dataclasses.replace(self.tiers,
                                                     share=rows * int(self.X.shape[1]) * self.X.dtype.itemsize)
                    note(f"daskmeans: {self.tiers.describe()}")
                    self._told = True
                elif self.placement is None:  # placed again after a loss, within the step that lost it
                    self._place()
                if during is None:
                    return step_(self.client, self.placement, *args, **kwargs)
                with self.phase(during[0]), step(during[1]):
                    return step_(self.client, self.placement, *args, **kwargs)
            except WorkerLost as lost:
                last = lost.args[0]
                self._forget_placement()
        raise DaskmeansError(f"workers kept leaving the cluster ({MAX_REPLANS} times; last {last})")

    def _place(self) -> None:
        """The data placed on the workers present."""
        # The chunks' pins from the passes over the placement lost: a chunk read again from
        # the source is checked against its first read.
        self.placement = place(self.client, self.X, self.backend, self.weights, self.tiers.tier,
                               balance=False, pins=self.pins, tunables=self.tiers.tunables, source=self.path)

    def replan(self) -> Placement:
        """A new placement on the workers now present (the Lloyd loop's hook after a loss)."""
        self._forget_placement()
        return self.survive(_placement)

    def _forget_placement(self) -> None:
        if self.placement is not None and self.placement.pins is not None:
            self.pins = self.placement.pins
        self.placement = None

    def moments(self, digest: bool = False) -> dict:
        """The moments pass (:func:`daskmeans.engine.moments.data_moments`) over the job's
        data, once: an earlier fit's where the data was kept (with the digest when asked).
        The data is placed by this, its first pass, where nothing placed it before."""
        if self._moments is not None and (self._digest or not digest):
            if not self._told and self.placement is not None:  # kept by an earlier fit: its tier line
                self.place()
            return dict(self._moments)
        self._moments = self.survive(data_moments, digest=digest, during=("moments", "moments (one pass over the data)"))
        self._digest = digest
        self.pins = self._moments.get("pins")
        return dict(self._moments)

    # ------------------------------------------------------------ every row

    def labels(self, centroids: np.ndarray, precision: str) -> EveryRow:
        """Every row's label under ``centroids`` (K, d) float64, the inertia and the cluster
        sizes over every row (``every``, also when the fit trained on a sample), by blocks as
        ``predict`` computes them (no placement: one task per row chunk)."""
        x, w = self.every
        with self.phase("all rows"):
            xb = infer.blocks(self.client, x, self.backend, self.metric)
            centers = np.asarray(centroids).astype(x.dtype)  # as predict reads cluster_centers_
            inertia, sizes = all_rows_stats(self.client, xb, w, centers, precision, self.metric)
        return EveryRow(infer.labels(xb, centers, precision), inertia, sizes)

    def output(self, result: da.Array) -> Any:
        """``result`` (a fit's labels (n,), lazy Dask array of NumPy blocks) as the caller
        gets it: computed on the job's client into an array of the data's kind (NumPy, or
        CuPy for CuPy data) where the data was given in memory (:attr:`outputs`), else the
        lazy ``result`` itself, whose blocks the workers hold."""
        if self.outputs is None:
            return result
        return get_backend(self.outputs).asarray(result.compute(scheduler=self.client))

    # ------------------------------------------------------------ the end of the job

    def keep(self, states: list) -> None:
        """Keep the placement for the next fit of the same data when the job ends without
        error (:meth:`close`), once ``states`` (futures made from the shards: the labels) are
        done with the shards (a later fit's final pass replaces what they hold)."""
        self._keep = states

    def close(self) -> None:
        """The job's end: the placement kept for the next fit of the same data where
        :meth:`keep` asked it (and its states are done with the shards in time), else
        released (the shards, and with them the persisted data)."""
        states, self._keep = self._keep, None
        if states is not None and self.placement is not None:
            wait_a_little(self.client, states, KEEP_WAIT_SECONDS)
            if all(f.status == "finished" for f in states):
                reuse.put(self.client, reuse.Entry(self._source, self._budgets, self._key, self.placement,
                                                   self._moments, self._digest, self.tiers.share))
        self.placement = None

    def __enter__(self) -> "FitJob":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:  # a fit that failed keeps nothing
            self._keep = None
        self.close()
