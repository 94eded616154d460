"""The benchmark problems, defined once: ``(n, d, k)`` by name.

P1 is make_classification-style data (1e6 x 100, K = 4, initial centroids rows 1, 3, 6, 8;
``command.py`` writes it); P2-P4, S1 and S2 are float32 standard normal data (the kernel,
multi-GPU and tier benchmarks draw it); blobs and randn1k are the whole-command problems of
the same names. Every benchmark takes its shapes from here.
"""

SHAPES: dict[str, tuple[int, int, int]] = {
    "P1": (1_000_000, 100, 4),  # the seed problem: small K, the whole command dominates
    "P2": (1_000_000, 100, 1000),  # moderate K, short rows: the pass over the N x K tile matters
    "P3": (300_000, 408, 5000),  # GEMM-bound, large K x D
    "P4": (4_000_000, 480, 40_000),  # 7.7 GB of data, K beyond the block-local sort
    "S1": (1_000_000, 100, 4),  # the fused small-K kernel: bandwidth and registers
    "S2": (10_000_000, 2, 8),  # the fused kernel: instructions per row
    "blobs": (100_000, 2, 5),  # 2-D blobs, up to 300 iterations
    "randn1k": (1_000_000, 100, 1000),  # K = 1000, 10 iterations
}


def pick(*names: str) -> dict[str, tuple[int, int, int]]:
    """``{name: (n, d, k)}`` for ``names``, in that order."""
    return {name: SHAPES[name] for name in names}
