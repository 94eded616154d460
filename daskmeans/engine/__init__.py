"""The engine: how a fit runs on a cluster.

- the kernels' per-cluster sums are fixed-point integers (:mod:`daskmeans.numerics.grid`)
  whose sum does not depend on the order of addition, so a result is bitwise the same for any
  chunking, number of workers and chunk-to-worker placement;
- :mod:`.collective` is the registry of the collectives that combine equal-sized integer
  buffers across the workers of a fit (:mod:`.nccl_collective` between GPU workers,
  :mod:`.dask_collective` between any workers, nothing for one worker), over the mailbox and
  protocol they share (:mod:`.mailbox`);
- :mod:`.loop` is the one Lloyd loop: one long task per worker runs segments of iterations
  over its local rows, each a step (:mod:`.step`) whose partials the workers combine through a
  collective, then re-seeded where a cluster is empty or too large (:mod:`.reseed`, choosing
  rows through :mod:`.allgather`); :mod:`.lloyd`, its client's side, sees a segment's
  statistics, shows progress, and re-plans when a worker is lost.
"""
