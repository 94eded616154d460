"""Faults against real ``dask scheduler`` / ``dask worker`` processes.

:class:`DaskProcesses` starts a scheduler (127.0.0.1, a free port, no dashboard, a scheduler
file) and worker processes, each in a process group of its own, and kills the groups at the
end. :class:`KillOnTask` is a worker plugin that SIGKILLs its own worker process when a task
whose key starts with a prefix starts executing: once across all workers (or once on every
worker), claimed through files created with ``O_CREAT | O_EXCL``.

Workers import this module by name (``faultkit``): their ``PYTHONPATH`` holds this directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from distributed import Client, WorkerPlugin

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BIN = Path(sys.executable).parent

# What a user's shell gives a worker started by hand: none of the thread caps a nanny sets.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS")


def environment(**extra: str) -> dict:
    """The environment of the scheduler, worker and command processes."""
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARS and not k.startswith("DASK_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def _die_with_parent() -> None:
    """In a child before it runs: SIGKILL when the test process ends, even killed (Linux), so
    that no scheduler or worker outlives an interrupted test run."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _claim(path: Path, note: str = "") -> bool:
    """Create ``path``; False when it exists (whoever created it first won)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, note.encode())
    finally:
        os.close(fd)
    return True


class KillOnTask(WorkerPlugin):
    """SIGKILL this worker's process when a task whose key (its name, for tuple keys) starts
    with ``prefix`` starts executing.

    ``skip``: let that many such task starts (on any worker) pass first. ``every_worker``:
    each worker kills itself at its own first such task after ``skip`` of its own (else:
    exactly one kill in all). The kill is recorded in ``flags/killed*`` (the key, the worker's
    address and its process id). ``pid``: kill that process group instead (the scheduler's),
    once."""

    def __init__(self, prefix: str, flags: str | Path, skip: int = 0, every_worker: bool = False,
                 pid: int | None = None):
        self.prefix, self.flags, self.skip, self.every_worker = prefix, str(flags), int(skip), every_worker
        self.pid = pid
        self.name = f"daskmeans-faults-kill-{prefix}"
        self.address = "?"

    def setup(self, worker: Any) -> None:
        self.address = worker.address

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish != "executing":
            return
        name = str(key[0] if isinstance(key, tuple) else key)
        if not name.startswith(self.prefix):
            return
        flags = Path(self.flags)
        note = f"{name} {self.address} {os.getpid()}"
        if self.every_worker:
            tag = "".join(c if c.isalnum() else "_" for c in self.address)
            for i in range(self.skip + 1):  # this worker's own task starts, counted
                if _claim(flags / f"seen-{tag}-{i}"):
                    break
            else:
                return
            if i != self.skip or not _claim(flags / f"killed-{tag}", note):
                return
        else:
            for i in range(self.skip + 1):  # the lowest free index is this task start's
                if _claim(flags / f"seen-{i}"):
                    break
            else:
                return
            if i != self.skip or not _claim(flags / "killed", note):
                return
        self.act()

    def act(self) -> None:
        """What the chosen task start does: the kill."""
        if self.pid is not None:
            os.killpg(self.pid, signal.SIGKILL)
            return
        os.kill(os.getpid(), signal.SIGKILL)


class ReplaceOnTask(KillOnTask):
    """:class:`KillOnTask`'s choice of a task start, whose act is to replace the file ``dst``
    by ``src`` (a rename: another valid chunk of a store) before the task runs, and then, with
    ``kill``, to SIGKILL the worker. ``holder_of``: only the task starts on the worker whose
    shard (a fit's rank) holds that global row count."""

    def __init__(self, prefix: str, flags: str | Path, src: str | Path, dst: str | Path, skip: int = 0,
                 kill: bool = False, holder_of: int | None = None):
        super().__init__(prefix, flags, skip)
        self.src, self.dst, self.kill, self.holder_of = str(src), str(dst), kill, holder_of
        self.name = f"daskmeans-faults-replace-{prefix}"
        self.worker: Any = None

    def setup(self, worker: Any) -> None:
        super().setup(worker)
        self.worker = worker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing" and self.holder_of is not None and not self._holds(self.holder_of):
            return
        super().transition(key, start, finish, **kwargs)

    def _holds(self, row: int) -> bool:
        """Whether a shard in this worker's memory holds global ``row``."""
        for value in list(self.worker.data.values()):
            offsets, rows = getattr(value, "offsets", None), getattr(value, "rows", None)
            if offsets is not None and any(o <= row < o + n for o, n in zip(offsets, rows)):
                return True
        return False

    def act(self) -> None:
        os.replace(self.src, self.dst)
        if self.kill:
            super().act()


class StopOnTask(KillOnTask):
    """:class:`KillOnTask`'s choice of a task start, whose act is SIGSTOP of the worker's own
    process: a worker hung for good (its process id is in the record, for the test to end
    it: :func:`end_stopped`)."""

    def __init__(self, prefix: str, flags: str | Path, skip: int = 0):
        super().__init__(prefix, flags, skip)
        self.name = f"daskmeans-faults-stop-{prefix}"

    def act(self) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)


def stopped_pids(flags: Path) -> list[int]:
    """The process ids :class:`StopOnTask` stopped (the last field of each record)."""
    return [int(line.split()[-1]) for line in kills(flags)]


def end_stopped(flags: Path) -> None:
    """SIGKILL (which a stopped process takes at once) every process :class:`StopOnTask`
    stopped: none outlives the test."""
    for pid in stopped_pids(flags):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kills(flags: Path) -> list[str]:
    """What :class:`KillOnTask` recorded: one ``key address pid`` line per kill."""
    return [p.read_text() for p in sorted(flags.glob("killed*"))]


class DaskProcesses:
    """A ``dask scheduler`` and ``n`` ``dask worker`` processes (``--nthreads 1``), with or
    without a nanny, started in ``root``; ``client`` is connected to them."""

    def __init__(self, root: Path, n: int = 3, nanny: bool = True, nthreads: int = 1):
        self.root, self.n, self.nanny, self.nthreads = Path(root), n, nanny, nthreads
        self.root.mkdir(parents=True, exist_ok=True)
        self.scheduler_file = self.root / "scheduler.json"
        self.procs: list[subprocess.Popen] = []
        self.scheduler: subprocess.Popen | None = None
        self.client: Client | None = None
        self.env = environment(DASK_DISTRIBUTED__LOGGING__DISTRIBUTED="error")
        self._logs = 0

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        self._logs += 1
        out = open(self.root / f"{self._logs:02d}-{log}.log", "w")
        p = subprocess.Popen(argv, cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, preexec_fn=_die_with_parent)
        out.close()
        self.procs.append(p)
        return p

    def start(self) -> "DaskProcesses":
        try:
            self.scheduler = self._spawn(
                ["dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                 "--scheduler-file", str(self.scheduler_file)], "scheduler")
            deadline = time.monotonic() + 60
            while not self._address():
                if self.scheduler.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the scheduler did not start:\n{self.logs()}")
                time.sleep(0.05)  # polling the scheduler file, with a deadline
            self.client = Client(self.address, timeout="30s", set_as_default=False)
            self.add_workers(self.n)
        except BaseException:
            self.stop()
            raise
        return self

    def _address(self) -> str | None:
        try:
            return json.loads(self.scheduler_file.read_text())["address"]
        except (OSError, ValueError, KeyError):
            return None

    @property
    def address(self) -> str:
        return self._address()

    def add_workers(self, count: int) -> None:
        """Start ``count`` more workers and wait until the cluster has ``n``."""
        for _ in range(count):
            self._spawn(["dask", "worker", "--scheduler-file", str(self.scheduler_file), "--host", "127.0.0.1",
                         "--nthreads", str(self.nthreads), "--nanny" if self.nanny else "--no-nanny",
                         "--no-dashboard", "--local-directory", str(self.root / "workers"), "--memory-limit", "2GiB",
                         "--death-timeout", "60"], "worker")
        self.wait_for_workers()

    def wait_for_workers(self, timeout: float = 90) -> None:
        try:
            self.client.wait_for_workers(self.n, timeout=timeout)
        except TimeoutError:
            raise RuntimeError(f"{self.n} workers did not come up in {timeout} s:\n{self.logs()}") from None

    def restore(self) -> None:
        """Back to ``n`` workers: a nanny restarts its killed worker by itself; without one,
        new worker processes replace the killed ones. The data earlier fits kept on the
        workers for re-fits is released first: the scheduler would compute a killed worker's
        share again on the new workers, and a test's kill-on-task would meet those tasks."""
        import daskmeans

        daskmeans.release(self.client)
        if not self.nanny:
            # A killed worker may still be listed until the scheduler notices its connection
            # closed: wait until it lists the live worker processes only, then replace the rest.
            workers = [p for p in self.procs if p is not self.scheduler]
            deadline = time.monotonic() + 30
            while len(self.client.nthreads()) > sum(p.poll() is None for p in workers):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the scheduler still lists killed workers:\n{self.logs()}")
                time.sleep(0.05)  # polling the scheduler's worker list, with a deadline
            self.add_workers(max(0, self.n - len(self.client.nthreads())))
        self.wait_for_workers()

    def worker_pids(self) -> dict[str, int]:
        return self.client.run(os.getpid)

    def kill_scheduler(self) -> None:
        os.killpg(self.scheduler.pid, signal.SIGKILL)

    def logs(self) -> str:
        return "".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                # A client that lost its scheduler stops trying to reconnect.
                self.client.close(timeout=5 if self.client.status == "running" else 1)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)


@contextlib.contextmanager
def kill_on(client: Client, flags: Path, prefix: str, skip: int = 0, every_worker: bool = False,
            pid: int | None = None, plugin: KillOnTask | None = None):
    """:class:`KillOnTask` (or ``plugin``, one of its kind) registered on every worker (and
    on those that join) for the block."""
    flags.mkdir(parents=True, exist_ok=True)
    plugin = plugin if plugin is not None else KillOnTask(prefix, flags, skip, every_worker, pid)
    client.register_plugin(plugin)
    try:
        yield flags
    finally:
        if client.status == "running":  # else it would wait for the lost scheduler
            with contextlib.suppress(Exception):
                client.unregister_worker_plugin(plugin.name)


def stuck_tasks(client: Client, after: float = 0.0, since: float = 0.0) -> dict:
    """Tasks that can never run, ``{key: text}``: waiting (``no-worker``) for more than
    ``after`` seconds, since ``since`` (``time.monotonic()``, the same clock in every process
    of the host) or later, for workers that are all gone, without leave to run elsewhere (a
    pinned task whose worker was lost: a restarted worker comes back at a new address)."""

    def look(after: float, since: float, dask_scheduler: Any = None) -> dict:
        now = time.monotonic()
        out = {}
        for ts, t in list(dask_scheduler.unrunnable.items()):
            if t < since or now - t < after or ts.loose_restrictions or not ts.worker_restrictions:
                continue
            if not set(ts.worker_restrictions) & set(dask_scheduler.workers):
                out[ts.key] = f"{ts.key} (pinned to {sorted(ts.worker_restrictions)})"
        return out

    return client.run_on_scheduler(look, after, since)


class Stuck(AssertionError):
    """The work hangs on tasks pinned to a lost worker (the known bug the xfail marks name)."""


class _Guard:
    """Tells when work on ``client``'s cluster can no longer progress: tasks pinned to lost
    workers, or no worker at all, for ``after`` seconds (a killed worker without a nanny never
    comes back; a nanny restarts one in a few seconds)."""

    def __init__(self, client: Client | None, after: float):
        self.client, self.after = client, after
        self.since = time.monotonic()
        self.empty_since: float | None = None

    def check(self) -> str | None:
        if self.client is None:
            return None
        try:
            stuck = stuck_tasks(self.client, self.after, self.since)
            empty = not self.client.nthreads()
        except Exception:  # the scheduler is gone: the work fails by itself
            return None
        if stuck:
            return f"hangs on {len(stuck)} task(s) pinned to lost workers, e.g. {next(iter(stuck.values()))}"
        now = time.monotonic()
        self.empty_since = (self.empty_since or now) if empty else None
        if self.empty_since is not None and now - self.empty_since >= self.after:
            return f"still runs {now - self.empty_since:.0f} s after the cluster's last worker left"
        return None


def wait_process(p: subprocess.Popen, timeout: float, client: Client | None = None,
                 stuck_after: float = 3.0) -> tuple[int, str, str]:
    """Wait for ``p`` (stdout and stderr to pipes): ``(rc, out, err)``. :class:`Stuck` (after
    killing it) as soon as the work on ``client``'s cluster cannot progress (:class:`_Guard`),
    a TimeoutError after ``timeout``."""
    guard = _Guard(client, stuck_after)
    deadline = time.monotonic() + timeout
    while True:
        try:
            out, err = p.communicate(timeout=0.5)
            return p.returncode, out, err
        except subprocess.TimeoutExpired:
            pass
        stuck = guard.check()
        if stuck or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            if stuck:
                raise Stuck(f"{stuck}\n{err[-3000:]}")
            raise TimeoutError(f"{p.args} still ran after {timeout} s\n{err[-3000:]}")


def run_guarded(client: Client, fn: Callable[[], Any], timeout: float = 60, stuck_after: float = 3.0) -> Any:
    """``fn()`` in a thread, with :func:`wait_process`'s guards (a stuck thread is left
    behind, its pinned tasks cancelled)."""
    import threading

    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller
            box["error"] = e

    guard = _Guard(client, stuck_after)
    t = threading.Thread(target=target, daemon=True)
    t.start()
    deadline = time.monotonic() + timeout
    while True:
        t.join(0.5)
        if not t.is_alive():
            if "error" in box:
                raise box["error"]
            return box.get("value")
        stuck = guard.check()
        if stuck:
            # Cancelled, so that the thread ends and no later test sees them.
            from distributed import Future

            with contextlib.suppress(Exception):
                keys = stuck_tasks(client, 0.0, guard.since)
                client.cancel([Future(k, client) for k in keys], force=True)
            t.join(10)
            raise Stuck(stuck)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{fn} still ran after {timeout} s")


# ---------------------------------------------------------------- the data and the command

N_ROWS, N_FEATURES, K = 12_000, 5, 10

# Row chunks per data kind and chunk count. Each chunking shares out evenly over 3 workers
# (within the 2% that keeps the fit from cutting it again) and, but for 7 chunks of a file,
# not over 2, so a fit that loses a worker places the same chunks unevenly on the survivors.
# .npy and Zarr (stored in such chunks) are read in chunks of EQUAL's rows, the last chunk
# holding the rest: 7 and 10 of them share out evenly over 3 only with a short last chunk
# (6 x 1990 + 60, 9 x 1325 + 75), and 7 such chunks then share out evenly over 2 as well.
EQUAL = {3: 4000, 7: 1990, 9: 1334, 10: 1325}
UNEQUAL = {  # in memory
    7: (3600, 3600, 3600, 400, 400, 200, 200),
    10: (3600, 3600, 3600, 200, 200, 200, 200, 200, 100, 100),
}
KINDS, CHUNKS = ("npy", "zarr", "mem"), (3, 7, 9, 10)  # every data kind and chunk count


@dataclass
class Data:
    x: Any  # (N_ROWS, N_FEATURES) float32
    dir: Path

    def npy(self) -> Path:
        return self.dir / "x.npy"

    def zarr(self, n_chunks: int) -> Path:
        return self.dir / f"x{n_chunks}.zarr"

    def api(self, kind: str, n_chunks: int):
        """What the API fits: a path read by daskmeans, or a Dask array in memory."""
        import dask.array as da

        import daskmeans

        if kind in ("npy", "zarr"):
            path = self.npy() if kind == "npy" else self.zarr(n_chunks)
            return daskmeans.read(str(path), chunk_bytes=EQUAL[n_chunks] * N_FEATURES * 4)
        chunks = UNEQUAL.get(n_chunks) or EQUAL[n_chunks]
        return da.from_array(self.x, chunks=(chunks, N_FEATURES))

    def cli(self, kind: str, n_chunks: int) -> list[str]:
        """The command's data arguments."""
        if kind in ("npy", "zarr"):
            path = self.npy() if kind == "npy" else self.zarr(n_chunks)
            return [str(path), "--chunk-bytes", str(EQUAL[n_chunks] * N_FEATURES * 4)]
        raise ValueError(f"the command reads files, not {kind}")

    @classmethod
    def make(cls, d: Path) -> "Data":
        """The blobs (N_ROWS x N_FEATURES float32, K centres, seed 3) written to ``d`` as .npy
        and as Zarr stored in EQUAL's chunks."""
        import numpy as np
        import zarr

        rng = np.random.default_rng(3)
        centers = rng.normal(scale=4, size=(K, N_FEATURES))
        x = (centers[rng.integers(0, K, N_ROWS)] + rng.normal(scale=1.5, size=(N_ROWS, N_FEATURES))).astype(np.float32)
        data = cls(x, d)
        np.save(data.npy(), x)
        for n in EQUAL:
            zarr.create_array(str(data.zarr(n)), data=x, chunks=(EQUAL[n], N_FEATURES))
        return data


def daskmeans_cli(cluster: DaskProcesses, *argv: str, cwd: Path, timeout: float = 120,
                  guard: bool = True, stuck_after: float = 3.0, env: dict | None = None) -> tuple[int, str, str]:
    """``python -m daskmeans ARGV --scheduler-file ...`` (segments of 0.02 s, so that a fit
    has several; ``env``: more variables): ``(rc, stdout, stderr)``. ``guard``:
    :class:`Stuck` as soon as the scheduler holds tasks pinned to lost workers (the command
    would hang)."""
    env = environment(**{"DASK_DASKMEANS__SEGMENT_SECONDS": "0.02", **(env or {})})
    p = subprocess.Popen([sys.executable, "-m", "daskmeans", *argv, "--scheduler-file", str(cluster.scheduler_file)],
                         cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    return wait_process(p, timeout, cluster.client if guard else None, stuck_after)


def command_while_killing(cluster: DaskProcesses, argv: list[str], flags: Path, prefix: str, *, cwd: Path,
                          after_kill: float, skip: int = 0, pid: int | None = None) -> tuple[int, str]:
    """``python -m daskmeans ARGV --scheduler-file ...`` (a segment per iteration, so that the
    kill at a segment task start comes however fast the iterations run) while
    :class:`KillOnTask` of ``prefix`` (``pid``: the process group it kills) is registered:
    ``(rc, stderr)`` once the command ends, which it must within ``after_kill`` seconds of the
    kill (:class:`subprocess.TimeoutExpired` otherwise; the command is killed then)."""
    argv = [sys.executable, "-m", "daskmeans", *argv, "--scheduler-file", str(cluster.scheduler_file)]
    with kill_on(cluster.client, flags, prefix, skip=skip, pid=pid):
        p = subprocess.Popen(argv, cwd=cwd, env=environment(DASK_DASKMEANS__SEGMENT_SECONDS="0"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while not (flags / "killed").exists() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)  # polling for the kill, with a deadline
            if not kills(flags):
                _, err = p.communicate(timeout=60)
                raise AssertionError(f"no kill on {prefix}: the command ended first (rc {p.returncode}):\n{err}")
            _, err = p.communicate(timeout=after_kill)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return p.returncode, err


def one_error_line(rc: int, err: str, *needles: str) -> str:
    """The command's one ``daskmeans: error: ...`` line (its last; exit status 1, no
    traceback), holding each of ``needles``."""
    assert rc == 1, err
    errors = [line for line in err.splitlines() if line.startswith("daskmeans: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == errors[0], err
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def leftovers(d: Path) -> list[str]:
    """Temporary outputs left in ``d`` (``.NAME.tmp-*``)."""
    return sorted(n for n in os.listdir(d) if ".tmp-" in n)


# ---------------------------------------------------------------- probes inside the workers' tasks

_PROBE: dict = {}


def blas_threads() -> list[int]:
    """The calling process's BLAS thread limits (threadpoolctl)."""
    from threadpoolctl import threadpool_info

    return sorted({int(i["num_threads"]) for i in threadpool_info() if i.get("user_api") == "blas"})


def probe_segments(dask_worker: Any = None) -> None:
    """On a worker (``client.run``): record :func:`blas_threads` inside every task of the
    loop (``daskmeans.engine.loop.run_segment``, looked up by name when a task arrives)."""
    from daskmeans.engine import loop

    if "run_segment" in _PROBE:
        return
    inner = _PROBE["run_segment"] = loop.run_segment
    _PROBE["seen"] = []

    def run_segment(*args: Any, **kwargs: Any) -> Any:
        _PROBE["seen"].append(blas_threads())
        return inner(*args, **kwargs)

    loop.run_segment = run_segment


def probed(dask_worker: Any = None) -> list:
    """What :func:`probe_segments` recorded on this worker (and the probe removed)."""
    from daskmeans.engine import loop

    if "run_segment" in _PROBE:
        loop.run_segment = _PROBE.pop("run_segment")
    return _PROBE.pop("seen", [])


def tree(path: str | Path) -> dict:
    """Every file under ``path`` (or the file itself, as ``""``) with its bytes: an output
    must stay as it was."""
    path = str(path)
    if os.path.isfile(path):
        return {"": Path(path).read_bytes()}
    return {os.path.relpath(os.path.join(r, f), path): Path(r, f).read_bytes() for r, _, fs in os.walk(path) for f in fs}
