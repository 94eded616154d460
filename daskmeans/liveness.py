"""Workers that stop answering: a hung worker is a lost worker.

A worker process that is stopped (SIGSTOP, a frozen VM, a swap storm) keeps its connections
open: the scheduler goes on listing it for Dask's ``worker-ttl`` (5 minutes), its tasks stay
"processing", and every call that waits for it (``client.run``, a collective, a gather) waits
as long. The client watches the workers of a fit's tasks by their heartbeats to the scheduler
(every 0.5 s on a small cluster, :func:`distributed.scheduler.heartbeat_interval`):
:class:`Silence` tells how long each has been silent, on the client's own clock (no clock is
compared between hosts). One silent for longer than the collective's timeout
(``daskmeans.collective-timeout``) is retired (:func:`retire`: the scheduler removes it, its
data is made again elsewhere by lineage) and then handled as a worker killed.

Calls the client makes to the workers outside tasks (an abort, a release) go to the workers
the scheduler still lists, within a time bound (:func:`run_bounded`): none waits for a stopped
worker.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Sequence

from distributed import Client

from .dask_cluster import check_scheduler
from .events import note

# How long a look at the scheduler may take (a scheduler that died since the client last heard
# from it refuses connections, and Dask retries them for its connect timeout: 30 s).
LOOK_SECONDS = 5.0
# A wait of a fit's tasks first looks at heartbeats once it has lasted half the silence that
# earns a note (most waits end sooner: a segment lasts about a second; each look asks the
# scheduler about every worker), then at most once per LOOK_AFTER seconds. The first look
# sees a silence that began before it, from how far a worker's last heartbeat lags the others'.
FIRST_LOOK = 0.5
LOOK_AFTER = 1.0
# A note on a silent worker is repeated this often while the wait goes on.
NOTE_EVERY = 30.0


def _heartbeat_interval(n_workers: int) -> float:
    """Seconds between a worker's heartbeats on a cluster of ``n_workers`` (Dask's rule)."""
    try:
        from distributed.scheduler import heartbeat_interval
    except ImportError:  # pragma: no cover - a Dask without it: its rule as of 2026
        return 0.5 if n_workers <= 10 else 1.0 if n_workers < 50 else 2.0 if n_workers < 200 else n_workers / 200 + 1
    return float(heartbeat_interval(n_workers))


def last_heartbeats(client: Client) -> dict[str, float] | None:
    """When the scheduler last heard from each of its workers (``last_seen``, the scheduler's
    clock); None when the scheduler does not answer within :data:`LOOK_SECONDS`;
    :class:`~daskmeans.dask_cluster.SchedulerLost` if it is gone."""
    check_scheduler(client)
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=LOOK_SECONDS)
    except Exception as e:
        e.__traceback__ = None
        check_scheduler(client)
        if isinstance(e, TimeoutError):
            return None
        raise
    return {w: float(v.get("last_seen", 0.0)) for w, v in info.get("workers", {}).items()}


class Silence:
    """How long each of ``workers`` (in rank order) has sent no heartbeat, by the client's
    clock: the time since the client saw its ``last_seen`` change, plus, at the first look, how
    far it lagged the freshest worker's (a worker silent before the first look).

    Parameters
    ----------
    client : distributed.Client
    workers : sequence of str, or None
        The workers watched, in rank order (a note names the rank); None: every worker the
        scheduler lists, as it lists them.
    limit : float
        Seconds of silence after which a worker counts as hung (:meth:`look`); never below
        four heartbeat intervals, so that a healthy worker late by a beat or two is not.
    """

    def __init__(self, client: Client, workers: Sequence[str] | None, limit: float):
        self.client, self.ranked = client, workers is not None
        self.workers = list(workers) if workers is not None else []
        self.requested = float(limit)
        self._bounds(len(self.workers) or 1)
        self.t0 = time.monotonic()
        self.next_look = self.t0 + max(LOOK_AFTER, FIRST_LOOK * self.note_after)
        self.since: dict[str, tuple[float, float]] = {}  # worker: (its last_seen, silent since: client clock)
        self.noted: dict[str, float] = {}  # worker: silence at its last note

    def _bounds(self, n_workers: int) -> None:
        """The limits for a cluster of ``n_workers``, whose heartbeats come at Dask's pace."""
        self.floor = 4 * _heartbeat_interval(n_workers)
        self.limit = max(self.requested, self.floor)
        # A note once a worker has been silent this long: well before it is given up on.
        self.note_after = max(self.floor, min(10.0, self.limit / 3))

    def silences(self) -> dict[str, float]:
        """Seconds of silence of each watched worker the scheduler lists (one look)."""
        seen = last_heartbeats(self.client)
        now = time.monotonic()
        if not seen:
            return {}
        fresh = max(seen.values())
        if not self.ranked:
            self.workers = sorted(seen)
            self._bounds(len(seen))
        for w in self.workers:
            if w not in seen:
                continue
            last = self.since.get(w)
            if last is None:
                self.since[w] = (seen[w], now - max(0.0, fresh - seen[w]))
            elif last[0] != seen[w]:
                self.since[w] = (seen[w], now)
        return {w: now - self.since[w][1] for w in self.workers if w in seen and w in self.since}

    def look(self) -> dict[str, float]:
        """Every second or so, once the wait has lasted a while (:data:`FIRST_LOOK`): a note
        for each worker silent for a while (``daskmeans: waiting for worker tcp://... (rank 2),
        no reply for 15 s``), and the workers silent for longer than ``limit``, with their
        silences."""
        now = time.monotonic()
        if now < self.next_look:
            return {}
        self.next_look = now + LOOK_AFTER
        silent = self.silences()
        for w, s in silent.items():
            if s >= self.note_after and s - self.noted.get(w, -NOTE_EVERY) >= min(NOTE_EVERY, self.limit):
                self.noted[w] = s
                rank = f" (rank {self.workers.index(w)})" if self.ranked else ""
                note(f"daskmeans: waiting for worker {w}{rank}, no reply for {s:.0f} s")
        return {w: s for w, s in silent.items() if s >= self.limit}

    def confirm(self) -> dict[str, float]:
        """The workers silent for half of ``limit`` (at most 30 s, at least four heartbeat
        intervals), looked at now: after a peer of theirs gave up waiting for them (a
        collective's timeout), a worker silent this long is the one it waited for."""
        bound = max(self.floor, min(self.limit / 2, 30.0))
        return {w: s for w, s in self.silences().items() if s >= bound}


# The function the scheduler runs to remove a worker (:func:`retire`). Made from source in a
# namespace that is no importable module, so that Dask sends it by value: the scheduler need
# not import daskmeans.
_REMOVE_SOURCE = """
async def daskmeans_remove_worker(address, stimulus_id, dask_scheduler=None):
    return await dask_scheduler.remove_worker(address=address, stimulus_id=stimulus_id, close=True)
"""
_REMOVE_NAMESPACE: dict = {"__name__": "daskmeans_scheduler_remove"}  # no module of that name exists
exec(compile(_REMOVE_SOURCE, "<daskmeans remove worker>", "exec"), _REMOVE_NAMESPACE)
_remove_worker = _REMOVE_NAMESPACE["daskmeans_remove_worker"]


def retire(client: Client, workers: Sequence[str], silences: dict[str, float] | None = None,
           ranks: Sequence[str] = ()) -> None:
    """Tell the scheduler that ``workers`` are gone (``Scheduler.remove_worker``, which does not
    wait for them, unlike ``retire_workers``, which asks them to hand their data over): their
    tasks and data are released (made again elsewhere by lineage), and a worker that resumes
    later is told to close. One note per worker, naming its rank among ``ranks``. A scheduler
    that does not answer in time is not waited for (the worker stays listed: work placed on
    it again is given up on again after the same silence); a lost one is
    :class:`~daskmeans.dask_cluster.SchedulerLost`."""
    silences = silences or {}
    for w in workers:
        rank = f" (rank {list(ranks).index(w)})" if w in ranks else ""
        s = f" for {silences[w]:.0f} s" if w in silences else ""
        note(f"daskmeans: worker {w}{rank} gave no reply{s}: taken for lost, its work goes to the workers left")
        try:
            client.sync(client.run_on_scheduler, _remove_worker, w, f"daskmeans-hung-{uuid.uuid4().hex[:8]}",
                        callback_timeout=LOOK_SECONDS)
        except Exception as e:
            e.__traceback__ = None
            check_scheduler(client)


def run_bounded(client: Client, fn: Callable, *args: Any, workers: Sequence[str], seconds: float = LOOK_SECONDS,
                **kwargs: Any) -> dict:
    """``client.run(fn, *args, workers=workers, **kwargs)`` on those of ``workers`` the
    scheduler still lists, giving up after ``seconds`` (a stopped worker never answers):
    ``{worker: result or exception}``, ``{}`` when none is listed; TimeoutError after
    ``seconds``. The function still runs on every worker that gets it."""
    deadline = time.monotonic() + seconds
    check_scheduler(client)
    alive = set(client.sync(client.scheduler.ncores, callback_timeout=seconds))
    targets = sorted(set(workers) & alive)
    if not targets:
        return {}
    left = max(0.1, deadline - time.monotonic())
    return client.sync(client.run, fn, *args, workers=targets, on_error="return", callback_timeout=left, **kwargs)
