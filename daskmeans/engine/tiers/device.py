"""The ``device`` tier: a shard's rows resident as the backend's arrays (GPU memory on a GPU,
host memory for the NumPy backend), read by the kernels where they are."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from dask.utils import format_bytes

from .base import Need, Tier

if TYPE_CHECKING:  # pragma: no cover
    from ..placement import Shard


class DeviceTier(Tier):
    name = "device"
    help = "GPU memory"
    yields_resident = True

    def resident_backend(self, backend: str) -> str | None:
        return backend

    def hold(self, be: Any, block: Any) -> Any:
        # The backend's asarray makes each block contiguous and aligned, once, for the kernels.
        return be.asarray(block)

    def stream(self, shard: "Shard") -> Iterator[Any]:
        return iter(shard.blocks)

    def unusable(self, gpu: bool) -> str | None:
        return None if gpu else "tier='device' needs GPU workers; CPU workers hold data in the 'host' tier"

    def refusal(self, need: Need) -> str | None:
        why = self.unusable(need.gpu)
        if why is not None:
            return why
        if need.device_budget is not None and need.share + need.working <= need.device_budget:
            return None
        budget = "none" if need.device_budget is None else format_bytes(need.device_budget)
        return (f"tier='device' needs {format_bytes(need.share + need.working)} per GPU worker, more than its device "
                f"memory budget {budget} (--device-memory-limit): use tier 'host' or 'storage', or more GPUs")


TIER = DeviceTier()
