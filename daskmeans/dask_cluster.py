"""Connect to a scheduler, or start a local cluster.

A local cluster is one worker per GPU where a GPU is visible, else one single-threaded NumPy
worker per core (so BLAS and the engine do not oversubscribe the cores). Its workers run in
this process (``daskmeans.local-cluster: threads``) or each in its own process (dask-cuda's
``LocalCUDACluster`` for GPUs, a ``LocalCluster`` of processes for CPUs). In-process workers
cost no process start, no imports in the workers and no transfer of the data between
processes (a large share of a short command, more for a GPU worker, which would import CuPy and
create its CUDA context again: docs/performance.md, "In-process local cluster"): ``auto`` uses
them for up to ``local-threads-max-workers`` workers, CPU workers or GPUs (a worker per GPU
that runs its tasks on its own: :mod:`daskmeans.engine.devices`), beyond which the workers'
Python work (one call per distance tile) would contend for the interpreter lock.

The API (:func:`api_client`, :func:`using_client`) starts the same local cluster when it is
given no client and finds no default one, once per process, and closes it at exit."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import threading
from typing import Any, Iterator

from distributed import Client, LocalCluster

from . import config
from .config import scheduler_address
from .backends import get_backend, gpu_available, gpu_count, on_gpu, requested_backend
from .errors import DaskmeansError


class SchedulerLost(DaskmeansError):
    """The client lost its connection to the scheduler: the fit's tasks and the data placed
    on the cluster went with it (Dask cancels every future), so the fit cannot go on."""


def check_scheduler(client: Client) -> None:
    """Raise :class:`SchedulerLost` unless ``client`` is connected to its scheduler.

    Dask cancels every future the moment the connection drops, then tries to reconnect for
    the client's timeout (30 s from the command) before it closes the client; a call to the
    scheduler meanwhile waits up to its connect timeout (30 s). The work is gone either way:
    whoever waits on it stops at once, naming the scheduler."""
    status = getattr(client, "status", "running")
    if status == "running":
        return
    try:
        address = client.scheduler.address
    except Exception:  # no scheduler rpc (a client closed before it connected)
        address = None
    where = f"scheduler {address}" if address else "scheduler"
    raise SchedulerLost(
        f"lost the connection to the {where} (client {status}): it stopped or cannot be reached, and the "
        f"work on the cluster went with it; run the command again once the scheduler runs"
    )


def close_client(client: Client) -> None:
    """Close ``client``; one that lost its scheduler without Dask's log of the reconnection it
    cancels (an error with a traceback, where the command reports the loss in one line)."""
    if client.status in ("running", "newly-created"):
        client.close()
        return
    log = logging.getLogger("distributed.client")
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    try:
        with contextlib.suppress(Exception):
            client.close(timeout=5)
    finally:
        log.setLevel(level)


# The function every worker runs first (:func:`run_checked`). It is made from source in a
# namespace that is no importable module, so that Dask sends it by value (cloudpickle): a
# function of daskmeans' own modules is sent by reference, and a worker that cannot import
# daskmeans fails to unpickle it with a traceback that names neither the worker nor the cause.
_PROBE_SOURCE = """
def daskmeans_probe(expected, call, args):
    try:
        import daskmeans
        version = daskmeans.__version__
    except Exception as e:
        return {"error": "cannot import daskmeans: " + type(e).__name__ + ": " + " ".join(str(e).split())}
    if version != expected or call is None:
        return {"version": version}
    import importlib
    module, name = call
    return {"version": version, "result": getattr(importlib.import_module(module), name)(*args)}
"""
_PROBE_NAMESPACE: dict = {"__name__": "daskmeans_worker_probe"}  # no module of that name exists
exec(compile(_PROBE_SOURCE, "<daskmeans worker probe>", "exec"), _PROBE_NAMESPACE)
_probe = _PROBE_NAMESPACE["daskmeans_probe"]


def run_checked(client: Client, call: tuple[str, str] | None = None, *args: Any) -> dict[str, Any]:
    """Check that every worker of ``client`` imports the client's daskmeans, and run
    ``module.name(*args)`` (``call``) on each, in one round trip: ``{worker: result}``.

    Parameters
    ----------
    client : distributed.Client
    call : (str, str), optional
        The module and function to run on each worker once the check passes (None: the
        check only).
    *args
        Its arguments (plain values: they travel before the worker has imported daskmeans).

    Raises
    ------
    DaskmeansError
        One line naming each worker that cannot import daskmeans (``worker tcp://...
        cannot import daskmeans: ModuleNotFoundError: ...``) or has another version (``worker
        tcp://... has daskmeans 0.3.0, the client 0.4.0``), before any work is sent.
    """
    from .version import __version__

    res = client.run(_probe, __version__, call, list(args))
    problems = []
    for worker, r in sorted(res.items()):
        if "error" in r:
            problems.append(f"worker {worker} {r['error']}")
        elif r["version"] != __version__:
            problems.append(f"worker {worker} has daskmeans {r['version']}, the client {__version__}")
    if problems:
        shown = problems[:3] + ([f"{len(problems) - 3} more"] if len(problems) > 3 else [])
        raise DaskmeansError(f"{'; '.join(shown)}: every worker needs the client's daskmeans ({__version__}) "
                             f"importable")
    return {worker: r.get("result") for worker, r in res.items()}


def check_workers(client: Client) -> None:
    """Raise unless every worker of ``client`` imports the client's daskmeans (see
    :func:`run_checked`)."""
    run_checked(client)


def worker_devices(client: Client) -> dict[str, str | None]:
    """Each worker of ``client``: the device backend it can run (the registry's first usable
    there, :func:`daskmeans.backends.device_backend_here`: CuPy seeing a CUDA device), or
    None, asked in the round trip that checks their daskmeans (:func:`run_checked`)."""
    return run_checked(client, ("daskmeans.backends", "device_backend_here"))


def worker_kinds(client: Client) -> tuple[list[str], list[str]]:
    """The addresses of ``client``'s workers with a usable device backend (GPU workers), and
    the others (see :func:`worker_devices`)."""
    res = worker_devices(client)
    return sorted(w for w, b in res.items() if b), sorted(w for w, b in res.items() if not b)


def resolve_backend(client: Client, requested: str = "auto", data_backend: str | None = None) -> str:
    """``"numpy"`` or ``"cupy"`` for ``requested`` in auto/cpu/gpu/numpy/cupy.

    ``auto`` follows the data when its blocks are already CuPy, else uses the GPUs when every
    worker has one; a cluster of GPU and CPU workers is refused (the loop runs on every worker
    with one backend): the user says which.
    """
    try:
        name = requested_backend(requested, data_backend)
    except ValueError as e:
        raise DaskmeansError(str(e)) from None
    if name is not None and get_backend(name).on_host:  # a host backend runs on any worker
        check_workers(client)  # that can import daskmeans: said in one line before any work
        return name
    devices = worker_devices(client)
    gpus = sorted(w for w, b in devices.items() if b)
    cpus = sorted(w for w, b in devices.items() if not b)
    if name is None:
        if gpus and cpus:
            raise DaskmeansError(
                f"the cluster mixes {len(gpus)} GPU worker(s) and {len(cpus)} CPU worker(s) (e.g. {cpus[0]}): "
                f"choose backend='cpu' (--backend cpu) to use every worker with NumPy, or start the cluster "
                f"with GPU workers only"
            )
        # Every worker's device backend (the registry's first usable there), else the host's.
        found = devices[gpus[0]] if gpus else None
        return found if isinstance(found, str) else requested_backend("gpu" if gpus else "cpu")
    if cpus:
        raise DaskmeansError(
            f"backend='gpu' but {len(cpus)} of the cluster's {len(gpus) + len(cpus)} workers have no usable GPU "
            f"(CuPy + CUDA device), e.g. {cpus[0]}"
        )
    return name


def _path_problems(read: list[str], write: list[str]) -> list[str]:
    """On a worker: what it cannot do with the given absolute paths."""
    out = [f"read {p} (no such file or directory here)" for p in read if not os.path.exists(p)]
    out += [f"read {p} (permission denied)" for p in read if os.path.exists(p) and not os.access(p, os.R_OK)]
    for p in write:
        parent = os.path.dirname(p.rstrip(os.sep))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            out.append(f"write into {parent} (missing or not writable here)")
    return out


def check_paths_on_workers(client: Client, read: list[str] = (), write: list[str] = ()) -> None:
    """Raise unless every worker can read ``read`` and write beside ``write`` (absolute paths).

    Workers read the data and write labels themselves: on an external cluster they may not
    see the client's filesystem, and a store they cannot see must never be read as empty.
    The same round trip checks their daskmeans (:func:`run_checked`).
    """
    read = [os.path.abspath(p) for p in read]
    write = [os.path.abspath(p) for p in write]
    if not read and not write:
        return
    res = run_checked(client, ("daskmeans.dask_cluster", "_path_problems"), read, write)
    for worker, problems in sorted(res.items()):
        if problems:
            raise DaskmeansError(
                f"worker {worker} cannot {problems[0]}: every worker needs the same paths as the "
                f"client (a shared filesystem)"
            )


def local_uses_gpu(backend: str) -> bool:
    """Whether a local cluster started for ``backend`` ("auto", "cpu", "gpu") is GPU workers."""
    name = requested_backend(backend)
    return gpu_available() if name is None else on_gpu(name)


def security(ca_file: str | None = None, cert: str | None = None, key: str | None = None):
    """``distributed.Security`` for a TLS client: from the three files (the dask CLI's
    ``--tls-ca-file``, ``--tls-cert``, ``--tls-key``), else from the ``distributed.comm.tls``
    configuration (``None`` when neither gives a certificate)."""
    from distributed.security import Security

    given = {"--tls-ca-file": ca_file, "--tls-cert": cert, "--tls-key": key}
    if any(given.values()):
        missing = [flag for flag, v in given.items() if not v]
        if missing:
            raise DaskmeansError(f"TLS needs --tls-ca-file, --tls-cert and --tls-key together; missing {', '.join(missing)}")
        for flag, v in given.items():
            if not os.path.isfile(v):
                raise DaskmeansError(f"{flag} {v}: no such file")
        return Security(tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key, require_encryption=True)
    sec = Security()  # reads distributed.comm.tls.*
    return sec if sec.tls_client_cert or sec.tls_ca_file else None


@contextlib.contextmanager
def connect(
    scheduler: str | None = None,
    backend: str = "auto",
    n_workers: int | None = None,
    *,
    scheduler_file: str | None = None,
    tls: tuple[str | None, str | None, str | None] = (None, None, None),
    dashboard: bool = False,
    blas_threads: int | None = 1,
) -> Iterator[Client]:
    """A client on an existing scheduler, or on a local cluster started (and closed) here.

    Parameters
    ----------
    scheduler : str, optional
        Address (``tcp://host:8786``, ``tls://host:8786``) or a scheduler JSON file.
    backend : "auto", "cpu" or "gpu"
        For a local cluster: ``auto`` starts GPU workers when a GPU is visible.
    n_workers : int, optional
        Local CPU cluster size (default: one per core).
    scheduler_file : str, optional
        The JSON file a scheduler wrote (``dask scheduler --scheduler-file``).
    tls : (ca_file, cert, key), optional
        TLS certificates of the client; default: the ``distributed.comm.tls`` configuration.
    dashboard : bool, default False
        Serve Dask's dashboard for a local cluster (importing bokeh for it costs more than a
        small fit: docs/performance.md, "Startup").
    blas_threads : int or None, default 1
        BLAS threads of this process while a local CPU cluster of in-process workers runs
        (None: left as they are; engine tasks cap BLAS themselves).

    Without ``scheduler`` or ``scheduler_file``, Dask's ``scheduler-address`` setting
    (``DASK_SCHEDULER_ADDRESS``) is used when set, else a local cluster is started.
    """
    address, source = scheduler_address(scheduler, scheduler_file)
    if address:
        sec = security(*tls)
        if address.startswith("tls://") and (sec is None or not sec.tls_client_cert):
            raise DaskmeansError(
                f"scheduler {address} (from {source}) uses TLS: give the client's certificates with --tls-ca-file, "
                f"--tls-cert and --tls-key (or distributed.comm.tls.ca-file, .client.cert and .client.key)"
            )
        if sec is not None and not address.startswith("tls://") and "://" in address:
            raise DaskmeansError(f"TLS certificates were given but scheduler {address} is not a tls:// address")
        try:
            client = Client(address, timeout="30s", security=sec)
        except (OSError, TimeoutError, ValueError) as e:
            msg = " ".join(str(e).split()) or type(e).__name__
            raise DaskmeansError(f"cannot connect to scheduler {address} (from {source}): {msg}") from None
        try:
            yield client
        except SchedulerLost:
            raise
        except Exception:
            # Whatever a lost scheduler made fail (a write's cancelled futures, a closed
            # comm) is that loss, told in one line.
            try:
                check_scheduler(client)
            except SchedulerLost as lost:
                raise lost from None
            raise
        finally:
            close_client(client)
        return
    if starts_in_process(backend, n_workers):
        gpu = local_uses_gpu(backend)
        if gpu and not gpu_available():
            raise DaskmeansError("backend='gpu' but no CUDA device is visible to CuPy")
        n = gpu_count() if gpu else n_workers or os.cpu_count() or 1
        with _local(n, None if gpu else blas_threads, dashboard, devices=gpu and n > 1) as client:
            yield client
        return
    with on_local_processes(local_processes(backend, n_workers, dashboard)) as client:
        yield client


def local_processes(backend: str = "auto", n_workers: int | None = None, dashboard: bool = False) -> Any:
    """A local cluster of worker processes for ``backend`` (not in-process: see
    :func:`starts_in_process`): dask-cuda's ``LocalCUDACluster``, a worker per GPU, for GPU
    workers, else ``n_workers`` (default one per core) single-threaded NumPy workers."""
    # Worker logs stay quiet: errors reach the client as exceptions (one line from the CLI),
    # and an interrupted fit's aborted tasks are expected, not news.
    if local_uses_gpu(backend):
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise DaskmeansError(
                "a GPU cluster needs dask-cuda: pip install 'daskmeans[cuda13]' (or [cuda12])"
            ) from None
        # The preload imports what the fit's tasks run while the workers wait for their first
        # one (daskmeans.preload).
        return LocalCUDACluster(**_dashboard(dashboard), silence_logs=logging.CRITICAL, preload=[PRELOAD])
    n = n_workers or os.cpu_count() or 1
    return LocalCluster(n_workers=n, threads_per_worker=1, **_dashboard(dashboard), silence_logs=logging.CRITICAL)


@contextlib.contextmanager
def on_local_processes(cluster: Any) -> Iterator[Client]:
    """A client on ``cluster`` (of :func:`local_processes`), closed on leaving with the cluster, or
    the cluster left to this process's exit (:func:`end_with_process`)."""
    try:
        with Client(cluster) as client:
            yield client
    finally:
        if not _ENDS_WITH_PROCESS:
            close_local(cluster)


def end_with_process() -> None:
    """Let this process's exit end the local clusters of worker processes it starts, rather
    than their close: called by the command, which ends with ``os._exit`` once its outputs are
    written (:func:`daskmeans.cli.main.run`). Closing such a cluster waits for every worker to
    shut down, a large share of a short multi-GPU command (docs/performance.md, "Several
    GPUs"), when the work is done and saved. Each worker's nanny, and each worker, is a child
    process that exits at once when its parent does (``distributed.process.AsyncProcess``
    watches a pipe to its parent), so the processes end with the command all the same."""
    global _ENDS_WITH_PROCESS
    _ENDS_WITH_PROCESS = True
    # The workers' queues hold semaphores of this process, which multiprocessing's resource
    # tracker (a process of its own, started with the first worker) removes once this process
    # is gone, saying so on stderr after the command has ended. Removing them is its job; the
    # line is no news to the command's user.
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet not in os.environ.get("PYTHONWARNINGS", ""):
        os.environ["PYTHONWARNINGS"] = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w)


# Set by end_with_process: local clusters of worker processes are left to the process's exit.
_ENDS_WITH_PROCESS = False
# The preload of the local GPU worker processes.
PRELOAD = "daskmeans.preload"


def starts_in_process(backend: str = "auto", n_workers: int | None = None) -> bool:
    """Whether the local cluster :func:`connect` starts for ``backend`` and ``n_workers`` has
    its workers in this process (threads), rather than in worker processes. Without a usable
    GPU for ``backend='gpu'`` (which :func:`connect` refuses): True, nothing to start."""
    if local_uses_gpu(backend):
        return not gpu_available() or config.gpu_in_process(gpu_count())
    return config.local_in_process(n_workers or os.cpu_count() or 1)


class Starting:
    """:func:`connect`'s local cluster of worker processes, started on a thread of its own
    while the caller goes on: the command starts its workers (their processes, imports and
    device contexts, most of two seconds for GPU workers) while it imports and reads its data.

    A cluster of in-process workers is not started here but by :meth:`connected`, in the
    caller's thread: its start is the caller's own imports, which a thread would only contend
    for (docs/performance.md, "The command and the readers"). Neither is a cluster one
    connects to: ``connect``'s arguments name no scheduler.

    Parameters
    ----------
    **kwargs
        :func:`connect`'s arguments.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._cluster: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="daskmeans-cluster-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        backend, n_workers = self._kwargs.get("backend", "auto"), self._kwargs.get("n_workers")
        try:
            if not starts_in_process(backend, n_workers):
                self._cluster = local_processes(backend, n_workers, self._kwargs.get("dashboard", False))
        except BaseException as e:  # told to the caller by connected(), in its thread
            self._error = e

    @contextlib.contextmanager
    def connected(self) -> Iterator[Client]:
        """A client on the cluster once started (closed as :func:`connect`'s on leaving; the
        client is made here, in the caller's thread, as Dask keeps the current client per
        thread), or on a cluster of in-process workers started now; the start's error, if it
        failed."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._cluster is None:
            with connect(**self._kwargs) as client:
                yield client
            return
        with on_local_processes(self._cluster) as client:
            yield client


def close_local(cluster: Any) -> None:
    """Close a local cluster of worker processes this process started. A nanny kills its
    worker process when it has not stopped within the nanny's 5 s, then raises TimeoutError
    if the process is still there a second later: a GPU worker of the host tier frees tens of
    GB of pinned memory as it exits, which takes longer. The work is done and every worker has
    been killed by then, so that is no error of the command (raised, it would discard the
    outputs of a finished fit)."""
    try:
        cluster.close()
    except TimeoutError:
        pass


def _dashboard(on: bool) -> dict:
    """A local cluster's arguments for a dashboard on any free port, or for none (its
    scheduler then never imports bokeh)."""
    return {"dashboard_address": ":0"} if on else {"dashboard_address": ":0", "scheduler_kwargs": {"dashboard": False}}


@contextlib.contextmanager
def _local(n_workers: int, blas_threads: int | None, dashboard: bool, devices: bool = False) -> Iterator[Client]:
    """A client on ``n_workers`` single-threaded workers in this process; with ``devices``, one
    per device of the device backend here, each running its tasks on its own device
    (:func:`_device_cluster`).

    The workers' memory limit (the machine's memory shared out) sizes the tiers' budgets, but
    the memory manager takes no action: it measures the whole process, which holds every
    worker's data, and an in-process worker can be neither paused usefully nor restarted.
    ``blas_threads`` caps BLAS's own thread pools while the cluster runs (the nanny of a worker
    process sets ``OPENBLAS_NUM_THREADS=1`` and the like for the same reason: one computing
    thread per core).
    """
    import dask

    quiet = {f"distributed.worker.memory.{k}": False for k in ("target", "spill", "pause", "terminate")}
    with contextlib.ExitStack() as stack:
        if blas_threads is not None:
            from threadpoolctl import threadpool_limits

            stack.enter_context(threadpool_limits(limits=blas_threads, user_api="blas"))
        with dask.config.set(quiet):
            cluster = stack.enter_context(_device_cluster(n_workers, dashboard) if devices else LocalCluster(
                n_workers=n_workers, threads_per_worker=1, processes=False, **_dashboard(dashboard),
                silence_logs=logging.CRITICAL))
        client = stack.enter_context(Client(cluster))
        try:
            yield client
        except KeyboardInterrupt:
            _stop_now(cluster)
            raise


def _device_cluster(n_devices: int, dashboard: bool) -> Any:
    """A cluster of ``n_devices`` in-process workers, worker ``i`` running its tasks on device
    ``i`` of the device backend here (:func:`daskmeans.engine.devices.device_worker_specs`),
    over in-process comms, each with its share of the machine's memory: what ``LocalCluster``
    starts with ``processes=False``, but with an executor of its own per worker, which
    ``LocalCluster``'s one worker spec for all cannot give."""
    from distributed import Scheduler, SpecCluster
    from distributed.system import MEMORY_LIMIT

    from .backends import device_backend_here
    from .engine.devices import device_worker_specs

    scheduler = {"cls": Scheduler, "options": {"protocol": "inproc://", "dashboard": dashboard,
                                               "dashboard_address": ":0"}}
    options = {"protocol": "inproc://", "memory_limit": MEMORY_LIMIT // max(1, n_devices),
               "silence_logs": logging.CRITICAL}
    workers = device_worker_specs(device_backend_here(), list(range(n_devices)), options)
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.CRITICAL)


def _stop_now(cluster: LocalCluster) -> None:
    """Close ``cluster``'s in-process workers without waiting for the tasks they run: after
    Ctrl-C or SIGTERM a task in the middle of a long pass (a k-means|| round, a labels pass)
    would otherwise hold the command for as long as the pass takes. Its thread is left to the
    process's exit (the command ends with ``os._exit``)."""
    for worker in list(cluster.workers.values()):
        with contextlib.suppress(Exception):
            cluster.sync(worker.close, executor_wait=False, reason="interrupted", timeout=5)


def describe(client: Client) -> str:
    """One line: the scheduler, its workers, and whether they are GPU or CPU workers."""
    gpus, cpus = worker_kinds(client)
    kinds = ", ".join(p for p in (f"{len(gpus)} GPU" if gpus else "", f"{len(cpus)} CPU" if cpus else "") if p)
    return f"scheduler {client.scheduler.address}: {len(gpus) + len(cpus)} worker(s) ({kinds or 'none'})"


# ---------------------------------------------------------------- the API's client

# The local cluster the API started in this process, by kind (GPU workers or CPU workers):
# (pid, its closer, its client). The pid tells a forked child that the cluster is its parent's.
_API_CLUSTERS: dict[bool, tuple[int, contextlib.ExitStack, Client]] = {}
_API_LOCK = threading.Lock()
# The name of the semaphore that lets one fit at a time run from inside a cluster's tasks.
FIT_SEMAPHORE = "daskmeans-fit"


def api_client(client: Client | None = None, backend: str = "auto") -> Client:
    """The client an estimator given ``client`` works through.

    Parameters
    ----------
    client : distributed.Client, optional
        Used as given.
    backend : {"auto", "cpu", "gpu", "numpy", "cupy"}
        The kind of local cluster to start when one is needed (as the CLI's ``--backend``).

    Returns
    -------
    distributed.Client
        ``client``; else, inside a Dask task, the worker's client; else the default client;
        else the client of the local cluster the CLI would start (:func:`connect`), started on
        first use in this process and reused, made the default client (so a lazy result, such
        as ``labels_``, computes on it), and closed at exit. A local CPU cluster of that kind
        has at most ``daskmeans.local-threads-max-workers`` single-threaded workers.
    """
    if client is not None:
        return client
    from distributed import default_client, get_client

    if in_task():
        return get_client()
    try:
        return default_client()
    except ValueError:  # no default client: the API starts its own cluster
        return _local_api_client(backend)


@contextlib.contextmanager
def using_client(client: Client | None = None, backend: str = "auto", *, exclusive: bool = False) -> Iterator[Client]:
    """:func:`api_client` for the duration of the block, safe inside a Dask task.

    A task that waits on other tasks holds one of its worker's threads: on single-threaded
    workers the tasks it waits for might never run. Inside a task (``joblib``'s Dask backend
    running ``GridSearchCV``, or ``client.submit(km.fit, X)``) the block therefore runs in
    ``distributed.worker_client()``, which gives the thread back to the worker for its
    duration. With ``exclusive`` (a fit) it also holds the cluster's ``FIT_SEMAPHORE``: a fit
    runs one long task per worker at once, joined by collectives, and two fits from tasks whose
    per-worker tasks interleave on single-threaded workers would wait on each other forever;
    fits from tasks run one after another instead. A fit from outside any task does not take it.
    """
    if client is not None or not in_task():
        yield api_client(client, backend)
        return
    from distributed import Semaphore, worker_client

    with worker_client() as wc:
        if not exclusive:
            yield wc
            return
        with Semaphore(max_leases=1, name=FIT_SEMAPHORE):
            yield wc


def in_task() -> bool:
    """Whether this thread runs a task of a Dask worker."""
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def _local_api_client(backend: str) -> Client:
    gpu = local_uses_gpu(backend)
    with _API_LOCK:
        held = _API_CLUSTERS.get(gpu)
        if held is not None and held[0] == os.getpid() and held[2].status == "running":
            return held[2]
        if held is not None and held[0] == os.getpid():  # closed by the user: start afresh
            _close_quietly(held[1])
        stack = contextlib.ExitStack()
        n_workers = None if gpu else min(_core_share(), int(config.get("local-threads-max-workers")))
        # BLAS is left as it is: this process is the user's, and engine tasks cap BLAS themselves.
        client = stack.enter_context(connect(None, "gpu" if gpu else "cpu", n_workers, blas_threads=None))
        if not gpu and _in_joblib_process() and _first_of_its_pool():
            import warnings

            from .errors import DaskmeansWarning

            # One line (no source line: it would be joblib's), from one process of the pool.
            warnings.warn(
                f"each joblib worker process (n_jobs > 1) starts its own local cluster, here of {n_workers} "
                f"worker(s) (its share of the cores); for every fit on one cluster use n_jobs=1 with a "
                f"distributed.Client, or joblib.parallel_backend('dask')", DaskmeansWarning, stacklevel=1000)
        if not _API_CLUSTERS:
            atexit.register(close_api_clusters)
        _API_CLUSTERS[gpu] = (os.getpid(), stack, client)
        return client


def _core_share() -> int:
    """The cores this process's local CPU cluster may use: all of them, but in a worker process
    of joblib's process pool (``GridSearchCV(n_jobs=N)``, ``cross_val_score(n_jobs=N)``) the
    share joblib gives each of its N processes (the ``OMP_NUM_THREADS`` it sets for them:
    cores // N). Each such process starts a cluster of its own; with a worker per core in each,
    N processes ran N workers per core, and more jobs made the search slower, not faster
    (docs/performance.md, "Local clusters inside joblib's workers")."""
    cores = os.cpu_count() or 1
    if not _in_joblib_process():
        return cores
    try:
        share = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return cores
    return max(1, min(cores, share))


def _first_of_its_pool() -> bool:
    """Whether this joblib worker process is the first of its parent's to ask (a marker file
    per parent process in a per-user temporary directory): the pool's note is said once.

    A marker is named by the parent's process id *and* start time: process ids are reused, and a
    marker left by an earlier parent of the same id silenced the note of a later pool. Markers
    of parents no longer running are removed on the way."""
    import tempfile

    import psutil

    folder = os.path.join(tempfile.gettempdir(), f"daskmeans-{os.getuid()}")
    try:
        parent = _process_key(os.getppid())
        if parent is None:  # the parent already gone: nobody to tell
            return False
        os.makedirs(folder, mode=0o700, exist_ok=True)
        for name in os.listdir(folder):
            found = re.fullmatch(r"joblib-(\d+)(?:-\d+)?", name)
            if found is not None and _process_key(int(found[1])) != name:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(folder, name))
        os.close(os.open(os.path.join(folder, parent), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except (OSError, psutil.Error):  # no temporary directory to write: said by each process
        return True
    return True


def _process_key(pid: int) -> str | None:
    """``joblib-PID-START`` for a running process (START: its start time in milliseconds), or
    None when no process of that id runs."""
    import psutil

    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return f"joblib-{pid}-{round(started * 1000)}"


def _in_joblib_process() -> bool:
    """Whether this process is a worker of joblib's process pool (loky)."""
    import multiprocessing

    return type(multiprocessing.current_process()).__name__ == "LokyProcess"


def close_api_clusters() -> None:
    """Close the local clusters :func:`api_client` started in this process (also run at exit)."""
    with _API_LOCK:
        held = [v for v in _API_CLUSTERS.values() if v[0] == os.getpid()]
        _API_CLUSTERS.clear()
    for _, stack, _client in held:
        _close_quietly(stack)


def _close_quietly(stack: contextlib.ExitStack) -> None:
    log = logging.getLogger("distributed")
    level = log.level
    log.setLevel(logging.CRITICAL + 1)  # a cluster closed at exit has nothing left to tell
    try:
        with contextlib.suppress(Exception):
            stack.close()
    finally:
        log.setLevel(level)
