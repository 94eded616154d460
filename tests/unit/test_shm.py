"""Shared-memory segments of the Dask collective (engine.shm), in one process."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from daskmeans.engine import shm

pytestmark = pytest.mark.skipif(not shm.room_for(1 << 20), reason="needs /dev/shm with room")


def _path() -> str:
    return os.path.join(shm.SHM_DIR, f"daskmeans-test-{uuid.uuid4().hex}")


def test_segment_is_shared_and_outlives_its_file():
    path = _path()
    own = shm.Segment(path, 1000, create=True)
    other = shm.Segment(path, 1000, create=False)
    own.array[:] = np.arange(1000)
    np.testing.assert_array_equal(other.array, np.arange(1000))  # one memory, two mappings
    own.unlink()
    assert not os.path.exists(path)
    own.array[7] = -5  # the mappings stay valid without the file
    assert other.array[7] == -5
    own.close()
    other.close()


def test_segment_errors_are_oserrors_and_leave_nothing():
    path = _path()
    with pytest.raises(FileNotFoundError):
        shm.Segment(path, 10, create=False)  # another host: no such segment
    own = shm.Segment(path, 10, create=True)
    with pytest.raises(FileExistsError):
        shm.Segment(path, 10, create=True)  # names are unique per fit, placement, rank, parity
    with pytest.raises(OSError, match=r"holds 80 bytes, 800 expected"):
        shm.Segment(path, 100, create=False)
    own.close()
    assert not os.path.exists(path)


def test_room_for_counts_the_headroom():
    st = os.statvfs(shm.SHM_DIR)
    free = st.f_bavail * st.f_frsize
    assert shm.room_for(0)
    assert not shm.room_for(free)  # the headroom stays free
