"""The benchmark harness, without a GPU: its subcommands, the problems defined once, the results
writer, and the README's performance tables against the committed results."""

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every subcommand ``python -m benchmarks`` lists, named here so that one dropped from the list fails.
SUBCOMMANDS = ("kernels", "command", "multigpu", "tiers", "placement", "cpu", "scale", "hosts", "csv-read", "pins", "gridsearch",
               "table", "profile-step", "profile-small", "profile-host", "profile-init", "profile-afk",
               "profile-yinyang", "profile-command", "profile-cold", "yinyang", "ab")
GPU_LIBRARIES = {"cupy", "torch", "dask", "distributed", "daskmeans"}


@pytest.fixture
def bench(monkeypatch):
    """The ``benchmarks`` package, imported from the repository root."""
    monkeypatch.syspath_prepend(str(ROOT))
    import benchmarks.meta
    import benchmarks.problems

    return benchmarks


def test_the_subcommands_named_here_are_the_ones_listed(bench):
    import benchmarks.__main__ as entry

    assert sorted(entry.SUBCOMMANDS) == sorted(SUBCOMMANDS)


def test_help_lists_every_subcommand_without_importing_gpu_libraries():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "benchmarks", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    for sub in SUBCOMMANDS:
        assert re.search(rf"^  {sub}\s", out.stdout, re.M), sub
    imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    assert not imported & GPU_LIBRARIES


def test_every_subcommand_has_help_without_gpu_libraries():
    """Each subcommand parses its options before importing CuPy, PyTorch, Dask or daskmeans."""
    script = f"""
import contextlib, io, sys
from benchmarks.__main__ import main
for sub in {SUBCOMMANDS!r}:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([sub, "--help"])
        except SystemExit as e:
            assert e.code in (0, None), (sub, e.code)
    assert f"python -m benchmarks {{sub}}" in out.getvalue(), sub
    print(sub, "--out" in out.getvalue(), file=sys.stderr)
print(sorted({{m.split(".")[0] for m in sys.modules}} & {GPU_LIBRARIES!r}))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    has_out = dict(line.split() for line in out.stderr.splitlines())
    for sub in ("kernels", "command", "multigpu", "tiers", "cpu"):
        assert has_out[sub] == "True", sub


def test_unknown_subcommand_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "kernel"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("unknown subcommand 'kernel'")


def test_a_subcommand_takes_its_own_options():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "cpu", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert "--ks" in out.stdout and "--merge" in out.stdout
    out = subprocess.run([sys.executable, "-m", "benchmarks", "kernels", "--problems", "P9"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "unknown problem 'P9'" in out.stderr


def test_readme_performance_tables_match_the_committed_results():
    """The README's block is what ``python -m benchmarks table`` writes from benchmarks/results/."""
    out = subprocess.run([sys.executable, "-m", "benchmarks", "table", "--check"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr


def test_table_check_fails_on_a_stale_readme(tmp_path):
    readme = (ROOT / "README.md").read_text()
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace("<!-- performance:end -->", "| stale | row |\n<!-- performance:end -->"))
    out = subprocess.run([sys.executable, "-m", "benchmarks", "table", "--check", "--readme", str(stale)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert len(out.stderr.strip().splitlines()) == 1 and "differ" in out.stderr


def test_problem_shapes_are_defined_once():
    """No benchmark writes a problem's shape itself: each takes it from problems.py."""
    shapes = (r"1_?000_?000, 100, 1_?000\b|300_?000, 408, 5_?000|4_?000_?000, 480, 40_?000|10_?000_?000, 2, 8"
              r"|30_?000_?000, 64, 16|n_samples=1_?000_?000")
    for path in (ROOT / "benchmarks").glob("*.py"):
        if path.name != "problems.py":
            assert not re.search(shapes, path.read_text()), path.name


def test_problems_shapes_and_sliced_draws(bench, tmp_path):
    problems = bench.problems
    assert problems.get("P3").shape == (300_000, 408, 5000)
    assert problems.get("P4").label == "P4 (4e6 x 480, K = 40000)"
    # A draw in slices is the draw at once (the tiers benchmark's P4 was drawn at once).
    small = dataclasses.replace(problems.get("P4"), n=2500, d=7, k=3)
    X, init = small.data(1)
    assert np.array_equal(X, np.random.default_rng(1).standard_normal((2500, 7), dtype=np.float32))
    X2 = np.concatenate([b for _, b in small.randn_blocks(1, rows=1000)])
    assert np.array_equal(X, X2) and np.array_equal(init, X[:3])
    z = small.write_zarr(str(tmp_path / "x.zarr"), 1, rows=1000)  # the same rows, in Zarr chunks of 1000
    assert z.chunks == (1000, 7) and np.array_equal(z[:], X)
    X, init = problems.get("blobs").data(0)
    assert X.shape == (100_000, 2) and X.dtype == np.float32 and init is None
    with pytest.raises(ValueError, match="unknown problem 'P7'"):
        problems.choose("P2,P7", problems.pick("P2"))


def test_write_stamps_and_merges_rows_by_key(bench, tmp_path):
    meta = bench.meta
    layout = meta.Layout(rows={"results": ("problem",)})
    path = str(tmp_path / "k.json")
    meta.write({"benchmark": "b", "device": "G", "date": "d1", "commit": "c1",
                "results": [{"problem": "P2", "t": 1}, {"problem": "P3", "t": 2}]}, path, layout)
    meta.write({"benchmark": "b", "device": "G", "date": "d2", "commit": "c2",
                "results": [{"problem": "P3", "t": 3}, {"problem": "P4", "t": 4}]}, path, layout, merge=True)
    doc = json.loads(Path(path).read_text())
    assert [(r["problem"], r["t"], r["commit"], r["date"]) for r in doc["results"]] == [
        ("P2", 1, "c1", "d1"), ("P3", 3, "c2", "d2"), ("P4", 4, "c2", "d2")]
    assert doc["commit"] == "c2" and doc["date"] == "d2"
    meta.write({"benchmark": "b", "device": "G", "date": "d3", "commit": "c3", "results": []}, path, layout)
    assert json.loads(Path(path).read_text())["results"] == []  # without --merge: replaced
    with pytest.raises(SystemExit, match="device 'G'"):
        meta.write({"benchmark": "b", "device": "H", "date": "d4", "commit": "c4", "results": []}, path, layout,
                   merge=True)


def test_merge_keeps_the_committed_tiers_structure(bench):
    """A ``tiers --p4`` run merged into the committed file replaces its p4 part only."""
    from benchmarks import tiers  # light: its GPU imports are inside functions

    old = json.loads((ROOT / "benchmarks" / "results" / "tiers_h200.json").read_text())
    new = {"benchmark": "tiers", "device": old["device"], "date": "d", "commit": "c",
           "p4": {"device": {"iteration_s": 2.0}, "host": {"iteration_s": 2.0}, "host_over_device": 1.0}}
    bench.meta._stamp(new, tiers.LAYOUT, "c", "d")
    doc = bench.meta.merged(copy.deepcopy(old), new, tiers.LAYOUT)
    assert set(doc) == {"benchmark", "device", "date", "throughput", "p4", "limits"}
    assert doc["throughput"] == old["throughput"] and doc["limits"] == old["limits"]
    assert doc["p4"]["commit"] == "c" and doc["p4"]["date"] == "d" and doc["date"] == "d"


def test_merge_stamps_entries_of_an_older_file_with_its_commit(bench):
    from benchmarks import command

    # An older file: its entries carry no commit of their own, only the file's (the layout
    # before entries were stamped), as the committed results once were.
    old = {"benchmark": "command", "device": "NVIDIA H200", "date": "d0", "commit": "28235cd",
           "problems": {"p1": {"wall_s": 3.0}, "p3": {"wall_s": 2.0}}}
    new = {"benchmark": "command", "device": old["device"], "date": "d", "commit": "c",
           "problems": {"p4": {"wall_s": 1.0}}}
    bench.meta._stamp(new, command.LAYOUT, "c", "d")
    doc = bench.meta.merged(copy.deepcopy(old), new, command.LAYOUT)
    assert list(doc["problems"]) == [*old["problems"], "p4"]
    assert doc["problems"]["p3"]["commit"] == old["commit"] and doc["problems"]["p4"]["commit"] == "c"


# The kernel benchmark's flash-kmeans peer: what runs without a GPU (its timing needs one).


def _kernel_row(flash):
    """A ``kernels`` row as the run builds it before :func:`add_ratios` (figures in seconds)."""
    return {"problem": "W14", "n": 2_000_000, "d": 128, "k": 1 << 14,
            "gemm_fp32_s": 0.20, "gemm_fp32_ev_s": 0.19, "gemm_tf32_s": 0.05, "gemm_tf32_ev_s": 0.05,
            "gemm_fp16_s": 0.025, "gemm_fp16_ev_s": 0.02, "hbm_read_s": 0.001, "hbm_read_ev_s": 0.001,
            "daskmeans_fp32_s": 0.12, "daskmeans_fp32_ev_s": 0.114, "daskmeans_tf32_s": 0.03,
            "daskmeans_tf32_ev_s": 0.025, "torch_tf32_s": 0.06, "torch_tf32_ev_s": 0.05, "rechecked_tf32": 0.12,
            "flash_kmeans": flash}


def test_kernels_add_ratios_over_flash_kmeans_iteration(bench):
    from benchmarks import kernels

    r = _kernel_row({"fp16": {"iteration_s": 0.024, "iteration_ev_s": 0.0228, "call_s": 0.03, "call_ev_s": 0.029},
                     "fp32": {"iteration_s": 0.04, "iteration_ev_s": 0.039}})
    kernels.add_ratios(r)
    assert r["ratio_tf32_vs_flash_fp16"] == pytest.approx(0.03 / 0.024)
    assert r["ratio_tf32_vs_flash_fp16_ev"] == pytest.approx(0.025 / 0.0228)
    assert r["ratio_fp32_vs_flash_fp32"] == pytest.approx(0.12 / 0.04)
    assert r["ratio_fp32_vs_flash_fp32_ev"] == pytest.approx(0.114 / 0.039)
    # the floors' ratios as before
    assert r["ratio_tf32_vs_gemm_fp16"] == pytest.approx(0.03 / 0.025)
    assert r["ratio_fp32_vs_gemm_fp32_ev"] == pytest.approx(0.114 / 0.19)
    assert r["speedup_tf32_vs_torch"] == pytest.approx(2.0)
    assert not any("flash_fp32" in key and "tf32" in key for key in r)  # tf32 meets fp16 input only

    # A refused precision has no ratio; nor has a row without flash-kmeans (absent or --skip-flash).
    refused = _kernel_row({"fp16": {"error": "OutOfResources: out of resource: shared memory"},
                           "fp32": {"iteration_s": 0.04, "iteration_ev_s": 0.039}})
    kernels.add_ratios(refused)
    assert not any(key.startswith("ratio_tf32_vs_flash") for key in refused)
    assert refused["ratio_fp32_vs_flash_fp32"] == pytest.approx(3.0)
    for flash in (None, "missing"):
        r = _kernel_row(flash)
        if flash == "missing":
            del r["flash_kmeans"]  # a row of an older file
        kernels.add_ratios(r)
        assert not any("flash" in key for key in r if key != "flash_kmeans")
        assert r["ratio_tf32_vs_gemm_tf32"] == pytest.approx(0.6)


def test_kernels_table_shows_a_null_flash_row_as_dashes(bench):
    from benchmarks import kernels

    rows = [_kernel_row(None),
            _kernel_row({"fp16": {"iteration_s": 0.024, "iteration_ev_s": 0.0228},
                         "fp32": {"error": "OutOfResources: out of resource: shared memory, Required: 262144"}})]
    rows[1]["problem"] = "P3"
    for r in rows:
        kernels.add_ratios(r)
    old = _kernel_row(None)  # an older file's row: no flash key, no fp16 GEMM
    del old["flash_kmeans"], old["gemm_fp16_s"], old["gemm_fp16_ev_s"]
    old["problem"] = "P4"
    old.update(ratio_fp32_vs_gemm_fp32=0.6, ratio_tf32_vs_gemm_tf32=0.6)
    rows.append(old)
    lines = kernels.table(rows).splitlines()
    header = lines[0].split()
    assert "flash16" in header and "flash32" in header and lines[0].count("x fl16") == 1
    assert [line.split()[0] for line in lines[1:7]] == ["W14", "W14_ev", "P3", "P3_ev", "P4", "P4_ev"]
    width = len(lines[0])
    assert all(len(line) == width for line in lines[1:7])  # columns line up, "-" included

    def cell(line, name):
        """The text under header column ``name`` (right-aligned columns end where its title ends)."""
        end = lines[0].index(name) + len(name)
        return line[:end].split()[-1]

    for line in lines[1:3] + lines[5:7]:  # null and missing flash: dashes in the flash columns only
        assert cell(line, "flash16") == cell(line, "flash32") == "-"
        assert cell(line, "x fl16") == cell(line, "x fl32") == "-"
        assert cell(line, "fp32") != "-"
    assert cell(lines[1], "x gm16") == "1.20" and cell(lines[5], "x gm16") == "-"
    assert cell(lines[3], "flash16") == "24.000" and cell(lines[4], "flash16") == "22.800"
    assert cell(lines[3], "x fl16") == "1.25" and cell(lines[3], "flash32") == "-"
    assert lines[7:] == ["P3: flash-kmeans fp32: OutOfResources: out of resource: shared memory, Required: 262144"]


def test_kernels_arguments(bench):
    from benchmarks import kernels

    from daskmeans.options import PRECISIONS

    assert kernels.MODES == PRECISIONS
    args = kernels.parse_args(["--problems", "W10,W12,W14,W16,W18", "--modes", "fp32,tf32", "--skip-flash"])
    assert [p.shape for p in args.problems] == [(2_000_000, 128, 1 << k) for k in (10, 12, 14, 16, 18)]
    assert args.modes == ["fp32", "tf32"] and args.skip_flash and not args.skip_torch
    assert args.out is None and not args.merge
    args = kernels.parse_args([])
    assert [p.name for p in args.problems] == ["P2", "P3", "P4", "S1", "S2"]
    assert args.modes == ["fp32", "tf32", "bf16"] and not args.skip_flash
    for argv, message in ((["--modes", "fp32,fp16"], "unknown mode 'fp16'"),
                          (["--problems", "W11"], "unknown problem 'W11'"),
                          (["--merge"], "--merge needs --out")):
        out = subprocess.run([sys.executable, "-m", "benchmarks", "kernels", *argv], cwd=ROOT, capture_output=True,
                             text=True)
        assert out.returncode == 2 and message in out.stderr, (argv, out.stderr)


def test_kernels_load_flash_absent_or_without_its_triton_kernels(bench, monkeypatch):
    import types

    from benchmarks import kernels

    monkeypatch.setitem(sys.modules, "flash_kmeans", None)  # not installed: import raises ImportError
    assert kernels.load_flash() == (None, None, None)
    # Installed, but its Triton modules failed to import: the package binds its PyTorch fallback.
    fake = types.ModuleType("flash_kmeans")
    fake.__version__ = "0.3.1"

    def batch_kmeans_Euclid_torch_native(*args, **kwargs):
        raise AssertionError("never run")

    batch_kmeans_Euclid_torch_native.__module__ = "flash_kmeans.torch_fallback"
    fake.batch_kmeans_Euclid = batch_kmeans_Euclid_torch_native
    monkeypatch.setitem(sys.modules, "flash_kmeans", fake)
    module, version, error = kernels.load_flash()
    assert module is fake and version == "0.3.1"
    assert error.startswith("ModuleNotFoundError: No module named 'flash_kmeans.kmeans_triton_impl'")
    assert kernels.first_line(RuntimeError("out of resource: shared memory\nReducing block sizes")) == (
        "RuntimeError: out of resource: shared memory")
    assert kernels.first_line(RuntimeError()) == "RuntimeError"


def test_ab_alternates_which_code_goes_first_and_reports_medians_and_ratios(bench, tmp_path, monkeypatch):
    """``ab`` runs the inner benchmark on each code once per round, current first in even
    rounds and baseline first in odd ones (ABBA), and compares rows matched by the inner
    benchmark's key fields: medians of each code and current / baseline."""
    import benchmarks.ab as ab

    calls = []
    per_code = {"current": iter([8.2, 8.6, 8.4, 9.0]), "baseline": iter([8.0, 8.4, 8.3, 8.5])}

    def fake_run(code, inner, src, site, out, timeout):
        calls.append(code)
        row = {"problem": "P3", "precision": "fp32", "gpus": 2, "collective": "nccl", "chunking": "default",
               "iteration_s": next(per_code[code])}
        other = dict(row, gpus=1, iteration_s=1.0 if code == "current" else 2.0)
        return {"results": [row, other] if code == "current" else [row]}  # a row only one code has is left out

    monkeypatch.setattr(ab, "_run", fake_run)
    src = tmp_path / "old"
    src.mkdir()
    (src / ".commit").write_text("8c3ca9b\n")
    out = tmp_path / "ab.json"
    ab.main(["--baseline-src", str(src), "--baseline-site", str(tmp_path / "site"), "--rounds", "4",
             "--out", str(out), "--", "multigpu", "--problems", "P3"])
    assert calls == ["current", "baseline", "baseline", "current", "current", "baseline", "baseline", "current"]
    doc = json.loads(out.read_text())
    (key,) = doc["comparisons"]
    assert key == "multigpu 8c3ca9b results P3 fp32 2 nccl default"
    c = doc["comparisons"][key]
    assert c["current"] == [8.2, 8.6, 8.4, 9.0] and c["baseline"] == [8.0, 8.4, 8.3, 8.5]
    assert c["current_first_in_round"] == [True, False, True, False]
    assert c["current_median"] == pytest.approx(8.5) and c["baseline_median"] == pytest.approx(8.35)
    assert c["ratio"] == pytest.approx(8.5 / 8.35)
    assert c["commit"] and c["date"]


def test_ab_keeps_the_rounds_done_when_a_later_one_fails(bench, tmp_path, monkeypatch):
    """Its file is written after every round: a run that fails (or a lease's time limit) in
    round 2 leaves round 1's comparison; a baseline tree without ``.commit`` outside git is named
    by its folder."""
    import benchmarks.ab as ab

    runs = iter([8.0, 8.5, None])

    def fake_run(code, inner, src, site, out, timeout):
        value = next(runs)
        if value is None:
            raise RuntimeError("current run of multigpu failed (137)")
        return {"results": [{"problem": "P3", "precision": "fp32", "gpus": 2, "collective": "nccl",
                             "chunking": "default", "iteration_s": value}]}

    monkeypatch.setattr(ab, "_run", fake_run)
    src = tmp_path / "tree-of-8c3ca9b"
    src.mkdir()
    out = tmp_path / "ab.json"
    with pytest.raises(RuntimeError, match="failed"):
        ab.main(["--baseline-src", str(src), "--baseline-site", str(tmp_path / "site"), "--rounds", "3",
                 "--out", str(out), "--", "multigpu", "--problems", "P3"])
    doc = json.loads(out.read_text())
    (key,) = doc["comparisons"]
    assert key == "multigpu tree-of-8c3ca9b results P3 fp32 2 nccl default"
    c = doc["comparisons"][key]
    assert c["rounds"] == 1 and c["current"] == [8.0] and c["baseline"] == [8.5]


@pytest.mark.parametrize("argv, message", [
    (["--baseline-src", "x", "--baseline-site", "y"], "name the benchmark to run after '--'"),
    (["--baseline-src", "x", "--baseline-site", "y", "--", "multigpu", "--out", "z.json"], "give --out before '--'"),
    (["--baseline-src", "x", "--baseline-site", "y", "--", "placement"], "placement writes no rows to compare"),
])
def test_ab_refuses_what_it_cannot_compare(bench, argv, message, capsys):
    import benchmarks.ab as ab

    with pytest.raises(SystemExit) as e:
        ab.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_profile_command_samples_a_whole_fit(tmp_path):
    """``profile-command`` runs the command as the script does and shows where its main thread
    was: the engine's steps below ``fit_distributed`` in the timeline, and the command's result."""
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(0).standard_normal((2000, 4)).astype(np.float32))
    model = tmp_path / "m.zarr"
    out = subprocess.run([sys.executable, "-m", "benchmarks", "profile-command", "--every", "1", "--top", "1000", "--", "fit",
                          str(data), "--k", "3", "--max-iter", "2", "--backend", "cpu", "-o", str(model), "-q"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert model.exists()
    stacks, timeline = out.stdout.split("below run_fit / fit_distributed")
    # The engine's fit below the command, and its job's steps (sampled every millisecond).
    assert re.search(r"cli/fit\.py:run_fit:\d+ > .*engine/fit\.py:fit_distributed:\d+ > engine/job\.py:", stacks)
    assert re.search(r"^\s+\d+\.\d{3}\s+\d+\.\d{3}\s+\S", timeline, re.M), out.stdout  # its changes, timed
    # With --threads, the in-process worker's task thread too: the engine's tasks, where they ran
    # (a fit whose steps take their threads about 0.1 s, many samples: the 2000 rows' few
    # milliseconds were missed by a sampler sharing two cores with the fit).
    longer = tmp_path / "longer.npy"
    np.save(longer, np.random.default_rng(0).standard_normal((100_000, 8)).astype(np.float32))
    out = subprocess.run([sys.executable, "-m", "benchmarks", "profile-command", "--every", "1", "--threads",
                          "--during", "init_kmeans_parallel", "--", "fit", str(longer), "--k", "3", "--max-iter", "20",
                          "--tol", "0", "--backend", "cpu", "-o", str(model), "--overwrite", "-q"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    threads = out.stdout.split("\nthread ")[1:]
    assert any(re.search(r"seeding/kmeans_parallel\.py:", t) for t in threads), out.stdout
    # --during: the worker threads' samples while the main thread was in the init, and their
    # timeline there (the tasks' functions, timed).
    during = out.stdout.split("while the main thread was in init_kmeans_parallel: ")[1].split("\n\n")[0]
    assert re.search(r"^\s+\d+\.\d{3}\s+\d+\.\d{3}\s+seeding/kmeans_parallel\.py:_par_", during, re.M), out.stdout
    assert not re.search(r"engine/(loop|step)\.py:", out.stdout.split("while the main thread")[1]), out.stdout
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "profile-command", "--every", "1"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "give the daskmeans command after --" in bad.stderr


def test_profile_cold_places_each_kernel_binary_in_the_phase_it_was_written(bench, tmp_path):
    """``profile-cold``'s timeline, on a kernel cache made by hand: each binary at its file's
    time from the command's start, in the phase that holds it, with the kernels its saved
    source defines; the warm-up markers listed, not counted as binaries."""
    from benchmarks import profile_cold

    src = ('extern "C" __global__ void cupy_add__int64(long long* x) {}\n'
           '__global__ void __launch_bounds__(256) fused_assign(float* x) {}\n')
    assert profile_cold.kernels(src) == ["cupy_add__int64", "fused_assign"]
    timeline = profile_cold.spans({"imports": 1.0, "fit moments": 0.5, "fit init": 2.0})
    assert timeline == [("imports", 0.0, 1.0), ("fit moments", 1.0, 1.5), ("fit init", 1.5, 3.5)]
    assert [profile_cold.phase_at(t, timeline) for t in (-0.1, 0.0, 1.2, 3.49, 3.5)] == [
        "before", "imports", "fit moments", "fit init", "after"]
    start = 1_000_000.0
    for name, t, source in (("b.cubin", 2.0, src), ("a.cubin", 0.5, None), ("daskmeans-warm-float32-3", 1.7, None),
                            ("c.cubin", 9.0, None)):
        path = tmp_path / "cupy" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x")
        if source:
            (tmp_path / "cupy" / (name + ".cu")).write_text(source)
        os.utime(path, (start + t, start + t))
    files = profile_cold.cache_files(str(tmp_path))
    assert [(round(w - start, 3), f, k) for w, f, k in files] == [
        (0.5, "a.cubin", []), (1.7, "daskmeans-warm-float32-3", []), (2.0, "b.cubin", ["cupy_add__int64", "fused_assign"]),
        (9.0, "c.cubin", [])]
    lines = profile_cold.report(files, start, timeline)
    assert re.match(r"\s+2\.000\s+fit init\s+b\.cubin\s+cupy_add__int64, fused_assign$", lines[2]), lines
    assert lines[-1] == "binaries written per phase: imports 1, fit init 1, after 1"


def test_profile_cold_runs_a_command_and_times_it_from_its_start():
    """On a host without a GPU the command compiles nothing: the phases from ``--timings``'
    start on the same clock, and no binary."""
    out = subprocess.run([sys.executable, "-m", "benchmarks", "profile-cold", "blobs"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"^blobs on an empty kernel cache: \d+\.\d{3} s", out.stdout, re.M), out.stdout
    assert re.search(r"^  fit iterations\s+\d+\.\d{3} -> +\d+\.\d{3}$", out.stdout, re.M), out.stdout
    assert re.search(r"^binaries written per phase: ?\nthe warm-up processes ended \d+\.\d s after that, having written 0 "
                     r"more files$", out.stdout, re.M), out.stdout
