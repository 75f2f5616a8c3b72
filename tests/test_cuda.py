"""CUDA kernels against the numpy references of their semantics and against llama.cpp CUDA MMQ.

Skipped (not failed) without a CUDA device. Every GEMM runs on a NaN-poisoned output, fresh random inputs, and
asserts through the dispatch counters that the named kernel ran."""

import numpy as np
import pytest

from ggml_ciq import native
from ggml_ciq import quants as Q
from ggml_ciq.errors import CiqError

TAIL_TOKENS = (1, 15, 17, 128, 131, 512)


@pytest.fixture(scope="module", autouse=True)
def gpu(native_lib):
    if native.device_count() == 0:
        pytest.skip("no CUDA device (or libggml_ciq built without CUDA)")
    return native.device_name("cuda")


def hopper() -> bool:
    """An sm_90 GPU and a build with sm_90a code: wgmma must be available (a silent fallback fails the tests)."""
    return "sm_90" in native.device_name("cuda") and "90a" in native.build_info()["cuda_archs"]


@pytest.fixture(scope="module")
def variants(gpu):
    base = ("wmma", "wmma-wide", "wmma-shared", "wmma-bigtile", "mma")
    assert native.variant_available("cuda", "wgmma") == hopper()
    return base + (("wgmma",) if hopper() else ())


@pytest.fixture(scope="module")
def wgmma(gpu):
    if not hopper():
        pytest.skip("wgmma needs an sm_90 GPU and a build with sm_90a")


def run_checked(weight, x, variant, **raw):
    native.dispatch_reset()
    semantics = native.variant_info(variant).semantics
    out = native.gemm(weight, x, variant=variant, device="cuda", semantics=semantics, **raw)
    counts = native.dispatch_counts()
    name = Q.type_name(raw.get("ggml_type", getattr(weight, "ggml_type", None)))
    assert counts[(variant, name)] == 1 and sum(counts.values()) == 1, counts
    assert np.isfinite(out).all(), f"{variant}: unwritten (poisoned) outputs"
    return out


def _inputs(rng):
    tied = np.zeros((3, 512), np.float32)
    tied[:, 7], tied[:, 200] = 2.5, -2.5
    return (rng.standard_normal((131, 1024)).astype(np.float32), np.zeros((17, 256), np.float32), tied,
            (rng.standard_normal((5, 256)) * 1e30).astype(np.float32),
            (rng.standard_normal((5, 256)) * 1e-30).astype(np.float32))


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q6_K])
def test_gpu_q8_K_byte_identical(weight_type, rng):
    for x in _inputs(rng):
        assert np.array_equal(native.quantize_activations(x, "cpu", weight_type, "cuda"),
                              Q.quantize_q8_K(x).view(np.uint8).reshape(-1))


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("pad", [0, 64])
def test_gpu_q8_1_mmq_mirrors_llamacpp_fast_math(weight_type, pad, rng):
    """The GPU quantizer uses llama.cpp's fast-math division: the same bytes as the IEEE reference except d within
    2 ulp (exact after fp16 rounding almost always) and q off by one only at rounding ties. pad: K 64 short of a
    multiple of 128 (the last block's second half zero: q 0, d 0, s 0 as llama.cpp pads)."""
    for x in _inputs(rng):
        x = x[:, :x.shape[1] - pad] if pad else x
        tokens, k = x.shape
        gpu = native.quantize_activations(x, "mmq", weight_type, "cuda").reshape(Q.q8_1_mmq_blocks(k), tokens, 144)
        if pad:
            assert not gpu[-1, :, 16 + 64:].any() and not gpu[-1, :, 8:16].any()
        ref = Q.quantize_q8_1_mmq(x, weight_type)
        q_gpu, d_gpu, s_gpu = Q.q8_1_mmq_fields(gpu, weight_type, tokens, k)
        q_ref, d_ref, s_ref = Q.q8_1_mmq_fields(ref, weight_type, tokens, k)
        assert np.abs(q_gpu - q_ref).max() <= 1 and np.mean(q_gpu != q_ref) < 1e-3
        assert np.allclose(d_gpu, d_ref, rtol=2.5e-7 if weight_type == Q.Q6_K else 1e-3, atol=0)
        if s_gpu is not None:
            assert np.array_equal(s_gpu, s_ref, equal_nan=True)


def reference(weight_type, data, rows, k, x, semantics):
    """The numpy reference of a semantics; for mmq on the GPU's own quantized activations (same bytes)."""
    if semantics == "cpu":
        return Q.gemm_cpu_semantics(weight_type, data, rows, k, x)
    if semantics == "f16":
        return Q.gemm_f16_semantics(weight_type, data, rows, k, x)
    xq = native.quantize_activations(x, "mmq", weight_type, "cuda")
    return Q.gemm_mmq_semantics_quantized(weight_type, data, rows, k, xq, x.shape[0])


def test_gpu_f16_layout_byte_identical(rng):
    for x in _inputs(rng) + ((rng.standard_normal((3, 512)) * 1e5).astype(np.float32),):
        assert np.array_equal(native.quantize_activations(x, "f16", Q.Q4_K, "cuda"), Q.f16_layout(x))


def test_every_variant_on_model_tensors(model, variants, rng):
    for t in model.weights():
        for tokens in (1, 17, 131):
            x = rng.standard_normal((tokens, t.k)).astype(np.float32)
            refs = {s: reference(t.ggml_type, t.raw(), t.rows, t.k, x, s) for s in ("cpu", "mmq", "f16")}
            for variant in variants:
                out = run_checked(t, x, variant)
                assert Q.nmse(out, refs[native.variant_info(variant).semantics]) <= 1e-10, (t.name, tokens, variant)


@pytest.mark.parametrize("rows", [1000, 4097, 14336])
@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q6_K])
def test_tail_shapes(rows, weight_type, variants, rng):
    k = 1024
    w = (rng.standard_normal((rows, k)) * 0.02).astype(np.float32)
    data = Q.quantize_q4_K(w) if weight_type == Q.Q4_K else Q.quantize_q6_K(w)
    for tokens in TAIL_TOKENS:
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        refs = {s: reference(weight_type, data, rows, k, x, s) for s in ("cpu", "mmq", "f16")}
        for variant in variants:
            out = run_checked(data, x, variant, ggml_type=weight_type, rows=rows, k=k)
            assert Q.nmse(out, refs[native.variant_info(variant).semantics]) <= 1e-10, (rows, tokens, variant)


@pytest.mark.parametrize("variant", ["wmma-shared", "wmma-bigtile"])
def test_staged_variants_with_partial_block_tiles(variant, rng):
    """Tile counts that are not multiples of the block's warps (8 row tiles) or of bigtile's 3 token tiles."""
    for rows, tokens in ((16 * 9, 16 * 4), (16 * 9 + 5, 16 * 4 + 1), (16 * 7 + 3, 16 * 2), (8, 49)):
        w = (rng.standard_normal((rows, 512)) * 0.02).astype(np.float32)
        data = Q.quantize_q6_K(w)
        x = rng.standard_normal((tokens, 512)).astype(np.float32)
        ref = Q.gemm_cpu_semantics(Q.Q6_K, data, rows, 512, x)
        out = run_checked(data, x, variant, ggml_type=Q.Q6_K, rows=rows, k=512)
        assert Q.nmse(out, ref) <= 1e-10, (rows, tokens)


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_wgmma_tiles_splits_and_tails(weight_type, wgmma, rng):
    """Every tile width (64/128/256 tokens) and split-K factor (cluster size) the planner picks, odd row and token
    counts, large activations (f16 range), both weight paths of Q6_K: staged by TMA (K = 4096, 2048: 16-byte row
    pitch) and read into registers (K = 768, 2304, 1024, 256: 630 B ... rows); Q4_K and Q5_K always staged."""
    for rows, k, tokens in ((128, 4096, 64), (1000, 768, 3), (4097, 2048, 131), (1024, 4096, 512),
                            (300, 2304, 257), (2048, 1024, 2047), (129, 256, 1)):
        data = _k_quant_weights(rng, weight_type, rows, k)
        x = (rng.standard_normal((tokens, k)) * rng.choice([1e-3, 1.0, 3e4], size=(tokens, 1))).astype(np.float32)
        out = run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k)
        assert Q.nmse(out, Q.gemm_f16_semantics(weight_type, data, rows, k, x)) <= 1e-10, (rows, k, tokens)


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q6_K, Q.Q5_0])
def test_wgmma_tail_split(weight_type, wgmma, rng, monkeypatch):
    """The planner's tail (whole waves unsplit, the last partial wave's tiles split-K in a second launch) on shapes
    where it applies (a stacked gate/up at 512 tokens: 448 tiles of 256 tokens on 132 SMs; 140 and 141 row tiles,
    odd rows and tokens; K-quants staged by TMA and read into registers, a 32-value type): against the numpy f16
    semantics as every wgmma plan, and not the same bits as GGML_CIQ_WGMMA_TAIL=0 (the split ran: its float32 sums
    fold in another order), NaN-poisoned outputs."""
    shapes = ((28672, 2048, 512), (17920, 1024, 200), (140 * 128 + 5, 2304 if weight_type == Q.Q6_K else 1024, 251))
    for rows, k, tokens in shapes:
        data = (block32_weights(rng, weight_type, rows, k) if weight_type in Q.Q32_TYPES else
                _k_quant_weights(rng, weight_type, rows, k))
        x = (rng.standard_normal((tokens, k)) * rng.choice([1e-3, 1.0, 3e4], size=(tokens, 1))).astype(np.float32)
        ref = Q.gemm_f16_semantics(weight_type, data, rows, k, x)
        whole_waves, tail = _wgmma_with(monkeypatch, "GGML_CIQ_WGMMA_TAIL", ("0", "1"), data, x, weight_type, rows, k)
        assert Q.nmse(tail, ref) <= 1e-10 and Q.nmse(whole_waves, ref) <= 1e-10, (rows, k, tokens)
        assert not np.array_equal(tail, whole_waves), (rows, k, tokens)


def _k_quant_weights(rng, weight_type, rows, k):
    quantize = {Q.Q4_K: Q.quantize_q4_K, Q.Q5_K: Q.quantize_q5_K, Q.Q6_K: Q.quantize_q6_K}[weight_type]
    return quantize((rng.standard_normal((rows, k)) * 0.02).astype(np.float32))


def _wgmma_with(monkeypatch, switch, values, data, x, weight_type, rows, k):
    """wgmma's outputs with the environment switch at each of `values` in turn (run_checked: poisoned, counted)."""
    outs = []
    for value in values:
        monkeypatch.setenv(switch, value)
        outs.append(run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k))
    return outs


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_wgmma_stream_k_forced(weight_type, wgmma, rng, monkeypatch):
    """GGML_CIQ_WGMMA_STREAMK=2 (every tile streamed: one CTA an SM, each a contiguous range of the tiles' K units, a
    tile's partial sums handed to the CTA that finishes it): ranges of one unit (up to 15 peers a tile), ranges over
    several tiles, whole tiles only, odd rows and tokens, a multi-wave shape, each tile shape (GGML_CIQ_WGMMA_CONFIG:
    64/128/256 tokens, 7/5/3 stages, 2/2/1 producer warpgroups), PDL off once. Against the numpy f16 semantics; each case
    runs after another input's run, so a stale hand-over (a flag left raised) would mix the other input's partials in;
    the same bits when run again; other bits than the plain plan where its float order must differ (ranges of one unit
    against split-K shares of two or more; ranges that cross tiles at other units than a split), the same where both
    add whole tiles (differ None: the plan may or may not fold in the same order)."""
    cases = [(rows, k, tokens, differ, {}) for rows, k, tokens, differ in
             ((300, 2048, 131, None), (1000, 4096, 64, True), (129, 256, 1, False), (4097, 2048, 257, None),
              (20000, 2048, 300, True))]
    cases += [(2049, 2048, 131, None, {"GGML_CIQ_WGMMA_CONFIG": str(c)}) for c in range(3)]
    cases += [(1000, 4096, 64, True, {"GGML_CIQ_WGMMA_PDL": "0"})]
    for rows, k, tokens, differ, env in cases:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        data = _k_quant_weights(rng, weight_type, rows, k)
        x, other = (rng.standard_normal((2, tokens, k)) * rng.choice([1e-3, 1.0, 3e4], size=(2, tokens, 1))).astype(np.float32)
        ref = Q.gemm_f16_semantics(weight_type, data, rows, k, x)
        monkeypatch.setenv("GGML_CIQ_WGMMA_STREAMK", "0")
        plain = run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k)
        monkeypatch.setenv("GGML_CIQ_WGMMA_STREAMK", "2")
        run_checked(data, other, "wgmma", ggml_type=weight_type, rows=rows, k=k)
        streamed = run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k)
        assert Q.nmse(streamed, ref) <= 1e-10 and Q.nmse(plain, ref) <= 1e-10, (rows, k, tokens)
        assert np.array_equal(run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k), streamed)
        if differ is not None:
            assert np.array_equal(streamed, plain) != differ, (rows, k, tokens)
        for name in env:
            monkeypatch.delenv(name)


def test_wgmma_stream_k_graph_replays(wgmma, rng, monkeypatch):
    """A stream-K GEMM (every tile streamed, ranges of one unit: 15 peers a tile) captured in a CUDA graph and replayed,
    each replay into a NaN-poisoned output after an eager run on another input: the eager bits every time (the owners
    lower the flags their peers raised, so a replay hands over its own sums, not the last run's)."""
    monkeypatch.setenv("GGML_CIQ_WGMMA_STREAMK", "2")
    n = native.load()
    rows, k, tokens = 1000, 4096, 64
    data = _k_quant_weights(rng, Q.Q4_K, rows, k)
    x, other = rng.standard_normal((2, tokens, k)).astype(np.float32)
    device = native.parse_device("cuda")
    w, xb, ob = native.Buffer.from_array(device, data), native.Buffer.from_array(device, x), native.Buffer.from_array(device, other)
    out = native.Buffer(device, tokens * rows * 4)
    plan = n.ffi.new("ciq_plan *")
    n.check(n.lib.ciq_gemm_plan(device, native.variant_id("wgmma"), n.lib.CIQ_SEMANTICS_ANY, Q.Q4_K, rows, k, tokens, plan))

    def gemm(src):
        n.check(n.lib.ciq_gemm(device, plan.variant, plan.semantics, Q.Q4_K, w.ptr, w.nbytes, rows, k,
                               n.ffi.cast("float *", src.ptr), tokens, out.ptr, n.lib.CIQ_OUT_F32))

    handle = n.ffi.new("void **")
    try:
        gemm(xb)
        eager = out.download(np.float32, (tokens, rows))
        assert Q.nmse(eager, Q.gemm_f16_semantics(Q.Q4_K, data, rows, k, x)) <= 1e-10
        n.check(n.lib.ciq_graph_capture_begin(device))
        gemm(xb)
        n.check(n.lib.ciq_graph_capture_end(device, handle))
        for _ in range(3):
            gemm(ob)
            out.upload(np.full((tokens, rows), np.nan, np.float32))
            n.check(n.lib.ciq_graph_launch(handle[0]))
            assert np.array_equal(out.download(np.float32, (tokens, rows)), eager)
    finally:
        if handle[0] != n.ffi.NULL:
            n.lib.ciq_graph_free(handle[0])
        for b in (w, xb, ob, out):
            b.close()


def test_wgmma_stream_k_not_where_weights_go_to_registers(wgmma, rng, monkeypatch):
    """Q6_K with K % 2048 != 0 reads its weights into registers, whose kernels do not stream: the same bits forced."""
    rows, k, tokens = 3000, 2304, 131
    data = _k_quant_weights(rng, Q.Q6_K, rows, k)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    monkeypatch.setenv("GGML_CIQ_WGMMA_STREAMK", "0")
    plain = run_checked(data, x, "wgmma", ggml_type=Q.Q6_K, rows=rows, k=k)
    monkeypatch.setenv("GGML_CIQ_WGMMA_STREAMK", "2")
    assert np.array_equal(run_checked(data, x, "wgmma", ggml_type=Q.Q6_K, rows=rows, k=k), plain)


@pytest.mark.parametrize("switch, bad_values", [("GGML_CIQ_WGMMA_STREAMK", ("on", "3", "12", "-1")),
                                                ("GGML_CIQ_WGMMA_RS", ("on", "2", "10", "-1"))])
def test_wgmma_switches_refuse_other_values(switch, bad_values, wgmma, rng, monkeypatch):
    """A value of GGML_CIQ_WGMMA_STREAMK other than 0, 1 or 2, or of GGML_CIQ_WGMMA_RS other than 0 or 1, is an error
    naming the variable, not a guess."""
    data = _k_quant_weights(rng, Q.Q4_K, 256, 256)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    for bad in bad_values:
        monkeypatch.setenv(switch, bad)
        with pytest.raises(CiqError, match=f"{switch}='{bad}'"):
            native.gemm(data, x, variant="wgmma", device="cuda", semantics="f16", ggml_type=Q.Q4_K, rows=256, k=256)


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q6_K])
def test_wgmma_stream_k_planned(weight_type, wgmma, rng, monkeypatch):
    """Where the planner streams (224 tiles of 256 tokens on 132 SMs, 1.7 tiles a CTA; 336 tiles, the full wave
    unsplit and the rest streamed; odd rows and tokens): against the numpy f16 semantics, and not the same bits as
    GGML_CIQ_WGMMA_STREAMK=0 (the hand-over ran); not where a CTA's range would be less than a tile (96 tiles of 128
    tokens, 6 units of 8: measured slower), the same bits there."""
    for rows, k, tokens, streams in ((14333, 2048, 509, True), (10663, 2048, 1000, True), (12285, 2048, 127, False)):
        data = _k_quant_weights(rng, weight_type, rows, k)
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        ref = Q.gemm_f16_semantics(weight_type, data, rows, k, x)
        plain, planned = _wgmma_with(monkeypatch, "GGML_CIQ_WGMMA_STREAMK", ("0", "1"), data, x, weight_type, rows, k)
        assert Q.nmse(planned, ref) <= 1e-10 and Q.nmse(plain, ref) <= 1e-10, (rows, k, tokens)
        assert np.array_equal(planned, plain) != streams, (rows, k, tokens)


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_wgmma_rs_same_bits_as_ss(weight_type, wgmma, rng, monkeypatch):
    """The RS form (consumers dequantize into wgmma's register operand; GGML_CIQ_WGMMA_RS=1, the default) against the
    SS form (=0) on the same plan: the same bits (the same f16 weights, K slices and accumulation order), both within
    1e-10 of the numpy f16 semantics, on NaN-poisoned outputs, and the launch counters naming the form that ran. Tiles of
    64, 128 and 256 tokens (GGML_CIQ_WGMMA_CONFIG), row and token tails, split-K clusters (1024 x 4096 at 512 tokens),
    stream-K forced (ranges of one unit; at 256 tokens ranges over several tiles, the epilogue's sums over the staged
    weight slots between segments), one token, PDL off once; a Q6_K matrix whose rows have no 16-byte pitch (K = 2304)
    reads its weights into registers and stays SS."""
    cases = [(300, 2048, 131, {"GGML_CIQ_WGMMA_CONFIG": "1"}), (1000, 4096, 64, {"GGML_CIQ_WGMMA_CONFIG": "0"}),
             (4097, 2048, 257, {"GGML_CIQ_WGMMA_CONFIG": "1"}), (129, 256, 1, {"GGML_CIQ_WGMMA_CONFIG": "0"}),
             (1024, 4096, 512, {"GGML_CIQ_WGMMA_CONFIG": "1"}), (1024, 4096, 512, {"GGML_CIQ_WGMMA_CONFIG": "2"}),
             (4097, 2048, 509, {"GGML_CIQ_WGMMA_CONFIG": "2"}), (129, 256, 3, {"GGML_CIQ_WGMMA_CONFIG": "2"}),
             (1000, 4096, 64, {"GGML_CIQ_WGMMA_CONFIG": "1", "GGML_CIQ_WGMMA_STREAMK": "2"}),
             (20000, 2048, 300, {"GGML_CIQ_WGMMA_CONFIG": "2", "GGML_CIQ_WGMMA_STREAMK": "2"}),
             (2049, 2048, 131, {"GGML_CIQ_WGMMA_CONFIG": "0", "GGML_CIQ_WGMMA_PDL": "0"})]
    if weight_type == Q.Q6_K:
        cases.append((3000, 2304, 131, {"GGML_CIQ_WGMMA_CONFIG": "1"}))
    for rows, k, tokens, env in cases:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        staged = weight_type != Q.Q6_K or k % 2048 == 0
        data = _k_quant_weights(rng, weight_type, rows, k)
        x = (rng.standard_normal((tokens, k)) * rng.choice([1e-3, 1.0, 3e4], size=(tokens, 1))).astype(np.float32)
        outs = {}
        for rs in ("0", "1"):
            monkeypatch.setenv("GGML_CIQ_WGMMA_RS", rs)
            outs[rs] = run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k)
            counts = native.wgmma_launch_counts()
            ran_rs = rs == "1" and staged
            assert counts["rs" if ran_rs else "ss"] >= 1 and counts["ss" if ran_rs else "rs"] == 0, (rows, k, rs, counts)
            assert (counts["stream_k"] > 0) == ("GGML_CIQ_WGMMA_STREAMK" in env), (rows, k, rs, counts)
        ref = Q.gemm_f16_semantics(weight_type, data, rows, k, x)
        assert Q.nmse(outs["1"], ref) <= 1e-10 and Q.nmse(outs["0"], ref) <= 1e-10, (rows, k, tokens)
        assert np.array_equal(outs["1"], outs["0"]), (rows, k, tokens, env)
        for name in env:
            monkeypatch.delenv(name)


def block32_weights(rng, ggml_type: int, rows: int, k: int) -> np.ndarray:
    """Raw Q4_0/Q5_0/Q8_0/Q4_1/Q5_1 blocks: random quants (every bit pattern, the high bits included) and fp16
    scales (and Q4_1/Q5_1 offsets m) of either sign spread over 2^-14 .. 2^-2 (f16 products from subnormal to
    large)."""
    values, nbytes = Q.BLOCK_LAYOUT[ggml_type]
    blocks = rng.integers(0, 256, (rows * k // values, nbytes), dtype=np.uint8)
    for offset in (0, 2) if ggml_type in Q.Q32_1_TYPES else (0,):
        d = (rng.choice([-1.0, 1.0], len(blocks)) * np.exp2(rng.uniform(-14, -2, len(blocks)))).astype(np.float16)
        blocks[:, offset:offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


BLOCK32_SHAPES = ((2048, 640, 512), (1000, 640, 3), (4097, 2048, 131), (129, 64, 1), (300, 2112, 257),
                  (300, 2176, 131), (256, 640, 2047), (1024, 4096, 64), (262144 // 64, 640, 77))


@pytest.mark.parametrize("weight_type", [Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1])
def test_wgmma_block32_tiles_splits_and_tails(weight_type, wgmma, rng):
    """wgmma on the 32-value block types (two blocks a pipeline stage, read from global memory): every tile width and
    split-K factor the planner picks, K = 64 (one stage) to 4096, K = 2112 and 2176 (33 and 34 stages: neither a
    multiple of one of the raw rings, 2 and 3 sets), odd row and token counts, activations from 1e-3 to 3e4 (f16 range) - against the numpy f16 semantics
    (q * d, Q4_1/Q5_1 fma(q, d, m), rounded once to f16), NaN-poisoned outputs, the dispatch counter naming wgmma."""
    for rows, k, tokens in BLOCK32_SHAPES:
        data = block32_weights(rng, weight_type, rows, k)
        x = (rng.standard_normal((tokens, k)) * rng.choice([1e-3, 1.0, 3e4], size=(tokens, 1))).astype(np.float32)
        out = run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k)
        ref = Q.gemm_f16_semantics(weight_type, data, rows, k, x)
        assert Q.nmse(out, ref) <= 1e-10, (rows, k, tokens)
        # and the f16 weights are within one f16 rounding of ggml's own dequantization
        exact = Q.gemm_f64(weight_type, data, rows, k, x)
        assert Q.nmse(out, exact) <= 1e-5, (rows, k, tokens, Q.nmse(out, exact))


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q5_0, Q.Q8_0, Q.Q5_1])
def test_wgmma_programmatic_launch_same_values(weight_type, wgmma, rng, monkeypatch):
    """GGML_CIQ_WGMMA_PDL=1 (the GEMM launched while the activation conversion still runs, waiting on it): the same
    bits as the ordinary launch, on a split-K shape, a multi-wave one and a tail; K-quants also with (Q6_K, K = 2304)
    weights read into registers, the 32-value block types (whose producers prefetch weights before waiting on the
    conversion) at Gemma's K = 640 and K = 2112. The conversion's scratch holds another input's bytes before each PDL
    run, so a GEMM reading it before the conversion is done gets other values."""
    block32 = weight_type in Q.Q32_TYPES + Q.Q32_1_TYPES
    shapes = (((1024, 640, 512), (4097, 2112, 131), (14336, 4096, 512)) if block32 else
              ((1024, 4096, 512), (4097, 2048, 131), (14336, 4096, 512), (300, 2304, 257)))
    for rows, k, tokens in shapes:
        data = block32_weights(rng, weight_type, rows, k) if block32 else _k_quant_weights(rng, weight_type, rows, k)
        x, other = (rng.standard_normal((2, tokens, k)) * [[[1.0]], [[3e3]]]).astype(np.float32)
        monkeypatch.setenv("GGML_CIQ_WGMMA_PDL", "0")
        plain = run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k)
        stale = run_checked(data, other, "wgmma", ggml_type=weight_type, rows=rows, k=k)
        assert not np.array_equal(stale, plain)
        monkeypatch.setenv("GGML_CIQ_WGMMA_PDL", "1")
        assert np.array_equal(run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k), plain), (rows, k)


def test_auto_picks_wgmma_for_block32_where_k_allows(wgmma):
    """AUTO on Hopper: the 32-block types on wgmma above 8 tokens where K is a multiple of 64 (Gemma's 640), q32 at
    1..8 tokens; at K = 96 q32 (its q8_1-mmq activations zero-padded; wgmma needs K % 64); f16 semantics there is an
    error naming the multiple, not a wrong kernel."""
    assert native.resolve_variant("auto", "cuda", "any", Q.Q5_0, 2048, 640, 512) == "wgmma"
    assert native.resolve_variant("auto", "cuda", "any", Q.Q8_0, 262144, 640, 9) == "wgmma"
    assert native.resolve_variant("auto", "cuda", "any", Q.Q8_0, 262144, 640, 8) == "q32"
    assert native.resolve_variant("auto", "cuda", "any", Q.Q4_0, 512, 384, 512) == "wgmma"
    assert native.resolve_variant("auto", "cuda", "any", Q.Q5_0, 512, 96, 512) == "q32"  # any K % 32 (API v17)
    assert native.resolve_variant("auto", "cuda", "f16", Q.Q5_0, 512, 640, 1) == "wgmma"
    for t in (Q.Q4_1, Q.Q5_1):  # API v18: wgmma takes them (fma(q, d, m)), q32 at 1..8 tokens (MMQ's formula)
        assert native.resolve_variant("auto", "cuda", "any", t, 576, 576, 512) == "wgmma"
        assert native.resolve_variant("auto", "cuda", "any", t, 576, 576, 8) == "q32"
    with pytest.raises(CiqError, match=r"f16 semantics for Q8_0 weights at K = 96 \(wgmma needs a multiple of 64\)"):
        native.resolve_variant("auto", "cuda", "f16", Q.Q8_0, 512, 96, 512)
    with pytest.raises(CiqError, match="kernel variant wgmma needs K a multiple of 64, got 96"):
        native.resolve_variant("wgmma", "cuda", "f16", Q.Q8_0, 512, 96, 512)


def test_auto_picks_wgmma_on_hopper_for_prefill(wgmma):
    assert native.resolve_variant("auto", "cuda", "any", Q.Q4_K, 4096, 4096, 512) == "wgmma"
    assert native.resolve_variant("auto", "cuda", "any", Q.Q6_K, 4096, 4096, 4) == "mmvq"  # llama.cpp: MMVQ
    assert native.resolve_variant("auto", "cuda", "f16", Q.Q6_K, 4096, 4096, 4) == "wgmma"
    assert native.resolve_variant("auto", "cuda", "any", Q.Q5_K, 4096, 4096, 512) == "wgmma"  # API v18
    assert native.resolve_variant("auto", "cuda", "any", Q.Q5_K, 4096, 4096, 4) == "mmvq"


def test_bf16_output(default_model, rng):
    t = default_model.weights()[2]
    x = rng.standard_normal((33, t.k)).astype(np.float32)
    f32 = native.gemm(t, x, variant="mma", device="cuda")
    bf16 = native.gemm(t, x, variant="mma", device="cuda", out_type="bf16")
    assert 0 < Q.nmse(bf16, f32) < 1e-4


def test_auto_resolves_per_semantics():
    assert native.resolve_variant("auto", "cuda", "mmq", Q.Q4_K, 4096, 4096, 512) == "mma"
    assert native.plan("auto", "cuda", "cpu", Q.Q6_K, 4096, 4096, 512).semantics == "cpu"


def test_environment_default_variant(monkeypatch, default_model, rng):
    t = default_model.weights()[0]
    x = rng.standard_normal((5, t.k)).astype(np.float32)
    monkeypatch.setenv("GGML_CIQ_VARIANT", "wmma-wide")
    assert native.resolve_variant("auto", "cuda", "cpu", t.ggml_type, t.rows, t.k, 5) == "wmma-wide"
    native.dispatch_reset()
    native.gemm(t, x, variant="auto", device="cuda", semantics="cpu")
    assert native.dispatch_counts()[("wmma-wide", t.type_name)] == 1
    monkeypatch.setenv("GGML_CIQ_VARIANT", "turbo")
    with pytest.raises(Exception, match="GGML_CIQ_VARIANT=turbo"):
        native.gemm(t, x, variant="auto", device="cuda")


def test_dense_bf16_ceiling_and_bench_cli(tmp_path):
    import json
    import subprocess
    import sys
    import tempfile

    proc = subprocess.run([sys.executable, "-m", "ggml_ciq.cli", "bench", "gemm", "--backend", "ciq-cuda", "--shape",
                           "Q4_K:1000:1024", "--tokens", "17", "--variants", "wmma,mma", "--no-llamacpp", "--repeat",
                           "2", "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")],
                          capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == ["wmma", "mma"]
    assert all(r["us"] > 0 and r["bf16_us"] > 0 and r["best_us"] <= r["us"] and r["host_us"] > 0 for r in rows)
    # each variant on the weight types it multiplies only: q32 on the 32-block types, mma on the K-quants
    proc = subprocess.run([sys.executable, "-m", "ggml_ciq.cli", "bench", "gemm", "--backend", "ciq-cuda", "--shape",
                           "Q4_K:1000:1024", "--shape", "Q8_0:333:1152", "--shape", "Q5_0:64:128", "--tokens", "17",
                           "--variants", "mma,q32", "--no-llamacpp", "--no-ceiling", "--repeat", "2", "--json",
                           str(tmp_path / "q.json")], capture_output=True, text=True, cwd=tempfile.gettempdir(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "q.json").read_text())["rows"]
    assert [(r["type"], r["variant"]) for r in rows] == [("Q4_K", "mma"), ("Q8_0", "q32"), ("Q5_0", "q32")]
    assert all(r["us"] > 0 for r in rows)


@pytest.fixture(scope="module")
def llama_cuda(llama):
    if "CUDA0" not in llama.devices():
        pytest.skip(f"llama.cpp at {llama.lib_dir} has no CUDA device (set GGML_CIQ_LLAMACPP_LIB to a CUDA build)")
    return llama


def test_mma_matches_llamacpp_mmq(llama_cuda, model, rng):
    for t in model.weights():
        for tokens in (15, 131):
            x = rng.standard_normal((tokens, t.k)).astype(np.float32)
            ours = run_checked(t, x, "mma")
            theirs = llama_cuda.mul_mat(t.ggml_type, t.raw(), t.rows, t.k, x, device="CUDA0")
            assert Q.nmse(ours, theirs) <= 1e-10, (t.name, tokens)


def test_wgmma_no_less_accurate_than_llamacpp_mmq(llama_cuda, model, wgmma, rng):
    """The f16 path against the float64 truth is at least as close as llama.cpp's MMQ (q8_1 activations)."""
    from ggml_ciq.diff import activations

    from types import SimpleNamespace

    synthetic = []
    for weight_type, quantize in ((Q.Q4_K, Q.quantize_q4_K), (Q.Q6_K, Q.quantize_q6_K)):
        data = quantize((rng.standard_normal((4097, 2048)) * 0.02).astype(np.float32))
        synthetic.append((f"synthetic-{Q.type_name(weight_type)}", weight_type, data, 4097, 2048))
    cases = [(t.name, t.ggml_type, t.raw(), t.rows, t.k) for t in model.weights()] + synthetic
    for name, weight_type, data, rows, k in cases:
        for tokens in (1, 17, 131):
            x = activations(SimpleNamespace(name=name, k=k), tokens, int(rng.integers(1 << 30)))
            truth = Q.gemm_f64(weight_type, data, rows, k, x)
            ours = run_checked(data, x, "wgmma", ggml_type=weight_type, rows=rows, k=k)
            theirs = llama_cuda.mul_mat(weight_type, data, rows, k, x, device="CUDA0")
            assert Q.nmse(ours, truth) <= Q.nmse(theirs, truth), (name, tokens)


@pytest.mark.parametrize("rows", [1000, 4097])
def test_mma_matches_llamacpp_mmq_tails(llama_cuda, rows, rng):
    k = 2048
    for weight_type, quantize in ((Q.Q4_K, Q.quantize_q4_K), (Q.Q6_K, Q.quantize_q6_K)):
        data = quantize((rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
        for tokens in (17, 128, 131, 512):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            ours = run_checked(data, x, "mma", ggml_type=weight_type, rows=rows, k=k)
            theirs = llama_cuda.mul_mat(weight_type, data, rows, k, x, device="CUDA0")
            assert Q.nmse(ours, theirs) <= 1e-10, (weight_type, rows, tokens)


MMQ_ONLY = [(Q.Q4_0, "q32"), (Q.Q5_0, "q32"), (Q.Q8_0, "q32"), (Q.Q4_1, "q32"), (Q.Q5_1, "q32"), (Q.Q5_K, "mma")]


@pytest.mark.parametrize("ggml_type, variant", MMQ_ONLY, ids=[Q.type_name(t) for t, _ in MMQ_ONLY])
@pytest.mark.parametrize("rows, k", [(640, 576), (1000, 1536), (576, 896)])
def test_q32_and_q5k_match_llamacpp_mmq(llama_cuda, ggml_type, variant, rows, k, rng):
    """The 32-block types (q32) and Q5_K (mma) against llama.cpp CUDA's MMQ, bit for bit, on llama.cpp's own
    quantization of Gaussian weights, at the K of real models that are no multiple of 128 (576: SmolLM2; 896: Qwen2.5;
    the activations' last q8_1-mmq block zero-padded as llama.cpp pads src1), rows at and off its 128-row tile, token
    tails, 640 x 576 split by MMQ's stream-k: which kernel ran is counted."""
    if ggml_type == Q.Q5_K and k % 256:
        k = 1024 + 512 if k == 1536 else 768  # Q5_K needs whole 256-value super-blocks
    data = llama_cuda.quantize_chunk(ggml_type, (rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
    for tokens in (9, 131, 512):
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        x[:, 3] *= 40.0  # an outlier channel
        native.dispatch_reset()
        ours = native.gemm(data, x, variant=variant, device="cuda", semantics="mmq", ggml_type=ggml_type, rows=rows,
                           k=k)
        counts = native.dispatch_counts()
        assert counts[(variant, Q.type_name(ggml_type))] == 1 and sum(counts.values()) == 1, counts
        theirs = llama_cuda.mul_mat(ggml_type, data, rows, k, x, device="CUDA0")
        err = Q.nmse(ours, theirs)
        print(f"{Q.type_name(ggml_type)} {rows} x {k} tokens={tokens}: NMSE {err:.2e}")
        assert err <= 1e-10, (Q.type_name(ggml_type), rows, k, tokens, err)


@pytest.mark.parametrize("ggml_type", [Q.Q4_K, Q.Q6_K, Q.Q5_K])
def test_offload_table_on_hopper(wgmma, ggml_type, monkeypatch):
    """The ggml plugin takes a MUL_MAT where the registry's measured table (API v19: CIQ0 takes the whole graph, no
    host waits) says wgmma beats llama.cpp end to end: Llama-3-8B-sized weights (1024 x 4096 values and up) from 16
    tokens, any weight from 128 (Gemma 3 270M's 640-row ones); decode (1..8 tokens) never. GGML_CIQ_OFFLOAD
    overrides."""
    monkeypatch.delenv("GGML_CIQ_OFFLOAD", raising=False)
    take = {(rows, k, tokens): native.plan("auto", "cuda", "any", ggml_type, rows, k, tokens).offload
            for rows, k, tokens in ((1024, 4096, 16), (1024, 4096, 15), (14336, 4096, 2048), (4096, 14336, 33),
                                    (1023, 4096, 127), (1023, 4096, 128), (640, 2048, 512), (640, 1024, 127),
                                    (4096, 4096, 8), (4096, 4096, 1))}
    assert take == {(1024, 4096, 16): True, (1024, 4096, 15): False, (14336, 4096, 2048): True,
                    (4096, 14336, 33): True, (1023, 4096, 127): False, (1023, 4096, 128): True,
                    (640, 2048, 512): True, (640, 1024, 127): False, (4096, 4096, 8): False, (4096, 4096, 1): False}
    monkeypatch.setenv("GGML_CIQ_OFFLOAD", "none")
    assert not native.plan("auto", "cuda", "any", ggml_type, 4096, 4096, 512).offload


@pytest.mark.parametrize("ggml_type", [Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1])
def test_offload_table_block32_on_hopper(wgmma, ggml_type, monkeypatch):
    """The 32-value block types through wgmma from 128 tokens: Q4_1 / Q5_1 at any size, Q4_0 / Q5_0 / Q8_0 only below
    the 8B's smallest weight (1024 x 4096 values), where wgmma is no faster than MMQ."""
    monkeypatch.delenv("GGML_CIQ_OFFLOAD", raising=False)
    any_size = ggml_type in (Q.Q4_1, Q.Q5_1)
    take = {(rows, k, tokens): native.plan("auto", "cuda", "any", ggml_type, rows, k, tokens).offload
            for rows, k, tokens in ((576, 576, 128), (576, 576, 127), (1536, 576, 512), (1023, 4096, 512),
                                    (1024, 4096, 512), (4096, 4096, 2048))}
    assert take == {(576, 576, 128): True, (576, 576, 127): False, (1536, 576, 512): True, (1023, 4096, 512): True,
                    (1024, 4096, 512): any_size, (4096, 4096, 2048): any_size}
