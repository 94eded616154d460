"""Outputs under contention and over other people's files (issue 31).

- Concurrent writers to one output: exactly one succeeds; the survivor is whole; no
  temporary entries remain (two real ``daskmeans fit`` processes released together, and two
  processes calling ``save_model`` at once).
- A replaced model is never absent from its path, and the two-rename fallback (no
  ``renameat2``) restores the previous model when the second rename fails.
- The output lock: refused at once while another process holds it, and still exclusive when
  the holder removes its lock file under a waiter.
- The temporaries of a ``predict`` killed mid-write (issue 42): removed by the next writer of
  the path, which holds its lock; never those of a live writer, nor a ``.old``.
- ``--overwrite`` on a foreign directory or file: refused, its files intact (every kind).

Processes start together on a barrier (each blocks reading its stdin until the test writes to
all of them), never on sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from faultkit import tree

from daskmeans.cli import main
from daskmeans.errors import DaskmeansError, OutputError
from daskmeans.io import model_store, paths

ENV = dict(os.environ, PYTHONUNBUFFERED="1")
LEFTOVERS = (".tmp", ".old", ".lock")


def _leftovers(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if any(s in n for s in LEFTOVERS))




@pytest.fixture()
def tiny(tmp_path):
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=10, size=(3, 2))
    np.save(tmp_path / "x.npy", (centers[rng.integers(0, 3, 600)] + rng.normal(size=(600, 2))).astype(np.float32))
    return tmp_path


def _start_together(argvs: list[list[str]], cwd) -> list[subprocess.Popen]:
    """Start ``python -c CODE ARGS...`` for each argv; each imports what it needs, says
    ``ready`` and waits on its stdin (:data:`BARRIER`); once all are ready, all are released
    at once."""
    procs = [subprocess.Popen([sys.executable, "-c", *argv], cwd=cwd, env=ENV, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.communicate()[1]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.close()
    return procs


def _finish(p: subprocess.Popen) -> tuple[int, str]:
    """(exit status, stderr) of a process started by :func:`_start_together`."""
    err = p.stderr.read()
    p.stdout.read()
    return p.wait(timeout=120), err


BARRIER = "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"


# ---------------------------------------------------------------- concurrent writers


def test_two_fit_commands_to_one_output_exactly_one_succeeds(tiny):
    """Acceptance: concurrent writers to one output: exactly one succeeds; the survivor is
    whole; no temporary entries remain. Both pass the `exists` check before either writes
    (each takes seconds to fit): without the lock both said "model written"."""
    code = ("import daskmeans.cli\n" + BARRIER
            + "sys.argv = ['daskmeans', 'fit', 'x.npy', '--k', '3', '--workers', '1', '-q', '-o', 'm.zarr']\n"
            + "daskmeans.cli.run()\n")
    procs = _start_together([[code], [code]], tiny)
    results = [_finish(p) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 1], results
    err = next(e for rc, e in results if rc == 1)
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("daskmeans: error: m.zarr ") and (
        "is being written by another process (pid " in err or "m.zarr exists: choose another output" in err), err
    import daskmeans

    km = daskmeans.load(str(tiny / "m.zarr"))
    assert km.cluster_centers_.shape == (3, 2) and np.isfinite(km.cluster_centers_).all()
    assert sorted(os.listdir(tiny)) == ["m.zarr", "x.npy"]


SAVER = textwrap.dedent("""
    import numpy as np
    from daskmeans.io.model_store import save_model
    {barrier}
    v = float(sys.argv[1])
    for i in range(150):
        save_model('m.zarr', np.full((4, 3), v + i), {{"v": v + i, "params": {{"n_clusters": 4}}, "n_features_in": 3,
                                                      "inertia": 0.0, "n_iter": 0}}, sizes=np.full(4, int(v) + i))
""")


def _attrs(v: float) -> dict:
    """A consistent model's attributes (load_model verifies them) for 2 x 2 centroids, marked ``v``."""
    return {"v": v, "params": {"n_clusters": 2}, "n_features_in": 2, "inertia": 0.0, "n_iter": 0}


def test_two_processes_saving_at_once_leave_one_whole_model(tmp_path):
    """save_model in two processes at once, 150 times each: every save completes, and what
    is left is one whole model (its centroids, sizes and attributes from the same save) and
    nothing else. Without the lock they raced on the rename of the previous model aside
    (FileNotFoundError, or a `.old` directory left); the window is narrow, hence the many
    saves (the old code failed this in 3 runs of 3; test_a_replaced_model_is_never_absent
    shows the gap deterministically)."""
    code = SAVER.format(barrier=BARRIER)
    procs = _start_together([[code, "100"], [code, "200"]], tmp_path)
    for p in procs:
        rc, err = _finish(p)
        assert rc == 0, err
    assert sorted(os.listdir(tmp_path)) == ["m.zarr"]
    centers, attrs, sizes = model_store.load_model(str(tmp_path / "m.zarr"))
    v = attrs["v"]
    assert v in (249.0, 349.0)  # the last save of either process
    np.testing.assert_array_equal(centers, np.full((4, 3), v))
    np.testing.assert_array_equal(sizes, np.full(4, int(v)))


def test_a_replaced_model_is_never_absent(tmp_path, monkeypatch):
    """At every file system step of replacing a model, the path holds a whole model (one of
    the two). Renaming the old model aside first left the path empty in between."""
    path = str(tmp_path / "m.zarr")
    model_store.save_model(path, np.zeros((2, 2)), _attrs(0))
    seen = []

    def check():
        centers, attrs, _ = model_store.load_model(path)
        assert (centers == attrs["v"]).all()
        seen.append(attrs["v"])

    def watched(fn):
        def call(*a, **k):
            out = fn(*a, **k)
            check()
            return out
        return call

    for mod, name in ((os, "rename"), (os, "replace"), (os, "unlink"), (shutil, "rmtree")):
        monkeypatch.setattr(mod, name, watched(getattr(mod, name)))
    model_store.save_model(path, np.ones((2, 2)), _attrs(1))
    monkeypatch.undo()
    assert model_store.load_model(path)[1]["v"] == 1
    assert seen and sorted(os.listdir(tmp_path)) == ["m.zarr"]


def test_the_fallback_without_renameat2_puts_the_previous_model_back(tmp_path, monkeypatch):
    """Where renameat2 is missing, two renames replace a model: when the second fails the
    previous model goes back, and neither the new one nor a `.old` stays."""
    path = str(tmp_path / "m.zarr")
    model_store.save_model(path, np.zeros((2, 2)), _attrs(0))
    monkeypatch.setattr(paths, "_renameat2_fn", None)
    model_store.save_model(path, np.ones((2, 2)), _attrs(1))  # the fallback works
    assert model_store.load_model(path)[1]["v"] == 1 and os.listdir(tmp_path) == ["m.zarr"]
    real = os.rename

    def second_fails(src, dst):
        if ".tmp-" in os.path.basename(src) and not src.endswith(".old") and dst == path:
            raise OSError(28, "No space left on device", dst)
        return real(src, dst)

    monkeypatch.setattr(os, "rename", second_fails)
    with pytest.raises(OutputError, match=r"cannot write .*m\.zarr: No space left on device"):
        model_store.save_model(path, np.full((2, 2), 2.0), _attrs(2))
    assert model_store.load_model(path)[1]["v"] == 1
    assert os.listdir(tmp_path) == ["m.zarr"]


def test_a_new_output_is_not_renamed_over_one_made_meanwhile(tmp_path):
    """Without replace, the rename happens only if the path still does not exist: an output
    made after the check (by a writer that takes no lock) is neither replaced nor merged."""
    path = tmp_path / "m.zarr"
    with pytest.raises(OutputError, match="m.zarr exists: choose another output or pass --overwrite"):
        with paths.atomic_dir(str(path), kind="model", replace=False) as tmp:
            model_store.write_group(tmp, {"c": np.zeros((1, 1))}, {"format": "daskmeans-model"})
            path.mkdir()  # empty: a plain rename would replace it
    assert list(path.iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["m.zarr"]


# ---------------------------------------------------------------- the lock itself


HOLDER = textwrap.dedent("""
    import sys
    from daskmeans.io.paths import output_lock
    print('imported', flush=True)
    with output_lock(sys.argv[1], wait=sys.argv[2] == "wait"):
        print('held', flush=True)
        sys.stdin.readline()
""")


def _holder(path, wait: str = "nowait") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(path), wait], env=ENV, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_locked_output_is_refused_at_once_and_its_holder_named(tmp_path):
    out = tmp_path / "m.zarr"
    p = _holder(out)
    try:
        assert p.stdout.readline().strip() == "imported", p.stderr.read()
        assert p.stdout.readline().strip() == "held", p.stderr.read()
        with pytest.raises(OutputError, match=rf"m\.zarr is being written by another process \(pid {p.pid}\): "
                                              "wait for it to end or choose another output"):
            with paths.Outputs() as outputs:
                outputs.claim(str(out), "model", True)
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    assert os.listdir(tmp_path) == []  # the lock file went with its holder
    with paths.Outputs() as outputs:
        outputs.claim(str(out), "model", False)


def _blocked_on_flock(pid: int) -> bool:
    """Whether process ``pid`` waits for a flock (a ``->`` line of /proc/locks)."""
    with open("/proc/locks") as f:
        return any("->" in ln and "FLOCK" in ln and ln.split()[5] == str(pid) for ln in f)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_a_waiter_on_a_removed_lock_file_takes_a_lock_that_still_excludes(tmp_path):
    """A waits on B's lock file; B lets go and removes it. A must not hold a lock on the
    removed file (a third writer would make a new one and go on too): it locks the file at
    the path, and a third writer is refused."""
    out = tmp_path / "m.zarr"
    b = _holder(out)
    assert b.stdout.readline().strip() == "imported"
    assert b.stdout.readline().strip() == "held"
    a = _holder(out, "wait")
    try:
        assert a.stdout.readline().strip() == "imported"
        while not _blocked_on_flock(a.pid):  # A waits in flock on B's file (no sleep: the kernel says)
            assert a.poll() is None, a.stderr.read()
        b.stdin.close()
        assert b.wait(timeout=60) == 0
        assert a.stdout.readline().strip() == "held", a.stderr.read()
        with pytest.raises(OutputError, match=rf"being written by another process \(pid {a.pid}\)"):
            with paths.output_lock(str(out), wait=False):
                pass
    finally:
        a.stdin.close()
        a.wait(timeout=60)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- what a killed writer leaves


# ``daskmeans predict`` whose label writer stops after its first block, as if the command was
# in the middle of writing: it says ``written`` and waits on its stdin, until the test kills it.
STALLED_PREDICT = textwrap.dedent("""
    import sys
    import daskmeans.cli
    from daskmeans.io import model_store
    write_block = model_store._write_block
    def stall(*args):
        write_block(*args)
        print('written', flush=True)
        sys.stdin.readline()
    model_store._write_block = stall
    sys.argv = ['daskmeans', *sys.argv[1:]]
    daskmeans.cli.run()
""")


def test_the_temporaries_of_a_killed_predict_are_reaped_by_the_next_write(tmp_path, capsys, monkeypatch):
    """Issue 42: a SIGKILLed ``predict -o L --overwrite`` left ``.L.tmp-*`` directories that
    no later run removed. The next command writing L holds L's lock, so no writer of such a
    temporary is alive: it removes them, and a successful run leaves no hidden partial output.
    While the killed writer still runs, another is refused and its temporary is untouched."""
    rng = np.random.default_rng(3)
    np.save(tmp_path / "x.npy", rng.normal(size=(400, 2)).astype(np.float32))
    argv = ["predict", "m.zarr", "x.npy", "-o", "L.zarr", "--overwrite", "--workers", "1", "-q", "--chunk-bytes", "800"]
    assert main(["fit", str(tmp_path / "x.npy"), "--k", "2", "--workers", "1", "-q", "-o",
                 str(tmp_path / "m.zarr")]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0, capsys.readouterr().err
    first = tree(tmp_path / "L.zarr")
    seen = []
    for kill in range(2):  # killed twice: the second run reaps the first's temporary as it starts
        p = subprocess.Popen([sys.executable, "-c", STALLED_PREDICT, *argv], cwd=tmp_path, env=ENV,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "written", p.communicate()[1]
        temporaries = [n for n in _leftovers(tmp_path) if n.startswith(".L.zarr.tmp-")]
        assert len(temporaries) == 1 and temporaries[0] not in seen, (temporaries, seen)
        seen += temporaries
        if kill == 0:  # its writer alive: another writer is refused, the temporary stays
            assert main(argv) == 1
            assert f"is being written by another process (pid {p.pid})" in capsys.readouterr().err
            assert os.path.isdir(tmp_path / temporaries[0])
        p.kill()
        p.communicate()
        assert os.path.isdir(tmp_path / temporaries[0])  # what the SIGKILL left behind
    assert tree(tmp_path / "L.zarr") == first  # the previous labels, untouched
    assert main(argv) == 0, capsys.readouterr().err
    assert _leftovers(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["L.zarr", "m.zarr", "x.npy"]


def test_only_the_path_s_own_temporaries_are_reaped(tmp_path):
    """Reaped: ``.NAME.tmp-XXXXXXXX`` (``XXXXXXXX`` hex; a file's with its suffix after it).
    Kept: another output's, a name that only looks alike, and a ``.old`` (the two-rename
    fallback's previous output, perhaps its only copy)."""
    names = {".m.zarr.tmp-0123abcd": True, ".m.zarr.tmp-0123abcd.old": False, ".m.zarr.tmp-mine": False,
             ".n.zarr.tmp-0123abcd": False, "m.zarr.tmp-0123abcd": False, ".r.png.tmp-89abcdef.png": True,
             ".r.png.tmp-89abcdef.png.old": False, ".x.old.tmp-01234567.old": False, ".x.old.tmp-01234567": True}
    for n in names:
        (tmp_path / n).mkdir()
    for out in ("m.zarr", "r.png", "x.old"):
        with paths.output_lock(str(tmp_path / out)):
            pass
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, reaped in names.items() if not reaped)


def test_an_empty_output_path_is_refused(tmp_path, monkeypatch):
    """The API's writers refuse "" (the command's options refuse it while parsing): it names
    no output, and was taken for the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DaskmeansError, match="^an output path is empty: name the file or directory to write$"):
        model_store.save_model("", np.zeros((2, 2)), _attrs(0))
    with pytest.raises(DaskmeansError, match="^an output path is empty"):
        with paths.Outputs() as outputs:
            outputs.claim("", "labels", True, ["x.npy"])
    # Nothing written, nor locked, in the working directory or beside it (as "" was).
    assert os.listdir(tmp_path) == [] and not [n for n in os.listdir(tmp_path.parent) if n.startswith(f".{tmp_path.name}")]


# ---------------------------------------------------------------- --overwrite on foreign paths


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """A model and its labels, and a user's directory and files in the way."""
    d = tmp_path_factory.mktemp("foreign")
    rng = np.random.default_rng(1)
    np.save(d / "x.npy", rng.normal(size=(300, 2)).astype(np.float32))
    assert main(["fit", str(d / "x.npy"), "--k", "2", "--workers", "1", "-q", "-o", str(d / "model.zarr")]) == 0
    return d


def _victims(d):
    """A user's directory (files at two levels), a JSON file, a text file named .png, a Zarr
    array the user wrote."""
    import zarr

    v = d / "victim"
    (v / "sub").mkdir(parents=True, exist_ok=True)
    (v / "notes.txt").write_text("my notes")
    (v / "sub" / "data.bin").write_bytes(b"\x00\x01" * 100)
    (d / "notes.json").write_text(json.dumps({"mine": 1}))
    (d / "photo.png").write_text("not an image")
    if not (d / "user.zarr").exists():
        zarr.create_array(str(d / "user.zarr"), data=np.arange(10.0))


DIRECTORY = "a directory that is not a Zarr store"
FOREIGN = [
    # (argv, the path in the way, what it should be, what it is)
    (["fit", "{d}/x.npy", "--k", "2", "-o", "{d}/victim", "--overwrite"], "victim", "model", DIRECTORY),
    (["fit", "{d}/x.npy", "--k", "2", "-o", "{d}/m2.zarr", "--labels", "{d}/victim", "--overwrite"],
     "victim", "labels output", DIRECTORY),
    (["fit", "{d}/x.npy", "--k", "2", "-o", "{d}/m2.zarr", "--timings", "{d}/victim", "--overwrite"],
     "victim", "timings file", DIRECTORY),
    (["fit", "{d}/x.npy", "--k", "2", "-o", "{d}/m2.zarr", "--timings", "{d}/notes.json", "--overwrite"],
     "notes.json", "timings file", "a file"),
    (["predict", "{d}/model.zarr", "{d}/x.npy", "-o", "{d}/victim", "--overwrite"], "victim", "labels output",
     DIRECTORY),
    (["predict", "{d}/model.zarr", "{d}/x.npy", "-o", "{d}/m3.zarr", "--overwrite"], "m3.zarr", "labels output",
     "a daskmeans model"),
    (["generate", "blobs", "--n", "10", "--d", "2", "--centers", "2", "-o", "{d}/victim", "--overwrite"],
     "victim", "generated dataset", DIRECTORY),
    (["generate", "blobs", "--n", "10", "--d", "2", "--centers", "2", "-o", "{d}/user.zarr", "--overwrite"],
     "user.zarr", "generated dataset", "a Zarr array that daskmeans did not write"),
    (["plot", "{d}/model.zarr", "-o", "{d}/victim", "--overwrite"], "victim", "plot", DIRECTORY),
    (["plot", "{d}/model.zarr", "-o", "{d}/photo.png", "--overwrite"], "photo.png", "plot", "a file"),
]


@pytest.mark.parametrize("argv, victim, noun, what", FOREIGN,
                         ids=[f"{a[0]}-{n.split()[0]}-{v}" for a, v, n, _ in FOREIGN])
def test_overwrite_on_a_foreign_path_is_refused_and_its_files_intact(outputs, capsys, argv, victim, noun, what):
    """Acceptance: --overwrite on a foreign directory: refused, its files intact, for each kind
    of output. Before, each was removed and replaced."""
    d = outputs
    _victims(d)
    if victim == "m3.zarr":  # a daskmeans output of another kind
        shutil.copytree(d / "model.zarr", d / "m3.zarr", dirs_exist_ok=True)
    before = tree(d / victim)
    listing = sorted(os.listdir(d))
    rc = main([a.format(d=d) for a in argv])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.strip() == (f"daskmeans: error: {d / victim} is not a daskmeans {noun} ({what}): --overwrite replaces "
                           f"only a daskmeans {noun}"), err
    assert tree(d / victim) == before
    assert sorted(os.listdir(d)) == listing


def test_a_checkpoint_path_holding_a_user_directory_is_refused(outputs, capsys):
    """--checkpoint rewrites its path as the fit goes (no --overwrite needed): only over a
    checkpoint."""
    d = outputs
    _victims(d)
    before = tree(d / "victim")
    rc = main(["fit", str(d / "x.npy"), "--k", "2", "-o", str(d / "m4.zarr"), "--checkpoint", str(d / "victim")])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.strip() == (f"daskmeans: error: {d / 'victim'} is not a daskmeans checkpoint ({DIRECTORY}): "
                           "--checkpoint replaces only a daskmeans checkpoint"), err
    assert tree(d / "victim") == before and not (d / "m4.zarr").exists()


def test_save_over_a_user_directory_is_refused(tmp_path):
    """The Python API's save replaces a model only."""
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "notes.txt").write_text("my notes")
    with pytest.raises(OutputError, match=rf"{tmp_path / 'victim'} is not a daskmeans model \({DIRECTORY}\): "
                                          "daskmeans replaces only a daskmeans model"):
        model_store.save_model(str(tmp_path / "victim"), np.zeros((2, 2)), {})
    assert (tmp_path / "victim" / "notes.txt").read_text() == "my notes"
    assert sorted(os.listdir(tmp_path)) == ["victim"]


def test_overwrite_replaces_each_kind_of_daskmeans_output(tmp_path, capsys, monkeypatch):
    """The same commands twice, the second with --overwrite: every output is replaced (and
    carries its kind's marker), nothing else is left."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    np.save("x.npy", np.random.default_rng(2).normal(size=(300, 2)).astype(np.float32))
    commands = (["fit", "x.npy", "--k", "2", "--workers", "1", "-q", "-o", "m.zarr", "--labels", "l.zarr",
                 "--timings", "t.json"],
                ["predict", "m.zarr", "x.npy", "--workers", "1", "-o", "p.zarr"],
                ["generate", "blobs", "--n", "50", "--d", "2", "--centers", "2", "-o", "g.zarr"],
                ["plot", "m.zarr", "-o", "r.png"])
    for extra in ([], ["--overwrite"]):
        for argv in commands:
            assert main(argv + extra) == 0, capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["g.zarr", "l.zarr", "m.zarr", "p.zarr", "r.png", "t.json", "x.npy"]
    for name, kind in (("m.zarr", "model"), ("l.zarr", "labels"), ("p.zarr", "labels"), ("g.zarr", "data"),
                       ("r.png", "plot"), ("t.json", "timings")):
        assert paths.is_kind(name, kind), name
