"""A worker SIGKILLed in each phase of a fit, of the labels' write and of predict, on real
``dask scheduler`` / ``dask worker`` processes, with and without a nanny: the command exits
0 and the API returns, and the model (centroids, inertia, n_iter) and the labels are bit for
bit those of an undisturbed fit on the same cluster. Without a nanny the killed worker is
gone for good (the work finishes on 2); with one it comes back at a new address.

The data varies over the cases: .npy, Zarr and in-memory, 3, 7, 9 and 10 chunks over 3
workers, each chunking even over 3 workers (:data:`faultkit.EQUAL`). By default each phase has
one (data kind, chunk count) per cluster kind, chosen so that every data kind and chunk count
appears (18 cases). With ``DASKMEANS_FAULT_MATRIX=full`` in the environment each phase runs
with every data kind and chunk count on each cluster kind (104 cases each: ids such as
``placement-zarr9``), but for the labels written by the command from in-memory data: the
command reads files, and ``labels-write-api`` is that phase for in-memory data. The phases the
command runs otherwise (the iterations, predict) run through the API for in-memory data."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import dask
import numpy as np
import pytest
import zarr

import daskmeans
import daskmeans.engine.watch as watch
import faultkit
from faultkit import CHUNKS, K, KINDS, Stuck, daskmeans_cli, kill_on, kills, leftovers, one_error_line, run_guarded

SEED = 0
MATRIX = os.environ.get("DASKMEANS_FAULT_MATRIX", "")
if MATRIX not in ("", "full"):
    raise ValueError(f"DASKMEANS_FAULT_MATRIX is 'full' or unset, not {MATRIX!r}")


@pytest.fixture(scope="module", params=["nanny", "no-nanny"])
def cluster(request, tmp_path_factory, fault_data):
    """3 single-threaded workers, with or without a nanny, shared by the module's tests of
    that kind (each test starts with 3 workers: :meth:`faultkit.DaskProcesses.restore`),
    and the undisturbed fits of every case on it, made before any worker is killed."""
    c = faultkit.DaskProcesses(tmp_path_factory.mktemp(request.param), 3, nanny=request.param == "nanny")
    c.start()
    c.references = {}
    try:
        for case in sorted({data or phase.data[request.param] for phase, data in cases()}):
            reference(c, fault_data, *case)
        yield c
    finally:
        c.stop()


@dataclass
class Reference:
    km: Any  # cluster_centers_, inertia_, n_iter_ (no futures: the workers hold nothing for it)
    labels: np.ndarray
    model: Path


def reference(cluster, data, kind: str, n_chunks: int) -> Reference:
    """The undisturbed fit of ``(kind, n_chunks)`` on ``cluster`` (made once), its labels and
    its saved model."""
    key = (kind, n_chunks)
    if key not in cluster.references:
        cluster.restore()
        c = cluster.client
        X = data.api(kind, n_chunks)
        km = run_guarded(c, lambda: daskmeans.KMeans(K, random_state=SEED, client=c).fit(X), timeout=90)
        assert km.n_iter_ >= 4
        labels = run_guarded(c, lambda: c.compute(km.labels_).result(), timeout=60)
        model = cluster.root / f"ref-{kind}{n_chunks}.zarr"
        km.save(str(model))
        # Only the results: a fit's labels_ holds futures, which the scheduler would make
        # again on the workers each time one is killed (and a kill would strike them).
        fitted = SimpleNamespace(cluster_centers_=km.cluster_centers_, inertia_=km.inertia_, n_iter_=km.n_iter_)
        daskmeans.release(c)  # nor the placement kept for a re-fit: the fits under test place their data
        cluster.references[key] = Reference(fitted, labels, model)
    return cluster.references[key]


def assert_same_model(km: daskmeans.KMeans, ref: Reference) -> None:
    np.testing.assert_array_equal(km.cluster_centers_, ref.km.cluster_centers_)
    assert km.cluster_centers_.dtype == ref.km.cluster_centers_.dtype
    assert km.inertia_ == ref.km.inertia_
    assert km.n_iter_ == ref.km.n_iter_


def assert_one_kill(flags: Path, prefix: str) -> None:
    done = kills(flags)
    assert len(done) == 1 and done[0].startswith(prefix), done


def read_labels(path: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(path), mode="r")["labels"][...])


# ---------------------------------------------------------------- what runs while a worker dies


def api_fit(cluster, data, kind, n, ref, tmp):
    """The API's fit, then its labels computed."""
    c = cluster.client
    X = data.api(kind, n)
    with dask.config.set({"daskmeans.segment-seconds": 0.02}):
        km = run_guarded(c, lambda: daskmeans.KMeans(K, random_state=SEED, client=c).fit(X), timeout=90)
    assert_same_model(km, ref)
    labels = run_guarded(c, lambda: c.compute(km.labels_).result(), timeout=60)
    np.testing.assert_array_equal(labels, ref.labels)


def api_labels(cluster, data, kind, n, ref, tmp):
    """The API's fit, then its labels written (the command's writer), checked."""
    from daskmeans.io.model_store import write_array

    c = cluster.client
    X = data.api(kind, n)
    km = run_guarded(c, lambda: daskmeans.KMeans(K, random_state=SEED, client=c).fit(X), timeout=90)
    assert_same_model(km, ref)
    out = tmp / "labels.zarr"

    def write():
        with c.as_current():  # the writer's client (a context variable: set in the thread)
            write_array(km.labels_, str(out), name="labels")

    run_guarded(c, write, timeout=60)
    np.testing.assert_array_equal(read_labels(out), ref.labels)
    assert leftovers(tmp) == []


def cli_fit(cluster, data, kind, n, ref, tmp, labels: bool = False):
    """``daskmeans fit`` (with ``--labels``), checked against the reference."""
    model, lab = tmp / "model.zarr", tmp / "labels.zarr"
    argv = ["fit", *data.cli(kind, n), "--k", str(K), "--seed", str(SEED), "-o", str(model), "-q"]
    rc, out, err = daskmeans_cli(cluster, *argv, *(["--labels", str(lab)] if labels else []), cwd=tmp)
    assert rc == 0 and "Traceback" not in err, err
    assert_same_model(daskmeans.load(str(model)), ref)
    if labels:
        np.testing.assert_array_equal(read_labels(lab), ref.labels)
    assert leftovers(tmp) == []


def cli_labels(cluster, data, kind, n, ref, tmp):
    cli_fit(cluster, data, kind, n, ref, tmp, labels=True)


def cli_predict(cluster, data, kind, n, ref, tmp):
    """``daskmeans predict`` of the reference model: the fit's labels."""
    out = tmp / "pred.zarr"
    rc, _, err = daskmeans_cli(cluster, "predict", str(ref.model), *data.cli(kind, n), "-o", str(out), cwd=tmp)
    assert rc == 0 and "Traceback" not in err, err
    np.testing.assert_array_equal(read_labels(out), ref.labels)
    assert leftovers(tmp) == []


def api_predict(cluster, data, kind, n, ref, tmp):
    """The API's predict of the reference model, computed: the fit's labels."""
    c = cluster.client
    km = daskmeans.load(str(ref.model)).set_params(client=c)
    X = data.api(kind, n)
    labels = run_guarded(c, lambda: c.compute(km.predict(X)).result(), timeout=60)
    np.testing.assert_array_equal(labels, ref.labels)


@dataclass
class Phase:
    name: str
    prefix: str  # the key prefix of the task whose start kills a worker
    run: Callable
    data: dict  # per cluster kind: (data kind, chunks)
    skip: int = 0  # task starts of that prefix let pass first
    xfail: dict = field(default_factory=dict)  # per cluster kind: the reason
    command: bool = False  # run is the command's, which reads files only
    api: Callable | None = None  # a command phase's run for in-memory data (None: no such case)

    def runner(self, kind: str) -> Callable | None:
        """What runs this phase on ``kind`` data (None: the case does not exist)."""
        return self.api if self.command and kind == "mem" else self.run


PHASES = [
    Phase("placement", "daskmeans-shard", api_fit, {"nanny": ("zarr", 9), "no-nanny": ("mem", 10)}),
    Phase("moments", "daskmeans-moments", api_fit, {"nanny": ("npy", 3), "no-nanny": ("zarr", 9)}),
    Phase("kmeans||-first-round", "daskmeans-kpar-update", api_fit, {"nanny": ("mem", 7), "no-nanny": ("npy", 3)}),
    # The third round's draws: 3 shards a round, one per worker, whatever the chunk count.
    Phase("kmeans||-later-round", "daskmeans-kpar-sample", api_fit, {"nanny": ("mem", 10), "no-nanny": ("zarr", 3)},
          skip=6),
    # The second segment (segments of 0.02 s: a few iterations each), through the command
    # (the API for in-memory data).
    Phase("iterations", "daskmeans-segment", cli_fit, {"nanny": ("zarr", 3), "no-nanny": ("npy", 9)}, skip=3,
          command=True, api=api_fit),
    Phase("final-pass", "daskmeans-labels", api_fit, {"nanny": ("npy", 9), "no-nanny": ("mem", 7)}),
    # In-memory data: labels-write-api's cases.
    Phase("labels-write-cli", "_write_block", cli_labels, {"nanny": ("zarr", 9), "no-nanny": ("npy", 3)},
          command=True),
    Phase("labels-write-api", "_write_block", api_labels, {"nanny": ("mem", 7), "no-nanny": ("mem", 10)}),
    Phase("predict", "_predict_block", cli_predict, {"nanny": ("npy", 9), "no-nanny": ("zarr", 9)}, command=True,
          api=api_predict),
]


def cases(full: bool = MATRIX == "full") -> list[tuple[Phase, tuple[str, int] | None]]:
    """``test_worker_killed``'s cases, ``(phase, (data kind, chunks))``: each phase with its
    own data per cluster kind (``None``: :attr:`Phase.data`'s), or with ``full`` every data
    kind and chunk count the phase can run on."""
    if not full:
        return [(p, None) for p in PHASES]
    return [(p, (kind, n)) for p in PHASES for kind in KINDS for n in CHUNKS if p.runner(kind) is not None]


def _case_id(phase: Phase, data: tuple[str, int] | None) -> str:
    return phase.name if data is None else f"{phase.name}-{data[0]}{data[1]}"


def _mode(cluster) -> str:
    return "nanny" if cluster.nanny else "no-nanny"


@pytest.mark.parametrize("phase, data", [pytest.param(*c, id=_case_id(*c)) for c in cases()])
def test_worker_killed(cluster, fault_data, phase, data, tmp_path, request):
    mode = _mode(cluster)
    if mode in phase.xfail:
        request.applymarker(pytest.mark.xfail(strict=True, raises=Stuck, reason=phase.xfail[mode]))
    kind, n = data or phase.data[mode]
    ref = reference(cluster, fault_data, kind, n)
    cluster.restore()
    with kill_on(cluster.client, tmp_path / "flags", phase.prefix, phase.skip) as flags:
        phase.runner(kind)(cluster, fault_data, kind, n, ref, tmp_path)
    assert_one_kill(flags, phase.prefix)


def test_every_case_covers_each_data_kind_and_chunk_count():
    cases = {case for p in PHASES for case in p.data.values()}
    assert {kind for kind, _ in cases} == {"npy", "zarr", "mem"}
    assert {n for _, n in cases} == {3, 7, 9, 10}
    assert all(p.runner(kind) is not None for p in PHASES for kind, _ in p.data.values())


def test_the_full_matrix_is_every_phase_data_kind_and_chunk_count():
    """All of them but the command's labels of in-memory data (labels-write-api's cases)."""
    full = {(p.name, *data) for p, data in cases(full=True)}
    every = {(p.name, kind, n) for p in PHASES for kind in KINDS for n in CHUNKS}
    assert every - full == {("labels-write-cli", "mem", n) for n in CHUNKS}
    assert len(full) == len(cases(full=True)) == 9 * 3 * 4 - 4


def test_engine_tasks_cap_blas_to_the_worker_threads(cluster, fault_data):
    """Inside the loop's tasks of a fit, BLAS runs on as many threads as the worker has
    (1): a worker without a nanny has no OMP_NUM_THREADS=1 and the like, and BLAS would run
    on every core from each worker (the check that this cluster is such a case: a plain
    task's BLAS threads)."""
    cluster.restore()
    c = cluster.client
    c.run(faultkit.probe_segments)
    try:
        km = run_guarded(c, lambda: daskmeans.KMeans(K, random_state=SEED, client=c).fit(fault_data.api("mem", 7)))
    finally:
        seen = c.run(faultkit.probed)
    assert km.n_iter_ >= 4
    assert all(seen.values()) and len(seen) == 3, seen
    assert {tuple(s) for ss in seen.values() for s in ss} == {(1,)}, seen
    plain = set(map(tuple, c.run(faultkit.blas_threads).values()))
    cores = os.cpu_count() or 1
    assert plain == ({(1,)} if cluster.nanny else {(cores,)}), plain


EVERY_WORKER = [
    pytest.param("daskmeans-segment", id="iterations"),
    pytest.param("daskmeans-shard", id="placement"),
]


@pytest.mark.parametrize("prefix", EVERY_WORKER)
@pytest.mark.parametrize("cluster", ["no-nanny"], indirect=True)  # a nanny would restart them
def test_every_worker_killed_is_one_line(cluster, fault_data, tmp_path, prefix):
    """Each worker kills itself as its first task of ``prefix`` starts: one line, exit
    status 1, no output. (A fit may wait watch.NO_WORKER_SECONDS for a worker to come
    back: the guard gives it longer.)"""
    cluster.restore()
    model, labels = tmp_path / "model.zarr", tmp_path / "labels.zarr"
    with kill_on(cluster.client, tmp_path / "flags", prefix, every_worker=True) as flags:
        rc, _, err = daskmeans_cli(cluster, "fit", *fault_data.cli("npy", 9), "--k", str(K), "--seed", str(SEED),
                                   "-o", str(model), "--labels", str(labels), "-q", cwd=tmp_path, timeout=90,
                                   stuck_after=watch.NO_WORKER_SECONDS + 5)
    assert len(kills(flags)) == 3
    one_error_line(rc, err, "every worker")
    assert not model.exists() and not labels.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("cluster", ["no-nanny"], indirect=True)
def test_the_guard_sees_work_that_waits_for_a_lost_worker(cluster):
    """The harness itself: a result that waits on a task pinned to a killed worker is
    :class:`faultkit.Stuck` within seconds, not a wait for the test's time-out (the xfail
    marks above rely on it)."""
    import signal
    import time

    cluster.restore()
    c = cluster.client
    pids = cluster.worker_pids()
    victim = sorted(pids)[0]
    fut = c.submit(time.sleep, 600, workers=[victim], allow_other_workers=False, pure=False)
    os.kill(pids[victim], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(Stuck, match="pinned to lost workers"):
        run_guarded(c, fut.result, timeout=60)
    assert time.monotonic() - t0 < 20
