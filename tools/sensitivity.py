"""How far a model's logits move when one op class changes its float order (CPU only, no GPU needed).

The CPU engine (NumpyOps) reproduces llama.cpp CPU's logits bit for bit; each perturbation below swaps one op class
for another legitimate implementation (the semantics llama.cpp CUDA or our GPU engine use) and reports the logits
agreement against llama.cpp CPU (and the hidden state after each layer against the unperturbed engine's), next to
llama.cpp against itself with flash attention on and with 32-token micro-batches. It answers: which agreement can
an implementation that is not bit-exact expect on this model?

Usage: python3 tools/sensitivity.py MODEL.gguf [tokens] [perturbation ...]     (defaults: 512, all)
"""

import sys
import time

import numpy as np

from ggml_ciq import native, quants
from ggml_ciq.bench import cpu_environment
from ggml_ciq.compare import logits_agreement, prompt_tokens
from ggml_ciq.engine import Transformer
from ggml_ciq.llama_model import LlamaModel
from ggml_ciq.model import ModelFile
from ggml_ciq.numpy_ops import NumpyOps

F = np.float32


def flash_attention(q, k_cache, v_cache, n_past: int, scale: float, window: int) -> np.ndarray:
    """FlashAttention-2 semantics on the f16 cache: q rounded to f16, scores in float32, P = exp(s - max) rounded to
    f16 for P V, the row sum over the unrounded P (one key tile: the online rescaling is rounding-level)."""
    t, h, d = q.shape
    n, group = n_past + t, h // k_cache.shape[1]
    pos, key = n_past + np.arange(t)[:, None], np.arange(n)[None, :]
    visible = (key <= pos) & ((pos - key < window) if window else True)
    q16 = q.astype(np.float16).astype(np.float64)
    out = np.empty((t, h, d), F)
    for head in range(h):
        k = k_cache[:n, head // group].astype(np.float64)
        v = v_cache[:n, head // group].astype(np.float64)
        s = np.where(visible, (q16[:, head] @ k.T).astype(F) * F(scale), -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True)).astype(F)
        out[:, head] = (p.astype(np.float16).astype(np.float64) @ v).astype(F) / p.sum(-1, keepdims=True, dtype=F)
    return out.reshape(t, h * d)


class PerturbedOps(NumpyOps):
    """NumpyOps with some op classes in other semantics: keep-quant "mmq" or "f16", q32 "mmq" or "bf16" (the
    weights and activations rounded to bf16, float32 sums), attention "flash", gelu "float" (no f16 table),
    rms_norm "f32" (squares summed in float32, not double)."""

    def __init__(self, **choices):
        super().__init__()
        self.choices = choices

    def load_weight(self, tensor):
        weight = super().load_weight(tensor)
        weight.raw_blocks = np.ascontiguousarray(tensor.raw())
        return weight

    def linear(self, w, x):
        kq, q32 = self.choices.get("keep_quant"), self.choices.get("q32")
        if w.kind == "keep-quant" and kq == "mmq":
            return self._track(w.problem.run(x, variant="cpu", semantics="mmq", poison=False))
        if w.kind == "keep-quant" and kq == "f16":
            return self._track(quants.gemm_f16_semantics(w.ggml_type, w.raw_blocks, w.rows, w.k, x).astype(F))
        if w.kind == "q32" and q32 == "mmq":
            return self._track(native.gemm_q32(w.raw, x, w.ggml_type, w.rows, w.k, "cpu", semantics="mmq"))
        if w.kind == "q32" and q32 == "bf16":
            dense = quants.round_bf16(quants.dequantize(w.ggml_type, w.raw, w.rows, w.k)).astype(np.float64)
            return self._track((quants.round_bf16(x).astype(np.float64) @ dense.T).astype(F))
        return super().linear(w, x)

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float, window: int):
        if self.choices.get("attention") == "flash":
            return self._track(flash_attention(q, k_cache, v_cache, n_past, scale, window))
        return super().attention(q, k_cache, v_cache, n_past, scale, window)

    def glu(self, gate, up, kind: str):
        if kind == "gelu" and self.choices.get("gelu") == "float":
            act = F(0.5) * gate * (F(1) + np.tanh(F(0.7978845608028654) * gate * (F(1) + F(0.044715) * gate * gate)))
            return self._track(act * up)
        return super().glu(gate, up, kind)

    def rms_norm(self, x, weight, eps: float):
        if self.choices.get("rms_norm") != "f32":
            return super().rms_norm(x, weight, eps)
        y = x * (F(1) / np.sqrt((x * x).sum(-1, keepdims=True, dtype=F) / F(x.shape[-1]) + F(eps)))
        return self._track(y if weight is None else y * weight)


PERTURBATIONS = {
    "none": {},
    "rms_norm=f32": dict(rms_norm="f32"),
    "gelu=float": dict(gelu="float"),
    "attention=flash": dict(attention="flash"),
    "keep_quant=mmq": dict(keep_quant="mmq"),
    "q32=mmq": dict(q32="mmq"),
    "cuda-like (all five)": dict(rms_norm="f32", gelu="float", attention="flash", keep_quant="mmq", q32="mmq"),
}


def main(path: str, n_tokens: int = 512, names=None) -> None:
    for name in names or ():
        if name not in PERTURBATIONS:
            sys.exit(f"sensitivity: unknown perturbation {name!r} (one of: {', '.join(PERTURBATIONS)})")
    threads = native.build_info()["threads"]
    native.set_num_threads(threads)
    runs = {}
    with LlamaModel(path, device="cpu", threads=threads) as llama:
        tokens = prompt_tokens(llama, n_tokens, None)
        for fa, ubatch in ((False, 512), (True, 512), (False, 32)):
            with llama.context_for(len(tokens), n_batch=ubatch, flash_attn=fa) as ctx:
                runs[fa, ubatch] = ctx.prefill(tokens, all_logits=True)
    reference = runs[False, 512]

    def line(label, logits, seconds=None):
        a = logits_agreement(logits.reshape(reference.shape), reference)
        took = f"  ({seconds:.0f} s)" if seconds is not None else ""
        print(f"{label:38s} top-1 {a['top1']:.4f}  KLD mean {a['kld_mean']:.2e} max {a['kld_max']:.2e}  "
              f"NMSE {a['nmse']:.2e}{took}", flush=True)

    env = cpu_environment(threads)
    print(f"# {path.rsplit('/', 1)[-1]}, {len(tokens)} tokens (compare.TEXT), against llama.cpp CPU (flash attention "
          f"off, n_ubatch 512); ggml-ciq {env['ggml_ciq_commit']}, llama.cpp {env['llamacpp_commit']}, "
          f"{env['device']}, {threads} threads")
    line("llama.cpp, flash attention on", runs[True, 512])
    line("llama.cpp, n_ubatch 32", runs[False, 32])
    model = ModelFile(path)
    exact = None  # the unperturbed engine's hidden states (llama.cpp's, bit for bit), for the per-layer line
    for name in ["none"] + [n for n in names or PERTURBATIONS if n != "none"]:
        start = time.perf_counter()
        engine = Transformer(model, ops=PerturbedOps(**PERTURBATIONS[name]), n_ctx=len(tokens), n_ubatch=512)
        hidden = []
        line(f"ggml-ciq CPU engine, {name}", engine.forward(tokens, hidden, all_logits=True),
             time.perf_counter() - start)
        if exact is None:
            exact = hidden
        else:
            print("    hidden-state NMSE after each layer: " +
                  " ".join(f"{quants.nmse(a, b):.1e}" for a, b in zip(hidden, exact)), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 512, sys.argv[3:])
