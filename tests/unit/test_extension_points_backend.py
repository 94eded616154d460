"""The extension points as wide as documented (docs/design.md, "A new backend", "A new reader"):
a backend is one module plus one registry entry, a reader one function plus one format entry,
and a fit through either gives the bits of the built-in one it copies."""

from __future__ import annotations

import dataclasses
import functools
import sys
import types

import numpy as np
import pytest

import daskmeans
from daskmeans import backends
from daskmeans.backends import numpy_backend, protocol
from daskmeans.io import blocks, npy_reader, readers
from localclient import local_client

COPY = "numpy-copy"
MODULE = "daskmeans_test_numpy_copy_backend"


@pytest.fixture(scope="module")
def threads_client():
    """Workers in this process: a registry entry made here is the workers' too (a deployment
    puts the entry in ``backends/__init__.py``, or registers it in a module every worker imports)."""
    with local_client(2, processes=False) as c:
        yield c


@pytest.fixture
def copied_backend():
    """The NumPy backend under another name: a module of its members, one registry entry."""
    module = types.ModuleType(MODULE)
    for member in [*protocol.members(), *protocol.capabilities(), "Prepared"]:
        setattr(module, member, getattr(numpy_backend, member))
    module.name = COPY
    module.calls = []

    @functools.wraps(numpy_backend.assign)
    def assign(*args, **kwargs):
        module.calls.append("assign")  # the fit's kernels are this module's
        return numpy_backend.assign(*args, **kwargs)

    module.assign = assign
    module.tunables_seen = []

    @functools.wraps(numpy_backend.prepare)
    def prepare(centroids, dtype, precision="fp32", tunables=None):
        module.tunables_seen.append(tunables)  # what the engine passed (None: it had none to pass)
        return numpy_backend.prepare(centroids, dtype, precision, tunables)

    module.prepare = prepare
    sys.modules[MODULE] = module
    backends.register(COPY, MODULE, aliases=("cpu-copy",))
    try:
        yield module
    finally:
        backends.unregister(COPY)
        del sys.modules[MODULE]


@pytest.fixture
def npy2_reader():
    """``.npy2``: files in the ``.npy`` format under another suffix, one format entry."""
    def open_npy2(path, chunk_bytes, dtype=None):
        return npy_reader.open_npy(path, chunk_bytes, dtype)

    fmt = readers.Format("npy2", (".npy2",), open_npy2)
    readers.register(fmt)
    try:
        yield fmt
    finally:
        readers.unregister("npy2")


def _data(n: int = 3000, d: int = 4) -> np.ndarray:
    rng = np.random.default_rng(7)
    centres = rng.normal(scale=4, size=(5, d))
    return centres[rng.integers(0, 5, n)] + rng.standard_normal((n, d))


def _fit(client, X, **kw):
    km = daskmeans.KMeans(5, random_state=3, n_init=1, client=client, **kw).fit(X)
    return km.cluster_centers_, km.n_iter_


def test_a_registered_backend_satisfies_the_protocol_and_fits_the_same_bits(threads_client, copied_backend):
    assert isinstance(copied_backend, protocol.Backend)
    assert backends.get_backend(COPY) is copied_backend and backends.get_backend("cpu-copy") is copied_backend
    assert COPY in backends.names() and "cpu-copy" in backends.choices()
    X = _data()
    ref, ref_iter = _fit(threads_client, X, backend="cpu")
    got, got_iter = _fit(threads_client, X, backend=COPY)
    assert copied_backend.calls, "the fit ran the registered backend's kernels"
    assert got_iter == ref_iter
    np.testing.assert_array_equal(got, ref)
    assert got.tobytes() == ref.tobytes()


def test_unregistered_backends_are_refused_by_name():
    assert COPY not in backends.REGISTRY
    with pytest.raises(ValueError, match=r"backend='numpy-copy' should be one of 'numpy', 'cupy', 'cpu', 'gpu'"):
        backends.get_backend(COPY)
    with pytest.raises(daskmeans.InvalidParameterError, match=r"backend='numpy-copy' should be one of 'auto'"):
        daskmeans.KMeans(2, backend=COPY).fit(np.zeros((4, 2)))


def test_registering_a_module_missing_members_names_them():
    module = types.ModuleType("daskmeans_test_partial_backend")
    for member in protocol.members():
        if member != "moments":
            setattr(module, member, getattr(numpy_backend, member))
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(TypeError, match=r"lacks moments, on_host, tile_setting, collectives"):
            backends.register("partial", module.__name__)
        with pytest.raises(ValueError, match=r"backend name 'gpu' is taken"):
            backends.register("gpu", "daskmeans.backends.numpy_backend")
    finally:
        del sys.modules[module.__name__]
    assert "partial" not in backends.REGISTRY


def test_a_registered_reader_returns_its_source_and_fits_the_same_bits(threads_client, npy2_reader, tmp_path):
    X = _data().astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "x.npy").rename(tmp_path / "x.npy2")
    np.save(tmp_path / "x.npy", X)
    path = str(tmp_path / "x.npy2")
    assert readers.format_of(path) is npy2_reader
    table = readers.read_table(path, chunk_bytes=4000)
    # What the engine needs of the source comes with what the reader returned.
    assert table.source == path and table.rows is not None and table.rows.path == path
    assert blocks.file_of(table.array) == path and blocks.file_of(table.array[:, :2]) == path
    again = readers.split_rows(table.array, 100)
    assert again.chunks[0][0] == 100 and blocks.file_of(again) == path
    np.testing.assert_array_equal(again.compute(), X)
    ref, ref_iter = _fit(threads_client, str(tmp_path / "x.npy"))
    got, got_iter = _fit(threads_client, path)
    assert got_iter == ref_iter
    assert got.tobytes() == ref.tobytes()


def test_formats_register_once_and_unregister():
    fmt = readers.Format("npy-again", (".npy",), npy_reader.open_npy)
    with pytest.raises(ValueError, match=r"format 'npy-again': its suffix '.npy' is the .npy format's already"):
        readers.register(fmt)
    with pytest.raises(ValueError, match=r"format 'npy2' is not registered"):
        readers.unregister("npy2")
    assert all(f.name != "npy2" for f in readers.FORMATS)


def test_the_plans_tunables_reach_the_loops_kernels(threads_client, copied_backend):
    """Resolved once on the client (engine.plan.kernel_tunables) and passed with the shards:
    the Lloyd loop's kernels are given them, and they change no bit."""
    import dask

    from daskmeans.engine.plan import kernel_tunables

    X = _data()
    ref, _ = _fit(threads_client, X, backend=COPY)
    copied_backend.tunables_seen.clear()
    with dask.config.set({"daskmeans.tile-bytes": "4KiB"}):
        small = kernel_tunables()
        got, _ = _fit(threads_client, X, backend=COPY)
    assert small.tile_bytes == 4096
    passed = [t for t in copied_backend.tunables_seen if t is not None]
    assert passed and all(t == small for t in passed)
    assert got.tobytes() == ref.tobytes()


def test_tunables_come_from_the_settings_and_name_a_bad_size():
    import dask

    from daskmeans import DaskmeansError
    from daskmeans.engine.plan import kernel_tunables

    t = kernel_tunables()
    assert (t.tile_bytes, t.gpu_tile_bytes, t.gpu_tile_bytes_max) == (2**20, 256 * 2**20, 4 * 2**30)
    assert (t.gpu_fp32_gemm, t.gpu_tf32_gemm) == ("auto", "auto")
    with dask.config.set({"daskmeans.gpu-tile-bytes": "lots"}):
        with pytest.raises(DaskmeansError, match=r"daskmeans.gpu-tile-bytes='lots' should be a size such as '256MiB'"):
            kernel_tunables()
    bound = backends.get_backend("cpu", t)
    assert isinstance(bound, protocol.Backend) and bound.name == "numpy" and bound.tunables is t
    assert bound.working_bytes(20, 10, 10**6) == 2**20
    assert backends.get_backend("cpu", dataclasses.replace(t, tile_bytes=4096)).working_bytes(20, 10, 10**6) == 4096
