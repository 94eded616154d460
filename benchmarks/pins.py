"""``python -m benchmarks pins``: what pinning a chunk costs (the hash that checks a chunk read
again during a fit is the chunk first read, ``Backend.pin``), against floors of the same run.

On one GPU, per chunk of 256 MB of float32 at D = 16, 64, 384 (fresh random data each): the
median time (CUDA events, after warm-up) of the device pin (``pin_words``), of the moments
kernel over the same chunk (the pass that pins it), and of an HBM copy of it (the memory
floor: the copy reads and writes the chunk once, the pin reads it once). On the host: XXH3 of
the same chunk (the host tier's and the storage tier's pin), single-threaded, in GB/s.

    python -m benchmarks pins [--dims 16,64,384] [--out results/pins_<device>.json [--merge]]
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks import meta

SUMMARY = "a chunk's pin (device and host) against the moments kernel and an HBM copy"  # its line in --help
LAYOUT = meta.Layout(rows={"results": ("d",)})
CHUNK_BYTES = 256 << 20


def measure(d: int) -> dict:
    """One row: the pin, moments and copy of a 256 MB float32 chunk of ``d`` columns."""
    import cupy

    from daskmeans.backends import get_backend

    gpu, host = get_backend("cupy"), get_backend("numpy")
    x = cupy.random.standard_normal((CHUNK_BYTES // (4 * d), d), dtype=cupy.float32)
    y = cupy.empty_like(x)
    pin = meta.event_ms(lambda: gpu.pin(x), 10, 3) / 1e3
    moments = meta.event_ms(lambda: gpu.moments(x), 10, 3) / 1e3
    copy = meta.event_ms(lambda: y.__setitem__(Ellipsis, x), 10, 3) / 1e3
    h = cupy.asnumpy(x)
    host.pin(h)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        host.pin(h)
        ts.append(time.perf_counter() - t0)
    return {"d": d, "chunk_mb": x.nbytes / 2**20, "pin_s": pin, "moments_s": moments, "hbm_copy_s": copy,
            "pin_over_moments": pin / moments, "pin_over_copy": pin / copy,
            "pin_gb_per_s": x.nbytes / pin / 1e9, "host_xxh3_gb_per_s": h.nbytes / float(np.median(ts)) / 1e9}


def main(argv: list[str] | None = None) -> None:
    ap = meta.parser("pins", __doc__)
    ap.add_argument("--dims", default="16,64,384", help="the chunks' column counts")
    meta.add_output_options(ap)
    args = ap.parse_args(argv)
    meta.check_output(ap, args, "pins")
    rows = []
    for d in (int(v) for v in args.dims.split(",")):
        rows.append(measure(d))
        print({k: round(v, 6) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    meta.write({"benchmark": "pins", "device": meta.device_name(), "date": meta.now(), "results": rows},
               args.out, LAYOUT, args.merge)
