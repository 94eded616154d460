"""Byte ranges of a file read into memory by several threads at once, and the threads that
readers split their work over: a few for reads (:func:`in_threads`), one per core for parsing
(:func:`on_cores`).

One thread reading a chunk through a memory map takes a page fault per few pages of the file
and of the new array (docs/performance.md, ".npy reads"). Positional reads (``os.preadv``, which releases the interpreter lock) of
8 MiB pieces by a few threads fill the same array several times faster, from the page cache
or from a parallel file system alike.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ..errors import DataError

T = TypeVar("T")

PIECE_BYTES = 8 << 20

# Set in every thread of daskmeans' pools, and in a reading pipeline's thread while it reads
# one of a chunk's several pieces (:func:`in_place`): such a thread runs a split of its own work
# in place, since it is already one of several (a pipeline's thread that read its piece through
# a shared pool would wait on that pool's few threads, and waiting for its own pieces on a full
# pool could wait forever).
_IN_POOL = threading.local()


def _enter_pool() -> None:
    _IN_POOL.on = True


def cores() -> int:
    """The cores this process may run on (its CPU affinity; a nanny's ``OMP_NUM_THREADS=1``
    is about BLAS, not these threads)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


class _Pool:
    """Threads made on first use, shared by every task of the process; a thread of the pool
    that splits work over the same pool runs it in place (waiting for its own pieces on a full
    pool could wait forever)."""

    def __init__(self, name: str, size: Callable[[], int]) -> None:
        self._name, self._size = name, size
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
        """``[fn(item) for item in items]`` on the pool's threads; returns once every call has
        returned, then raises the first failure's exception."""
        if len(items) <= 1 or getattr(_IN_POOL, "on", False):
            return [fn(item) for item in items]
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._size(), thread_name_prefix=self._name,
                                                    initializer=_enter_pool)
        futs = [self._executor.submit(fn, item) for item in items]
        wait(futs)  # none still runs: the caller may free what they write to or read from
        return [f.result() for f in futs]


_READERS = _Pool("daskmeans-read", lambda: min(8, os.cpu_count() or 1))
_CORES = _Pool("daskmeans-parse", cores)


def read_into(path: str, offset: int, buf: memoryview) -> None:
    """Fill ``buf`` (a writable byte view) with the bytes of ``path`` from ``offset`` on.

    Raises
    ------
    DataError
        When the file ends before ``buf`` is full (a truncated file).
    """
    n = len(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        def piece(a: int) -> None:
            view, at = buf[a:min(n, a + PIECE_BYTES)], offset + a
            while view:
                got = os.preadv(fd, [view], at)
                if got == 0:
                    raise DataError(f"{path} ends at byte {at}, before byte {offset + n} that its header promises "
                                    f"(a truncated file)")
                view, at = view[got:], at + got

        in_threads(piece, range(0, n, PIECE_BYTES))  # returns once no piece reads the descriptor
    finally:
        os.close(fd)


def reading_pool(threads: int, name: str = "daskmeans-fill") -> ThreadPoolExecutor:
    """A pool of ``threads`` threads for a reading pipeline (:mod:`daskmeans.io.fill`)."""
    return ThreadPoolExecutor(max(1, int(threads)), thread_name_prefix=name)


@contextlib.contextmanager
def in_place() -> Iterator[None]:
    """Within it, the calling thread's reads run their splits in place (:func:`in_threads`,
    :func:`on_cores`): a pipeline's thread reading one of many pieces, the other threads
    reading the others, so that the pipeline's thread count bounds the reads at once."""
    was = getattr(_IN_POOL, "on", False)
    _IN_POOL.on = True
    try:
        yield
    finally:
        _IN_POOL.on = was


def in_threads(fn: Callable[[Any], None], items: Sequence[Any]) -> None:
    """``fn(item)`` for every item, on the readers' threads (a few: reads, decompression);
    returns once every call has returned, then raises the first failure's exception."""
    _READERS.map(fn, items)


def on_cores(fn: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
    """``[fn(item) for item in items]`` on a thread per core (work that holds a core: parsing,
    counting), whatever Dask's threads are (one per in-process worker); returns once every
    call has returned, then raises the first failure's exception."""
    return _CORES.map(fn, items)
