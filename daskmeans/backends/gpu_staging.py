"""Host memory to the GPU.

The host tier: chunks in page-locked host memory copied to the device through two buffers,
the copy of the next chunk on its own stream overlapping the kernels of the current one, so
the tier runs near the pinned copy's rate (docs/performance.md, "host tier").

Rows read into page-locked buffers by a reading pipeline's threads go to their device blocks on
a copy stream of each thread's own (:func:`copy_in`), overlapping the threads' next reads.

Placement of an in-memory chunk in the device tier (:func:`upload`): a chunk in ordinary (pageable) host memory goes
through a few page-locked buffers filled by threads, each buffer's copy to the device
overlapping the filling of the others: faster than CuPy's copy of pageable memory, above all
a process's first (docs/performance.md, "placement"); an array already in page-locked memory
(the Dask collective's sums between hosts) is copied as it is.
"""

from __future__ import annotations

import threading
from concurrent.futures import wait
from typing import Any

import numpy


def empty_pinned(shape: tuple | int, dtype: Any) -> numpy.ndarray:
    """An uninitialised host array in page-locked memory (freed with the array). What
    ``cupyx.empty_pinned`` does, without importing ``cupyx``, which loads its SciPy layer."""
    import cupy

    dtype = numpy.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, numpy.integer)) else tuple(shape)
    mem = cupy.cuda.alloc_pinned_memory(max(1, int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize))
    return numpy.ndarray(shape, dtype, buffer=mem)


_COPY_STREAMS = threading.local()


def copy_in(dst: Any, src: numpy.ndarray) -> Any:
    """Queue ``dst[...] = src`` (``src`` page-locked host memory, ``dst`` a C-contiguous device
    array of its shape and dtype, on its own device) on a non-blocking stream of the calling
    thread's own for that device, made on its first use: the copies of a reading pipeline's
    threads (:mod:`daskmeans.io.fill`) overlap each other and the threads' next reads, at the
    link's speed since no staging copy is made. Returns the event recorded after the copy."""
    import cupy

    with dst.device:
        dev = dst.device.id
        streams = getattr(_COPY_STREAMS, "by_device", None)
        if streams is None:
            streams = _COPY_STREAMS.by_device = {}
        stream = streams.get(dev)
        if stream is None:
            stream = streams[dev] = cupy.cuda.Stream(non_blocking=True)
        # The memory pool may have handed ``dst`` over from work still queued on the current
        # stream: the copy waits for it there, on the device, not here.
        stream.wait_event(cupy.cuda.get_current_stream().record())
        dst.set(src, stream=stream)
        return stream.record()


UPLOAD_PIECE_BYTES = 16 << 20
UPLOAD_LANES = 4
UPLOAD_MIN_BYTES = 4 * UPLOAD_PIECE_BYTES  # smaller arrays: one copy of pageable memory


class _Uploader:
    """One device's page-locked buffers, streams and threads for :func:`upload` (kept for the
    process: allocating page-locked memory costs more than a copy)."""

    def __init__(self, device: int):
        import cupy
        from concurrent.futures import ThreadPoolExecutor

        self.device = device
        self.lanes = [(empty_pinned(UPLOAD_PIECE_BYTES, numpy.uint8), cupy.cuda.Stream(non_blocking=True))
                      for _ in range(UPLOAD_LANES)]
        self.pool = ThreadPoolExecutor(UPLOAD_LANES, thread_name_prefix="daskmeans-upload")
        self.lock = threading.Lock()  # one upload at a time uses the buffers

    def copy(self, src: numpy.ndarray, dst: Any) -> None:
        """``dst[:] = src`` for a contiguous host byte array and a device byte array."""
        import cupy

        n, step, lanes = src.size, UPLOAD_PIECE_BYTES, len(self.lanes)

        def lane(j: int) -> None:
            buf, stream = self.lanes[j]
            with cupy.cuda.Device(self.device):
                for a in range(j * step, n, lanes * step):
                    b = min(n, a + step)
                    stream.synchronize()  # the buffer's previous copy is done
                    numpy.copyto(buf[: b - a], src[a:b])  # a plain memcpy: other lanes run meanwhile
                    dst[a:b].set(buf[: b - a], stream=stream)
                stream.synchronize()

        with self.lock:
            futs = [self.pool.submit(lane, j) for j in range(lanes)]
            wait(futs)  # every lane done with its buffer before the next upload, even after an error
            for f in futs:
                f.result()


def page_locked(a: numpy.ndarray) -> bool:
    """Whether host array ``a``'s memory is page-locked (CUDA's host memory: allocated or
    registered through CUDA, :func:`empty_pinned`), which CuPy's copy to the device takes as
    it is; from pageable memory it copies through page-locked memory of its pool first, one
    host copy more, and :func:`upload` through its lanes above :data:`UPLOAD_MIN_BYTES`."""
    import cupy

    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(a.ctypes.data)
    except cupy.cuda.runtime.CUDARuntimeError:
        return False
    return attrs.type == cupy.cuda.runtime.memoryTypeHost


_UPLOADERS: dict[int, _Uploader] = {}
_UPLOADERS_LOCK = threading.Lock()


def upload(a: numpy.ndarray) -> Any:
    """A C-contiguous device copy of host array ``a`` (on the current device), through
    page-locked buffers filled by threads; arrays under :data:`UPLOAD_MIN_BYTES` are copied
    directly, and so are arrays already in page-locked memory (:func:`page_locked`), at the
    link's speed with no host copy."""
    import cupy

    a = numpy.ascontiguousarray(a)
    if a.nbytes and page_locked(a):
        # CuPy's own copy takes page-locked memory as it is; waited for, as the caller may
        # write ``a`` again at once.
        return cupy.asarray(a, blocking=True)
    if a.nbytes < UPLOAD_MIN_BYTES:
        return cupy.asarray(a)
    dev = cupy.cuda.Device().id
    with _UPLOADERS_LOCK:
        up = _UPLOADERS.get(dev)
        if up is None:
            up = _UPLOADERS[dev] = _Uploader(dev)
    out = cupy.empty(a.shape, a.dtype)
    cupy.cuda.get_current_stream().synchronize()  # the allocation's stream is done with the memory
    up.copy(a.reshape(-1).view(numpy.uint8), out.reshape(-1).view(cupy.uint8))
    return out


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
