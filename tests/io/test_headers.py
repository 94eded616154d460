"""A data file's shape and fit dtype from its header alone (daskmeans.io.headers.peek), what
the command compiles its kernels for before its imports: the reader's shape and dtype where it
can tell, None (never an error) where it cannot."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

from daskmeans.io import readers
from daskmeans.io.headers import float_dtype, peek


@pytest.mark.parametrize("dtype, fit", [(np.float16, np.float32), (np.float32, np.float32),
                                        (np.float64, np.float64), (np.int16, np.float64), (np.uint8, np.float64)])
def test_npy_header_as_the_reader_reads_it(tmp_path, dtype, fit):
    path = str(tmp_path / "x.npy")
    np.save(path, np.ones((13, 5), dtype))
    assert peek(path) == ((13, 5), np.dtype(fit))
    X = readers.read(path)
    assert (tuple(X.shape), X.dtype) == peek(path)


@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_array_and_dataset_in_a_group(tmp_path, fmt):
    a = str(tmp_path / "a.zarr")
    zarr.create_array(a, shape=(11, 4), chunks=(5, 4), dtype="int32", zarr_format=fmt)
    assert peek(a) == ((11, 4), np.dtype(np.float64))
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=fmt)
    g.create_group("inner").create_array("x", shape=(9, 2), dtype="float32")
    assert peek(str(tmp_path / "g.zarr")) == ((9, 2), np.dtype(np.float32))  # its one array, as the reader takes it
    assert tuple(readers.read(str(tmp_path / "g.zarr")).shape) == (9, 2)
    g.create_array("y", shape=(3, 3), dtype="float64")
    assert peek(str(tmp_path / "g.zarr")) is None  # two arrays: the read refuses, naming them
    assert peek(str(tmp_path / "g.zarr"), "inner/x") == ((9, 2), np.dtype(np.float32))
    assert peek(str(tmp_path / "g.zarr"), "/inner/x/") == ((9, 2), np.dtype(np.float32))
    assert peek(str(tmp_path / "g.zarr"), "missing") is None


def test_the_suffix_in_any_case(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 2), np.float32))
    os.rename(tmp_path / "x.npy", tmp_path / "X.NPY")
    assert peek(str(tmp_path / "X.NPY")) == ((4, 2), np.dtype(np.float32))


def test_anything_else_is_none(tmp_path):
    np.save(tmp_path / "one.npy", np.ones(7))
    np.save(tmp_path / "three.npy", np.ones((2, 2, 2)))
    np.save(tmp_path / "text.npy", np.array([["a"]]))
    np.save(tmp_path / "bool.npy", np.ones((2, 2), bool))  # the reader refuses it
    np.save(tmp_path / "empty.npy", np.ones((0, 2)))
    (tmp_path / "bad.npy").write_bytes(b"not an npy file")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    for name in ("one.npy", "three.npy", "text.npy", "bool.npy", "empty.npy", "bad.npy", "x.csv", "missing.npy", "missing.zarr"):
        assert peek(str(tmp_path / name)) is None, name


def test_float_dtype_by_hand():
    assert float_dtype("f2") == np.float32 and float_dtype("f8") == np.float64 and float_dtype("u1") == np.float64
    with pytest.raises(Exception, match="X should be numeric, got dtype <U1"):
        float_dtype("U1")
