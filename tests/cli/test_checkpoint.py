"""Checkpoint and resume through the command line, as a user meets them: a real `daskmeans
fit` subprocess interrupted with SIGINT or killed with SIGKILL, then resumed, gives bitwise
the centroids of an uninterrupted fit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import zarr

ENV = dict(os.environ, DASK_DASKMEANS__SEGMENT_SECONDS="0", PYTHONUNBUFFERED="1")
# The command's local cluster: its workers in its own process (the default for a few workers),
# or a process per worker, which must not outlive the command whatever the signal.
LOCAL = {"threads": ENV, "processes": dict(ENV, DASK_DASKMEANS__LOCAL_CLUSTER="processes")}


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20_000, 8)).astype(np.float32)  # no structure: many iterations
    zarr.create_array(str(d / "x.zarr"), data=x, chunks=(2500, 8))
    np.save(d / "init.npy", x[:30].astype(np.float64))
    return d


def _argv(d, out, *extra):
    return [sys.executable, "-m", "daskmeans", "fit", str(d / "x.zarr"), "--k", "30", "--init", str(d / "init.npy"),
            "--tol", "0", "--max-iter", "60", "--workers", "2", "-o", str(d / out), *extra]


def _run(argv):
    p = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr


def _centers(path):
    return zarr.open_group(str(path), mode="r")["cluster_centers"][:]


def _interrupt_at(argv, iteration, sig, local="threads"):
    """Start ``argv`` with its local cluster's workers as ``local`` says, send ``sig`` once it
    reports ``iteration``; (rc, stderr). Worker processes must all end with the command,
    whatever the signal; in-process workers leave none."""
    p = subprocess.Popen(argv, env=LOCAL[local], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    sent = threading.Event()
    children: list[psutil.Process] = []

    def read():
        for line in p.stderr:
            lines.append(line)
            if not sent.is_set() and line.startswith(f"iter {iteration:4d}"):
                children.extend(psutil.Process(p.pid).children(recursive=True))
                sent.set()
                p.send_signal(sig)

    t = threading.Thread(target=read)
    t.start()
    rc = p.wait(timeout=300)
    t.join()
    assert sent.is_set(), "".join(lines)
    if local == "processes":
        assert len(children) >= 2, children  # the workers of the command's local cluster
    else:
        assert children == [], children
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not [c for c in alive if c.status() != psutil.STATUS_ZOMBIE], ("orphans", sig, alive)
    return rc, "".join(lines)


@pytest.fixture(scope="module")
def reference(problem):
    rc, err = _run(_argv(problem, "ref.zarr"))
    assert rc == 0, err
    return _centers(problem / "ref.zarr")


@pytest.mark.parametrize("sig, rc_expected, local", [
    (signal.SIGINT, 130, "threads"), (signal.SIGTERM, 143, "threads"), (signal.SIGKILL, -9, "threads"),
    (signal.SIGINT, 130, "processes"), (signal.SIGKILL, -9, "processes"),
])
def test_interrupted_then_resumed_is_bitwise_the_uninterrupted_fit(problem, reference, sig, rc_expected, local):
    ck, out = f"ck-{sig.name}-{local}.zarr", f"m-{sig.name}-{local}.zarr"
    rc, err = _interrupt_at(_argv(problem, out, "--checkpoint", str(problem / ck), "--checkpoint-every", "2"), 5, sig,
                            local)
    assert rc == rc_expected, err
    assert not (problem / out).exists()
    assert (problem / ck).exists()
    if sig != signal.SIGKILL:
        assert "Traceback" not in err, err
        assert f"in {problem / ck}; continue with --resume" in err, err
    saved = zarr.open_group(str(problem / ck), mode="r").attrs["iteration"]
    assert 2 <= saved <= 60
    rc, err = _run(_argv(problem, out, "--checkpoint", str(problem / ck), "--resume"))
    assert rc == 0, err
    np.testing.assert_array_equal(_centers(problem / out), reference)
    hist = zarr.open_group(str(problem / out), mode="r").attrs["history"]
    assert [h["iteration"] for h in hist] == list(range(1, len(hist) + 1))


def test_checkpoint_of_another_fit_is_refused(problem):
    ck = problem / "ck-other.zarr"
    rc, err = _interrupt_at(_argv(problem, "m-o.zarr", "--checkpoint", str(ck), "--checkpoint-every", "1"), 3,
                            signal.SIGINT)
    assert rc == 130, err
    argv = _argv(problem, "m-o.zarr", "--checkpoint", str(ck), "--resume")
    argv[argv.index("--tol") + 1] = "0.001"
    rc, err = _run(argv)
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("daskmeans: error: checkpoint ") and "tol: checkpoint 0.0, now 0.001" in last, err


def test_resume_without_a_checkpoint_is_one_line(problem):
    rc, err = _run(_argv(problem, "m-n.zarr", "--resume"))
    assert rc == 1 and err.strip() == "daskmeans: error: --resume needs --checkpoint PATH"
    rc, err = _run(_argv(problem, "m-n.zarr", "--checkpoint", str(problem / "none.zarr"), "--resume"))
    assert rc == 1 and "no checkpoint at" in err and "Traceback" not in err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception, expected
def test_an_interrupt_python_drops_in_a_finaliser_still_stops_the_fit(problem, monkeypatch, capsys):
    """Python prints and drops an exception raised while a finaliser runs (a Dask future's
    ``__del__``): a Ctrl-C landing there must still stop the fit, save the checkpoint and write
    no model, not go on to exit 0."""
    import dask

    from daskmeans import cli
    from daskmeans.cli import fit as fit_command

    class Finaliser:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler's exception is raised here, and dropped

    class Progress(fit_command.FitProgress):
        def __call__(self, stats):
            if stats["iteration"] == 3:
                Finaliser()
            super().__call__(stats)

    monkeypatch.setattr(fit_command, "FitProgress", Progress)
    ck, out = problem / "ck-finaliser.zarr", problem / "m-finaliser.zarr"
    # Python's own handler, as in an interactive shell (a background job inherits SIG_IGN).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with dask.config.set({"daskmeans.segment-seconds": 0}):
            rc = cli.main(_argv(problem, out.name, "--checkpoint", str(ck), "--checkpoint-every", "2")[3:])
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    err = capsys.readouterr().err
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == "daskmeans: interrupted", err
    assert not out.exists()
    assert zarr.open_group(str(ck), mode="r").attrs["iteration"] == 3
    assert after is signal.default_int_handler  # main() put the handler back


# ------------------------------------------------------- an interrupted label write


def _tree(path):
    """Every file under ``path`` with its bytes (the previous output must stay as it was)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    d = tmp_path_factory.mktemp("labels")
    rng = np.random.default_rng(8)
    zarr.create_array(str(d / "x.zarr"), data=rng.standard_normal((3_000_000, 4)).astype(np.float32),
                      chunks=(50_000, 4))
    np.save(d / "init.npy", rng.standard_normal((16, 4)))
    rc, err = _run([sys.executable, "-m", "daskmeans", "fit", str(d / "x.zarr"), "--k", "16", "--init",
                    str(d / "init.npy"), "--max-iter", "2", "--workers", "2", "-q", "-o", str(d / "m.zarr")])
    assert rc == 0, err
    return d


@pytest.mark.parametrize("sig, rc_expected", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_label_write_leaves_the_previous_output_and_no_temporary_directory(labelled, sig, rc_expected):
    d = labelled
    out = d / "labels.zarr"
    argv = [sys.executable, "-m", "daskmeans", "predict", str(d / "m.zarr"), str(d / "x.zarr"), "-o", str(out),
            "--overwrite", "--workers", "2"]
    if not out.exists():
        rc, err = _run(argv)
        assert rc == 0, err
    before = _tree(out)
    p = subprocess.Popen(argv, env=ENV, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                         start_new_session=True)  # its own process group: its workers' too
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        tmp = [t for t in d.iterdir() if t.name.startswith(".labels.zarr.tmp-")]
        try:
            writing = bool(tmp) and any(tmp[0].rglob("c/*"))  # chunks are being written
        except FileNotFoundError:  # renamed into place meanwhile: the command ends without a signal
            writing = False
        if writing:
            p.send_signal(sig)
            break
        time.sleep(0.01)
    else:
        pytest.fail(f"the label write was never seen under way (rc {p.poll()})")
    _, err = p.communicate(timeout=120)
    assert p.returncode == rc_expected, err
    assert "Traceback" not in err, err
    # Every process of the command (its workers, where they are processes) has exited: no
    # write still in flight can land after the checks below.
    deadline = time.monotonic() + 60
    while True:
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the command's processes outlived it by 60 s"
        time.sleep(0.02)
    assert [t.name for t in d.iterdir() if ".tmp-" in t.name] == []
    assert _tree(out) == before


def test_a_signal_dropped_in_a_finaliser_prints_no_traceback(capsys):
    """SIGTERM landing while a finaliser runs (a Dask future's ``__del__``): Python drops the
    exception and would print 'Exception ignored' with a traceback; the command prints
    nothing for it and raises it again at its next check. Other dropped exceptions still print."""
    import sys

    from daskmeans.cli import common

    class Dropped:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            raise self.exc

    hook = sys.unraisablehook
    sys.unraisablehook = sys.__unraisablehook__  # Python's own printing, not pytest's collector
    common.set_pending(common.Terminated)
    try:
        with common.quiet_dropped_signals():
            Dropped(common.Terminated())
            Dropped(ValueError("a real bug"))
            with pytest.raises(common.Terminated):
                common.check_interrupt()
        assert sys.unraisablehook is sys.__unraisablehook__
    finally:
        common.set_pending(None)
        sys.unraisablehook = hook
    err = capsys.readouterr().err
    assert "Terminated" not in err and "ValueError: a real bug" in err, err


# ------------------------------------------------------- what a checkpoint resumes is verified


@pytest.fixture(scope="module")
def saved(problem):
    """A checkpoint of the problem's fit, interrupted at iteration 3."""
    ck = problem / "ck-verify.zarr"
    rc, err = _interrupt_at(_argv(problem, "m-v.zarr", "--checkpoint", str(ck), "--checkpoint-every", "1"), 3,
                            signal.SIGINT)
    assert rc == 130, err
    return ck


def _copy(src, dst):
    import shutil

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _resume_fails(problem, ck, data="x.zarr", out="m-bad.zarr"):
    argv = _argv(problem, out, "--checkpoint", str(ck), "--resume")
    argv[argv.index(str(problem / "x.zarr"))] = str(problem / data)
    rc, err = _run(argv)
    assert rc == 1, err
    assert "Traceback" not in err, err
    assert not (problem / out).exists()
    lines = err.strip().splitlines()
    assert lines[-1].startswith("daskmeans: error: ") and not any("error" in ln for ln in lines[:-1]), err
    return lines[-1]


def test_resume_on_other_data_of_the_same_shape_and_range_is_refused(problem, saved):
    """Most rows changed, the same shape, dtype and per-feature largest |value|: the content
    digest differs (a fingerprint of shape and range alone accepted this)."""
    x = zarr.open_array(str(problem / "x.zarr"), mode="r")[:]
    y = x.copy()
    rng = np.random.default_rng(0)
    keep = np.abs(y).argmax(axis=0)  # the rows holding each feature's largest |value| stay
    rows = np.setdiff1d(np.arange(len(y)), keep)
    y[rows] = rng.permutation(y[rows])  # the same values, in other rows
    assert np.array_equal(np.abs(y).max(axis=0), np.abs(x).max(axis=0))
    zarr.create_array(str(problem / "y.zarr"), data=y, chunks=(2500, 8), overwrite=True)
    line = _resume_fails(problem, saved, data="y.zarr")
    assert "is for another fit (the data's values differ)" in line, line


def _attrs_edit(ck, edit):
    import json

    meta = ck / "zarr.json"
    doc = json.loads(meta.read_text())
    edit(doc["attributes"])
    meta.write_text(json.dumps(doc))


@pytest.mark.parametrize("damage", ["iteration-huge", "iteration-negative", "nan-centroid", "garbage-history",
                                    "transposed"])
def test_a_damaged_checkpoint_is_refused_in_one_line(problem, saved, tmp_path, damage):
    ck = _copy(saved, tmp_path / "ck.zarr")
    if damage == "iteration-huge":
        _attrs_edit(ck, lambda a: a.update(iteration=10**6))
    elif damage == "iteration-negative":
        _attrs_edit(ck, lambda a: a.update(iteration=-5))
    elif damage == "garbage-history":
        _attrs_edit(ck, lambda a: a.update(history=[{"iteration": "x"}, 7]))
    elif damage == "nan-centroid":
        g = zarr.open_group(str(ck), mode="r+")
        c = g["centroids"][:]
        c[2, 3] = np.nan
        g["centroids"][:] = c
    else:  # the centroids transposed: (D, K)
        g = zarr.open_group(str(ck), mode="r+")
        c = g["centroids"][:]
        del g["centroids"]
        g.create_array("centroids", data=np.ascontiguousarray(c.T))
    line = _resume_fails(problem, ck)
    assert f"checkpoint {ck} is damaged: its checksum does not match its contents" in line, line
