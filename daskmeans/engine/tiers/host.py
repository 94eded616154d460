"""The ``host`` tier: a shard's rows resident in host memory (page-locked on a GPU worker),
copied to the GPU chunk by chunk each pass, the copies overlapping the kernels
(``backends.gpu_staging``); for the NumPy backend the blocks are read where they are."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
from dask.utils import format_bytes

from ..reading import locked
from .base import Need, Tier

if TYPE_CHECKING:  # pragma: no cover
    from ..placement import Shard


class HostTier(Tier):
    name = "host"
    help = "host memory (pinned on a GPU worker, copied to the GPU chunk by chunk each pass)"

    def resident_backend(self, backend: str) -> str | None:
        return "numpy"

    def hold(self, be: Any, block: Any) -> Any:
        if be.on_host:
            return be.pinned(block)  # the host's backend reads the block where it is
        # A copy in ordinary memory, page-locked in place: allocating page-locked memory runs
        # at a fraction of the copy's rate, locking memory already written at many times it
        # (docs/performance.md, "placement of a file, the storage tier's passes"), as the
        # blocks read from a file are.
        return locked(be, np.array(block, order="C", copy=True))

    def stream(self, shard: "Shard") -> Iterator[Any]:
        # On a GPU the copy of the next chunk overlaps the current chunk's kernels.
        return shard.be.staged(shard.blocks)

    def refusal(self, need: Need) -> str | None:
        # Host memory holds the data and, on a host backend, the loop's working set beside it:
        # where the budget holds the working set but not both, the storage tier streams the data.
        host_need = need.share + (0 if need.gpu else need.working)
        if host_need <= need.host_budget:
            return None
        loop = "" if need.gpu else f" ({format_bytes(need.share)} of data, {format_bytes(need.working)} for the loop)"
        return (f"tier='host' needs {format_bytes(host_need)} of host memory per worker{loop}, more than its budget "
                f"{format_bytes(need.host_budget)} (--memory-limit): use tier 'storage', or more workers")


TIER = HostTier()
