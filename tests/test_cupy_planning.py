"""The CuPy backend's launch planning, which is plain Python (no GPU needed): the fused
kernel's configuration for K x D, its shared-memory size, and the compile-time choices written
into the kernel source. The kernels themselves are tested in test_gpu.py."""

import re
from pathlib import Path

import dask
import pytest

from daskmeans.backends import cuda_src
from daskmeans.backends import cupy_backend as be

BIG = 1 << 30  # a device that lets a block have any shared memory


def test_auto_puts_centroids_in_registers_where_they_fit():
    # S1 (K = 4, D = 100): 16 lanes of 7 values, transposed reduction, centroids in registers.
    assert be._small_config(4, 100, BIG) == (16, 7, 4, True, True)
    # S2 (K = 8, D = 2): one lane per row, centroids in registers, one slice per thread.
    assert be._small_config(8, 2, BIG) == (1, 2, 8, False, True)
    # ... unless the block cannot have the 256 slices (K = 8: 64 KiB; the default 48 KiB).
    assert be._small_config(8, 2, 48 * 1024) == (1, 2, 8, False, False)


def test_registers_fall_back_to_shared_where_the_block_cannot_have_the_memory():
    need = be._shared_bytes(4, 16, 7, True)
    assert need == 8 * (16 * ((4 * (112 + 2)) | 1) + 2 * 4 + 2)  # 16 groups' odd slices
    assert be._small_config(4, 100, need)[4] is True
    assert be._small_config(4, 100, need - 1)[4] is False
    with dask.config.set({"daskmeans.gpu-small-centroids": "registers"}):
        assert be._small_config(4, 100, need - 1)[4] is False


@pytest.mark.parametrize("choice,expected", [("registers", True), ("shared", False)])
def test_explicit_placement_is_honoured(choice, expected):
    with dask.config.set({"daskmeans.gpu-small-centroids": choice}):
        assert be._small_config(8, 2, BIG)[4] is expected
        assert be._small_config(4, 100, BIG)[4] is expected


def test_unknown_placement_is_rejected_with_the_value():
    with dask.config.set({"daskmeans.gpu-small-centroids": "texture"}):
        with pytest.raises(ValueError, match="gpu-small-centroids='texture' should be one of 'auto', 'registers', 'shared'"):
            be._small_config(4, 100, BIG)


@pytest.mark.parametrize("layout", ["columns", "cols8"])
def test_unknown_select_layout_is_rejected_with_the_value(layout):
    import numpy as np

    with dask.config.set({"daskmeans.gpu-select-layout": layout}):
        with pytest.raises(ValueError, match=f"gpu-select-layout='{layout}' should be one of 'auto', 'rows', 'cols1'"):
            be._select_layout(4096, 1000, np.float32, 0, "fp32")


@pytest.mark.parametrize("layout,rpt", [("rows", 0), ("cols1", 1), ("cols4", 4)])
def test_explicit_select_layout_is_honoured(layout, rpt):
    import numpy as np

    with dask.config.set({"daskmeans.gpu-select-layout": layout}):
        assert be._select_layout(4096, 1000, np.float32, 0, "fp32") == rpt


def test_shared_accumulator_regime_has_no_register_placement():
    # K x DPL too large for registers (K = 17, D = 130): 16 lanes of 9 values (at most 16 per
    # lane), shared centroids and sums.
    assert be._small_config(17, 130, BIG) == (16, 9, 0, False, False)
    assert be._small_config(5000, 408, BIG) is None  # the GEMM regime


def test_labels_only_pass_needs_no_group_slices():
    assert be._shared_bytes(4, 16, 7, True, mode=1) == 8 * (2 * 4 + 2)
    assert be._shared_bytes(4, 16, 7, False) == 8 * (2 * 4 * 112 + 2 * 4 + 2)
    # Shared centroids: the labels-only pass has no K x DP sums either.
    assert be._shared_bytes(4, 16, 7, False, mode=1) == 8 * (4 * 112 + 2 * 4 + 2)


def test_group_slices_are_odd_only_for_multi_lane_rows():
    # 16 lanes: 16 slices of K x (DP + 2) = 4 x 114 doubles, made odd (457) against bank conflicts.
    assert be._shared_bytes(4, 16, 7, True) == 8 * (16 * 457 + 2 * 4 + 2)
    # One lane per row: 256 slices of 8 x 4 doubles, interleaved (no padding needed).
    assert be._shared_bytes(8, 1, 2, True) == 8 * (256 * 32 + 2 * 8 + 2)


def _defines(src):
    """The first definition of each macro (the configuration head; the source's own
    ``#ifndef`` defaults come later)."""
    out = {}
    for line in src.splitlines():
        if line.startswith("#define") and len(line.split()) == 3:
            out.setdefault(*line.split()[1:3])
    return out


def test_kernel_source_carries_the_placement_and_rows_per_trip():
    reg = _defines(cuda_src.small_source("float32", 16, 7, 4, True, 256, creg=True))
    assert (reg["CREG"], reg["U"], reg["MINB"]) == ("1", "2", "1")  # two rows in flight (16 // 7)
    shr = _defines(cuda_src.small_source("float32", 16, 7, 4, True, 256))
    assert (shr["CREG"], shr["U"], shr["MINB"]) == ("0", "1", "2")
    # No register accumulators (KACC = 0): the placement does not apply.
    assert _defines(cuda_src.small_source("float32", 32, 5, 0, False, 256, creg=True))["CREG"] == "0"


def test_select_source_defaults_to_two_insert_chains():
    assert _defines(cuda_src.select_source("float32", "float32"))["CH"] == "2"
    assert _defines(cuda_src.select_source("float32", "float32", chains=1))["CH"] == "1"


def test_cuda_sources_are_files_of_the_package_not_python_strings():
    import daskmeans

    pkg = Path(daskmeans.__file__).parent
    assert [p.name for p in pkg.rglob("*.py") if "__global__" in p.read_text()] == []
    files = sorted(p.name for p in (pkg / "backends" / "cuda").iterdir())
    assert files == ["common.cuh", "select.cu", "small.cu"]
    # Each module is the common device code and its kernels, behind the #define header.
    src = cuda_src.small_source("float32", 16, 7, 4, True, 256)
    assert src.endswith((pkg / "backends" / "cuda" / "small.cu").read_text())
    assert (pkg / "backends" / "cuda" / "common.cuh").read_text() in src
    kernels = {m.group(1) for s in (cuda_src.SMALL_SRC, cuda_src.SELECT_SRC)
               for m in re.finditer(r"__global__ void (?:__launch_bounds__\([^)]*\) |BOUNDS )?(\w+)", s)}
    assert {"fused_small", "reduce_parts", "select_rows", "select_cols", "sorted_sums", "label_hist",
            "label_scatter", "scatter_by_label"} <= kernels, kernels
