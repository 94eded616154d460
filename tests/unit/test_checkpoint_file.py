"""Checkpoint files (io.checkpoint): written, read back, and refused when they contradict
themselves or the fit, each with a message that says what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from daskmeans.errors import DataError
from daskmeans.io.checkpoint import check_fingerprint, read_checkpoint, write_checkpoint

K, D = 3, 2
FP = {"n_samples": 10, "n_features": D, "n_clusters": K, "digest": "ab" * 16, "tol": 0.0}


def _hist(n):
    return [{"iteration": i, "inertia": 1.0, "shift": 0.5, "reassigned": 2, "n_empty": 0} for i in range(1, n + 1)]


def _c(shape=(K, D)):
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape)


def test_round_trip(tmp_path):
    write_checkpoint(str(tmp_path / "c"), 2, _c(), _c() + 1, _hist(2), FP)
    ck = read_checkpoint(str(tmp_path / "c"))
    assert ck["iteration"] == 2 and ck["history"] == _hist(2) and ck["fingerprint"] == FP
    np.testing.assert_array_equal(ck["centroids"], _c())
    np.testing.assert_array_equal(ck["prev"], _c() + 1)


# Written as a buggy writer would (the checksum matches): each inconsistency named.
@pytest.mark.parametrize("args, message", [
    ((0, _c(), _c(), _hist(0)), "iteration=0 should be an integer >= 1"),
    ((4, _c(), _c(), _hist(3)), "its history has 3 entries, should have one per completed iteration (4)"),
    ((2, _c((D, K)), _c(), _hist(2)), "centroids have shape (2, 3), should be (n_clusters, n_features) = (3, 2)"),
    ((2, _c() * np.nan, _c(), _hist(2)), "centroids should be finite float64 values"),
    ((2, _c(), None, _hist(2)), "the centroids of the iteration before (prev) are missing"),
    ((2, _c(), _c(), [{"iteration": 1}, *_hist(2)[1:]]), "history entry 1 should be a record of numbers"),
    ((2, _c(), _c(), _hist(3)[1:]), "history entry 1 is numbered 2"),
])
def test_an_inconsistent_checkpoint_is_refused(tmp_path, args, message):
    path = str(tmp_path / "c")
    write_checkpoint(path, *args, FP)
    with pytest.raises(DataError, match=f"checkpoint {path} is damaged: ") as e:
        read_checkpoint(path)
    assert message in str(e.value)


def test_a_changed_byte_fails_the_checksum(tmp_path):
    path = tmp_path / "c"
    write_checkpoint(str(path), 2, _c(), _c(), _hist(2), FP)
    chunk = path / "centroids" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[3] ^= 1
    chunk.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="its checksum does not match its contents"):
        read_checkpoint(str(path))


def test_the_fingerprint_names_what_differs_and_the_iteration_is_bounded():
    check_fingerprint("c", FP, dict(FP), 5, 5)
    with pytest.raises(DataError, match=r"is for another fit \(the data's values differ\)"):
        check_fingerprint("c", FP, {**FP, "digest": "cd" * 16}, 5, 10)
    with pytest.raises(DataError, match=r"n_clusters: checkpoint 3, now 4"):
        check_fingerprint("c", FP, {**FP, "n_clusters": 4}, 5, 10)
    with pytest.raises(DataError, match="checkpoint c is at iteration 6, past max_iter=5"):
        check_fingerprint("c", FP, dict(FP), 6, 5)
