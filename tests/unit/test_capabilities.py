"""Capabilities, not names: a backend says what it is (``protocol.capabilities()``), and no
module outside a registry compares a backend's or a metric's name."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import daskmeans
from daskmeans.backends import cupy_backend, numpy_backend, protocol
from daskmeans.engine.plan import working_bytes

PACKAGE = Path(daskmeans.__file__).parent
# The registries: the only modules that may turn a name into a backend or a metric.
REGISTRIES = {"backends/__init__.py", "metric.py"}
NAMES = {"numpy", "cupy", "cpu", "gpu", "euclidean", "cosine"}
# Comparisons still in modules not yet moved to capabilities: (module, source of the comparison).
# Remove an entry once its module asks a capability instead (the test says when).
ALLOWED: set = set()  # comparisons still allowed outside the registries: none


def _names_in(node: ast.AST) -> bool:
    """Whether ``node`` is a backend or metric name as a literal, or a collection holding one,
    or a call of ``backend_name``."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_in(e) for e in node.elts)
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Name) and f.id == "backend_name") or (
            isinstance(f, ast.Attribute) and f.attr == "backend_name")
    return False


def name_comparisons(source: str) -> list[str]:
    """The source of every comparison in ``source`` with a backend's or metric's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_names_in(x) for x in [node.left, *node.comparators]):
            found.append(ast.get_source_segment(source, node))
    return found


def test_the_finder_sees_each_form_of_name_comparison():
    src = ('a = be.name == "numpy"\nb = backend in ("gpu", "cupy")\nc = "cosine" != metric\n'
           'd = backend_name(X) == other\ne = dt.name in ("float32", "float64")\nf = be.on_host\n')
    assert name_comparisons(src) == ['be.name == "numpy"', 'backend in ("gpu", "cupy")', '"cosine" != metric',
                                     "backend_name(X) == other"]


def test_no_module_compares_a_backend_or_metric_name_outside_its_registry():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in REGISTRIES:
            continue
        found |= {(rel, seg) for seg in name_comparisons(path.read_text())}
    assert found - ALLOWED == set(), "ask the backend's or metric's capabilities instead of its name"
    assert ALLOWED - found == set(), "no longer found: remove from ALLOWED"


@pytest.mark.parametrize("module", [numpy_backend, cupy_backend], ids=["numpy", "cupy"])
def test_backends_declare_every_capability(module):
    for attr, kind in protocol.capabilities().items():
        assert isinstance(getattr(module, attr), kind), attr


def test_host_and_device_backends_say_so():
    assert numpy_backend.on_host is True and cupy_backend.on_host is False


def test_numpy_working_bytes_is_one_tile_within_tile_bytes():
    import dask

    with dask.config.set({"daskmeans.tile-bytes": "1MiB"}):
        # 100 rows of (K + D) = 30 float64 values: 24,000 bytes, under 1 MiB.
        assert numpy_backend.working_bytes(20, 10, 100) == 100 * 30 * 8
        assert numpy_backend.working_bytes(20, 10, 10**6) == 2**20
        # The plan adds the model (7 K x D float64, one float64 per chunk), two chunks and labels.
        assert working_bytes(20, 10, 3, 4000, 250, "numpy") == 20 * 10 * 8 * 7 + 3 * 8 + 100 * 30 * 8 + 8000 + 3000


def test_gpu_working_bytes_needs_no_gpu():
    # The fused regime (small K x D) has no tiles; the GEMM regime two, of at least one row.
    assert cupy_backend.working_bytes(8, 16, 1000) == 0
    k, d = 4096, 128
    assert cupy_backend.working_bytes(k, d, 1000) >= 2 * k * 4
    assert np.dtype(type(cupy_backend.working_bytes(k, d, 1000))).kind == "i"


def test_gpu_working_bytes_count_what_a_block_holds_per_row():
    """Beside its two tiles a block of the GEMM regime holds per row the tile path's error
    bound (8 bytes) or, where fused_select may run (D' <= 320), its list of rows for the
    recheck (52 bytes: the row's index, two candidates and threshold, 24; four noted
    candidates, 16; their count, 4; a place in the rescan's list, 8): at D = 2 that is six
    times the block's own rows, so the plan counts it."""
    from daskmeans.backends import gpu_plan
    from daskmeans.backends.protocol import tunables_in_force

    t = tunables_in_force()
    rows = 1 << 26  # a 512 MiB chunk of D = 2 float32 rows
    tiles = 2 * gpu_plan.tile_bytes(rows, 1024, 4, 0, 4, t.gpu_tile_bytes, t.gpu_tile_bytes_max, 132)
    assert cupy_backend.working_bytes(1024, 2, rows, 132, t) == tiles + 52 * rows
    assert cupy_backend.working_bytes(1024, 2, rows, 132, t) > 6 * rows * 2 * 4
    tiles = 2 * gpu_plan.tile_bytes(10**6, 1024, 4, 0, 4, t.gpu_tile_bytes, t.gpu_tile_bytes_max, 132)
    assert cupy_backend.working_bytes(1024, 400, 10**6, 132, t) == tiles + 8 * 10**6  # D' = 416: no fused_select
