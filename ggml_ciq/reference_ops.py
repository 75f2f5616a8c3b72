"""The model a GGUF defines, evaluated in float64 (ReferenceOps), and the CPU engine's `exact` semantics (ExactCpuOps).

ReferenceOps is the engine's ops contract (ggml_ciq.ops) with no rounding but float64's own:
- weights dequantized exactly from their blocks (Q4_K/Q5_K: d*sc*q - dmin*m in float64, where ggml rounds the
  difference to float32; every other supported type is exact in float32 and kept so), multiplied with float64
  activations (none quantized) in float64, row chunks converted as they are used;
- rms_norm, RoPE (angles pos * base^(-2i/d) in float64, no stepped float32 theta), tanh-GELU / SiLU, softmax and
  attention in float64, over float64 K/V caches (no f16 cache), queries in chunks.
Arrays are float64 numpy arrays; the engine's logits and hidden states come back as float32 (a 2^-24 relative
rounding, far below any distance compare reports).

ExactCpuOps is the most exact fast CPU path (`--semantics exact` on the CPU): NumpyOps (ggml's rms_norm: squares
summed in double) with every weight dequantized once to float32 and multiplied by float32 activations in OpenBLAS's
sgemm (no Q8_K/q8_0 activation quantization), GELU in float (no fp16 table), RoPE angles in float64, and attention
in float64 over the f16 K/V cache (q and the softmax weights not rounded to f16). The K/V cache stays f16, as
llama.cpp's default.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import quants
from .errors import OutOfMemoryError, ShapeError, UnsupportedTypeError
from .model import ModelFile, Tensor
from .numpy_ops import HostArrays, NumpyOps
from .resources import free_host_bytes

# Bytes of float64 weight rows converted at a time by ReferenceWeight, and of attention scores per query chunk.
CHUNK_BYTES = 64 << 20

# Types whose ggml dequantization (float32) is exact: every product has at most 24 significant bits
# (Q8_0: 11-bit fp16 d x 8-bit q; Q6_K: 11-bit d x 8-bit sc x 6-bit q <= 24 bits).
_EXACT_IN_FLOAT32 = (quants.F32, quants.F16, quants.BF16, quants.Q4_0, quants.Q5_0, quants.Q8_0, quants.Q6_K)


def dequantize_exact(ggml_type: int, data, rows: int, k: int) -> np.ndarray:
    """A [rows, k] tensor's values exactly: float32 where float32 holds them exactly (the types in
    _EXACT_IN_FLOAT32, ggml's own dequantization), float64 for Q4_K and Q5_K (d*sc*q - dmin*m without ggml's float32
    rounding of the difference), Q4_1 and Q5_1 (q*d + m without ggml's float32 rounding of the sum)."""
    if ggml_type in _EXACT_IN_FLOAT32:
        return quants.dequantize(ggml_type, data, rows, k)
    if ggml_type in quants.Q32_1_TYPES:
        q, d, m = quants.q32_1_fields(ggml_type, data, rows, k)
        return (q * d.astype(np.float64)[..., None] + m.astype(np.float64)[..., None]).reshape(rows, k)
    if ggml_type == quants.Q4_K:
        d, dmin, sc, m, q = quants.q4_K_fields(data, rows, k)
    elif ggml_type == quants.Q5_K:
        raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
        if raw.size != rows * quants.row_bytes(ggml_type, k):
            raise ShapeError(f"Q5_K [{rows} x {k}] needs {rows * quants.row_bytes(ggml_type, k)} bytes, got {raw.size}")
        d, dmin, sc, m, q = quants.q5_K_fields(raw, rows, k)
    else:
        raise UnsupportedTypeError(f"the float64 reference cannot dequantize {quants.type_name(ggml_type)}")
    scale = d.astype(np.float64)[..., None] * sc
    offset = dmin.astype(np.float64)[..., None] * m
    return (scale[..., None] * q - offset[..., None]).reshape(rows, k)


def exact_bytes(tensor: Tensor) -> int:
    """Bytes of a tensor's exact values as ReferenceWeight keeps them (float32; float64 for Q4_K/Q5_K/Q4_1/Q5_1)."""
    wide = (quants.Q4_K, quants.Q5_K) + quants.Q32_1_TYPES
    return tensor.rows * tensor.k * (8 if tensor.ggml_type in wide else 4)


def check_host_memory(model: ModelFile, extra_bytes: int = 0) -> None:
    """OutOfMemoryError, before anything is dequantized, when the reference's weights (every 2-D tensor's exact
    values) and `extra_bytes` would not fit 80% of the free host memory (Llama-3-8B's Q4_K weights alone take 64 GB
    in float64)."""
    need = sum(exact_bytes(t) for t in model.tensors.values() if len(t.shape) == 2) + extra_bytes
    free = free_host_bytes()
    if need > 0.8 * free:
        raise OutOfMemoryError(f"the float64 reference of {model.path} needs {need / 2**30:.1f} GiB of host memory "
                               f"for its weights; {free / 2**30:.1f} GiB is free")


def _rows_of(tensor: Tensor, ids: np.ndarray) -> np.ndarray:
    """The raw blocks of rows `ids` of a [rows, k] tensor, contiguous."""
    row_bytes = quants.row_bytes(tensor.ggml_type, tensor.k)
    return np.ascontiguousarray(tensor.raw().reshape(tensor.rows, row_bytes)[ids]).reshape(-1)


# -- float64 ops (ReferenceOps; ExactCpuOps' RoPE and attention) --------------------------------------------------

def rms_norm_f64(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    x = np.asarray(x, np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def rope_f64(x: np.ndarray, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """RoPE of x[tokens, heads, head_dim]: pairs (2i, 2i+1) (NORM) or (i, i + d/2) (NEOX) rotated by
    pos * base^(-2i/d), angles and rotation in float64."""
    t, h, d = x.shape
    half = d // 2
    theta = np.asarray(positions, np.float64)[:, None] * np.power(float(base), -2.0 * np.arange(half) / d)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x = np.asarray(x, np.float64)
    x0, x1 = (x[..., :half], x[..., half:]) if neox else (x[..., 0::2], x[..., 1::2])
    out = np.empty_like(x)
    if neox:
        out[..., :half], out[..., half:] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    else:
        out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out


def attention_f64(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_past: int, scale: float,
                  window: int, chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
    """Causal GQA in float64 over caches of any float type: query t (position n_past + t) sees keys p <= n_past + t
    (and n_past + t - p < window when window > 0); exact softmax. Queries in chunks whose scores fit chunk_bytes.
    -> [T, H*D] float64."""
    t, h, d = q.shape
    c, h_kv, dk = k_cache.shape
    if dk != d or h % h_kv or n_past < 0 or n_past + t > c:
        raise ShapeError(f"attention: q {q.shape} with caches {k_cache.shape} at n_past {n_past}")
    group = h // h_kv
    q = np.asarray(q, np.float64)
    out = np.empty((t, h, d))
    span = n_past + t if window <= 0 else min(n_past + t, window + t)
    step = max(1, chunk_bytes // (8 * group * span))
    for t0 in range(0, t, step):
        t1 = min(t, t0 + step)
        pos = n_past + np.arange(t0, t1)
        first = 0 if window <= 0 else max(0, n_past + t0 - window + 1)
        keys = np.arange(first, n_past + t1)
        visible = keys[None, :] <= pos[:, None]
        if window > 0:
            visible &= pos[:, None] - keys[None, :] < window
        for g in range(h_kv):
            k = np.asarray(k_cache[first:n_past + t1, g], np.float64)
            v = np.asarray(v_cache[first:n_past + t1, g], np.float64)
            qg = q[t0:t1, g * group:(g + 1) * group].reshape(-1, d)        # [tq * group, d], query-major
            s = (qg @ k.T * scale).reshape(t1 - t0, group, len(keys))
            s = np.where(visible[:, None, :], s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True)).reshape(-1, len(keys))
            out[t0:t1, g * group:(g + 1) * group] = ((w @ v) / w.sum(-1, keepdims=True)).reshape(t1 - t0, group, d)
    return out.reshape(t, h * d)


def gelu_tanh_f64(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU (ggml_gelu, Gemma's gelu_pytorch_tanh), in float64."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


def glu_f64(gate: np.ndarray, up: np.ndarray, kind: str) -> np.ndarray:
    gate = np.asarray(gate, np.float64)
    if kind == "silu":
        return gate / (1.0 + np.exp(-gate)) * up
    if kind == "gelu":
        return gelu_tanh_f64(gate) * up
    raise UnsupportedTypeError(f"unknown GLU kind {kind!r} (silu or gelu)")


# -- ReferenceOps -----------------------------------------------------------------------------------------------

class ReferenceWeight:
    """A weight's exact values (float32 where that is exact, else float64), multiplied in float64 row chunks."""

    def __init__(self, tensor: Tensor):
        if len(tensor.shape) != 2:
            raise ShapeError(f"{tensor.name}: a weight must be 2-D, got shape {tensor.shape}")
        self.name, self.ggml_type, self.rows, self.k = tensor.name, tensor.ggml_type, tensor.rows, tensor.k
        self.values = dequantize_exact(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k)
        self.nbytes = self.values.nbytes

    def __call__(self, x: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ShapeError(f"{self.name}: activations must be [n, {self.k}], got {x.shape}")
        x = np.asarray(x, np.float64)
        if self.values.dtype == np.float64:
            return x @ self.values.T
        out = np.empty((len(x), self.rows))
        step = max(1, chunk_bytes // (8 * self.k))
        for r in range(0, self.rows, step):
            out[:, r:r + step] = x @ self.values[r:r + step].astype(np.float64).T
        return out


class ReferenceOps(HostArrays):
    """The engine/ops contract in float64 on the CPU (module docstring): `device = "reference"`."""

    device = "reference"
    kv_cache_dtype = np.dtype(np.float64)  # the engine's K/V caches: no f16 rounding

    def __init__(self, chunk_bytes: int = CHUNK_BYTES):
        super().__init__()
        self.chunk_bytes = chunk_bytes

    # -- arrays -------------------------------------------------------------------------------------------------
    def asarray(self, a) -> np.ndarray:
        a = np.asarray(a)
        return self._track(a.astype(np.float64 if a.dtype.kind == "f" else a.dtype, copy=True))

    def zeros(self, shape, dtype=np.float64) -> np.ndarray:
        """Float arrays (the K/V caches included) are float64."""
        return self._track(np.zeros(shape, np.float64 if np.dtype(dtype).kind == "f" else dtype))

    def check_memory(self, model: ModelFile) -> None:
        """Called by the engine before it loads the weights (check_host_memory)."""
        check_host_memory(model)

    # -- ops ----------------------------------------------------------------------------------------------------
    def get_rows(self, tensor: Tensor, ids) -> np.ndarray:
        ids = np.asarray(ids).reshape(-1)
        values = dequantize_exact(tensor.ggml_type, _rows_of(tensor, ids), len(ids), tensor.k)
        return self._track(values.astype(np.float64))

    def rms_norm(self, x, weight, eps: float):
        return self._track(rms_norm_f64(x, weight, eps))

    def rope(self, x, positions, base: float, neox: bool):
        return self._track(rope_f64(x, positions, base, neox))

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float, window: int):
        return self._track(attention_f64(q, k_cache, v_cache, n_past, scale, window, self.chunk_bytes))

    def kv_store(self, cache, start: int, x) -> None:
        if start + len(x) > len(cache):
            raise ShapeError(f"KV cache holds {len(cache)} positions; cannot store {start}..{start + len(x)}")
        cache[start:start + len(x)] = x

    def glu(self, gate, up, kind: str):
        return self._track(glu_f64(gate, up, kind))

    def add(self, a, b):
        return self._track(np.add(a, b, dtype=np.float64))

    def scale(self, x, s: float):
        return self._track(np.multiply(x, float(s), dtype=np.float64))

    def load_weight(self, tensor: Tensor) -> ReferenceWeight:
        weight = ReferenceWeight(tensor)
        self._live += weight.nbytes
        weakref.finalize(weight, self._release, weight.nbytes)
        return weight

    def linear(self, weight: ReferenceWeight, x):
        return self._track(weight(x, self.chunk_bytes))


# -- ExactCpuOps ------------------------------------------------------------------------------------------------

class DenseWeight:
    """A weight dequantized once to float32 (exact but for Q4_K/Q5_K's last bit), for sgemm."""

    def __init__(self, tensor: Tensor):
        if len(tensor.shape) != 2:
            raise ShapeError(f"{tensor.name}: a weight must be 2-D, got shape {tensor.shape}")
        self.name, self.ggml_type, self.rows, self.k = tensor.name, tensor.ggml_type, tensor.rows, tensor.k
        self.values = np.ascontiguousarray(dequantize_exact(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k),
                                           np.float32)
        self.nbytes = self.values.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ShapeError(f"{self.name}: activations must be [n, {self.k}], got {x.shape}")
        return np.asarray(x, np.float32) @ self.values.T


class ExactCpuOps(NumpyOps):
    """The CPU engine in `exact` semantics (module docstring): float activations everywhere, float32 GEMMs."""

    semantics = "exact"

    def load_weight(self, tensor: Tensor) -> DenseWeight:
        weight = DenseWeight(tensor)
        self._live += weight.nbytes
        weakref.finalize(weight, self._release, weight.nbytes)
        return weight

    def rope(self, x, positions, base: float, neox: bool):
        return self._track(rope_f64(x, np.asarray(positions), base, neox).astype(np.float32))

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float, window: int):
        return self._track(attention_f64(q, k_cache, v_cache, n_past, scale, window).astype(np.float32))

    def glu(self, gate, up, kind: str):
        return self._track(glu_f64(gate, up, kind).astype(np.float32))
