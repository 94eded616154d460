"""Several hosts simulated on one: a ``dask scheduler`` on 127.0.0.1 and sets of real ``dask
worker`` processes listening on 127.0.0.2, 127.0.0.3, ... (every 127/8 address reaches this
host's loopback device), plain TCP or TLS; CPU workers, or GPU workers one per GPU with NCCL
kept on sockets (:class:`GpuHosts`).

The workers are started as the recipes in ``deploy/`` start them: ``--host ADDR`` (what
``deploy/local/start.sh --host`` passes), or ``--listen-address`` with ``--contact-address``
(a worker behind an address of its own, as in a container). Each "host" is known to the
engine only by the host part of its workers' addresses, as a real one would be.

Built on :class:`faultkit.DaskProcesses` (process groups, logs, the client, ``stop``) and
:class:`faultkit.KillOnTask`. Workers import this module by name (``hostkit``): their
``PYTHONPATH`` holds this directory.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_FAULTS = str(HERE.parent / "faults")
if _FAULTS not in sys.path:
    sys.path.insert(0, _FAULTS)

import faultkit  # noqa: E402
from distributed import Client  # noqa: E402
from distributed.comm import get_address_host  # noqa: E402

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SCHEDULER_HOST = "127.0.0.1"
SEED = 0  # the fits' random_state / --seed
# NCCL between simulated hosts as between machines: no peer-to-peer, no shared memory, sockets.
NCCL_SOCKETS = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"}


def host_of(address: str) -> str:
    """The host part of a worker's address (``tls://127.0.0.2:4000`` -> ``127.0.0.2``)."""
    return get_address_host(address)


def by_host(addresses) -> dict[str, list[str]]:
    """Worker addresses grouped by host, each group sorted."""
    out: dict[str, list[str]] = {}
    for a in sorted(addresses):
        out.setdefault(host_of(a), []).append(a)
    return out


def free_port(host: str) -> int:
    """A port nobody listens on at ``host`` now (for ``--listen-address``)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LoopbackHosts(faultkit.DaskProcesses):
    """A scheduler on 127.0.0.1 and ``per_host`` single-threaded workers on each of ``hosts``.

    Parameters
    ----------
    root : Path
        Where the scheduler file, the logs and the workers' directories go.
    hosts : sequence of str
        The simulated hosts' loopback addresses.
    per_host : int
        Workers per host.
    nanny : bool
        Workers with a nanny (a killed one comes back at a new port of the same host).
    tls : (ca, cert, key) paths, optional
        Every process speaks ``tls://`` and accepts only peers with certificates of ``ca``.
    contact : sequence of str
        Hosts whose workers are started with ``--listen-address``/``--contact-address`` (a
        port chosen here) instead of ``--host``.
    """

    memory_limit = "2GiB"  # each worker's ``--memory-limit``

    def __init__(self, root: Path, hosts=HOSTS[:2], per_host: int = 2, nanny: bool = False,
                 tls: tuple | None = None, contact=()):
        super().__init__(root, n=len(hosts) * per_host, nanny=nanny)
        self.hosts, self.per_host, self.tls, self.contact = tuple(hosts), per_host, tls, tuple(contact)
        self.env["PYTHONPATH"] = f"{HERE}:{self.env['PYTHONPATH']}"

    @property
    def protocol(self) -> str:
        return "tls" if self.tls else "tcp"

    def tls_flags(self) -> list[str]:
        """The dask CLI's (and daskmeans's) TLS flags, or nothing."""
        if not self.tls:
            return []
        ca, cert, key = map(str, self.tls)
        return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]

    def security(self) -> Any:
        if not self.tls:
            return None
        from distributed.security import Security

        ca, cert, key = map(str, self.tls)
        return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True)

    def start(self) -> "LoopbackHosts":
        try:
            self.scheduler = self._spawn(
                ["dask", "scheduler", "--protocol", self.protocol, "--host", SCHEDULER_HOST, "--port", "0",
                 "--no-dashboard", "--scheduler-file", str(self.scheduler_file), *self.tls_flags()], "scheduler")
            deadline = time.monotonic() + 60
            while not self._address():
                if self.scheduler.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the scheduler did not start:\n{self.logs()}")
                time.sleep(0.05)  # polling the scheduler file, with a deadline
            self.client = Client(self.address, timeout="30s", set_as_default=False, security=self.security())
            for host in self.hosts:
                self.start_host(host, wait=False)
            self.wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def start_host(self, host: str, count: int | None = None, wait: bool = True) -> None:
        """Start ``count`` (default ``per_host``) workers on ``host``."""
        for _ in range(self.per_host if count is None else count):
            if host in self.contact:
                port = free_port(host)
                where = ["--listen-address", f"{self.protocol}://{host}:{port}",
                         "--contact-address", f"{self.protocol}://{host}:{port}"]
            else:
                where = ["--host", host]
            self._spawn(["dask", "worker", "--scheduler-file", str(self.scheduler_file), *where,
                         "--nthreads", "1", "--nanny" if self.nanny else "--no-nanny", "--no-dashboard",
                         "--local-directory", str(self.root / "workers"), "--memory-limit",
                         self.memory_limit, "--death-timeout", "60", *self.tls_flags()], f"worker-{host}")
        if wait:
            self.wait_for_workers()

    def add_workers(self, count: int) -> None:
        """``count`` more workers, spread over the hosts that have the fewest."""
        have = by_host(self.client.nthreads())
        for _ in range(count):
            host = min(self.hosts, key=lambda h: len(have.get(h, [])))
            have.setdefault(host, []).append("new")
            self.start_host(host, 1, wait=False)
        self.wait_for_workers()

    def workers_by_host(self) -> dict[str, list[str]]:
        return by_host(self.client.nthreads())


class GpuHosts(LoopbackHosts):
    """GPU workers on the simulated hosts, one ``dask worker`` process per GPU, NCCL kept on
    sockets (:data:`NCCL_SOCKETS`): host ``i`` (of ``hosts``) owns GPUs ``i * per_host`` to
    ``(i + 1) * per_host - 1``, and each of its workers sees one of them alone (its own
    ``CUDA_VISIBLE_DEVICES``). A worker started after one was killed takes its host's GPU that
    has no live worker.

    Parameters
    ----------
    root, hosts, per_host, **kwargs
        As :class:`LoopbackHosts`'s; ``per_host`` is the GPUs (and workers) per host.
    """

    memory_limit = "16GiB"  # a CUDA context and staged rows: Dask would pause a worker at 80% of 2 GiB

    def __init__(self, root: Path, hosts=HOSTS[:2], per_host: int = 1, **kwargs: Any):
        super().__init__(root, hosts, per_host, **kwargs)
        self.env.update(NCCL_SOCKETS)
        self._on_gpu: dict[int, subprocess.Popen] = {}  # GPU -> the worker process started on it

    def gpus(self, host: str) -> list[int]:
        """The GPUs (indices on this machine) of ``host``."""
        i = self.hosts.index(host)
        return list(range(i * self.per_host, (i + 1) * self.per_host))

    def start_host(self, host: str, count: int | None = None, wait: bool = True) -> None:
        """Start ``count`` (default ``per_host``) workers on ``host``, each on a GPU of the
        host that has no live worker."""
        for _ in range(self.per_host if count is None else count):
            free = [g for g in self.gpus(host) if g not in self._on_gpu or self._on_gpu[g].poll() is not None]
            if not free:
                raise RuntimeError(f"every GPU of {host} ({self.gpus(host)}) has a live worker")
            # The environment is read when the process is spawned: one worker at a time.
            self.env["CUDA_VISIBLE_DEVICES"] = str(free[0])
            super().start_host(host, 1, wait=False)
            self._on_gpu[free[0]] = self.procs[-1]
        if wait:
            self.wait_for_workers()


class KillHostOnTask(faultkit.KillOnTask):
    """Every worker of ``host`` SIGKILLs itself when its task whose key starts with ``prefix``
    starts executing, after ``skip`` such tasks of its own (a host lost: all its workers at once, mid-work); workers of
    other hosts run on. Kills are recorded as :class:`faultkit.KillOnTask` records them."""

    def __init__(self, prefix: str, flags: str | Path, host: str, skip: int = 0):
        super().__init__(prefix, flags, every_worker=True)
        self.host, self.skip_here = host, int(skip)
        self.name = f"daskmeans-multinode-kill-{host}-{prefix}"
        self.seen = 0  # on each worker: its task starts of ``prefix`` so far

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if host_of(self.address) != self.host or finish != "executing":
            return
        name = str(key[0] if isinstance(key, tuple) else key)
        if name.startswith(self.prefix):
            self.seen += 1
            if self.seen > self.skip_here:
                super().transition(key, start, finish, **kwargs)


@contextlib.contextmanager
def kill_hosts(client: Client, flags: Path, prefix: str, hosts, skip: int = 0):
    """:class:`KillHostOnTask` for each of ``hosts``, registered on every worker for the
    block; yields ``flags``."""
    flags.mkdir(parents=True, exist_ok=True)
    plugins = [KillHostOnTask(prefix, flags, host, skip) for host in hosts]
    for plugin in plugins:
        client.register_plugin(plugin)
    try:
        yield flags
    finally:
        if client.status == "running":
            for plugin in plugins:
                with contextlib.suppress(Exception):
                    client.unregister_worker_plugin(plugin.name)


# ---------------------------------------------------------------- run on the workers


def read_shard(shard: Any) -> tuple[str, list]:
    """On a shard's worker: its address and ``(row offset, block)`` of every chunk, read in
    the shard's tier (the storage tier reads the file here)."""
    import numpy as np
    from distributed import get_worker

    return get_worker().address, [(int(off), np.array(block, copy=True)) for _, off, block, _ in shard.items()]


def certificates(d: Path, name: str) -> tuple[Path, Path, Path]:
    """A certificate authority and one certificate it signed, as PEM files: the TLS tests' own
    helper (``tests/cli/test_deploy.py``). Dask checks the authority, not the host name, so the
    one certificate serves every simulated host."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_deploy_tests", HERE.parent / "cli" / "test_deploy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._certificates(d, name)


def rank_buffers(rank: int, n: int, calls: int) -> list:
    """The int64 buffers rank ``rank`` contributes to ``calls`` all-reduces of ``n`` values."""
    import numpy as np

    rng = np.random.default_rng([rank, n])
    return [rng.integers(-(2**60), 2**60, n, dtype=np.int64) for _ in range(calls)]


def allreduce_on_rank(rank: int, spec: Any, n: int, calls: int) -> dict:
    """On a worker: ``calls`` all-reduces of :func:`rank_buffers` through the Dask collective
    of ``spec``; the sums, the bytes this rank sent in each call (to ranks of its own host and
    over the network; the first call's include opening the shared memory), and whether the
    buffers went through the hosts' shared memory."""
    from distributed import get_worker

    from daskmeans.engine import collective as coll

    c = coll.open_collective(spec, rank, get_worker())
    outs, sent = [], []
    for buf in rank_buffers(rank, n, calls):
        before = dict(c.sent_bytes)
        outs.append(c.allreduce(buf))
        sent.append({k: c.sent_bytes[k] - before[k] for k in before})
    return {"sums": outs, "sent": sent, "shared": bool(c._shm)}


_PATHS: dict = {}


def probe_host_path(threshold: int, dask_worker: Any = None) -> None:
    """On a worker (``client.run``): buffers of ``threshold`` bytes and more take the Dask
    collective's shared-memory paths (a fit's small buffers then take them too), and each sum
    through hosts' shared memory and the network is counted."""
    from daskmeans.engine.dask_collective import DaskCollective

    _PATHS.setdefault("threshold", DaskCollective.shm_min_bytes)
    _PATHS.setdefault("calls", 0)
    inner = _PATHS.setdefault("inner", DaskCollective._allreduce_hosts)
    DaskCollective.shm_min_bytes = threshold

    def counted(self: Any, buf: Any) -> Any:
        _PATHS["calls"] += 1
        return inner(self, buf)

    DaskCollective._allreduce_hosts = counted


def probed_host_path(dask_worker: Any = None) -> int:
    """The sums :func:`probe_host_path` counted on this worker (and the probe removed)."""
    from daskmeans.engine.dask_collective import DaskCollective

    if "inner" in _PATHS:
        DaskCollective._allreduce_hosts = _PATHS.pop("inner")
        DaskCollective.shm_min_bytes = _PATHS.pop("threshold")
    return _PATHS.pop("calls", 0)
