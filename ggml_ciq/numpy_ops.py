"""The engine's ops in numpy, in llama.cpp CPU's arithmetic (the x86 AVX2 build of llama-cpp-python 0.3.36).

Arrays are numpy float32 (caches float16), rows first. What each op mirrors, found op by op against tensors
captured from llama.cpp's own forward pass of Gemma 3 270M:
- 32-block weights (Q4_0, Q5_0, Q8_0): libggml_ciq's q32 variant in cpu semantics (q8_0 activations as ggml's
  AVX2 `quantize_row_q8_0`, llamafile `tinyBLAS_Q0_AVX`'s float order); Q4_1/Q5_1 the same variant on q8_1
  activations as `quantize_row_q8_1`, `ggml_vec_dot_q{4,5}_1_q8_1`'s float order.
- Q4_K/Q5_K/Q6_K: libggml_ciq's keep-quant GEMM in cpu semantics, in the float order of the kernel llama.cpp runs for
  the matrix (repacked Q4_K GEMM, tiled K-quant matmul, vec_dot; docs/SEMANTICS.md).
- Attention without flash attention over the f16 K/V cache: libggml_ciq's host kernel "ggml" (q and the softmax
  weights rounded to f16, llamafile's f16 GEMM lanes, ggml's SIMD expf and softmax sum).
- GLU: libggml_ciq's host ciq_glu in CIQ_ORDER_LLAMACPP_CPU: SiLU as ggml_vec_swiglu_f32's AVX2 lanes (ggml_v_expf,
  expf on each row's tail); GELU through ggml's fp16 table, built as ggml's x86 FMA build builds it (float32,
  `1 + a*x*x` fused, the C library's tanhf).
With llama.cpp's GEMM outputs substituted, every other op reproduces its hidden states bit for bit (NOTES.md); the
GEMMs follow its float order, so prompts of >= 8 tokens per micro-batch reproduce its logits exactly on an x86 AVX2
build (1-token micro-batches take other llama.cpp kernels: rounding-level apart).
"""

from __future__ import annotations

import time
import weakref
from collections import defaultdict
from contextlib import contextmanager

import numpy as np

from . import native, quants
from .errors import ShapeError, UnsupportedTypeError
from .model import Tensor


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """ggml's rms_norm (squares summed in double, scale = 1/sqrtf(mean + eps) in float32), then mul by weight."""
    mean = ((x * x).astype(np.float64).sum(-1, keepdims=True) / x.shape[-1]).astype(np.float32)
    y = x * (np.float32(1.0) / np.sqrt(mean + np.float32(eps)))
    return y if weight is None else y * weight


def rope(x: np.ndarray, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """ggml's RoPE on [tokens, heads, head_dim]: pairs (2i, 2i+1) (NORM) or (i, i + d/2) (NEOX) rotate by
    pos * base^(-2i/d) as ggml's x86 CPU build computes it (libggml_ciq's host ciq_rope: theta stepped by powf's
    factor, libm cosf/sinf, the fused products of ggml's rotate_pairs)."""
    n = native.load()
    x = np.ascontiguousarray(x, np.float32)
    positions = np.ascontiguousarray(positions, np.int32)
    out = np.empty_like(x)
    n.check(n.lib.ciq_rope(n.lib.CIQ_DEVICE_CPU, n.lib.CIQ_ORDER_HOST, n.lib.CIQ_ROPE_NEOX if neox else n.lib.CIQ_ROPE_NORM, n.ffi.from_buffer("float[]", x),
                           n.ffi.from_buffer("int32_t[]", positions), x.shape[0], x.shape[1], x.shape[2], float(base),
                           n.ffi.from_buffer("float[]", out)))
    return out


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_past: int, scale: float,
              window: int) -> np.ndarray:
    """Causal GQA over f16 caches as llama.cpp's x86 CPU graph without flash attention computes it (libggml_ciq's
    host kernel "ggml", float order in native/src/cpu/ops.cpp): query t at position n_past + t sees keys
    p <= n_past + t (and n_past + t - p < window when window > 0); q and the softmax weights rounded to f16."""
    t, h, d = q.shape
    n = native.load()
    q = np.ascontiguousarray(q, np.float32)
    k_cache, v_cache = np.ascontiguousarray(k_cache, np.float16), np.ascontiguousarray(v_cache, np.float16)
    out = np.empty((t, h * d), np.float32)
    n.check(n.lib.ciq_attention(n.lib.CIQ_DEVICE_CPU, n.lib.CIQ_ATTENTION_GGML, n.ffi.from_buffer("float[]", q),
                                n.ffi.from_buffer("uint16_t[]", k_cache.view(np.uint16)),
                                n.ffi.from_buffer("uint16_t[]", v_cache.view(np.uint16)), t, h, k_cache.shape[1], d,
                                k_cache.shape[0], int(n_past), float(scale), int(window),
                                n.ffi.from_buffer("float[]", out)))
    return out


class NumpyWeight:
    """A weight as NumpyOps multiplies it: `kind` is "keep-quant" or "q32" (native GEMMs in llama.cpp CPU's
    semantics) or "dense" (float32, with activations rounded to the weight's vec_dot type first)."""

    def __init__(self, tensor: Tensor):
        self.name, self.ggml_type, self.rows, self.k = tensor.name, tensor.ggml_type, tensor.rows, tensor.k
        if tensor.ggml_type in quants.HOST_KEEP_QUANT_TYPES and len(tensor.shape) == 2:  # the host's "cpu" variant
            self.kind = "keep-quant"
            self.problem = native.GemmProblem.upload(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k, "cpu")
            self.nbytes = tensor.raw().nbytes
        elif tensor.ggml_type in quants.Q32_TYPES + quants.Q32_1_TYPES:  # the q32 variant, uploaded once (as above)
            self.kind = "q32"
            self.problem = native.GemmProblem.upload(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k, "cpu")
            self.nbytes = tensor.raw().nbytes
        else:
            self.kind = "dense"
            self.dense = tensor.dequantize().astype(np.float64)
            self.nbytes = self.dense.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ShapeError(f"{self.name}: activations must be [n, {self.k}], got {x.shape}")
        if self.kind == "keep-quant":
            return self.problem.run(x, variant="auto", semantics="cpu", poison=False)
        if self.kind == "q32":
            return self.problem.run(x, variant="q32", semantics="cpu", poison=False)
        if self.ggml_type == quants.F16:
            x = x.astype(np.float16).astype(np.float32)
        elif self.ggml_type == quants.BF16:
            x = quants.round_bf16(x)
        elif self.ggml_type in quants.KEEP_QUANT_TYPES + (quants.Q5_K,):
            x = quants.q8_K_round_trip(x)
        return (x.astype(np.float64) @ self.dense.T).astype(np.float32)  # exact products, rounded once


class HostArrays:
    """What host ops share: the bytes of the arrays they return (memory_bytes) and host timers."""

    def __init__(self):
        self.timings: defaultdict[str, float] = defaultdict(float)
        self._live = 0

    def _track(self, a: np.ndarray) -> np.ndarray:
        if a.base is None:
            self._live += a.nbytes
            weakref.finalize(a, self._release, a.nbytes)
        return a

    def _release(self, nbytes: int) -> None:
        self._live -= nbytes

    def numpy(self, x) -> np.ndarray:
        return np.asarray(x)

    def memory_bytes(self) -> int:
        """Bytes of the live arrays and weights this object created."""
        return self._live

    @contextmanager
    def timer(self, op_class: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[op_class] += time.perf_counter() - start

    def settle_timings(self) -> None:
        """Nothing pending: host ops are timed as they run."""


class NumpyOps(HostArrays):
    """The engine/ops contract on numpy arrays (see ggml_ciq.engine). Tracks the bytes of what it returns."""

    device = "cpu"

    def asarray(self, a) -> np.ndarray:
        a = np.asarray(a)
        return self._track(a.astype(np.float32 if a.dtype == np.float64 else a.dtype, copy=True))

    def zeros(self, shape, dtype=np.float32) -> np.ndarray:
        return self._track(np.zeros(shape, dtype))

    # -- ops ----------------------------------------------------------------------------------------------------
    def get_rows(self, tensor: Tensor, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of tensor dequantized to float32, as ggml's get_rows."""
        ids = np.asarray(ids)
        row_bytes = quants.row_bytes(tensor.ggml_type, tensor.k)
        raw = np.ascontiguousarray(tensor.raw().reshape(tensor.rows, row_bytes)[ids])
        return self._track(quants.dequantize(tensor.ggml_type, raw.reshape(-1), len(ids), tensor.k))

    def rms_norm(self, x, weight, eps: float):
        return self._track(rms_norm(x, weight, eps))

    def rope(self, x, positions, base: float, neox: bool):
        return self._track(rope(x, np.asarray(positions), base, neox))

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float, window: int):
        return self._track(attention(q, k_cache, v_cache, n_past, scale, window))

    def kv_store(self, cache, start: int, x) -> None:
        if start + len(x) > len(cache):
            raise ShapeError(f"KV cache holds {len(cache)} positions; cannot store {start}..{start + len(x)}")
        cache[start:start + len(x)] = x.astype(np.float16)

    def glu(self, gate, up, kind: str):
        """act(gate) * up over rows of gate's last axis: libggml_ciq's host ciq_glu, SiLU in llama.cpp x86 AVX2's
        order (CIQ_ORDER_LLAMACPP_CPU: ggml_v_expf on each row's 8-value blocks, expf on its tail), GELU through
        ggml's fp16 table (x <= -10: 0, x >= 10: x)."""
        if kind not in ("silu", "gelu"):
            raise UnsupportedTypeError(f"unknown GLU kind {kind!r} (silu or gelu)")
        n = native.load()
        gate, up = np.ascontiguousarray(gate, np.float32), np.ascontiguousarray(up, np.float32)
        if gate.shape != up.shape:
            raise ShapeError(f"glu: gate {gate.shape} and up {up.shape} differ")
        out = np.empty_like(gate)
        kind_id = n.lib.CIQ_GLU_SILU if kind == "silu" else n.lib.CIQ_GLU_GELU
        native.glu_into(n.lib.CIQ_DEVICE_CPU, n.lib.CIQ_ORDER_LLAMACPP_CPU, kind_id, n.ffi.from_buffer("float[]", gate),
                        n.ffi.from_buffer("float[]", up), n.ffi.from_buffer("float[]", out), gate.size,
                        gate.shape[-1] if gate.ndim else 1)
        return self._track(out)

    def add(self, a, b):
        return self._track(a + b)

    def scale(self, x, s: float):
        return self._track(x * np.float32(s))

    def load_weight(self, tensor: Tensor) -> NumpyWeight:
        weight = NumpyWeight(tensor)
        self._live += weight.nbytes
        weakref.finalize(weight, self._release, weight.nbytes)
        return weight

    def linear(self, weight: NumpyWeight, x):
        return self._track(weight(x))
