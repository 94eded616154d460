"""Choices that belong to no heavier module, in one light module: the command's ``--help``
reads them without loading NumPy or Dask.

:data:`TIERS` names the memory tiers with their help (``engine.plan`` chooses one,
``engine.placement`` places the rows in it): the estimator's ``tier=`` values, the command's
``--tier`` choices and its help come from it. The tiers themselves are objects in
:data:`daskmeans.engine.tiers.REGISTRY`, with the same names and help in the same order
(``engine.tiers.register`` adds to both). :data:`LABEL_SUFFIXES` are the labels outputs' formats (``predict -o``,
``fit --labels``), checked as the command line is parsed. :data:`METRICS` names the metrics whose hooks
:data:`daskmeans.metric.REGISTRY` holds; the inits' registry is :data:`daskmeans.seeding.REGISTRY`.
"""

# The metrics' names (daskmeans.metric.REGISTRY holds their hooks, under these names): the
# model store checks a model's metric against them without loading the kernels.
METRICS = ("euclidean", "cosine")

# GEMM precisions of the GPU kernels (labels are exact in all of them; see backends.cupy_backend).
PRECISIONS = ("fp32", "tf32", "bf16")

# Where a worker keeps its rows during the iterations: name -> what it means, for the help
# ("auto", then engine.tiers.REGISTRY's tiers, in its order).
TIERS: dict[str, str] = {
    "auto": "the first of device, host, storage that fits the budgets",
    "device": "GPU memory",
    "host": "host memory (pinned on a GPU worker, copied to the GPU chunk by chunk each pass)",
    "storage": "re-read from the source file each pass",
}

# Labels outputs by their path's suffix (lower case) -> format (daskmeans.io.labels writes
# each); a path without a suffix is a Zarr store, as reading takes any directory for one.
LABEL_SUFFIXES: dict[str, str] = {".zarr": "zarr", ".npy": "npy", ".csv": "csv", ".parquet": "parquet"}


def label_format(path: str) -> str | None:
    """The format of a labels output at ``path`` (a value of :data:`LABEL_SUFFIXES`, "zarr"
    for no suffix), or None for a suffix of no labels format."""
    import os

    suffix = os.path.splitext(os.fspath(path).rstrip("/\\"))[1].lower()
    return "zarr" if suffix == "" else LABEL_SUFFIXES.get(suffix)
