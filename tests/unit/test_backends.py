"""The backend contract (no GPU needed): both backend modules define every member of
:class:`daskmeans.backends.protocol.Backend` with the contract's parameters, and the GPU
kernels decide winners and break ties in one place each."""

import inspect
import re
from pathlib import Path

import pytest

from daskmeans.backends import cupy_backend, numpy_backend, protocol

CUDA = Path(protocol.__file__).parent / "cuda"


@pytest.mark.parametrize("module", [numpy_backend, cupy_backend], ids=["numpy", "cupy"])
def test_backend_modules_satisfy_the_protocol(module):
    for member in protocol.members():
        if member in ("name", "xp"):
            continue  # data; xp imports the library (checked below for NumPy)
        want = [p for p in inspect.signature(getattr(protocol.Backend, member)).parameters if p != "self"]
        got = inspect.signature(getattr(module, member))
        # The contract's parameters, in order; a backend may add private keyword-only ones.
        assert [p for p in got.parameters if not p.startswith("_")] == want, member
    assert module.name in ("numpy", "cupy")


def test_numpy_backend_is_a_backend_instance():
    assert isinstance(numpy_backend, protocol.Backend)
    assert numpy_backend.xp.__name__ == "numpy"


def test_a_module_missing_a_member_is_not_a_backend():
    import types

    partial = types.ModuleType("partial")
    for member in protocol.members():
        if member != "moments":
            setattr(partial, member, getattr(numpy_backend, member))
    assert not isinstance(partial, protocol.Backend)


def _strip_comments(src):
    return re.sub(r"//[^\n]*", "", src)


def test_certify_and_rerank_is_written_once():
    sel = _strip_comments("".join((CUDA / f).read_text() for f in ("certify.cuh", "select_rows.cu", "select_cols.cu")))
    # One definition, called by both selections.
    assert len(re.findall(r"\bint exact_winner\(", sel)) == 1
    assert len(re.findall(r"\bexact_winner\b", sel)) == 3
    # Nothing else computes a candidate's exact distance or scans a row for candidates.
    body = sel[sel.index("int exact_winner("):]
    body = body[: body.index("\n}\n")]
    assert sel.count("exact_d2(") == body.count("exact_d2(")
    assert sel.count("__ballot_sync") == body.count("__ballot_sync")
    assert sel.count("2.0 *") == 1  # the bound's threshold, in rerank_threshold


def test_ties_break_in_one_comparison():
    src = "".join(_strip_comments(p.read_text()) for p in sorted(CUDA.iterdir()))
    # "v < b || (v == b && k < i)": only inside precedes().
    tie = r"<\s*[\w\[\]]+\s*\|\|\s*\(\s*[\w\[\]]+\s*==\s*[\w\[\]]+\s*&&"
    assert len(re.findall(tie, src)) == 1  # that ties go to the lowest index everywhere: tests/gpu


def test_backend_names_come_without_importing_the_backends():
    """The name of an array's backend is read off its type; importing the NumPy backend does
    not import Numba (a GPU fit never runs its kernels: ~0.3 s of imports)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, dask.array as da\n"
        "from daskmeans.backends import backend_name\n"
        "assert backend_name(np.zeros(2)) == 'numpy' and backend_name(da.zeros(2)) == 'numpy'\n"
        "assert backend_name('gpu') == 'cupy' and backend_name('cpu') == 'numpy'\n"
        "assert 'daskmeans.backends.numpy_backend' not in sys.modules\n"
        "import daskmeans.backends.numpy_backend\n"
        "assert 'numba' not in sys.modules, 'numba imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    from daskmeans.backends import backend_name

    with pytest.raises(ValueError, match="backend='tpu' should be one of 'numpy', 'cupy', 'cpu', 'gpu'"):
        backend_name("tpu")
