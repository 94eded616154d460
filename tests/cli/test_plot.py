"""``daskmeans plot`` and ``KMeans.plot``: the report's panels are drawn and written."""

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")  # the [plot] extra; CI installs it with [test]
from matplotlib.image import imread  # noqa: E402

from daskmeans import KMeans, load  # noqa: E402
from daskmeans.cli import main  # noqa: E402
from daskmeans.datasets import make_blobs  # noqa: E402
from daskmeans.io.model_store import write_array  # noqa: E402


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, client):
    d = tmp_path_factory.mktemp("plot")
    X, _ = make_blobs(20_000, 5, 4, cluster_std=6.0, random_state=1)  # overlapping: ~16 iterations to draw
    write_array(X, str(d / "x.zarr"))
    km = KMeans(4, random_state=0, client=client).fit(X)
    km.save(str(d / "m.zarr"))
    return d, km


def _panels(fig, png):
    """Each panel's pixels in the written image (one per panel: twin axes share a box)."""
    img = imread(png)
    h = img.shape[0]
    boxes = {tuple(np.round(ax.get_window_extent().extents).astype(int)) for ax in fig.axes}
    return img, [img[h - y1 : h - y0, x0:x1, :3] for x0, y0, x1, y1 in sorted(boxes)]


def _drawn(pixels) -> bool:
    """More than a frame: an empty panel's frame and ticks ink ~1.5% of its box in 4 colours."""
    ink = (pixels < 0.95).any(axis=-1).mean()
    colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    return ink > 0.03 and colours > 8


def test_report_has_three_drawn_panels(fitted, tmp_path):
    d, km = fitted
    png = str(tmp_path / "r.png")
    fig = km.plot(str(d / "x.zarr"), path=png, sample=5000)
    img, panels = _panels(fig, png)
    w, h = fig.get_size_inches() * fig.dpi
    assert img.shape[:2] == (round(h), round(w))
    assert len(panels) == 3
    assert all(_drawn(p) for p in panels)
    titles = [ax.get_title() for ax in fig.axes]
    assert "convergence" in titles and "5000 rows, PCA" in titles
    assert any(t.startswith("cluster sizes: mean 5000 ") for t in titles)  # 20000 rows in 4 clusters


def test_cli_plot_with_and_without_data(fitted, tmp_path, capsys):
    d, km = fitted
    with_data, without = tmp_path / "a.png", tmp_path / "b.png"
    assert main(["plot", str(d / "m.zarr"), str(d / "x.zarr"), "-o", str(with_data), "--sample", "3000"]) == 0
    assert main(["plot", str(d / "m.zarr"), "-o", str(without)]) == 0
    a, b = imread(str(with_data)), imread(str(without))
    assert a.shape[0] == b.shape[0] and a.shape[1] == pytest.approx(1.5 * b.shape[1], abs=2)  # 3 panels, 2 panels
    np.testing.assert_array_equal(load(str(d / "m.zarr")).cluster_sizes_, km.cluster_sizes_)
    assert km.cluster_sizes_.sum() == 20_000
    assert "report written to" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["-o", "{t}/r.xyz"], "cannot write {t}/r.xyz: the suffix should name an image format, one of "),
    (["-o", "{t}/exists.png"], "{t}/exists.png exists: choose another output or pass --overwrite"),
    (["{d}/y.npy", "-o", "{t}/r.png"], "X has 3 features, but KMeans is expecting 5 features as input"),
])  # --sample 0 is a usage error found while parsing: tests/cli/test_options.py
def test_cli_plot_errors_are_one_line_and_leave_nothing(fitted, tmp_path, capsys, extra, message):
    d, _ = fitted
    np.save(d / "y.npy", np.zeros((10, 3)))
    (tmp_path / "exists.png").write_bytes(b"x")
    argv = ["plot", str(d / "m.zarr")] + [a.format(d=d, t=tmp_path) for a in extra]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("daskmeans: error: " + message.format(d=d, t=tmp_path)) and "\n" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists.png"]
