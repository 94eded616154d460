"""Choosing K: fit each of several K on the same data and compare them (``daskmeans sweep``).

Every K is one :class:`~daskmeans.KMeans` fit on the engine. The data is read once: the
engine's job keeps the chunks one fit placed for the next fit of the same data
(:mod:`daskmeans.engine.reuse`), so no fit but the first reads the file. Each fit's inertia is over all rows; the
silhouette and Davies–Bouldin scores (scikit-learn's definitions) are computed on one sample
of rows drawn by global index from the seed, the same sample for every K: the silhouette's
row sums of distances on the workers, in blocks of rows (:func:`silhouette`), the rest here.

The elbow is the K farthest below the chord of the normalised log-inertia curve: with K and
log(inertia) each scaled to [0, 1] over the sweep, the point of largest distance below the
straight line joining the first and last points. The logarithm keeps the first steps from
dominating: on linear inertia a sweep from K = 1 (inertia 20x the rest) picks the first
K after it whatever the data (5 blobs, K = 1, 3, 5, 7: 3 linear, 5 in log). A curve with no
point below the chord (one that bends the other way, or a straight line) has no elbow.

``daskmeans.sweep`` is this module, callable as :func:`sweep`: ``daskmeans.sweep(X, ks)`` runs
a sweep, and ``daskmeans.sweep.figure``, ``daskmeans.sweep.elbow``,
``daskmeans.sweep.SweepResult`` are its other names (a package attribute that was the function
would be replaced by the module as soon as anything imported ``daskmeans.sweep``).
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
import types
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

# The rows the silhouette and Davies–Bouldin scores are computed on (the silhouette costs
# sample^2 distances per K).
SAMPLE_ROWS = 10_000
ELBOW_RULE = ("the K of largest distance below the chord from the first to the last point of the curve of "
              "log(inertia) against K, both scaled to [0, 1]; none where no point lies below it")
FORMAT = "daskmeans-sweep"
# How far below the chord (in the normalised units) a point must lie to be an elbow: points
# on a straight line differ from it by rounding only.
_BELOW = 1e-9
# The columns of the table (repr, HTML, to_frame): (attribute, heading, format).
_COLUMNS = (("inertia", "inertia", "{:.6e}"), ("silhouette", "silhouette", "{:.4f}"),
            ("davies_bouldin", "Davies-Bouldin", "{:.4f}"), ("n_iter", "iterations", "{:d}"),
            ("fit_seconds", "fit s", "{:.2f}"), ("score_seconds", "score s", "{:.2f}"), ("seconds", "total s", "{:.2f}"))


@dataclass
class SweepResult:
    """One sweep over K: a table of one row per K, the elbow, the fitted models.

    Attributes
    ----------
    ks : list of int, ascending
        The Ks fitted (all of ``ks_requested`` once ``complete``).
    inertia : list of float
        Each fit's inertia over all rows.
    silhouette, davies_bouldin : list of float or None
        On the sample (None where the score is undefined: fewer than 2 clusters in the
        sample, or as many as its rows).
    n_iter : list of int
    fit_seconds : list of float
        Wall seconds of each fit (placing the data, for the first, included).
    score_seconds : list of float
        Wall seconds of each K's scores (the sample's labels, silhouette, Davies–Bouldin).
    seconds : list of float
        Wall seconds of each K: its fit and its scores.
    elbow : int or None
        The chosen K (:func:`elbow`, over the Ks fitted); None for fewer than 3 K or a
        curve with no point below its chord.
    sample_rows, n_samples, n_features : int
    ks_requested : list of int
        The Ks asked for.
    complete : bool
        Whether every K asked for was fitted (False in the result of an interrupted sweep).
    sample_seconds : float
        Wall seconds taken to draw the sample.
    wall_seconds : float
        Wall seconds of the whole sweep so far: the sample and every K.
    rule : str
        How the elbow is chosen.
    models : list of KMeans
        The fitted estimators, in the order of ``ks`` (not in :meth:`to_dict`).
    """

    ks: list = field(default_factory=list)
    inertia: list = field(default_factory=list)
    silhouette: list = field(default_factory=list)
    davies_bouldin: list = field(default_factory=list)
    n_iter: list = field(default_factory=list)
    fit_seconds: list = field(default_factory=list)
    score_seconds: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    elbow: int | None = None
    sample_rows: int = 0
    n_samples: int = 0
    n_features: int = 0
    ks_requested: list = field(default_factory=list)
    complete: bool = False
    sample_seconds: float = 0.0
    wall_seconds: float = 0.0
    rule: str = ELBOW_RULE
    models: list = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        """The summary as JSON-ready values (no models)."""
        d = asdict(self)
        d.pop("models")
        return {"format": FORMAT, **d}

    def to_frame(self):
        """The table as a pandas DataFrame: one row per K (index ``k``), the columns
        ``inertia``, ``silhouette``, ``davies_bouldin``, ``n_iter``, ``fit_seconds``,
        ``score_seconds``, ``seconds`` and ``elbow`` (True on the elbow's row)."""
        import pandas as pd

        cols = {name: getattr(self, name) for name, _, _ in _COLUMNS}
        df = pd.DataFrame(cols, index=pd.Index(self.ks, name="k"))
        for name in ("silhouette", "davies_bouldin"):  # None (undefined) as NaN
            df[name] = df[name].astype("float64")
        df["elbow"] = [k == self.elbow for k in self.ks]
        return df

    def plot(self, path: str | None = None):
        """The elbow plot (:func:`figure`): inertia against K with the elbow marked, and the
        sample's scores; also written to ``path`` (.png, .svg, .pdf) where given.

        Returns
        -------
        matplotlib.figure.Figure
        """
        fig = figure(self)
        if path is not None:
            fig.savefig(path, format=os.path.splitext(path)[1].lstrip(".").lower() or None)
        return fig

    def _headline(self) -> str:
        done = "" if self.complete else f" (interrupted: {len(self.ks)} of {len(self.ks_requested)} K fitted)"
        elbow = f"elbow K={self.elbow}" if self.elbow is not None else "no elbow"
        return (f"sweep of K on {self.n_samples} x {self.n_features}{done}: {elbow}; scores on {self.sample_rows} "
                f"sampled rows; {self.wall_seconds:.2f} s")

    def _cells(self) -> list[list[str]]:
        rows = []
        for i, k in enumerate(self.ks):
            row = [str(k)]
            for name, _, fmt in _COLUMNS:
                v = getattr(self, name)[i]
                row.append("-" if v is None else fmt.format(v))
            rows.append(row)
        return rows

    def __repr__(self) -> str:
        head = ["K"] + [h for _, h, _ in _COLUMNS]
        rows = self._cells()
        width = [max(len(r[j]) for r in [head] + rows) for j in range(len(head))]
        lines = [self._headline(), "  " + "  ".join(h.rjust(w) for h, w in zip(head, width))]
        for k, r in zip(self.ks, rows):
            lines.append(("* " if k == self.elbow else "  ") + "  ".join(c.rjust(w) for c, w in zip(r, width)))
        if self.elbow is not None:
            lines.append("* the elbow")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in ["K"] + [h for _, h, _ in _COLUMNS])
        body = []
        for k, r in zip(self.ks, self._cells()):
            style = ' style="font-weight: bold"' if k == self.elbow else ""
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
        return (f"<table><caption>{html.escape(self._headline())}</caption><thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(body)}</tbody></table>")

    def _add(self, line: dict, model: Any) -> None:
        for key in ("k", "inertia", "silhouette", "davies_bouldin", "n_iter", "fit_seconds", "score_seconds",
                    "seconds"):
            getattr(self, "ks" if key == "k" else key).append(line[key])
        self.models.append(model)
        self.elbow = elbow(self.ks, self.inertia)


def parse_ks(text: str) -> list[int]:
    """``"8,16,32"`` or ``"2-10"`` (a range, both ends included) or a mix: distinct Ks >= 1,
    ascending.

    Raises
    ------
    ValueError
        Naming the first item that is not such a K.
    """
    ks: set[int] = set()
    for item in (s.strip() for s in text.split(",")):
        lo, _, hi = item.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"{item!r} is not an integer or a range such as 2-10") from None
        if a < 1 or b < a:
            raise ValueError(f"{item!r} should be K >= 1 (or a range low-high with 1 <= low <= high)")
        ks.update(range(a, b + 1))
    return sorted(ks)


def elbow(ks: Sequence[int], inertia: Sequence[float]) -> int | None:
    """The elbow of an inertia curve (:data:`ELBOW_RULE`).

    Parameters
    ----------
    ks : sequence of int (m,), ascending
    inertia : sequence of float (m,)

    Returns
    -------
    int or None
        The K farthest below the chord; None for fewer than 3 points, a flat curve, or a
        curve with no point below its chord (the endpoints lie on it: they are never the
        elbow).
    """
    import numpy as np

    k = np.asarray(ks, np.float64)
    y = np.log(np.maximum(np.asarray(inertia, np.float64), np.finfo(np.float64).tiny))  # a perfect fit has 0
    if len(k) < 3 or y.max() == y.min():
        return None
    x = (k - k[0]) / (k[-1] - k[0])
    y = (y - y.min()) / (y.max() - y.min())
    # How far each inner point lies below the chord from the first point to the last,
    # vertically: a fixed multiple of the perpendicular distance (the chord's slope is the
    # same for all).
    below = (y[0] + (y[-1] - y[0]) * x - y)[1:-1]
    i = int(np.argmax(below))
    return int(ks[i + 1]) if below[i] > _BELOW else None


def _scored(x: Any, labels: Any) -> tuple[Any, Any, int | None]:
    """``(x, lab, k)`` for a score: the rows as float64, the labels renumbered 0 .. k-1 in
    the order of their values, and k, or None for k where scores are undefined (fewer than 2
    labels, or as many labels as rows)."""
    import numpy as np

    x = np.asarray(x, np.float64)
    _, lab = np.unique(labels, return_inverse=True)
    k = int(lab.max()) + 1 if len(lab) else 0
    return x, lab, (k if 2 <= k <= len(x) - 1 else None)


def silhouette(x: Any, labels: Any, *, client: Any = None, rows: Any = None) -> float | None:
    """Mean silhouette coefficient (Rousseeuw 1987; scikit-learn's ``silhouette_score``): per
    row ``(b - a) / max(a, b)``, ``a`` the mean distance to the other rows of its cluster,
    ``b`` the least mean distance to another cluster's rows; 0 for a row alone in its cluster.

    Parameters
    ----------
    x : ndarray (n, d)
    labels : ndarray (n,) int
    client : distributed.Client, optional
        Compute the row sums of distances (the n^2 part) on its workers, a block of
        :data:`daskmeans.engine.scoring.SCORE_BLOCK_ROWS` rows per task, given ``rows``: ``x`` as float64, scattered
        to them (``client.scatter(x, broadcast=True)``). The result is the same as here (to
        the rounding of BLAS's threads).
    rows : distributed.Future, optional

    Returns
    -------
    float, or None where undefined (fewer than 2 labels, or as many labels as rows)
    """
    import numpy as np

    x, lab, k = _scored(x, labels)
    if k is None:
        return None
    from .engine.scoring import pairwise_sums

    sums = pairwise_sums(x, lab, k, client, rows)
    size = np.bincount(lab, minlength=k).astype(np.float64)
    own = size[lab]
    a = sums[np.arange(len(x)), lab] / np.maximum(own - 1, 1)
    other = sums / size[None, :]
    other[np.arange(len(x)), lab] = np.inf
    b = other.min(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(own > 1, (b - a) / np.maximum(a, b), 0.0)
    return float(np.nan_to_num(s).mean())


def davies_bouldin(x: Any, labels: Any) -> float | None:
    """Davies–Bouldin index (scikit-learn's ``davies_bouldin_score``): the mean over clusters
    of the largest ``(s_i + s_j) / d(c_i, c_j)``, ``s_i`` the mean distance of cluster ``i``'s
    rows to its centroid ``c_i`` (clusters as the labels present). Parameters and result as
    :func:`silhouette`'s."""
    import numpy as np

    x, lab, k = _scored(x, labels)
    if k is None:
        return None
    size = np.bincount(lab, minlength=k).astype(np.float64)
    c = np.zeros((k, x.shape[1]))
    np.add.at(c, lab, x)
    c /= size[:, None]
    intra = np.bincount(lab, weights=np.linalg.norm(x - c[lab], axis=1), minlength=k) / size
    cd = np.sqrt(np.maximum(((c[:, None, :] - c[None, :, :]) ** 2).sum(-1), 0.0))
    if np.allclose(intra, 0) or np.allclose(cd, 0):
        return 0.0
    cd[cd == 0] = np.inf
    return float(np.max((intra[:, None] + intra[None, :]) / cd, axis=1).mean())


def sweep(
    X: Any,
    ks: Sequence[int],
    *,
    sample: int = SAMPLE_ROWS,
    random_state: int = 0,
    client: Any = None,
    callback: Callable[[dict], None] | None = None,
    verbose: int = 0,
    output: str | None = None,
    **kmeans_params: Any,
) -> SweepResult:
    """Fit :class:`~daskmeans.KMeans` for each K in ``ks`` and score each fit.

    Parameters
    ----------
    X : array (n_samples, n_features) (NumPy, CuPy, Dask, DataFrame) or a path (Zarr/CSV/.npy)
    ks : sequence of int
        Numbers of clusters, each >= 1 and <= n_samples.
    sample : int, default SAMPLE_ROWS
        Rows drawn (by global index, from ``random_state``) for the silhouette and
        Davies–Bouldin scores.
    random_state : int, default 0
        The seed of every fit and of the sample.
    client : distributed.Client, optional
        As :class:`~daskmeans.KMeans`'s.
    callback : callable(dict), optional
        Called after each K with its row of the table (``k``, ``inertia``, ``silhouette``,
        ``davies_bouldin``, ``n_iter``, ``fit_seconds``, ``score_seconds``, ``seconds``).
    verbose : int, default 0
        1: a line per K on stdout (its row, and the time left at this pace), and the sample's;
        2 and more: also each fit's iterations (``KMeans(verbose=verbose - 1)``).
    output : str, optional
        A JSON file (:meth:`SweepResult.to_dict`) written after each K, atomically, with the
        Ks fitted so far (``complete`` false until the last): a sweep interrupted keeps them.
    **kmeans_params
        Other :class:`~daskmeans.KMeans` parameters (``init``, ``n_init``, ``max_iter``,
        ``tol``, ``backend``, ``tier``...).

    Returns
    -------
    SweepResult
        With ``models``: the fitted estimators, in the order of ``result.ks``.

    Raises
    ------
    KeyboardInterrupt
        Ctrl-C (or SIGTERM in the command) during the sweep: its ``result`` attribute is the
        :class:`SweepResult` of the Ks fitted before it (``complete`` False).
    """
    import numpy as np

    from .backends import get_backend
    from .errors import InvalidParameterError
    from .estimator import KMeans
    from .io.readers import read
    from .events import advance, step
    from .validation import Interval, check_n_clusters

    t_start = time.perf_counter()
    ks = sorted({int(k) for k in ks})
    if not ks:
        raise InvalidParameterError("ks=[] should hold at least one number of clusters")
    for k in ks:
        Interval(1, None, integer=True).check("k", k)
    Interval(1, None, integer=True).check("sample", sample)
    Interval(0, None, integer=True).check("verbose", verbose)
    x = read(X)
    n, d = (int(s) for s in x.shape)
    check_n_clusters(n, ks[-1])
    fit_verbose = kmeans_params.pop("verbose", max(0, verbose - 1))
    models = [KMeans(k, random_state=random_state, client=client, verbose=fit_verbose, **kmeans_params) for k in ks]
    models[0]._validate_params()
    c = models[0]._client()

    def say(line: str) -> None:
        if verbose:  # as KMeans(verbose=1): lines on stdout (a notebook's cell output)
            print(line, file=sys.stdout, flush=True)

    # One read for every K: each fit runs on the engine's job, which keeps the data placed by
    # one fit for the next fit of the same data (engine/reuse.py).
    # The same rows for every K, chosen by global index (so for any chunking).
    idx = np.arange(n) if n <= sample else np.sort(np.random.default_rng(random_state).choice(n, sample, replace=False))
    from .engine.scoring import sample_rows, share

    rows = sample_rows(c, x, idx)
    rows = np.asarray(get_backend(rows).to_numpy(rows))
    scored = np.asarray(rows, np.float64)
    # The sample on every worker once (the silhouette's blocks are computed there).
    shared = share(c, scored)
    out = SweepResult(sample_rows=len(rows), n_samples=n, n_features=d, ks_requested=list(ks),
                      sample_seconds=time.perf_counter() - t_start)
    say(f"daskmeans: sweep of K in {ks} on {n} x {d}: scores on {len(rows)} sampled rows "
        f"(drawn in {out.sample_seconds:.2f} s)")
    try:
        with step("sweep", total=len(ks), unit="K"):
            for i, km in enumerate(models):
                t0 = time.perf_counter()
                km.client = c
                km.fit(x)
                t1 = time.perf_counter()
                labels = np.asarray(get_backend_numpy(km.predict(rows)))
                line = {"k": km.n_clusters, "inertia": float(km.inertia_),
                        "silhouette": silhouette(scored, labels, client=c if shared is not None else None, rows=shared),
                        "davies_bouldin": davies_bouldin(scored, labels), "n_iter": int(km.n_iter_)}
                t2 = time.perf_counter()
                line.update(fit_seconds=t1 - t0, score_seconds=t2 - t1, seconds=t2 - t0)
                km.client = client
                out._add(line, km)
                out.wall_seconds = time.perf_counter() - t_start
                out.complete = len(out.ks) == len(ks)
                if output is not None:
                    write_summary(out, output)
                advance(i + 1)
                left = (len(ks) - i - 1) * (out.wall_seconds - out.sample_seconds) / (i + 1)
                say(describe_line(line) + (f"; about {left:.0f} s left" if i + 1 < len(ks) else ""))
                if callback is not None:
                    callback(line)
    except KeyboardInterrupt as e:
        out.wall_seconds = time.perf_counter() - t_start
        e.result = out  # the Ks fitted before it
        raise
    finally:
        if shared is not None:
            shared.release()
    return out


def get_backend_numpy(a: Any) -> Any:
    """``a`` (labels of the sample) as a NumPy array."""
    from .backends import get_backend

    return get_backend(a).to_numpy(a)


def describe_line(s: dict) -> str:
    """One K's row as the line the command and ``verbose`` print."""
    sil = "-" if s["silhouette"] is None else f"{s['silhouette']:.4f}"
    db = "-" if s["davies_bouldin"] is None else f"{s['davies_bouldin']:.4f}"
    return (f"daskmeans: K={s['k']}: inertia {s['inertia']:.6e}, silhouette {sil}, Davies-Bouldin {db}, "
            f"{s['n_iter']} iterations; fit {s['fit_seconds']:.2f} s, scores {s['score_seconds']:.2f} s")


def figure(result: SweepResult):
    """The elbow plot: inertia against K with the elbow marked, and the sample's silhouette
    and Davies–Bouldin scores against K (a Matplotlib figure, without pyplot)."""
    from .report import matplotlib_api

    mpl = matplotlib_api()
    fig = mpl.figure.Figure(figsize=(10.4, 4.4), dpi=100)
    left, right = fig.subplots(1, 2)
    left.plot(result.ks, result.inertia, "o-", ms=4, color="C0")
    if result.elbow is not None:
        i = result.ks.index(result.elbow)
        left.plot([result.elbow], [result.inertia[i]], "o", ms=12, mfc="none", mec="C3", mew=2,
                  label=f"elbow: K = {result.elbow}")
        left.legend(loc="best")
    left.set_xlabel("K (clusters)")
    left.set_ylabel("inertia (all rows)")
    left.set_title("inertia")
    for ax, key, name, color in ((right, "silhouette", "silhouette (higher is better)", "C2"),
                                 (right.twinx(), "davies_bouldin", "Davies–Bouldin (lower is better)", "C1")):
        pts = [(k, v) for k, v in zip(result.ks, getattr(result, key)) if v is not None]
        if pts:
            ax.plot(*zip(*pts), "s-", ms=4, color=color)
        ax.set_ylabel(name, color=color)
    right.set_xlabel("K (clusters)")
    right.set_title(f"scores on {result.sample_rows} sampled rows")
    for ax in (left, right):
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    return fig


def write_summary(result: SweepResult, path: str) -> None:
    """Write :meth:`SweepResult.to_dict` as JSON, atomically."""
    from .io.paths import atomic_file

    with atomic_file(path) as tmp, open(tmp, "w") as f:
        json.dump(result.to_dict(), f, indent=1)


def is_summary(path: str) -> bool:
    """Whether the file ``path`` holds a sweep summary (what ``--overwrite`` may replace)."""
    try:
        if os.path.getsize(path) > 2**26:
            return False
        with open(path) as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def no_elbow_reason(result: SweepResult) -> str:
    """Why ``result`` has no elbow, in words (its elbow is None)."""
    if len(result.ks) < 3:
        return "it needs at least 3 values of K"
    return ("no K lies below the chord joining the first and last points of log(inertia) against K: the curve "
            "does not bend into a flatter part")


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`sweep` (see the module docstring): Python binds the
    package's ``sweep`` attribute to the module whenever ``daskmeans.sweep`` is imported, so
    the public name is the module, and calling it runs :func:`sweep` (with its signature and
    docstring for ``help`` and ``inspect``)."""

    __call__ = staticmethod(sweep)


sys.modules[__name__].__class__ = _CallableModule
# inspect.signature(daskmeans.sweep) is the function's (a callable's __call__ would lose X).
__signature__ = __import__("inspect").signature(sweep)
