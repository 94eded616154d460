"""The benchmark problems, each defined once: its shape, what it stresses, and its host data.

Every subcommand takes its problems from here. The host data (:meth:`Problem.data`) are those
the ``command`` and ``tiers`` benchmarks write and fit; the GPU benchmarks draw ``randn``
data of the same shapes on the device (``kernels`` through PyTorch, ``multigpu`` per chunk on
the workers, the profilers with :func:`cupy_randn`), each as its module says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

# Rows a randn generator draws at a time: P4 is 7.7 GB, and a slice-by-slice draw gives the
# same values as one draw from the same generator.
BLOCK_ROWS = 1 << 20


@dataclass(frozen=True)
class Problem:
    """One benchmark problem.

    Attributes
    ----------
    name : str
        Its name in the subcommands' ``--problems`` and in the results.
    n, d, k : int
        Rows, features and clusters.
    description : str
        What it is and what it stresses, one line.
    generator : callable, optional
        ``generator(problem, seed) -> (X, init)``: float32 host data and the initial centroids
        (None where the fit seeds its own); see :meth:`data`.
    """

    name: str
    n: int
    d: int
    k: int
    description: str
    generator: Callable[[Problem, int], tuple[np.ndarray, np.ndarray | None]] | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(n, d, k)``."""
        return self.n, self.d, self.k

    @property
    def label(self) -> str:
        """``"P3 (3e5 x 408, K = 5000)"``: the name and shape, for tables and logs."""
        return f"{self.name} ({_num(self.n)} x {self.d}, K = {self.k})"

    def data(self, seed: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
        """The problem's host data.

        Parameters
        ----------
        seed : int
            The generator's seed (the ``command`` benchmark uses 0, the ``tiers`` P4 fit 1).

        Returns
        -------
        X : numpy.ndarray
            ``(n, d)`` float32.
        init : numpy.ndarray or None
            ``(k, d)`` initial centroids, or None where the fit seeds its own (blobs:
            k-means++).
        """
        if self.generator is None:
            raise ValueError(f"problem {self.name} has no host data generator")
        return self.generator(self, seed)

    def randn_blocks(self, seed: int, rows: int = BLOCK_ROWS, xp=np) -> Iterator[tuple[int, object]]:
        """Standard normal float32 rows, ``rows`` at a time from one generator.

        Parameters
        ----------
        seed : int
            Seed of ``xp.random.default_rng``.
        rows : int
            Rows per block.
        xp : module
            ``numpy``, or ``cupy`` to draw on the GPU (as the ``tiers`` benchmark does).

        Yields
        ------
        start : int
            The block's first row.
        block : array
            ``(min(rows, n - start), d)`` float32, of ``xp``.
        """
        rng = xp.random.default_rng(seed)
        for s in range(0, self.n, rows):
            yield s, rng.standard_normal((min(rows, self.n - s), self.d), dtype=xp.float32)

    def write_zarr(self, path: str, seed: int, rows: int = BLOCK_ROWS, xp=np):
        """The problem's randn rows (:meth:`randn_blocks` of ``seed``, ``rows`` at a time) as a
        float32 Zarr array at ``path`` with chunks of ``rows`` rows; returns the array.
        ``xp=cupy`` draws on the GPU (7.7 GB in seconds)."""
        import zarr

        z = zarr.create_array(path, shape=(self.n, self.d), chunks=(rows, self.d), dtype=np.float32)
        for s, block in self.randn_blocks(seed, rows=rows, xp=xp):
            z[s : s + len(block)] = block if xp is np else block.get()
        return z


def _num(n: int) -> str:
    """``1000000 -> "1e6"``, ``300000 -> "3e5"``; other counts as written."""
    text = f"{n:.0e}".replace("e+0", "e").replace("e+", "e")
    return text if float(text) == n else f"{n:,}"


def _classification(p: Problem, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``make_classification`` (its defaults), float32; init rows 1, 3, 6, 8."""
    from sklearn.datasets import make_classification

    X = make_classification(n_samples=p.n, n_features=p.d, random_state=seed)[0].astype(np.float32)
    return X, X[[1, 3, 6, 8]]


def _blobs(p: Problem, seed: int) -> tuple[np.ndarray, None]:
    """scikit-learn's ``make_blobs`` with K centres, float32; the fit seeds its own init."""
    from sklearn.datasets import make_blobs

    return make_blobs(n_samples=p.n, n_features=p.d, centers=p.k, random_state=seed)[0].astype(np.float32), None


def _randn(p: Problem, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal float32 from ``default_rng(seed)``; init the first K rows."""
    X = np.empty((p.n, p.d), np.float32)
    for s, block in p.randn_blocks(seed):
        X[s : s + len(block)] = block
    return X, X[: p.k]


def cupy_randn(p: Problem):
    """Unseeded standard normal float32 rows on the GPU (CuPy's global generator) and K of
    them, drawn without replacement, as float64 centroids: the profilers' data.

    Returns
    -------
    X : cupy.ndarray
        ``(n, d)`` float32.
    C : cupy.ndarray
        ``(k, d)`` float64.
    """
    import cupy

    X = cupy.random.standard_normal((p.n, p.d), dtype=cupy.float32)
    return X, X[cupy.random.permutation(p.n)[: p.k]].astype(cupy.float64)


def lloyd_update(X, C, labels):
    """The centroids after one Lloyd update of ``C`` (K, D) under ``labels`` (CuPy): each
    cluster's mean, summed in ``C``'s dtype a million rows at a time, an empty cluster's
    centroid kept; the profilers' later steps."""
    import cupy
    import cupyx

    k, d = C.shape
    sums = cupy.zeros((k, d), C.dtype)
    step = 1 << 20
    for s in range(0, X.shape[0], step):
        cupyx.scatter_add(sums, labels[s : s + step], X[s : s + step].astype(C.dtype))
    counts = cupy.bincount(labels, minlength=k).astype(C.dtype)[:, None]
    return cupy.where(counts > 0, sums / cupy.maximum(counts, 1), C)


PROBLEMS: dict[str, Problem] = {
    p.name: p
    for p in (
        Problem("P1", 1_000_000, 100, 4, "make_classification 1e6 x 100, K = 4, init rows 1, 3, 6, 8: "
                "small K, the whole command dominates", _classification),
        Problem("P2", 1_000_000, 100, 1000, "randn, K = 1000, short rows: the pass over the N x K tile matters",
                _randn),
        Problem("P3", 300_000, 408, 5000, "randn, GEMM-bound, large K x D", _randn),
        Problem("P4", 4_000_000, 480, 40_000, "randn, 7.7 GB of data, K beyond the block-local sort", _randn),
        Problem("S1", 1_000_000, 100, 4, "randn, the fused small-K kernel: bandwidth and registers", _randn),
        Problem("S2", 10_000_000, 2, 8, "randn, the fused small-K kernel: instructions per row", _randn),
        Problem("W10", 2_000_000, 128, 1 << 10, "randn, IVF-training shape: K = 2^10 at short D (the tf32 mode "
                "against fp32 from K = 2^10 on)", _randn),
        Problem("W12", 2_000_000, 128, 1 << 12, "randn, IVF-training shape: K = 2^12 at short D", _randn),
        Problem("W14", 2_000_000, 128, 1 << 14, "randn, IVF-training shape: wide K = 2^14 at short D", _randn),
        Problem("W16", 2_000_000, 128, 1 << 16, "randn, IVF-training shape: wide K = 2^16 at short D", _randn),
        Problem("W18", 2_000_000, 128, 1 << 18, "randn, IVF-training shape: wide K = 2^18 at short D", _randn),
        Problem("V12", 2_000_000, 64, 1 << 12, "randn, IVF-training shape: K = 2^12 at D = 64", _randn),
        Problem("V14", 2_000_000, 64, 1 << 14, "randn, IVF-training shape: K = 2^14 at D = 64", _randn),
        Problem("V16", 2_000_000, 64, 1 << 16, "randn, IVF-training shape: K = 2^16 at D = 64", _randn),
        Problem("V18", 2_000_000, 64, 1 << 18, "randn, IVF-training shape: K = 2^18 at D = 64", _randn),
        Problem("C10", 200_000, 32, 1024, "randn, K = 1024 at D = 32: Yinyang against Lloyd on a CPU's cores",
                _randn),
        Problem("blobs", 100_000, 2, 5, "make_blobs 2-D, K = 5, k-means++ init, up to 300 iterations", _blobs),
        Problem("randn1k", 1_000_000, 100, 1000, "randn, K = 1000, init the first K rows, 10 iterations", _randn),
        Problem("cpu", 1_000_000, 100, 256, "randn with a fresh seed per run, K = 4 and 256: the CPU pipeline"),
        Problem("tiers", 12_582_912, 64, 16, "randn, 3 GiB (--gib) of data-bound K = 16, D = 64: the host and "
                "storage tiers, data 3x the device budget"),
        Problem("limits", 30_000_000, 64, 16, "randn (seed 2), a 7.7 GB Zarr through `daskmeans fit` under "
                "memory limits", _randn),
    )
}


def get(name: str) -> Problem:
    """The problem called ``name``."""
    try:
        return PROBLEMS[name]
    except KeyError:
        raise KeyError(f"unknown problem {name!r} (known: {', '.join(PROBLEMS)})") from None


def pick(*names: str) -> dict[str, Problem]:
    """``{name: Problem}`` for ``names``, in that order."""
    return {name: get(name) for name in names}


def choose(text: str, allowed: dict[str, Problem]) -> list[Problem]:
    """The problems of a comma-separated ``--problems`` value, each one of ``allowed``.

    Raises
    ------
    ValueError
        For a name not in ``allowed``.
    """
    names = [s for s in text.split(",") if s]
    bad = [s for s in names if s not in allowed]
    if bad:
        raise ValueError(f"unknown problem {bad[0]!r} (choose from {', '.join(allowed)})")
    return [allowed[s] for s in names]
