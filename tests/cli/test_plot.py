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


# ---------------------------------------------------------------- the panels' details


def _history(shifts):
    return [{"iteration": i + 1, "inertia": 100.0 / (i + 1), "shift": s} for i, s in enumerate(shifts)]


def _draw(fig):
    """``fig`` drawn on an Agg canvas (ticks and text extents are known once drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig


def test_a_short_fit_has_whole_iteration_ticks_and_its_zero_shift_drawn():
    from daskmeans import report

    fig = _draw(report.figure(_history([4.0, 0.5, 0.0]), np.array([5, 3]), np.zeros((2, 2))))
    conv = next(ax for ax in fig.axes if ax.get_title() == "convergence")
    lo, hi = conv.get_xlim()
    ticks = [t for t in conv.get_xticks() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    shift = next(ax for ax in fig.axes if ax.get_ylabel().startswith("centroid shift"))
    x, y = shift.lines[0].get_data()
    assert list(y) == [4.0, 0.5, 0.0]  # the last shift, 0, is a point of the line
    lo, hi = shift.get_ylim()
    assert lo <= 0.0 < hi  # and inside the axis
    pixels = shift.transData.transform(np.c_[x, y])
    assert np.isfinite(pixels).all()


def test_size_bars_have_their_clusters_colours_as_in_the_projection():
    from daskmeans import report

    sizes = np.array([10, 40, 25, 5])
    rng = np.random.default_rng(0)
    sample = rng.standard_normal((40, 3))
    labels = np.arange(40) % 4
    fig = _draw(report.figure(_history([1.0]), sizes, rng.standard_normal((4, 3)), sample, labels))
    bars = next(ax for ax in fig.axes if ax.get_title().startswith("cluster sizes")).patches
    assert [b.get_height() for b in bars] == [40, 25, 10, 5]
    projection = next(ax for ax in fig.axes if ax.get_title().endswith("PCA"))
    points = projection.collections[0].get_facecolors()[:, :3]
    for bar, cluster in zip(bars, [1, 2, 0, 3]):  # largest first
        np.testing.assert_allclose(bar.get_facecolor()[:3], points[labels == cluster][0])
    assert len({tuple(b.get_facecolor()) for b in bars}) == 4


@pytest.mark.parametrize("sizes", [np.full(500, 40) + np.arange(500) % 7,  # near-equal
                                   np.r_[np.full(499, 3), 100_000]])  # sizes spanning decades
def test_sizes_panel_has_y_ticks_at_k_500(sizes):
    from daskmeans import report

    fig = _draw(report.figure(_history([1.0]), sizes, np.zeros((500, 2))))
    ax = next(ax for ax in fig.axes if ax.get_title().startswith("cluster sizes"))
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.get_yticks() if lo <= t <= hi]
    assert len(shown) >= 2, (ax.get_yscale(), ax.get_yticks(), (lo, hi))


def test_the_model_only_plot_shows_every_title_whole(fitted, tmp_path):
    d, km = fitted
    fig = load(str(d / "m.zarr")).plot(None)
    renderer = _draw(fig).canvas.get_renderer()  # the Agg canvas's
    box = fig.bbox
    for text in [ax.title for ax in fig.axes if ax.get_title()] + [t for t in fig.texts if t.get_text()]:
        ext = text.get_window_extent(renderer)
        assert box.x0 <= ext.x0 and ext.x1 <= box.x1 and box.y0 <= ext.y0 and ext.y1 <= box.y1, text.get_text()
    axes = sorted((ax for ax in fig.axes if ax.get_title()), key=lambda ax: ax.get_position().x0)
    for left, right in zip(axes, axes[1:]):  # no title runs into its neighbour's
        assert left.title.get_window_extent(renderer).x1 < right.title.get_window_extent(renderer).x0
