"""The float64 reference (reference_ops.ReferenceOps, `--device reference`) and the engine's semantics selection
(engine.make_ops: llamacpp / exact per device)."""

from fractions import Fraction

import numpy as np
import pytest

from ggml_ciq import catalog, native
from ggml_ciq import quants as Q
from ggml_ciq.compare import logits_agreement
from ggml_ciq.engine import Transformer, make_ops
from ggml_ciq.errors import InvalidArgumentError, ShapeError
from ggml_ciq.model import ModelFile
from ggml_ciq.numpy_ops import NumpyOps
from ggml_ciq.reference_ops import (ExactCpuOps, ReferenceOps, attention_f64, dequantize_exact, gelu_tanh_f64,
                                    rope_f64)


def _gemma_rows(gemma_model, name: str, rows: int = 16):
    t = gemma_model.tensor(name)
    raw = t.raw()[:rows * Q.row_bytes(t.ggml_type, t.k)]
    return t.ggml_type, raw, rows, t.k


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight",
                                  "blk.0.attn_output.weight"], ids=["Q8_0", "Q5_0", "Q6_K", "Q4_K"])
def test_dequantize_exact_on_gemma_blocks(gemma_full, name):
    gemma_model = gemma_full
    """Q8_0/Q5_0/Q6_K: ggml's float32 dequantization is exact (every product fits 24 bits), kept as it is. Q4_K:
    d*sc*q - dmin*m in float64, checked value by value against rational arithmetic, within half a float32 ulp of
    ggml's float32 result (which rounds the difference)."""
    ggml_type, raw, rows, k = _gemma_rows(gemma_model, name)
    exact = dequantize_exact(ggml_type, raw, rows, k)
    ggml = Q.dequantize(ggml_type, raw, rows, k)
    if ggml_type != Q.Q4_K:
        assert exact.dtype == np.float32 and np.array_equal(exact, ggml)
        return
    assert exact.dtype == np.float64
    d, dmin, sc, m, q = Q.q4_K_fields(raw, rows, k)
    for r, b, s, i in [(0, 0, 0, 0), (3, 1, 7, 31), (rows - 1, k // 256 - 1, 5, 17)]:
        truth = Fraction(float(d[r, b])) * int(sc[r, b, s]) * int(q[r, b, s, i]) - \
            Fraction(float(dmin[r, b])) * int(m[r, b, s])
        assert Fraction(float(exact[r, b * 256 + s * 32 + i])) == truth
    assert np.all(np.abs(exact - ggml) <= np.spacing(np.abs(ggml).astype(np.float32)) / 2)
    # Gemma's blocks happen to fit float32; d = 1 + 2^-10 with dmin = 2^-14 (1 + 2^-10) does not (d*sc*q has ulps of
    # ~2^-14, dmin*m bits down to 2^-24): ggml rounds the difference, the reference does not.
    blocks = raw.reshape(-1, 144).copy()
    blocks[:, 0:4] = np.array([0x3C01, 0x0401], "<u2").view(np.uint8)
    exact, ggml = dequantize_exact(ggml_type, blocks, rows, k), Q.dequantize(ggml_type, blocks, rows, k)
    assert np.any(exact != ggml) and np.all(np.abs(exact - ggml) <= np.spacing(np.abs(ggml)) / 2)
    d, dmin, sc, m, q = Q.q4_K_fields(blocks, rows, k)
    assert all(Fraction(float(exact[0, i])) == Fraction(float(d[0, 0])) * int(sc[0, 0, 0]) * int(q[0, 0, 0, i]) -
               Fraction(float(dmin[0, 0])) * int(m[0, 0, 0]) for i in range(32))


def test_dequantize_exact_q5_K(llama, rng):
    """Q5_K (quantized by llama.cpp): the float64 values within half a float32 ulp of ggml's, and exactly
    representable sums (d*sc*q and dmin*m each exact in float32)."""
    w = rng.standard_normal((8, 512)).astype(np.float32)
    raw = llama.quantize_chunk(Q.Q5_K, w)
    exact, ggml = dequantize_exact(Q.Q5_K, raw, 8, 512), Q.dequantize(Q.Q5_K, raw, 8, 512)
    assert exact.dtype == np.float64 and np.all(np.abs(exact - ggml) <= np.spacing(np.abs(ggml)) / 2)
    assert Q.nmse(exact, w) < 1e-2  # it is the weight


def test_reference_ops_against_their_definitions(rng):
    """Each float64 op against a plain float64 statement of its definition; NMSE <= 1e-28 where only the summation
    order differs, and the f32 CPU ops (llama.cpp's arithmetic) within their rounding."""
    ops, f32 = ReferenceOps(), NumpyOps()
    x = rng.standard_normal((7, 64)) * 3
    w = rng.standard_normal(64)
    expect = x / np.sqrt(np.mean(x ** 2, -1, keepdims=True) + 1e-6) * w
    assert Q.nmse(ops.rms_norm(x, w, 1e-6), expect) <= 1e-28
    assert 1e-20 < Q.nmse(f32.rms_norm(x.astype(np.float32), w.astype(np.float32), 1e-6), expect) <= 1e-12

    positions = np.array([0, 1, 5, 77, 300, 2047, 4095])
    h = rng.standard_normal((7, 3, 64))
    for neox in (False, True):
        out = ops.rope(h, positions, 10000.0, neox)
        for t, pos in enumerate(positions):
            for i in range(32):
                a, b = (i, i + 32) if neox else (2 * i, 2 * i + 1)
                angle = pos * 10000.0 ** (-2 * i / 64)
                c, s = np.cos(angle), np.sin(angle)
                np.testing.assert_allclose(out[t, :, a], h[t, :, a] * c - h[t, :, b] * s, rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(out[t, :, b], h[t, :, a] * s + h[t, :, b] * c, rtol=1e-12, atol=1e-12)
        llama_rope = f32.rope(h.astype(np.float32), positions.astype(np.int32), 10000.0, neox)
        assert Q.nmse(llama_rope, out) <= 1e-6  # ggml steps theta by float products: its error grows with position
    assert Q.nmse(rope_f64(h, positions, 10000.0, True), rope_f64(h, positions, 10000.0, False)) > 0.1

    g = rng.standard_normal(1000) * 4
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    assert Q.nmse(gelu_tanh_f64(g), gelu) <= 1e-28
    up = rng.standard_normal(1000)
    table = f32.glu(g.astype(np.float32), up.astype(np.float32), "gelu")  # ggml's fp16 table: f16-rounded inputs
    assert 1e-9 < Q.nmse(table, gelu * up) <= 1e-5
    assert Q.nmse(ops.glu(g, up, "silu"), g / (1 + np.exp(-g)) * up) <= 1e-28


@pytest.mark.parametrize("n_past, tokens, window, chunk", [(0, 13, 0, 1 << 30), (20, 13, 7, 1 << 30),
                                                          (5, 29, 0, 3000), (40, 17, 9, 2000)])
def test_attention_f64_masks_windows_and_chunks(rng, n_past, tokens, window, chunk):
    """Causal GQA (6 heads over 2) at n_past with and without a sliding window, in one query chunk and in chunks
    that leave a tail; rows no query may see hold NaN."""
    h, h_kv, d = 6, 2, 16
    first = max(0, n_past - window + 1) if window else 0
    q = rng.standard_normal((tokens, h, d))
    k_cache = np.full((n_past + tokens + 5, h_kv, d), np.nan)
    v_cache = np.full_like(k_cache, np.nan)
    k_cache[first:n_past + tokens] = rng.standard_normal((n_past + tokens - first, h_kv, d))
    v_cache[first:n_past + tokens] = rng.standard_normal((n_past + tokens - first, h_kv, d))
    out = attention_f64(q, k_cache, v_cache, n_past, 0.25, window, chunk_bytes=chunk)
    assert out.shape == (tokens, h * d) and np.isfinite(out).all()
    ref = np.empty((tokens, h, d))
    for t in range(tokens):
        pos = n_past + t
        keys = [p for p in range(pos + 1) if not window or pos - p < window]
        for head in range(h):
            s = np.array([k_cache[p, head // 3] @ q[t, head] for p in keys]) * 0.25
            p = np.exp(s - s.max())
            ref[t, head] = (p / p.sum()) @ v_cache[keys, head // 3]
    assert Q.nmse(out, ref.reshape(tokens, -1)) <= 1e-28
    with pytest.raises(ShapeError):
        attention_f64(q, k_cache[:n_past + tokens - 1], v_cache, n_past, 0.25, window)


def test_reference_linear_in_row_chunks(gemma_full, rng):
    gemma_model = gemma_full
    """A float32-exact weight (Q5_0) is converted to float64 in row chunks (here 3 rows of 64 at a time, a tail of
    one): the product equals the whole float64 product."""
    ggml_type, raw, rows, k = _gemma_rows(gemma_model, "blk.0.attn_q.weight", rows=64)
    from ggml_ciq.model import Tensor

    tensor = Tensor("q", ggml_type, (rows, k), raw)
    weight = ReferenceOps().load_weight(tensor)
    x = rng.standard_normal((5, k))
    truth = x @ Q.dequantize(ggml_type, raw, rows, k).astype(np.float64).T
    assert Q.nmse(weight(x, chunk_bytes=3 * k * 8), truth) <= 1e-28
    assert Q.nmse(weight(x), truth) <= 1e-28


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    """Every small architecture, 41 tokens in micro-batches of 16 (a tail of 9): logits and hidden states of the
    CPU engine in both semantics and of the reference."""
    tmp = tmp_path_factory.mktemp("small")
    runs = {}
    for arch in catalog.SMALL_ARCHITECTURES:
        model = ModelFile(catalog.write_small_model(tmp / f"{arch}.gguf", arch))
        tokens = np.random.default_rng(41).integers(3, 512, 41)
        for device, semantics in (("cpu", "llamacpp"), ("cpu", "exact"), ("reference", "llamacpp")):
            hidden = []
            engine = Transformer(model, device=device, semantics=semantics, n_ubatch=16)
            runs[arch, device, semantics] = engine.forward(tokens, hidden, all_logits=True), hidden
    return runs


@pytest.mark.parametrize("arch", catalog.SMALL_ARCHITECTURES)
def test_reference_against_the_bit_exact_cpu_engine(native_lib, small_runs, arch):
    """The reference and the CPU engine (llama.cpp CPU's arithmetic bit for bit: Q8_K activations, f16 K/V cache
    and attention weights, the fp16 GELU table) differ only by that rounding. Measured on these random two-layer
    models: hidden-state NMSE per layer 4e-4..4.3e-3, logits KLD 1.2e-4..1.3e-3, top-1 0.83..0.93 (random weights
    with outlier channels turn rounding into flips). A wrong RoPE pairing gives NMSE 0.5, KLD 0.16, top-1 0.34
    (test_reference_catches_a_wrong_op). Bars: about twice the worst measured."""
    ref_logits, ref_hidden = small_runs[arch, "reference", "llamacpp"]
    logits, hidden = small_runs[arch, "cpu", "llamacpp"]
    layers = [Q.nmse(h, r) for h, r in zip(hidden, ref_hidden)]
    a = logits_agreement(logits, ref_logits)
    print(f"{arch}: hidden NMSE per layer {['%.1e' % e for e in layers]}, KLD {a['kld_mean']:.2e}, "
          f"top-1 {a['top1']:.3f}")
    assert len(layers) == 2 and max(layers) <= 1e-2 and a["kld_mean"] <= 3e-3 and a["top1"] >= 0.7
    assert min(layers) > 1e-6  # the two really are different arithmetic


@pytest.mark.parametrize("arch", catalog.SMALL_ARCHITECTURES)
def test_exact_semantics_is_near_the_reference(native_lib, small_runs, arch):
    """The CPU engine's exact semantics (float32 GEMMs on exact weights, no activation quantization, f16 K/V
    cache) against the reference: measured hidden NMSE ~1e-7, KLD ~5e-8; 1000x closer than llamacpp semantics."""
    ref_logits, ref_hidden = small_runs[arch, "reference", "llamacpp"]
    logits, hidden = small_runs[arch, "cpu", "exact"]
    layers = [Q.nmse(h, r) for h, r in zip(hidden, ref_hidden)]
    a = logits_agreement(logits, ref_logits)
    llamacpp = logits_agreement(small_runs[arch, "cpu", "llamacpp"][0], ref_logits)
    print(f"{arch} exact: hidden NMSE {['%.1e' % e for e in layers]}, KLD {a['kld_mean']:.2e}")
    assert max(layers) <= 1e-5 and a["kld_mean"] <= 1e-6 and a["top1"] == 1.0
    assert a["kld_mean"] * 100 < llamacpp["kld_mean"]


def test_reference_catches_a_wrong_op(native_lib, small_runs, tmp_path):
    """The bars above can fail: the reference with llama's RoPE pairing on a NEOX model (qwen3) is far outside them.
    (The small models' activations are too small for GELU's cubic term to matter: a GELU without it stays inside
    the bars, which is why the ops are pinned one by one in test_reference_ops_against_their_definitions.)"""
    model = ModelFile(catalog.write_small_model(tmp_path / "qwen3.gguf", "qwen3"))
    tokens = np.random.default_rng(41).integers(3, 512, 41)

    class WrongPairing(ReferenceOps):
        def rope(self, x, positions, base, neox):
            return super().rope(x, positions, base, not neox)

    hidden = []
    wrong = Transformer(model, ops=WrongPairing(), n_ubatch=16).forward(tokens, hidden, all_logits=True)
    logits, cpu_hidden = small_runs["qwen3", "cpu", "llamacpp"]
    a = logits_agreement(logits, wrong)
    layer = Q.nmse(cpu_hidden[-1], hidden[-1])
    print(f"wrong RoPE pairing: last hidden NMSE {layer:.2e}, KLD {a['kld_mean']:.2e}, top-1 {a['top1']:.3f}")
    assert layer > 1e-2 and a["kld_mean"] > 3e-3


def test_reference_kv_cache_and_micro_batches(native_lib, default_model, rng):
    """The reference keeps float64 K/V caches; 48 tokens at once and in micro-batches of 8 (a different float
    order only in the sums): the same values to 1e-24."""
    tokens = rng.integers(0, 512, 48)
    whole, parts = Transformer(default_model, device="reference"), Transformer(default_model, device="reference",
                                                                               n_ubatch=8)
    a, b = whole.forward(tokens, all_logits=True), parts.forward(tokens, all_logits=True)
    assert whole.kv_cache[0][0].dtype == np.float64 and whole.kv_cache_bytes() == 2 * 2 * 256 * 2 * 64 * 8
    assert a.dtype == np.float32 and Q.nmse(b, a) <= 1e-12  # float32 logits: their own rounding
    assert np.isfinite(a).all()


def test_reference_that_would_not_fit_is_one_line(native_lib, default_model, monkeypatch, capsys):
    """The reference's float64 weights are checked against free host memory before any is made (Llama-3-8B's Q4_K
    weights alone would take 64 GB): prefill --device reference says so in one line, exit 2."""
    import os

    from ggml_ciq import cli

    sysconf = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 1 if name == "SC_AVPHYS_PAGES" else sysconf(name))
    rc = cli.main(["prefill", str(default_model.path), "--device", "reference", "--tokens", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "float64 reference" in err[0] and "GiB" in err[0], err


def test_make_ops_picks_the_semantics(native_lib):
    assert type(make_ops("cpu")) is NumpyOps and type(make_ops("cpu", "llamacpp")) is NumpyOps
    assert type(make_ops("cpu", "exact")) is ExactCpuOps
    assert type(make_ops("cpu", "fast")) is NumpyOps  # the host's fastest path is llama.cpp's arithmetic
    assert type(make_ops("reference")) is ReferenceOps
    with pytest.raises(InvalidArgumentError, match="unknown semantics 'f16'"):
        make_ops("cpu", "f16")


@pytest.mark.gpu
def test_gpu_fast_semantics_runs_the_auto_kernels(native_lib, tmp_path, rng):
    """fast = AUTO: wgmma for the K-quants above 8 tokens on Hopper (mma elsewhere), the q32 variant, mma attention;
    counted by the dispatch counters."""
    if native.device_count() == 0:
        pytest.skip("needs a CUDA device and libggml_ciq built with CUDA")
    ops = make_ops("cuda", "fast")
    assert (ops.semantics, ops.attention_kernel, ops.q32_kernel) == ("any", "auto", True)
    assert ops.op_order == "host"
    path = catalog.write_small_model(tmp_path / "gemma3.gguf", "gemma3")
    native.dispatch_reset()
    Transformer(ModelFile(path), ops=ops, n_ubatch=16).forward(rng.integers(3, 512, 41), all_logits=True)
    variant = "wgmma" if native.variant_available("cuda", "wgmma") else "mma"
    counts = native.dispatch_counts()
    assert counts[(variant, "Q4_K")] > 0 and counts[("cpu", "Q4_K")] == 0
    if variant == "wgmma":  # micro-batches of 16, 16 and 9 tokens: all above mmvq's 8
        assert counts[("mma", "Q4_K")] == 0 and counts[("mmvq", "Q4_K")] == 0


@pytest.mark.gpu
def test_gpu_llamacpp_semantics_small_batches_run_mmvq(native_lib, tmp_path, rng):
    """llamacpp on a GPU follows llama.cpp's kernel choice per micro-batch: 1..8 tokens through `mmvq` (its
    mul_mat_vec_q semantics) for every quantized weight, more through MMQ's (`mma`, q32)."""
    if native.device_count() == 0:
        pytest.skip("needs a CUDA device and libggml_ciq built with CUDA")
    path = catalog.write_small_model(tmp_path / "gemma3.gguf", "gemma3")
    engine = Transformer(ModelFile(path), device="cuda", semantics="llamacpp", n_ubatch=8)
    native.dispatch_reset()
    engine.forward(rng.integers(3, 512, 13), all_logits=True)  # micro-batches of 8 and 5 tokens
    counts = native.dispatch_counts()
    assert counts[("mmvq", "Q4_K")] > 0 and counts[("mma", "Q4_K")] == 0 and counts[("wgmma", "Q4_K")] == 0
    # and llama.cpp CUDA's flash attention arithmetic and norm/RoPE/GLU order
    assert engine.ops.op_order == "llamacpp_cuda"
    attention = native.attention_dispatch_counts()
    assert attention["mma_llamacpp"] == 2 * 2 and attention["mma"] == 0  # 2 layers x 2 micro-batches


@pytest.mark.gpu
@pytest.mark.parametrize("semantics", ["llamacpp", "exact"])
def test_gpu_semantics_select_their_kernels(native_lib, semantics, tmp_path, rng):
    """On a GPU: llamacpp = MMQ semantics (keep-quant `mma`, the `q32` variant for 32-value blocks, mma attention);
    exact = f16 semantics (`wgmma` on Hopper), 32-value blocks as bf16, SIMT attention. Each against the reference:
    exact at most half llamacpp's KLD."""
    if native.device_count() == 0:
        pytest.skip("needs a CUDA device and libggml_ciq built with CUDA")
    ops = make_ops("cuda", semantics)
    wgmma = native.variant_available("cuda", "wgmma")
    expected = ("mmq", "mma_llamacpp", True) if semantics == "llamacpp" else ("f16" if wgmma else "mmq", "simt", False)
    assert (ops.semantics, ops.attention_kernel, ops.q32_kernel) == expected
    path = catalog.write_small_model(tmp_path / "gemma3.gguf", "gemma3")
    tokens = rng.integers(3, 512, 41)
    native.dispatch_reset()
    gpu = Transformer(ModelFile(path), ops=ops, n_ubatch=16).forward(tokens, all_logits=True)
    counts = native.dispatch_counts()
    variant = "mma" if expected[0] == "mmq" else "wgmma"
    assert counts[(variant, "Q4_K")] == 3 * 2 * 5 and counts[("cpu", "Q4_K")] == 0
    attention = native.attention_dispatch_counts()  # every layer's attention in the semantics' kernel
    ran, other = ("mma_llamacpp", "simt") if semantics == "llamacpp" else ("simt", "mma_llamacpp")
    assert attention[ran] >= 3 * 2 and attention[other] == 0 and attention["mma"] == 0
    reference = Transformer(ModelFile(path), device="reference", n_ubatch=16).forward(tokens, all_logits=True)
    a = logits_agreement(gpu, reference)
    print(f"gemma3 cuda {semantics} vs reference: KLD {a['kld_mean']:.2e}, top-1 {a['top1']:.3f}; {counts}")
    assert np.isfinite(gpu).all() and a["kld_mean"] <= 3e-3
