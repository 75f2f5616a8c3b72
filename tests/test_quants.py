"""numpy reference formats: bit-exact with ggml (decode, Q8_K), golden q8_1-mmq, reference GEMMs vs llama.cpp CPU."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggml_ciq import quants as Q
from ggml_ciq.errors import ShapeError, UnsupportedTypeError


def test_decode_bit_exact_with_ggml(llama, model):
    tensors = model.weights()
    assert {t.type_name for t in tensors} == {"Q4_K", "Q6_K"}
    for t in tensors:
        ours = t.dequantize().reshape(-1)
        ref = llama.dequantize(t.ggml_type, t.raw(), t.rows * t.k)
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), t.name


def test_gemma_has_all_keep_quant_tensors(gemma_model):
    types = [t.type_name for t in gemma_model.weights()]
    assert types.count("Q4_K") == 27 and types.count("Q6_K") == 9


def test_other_types_decode_like_ggml(llama, gemma_model):
    seen = set()
    for t in gemma_model.quantized_weights():
        if t.ggml_type in seen or t.ggml_type in Q.KEEP_QUANT_TYPES or t.rows * t.k > 4_000_000:
            continue
        seen.add(t.ggml_type)
        ref = llama.dequantize(t.ggml_type, t.raw(), t.rows * t.k)
        assert np.array_equal(t.dequantize().reshape(-1).view(np.uint32), ref.view(np.uint32)), t.type_name
    assert {Q.type_name(s) for s in seen} >= {"Q5_0", "Q8_0"}


def _q8_K_inputs(rng):
    tied = np.zeros((1, 256), np.float32)
    tied[0, 3], tied[0, 9] = -4.0, 4.0  # first |max| wins: the negative one
    return {
        "random": rng.standard_normal((3, 512)).astype(np.float32),
        "zeros": np.zeros((2, 256), np.float32),
        "tied-max": tied,
        "huge": (rng.standard_normal((2, 256)) * 1e30).astype(np.float32),
        "tiny": (rng.standard_normal((2, 256)) * 1e-30).astype(np.float32),
        "halves": (np.arange(256, dtype=np.float32)[None, :] - 127.5),  # exact .5 products: round half to even
    }


def test_q8_K_bytes_equal_ggml(llama, rng):
    for name, x in _q8_K_inputs(rng).items():
        ours = Q.quantize_q8_K(x).view(np.uint8).reshape(-1)
        assert np.array_equal(ours, llama.quantize_row_q8_K_ref(x)), name


def _golden_q8_1(values, ds4):
    """One q8_1 group written out step by step in float32 (C's roundf: halves away from zero)."""
    f32 = np.float32
    amax = max(abs(f32(v)) for v in values)
    if amax == 0:
        return np.zeros(32, np.int8), 0
    d_inv = f32(127.0) / amax
    q = []
    for v in values:
        p = abs(f32(v) * d_inv)
        r = np.floor(p) + (1 if p - np.floor(p) >= 0.5 else 0)
        q.append(int(np.copysign(r, v)))
    t = [f32(f32(f32(f32(values[4 * i]) + f32(values[4 * i + 1])) + f32(values[4 * i + 2])) + f32(values[4 * i + 3]))
         for i in range(8)]
    s = f32(f32(f32(t[0] + t[4]) + f32(t[2] + t[6])) + f32(f32(t[1] + t[5]) + f32(t[3] + t[7])))
    d = f32(1.0) / d_inv
    with np.errstate(over="ignore"):
        word = np.array([d, s], np.float16).view(np.uint32)[0] if ds4 else np.array([d], np.float32).view(np.uint32)[0]
    return np.array(q, np.int8), int(word)


def test_q8_1_mmq_literal_golden():
    x = np.tile(np.array([127.0, -63.5, 0.5, -0.5], np.float32), (1, 64))  # amax 127: d = 1, q = roundf(x)
    block = Q.quantize_q8_1_mmq(x, Q.Q4_K)[0, 0]
    assert block[16:20].view(np.int8).tolist() == [127, -64, 1, -1]
    assert block[0:4].view(np.float16).tolist() == [1.0, 508.0]  # d, sum of the 32 values
    block = Q.quantize_q8_1_mmq(np.zeros((1, 256), np.float32), Q.Q6_K)[1, 0]
    assert not block.any()
    tied = np.zeros((1, 256), np.float32)
    tied[0, :2] = [-4.0, 4.0]
    block = Q.quantize_q8_1_mmq(tied, Q.Q6_K)[0, 0]
    assert block[16:18].view(np.int8).tolist() == [-127, 127]
    assert block[0:4].view(np.float32)[0] == np.float32(1.0) / (np.float32(127.0) / np.float32(4.0))


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q6_K])
def test_q8_1_mmq_matches_hand_golden(weight_type, rng):
    inputs = _q8_K_inputs(rng)
    for name, x in inputs.items():
        tokens, k = x.shape
        blocks = Q.quantize_q8_1_mmq(x, weight_type)
        assert blocks.shape == (k // 128, tokens, 144)
        for t in range(tokens):
            for g in range(k // 32):
                q, word = _golden_q8_1(x[t, 32 * g:32 * g + 32].tolist(), weight_type == Q.Q4_K)
                block = blocks[g // 4, t]
                assert np.array_equal(block[16 + 32 * (g % 4):16 + 32 * (g % 4) + 32].view(np.int8), q), (name, t, g)
                assert int(block[4 * (g % 4):4 * (g % 4) + 4].view(np.uint32)[0]) == word, (name, t, g)


def test_reference_gemms_match_llamacpp_cpu(llama, model):
    rng = np.random.default_rng(7)
    for t in model.weights():
        for tokens in (1, 7, 32, 129):
            x = rng.standard_normal((tokens, t.k)).astype(np.float32)
            ref = Q.gemm_cpu_semantics(t.ggml_type, t.raw(), t.rows, t.k, x)
            got = llama.mul_mat(t.ggml_type, t.raw(), t.rows, t.k, x)
            assert Q.nmse(got, ref) <= 1e-10, (t.name, tokens)


def test_mmq_semantics_differs_from_cpu_semantics_but_both_near_truth(default_model):
    t = default_model.weights()[0]
    x = np.random.default_rng(3).standard_normal((5, t.k)).astype(np.float32)
    truth = Q.gemm_f64(t.ggml_type, t.raw(), t.rows, t.k, x)
    cpu = Q.gemm_cpu_semantics(t.ggml_type, t.raw(), t.rows, t.k, x)
    mmq = Q.gemm_mmq_semantics(t.ggml_type, t.raw(), t.rows, t.k, x)
    assert 1e-12 < Q.nmse(cpu, mmq) < 1e-2
    assert Q.nmse(cpu, truth) < 1e-3 and Q.nmse(mmq, truth) < 1e-3


def test_nmse_flags_non_finite():
    assert Q.nmse(np.array([np.nan, 1.0]), np.array([1.0, 1.0])) == float("inf")


def test_shape_errors():
    with pytest.raises(ShapeError, match="K % 256"):
        Q.row_bytes(Q.Q4_K, 300)
    with pytest.raises(ShapeError, match="needs 144 bytes"):
        Q.dequantize(Q.Q4_K, np.zeros(100, np.uint8), 1, 256)
    with pytest.raises(UnsupportedTypeError, match="Q2_K"):
        Q.dequantize(10, np.zeros(84, np.uint8), 1, 256)
    with pytest.raises(ShapeError):
        Q.quantize_q8_K(np.zeros((2, 100), np.float32))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), blocks=st.integers(1, 3), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**31))
def test_quantizers_round_trip(rows, blocks, scale, seed):
    x = (np.random.default_rng(seed).standard_normal((rows, 256 * blocks)) * scale).astype(np.float32)
    assert Q.nmse(Q.dequantize_q4_K(Q.quantize_q4_K(x), rows, 256 * blocks), x) < 2e-2
    assert Q.nmse(Q.dequantize_q6_K(Q.quantize_q6_K(x), rows, 256 * blocks), x) < 2e-3


@pytest.mark.parametrize("weight_type", [Q.Q4_0, Q.Q5_0, Q.Q8_0])
def test_f16_semantics_of_block32_weights(weight_type):
    """wgmma's f16 weights of the 32-value block types are ggml's own dequantized values rounded once to f16 (q * d
    is exact in float32), and the f16-semantics GEMM stays within f16 rounding of float64."""
    rng = np.random.default_rng(32)
    values, nbytes = Q.BLOCK_LAYOUT[weight_type]
    rows, k = 24, 640
    blocks = rng.integers(0, 256, (rows * k // values, nbytes), dtype=np.uint8)
    blocks[:, 0:2] = (rng.choice([-1.0, 1.0], len(blocks)) * np.exp2(rng.uniform(-14, -2, len(blocks)))).astype(
        np.float16).view(np.uint8).reshape(-1, 2)
    data = blocks.reshape(-1)
    w16 = Q.dequantize_f16(weight_type, data, rows, k)
    assert w16.dtype == np.float16 and np.array_equal(w16, Q.dequantize(weight_type, data, rows, k).astype(np.float16))
    x = rng.standard_normal((7, k)).astype(np.float32)
    assert Q.nmse(Q.gemm_f16_semantics(weight_type, data, rows, k, x), Q.gemm_f64(weight_type, data, rows, k, x)) < 1e-6
    with pytest.raises(ShapeError, match="K % 64"):
        Q.convert_f16(np.zeros((2, 96), np.float32))
