"""One small tail-shaped run of every GPU kernel (quantizers, the engine's ops and attention kernels included), for
compute-sanitizer.

Usage: compute-sanitizer --tool memcheck python3 tools/sanitize_case.py [variant ... | wgmma-block32 | engine |
attention-split | attention-wgmma | attention-masked | rope-rows-set | ops | fusion | wgmma-stream-k | wgmma-rs | wgmma-group-glu]
(mmvq: every type at 1..8 tokens, mmvq_case; mma and q32: also MMQ's stream-k seams, mmq_seams_case; wgmma-block32:
wgmma on Q4_0/Q5_0/Q8_0, wgmma_block32_case; attention-split: attention_split_case; attention-wgmma:
attention_wgmma_case; attention-masked: attention_masked_case (and SET_ROWS); rope-rows-set: rope_rows_set_case;
ops: ops_case; fusion: fusion_case; wgmma-stream-k: wgmma_stream_k_case;
wgmma-rs: wgmma_rs_case; wgmma-group-glu: wgmma_group_glu_case)
"""

import itertools
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from ggml_ciq import native
from ggml_ciq import quants as Q


def _attention_calls(ops, rng, label, cases):
    """ops.attention on each (tokens, n_past, heads, heads_kv, head_dim, window) case: random q, f16 K/V caches three
    rows longer than the positions (zeros there); prints whether each output is finite."""
    for t, n_past, heads, hkv, d, window in cases:
        q = rng.standard_normal((t, heads, d)).astype(np.float32)
        k, v = ops.zeros((n_past + t + 3, hkv, d), np.float16), ops.zeros((n_past + t + 3, hkv, d), np.float16)
        ops.kv_store(k, 0, rng.standard_normal((n_past + t, hkv, d)).astype(np.float32))
        ops.kv_store(v, 0, rng.standard_normal((n_past + t, hkv, d)).astype(np.float32))
        out = ops.attention(q, k, v, n_past, d ** -0.5, window).numpy()
        print(f"attention {label} t={t} n_past={n_past} heads={heads}/{hkv} D={d} window={window}: "
              f"finite={np.isfinite(out).all()}")


def engine_case():
    """Every NativeOps op on the GPU in both float orders (host, llama.cpp CUDA's), the four attention kernels (a
    window, a tail micro-batch; mma_llamacpp's tile shapes and stream-k segments), the q32 variant, and a small
    gemma3 and llama model's prefill through the engine in each GPU semantics (41 tokens in micro-batches of 16)."""
    from ggml_ciq import catalog
    from ggml_ciq.engine import Transformer
    from ggml_ciq.model import ModelFile
    from ggml_ciq.ops import GET_ROWS_TYPES, NativeOps

    rng = np.random.default_rng(1)
    for kernel in ("simt", "mma", "mma_llamacpp", "wgmma"):
        ops = NativeOps("cuda", attention_kernel=kernel)
        if kernel == "wgmma" and not ops.attention_runs(64):
            continue  # not Hopper or no sm_90a code in this build
        _attention_calls(ops, rng, kernel, [(67, 0, 4, 2, 64, 0), (67, 37, 4, 2, 128, 0), (67, 5, 4, 2, 256, 19)])
    # mma_llamacpp's tile shapes (1, 2, 4, 8 heads per kv head: 64, 32, 16, 8 queries a tile) and stream-k segments (600
    # cached keys: several segments a tile, folded; 2 and 1 CTAs per SM of llama.cpp's grid: other seams)
    ops = NativeOps("cuda", attention_kernel="mma_llamacpp")
    for (heads, hkv), d, per_sm in itertools.product(((1, 1), (4, 2), (4, 1), (8, 1)), (64, 256), ("2", "1")):
        t, n_past, window = 41, 600, (0 if d == 64 else 512)
        q = rng.standard_normal((t, heads, d)).astype(np.float32)
        k, v = ops.zeros((n_past + t, hkv, d), np.float16), ops.zeros((n_past + t, hkv, d), np.float16)
        ops.kv_store(k, 0, rng.standard_normal((n_past + t, hkv, d)).astype(np.float32))
        ops.kv_store(v, 0, rng.standard_normal((n_past + t, hkv, d)).astype(np.float32))
        os.environ["GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM"] = per_sm
        out = ops.attention(q, k, v, n_past, d ** -0.5, window).numpy()
        del os.environ["GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM"]
        print(f"attention mma_llamacpp {heads}/{hkv} heads D={d} {per_sm} CTAs/SM: finite={np.isfinite(out).all()}")
    for weight_type, block_bytes in ((Q.Q4_0, 18), (Q.Q5_0, 22), (Q.Q8_0, 34)):  # the q32 variant, row/token tails
        rows, k = 70, 384
        raw = rng.integers(0, 256, rows * k // 32 * block_bytes, dtype=np.uint8).reshape(-1, block_bytes)
        raw[:, 0:2] = rng.uniform(-0.1, 0.1, (len(raw), 1)).astype(np.float16).view(np.uint8)
        for tokens in (1, 37):
            out = native.gemm_q32(raw.reshape(-1), rng.standard_normal((tokens, k)).astype(np.float32), weight_type,
                                  rows, k, "cuda")
            print(f"gemm_q32 {Q.type_name(weight_type)} tokens={tokens}: finite={np.isfinite(out).all()}")
    for order in ("host", "llamacpp_cuda"):
        ops = NativeOps("cuda", op_order=order)
        x = rng.standard_normal((37, 3, 64)).astype(np.float32)
        for d in (64, 1030):  # llama.cpp's norm: 256 threads below 1024 columns, 1024 from there
            rows = rng.standard_normal((5, d)).astype(np.float32)
            ops.rms_norm(rows, rng.standard_normal(d), 1e-6).numpy()
            ops.rms_norm_add(rows, rng.standard_normal(d), 1e-6, rows).numpy()
            ops.rms_norm(rows, None, 1e-6).numpy()
        ops.rope(x, np.arange(37, dtype=np.int32), 10000.0, neox=True).numpy()
        ops.rope(x, np.arange(37, dtype=np.int32), 10000.0, neox=False).numpy()
        for shape in ((37, 3, 64), (3, 2, 1030)):  # the fused norm + rope: 256 and 1024 threads, odd pairs per thread
            xs = rng.standard_normal(shape).astype(np.float32)
            for neox in (True, False):
                ops.rms_norm_rope(xs, rng.standard_normal(shape[-1]).astype(np.float32), 1e-6,
                                  np.arange(5, 5 + shape[0], dtype=np.int32), 1e6, neox=neox).numpy()
        ops.glu(x, x, "gelu").numpy(), ops.glu(x, x, "silu").numpy(), ops.scale(x, 0.5).numpy()
        ops.add(x.reshape(-1, 64), rng.standard_normal(64)).numpy()
        print(f"ops in the {order} order: done")
    ops = NativeOps("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        from ggml_ciq.engine import make_ops

        for arch in ("gemma3", "llama"):
            model = ModelFile(catalog.write_small_model(Path(tmp) / f"{arch}.gguf", arch))
            for semantics in ("fast", "llamacpp", "exact"):
                engine = Transformer(model, ops=make_ops("cuda", semantics), n_ubatch=16)
                logits = engine.forward(rng.integers(3, 512, 41), all_logits=True)
                last = engine.forward(rng.integers(3, 512, 41))  # the last layer on one row (llama.cpp's out_ids)
                for _ in range(2):  # CUDA graphs: eager + capture, then a replay with other tokens
                    graphed = engine.forward(rng.integers(3, 512, 41), graph=True)
                print(f"engine {arch} {semantics}: finite={np.isfinite(logits).all() and np.isfinite(last).all()}"
                      f" graph finite={np.isfinite(graphed).all()}")
            for t in model.tensors.values():
                if t.ggml_type in GET_ROWS_TYPES and len(t.shape) == 2:
                    ops.get_rows(t, [0, t.rows - 1]).numpy()
                    ops.linear(ops.load_weight(t), rng.standard_normal((5, t.k)).astype(np.float32)).numpy()


def mmvq_case():
    """ciq_quantize q8_1 and the mmvq kernel for every type it multiplies: 1..8 tokens (each a template), a row tail of
    the 2-row CTA, K with a tail of the CTA's step."""
    rng = np.random.default_rng(2)
    for weight_type, k in ((Q.Q4_K, 256 * 11), (Q.Q6_K, 256 * 11), (Q.Q5_K, 256 * 11), (Q.Q4_0, 32 * 150),
                           (Q.Q5_0, 32 * 150), (Q.Q8_0, 32 * 150), (Q.Q4_1, 32 * 150), (Q.Q5_1, 32 * 150)):
        values, block_bytes = Q.BLOCK_LAYOUT[weight_type]
        rows = 1013
        raw = rng.integers(0, 256, (rows * k // values, block_bytes), dtype=np.uint8)
        scale = rng.uniform(-0.1, 0.1, (len(raw), 1)).astype(np.float16).view(np.uint8)
        if weight_type == Q.Q6_K:
            raw[:, 208:210] = scale
        else:
            raw[:, 0:2] = scale
        if weight_type in (Q.Q4_K, Q.Q5_K, Q.Q4_1, Q.Q5_1):  # dmin / m too: random bytes there are inf/NaN half the
            raw[:, 2:4] = rng.uniform(0, 0.05, (len(raw), 1)).astype(np.float16).view(np.uint8)
        for tokens in range(1, 9):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            xq = native.quantize_activations(x, "mmvq", weight_type, "cuda")
            out = native.gemm(raw.reshape(-1), x, variant="mmvq", device="cuda", ggml_type=weight_type, rows=rows, k=k)
            err = Q.nmse(out, Q.gemm_mmvq_semantics_quantized(weight_type, raw.reshape(-1), rows, k, xq))
            print(f"mmvq          {Q.type_name(weight_type)} tokens={tokens:4d} nmse={err:.2e}")


def mmq_seams_case(variants):
    """MMQ's stream-k seams (mmq_stream_k.cuh): q32 on the 32-block types (K 640 and 576) and mma on the K-quants (Q5_K
    too) at shapes MMQ splits (640 rows: 5 tiles on 132 SMs), at 512 tokens, a tail of 88 and 200 (mma: 16-token CTAs
    inside MMQ's J = 112)."""
    from ggml_ciq.llamacpp import LlamaCpp

    rng = np.random.default_rng(3)
    try:
        quantize = LlamaCpp.load().quantize_chunk
    except Exception as exc:  # llama.cpp quantizes the 32-block types here; without it, only the K-quants
        print(f"mmq seams: no llama.cpp ({exc}): K-quants only")
        quantize = None
    block32 = (Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1)  # K 576: the activations' last block zero-padded
    cases = [(t, "mma", 2048) for t in (Q.Q4_K, Q.Q5_K, Q.Q6_K)] + (
        [(t, "q32", k) for t in block32 for k in (640, 576)] if quantize else [])
    for weight_type, variant, k in cases:
        if variant not in variants:
            continue
        w = (rng.standard_normal((640, k)) * 0.02).astype(np.float32)
        data = (quantize(weight_type, w) if variant == "q32" else
                {Q.Q4_K: Q.quantize_q4_K, Q.Q5_K: Q.quantize_q5_K, Q.Q6_K: Q.quantize_q6_K}[weight_type](w))
        for tokens in (88, 200, 512):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            out = native.gemm(data, x, variant=variant, device="cuda", semantics="mmq", ggml_type=weight_type,
                              rows=640, k=k)
            print(f"{variant:13s} {Q.type_name(weight_type)} 640 x {k} tokens={tokens:4d} finite={np.isfinite(out).all()}")


def wgmma_block32_case():
    """wgmma on the 32-value block types: the three tile widths (3, 131 and 512 tokens), a split-K shape (K 2112: 33
    stages, no multiple of the 2-set raw ring; 1000 + 13 rows: a row tail), Gemma's K = 640 and SmolLM2's 576."""
    rng = np.random.default_rng(3)
    for weight_type, (rows, k) in itertools.product((Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1),
                                                    ((1013, 2112), (2048, 640), (1536, 576))):
        values, nbytes = Q.BLOCK_LAYOUT[weight_type]
        raw = rng.integers(0, 256, (rows * k // values, nbytes), dtype=np.uint8)
        raw[:, 0:2] = rng.uniform(-0.1, 0.1, (len(raw), 1)).astype(np.float16).view(np.uint8)
        if weight_type in Q.Q32_1_TYPES:  # m
            raw[:, 2:4] = rng.uniform(-0.1, 0.1, (len(raw), 1)).astype(np.float16).view(np.uint8)
        for tokens in (3, 131, 512):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            out = native.gemm(raw.reshape(-1), x, variant="wgmma", device="cuda", semantics="f16",
                              ggml_type=weight_type, rows=rows, k=k)
            err = Q.nmse(out, Q.gemm_f16_semantics(weight_type, raw.reshape(-1), rows, k, x))
            print(f"wgmma {Q.type_name(weight_type)} {rows} x {k} tokens={tokens:4d} nmse={err:.2e}")


def wgmma_stream_k_case():
    """wgmma's stream-K (GGML_CIQ_WGMMA_STREAMK=2: every tile streamed): ranges of one unit (a tile over 8 CTAs), of
    several tiles, a row and token tail, Q4_K and Q6_K (staged by TMA); then a shape the time model streams itself."""
    rng = np.random.default_rng(5)
    os.environ["GGML_CIQ_WGMMA_STREAMK"] = "2"
    for (weight_type, quantize), (rows, k, tokens) in itertools.product(
            ((Q.Q4_K, Q.quantize_q4_K), (Q.Q6_K, Q.quantize_q6_K)), ((300, 2048, 131), (1000, 4096, 64), (2049, 2048, 257))):
        data = quantize((rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        out = native.gemm(data, x, variant="wgmma", device="cuda", semantics="f16", ggml_type=weight_type, rows=rows, k=k)
        err = Q.nmse(out, Q.gemm_f16_semantics(weight_type, data, rows, k, x))
        print(f"wgmma stream-k {Q.type_name(weight_type)} {rows} x {k} tokens={tokens}: nmse={err:.2e}")
    os.environ["GGML_CIQ_WGMMA_STREAMK"] = "1"
    data = Q.quantize_q4_K((rng.standard_normal((14333, 2048)) * 0.02).astype(np.float32))
    x = rng.standard_normal((509, 2048)).astype(np.float32)
    out = native.gemm(data, x, variant="wgmma", device="cuda", semantics="f16", ggml_type=Q.Q4_K, rows=14333, k=2048)
    print(f"wgmma stream-k planned Q4_K 14333 x 2048 tokens=509: finite={np.isfinite(out).all()}")


def wgmma_rs_case():
    """wgmma's RS form (A fragments dequantized in the consumers' registers): tiles of 64, 128 and 256 tokens, row and
    token tails, split-K clusters, stream-K forced (at 256 tokens over several tiles), Q4_K, Q5_K and Q6_K (staged by
    TMA, Q6_K in 240-byte box rows); Q5_K in the SS form too."""
    rng = np.random.default_rng(6)
    os.environ["GGML_CIQ_WGMMA_RS"] = "0"
    for rows, k, tokens in ((1013, 2048, 131), (300, 1024, 512)):
        data = Q.quantize_q5_K((rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        out = native.gemm(data, x, variant="wgmma", device="cuda", semantics="f16", ggml_type=Q.Q5_K, rows=rows, k=k)
        print(f"wgmma ss Q5_K {rows} x {k} tokens={tokens}: "
              f"nmse={Q.nmse(out, Q.gemm_f16_semantics(Q.Q5_K, data, rows, k, x)):.2e}")
    os.environ["GGML_CIQ_WGMMA_RS"] = "1"
    for (weight_type, quantize), (rows, k, tokens, config, sk) in itertools.product(
            ((Q.Q4_K, Q.quantize_q4_K), (Q.Q5_K, Q.quantize_q5_K), (Q.Q6_K, Q.quantize_q6_K)),
            ((300, 2048, 131, "1", "0"), (1000, 4096, 64, "0", "0"), (1024, 4096, 512, "1", "0"), (2049, 2048, 257, "1", "2"),
             (1024, 4096, 512, "2", "0"), (4097, 2048, 509, "2", "0"), (5000, 2048, 300, "2", "2"))):
        os.environ["GGML_CIQ_WGMMA_CONFIG"], os.environ["GGML_CIQ_WGMMA_STREAMK"] = config, sk
        data = quantize((rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        native.dispatch_reset()
        out = native.gemm(data, x, variant="wgmma", device="cuda", semantics="f16", ggml_type=weight_type, rows=rows, k=k)
        err = Q.nmse(out, Q.gemm_f16_semantics(weight_type, data, rows, k, x))
        print(f"wgmma rs {Q.type_name(weight_type)} {rows} x {k} tokens={tokens} config={config} streamk={sk}: "
              f"nmse={err:.2e} launches={native.wgmma_launch_counts()}")
    for name in ("GGML_CIQ_WGMMA_CONFIG", "GGML_CIQ_WGMMA_STREAMK"):
        del os.environ[name]


def attention_split_case():
    """attention.cu's split over the keys (simt and mma): a decode row over 700 cached keys (chunks of 64), 100 queries
    after 300 keys with and without a window (rows that see no key of a chunk), Gemma's 4 heads on 1 kv head at
    D = 256, a 32-head D = 128 case (3 chunks) and the same calls unsplit (GGML_CIQ_ATTENTION_SPLIT=0)."""
    from ggml_ciq.ops import NativeOps

    rng = np.random.default_rng(4)
    for kernel, split in itertools.product(("simt", "mma"), ("1", "0")):
        os.environ["GGML_CIQ_ATTENTION_SPLIT"] = split
        _attention_calls(NativeOps("cuda", attention_kernel=kernel), rng, f"{kernel} split={split}",
                         [(1, 700, 8, 2, 128, 0), (100, 300, 4, 1, 256, 0), (100, 300, 4, 1, 256, 37),
                          (130, 0, 32, 8, 128, 0)])
    del os.environ["GGML_CIQ_ATTENTION_SPLIT"]


def attention_wgmma_case():
    """attention_wgmma.cu (Hopper): head_dim 64/128/256, query tails (1, 67, 300 tokens against 64- and 128-query tiles), GQA,
    n_past, windows, key tiles running past the cache's filled rows, split over the keys (from 1024 keys a tile, below
    half the SMs' CTAs) and not (GGML_CIQ_ATTENTION_SPLIT), and the 8B's 32 heads at 512 queries (one CTA a (tile,
    head), unsplit)."""
    from ggml_ciq.ops import NativeOps

    rng = np.random.default_rng(6)
    ops = NativeOps("cuda", attention_kernel="wgmma")
    cases = [(1, 1700, 8, 2, 128, 0), (67, 0, 4, 2, 64, 0), (300, 37, 6, 2, 128, 100), (67, 5, 4, 1, 256, 19),
             (300, 130, 4, 1, 256, 0), (200, 1000, 4, 1, 256, 0), (512, 0, 32, 8, 128, 0), (130, 900, 8, 8, 64, 0)]
    for split in ("1", "0"):
        os.environ["GGML_CIQ_ATTENTION_SPLIT"] = split
        _attention_calls(ops, rng, f"wgmma split={split}", cases)
    del os.environ["GGML_CIQ_ATTENTION_SPLIT"]


def attention_masked_case():
    """ciq_attention_masked (the plugin's FLASH_ATTN_EXT; simt, mma and on Hopper wgmma, split over the keys and not):
    the mask's tile
    marks, masks that end mid-tile (n_kv 300, 97 queries), a sliding window, two sequences, a fully masked row, Gemma's
    4 heads on 1 kv head at D = 256 and the 8B's 32 on 8 at D = 128; then ciq_rows_set_f16 (SET_ROWS) into a strided
    table."""
    from ggml_ciq.ops import NativeOps

    rng = np.random.default_rng(8)
    hopper = NativeOps("cuda", attention_kernel="wgmma").attention_runs(128)
    for kernel, split in itertools.product(("simt", "mma", "wgmma") if hopper else ("simt", "mma"), ("1", "0")):
        os.environ["GGML_CIQ_ATTENTION_SPLIT"] = split
        ops = NativeOps("cuda", attention_kernel=kernel)
        for t, n_past, heads, hkv, d, window, kind in [(97, 200, 4, 1, 256, 0, "causal"), (97, 200, 4, 1, 256, 64, "causal"),
                                                       (130, 0, 32, 8, 128, 0, "two"), (70, 30, 4, 2, 64, 0, "empty"),
                                                       (300, 1000, 4, 1, 256, 0, "causal")]:
            n_kv = n_past + t + 3
            q = rng.standard_normal((t, heads, d)).astype(np.float32)
            k = rng.standard_normal((n_kv, hkv, d)).astype(np.float16)
            v = rng.standard_normal((n_kv, hkv, d)).astype(np.float16)
            pos, p = n_past + np.arange(t)[:, None], np.arange(n_kv + 5)[None, :]
            visible = (p <= pos) & ((pos - p < window) if window else True)
            if kind == "two":
                visible &= (np.arange(t)[:, None] >= t // 2) == (p >= n_past + t // 2)
            if kind == "empty":
                visible[3] = False
            mask = np.where(visible, 0.0, -np.inf).astype(np.float16)
            out = ops.attention_masked(q, k, v, mask, n_kv, d ** -0.5).numpy()
            print(f"attention_masked {kernel} split={split} t={t} n_kv={n_kv} heads={heads}/{hkv} D={d} {kind}: "
                  f"finite={np.isfinite(out).all()}")
    del os.environ["GGML_CIQ_ATTENTION_SPLIT"]
    ops = NativeOps("cuda")
    table = ops.zeros((300, 1100), np.float16)
    ops.rows_set_f16(table, rng.permutation(300)[:77], rng.standard_normal((77, 1024)).astype(np.float32))
    print(f"rows_set_f16: finite={np.isfinite(table.numpy()).all()}")


def rope_rows_set_case():
    """ciq_rope_rows_set_f16 (the plugin's ROPE_KV step, llama.cpp CUDA's order): the 8B's 32 q heads on 8 kv heads
    at D = 128 and 77 tokens into strided tables with ids in random rows (one outside the table: skipped), without q,
    without v, NORM and NEOX, v rows of 1024 values (the vector kernel) and 1022 (the scalar one)."""
    from ggml_ciq.ops import NativeOps

    rng = np.random.default_rng(9)
    ops = NativeOps("cuda", op_order="llamacpp_cuda")
    t, heads, hkv, d = 77, 32, 8, 128
    for neox, with_q, with_v, v_k in itertools.product((False, True), (True, False), (True, False),
                                                       (hkv * d, hkv * d - 2)):  # the vector kernel, the scalar one
        q = ops.asarray(rng.standard_normal((t, heads, d)).astype(np.float32))
        k, v = rng.standard_normal((t, hkv, d)).astype(np.float32), rng.standard_normal((t, v_k)).astype(np.float32)
        k_table, v_table = ops.zeros((300, hkv * d + 64), np.float16), ops.zeros((300, hkv * d + 8), np.float16)
        ids = rng.permutation(300)[:t]
        ids[5] = 300
        out = ops.rope_rows_set_f16(q if with_q else None, k, v if with_v else None, np.arange(t) + 100, 5e5, neox,
                                    ids, k_table, rng.permutation(300)[:t], v_table)
        print(f"rope_rows_set_f16 neox={neox} q={with_q} v={with_v} v_k={v_k}: finite="
              f"{np.isfinite(k_table.numpy()).all() and (out is None or np.isfinite(out.numpy()).all())}")


def ops_case():
    """The vectorized ops (ops.cu) and the fused GLU conversion (convert_f16.cu): rms_norm a warp a row (d 256, 640,
    100), a block a row with registers (d 4096, 1028) and the plain kernel (d 8196), in place too; glu and add on
    float4s and a tail; rope with 6 heads (a group of 4 and one of 2); ciq_glu_activations at K 640, 14336 (the row
    in registers) and 16640 (two passes), 1 and 37 tokens."""
    from ggml_ciq.ops import NativeOps

    rng = np.random.default_rng(5)
    ops = NativeOps("cuda")
    for t, d in ((37, 256), (37, 640), (5, 100), (9, 4096), (9, 1028), (3, 8196)):
        x, w = rng.standard_normal((t, d)).astype(np.float32), rng.standard_normal(d).astype(np.float32)
        xd = ops.asarray(x)
        out = ops.rms_norm(xd, w, 1e-6).numpy()
        ops.native.check(ops.native.lib.ciq_rms_norm(ops.device, 0, ops._fp(xd), ops._fp(ops.asarray(w)), ops._fp(xd),
                                                     1e-6, t, d, ops._fp(xd)))
        print(f"rms_norm {t} x {d}: finite={np.isfinite(out).all()} in place={np.isfinite(xd.numpy()).all()}")
    for size in (4096, 4099):
        g, u = rng.standard_normal(size).astype(np.float32), rng.standard_normal(size).astype(np.float32)
        print(f"glu/add {size}: finite={np.isfinite(ops.glu(g, u, 'gelu').numpy()).all()} "
              f"{np.isfinite(ops.add(g, u).numpy()).all()}")
    x = rng.standard_normal((17, 6, 128)).astype(np.float32)
    print(f"rope 6 heads: finite={np.isfinite(ops.rope(x, np.arange(17, dtype=np.int32), 1e4, True).numpy()).all()}")
    n, lib = ops.native, ops.native.lib
    for t, k in ((1, 640), (37, 640), (37, 14336), (3, 16640)):
        g, u = (ops.asarray(rng.standard_normal((t, k)).astype(np.float32)) for _ in range(2))
        out = ops.empty((native.activation_bytes("f16", t, k),), np.uint8)
        n.check(lib.ciq_glu_activations(ops.device, lib.CIQ_ORDER_HOST, lib.CIQ_GLU_SILU, ops._fp(g), ops._fp(u), t, k,
                                        lib.CIQ_LAYOUT_F16, out.ptr))
        print(f"glu_activations {t} x {k}: {out.numpy().size} bytes")


def wgmma_group_glu_case():
    """API v14: the grouped kernel (ciq_gemm_quantized_group, GGML_CIQ_WGMMA_GROUP=2: Q4_K q+k beside a Q6_K v of a row
    tail, tiles of 64, 128 and 256 tokens, split-K and stream-K) and the GLU epilogue (ciq_gemm_quantized_glu: Q4_K RS,
    Q6_K SS, split-K and stream-K, both kinds); API v28: three weights apart in one launch and the GLU pair."""
    from ggml_ciq.model import Tensor
    from ggml_ciq.ops import NativeOps

    rng = np.random.default_rng(7)
    ops = NativeOps("cuda", fuse=True)

    def tensor(name, weight_type, quantize, rows, k):
        return Tensor(name, weight_type, (rows, k), quantize((rng.standard_normal((rows, k)) * 0.02).astype(np.float32)))

    os.environ["GGML_CIQ_WGMMA_GROUP"] = "2"
    k = 2048
    qk = ops.stack_weights([tensor("q", Q.Q4_K, Q.quantize_q4_K, 1024, k), tensor("k", Q.Q4_K, Q.quantize_q4_K, 256, k)])
    v = ops.load_weight(tensor("v", Q.Q6_K, Q.quantize_q6_K, 200, k))
    for tokens, config, sk in ((37, "0", "0"), (131, "1", "0"), (300, "2", "0"), (509, "1", "2"), (1000, "", "")):
        os.environ["GGML_CIQ_WGMMA_CONFIG"], os.environ["GGML_CIQ_WGMMA_STREAMK"] = config, sk
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        native.dispatch_reset()
        outs = [y.numpy() for y in ops.linear_group([qk, v], x)]
        print(f"grouped q+k/v tokens={tokens} config={config} streamk={sk}: "
              f"finite={all(np.isfinite(o).all() for o in outs)} launches={native.wgmma_launch_counts()}")
    for (weight_type, quantize, ff, kk), (tokens, config, sk) in itertools.product(
            ((Q.Q4_K, Q.quantize_q4_K, 192, 2048), (Q.Q6_K, Q.quantize_q6_K, 320, 512)),
            ((37, "0", "0"), (300, "2", "0"), (509, "1", "2"))):
        os.environ["GGML_CIQ_WGMMA_CONFIG"], os.environ["GGML_CIQ_WGMMA_STREAMK"] = config, sk
        w = ops.stack_glu(tensor("gate", weight_type, quantize, ff, kk), tensor("up", weight_type, quantize, ff, kk))
        x = rng.standard_normal((tokens, kk)).astype(np.float32)
        native.dispatch_reset()
        for kind in ("silu", "gelu"):
            h = ops.linear_glu(w, x, kind).numpy()
            print(f"glu {Q.type_name(weight_type)} {2 * ff} x {kk} {kind} tokens={tokens} config={config} streamk={sk}: "
                  f"finite={np.isfinite(h).all()} launches={native.wgmma_launch_counts()}")
    # API v28: three weights apart (q, k, v as llama.cpp holds them: Q4_K, Q4_K, Q6_K and three Q4_K, a row tail) and
    # the GLU from two matrices (ciq_gemm_quantized_glu_pair: 64-row boxes of gate and up)
    q, kk_, v4 = (ops.load_weight(tensor(n, Q.Q4_K, Q.quantize_q4_K, r, k)) for n, r in (("q", 1024), ("k", 256), ("v4", 200)))
    for weights, (tokens, config, sk) in itertools.product(([q, kk_, v], [q, kk_, v4]),
                                                           ((37, "0", "0"), (300, "2", "0"), (509, "1", "2"))):
        os.environ["GGML_CIQ_WGMMA_CONFIG"], os.environ["GGML_CIQ_WGMMA_STREAMK"] = config, sk
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        native.dispatch_reset()
        outs = [y.numpy() for y in ops.linear_group(weights, x)]
        print(f"grouped q/k/{Q.type_name(weights[2].ggml_type)} tokens={tokens} config={config} streamk={sk}: "
              f"finite={all(np.isfinite(o).all() for o in outs)} launches={native.wgmma_launch_counts()}")
    for (weight_type, quantize, ff, kk), (tokens, config, sk) in itertools.product(
            ((Q.Q4_K, Q.quantize_q4_K, 192, 2048), (Q.Q6_K, Q.quantize_q6_K, 320, 2048)),
            ((37, "0", "0"), (300, "2", "0"), (509, "1", "2"))):
        os.environ["GGML_CIQ_WGMMA_CONFIG"], os.environ["GGML_CIQ_WGMMA_STREAMK"] = config, sk
        gate, up = (ops.load_weight(tensor(n, weight_type, quantize, ff, kk)) for n in ("gate", "up"))
        x = rng.standard_normal((tokens, kk)).astype(np.float32)
        native.dispatch_reset()
        for kind in ("silu", "gelu"):
            h = ops.linear_glu_pair(gate, up, x, kind).numpy()
            print(f"glu pair {Q.type_name(weight_type)} 2 x {ff} x {kk} {kind} tokens={tokens} config={config} "
                  f"streamk={sk}: finite={np.isfinite(h).all()} launches={native.wgmma_launch_counts()}")
    for name in ("GGML_CIQ_WGMMA_GROUP", "GGML_CIQ_WGMMA_CONFIG", "GGML_CIQ_WGMMA_STREAMK"):
        del os.environ[name]


def fusion_case():
    """API v11: stacked weights' outputs (ciq_gemm_quantized_outputs: from wgmma's epilogue where the outputs' rows
    allow, copied out where not; residual addends, odd rows), rms_norm fused into the f16 conversion (its warp, block
    and strided kernels), rope + kv_store in one kernel (ciq_rope_kv_store), and wgmma's tail split (whole waves,
    then the partial wave split-K in a second launch)."""
    from ggml_ciq.model import Tensor
    from ggml_ciq.ops import NativeOps

    rng = np.random.default_rng(6)
    ops = NativeOps("cuda", fuse=True)
    k = 512
    for parts in ((256, 128, 136), (96, 40, 41)):
        tensors = [Tensor(f"w{i}", Q.Q4_K, (r, k), Q.quantize_q4_K(rng.standard_normal((r, k)).astype(np.float32)))
                   for i, r in enumerate(parts)]
        stacked = ops.stack_weights(tensors)
        for tokens in (5, 37, 300):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            outs = [y.numpy() for y in ops.linear_group([stacked], x)]
            w = ops.load_weight(tensors[-1])
            added = ops.linear(w, x, rng.standard_normal((tokens, parts[-1])).astype(np.float32)).numpy()
            print(f"outputs {parts} tokens={tokens}: finite={all(np.isfinite(o).all() for o in outs)} "
                  f"add finite={np.isfinite(added).all()}")
    n, lib = ops.native, ops.native.lib
    for t, d in ((37, 640), (9, 4096), (3, 9216)):
        x, w = ops.asarray(rng.standard_normal((t, d)).astype(np.float32)), ops.asarray(rng.standard_normal(d).astype(np.float32))
        out = ops.empty((native.activation_bytes("f16", t, d),), np.uint8)
        n.check(lib.ciq_rms_norm_activations(ops.device, lib.CIQ_ORDER_HOST, ops._fp(x), ops._fp(w), 1e-6, t, d,
                                             lib.CIQ_LAYOUT_F16, out.ptr))
        print(f"rms_norm_activations {t} x {d}: {out.numpy().size} bytes")
    for heads, heads_kv, d in ((32, 8, 128), (6, 3, 64)):  # rope + kv_store fused: with v and without
        t = 37
        kc, vc = (ops.zeros((t + 8, heads_kv, d), np.float16) for _ in range(2))
        q = rng.standard_normal((t, heads, d)).astype(np.float32)
        k, v = rng.standard_normal((2, t, heads_kv, d)).astype(np.float32)
        pos = np.arange(5, 5 + t, dtype=np.int32)
        out = ops.rope_kv_store(q, k, v, pos, 1e4, True, kc, vc, 5).numpy()
        ops.rope_kv_store(q, k, None, pos, 1e4, False, kc, vc, 8).numpy()
        print(f"rope_kv_store {heads}/{heads_kv} x {d}: finite={np.isfinite(out).all()}")
    for weight_type, quantize, (rows, kk, tokens) in ((Q.Q4_K, Q.quantize_q4_K, (17920, 1024, 200)),
                                                      (Q.Q6_K, Q.quantize_q6_K, (140 * 128 + 5, 2304, 251))):
        data = quantize((rng.standard_normal((rows, kk)) * 0.02).astype(np.float32))
        x = rng.standard_normal((tokens, kk)).astype(np.float32)
        out = native.gemm(data, x, variant="wgmma", device="cuda", semantics="f16", ggml_type=weight_type, rows=rows, k=kk)
        print(f"wgmma tail {Q.type_name(weight_type)} {rows} x {kk} tokens={tokens}: finite={np.isfinite(out).all()}")


# The cases that run only alone (one argument): the argument -> its case.
ALONE_CASES = {"engine": engine_case, "fusion": fusion_case, "attention-split": attention_split_case,
               "wgmma-stream-k": wgmma_stream_k_case, "wgmma-rs": wgmma_rs_case,
               "wgmma-group-glu": wgmma_group_glu_case, "attention-wgmma": attention_wgmma_case, "ops": ops_case,
               "attention-masked": attention_masked_case, "rope-rows-set": rope_rows_set_case}


def main(variants):
    if len(variants) == 1 and variants[0] in ALONE_CASES:
        return ALONE_CASES[variants[0]]()
    if "wgmma-block32" in variants:
        wgmma_block32_case()
        variants = [v for v in variants if v != "wgmma-block32"]
    if "mmvq" in variants:
        mmvq_case()
    if "mma" in variants or "q32" in variants:
        mmq_seams_case(variants)
    rng = np.random.default_rng(0)
    rows, k = 1000 + 13, 512
    for weight_type, quantize in ((Q.Q4_K, Q.quantize_q4_K), (Q.Q6_K, Q.quantize_q6_K)):
        data = quantize((rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
        for tokens in (1, 17, 131):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            native.quantize_activations(x, "cpu", weight_type, "cuda")
            native.quantize_activations(x, "mmq", weight_type, "cuda")
            native.quantize_activations(x, "f16", weight_type, "cuda")
            for variant in variants:
                if tokens > native.variant_info(variant).max_tokens or variant == "q32":  # mmvq: mmvq_case; q32 below
                    continue
                sem = native.variant_info(variant).semantics
                out = native.gemm(data, x, variant=variant, device="cuda", semantics=sem, ggml_type=weight_type,
                                  rows=rows, k=k)
                err = Q.nmse(out, Q.REFERENCE_GEMMS[sem](weight_type, data, rows, k, x))
                print(f"{variant:13s} {Q.type_name(weight_type)} tokens={tokens:4d} nmse={err:.2e}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(native.GPU_VARIANTS) + ["mmvq", "q32", "wgmma-block32"])  # GPU_VARIANTS: every token count
    if len(sys.argv) == 1:
        engine_case()
