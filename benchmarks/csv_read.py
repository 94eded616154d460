"""``python -m benchmarks csv-read``: reading P1 from CSV, against pyarrow's own floor.

Writes P1 (1e6 x 100 float32, scikit-learn's ``make_classification``; standard normal where
scikit-learn is missing) as ``pyarrow.csv.write_csv`` writes it (a quoted header, each value
its shortest float32 text: about 1.09 GB) into a temporary folder, then times, ``--repeats``
times each, alternating:

- ``floor``: ``pyarrow.csv.read_csv`` of the whole file, every column float32, on all cores,
  and the table's one row-major copy (what any reader must at least do);
- ``daskmeans``: ``daskmeans.read(path, chunk_bytes=...)`` (the header, the layout and the row
  counts) and its ``.compute()`` on a local cluster of in-process single-threaded workers, as
  the command starts one for one GPU (``--workers 1``, ``--chunk-bytes`` the size a fit on
  GPU workers reads in, ``gpu-chunk-bytes``).

- ``into``: the opened file's rows parsed into one buffer allocated (and touched) beforehand
  by ``csv_reader.parse_into(spec, 0, n, out)`` on every core, as a placement pipeline fills
  its own buffers: the compiled parser (``io/csv_parse.py``), no Dask array, no second copy;
- ``into_arrow``: the same with the compiled parser switched off (pyarrow's parser on the
  same pieces, its table copied into the rows): the ratio of the two is the parser's gain;
- ``scan``: the file's line breaks counted on every core (``csv_reader._count_all``, every
  byte read once from the page cache): the floor of any parse of the text.

Prints one JSON document (``--out PATH`` writes it too): the medians, the file's bytes,
``parse_gbps`` (the file's bytes over ``read`` + ``compute``, the whole read) next to the
floor's, and ``into_gbps``, ``into_arrow_gbps``, ``scan_gbps``; ``into_core_gbps`` and
``into_arrow_core_gbps``: the bytes per second of the process's CPU time (a core's rate).

    python -m benchmarks csv-read [--rows 1000000] [--cols 100] [--workers 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Iterator

import numpy as np

SUMMARY = "P1 read from CSV on all cores against pyarrow's whole-file parse"  # its line in --help


def _data(rows: int, cols: int) -> tuple[np.ndarray, str]:
    """The rows to write and what they are."""
    try:
        from sklearn.datasets import make_classification
    except ImportError:
        x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
        return x, "standard normal (scikit-learn missing)"
    x = make_classification(n_samples=rows, n_features=cols, random_state=0)[0].astype(np.float32)
    return x, "P1: make_classification, seed 0" if (rows, cols) == (1_000_000, 100) else "make_classification, seed 0"


def write_csv(path: str, x: np.ndarray) -> None:
    """``x`` as ``pyarrow.csv.write_csv`` writes a table of float32 columns ``f0``, ``f1``, ..."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    pcsv.write_csv(pa.table({f"f{j}": x[:, j] for j in range(x.shape[1])}), path)


def floor(path: str, cols: int) -> np.ndarray:
    """The whole file parsed by pyarrow on all cores to float32, as one row-major array."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = [f"f{j}" for j in range(cols)]
    table = pcsv.read_csv(path, read_options=pcsv.ReadOptions(use_threads=True, block_size=1 << 20),
                          convert_options=pcsv.ConvertOptions(column_types={n: pa.float32() for n in names}))
    return table.to_tensor(row_major=True).to_numpy()


@contextlib.contextmanager
def _compiled(on: bool) -> Iterator[None]:
    """The CSV reader with its compiled parser on (as it is) or off (pyarrow's on its pieces)."""
    from daskmeans.io import csv_parse

    usable = csv_parse.usable
    if not on:
        csv_parse.usable = lambda delimiter: False
    try:
        yield
    finally:
        csv_parse.usable = usable


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks csv-read", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1, help="in-process single-threaded workers (the command's one GPU: 1)")
    ap.add_argument("--chunk-bytes", default=None, help="text per block (default: daskmeans.gpu-chunk-bytes)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the temporary folder goes (default: the system's)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)

    import logging

    import dask
    import pyarrow as pa
    from distributed import Client, LocalCluster

    import daskmeans
    from daskmeans import config
    from daskmeans.io import csv_reader

    cb = args.chunk_bytes or config.get("gpu-chunk-bytes")
    x, what = _data(args.rows, args.cols)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = os.path.join(folder, "p1.csv")
        t0 = time.perf_counter()
        write_csv(path, x)
        write_s = time.perf_counter() - t0
        size = os.path.getsize(path)
        times: dict[str, list[float]] = {"floor": [], "read": [], "compute": [], "into": [], "into_arrow": [],
                                         "scan": []}
        cpu: dict[str, list[float]] = {"into": [], "into_arrow": []}  # the process's CPU time, every thread
        quiet = {f"distributed.worker.memory.{k}": False for k in ("target", "spill", "pause", "terminate")}
        with dask.config.set(quiet), LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=False,
                                                  dashboard_address=":0", scheduler_kwargs={"dashboard": False},
                                                  silence_logs=logging.CRITICAL) as cluster, Client(cluster):
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                ref = floor(path, args.cols)
                times["floor"].append(time.perf_counter() - t0)
                del ref
                t0 = time.perf_counter()
                arr = daskmeans.read(path, chunk_bytes=cb)
                t1 = time.perf_counter()
                got = arr.compute()
                t2 = time.perf_counter()
                times["read"].append(t1 - t0)
                times["compute"].append(t2 - t1)
                if not np.array_equal(got, x):
                    print("daskmeans.read gave other values than the rows written", file=sys.stderr)
                    return 1
                del got
                for name, compiled in (("into", True), ("into_arrow", False)):
                    spec = csv_reader.csv_rows_of(arr)
                    out = np.zeros((spec.n, spec.d), spec.dtype)  # a placement's buffer exists, its pages mapped
                    t0, c0 = time.perf_counter(), time.process_time()
                    with _compiled(compiled):
                        csv_reader.parse_into(spec, 0, spec.n, out)
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
                    if not np.array_equal(out.view(np.uint32), x.view(np.uint32)):
                        print(f"parse_into ({name}) gave other values than the rows written", file=sys.stderr)
                        return 1
                    del out
                t0 = time.perf_counter()
                csv_reader._count_all(np.memmap(path, dtype=np.uint8, mode="r"), 0, size, 16 << 20)
                times["scan"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    whole = med["read"] + med["compute"]
    doc = {
        "benchmark": "csv_read", "data": what, "rows": args.rows, "cols": args.cols, "file_bytes": size,
        "write_s": round(write_s, 3), "workers": args.workers, "chunk_bytes": str(cb), "cpus": os.cpu_count(),
        "pyarrow": pa.__version__, "repeats": args.repeats,
        "floor_s": round(med["floor"], 3), "floor_gbps": round(size / med["floor"] / 1e9, 3),
        "read_s": round(med["read"], 3), "compute_s": round(med["compute"], 3), "whole_s": round(whole, 3),
        "parse_gbps": round(size / whole / 1e9, 3),
        "into_s": round(med["into"], 3), "into_gbps": round(size / med["into"] / 1e9, 3),
        "into_arrow_s": round(med["into_arrow"], 3), "into_arrow_gbps": round(size / med["into_arrow"] / 1e9, 3),
        # Bytes per CPU second: a core's rate, which other processes on a shared host change less than the wall's.
        "into_core_gbps": round(size / statistics.median(cpu["into"]) / 1e9, 3),
        "into_arrow_core_gbps": round(size / statistics.median(cpu["into_arrow"]) / 1e9, 3),
        "scan_s": round(med["scan"], 3), "scan_gbps": round(size / med["scan"] / 1e9, 3),
        "cores": csv_reader.cores(),
        "all_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
    }
    try:
        from benchmarks import meta

        doc.update(commit=meta.commit(), date=meta.now(), device=meta.device_name())
    except ImportError:  # run as a file, outside the repository's root
        pass
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
