"""daskmeans' benchmarks: one harness, run from the repository root as
``python -m benchmarks SUBCOMMAND [options]`` (``--help`` lists the subcommands,
``SUBCOMMAND --help`` their options).

Subcommands, what each measures, and against which floor (measured in the same run):

- ``kernels``: one GPU kernel step (labels, sums, inertia) on P2-P4, S1, S2, W10-W18, V12-V18,
  data resident; floors the cuBLAS fp32, TF32 and float16 GEMMs of the same shape, one HBM read
  of X and a tiled PyTorch step; peer flash-kmeans' iteration in float16 and float32 where it is
  installed (``--skip-flash``).
- ``command``: whole ``daskmeans fit`` commands (a subprocess, warm and empty kernel cache),
  split into phases; against scikit-learn's script doing the same; the default init at wide K
  in iteration-times (``--problems w14,w16,w18 --warm-only``).
- ``multigpu``: P3 and P4 per iteration on 1 and 2 (or more) GPUs, NCCL and Dask collectives;
  against 1 GPU, with the centroids checked bitwise.
- ``tiers``: the host and storage tiers; floors the pinned host-to-device copy and the store's
  read; P4 in the host tier against the device tier; the command under memory limits.
- ``placement``: placement and the storage tier's passes (the workers' reading pipeline) of a
  Zarr store and of the same rows as ``.npy``, on a GPU or on the CPU; floors the same run's
  raw read and Zstd decode at 1 and 16 threads.
- ``cpu``: the CPU pipeline per iteration against scikit-learn, whole fits against dask-ml,
  and the orchestration overhead with 1000 chunks.
- ``scale``: the largest fits (1e8 x 384 in the host tier; 2e7 x 128 at K = 2^20) as whole
  commands on every GPU of the host; against the kernel step at the same D and K on one GPU,
  scaled to each GPU's rows.
- ``hosts``: P3 on two simulated hosts (workers on 127.0.0.2 and 127.0.0.3, one per GPU), the
  Dask collective against NCCL over sockets, alternated in one run, with the models checked
  bitwise.
- ``table``: no measurement: the README's performance tables from ``results/`` (``--check``
  fails where they differ).
- ``profile-step``, ``profile-small``, ``profile-host``, ``profile-init``: the GEMM regime's
  step in pieces, the fused small-K kernel's variants, the host time of a small-K step, the
  k-means|| recluster's time in iteration-times and host profile (printed only, for planning
  kernel work).

Problems are defined once, in :mod:`benchmarks.problems`. Results: ``--out PATH`` writes JSON
(:mod:`benchmarks.meta`), ``--merge`` merges a run into an existing file; one current file per
benchmark and device kind is committed as ``results/<benchmark>_<device>.json`` (git keeps
the history), and ``python -m benchmarks table`` brings the README up to date with them.
GPU libraries are imported inside the subcommands, so ``--help`` and ``table`` run anywhere.
"""
