"""Prefill engine (NumpyOps: llama.cpp CPU arithmetic, native keep-quant GEMMs) against llama.cpp's own forward
pass on the same GGUF, with llama.cpp's defaults (f16 K/V cache, no flash attention)."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ggml_ciq import catalog, native, numpy_ops
from ggml_ciq import quants as Q
from ggml_ciq.engine import Transformer
from ggml_ciq.errors import GGUFFileError, InvalidArgumentError, ShapeError, UnsupportedTypeError
from ggml_ciq.model import ModelFile

import llamacpp_python  # tests/llamacpp_python.py

PROMPT = Path(__file__).resolve().parent / "data" / "prompt_en.txt"

LLAMA_LOGITS = llamacpp_python.script("""
    import sys, numpy as np, llama_cpp
    path, out, tokens, kv = sys.argv[1:5]
    cache = dict(type_k=0, type_v=0) if kv == "f32" else {}  # default: f16 K/V cache
    model = llama_cpp.Llama(path, n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True, verbose=False, **cache)
    tokens = model.tokenize(open(tokens[5:]).read().encode()) if tokens.startswith("file:") else \\
        [int(t) for t in tokens.split(",")]
    model.eval(tokens)
    np.savez(out, tokens=np.array(tokens), logits=np.array(model.scores[:len(tokens)], dtype=np.float32))
""")


def llama_logits(path, tokens, tmp_path, kv="f16"):
    """(tokens, logits of every position) of llama.cpp's forward pass; tokens: ids, or a Path of text to tokenize."""
    out = tmp_path / f"logits-{kv}.npz"
    arg = f"file:{tokens}" if isinstance(tokens, Path) else ",".join(map(str, tokens))
    proc = subprocess.run([sys.executable, "-c", LLAMA_LOGITS, str(path), str(out), arg, kv],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode < 0 and not os.environ.get("GGML_CIQ_REQUIRE_LLAMACPP"):
        pytest.skip(f"llama.cpp's own forward pass died (signal {-proc.returncode}) with its extra buffer types off "
                    f"(tests/llamacpp_python.py)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = np.load(out)
    return data["tokens"], data["logits"]


def agreement(ours, theirs):
    """(top-1 agreement, mean KL(theirs || ours), NMSE) over all positions."""
    def log_softmax(x):
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p, q = log_softmax(theirs), log_softmax(ours)
    kl = (np.exp(p) * (p - q)).sum(-1)
    return float(np.mean(ours.argmax(-1) == theirs.argmax(-1))), float(kl.mean()), Q.nmse(ours, theirs)


@pytest.mark.parametrize("architecture", catalog.SMALL_ARCHITECTURES)
def test_small_model_matches_llamacpp(architecture, llama, native_lib, rng, tmp_path, llamacpp_avx2):
    """Two-layer random models of each architecture, 41 random tokens in micro-batches of 16 (a tail of 9): against
    llama.cpp's AVX2 build every logit bit for bit (SwiGLU in its SIMD order: CIQ_ORDER_LLAMACPP_CPU), against
    another build within llama.cpp's own rounding spread."""
    path = catalog.write_small_model(tmp_path / f"{architecture}.gguf", architecture)
    tokens = rng.integers(3, 512, 41)
    _, theirs = llama_logits(path, tokens, tmp_path)
    native.dispatch_reset()
    engine = Transformer(ModelFile(path), n_ubatch=16)
    ours = engine.forward(tokens, all_logits=True)
    assert native.dispatch_counts()[("cpu", "Q4_K")] == 3 * 2 * 5  # 3 micro-batches x 2 layers x 5 Q4_K weights
    top1, kl, err = agreement(ours, theirs)
    print(f"{architecture}: NMSE {err:.2e}, top-1 {top1:.3f}, KL {kl:.2e}")
    # Measured over 5 token draws per architecture: NMSE 6e-5 .. 4e-4, top-1 0.925 .. 1.0 (random weights with
    # outlier channels amplify rounding flips); a wrong RoPE pairing is ~0.5 (test_wrong_rope_pairing_is_caught).
    assert err <= 2e-3 and top1 >= 0.85
    if llamacpp_avx2:
        assert err == 0.0, f"{architecture}: NMSE {err:.3g} against llama.cpp's AVX2 build (bit for bit expected)"
    if architecture == "gemma3":
        assert engine.hp.sliding_window == 16 and engine.hp.is_sliding(0) and not engine.hp.is_sliding(5)


@pytest.mark.gpu
@pytest.mark.parametrize("architecture", catalog.SMALL_ARCHITECTURES)
def test_cuda_engine_matches_cpu_engine(architecture, native_lib, rng, tmp_path):
    """The engine on the GPU (NativeOps "cuda": AUTO's keep-quant and attention kernels) against the same engine
    on the CPU: 41 random tokens in micro-batches of 16 (a tail of 9), every position's logits."""
    from ggml_ciq.ops import NativeOps

    if native.device_count() == 0:
        pytest.skip("needs a CUDA device and libggml_ciq built with CUDA")
    path = catalog.write_small_model(tmp_path / f"{architecture}.gguf", architecture)
    tokens = rng.integers(3, 512, 41)
    cpu = Transformer(ModelFile(path), n_ubatch=16).forward(tokens, all_logits=True)
    native.dispatch_reset()
    engine = Transformer(ModelFile(path), ops=NativeOps("cuda"), n_ubatch=16)
    gpu = engine.forward(tokens, all_logits=True)
    counts = native.dispatch_counts()
    gpu_q4k = sum(n for (variant, t), n in counts.items() if t == "Q4_K" and variant in native.GPU_VARIANTS)
    assert gpu_q4k == 3 * 2 * 5 and counts[("cpu", "Q4_K")] == 0  # every keep-quant GEMM ran on the GPU
    hopper = NativeOps("cuda", attention_kernel="wgmma").attention_runs(engine.hp.head_dim)
    expected = "wgmma" if hopper else "mma"  # AUTO's first choice that runs (Hopper with sm_90a code: wgmma)
    assert engine.ops.attention_kernel_name(engine.hp.head_dim) == expected
    attention = native.attention_dispatch_counts()
    assert attention[expected] > 0 and sum(attention.values()) == attention[expected]
    assert set(engine.timings) >= {"keep-quant GEMM", "attention", "rest", "total"}
    top1, kl, err = agreement(gpu, cpu)
    print(f"{architecture} cuda vs cpu engine: NMSE {err:.2e}, top-1 {top1:.3f}, KL {kl:.2e}; {counts}")
    # f16 activations (wgmma) against the CPU's q8_K, f16 attention weights, bf16 for the other weight types: on the
    # H200 (5d360bc) qwen3 measured NMSE 3.3e-3, top-1 0.90, the other three passed 2e-3; a broken op is ~1
    assert np.isfinite(gpu).all() and err <= 1e-2 and top1 >= 0.85


def test_wrong_rope_pairing_is_caught(llama, native_lib, rng, tmp_path):
    path = catalog.write_small_model(tmp_path / "qwen3.gguf", "qwen3")
    tokens = rng.integers(3, 512, 24)
    _, theirs = llama_logits(path, tokens, tmp_path)
    engine = Transformer(ModelFile(path))
    engine.arch = replace(engine.arch, rope_neox=False)  # llama's pairing on a NEOX model
    err = Q.nmse(engine.forward(tokens, all_logits=True), theirs)
    print(f"NMSE with the wrong RoPE pairing {err:.2e}")
    assert err > 1e-2


def test_microbatches_hidden_states_and_cache(native_lib, default_model, rng):
    """48 tokens at once and in six micro-batches of 8: the same values. (As in llama.cpp, the GEMMs' float order
    follows the tokens per call: groups of 4 for repacked Q4_K, >= 8 for the tiled Q6_K path; 8-token micro-batches
    keep every order of the whole batch, so the results are identical.)"""
    tokens = rng.integers(0, 512, 48)
    whole, parts = Transformer(default_model), Transformer(default_model, n_ubatch=8)
    hidden_whole, hidden_parts = [], []
    a = whole.forward(tokens, hidden_whole, all_logits=True)
    b = parts.forward(tokens, hidden_parts, all_logits=True)
    assert a.shape == (48, 512) and Q.nmse(b, a) <= 1e-12
    assert len(hidden_parts) == 2 and all(h.shape == (48, 512) and h.dtype == np.float32 for h in hidden_parts)
    assert all(Q.nmse(p, w) <= 1e-12 for p, w in zip(hidden_parts, hidden_whole))
    last = whole.forward(tokens)  # the output head on one row: another float order, the same values to rounding
    assert last.shape == (1, 512) and Q.nmse(last[0], a[-1]) <= 1e-10
    hidden_last = []  # hidden states keep every row through the last layer (so its FFN GEMMs run on 8 rows, not 1:
    # another float order); the logits are still the last row's
    with_hidden = parts.forward(tokens, hidden_last)
    assert with_hidden.shape == (1, 512) and Q.nmse(with_hidden[0], last[0]) <= 1e-10
    assert hidden_last[-1].shape == (48, 512)
    k, v = whole.kv_cache[1]
    assert k.shape == (256, 2, 64) and k.dtype == np.float16 and len(whole.kv_cache) == 2
    assert np.all(k[48:] == 0) and np.all(np.abs(k[:48]).max(-1) > 0)
    assert np.array_equal(k[:48], parts.kv_cache[1][0][:48]) and np.array_equal(v[:48], parts.kv_cache[1][1][:48])
    assert whole.ops.memory_bytes() >= whole.kv_cache_bytes() > 0


@pytest.fixture(scope="module")
def gemma_run(gemma_full, tmp_path_factory):
    """llama.cpp (f16 and f32 K/V caches) and our engine on the committed English prompt (the whole model: a skip on
    the GPU machine's K-quant extract, not an error)."""
    tmp = tmp_path_factory.mktemp("gemma")
    tokens, theirs = llama_logits(gemma_full.path, PROMPT, tmp)
    _, theirs_f32_cache = llama_logits(gemma_full.path, PROMPT, tmp, kv="f32")
    native.dispatch_reset()
    ours = Transformer(gemma_full).forward(tokens, all_logits=True)
    counts = native.dispatch_counts()
    return tokens, ours, theirs, theirs_f32_cache, counts


def test_gemma3_real_prompt_vs_llamacpp(llama, native_lib, gemma_run, llamacpp_avx2):
    """Gemma 3 270M Q4_K_M on a real English prompt (tests/data/prompt_en.txt, 158 tokens), against llama.cpp CPU
    with its defaults (f16 K/V cache, no flash attention). This model turns last-bit differences into KL ~5e-3
    (llama.cpp against itself with an f32 K/V cache: top-1 0.962, KL 5.7e-3), so the engine follows llama.cpp's x86
    float order op by op (numpy_ops): same semantics, hence the 1e-10 bar on the logits' NMSE (measured: 0, the
    logits bit for bit). llama.cpp's f32-cache run shows the test can fail: it is far off the bar. Against an AVX-512
    build of llama.cpp (llamacpp_avx2 false) ours is held to llama.cpp's own f32-cache spread instead, in NMSE and KL
    (measured on an AVX-512 CPU: NMSE 1.7e-3, KL 5.0e-3 against the spread's 2.5e-3, 6.6e-3)."""
    tokens, ours, theirs, theirs_f32_cache, counts = gemma_run
    assert len(tokens) >= 64 and ours.shape == theirs.shape == (len(tokens), 262144)
    assert counts[("cpu", "Q4_K")] == 27 and counts[("cpu", "Q6_K")] == 9  # one micro-batch
    top1, kl, err = agreement(ours, theirs)
    self_top1, self_kl, self_err = agreement(theirs_f32_cache, theirs)
    print(f"ours vs llama.cpp: top-1 {top1:.3f}, KL {kl:.2e}, NMSE {err:.2e}, identical {np.mean(ours == theirs):.4f}; "
          f"llama.cpp f32 vs f16 cache: top-1 {self_top1:.3f}, KL {self_kl:.2e}, NMSE {self_err:.2e}")
    if llamacpp_avx2:
        assert err <= 1e-10 and self_err > 1e-6
    else:
        assert err <= self_err and kl <= self_kl


def test_gemma3_issue_bar(llama, native_lib, gemma_run, llamacpp_avx2):
    """Issue 7's CPU bar: top-1 agreement >= 99% over all positions, mean KL divergence <= 1e-3, against the llama.cpp
    arithmetic our engine follows (an AVX2 build; an AVX-512 one is judged by its spread in the test above)."""
    if not llamacpp_avx2:
        pytest.skip("issue 7's bar is against llama.cpp's AVX2 CPU arithmetic; this llama.cpp is an AVX-512 build "
                    "(test_gemma3_real_prompt_vs_llamacpp holds ours to its spread)")
    _, ours, theirs, _, _ = gemma_run
    top1, kl, _ = agreement(ours, theirs)
    assert top1 >= 0.99 and kl <= 1e-3


@pytest.mark.parametrize("ggml_type", [Q.Q4_0, Q.Q5_0, Q.Q8_0])
@pytest.mark.parametrize("tokens", [1, 17])
@pytest.mark.parametrize("isa", ["best", "scalar"])
def test_q32_gemm_matches_llamacpp(llama, ggml_type, tokens, isa, rng, monkeypatch):
    """32-block weights in cpu semantics (the q32 variant: q8_0 activations, tinyBLAS's float order) against llama.cpp
    CPU's mul_mat (rows 1000: a tail of the 32-row chunk), bit for bit: tinyBLAS from 2 tokens, vec_dot_*_q8_0 (the
    same lanes and sum) for 1; on the host's AVX2 path (17 tokens: a 16-token tile, four at a time, and a tail) and
    on its scalar one."""
    if isa == "scalar":
        monkeypatch.setenv("GGML_CIQ_CPU_ISA", "scalar")
    rows, k = 1000, 640
    w = rng.standard_normal((rows, k)).astype(np.float32) * 0.02
    raw = llama.quantize_chunk(ggml_type, w)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    x[:, 400] *= 300.0  # an outlier channel, as Gemma's residual stream has
    ours = native.gemm_q32(raw, x, ggml_type, rows, k, "cpu", semantics="cpu")
    theirs = llama.mul_mat(ggml_type, raw, rows, k, x)
    err = Q.nmse(ours, theirs)
    print(f"{Q.type_name(ggml_type)} tokens={tokens}: NMSE {err:.2e}, identical {np.mean(ours == theirs):.4f}")
    assert err <= 1e-10 and np.array_equal(ours, theirs)
    float_path = x @ Q.dequantize(ggml_type, raw, rows, k).T  # float activations: a different semantics
    assert Q.nmse(float_path, theirs) > 1e3 * max(err, 1e-16)


@pytest.mark.parametrize("ggml_type, rows, tokens", [(Q.Q6_K, 1000, 1), (Q.Q6_K, 1000, 17), (Q.Q4_K, 1001, 17)],
                         ids=["Q6_K-vec_dot", "Q6_K-tiled", "Q4_K-tiled"])
def test_keep_quant_float_order_matches_llamacpp(llama, ggml_type, rows, tokens, rng):
    """cpu semantics follow the float order of the kernel llama.cpp CPU runs for the call (docs/SEMANTICS.md): Q6_K
    under 8 tokens its vec_dot, from 8 tokens its tiled matmul, Q4_K whose rows are not a multiple of 8 (not
    repacked) the tiled matmul; bit for bit against llama.cpp's mul_mat."""
    k = 512
    raw = llama.quantize_chunk(ggml_type, rng.standard_normal((rows, k)).astype(np.float32) * 0.02)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    ours = native.gemm(raw, x, variant="cpu", device="cpu", semantics="cpu", ggml_type=ggml_type, rows=rows, k=k)
    theirs = llama.mul_mat(ggml_type, raw, rows, k, x)
    print(f"{Q.type_name(ggml_type)} {rows}x{k}x{tokens}: identical {np.mean(ours == theirs):.4f}")
    assert np.array_equal(ours, theirs)


def test_attention_mask_window_and_cache_poison(rng):
    t, n_past, h, h_kv, d, window = 13, 20, 6, 2, 64, 7
    first = n_past - window + 1  # no query sees keys before it
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    k_cache = np.full((48, h_kv, d), np.nan, np.float16)  # rows outside [first, n_past + t) must never be read
    v_cache = np.full((48, h_kv, d), np.nan, np.float16)
    ops = numpy_ops.NumpyOps()
    ops.kv_store(k_cache, first, rng.standard_normal((n_past + t - first, h_kv, d)).astype(np.float32))
    ops.kv_store(v_cache, first, rng.standard_normal((n_past + t - first, h_kv, d)).astype(np.float32))
    out = ops.attention(q, k_cache, v_cache, n_past, 0.125, window)
    assert out.shape == (t, h * d) and np.isfinite(out).all()
    ref = np.empty((t, h, d))
    for i in range(t):
        pos = n_past + i
        keys = [p for p in range(pos + 1) if pos - p < window]
        for head in range(h):
            g = head // (h // h_kv)
            s = k_cache[keys, g].astype(np.float64) @ q[i, head].astype(np.float16).astype(np.float64) * 0.125
            p = np.exp(s - s.max())
            ref[i, head] = (p / p.sum()) @ v_cache[keys, g].astype(np.float64)
    err = Q.nmse(out, ref.reshape(t, -1))
    print(f"attention NMSE vs float64 {err:.2e}")
    assert err <= 1e-6  # the f16 rounding of the probabilities, nothing more
    k_cache[:first] = v_cache[:first] = 0.5  # now readable: a full-context attention sees them
    assert Q.nmse(ops.attention(q, k_cache, v_cache, n_past, 0.125, 0), ref.reshape(t, -1)) > 1e-3


def test_bad_models_and_tokens(native_lib, default_model, tmp_path):
    from ggml_ciq.gguf_writer import gguf_file

    model = Transformer(default_model, n_ctx=64)
    with pytest.raises(ShapeError, match="token ids"):
        model.forward([0, 512])
    with pytest.raises(ShapeError, match="longer than the context"):
        model.forward(list(range(65)))
    with gguf_file(tmp_path / "mamba.gguf", "mamba"):
        pass
    with pytest.raises(UnsupportedTypeError, match="mamba is not supported"):
        Transformer(ModelFile(tmp_path / "mamba.gguf"))
    path = catalog.write_small_model(tmp_path / "broken.gguf", "qwen2", drop=("blk.1.attn_k.bias", "blk.1.ffn_up.weight"))
    with pytest.raises(GGUFFileError, match="blk.1.ffn_up.weight, needed by the qwen2 architecture"):
        Transformer(ModelFile(path))


def test_gemma3_last_token_logits_vs_llamacpp(llama, native_lib, gemma_full, llamacpp_avx2):
    """Last-token logits (forward without all_logits) in micro-batches of 64 (158 tokens: 64 + 64 + 30), against
    llama.cpp CPU prefilling the same way: bit for bit. As llama.cpp's out_ids, the last layer after its attention
    goes on with only the rows whose logits are wanted: the final micro-batch's last row; the earlier micro-batches'
    last-layer FFNs do not run (the dispatch counts show it). Against an AVX-512 build of llama.cpp: NMSE <= 1e-2
    (its rounding-level differences through Gemma's 18 layers; measured ~2e-3 over all positions)."""
    from ggml_ciq.llama_model import LlamaModel

    with LlamaModel(gemma_full.path, device="cpu", threads=2) as lm:
        tokens = lm.tokenize(PROMPT.read_text())
        with lm.context_for(len(tokens), n_batch=64) as ctx:
            theirs = ctx.prefill(tokens, all_logits=False)
    assert len(tokens) == 158
    engine = Transformer(gemma_full, n_ubatch=64)
    native.dispatch_reset()
    ours = engine.forward(tokens)
    counts = native.dispatch_counts()
    assert ours.shape == (1, 262144)
    if llamacpp_avx2:
        assert np.array_equal(ours.reshape(-1), theirs.reshape(-1))
    else:
        assert Q.nmse(ours.reshape(-1), theirs.reshape(-1)) <= 1e-2
    last = engine.hp.n_layer - 1
    ffn = [gemma_full.tensor(f"blk.{last}.ffn_{w}.weight").ggml_type for w in ("gate", "up", "down")]
    for t in (Q.Q4_K, Q.Q6_K):  # 3 micro-batches of every keep-quant GEMM, less two of the last layer's FFN ones
        per_batch = sum(1 for name, w in gemma_full.tensors.items()
                        if name.startswith("blk.") and name.endswith(".weight") and w.ggml_type == t
                        and len(w.shape) == 2)
        assert counts[("cpu", Q.type_name(t))] == 3 * per_batch - 2 * ffn.count(t)


def test_graph_mode_needs_a_gpu(native_lib, default_model):
    from ggml_ciq.ops import NativeOps

    with pytest.raises(InvalidArgumentError, match="needs the engine on a GPU"):
        Transformer(default_model).forward([1, 2, 3], graph=True)
    with pytest.raises(InvalidArgumentError, match="need a GPU"):
        with NativeOps("cpu").graph_capture():
            pass


@pytest.mark.gpu
@pytest.mark.parametrize("architecture", catalog.SMALL_ARCHITECTURES)
@pytest.mark.parametrize("semantics", ["fast", "llamacpp", "exact"])
def test_cuda_graph_prefill_equals_eager(architecture, semantics, native_lib, rng, tmp_path):
    """forward(graph=True) against the same engine eager, bit for bit: 41 random tokens in micro-batches of 16 (a
    tail of 9), all logits and last-token logits, the graphs captured on the first call and replayed on later ones
    with other tokens (the replays dispatch no GEMM: the counters stay at 0), then a longer prompt (the K/V cache
    grows: every graph is dropped and captured again)."""
    from ggml_ciq.engine import make_ops

    if native.device_count() == 0:
        pytest.skip("needs a CUDA device and libggml_ciq built with CUDA")
    path = catalog.write_small_model(tmp_path / f"{architecture}.gguf", architecture)
    eager = Transformer(ModelFile(path), ops=make_ops("cuda", semantics), n_ubatch=16)
    graphed = Transformer(ModelFile(path), ops=make_ops("cuda", semantics), n_ubatch=16)
    for n_tokens in (41, 41, 41, 300):
        if n_tokens == 300:
            before = {key: entry[0] for key, entry in graphed._graphs.items()}  # kept: no id can be reused
        tokens = rng.integers(3, 512, n_tokens)
        for all_logits in (True, False):
            want = eager.forward(tokens, all_logits=all_logits)
            replay = n_tokens == 41 and len(graphed._graphs) >= (3 if all_logits else 6)
            native.dispatch_reset()
            got = graphed.forward(tokens, all_logits=all_logits, graph=True)
            gemms = sum(native.dispatch_counts().values())
            assert np.array_equal(got, want), f"{n_tokens} tokens, all_logits={all_logits}: graph != eager"
            if replay:
                assert gemms == 0, f"a replayed prefill dispatched {gemms} GEMMs: it did not replay"
    assert graphed.graph_error is None, graphed.graph_error
    # 300 tokens outgrew the 256-position cache: every graph of the 41-token prompts was dropped, none replayed
    assert graphed.kv_cache[0][0].shape[0] == 512 and before
    assert all(entry[0] is not before.get(key) and before[key]._handle is None for key, entry in graphed._graphs.items()
               if key in before)


@pytest.mark.gpu
@pytest.mark.parametrize("semantics", ["fast", "llamacpp", "exact"])
def test_cuda_graph_prefill_equals_eager_gemma(semantics, native_lib, gemma_full, rng):
    """The same on Gemma 3 270M's real weights, whose Q5_0/Q8_0 tensors take wgmma (fast and exact on Hopper; fast
    on q32 at 1..8 tokens) or the q32 GEMM (llamacpp): 77 tokens in micro-batches of 32 (a tail of 13), twice (the
    second call replays), all logits, bit for bit with eager."""
    from ggml_ciq.engine import make_ops

    if native.device_count() == 0:
        pytest.skip("needs a CUDA device and libggml_ciq built with CUDA")
    eager = Transformer(gemma_full, ops=make_ops("cuda", semantics), n_ctx=256, n_ubatch=32)
    graphed = Transformer(gemma_full, ops=make_ops("cuda", semantics), n_ctx=256, n_ubatch=32)
    for _ in range(2):
        tokens = rng.integers(3, 262144, 77)
        native.dispatch_reset()
        got = graphed.forward(tokens, all_logits=True, graph=True)
        replayed = sum(native.dispatch_counts().values()) == 0
        assert np.array_equal(got, eager.forward(tokens, all_logits=True))
    assert replayed and graphed.graph_error is None, graphed.graph_error


@pytest.mark.gpu
@pytest.mark.parametrize("semantics", ["fast", "exact"])
def test_glu_fused_into_down_equals_apart(semantics, native_lib, rng, tmp_path, monkeypatch):
    """The FFN's GLU fused into down's f16 activation conversion (NativeOps.glu_linear, ciq_glu_activations) against
    glu then linear: the same logits bit for bit, on a SwiGLU (llama) and a GEGLU (gemma3) model, 41 tokens in
    micro-batches of 16. (GGML_CIQ_FUSE_GLU=0: fast's gate/up otherwise give the GLU from their GEMM, the next test.)"""
    from ggml_ciq.engine import make_ops
    from ggml_ciq.ops import NativeOps

    if native.device_count() == 0:
        pytest.skip("needs a CUDA device and libggml_ciq built with CUDA")
    monkeypatch.setenv("GGML_CIQ_FUSE_GLU", "0")
    fused, glu = NativeOps.glu_linear, NativeOps.glu
    for architecture in ("llama", "gemma3"):
        path = catalog.write_small_model(tmp_path / f"{architecture}.gguf", architecture)
        tokens = rng.integers(3, 512, 41)
        calls, glus = [], {"fused": 0, "apart": 0}
        run = "fused"

        def counted_glu(self, *a):
            glus[run] += 1
            return glu(self, *a)

        monkeypatch.setattr(NativeOps, "glu", counted_glu)
        monkeypatch.setattr(NativeOps, "glu_linear", lambda self, *a, **kw: calls.append(1) or fused(self, *a, **kw))
        got = Transformer(ModelFile(path), ops=make_ops("cuda", semantics), n_ubatch=16).forward(tokens, all_logits=True)
        monkeypatch.setattr(NativeOps, "glu_linear", None)
        run = "apart"
        want = Transformer(ModelFile(path), ops=make_ops("cuda", semantics), n_ubatch=16).forward(tokens,
                                                                                                 all_logits=True)
        assert calls and np.array_equal(got, want), architecture
        # the fused conversion ran (ciq_glu_activations, not glu then the conversion) for at least one FFN
        assert glus["fused"] < glus["apart"], (architecture, glus)


@pytest.mark.gpu
@pytest.mark.parametrize("architecture", ["llama", "gemma3"])
def test_glu_from_gate_up_epilogue_equals_conversion(architecture, native_lib, rng, tmp_path, monkeypatch):
    """The fast semantics' gate/up interleaved with the GLU from their GEMM's epilogue (stack_glu, linear_glu) against
    the GLU fused into down's conversion (GGML_CIQ_FUSE_GLU=0), SwiGLU and GEGLU, 41 tokens in micro-batches of 16:
    with stream-K off (the same K split for every row either way) the same logits bit for bit, and one GLU launch a
    layer and micro-batch; with the planner's stream-K and tail split (whose seams fall on other rows when the rows
    are interleaved), NMSE <= 1e-9 and the same top-1."""
    from ggml_ciq.engine import Linear, make_ops

    if native.device_count() == 0 or not native.variant_available("cuda", "wgmma"):
        pytest.skip("needs a Hopper GPU and a build with sm_90a (wgmma)")
    path = catalog.write_small_model(tmp_path / f"{architecture}.gguf", architecture)
    tokens = rng.integers(3, 512, 41)
    for streamk in ("0", "1"):
        monkeypatch.setenv("GGML_CIQ_WGMMA_STREAMK", streamk)
        monkeypatch.setenv("GGML_CIQ_WGMMA_TAIL", streamk)
        runs = {}
        for glu in ("1", "0"):
            monkeypatch.setenv("GGML_CIQ_FUSE_GLU", glu)
            engine = Transformer(ModelFile(path), ops=make_ops("cuda", "fast"), n_ubatch=16)
            assert all(isinstance(layer["gate_up"], Linear) == (glu == "1") for layer in engine.layers)
            native.dispatch_reset()
            runs[glu] = engine.forward(tokens, all_logits=True)
            launches = native.wgmma_launch_counts()["glu"]
            assert launches >= 3 * len(engine.layers) if glu == "1" else launches == 0, (glu, launches)
        got, want = runs["1"], runs["0"]
        assert np.isfinite(got).all()
        if streamk == "0":
            assert np.array_equal(got, want)
        else:
            top1, _, err = agreement(got, want)
            assert err <= 1e-9 and top1 == 1.0, (err, top1)


def _gemm_weights(layer: dict) -> list:
    """The ops' weights of a layer's GEMMs, a stacked weight once."""
    from ggml_ciq.engine import Linear, LinearSet

    out = []
    for value in layer.values():
        if isinstance(value, Linear):
            out.append(value.weight)
        elif isinstance(value, LinearSet):
            out += [p.weight for p in value.parts]
    return out


@pytest.mark.parametrize("architecture", catalog.SMALL_ARCHITECTURES)
def test_fused_engine_equals_apart_cpu(architecture, native_lib, rng, tmp_path):
    """NativeOps with fuse (stacked q/k/v, gate/up interleaved with their GLU from the GEMM, norms fused into the
    activation conversion, residual adds into the GEMMs) against the same ops apart, on the CPU: the same logits bit for bit (41 tokens in micro-batches of 16,
    every position), and the stacking seen: fewer GEMM launches (qwen2's q/k/v biases keep those apart, its gate/up
    stack)."""
    from ggml_ciq.ops import NativeOps

    path = catalog.write_small_model(tmp_path / f"{architecture}.gguf", architecture)
    tokens = rng.integers(3, 512, 41)
    runs = {}
    for fuse in (True, False):
        engine = Transformer(ModelFile(path), ops=NativeOps("cpu", fuse=fuse), n_ubatch=16)
        native.dispatch_reset()
        runs[fuse] = engine.forward(tokens, all_logits=True), sum(native.dispatch_counts().values())
        stacked = [len(w.parts) or "glu" for layer in engine.layers for w in _gemm_weights(layer) if w.parts or w.glu]
        # q+k (v is Q6_K), gate/up interleaved for the GLU from their GEMM (stack_glu); qwen2's q/k/v biases: apart
        want = [] if not fuse else ["glu"] * 2 if architecture == "qwen2" else [2, "glu"] * 2
        assert stacked == want, stacked
    (fused, n_fused), (apart, n_apart) = runs[True], runs[False]
    assert np.isfinite(fused).all() and np.array_equal(fused, apart)
    assert n_fused < n_apart, (n_fused, n_apart)


def test_linear_set_beside_a_weight_not_grouped(native_lib, rng):
    """A LinearSet whose q/k stack (Q4_K) beside a v the ops do not group (Q8_0, float32 on the CPU): the engine's
    _linears runs the stacked part alone and the other apart, each output as linear on the normed input."""
    import types

    from ggml_ciq.engine import LinearSet
    from ggml_ciq.model import Tensor
    from ggml_ciq.ops import NativeOps

    k, tokens = 512, 9
    ops = NativeOps("cpu", fuse=True)
    tensors = [Tensor(f"blk.0.attn_{n}.weight", Q.Q4_K, (rows, k),
                      Q.quantize_q4_K(rng.standard_normal((rows, k)).astype(np.float32))) for n, rows in (("q", 64), ("k", 32))]
    v = rng.integers(0, 256, (32 * k // 32, 34), dtype=np.uint8)  # Q8_0 blocks: fp16 d, 32 int8
    v[:, 0:2] = rng.uniform(-0.1, 0.1, (len(v), 1)).astype(np.float16).view(np.uint8)
    tensors.append(Tensor("blk.0.attn_v.weight", Q.Q8_0, (32, k), v.reshape(-1)))
    lset = LinearSet(ops, [(t, None) for t in tensors])
    assert lset.parts[0].outputs == 2 and lset.parts[1].outputs == 1 and not ops.groups(  # q+k stacked, v apart
        [lset.parts[0].weight, lset.parts[1].weight])
    engine = types.SimpleNamespace(ops=ops, hp=types.SimpleNamespace(rms_eps=1e-6))
    engine._linear = types.MethodType(Transformer._linear, engine)
    x, norm = rng.standard_normal((tokens, k)).astype(np.float32), (rng.standard_normal(k) + 1).astype(np.float32)
    got = [y.numpy() for y in Transformer._linears(engine, lset, ops.asarray(x), norm=ops.asarray(norm))]
    h = ops.rms_norm(ops.asarray(x), ops.asarray(norm), 1e-6)
    want = [ops.linear(ops.load_weight(t), h).numpy() for t in tensors]
    assert len(got) == 3 and all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.gpu
@pytest.mark.parametrize("architecture", catalog.SMALL_ARCHITECTURES)
def test_fused_engine_gpu(architecture, native_lib, rng, tmp_path, monkeypatch):
    """The fast semantics fused (stacked q/k/v and gate/up from one wgmma launch, the norms in the f16 conversion, the
    residuals from wgmma's epilogue) against GGML_CIQ_FUSE=0 on a GPU: 41 tokens in micro-batches of 16, every
    position. The stacked GEMMs run other split-K plans than the matrices apart (float32 sums in another order), so
    not the same bits: NMSE <= 1e-9 and the same top-1 everywhere (a wrong output or a lost residual is ~1); the
    launches: one per stacked weight, gate/up's with the GLU from the epilogue (stack_glu: every layer, every step)."""
    from ggml_ciq.engine import make_ops

    if native.device_count() == 0 or not native.variant_available("cuda", "wgmma"):
        pytest.skip("needs a Hopper GPU and a build with sm_90a (wgmma)")
    path = catalog.write_small_model(tmp_path / f"{architecture}.gguf", architecture)
    tokens = rng.integers(3, 512, 41)
    runs = {}
    for fuse in ("1", "0"):
        monkeypatch.setenv("GGML_CIQ_FUSE", fuse)
        engine = Transformer(ModelFile(path), ops=make_ops("cuda", "fast"), n_ubatch=16)
        native.dispatch_reset()
        logits = engine.forward(tokens, all_logits=True)
        launches = sum(n for (variant, _), n in native.dispatch_counts().items() if variant == "wgmma")
        weights = [w for layer in engine.layers for w in _gemm_weights(layer)]
        runs[fuse] = logits, launches, weights
        glu = native.wgmma_launch_counts()["glu"]
        assert glu >= 3 * len(engine.layers) if fuse == "1" else glu == 0, (fuse, glu)
    (fused, n_fused, w_fused), (apart, n_apart, w_apart) = runs["1"], runs["0"]
    steps = 3  # micro-batches of 16, 16, 9 tokens: every one above MMVQ's 8 (wgmma); all logits: the output's too
    assert n_fused == steps * (len(w_fused) + 1) and n_apart == steps * (len(w_apart) + 1), (n_fused, n_apart)
    assert len(w_fused) < len(w_apart)
    top1, kl, err = agreement(fused, apart)
    print(f"{architecture} fused vs apart: NMSE {err:.2e}, top-1 {top1:.4f}, KL {kl:.2e}")
    assert np.isfinite(fused).all() and err <= 1e-9 and top1 == 1.0


@pytest.mark.gpu
def test_gemma_block32_weights_on_wgmma(native_lib, gemma_full, rng):
    """Gemma 3 270M's Q5_0/Q8_0 weights (K = 640) in the fast and exact semantics on Hopper: kept in their blocks (no
    bf16 copy), every GEMM of a 77-token prompt (all logits: the output too) on wgmma, q32 never; both within f16
    rounding of the float64 reference ("the model the file defines"): the bars leave a broken op (KLD ~1) no room;
    the printout gives the measured distances."""
    from ggml_ciq.compare import logits_agreement
    from ggml_ciq.engine import make_ops

    if native.device_count() == 0 or not native.variant_available("cuda", "wgmma"):
        pytest.skip("needs a Hopper GPU and a build with sm_90a (wgmma)")
    tokens = rng.integers(3, 262144, 77)
    reference = Transformer(gemma_full, device="reference", n_ctx=128).forward(tokens, all_logits=True)
    for semantics in ("fast", "exact"):
        engine = Transformer(gemma_full, ops=make_ops("cuda", semantics), n_ctx=128, n_ubatch=128)
        weights = [engine.output.weight] + [w for layer in engine.layers for w in _gemm_weights(layer)]
        kinds = {w.kind for w in weights if w.ggml_type in Q.Q32_TYPES}
        assert kinds == {"q32"}, kinds  # raw 32-value blocks, no bf16 copy
        native.dispatch_reset()
        ours = engine.forward(tokens, all_logits=True)
        counts = native.dispatch_counts()
        # one launch per weight; fast stacks q/k(/v) and gate/up (2 Q5_0 launches a layer, 4-5 apart)
        want = {t: sum(w.ggml_type == t for w in weights) for t in (Q.Q5_0, Q.Q8_0)}
        assert want[Q.Q5_0] == (36 if semantics == "fast" else 81) and want[Q.Q8_0] == 10, want
        assert counts[("wgmma", "Q5_0")] == want[Q.Q5_0] and counts[("wgmma", "Q8_0")] == 10, counts
        assert not any(n for (variant, _), n in counts.items() if variant == "q32"), counts
        a = logits_agreement(ours, reference)
        print(f"gemma {semantics} vs float64 reference: top-1 {a['top1']:.4f}, KLD mean {a['kld_mean']:.2e}, "
              f"max {a['kld_max']:.2e}")
        assert np.isfinite(ours).all() and a["top1"] >= 0.95 and a["kld_mean"] <= 5e-3
