"""The engine's ops in numpy, in llama.cpp CPU's arithmetic (the x86 AVX2 build of llama-cpp-python 0.3.36).

Arrays are numpy float32 (caches float16), rows first. What each op mirrors, found op by op against tensors
captured from llama.cpp's own forward pass of Gemma 3 270M:
- 32-block weights (Q4_0, Q5_0, Q8_0): activations quantized as ggml's AVX2 `quantize_row_q8_0`
  (`id = 127/amax`, round half to even, `d = fp16(amax/127)`), then Σ_blocks `d_w*d_x*isum` with `isum` a
  block's integer dot product (`ggml_vec_dot_q5_0_q8_0` / llamafile's `tinyBLAS_Q0_AVX`), here evaluated exactly.
- Q4_K/Q6_K: libggml_ciq's keep-quant GEMM in cpu semantics (docs/SEMANTICS.md).
- Attention without flash attention over the f16 K/V cache: q rounded to f16, scores in float32, softmax in
  float32 with its sum in double, probabilities rounded to f16 before the product with V.
- GELU: ggml's fp16 table, built as ggml builds it (float32, `1 + a*x*x` fused, correctly rounded tanhf).
Float additions may run in another order than ggml's SIMD lanes: results agree to rounding, not bit for bit.
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

Q32_TYPES = (quants.Q4_0, quants.Q5_0, quants.Q8_0)  # 32-value blocks: q8_0 activations, integer dot products


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's AVX2 quantize_row_q8_0 of x [n, k] -> (q [n, k/32, 32] float32 integers, d [n, k/32] float32)."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(-1)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    q = np.rint(xb * inv[..., None])  # _mm256_round_ps(_MM_ROUND_NEAREST): half to even
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    return q, d


def gemm_q32(q_w: np.ndarray, d_w: np.ndarray, x: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """out[n, rows] for 32-block weights (q_w [rows, K/32, 32] int8, d_w [rows, K/32]) on q8_0 activations:
    Σ_blocks d_w*d_x*isum with isum the integer dot product of a block. Computed exactly (float64 holds every
    product q_w*d_w*q_x*d_x and the sums of a row) and rounded once; ggml's float32 accumulation differs from
    it by rounding only."""
    q_x, d_x = quantize_q8_0(x)
    x64 = (q_x.astype(np.float64) * d_x[..., None]).reshape(x.shape)
    out = np.empty((x.shape[0], len(d_w)), np.float32)
    for r0 in range(0, len(d_w), chunk):
        w64 = (q_w[r0:r0 + chunk].astype(np.float64) * d_w[r0:r0 + chunk, :, None]).reshape(-1, x.shape[1])
        out[:, r0:r0 + chunk] = x64 @ w64.T
    return out


def _gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16 as float32: gelu of every fp16 value, computed as ggml's x86 build does (float32,
    1 + GELU_COEF_A*x*x contracted to an fma, glibc's correctly rounded tanhf), rounded to fp16."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        inner = ((np.float32(0.044715) * x).astype(np.float64) * x + 1.0).astype(np.float32)
        arg = np.float32(0.79788456080286535587989211986876) * x * inner
        tanh = np.tanh(arg.astype(np.float64)).astype(np.float32)
        return (np.float32(0.5) * x * (np.float32(1) + tanh)).astype(np.float16).astype(np.float32)


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """ggml's rms_norm (squares summed in double, scale = 1/sqrtf(mean + eps) in float32), then mul by weight."""
    mean = ((x * x).astype(np.float64).sum(-1, keepdims=True) / x.shape[-1]).astype(np.float32)
    y = x * (np.float32(1.0) / np.sqrt(mean + np.float32(eps)))
    return y if weight is None else y * weight


def rope(x: np.ndarray, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """ggml's RoPE on [tokens, heads, head_dim]: pairs (2i, 2i+1) (NORM) or (i, i + d/2) (NEOX) rotate by
    pos * base^(-2i/d), theta stepped in float32 as ggml's rope cache does (theta *= powf(base, -2/d))."""
    d = x.shape[-1]
    theta_scale = np.float32(np.power(np.float64(np.float32(base)), np.float64(np.float32(-2.0) / np.float32(d))))
    theta = np.empty((len(positions), d // 2), np.float32)
    theta[:, 0] = positions
    for i in range(1, d // 2):
        theta[:, i] = theta[:, i - 1] * theta_scale
    cos = np.cos(theta.astype(np.float64)).astype(np.float32)[:, None, :]
    sin = np.sin(theta.astype(np.float64)).astype(np.float32)[:, None, :]
    first, second = (slice(0, d // 2), slice(d // 2, d)) if neox else (slice(0, d, 2), slice(1, d, 2))
    x0, x1 = x[..., first], x[..., second]
    out = np.empty_like(x)
    out[..., first] = x0 * cos - x1 * sin
    out[..., second] = x0 * sin + x1 * cos
    return out


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_past: int, scale: float,
              window: int) -> np.ndarray:
    """Causal GQA over f16 caches as llama.cpp's CPU graph without flash attention computes it: query t at
    position n_past + t sees keys p <= n_past + t (and n_past + t - p < window when window > 0). The two f16
    products run in float64 (exact products, one rounding to float32), so a row's result does not depend on
    how many rows the micro-batch has."""
    t, h, d = q.shape
    n_kv, h_kv = n_past + t, k_cache.shape[1]
    first = max(0, n_past - window + 1) if window else 0  # keys before it are outside every query's window
    group = h // h_kv
    pos = n_past + np.arange(t)
    distance = pos[:, None] - np.arange(first, n_kv)[None, :]
    visible = (distance >= 0) & ((distance < window) if window else True)
    q16 = q.astype(np.float16).astype(np.float64)
    out = np.empty((t, h_kv, group, d), np.float32)
    for g in range(h_kv):  # one KV head at a time: scores stay [group * t, n_kv - first]
        k = k_cache[first:n_kv, g].astype(np.float64)
        v = v_cache[first:n_kv, g].astype(np.float64)
        qg = q16[:, g * group:(g + 1) * group].transpose(1, 0, 2)             # [group, t, d]
        scores = (qg @ k.T).astype(np.float32) * np.float32(scale)
        scores = np.where(visible[None], scores, np.float32(-np.inf))
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p *= (1.0 / p.astype(np.float64).sum(-1, keepdims=True)).astype(np.float32)
        out[:, g] = (p.astype(np.float16).astype(np.float64) @ v).transpose(1, 0, 2)
    return out.reshape(t, h * d)


class NumpyWeight:
    """A weight as NumpyOps multiplies it: `kind` is "keep-quant" (native GEMM), "q32" (int8 values and block
    scales) or "dense" (float32, with activations rounded to the weight's vec_dot type first)."""

    def __init__(self, tensor: Tensor):
        self.name, self.ggml_type, self.rows, self.k = tensor.name, tensor.ggml_type, tensor.rows, tensor.k
        if tensor.is_keep_quant:
            self.kind = "keep-quant"
            self.problem = native.GemmProblem.upload(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k, "cpu")
            self.nbytes = tensor.raw().nbytes
        elif tensor.ggml_type in Q32_TYPES:
            self.kind = "q32"
            self.q, self.d = quants.q32_fields(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k)
            self.nbytes = self.q.nbytes + self.d.nbytes
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
            return gemm_q32(self.q, self.d, x)
        if self.ggml_type == quants.F16:
            x = x.astype(np.float16).astype(np.float32)
        elif self.ggml_type == quants.BF16:
            x = quants.round_bf16(x)
        elif self.ggml_type in quants.KEEP_QUANT_TYPES + (quants.Q5_K,):
            x = quants.q8_K_round_trip(x)
        return (x.astype(np.float64) @ self.dense.T).astype(np.float32)  # exact products, as gemm_q32


class NumpyOps:
    """The engine/ops contract on numpy arrays (see ggml_ciq.engine). Tracks the bytes of what it returns."""

    device = "cpu"

    def __init__(self):
        self.timings: defaultdict[str, float] = defaultdict(float)
        self._live = 0
        self._gelu = None

    # -- arrays -------------------------------------------------------------------------------------------------
    def _track(self, a: np.ndarray) -> np.ndarray:
        if a.base is None:
            self._live += a.nbytes
            weakref.finalize(a, self._release, a.nbytes)
        return a

    def _release(self, nbytes: int) -> None:
        self._live -= nbytes

    def asarray(self, a) -> np.ndarray:
        a = np.asarray(a)
        return self._track(a.astype(np.float32 if a.dtype == np.float64 else a.dtype, copy=True))

    def numpy(self, x) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape, dtype=np.float32) -> np.ndarray:
        return self._track(np.zeros(shape, dtype))

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
        """act(gate) * up: SiLU in float32, or GELU through ggml's fp16 table (x <= -10: 0, x >= 10: x)."""
        if kind == "silu":
            return self._track((gate / (np.float32(1) + np.exp(-gate))) * up)
        if kind == "gelu":
            if self._gelu is None:
                self._gelu = _gelu_table()
            g = self._gelu[gate.astype(np.float16).view(np.uint16)]
            g = np.where(gate <= -10.0, np.float32(0), np.where(gate >= 10.0, gate, g))
            return self._track(g * up)
        raise UnsupportedTypeError(f"unknown GLU kind {kind!r} (silu or gelu)")

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
