"""The host tier on the GPU: chunks in page-locked host memory copied to the device through
two buffers, the copy of the next chunk on its own stream overlapping the kernels of the
current one (52 GB/s of a 55 GB/s pinned copy on an H200: docs/performance.md)."""

from __future__ import annotations

from typing import Any

import numpy


class _Stager:
    """Host (pinned) chunks to the GPU through two device buffers, the copy of the next chunk
    on its own stream overlapping the kernels of the current one.

    A chunk yielded by :meth:`stream` is valid until the next is requested: its buffer is then
    refilled (after an event says the kernels that read it have run).
    """

    def __init__(self, max_elements: int, dtype: Any):
        import cupy

        self.bufs = [cupy.empty(max_elements, dtype) for _ in range(2)]
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)

    def _stage(self, i: int, block: numpy.ndarray, after: Any) -> Any:
        buf = self.bufs[i % 2][: block.size]
        if after is not None:
            self.copy_stream.wait_event(after)  # the kernels that read this buffer are done
        buf.set(block.reshape(-1), stream=self.copy_stream)
        return buf.reshape(block.shape), self.copy_stream.record()

    def stream(self, blocks: list) -> Any:
        import cupy

        if not blocks:
            return
        staged = self._stage(0, blocks[0], None)
        for i in range(len(blocks)):
            arr, copied = staged
            cupy.cuda.get_current_stream().wait_event(copied)
            if i + 1 < len(blocks):
                # Buffer (i+1) % 2 last held chunk i-1, whose kernels were enqueued before
                # chunk i was asked for: wait for them on the copy stream, not on the host.
                staged = self._stage(i + 1, blocks[i + 1], self._done_with_prev)
            yield arr
            self._done_with_prev = cupy.cuda.get_current_stream().record()

    _done_with_prev = None


def staged(blocks: list) -> Any:
    """Yield the pinned host ``blocks`` as device arrays, copies overlapping the kernels."""
    if not blocks:
        return iter(())
    return _Stager(max(b.size for b in blocks), blocks[0].dtype).stream(blocks)
