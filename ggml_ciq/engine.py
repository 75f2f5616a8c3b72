"""Prefill through a GGUF model: the transformer is plain code, the matrix products are calls.

Q4_K/Q6_K weights go through libggml_ciq's keep-quant GEMM (on the CPU here: llama.cpp CPU semantics); other
weight types are dequantized once and multiplied in float32. Architectures: llama (Llama 2/3, Mistral) and gemma3
(embedding scale, q/k norms, post-attention/post-FFN norms, GELU gate, sliding-window layers, tied output).
Activations are [tokens, features] float32, as everywhere in ggml_ciq.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from . import native, quants
from .errors import ShapeError, UnsupportedTypeError
from .model import ModelFile, Tensor

ARCHITECTURES = ("llama", "gemma3")


@dataclass(frozen=True)
class Hyperparameters:
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    n_vocab: int
    sliding_window: int = 0         # gemma3: layers with il % 6 != 5 attend to the last sliding_window tokens
    rope_base_sliding: float = 10000.0

    @classmethod
    def of(cls, model: ModelFile) -> "Hyperparameters":
        c = model.config
        arch = c.architecture
        if arch not in ARCHITECTURES:
            raise UnsupportedTypeError(f"{model.path}: architecture {arch} is not supported by the engine "
                                       f"(supported: {', '.join(ARCHITECTURES)})")
        head_dim = int(c.metadata.get(f"{arch}.attention.key_length", c.embedding_length // c.head_count))
        rot = c.metadata.get(f"{arch}.rope.dimension_count")
        if rot is not None and int(rot) != head_dim:
            raise UnsupportedTypeError(f"{model.path}: partial RoPE ({rot} of {head_dim} dims) is not supported")
        return cls(arch, c.block_count, c.embedding_length, c.head_count, c.head_count_kv, head_dim, c.rms_norm_eps,
                   c.rope_freq_base, c.vocab_size, int(c.metadata.get(f"{arch}.attention.sliding_window", 0)),
                   float(c.metadata.get(f"{arch}.rope.freq_base_swa", 10000.0)))

    def is_sliding(self, layer: int) -> bool:
        return self.architecture == "gemma3" and self.sliding_window > 0 and layer % 6 != 5


def q8_0_round_trip(x: np.ndarray) -> np.ndarray:
    """Activations as llama.cpp's CPU sees them for 32-block weight types: quantize_row_q8_0 then dequantized."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = np.abs(xb).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.trunc(xb * inv + np.copysign(np.float32(0.5), xb * inv))  # roundf
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


class Timings(defaultdict):
    """Seconds per op class: keep-quant GEMM, other GEMM, attention; `time(cls)` is a context manager."""

    def __init__(self):
        super().__init__(float)

    def time(self, op_class: str):
        timings = self

        class _Timer:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                timings[op_class] += time.perf_counter() - self.start

        return _Timer()


class Linear:
    """One weight matrix: keep-quant GEMM for Q4_K/Q6_K; other types dequantized once and multiplied in float32
    (on q8_0-rounded activations for Q4_0/Q5_0/Q8_0, as llama.cpp's CPU path)."""

    def __init__(self, tensor: Tensor, timings: Timings, device="cpu"):
        self.tensor, self.device, self.timings = tensor, device, timings
        self.keep_quant = tensor.is_keep_quant
        self.q8_0_activations = tensor.ggml_type in (quants.Q4_0, quants.Q5_0, quants.Q8_0)
        self.dense = None if self.keep_quant else tensor.dequantize()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.keep_quant:
            with self.timings.time("keep-quant GEMM"):
                return native.gemm(self.tensor, x, variant="auto", device=self.device, semantics="cpu")
        with self.timings.time("other GEMM"):
            return (q8_0_round_trip(x) if self.q8_0_activations else x) @ self.dense.T


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """ggml's rms_norm then mul: squares summed in double, scale = 1/sqrtf(mean + eps) in float32."""
    mean = ((x * x).astype(np.float64).sum(-1, keepdims=True) / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale) * weight


def rope(x: np.ndarray, positions: np.ndarray, base: float, neox: bool = False) -> np.ndarray:
    """llama.cpp's RoPE on [tokens, heads, head_dim]: dimension pairs (2i, 2i+1) (NORM) or (i, i + d/2) (NEOX)
    rotate by pos * base^(-2i/d), theta stepped in float32 as ggml's rope cache does (theta *= powf(base, -2/d))."""
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


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU (tanh form) as its fp16 table computes it: input and result rounded to fp16."""
    h = x.astype(np.float16).astype(np.float64)
    y = (0.5 * h * (1.0 + np.tanh(0.7978845608028654 * h * (1.0 + 0.044715 * h * h)))).astype(np.float16)
    return np.where(x <= -10.0, np.float32(0), np.where(x >= 10.0, x, y.astype(np.float32))).astype(np.float32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int = 0) -> np.ndarray:
    """Causal grouped-query attention: q [T, H, D], k/v [T, Hkv, D] -> [T, H*D]; window > 0 masks keys that are
    window or more positions back (sliding-window layers)."""
    t, h, d = q.shape
    group = h // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * np.float32(scale)
    distance = np.arange(t)[:, None] - np.arange(t)[None, :]
    visible = (distance >= 0) & ((distance < window) if window else True)
    scores = np.where(visible[None], scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", scores, v).reshape(t, h * d).astype(np.float32)


def heads_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over each head's vector of [tokens, heads, head_dim]."""
    t, h, d = x.shape
    return rms_norm(x.reshape(t * h, d), weight, eps).reshape(t, h, d)


class Transformer:
    """A llama or gemma3 model loaded from a GGUF file."""

    def __init__(self, model: ModelFile, device="cpu"):
        self.model, self.hp = model, Hyperparameters.of(model)
        self.timings = Timings()
        gemma = self.hp.architecture == "gemma3"

        def w(name):
            return Linear(model.tensor(name), self.timings, device)

        def norm(name):
            return model.tensor(name).dequantize().reshape(-1)

        self.token_embd = model.tensor("token_embd.weight")
        self.layers = []
        for i in range(self.hp.n_layer):
            layer = dict(attn_norm=norm(f"blk.{i}.attn_norm.weight"), q=w(f"blk.{i}.attn_q.weight"),
                         k=w(f"blk.{i}.attn_k.weight"), v=w(f"blk.{i}.attn_v.weight"),
                         o=w(f"blk.{i}.attn_output.weight"), ffn_norm=norm(f"blk.{i}.ffn_norm.weight"),
                         gate=w(f"blk.{i}.ffn_gate.weight"), up=w(f"blk.{i}.ffn_up.weight"),
                         down=w(f"blk.{i}.ffn_down.weight"))
            if gemma:
                for name in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
                    layer[name] = norm(f"blk.{i}.{name}.weight")
            self.layers.append(layer)
        self.output_norm = norm("output_norm.weight")
        output = "output.weight" if "output.weight" in model.tensors else "token_embd.weight"  # tied embeddings
        self.output = w(output)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Rows of the token embedding, dequantized like llama.cpp's get_rows."""
        t = self.token_embd
        if tokens.min() < 0 or tokens.max() >= t.rows:
            raise ShapeError(f"token ids must be in [0, {t.rows}), got {tokens.min()}..{tokens.max()}")
        row_bytes = quants.row_bytes(t.ggml_type, t.k)
        raw = t.raw().reshape(t.rows, row_bytes)[tokens]
        return quants.dequantize(t.ggml_type, np.ascontiguousarray(raw).reshape(-1), len(tokens), t.k)

    def _llama_block(self, layer: dict, x: np.ndarray, positions: np.ndarray, il: int) -> np.ndarray:
        hp, t = self.hp, len(positions)
        h = rms_norm(x, layer["attn_norm"], hp.rms_eps)
        q = rope(layer["q"](h).reshape(t, hp.n_head, hp.head_dim), positions, hp.rope_base)
        k = rope(layer["k"](h).reshape(t, hp.n_head_kv, hp.head_dim), positions, hp.rope_base)
        v = layer["v"](h).reshape(t, hp.n_head_kv, hp.head_dim)
        with self.timings.time("attention"):
            attn = attention(q, k, v, 1.0 / np.sqrt(hp.head_dim))
        x = x + layer["o"](attn)
        h = rms_norm(x, layer["ffn_norm"], hp.rms_eps)
        gate = layer["gate"](h)
        return x + layer["down"]((gate / (1.0 + np.exp(-gate)) * layer["up"](h)).astype(np.float32))

    def _gemma3_block(self, layer: dict, x: np.ndarray, positions: np.ndarray, il: int) -> np.ndarray:
        hp, t = self.hp, len(positions)
        sliding = hp.is_sliding(il)
        base = hp.rope_base_sliding if sliding else hp.rope_base
        h = rms_norm(x, layer["attn_norm"], hp.rms_eps)
        q = heads_norm(layer["q"](h).reshape(t, hp.n_head, hp.head_dim), layer["attn_q_norm"], hp.rms_eps)
        k = heads_norm(layer["k"](h).reshape(t, hp.n_head_kv, hp.head_dim), layer["attn_k_norm"], hp.rms_eps)
        q = rope(q, positions, base, neox=True) * np.float32(1.0 / np.sqrt(np.float32(hp.head_dim)))
        k = rope(k, positions, base, neox=True)
        v = layer["v"](h).reshape(t, hp.n_head_kv, hp.head_dim)
        with self.timings.time("attention"):
            attn = attention(q, k, v, 1.0, hp.sliding_window if sliding else 0)
        x = rms_norm(layer["o"](attn), layer["post_attention_norm"], hp.rms_eps) + x
        h = rms_norm(x, layer["ffn_norm"], hp.rms_eps)
        ffn = layer["down"](gelu(layer["gate"](h)) * layer["up"](h))
        return rms_norm(ffn, layer["post_ffw_norm"], hp.rms_eps) + x

    def forward(self, tokens, hidden_states: list | None = None) -> np.ndarray:
        """Logits [tokens, vocab] for a prompt; appends each layer's output to hidden_states if given.
        self.timings holds the seconds per op class of this call ("total" included)."""
        self.timings.clear()
        start = time.perf_counter()
        tokens = np.asarray(tokens, dtype=np.int64)
        hp = self.hp
        x = self.embed(tokens)
        block = self._llama_block
        if hp.architecture == "gemma3":
            x = x * np.float32(np.sqrt(np.float32(hp.n_embd)))
            block = self._gemma3_block
        positions = np.arange(len(tokens), dtype=np.float32)
        for il, layer in enumerate(self.layers):
            x = block(layer, x, positions, il)
            if hidden_states is not None:
                hidden_states.append(x.copy())
        logits = self.output(rms_norm(x, self.output_norm, hp.rms_eps))
        self.timings["total"] = time.perf_counter() - start
        return logits
