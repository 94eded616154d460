"""The ``storage`` tier: a shard keeps no rows; each pass reads every chunk again from its
source (a file's row ranges, or the chunk's culled task graph, run on the worker: only the
path and offsets travel), the worker's reading threads (``daskmeans.read-threads``) reading
``daskmeans.read-ahead`` chunks ahead while the kernels run, into host buffers kept for the
shard's passes (page-locked on a GPU worker), each chunk checked against its pin as it is
read (:mod:`daskmeans.engine.reading`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import dask
import numpy as np
from dask.sizeof import sizeof

from ... import config
from ...backends import get_backend
from ...errors import DataError
from ...io.blocks import rows_of
from ...io.ranges import on_cores
from ..reading import stream_chunks
from .base import Need, Tier

if TYPE_CHECKING:  # pragma: no cover
    import dask.array as da

    from ..placement import Shard


class ChunkReader:
    """Reads one row chunk from its source on the worker: the chunk's culled task graph, run
    in the calling thread. Only the path and offsets travel. The fallback for arrays derived
    from a file (a file a reader opened is read by row ranges: ``RowSource.chunk``, which also
    reads chosen rows alone: :meth:`daskmeans.io.blocks.RowRange.read_rows`).

    Attributes
    ----------
    rows, n_features : int
        The chunk's shape.
    align : int
        ``rows``: the chunk is read in one piece (:class:`daskmeans.io.fill.ChunkSource`).
    """

    def __init__(self, block: "da.Array"):
        (block,) = dask.optimize(block)
        self.graph = dict(block.__dask_graph__())
        self.key = block.__dask_keys__()[0][0]
        self.rows, self.n_features = (int(s) for s in block.shape)
        self.align = max(1, self.rows)
        if sizeof(self.graph) > 2**20:  # a file reader's graph is a few hundred bytes
            raise DataError(
                "the storage tier re-reads each chunk from its source, but this array is held in the "
                "client's memory: read the data from a file (Zarr, .npy, CSV) or give the workers more memory"
            )

    def read(self) -> np.ndarray:
        """The chunk, shape (n_i, d), as a NumPy array."""
        from dask.local import get_sync

        return np.asarray(get_sync(self.graph, self.key))

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``start:stop`` of the chunk into ``out`` (stop - start, d): the chunk read,
        then copied (its graph makes a new array)."""
        out[...] = self.read()[start:stop]

    def read_rows(self, rows: np.ndarray) -> None:
        """None: a derived array's rows are read with its whole chunk (the caller reads it)."""
        return None


def _to_device(be: Any, block: np.ndarray) -> Any:
    """A device copy of the page-locked host ``block`` (the link's speed: no staging copy),
    done before its buffer is given to the next read."""
    out = be.xp.empty(block.shape, block.dtype)
    be.wait(be.copy_in(out, block))
    return out


class StorageTier(Tier):
    name = "storage"
    help = "re-read from the source file each pass"

    def resident_backend(self, backend: str) -> str | None:
        return None

    def hold(self, be: Any, block: Any) -> Any:
        raise TypeError("the storage tier keeps no blocks: its shards read them from their readers")

    def readers(self, X: "da.Array", ids: list[int]) -> list | None:
        # A file a reader opened is read by row ranges (only its path and the offsets travel,
        # cut into pieces of the file's own chunks for the reading threads); an array derived
        # from one, by each chunk's culled read graph.
        src = rows_of(X)
        if src is not None:
            offsets = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(int)
            return [src.chunk(int(offsets[i]), int(offsets[i + 1])) for i in ids]
        return [ChunkReader(X.blocks[i]) for i in ids]

    def stream(self, shard: "Shard") -> Iterator[Any]:
        host = get_backend("numpy")  # the pin of a chunk read from its source, on the host
        be = shard.be
        depth = int(config.get("read-ahead"))
        chunks = stream_chunks(be, shard.readers, shard.n_features, shard.dtype, shard.read_threads, depth,
                               lambda j, b: shard.check_pin(j, host, b), shard.buffers)
        return (be.asarray(b) if be.on_host else _to_device(be, b) for b in chunks)

    def take(self, shard: "Shard", picks: dict, host: bool = True) -> dict:
        # Rows read alone where the source can (only the file's chunks that hold them); else
        # only the chosen chunks are read, one at a time (each checked against its pin, as a
        # pass's are), and only their chosen rows kept.
        # The chunks at once where several hold picks (a round's few draws at small K each
        # decode a file chunk of their own); a single chunk splits its file chunks over the
        # cores itself (:meth:`RowRange.read_rows`). Host arrays whatever ``host`` asks: the
        # rows are read on the host.
        host = get_backend("numpy")

        def alone(j: int) -> tuple[int, Any]:
            return j, shard.readers[j].read_rows(picks[j])

        def whole(j: int) -> tuple[int, Any]:
            block = shard.readers[j].read()
            shard.check_pin(j, host, block)
            return j, np.asarray(block)[np.asarray(picks[j])]

        got = {j: part for j, part in on_cores(alone, list(picks)) if part is not None}
        got.update(on_cores(whole, sorted(j for j in picks if j not in got)))
        return got

    def refusal(self, need: Need) -> str | None:
        return None  # the loop's working set alone is checked by the plan, before any tier


TIER = StorageTier()
