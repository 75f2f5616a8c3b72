"""Prefill through a GGUF model: the transformer is plain code, every op is a call on an ops object.

Architectures: llama (Llama 2/3, Mistral), qwen2 (q/k/v biases), qwen3 (per-head q/k RMSNorm), gemma3 (embedding
scale, q/k norms, post-attention/post-FFN norms, GELU gate, sliding-window layers, tied output); op order as in
llama.cpp's src/models/*.cpp. Activations are [tokens, features], weights [out features, in features].

The ops contract: ggml_ciq.ops (Ops, and the optional methods used where present); NumpyOps here, the float64
reference's ops (ggml_ciq.reference_ops) and ggml_ciq.ops.NativeOps in the native library implement it (arrays
rows-first, float32, K/V caches float16).
Prefill runs in micro-batches of n_ubatch tokens through a K/V cache, as llama.cpp does.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from .errors import (BackendError, CiqError, GGUFFileError, InvalidArgumentError, OutOfMemoryError, ShapeError,
                     UnsupportedTypeError)
from . import quants
from .model import ModelFile, Tensor
from .numpy_ops import NumpyOps
from .resources import free_host_bytes


@dataclass(frozen=True)
class Architecture:
    rope_neox: bool          # RoPE pairs (i, i + d/2) instead of (2i, 2i+1)
    qk_norm: bool = False    # RMSNorm over each head of q and k before RoPE
    gemma: bool = False      # embedding scale, post-attention/post-FFN norms, GELU gate, sliding-window layers


ARCHITECTURES = {
    "llama": Architecture(rope_neox=False),
    "qwen2": Architecture(rope_neox=True),
    "qwen3": Architecture(rope_neox=True, qk_norm=True),
    "gemma3": Architecture(rope_neox=True, qk_norm=True, gemma=True),
}


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
    n_ctx_train: int
    sliding_window: int = 0            # gemma3: layers with il % 6 != 5 see the last sliding_window positions
    rope_base_sliding: float = 10000.0

    @classmethod
    def of(cls, model: ModelFile) -> "Hyperparameters":
        c = model.config
        arch, meta = c.architecture, c.metadata
        if arch not in ARCHITECTURES:
            raise UnsupportedTypeError(f"{model.path}: architecture {arch} is not supported by the engine "
                                       f"(supported: {', '.join(ARCHITECTURES)})")
        if not (c.block_count and c.embedding_length and c.head_count):
            raise GGUFFileError(f"{model.path}: {arch}.block_count, embedding_length and attention.head_count "
                                f"must be set")
        head_dim = int(meta.get(f"{arch}.attention.key_length", c.embedding_length // c.head_count))
        rot = meta.get(f"{arch}.rope.dimension_count")
        if rot is not None and int(rot) != head_dim:
            raise UnsupportedTypeError(f"{model.path}: partial RoPE ({rot} of {head_dim} dims) is not supported")
        scaling = float(meta.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        if scaling != 1.0 or "rope_freqs.weight" in model.tensors:
            raise UnsupportedTypeError(f"{model.path}: RoPE frequency scaling is not supported")
        if float(meta.get(f"{arch}.final_logit_softcapping", 0.0) or 0.0):
            raise UnsupportedTypeError(f"{model.path}: final logit soft-capping is not supported")
        return cls(arch, c.block_count, c.embedding_length, c.head_count, c.head_count_kv, head_dim, c.rms_norm_eps,
                   c.rope_freq_base, c.vocab_size, c.context_length,
                   int(meta.get(f"{arch}.attention.sliding_window", 0)) if arch == "gemma3" else 0,
                   float(meta.get(f"{arch}.rope.freq_base_swa", 10000.0)))

    def is_sliding(self, layer: int) -> bool:
        return self.sliding_window > 0 and layer % 6 != 5


class Linear:
    """One weight matrix (+ optional bias): the ops' own weight (loaded here unless given: a stacked one, whose
    ``outputs`` are its matrices'), and the op class its time counts under."""

    def __init__(self, ops, tensor: Tensor, bias: Tensor | None = None, weight=None):
        self.tensor, self.weight = tensor, ops.load_weight(tensor) if weight is None else weight
        self.op_class = "keep-quant GEMM" if tensor.is_keep_quant else "other GEMM"
        self.bias = None if bias is None else ops.asarray(bias.dequantize().reshape(-1))  # uploaded once
        self.outputs = len(getattr(self.weight, "parts", ())) or 1


class LinearSet:
    """Weights on one input (q/k/v, gate/up): runs of consecutive matrices of one type and K that the ops stack into
    one weight (ops.stack_weights: one GEMM launch, the outputs apart; no biases), the rest one Linear each. ``parts``
    lists the Linears in order, a stacked one with ``outputs`` > 1."""

    def __init__(self, ops, pairs: list[tuple[Tensor, Tensor | None]]):
        stack = getattr(ops, "stack_weights", None)
        self.parts: list[Linear] = []
        for _, run in itertools.groupby(pairs, key=lambda p: (p[0].ggml_type, p[0].k) if stack else id(p)):
            run = list(run)
            stacked = stack([t for t, _ in run]) if len(run) > 1 and all(b is None for _, b in run) else None
            self.parts += ([Linear(ops, run[0][0], weight=stacked)] if stacked is not None else
                           [Linear(ops, t, b) for t, b in run])


def _rows(x, start: int, stop: int):
    return x.rows(start, stop) if hasattr(x, "rows") else x[start:stop]


def _view(x, shape):
    return x.view(shape) if hasattr(x, "rows") else x.reshape(shape)


SEMANTICS = ("llamacpp", "exact", "fast")


def make_ops(device="cpu", semantics: str = "llamacpp"):
    """The ops of one device in one semantics (docs/SEMANTICS.md, "Engine semantics").
    - "reference": ReferenceOps, the model the GGUF defines in float64 (semantics does not apply).
    - cpu, llamacpp: NumpyOps, llama.cpp x86 CPU's arithmetic bit for bit. cpu, exact: ExactCpuOps (float32 GEMMs on
      exactly dequantized weights, no activation quantization, float GELU, float64 RoPE angles and attention).
    - GPU, llamacpp: NativeOps with llama.cpp CUDA's GEMM semantics per token count, as llama.cpp picks them: MMQ's
      above 8 tokens (keep-quant `mma`, Q4_0/Q5_0/Q8_0 through the q32 variant), MMVQ's at 1..8 (`mmvq`); its flash
      attention's arithmetic (`mma_llamacpp`: f16 P V accumulation) and its norm/RoPE/GLU float order
      (op order llamacpp_cuda: its kernels' expressions under -use_fast_math). GPU, exact: K-quants in f16 semantics (`wgmma`; `mma` where the GPU has no
      wgmma), Q4_0/Q5_0/Q8_0 in f16 semantics too where wgmma takes them (Hopper, K a multiple of 64), else
      dequantized to bf16 (cuBLAS), float32 SIMT attention (q and p not rounded to f16).
    - fast: the fastest measured kernel per op, the path the speed claims are about (STATUS.md). GPU: AUTO GEMMs
      (`wgmma` above 8 tokens on Hopper, for Q4_0/Q5_0/Q8_0 too where K is a multiple of 64: 6x the q32 variant on
      Gemma 3 270M's, 41d23b3:bench/results/h200/profile-04ab8d8/; `mmvq` for the K-quants at 1..8 tokens, q32 for the
      32-block types there), mma attention.
      CPU: llama.cpp's arithmetic (NumpyOps; the exact float orders are also the fastest host paths we have)."""
    if semantics not in SEMANTICS:
        raise InvalidArgumentError(f"unknown semantics {semantics!r} (choose {' or '.join(SEMANTICS)})")
    if str(device) == "reference":
        from .reference_ops import ReferenceOps

        return ReferenceOps()
    if str(device) == "cpu":
        if semantics == "exact":
            from .reference_ops import ExactCpuOps

            return ExactCpuOps()
        return NumpyOps()
    try:
        from . import native
        from .ops import NativeOps
    except ImportError:
        raise BackendError(f"device {device}: this build has no native ops (ggml_ciq.ops)") from None
    if semantics == "llamacpp":
        return NativeOps(device, semantics="mmq", llamacpp_small_batches=True, attention_kernel="mma_llamacpp",
                         op_order="llamacpp_cuda")
    if semantics == "fast":
        return NativeOps(device, fuse=True)
    try:  # f16 semantics (the most exact keep-quant arithmetic) where the registry has a kernel for it on this device
        keep_quant = native.plan("auto", device, "f16", quants.Q4_K, 1, 256, 9).semantics
    except CiqError:
        keep_quant = "mmq"
    return NativeOps(device, semantics=keep_quant, attention_kernel="simt", q32_kernel=False)


class Transformer:
    """A llama, qwen2, qwen3 or gemma3 GGUF model, ready to prefill prompts on `ops` (default: make_ops(device,
    semantics)). n_ctx (default: the GGUF's context_length) bounds the prompt; the K/V cache (`self.kv_cache`, per layer
    a (k, v) pair of float16 [positions, n_head_kv, head_dim]) grows to the longest prompt seen; after forward its
    first `n_past` positions hold the prompt's keys and values."""

    def __init__(self, model: ModelFile, device="cpu", ops=None, n_ctx: int | None = None, n_ubatch: int = 512,
                 semantics: str = "llamacpp"):
        self.model, self.hp = model, Hyperparameters.of(model)
        self.arch = ARCHITECTURES[self.hp.architecture]
        self.ops = ops = make_ops(device, semantics) if ops is None else ops
        if hasattr(ops, "check_memory"):  # ops whose weights may not fit (the float64 reference): said up front
            ops.check_memory(model)
        self.n_ctx = int(n_ctx or self.hp.n_ctx_train or 4096)
        if n_ubatch < 1 or self.n_ctx < 1:
            raise ShapeError(f"n_ctx ({self.n_ctx}) and n_ubatch ({n_ubatch}) must be >= 1")
        self.n_ubatch = n_ubatch
        self.kv_cache: list[tuple] = []
        self._graphs: dict = {}  # forward(graph=True): per micro-batch step, (Graph, its token-id buffer)
        self._graph_arena = None  # the buffers every graph of this engine allocates (they run one at a time)
        self.graph_error: str | None = None  # why a micro-batch's capture failed (it then stays eager)
        self.n_past = 0
        self.timings = ops.timings

        hp = self.hp
        if hp.n_head_kv < 1 or hp.n_head % hp.n_head_kv:
            raise GGUFFileError(f"{model.path}: {hp.n_head} attention heads cannot share {hp.n_head_kv} K/V heads")

        def tensor(name, *shape):
            """The tensor `name`, whose shape must be `shape` ([rows, cols] or [n]; None: any), as llama.cpp checks."""
            if name not in model.tensors:
                raise GGUFFileError(f"{model.path}: tensor {name}, needed by the {hp.architecture} "
                                    f"architecture, is missing")
            t = model.tensors[name]
            if len(t.shape) != len(shape) or any(want not in (None, got) for want, got in zip(shape, t.shape)):
                raise GGUFFileError(f"{model.path}: tensor {name} is {' x '.join(map(str, t.shape))}; the "
                                    f"{hp.architecture} hyperparameters need "
                                    f"{' x '.join('?' if n is None else str(n) for n in shape)}")
            return t

        def optional(name, *shape):
            return tensor(name, *shape) if name in model.tensors else None

        def pair(name, rows, cols):
            """(weight tensor, its bias or None) of a linear layer."""
            return tensor(f"{name}.weight", rows, cols), optional(f"{name}.bias", rows)

        def linear(name, rows, cols):
            return Linear(ops, *pair(name, rows, cols))

        def norm(name, n=hp.n_embd):
            return ops.asarray(tensor(name, n).dequantize().reshape(-1))

        e, q_rows, kv_rows = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        self.token_embd = tensor("token_embd.weight", hp.n_vocab, e)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}"
            gate = pair(f"{p}.ffn_gate", None, e)
            ff = gate[0].rows
            layer = dict(attn_norm=norm(f"{p}.attn_norm.weight"),
                         qkv=LinearSet(ops, [pair(f"{p}.attn_q", q_rows, e), pair(f"{p}.attn_k", kv_rows, e),
                                             pair(f"{p}.attn_v", kv_rows, e)]),
                         o=linear(f"{p}.attn_output", e, q_rows), ffn_norm=norm(f"{p}.ffn_norm.weight"),
                         gate_up=self._gate_up(gate, pair(f"{p}.ffn_up", ff, e)),
                         down=linear(f"{p}.ffn_down", e, ff))
            if self.arch.qk_norm:
                layer.update(q_norm=norm(f"{p}.attn_q_norm.weight", hp.head_dim),
                             k_norm=norm(f"{p}.attn_k_norm.weight", hp.head_dim))
            if self.arch.gemma:
                layer.update(post_attention_norm=norm(f"{p}.post_attention_norm.weight"),
                             post_ffw_norm=norm(f"{p}.post_ffw_norm.weight"))
            self.layers.append(layer)
        self.output_norm = norm("output_norm.weight")
        tied = "output.weight" not in model.tensors
        output = self.token_embd if tied else tensor("output.weight", hp.n_vocab, e)
        self.output = Linear(ops, output, optional("output.bias", hp.n_vocab))

    # -- building blocks ----------------------------------------------------------------------------------------
    def _linear(self, lin: Linear, x, add=None):
        """lin(x) (+ its bias) (+ add, the residual): the add from the GEMM's epilogue where the ops fuse it (no
        bias between), else an add of its own; the same values."""
        fused = add is not None and lin.bias is None and getattr(self.ops, "fuse", False)
        with self.ops.timer(lin.op_class):
            y = self.ops.linear(lin.weight, x, add) if fused else self.ops.linear(lin.weight, x)
        if lin.bias is not None:  # ggml_add broadcasts the bias over rows
            y = self.ops.add(y, lin.bias)
        return y if add is None or fused else self.ops.add(y, add)

    def _linears(self, lins: LinearSet | list, x, norm=None) -> list:
        """Several weights on one input (a LinearSet's outputs in order), of rms_norm(x) * norm where norm is given:
        where the ops offer linear_group and it takes these weights (ops.groups), the input is quantized once for
        all of them, with the norm fused into that conversion where the ops fuse (the same values)."""
        ops, eps = self.ops, self.hp.rms_eps
        parts = lins.parts if isinstance(lins, LinearSet) else lins
        group, groups = getattr(ops, "linear_group", None), getattr(ops, "groups", None)
        if group is None or groups is None or not groups([p.weight for p in parts]):
            h, out = (x if norm is None else ops.rms_norm(x, norm, eps)), []
            for p in parts:  # a stacked weight (ops that stack group it alone) beside one they do not group
                if p.outputs == 1:
                    out.append(self._linear(p, h))
                else:
                    with ops.timer(p.op_class):
                        out += group([p.weight], h)
            return out
        with ops.timer(parts[0].op_class):
            ys = group([p.weight for p in parts], x, **({} if norm is None else {"norm": (norm, eps)}))
        ys, out = iter(ys), []
        for p in parts:
            out += [next(ys) for _ in range(p.outputs)]
            if p.bias is not None:  # one output: a bias only stays on a weight apart
                out[-1] = ops.add(out[-1], p.bias)
        return out

    def _heads(self, x, n_heads: int):
        return _view(x, (x.shape[0], n_heads, self.hp.head_dim))

    def _heads_norm(self, x, weight):
        t, h, d = x.shape
        return _view(self.ops.rms_norm(_view(x, (t * h, d)), weight, self.hp.rms_eps), (t, h, d))

    def _attention(self, layer: dict, il: int, x, positions, n_past: int, residual=None):
        """Self-attention of one micro-batch on the layer input x: its norm, q/k/v, their norms and RoPE, the K/V
        cache, the output projection (+ residual where given)."""
        ops, hp = self.ops, self.hp
        sliding = hp.is_sliding(il)
        base = hp.rope_base_sliding if sliding else hp.rope_base
        q, k, v = self._linears(layer["qkv"], x, norm=layer["attn_norm"])
        q, k, v = self._heads(q, hp.n_head), self._heads(k, hp.n_head_kv), self._heads(v, hp.n_head_kv)
        k_cache, v_cache = self.kv_cache[il]
        rope_kv = getattr(ops, "rope_kv_store", None) if getattr(ops, "fuse", False) else None
        if rope_kv is not None and not self.arch.qk_norm:  # q/k roped and k/v stored in one op: the same values
            q = rope_kv(q, k, v, positions, base, self.arch.rope_neox, k_cache, v_cache, n_past)
        else:
            q, k = self._rope(layer, q, positions, base, "q_norm"), self._rope(layer, k, positions, base, "k_norm")
            ops.kv_store(k_cache, n_past, k)
            ops.kv_store(v_cache, n_past, v)
        if self.arch.gemma:  # gemma scales q itself (f_attention_scale) and attends with scale 1
            q, scale = ops.scale(q, self._gemma_query_scale()), 1.0
        else:
            scale = 1.0 / float(np.sqrt(np.float32(hp.head_dim)))
        with ops.timer("attention"):
            attn = ops.attention(q, k_cache, v_cache, n_past, scale, hp.sliding_window if sliding else 0)
        return self._linear(layer["o"], attn, residual)

    def _rope(self, layer: dict, x, positions, base: float, norm: str):
        """RoPE of q or k [T, heads, D], after its per-head RMS norm where the architecture has one: one op where the
        ops offer it (llama.cpp CUDA fuses RMS_NORM + MUL + ROPE, in another float order than its separate kernels)."""
        ops, neox = self.ops, self.arch.rope_neox
        if not self.arch.qk_norm:
            return ops.rope(x, positions, base, neox)
        fused = getattr(ops, "rms_norm_rope", None)
        if fused is not None:
            return fused(x, layer[norm], self.hp.rms_eps, positions, base, neox)
        return ops.rope(self._heads_norm(x, layer[norm]), positions, base, neox)

    def _gemma_query_scale(self) -> float:
        hp = self.hp
        dim = hp.n_embd // hp.n_head if hp.n_layer == 62 else hp.head_dim  # Gemma 3 27B: n_embd / n_head
        return float(np.float32(1.0) / np.sqrt(np.float32(dim)))

    def _gate_up(self, gate: tuple, up: tuple):
        """The FFN's gate/up: one Linear of both interleaved whose GEMM gives their GLU where the ops stack them so
        (stack_glu, no biases), else a LinearSet."""
        stack = getattr(self.ops, "stack_glu", None)
        weight = stack(gate[0], up[0]) if stack is not None and gate[1] is None and up[1] is None else None
        return Linear(self.ops, gate[0], weight=weight) if weight is not None else LinearSet(self.ops, [gate, up])

    def _ffn(self, layer: dict, x, residual=None):
        """The layer's FFN on x: its norm, gate/up, their GLU, down (+ residual where given): the GLU from gate/up's
        GEMM where the ops stacked them for it (linear_glu), else fused into down's activation conversion where the ops
        offer it (glu_linear: the same values; the GLU's time counts to down's GEMM class where it is fused in), the
        residual into down's epilogue where they fuse."""
        kind, down = "gelu" if self.arch.gemma else "silu", layer["down"]
        if isinstance(layer["gate_up"], Linear):  # stack_glu's weight: the GLU from its GEMM's epilogue
            lin = layer["gate_up"]
            with self.ops.timer(lin.op_class):
                h = self.ops.linear_glu(lin.weight, x, kind, norm=(layer["ffn_norm"], self.hp.rms_eps))
            return self._linear(down, h, residual)
        gate, up = self._linears(layer["gate_up"], x, norm=layer["ffn_norm"])
        glu_linear = getattr(self.ops, "glu_linear", None)
        if glu_linear is None or down.bias is not None:
            return self._linear(down, self.ops.glu(gate, up, kind), residual)
        fused = residual is not None and getattr(self.ops, "fuse", False)  # as _linear's add
        y = glu_linear(down.weight, gate, up, kind, down.op_class, add=residual if fused else None)
        return y if residual is None or fused else self.ops.add(y, residual)

    def _norm_add(self, x, weight, residual, fused: bool = True):
        """rms_norm(x) * weight + residual: one op where the ops offer it and llama.cpp's graph lets ggml-cuda fuse
        it (fused=False: the add rounds on its own, as where another node sits between MUL and ADD)."""
        op = getattr(self.ops, "rms_norm_add", None) if fused else None
        if op is not None:
            return op(x, weight, self.hp.rms_eps, residual)
        return self.ops.add(self.ops.rms_norm(x, weight, self.hp.rms_eps), residual)

    def _block(self, layer: dict, il: int, x, positions, n_past: int, out_rows: tuple | None = None):
        """One layer. out_rows (the last layer only): llama.cpp's out_ids, the rows whose logits are wanted, taken
        after the attention (its ggml_get_rows of cur and the residual); (a, a) leaves no row: None is returned."""
        gemma = self.arch.gemma
        # llama: attn + x, the residual added as the o projection's (values as an add after it, on every row)
        attn = self._attention(layer, il, x, positions, n_past, residual=None if gemma else x)
        last = out_rows is not None
        if last:
            if out_rows[0] == out_rows[1]:
                return None
            attn, x = _rows(attn, *out_rows), _rows(x, *out_rows)
        if gemma:
            # In the last layer llama.cpp's graph has the residual's GET_ROWS between MUL and ADD: not fused there.
            x = self._norm_add(attn, layer["post_attention_norm"], x, fused=not last)
            return self._norm_add(self._ffn(layer, x), layer["post_ffw_norm"], x)
        return self._ffn(layer, attn, residual=attn)

    # -- prefill --------------------------------------------------------------------------------------------------
    def reserve(self, n_tokens: int) -> None:
        """The K/V cache for a prompt of n_tokens: ShapeError past n_ctx, OutOfMemoryError (before allocating) when
        a host cache would not fit the free memory."""
        if n_tokens > self.n_ctx:
            raise ShapeError(f"prompt of {n_tokens} tokens is longer than the context ({self.n_ctx} tokens)")
        self._ensure_cache(n_tokens)

    def _ensure_cache(self, n_tokens: int) -> None:
        """One (k, v) pair per layer (float16; float64 in the reference), grown (in steps of 256 positions, up to
        n_ctx) to hold n_tokens."""
        have = self.kv_cache[0][0].shape[0] if self.kv_cache else 0
        if have >= n_tokens:
            return
        size = min(self.n_ctx, -(-n_tokens // 256) * 256)
        shape = (size, self.hp.n_head_kv, self.hp.head_dim)
        dtype = np.dtype(getattr(self.ops, "kv_cache_dtype", np.float16))  # f16 but in the float64 reference
        need = 2 * self.hp.n_layer * size * self.hp.n_head_kv * self.hp.head_dim * dtype.itemsize
        if str(getattr(self.ops, "device", "cpu")) in ("cpu", "-1", "reference"):  # the host: Linux overcommits
            free = free_host_bytes()
            if need > free:
                raise OutOfMemoryError(f"the K/V cache for {n_tokens} tokens needs {need / 2**30:.1f} GiB, "
                                       f"{free / 2**30:.1f} GiB of host memory is free")
        self.drop_graphs()  # they write the old cache
        self.kv_cache = []  # free the old cache first
        self.kv_cache = [(self.ops.zeros(shape, dtype), self.ops.zeros(shape, dtype))
                         for _ in range(self.hp.n_layer)]

    def kv_cache_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv_cache)

    def check_tokens(self, tokens) -> np.ndarray:
        """Token ids as int32; ShapeError for an empty prompt, ids outside the vocabulary, or more than n_ctx."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or len(tokens) == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise ShapeError(f"tokens must be a non-empty 1-D list of integer ids, got shape {tokens.shape}")
        n_vocab = self.token_embd.rows
        if tokens.min() < 0 or tokens.max() >= n_vocab:
            raise ShapeError(f"token ids must be in [0, {n_vocab}), got {tokens.min()}..{tokens.max()}")
        if len(tokens) > self.n_ctx:
            raise ShapeError(f"prompt of {len(tokens)} tokens is longer than the context ({self.n_ctx} tokens)")
        return tokens.astype(np.int32)

    def forward(self, tokens, hidden_states: list | None = None, all_logits: bool = False,
                graph: bool = False) -> np.ndarray:
        """Prefill a prompt from position 0: logits float32 [1, vocab] for the last token ([tokens, vocab] with
        all_logits). hidden_states (a list) gets each layer's output for all tokens, float32 [tokens, n_embd].
        ops.timings holds the seconds per op class of this call: "keep-quant GEMM", "other GEMM", "attention",
        "rest" (everything else) and "total".
        graph=True (GPU ops): each micro-batch runs as a CUDA graph, captured after its first eager run and replayed
        whenever the same micro-batch (tokens, position, what is output) comes again, with new token ids: the same
        kernels on the same buffers, so the same values as eager, without the per-op Python and launch costs. Its
        op-class timings are not kept (only "total"), and the dispatch counters do not see replays."""
        ops, hp = self.ops, self.hp
        tokens = self.check_tokens(tokens)
        if graph and (not hasattr(ops, "graph_capture") or getattr(ops, "device", -1) < 0):
            raise InvalidArgumentError("graph=True needs the engine on a GPU (CUDA graphs)")
        if graph and hidden_states is not None:
            raise InvalidArgumentError("graph=True does not keep hidden states (each layer's output is inside the graph)")
        n = len(tokens)
        ops.timings.clear()
        start_time = time.perf_counter()
        self._ensure_cache(n)
        layer_outputs = [[] for _ in self.layers] if hidden_states is not None else None
        out = None  # float32 [tokens or 1, vocab], filled micro-batch by micro-batch
        every_row = all_logits or hidden_states is not None
        steps = [(tokens[start:start + self.n_ubatch], (start, min(self.n_ubatch, n - start),
                                                        start + self.n_ubatch >= n, every_row, all_logits))
                 for start in range(0, n, self.n_ubatch)]
        uploaded = set()
        if graph:  # every replay's token ids first: no copy between two replays waits for the one before
            for ids, step in steps:
                entry = self._graphs.get(step)
                if entry is not None and entry[0] is not None:
                    ops.upload(entry[1], ids)
                    uploaded.add(step)
        results = []
        for ids, step in steps:
            if graph:
                logits = self._graph_step(ids, step, step in uploaded)
            else:
                logits = self._step(ids, self._positions(step), step, layer_outputs)
                logits = None if logits is None else ops.numpy(logits)  # eager: each micro-batch's buffers free again
            if logits is not None:
                results.append((step[0], logits))
        for start, logits in results:  # graphs: read after the last replay (each graph's outputs are its own)
            logits = ops.numpy(logits)
            if out is None:
                out = np.empty((n if all_logits else 1, logits.shape[-1]), np.float32)
            first = start if all_logits else 0
            out[first:first + len(logits)] = logits
        self.n_past = n
        if layer_outputs is not None:
            hidden_states.extend(np.concatenate(parts) for parts in layer_outputs)
        total = time.perf_counter() - start_time
        ops.settle_timings()
        ops.timings["rest"] = max(0.0, total - sum(v for k, v in ops.timings.items() if k != "rest"))
        ops.timings["total"] = total
        return out

    def _step(self, ids, positions, step: tuple, layer_outputs=None):
        """One micro-batch from its token ids (host, or int32 on the device) and positions: its logits (on the ops'
        device), or None where none are wanted. step = (start, tokens, final, every_row, all_logits)."""
        ops, hp = self.ops, self.hp
        start, count, final, every_row, all_logits = step
        x = ops.get_rows(self.token_embd, ids)
        if self.arch.gemma:
            x = ops.scale(x, float(np.sqrt(np.float32(hp.n_embd))))
        for il, layer in enumerate(self.layers):
            # llama.cpp's out_ids: after the last layer's attention only the rows whose logits are wanted go on
            # (the last token of the last micro-batch unless all_logits); its graph takes them in every case
            out_rows = None
            if il == len(self.layers) - 1:
                out_rows = (0, count) if every_row else (count - 1, count) if final else (0, 0)
            x = self._block(layer, il, x, positions, start, out_rows)
            if layer_outputs is not None:
                layer_outputs[il].append(ops.numpy(x).astype(np.float32))
        if not (all_logits or final):
            return None
        # every row of the micro-batch, or its last: out_rows took it, or (hidden states wanted) take it here
        rows = x if all_logits or not every_row else _rows(x, count - 1, count)
        return self._linears([self.output], rows, norm=self.output_norm)[0]

    def _positions(self, step: tuple):
        """The micro-batch's positions, int32 on the ops' device."""
        return self.ops.asarray(np.arange(step[0], step[0] + step[1], dtype=np.int32))

    def _graph_step(self, ids, step: tuple, uploaded: bool = False):
        """_step as a CUDA graph: the first time a step comes, it runs eagerly (sizing every buffer) and is then
        captured with its token ids and positions in fixed device buffers; later it is replayed after new ids are
        copied in (already, when uploaded). A graph gone stale (the library's scratch moved) is captured again."""
        ops = self.ops
        start, count = step[0], step[1]
        entry = self._graphs.get(step)
        if entry is not None and entry[0] is None:  # its capture failed: eager (self.graph_error says why)
            return self._step(ids, self._positions(step), step)
        if entry is not None:
            g, ids_dev = entry
            if not uploaded:
                ops.upload(ids_dev, ids)
            try:
                g.launch()
                return g.outputs
            except CiqError as exc:
                if "stale" not in str(exc):
                    raise
                self.drop_graphs()
        ids_dev = ops.asarray(np.asarray(ids, np.int32))
        positions = self._positions(step)
        logits = self._step(ids_dev, positions, step)  # this call's result, and the warm-up of every buffer size
        if self._graph_arena is None:
            self._graph_arena = ops.graph_arena()  # one for all of them: they never run at the same time
        try:
            with ops.graph_capture(self._graph_arena) as g:
                g.outputs = self._step(ids_dev, positions, step)
        except CiqError as exc:  # this step stays eager; the result above stands
            self.graph_error = f"micro-batch at {start} ({count} tokens): {exc}"
            self._graphs[step] = (None, None)
            return logits
        g.inputs = (ids_dev, positions)
        self._graphs[step] = (g, ids_dev)
        return logits

    def drop_graphs(self) -> None:
        """Free the captured graphs and their buffers (the K/V cache they write is about to move, or one went
        stale)."""
        graphs, self._graphs = self._graphs, {}
        for g, _ in graphs.values():
            if g is not None:
                g.close()
        if self._graph_arena is not None:
            self._graph_arena.close()
            self._graph_arena = None
