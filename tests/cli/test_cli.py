"""The command line: the README's workflow end to end, and one-line errors for bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zarr

from daskmeans.cli import main
from terminal import on_a_terminal
from clirun import run


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    path = str(d / "data.zarr")
    assert main(["generate", "blobs", "--n", "30000", "--d", "6", "--centers", "4", "--chunk-rows", "4000", "-o", path]) == 0
    return d, path


def test_generate_writes_chunked_zarr(blobs):
    _, path = blobs
    a = zarr.open_array(path, mode="r")
    assert a.shape == (30000, 6) and a.chunks == (4000, 6) and a.dtype == np.float32
    assert np.isfinite(a[:]).all()


def test_fit_info_predict_roundtrip(blobs, capsys):
    d, data = blobs
    model, labels, pred = str(d / "m.zarr"), str(d / "l.zarr"), str(d / "p.zarr")
    rc, _, err = run(capsys, "fit", data, "--k", "4", "--seed", "3", "-o", model, "--labels", labels, "--workers", "2")
    assert rc == 0, err
    assert "iter    1" in err and "model written" in err
    rc, out, _ = run(capsys, "info", model)
    assert rc == 0 and "clusters     4  features 6" in out
    rc, out, _ = run(capsys, "info", model, "--json")
    attrs = json.loads(out)
    assert attrs["format"] == "daskmeans-model" and attrs["params"]["n_clusters"] == 4
    rc, _, err = run(capsys, "predict", model, data, "-o", pred, "--workers", "2")
    assert rc == 0, err
    a = zarr.open_group(labels, mode="r")["labels"][:]
    b = zarr.open_group(pred, mode="r")["labels"][:]
    assert a.shape == (30000,) and (a == b).all()
    assert sorted(np.bincount(a, minlength=4) > 5000) == [True] * 4


def _one_line_error(rc, out, err):
    # Progress lines may precede it (errors found while reading the data on the cluster),
    # but the error itself is exactly one line, the last, and there is no traceback.
    assert rc != 0
    lines = [ln for ln in err.strip().splitlines() if ln]
    errors = [ln for ln in lines if ln.startswith("daskmeans: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert "Traceback" not in err
    return errors[0]


def test_missing_file(tmp_path, capsys):
    line = _one_line_error(*run(capsys, "fit", str(tmp_path / "nope.zarr"), "--k", "3", "-o", str(tmp_path / "m.zarr")))
    assert "no such file" in line
    assert not os.path.exists(tmp_path / "m.zarr")


def test_k_larger_than_n(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((10, 2)))
    line = _one_line_error(*run(capsys, "fit", str(tmp_path / "x.npy"), "--k", "11", "-o", str(tmp_path / "m.zarr")))
    assert "n_samples=10 should be >= n_clusters=11" in line
    assert not os.path.exists(tmp_path / "m.zarr")


def test_non_numeric_csv(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("a,b\n1,x\n2,y\n3,z\n")
    line = _one_line_error(*run(capsys, "fit", str(tmp_path / "x.csv"), "--k", "1", "-o", str(tmp_path / "m.zarr")))
    assert "column 'b'" in line and "not numeric" in line


def test_csv_drop_label_column(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x = np.r_[rng.normal(0, 0.1, (50, 2)), rng.normal(5, 0.1, (50, 2))]
    rows = "\n".join(f"{a},{b},{'p' if i < 50 else 'q'}" for i, (a, b) in enumerate(x))
    (tmp_path / "x.csv").write_text("f1,f2,label\n" + rows + "\n")
    rc, _, err = run(capsys, "fit", str(tmp_path / "x.csv"), "--k", "2", "--drop-columns", "label", "--seed", "0",
                     "-o", str(tmp_path / "m.zarr"), "--workers", "1", "-q")
    assert rc == 0, err
    centers = np.sort(zarr.open_group(str(tmp_path / "m.zarr"), mode="r")["cluster_centers"][:, 0])
    np.testing.assert_allclose(centers, [0, 5], atol=0.1)


def test_nan_in_data(tmp_path, capsys):
    x = np.random.default_rng(0).random((100, 3))
    x[7, 2] = np.nan
    np.save(tmp_path / "x.npy", x)
    line = _one_line_error(*run(capsys, "fit", str(tmp_path / "x.npy"), "--k", "2", "-o", str(tmp_path / "m.zarr"), "--workers", "1", "-q"))
    assert "NaN" in line and "row 7" in line
    assert not os.path.exists(tmp_path / "m.zarr")
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


def test_existing_output_refused(blobs, tmp_path, capsys):
    _, data = blobs
    (tmp_path / "m.zarr").mkdir()
    line = _one_line_error(*run(capsys, "fit", data, "--k", "2", "-o", str(tmp_path / "m.zarr")))
    assert "--overwrite" in line


def test_bad_model_path(tmp_path, capsys):
    line = _one_line_error(*run(capsys, "info", str(tmp_path / "none.zarr")))
    assert "no such model" in line


def test_fit_cosine_and_zero_row_error(blobs, tmp_path, capsys):
    _, data = blobs
    model = str(tmp_path / "cos.zarr")
    rc, _, err = run(capsys, "fit", data, "--k", "4", "--seed", "1", "--metric", "cosine", "-o", model, "--workers", "2", "-q")
    assert rc == 0, err
    attrs = zarr.open_group(model, mode="r").attrs
    assert attrs["params"]["metric"] == "cosine" and attrs["params"]["precision"] == "fp32"
    np.testing.assert_allclose(np.linalg.norm(zarr.open_group(model, mode="r")["cluster_centers"][:], axis=1), 1, rtol=1e-6)
    bad = str(tmp_path / "zero.npy")
    x = np.ones((100, 3), np.float32)
    x[42] = 0
    np.save(bad, x)
    out_model = str(tmp_path / "never.zarr")
    msg = _one_line_error(*run(capsys, "fit", bad, "--k", "2", "--metric", "cosine", "-o", out_model, "--workers", "1"))
    assert "row 42 is all zeros" in msg
    assert not os.path.exists(out_model)


def test_help_imports_neither_dask_nor_numpy():
    """`daskmeans --help` must answer at once: the command's module loads no heavy library
    until a command needs one (the speed target itself lives in the benchmarks)."""
    import subprocess
    import sys

    code = ("import sys, daskmeans.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('dask', 'distributed', 'numpy', 'zarr', 'cupy') if m in sys.modules)\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "usage: daskmeans" in out.stdout and "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_the_command_skips_dask_optional_imports(blobs, tmp_path):
    """Dask imports xarray (~0.35 s with pandas), SciPy's sparse matrices and SciPy's FFT
    (~0.15 s) and Jinja where installed, to recognise such objects or for HTML views: the
    command's own process never needs them. With a stand-in xarray installed and an import
    hook logging every attempt to load them (``sitecustomize``), a plain ``import dask.array``
    tries all of them; the command (``python -m daskmeans fit``) none."""
    import subprocess
    import sys

    pytest.importorskip("scipy")
    site = tmp_path / "site"
    (site / "xarray").mkdir(parents=True)
    (site / "xarray" / "__init__.py").write_text("__version__ = '2099.1.0'\n")
    meta = site / "xarray-2099.1.0.dist-info"  # Dask asks for an installed distribution
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: xarray\nVersion: 2099.1.0\n")
    log = tmp_path / "tried"
    optional = ("xarray", "scipy.sparse", "scipy.fftpack", "jinja2")
    # Called only for a name not already in sys.modules: a name the command marked absent
    # fails before any finder is asked.
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name in {optional!r}:\n"
        f"            open({str(log)!r}, 'a').write(name + '\\n')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Watch())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))

    def tried(argv):
        log.write_text("")
        p = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return set(log.read_text().split())

    assert tried(["-c", "import dask.array"]) == set(optional)  # the premise: Dask does import them
    _, path = blobs
    assert tried(["-m", "daskmeans", "fit", path, "--k", "4", "-q", "-o", str(tmp_path / "m.zarr")]) == set()
    assert (tmp_path / "m.zarr").exists()


def test_the_commands_fit_loads_its_kernels_without_scipy_linalg(tmp_path):
    """Numba imports SciPy's BLAS wrappers (all of ``scipy.linalg``) as it loads its first
    kernel, only to offer ``np.dot`` in compiled code: the command's process marks them absent,
    and its CPU fit, whose kernels use none, runs and writes its model."""
    import subprocess
    import sys

    pytest.importorskip("scipy")
    x = np.random.default_rng(0).standard_normal((3000, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "m.zarr"
    code = ("import sys\nfrom daskmeans import cli\nfrom daskmeans.cli.main import command_process\ncommand_process()\n"
            f"assert cli.main(['fit', {str(tmp_path / 'x.npy')!r}, '--k', '3', '-q', '-o', {str(out)!r}, '--backend', 'cpu']) == 0\n"
            "print('LINALG', 'scipy.linalg' in sys.modules, 'numba' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "LINALG False True"
    assert out.exists()


@pytest.mark.parametrize("argv, jinja", [(["fit", "x.npy", "--k", "2"], False),
                                         (["fit", "x.npy", "--k", "2", "--dashboard"], True),
                                         (["fit", "x.npy", "--k", "2", "--dash"], True)])  # argparse's prefix
def test_the_command_keeps_jinja_for_a_dashboard_only(argv, jinja):
    """The command's process goes without Jinja (Dask's HTML views) unless it serves Dask's
    dashboard, whose pages need it: as ``run`` sets it up from the command line."""
    import subprocess
    import sys

    pytest.importorskip("jinja2")
    code = ("from daskmeans.cli.main import command_process, parser\n"
            f"args = parser().parse_args({argv!r})\n"
            "command_process(dashboard=args.dashboard)\n"
            "try:\n    import jinja2\nexcept ImportError:\n    print('JINJA False')\nelse:\n    print('JINJA True')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["JINJA", str(jinja)]


def test_a_fit_from_npy_writes_its_model_without_zarr_python(tmp_path):
    """The model is a Zarr group written from the format's specification: a fit of a .npy file
    never imports zarr-python (~0.4 s of imports), and daskmeans.load reads the model."""
    import subprocess
    import sys

    import daskmeans

    x = np.random.default_rng(0).standard_normal((3000, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "m.zarr"
    code = ("import sys\nfrom daskmeans import cli\nfrom daskmeans.cli.main import command_process\ncommand_process()\n"
            f"assert cli.main(['fit', {str(tmp_path / 'x.npy')!r}, '--k', '3', '-q', '-o', {str(out)!r}]) == 0\n"
            "print('ZARR', 'zarr' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "ZARR False"
    km = daskmeans.load(str(out))
    assert km.cluster_centers_.shape == (3, 3) and km.n_features_in_ == 3


@pytest.mark.parametrize("parsed_first", [False, True], ids=["plain", "size-option"])
@pytest.mark.parametrize("user_level, shown", [(None, False), ("info", True)])
def test_the_command_keeps_dask_log_lines_out_unless_the_user_asks(user_level, shown, parsed_first):
    """Dask logs comm events with tracebacks when an interrupted fit's cluster closes, and its
    client an error when it fails to reconnect to a lost scheduler: the command's process
    keeps them off stderr, unless the user sets Dask's logging level. Also where parsing a
    size option (``--chunk-bytes``) imported Dask before the command's settings."""
    import subprocess
    import sys

    code = ("from daskmeans.cli.main import command_process, parser\n"
            + ("parser().parse_args(['fit', 'x.npy', '--k', '2', '-o', 'm.zarr', '--chunk-bytes', '4MiB'])\n"
               "import sys\nassert 'dask.config' in sys.modules\n" if parsed_first else "")
            + "command_process()\n"
            "import logging, distributed\n"
            "try:\n    raise OSError('comm closed')\nexcept OSError:\n"
            "    logging.getLogger('distributed.batched').info('Batched Comm Closed', exc_info=True)\n"
            "logging.getLogger('distributed.client').error('Failed to reconnect to scheduler')\n")
    env = {k: v for k, v in os.environ.items() if k != "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED"}
    if user_level:
        env["DASK_DISTRIBUTED__LOGGING__DISTRIBUTED"] = user_level
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert ("Batched Comm Closed" in p.stderr and "Traceback" in p.stderr) is shown, p.stderr
    assert ("Failed to reconnect" in p.stderr) is shown, p.stderr
    if not shown:
        assert p.stderr == ""


def test_every_flag_is_in_the_readme_cli_reference_and_back():
    """The README's CLI reference names every command and flag of the parser, and nothing else."""
    import argparse
    import re
    from pathlib import Path

    from daskmeans.cli.main import parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## CLI reference", 1)[1].split("\n## ", 1)[0]

    def walk(p: argparse.ArgumentParser, path: tuple):
        for a in p._actions:  # argparse has no public listing of a parser's options
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from walk(sub, path + (name,))
            else:
                yield path, [s for s in a.option_strings if s not in ("-h", "--help")]

    flags, commands = set(), set()
    for path, opts in walk(parser(), ()):
        commands.add(" ".join(path))
        flags.update(opts)
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-z])(?![\w-])", section))
    assert not flags - named, f"flags missing from the README's CLI reference: {sorted(flags - named)}"
    assert not named - flags, f"the README names flags the parser lacks: {sorted(named - flags)}"
    for c in commands - {""}:
        assert f"daskmeans {c}" in section, c


def test_info_prints_the_history_table(blobs, capsys, tmp_path):
    from daskmeans.cli import main

    rc = main(["fit", blobs[1], "--k", "3", "--workers", "1", "-q", "--max-iter", "4", "--tol", "0",
               "-o", str(tmp_path / "m.zarr")])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["info", str(tmp_path / "m.zarr")]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(out) if line.split()[:2] == ["iter", "inertia"])
    assert out[head].split() == ["iter", "inertia", "shift", "reassigned", "empty", "imbalance", "seconds", "GB/s"]
    rows = [line.split() for line in out[head + 1:]]
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)) and 1 <= len(rows) <= 4
    assert all(float(r[5]) >= 1.0 and float(r[7]) > 0 for r in rows)


def test_progress_is_a_bar_on_a_terminal(blobs):
    import re
    import sys

    d, data = blobs
    out = on_a_terminal([sys.executable, "-m", "daskmeans", "fit", data, "--k", "4", "--seed", "0", "--n-init", "2",
                          "--workers", "2", "-o", str(d / "bar.zarr")])
    assert "iter    1" not in out  # no log lines: the bar
    for r in (1, 2):
        final = re.findall(rf"run {r}/2: 100%\|[^|]+\| (\d+)/(\d+) \[inertia \S+ shift \S+ [\d.]+s/it\]", out)
        assert len(final) == 1 and final[0][0] == final[0][1], out  # ends at its last iteration
    assert "model written to" in out


def test_verbose_lines_and_numbered_runs(blobs, capsys):
    d, data = blobs
    rc, _, err = run(capsys, "fit", data, "--k", "4", "--seed", "0", "--n-init", "2", "-v", "--max-iter", "3",
                     "--tol", "0", "--workers", "2", "-o", str(d / "v.zarr"))
    assert rc == 0, err
    lines = [x for x in err.splitlines() if " iter " in x]
    heads = [x.split()[:4] for x in lines]
    for r in (1, 2):  # each run numbered, its iterations from 1 (a run may stop early: no label changed)
        its = [int(h[3]) for h in heads if h[:3] == ["run", f"{r}/2", "iter"]]
        assert its == list(range(1, len(its) + 1)) and its, heads
    assert len(heads) == sum(h[0] == "run" for h in heads)
    assert all(" imbalance " in x and x.endswith(" GB/s") for x in lines), lines


def test_a_dashboard_without_bokeh_is_one_line_before_any_work(tmp_path):
    """``--dashboard`` where bokeh cannot be imported (a package of that name that raises, on
    the path first): one error line naming bokeh, exit 1, no cluster started, no model; it
    printed a dashboard URL whose pages were errors."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((100, 2)).astype(np.float32))
    site = tmp_path / "site"
    (site / "bokeh").mkdir(parents=True)
    (site / "bokeh" / "__init__.py").write_text("raise ImportError('No module named bokeh.server')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "daskmeans", "fit", str(tmp_path / "x.npy"), "--k", "2", "--dashboard",
                        "-o", str(tmp_path / "m.zarr")], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("daskmeans: error: --dashboard needs bokeh") and p.stderr.count("\n") == 1, p.stderr
    assert "pip install 'bokeh>=3.1'" in p.stderr and "http" not in p.stderr
    assert not (tmp_path / "m.zarr").exists()
