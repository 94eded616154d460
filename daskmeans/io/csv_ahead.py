"""A CSV file read ahead, in a process of its own, while the command that fits it starts.

``daskmeans fit data.csv`` spends its first second or two importing Dask, distributed and CuPy,
one module after another under the interpreter lock; reading a CSV file (loading the compiled
parser, counting the rows, parsing them) came after, on the same path. Here the command starts a
process first: it opens the file as :func:`~.csv_reader.open_csv` does (the survey: the layout,
the columns' names and types, every piece's rows counted) and parses every row, on every core,
into an anonymous shared memory file (``memfd``) that the command made and passed to it; it
prints the survey as JSON and ends. When the command reads the file (:func:`take`, called by
``open_csv`` with the same options), it maps the parsed rows and takes the survey, rather than
reading the file again: its in-process workers then copy rows where they would have parsed them
(:data:`~.csv_reader._AHEAD`). The rows are the same bits (the same code parsed them); the file
the fit names, its chunks and its messages are as without a read-ahead.

Where anything fails in the read-ahead process (a cell that is no number, a file that cannot be
read, the process killed), :func:`take` returns None and the command reads the file itself,
which raises the same error the same way. Nothing is written to any file system: the memory
file has no name and goes with the last process that holds it.

Used by the command alone, where its workers will be threads of its process (the rows are then
shared without a copy) and the file is plain text small enough to hold in memory twice
(:func:`start`). Linux only (``os.memfd_create``).

The process is the CSV reader's own (``python -m daskmeans.io.csv_reader FD OPTIONS_JSON``,
:func:`~.csv_reader.read_ahead`): this module starts it and hands its result over, and imports
neither NumPy nor Dask before the command asks for the rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

# Files larger than this are read as usual: the read-ahead saves at most the command's start
# (its imports, a second or two) whatever the file's size, while its buffer grows with it.
MAX_BYTES = 4 << 30
# The parsed rows may take at most this share of the memory available when the command starts.
MEMORY_SHARE = 0.25
# Fewer cores than this, and the read-ahead process's imports and parse take the cores the
# command's own imports need: on 2 cores a small CSV fit was slower with it (docs/performance.md,
# "CSV read ahead").
MIN_CORES = 8

# The plain text files the CSV reader opens (its compressed ones are read as one stream).
PLAIN_SUFFIXES = (".csv", ".tsv", ".txt")

_STARTED: dict[tuple, "_Ahead"] = {}
TAKEN: list[str] = []  # the files whose rows this process took from a read-ahead


def key(path: str, chunk_bytes: int | None, dtype: Any, columns: list | None, drop_columns: list | None,
        delimiter: str | None) -> tuple:
    """What a read-ahead was started with, as :func:`~.csv_reader.open_csv` has it (an absolute
    path, text per block in bytes or None, the dtype parsed to (a NumPy dtype or its name), the
    column lists as :func:`~.csv_reader.column_list` makes them, the delimiter or None): a
    read-ahead serves only a read with the same."""
    cols = None if columns is None else tuple(columns)
    drop = None if drop_columns is None else tuple(drop_columns)
    return (os.path.abspath(path), None if chunk_bytes is None else int(chunk_bytes), getattr(dtype, "name", dtype),
            cols, drop, delimiter)


class _Ahead:
    """A read-ahead process and the memory file it parses into."""

    def __init__(self, proc: subprocess.Popen, fd: int):
        self.proc, self.fd = proc, fd

    def result(self) -> tuple[dict, Any] | None:
        """(the survey as the process printed it, the rows as an array over the memory file),
        once the process has ended; None where it failed."""
        import mmap

        import numpy as np

        try:
            out, _ = self.proc.communicate()
            if self.proc.returncode != 0:
                return None
            got = json.loads(out)
            rows, d, dtype = int(got["rows"]), int(got["columns"]), np.dtype(got["dtype"])
            nbytes = rows * d * dtype.itemsize
            if os.fstat(self.fd).st_size != max(nbytes, 1):
                return None
            # Its pages mapped now (MAP_POPULATE), not faulted in one by one by the copies.
            mm = mmap.mmap(self.fd, max(nbytes, 1), flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ)
            return got["survey"], np.frombuffer(mm, dtype, count=rows * d).reshape(rows, d)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        finally:
            os.close(self.fd)

    def discard(self) -> None:
        """End the process and free its memory file, unread."""
        self.proc.kill()
        self.proc.communicate()
        os.close(self.fd)


def start(path: str, chunk_bytes: int | None = None, dtype: str | None = None, columns: list | None = None,
          drop_columns: list | None = None, delimiter: str | None = None, any_cores: bool = False) -> bool:
    """Start reading ``path`` ahead (once per options), where it is a plain CSV file of at
    most :data:`MAX_BYTES` whose rows fit in :data:`MEMORY_SHARE` of the available memory, on
    Linux with at least :data:`MIN_CORES` cores (``any_cores``: on any number). ``dtype``:
    "float32" or "float64", None for ``daskmeans.csv-dtype``. Returns whether a process was
    started. Imports neither NumPy, Dask's arrays nor the parser: the process does, while the
    command imports its own."""
    from .. import config

    if not hasattr(os, "memfd_create") or (not any_cores and (os.cpu_count() or 1) < MIN_CORES):
        return False
    path = os.path.abspath(path)
    if not path.lower().endswith(PLAIN_SUFFIXES):
        return False
    dtype = str(dtype if dtype is not None else config.get("csv-dtype"))
    itemsize = {"float32": 4, "float64": 8}.get(dtype)
    try:
        size = os.path.getsize(path)
    except OSError:
        return False  # the read names the problem
    # Each value takes at least one byte of text (its delimiter, an empty cell): the rows take
    # at most this much.
    if itemsize is None or size > MAX_BYTES or size * itemsize > MEMORY_SHARE * _available():
        return False
    k = key(path, chunk_bytes, dtype, columns, drop_columns, delimiter)
    if k in _STARTED:
        return True
    try:
        fd = os.memfd_create("daskmeans-csv-ahead")  # close-on-exec: only the process it is passed to
    except OSError:  # no memory files here (a sandbox's filter, a descriptor limit): read as usual
        return False
    options = {"path": path, "chunk_bytes": chunk_bytes, "dtype": dtype, "columns": columns,
               "drop_columns": drop_columns, "delimiter": delimiter, "parent": os.getpid()}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "daskmeans.io.csv_reader", str(fd), json.dumps(options)],
                                pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
    except OSError:
        os.close(fd)
        return False
    _STARTED[k] = _Ahead(proc, fd)
    return True


def take(k: tuple) -> tuple[dict, Any] | None:
    """The survey (as JSON) and parsed rows of the read-ahead started with options ``k``
    (:func:`key`), once (waiting for its process to end), or None: none started, or it failed.
    Any other read-ahead of the same file (other options) is ended: the file is read now."""
    ahead = _STARTED.pop(k, None)
    for other in [o for o in _STARTED if o[0] == k[0]]:
        _STARTED.pop(other).discard()
    got = None if ahead is None else ahead.result()
    if got is not None:
        TAKEN.append(k[0])
    return got


def _available() -> int:
    """Bytes of memory available now (``MemAvailable``), else of physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def end_with_parent(parent: int) -> None:
    """The read-ahead process ends when the command's does (Linux's parent-death signal): a
    command that stops before it reads the file leaves no parse running."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it ended before the signal was asked for
        os._exit(1)
