"""The benchmark harness (no GPU needed): its subcommands, and the problems defined once."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_harness_lists_every_subcommand_without_importing_gpu_libraries():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "benchmarks", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    for sub in ("kernels", "command", "multigpu", "tiers", "cpu", "profile-step", "profile-small", "profile-host"):
        assert re.search(rf"^  {sub}\s", out.stdout, re.M), sub
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert not imported & {"cupy", "torch", "dask", "daskmeans"}


def test_unknown_subcommand_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "kernel"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("unknown subcommand 'kernel'")


def test_a_subcommand_runs_its_script_with_its_options():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "cpu", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert "--ks" in out.stdout


def test_problem_shapes_are_defined_once():
    """No benchmark writes a problem's shape itself: each takes it from problems.py."""
    shapes = r"1_000_000, 100, 1000|300_000, 408, 5000|4_000_000, 480, 40_?000|10_000_000, 2, 8"
    for path in (ROOT / "benchmarks").glob("*.py"):
        if path.name != "problems.py":
            assert not re.search(shapes, path.read_text()), path.name
