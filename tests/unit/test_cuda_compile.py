"""Every CUDA module the CuPy backend builds compiles, checked on any host with NVIDIA's
compiler (no GPU needed; skipped without one): the configurations the host code produces for
each kernel family, compiled for sm_90 as NVRTC would (``--std=c++17``, the sources as
:mod:`daskmeans.backends.cuda_src` assembles them). The selections are also held to what
their sources promise: their registers within the launch bounds without spills; for
``fused_select`` two blocks per SM (of 256 threads: at most 128 registers)."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from daskmeans.backends import cuda_src
from daskmeans.backends import gpu_plan as plan

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs NVIDIA's compiler (nvcc)")

# Kernels whose sources size their work to stay in registers (cuda_src.select_rows_source,
# select_cols_source, fused_select's and afkmc2.cu's launch bounds): a spill there is a change
# of design, not of speed alone.
NO_SPILLS = {"select_rows", "select_cols", "fused_select", "fused_recheck", "fused_rerank", "fused_rescan", "afkmc2_block", "afkmc2_fold", "group_min"}


def _modules() -> dict[str, str]:
    afk = "#define AFK_THREADS {}\n#define AFK_DCH {}\n#define AFK_R {}\n"
    return {
        "small, centroids in registers": cuda_src.small_source("float32", 16, 7, 4, True, 256, creg=True),
        "small, shared memory, float64": cuda_src.small_source("float64", 32, 5, 0, False, 256),
        "small, labels only": cuda_src.small_source("float32", 4, 8, 3, False, 256, mode=1),
        "prep, float32": cuda_src.prep_source("float32"),
        "prep, float64": cuda_src.prep_source("float64"),
        "select_rows, float16 tile": cuda_src.select_rows_source("float32", "float16"),
        "select_rows, float32 tile": cuda_src.select_rows_source("float32", "float32"),
        "select_rows, float64": cuda_src.select_rows_source("float64", "float64"),
        "select_cols, 1 row": cuda_src.select_cols_source("float32", 1),
        "select_cols, 4 rows": cuda_src.select_cols_source("float32", 4),
        "sums, float32": cuda_src.sums_source("float32"),
        "sums, float64": cuda_src.sums_source("float64"),
        "fit": cuda_src.FIT_SRC,
        "group_min, float16 tile": cuda_src.group_min_source("float16", "float32"),
        "group_min, float32 tile": cuda_src.group_min_source("float32", "float32"),
        "group_min, float64": cuda_src.group_min_source("float64", "float64"),
        "afkmc2, global memory": afk.format(cuda_src.AFKMC2_THREADS, 0, cuda_src.AFKMC2_ROWS) + cuda_src.AFKMC2_SRC,
        "fused, narrowest": cuda_src.fused_source("float32", plan.fused_dp(1), plan.FUSED_STAGES, 32, plan.FUSED_WARPS),
        "fused, widest": cuda_src.fused_source("float32", plan.FUSED_MAX_DP, plan.FUSED_STAGES, 32, plan.FUSED_WARPS),
        "fused, 256 columns": cuda_src.fused_source("float32", 256, plan.FUSED_STAGES, 32, plan.FUSED_WARPS),
        "fused, 64-column stages": cuda_src.fused_source("float32", 128, 2, 64, plan.FUSED_WARPS),
        "fused, 2 x 2 warps": cuda_src.fused_source("float32", 128, 3, 32, (2, 2)),
        "fused, 8 x 1 warps": cuda_src.fused_source("float32", 64, 4, 64, (8, 1)),
        "fused, the fold by the warp's vote": cuda_src.fused_source("float32", 128, plan.FUSED_STAGES, 64,
                                                                   plan.FUSED_WARPS, vote=True),
        "fused, profile-step's fold of minima": cuda_src.fused_source("float32", 128, plan.FUSED_STAGES, 64,
                                                                      plan.FUSED_WARPS, fold_min=True),
        # every width afkmc2_dch gives (its register configurations), at some widths the most spill-prone
        **{f"afkmc2, {dch} columns a lane": afk.format(cuda_src.AFKMC2_THREADS, dch, cuda_src.AFKMC2_ROWS)
           + cuda_src.AFKMC2_SRC for dch in range(1, cuda_src.AFKMC2_MAX_DCH + 1)},
    }


def _compile(item, tmp_path):
    name, src = item
    path = tmp_path / (re.sub(r"\W+", "_", name) + ".cu")
    path.write_text(src)
    proc = subprocess.run([NVCC, "-arch=sm_90", "--std=c++17", "-Xptxas", "-v", "-c", str(path), "-o",
                           str(path.with_suffix(".o"))], capture_output=True, text=True, timeout=600)
    return name, proc.returncode, proc.stderr


def _properties(ptxas: str) -> dict[str, str]:
    """ptxas -v's lines per kernel ("N bytes spill stores", "Used R registers"), by name."""
    return dict(re.findall(r"Function properties for (\w+)\n(.*?)Compile time", ptxas, re.S))


def test_every_module_compiles_and_the_selections_do_not_spill(tmp_path):
    modules = _modules()
    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(lambda item: _compile(item, tmp_path), modules.items()))
    failed = {name: err[-2000:] for name, rc, err in results if rc != 0}
    assert not failed, failed
    seen = set()
    for name, _, err in results:
        for kernel, props in _properties(err).items():
            seen.add(kernel)
            if kernel in NO_SPILLS:
                assert "0 bytes spill stores" in props, (name, kernel, props)
            if kernel == "fused_select":  # two blocks of WM x WN warps in an SM's 64K registers
                wm, wn = (int(re.search(rf"#define {v} (\d+)", modules[name])[1]) for v in ("WM", "WN"))
                regs = int(re.search(r"Used (\d+) registers", props)[1])
                assert 2 * regs * 32 * wm * wn <= 65536, (name, props)
    assert NO_SPILLS <= seen and {"fused_rescan", "fused_small", "gemm_prep0", "sorted_sums", "afkmc2_block"} <= seen, seen
