"""The CuPy backend's planning, which is plain Python (no GPU needed): the regime and the fused
kernel's configuration for K x D, shared-memory sizes, occupancy, the GEMM's input mode, tile
rows, the selection layout, and the compile-time choices written into the kernel sources. The
kernels themselves are tested in tests/gpu/test_gpu.py."""

import re
from pathlib import Path

import numpy as np
import pytest

from daskmeans.backends import cuda_src
from daskmeans.backends import gpu_plan as plan

BIG = 1 << 30  # a device that lets a block have any shared memory


def test_auto_puts_centroids_in_registers_where_they_fit():
    # S1 (K = 4, D = 100): 16 lanes of 7 values, transposed reduction, centroids in registers.
    assert plan.small_config(4, 100, BIG) == (16, 7, 4, True, True)
    # S2 (K = 8, D = 2): one lane per row, centroids in registers, one slice per thread.
    assert plan.small_config(8, 2, BIG) == (1, 2, 8, False, True)
    # ... unless the block cannot have the 256 slices (K = 8: 64 KiB; the default 48 KiB).
    assert plan.small_config(8, 2, 48 * 1024) == (1, 2, 8, False, False)


def test_registers_fall_back_to_shared_where_the_block_cannot_have_the_memory():
    need = plan.shared_bytes(4, 16, 7, True)
    assert need == 8 * (16 * ((4 * (112 + 2)) | 1) + 2 * 4 + 2)  # 16 groups' odd slices
    assert plan.small_config(4, 100, need)[4] is True
    assert plan.small_config(4, 100, need - 1)[4] is False
    assert plan.small_config(4, 100, need - 1, "registers")[4] is False


@pytest.mark.parametrize("choice,expected", [("registers", True), ("shared", False)])
def test_explicit_placement_is_honoured(choice, expected):
    assert plan.small_config(8, 2, BIG, choice)[4] is expected
    assert plan.small_config(4, 100, BIG, choice)[4] is expected


def test_unknown_placement_is_rejected_with_the_value():
    with pytest.raises(ValueError, match="centroids='texture' should be one of 'auto', 'registers', 'shared'"):
        plan.small_config(4, 100, BIG, "texture")


@pytest.mark.parametrize("layout", ["columns", "cols8"])
def test_unknown_select_layout_is_rejected_with_the_value(layout):
    with pytest.raises(ValueError, match=f"layout='{layout}' should be one of 'auto', 'rows', 'cols1'"):
        plan.select_layout(4096, 1000, True, 132, "fp32", layout)


@pytest.mark.parametrize("layout,rpt", [("rows", 0), ("cols1", 1), ("cols4", 4)])
def test_explicit_select_layout_is_honoured(layout, rpt):
    assert plan.select_layout(4096, 1000, True, 132, "fp32", layout) == rpt


def test_auto_select_layout_takes_the_most_rows_per_thread_that_fill_the_gpu():
    # 132 SMs x 3 blocks = 396 blocks of 32 x RPT rows: RPT = 4 from 395 x 128 + 1 rows.
    assert plan.select_layout(50_561, 1000, True, 132, "fp32") == 4
    assert plan.select_layout(50_560, 1000, True, 132, "fp32") == 2
    assert plan.select_layout(25_280, 1000, True, 132, "fp32") == 1
    assert plan.select_layout(12_641, 1000, True, 132, "fp32") == 1
    assert plan.select_layout(12_640, 1000, True, 132, "fp32") == 0
    # Row-major where columns lose: K past 2048, tf32/bf16 (many uncertain rows), float64 tiles.
    assert plan.select_layout(1 << 20, 2052, True, 132, "fp32") == 0
    assert plan.select_layout(1 << 20, 1000, True, 132, "tf32") == 0
    assert plan.select_layout(1 << 20, 1000, False, 132, "fp32") == 0


def test_gemm_mode_by_precision_and_gpu():
    assert plan.gemm_mode("fp32", True) == 0  # float64 data: the GEMM reads it as given
    assert plan.gemm_mode("tf32", False) == 4  # scaled float16 inputs and tile above K = 2048
    assert plan.gemm_mode("tf32", False, k=2049) == 4
    assert plan.gemm_mode("tf32", False, k=2048) == 1  # TF32 inputs, float32 tile at small K
    # ... unless fused_select runs for these rows (no tile): D' up to 128, on compute capability 9.0
    assert plan.gemm_mode("tf32", False, k=300, d=128) == 4 and plan.gemm_mode("tf32", False, k=300, d=129) == 1
    assert plan.gemm_mode("tf32", False, "auto", "80", k=300, d=64) == 1
    assert plan.gemm_mode("tf32", False, tf32_gemm="fp16", k=300, d=64) == 4
    assert plan.gemm_mode("tf32", False, tf32_gemm="tf32", k=300, d=64) == 1
    assert plan.gemm_mode("tf32", False, tf32_gemm="fp16", k=10) == 4
    assert plan.gemm_mode("tf32", False, tf32_gemm="tf32", k=1 << 20) == 1
    assert plan.gemm_mode("tf32", True) == 0  # float64 data whatever the precision
    assert plan.gemm_mode("bf16", False) == 3
    assert plan.gemm_mode("fp32", False, "auto", "90") == 2  # split TF32 on data-centre parts
    assert plan.gemm_mode("fp32", False, "auto", "89") == 0  # cuBLAS fp32 on consumer parts
    assert plan.gemm_mode("fp32", False, "3xtf32", "89") == 2
    assert plan.gemm_mode("fp32", False, "sgemm", "90") == 0
    with pytest.raises(ValueError, match="gpu-fp32-gemm='fast' should be one of 'auto', 'sgemm', '3xtf32'"):
        plan.gemm_mode("fp32", False, "fast")
    assert plan.gemm_mode("tf32", False, tf32_gemm="fused", k=10) == 4
    with pytest.raises(ValueError, match="gpu-tf32-gemm='bf16' should be one of 'auto', 'tf32', 'fp16', 'fused'"):
        plan.gemm_mode("tf32", False, tf32_gemm="bf16")


def test_fused_select_takes_mode_4_where_the_rows_fit_two_blocks_per_sm():
    assert plan.fused_dp(5) == 32 and plan.fused_dp(128) == 128 and plan.fused_dp(130) == 160
    assert plan.fused_columns(96) == 32 and plan.fused_columns(128) in (32, 64)
    assert plan.uses_fused("fused", 4, 320) and plan.uses_fused("fused", 4, 3)
    assert not plan.uses_fused("fused", 4, 321)  # D' = 352: the tile path
    # "auto": D' up to 128 where it was measured to win, on compute capability 9.0 only;
    # "fused": from 8.0 (mma.sync m16n8k16, cp.async), never before
    assert plan.uses_fused("auto", 4, 128) and not plan.uses_fused("auto", 4, 129)
    assert not plan.uses_fused("auto", 4, 64, "80") and not plan.uses_fused("auto", 4, 64, "100")
    assert plan.uses_fused("fused", 4, 64, "80") and not plan.uses_fused("fused", 4, 64, "75")
    # a block's shared memory within the device's per-block limit: 99 KiB on 8.6, 8.9 and 12.x
    # holds D' = 256 with its stages (97 KiB) but not D' = 288 (105 KiB) or 320 (113 KiB)
    assert plan.fused_shared_bytes(256, plan.FUSED_STAGES, plan.fused_columns(256)) <= 99 * 1024
    assert plan.uses_fused("fused", 4, 256, "86", 99 * 1024)
    assert not plan.uses_fused("fused", 4, 288, "86", 99 * 1024) and not plan.uses_fused("fused", 4, 320, "120", 99 * 1024)
    assert plan.uses_fused("fused", 4, 320, "90", 227 * 1024)
    assert not plan.uses_fused("fp16", 4, 128)  # the tile path asked for
    assert not plan.uses_fused("auto", 1, 128) and not plan.uses_fused("fused", 2, 128)
    # two blocks of the widest rows in an SM's 228 KiB (1 KiB reserved per block)
    need = plan.fused_shared_bytes(plan.FUSED_MAX_DP, plan.FUSED_STAGES, plan.fused_columns(plan.FUSED_MAX_DP))
    assert need == 2 * 128 * 328 + 2 * 3 * 128 * 40 + 8 * 128
    assert plan.occupancy(127, 0, plan.THREADS, need) == 2
    assert plan.occupancy(127, 0, plan.THREADS, plan.fused_shared_bytes(plan.FUSED_MAX_DP + 32, 3, 32)) == 1
    with pytest.raises(ValueError, match="gpu-tf32-gemm='fast' should be one of"):
        plan.uses_fused("fast", 4, 128)


def test_fused_select_is_taken_only_where_two_blocks_share_an_sm(monkeypatch):
    """Four stages of 64 columns hold twice the shared memory: from D' = 192 two such blocks no
    longer share an SM, so the stages narrow to 32 columns (two blocks again), and where not even
    those fit the tile path is taken; the kernel's source refuses what it cannot run."""
    monkeypatch.setattr(plan, "FUSED_STAGES", 4)
    monkeypatch.setattr(plan, "FUSED_BK", 64)
    assert plan.uses_fused("fused", 4, 160) and plan.fused_columns(160) == 32  # 160 % 64 != 0
    assert plan.uses_fused("fused", 4, 128) and plan.fused_columns(128) == 64
    assert plan.occupancy(1, 0, 256, plan.fused_shared_bytes(192, 4, 64)) == 1  # 4 x 128 x 72 halves
    assert plan.uses_fused("fused", 4, 192) and plan.fused_columns(192) == 32
    assert plan.occupancy(1, 0, 256, plan.fused_shared_bytes(192, 4, 32)) == 2
    monkeypatch.setattr(plan, "FUSED_STAGES", 9)  # 9 x 128 x 40 halves and the rows: one block
    assert not plan.uses_fused("fused", 4, 320)
    with pytest.raises(ValueError, match=r"fused_select: dp=96, columns=64, stages=3, warps=\(4, 2\) should have dp "
                                         r"a multiple of columns"):
        cuda_src.fused_source("float32", 96, 3, 64, (4, 2))
    with pytest.raises(ValueError, match=r"warps=\(2, 4\)"):
        cuda_src.fused_source("float32", 128, 3, 32, (2, 4))


def test_fused_select_takes_its_one_factor_only_where_it_is_a_normal_float32():
    from daskmeans.backends.gpu_gemm import fused_factor

    assert fused_factor(-2.0**-20, 2.0**-30) == -2.0**-50
    assert fused_factor(-2.0**-20, 2.0**-106) == -2.0**-126  # the smallest normal
    assert fused_factor(-2.0**-20, 2.0**-107) is None  # subnormal: the block takes the tile path
    assert fused_factor(-2.0**-20, 2.0**-140) is None  # zero in float32
    assert fused_factor(-2.0**100, 2.0**27) == -2.0**127 and fused_factor(-2.0**100, 2.0**28) is None


def test_half_scales_keep_float16_inputs_and_tile_in_range():
    """Mode 4's powers of two: inputs scaled to at most 2^14 in magnitude, the tile's -2 x.c
    (at most 2 d max|x| max|c|) to at most 2^15; float16 holds up to 65504."""
    for xmax, cmax, d in [(1.0, 1.0, 128), (3e-20, 7e12, 64), (1e15, 1e15, 1500), (0.75, 0.5, 2)]:
        a, b, o = plan.half_scales(xmax, cmax, d)
        assert 2**13 < xmax * 2.0**a <= 2**14 and 2**13 < cmax * 2.0**b <= 2**14
        assert 2**14 < 2 * d * xmax * cmax * 2.0**-o <= 2**15
    assert plan.half_scales(0.0, 0.0, 8) == (14, 14, 0)  # all-zero data: any scale is exact
    # rows near 2^-70 and centroids near 2^-53: -2 x.c near 2^-116 would want a factor 2^-131,
    # subnormal in float32; the factor stays 2^-126 and the tile below 2^15 (2^10 here)
    a, b, o = plan.half_scales(2.0**-70, 2.0**-53, 64)
    assert (a, b, o) == (84, 67, -126) and 2 * 64 * 2.0**-70 * 2.0**-53 * 2.0**-o == 2.0**10
    assert plan.half_output_floor(0) == 1.1 * 2.0**-25 and plan.half_output_floor(30) == 1.1 * 2.0**5


def test_tile_rows_bound_distances_and_rounded_inputs():
    # 256 MiB of float32 distances over Kpad = 5000: 13,421 rows.
    assert plan.tile_rows(300_000, 5000, 4, 0, 4, 256 << 20) == (256 << 20) // 20_000
    # Split TF32 of D = 4000 (3D floats per row) outweighs K = 100's distances.
    assert plan.tile_rows(10**6, 100, 4, 12_000, 4, 4 << 20) == (4 << 20) // 48_000
    assert plan.tile_rows(100, 5000, 4, 0, 4, 256 << 20) == 100  # never more rows than the block
    assert plan.tile_rows(10**6, 10**6, 8, 0, 4, 1 << 20) == 32  # never fewer than 32


def test_wide_k_tiles_grow_to_fill_the_gpu_within_their_cap():
    # K = 2^18 float32: 1 MiB a row, 256 rows in 256 MiB; 132 SMs want 64 x 132 = 8448 rows.
    k, mib = 1 << 18, 1 << 20
    assert plan.fill_rows(132) == 8448
    assert plan.tile_rows(2_000_000, k, 4, 0, 4, 256 * mib, 2112, 8 << 30) == 2112
    assert plan.tile_rows(2_000_000, k, 4, 0, 4, 256 * mib, 2112, 1 << 30) == 1024  # the cap: 1 GiB of rows
    assert plan.tile_rows(1000, k, 4, 0, 4, 256 * mib, 2112, 8 << 30) == 1000  # never more rows than the block
    # Narrow K already has rows enough: unchanged (P3: 256 MiB / 20000 bytes).
    assert plan.tile_rows(300_000, 5000, 4, 0, 4, 256 * mib, 2112, 8 << 30) == (256 * mib) // 20_000
    assert plan.tile_bytes(2_000_000, k, 4, 0, 4, 256 * mib, 4 << 30, 132) == 4096 * mib  # capped


def test_occupancy_from_registers_and_shared_memory():
    # 128 registers x 256 threads: 32K registers per block, two blocks in 64K.
    assert plan.occupancy(128, 0, 256, 0) == 2
    assert plan.occupancy(64, 0, 256, 0) == 4
    assert plan.occupancy(32, 0, 256, 0) == 8  # 2048 threads
    # Shared memory: 228 KiB / (100 KiB + 1 KiB reserved) = 2.
    assert plan.occupancy(32, 0, 256, 100 * 1024) == 2
    assert plan.occupancy(255, 200 * 1024, 256, 100 * 1024) == 1  # at least one


def test_error_bound_grows_with_the_rounding_of_the_inputs():
    exact = plan.error_bound(10.0, 0.0, 100, 0, False)
    split = plan.error_bound(10.0, 10.0 * 2**-11, 100, 2, False)
    tf32 = plan.error_bound(10.0, 10.0 * 2**-11, 100, 1, False)
    assert exact[1] == 0.0  # fp32 as given: no residual term
    assert 0 < split[0] < tf32[0] and 0 < split[1] < tf32[1]
    assert plan.error_bound(10.0, 0.0, 100, 0, True)[0] < exact[0]  # float64
    # float16 inputs: the tile's float16 rounding is most of the bound; fused_select has none
    tile = plan.error_bound(10.0, 10.0 * 2**-11, 100, 4, False)
    fused = plan.error_bound(10.0, 10.0 * 2**-11, 100, 4, False, rounded_output=False)
    assert fused[1:] == tf32[1:] and fused[0] == tf32[0]  # the same inputs' rounding as TF32's
    assert tile[0] > 1.9 * fused[0] and tile[1] > fused[1]  # about 2^-11 M ||x|| of each


def test_shared_accumulator_regime_has_no_register_placement():
    # K x DPL too large for registers (K = 17, D = 130): 16 lanes of 9 values (at most 16 per
    # lane), shared centroids and sums.
    assert plan.small_config(17, 130, BIG) == (16, 9, 0, False, False)
    assert plan.small_config(5000, 408, BIG) is None  # the GEMM regime


def test_labels_only_pass_needs_no_group_slices():
    assert plan.shared_bytes(4, 16, 7, True, mode=1) == 8 * (2 * 4 + 2)
    assert plan.shared_bytes(4, 16, 7, False) == 8 * (2 * 4 * 112 + 2 * 4 + 2)
    # Shared centroids: the labels-only pass has no K x DP sums either.
    assert plan.shared_bytes(4, 16, 7, False, mode=1) == 8 * (4 * 112 + 2 * 4 + 2)


def test_group_slices_are_odd_only_for_multi_lane_rows():
    # 16 lanes: 16 slices of K x (DP + 2) = 4 x 114 doubles, made odd (457) against bank conflicts.
    assert plan.shared_bytes(4, 16, 7, True) == 8 * (16 * 457 + 2 * 4 + 2)
    # One lane per row: 256 slices of 8 x 4 doubles, interleaved (no padding needed).
    assert plan.shared_bytes(8, 1, 2, True) == 8 * (256 * 32 + 2 * 8 + 2)


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
    assert _defines(cuda_src.select_rows_source("float32", "float32"))["CH"] == "2"
    assert _defines(cuda_src.select_rows_source("float32", "float32", chains=1))["CH"] == "1"
    half = _defines(cuda_src.select_rows_source("float32", "float16"))
    assert (half["GH"], half["GT"], half["GV"], half["VEC"]) == ("1", "float", "uint4", "8")
    assert _defines(cuda_src.select_cols_source("float64", 2))["SC_MINB"] == "3"
    assert _defines(cuda_src.sums_source("float64"))["SS_MINB"] == "3"


def test_cuda_sources_are_files_of_the_package_not_python_strings():
    import daskmeans

    pkg = Path(daskmeans.__file__).parent
    assert [p.name for p in pkg.rglob("*.py") if "__global__" in p.read_text()] == []
    files = sorted(p.name for p in (pkg / "backends" / "cuda").iterdir())
    # one kernel family per file, after the shared device code
    assert files == ["afkmc2.cu", "certify.cuh", "common.cuh", "fit.cu", "fused_select.cu", "group_min.cu", "prep.cu",
                     "select_cols.cu", "select_rows.cu", "small.cu", "sums.cu"]
    # Each module is the common device code and its kernels, behind the #define header.
    src = cuda_src.small_source("float32", 16, 7, 4, True, 256)
    assert src.endswith((pkg / "backends" / "cuda" / "small.cu").read_text())
    assert (pkg / "backends" / "cuda" / "common.cuh").read_text() in src
    kernels = {m.group(1) for s in cuda_src.SOURCES
               for m in re.finditer(r"__global__ void (?:__launch_bounds__\([^)]*\) |BOUNDS )?(\w+)", s)}
    assert {"fused_small", "reduce_parts", "select_rows", "select_cols", "sorted_sums", "label_hist",
            "label_scatter", "scatter_by_label", "update_centroids", "sum_parts", "label_counts", "col_reduce",
            "gemm_prep"} <= kernels, kernels
    # the names the host looks kernels up by are the sources' kernels (gemm_prep's through PREP(M))
    assert set(cuda_src.SUMS_KERNELS) <= kernels and set(cuda_src.FUSED_KERNELS) <= kernels
    assert cuda_src.PREP_KERNELS == tuple(f"gemm_prep{m}" for m in re.findall(r"^PREP\((\d)\)$", cuda_src.PREP_SRC, re.M))


def test_modules_compile_concurrently_and_failures_surface():
    import threading

    seen = []
    together = threading.Barrier(3, timeout=10)  # run one after another, the first would wait in vain

    def compile_(i):
        together.wait()
        seen.append((i, threading.current_thread().name))

    cuda_src.compile_concurrently(*(lambda i=i: compile_(i) for i in range(3)))
    assert sorted(i for i, _ in seen) == [0, 1, 2]
    assert len({name for _, name in seen}) == 3  # three threads at once

    def broken():
        raise RuntimeError("nvrtc: error")

    with pytest.raises(RuntimeError, match="nvrtc: error"):
        cuda_src.compile_concurrently(lambda: None, broken)
    one = []
    cuda_src.compile_concurrently(lambda: one.append(1))  # a single compile needs no thread
    assert one == [1]


def test_a_module_is_built_once_while_threads_wait_for_it(monkeypatch):
    """Two threads asking for a module in flight (a fit's kernel while warm() compiles it):
    one build, both get its result; a failed build raises in both, and the next call builds
    again."""
    import threading

    from concurrent.futures import Future

    monkeypatch.setattr(cuda_src, "_CACHE", {})
    started, release, waiting = threading.Event(), threading.Event(), threading.Event()

    class Observed(Future):
        def result(self, timeout=None):
            waiting.set()  # a second thread waits for the build in flight
            return super().result(timeout)

    monkeypatch.setattr(cuda_src, "Future", Observed)
    builds = []

    def build():
        builds.append(1)
        started.set()
        assert release.wait(10)
        if len(builds) == 1:
            raise RuntimeError("nvrtc: error")
        return ("kernel",)

    def ask(out):
        try:
            out.append(cuda_src._once(("m",), build))
        except RuntimeError as e:
            out.append(str(e))

    results = [[], []]
    first = threading.Thread(target=ask, args=(results[0],))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=ask, args=(results[1],))
    second.start()
    assert waiting.wait(10)
    release.set()
    first.join(10)
    second.join(10)
    assert results == [["nvrtc: error"], ["nvrtc: error"]] and len(builds) == 1
    assert cuda_src._once(("m",), build) == ("kernel",) and len(builds) == 2
    assert cuda_src._once(("m",), build) == ("kernel",) and len(builds) == 2  # cached
    assert not cuda_src._PENDING


def test_each_kernel_family_is_a_module_of_its_own():
    import numpy as np

    def kernels(src):
        # The kernels left after the preprocessor's #ifdef RPT / #ifndef RPT, by a line scan.
        out, stack = [], []
        for line in src.splitlines():
            if line.startswith("#ifndef RPT"):
                stack.append("RPT" not in _defines(src))
            elif line.startswith("#ifdef RPT"):
                stack.append("RPT" in _defines(src))
            elif line.startswith("#if"):
                stack.append(True)
            elif line.startswith("#endif"):
                stack.pop()
            elif all(stack):
                m = re.search(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)', line)
                out += [m.group(1)] if m else []
                out += ["gemm_prep"] if line.startswith("PREP(") else []
        return out

    assert kernels(cuda_src.select_cols_source(np.float32, 2)) == ["select_cols"]
    assert kernels(cuda_src.select_rows_source(np.float32, np.float16)) == ["select_rows"]
    assert set(kernels(cuda_src.sums_source(np.float32))) == set(cuda_src.SUMS_KERNELS)
    assert set(kernels("#define T float\n" + cuda_src.PREP_SRC)) == {"gemm_prep"}  # gemm_prep0 .. 4


def test_occupancy_is_read_from_the_compiled_kernel_and_cached():
    from types import SimpleNamespace

    from daskmeans.backends import gpu_device

    kern = SimpleNamespace(attributes={"num_regs": 64, "shared_size_bytes": 0})
    assert gpu_device.blocks_per_sm(kern, 256, 0) == 4
    kern.attributes = {"num_regs": 128}
    assert gpu_device.blocks_per_sm(kern, 256, 0) == 4  # cached per kernel and launch shape
    assert gpu_device.blocks_per_sm(SimpleNamespace(), 256, 0) == 2  # no attributes: a safe default
    assert gpu_device.ptr(None) == gpu_device.NULL and gpu_device.ptr(kern) is kern


@pytest.mark.parametrize("ntile,splits", [(1, 1), (16, 1), (31, 1), (32, 2), (100, 6), (128, 8), (2048, 8)])
def test_the_recheck_splits_the_centroid_tiles_in_shares_of_16_or_more(ntile, splits):
    """fused_recheck's grid takes ``ntile // 16`` shares of the tiles, 1 to 8: K = 2^18 (2048
    tiles) in 8 shares of 256 tiles, K = 4096 (32) in 2 of 16, K = 2000 (16) in one."""
    assert plan.recheck_splits(ntile) == splits


def test_fused_select_constants_of_the_plan_are_the_kernels():
    """The sizes the host plans with (rows and centroids a block, the rerank's threads, the
    candidates a listed row's list holds, hence its bytes) are the ones fused_select.cu
    compiles in: the lists the host allocates are the ones the kernels fill."""
    src = cuda_src.FUSED_SRC
    defines = dict(re.findall(r"^#define (BM|BN|RT|FOUND) (\d+)", src, re.M))
    assert {name: int(v) for name, v in defines.items()} == {
        "BM": plan.FUSED_BM, "BN": plan.FUSED_BN, "RT": plan.FUSED_RESCAN_THREADS, "FOUND": plan.FUSED_FOUND}
    assert plan.fused_list_bytes() == 24 + 4 * plan.FUSED_FOUND + 4 + 8 == 52
