"""NativeOps: the prefill engine's ops on libggml_ciq buffers, on the CPU (device -1) or a GPU.

Arrays are ``DeviceArray``: contiguous row-major float32, float16 or int32 in a ``ciq_memory_alloc`` buffer on the ops'
device. Methods take DeviceArrays (numpy inputs are copied to the device first) and return new DeviceArrays, except
``kv_store`` (in place). Float order per device is documented in native/src/cpu/ops.cpp and native/src/cuda/ops.cu.

This file holds NativeOps' settings and its timers; its ops come by family from
- native_buffers.py (BufferOps): arrays, uploads and downloads, CUDA graph captures;
- native_pointwise.py (PointwiseOps): rms_norm, rope, glu, add, scale;
- native_attention.py (AttentionOps): attention, kv_store, rope_kv_store;
- native_gemm.py (GemmOps): get_rows, load_weight, stack_weights, stack_glu, linear and its fused forms.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict

from . import environment, native
from .errors import InvalidArgumentError
from .native_attention import AttentionOps
from .native_buffers import BufferOps, DeviceArray, _Pool
from .native_gemm import GemmOps
from .native_pointwise import PointwiseOps


class NativeOps(BufferOps, PointwiseOps, AttentionOps, GemmOps):
    """The engine's ops over libggml_ciq on one device ("cpu", "cuda", "cuda:N" or an index; -1 is the CPU).

    ``semantics`` of the keep-quant GEMMs defaults to llama.cpp CPU's on the CPU and to whatever the fastest GPU
    kernel implements on a GPU ("any"); ``attention_kernel`` is one of ATTENTION_KERNELS; ``q32_kernel`` False
    dequantizes Q4_0/Q5_0/Q8_0 weights to bf16 on a GPU too (bf16 activations instead of the q32 variant's q8_1).
    ``llamacpp_small_batches`` (GPU, with semantics "mmq"): where llama.cpp CUDA multiplies by mul_mat_vec_q (1..8
    tokens, quants.llamacpp_cuda_uses_mmvq), every quantized weight runs the `mmvq` variant in its semantics, as
    llama.cpp does. ``op_order`` is whose float order rms_norm, rope and glu follow: "host" (llama.cpp CPU's, either
    device), "llamacpp_cuda" (llama.cpp CUDA's kernels, GPU only) or "llamacpp_cpu" (llama.cpp x86 AVX2's SIMD SiLU,
    CPU only; ggml_ciq.h ciq_op_order). ``fuse`` (host order;
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
        if op_order == "llamacpp_cuda" and self.device < 0:
            raise InvalidArgumentError(f"op order {op_order!r} runs on a GPU, not the CPU")
        if op_order == "llamacpp_cpu" and self.device >= 0:
            raise InvalidArgumentError(f"op order {op_order!r} runs on the CPU, not a GPU")
        self.op_order, self._op_order_id = op_order, orders.index(op_order)
        self.timings: dict[str, float] = defaultdict(float)
        self._pending: list = []  # (op class, marked timer) not yet in timings
        self._pool = _Pool(self.device)
        self._tables: dict[str, DeviceArray] = {}  # get_rows tables by tensor name
        self._bf16_scratch: DeviceArray | None = None

    # -- timing ------------------------------------------------------------------------------------------------
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
