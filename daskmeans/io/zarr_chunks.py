"""Rows of a Zarr array in a local store, its chunks decompressed straight into the rows' array.

zarr-python decodes the chunks of one read one after another, each into a buffer of its own
that it then copies into the result, a fraction of the rate the store's files are read at
(docs/performance.md, "Zarr reads"). Here each chunk's file is read and decompressed by numcodecs
(the codecs zarr-python itself calls) into the block's rows, several chunks at once on the
readers' threads (the codecs release the interpreter lock).

Only arrays whose chunks are plainly C-order rows are read this way (:func:`layout`): a local
store, no sharding, little-endian or one-byte values, and the codecs ``bytes`` then at most one
of ``zstd`` or ``blosc`` (format 3), or no filters, C order and a Zstd or Blosc compressor or
none (format 2). Any other array is read by zarr-python.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError
from .ranges import in_threads, read_into


@dataclass(frozen=True)
class Layout:
    """Where a Zarr array's chunks are and how they decode.

    Attributes
    ----------
    array : zarr.Array
        The opened array (its chunk keys).
    chunks : tuple of int
        Rows and columns of a chunk (edge chunks are stored whole, padded).
    codec : numcodecs codec or None
        Decompresses a chunk's bytes; None: the bytes are the values.
    """

    array: Any
    chunks: tuple[int, int]
    codec: Any


def layout(arr: Any) -> Layout | None:
    """How to read ``arr``'s chunks directly, or None where zarr-python should."""
    import numcodecs

    if chunk_file(arr, "") is None or getattr(arr, "shards", None) is not None:
        return None
    dtype = np.dtype(arr.dtype)
    if dtype.itemsize > 1 and (dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder != "little")):
        return None
    meta = arr.metadata
    codec = False  # not readable here unless one of the cases below says otherwise
    if meta.zarr_format == 3:
        from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec

        codecs = list(meta.codecs)
        if codecs and isinstance(codecs[0], BytesCodec) and getattr(codecs[0].endian, "value", codecs[0].endian) in (
                None, "little"):
            rest = codecs[1:]
            if not rest:
                codec = None
            elif len(rest) == 1 and isinstance(rest[0], ZstdCodec):
                codec = numcodecs.Zstd(level=rest[0].level, checksum=rest[0].checksum)
            elif len(rest) == 1 and isinstance(rest[0], BloscCodec):
                codec = numcodecs.Blosc()  # the parameters travel in each chunk's header
    elif meta.zarr_format == 2 and not meta.filters and meta.order == "C":
        if meta.compressor is None or isinstance(meta.compressor, (numcodecs.Zstd, numcodecs.Blosc)):
            codec = meta.compressor
    if codec is False:
        return None
    return Layout(arr, (int(arr.chunks[0]), int(arr.chunks[1])), codec)


def chunk_file(arr: Any, key: str) -> str | None:
    """The file of ``arr``'s stored object ``key`` where its store is a local directory
    (None for other stores)."""
    import zarr.storage

    sp = arr.store_path
    if not isinstance(sp.store, zarr.storage.LocalStore):
        return None
    return os.path.join(str(sp.store.root), *[p for p in f"{sp.path}/{key}".split("/") if p])


def read_rows(lay: Layout, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rows ``start:stop`` of the array, its chunks read and decompressed on the readers'
    threads, straight into the result where a chunk's rows all fall in it.

    Parameters
    ----------
    lay : Layout
    start, stop : int
    out : ndarray (stop - start, n_features) of the array's dtype, C-contiguous, optional
        Where the rows go (the caller's buffer); a new array where None.

    Returns
    -------
    ndarray (stop - start, n_features)
        ``out``, or the new array.

    Raises
    ------
    DataError
        A chunk file holds the wrong number of bytes (or decompresses to them).
    ValueError
        ``out`` is not a C-contiguous array of that shape and dtype.
    """
    arr = lay.array
    n, d = (int(s) for s in arr.shape)
    zrows, zcols = lay.chunks
    dtype = np.dtype(arr.dtype)
    if out is None:
        out = np.empty((stop - start, d), dtype)
    elif out.shape != (stop - start, d) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"rows {start}:{stop} go into a C-contiguous {dtype} array of shape {(stop - start, d)}, "
                         f"got {out.dtype} {out.shape}")
    chunk_bytes = zrows * zcols * dtype.itemsize
    tasks = [(i, j) for i in range(start // zrows, -(-stop // zrows)) for j in range(-(-d // zcols))]

    def one(task: tuple[int, int]) -> None:
        i, j = task
        r0, c0 = i * zrows, j * zcols
        a, b = max(start, r0), min(stop, r0 + zrows, n)
        c1 = min(d, c0 + zcols)
        path = chunk_file(arr, arr.metadata.encode_chunk_key((i, j)))
        whole = zcols == d and a == r0 and b == r0 + zrows  # the chunk is rows a:b of out, as stored
        dest = out[a - start:b - start].reshape(-1).view(np.uint8) if whole else np.empty(chunk_bytes, np.uint8)
        _fill(lay.codec, path, dest)
        if not whole:
            out[a - start:b - start, c0:c1] = dest.view(dtype).reshape(zrows, zcols)[a - r0:b - r0, : c1 - c0]

    in_threads(one, tasks)
    return out


def _fill(codec: Any, path: str, dest: np.ndarray) -> None:
    """``dest`` (the bytes of one whole chunk) from the chunk file ``path``: read into it, or
    decompressed into it from the file's pages mapped in memory (no copy of the compressed
    bytes; as with any reader, a file cut short while it is read is not survived); a
    DataError unless the chunk holds exactly ``dest``'s size."""
    size, on_disk = dest.size, os.path.getsize(path)
    if codec is None:
        got = on_disk
        if got == size:
            read_into(path, 0, memoryview(dest))
    elif on_disk == 0:
        got = 0
    else:
        with open(path, "rb") as f:
            try:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # a file system that maps no files
                got = _decode(codec, f.read(), dest, path)
            else:
                with data:
                    got = _decode(codec, data, dest, path)
    if got != size:
        raise DataError(f"Zarr chunk {path} holds {got} bytes of values, {size} expected: the chunk is damaged")


def _decode(codec: Any, data: Any, dest: np.ndarray, path: str) -> int:
    """Decompress ``data`` into ``dest``; returns the size it decompresses to. Straight into
    ``dest`` where its header states ``dest``'s size; refused without decompressing where the
    header states more (or, Blosc, any other size); otherwise (no stated size, a leading
    skippable frame, or several Zstd frames, whose first states only its own) on its own,
    then checked."""
    try:
        stated, whole = _content_size(codec, data)
    except ValueError as e:
        raise DataError(f"Zarr chunk {path} is damaged: {e}") from None
    if stated == dest.size:
        codec.decode(data, out=dest)
        return stated
    if stated is not None and (whole or stated > dest.size):
        return stated
    raw = np.frombuffer(codec.decode(data), np.uint8)
    if raw.size == dest.size:
        dest[...] = raw
    return raw.size


def _content_size(codec: Any, data: Any) -> tuple[int | None, bool]:
    """The decompressed size a chunk's header states, or None, and whether that is the whole
    chunk's (Blosc) or possibly only its first frame's (Zstd); a ValueError for a header that
    cannot be one."""
    import numcodecs

    if isinstance(codec, numcodecs.Blosc):
        # The 16-byte Blosc header: version, version of the codec, flags, type size, then the
        # uncompressed bytes, block size and compressed bytes (uint32, little-endian).
        if len(data) < 16 or struct.unpack_from("<I", data, 12)[0] > len(data):
            raise ValueError("it is shorter than its Blosc header says")
        return int(struct.unpack_from("<I", data, 4)[0]), True
    return _zstd_content_size(data), False


def _zstd_content_size(data: Any) -> int | None:
    """Frame_Content_Size of the Zstandard frame ``data`` starts with (RFC 8878, 3.1.1.1), or
    None where the frame leaves it out or ``data`` starts with a skippable frame."""
    if len(data) < 6:
        raise ValueError("it is too short for a Zstandard frame")
    magic = struct.unpack_from("<I", data)[0]
    if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame (RFC 8878, 3.1.2)
        return None
    if magic != 0xFD2FB528:
        raise ValueError("it is not a Zstandard frame")
    fhd = data[4]
    fcs_flag, single_segment, did_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[did_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        return None
    if len(data) < at + width:
        raise ValueError("its Zstandard frame header is cut short")
    value = int.from_bytes(data[at:at + width], "little")
    return value + 256 if width == 2 else value
