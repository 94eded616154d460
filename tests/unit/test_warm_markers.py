"""The kernel warm-up's markers, read without CuPy (:func:`gpu_warm_ops.compiled`): a launcher
starts no process where every slice of the installed CuPy left its marker, and starts them where
any slice, or the version's, is missing."""

import os

import pytest

from daskmeans.backends import gpu_warm_ops


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "cupy", raising=False)
    monkeypatch.setattr(gpu_warm_ops, "_cupy_version", lambda: "14.0.1")
    return tmp_path


def mark(cache, index, count, version="14.0.1", dtype="float32"):
    name = f"daskmeans-warm-{gpu_warm_ops._tag()}-cupy{version}-cuda13000-sm90-{dtype}-{index}of{count}"
    (cache / name).write_text("")


def test_every_slice_marked_is_compiled(cache):
    assert not gpu_warm_ops.compiled("float32", 3)
    for i in range(3):
        mark(cache, i, 3)
    assert gpu_warm_ops.compiled("float32", 3)
    assert not gpu_warm_ops.compiled("float64", 3)  # another dtype's ops
    assert not gpu_warm_ops.compiled("float32", 4)  # another cut of the list


def test_a_missing_slice_or_another_version_is_not_compiled(cache):
    mark(cache, 0, 2)
    mark(cache, 1, 2, version="13.6.0")
    assert not gpu_warm_ops.compiled("float32", 2)
    mark(cache, 1, 2)
    assert gpu_warm_ops.compiled("float32", 2)


def test_a_marker_of_another_list_of_ops_does_not_count(cache):
    for i in range(2):
        (cache / f"daskmeans-warm-000000000000-cupy14.0.1-cuda13000-sm90-float32-{i}of2").write_text("")
    assert not gpu_warm_ops.compiled("float32", 2)
    assert os.path.isdir(cache)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_op_runs_with_numpy_for_cupy(dtype):
    """Each op of the warm-up's list runs to the end with NumPy standing in for CuPy (the same
    array API here): an op whose shapes or dtypes do not agree would fail in its process on a
    GPU, where its kernels would then stay for the fit to compile."""
    import warnings

    import numpy as np

    ops = gpu_warm_ops._ops(np, np, np.dtype(dtype))
    assert len(ops) >= 14
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # log(0) of the draws' keys: a kernel's inputs, not its result
        for op in ops:
            op()
