"""The engine's ops contract (Ops), and where the native ops that implement it live.

Every ops object the engine (ggml_ciq.engine) runs on offers Ops' methods: NumpyOps (ggml_ciq.numpy_ops: numpy in
llama.cpp CPU's arithmetic), ReferenceOps and ExactCpuOps (ggml_ciq.reference_ops: float64, and the CPU's `exact`
semantics) and NativeOps (libggml_ciq's ops on the CPU or a GPU). Arrays are rows first, float32, the K/V caches
float16 (the reference's float64); the engine checks shapes before it calls, and an op raises ggml_ciq.errors'
errors otherwise.

Optional, used where an ops object has them (NativeOps unless said): linear_group(weights, x, norm=(weight, eps))
with groups(weights) (one input, several weights, the input's norm fused in), rms_norm_rope, glu_linear(weight,
gate, up, kind, op_class, add=) (= linear(weight, glu(gate, up, kind)) + add), stack_weights(tensors) (q/k/v,
gate/up as one weight: engine.LinearSet), stack_glu and linear_glu (gate/up interleaved, the GLU from the GEMM's
epilogue), and with `fuse` true linear(weight, x, add) (the residual add from the GEMM's epilogue), rms_norm_add and
rope_kv_store(q, k, v, positions, base, neox, k_cache, v_cache, start) (= rope q, rope k, kv_store k and v); on a
GPU graph_capture, graph_arena and upload (CUDA graphs); check_memory(model) and kv_cache_dtype (ReferenceOps:
weights that may not fit, float64 caches).

NativeOps, by concern (``from ggml_ciq.ops import NativeOps, DeviceArray, ...`` keeps working):
- native_ops.py: NativeOps itself (its settings: device, semantics, kernels, op order, fuse) and its timers;
- native_buffers.py: DeviceArray, the buffer pool, CUDA graphs (Graph), arrays in and out (BufferOps);
- native_pointwise.py: rms_norm, rope, rms_norm_rope, glu, add, scale (PointwiseOps);
- native_attention.py: attention, kv_store, rope_kv_store (AttentionOps);
- native_gemm.py: Weight, get_rows, load_weight, stack_weights, stack_glu, linear, linear_group, linear_glu,
  glu_linear (GemmOps).
"""

from __future__ import annotations

from typing import Protocol

from . import native
from .native_buffers import DTYPES, DeviceArray, Graph
from .native_gemm import GET_ROWS_TYPES, Weight
from .native_ops import NativeOps

# this module's names and the native ops' it re-exports; ATTENTION_KERNELS too, read on first use (__getattr__)
__all__ = ["DTYPES", "GET_ROWS_TYPES", "OP_CLASSES", "DeviceArray", "Graph", "NativeOps", "Ops", "Weight"]

OP_CLASSES = ("keep-quant GEMM", "other GEMM", "attention", "rest")


def __getattr__(name: str):
    """ATTENTION_KERNELS: ciq_attention_kernel's names from the header, read on first use."""
    if name == "ATTENTION_KERNELS":
        return native.enum_names("ciq_attention_kernel", "CIQ_ATTENTION_")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Ops(Protocol):
    """The methods every ops object has (the optional ones: this module's docstring)."""

    timings: dict  # seconds per op class (OP_CLASSES), complete after settle_timings()

    def asarray(self, a):
        """A host array as this ops' array."""

    def numpy(self, x):
        """This ops' array as a numpy array on the host."""

    def zeros(self, shape, dtype=...):
        """A new array of zeros (the K/V caches: float16)."""

    def get_rows(self, tensor, ids):
        """Rows ids of a [rows, k] weight table, dequantized as llama.cpp's get_rows."""

    def rms_norm(self, x, weight, eps: float):
        """ggml's rms_norm over the last axis, then * weight (None: no weight)."""

    def rope(self, x, positions, base: float, neox: bool):
        """RoPE (NORM or NEOX) of x[T, H, D] at positions[T]."""

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float, window: int):
        """Causal GQA of q[T, H, D] over caches [C, Hkv, D] holding positions 0..n_past+T-1 -> [T, H*D]."""

    def kv_store(self, cache, start: int, x) -> None:
        """cache[start:start+T] = x[T, Hkv, D], in place."""

    def glu(self, gate, up, kind: str):
        """act(gate) * up, kind "silu" or "gelu"."""

    def add(self, a, b):
        """a + b; b of a's shape or one row of it (a bias)."""

    def scale(self, x, s: float):
        """x * s."""

    def load_weight(self, tensor):
        """A [rows, k] weight ready for linear."""

    def linear(self, weight, x):
        """x[n, k] @ W^T -> [n, rows]."""

    def timer(self, op_class: str):
        """A context manager: the enclosed ops' seconds count to timings[op_class]."""

    def settle_timings(self) -> None:
        """Complete timings (a GPU's timers are read late)."""

    def memory_bytes(self) -> int:
        """Bytes these ops hold: weights, activations, caches."""
