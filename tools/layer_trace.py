"""Which op of a layer first parts our engine (llamacpp semantics, GPU) from llama.cpp CUDA, bit for bit.

llama.cpp CUDA prefills compare's evaluation text (flash attention on, the eval callback keeping every weight MUL_MAT,
every FLASH_ATTN_EXT node and each layer's l_out: the cuts fall after those nodes, so ggml-cuda's fusions of the norms,
RoPE and adds stay as in an uncaptured prefill). Our engine prefills the same tokens, recording what enters each GEMM
and the attention. Per layer, two kinds of rows:
  chain  ours end to end against llama.cpp's tensor (where the drift is);
  op     one op of ours on llama.cpp's own inputs against llama.cpp's output (which op differs):
         attn_norm (previous l_out -> attn_q's input), q/k chain (attn_q/attn_k output -> norm, RoPE, scale, f16 cache
         -> flash attention's q/k), v (attn_v output -> f16 cache), ffn (attn_output's output + residual -> post norm +
         add -> ffn norm -> ffn_gate's input), glu (gate and up outputs -> ffn_down's input), l_out (ffn_down's output
         + our sa_out -> post norm + add -> l_out).
Values are compared as bits: "differ" counts float32 (or f16) values whose bits differ, "values_differ" those whose
values differ (+0 and -0 alike: ggml's SCALE is fma(s, x, 0), which turns -0 into +0).

    python tools/layer_trace.py MODEL.gguf --tokens 512 --json out.json
"""

import argparse
import json
import sys

import numpy as np

from ggml_ciq import environment, native, quants
from ggml_ciq.errors import CiqError


def differ(ours, theirs) -> dict:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if ours.size != theirs.size:
        return {"differ": -1, "nmse": None, "note": f"sizes {ours.shape} vs {theirs.shape}"}
    ours, theirs = ours.reshape(-1), theirs.reshape(-1)
    kind = np.uint16 if theirs.dtype == np.float16 else np.uint32
    ours = ours.astype(theirs.dtype)
    count = int((ours.view(kind) != theirs.view(kind)).sum())
    values = int(np.count_nonzero(ours != theirs)) if count else 0  # +0 and -0 are one value
    nmse = quants.nmse(ours.astype(np.float64), theirs.astype(np.float64)) if count else 0.0
    return {"differ": count, "values_differ": values, "nmse": float(nmse)}


class Recorder:
    """Wraps the engine's ops: the inputs of each weight's GEMM (by name) and each attention call's q/k/v/out."""

    def __init__(self, ops):
        self.ops, self.inputs, self.attention = ops, {}, []
        linear, group, attention = ops.linear, getattr(ops, "linear_group", None), ops.attention

        def rec_linear(weight, x, add=None):
            self.inputs.setdefault(weight.name, []).append(ops.numpy(x))
            return linear(weight, x, add)

        def rec_group(weights, x, norm=None, adds=None):
            h = ops.numpy(x if norm is None else ops.rms_norm(x, norm[0], norm[1]))  # what the GEMMs multiply
            for w in weights:
                self.inputs.setdefault(w.name, []).append(h)
            return group(weights, x, norm=norm, adds=adds)

        def rec_attention(q, k_cache, v_cache, n_past, scale, window=0):
            out = attention(q, k_cache, v_cache, n_past, scale, window)
            t = q.shape[0]
            self.attention.append({"q": ops.numpy(q), "k": ops.numpy(k_cache)[:n_past + t],
                                   "v": ops.numpy(v_cache)[:n_past + t], "out": ops.numpy(out)})
            return out

        ops.linear, ops.attention = rec_linear, rec_attention
        if group is not None:
            ops.linear_group = rec_group


def trace(path: str, n_tokens: int, layers: int | None, device: str = "cuda") -> dict:
    from ggml_ciq.compare import _repeat_to, evaluation_text
    from ggml_ciq.engine import Transformer
    from ggml_ciq.llama_model import LlamaModel
    from ggml_ciq.model import ModelFile

    if device == "cuda" and native.device_count() < 1:
        raise CiqError("the trace runs our engine on a GPU, and there is none (--device cpu: against llama.cpp CPU)")
    llama = LlamaModel(path, device=device)
    try:
        tokens, _, _ = _repeat_to(llama, evaluation_text()[0], n_tokens)
        with llama.context_for(len(tokens), n_batch=512, flash_attn=True, eval_callback=True) as ctx:
            _, cap = ctx.capture(tokens, attention=True)
    finally:
        llama.close()
    if len(tokens) > 512:
        raise CiqError("the trace compares one micro-batch: give --tokens <= 512")
    engine = Transformer(ModelFile(path), device=device, n_ctx=-(-len(tokens) // 256) * 256, n_ubatch=512)
    if not engine.arch.gemma:
        raise CiqError("the trace follows Gemma 3's layer (q/k norms, post norms)")
    rec = Recorder(engine.ops)
    hidden: list = []
    engine.forward(tokens, hidden_states=hidden)
    ops, hp, t = engine.ops, engine.hp, len(tokens)
    n_layers = min(layers or hp.n_layer, hp.n_layer)
    rows = []

    def row(layer, kind, what, ours, theirs):
        r = {"layer": layer, "kind": kind, "what": what, **differ(ours, theirs)}
        rows.append(r)
        return r

    def cap_in(name):
        return cap.inputs(name)

    def cap_out(name):
        return cap.outputs(name)

    for il in range(n_layers):
        p, layer, call = f"blk.{il}", engine.layers[il], cap.attention[il]
        for w in ("attn_q", "attn_output", "ffn_gate", "ffn_down"):
            name = f"{p}.{w}.weight"
            row(il, "chain", f"{w} input", np.concatenate(rec.inputs[name]), cap_in(name))
        ours_att = rec.attention[il]
        for key in ("q", "k", "v"):
            theirs = getattr(call, key)
            row(il, "chain", f"attention {key}", ours_att[key], theirs[:ours_att[key].shape[0]])
        row(il, "chain", "attention out", ours_att["out"], call.out)
        row(il, "chain", "l_out", hidden[il], cap.hidden_state(il))
        # op rows: each op of ours on llama.cpp's inputs
        prev = cap.hidden_state(il - 1) if il > 0 else None
        if prev is not None:
            x = ops.rms_norm(prev, layer["attn_norm"], hp.rms_eps)
            row(il, "op", "attn_norm (l_out -> attn_q input)", ops.numpy(x), cap_in(f"{p}.attn_q.weight"))
        sliding = hp.is_sliding(il)
        base = hp.rope_base_sliding if sliding else hp.rope_base
        positions = ops.asarray(np.arange(t, dtype=np.int32))
        yq = cap_out(f"{p}.attn_q.weight").reshape(t, hp.n_head, hp.head_dim)
        yk = cap_out(f"{p}.attn_k.weight").reshape(t, hp.n_head_kv, hp.head_dim)
        yv = cap_out(f"{p}.attn_v.weight").reshape(t, hp.n_head_kv, hp.head_dim)
        q = engine._rope(layer, ops.asarray(yq), positions, base, "q_norm")
        q = ops.scale(q, engine._gemma_query_scale())
        row(il, "op", "q chain (attn_q output -> norm, rope, scale)", ops.numpy(q), call.q)
        k = engine._rope(layer, ops.asarray(yk), positions, base, "k_norm")
        cache = ops.zeros((t, hp.n_head_kv, hp.head_dim), np.float16)
        ops.kv_store(cache, 0, k)
        row(il, "op", "k chain (attn_k output -> norm, rope, f16)", ops.numpy(cache), call.k[:t])
        cache = ops.zeros((t, hp.n_head_kv, hp.head_dim), np.float16)
        ops.kv_store(cache, 0, ops.asarray(yv))
        row(il, "op", "v (attn_v output -> f16)", ops.numpy(cache), call.v[:t])
        kc, vc = ops.asarray(call.k), ops.asarray(call.v)
        out = ops.attention(ops.asarray(call.q), kc, vc, call.n_past, call.scale, call.window)
        row(il, "op", "attention (its q, k, v)", ops.numpy(out), call.out)
        row(il, "op", "attention out -> attn_output input", call.out, cap_in(f"{p}.attn_output.weight"))
        residual = prev
        if residual is None:  # layer 0: the scaled embeddings, ours (get_rows and scale are exact products)
            x0 = ops.get_rows(engine.token_embd, np.asarray(tokens, np.int32))
            residual = ops.numpy(ops.scale(x0, float(np.sqrt(np.float32(hp.n_embd)))))
            x = ops.rms_norm(residual, layer["attn_norm"], hp.rms_eps)
            row(il, "op", "embed, scale, attn_norm -> attn_q input", ops.numpy(x), cap_in(f"{p}.attn_q.weight"))
        sa_out = engine._norm_add(ops.asarray(cap_out(f"{p}.attn_output.weight")), layer["post_attention_norm"],
                                  ops.asarray(residual), fused=il != hp.n_layer - 1)  # as the engine's last layer
        ffn_in = ops.rms_norm(sa_out, layer["ffn_norm"], hp.rms_eps)
        row(il, "op", "post-attn norm + add, ffn_norm -> ffn_gate input", ops.numpy(ffn_in), cap_in(f"{p}.ffn_gate.weight"))
        glu = ops.glu(ops.asarray(cap_out(f"{p}.ffn_gate.weight")), ops.asarray(cap_out(f"{p}.ffn_up.weight")), "gelu")
        row(il, "op", "geglu -> ffn_down input", ops.numpy(glu), cap_in(f"{p}.ffn_down.weight"))
        l_out = engine._norm_add(ops.asarray(cap_out(f"{p}.ffn_down.weight")), layer["post_ffw_norm"], sa_out)
        row(il, "op", "post-ffw norm + add -> l_out", ops.numpy(l_out), cap.hidden_state(il))
    return {"model": path, "tokens": t, "rows": rows, "environment": environment.describe()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--layers", type=int, default=None, help="the first N layers (default: all)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: our CPU engine against llama.cpp CPU (whose flash attention, needed for the capture, "
                        "our CPU engine does not follow: its attention rows differ)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    try:
        if args.tokens < 1 or args.tokens > 512:
            raise CiqError(f"--tokens must be in 1..512 (one micro-batch), got {args.tokens}")
        result = trace(args.model, args.tokens, args.layers, args.device)
    except (CiqError, OSError) as exc:
        print(f"layer_trace: error: {exc}", file=sys.stderr)
        return 2
    first = {}
    for r in result["rows"]:
        mark = "" if r["differ"] == 0 else "  <-- differs" if r["values_differ"] else "  (sign of zero only)"
        print(f"layer {r['layer']:2d} {r['kind']:5s} {r['what']:52s} {r['differ']:9d} differ  NMSE {r['nmse']}{mark}")
        if r["values_differ"] and r["kind"] not in first:
            first[r["kind"]] = r
    for kind, r in first.items():
        print(f"first differing {kind} row: layer {r['layer']}, {r['what']} ({r['values_differ']} values, NMSE "
              f"{r['nmse']:.3g})")
    if not first:
        print("every row equal in value")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
