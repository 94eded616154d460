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
    in the calling thread. Only the path and offsets travel.

    Where the array is a reader's own (``io.readers.rows_of``: its rows are the file's), the
    reader also reads chosen rows alone (:meth:`read_rows`): only the file's chunks that hold
    them (its ``align`` rows each), not the whole row chunk."""

    def __init__(self, block: "da.Array", source: Any = None, start: int = 0):
        self.source = source  # io.blocks.RowSource, or None
        self.start = int(start)  # the chunk's first row in the file
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

    def read_rows(self, rows: np.ndarray) -> np.ndarray | None:
        """The chunk's rows ``rows`` (local indices, int64 ``(m,)``), shape (m, d), in that
        order: only the file's chunks that hold them are read, each once. None where the
        source cannot read rows alone (the caller reads the chunk). A row read alone is not
        checked against the chunk's pin (a pin is of the whole chunk): the next pass reads and
        checks the whole chunk."""
        src = self.source
        if src is None:
            return None
        rows = np.asarray(rows, np.int64)
        glob = rows + self.start
        first = glob // src.align * src.align  # the file chunk of each row
        out = np.empty((len(rows), src.d), src.out_dtype)
        for s in np.unique(first):
            at = np.flatnonzero(first == s)
            part = np.asarray(src.fn(*src.args, int(s), int(min(s + src.align, src.n))))
            out[at] = part[glob[at] - s]  # as the chunk's read: the file's values in the array's dtype
        return out


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
        from ...io.readers import rows_of

        src = rows_of(X)  # X's rows are its file's (a reader's own array): chosen rows read alone
        starts = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(int).tolist()
        return [ChunkReader(X.blocks[i], src, starts[i]) for i in ids]

    def stream(self, shard: "Shard") -> Iterator[Any]:
        host = get_backend("numpy")  # the pin of a chunk read from its source, on the host
        be = shard.be
        depth = int(config.get("read-ahead"))
        return (be.asarray(b) for b in read_ahead(shard.readers, depth, lambda j, b: shard.check_pin(j, host, b)))

    def take(self, shard: "Shard", picks: dict) -> dict:
        # Rows read alone where the source can (only the file's chunks that hold them); else
        # only the chosen chunks are read (each checked against its pin, as a pass's are), by
        # the read-ahead thread of a pass (two chunks in flight: the plan's budget), and only
        # their chosen rows kept.
        got = {}
        for j, rows in picks.items():
            part = shard.readers[j].read_rows(rows)
            if part is not None:
                got[j] = part
        host = get_backend("numpy")
        js = sorted(j for j in picks if j not in got)
        depth = int(config.get("read-ahead"))
        blocks = read_ahead([shard.readers[j] for j in js], depth, lambda i, b: shard.check_pin(js[i], host, b))
        got.update({j: np.asarray(block)[np.asarray(picks[j])] for j, block in zip(js, blocks)})
        return got

    def refusal(self, need: Need) -> str | None:
        return None  # the loop's working set alone is checked by the plan, before any tier


TIER = StorageTier()
