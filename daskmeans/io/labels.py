"""Labels outputs, in the format their path's suffix names (:data:`daskmeans.options.LABEL_SUFFIXES`):

- ``.zarr`` (or no suffix): a Zarr group holding the int32 array ``labels``, written by the
  workers chunk by chunk (:func:`daskmeans.io.model_store.write_array`);
- ``.npy``: a 1-D int32 array (``numpy.load``);
- ``.csv``: a column ``label``, after the input's columns kept by name (``--keep-columns``: an
  id, as written in the input CSV, in the same row order); ``pandas.read_csv``;
- ``.parquet``: the same columns (the kept ones typed as the reader's sample of them: int64,
  float64, else text; ``label`` int32), one row group per chunk, marked as daskmeans' labels
  in the file's metadata; needs pyarrow's Parquet module.

The three files are written by the client in row order, one chunk at a time: the workers
compute each chunk's labels (and format a CSV chunk's text) a few chunks ahead, so the client
holds a few chunks, never the whole array. Each output is written to a temporary sibling and
renamed into place under its lock (:func:`daskmeans.io.paths.atomic_file`): a failure or an
interrupt leaves nothing behind. ``--overwrite`` replaces only daskmeans labels (the rule for
each format: :func:`daskmeans.io.paths.is_labels_file`).
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import dask
import dask.array as da
import numpy as np

from ..errors import DaskmeansError, DataError
from ..options import LABEL_SUFFIXES, label_format
from ..events import advance, step
from .blocks import Table
from .paths import FORMATS, atomic_file

LABEL = "label"  # the labels' column in CSV and Parquet outputs
PARQUET_KEY = b"format"  # the Parquet file metadata that marks daskmeans' labels (value FORMATS["labels"])


@dataclass(frozen=True)
class LabelsOutput:
    """Where and how labels are written, checked before any work (:func:`labels_output`).

    Attributes
    ----------
    path : str
    format : {"zarr", "npy", "csv", "parquet"}
    keep : tuple or None
        ``(names, dtypes, blocks)`` of the input's columns written beside the labels
        (:attr:`~daskmeans.io.blocks.Table.other_columns`), or None.
    rows : tuple of int or None
        The rows of each of ``keep``'s blocks (the input's row chunks).
    """

    path: str
    format: str
    keep: tuple[list[str], list[str], list[Any]] | None = None
    rows: tuple[int, ...] | None = None


def labels_output(path: str, keep_columns: Sequence[str | int] | None = None, table: Table | None = None) -> LabelsOutput:
    """The labels output at ``path``, checked: its suffix, what writing it needs, and the
    columns to keep beside the labels (read by name from ``table``, the input).

    Parameters
    ----------
    path : str
        Its suffix names the format (see the module); no suffix: Zarr.
    keep_columns : sequence of str or int, optional
        Columns of the input CSV (names or positions) written before ``label``.
    table : Table, optional
        The input, as :func:`daskmeans.io.readers.read_table` opened it (needed with
        ``keep_columns``).

    Raises
    ------
    DaskmeansError
        An unknown suffix; ``keep_columns`` with a ``.zarr``/``.npy`` output or input that is
        not a CSV file; a ``.parquet`` output without pyarrow's Parquet module.
    DataError
        A column to keep that is not in the input.
    """
    path = os.fspath(path)
    fmt = label_format(path)
    if fmt is None:
        raise DaskmeansError(f"cannot write labels to {path}: its suffix should be one of "
                             f"{', '.join(LABEL_SUFFIXES)} (no suffix: Zarr)")
    if fmt == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError as e:
            raise DaskmeansError(f"cannot write {path}: Parquet needs pyarrow with its parquet module ({e}); write "
                                 f".csv or .npy labels instead") from None
    if not keep_columns:
        return LabelsOutput(path, fmt)
    if fmt not in ("csv", "parquet"):
        raise DaskmeansError(f"--keep-columns writes columns beside the labels in a .csv or .parquet output, not "
                             f"{path}")
    if table is None or table.other_columns is None:
        source = "data in memory" if table is None or table.source is None else table.source
        raise DaskmeansError(f"--keep-columns applies to CSV input only, not to {source}")
    keep = table.other_columns(list(keep_columns))
    if LABEL in keep[0]:
        raise DataError(f"--keep-columns {','.join(map(str, keep_columns))}: the column {LABEL!r} would have the name "
                        f"of the labels' own column")
    return LabelsOutput(path, fmt, keep, tuple(int(c) for c in table.array.chunks[0]))


def write_labels(labels: da.Array, out: LabelsOutput) -> None:
    """Write ``labels`` (n,) int to ``out`` atomically, a chunk at a time (see the module).

    The blocks written are the step ``write labels`` of a command's progress.
    """
    if out.format == "zarr":
        from .model_store import write_array

        write_array(labels, out.path, name="labels", kind="labels")
        return
    labels = labels.astype(np.int32)
    if out.rows is not None:  # the kept columns' blocks are the input's chunks: the labels' too
        if sum(out.rows) != int(labels.shape[0]):
            raise DataError(f"{int(labels.shape[0])} labels for {sum(out.rows)} rows of the input")
        labels = labels.rechunk((out.rows,))
    blocks = list(labels.to_delayed().ravel())
    keep = out.keep[2] if out.keep is not None else [None] * len(blocks)
    part = {"npy": _npy_part, "csv": _csv_part, "parquet": _parquet_part}[out.format]
    types = None if out.keep is None else _arrow_types(out.keep[1]) if out.format == "parquet" else None
    parts = [dask.delayed(part, pure=True)(b, k, types) for b, k in zip(blocks, keep)]
    names = [] if out.keep is None else list(out.keep[0])
    with atomic_file(out.path, kind="labels") as tmp, step("write labels", total=len(parts), unit="blocks"):
        writer = {"npy": _NpyWriter, "csv": _CsvWriter, "parquet": _ParquetWriter}[out.format]
        with writer(tmp, int(labels.shape[0]), names, types) as w:
            for done, data in enumerate(_in_order(parts), 1):
                w.write(data)
                advance(done)


# ---------------------------------------------------------------- the parts, made on the workers


def _host(block: Any) -> np.ndarray:
    """A block of labels as a NumPy int32 array (a CuPy block copied to the host)."""
    if hasattr(block, "__cuda_array_interface__"):
        block = block.get()
    return np.ascontiguousarray(block, dtype="<i4")


def _npy_part(block: Any, keep: Any, types: Any) -> bytes:
    return _host(block).tobytes()


def _table(block: Any, keep: Any, types: Any) -> Any:
    """The kept columns (cast to ``types`` where given) and the labels, as a pyarrow Table."""
    import pyarrow as pa

    labels = pa.array(_host(block), pa.int32())
    if keep is None:
        return pa.table([labels], names=[LABEL])
    if keep.num_rows != len(labels):
        raise DataError(f"{keep.num_rows} rows of kept columns for {len(labels)} labels")
    columns = list(keep.columns)
    if types is not None:
        for i, t in enumerate(types):
            if t is not None:
                try:
                    columns[i] = columns[i].cast(t)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise DataError(f"column {keep.column_names[i]!r} holds a value that is not {t} like its first "
                                    f"rows ({str(e).strip()}): write the labels as .csv, which keeps the text as "
                                    f"it is") from None
    return pa.table(columns + [labels], names=keep.column_names + [LABEL])


def _csv_part(block: Any, keep: Any, types: Any) -> bytes:
    """The chunk's lines of CSV (no header): the kept values as read, quoted only where a
    value needs it (Python's and pandas' QUOTE_MINIMAL; pyarrow quotes every string)."""
    labels = _host(block)
    if keep is None:  # labels alone: one integer a line
        return "".join(f"{v}\n" for v in labels.tolist()).encode()
    import pandas as pd

    if keep.num_rows != len(labels):
        raise DataError(f"{keep.num_rows} rows of kept columns for {len(labels)} labels")
    frame = pd.DataFrame({i: c.to_numpy(zero_copy_only=False) for i, c in enumerate(keep.columns)})
    frame[len(keep.columns)] = labels
    return frame.to_csv(header=False, index=False, lineterminator="\n").encode()


def _parquet_part(block: Any, keep: Any, types: Any) -> Any:
    return _table(block, keep, types)


def _arrow_types(dtypes: Sequence[str]) -> list[Any]:
    """pyarrow types of kept columns for Parquet, from their NumPy dtypes in the reader's
    sample: integers int64, floats float64, anything else text (None: left as read)."""
    import pyarrow as pa

    return [pa.int64() if d.startswith(("int", "uint")) else pa.float64() if d.startswith("float") else None
            for d in dtypes]


# ---------------------------------------------------------------- the writers, on the client


class _NpyWriter:
    """A 1-D int32 ``.npy`` file: its header for ``n`` rows, then each chunk's bytes in order."""

    def __init__(self, path: str, n: int, names: list[str], types: Any):
        self.f = open(path, "wb")
        np.lib.format.write_array_header_1_0(self.f, {"descr": "<i4", "fortran_order": False, "shape": (n,)})

    def write(self, data: bytes) -> None:
        self.f.write(data)

    def __enter__(self) -> "_NpyWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()


class _CsvWriter(_NpyWriter):
    """A CSV file: its header (the kept columns' names, then ``label``), then each chunk's lines."""

    def __init__(self, path: str, n: int, names: list[str], types: Any):
        import csv
        import io

        self.f = open(path, "wb")
        header = io.StringIO()
        csv.writer(header, lineterminator="\n").writerow(names + [LABEL])
        self.f.write(header.getvalue().encode())


class _ParquetWriter:
    """A Parquet file of one row group per chunk, marked as daskmeans' labels."""

    def __init__(self, path: str, n: int, names: list[str], types: Any):
        import pyarrow as pa
        import pyarrow.parquet as pq

        fields = [(c, t if t is not None else pa.string()) for c, t in zip(names, types or [])] + [(LABEL, pa.int32())]
        self.schema = pa.schema(fields, metadata={PARQUET_KEY: FORMATS["labels"].encode()})
        self.w = pq.ParquetWriter(path, self.schema)

    def write(self, table: Any) -> None:
        self.w.write_table(table.replace_schema_metadata(self.schema.metadata))

    def __enter__(self) -> "_ParquetWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.w.close()


def _in_order(parts: list) -> Iterator[Any]:
    """The results of ``parts`` (delayed) in order, a few computed ahead: on the distributed
    client when there is one (as many ahead as twice its workers; those not yet taken are
    cancelled on a failure or an interrupt), else one at a time on Dask's threads."""
    try:
        from distributed import get_client

        if dask.config.get("scheduler", None) not in (None, "dask.distributed", "distributed"):
            raise ValueError("a local scheduler is configured")
        client = get_client()
    except (ImportError, ValueError):
        for p in parts:
            yield dask.compute(p, scheduler="threads")[0]
        return
    ahead = max(2, 2 * len(client.nthreads()))
    pending: collections.deque = collections.deque()
    todo = iter(parts)
    try:
        for p in todo:
            pending.append(client.compute(p))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        if pending:
            client.cancel(list(pending), force=True)
