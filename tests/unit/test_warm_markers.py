"""The kernel warm-up's markers, read without CuPy (:func:`gpu_warm_ops.compiled`): a launcher
starts no process where every op of the installed CuPy left its marker, and starts them where
any op's, or the version's, is missing; and the claims by which the processes share the ops
(:func:`gpu_warm_ops._claim`)."""

import os

import pytest

from daskmeans.backends import gpu_warm_ops


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "cupy", raising=False)
    monkeypatch.setattr(gpu_warm_ops, "_cupy_version", lambda: "14.0.1")
    return tmp_path


def mark(cache, index, version="14.0.1", dtype="float32"):
    name = f"daskmeans-warm-{gpu_warm_ops._tag()}-cupy{version}-cuda13000-sm90-{dtype}-op{index}"
    (cache / name).write_text("")


def test_every_op_marked_is_compiled(cache):
    n = gpu_warm_ops.count("float32")
    assert not gpu_warm_ops.compiled("float32")
    for i in range(n - 1):
        mark(cache, i)
    assert not gpu_warm_ops.compiled("float32")  # the last op's marker missing
    mark(cache, n - 1)
    assert gpu_warm_ops.compiled("float32")
    assert not gpu_warm_ops.compiled("float64")  # another dtype's ops


def test_an_op_of_another_version_is_not_compiled(cache):
    n = gpu_warm_ops.count("float32")
    for i in range(n - 1):
        mark(cache, i)
    mark(cache, n - 1, version="13.6.0")
    assert not gpu_warm_ops.compiled("float32")
    mark(cache, n - 1)
    assert gpu_warm_ops.compiled("float32")


def test_a_marker_of_another_list_of_ops_does_not_count(cache):
    for i in range(gpu_warm_ops.count("float32")):
        (cache / f"daskmeans-warm-000000000000-cupy14.0.1-cuda13000-sm90-float32-op{i}").write_text("")
    assert not gpu_warm_ops.compiled("float32")
    mark(cache, 0)  # this list's marker of one op: still not all of them
    assert not gpu_warm_ops.compiled("float32")


def test_an_op_is_claimed_once_until_its_process_ends(tmp_path):
    """The first process to ask for an op gets its lock; another finds it held while the holder
    lives, gets it once the holder has ended without the marker (the system drops a dead
    process's lock), and finds nothing to do once the marker is there."""
    import subprocess
    import sys

    marker = str(tmp_path / "daskmeans-warm-op3")
    lock = gpu_warm_ops._claim(marker)
    assert lock is not None
    assert gpu_warm_ops._claim(marker) is None  # held (by this process, through another descriptor)
    os.close(lock)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from daskmeans.backends import gpu_warm_ops; "
                               f"assert gpu_warm_ops._claim({marker!r}) is not None; print('held', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert gpu_warm_ops._claim(marker) is None  # held by a live process
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    lock = gpu_warm_ops._claim(marker)  # its process ended without the marker
    assert lock is not None
    open(marker, "w").close()
    os.close(lock)
    assert gpu_warm_ops._claim(marker) is None  # compiled


def test_a_threads_claim_excludes_a_process_and_the_process_goes_on(tmp_path):
    """A command's thread (``work``, as ``cupy_backend.warm_ops_here`` runs it) and the
    processes share the ops: an op a thread of this process holds is skipped by a process,
    which takes the next one; once the thread leaves the op's marker, nobody claims it."""
    import subprocess
    import sys

    first, second = str(tmp_path / "daskmeans-warm-op0"), str(tmp_path / "daskmeans-warm-op1")
    claim = ("import sys; from daskmeans.backends import gpu_warm_ops; "
             "print([gpu_warm_ops._claim(m) is not None for m in sys.argv[1:]])")
    lock = gpu_warm_ops._claim(first)
    assert lock is not None
    p = subprocess.run([sys.executable, "-c", claim, first, second], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "[False, True]", p.stderr  # op0 held here, op1 free (released at its exit)
    open(first, "w").close()
    os.close(lock)
    p = subprocess.run([sys.executable, "-c", claim, first], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "[False]", p.stderr  # compiled


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


def test_the_setting_counts_the_processes(cache, monkeypatch):
    """``daskmeans.gpu-warm-processes``: auto is a quarter of the cores, 2 to 4; a count is
    that many (no more than the ops); anything else is refused by value."""
    import subprocess

    import dask

    from daskmeans.backends import cupy_backend

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: started.append(argv) or argv)
    for cores, want in [(2, 2), (8, 2), (12, 3), (16, 4), (64, 4)]:
        monkeypatch.setattr(os, "cpu_count", lambda c=cores: c)
        assert cupy_backend.warm_processes() == want
    with dask.config.set({"daskmeans.gpu-warm-processes": 3}):
        assert cupy_backend.warm_processes() == 3
        monkeypatch.setattr(cupy_backend, "_OPS_STARTED", set())
        procs = cupy_backend.warm_cupy_ops("float32")
    assert len(procs) == 3 and all(a[-1] == "float32" and a[-2].endswith("gpu_warm_ops.py") for a in started)
    with dask.config.set({"daskmeans.gpu-warm-processes": 1000}):
        monkeypatch.setattr(cupy_backend, "_OPS_STARTED", set())
        assert len(cupy_backend.warm_cupy_ops("float32")) == gpu_warm_ops.count("float32")  # an op each at most
    for bad in (0, "many", 2.5):
        with dask.config.set({"daskmeans.gpu-warm-processes": bad}):
            with pytest.raises(ValueError, match=rf"daskmeans.gpu-warm-processes={bad!r} should be auto or a count"):
                cupy_backend.warm_processes()


def test_the_warm_up_processes_parse_cupys_headers_once(cache, monkeypatch):
    """The processes compile with NVRTC's precompiled headers (``CUPY_NVRTC_USE_PCH=1`` in
    their environment) unless the environment sets the switch (``0`` keeps it off); this
    process's own environment is left as it is; ``nvrtc_pch`` sets a default, never a value."""
    import subprocess

    from daskmeans.backends import cupy_backend

    envs = []
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: envs.append(kw["env"]) or argv)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != "CUPY_NVRTC_USE_PCH"})
    monkeypatch.setattr(cupy_backend, "_OPS_STARTED", set())
    assert len(cupy_backend.warm_cupy_ops("float32", processes=2)) == 2
    assert [e["CUPY_NVRTC_USE_PCH"] for e in envs] == ["1", "1"]
    assert envs[0]["CUPY_CACHE_DIR"] == str(cache) and "CUPY_NVRTC_USE_PCH" not in os.environ
    os.environ["CUPY_NVRTC_USE_PCH"] = "0"
    envs.clear()
    monkeypatch.setattr(cupy_backend, "_OPS_STARTED", set())
    cupy_backend.warm_cupy_ops("float32", processes=1)
    assert [e["CUPY_NVRTC_USE_PCH"] for e in envs] == ["0"]
    assert cupy_backend.nvrtc_pch() is os.environ and os.environ["CUPY_NVRTC_USE_PCH"] == "0"
    assert cupy_backend.nvrtc_pch({}) == {"CUPY_NVRTC_USE_PCH": "1"}


def test_the_ops_have_names_that_load_can_skip():
    """:func:`gpu_warm_ops.load` skips ops by name (the worker's warm leaves Yinyang's out of a
    Lloyd fit): every op has its own name, the sized ones their function's, not a lambda's."""
    names = gpu_warm_ops.names("float32")
    assert len(names) == gpu_warm_ops.count("float32")
    assert len(set(names)) == len(names)
    assert "yinyang" in names and "seed_batched" in names and "<lambda>" not in names


def test_the_ops_load_ahead_only_from_a_warm_cache_and_when_set(monkeypatch):
    """``cupy_backend.load_ahead``: CuPy's ops are launched ahead on a worker's GPU only where
    every op is compiled (else the warm-up processes compile them, and the fit loads each at
    its launch) and ``daskmeans.gpu-load-ahead`` is on."""
    import dask

    from daskmeans.backends import cupy_backend

    monkeypatch.setattr(gpu_warm_ops, "compiled", lambda dtype: dtype == "float32")
    assert cupy_backend.load_ahead("float32")
    assert not cupy_backend.load_ahead("float64")
    with dask.config.set({"daskmeans.gpu-load-ahead": False}):
        assert not cupy_backend.load_ahead("float32")
