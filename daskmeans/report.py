"""Pictures of a fitted model: convergence, cluster sizes and, given data, a 2-D projection.

Matplotlib is optional (``pip install 'daskmeans[plot]'``) and imported only here. Figures are
made without pyplot: no backend is chosen or changed (a notebook's inline display stays), none
is kept in pyplot's registry, and writing works without a display (servers, batch jobs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backends import get_backend
from .errors import DaskmeansError

# Points drawn in the projection: enough to show each cluster's shape, few enough to read.
SAMPLE_ROWS = 20_000


def matplotlib_api():
    """The ``matplotlib`` package with ``matplotlib.figure`` loaded (figures without pyplot), or
    the one-line error saying how to install it."""
    try:
        import matplotlib
        import matplotlib.figure
    except ImportError:
        raise DaskmeansError("plotting needs matplotlib: pip install 'daskmeans[plot]'") from None
    return matplotlib


def image_formats() -> dict[str, str]:
    """The image formats Matplotlib writes: suffix (no dot) -> description."""
    return matplotlib_api().figure.Figure().canvas.get_supported_filetypes()


def cluster_colours(clusters: np.ndarray, k: int) -> np.ndarray:
    """RGBA colours ``(n, 4)`` of the clusters ``clusters`` (n,) of a K-cluster model, the
    same in every panel: tab20 up to 20 clusters, else spread over the hsv wheel."""
    mpl = matplotlib_api()
    clusters = np.asarray(clusters)
    if k <= 20:
        return mpl.colormaps["tab20"](clusters % 20)
    return mpl.colormaps["hsv"](clusters / max(k - 1, 1))


def sample_rows(x: Any, n: int, seed: int = 0) -> np.ndarray:
    """Up to ``n`` rows of the Dask array ``x`` drawn without replacement, as NumPy, in row order
    (only the chunks holding them are read)."""
    rows = int(x.shape[0])
    idx = np.arange(rows) if rows <= n else np.sort(np.random.default_rng(seed).choice(rows, n, replace=False))
    out = x[idx].compute(scheduler="threads")
    return get_backend(out).to_numpy(out)


def projection(sample: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PCA of ``sample`` (n, D) to 2-D: ``(sample_2d (n, 2), centers_2d (K, 2), explained (2,))``,
    the fraction of the sample's variance along each axis. D = 1 is drawn against zeros."""
    s = np.asarray(sample, np.float64)
    mean = s.mean(axis=0)
    _, sv, vt = np.linalg.svd(s - mean, full_matrices=False)
    axes = vt[:2].T
    total = float((sv ** 2).sum()) or 1.0
    explained = (sv[:2] ** 2) / total
    if axes.shape[1] == 1:  # one feature
        axes = np.hstack([axes, np.zeros_like(axes)])
        explained = np.append(explained, 0.0)
    return (s - mean) @ axes, (np.asarray(centers, np.float64) - mean) @ axes, explained


def figure(history: list[dict], sizes: np.ndarray | None, centers: np.ndarray,
           sample: np.ndarray | None = None, labels: np.ndarray | None = None, title: str = ""):
    """The report as a Matplotlib figure: one panel per picture.

    Parameters
    ----------
    history : list of dict
        Per-iteration statistics (``KMeans.history_``): inertia and shift are drawn.
    sizes : ndarray (n_clusters,), optional
        Rows per cluster (``KMeans.cluster_sizes_``), drawn largest first.
    centers : ndarray (n_clusters, n_features)
    sample, labels : ndarray (n, n_features) and (n,), optional
        Rows and their clusters for the 2-D projection panel.
    """
    mpl = matplotlib_api()
    panels = ["convergence"] + (["sizes"] if sizes is not None else []) + (["projection"] if sample is not None else [])
    fig = mpl.figure.Figure(figsize=(5.2 * len(panels), 4.4), dpi=100)
    axs = dict(zip(panels, fig.subplots(1, len(panels), squeeze=False)[0]))
    k = int(centers.shape[0])

    ax = axs["convergence"]
    it = [h["iteration"] for h in history]
    ax.plot(it, [h["inertia"] for h in history], "o-", ms=3, color="C0", label="inertia")
    ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))  # iterations are whole
    ax.set_xlabel("iteration")
    ax.set_ylabel("inertia", color="C0")
    ax.set_title("convergence")
    if history:
        shifts = np.array([h["shift"] for h in history], np.float64)
        shift = ax.twinx()
        shift.plot(it, shifts, "s-", ms=3, color="C1", label="shift")
        # Logarithmic above the smallest shift that moved, linear below it: a last shift of 0
        # (nothing moved) is drawn at the bottom, where a log axis would drop it.
        moved = shifts[shifts > 0]
        shift.set_yscale("symlog", linthresh=float(moved.min()) if moved.size else 1.0)
        shift.set_ylim(bottom=0)
        shift.set_ylabel("centroid shift (sum of squares)", color="C1")
    if not history:
        ax.text(0.5, 0.5, "no iterations recorded", ha="center", va="center", transform=ax.transAxes)

    if "sizes" in axs:
        ax = axs["sizes"]
        which = np.argsort(-np.asarray(sizes), kind="stable")  # largest first
        order = np.asarray(sizes)[which]
        if k <= 64:  # each bar in its cluster's colour, as in the projection
            ax.bar(np.arange(k), order, color=cluster_colours(which, k))
            ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
        else:  # thousands of bars are a solid block: the sorted sizes as a curve
            ax.plot(np.arange(k), order, color="C2")
            if order.max() > 100 * max(order.min(), 1):  # a log scale only where sizes span decades
                ax.set_yscale("symlog", linthresh=1)
        ax.axhline(order.mean(), color="k", lw=0.8, ls="--")  # the mean
        ax.set_xlabel("cluster (largest first)")
        ax.set_ylabel("rows")
        ax.set_title(f"cluster sizes: mean {order.mean():.4g} (dashed),\n"
                     f"largest {order.max() / max(order.mean(), 1e-300):.2f}x")

    if "projection" in axs:
        ax = axs["projection"]
        p, c, explained = projection(sample, centers)
        ax.scatter(p[:, 0], p[:, 1], c=cluster_colours(labels, k), s=2, alpha=0.5, linewidths=0, rasterized=True)
        ax.scatter(c[:, 0], c[:, 1], marker="x", c="k", s=40 if k <= 200 else 4, linewidths=1.2, label="centroids")
        ax.set_xlabel(f"PC1 ({100 * explained[0]:.0f}% of variance)")
        ax.set_ylabel(f"PC2 ({100 * explained[1]:.0f}% of variance)")
        ax.set_title(f"{len(p)} rows, PCA")
        ax.legend(loc="best")

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def write(fig: Any, path: str) -> None:
    """Save ``fig`` to ``path`` atomically, in the format its suffix names (.png, .svg, .pdf...)."""
    import os
    import uuid

    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    formats = image_formats()
    if fmt not in formats:
        raise DaskmeansError(f"cannot write {path}: the suffix should name an image format, one of "
                             f"{', '.join('.' + f for f in sorted(formats))}")
    parent, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        fig.savefig(tmp, format=fmt)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
