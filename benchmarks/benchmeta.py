"""What every benchmark JSON records about where it ran, and the GPU timers of the profiling
scripts (shared by the benchmark scripts, which ``python -m benchmarks SUBCOMMAND`` runs with
this folder on the path, so they import this module by its plain name)."""

from __future__ import annotations

import os
import subprocess


def commit() -> str | None:
    """The measured commit: ``.commit`` in the working directory or the repository root
    (written before a device run, whose copy of .git may be stale), else ``git rev-parse HEAD``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in (".commit", os.path.join(root, ".commit")):
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip() or None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() or None
    except OSError:
        return None


def event_ms(fn, reps: int = 20, warm: int = 3) -> float:
    """Median milliseconds of ``fn`` between two CUDA events on the current CuPy stream
    (GPU time of the work it enqueues, plus any host time before its first launch)."""
    import cupy
    import numpy as np

    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(a, b))
    return float(np.median(ts))


def synced_ms(fn, reps: int = 20, warm: int = 3) -> float:
    """Median milliseconds of ``fn`` between full device synchronisations (wall clock)."""
    import time

    import cupy
    import numpy as np

    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))


def device_name() -> str:
    """The GPU's name where CuPy sees one, else the CPU's model."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:  # no CuPy or no GPU: a CPU run
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
