"""Prefill through a GGUF model: the transformer is plain code, the matrix products are calls.

Q4_K/Q6_K weights go through libggml_ciq's keep-quant GEMM (on the CPU here: llama.cpp CPU semantics); other
weight types are dequantized once and multiplied in float32. Architectures: llama (Llama 2/3, Mistral).
Activations are [tokens, features] float32, as everywhere in ggml_ciq.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import native, quants
from .errors import ShapeError, UnsupportedTypeError
from .model import ModelFile, Tensor

ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class Hyperparameters:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    n_vocab: int

    @classmethod
    def of(cls, model: ModelFile) -> "Hyperparameters":
        c = model.config
        if c.architecture not in ARCHITECTURES:
            raise UnsupportedTypeError(f"{model.path}: architecture {c.architecture} is not supported by the engine "
                                       f"(supported: {', '.join(ARCHITECTURES)})")
        rot = c.metadata.get(f"{c.architecture}.rope.dimension_count")
        head_dim = c.embedding_length // c.head_count
        if rot is not None and int(rot) != head_dim:
            raise UnsupportedTypeError(f"{model.path}: partial RoPE ({rot} of {head_dim} dims) is not supported")
        return cls(c.block_count, c.embedding_length, c.head_count, c.head_count_kv, head_dim, c.rms_norm_eps,
                   c.rope_freq_base, c.vocab_size)


class Linear:
    """One weight matrix: keep-quant GEMM for Q4_K/Q6_K, a float32 matrix product otherwise."""

    def __init__(self, tensor: Tensor, device="cpu"):
        self.tensor, self.device = tensor, device
        self.keep_quant = tensor.is_keep_quant
        self.dense = None if self.keep_quant else tensor.dequantize()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.keep_quant:
            return native.gemm(self.tensor, x, variant="auto", device=self.device, semantics="cpu")
        return x @ self.dense.T


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """ggml's rms_norm then mul: squares summed in double, scale = 1/sqrtf(mean + eps) in float32."""
    mean = ((x * x).astype(np.float64).sum(-1, keepdims=True) / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale) * weight


def rope(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """llama.cpp's NORM RoPE on [tokens, heads, head_dim]: pairs (2i, 2i+1) rotate by pos * base^(-2i/d), with
    theta stepped in float32 as ggml's rope cache does (theta *= powf(base, -2/d))."""
    d = x.shape[-1]
    theta_scale = np.float32(np.power(np.float64(np.float32(base)), np.float64(np.float32(-2.0) / np.float32(d))))
    theta = np.empty((len(positions), d // 2), np.float32)
    theta[:, 0] = positions
    for i in range(1, d // 2):
        theta[:, i] = theta[:, i - 1] * theta_scale
    cos = np.cos(theta.astype(np.float64)).astype(np.float32)[:, None, :]
    sin = np.sin(theta.astype(np.float64)).astype(np.float32)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal grouped-query attention: q [T, H, D], k/v [T, Hkv, D] -> [T, H*D]."""
    t, h, d = q.shape
    group = h // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.float32(np.sqrt(d))
    scores = np.where(np.tril(np.ones((t, t), bool))[None], scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", scores, v).reshape(t, h * d).astype(np.float32)


class Transformer:
    """A Llama-architecture model loaded from a GGUF file."""

    def __init__(self, model: ModelFile, device="cpu"):
        self.model, self.hp = model, Hyperparameters.of(model)

        def w(name):
            return Linear(model.tensor(name), device)

        def norm(name):
            return model.tensor(name).dequantize().reshape(-1)

        self.token_embd = model.tensor("token_embd.weight")
        self.layers = [dict(attn_norm=norm(f"blk.{i}.attn_norm.weight"), q=w(f"blk.{i}.attn_q.weight"),
                            k=w(f"blk.{i}.attn_k.weight"), v=w(f"blk.{i}.attn_v.weight"),
                            o=w(f"blk.{i}.attn_output.weight"), ffn_norm=norm(f"blk.{i}.ffn_norm.weight"),
                            gate=w(f"blk.{i}.ffn_gate.weight"), up=w(f"blk.{i}.ffn_up.weight"),
                            down=w(f"blk.{i}.ffn_down.weight")) for i in range(self.hp.n_layer)]
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

    def forward(self, tokens, hidden_states: list | None = None) -> np.ndarray:
        """Logits [tokens, vocab] for a prompt; appends each layer's output to hidden_states if given."""
        tokens = np.asarray(tokens, dtype=np.int64)
        hp = self.hp
        x = self.embed(tokens)
        positions = np.arange(len(tokens), dtype=np.float64)
        for layer in self.layers:
            h = rms_norm(x, layer["attn_norm"], hp.rms_eps)
            q = rope(layer["q"](h).reshape(len(tokens), hp.n_head, hp.head_dim), positions, hp.rope_base)
            k = rope(layer["k"](h).reshape(len(tokens), hp.n_head_kv, hp.head_dim), positions, hp.rope_base)
            v = layer["v"](h).reshape(len(tokens), hp.n_head_kv, hp.head_dim)
            x = x + layer["o"](attention(q, k, v))
            h = rms_norm(x, layer["ffn_norm"], hp.rms_eps)
            gate = layer["gate"](h)
            x = x + layer["down"]((gate / (1.0 + np.exp(-gate)) * layer["up"](h)).astype(np.float32))
            if hidden_states is not None:
                hidden_states.append(x.copy())
        return self.output(rms_norm(x, self.output_norm, hp.rms_eps))
