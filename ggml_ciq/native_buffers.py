"""NativeOps' buffers: DeviceArray (an array in a libggml_ciq buffer on the ops' device), the pool that reuses
buffers, CUDA graph captures (Graph, their arenas), and BufferOps, the part of NativeOps that makes, uploads, reads
back and frees arrays and captures graphs.

A DeviceArray is contiguous row-major float32, float16 or int32 (uint8 for raw GGUF blocks) in a
``ciq_memory_alloc`` buffer; its buffer returns to the pool when the last DeviceArray on it is gone.
"""

from __future__ import annotations

import contextlib
import gc
import math

import numpy as np

from . import native
from .errors import InvalidArgumentError, ShapeError
from .model import Tensor

DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32))


class _Pool:
    """The buffers of one NativeOps: ``allocated`` bytes in all, of which ``free`` (by exact size) wait for reuse.
    A GPU buffer is never handed back to the driver while the ops run (cudaFree synchronizes the device); reuse is
    safe because every op is queued in order on one stream."""

    def __init__(self, device: int):
        self.native, self.device = native.load(), device
        self.allocated = 0
        self.free: dict[int, list] = {}
        self.arena: _Arena | None = None  # while a graph is captured: where new allocations come from

    def take(self, nbytes: int):
        cached = self.free.get(nbytes)
        if cached:
            return cached.pop()
        ptr = self.native.ffi.new("void **")
        self.native.check(self.native.lib.ciq_memory_alloc(self.device, nbytes, ptr))
        self.allocated += nbytes
        return ptr[0]

    def give(self, nbytes: int, ptr) -> None:
        self.free.setdefault(nbytes, []).append(ptr)

    def trim(self) -> None:
        """Free every cached buffer."""
        for nbytes, ptrs in self.free.items():
            for ptr in ptrs:
                self.native.check(self.native.lib.ciq_memory_free(self.device, ptr))
                self.allocated -= nbytes
        self.free.clear()

    def __del__(self):
        try:
            self.trim()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


class _Arena:
    """The buffers allocated while a graph is captured: reused within the capture as the pool reuses buffers, then
    kept for the graph (its replays write every one of them) until the graph is freed, when they return to the
    pool."""

    def __init__(self, pool: _Pool):
        self.pool, self.free, self.closed = pool, {}, False

    def take(self, nbytes: int):
        cached = self.free.get(nbytes)
        return cached.pop() if cached else self.pool.take(nbytes)

    def give(self, nbytes: int, ptr) -> None:
        if self.closed:
            self.pool.give(nbytes, ptr)
        else:
            self.free.setdefault(nbytes, []).append(ptr)

    def close(self) -> None:
        self.closed = True
        for nbytes, ptrs in self.free.items():
            for ptr in ptrs:
                self.pool.give(nbytes, ptr)
        self.free.clear()


class _Allocation:
    """One pooled buffer, returned to its pool (or the arena of the graph capture it was made in) when the last
    DeviceArray on it is gone."""

    def __init__(self, pool: _Pool, nbytes: int):
        self.pool, self.nbytes, self.device, self.native = pool, nbytes, pool.device, pool.native
        self.owner = pool.arena or pool
        self.ptr = self.owner.take(nbytes)

    def __del__(self):
        if getattr(self, "ptr", None) is not None:
            self.owner.give(self.nbytes, self.ptr)
            self.ptr = None


class DeviceArray:
    """A contiguous array in device memory: ``shape``, ``dtype``, ``ptr``, ``device``, ``nbytes``; ``numpy()``
    copies it to the host; ``view(shape)`` and ``rows(start, stop)`` share its memory."""

    def __init__(self, allocation: _Allocation, shape, dtype, offset: int = 0):
        self._allocation, self._offset = allocation, offset
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.device = allocation.device
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.ptr = allocation.native.ffi.cast("char *", allocation.ptr) + offset

    @property
    def size(self) -> int:
        return self.nbytes // self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        n = self._allocation.native
        if self.nbytes:
            n.check(n.lib.ciq_memory_download(self.device, n.ffi.from_buffer(out), self.ptr, self.nbytes))
        return out

    def view(self, shape) -> "DeviceArray":
        shape = tuple(int(s) for s in shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.size // max(known, 1) if s == -1 else s for s in shape)
        if math.prod(shape) != self.size:
            raise ShapeError(f"cannot view {self.shape} as {shape}")
        return DeviceArray(self._allocation, shape, self.dtype, self._offset)

    def rows(self, start: int, stop: int) -> "DeviceArray":
        if not 0 <= start <= stop <= self.shape[0]:
            raise ShapeError(f"rows {start}:{stop} outside the {self.shape[0]} rows of {self.shape}")
        row_bytes = self.nbytes // self.shape[0] if self.shape[0] else 0
        return DeviceArray(self._allocation, (stop - start,) + self.shape[1:], self.dtype,
                           self._offset + start * row_bytes)


class Graph:
    """A CUDA graph of NativeOps calls (NativeOps.graph_capture): ``launch()`` replays them on the buffers they were
    captured with (fill the inputs first), ``outputs`` keeps what the capture returned; ``close()`` frees it (and
    its arena, unless the arena was passed in: then its owner closes it)."""

    def __init__(self, ops: "BufferOps", arena: _Arena, owns_arena: bool):
        self.ops, self._arena, self._owns_arena, self._handle, self.outputs = ops, arena, owns_arena, None, None

    def launch(self) -> None:
        if self._handle is None:
            raise InvalidArgumentError("this graph was not captured, or is closed")
        self.ops._not_capturing("a graph launch")
        self.ops.native.check(self.ops.native.lib.ciq_graph_launch(self._handle))

    def close(self) -> None:
        handle, self._handle, self.outputs = self._handle, None, None
        try:
            if handle is not None:
                self.ops.native.check(self.ops.native.lib.ciq_graph_free(handle))
        finally:
            if self._owns_arena:
                self._arena.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class BufferOps:
    """NativeOps' arrays, uploads and downloads, and CUDA graph captures (a part of NativeOps, ggml_ciq.native_ops:
    it uses the ops' device, native library and buffer pool)."""

    # -- arrays ------------------------------------------------------------------------------------------------
    def empty(self, shape, dtype=np.float32) -> DeviceArray:
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        return DeviceArray(_Allocation(self._pool, nbytes), shape, dtype)

    def zeros(self, shape, dtype=np.float32) -> DeviceArray:
        out = self.empty(shape, dtype)
        if out.nbytes:
            self.native.check(self.native.lib.ciq_memory_fill(self.device, out.ptr, 0, out.nbytes))
        return out

    def asarray(self, a, dtype=None) -> DeviceArray:
        """A device copy of a host array (float types -> float32 unless float16, ints -> int32); a DeviceArray on
        this device is returned as it is."""
        if isinstance(a, DeviceArray):
            if a.device != self.device:
                raise InvalidArgumentError(f"array on device {a.device} used by ops on device {self.device}")
            if dtype is not None and a.dtype != np.dtype(dtype):
                raise InvalidArgumentError(f"expected a {np.dtype(dtype)} array, got {a.dtype}")
            return a
        self._not_capturing("an upload of a host array")
        a = np.asarray(a)
        if dtype is None:
            dtype = a.dtype if a.dtype in DTYPES else np.int32 if a.dtype.kind in "iu" else np.float32
        a = np.ascontiguousarray(a, dtype=dtype)
        out = self.empty(a.shape, a.dtype)
        if a.nbytes:
            n = self.native
            n.check(n.lib.ciq_memory_upload(self.device, out.ptr, n.ffi.from_buffer(a), a.nbytes))
        return out

    def numpy(self, x) -> np.ndarray:
        if isinstance(x, DeviceArray):
            self._not_capturing("a download")
            return x.numpy()
        return np.asarray(x)

    def upload(self, dst: DeviceArray, a) -> None:
        """Copy host array ``a`` into the existing DeviceArray dst (same size and dtype): a graph's inputs."""
        self._not_capturing("an upload")
        a = np.ascontiguousarray(a, dtype=dst.dtype)
        if a.nbytes != dst.nbytes or dst.device != self.device:
            raise ShapeError(f"upload: {a.shape} {a.dtype} into {dst.shape} {dst.dtype} on device {dst.device}")
        if a.nbytes:
            n = self.native
            n.check(n.lib.ciq_memory_upload(self.device, dst.ptr, n.ffi.from_buffer(a), a.nbytes))

    def memory_bytes(self) -> int:
        """Bytes allocated on the device by these ops: live arrays and buffers cached for reuse."""
        return self._pool.allocated

    def trim(self) -> None:
        """Free the buffers cached for reuse (no array uses them)."""
        self._not_capturing("freeing buffers")
        self._pool.trim()

    # -- CUDA graphs -------------------------------------------------------------------------------------------
    def graph_arena(self) -> _Arena:
        """An arena to share between graphs that never run at the same time (one engine's micro-batches): their
        captures reuse each other's dead buffers instead of each keeping a working set; close() it after the graphs."""
        return _Arena(self._pool)

    @contextlib.contextmanager
    def graph_capture(self, arena: _Arena | None = None):
        """Record the enclosed ops into a CUDA graph (a GPU only) instead of running them; yields the Graph, whose
        launch() replays them. Inside: no host arrays as inputs and no reads back (uploads and downloads cannot be
        captured: they raise), and every GEMM shape must have run once before (ggml_ciq.h, ciq_graph_capture_begin).
        Set graph.outputs to what the replays should fill: the buffers allocated inside belong to the graph (to
        ``arena``, from graph_arena(), when given). The garbage collector is paused meanwhile (a collected buffer's
        cudaFree would break the capture)."""
        if self.device < 0:
            raise InvalidArgumentError("CUDA graphs need a GPU; these ops run on the CPU")
        if self._pool.arena is not None:
            raise InvalidArgumentError("a graph capture is already open on these ops")
        n = self.native
        owns = arena is None
        arena = _Arena(self._pool) if owns else arena
        graph = Graph(self, arena, owns)
        handle = n.ffi.new("void **")
        collecting = gc.isenabled()
        gc.disable()
        try:
            n.check(n.lib.ciq_graph_capture_begin(self.device))
            self._pool.arena = arena
            try:
                yield graph
            except BaseException:
                self._pool.arena = None
                n.lib.ciq_graph_capture_end(self.device, handle)  # ends the capture; the error raised is the first
                if handle[0] != n.ffi.NULL:
                    n.lib.ciq_graph_free(handle[0])
                raise
            self._pool.arena = None
            n.check(n.lib.ciq_graph_capture_end(self.device, handle))
            graph._handle = handle[0]
        except BaseException:
            graph.outputs = None
            if owns:
                arena.close()
            raise
        finally:
            self._pool.arena = None
            if collecting:
                gc.enable()

    def _not_capturing(self, what: str) -> None:
        if self._pool.arena is not None:
            raise InvalidArgumentError(f"{what} cannot run inside a graph capture (it would not be captured)")

    # -- helpers -----------------------------------------------------------------------------------------------
    def _upload_raw(self, tensor: Tensor) -> DeviceArray:
        return self._upload_bytes(tensor.raw())

    def _upload_bytes(self, raw: np.ndarray) -> DeviceArray:
        raw = np.ascontiguousarray(raw).reshape(-1)
        out = self.empty((raw.size,), np.uint8)
        n = self.native
        n.check(n.lib.ciq_memory_upload(self.device, out.ptr, n.ffi.from_buffer(raw), raw.nbytes))
        return out

    def _host_view(self, a: DeviceArray) -> np.ndarray:
        """Zero-copy numpy view of a CPU (device -1) array."""
        buf = self.native.ffi.buffer(a.ptr, a.nbytes)
        return np.frombuffer(buf, a.dtype).reshape(a.shape)

    def _f32(self, x, what: str) -> DeviceArray:
        x = self.asarray(x, None if isinstance(x, DeviceArray) else np.float32)
        if x.dtype != np.float32:
            raise InvalidArgumentError(f"{what} must be float32, got {x.dtype}")
        return x

    @staticmethod
    def _same_size(what: str, a: DeviceArray, b: DeviceArray) -> None:
        if a.size != b.size:
            raise ShapeError(f"{what}: {a.shape} and {b.shape} differ in size")

    def _fp(self, a: DeviceArray):
        return self.native.ffi.cast("float *", a.ptr)

    def _i32(self, a: DeviceArray):
        return self.native.ffi.cast("int32_t *", a.ptr)

    def _u16(self, a: DeviceArray):
        return self.native.ffi.cast("uint16_t *", a.ptr)
