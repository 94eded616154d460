"""The command's compiles ahead (backends.cupy_backend.warm_ahead): the kernels of a fit of
the data's shape, as the worker's warm-up chooses them, start compiling before the command's
imports where its GPU workers will be threads of the process. The GPU side (nothing compiled
after the warm-up) is tests/gpu/test_gpu_warm.py's; here the choices and the wiring."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from daskmeans import config
from daskmeans.backends import cupy_backend


def test_ahead_rows_by_hand():
    # 1e6 rows of 128 float32 on 2 GPUs: 512 MiB chunks hold 1,048,576 rows, a GPU's share is 500,000.
    with dask.config.set({"daskmeans.gpu-chunk-bytes": "512MiB"}):
        assert cupy_backend.ahead_rows((1_000_000, 128), np.float32, 2) == 500_000
        # 4e6 x 480 float32 on one GPU: 512 MiB / 1920 B = 279,620 rows.
        assert cupy_backend.ahead_rows((4_000_000, 480), "float32", 1) == 279_620
    # --chunk-bytes sets the blocks (float64: 8 B a value): 1 MiB / (10 x 8 B) = 13,107 rows.
    assert cupy_backend.ahead_rows((100_000, 10), np.float64, 1, chunk_bytes=1 << 20) == 13_107
    assert cupy_backend.ahead_rows((100_000, 10), np.float64, 1, chunk_bytes="1MiB") == 13_107
    assert cupy_backend.ahead_rows((3, 10**9), np.float32, 1, chunk_bytes=1) == 1


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, name):
        return lambda *a, **kw: self.calls.append((name, a, kw))


@pytest.fixture
def gpus(monkeypatch):
    """Two GPUs whose workers are threads of this process, their work recorded."""
    rec = _Recorder()
    monkeypatch.setattr(cupy_backend, "device_count", lambda: 2)
    monkeypatch.setattr(config, "gpu_in_process", lambda n: True)
    monkeypatch.setattr(cupy_backend, "_open_device", rec("open"))
    monkeypatch.setattr(cupy_backend, "warm", rec("warm"))
    monkeypatch.setattr(cupy_backend, "device_scope", lambda i: __import__("contextlib").nullcontext())
    monkeypatch.setattr(cupy_backend.cuda_src, "compile_concurrently", rec("compile"))
    return rec


def _wait_for_threads(prefix="daskmeans-open-gpu"):
    import threading

    for t in threading.enumerate():
        if t.name.startswith(prefix):
            t.join()


def test_with_the_shape_the_fits_kernels_compile_ahead(gpus):
    with dask.config.set({"daskmeans.gpu-chunk-bytes": "512MiB"}):
        cupy_backend._modules_ahead(np.dtype(np.float32), 16384, (2_000_000, 128), "tf32", "yinyang")
    _wait_for_threads()
    assert ("open", (1,), {}) in gpus.calls  # the other GPU's context made meanwhile
    # warm(k, d, dtype, precision, rows) as a worker's warm-up asks it, 1e6 rows a GPU.
    warm = ("warm", (16384, 128, np.dtype(np.float32), "tf32", 1_000_000), {"algorithm": "yinyang"})
    assert warm in gpus.calls
    # The first GPU's context is made (without the interpreter lock) before its modules.
    assert gpus.calls.index(("open", (0,), {})) < gpus.calls.index(warm)
    assert not [c for c in gpus.calls if c[0] == "compile"]


@pytest.mark.parametrize("shape", [None, (3, 8)])  # no header, or fewer rows than K: the fit is refused
def test_without_a_fit_the_dtypes_modules(gpus, shape):
    cupy_backend._modules_ahead("float32", 4, shape)
    _wait_for_threads()
    compiles = [c for c in gpus.calls if c[0] == "compile"]
    assert len(compiles) == 1 and compiles[0][1] == (cupy_backend.cuda_src.fit_kernels,)
    assert compiles[0][2] == {"device": 0} and not [c for c in gpus.calls if c[0] == "warm"]


def test_workers_in_processes_of_their_own_compile_nothing_here(gpus, monkeypatch):
    monkeypatch.setattr(config, "gpu_in_process", lambda n: False)
    cupy_backend._modules_ahead("float32", 16, (1000, 8))
    assert gpus.calls == []


def test_no_gpu_visible_compiles_nothing(gpus, monkeypatch):
    """A driver (``/dev/nvidiactl``) with no device visible to this process
    (``CUDA_VISIBLE_DEVICES=""``): the fit runs elsewhere or on the CPU."""
    monkeypatch.setattr(cupy_backend, "device_count", lambda: 0)
    cupy_backend._modules_ahead("float32", 16, (1000, 8))
    assert gpus.calls == []


@pytest.mark.parametrize("cold", [True, False])
def test_the_fits_modules_ahead_only_on_an_empty_kernel_cache(monkeypatch, cold):
    """With CuPy's ops compiled already (no process started: a warm cache), the fit's modules
    load during placement as before; ahead, their loads would take turns with the imports."""
    import importlib.util
    import os

    seen = []
    monkeypatch.setenv("CUPY_NVRTC_USE_PCH", "")  # then absent, and absent again afterwards
    monkeypatch.delenv("CUPY_NVRTC_USE_PCH")
    exists, find = os.path.exists, importlib.util.find_spec
    monkeypatch.setattr(os.path, "exists", lambda p: True if p == "/dev/nvidiactl" else exists(p))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "cupy" else find(name, *a))
    monkeypatch.setattr(cupy_backend, "warm_cupy_ops", lambda dtype: ["a process"] if cold else [])
    monkeypatch.setattr(cupy_backend, "_modules_ahead", lambda *a: seen.append(a))
    procs = cupy_backend.warm_ahead(np.dtype(np.float32), k=64, shape=(1000, 8), precision="tf32", algorithm="lloyd")
    _wait_for_threads("daskmeans-compile-ahead")
    assert procs == (["a process"] if cold else [])
    assert seen == [(np.dtype(np.float32), 64, (1000, 8) if cold else None, "tf32", "lloyd", None)]
    # NVRTC's precompiled headers on in this process's environment, before it imports CuPy.
    assert os.environ["CUPY_NVRTC_USE_PCH"] == "1"


def test_the_command_passes_the_datas_header(tmp_path, monkeypatch):
    """``daskmeans fit`` hands warm_ahead the shape and dtype of DATA's header and the fit's
    options, before it reads the data."""
    from daskmeans.cli import main

    seen = []
    monkeypatch.setattr(cupy_backend, "warm_ahead", lambda *a, **kw: seen.append((a, kw)) or [])
    path = str(tmp_path / "x.npy")
    np.save(path, np.random.default_rng(0).standard_normal((300, 3)))
    assert main(["fit", path, "--k", "3", "--max-iter", "2", "--precision", "tf32", "--chunk-bytes", "4KiB",
                 "-o", str(tmp_path / "m.zarr"), "-q"]) == 0
    assert seen == [((np.dtype(np.float64),), {"k": 3, "shape": (300, 3), "precision": "tf32",
                                                 "algorithm": "lloyd", "chunk_bytes": "4KiB"})]


def test_the_ops_are_compiled_here_once_by_a_thread_on_the_first_gpu(gpus, monkeypatch):
    """``warm_ops_here``: a thread of this process runs the op list (gpu_warm_ops.work) on the
    first GPU, once per dtype, where the GPU workers are threads of this process; nothing where
    they are processes of their own or no GPU is visible."""
    from daskmeans.backends import gpu_warm_ops

    ran, scopes = [], []
    monkeypatch.setattr(gpu_warm_ops, "work", lambda dtype: ran.append(dtype) or 0)
    monkeypatch.setattr(cupy_backend, "device_scope", lambda i: scopes.append(i) or __import__("contextlib").nullcontext())
    monkeypatch.setattr(cupy_backend, "_OPS_HERE", set())
    t = cupy_backend.warm_ops_here(np.float32)
    t.join()
    assert t.name == "daskmeans-compile-ops" and ran == ["float32"] and scopes == [0]
    assert cupy_backend.warm_ops_here("float32") is None  # once
    monkeypatch.setattr(config, "gpu_in_process", lambda n: False)
    assert cupy_backend.warm_ops_here("float64") is None
    monkeypatch.setattr(config, "gpu_in_process", lambda n: True)
    monkeypatch.setattr(cupy_backend, "device_count", lambda: 0)
    assert cupy_backend.warm_ops_here("float64") is None
    assert ran == ["float32"]


@pytest.mark.parametrize("started", [True, False])
def test_the_command_compiles_ops_here_after_its_imports_where_processes_were_started(tmp_path, monkeypatch,
                                                                                       started):
    """``daskmeans fit`` starts the thread (warm_ops_here, with the data's dtype) after its
    imports, and only where warm_ahead started processes (an empty kernel cache)."""
    import sys

    from daskmeans.cli import main

    calls = []
    monkeypatch.setattr(cupy_backend, "warm_ahead", lambda *a, **kw: ["a process"] if started else [])
    monkeypatch.setattr(cupy_backend, "warm_ops_here",
                        lambda dtype: calls.append((dtype, "daskmeans.estimator" in sys.modules)))
    path = str(tmp_path / "x.npy")
    np.save(path, np.random.default_rng(0).standard_normal((300, 3)).astype(np.float32))
    assert main(["fit", path, "--k", "3", "--max-iter", "2", "-o", str(tmp_path / "m.zarr"), "-q"]) == 0
    assert calls == ([(np.dtype(np.float32), True)] if started else [])


@pytest.mark.parametrize("version, split", [((13, 0), True), ((12, 1), True), ((12, 0), False), ((11, 8), False)])
def test_the_fused_module_compiles_split_where_nvrtc_takes_the_option(monkeypatch, version, split):
    """The fused module's options: every module's, and NVRTC's split compile from CUDA 12.1 on
    (an older NVRTC refuses the option, and the module would not compile at all); the other
    modules' options stay as they are (CuPy's cache keys them)."""
    import sys
    import types

    from daskmeans.backends import cuda_src

    nvrtc = types.SimpleNamespace(getVersion=lambda: version)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nvrtc = nvrtc
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    want = ("--std=c++17", "--split-compile=0") if split else ("--std=c++17",)
    assert cuda_src.fused_options() == want
    assert cuda_src.OPTIONS == ("--std=c++17",)
