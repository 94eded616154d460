"""The sweep finished (issue 47, part 5), from the command and from Python: no elbow where
the curve has none, every second reported per K, the silhouette on the workers (the same
bits), progress, the summary rewritten after each K and kept on Ctrl-C (a real signal to a
real process), the result object (table, frame, HTML, plot) and ``daskmeans.sweep`` as both
the function and the module."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from sklearn.metrics import silhouette_score

pytest.importorskip("matplotlib")

import daskmeans  # noqa: E402
from daskmeans.cli import main  # noqa: E402
from daskmeans.datasets import make_blobs  # noqa: E402
from daskmeans.io.model_store import write_array  # noqa: E402
from daskmeans.engine.scoring import pairwise_sums  # noqa: E402
from daskmeans.sweep import SweepResult, elbow, figure, silhouette  # noqa: E402

from terminal import on_a_terminal  # noqa: E402

ROWS = ("k", "inertia", "silhouette", "davies_bouldin", "n_iter", "fit_seconds", "score_seconds", "seconds")


def test_no_point_below_the_chord_is_no_elbow():
    # log(inertia) normalised: 1, .954, .845, 0 at x = 0, .143, .429, 1; the chord 1 - x lies
    # below both inner points: the curve bends the other way, and an endpoint is no elbow.
    assert elbow([2, 4, 8, 16], [100, 90, 70, 10]) is None
    assert elbow([1, 2, 3, 4], [1000, 100, 10, 1]) is None  # a straight line in log
    assert elbow([2, 4, 8, 16], [100, 50, 5, 4]) == 8  # unchanged where there is one
    assert elbow([1, 2, 3, 4, 5], [110, 40, 30, 20, 10]) == 2


def _result(elbow_k=None) -> SweepResult:
    r = SweepResult(sample_rows=50, n_samples=100, n_features=2, ks_requested=[2, 4, 8], complete=True)
    for k, inertia, sil in ((2, 100.0, None), (4, 90.0, 0.5), (8, 70.0, 0.25)):
        r._add({"k": k, "inertia": inertia, "silhouette": sil, "davies_bouldin": 0.75, "n_iter": 3,
                "fit_seconds": 1.0, "score_seconds": 0.5, "seconds": 1.5}, None)
    r.elbow = elbow_k
    return r


def test_result_table_frame_html_and_plot_with_and_without_an_elbow(tmp_path):
    for e in (None, 4):
        r = _result(e)
        text = repr(r)
        lines = text.splitlines()
        assert lines[0].startswith("sweep of K on 100 x 2: " + ("no elbow" if e is None else "elbow K=4"))
        assert lines[1].split() == ["K", "inertia", "silhouette", "Davies-Bouldin", "iterations", "fit", "s",
                                    "score", "s", "total", "s"]
        assert lines[2].split()[:3] == ["2", "1.000000e+02", "-"]  # an undefined score is '-'
        assert lines[3].startswith("* 4" if e == 4 else "  4")
        html = r._repr_html_()
        assert html.startswith("<table>") and html.count("<tr") == 4 and ("font-weight: bold" in html) == (e == 4)
        df = r.to_frame()
        assert list(df.index) == [2, 4, 8] and df.index.name == "k"
        assert list(df.columns) == list(ROWS[1:]) + ["elbow"]
        assert np.isnan(df.loc[2, "silhouette"]) and df["elbow"].sum() == (e is not None)
        png = tmp_path / f"elbow{e}.png"
        fig = r.plot(str(png))
        assert type(fig).__name__ == "Figure" and png.read_bytes()[:4] == b"\x89PNG"


def test_sweep_is_the_function_and_the_module():
    assert callable(daskmeans.sweep) and daskmeans.sweep.figure is figure and daskmeans.sweep.elbow is elbow
    assert list(inspect.signature(daskmeans.sweep).parameters)[:2] == ["X", "ks"]
    import daskmeans.sweep as module

    assert module is daskmeans.sweep and "sweep" in daskmeans.__all__


def test_silhouette_on_the_workers_equals_the_one_here_and_scikit_learns(client):
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(c, 1.0, (1300, 3)) for c in (0, 5, 9)])
    labels = rng.integers(0, 4, len(x))
    rows = client.scatter(x, broadcast=True, hash=False)
    here = pairwise_sums(x, labels, 4, block=500)
    there = pairwise_sums(x, labels, 4, client, rows, block=500)  # 8 tasks
    np.testing.assert_allclose(here, there, rtol=1e-13)  # BLAS's own threads may round differently
    assert silhouette(x, labels, client=client, rows=rows) == pytest.approx(silhouette_score(x, labels), rel=1e-8)


def test_api_reports_every_second_and_progress_and_writes_each_k(client, tmp_path, capsys):
    X, _ = make_blobs(3000, 3, 4, random_state=2)
    out = tmp_path / "s.json"
    seen = []

    def after_each(line):
        seen.append(json.loads(out.read_text())["ks"])  # the file already holds this K

    r = daskmeans.sweep(X, [2, 4, 6], sample=1500, client=client, verbose=1, output=str(out), callback=after_each)
    assert seen == [[2], [2, 4], [2, 4, 6]]
    assert r.complete and r.ks_requested == r.ks == [2, 4, 6]
    for f, s, t in zip(r.fit_seconds, r.score_seconds, r.seconds):
        assert f > 0 and s > 0 and t == pytest.approx(f + s)
    assert r.wall_seconds >= sum(r.seconds) + r.sample_seconds - 1e-6
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and doc["fit_seconds"] == r.fit_seconds and doc["score_seconds"] == r.score_seconds
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("daskmeans: sweep of K in [2, 4, 6] on 3000 x 3: scores on 1500 sampled rows")
    assert [p.split(":")[1] for p in printed[1:]] == [" K=2", " K=4", " K=6"]
    assert "s left" in printed[1] and "fit " in printed[3] and "scores " in printed[3]


def test_api_interrupt_keeps_the_ks_fitted(client, tmp_path):
    X, _ = make_blobs(2000, 3, 4, random_state=4)
    out = tmp_path / "s.json"

    def stop_after_two(line):
        if line["k"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as e:
        daskmeans.sweep(X, [2, 3, 4, 5], sample=500, client=client, output=str(out), callback=stop_after_two)
    part = e.value.result
    assert part.ks == [2, 3] and not part.complete and len(part.models) == 2
    doc = json.loads(out.read_text())
    assert doc["ks"] == [2, 3] and doc["complete"] is False and doc["ks_requested"] == [2, 3, 4, 5]


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("sweep") / "blobs.zarr")
    write_array(make_blobs(20000, 4, 5, random_state=1)[0].astype(np.float32), path)
    return path


def test_command_reports_seconds_and_no_elbow_in_one_line(blobs, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["sweep", blobs, "--k", "2,3", "-o", str(out), "--sample", "1500", "--workers", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    doc = json.loads(out.read_text())
    assert doc["elbow"] is None and doc["complete"] is True and len(doc["score_seconds"]) == 2
    assert [e.split(":")[1] for e in err if e.startswith("daskmeans: K=")] == [" K=2", " K=3"]
    assert any(e.startswith("daskmeans: sweep: 2/2 K in ") for e in err)  # the steps' line
    assert "daskmeans: no elbow: it needs at least 3 values of K" in err
    assert err[-1].startswith("daskmeans: 2 K in ") and "(fits " in err[-1] and "scores " in err[-1]


def test_command_shows_a_bar_on_a_terminal(blobs, tmp_path):
    out = on_a_terminal([sys.executable, "-m", "daskmeans", "sweep", blobs, "--k", "2,3,4", "-o",
                         str(tmp_path / "s.json"), "--sample", "1000", "--workers", "1"])
    assert "sweep: 100%" in out and "3/3" in out and "daskmeans: K=4: inertia" in out


def test_ctrl_c_keeps_the_finished_ks(blobs, tmp_path):
    out = tmp_path / "s.json"
    argv = [sys.executable, "-m", "daskmeans", "sweep", blobs, "--k", "2-40", "-o", str(out), "--sample", "1000",
            "--workers", "1"]
    p = subprocess.Popen(argv, env=dict(os.environ, PYTHONUNBUFFERED="1"), stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    second = threading.Event()

    def read():
        for line in p.stderr:
            lines.append(line)
            if line.startswith("daskmeans: K=3:"):
                second.set()

    t = threading.Thread(target=read)
    t.start()
    assert second.wait(240), "".join(lines)  # the event: two Ks done (and written)
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=120)
    t.join()
    assert rc == 130, "".join(lines)
    doc = json.loads(out.read_text())
    done = doc["ks"]
    assert done[:2] == [2, 3] and doc["complete"] is False and doc["ks_requested"] == list(range(2, 41))
    said = [ln for ln in lines if "fitted before the interrupt" in ln]
    assert said == [f"daskmeans: {len(done)} of 39 K fitted before the interrupt (K={', '.join(map(str, done))}): "
                    f"their summary is in {out}\n"], "".join(lines)
    assert lines[-1] == "daskmeans: interrupted\n"
    assert sorted(os.listdir(tmp_path)) == ["s.json"]  # no temporary, no lock left
