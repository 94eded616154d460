"""The ``storage`` tier: a shard keeps no rows; each pass reads every chunk again from its
source (the chunk's culled task graph, run on the worker: only the path and offsets travel),
a thread reading ahead while the kernels run, each chunk checked against its pin as it is
read."""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator

import dask
import numpy as np
from dask.sizeof import sizeof

from ... import config
from ...backends import get_backend
from ...errors import DataError
from .base import Need, Tier

if TYPE_CHECKING:  # pragma: no cover
    import dask.array as da

    from ..placement import Shard


class ChunkReader:
    """Reads one row chunk from its source on the worker: the chunk's culled task graph, run
    in the calling thread. Only the path and offsets travel."""

    def __init__(self, block: "da.Array"):
        (block,) = dask.optimize(block)
        self.graph = dict(block.__dask_graph__())
        self.key = block.__dask_keys__()[0][0]
        if sizeof(self.graph) > 2**20:  # a file reader's graph is a few hundred bytes
            raise DataError(
                "the storage tier re-reads each chunk from its source, but this array is held in the "
                "client's memory: read the data from a file (Zarr, .npy, CSV) or give the workers more memory"
            )

    def read(self) -> np.ndarray:
        """The chunk, shape (n_i, d), as a NumPy array."""
        from dask.local import get_sync

        return np.asarray(get_sync(self.graph, self.key))


def read_ahead(readers: list, depth: int, check: Callable[[int, np.ndarray], None]) -> Iterator[np.ndarray]:
    """The readers' chunks in order, up to ``depth`` read ahead by a thread while the caller
    computes (reading and decompressing overlap the kernels); ``check(j, block)`` runs on each
    chunk ``j`` in that thread, as it is read (its pin)."""

    def read(j: int) -> np.ndarray:
        block = readers[j].read()
        check(j, block)
        return block

    with ThreadPoolExecutor(1, thread_name_prefix="daskmeans-read-ahead") as ex:
        pending = collections.deque(ex.submit(read, j) for j in range(min(depth, len(readers))))
        nxt = len(pending)
        while pending:
            block = pending.popleft().result()
            if nxt < len(readers):
                pending.append(ex.submit(read, nxt))
                nxt += 1
            yield block


class StorageTier(Tier):
    name = "storage"
    help = "re-read from the source file each pass"

    def resident_backend(self, backend: str) -> str | None:
        return None

    def hold(self, be: Any, block: Any) -> Any:
        raise TypeError("the storage tier keeps no blocks: its shards read them from their readers")

    def readers(self, X: "da.Array", ids: list[int]) -> list | None:
        return [ChunkReader(X.blocks[i]) for i in ids]

    def stream(self, shard: "Shard") -> Iterator[Any]:
        host = get_backend("numpy")  # the pin of a chunk read from its source, on the host
        be = shard.be
        depth = int(config.get("read-ahead"))
        return (be.asarray(b) for b in read_ahead(shard.readers, depth, lambda j, b: shard.check_pin(j, host, b)))

    def take(self, shard: "Shard", picks: dict) -> dict:
        # Only the chosen chunks are read (each checked against its pin, as a pass's are), by
        # the read-ahead thread of a pass (two chunks in flight: the plan's budget); only their
        # chosen rows are kept.
        host = get_backend("numpy")
        js = sorted(picks)
        depth = int(config.get("read-ahead"))
        blocks = read_ahead([shard.readers[j] for j in js], depth, lambda i, b: shard.check_pin(js[i], host, b))
        return {j: np.asarray(block)[np.asarray(picks[j])] for j, block in zip(js, blocks)}

    def refusal(self, need: Need) -> str | None:
        return None  # the loop's working set alone is checked by the plan, before any tier


TIER = StorageTier()
