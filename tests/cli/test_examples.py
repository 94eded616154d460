"""The examples in ``examples/`` run end to end and say what they should: the CPU ones here,
the GPU one on a GPU host."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str, timeout: int = 600) -> str:
    p = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_quickstart(tmp_path):
    out = _run("quickstart.py", str(tmp_path))
    assert re.search(r"^\d+ iterations, inertia \S+, converged True$", out, re.M), out
    sizes = [int(s) for s in re.search(r"cluster sizes \[(.*)\]", out).group(1).split(",")]
    assert len(sizes) == 6 and sum(sizes) == 200_000
    assert float(re.search(r"to its centroid (\S+)", out).group(1)) < 0.1, out
    assert "labels equal to the training labels: True" in out
    assert {p.name for p in tmp_path.iterdir()} == {"blobs.zarr", "model.zarr", "report.png"}


def test_pipeline():
    out = _run("pipeline.py")
    assert "agreement with the true groups 1.0000" in out, out
    assert len(re.findall(r"^k=\d  held-out inertia", out, re.M)) == 5
    assert out.strip().endswith("the largest drop in held-out inertia comes with k = 3"), out


def test_notebook():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # committed without outputs
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert re.search(r"^iter    1  inertia \S+  shift ", text, re.M) and "converged: True" in text, text
    sizes = [int(s) for s in re.search(r"cluster sizes \[(.*)\]", text).group(1).split(",")]
    assert len(sizes) == 10 and sum(sizes) == 300_000
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1  # the report, shown inline


@pytest.mark.gpu
def test_gpu_out_of_core(tmp_path):
    out = _run("gpu_out_of_core.py", str(tmp_path), timeout=1200)
    assert "tiers used: ['device', 'host', 'storage'] - centroids bitwise equal: True" in out, out
