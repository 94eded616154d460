"""Readers (Zarr v2/v3, CSV, .npy, in-memory) and the model store (save/load, atomic writes)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from unittest import mock

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr

import daskmeans
import daskmeans.io.model_store as model_store
from daskmeans import DataError, KMeans, read
from daskmeans.io.readers import rows_per_chunk


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(0).standard_normal((1000, 5))


def listing(path):
    return sorted(os.listdir(path))


# ---------------------------------------------------------------- Zarr


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_zarr_array(tmp_path, data, zarr_format):
    path = str(tmp_path / "x.zarr")
    z = zarr.open_array(path, mode="w", shape=data.shape, chunks=(50, 5), dtype="f8", zarr_format=zarr_format)
    z[:] = data
    x = read(path)
    assert isinstance(x, da.Array)
    assert x.dtype == np.float64 and x.shape == data.shape
    assert x.numblocks == (1, 1)
    np.testing.assert_array_equal(x.compute(), data)
    # chunks by bytes, aligned to the Zarr chunks (50 rows): 4000 B = 100 rows; 9000 B = 225 -> 200
    assert read(path, chunk_bytes=4000).chunks[0] == (100,) * 10
    assert read(path, chunk_bytes=9_000).chunks[0] == (200,) * 5
    # never smaller than one Zarr chunk
    assert read(path, chunk_bytes=8).chunks[0] == (50,) * 20
    assert read(path, chunk_bytes="4000B").chunks[0] == (100,) * 10


@pytest.mark.parametrize("layout", ["rows", "rows-and-columns", "shards"])
def test_zarr_block_rows_on_and_off_the_stored_objects_edges(tmp_path, layout):
    """A block's rows, for ranges on and off the edges of the stored objects (7-row chunks,
    7 x 2 chunks, 21-row shards of 7-row chunks); a corrupt object is a DataError naming the
    rows."""
    from daskmeans.io import zarr_reader

    x = np.random.default_rng(1).standard_normal((100, 5)).astype(np.float32)
    path = str(tmp_path / "x.zarr")
    kw = {"rows": {"chunks": (7, 5)}, "rows-and-columns": {"chunks": (7, 2)},
          "shards": {"chunks": (7, 5), "shards": (21, 5)}}[layout]
    zarr.create_array(path, data=x, **kw)
    for a, b in ((0, 100), (0, 7), (3, 4), (5, 30), (6, 22), (63, 100), (99, 100)):
        np.testing.assert_array_equal(zarr_reader.zarr_block(path, "", a, b), x[a:b])
    with open(os.path.join(path, "c", "1", "0"), "wb") as f:
        f.write(b"not a chunk")
    # Chunks are decoded by daskmeans (naming the chunk) or, sharded, by zarr-python (the rows).
    msg = r"cannot read rows 0 to 99 of .*x\.zarr" if layout == "shards" else r"Zarr chunk .*x\.zarr/c/1/0 is damaged"
    with pytest.raises(DataError, match=msg):
        zarr_reader.zarr_block(path, "", 0, 100)


def _zarr_v3(path, x, chunks, compressors):
    return zarr.create_array(path, data=x, chunks=chunks, compressors=compressors)


def _zarr_v2(path, x, chunks, compressor, **kw):
    z = zarr.create_array(path, shape=x.shape, dtype=x.dtype, chunks=chunks, zarr_format=2,
                          compressors=compressor, **kw)
    z[:] = x
    return z


@pytest.mark.parametrize("fmt, codec, direct", [
    (3, None, True), (3, "zstd", True), (3, "zstd-checksum", True), (3, "blosc", True), (3, "gzip", False),
    (2, None, True), (2, "zstd", True), (2, "blosc", True), (2, "zlib", False),
])
@pytest.mark.parametrize("dtype", ["f4", "f8", "i2", "u1"])
def test_zarr_chunks_decoded_directly_equal_zarr_pythons_reads(tmp_path, fmt, codec, direct, dtype):
    """Chunks decompressed by daskmeans straight into the rows (local store, plain layouts)
    give zarr-python's values bit for bit: formats 3 and 2, each codec taken, row and column
    chunks, edge chunks, ranges on and off the chunks' edges; other codecs are read by
    zarr-python (no layout)."""
    import numcodecs
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    from daskmeans.io import zarr_chunks, zarr_reader

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((103, 7)) * 50).astype(dtype)
    v3 = {None: None, "zstd": ZstdCodec(level=3), "zstd-checksum": ZstdCodec(level=1, checksum=True),
          "blosc": BloscCodec(cname="lz4"), "gzip": GzipCodec()}
    v2 = {None: None, "zstd": numcodecs.Zstd(level=1), "blosc": numcodecs.Blosc(), "zlib": numcodecs.Zlib()}
    for chunks in ((10, 7), (10, 3), (103, 7), (200, 8)):
        path = str(tmp_path / f"x-{chunks[0]}-{chunks[1]}.zarr")
        z = _zarr_v3(path, x, chunks, v3[codec]) if fmt == 3 else _zarr_v2(path, x, chunks, v2[codec])
        arr = zarr.open_array(path, mode="r")
        assert (zarr_chunks.layout(arr) is not None) == direct
        for a, b in ((0, 103), (0, 10), (3, 4), (9, 31), (10, 20), (95, 103), (102, 103)):
            got = zarr_reader.zarr_block(path, "", a, b)
            assert got.dtype == x.dtype
            np.testing.assert_array_equal(got, np.asarray(z[a:b]))
            np.testing.assert_array_equal(got, x[a:b])


def test_zarr_layouts_left_to_zarr_python(tmp_path):
    """Big-endian values, Fortran order and filters (format 2) and sharding (format 3) are not
    decoded by daskmeans, and still read right."""
    import numcodecs

    from daskmeans.io import zarr_chunks, zarr_reader

    x = np.arange(60, dtype="f8").reshape(20, 3)
    cases = {"big-endian": dict(dtype=">f8"), "fortran": dict(order="F"),
             "filters": dict(filters=[numcodecs.Delta(dtype="f8")])}
    for name, kw in cases.items():
        path = str(tmp_path / f"{name}.zarr")
        z = zarr.create_array(path, shape=x.shape, chunks=(7, 3), zarr_format=2, **{"dtype": "f8", **kw})
        z[:] = x
        assert zarr_chunks.layout(zarr.open_array(path, mode="r")) is None, name
        np.testing.assert_array_equal(zarr_reader.zarr_block(path, "", 2, 17), x[2:17])
    path = str(tmp_path / "sharded.zarr")
    zarr.create_array(path, data=x, chunks=(7, 3), shards=(14, 3))
    assert zarr_chunks.layout(zarr.open_array(path, mode="r")) is None
    np.testing.assert_array_equal(zarr_reader.zarr_block(path, "", 2, 17), x[2:17])


def test_zarr_chunks_of_several_zstd_frames_and_unmappable_files_are_read(tmp_path, monkeypatch):
    """A zstd chunk written as two frames (the first header states only its own size) reads
    as zarr-python reads it; where files cannot be mapped in memory, chunks are read whole."""
    import mmap

    import numcodecs

    from daskmeans.io import zarr_chunks, zarr_reader

    x = np.arange(200, dtype="f4").reshape(40, 5)
    path = str(tmp_path / "x.zarr")
    zarr.create_array(path, data=x, chunks=(10, 5), compressors=zarr.codecs.ZstdCodec())
    raw = x[10:20].tobytes()
    z = numcodecs.Zstd()
    with open(os.path.join(path, "c", "1", "0"), "wb") as f:
        f.write(z.encode(np.frombuffer(raw[:120], np.uint8)) + z.encode(np.frombuffer(raw[120:], np.uint8)))
    assert zarr_chunks.layout(zarr.open_array(path, mode="r")) is not None
    np.testing.assert_array_equal(np.asarray(zarr.open_array(path, mode="r")[:]), x)
    np.testing.assert_array_equal(zarr_reader.zarr_block(path, "", 0, 40), x)

    def no_mapping(*args, **kwargs):
        raise OSError("mmap: operation not supported")

    monkeypatch.setattr(mmap, "mmap", no_mapping)
    np.testing.assert_array_equal(zarr_reader.zarr_block(path, "", 3, 37), x[3:37])


def test_zarr_chunks_zarr_python_reads_are_read(tmp_path):
    """Valid if unusual chunks read as zarr-python reads them: a Zstd chunk led by a skippable
    frame, a Blosc chunk followed by spare bytes."""
    import struct

    import numcodecs

    from daskmeans.io import zarr_reader

    x = np.arange(200, dtype="f4").reshape(40, 5)
    for name, comp, chunk in (
        ("skippable", zarr.codecs.ZstdCodec(),
         struct.pack("<II", 0x184D2A50, 3) + b"abc" + numcodecs.Zstd().encode(x[10:20].tobytes())),
        ("spare", zarr.codecs.BloscCodec(), None),
    ):
        path = str(tmp_path / f"{name}.zarr")
        zarr.create_array(path, data=x, chunks=(10, 5), compressors=comp)
        file = os.path.join(path, "c", "1", "0")
        if chunk is None:
            with open(file, "rb") as f:
                chunk = f.read() + bytes(7)
        with open(file, "wb") as f:
            f.write(chunk)
        np.testing.assert_array_equal(np.asarray(zarr.open_array(path, mode="r")[:]), x)
        np.testing.assert_array_equal(zarr_reader.zarr_block(path, "", 0, 40), x)


def test_a_zarr_chunk_claiming_more_than_a_chunk_is_refused_unread(tmp_path, monkeypatch):
    """A Zstd header stating more bytes than a chunk holds (a damaged size field: here 1 TiB)
    is refused from the header, without decompressing to that size."""
    import struct

    import numcodecs

    from daskmeans.io import zarr_reader

    x = np.arange(200, dtype="f4").reshape(40, 5)
    path = str(tmp_path / "x.zarr")
    zarr.create_array(path, data=x, chunks=(10, 5), compressors=zarr.codecs.ZstdCodec())
    with open(os.path.join(path, "c", "1", "0"), "wb") as f:  # single segment, 8-byte size field
        f.write(struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", 1 << 40) + bytes(16))
    monkeypatch.setattr(numcodecs.Zstd, "decode", lambda *a, **k: pytest.fail("decompressed"))
    with pytest.raises(DataError, match=r"c/1/0 holds 1099511627776 bytes of values, 200 expected"):
        zarr_reader.zarr_block(path, "", 10, 20)  # that chunk alone


@pytest.mark.parametrize("codec", [None, "zstd", "blosc"])
def test_a_zarr_chunk_of_the_wrong_size_is_an_error(tmp_path, codec):
    """A chunk file cut short, or one that decompresses to fewer bytes than a chunk (another
    array's chunk copied in), is a DataError naming the chunk, never rows of garbage."""
    from zarr.codecs import BloscCodec, ZstdCodec

    from daskmeans.io import zarr_reader

    x = np.arange(200, dtype="f4").reshape(40, 5)
    comp = {None: None, "zstd": ZstdCodec(), "blosc": BloscCodec()}[codec]
    path, small = str(tmp_path / "x.zarr"), str(tmp_path / "small.zarr")
    zarr.create_array(path, data=x, chunks=(10, 5), compressors=comp)
    zarr.create_array(small, data=x[:8], chunks=(8, 5), compressors=comp)  # 8-row chunks
    chunk = os.path.join(path, "c", "1", "0")
    with open(os.path.join(small, "c", "0", "0"), "rb") as f:
        other = f.read()
    with open(chunk, "wb") as f:
        f.write(other)
    with pytest.raises(DataError, match=r"Zarr chunk .*x\.zarr/c/1/0 (holds 160 bytes of values, 200 expected|is damaged)"):
        zarr_reader.zarr_block(path, "", 0, 40)
    with open(chunk, "wb") as f:
        f.write(other[: len(other) // 2])
    with pytest.raises(DataError, match=r"x\.zarr"):
        zarr_reader.zarr_block(path, "", 0, 40)
    open(chunk, "wb").close()  # an empty file
    with pytest.raises(DataError, match=r"Zarr chunk .*x\.zarr/c/1/0 holds 0 bytes of values, 200 expected"):
        zarr_reader.zarr_block(path, "", 0, 40)


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_zarr_dtypes(tmp_path, zarr_format):
    a = np.arange(60).reshape(20, 3)
    for dt, expected in [("i4", np.float64), ("u1", np.float64), ("f2", np.float32), ("f4", np.float32)]:
        path = str(tmp_path / f"{dt}.zarr")
        z = zarr.open_array(path, mode="w", shape=a.shape, chunks=(7, 3), dtype=dt, zarr_format=zarr_format)
        z[:] = a.astype(dt)
        x = read(path)
        assert x.dtype == expected, dt
        np.testing.assert_array_equal(x.compute(), a.astype(expected))


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_zarr_group_dataset_selection(tmp_path, data, zarr_format):
    path = str(tmp_path / "g.zarr")
    g = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    g.create_array("a", data=data)
    g.create_group("sub").create_array("b", data=data[:10].astype(np.float32))
    with pytest.raises(DataError, match=r"Zarr group with arrays \['a', 'sub/b'\]: choose one with dataset="):
        read(path)
    np.testing.assert_array_equal(read(path, dataset="a").compute(), data)
    b = read(path, dataset="sub/b")
    assert b.dtype == np.float32
    np.testing.assert_array_equal(b.compute(), data[:10].astype(np.float32))
    with pytest.raises(DataError, match=r"dataset='nope' is not an array in .*; arrays: \['a', 'sub/b'\]"):
        read(path, dataset="nope")


def test_zarr_group_single_array_is_chosen(tmp_path, data):
    path = str(tmp_path / "one.zarr")
    zarr.open_group(path, mode="w").create_group("deep").create_array("x", data=data)
    np.testing.assert_array_equal(read(path).compute(), data)


def test_zarr_array_with_dataset_is_refused(tmp_path, data):
    path = str(tmp_path / "x.zarr")
    zarr.open_array(path, mode="w", shape=data.shape, dtype="f8")[:] = data
    with pytest.raises(DataError, match="is a Zarr array, not a group"):
        read(path, dataset="x")


def test_zarr_bad_arrays(tmp_path):
    path = str(tmp_path / "one_d.zarr")
    zarr.open_array(path, mode="w", shape=(10,), dtype="f8")[:] = np.arange(10.0)
    with pytest.raises(DataError, match="X should be 2-D"):
        read(path)
    path = str(tmp_path / "bool.zarr")
    zarr.open_array(path, mode="w", shape=(10, 2), dtype="bool")[:] = True
    with pytest.raises(DataError, match="X should be numeric"):
        read(path)
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(DataError, match="cannot open .* as Zarr"):
        read(str(empty))


# ---------------------------------------------------------------- CSV


@pytest.fixture()
def labelled_csv(tmp_path, data):
    df = pd.DataFrame(data, columns=list("abcde"))
    df.insert(2, "label", np.where(data[:, 0] > 0, "pos", "neg"))
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    return str(path)


def test_csv_with_header(tmp_path, data):
    path = tmp_path / "h.csv"
    pd.DataFrame(data, columns=list("abcde")).to_csv(path, index=False)
    x = read(str(path))
    assert x.dtype == np.float32 and x.shape == data.shape  # CSV reads as float32 by default
    np.testing.assert_array_equal(x.compute(), data.astype(np.float32))


@pytest.mark.parametrize("suffix,delimiter", [(".csv", ","), (".tsv", "\t"), (".txt", ";"), (".txt", " ")])
def test_csv_without_header(tmp_path, data, suffix, delimiter):
    path = tmp_path / f"n{suffix}"
    np.savetxt(path, data, delimiter=delimiter, fmt="%.17g")
    x = read(str(path))
    assert x.shape == data.shape
    data = data.astype(np.float32)
    np.testing.assert_array_equal(x.compute(), data)
    # positional column names
    np.testing.assert_array_equal(read(str(path), columns=[4, 0]).compute(), data[:, [4, 0]])
    np.testing.assert_array_equal(read(str(path), drop_columns=["1", -1]).compute(), data[:, [0, 2, 3]])


def test_csv_gzip(tmp_path, data):
    path = tmp_path / "z.csv.gz"
    pd.DataFrame(data, columns=list("abcde")).to_csv(path, index=False)
    np.testing.assert_array_equal(read(str(path)).compute(), data.astype(np.float32))


def test_csv_columns_and_drop_columns(labelled_csv, data):
    with pytest.raises(DataError, match=r"column 'label' of .* is not numeric .*--columns or --drop-columns"):
        read(labelled_csv)
    data = data.astype(np.float32)
    np.testing.assert_array_equal(read(labelled_csv, drop_columns=["label"]).compute(), data)
    np.testing.assert_array_equal(read(labelled_csv, drop_columns=[2]).compute(), data)
    np.testing.assert_array_equal(read(labelled_csv, columns=["e", "a"]).compute(), data[:, [4, 0]])
    np.testing.assert_array_equal(read(labelled_csv, columns=[0, "b", -1]).compute(), data[:, [0, 1, 4]])
    with pytest.raises(DataError, match=r"column 'zz' is not in .*; columns: \['a', 'b', 'label', 'c', 'd', 'e'\]"):
        read(labelled_csv, columns=["a", "zz"])
    with pytest.raises(DataError, match="not both"):
        read(labelled_csv, columns=["a"], drop_columns=["label"])
    with pytest.raises(DataError, match="no columns left"):
        read(labelled_csv, drop_columns=list("abcde") + ["label"])


def test_csv_header_names_are_the_tables_columns(labelled_csv, tmp_path, data):
    """The header's names of the columns read, in the array's order (issue 47); none without
    a header."""
    from daskmeans.io.readers import read_table

    t = read_table(labelled_csv, drop_columns="label")
    assert t.columns == tuple("abcde") and t.source == labelled_csv and t.array.shape == data.shape
    assert read_table(labelled_csv, columns="e,a").columns == ("e", "a")
    assert read_table(labelled_csv, columns=[0, -1]).columns == ("a", "e")
    np.savetxt(tmp_path / "n.csv", data, delimiter=",")
    assert read_table(str(tmp_path / "n.csv")).columns is None
    assert read_table(data).columns is None and read_table(pd.DataFrame(data, columns=list("vwxyz"))).columns == \
        tuple("vwxyz")


# (header, first values, refused as an identifier): integers named like a row number only.
IDENTIFIERS = [
    ("id", "7", "integer values, name 'id'"),
    ("ID", "7", "integer values, name 'ID'"),
    ("customer_id", "7", "integer values, name 'customer_id'"),
    ("Row", "7", "integer values, name 'Row'"),
    ("index", "0", "integer values, name 'index'"),
    ("", "0", "integer values, an unnamed first column as pandas writes its index"),
    ("id", "7.5", None),  # not integers: a measure
    ("idx2", "7", None),
    ("paid", "7", None),  # ends with "id", not "_id"
    ("count", "7", None),
]


@pytest.mark.parametrize("name, value, why", IDENTIFIERS, ids=[f"{n or 'unnamed'}={v}" for n, v, _ in IDENTIFIERS])
def test_csv_identifier_rule(tmp_path, name, value, why):
    """The rule (csv_reader.identifier_columns), judged on the sample the reader parses anyway."""
    from daskmeans.io.readers import read_table

    path = tmp_path / "i.csv"
    path.write_text(f"{name},a\n" + "".join(f"{value if i == 0 else i},{i * 0.5}\n" for i in range(50)))
    t = read_table(str(path))
    if why is None:
        assert t.identifier_error is None
        return
    hint = "0" if name == "" else name
    shown = "Unnamed: 0" if name == "" else name
    assert t.identifier_error == (f"column {shown!r} of {path} looks like an identifier ({why}): drop it with "
                                  f"--drop-columns {hint}, or select it with --columns to cluster on it")
    with pytest.raises(DataError, match="looks like an identifier"):
        read(str(path))
    assert read(str(path), drop_columns=hint).shape == (50, 1)
    assert read(str(path), columns=[hint, "a"]).shape == (50, 2)  # selected: clustered as asked


def test_csv_identifier_hint_keeps_the_columns_already_dropped(tmp_path):
    from daskmeans.io.readers import read_table

    path = tmp_path / "i.csv"
    path.write_text("label,row_id,id,a\n" + "".join(f"x,{i},{i},{i * 0.5}\n" for i in range(20)))
    t = read_table(str(path), drop_columns="label")
    assert t.identifier_error.endswith("drop it and 'id' with --drop-columns label,row_id,id, or select it with "
                                       "--columns to cluster on it")


def test_csv_other_columns_are_read_as_written_in_the_arrays_chunks(tmp_path):
    """Columns read by name beside the array (labels written beside an id): text as written,
    one table per chunk of the array, the same rows."""
    import dask

    from daskmeans.io.readers import read_table

    path = tmp_path / "o.csv"
    path.write_text("key,a,b\n" + "".join(f"k{i:03d},{i * 0.5},\"{i}, x\"\n" for i in range(300)))
    t = read_table(str(path), columns="a", chunk_bytes=1000)
    assert t.array.numblocks[0] > 3
    names, dtypes, blocks = t.other_columns(["key", 2])
    assert names == ["key", "b"] and dtypes[0] in ("object", "str")
    parts = dask.compute(*blocks)
    assert [p.num_rows for p in parts] == list(t.array.chunks[0])
    keys = [v for p in parts for v in p.column("key").to_pylist()]
    assert keys == [f"k{i:03d}" for i in range(300)]
    assert parts[0].column("b").to_pylist()[:2] == ["0, x", "1, x"]
    with pytest.raises(DataError, match=r"column 'nope' is not in .*o\.csv"):
        t.other_columns(["nope"])


def test_zarr_feature_names_attribute(tmp_path, data):
    """The array attribute feature_names (one string per column) names the columns."""
    from daskmeans.io.readers import read_table

    z = zarr.create_array(str(tmp_path / "n.zarr"), data=data)
    assert read_table(str(tmp_path / "n.zarr")).columns is None
    z.attrs["feature_names"] = list("vwxyz")
    assert read_table(str(tmp_path / "n.zarr")).columns == tuple("vwxyz")
    z.attrs["feature_names"] = ["v", "w"]
    with pytest.raises(DataError, match=r"the attribute 'feature_names' of .*n\.zarr should be a list of 5 strings, "
                                        r"one per column, got \['v', 'w'\]"):
        read_table(str(tmp_path / "n.zarr"))


def test_csv_non_numeric_value_late_in_file(tmp_path):
    """A bad value past the part dask samples for dtypes still gives a DataError."""
    n = 40_000
    col = np.arange(n, dtype=np.float64).astype(str).astype(object)
    col[n - 5] = "oops"
    df = pd.DataFrame({"a": np.arange(n, dtype=np.float64), "b": col})
    path = tmp_path / "late.csv"
    df.to_csv(path, index=False)
    assert os.path.getsize(path) > 300_000  # larger than dask's 256 KiB sample
    with pytest.raises(DataError, match="oops|non-numeric|not numeric"):
        read(str(path), chunk_bytes=100_000).compute()


def test_csv_bool_column_is_not_numeric(tmp_path):
    path = tmp_path / "b.csv"
    pd.DataFrame({"a": [1.0, 2.0, 3.0], "flag": [True, False, True]}).to_csv(path, index=False)
    with pytest.raises(DataError, match="column 'flag' .* is not numeric"):
        read(str(path))
    np.testing.assert_array_equal(read(str(path), columns=["a"]).compute(), [[1.0], [2.0], [3.0]])


def test_csv_missing_value_is_refused_by_fit(client, tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("a,b\n1,2\n3,\n5,6\n7,8\n")
    x = read(str(path))
    assert np.isnan(x.compute()[1, 1])
    with pytest.raises(DataError, match=r"X contains 1 NaN or infinite value\(s\), the first in row 1 \(rows of data "
                                        r"counted from 0; in a CSV file with a header that is line 3\): .*"
                                        r"\(in a CSV file, an empty or missing field reads as NaN\)"):
        KMeans(2, client=client).fit(str(path))


def test_csv_empty_and_columns_on_non_csv(tmp_path, data):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError, match="is empty"):
        read(str(empty))
    np.save(tmp_path / "a.npy", data)
    with pytest.raises(DataError, match="CSV input only"):
        read(str(tmp_path / "a.npy"), columns=[0])


def test_csv_chunk_bytes_splits(tmp_path, data):
    path = tmp_path / "h.csv"
    pd.DataFrame(data, columns=list("abcde")).to_csv(path, index=False)
    size = os.path.getsize(path)
    x = read(str(path), chunk_bytes=size // 4)
    assert x.numblocks[0] >= 4
    assert sum(x.chunks[0]) == len(data)
    np.testing.assert_array_equal(x.compute(), data.astype(np.float32))


# ---------------------------------------------------------------- .npy


def test_npy_memory_mapped(tmp_path, data):
    path = tmp_path / "a.npy"
    np.save(path, data)
    x = read(str(path), chunk_bytes=4000)  # 4000 B / (5 * 8 B) = 100 rows
    assert x.chunks == ((100,) * 10, (5,))
    np.testing.assert_array_equal(x.compute(), data)
    # the graph holds the path, not the data: tasks open the memory map themselves
    import cloudpickle

    graph = dict(x.__dask_graph__())
    assert len(cloudpickle.dumps(graph)) < data.nbytes / 4
    # default chunking: 128 MiB -> one chunk here
    assert read(str(path)).numblocks == (1, 1)


def test_npy_float32_and_fortran_order(tmp_path, data):
    path = tmp_path / "f.npy"
    np.save(path, np.asfortranarray(data.astype(np.float32)))
    x = read(str(path), chunk_bytes=2000)  # 2000 B / (5 * 4 B) = 100 rows
    assert x.dtype == np.float32
    assert x.chunks[0] == (100,) * 10
    np.testing.assert_array_equal(x.compute(), data.astype(np.float32))


def test_npy_blocks_are_read_in_parallel_pieces_exactly(tmp_path, monkeypatch):
    """A block is read by positional reads of several pieces (threads), the last one short,
    from the header's end on: the same values as the memory map, for any block bounds."""
    from daskmeans.io import ranges
    from daskmeans.io.npy_reader import npy_block

    monkeypatch.setattr(ranges, "PIECE_BYTES", 1000)  # 1 row = 28 B: pieces cut rows too
    a = np.random.default_rng(0).random((1003, 7)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    for start, stop in ((0, 1003), (1, 2), (17, 990), (1002, 1003)):
        np.testing.assert_array_equal(npy_block(str(tmp_path / "a.npy"), start, stop), a[start:stop])
    f = np.asfortranarray(a.astype(np.float64))
    np.save(tmp_path / "f.npy", f)
    np.testing.assert_array_equal(npy_block(str(tmp_path / "f.npy"), 5, 500), f[5:500])


def test_a_range_past_the_end_of_the_file_is_a_data_error(tmp_path, monkeypatch):
    from daskmeans.io import ranges

    monkeypatch.setattr(ranges, "PIECE_BYTES", 64)
    (tmp_path / "short").write_bytes(bytes(range(200)))
    buf = bytearray(150)
    ranges.read_into(str(tmp_path / "short"), 40, memoryview(buf))
    assert bytes(buf) == bytes(range(40, 190))
    with pytest.raises(DataError, match=r"short ends at byte 200, before byte 240 that its header promises"):
        ranges.read_into(str(tmp_path / "short"), 90, memoryview(bytearray(150)))


def test_pieces_of_pieces_on_the_readers_threads_complete(tmp_path, monkeypatch):
    """Work split on the readers' threads whose pieces split again (raw Zarr chunks read by
    byte ranges, more chunks than threads) completes, each inner split in its own thread."""
    import threading

    from daskmeans.io import ranges, zarr_reader

    monkeypatch.setattr(ranges, "PIECE_BYTES", 256)  # each 10 x 8 float64 chunk: 3 pieces
    x = np.random.default_rng(3).standard_normal((400, 8))
    path = str(tmp_path / "x.zarr")
    zarr.create_array(path, data=x, chunks=(10, 8), compressors=None)  # 40 chunks
    got = []
    t = threading.Thread(target=lambda: got.append(zarr_reader.zarr_block(path, "", 0, 400)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the readers' threads wait for each other"
    np.testing.assert_array_equal(got[0], x)


def test_npy_integer_chunk_bytes_counts_float_size(tmp_path):
    """Regression (fixed): integer data is read as float64, and in-memory arrays and Zarr size their
    chunks by the float64 itemsize; .npy uses the file's itemsize (npy_reader.open_npy:
    ``rows_per_chunk(d, mm.dtype.itemsize, cb)``), so an int32 file gets chunks twice the
    requested bytes (uint8: 8x)."""
    a = np.arange(5000, dtype=np.int32).reshape(1000, 5)
    np.save(tmp_path / "i.npy", a)
    assert read(a, chunk_bytes=4000).chunks[0] == (100,) * 10  # in memory: 4000 / (5 * 8)
    x = read(str(tmp_path / "i.npy"), chunk_bytes=4000)
    assert x.dtype == np.float64
    np.testing.assert_array_equal(x.compute(), a)
    assert x.chunks[0] == (100,) * 10, f"got rows per chunk {x.chunks[0][0]}, expected 100"


def test_npy_bad_files(tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an npy file")
    with pytest.raises(DataError, match="cannot read .* as .npy"):
        read(str(bad))
    np.save(tmp_path / "one_d.npy", np.arange(4.0))
    with pytest.raises(DataError, match="2-D"):
        read(str(tmp_path / "one_d.npy"))


# ---------------------------------------------------------------- in memory, paths, chunk sizes


@pytest.mark.parametrize(
    "dtype,chunk_bytes,rows",
    [(np.float64, 4000, 100), (np.float32, 4000, 200), (np.int64, 4000, 100), (np.float64, "1KiB", 25), (np.float64, 1, 1)],
)
def test_in_memory_chunk_bytes(data, dtype, chunk_bytes, rows):
    x = read(data.astype(dtype), chunk_bytes=chunk_bytes)
    assert x.chunks[0][0] == rows
    assert sum(x.chunks[0]) == len(data)
    assert x.chunks[1] == (5,)


def test_rows_per_chunk():
    assert rows_per_chunk(5, 8, 4000) == 100
    assert rows_per_chunk(5, 8, 4000, align=64) == 64
    assert rows_per_chunk(5, 8, 40_000, align=64) == 960
    assert rows_per_chunk(1000, 8, 10) == 1


def test_dask_input_is_rechunked_to_one_column_block(data):
    x = read(da.from_array(data, chunks=(300, 2)))
    assert x.numblocks[1] == 1 and x.chunks[0] == (300, 300, 300, 100)
    x = read(da.from_array(data.astype(np.int16), chunks=(300, 5)))
    assert x.dtype == np.float64


def test_missing_and_unknown_paths(tmp_path):
    with pytest.raises(DataError, match="no such file or directory"):
        read(str(tmp_path / "nope.zarr"))
    with pytest.raises(DataError, match="no such file or directory"):
        read(tmp_path / "nope.npy")
    other = tmp_path / "data.parquet"
    other.write_bytes(b"x")
    with pytest.raises(DataError, match="cannot tell the format"):
        read(str(other))
    with pytest.raises(DataError, match="X should be an array, a DataFrame or a path, got set"):
        read({1.0, 2.0})
    assert read([[1.0, 2.0], [3.0, 4.0]]).shape == (2, 2)  # a list is an array


def test_fit_from_paths_equals_fit_from_array(client, tmp_path, data):
    init = data[:4]
    ref = KMeans(4, init=init, client=client).fit(data)
    np.save(tmp_path / "a.npy", data)
    zarr.open_array(str(tmp_path / "a.zarr"), mode="w", shape=data.shape, chunks=(100, 5), dtype="f8")[:] = data
    pd.DataFrame(data, columns=list("abcde")).to_csv(tmp_path / "a.csv", index=False)
    ref32 = KMeans(4, init=init, client=client).fit(data.astype(np.float32))  # CSV reads as float32
    for src, r in [("a.npy", ref), ("a.zarr", ref), ("a.csv", ref32)]:
        km = KMeans(4, init=init, client=client).fit(str(tmp_path / src))
        np.testing.assert_allclose(km.cluster_centers_, r.cluster_centers_, rtol=1e-9, err_msg=src)
        np.testing.assert_array_equal(np.asarray(km.labels_), np.asarray(r.labels_), err_msg=src)
    with pytest.raises(DataError, match="no such file"):
        KMeans(4, client=client).fit(str(tmp_path / "missing.npy"))


# ---------------------------------------------------------------- model store


WRITTEN = {
    "f64": np.arange(12.0).reshape(4, 3), "f32": np.linspace(-1, 1, 7, dtype=np.float32),
    "i64": np.array([1, -2, 2**62]), "u8": np.arange(5, dtype=np.uint8).reshape(5, 1),
    "b": np.array([True, False]), "f16": np.full((2, 2), 0.5, np.float16),
    "special": np.array([np.nan, np.inf, -0.0, 5e-324]), "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
}


def test_write_group_is_read_by_zarr_bit_for_bit(tmp_path):
    """The hand-written Zarr group: zarr-python reads every array with its dtype, shape and
    bytes, and the attributes; each array's metadata is what zarr-python writes for the same
    array uncompressed in one chunk."""
    root = str(tmp_path / "g.zarr")
    model_store.write_group(root, WRITTEN, {"x": [1, 2.5], "y": "z"})
    g = zarr.open_group(root, mode="r")
    assert dict(g.attrs) == {"x": [1, 2.5], "y": "z"}
    assert sorted(g.array_keys()) == sorted(WRITTEN)
    for name, a in WRITTEN.items():
        r = g[name][...]
        assert r.dtype == a.dtype and r.shape == a.shape
        assert r.tobytes() == np.ascontiguousarray(a).tobytes(), name
        ref = zarr.create_array(str(tmp_path / f"ref-{name}.zarr"), data=np.ascontiguousarray(a), compressors=None,
                                chunks=a.shape)
        mine = g[name].metadata.to_dict()
        assert mine == ref.metadata.to_dict(), name


@pytest.mark.parametrize("bad", [np.array(["a", "b"]), np.zeros((2, 2, 2)), np.zeros((0, 3)), np.zeros(3, complex)])
def test_write_group_refuses_what_it_cannot_write(tmp_path, bad):
    with pytest.raises(ValueError, match="should be a non-empty 1-D or 2-D array of booleans, integers or floats"):
        model_store.write_group(str(tmp_path / "g.zarr"), {"x": bad}, {})


@pytest.fixture(scope="module")
def model(client):
    X = np.random.default_rng(1).standard_normal((2000, 4))
    return X, KMeans(5, init="k-means++", random_state=7, tol=1e-3, client=client).fit(X)


def test_save_load_round_trip(tmp_path, model):
    X, km = model
    path = str(tmp_path / "model.zarr")
    km.save(path)
    assert listing(tmp_path) == ["model.zarr"]
    loaded = daskmeans.load(path)
    assert isinstance(loaded, KMeans)
    np.testing.assert_array_equal(loaded.cluster_centers_, km.cluster_centers_)
    assert loaded.cluster_centers_.dtype == km.cluster_centers_.dtype
    assert loaded.inertia_ == km.inertia_
    assert loaded.n_iter_ == km.n_iter_
    assert loaded.n_features_in_ == km.n_features_in_ == 4
    assert loaded.backend_ == km.backend_ == "numpy"
    assert len(loaded.history_) == len(km.history_)
    assert loaded.history_[-1]["inertia"] == km.history_[-1]["inertia"]
    params = loaded.get_params()
    assert params["n_clusters"] == 5 and params["init"] == "k-means++" and params["random_state"] == 7
    assert params["tol"] == 1e-3 and params["client"] is None
    attrs = dict(zarr.open_group(path, mode="r").attrs)
    assert attrs["format"] == "daskmeans-model" and attrs["format_version"] == 2 and len(attrs["checksum"]) == 64
    assert attrs["daskmeans_version"] == daskmeans.__version__
    np.testing.assert_array_equal(loaded.predict(X), km.predict(X))
    np.testing.assert_array_equal(loaded.predict(X), np.asarray(km.labels_))
    np.testing.assert_allclose(loaded.transform(X), km.transform(X))
    assert loaded.score(X) == km.score(X)


def test_save_load_float32_and_array_init(client, tmp_path):
    X = np.random.default_rng(2).standard_normal((500, 3)).astype(np.float32)
    km = KMeans(3, init=X[:3].astype(np.float64), client=client).fit(X)
    path = str(tmp_path / "m32.zarr")
    km.save(path)
    loaded = daskmeans.load(path)
    assert loaded.cluster_centers_.dtype == np.float32
    np.testing.assert_array_equal(loaded.cluster_centers_, km.cluster_centers_)
    assert isinstance(loaded.init, np.ndarray) and loaded.init.shape == (3, 3)
    np.testing.assert_array_equal(loaded.predict(X), km.predict(X))


def test_save_overwrites_atomically(tmp_path, model, client):
    X, km = model
    path = str(tmp_path / "model.zarr")
    km.save(path)
    other = KMeans(2, init="random", random_state=0, client=client).fit(X)
    other.save(path)
    assert listing(tmp_path) == ["model.zarr"]
    assert daskmeans.load(path).n_clusters == 2


def test_failed_save_leaves_nothing(tmp_path, model, monkeypatch):
    X, km = model
    path = str(tmp_path / "model.zarr")
    written = []
    real_write_json = model_store._write_json

    def boom(path, doc):
        if doc["node_type"] == "array":
            # the group's metadata is already on disk in the temporary directory at this point
            written.extend(p for p in os.listdir(tmp_path))
            raise RuntimeError("disk full")
        real_write_json(path, doc)

    monkeypatch.setattr(model_store, "_write_json", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        km.save(path)
    # it did write, elsewhere (beside the output's lock file, .model.zarr.lock, held meanwhile)
    assert written and all(".tmp-" in p or p == ".model.zarr.lock" for p in written), written
    assert not os.path.exists(path)
    assert listing(tmp_path) == []


def test_failed_save_keeps_previous_model(tmp_path, model, monkeypatch, client):
    X, km = model
    path = str(tmp_path / "model.zarr")
    km.save(path)

    def boom(obj):
        raise RuntimeError("disk full")

    other = KMeans(2, init="random", random_state=0, client=client).fit(X)
    monkeypatch.setattr(model_store, "jsonable", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        other.save(path)
    monkeypatch.undo()
    assert listing(tmp_path) == ["model.zarr"]
    loaded = daskmeans.load(path)
    assert loaded.n_clusters == 5
    np.testing.assert_array_equal(loaded.cluster_centers_, km.cluster_centers_)


def test_save_errors(tmp_path, model):
    X, km = model
    with pytest.raises(DataError, match="does not exist"):
        km.save(str(tmp_path / "no" / "such" / "dir" / "m.zarr"))
    with pytest.raises(daskmeans.NotFittedError):
        KMeans(3).save(str(tmp_path / "m.zarr"))
    assert listing(tmp_path) == []


def test_load_errors(tmp_path, data):
    with pytest.raises(DataError, match="no such model"):
        daskmeans.load(str(tmp_path / "missing.zarr"))
    path = str(tmp_path / "notmodel.zarr")
    zarr.open_group(path, mode="w").create_array("x", data=data)
    with pytest.raises(DataError, match="is not a daskmeans model"):
        daskmeans.load(path)
    path2 = str(tmp_path / "future.zarr")
    g = zarr.open_group(path2, mode="w")
    g.create_array("cluster_centers", data=data[:3])
    g.attrs.update({"format": "daskmeans-model", "format_version": 99})
    with pytest.raises(DataError, match="format_version=99"):
        daskmeans.load(path2)


@pytest.mark.parametrize("name", [None, "labels"])
def test_write_array_round_trip(tmp_path, name):
    """Without ``name`` the path is the array itself; with it, a group holding the array."""
    labels = da.concatenate([da.arange(0, 7, chunks=7), da.arange(7, 30, chunks=10)]).astype(np.int32)
    assert len(set(labels.chunks[0])) > 1  # irregular on purpose
    path = str(tmp_path / "labels.zarr")
    model_store.write_array(labels, path, name=name)
    arr = zarr.open_array(path, mode="r") if name is None else zarr.open_group(path, mode="r")[name]
    assert arr.dtype == np.int32
    np.testing.assert_array_equal(arr[...], np.arange(30))
    assert listing(tmp_path) == ["labels.zarr"]


def test_write_array_2d_readable_and_failure_leaves_nothing(tmp_path, monkeypatch, data):
    path = str(tmp_path / "x.zarr")
    model_store.write_array(da.from_array(data, chunks=(300, 5)), path)
    np.testing.assert_array_equal(read(path).compute(), data)

    running = []

    def third_block_fails(block, block_info=None):
        i = block_info[0]["chunk-location"][0]
        if i == 2:
            raise RuntimeError("worker died")
        running.append(i)
        time.sleep(0.2)  # still under way when the third block fails
        running.remove(i)
        return block

    # The other blocks are written (or being written) when one fails: the error comes once
    # none is still under way, and all of it goes. (On Dask's threads: a default client that
    # other tests' estimators started would run the blocks in its worker processes.)
    failing = da.from_array(data, chunks=(300, 5)).map_blocks(third_block_fails, dtype=data.dtype)
    with dask.config.set(scheduler="threads"), pytest.raises(RuntimeError, match="worker died"):
        model_store.write_array(failing, str(tmp_path / "y.zarr"))
    assert running == []
    assert listing(tmp_path) == ["x.zarr"]


def test_a_block_write_after_the_output_was_abandoned_leaves_nothing(tmp_path):
    """A write a worker starts, or finishes, after the client removed the temporary directory
    (the client cannot stop a task already running on a worker) leaves no directory behind."""
    root = str(tmp_path / ".y.zarr.tmp")
    zarr.create_array(root, shape=(10, 2), chunks=(5, 2), dtype="f8")
    model_store._write_block(np.ones((5, 2)), root, None, (0, 0))
    np.testing.assert_array_equal(zarr.open_array(root)[:5], 1)
    shutil.rmtree(root)
    model_store._write_block(np.ones((5, 2)), root, None, (5, 0))  # started after the removal
    assert listing(tmp_path) == []

    zarr.create_array(root, shape=(10, 2), chunks=(5, 2), dtype="f8")
    real_open = zarr.open_array

    def removed_while_opening(*a, **k):  # removed between the check and the chunk's write
        arr = real_open(*a, **k)
        shutil.rmtree(root)
        return arr

    with mock.patch.object(zarr, "open_array", removed_while_opening):
        model_store._write_block(np.ones((5, 2)), root, None, (5, 0))
    assert listing(tmp_path) == []


# The block write that stalls, and what happened in which order (module-level: the blocks'
# functions go to the workers by reference).
_STALL = {"started": threading.Event(), "order": [], "root": None}


class _Stalled:
    """A block whose values come only once the failed write's metadata is gone: its write is
    under way (it has opened the array) when the other block fails."""

    def __init__(self, a):
        self.a, self.shape, self.dtype, self.ndim = a, a.shape, a.dtype, a.ndim

    def __array__(self, dtype=None, copy=None):
        _STALL["started"].set()
        while any(_STALL["root"].glob(".y.zarr.tmp-*/zarr.json")):  # until the failure's clean-up began
            time.sleep(0.005)
        _STALL["order"].append("write ended")
        return self.a


def _stall_first_fail_second(b, block_info=None):
    if block_info[0]["chunk-location"][0] == 0:
        return _Stalled(b)
    assert _STALL["started"].wait(30)
    raise RuntimeError("the disk is gone")


def test_a_failed_write_removes_its_directory_once_no_block_write_runs(tmp_path):
    """Issue 45's CI: ``predict`` stopped by SIGTERM left a temporary labels directory. The
    command removed it while a block write still ran on an in-process worker, whose chunk
    recreated the directories, and the process ended before that write's own clean-up. Now a
    failed or interrupted write removes the metadata (writes starting later write nothing) and
    waits for the writes under way before it removes the directory, on a distributed client as
    on Dask's threads."""
    from distributed import Client, LocalCluster

    data = np.arange(60, dtype=np.float64).reshape(12, 5)
    x = da.from_array(data, chunks=(6, 5)).map_blocks(_stall_first_fail_second, dtype=data.dtype,
                                                      meta=np.empty((0, 5)))
    _STALL["root"] = tmp_path
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):
        for local in (False, True):  # on the client's workers, then on Dask's threads
            _STALL["started"].clear()
            _STALL["order"].clear()
            with dask.config.set(scheduler="threads" if local else None), \
                    pytest.raises(RuntimeError, match="the disk is gone"):
                try:
                    model_store.write_array(x, str(tmp_path / "y.zarr"))
                finally:
                    _STALL["order"].append("raised")
            assert _STALL["order"] == ["write ended", "raised"]
            assert listing(tmp_path) == []
            assert model_store.writes_under_way(str(tmp_path)) == 0


@pytest.mark.parametrize("kind", ["zarr", "npy"])
def test_split_for_more_workers_reads_only_each_parts_rows(tmp_path, kind):
    """Data read in fewer chunks than workers is read again in smaller chunks, so that each
    part reads its own rows only (the storage tier reads every part every pass), bit for bit
    what a rechunk gives; with its first Zarr chunk gone, every other part still reads."""
    from daskmeans.engine.plan import balance_chunks

    x = np.arange(8000 * 3, dtype=np.float32).reshape(8000, 3)
    if kind == "zarr":
        path = str(tmp_path / "x.zarr")
        zarr.create_array(path, data=x, chunks=(250, 3))
    else:
        path = str(tmp_path / "x.npy")
        np.save(path, x)
    X = read(path)  # the default chunk size holds all 8000 rows: one chunk
    assert X.numblocks[0] == 1
    parts = balance_chunks(X, 4)
    assert parts.numblocks[0] >= 4 and parts.chunks == X.rechunk({0: parts.chunks[0][0]}).chunks
    assert not any("rechunk" in str(k) for k in dict(parts.__dask_graph__()))
    np.testing.assert_array_equal(parts.compute(scheduler="sync"), x)
    if kind == "zarr":
        os.remove(tmp_path / "x.zarr" / "c" / "0" / "0")  # rows 0 to 249
        off = parts.chunks[0][0]
        np.testing.assert_array_equal(parts[off:].compute(scheduler="sync"), x[off:])
        with pytest.raises(DataError, match=r"c/0/0 .*is missing"):
            parts.blocks[0].compute(scheduler="sync")


# ---------------------------------------------------------------- CSV: parallel blocks, float32


def _write_csv(path, x, header=None, newline="\n", last_newline=True, fmt="%.18e", delimiter=","):
    """``x`` as text as ``np.savetxt`` writes it (default format ``%.18e``), with the given
    line ending, with or without a header line and a line break after the last line."""
    lines = ([delimiter.join(header)] if header else []) + [delimiter.join(fmt % v for v in row) for row in x]
    text = newline.join(lines) + (newline if last_newline else "")
    if str(path).endswith(".gz"):
        import gzip

        with gzip.open(path, "wt", newline="") as f:
            f.write(text)
    else:
        with open(path, "w", newline="") as f:
            f.write(text)
    return str(path)


def test_csv_toy_read_exactly_as_float32(tmp_path):
    path = tmp_path / "toy.csv"
    path.write_text("x,y,z\n1,2.5,-3\n0.1,1e3,-2.5E-2\n\n4,  5,6\n7,8,9\n\n\n")
    x = read(str(path))
    assert x.dtype == np.float32 and x.shape == (4, 3) and x.chunks == ((4,), (3,))
    got = x.compute()
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, np.array([[1, 2.5, -3], [0.1, 1e3, -2.5e-2], [4, 5, 6], [7, 8, 9]], np.float32))
    np.testing.assert_array_equal(read(str(path), columns=["z", "x"]).compute(), got[:, [2, 0]])


@pytest.mark.parametrize("header", [False, True])
@pytest.mark.parametrize("newline,last_newline", [("\n", True), ("\r\n", True), ("\n", False), ("\r\n", False)])
def test_csv_blocks_equal_loadtxt(tmp_path, header, newline, last_newline):
    """A file cut into many blocks (a small ``daskmeans.chunk-bytes``) reads as numpy.loadtxt,
    every chunk's length known, whatever the line ending and the last line."""
    import dask

    x = np.random.default_rng(3).standard_normal((997, 7))
    path = _write_csv(tmp_path / "x.csv", x, header=list("abcdefg") if header else None, newline=newline,
                      last_newline=last_newline)
    expected = np.loadtxt(path, delimiter=",", skiprows=int(header)).astype(np.float32)
    with dask.config.set({"daskmeans.chunk-bytes": 10_000}):  # about 50 lines a block
        X = read(path)
    assert X.dtype == np.float32 and X.shape == x.shape
    assert X.numblocks[0] > 10 and not any(np.isnan(c) for c in X.chunks[0]) and sum(X.chunks[0]) == len(x)
    np.testing.assert_array_equal(X.compute(), expected)
    np.testing.assert_array_equal(X.blocks[3].compute(), expected[sum(X.chunks[0][:3]):sum(X.chunks[0][:4])])


@pytest.mark.parametrize("header", [False, True])
def test_csv_gzip_equals_loadtxt(tmp_path, header):
    """A compressed file cannot be cut: one chunk of known length, the same values."""
    x = np.random.default_rng(4).standard_normal((500, 4))
    path = _write_csv(tmp_path / "x.csv.gz", x, header=list("abcd") if header else None, newline="\r\n")
    X = read(path, chunk_bytes=1000)
    assert X.chunks == ((500,), (4,))
    np.testing.assert_array_equal(X.compute(), np.loadtxt(path, delimiter=",", skiprows=int(header)).astype(np.float32))


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_csv_blank_lines_anywhere(tmp_path, monkeypatch, suffix):
    """Blank lines (LF or CRLF) before, between and after the rows, where a block or a counting
    task's bytes start, and lines of whitespace after the last row, are skipped as before: the
    chunk lengths count rows, not line breaks."""
    import gzip

    import dask

    from daskmeans.io import csv_reader

    monkeypatch.setattr(csv_reader, "_COUNT_BYTES", 7)  # line breaks counted 7 bytes a call
    monkeypatch.setattr(csv_reader, "_PIECE_BYTES", 5)  # a piece parsed per line or so
    rows = [f"{i},{-i - 0.5}" for i in range(300)]
    text = "a,b\n\n" + "".join(r + ("\n\n\r\n" if i % 7 == 0 else "\n") for i, r in enumerate(rows)) + "\n\r\n \n\t\n"
    path = str(tmp_path / f"b{suffix}")
    with (gzip.open if suffix.endswith(".gz") else open)(path, "wt", newline="") as f:
        f.write(text)
    expected = np.array([[i, -i - 0.5] for i in range(300)], np.float32)
    for cb in (40, 333, 10**6):
        with dask.config.set({"daskmeans.chunk-bytes": cb}):
            X = read(path)
        assert X.shape == (300, 2)
        np.testing.assert_array_equal(X.compute(), expected)
    # A line of whitespace between rows is named, not read as a row or skipped silently.
    with open(path.replace(".gz", "") + ".ws.csv", "w") as f:
        f.write("a,b\n1,2\n  \n3,4\n")
    with pytest.raises(DataError, match=r"ws.csv: line 3 holds whitespace alone, which cannot be read: delete it"):
        read(path.replace(".gz", "") + ".ws.csv").compute()


def test_csv_dtype_option(tmp_path):
    from daskmeans.errors import InvalidParameterError

    x = np.random.default_rng(5).standard_normal((50, 3))
    path = _write_csv(tmp_path / "x.csv", x)
    X = read(path, dtype="float64")
    assert X.dtype == np.float64
    np.testing.assert_array_equal(X.compute(), np.loadtxt(path, delimiter=","))
    import dask

    with dask.config.set({"daskmeans.csv-dtype": "float64"}):
        assert read(path).dtype == np.float64
    np.save(tmp_path / "x.npy", x)
    assert read(str(tmp_path / "x.npy"), dtype=np.float32).dtype == np.float32  # any source
    with pytest.raises(InvalidParameterError, match=r"dtype='int8' should be float32 or float64"):
        read(path, dtype="int8")


def test_csv_odd_rows_in_a_late_block(tmp_path):
    """Cells pyarrow's parser refuses, far into the file, read as pandas read them (a short
    row gives NaN, ' 1.5' a number), and a word is named with its line in the file."""
    import dask

    lines = [f"{i},{i}.25,{2 * i}" for i in range(2000)]
    lines[1500] = "7,  8.5"  # short row: the last cell is NaN
    lines[1700] = "None, 1.5 ,3"
    (tmp_path / "odd.csv").write_text("a,b,c\n" + "\n".join(lines) + "\n")
    with dask.config.set({"daskmeans.chunk-bytes": 2000}):
        X = read(str(tmp_path / "odd.csv"))
        got = X.compute()
        assert X.numblocks[0] > 10 and got.shape == (2000, 3)
        np.testing.assert_array_equal(got[1500], [7, 8.5, np.nan])
        np.testing.assert_array_equal(got[1700], [np.nan, 1.5, 3])
        np.testing.assert_array_equal(got[1999], [1999, 1999.25, 3998])
        lines[1800] = "1,2,oops"
        (tmp_path / "bad.csv").write_text("a,b,c\n" + "\n".join(lines) + "\n")
        # The sample parsed in the client (the first MiB) holds it all: refused by read().
        with pytest.raises(DataError, match=r"column 'c' of .*bad.csv is not numeric \(line 1802 has 'oops'\)"):
            read(str(tmp_path / "bad.csv"))


def test_csv_non_numeric_past_the_sample_names_its_line(tmp_path):
    n = 120_000  # about 1.5 MB: past the 1 MiB sample parsed in the client
    lines = [f"{i},{i}.5" for i in range(n)]
    lines[n - 10] = f"{n},word"
    (tmp_path / "late.csv").write_text("a,b\n" + "\n".join(lines) + "\n")
    assert os.path.getsize(tmp_path / "late.csv") > 1.2 * 2**20
    X = read(str(tmp_path / "late.csv"), chunk_bytes=100_000)
    assert X.numblocks[0] > 10
    with pytest.raises(DataError, match=rf"column 'b' of .*late.csv is not numeric \(line {n - 10 + 2} has 'word'\)"):
        X.compute()


def test_csv_whitespace_runs(tmp_path):
    """Space-delimited files with runs of spaces and leading spaces (aligned columns) read as
    before; a plain single-space file reads the same."""
    x = np.array([[1.5, -2, 3], [10, 20.25, -30], [0.5, 0, 7]])
    (tmp_path / "aligned.txt").write_text("".join("  " + "   ".join(f"{v:8.3f}" for v in r) + "  \n" for r in x))
    np.testing.assert_array_equal(read(str(tmp_path / "aligned.txt")).compute(), x.astype(np.float32))
    np.savetxt(tmp_path / "plain.txt", x)
    np.testing.assert_array_equal(read(str(tmp_path / "plain.txt")).compute(), x.astype(np.float32))


def test_csv_changed_after_read_is_refused(tmp_path):
    path = _write_csv(tmp_path / "x.csv", np.ones((20, 2)))
    X = read(path)
    with open(path, "a") as f:
        f.write("1,2\n")
    with pytest.raises(DataError, match=r"x.csv changed since it was opened: \d+ bytes, was \d+"):
        X.compute()


def test_csv_columns_as_a_comma_separated_string(labelled_csv, data):
    """``drop_columns="id,label"`` names two columns (as the CLI's --drop-columns), not one
    per character; a single name or position is one column."""
    data = data.astype(np.float32)
    np.testing.assert_array_equal(read(labelled_csv, drop_columns="label").compute(), data)
    np.testing.assert_array_equal(read(labelled_csv, drop_columns="label, e").compute(), data[:, :4])
    np.testing.assert_array_equal(read(labelled_csv, drop_columns="2,e").compute(), data[:, :4])
    np.testing.assert_array_equal(read(labelled_csv, columns="e,a").compute(), data[:, [4, 0]])
    np.testing.assert_array_equal(read(labelled_csv, columns=4).compute(), data[:, [3]])
    with pytest.raises(DataError, match=r"column 'zz' is not in .*t\.csv"):
        read(labelled_csv, drop_columns="label,zz")


def correctly_rounded_f32(text: str) -> np.float32:
    """The float32 nearest the decimal ``text`` (ties to even), from exact rational arithmetic."""
    from fractions import Fraction

    exact = Fraction(text)
    guess = np.float32(float(exact))
    best = None
    for cand in (np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))):
        err = abs(Fraction(float(cand)) - exact)
        if best is None or err < best[0] or (err == best[0] and int(cand.view(np.uint32)) % 2 == 0):
            best = (err, cand)
    return best[1]


def test_csv_values_parse_straight_to_float32_exactly(tmp_path):
    """Text is parsed straight to float32, correctly rounded: float32 values written as pyarrow
    writes them (shortest text) or with 9 digits come back bit for bit, extremes included
    (subnormals, the largest, -0), and decimals of 17 digits give their nearest float32 (a
    float64 parse then a cast can round twice)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((3000, 6)) * 10.0 ** rng.integers(-40, 38, (3000, 6))).astype(np.float32)
    x[0] = [np.finfo(np.float32).max, np.finfo(np.float32).tiny, np.float32(1e-45), -0.0, 1, -np.finfo(np.float32).max]
    x = x[:, :6]
    pcsv.write_csv(pa.table({f"f{j}": x[:, j] for j in range(6)}), tmp_path / "arrow.csv")
    got = read(str(tmp_path / "arrow.csv"), chunk_bytes=20_000)
    assert got.numblocks[0] > 4
    np.testing.assert_array_equal(got.compute().view(np.uint32), x.view(np.uint32))
    np.savetxt(tmp_path / "g9.csv", x, delimiter=",", fmt="%.9g")
    np.testing.assert_array_equal(read(str(tmp_path / "g9.csv")).compute().view(np.uint32), x.view(np.uint32))
    texts = [[f"{v:.16e}" for v in row] for row in rng.standard_normal((400, 3)) * 10.0 ** rng.integers(-30, 30, (400, 3))]
    (tmp_path / "d17.csv").write_text("".join(",".join(r) + "\n" for r in texts))
    expected = np.array([[correctly_rounded_f32(t) for t in r] for r in texts], np.float32)
    np.testing.assert_array_equal(read(str(tmp_path / "d17.csv")).compute().view(np.uint32), expected.view(np.uint32))
    # float64: the same text to the nearest double, as NumPy parses it
    np.testing.assert_array_equal(read(str(tmp_path / "d17.csv"), dtype="float64").compute(),
                                  np.array([[float(t) for t in r] for r in texts]))


@pytest.mark.parametrize("piece_bytes", [40, 1000, 8 << 20])
def test_csv_pieces_of_a_block_read_as_one(tmp_path, monkeypatch, piece_bytes):
    """A block parsed in pieces of whole lines (a few per core) reads the same whatever the
    pieces: rows in order, a piece pandas reads (a short row, ``' 1.5 '``) beside pieces
    pyarrow reads, and a bad cell or a line of whitespace named by its line in the file."""
    from daskmeans.io import csv_reader

    monkeypatch.setattr(csv_reader, "_PIECE_BYTES", piece_bytes)
    lines = [f"{i},{i}.25,{-2 * i}" for i in range(3000)]
    lines[1500] = "7,  8.5"
    lines[2900] = "None, 1.5 ,3"
    (tmp_path / "p.csv").write_text("a,b,c\n" + "\n".join(lines) + "\n")
    X = read(str(tmp_path / "p.csv"))
    assert X.numblocks[0] == 1
    expected = np.array([[i, i + 0.25, -2 * i] for i in range(3000)], np.float32)
    expected[1500], expected[2900] = [7, 8.5, np.nan], [np.nan, 1.5, 3]
    np.testing.assert_array_equal(X.compute(), expected)
    np.testing.assert_array_equal(read(str(tmp_path / "p.csv"), columns="c,a,c").compute(), expected[:, [2, 0, 2]])
    monkeypatch.setattr(csv_reader, "_PIECE_BYTES", max(piece_bytes, 20_000))  # 1.3 MB: 65 pieces or fewer
    n = 120_000  # past the sample parsed in the client
    late = [f"{i},{i}.5" for i in range(n)]
    late[n - 10] = f"{n},word"
    (tmp_path / "late.csv").write_text("a,b\n" + "\n".join(late) + "\n")
    with pytest.raises(DataError, match=rf"column 'b' of .*late.csv is not numeric \(line {n - 10 + 2} has 'word'\)"):
        read(str(tmp_path / "late.csv")).compute()
    late[n - 10] = "   "
    (tmp_path / "ws.csv").write_text("a,b\n" + "\n".join(late) + "\n")
    with pytest.raises(DataError, match=rf"ws.csv: line {n - 10 + 2} holds whitespace alone"):
        read(str(tmp_path / "ws.csv")).compute()


def test_csv_block_is_parsed_on_several_cores_from_one_thread(tmp_path, monkeypatch):
    """One Dask thread (a worker of one thread, as for one GPU) parses a block on several
    threads at once: two pieces wait for each other, which one thread alone cannot do."""
    import threading

    from daskmeans.io import csv_reader, ranges

    if ranges.cores() < 2:
        pytest.skip("one core")
    monkeypatch.setattr(csv_reader, "_PIECE_BYTES", 1000)
    both, calls, lock = threading.Barrier(2, timeout=30), [], threading.Lock()
    parse = csv_reader._parse_block

    def meeting(buf, spec, first_line, out):
        with lock:
            calls.append(threading.current_thread().name)
            first_two = len(calls) <= 2
        if first_two:
            both.wait()  # a BrokenBarrierError after 30 s if the pieces run one after another
        return parse(buf, spec, first_line, out)

    monkeypatch.setattr(csv_reader, "_parse_block", meeting)
    x = np.random.default_rng(2).standard_normal((2000, 4)).astype(np.float32)
    path = _write_csv(tmp_path / "x.csv", x, fmt="%.9g")
    np.testing.assert_array_equal(read(path).compute(scheduler="synchronous"), x)
    assert len(set(calls[:2])) == 2 and all(c.startswith("daskmeans-parse") for c in calls)


def test_formats_are_a_registry(tmp_path, monkeypatch, data):
    """A format is an entry of readers.FORMATS (suffixes, open function, its options): a raw
    float32 format added here is read by read(), with an option of its own, and split again
    from its file; an option of another format is refused naming the formats that take it."""
    from daskmeans.io import blocks, readers

    def raw_block(path, d, start, stop):
        return np.fromfile(path, np.float32, count=(stop - start) * d, offset=start * d * 4).reshape(-1, d)

    def open_raw(path, chunk_bytes, dtype=None, *, width=None):
        n = os.path.getsize(path) // (4 * width)
        return blocks.row_blocks(raw_block, (path, width), n, width, np.float32,
                                 blocks.rows_per_chunk(width, 4, chunk_bytes), align=1)

    raw = readers.Format("raw", (".f32",), open_raw, options=("width",))
    monkeypatch.setattr(readers, "FORMATS", readers.FORMATS + (raw,))
    x = data.astype(np.float32)
    x.tofile(tmp_path / "x.f32")
    assert readers.format_of(str(tmp_path / "x.f32")) is raw
    X = read(str(tmp_path / "x.f32"), chunk_bytes=4000, width=5)
    assert X.chunks[0] == (200,) * 5
    np.testing.assert_array_equal(X.compute(), x)
    parts = readers.split_rows(X, 100)
    assert parts.chunks[0] == (100,) * 10
    np.testing.assert_array_equal(parts.compute(), x)
    with pytest.raises(DataError, match=r"delimiter=';' applies to CSV input only, not to .*x\.f32"):
        read(str(tmp_path / "x.f32"), delimiter=";", width=5)
    path = _write_csv(tmp_path / "x.csv", x)
    with pytest.raises(DataError, match=r"dataset='a' applies to Zarr input only, not to .*x\.csv"):
        read(path, dataset="a")
    with pytest.raises(DataError, match=r"width=5 applies to raw input only, not to .*x\.csv"):
        read(path, width=5)
    monkeypatch.undo()
    with pytest.raises(TypeError, match=r"read\(\) got an unexpected keyword argument 'width'"):
        read(path, width=5)


# ---------------------------------------------------------------- labels outputs (issue 47)


@pytest.mark.parametrize("suffix", [".npy", ".csv", ".parquet", ".zarr"])
def test_write_labels_by_suffix_without_a_client(tmp_path, suffix):
    """Each format written chunk by chunk on Dask's threads (no distributed client), read back
    by its own reader, and recognised as daskmeans' labels (what --overwrite replaces)."""
    from daskmeans.io.labels import labels_output, write_labels
    from daskmeans.io.paths import describe, is_kind

    labels = da.from_array(np.arange(1000, dtype=np.int32) % 7, chunks=130)
    path = str(tmp_path / f"l{suffix}")
    with dask.config.set(scheduler="threads"):
        write_labels(labels, labels_output(path))
    got = {".npy": lambda: np.load(path), ".csv": lambda: pd.read_csv(path)["label"].to_numpy(),
           ".parquet": lambda: pd.read_parquet(path)["label"].to_numpy(),
           ".zarr": lambda: zarr.open_group(path, mode="r")["labels"][:]}[suffix]()
    np.testing.assert_array_equal(got, labels.compute())
    assert is_kind(path, "labels") and describe(path) == "a daskmeans labels output"
    assert listing(tmp_path) == [f"l{suffix}"]  # no temporary, no lock file


def test_labels_files_are_recognised_by_content(tmp_path):
    from daskmeans.io.paths import is_labels_file

    np.save(tmp_path / "ok.npy", np.zeros(5, np.int32))
    np.save(tmp_path / "f.npy", np.zeros(5, np.float32))
    np.save(tmp_path / "two.npy", np.zeros((5, 1), np.int32))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "ok.npy").read_bytes()[:-4])  # a truncated array
    (tmp_path / "ok.csv").write_text("id,label\nu1,3\n")
    (tmp_path / "empty.csv").write_text("label\n")
    (tmp_path / "words.csv").write_text("id,label\nu1,cat\n")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    pd.DataFrame({"label": np.zeros(3, np.int32)}).to_parquet(tmp_path / "user.parquet")
    found = {p: is_labels_file(str(tmp_path / p)) for p in sorted(os.listdir(tmp_path))}
    assert found == {"cut.npy": False, "empty.csv": True, "f.npy": False, "ok.csv": True, "ok.npy": True,
                     "other.csv": False, "two.npy": False, "user.parquet": False, "words.csv": False}


def test_labels_output_refusals(tmp_path):
    from daskmeans import DaskmeansError
    from daskmeans.io.labels import labels_output
    from daskmeans.io.readers import read_table

    with pytest.raises(DaskmeansError, match=r"^cannot write labels to .*l\.txt: its suffix should be one of \.zarr, "
                                             r"\.npy, \.csv, \.parquet \(no suffix: Zarr\)$"):
        labels_output(str(tmp_path / "l.txt"))
    assert labels_output(str(tmp_path / "plain")).format == "zarr"
    with pytest.raises(DaskmeansError, match="applies to CSV input only, not to data in memory"):
        labels_output(str(tmp_path / "l.csv"), ["id"], read_table(np.zeros((3, 2))))
