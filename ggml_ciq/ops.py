"""NativeOps: the prefill engine's ops on libggml_ciq buffers, on the CPU (device -1) or a GPU.

Arrays are ``DeviceArray``: contiguous row-major float32, float16 or int32 in a ``ciq_memory_alloc`` buffer on the ops'
device. Methods take DeviceArrays (numpy inputs are copied to the device first) and return new DeviceArrays, except
``kv_store`` (in place). Float order per device is documented in native/src/cpu/ops.cpp and native/src/cuda/ops.cu.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from . import environment, native, quants
from .errors import BackendError, CiqError, InvalidArgumentError, ShapeError, UnsupportedTypeError
from .model import Tensor

DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32))
GET_ROWS_TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q4_0, quants.Q5_0, quants.Q8_0, quants.Q4_K,
                  quants.Q5_K, quants.Q6_K)
OP_CLASSES = ("keep-quant GEMM", "other GEMM", "attention", "rest")


def __getattr__(name: str):
    """ATTENTION_KERNELS: ciq_attention_kernel's names from the header, read on first use."""
    if name == "ATTENTION_KERNELS":
        return native.enum_names("ciq_attention_kernel", "CIQ_ATTENTION_")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

    def __init__(self, ops: "NativeOps", arena: _Arena, owns_arena: bool):
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


@dataclass
class Weight:
    """A weight matrix [rows, k] ready for ``linear``: raw Q4_K/Q6_K blocks ("keep-quant"), raw Q4_0/Q5_0/Q8_0
    blocks (GPU, "q32": the q32 variant in MMQ's semantics, or with f16/any semantics whatever the registry picks -
    wgmma on Hopper above 8 tokens), or dequantized once to bf16 (GPU, "bf16") or float32 (CPU, "f32")."""

    name: str
    ggml_type: int
    rows: int
    k: int
    kind: str
    data: DeviceArray
    parts: tuple = ()  # stack_weights: the rows of each stacked matrix, in order (their outputs are returned apart)
    glu: bool = False  # stack_glu: gate's and up's rows interleaved by CIQ_GLU_INTERLEAVE; its GEMM gives their GLU


class NativeOps:
    """The engine's ops over libggml_ciq on one device ("cpu", "cuda", "cuda:N" or an index; -1 is the CPU).

    ``semantics`` of the keep-quant GEMMs defaults to llama.cpp CPU's on the CPU and to whatever the fastest GPU
    kernel implements on a GPU ("any"); ``attention_kernel`` is one of ATTENTION_KERNELS; ``q32_kernel`` False
    dequantizes Q4_0/Q5_0/Q8_0 weights to bf16 on a GPU too (bf16 activations instead of the q32 variant's q8_1).
    ``llamacpp_small_batches`` (GPU, with semantics "mmq"): where llama.cpp CUDA multiplies by mul_mat_vec_q (1..8
    tokens, quants.llamacpp_cuda_uses_mmvq), every quantized weight runs the `mmvq` variant in its semantics, as
    llama.cpp does. ``op_order`` is whose float order rms_norm, rope and glu follow: "host" (llama.cpp CPU's, either
    device) or "llamacpp_cuda" (llama.cpp CUDA's kernels, GPU only; ggml_ciq.h ciq_op_order). ``fuse`` (host order;
    the engine's "fast" semantics): stacked weights (one GEMM's values over the stacked rows: stack_weights), norms,
    residual adds and q/k RoPE with the K/V stores fused (linear_group's norm, linear's add, rope_kv_store: the same
    values); GGML_CIQ_FUSE=0 in the environment turns it off."""

    def __init__(self, device="cpu", semantics: str | None = None, attention_kernel: str = "auto",
                 q32_kernel: bool = True, llamacpp_small_batches: bool = False, op_order: str = "host",
                 fuse: bool = False):
        self.device = native.parse_device(device)
        # host op order: weights stacked (stack_weights), norms and residual adds fused into the GEMMs' activation
        # conversion and epilogue (linear_group's norm, linear's add), RoPE and the K/V stores in one kernel
        # (rope_kv_store); GGML_CIQ_FUSE=0 turns it off for A/B runs
        self.fuse = fuse and op_order == "host" and environment.switch("GGML_CIQ_FUSE")
        self.native = native.load()
        if self.device >= 0 and self.device >= native.device_count():
            raise InvalidArgumentError(f"GPU {self.device} requested but {native.device_count()} found")
        self.semantics = semantics or ("cpu" if self.device < 0 else "any")
        self._semantics_id = native.semantics_id(self.semantics)
        # Q4_0/Q5_0/Q8_0 blocks through AUTO in these semantics (wgmma where it runs them), not pinned to q32/MMQ
        self._block32_auto = self.semantics in ("any", "f16")
        kernels = native.enum_names("ciq_attention_kernel", "CIQ_ATTENTION_")
        if attention_kernel not in kernels:
            raise InvalidArgumentError(f"unknown attention kernel {attention_kernel!r} (choose from "
                                       f"{', '.join(kernels)})")
        self.attention_kernel, self.q32_kernel = attention_kernel, q32_kernel
        self._compute_capability = None
        if llamacpp_small_batches and self.device >= 0:
            match = re.search(r"sm_(\d+)(\d)", native.device_name(self.device))
            self._compute_capability = (int(match[1]), int(match[2])) if match else (9, 0)
        self._attention_kernel_id = kernels.index(attention_kernel)
        orders = native.enum_names("ciq_op_order", "CIQ_ORDER_")
        if op_order not in orders:
            raise InvalidArgumentError(f"unknown op order {op_order!r} (choose from {', '.join(orders)})")
        if op_order != "host" and self.device < 0:
            raise InvalidArgumentError(f"op order {op_order!r} runs on a GPU, not the CPU")
        self.op_order, self._op_order_id = op_order, orders.index(op_order)
        self.timings: dict[str, float] = defaultdict(float)
        self._pending: list = []  # (op class, marked timer) not yet in timings
        self._pool = _Pool(self.device)
        self._tables: dict[str, DeviceArray] = {}  # get_rows tables by tensor name
        self._bf16_scratch: DeviceArray | None = None

    # -- arrays -----------------------------------------------------------------------------------------------
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

    def memory_bytes(self) -> int:
        """Bytes allocated on the device by these ops: live arrays and buffers cached for reuse."""
        return self._pool.allocated

    def trim(self) -> None:
        """Free the buffers cached for reuse (no array uses them)."""
        self._not_capturing("freeing buffers")
        self._pool.trim()

    # -- CUDA graphs ----------------------------------------------------------------------------------------------
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

    def upload(self, dst: DeviceArray, a) -> None:
        """Copy host array ``a`` into the existing DeviceArray dst (same size and dtype): a graph's inputs."""
        self._not_capturing("an upload")
        a = np.ascontiguousarray(a, dtype=dst.dtype)
        if a.nbytes != dst.nbytes or dst.device != self.device:
            raise ShapeError(f"upload: {a.shape} {a.dtype} into {dst.shape} {dst.dtype} on device {dst.device}")
        if a.nbytes:
            n = self.native
            n.check(n.lib.ciq_memory_upload(self.device, dst.ptr, n.ffi.from_buffer(a), a.nbytes))

    # -- timing -------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def timer(self, op_class: str):
        """Seconds of the enclosed ops, added to timings[op_class] by settle_timings(); device time (CUDA events)
        on a GPU, read later so that timing never waits for the device between ops."""
        if self._pool.arena is not None:  # inside a graph capture: no timers (its replay is timed as a whole)
            yield
            return
        n = self.native
        handle = n.ffi.new("void **")
        n.check(n.lib.ciq_timer_start(self.device, handle))
        try:
            yield
        finally:
            self._pending.append((op_class, handle[0]))
            n.check(n.lib.ciq_timer_mark(handle[0]))

    def settle_timings(self) -> None:
        """Add the pending timers to timings (waits for the device)."""
        n, pending, self._pending = self.native, self._pending, []
        ms = n.ffi.new("float *")
        for op_class, handle in pending:
            n.check(n.lib.ciq_timer_stop(handle, ms))
            self.timings[op_class] += ms[0] / 1000.0

    # -- ops ----------------------------------------------------------------------------------------------------
    def _f32(self, x, what: str) -> DeviceArray:
        x = self.asarray(x, None if isinstance(x, DeviceArray) else np.float32)
        if x.dtype != np.float32:
            raise InvalidArgumentError(f"{what} must be float32, got {x.dtype}")
        return x

    def get_rows(self, tensor: Tensor, ids) -> DeviceArray:
        """Rows ``ids`` of a [rows, k] table dequantized to float32 as llama.cpp's get_rows."""
        if tensor.ggml_type not in GET_ROWS_TYPES:
            raise UnsupportedTypeError(f"{tensor.name}: get_rows of type {tensor.type_name} is not supported")
        if isinstance(ids, DeviceArray):  # int32 ids already on the device (a graph's input): checked by the caller
            ids_dev = self.asarray(ids, np.int32)
            if ids_dev.size == 0:
                raise ShapeError("get_rows: no ids")
            ids = ids_dev
        else:
            ids = np.asarray(ids).reshape(-1)
            if ids.size == 0:
                raise ShapeError("get_rows: no ids")
            if ids.min() < 0 or ids.max() >= tensor.rows:
                raise ShapeError(f"{tensor.name}: row ids must be in [0, {tensor.rows}), got {ids.min()}..{ids.max()}")
            ids_dev = self.asarray(ids, np.int32)
        table = self._raw(tensor)
        out = self.empty((ids.size, tensor.k))
        self.native.check(self.native.lib.ciq_rows_get(self.device, tensor.ggml_type, table.ptr, tensor.rows, tensor.k,
                                                       self._i32(ids_dev), ids.size, self._fp(out)))
        return out

    def _raw(self, tensor: Tensor) -> DeviceArray:
        """The tensor's raw blocks on the device, uploaded once (get_rows and a tied output weight share them)."""
        table = self._tables.get(tensor.name)
        if table is None:
            table = self._tables[tensor.name] = self._upload_raw(tensor)
        return table

    def _upload_raw(self, tensor: Tensor) -> DeviceArray:
        return self._upload_bytes(tensor.raw())

    def _upload_bytes(self, raw: np.ndarray) -> DeviceArray:
        raw = np.ascontiguousarray(raw).reshape(-1)
        out = self.empty((raw.size,), np.uint8)
        n = self.native
        n.check(n.lib.ciq_memory_upload(self.device, out.ptr, n.ffi.from_buffer(raw), raw.nbytes))
        return out

    def rms_norm(self, x, weight, eps: float) -> DeviceArray:
        """ggml's rms_norm over the last axis, then * weight (None: no weight)."""
        return self.rms_norm_add(x, weight, eps, None)

    def rms_norm_add(self, x, weight, eps: float, add) -> DeviceArray:
        """rms_norm(x) * weight + add (add of x's shape; None: none) in one op: the add rounds separately in the host
        order, inside one FMA in llama.cpp CUDA's (its fused RMS_NORM + MUL + ADD)."""
        x = self._f32(x, "rms_norm input")
        d = x.shape[-1]
        w = self._norm_weight(weight, d)
        if add is not None:
            add = self._f32(add, "rms_norm add")
            if add.shape != x.shape:
                raise ShapeError(f"rms_norm: add {add.shape} for input {x.shape}")
        out = self.empty(x.shape)
        n = self.native
        n.check(n.lib.ciq_rms_norm(self.device, self._op_order_id, self._fp(x),
                                   self._fp(w) if w is not None else n.ffi.NULL,
                                   self._fp(add) if add is not None else n.ffi.NULL, float(eps), x.size // d, d,
                                   self._fp(out)))
        return out

    def _norm_weight(self, weight, d: int):
        """rms_norm's weight as float32 on this device (None: none), checked against rows of d."""
        if weight is None:
            return None
        w = self._f32(weight, "rms_norm weight")
        if w.size != d:
            raise ShapeError(f"rms_norm: weight of {w.size} values for rows of {d}")
        return w

    def _positions(self, positions, tokens: int, what: str) -> DeviceArray:
        """RoPE positions as int32[tokens] on this device."""
        positions = self.asarray(positions, None if isinstance(positions, DeviceArray) else np.int32)
        if positions.dtype != np.int32 or positions.size != tokens:
            raise ShapeError(f"{what}: positions must be int32[{tokens}], got {positions.dtype}{positions.shape}")
        return positions

    def _check_cache(self, cache, start: int, x, what: str) -> None:
        """A float16 K/V cache of this device that x[T, Hkv, D] fits from row start."""
        if not isinstance(cache, DeviceArray) or cache.dtype != np.float16 or cache.device != self.device:
            raise InvalidArgumentError(f"{what}: the cache must be a float16 DeviceArray on this device")
        if tuple(x.shape[1:]) != tuple(cache.shape[1:]) or start < 0 or start + x.shape[0] > cache.shape[0]:
            raise ShapeError(f"{what}: {x.shape} at row {start} into a {cache.shape} cache")

    def rope(self, x, positions, base: float, neox: bool = False) -> DeviceArray:
        """ggml RoPE (NORM or NEOX) of x[T, H, D] over all D dims at positions[T]."""
        x = self._f32(x, "rope input")
        if len(x.shape) != 3:
            raise ShapeError(f"rope: x must be [tokens, heads, head_dim], got {x.shape}")
        positions = self._positions(positions, x.shape[0], "rope")
        out = self.empty(x.shape)
        n = self.native
        n.check(n.lib.ciq_rope(self.device, self._op_order_id, n.lib.CIQ_ROPE_NEOX if neox else n.lib.CIQ_ROPE_NORM,
                               self._fp(x), self._i32(positions), x.shape[0], x.shape[1], x.shape[2], float(base),
                               self._fp(out)))
        return out

    def rms_norm_rope(self, x, weight, eps: float, positions, base: float, neox: bool = False) -> DeviceArray:
        """rope(rms_norm(x) * weight) of x[T, H, D] (each head's row normed over D) in one op: llama.cpp CUDA fuses
        RMS_NORM + MUL + ROPE into one kernel whose float order is not its separate kernels' (the op order
        llamacpp_cuda follows it); the host order runs rms_norm then rope."""
        x = self._f32(x, "rms_norm_rope input")
        if len(x.shape) != 3:
            raise ShapeError(f"rms_norm_rope: x must be [tokens, heads, head_dim], got {x.shape}")
        t, h, d = x.shape
        w = self._f32(weight, "rms_norm_rope weight")
        if w.size != d:
            raise ShapeError(f"rms_norm_rope: weight of {w.size} values for heads of {d}")
        positions = self._positions(positions, t, "rms_norm_rope")
        out = self.empty(x.shape)
        n = self.native
        n.check(n.lib.ciq_rms_norm_rope(self.device, self._op_order_id,
                                        n.lib.CIQ_ROPE_NEOX if neox else n.lib.CIQ_ROPE_NORM, self._fp(x), self._fp(w),
                                        float(eps), self._i32(positions), t, h, d, float(base), self._fp(out)))
        return out

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float, window: int = 0) -> DeviceArray:
        """Causal GQA of q[T, H, D] over f16 caches [C, Hkv, D] holding positions 0..n_past+T-1 -> [T, H*D]."""
        q = self._f32(q, "attention q")
        k_cache, v_cache = self.asarray(k_cache, np.float16), self.asarray(v_cache, np.float16)
        if len(q.shape) != 3 or len(k_cache.shape) != 3 or k_cache.shape != v_cache.shape:
            raise ShapeError(f"attention: q [T, H, D] and equal caches [C, Hkv, D], got {q.shape}, {k_cache.shape}, "
                             f"{v_cache.shape}")
        t, h, d = q.shape
        c, hkv, dk = k_cache.shape
        if dk != d or h % hkv or n_past < 0 or n_past + t > c:
            raise ShapeError(f"attention: q {q.shape} with caches {k_cache.shape} at n_past {n_past}")
        out = self.empty((t, h * d))
        n = self.native
        n.check(n.lib.ciq_attention(self.device, self._attention_kernel_id, self._fp(q),
                                    self._u16(k_cache), self._u16(v_cache), t, h, hkv, d, c, int(n_past), float(scale),
                                    int(window), self._fp(out)))
        return out

    def attention_kernel_name(self, head_dim: int) -> str:
        """The kernel ``attention`` runs for this head_dim on this device."""
        n = self.native
        out = n.ffi.new("ciq_attention_kernel *")
        n.check(n.lib.ciq_attention_resolve(self.device, self._attention_kernel_id, head_dim, out))
        return native.enum_names("ciq_attention_kernel", "CIQ_ATTENTION_")[out[0]]

    def attention_runs(self, head_dim: int) -> bool:
        """Whether ``attention`` runs for this head_dim on this device (attention_kernel_name's question, as a bool)."""
        try:
            self.attention_kernel_name(head_dim)
        except BackendError:  # the kernel does not run it here (CIQ_ERR_UNSUPPORTED)
            return False
        return True

    def kv_store(self, cache, start: int, x) -> None:
        """cache[start:start+T] = x[T, Hkv, D] rounded to f16."""
        x = self._f32(x, "kv_store input")
        self._check_cache(cache, start, x, "kv_store")
        n = self.native
        n.check(n.lib.ciq_kv_store(self.device, self._u16(cache), int(start), self._fp(x), x.shape[0],
                                   x.size // x.shape[0]))

    def rope_kv_store(self, q, k, v, positions, base: float, neox: bool, k_cache, v_cache, start: int) -> DeviceArray:
        """rope(q) returned, rope(k) and v (None: not stored) stored into the caches at row start, in one op
        (ciq_rope_kv_store: one kernel on a GPU in the host order): the values of rope, rope and kv_store."""
        q, k = self._f32(q, "rope input"), self._f32(k, "rope input")
        if len(q.shape) != 3 or len(k.shape) != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
            raise ShapeError(f"rope_kv_store: q {q.shape} and k {k.shape} must be [tokens, heads, head_dim] alike")
        v = None if v is None else self._f32(v, "kv_store input")
        self._check_cache(k_cache, start, k, "rope_kv_store")
        if v is not None:
            if v.shape != k.shape:
                raise ShapeError(f"rope_kv_store: v {v.shape} for k {k.shape}")
            self._check_cache(v_cache, start, v, "rope_kv_store")
        positions = self._positions(positions, q.shape[0], "rope_kv_store")
        out = self.empty(q.shape)
        n = self.native
        n.check(n.lib.ciq_rope_kv_store(self.device, self._op_order_id,
                                        n.lib.CIQ_ROPE_NEOX if neox else n.lib.CIQ_ROPE_NORM, self._fp(q), self._fp(k),
                                        self._fp(v) if v is not None else n.ffi.NULL, self._i32(positions), q.shape[0],
                                        q.shape[1], k.shape[1], q.shape[2], float(base), int(start), self._fp(out),
                                        self._u16(k_cache), self._u16(v_cache) if v is not None else n.ffi.NULL))
        return out

    def _glu_inputs(self, gate, up, kind: str):
        """(gate, up as float32 device arrays of one size, the ciq_glu_kind of `kind`)."""
        if kind not in ("silu", "gelu"):
            raise InvalidArgumentError(f"glu: unknown kind {kind!r} (silu or gelu)")
        gate, up = self._f32(gate, "glu gate"), self._f32(up, "glu up")
        self._same_size("glu", gate, up)
        lib = self.native.lib
        return gate, up, lib.CIQ_GLU_SILU if kind == "silu" else lib.CIQ_GLU_GELU

    def glu(self, gate, up, kind: str) -> DeviceArray:
        """act(gate) * up; kind "silu" or "gelu" (tanh GELU: ggml's fp16 table on the CPU, float on a GPU)."""
        gate, up, kind_id = self._glu_inputs(gate, up, kind)
        out = self.empty(gate.shape)
        self.native.check(self.native.lib.ciq_glu(self.device, self._op_order_id, kind_id, self._fp(gate),
                                                  self._fp(up), gate.size, self._fp(out)))
        return out

    def glu_linear(self, weight: Weight, gate, up, kind: str, op_class: str | None = None,
                   add=None) -> DeviceArray:
        """linear(weight, glu(gate, up, kind), add), the same values: where the weight's GEMM reads the f16 layout on
        a GPU and the GLU follows the host order, the GLU is fused into that conversion (ciq_glu_activations: one
        kernel fewer and no float32 intermediate); elsewhere the two ops in turn. op_class: the timer class of the
        GEMM (with the GLU where fused into it; the GLU apart is left out of it, as an op of its own)."""
        timer = self.timer(op_class) if op_class else contextlib.nullcontext()
        gate, up, _ = self._glu_inputs(gate, up, kind)
        if self.device >= 0 and self.op_order == "host" and gate.shape[-1] == weight.k and self.groups([weight]):
            with timer:  # linear_group's glu prologue: fused where the plan reads the f16 layout
                return self.linear_group([weight], gate, glu=(up, kind), adds=[add])[0]
        h = self.glu(gate, up, kind)
        with timer:
            return self.linear(weight, h, add)

    def _plan(self, weight: Weight, tokens: int):
        """The ciq_plan of a quantized weight's GEMM at this token count (_kernel's variant and semantics)."""
        n = self.native
        plan = n.ffi.new("ciq_plan *")
        n.check(n.lib.ciq_gemm_plan(self.device, *self._kernel(weight, tokens), weight.ggml_type, weight.rows,
                                    weight.k, tokens, plan))
        return plan

    def _gemm_planned(self, weight: Weight, plan, activations: DeviceArray, tokens: int,
                      add=None) -> list[DeviceArray]:
        """[tokens, rows] float32 per stacked part (one for a plain weight): the plan's GEMM on activations already
        in its layout (ciq_gemm_quantized), plus add [tokens, rows] where given (a plain weight only; the values of
        add() after it, from wgmma's epilogue: ciq_gemm_quantized_outputs)."""
        n = self.native
        outs = self._outs(weight, tokens)
        if add is not None:
            add = self._f32(add, "linear add")
            if len(outs) > 1 or add.shape != (tokens, weight.rows):
                raise ShapeError(f"{weight.name}: add {add.shape} for an output of {(tokens, weight.rows)}")
        if len(outs) == 1 and add is None:
            n.check(n.lib.ciq_gemm_quantized(self.device, plan, weight.ggml_type, weight.data.ptr, weight.data.nbytes,
                                             weight.rows, weight.k, activations.ptr, tokens, outs[0].ptr,
                                             n.lib.CIQ_OUT_F32))
            return outs
        outputs = self._outputs(outs, add)
        n.check(n.lib.ciq_gemm_quantized_outputs(self.device, plan, weight.ggml_type, weight.data.ptr,
                                                 weight.data.nbytes, weight.rows, weight.k, activations.ptr, tokens,
                                                 outputs, len(outs), n.lib.CIQ_OUT_F32))
        return outs

    def _outs(self, weight: Weight, tokens: int) -> list[DeviceArray]:
        """A GEMM's float32 outputs [tokens, rows], one per stacked part (one for a plain weight)."""
        return [self.empty((tokens, rows)) for rows in (weight.parts or (weight.rows,))]

    def _outputs(self, outs: list[DeviceArray], add=None):
        """ciq_gemm_output[] of these [tokens, rows] outputs, each with the addend add (one output) or none."""
        n = self.native
        outputs = n.ffi.new("ciq_gemm_output[]", len(outs))
        for o, out in zip(outputs, outs):
            o.rows, o.out = out.shape[1], out.ptr
            o.add = self._fp(add) if add is not None else n.ffi.NULL
        return outputs

    def add(self, a, b) -> DeviceArray:
        """a + b; b of a's shape, or a row of a's last axis (a bias) added to every row."""
        a, b = self._f32(a, "add input"), self._f32(b, "add input")
        if a.size != b.size and (len(b.shape) != 1 or b.size != a.shape[-1]):
            raise ShapeError(f"add: {b.shape} is neither {a.shape} nor one row of it")
        out = self.empty(a.shape)
        self.native.check(self.native.lib.ciq_add(self.device, self._fp(a), a.size, self._fp(b), b.size, self._fp(out)))
        return out

    def scale(self, x, s: float) -> DeviceArray:
        x = self._f32(x, "scale input")
        out = self.empty(x.shape)
        self.native.check(self.native.lib.ciq_scale(self.device, self._fp(x), float(s), x.size, self._fp(out)))
        return out

    # -- GEMMs --------------------------------------------------------------------------------------------------
    def load_weight(self, tensor: Tensor) -> Weight:
        """Q4_K/Q6_K: raw blocks for the keep-quant GEMM; on a GPU Q4_0/Q5_0/Q8_0 raw blocks where a kernel of these
        ops' semantics multiplies them (_block32_raw); other types dequantized once (bf16 on a GPU, float32 on the
        CPU)."""
        if len(tensor.shape) != 2:
            raise ShapeError(f"{tensor.name}: a weight must be 2-D, got shape {tensor.shape}")
        kind = self._block_kind(tensor)
        if kind == "keep-quant":
            return Weight(tensor.name, tensor.ggml_type, tensor.rows, tensor.k, kind, self._upload_raw(tensor))
        if kind == "q32":
            return Weight(tensor.name, tensor.ggml_type, tensor.rows, tensor.k, kind, self._raw(tensor))
        if tensor.ggml_type not in GET_ROWS_TYPES:
            raise UnsupportedTypeError(f"{tensor.name}: weight type {tensor.type_name} is not supported")
        if self.device < 0:
            return Weight(tensor.name, tensor.ggml_type, tensor.rows, tensor.k, "f32",
                          self.asarray(tensor.dequantize(), np.float32))
        raw = self._upload_raw(tensor)
        dense = self.empty((tensor.rows, tensor.k), np.float16)  # bf16 bits; float16 only sizes the buffer
        self.native.check(self.native.lib.ciq_tensor_dequantize_bf16(self.device, tensor.ggml_type, raw.ptr, tensor.rows,
                                                              tensor.k, dense.ptr))
        del raw
        self.trim()  # the raw blocks are not needed again: no cached copy of them
        return Weight(tensor.name, tensor.ggml_type, tensor.rows, tensor.k, "bf16", dense)

    def _block_kind(self, tensor: Tensor) -> str | None:
        """The Weight kind that keeps this tensor in its GGUF blocks on these ops: "keep-quant" (Q4_K/Q6_K), "q32"
        (Q4_0/Q5_0/Q8_0 on a GPU where _block32_raw), else None (dequantized)."""
        if tensor.is_keep_quant:
            return "keep-quant"
        if self.device >= 0 and tensor.ggml_type in quants.Q32_TYPES and self._block32_raw(tensor):
            return "q32"
        return None

    def _block32_raw(self, tensor: Tensor) -> bool:
        """Whether a Q4_0/Q5_0/Q8_0 weight stays in its blocks on this GPU: in f16 semantics where the registry has a
        kernel for it (wgmma: Hopper, K a multiple of 64), else (bf16 then) never; otherwise where the q32 variant
        takes it (q32_kernel, K a multiple of 128: its q8_1-mmq activations). With semantics "any" the registry then
        picks per token count (wgmma above 8 tokens where it runs this K, q32 at 1..8 and elsewhere)."""
        if self.semantics == "f16":
            try:
                native.plan("auto", self.device, "f16", tensor.ggml_type, tensor.rows, tensor.k,
                            native.variant_info("mmvq").max_tokens + 1)  # above the small batches
            except CiqError:
                return False
            return True
        return self.q32_kernel and tensor.k % 128 == 0

    def _kernel(self, weight: Weight, tokens: int) -> tuple[int, int]:
        """(variant, semantics) ids of a quantized weight's GEMM at this token count."""
        lib = self.native.lib
        if self._compute_capability and quants.llamacpp_cuda_uses_mmvq(weight.ggml_type, tokens,
                                                                        self._compute_capability):
            return lib.CIQ_VARIANT_MMVQ, lib.CIQ_SEMANTICS_MMVQ
        if weight.kind == "q32" and not self._block32_auto:  # llama.cpp CUDA MMQ's semantics
            return lib.CIQ_VARIANT_Q32, lib.CIQ_SEMANTICS_MMQ
        return lib.CIQ_VARIANT_AUTO, self._semantics_id

    def linear(self, weight: Weight, x, add=None) -> DeviceArray:
        """x[n, k] @ W^T (+ add [n, rows]: add()'s values; from the GEMM's epilogue where the kernel fuses it) ->
        [n, rows] float32. A stacked weight (stack_weights) goes through linear_group."""
        x = self._f32(x, "linear input")
        if x.shape[-1] != weight.k:
            raise ShapeError(f"{weight.name}: input rows of {x.shape[-1]} values, the weight takes {weight.k}")
        if weight.parts:
            raise InvalidArgumentError(f"{weight.name}: a stacked weight's outputs come from linear_group")
        if weight.glu:
            raise InvalidArgumentError(f"{weight.name}: a gate/up weight interleaved for its GLU goes through linear_glu")
        tokens = x.size // weight.k
        if add is not None:  # from the epilogue where linear_group takes the weight; else the GEMM, then the add
            if self.groups([weight]):
                return self.linear_group([weight], x, adds=[add])[0]
            return self.add(self.linear(weight, x), add)
        out = self.empty((tokens, weight.rows))
        n = self.native
        if weight.kind in ("keep-quant", "q32"):
            variant, semantics = self._kernel(weight, tokens)
            n.check(n.lib.ciq_gemm(self.device, variant, semantics, weight.ggml_type, weight.data.ptr,
                                   weight.data.nbytes, weight.rows, weight.k, self._fp(x), tokens, out.ptr,
                                   n.lib.CIQ_OUT_F32))
        elif weight.kind == "bf16":
            scratch = self._bf16(tokens * weight.k)
            n.check(n.lib.ciq_values_convert_bf16(self.device, self._fp(x), tokens * weight.k, scratch.ptr))
            n.check(n.lib.ciq_gemm_dense_bf16(self.device, weight.data.ptr, weight.rows, weight.k, scratch.ptr, tokens,
                                              out.ptr, n.lib.CIQ_OUT_F32))
        else:  # CPU float32: the buffers are host memory
            dense = self._host_view(weight.data)
            np.matmul(self._host_view(x).reshape(tokens, weight.k), dense.T, out=self._host_view(out))
        return out

    def groups(self, weights: list[Weight]) -> bool:
        """Whether linear_group takes these weights: blocks our GEMMs read (keep-quant, and 32-block ones unless in
        MMQ's semantics, where the engine keeps llama.cpp's one quantization per GEMM), all of one K."""
        kinds = ("keep-quant", "q32") if self._block32_auto else ("keep-quant",)
        return all(w.kind in kinds and w.k == weights[0].k for w in weights)

    def linear_group(self, weights: list[Weight], x, norm: tuple | None = None, adds: list | None = None,
                     glu: tuple | None = None) -> list[DeviceArray]:
        """``linear`` of several quantized weights on one input x[n, k] (``groups``): each GEMM is planned once
        (ciq_gemm_plan), x is quantized (or converted) once per activation layout the plans name
        (ciq_activations_quantize), then each GEMM runs its plan on those bytes (ciq_gemm_quantized): the same
        kernels and bytes as separate ``linear`` calls. A stacked weight (stack_weights) gives one output per part.
        norm (weight, eps): the inputs are rms_norm(x) * weight, with the norm fused into the f16 conversion where
        the ops fuse (ciq_rms_norm_activations: the same bytes); glu (up, kind): the inputs are glu(x, up, kind), fused
        into a GPU's f16 conversion in the host order (ciq_glu_activations: the same bytes); adds: per weight None or
        its addend (linear's add). Two weights without addends go through ciq_gemm_quantized_group (one launch where
        wgmma groups them: q+k Q4_K beside v Q6_K; its one plan may split K otherwise than the two apart)."""
        x = self._f32(x, "linear input")
        if not self.groups(weights) or x.shape[-1] != weights[0].k:
            raise ShapeError("linear_group: quantized weights of one K (groups()), and inputs of that K")
        if any(w.glu for w in weights):
            raise InvalidArgumentError("linear_group: a gate/up weight interleaved for its GLU goes through linear_glu")
        k = weights[0].k
        tokens = x.size // k
        plans = [self._plan(w, tokens) for w in weights]
        layouts = self._activations(plans, x, tokens, k, norm, glu)
        adds = adds or [None] * len(weights)
        if len(adds) != len(weights):
            raise ShapeError(f"linear_group: {len(adds)} addends for {len(weights)} weights")
        if len(weights) == 2 and adds == [None, None] and plans[0].activation_layout == plans[1].activation_layout:
            return self._gemm_group(weights, plans, layouts[plans[0].activation_layout], tokens)
        outs = []
        for w, plan, add in zip(weights, plans, adds):
            outs += self._gemm_planned(w, plan, layouts[plan.activation_layout], tokens, add)
        return outs

    def _activations(self, plans, x: DeviceArray, tokens: int, k: int, norm: tuple | None = None,
                     glu: tuple | None = None) -> dict:
        """{layout: x quantized (or converted) into it} for the plans' layouts (linear_group's prologues: norm, glu)."""
        n = self.native
        norm_w = self._norm_weight(norm[0], k) if norm is not None else None
        f16_gpu = self.device >= 0 and self.op_order == "host"
        layouts, source = {}, None
        for plan in plans:
            layout = plan.activation_layout
            if layout in layouts:
                continue
            buf = layouts[layout] = self.empty((plan.activation_bytes,), np.uint8)
            f16 = layout == n.lib.CIQ_LAYOUT_F16
            # fused prologues: a GPU's f16 conversion (one kernel); the host runs the norm's two in turn for any layout
            if norm is not None and self.fuse and (f16 or self.device < 0):
                n.check(n.lib.ciq_rms_norm_activations(self.device, self._op_order_id, self._fp(x),
                                                       self._fp(norm_w) if norm_w is not None else n.ffi.NULL,
                                                       float(norm[1]), tokens, k, layout, buf.ptr))
                continue
            if glu is not None and f16 and f16_gpu:
                gate, up, kind_id = self._glu_inputs(x, glu[0], glu[1])
                n.check(n.lib.ciq_glu_activations(self.device, self._op_order_id, kind_id, self._fp(gate), self._fp(up),
                                                  tokens, k, layout, buf.ptr))
                continue
            if source is None:  # the prologue apart, once for every other layout
                source = (self.rms_norm(x, norm_w, norm[1]) if norm is not None else
                          self.glu(x, glu[0], glu[1]) if glu is not None else x)
            n.check(n.lib.ciq_activations_quantize(self.device, layout, self._fp(source), buf.ptr, tokens, k))
        return layouts

    def _gemm_group(self, weights: list[Weight], plans, activations: DeviceArray, tokens: int) -> list[DeviceArray]:
        """Two weights' GEMMs on the same activations (ciq_gemm_quantized_group: one launch where wgmma groups them,
        e.g. q+k Q4_K beside v Q6_K; else one each): [tokens, rows] float32 per stacked part, in order."""
        n = self.native
        group = n.ffi.new("ciq_gemm_weight[]", len(weights))
        outs, keep = [], []
        for g, w, plan in zip(group, weights, plans):
            mine = self._outs(w, tokens)
            outputs = self._outputs(mine)
            keep.append(outputs)  # the struct's pointers do not keep the arrays alive
            g.plan, g.type, g.weight, g.weight_nbytes, g.rows = plan, w.ggml_type, w.data.ptr, w.data.nbytes, w.rows
            g.outputs, g.n_outputs = outputs, len(mine)
            outs += mine
        n.check(n.lib.ciq_gemm_quantized_group(self.device, group, len(weights), weights[0].k, activations.ptr, tokens,
                                               n.lib.CIQ_OUT_F32))
        return outs

    def linear_glu(self, weight: Weight, x, kind: str, norm: tuple | None = None) -> DeviceArray:
        """glu(gate(x'), up(x'), kind) [n, rows/2] float32 of a stack_glu weight, x' = rms_norm(x) * norm[0] where
        norm (weight, eps) is given (fused as linear_group fuses it): ciq_gemm_quantized_glu, the GLU from wgmma's
        epilogue (no gate/up product in memory); the values of the GEMM, its halves apart, then glu."""
        if not weight.glu:
            raise InvalidArgumentError(f"{weight.name}: linear_glu takes a gate/up weight from stack_glu")
        if kind not in ("silu", "gelu"):
            raise InvalidArgumentError(f"glu: unknown kind {kind!r} (silu or gelu)")
        x = self._f32(x, "linear input")
        if x.shape[-1] != weight.k:
            raise ShapeError(f"{weight.name}: input rows of {x.shape[-1]} values, the weight takes {weight.k}")
        n, k = self.native, weight.k
        tokens = x.size // k
        plan = self._plan(weight, tokens)
        activations = self._activations([plan], x, tokens, k, norm)[plan.activation_layout]
        out = self.empty((tokens, weight.rows // 2))
        n.check(n.lib.ciq_gemm_quantized_glu(self.device, plan, weight.ggml_type, weight.data.ptr, weight.data.nbytes,
                                             weight.rows, k, activations.ptr, tokens,
                                             n.lib.CIQ_GLU_SILU if kind == "silu" else n.lib.CIQ_GLU_GELU,
                                             self._fp(out)))
        return out

    def stack_glu(self, gate: Tensor, up: Tensor) -> Weight | None:
        """One gate/up weight for linear_glu: their rows interleaved CIQ_GLU_INTERLEAVE at a time (ggml_ciq.h), where
        these ops fuse, the two are of one type, K and row count (a multiple of CIQ_GLU_INTERLEAVE) and kept in blocks
        as stack_weights keeps them; None otherwise (and with GGML_CIQ_FUSE_GLU=0: the GLU then fused into down's
        activation conversion, glu_linear)."""
        if not self.fuse or not environment.switch("GGML_CIQ_FUSE_GLU") or len(gate.shape) != 2 or len(up.shape) != 2:
            return None
        block = self.native.lib.CIQ_GLU_INTERLEAVE
        if (gate.ggml_type, gate.k, gate.rows) != (up.ggml_type, up.k, up.rows) or gate.rows % block:
            return None
        kind = self._block_kind(gate)
        if kind is None or (kind == "q32" and not self._block32_auto):  # what linear_group (groups) takes
            return None
        g = np.ascontiguousarray(gate.raw()).reshape(gate.rows // block, -1)
        u = np.ascontiguousarray(up.raw()).reshape(up.rows // block, -1)
        data = self._upload_bytes(np.stack([g, u], axis=1))
        return Weight(f"{gate.name}+{up.name} (glu)", gate.ggml_type, 2 * gate.rows, gate.k, kind, data, glu=True)

    def stack_weights(self, tensors: list[Tensor]) -> Weight | None:
        """One weight of these matrices' rows stacked (q/k/v, gate/up: one GEMM launch, its outputs apart through
        ciq_gemm_quantized_outputs), where these ops fuse (``fuse``) and the tensors are quantized blocks of one type
        and K that our GEMMs read (as load_weight would keep them); None otherwise (load them apart). Its outputs are
        the values of one GEMM over the stacked rows: the same semantics as the matrices apart, but the kernel may
        plan the bigger problem otherwise (wgmma: another split-K, float32 sums in another order)."""
        if not self.fuse or len(tensors) < 2:
            return None
        first = tensors[0]
        if any(len(t.shape) != 2 or t.ggml_type != first.ggml_type or t.k != first.k for t in tensors):
            return None
        kind = self._block_kind(first)
        if kind is None or (kind == "q32" and not self._block32_auto):  # what linear_group (groups) takes
            return None
        data = self._upload_bytes(np.concatenate([np.ascontiguousarray(t.raw()).reshape(-1) for t in tensors]))
        return Weight("+".join(t.name for t in tensors), first.ggml_type, sum(t.rows for t in tensors), first.k, kind,
                      data, tuple(t.rows for t in tensors))

    # -- helpers ------------------------------------------------------------------------------------------------
    def _bf16(self, values: int) -> DeviceArray:
        if self._pool.arena is not None:  # a graph keeps its own: the shared one may move before a replay
            return self.empty((values,), np.float16)
        if self._bf16_scratch is None or self._bf16_scratch.size < values:
            self._bf16_scratch = None
            self._bf16_scratch = self.empty((values,), np.float16)
        return self._bf16_scratch

    def _host_view(self, a: DeviceArray) -> np.ndarray:
        """Zero-copy numpy view of a CPU (device -1) array."""
        buf = self.native.ffi.buffer(a.ptr, a.nbytes)
        return np.frombuffer(buf, a.dtype).reshape(a.shape)

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
