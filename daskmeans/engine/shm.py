"""Shared-memory segments for the Dask collective between worker processes of one host.

A segment is an int64 array in a file under ``/dev/shm`` (Linux's tmpfs), mapped by every
rank: its owner writes its buffer there and the others read it directly, where the Dask comms
would serialise it through a TCP socket (docs/performance.md, "collectives"). The owner
reserves the file's pages with ``posix_fallocate``, so a full ``/dev/shm`` is an ``OSError``
at creation (the collective then keeps to the comms) and never a SIGBUS at the first write.
Once every rank has mapped every segment, the owners unlink the files: the mappings stay
valid, and nothing is left behind in ``/dev/shm`` even if a worker is killed.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

SHM_DIR = "/dev/shm"
# /dev/shm must keep this much free beyond the segments (other users of the host's tmpfs).
_HEADROOM = 64 << 20


def room_for(nbytes: int) -> bool:
    """Whether ``/dev/shm`` exists and has ``nbytes`` free beyond a headroom."""
    try:
        st = os.statvfs(SHM_DIR)
    except (OSError, AttributeError):  # no /dev/shm (not Linux) or no statvfs
        return False
    return st.f_bavail * st.f_frsize >= nbytes + _HEADROOM


class Segment:
    """``n`` int64 values in the file ``path``, mapped (``array``).

    Parameters
    ----------
    path : str
        A file under :data:`SHM_DIR`; unique per fit, placement, rank and parity.
    n : int
        Length of the array.
    create : bool
        Create the file (it must not exist) and reserve its pages, else open the owner's.

    Raises
    ------
    OSError
        The file cannot be created, reserved (no room) or opened (another host: the ranks
        share no ``/dev/shm``).
    """

    def __init__(self, path: str, n: int, create: bool):
        self.path, self.n, self.owner = path, int(n), create
        nbytes = max(8, 8 * self.n)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                except BaseException:
                    os.unlink(path)
                    raise
            elif os.fstat(fd).st_size < nbytes:
                raise OSError(f"{path} holds {os.fstat(fd).st_size} bytes, {nbytes} expected")
            self._map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self._map, np.int64, self.n)

    def unlink(self) -> None:
        """Remove the owner's file (the mappings stay valid)."""
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.owner = False

    def close(self) -> None:
        self.unlink()
        self.array = None
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with it
            pass
