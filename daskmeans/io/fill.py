"""Rows read into the caller's buffers by several threads: the reading pipeline of placement
and of the storage tier's passes.

A source of rows gives "rows ``a:b`` of this chunk into this buffer" (:class:`ChunkSource`:
:meth:`daskmeans.io.blocks.RowSource.chunk` for a file a reader opened, whose pieces are whole
chunks of the file; a culled read graph for any other, one piece per chunk). The pipeline cuts
the chunks into pieces (:func:`pieces`) and reads them on a pool of threads
(:func:`daskmeans.io.ranges.reading_pool`), every thread into the rows the caller chose for its
piece: the caller supplies the buffers (page-locked on a GPU worker, a staging buffer on its
way to the device, or the resident block itself), this module knows nothing of where they
live. The reads release the interpreter lock (``os.preadv``; numcodecs' Zstd and Blosc
decompress without it), so the threads run on as many cores as they are given.

:func:`fill` reads every piece (placement); :func:`ordered` gives the chunks in order as each is
complete, a bounded number ahead of the one the caller holds (a pass of the storage tier).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from .ranges import in_place, reading_pool

# A piece: rows read by one thread in one go; big enough that a thread's fixed costs (opening
# the file, a Zstd frame's set-up) are small beside it, small enough that every thread of a
# worker has pieces of one chunk to read. Pieces are whole chunks of the file above this.
PIECE_BYTES = 32 << 20


class ChunkSource(Protocol):
    """One chunk of rows that can be read into a caller's buffer.

    Attributes
    ----------
    rows : int
        The chunk's rows.
    align : int
        Pieces of the chunk start at multiples of this many rows (the file's own chunks: a
        piece that cut one would decompress it twice); ``rows`` or more: the chunk is read in
        one piece.
    """

    rows: int
    align: int

    # Optional: ``cuts``, a tuple of rows where the source's own pieces start inside the chunk
    # (the first 0), for pieces of uneven lengths (a CSV file's pieces of whole lines): the
    # pipeline's pieces are those. Sources without it are cut by ``align``.

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``start:stop`` of the chunk into ``out``, a C-contiguous array of shape
        (stop - start, n_features) in the chunk's dtype."""


@dataclass(frozen=True)
class Piece:
    """Rows ``start:stop`` of the caller's chunk ``chunk`` (an index into its list)."""

    chunk: int
    start: int
    stop: int


def pieces(chunk: int, source: ChunkSource, row_bytes: int, piece_bytes: int | None = None) -> list[Piece]:
    """Chunk ``chunk``'s pieces of about ``piece_bytes`` (default :data:`PIECE_BYTES`;
    ``row_bytes`` a row), whole multiples of its ``align`` rows; one piece where the chunk
    cannot be cut. A source that says where its own pieces start (``cuts``) is read in those:
    each is parsed whole by one thread (a CSV file's, a few MB of text each, spread the parse
    over every thread where pieces of ``piece_bytes`` of rows would leave some idle)."""
    piece_bytes = PIECE_BYTES if piece_bytes is None else piece_bytes
    n, align = int(source.rows), max(1, int(source.align))
    cuts = getattr(source, "cuts", None)
    if cuts is not None:
        edges = sorted({0, n, *(int(c) for c in cuts if 0 < int(c) < n)})
        return [Piece(chunk, a, b) for a, b in zip(edges, edges[1:])] or [Piece(chunk, 0, 0)]
    step = max(align, int(piece_bytes) // max(1, int(row_bytes)) // align * align)
    return [Piece(chunk, a, min(n, a + step)) for a in range(0, n, step)] or [Piece(chunk, 0, 0)]


class _Chunks:
    """Each chunk's pieces not yet read and its completion, shared by the threads."""

    def __init__(self, counts: Sequence[int], finished: Callable[[int], None] | None):
        self.left = list(counts)
        self.cut = [c > 1 for c in counts]
        self.done = [Future() for _ in counts]
        self.finished = finished
        self.lock = threading.Lock()

    def run(self, read: Callable[[Piece], None], p: Piece) -> None:
        """Read ``p``; the thread that reads a chunk's last piece calls ``finished`` on it and
        completes it; a failure completes the chunk with the error."""
        done = self.done[p.chunk]
        if done.done():  # the chunk failed already
            return
        try:
            if p.stop > p.start and self.cut[p.chunk]:
                with in_place():  # one of several pieces: the other threads read the others
                    read(p)
            elif p.stop > p.start:
                read(p)  # a chunk read in one piece splits its own read over the shared pools
            with self.lock:
                self.left[p.chunk] -= 1
                last = self.left[p.chunk] == 0
            if last:
                if self.finished is not None:
                    self.finished(p.chunk)
                done.set_result(None)
        except BaseException as e:  # the caller sees it where it waits for the chunk
            with self.lock:
                if not done.done():
                    done.set_exception(e)


def fill(chunks: Sequence[list[Piece]], read: Callable[[Piece], None], threads: int,
         finished: Callable[[int], None] | None = None) -> None:
    """``read(piece)`` for every piece of every chunk (``chunks[j]``, chunk ``j``'s pieces) on
    ``threads`` threads; ``finished(j)`` called by the thread that read chunk ``j``'s last piece.
    Returns once every read has returned (none still writes into the caller's buffers), then
    raises the first chunk's failure."""
    state = _Chunks([len(ps) for ps in chunks], finished)
    with reading_pool(threads) as ex:
        for ps in chunks:
            for p in ps:
                ex.submit(state.run, read, p)
    for done in state.done:
        done.result()


def ordered(chunks: Sequence[list[Piece]], read: Callable[[Piece], None], threads: int, ahead: int,
            finished: Callable[[int], None] | None = None, start: Callable[[int], None] | None = None) -> Iterator[int]:
    """Chunk indices ``0, 1, ...`` in order, each once it is read (every piece, then
    ``finished(j)``), with the pieces of up to ``ahead`` further chunks read meanwhile by
    ``threads`` threads.

    Chunk ``j + ahead``'s reads start (``start(j + ahead)`` first: the caller's buffer for it)
    once the caller asks for chunk ``j``, so it may reuse chunk ``j - 1``'s buffer: at most
    ``ahead + 1`` chunks are held at once. Closing the generator (a pass stopped early, an
    error) cancels the reads not started and waits for those running.
    """
    n, ahead = len(chunks), max(0, int(ahead))
    state = _Chunks([len(ps) for ps in chunks], finished)
    ex = reading_pool(threads)

    def submit(j: int) -> None:
        if j < n:
            if start is not None:
                start(j)
            for p in chunks[j]:
                ex.submit(state.run, read, p)

    try:
        for j in range(min(ahead, n)):
            submit(j)
        for j in range(n):
            submit(j + ahead)
            state.done[j].result()
            yield j
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
