"""Choosing K: fit each of several K on the same data and compare them (``daskmeans sweep``).

Every K is one :class:`~daskmeans.KMeans` fit on the engine. The data is read once: the
engine's job keeps the chunks one fit placed for the next fit of the same data
(:mod:`daskmeans.engine.reuse`), so no fit but the first reads the file. Each fit's inertia is over all rows; the
silhouette and Davies–Bouldin scores are computed here in NumPy (scikit-learn's definitions)
on one sample of rows drawn by global index from the seed, the same sample for every K.

The elbow is the K farthest below the chord of the normalised log-inertia curve: with K and
log(inertia) each scaled to [0, 1] over the sweep, the point of largest distance below the
straight line joining the first and last points. The logarithm keeps the first steps from
dominating: on linear inertia a sweep from K = 1 (inertia 20x the rest) picks the first
K after it whatever the data (5 blobs, K = 1, 3, 5, 7: 3 linear, 5 in log).
"""

from __future__ import annotations

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
              "log(inertia) against K, both scaled to [0, 1]")
FORMAT = "daskmeans-sweep"


@dataclass
class SweepResult:
    """One sweep over K.

    Attributes
    ----------
    ks : list of int, ascending
    inertia : list of float
        Each fit's inertia over all rows.
    silhouette, davies_bouldin : list of float or None
        On the sample (None where the score is undefined: fewer than 2 clusters in the
        sample, or as many as its rows).
    n_iter : list of int
    seconds : list of float
        Wall seconds of each fit.
    elbow : int or None
        The chosen K (:func:`elbow`; None for fewer than 3 K).
    sample_rows, n_samples, n_features : int
    rule : str
        How the elbow is chosen.
    """

    ks: list
    inertia: list
    silhouette: list
    davies_bouldin: list
    n_iter: list
    seconds: list
    elbow: int | None
    sample_rows: int
    n_samples: int
    n_features: int
    rule: str = ELBOW_RULE
    models: list = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        """The summary as JSON-ready values (no models)."""
        d = asdict(self)
        d.pop("models")
        return {"format": FORMAT, **d}


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
    """The elbow of an inertia curve (:data:`ELBOW_RULE`); None for fewer than 3 points or a
    flat curve.

    Parameters
    ----------
    ks : sequence of int (m,), ascending
    inertia : sequence of float (m,)
    """
    import numpy as np

    k = np.asarray(ks, np.float64)
    y = np.log(np.maximum(np.asarray(inertia, np.float64), np.finfo(np.float64).tiny))  # a perfect fit has 0
    if len(k) < 3 or y.max() == y.min():
        return None
    x = (k - k[0]) / (k[-1] - k[0])
    y = (y - y.min()) / (y.max() - y.min())
    # How far each point lies below the chord from the first point to the last, vertically:
    # a fixed multiple of the perpendicular distance (the chord's slope is the same for all).
    below = y[0] + (y[-1] - y[0]) * x - y
    return int(ks[int(np.argmax(below))])


def _pairwise_sums(x: Any, labels: Any, k: int, block: int = 2048) -> Any:
    """``out[i, j]``: the sum of Euclidean distances from row ``i`` to the rows of label ``j``
    (n, k) float64, in row blocks (never the whole n x n matrix)."""
    import numpy as np

    sq = np.einsum("ij,ij->i", x, x)
    onehot = np.zeros((len(x), k))
    onehot[np.arange(len(x)), labels] = 1.0
    out = np.empty((len(x), k))
    for s in range(0, len(x), block):
        d2 = sq[s:s + block, None] - 2.0 * (x[s:s + block] @ x.T) + sq[None, :]
        out[s:s + block] = np.sqrt(np.maximum(d2, 0.0)) @ onehot
    return out


def _scored(x: Any, labels: Any) -> tuple[Any, Any, int | None]:
    """``(x, lab, k)`` for a score: the rows as float64, the labels renumbered 0 .. k-1 in
    the order of their values, and k, or None for k where scores are undefined (fewer than 2
    labels, or as many labels as rows)."""
    import numpy as np

    x = np.asarray(x, np.float64)
    _, lab = np.unique(labels, return_inverse=True)
    k = int(lab.max()) + 1 if len(lab) else 0
    return x, lab, (k if 2 <= k <= len(x) - 1 else None)


def silhouette(x: Any, labels: Any) -> float | None:
    """Mean silhouette coefficient (Rousseeuw 1987; scikit-learn's ``silhouette_score``): per
    row ``(b - a) / max(a, b)``, ``a`` the mean distance to the other rows of its cluster,
    ``b`` the least mean distance to another cluster's rows; 0 for a row alone in its cluster.

    Parameters
    ----------
    x : ndarray (n, d)
    labels : ndarray (n,) int

    Returns
    -------
    float, or None where undefined (fewer than 2 labels, or as many labels as rows)
    """
    import numpy as np

    x, lab, k = _scored(x, labels)
    if k is None:
        return None
    sums = _pairwise_sums(x, lab, k)
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
        Called after each fit with its K's line of the summary (``k``, ``inertia``,
        ``silhouette``, ``davies_bouldin``, ``n_iter``, ``seconds``).
    **kmeans_params
        Other :class:`~daskmeans.KMeans` parameters (``init``, ``n_init``, ``max_iter``,
        ``tol``, ``backend``, ``tier``...).

    Returns
    -------
    SweepResult
        With ``models``: the fitted estimators, in the order of ``result.ks``.
    """
    import numpy as np

    from .errors import InvalidParameterError
    from .estimator import KMeans
    from .io.readers import read
    from .backends import get_backend
    from .validation import Interval, check_n_clusters

    ks = sorted({int(k) for k in ks})
    if not ks:
        raise InvalidParameterError("ks=[] should hold at least one number of clusters")
    for k in ks:
        Interval(1, None, integer=True).check("k", k)
    Interval(1, None, integer=True).check("sample", sample)
    x = read(X)
    n, d = (int(s) for s in x.shape)
    check_n_clusters(n, ks[-1])
    models = [KMeans(k, random_state=random_state, client=client, **kmeans_params) for k in ks]
    models[0]._validate_params()
    c = models[0]._client()
    # One read for every K: each fit runs on the engine's job, which keeps the data placed by
    # one fit for the next fit of the same data (engine/reuse.py).
    # The same rows for every K, chosen by global index (so for any chunking).
    idx = np.arange(n) if n <= sample else np.sort(np.random.default_rng(random_state).choice(n, sample, replace=False))
    rows = c.compute(x[idx]).result()
    rows = get_backend(rows).to_numpy(rows)
    out = SweepResult([], [], [], [], [], [], None, len(rows), n, d, models=[])
    for km in models:
        t0 = time.perf_counter()
        km.client = c
        km.fit(x)
        seconds = time.perf_counter() - t0
        labels = np.asarray(km.predict(rows))
        line = {"k": km.n_clusters, "inertia": float(km.inertia_), "silhouette": silhouette(rows, labels),
                "davies_bouldin": davies_bouldin(rows, labels), "n_iter": int(km.n_iter_), "seconds": seconds}
        for key, attr in (("k", "ks"), ("inertia", "inertia"), ("silhouette", "silhouette"),
                          ("davies_bouldin", "davies_bouldin"), ("n_iter", "n_iter"), ("seconds", "seconds")):
            getattr(out, attr).append(line[key])
        out.models.append(km)
        km.client = client
        if callback is not None:
            callback(line)
    out.elbow = elbow(out.ks, out.inertia)
    return out


def figure(result: SweepResult):
    """The elbow plot: inertia against K with the elbow marked, and the sample's silhouette
    and Davies–Bouldin scores against K (a Matplotlib figure, without pyplot)."""
    from .report import _matplotlib

    mpl = _matplotlib()
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


# ---------------------------------------------------------------- the command


def add_parser(sub: Any, data_args: Callable, cluster_args: Callable) -> None:
    """The ``sweep`` subcommand's parser (``cli.py`` passes its shared option groups)."""
    import argparse

    from .validation import int_option, path_option

    def ks_option(text: str) -> list[int]:
        try:
            return parse_ks(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"--k {text}: {e}") from None

    s = sub.add_parser("sweep", help="fit DATA for several K and pick the elbow (inertia, silhouette, Davies-Bouldin)")
    s.add_argument("data", help="the rows to cluster (.zarr, .csv or .npy)")
    s.add_argument("--k", type=ks_option, required=True, metavar="K,K,...",
                   help="the numbers of clusters to fit: a list (8,16,32) or ranges (2-12)")
    s.add_argument("-o", "--output", type=path_option("-o"), default="sweep.json", metavar="SWEEP.json",
                   help="the summary: each K's inertia, scores, iterations and seconds, and the elbow "
                        "(default sweep.json)")
    s.add_argument("--plot", type=path_option("--plot"), metavar="ELBOW.png", help="also draw the elbow plot here (.png, .svg or .pdf)")
    s.add_argument("--sample", type=int_option("--sample"), default=SAMPLE_ROWS, metavar="N",
                   help=f"rows drawn for the silhouette and Davies-Bouldin scores (default {SAMPLE_ROWS})")
    s.add_argument("--init", default="k-means||", help="each fit's init (as fit's --init)")
    s.add_argument("--n-init", type=int_option("--n-init"), default=1, help="runs per K, the best kept")
    s.add_argument("--max-iter", type=int_option("--max-iter"), default=300, help="iterations per fit at most")
    s.add_argument("--seed", type=int_option("--seed", low=0, high=2**32 - 1), default=0,
                   help="seed of every fit and of the sample (default 0)")
    s.add_argument("--overwrite", action="store_true", help="replace an existing summary and plot")
    s.add_argument("-q", "--quiet", action="store_true", help="no line per K")
    data_args(s)
    cluster_args(s)


def run_command(args: Any) -> int:
    """``daskmeans sweep``: the outputs claimed before any work, one line per K, the elbow."""
    from . import cli
    from .dask_cluster import check_paths_on_workers, describe
    from .errors import DaskmeansError
    from .io.paths import Outputs, atomic_file

    with Outputs() as outputs:
        cli._check_cluster_args(args)
        if args.overwrite and os.path.isfile(args.output) and not is_summary(args.output):
            raise DaskmeansError(f"{args.output} is not a daskmeans sweep summary: --overwrite replaces only one")
        outputs.claim(args.output, None, args.overwrite, [args.data])
        if args.plot:
            outputs.claim(args.plot, "plot", args.overwrite, [args.data, args.output])
            cli._check_image_suffix(args.plot)
        table = cli._read(args)
        table.refuse_identifiers()  # a CSV id column is no feature, as for fit
        X = table.array
        with cli._connect(args) as client:
            cli._say(f"daskmeans: {describe(client)}")
            check_paths_on_workers(client, read=[args.data])
            cli._say(f"daskmeans: {X.shape[0]} x {X.shape[1]} {X.dtype}, K in {args.k}")

            def line(s: dict) -> None:
                cli._check_interrupt()
                if not args.quiet:
                    sil = "-" if s["silhouette"] is None else f"{s['silhouette']:.4f}"
                    db = "-" if s["davies_bouldin"] is None else f"{s['davies_bouldin']:.4f}"
                    cli._say(f"daskmeans: K={s['k']}: inertia {s['inertia']:.6e}, silhouette {sil}, "
                             f"Davies-Bouldin {db}, {s['n_iter']} iterations in {s['seconds']:.2f} s")

            with cli._config(args):
                res = sweep(X, args.k, sample=args.sample, random_state=args.seed, client=client, callback=line,
                            init=args.init, n_init=args.n_init, max_iter=args.max_iter, backend=args.backend)
        write_summary(res, args.output)
        if args.plot:
            with atomic_file(args.plot, kind="plot") as tmp:
                figure(res).savefig(tmp, format=os.path.splitext(args.plot)[1].lstrip(".").lower())
        cli._check_interrupt()
    cli._say(f"daskmeans: elbow at K={res.elbow}" if res.elbow is not None else
             "daskmeans: no elbow (it needs at least 3 values of K and a curve that is not flat)")
    cli._say(f"daskmeans: summary written to {args.output}" + (f", plot to {args.plot}" if args.plot else ""))
    return 0


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`sweep`: ``daskmeans.sweep`` is the public function, but
    once the submodule is imported (the command does) Python binds the package's ``sweep``
    attribute to the module itself; ``daskmeans.sweep(X, ks)`` then still runs the sweep."""

    def __call__(self, X: Any, ks: Sequence[int], **kwargs: Any) -> SweepResult:
        return sweep(X, ks, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
