"""Q4_1 / Q5_1 weights in cpu semantics (the q32 variant on the host): llama.cpp x86 CPU's mul_mat for them, bit for
bit. llama.cpp takes neither llamafile_sgemm nor its tiled matmul for these types: every output is one
ggml_vec_dot_q{4,5}_1_q8_1 on activations from quantize_row_q8_1 (native/src/cpu/gemm_q32.cpp says the float order),
whatever the token count. The AVX2 build and a -march=native AVX-512 one run the same arithmetic for these types
(dpbusd's sums equal maddubs+madd's here: no pair saturates), so the same assertions hold against either."""

import numpy as np
import pytest

from ggml_ciq import native
from ggml_ciq import quants as Q
from ggml_ciq.errors import BackendError, CiqError
from ggml_ciq.model import Tensor
from test_ops import random_table

TYPES = Q.Q32_1_TYPES
IDS = [Q.type_name(t) for t in TYPES]


def activations(rng, tokens: int, k: int) -> np.ndarray:
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    x[:, 7] *= 300.0  # an outlier channel, as real residual streams have
    if tokens > 1:
        x[1, 32:64] = 0.0  # an all-zero block: d = s = 0
    return x


def weights(llama, rng, ggml_type: int, rows: int, k: int, source: str) -> np.ndarray:
    """ggml's own quantization of Gaussian weights, or random blocks (every qh bit pattern, d and m of either sign)."""
    if source == "ggml":
        return llama.quantize_chunk(ggml_type, rng.standard_normal((rows, k)).astype(np.float32) * 0.02)
    return random_table(rng, ggml_type, rows, k)


@pytest.mark.parametrize("tokens", [1, 2, 31, 77])
@pytest.mark.parametrize("isa", ["best", "scalar"])
def test_q8_1_cpu_layout_is_llamacpp_quantize_row_q8_1(llama, native_lib, rng, monkeypatch, tokens, isa):
    """The q8_1-cpu layout's bytes are the CPU backend's quantize_row_q8_1 (s from the quants, d * sum(q)) and the
    numpy reference's; MMVQ's q8_1 (s from the floats, CUDA's quantize_q8_1) is another layout."""
    if isa == "scalar":
        monkeypatch.setenv("GGML_CIQ_CPU_ISA", "scalar")
    k = 576
    x = activations(rng, tokens, k)
    x[0, 99] = -254.0  # block 3's amax: 127 / amax = 0.5 exactly, so 1.0, 3.0 and -1.0 are ties (half to even)
    x[0, 100:103] = [1.0, 3.0, -1.0]
    ours = native.quantize_activations(x, "cpu", Q.Q4_1, "cpu")
    assert native.activations_layout("cpu", Q.Q5_1) == "q8_1_cpu"
    assert ours.tobytes() == llama.quantize_row_q8_1(x).tobytes() == Q.quantize_q8_1_cpu(x).tobytes()
    assert ours.tobytes() != Q.quantize_q8_1(x).tobytes()


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_dequantize_matches_ggml(llama, native_lib, rng, ggml_type):
    """quants.dequantize and the library's get_rows (ciq_rows_get) are ggml's dequantize_row_q{4,5}_1 (q*d + m)."""
    rows, k = 9, 1536
    raw = random_table(rng, ggml_type, rows, k)
    theirs = llama.dequantize(ggml_type, raw, rows * k).reshape(rows, k)
    assert np.array_equal(Q.dequantize(ggml_type, raw, rows, k), theirs)
    from ggml_ciq.ops import NativeOps

    ids = np.array([8, 0, 3, 3], np.int32)
    out = NativeOps("cpu").get_rows(Tensor("token_embd.weight", ggml_type, (rows, k), raw), ids).numpy()
    assert np.array_equal(out, theirs[ids])


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("k", [576, 1536, 32 * 23])
@pytest.mark.parametrize("tokens", [1, 2, 7, 8, 9, 31, 77])
def test_gemm_matches_llamacpp_cpu(llama, native_lib, rng, ggml_type, k, tokens):
    """ciq_gemm (q32, cpu semantics; the output poisoned first) against llama.cpp CPU's mul_mat on a plain CPU buffer,
    bit for bit, for ggml-quantized and random weights at odd row counts (tails of the 32-row chunk); one dispatch of
    q32 counted; close to float64 (the activations' int8 rounding is the error), exact on its own q8_1 activations."""
    x = activations(rng, tokens, k)
    for rows, source in ((333, "ggml"), (37, "random")):
        raw = weights(llama, rng, ggml_type, rows, k, source)
        native.dispatch_reset()
        ours = native.gemm_q32(raw, x, ggml_type, rows, k, "cpu", semantics="cpu")
        ran = {key: c for key, c in native.dispatch_counts().items() if c}
        assert ran == {("q32", Q.type_name(ggml_type)): 1}, ran
        theirs = llama.mul_mat(ggml_type, raw, rows, k, x, device="CPU", threads=2)
        assert np.isfinite(ours).all()
        assert np.array_equal(ours, theirs), (f"{source} {rows}x{k}x{tokens}: NMSE {Q.nmse(ours, theirs):.2e}, "
                                              f"identical {np.mean(ours == theirs):.4f}")
        exact = Q.gemm_q32_1_cpu_quantized(ggml_type, raw, rows, k, Q.quantize_q8_1_cpu(x), tokens)
        float64 = x.astype(np.float64) @ Q.dequantize(ggml_type, raw, rows, k).T.astype(np.float64)
        err, float_err = Q.nmse(ours, exact), Q.nmse(ours, float64)
        print(f"{Q.type_name(ggml_type)} {source} {rows}x{k}x{tokens}: NMSE {err:.2e} to its q8_1 activations, "
              f"{float_err:.2e} to float64")
        assert err <= 1e-10 and float_err <= 1e-3 and float_err > 1e3 * max(err, 1e-18)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 9, 77])
def test_scalar_path_matches_llamacpp_cpu(llama, native_lib, rng, monkeypatch, ggml_type, tokens):
    """GGML_CIQ_CPU_ISA=scalar: the scalar loops keep the AVX2 path's float order (quantization and GEMM)."""
    monkeypatch.setenv("GGML_CIQ_CPU_ISA", "scalar")
    rows, k = 101, 1536
    raw = weights(llama, rng, ggml_type, rows, k, "ggml")
    x = activations(rng, tokens, k)
    ours = native.gemm_q32(raw, x, ggml_type, rows, k, "cpu", semantics="cpu")
    assert np.array_equal(ours, llama.mul_mat(ggml_type, raw, rows, k, x, device="CPU", threads=2))


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_numpy_ops_weight_runs_q32(llama, native_lib, rng, ggml_type):
    """The CPU engine's NumpyWeight keeps Q4_1/Q5_1 in their blocks (kind q32) and multiplies them as llama.cpp."""
    from ggml_ciq.numpy_ops import NumpyWeight

    rows, k = 75, 576
    raw = weights(llama, rng, ggml_type, rows, k, "ggml")
    weight = NumpyWeight(Tensor("blk.0.ffn_up.weight", ggml_type, (rows, k), raw))
    assert weight.kind == "q32"
    x = activations(rng, 9, k)
    assert np.array_equal(weight(x), llama.mul_mat(ggml_type, raw, rows, k, x, device="CPU", threads=2))


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_host_plans_cpu_and_mmq_semantics(native_lib, rng, ggml_type):
    """The q32 variant runs Q4_1/Q5_1 on the host in cpu semantics (q8_1-cpu activations) and in MMQ's (q8_1-mmq DS4,
    K any multiple of 32: llama.cpp CUDA's vec_dot_q8_1_q8_1_mma, tests/test_ops.py test_gemm_q32); every other
    variant but mmvq (llama.cpp CUDA's mul_mat_vec_q, 1..8 tokens; API v18) refuses them there with an error naming
    the type."""
    n = native_lib
    lib, name = n.lib, Q.type_name(ggml_type)
    plan = n.ffi.new("ciq_plan *")
    for variant, semantics in ((lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU), (lib.CIQ_VARIANT_WGMMA, lib.CIQ_SEMANTICS_F16)):
        assert lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, variant, semantics, ggml_type, 64, 576, 2, plan) != lib.CIQ_OK
    assert lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, lib.CIQ_VARIANT_MMVQ, lib.CIQ_SEMANTICS_MMVQ, ggml_type, 64, 576, 2,
                             plan) == lib.CIQ_OK and plan.variant == lib.CIQ_VARIANT_MMVQ
    for semantics in ("any", "cpu"):
        p = native.plan("auto", "cpu", semantics, ggml_type, 64, 576, 9)
        assert (p.variant, p.semantics, p.layout) == ("q32", "cpu", "q8_1_cpu")
        assert p.activation_bytes == 9 * 576 // 32 * 36
    p = native.plan("auto", "cpu", "mmq", ggml_type, 64, 576, 9)
    assert (p.variant, p.semantics, p.layout) == ("q32", "mmq", "q8_1_mmq_ds4")
    assert p.activation_bytes == 9 * 5 * 144  # 576 values: 4.5 blocks of 128, the last zero-padded
    with pytest.raises(CiqError, match=name):  # the host has no f16 semantics at all: InvalidArgumentError
        native.plan("auto", "cpu", "f16", ggml_type, 64, 576, 9)


def test_python_type_ids_are_the_headers(native_lib):
    """quants' type constants are ggml_ciq.h's ciq_type values, name for name (Q4_1 = 3, Q5_1 = 7 included)."""
    names = native._header_ffi().typeof("ciq_type").elements  # value -> CIQ_TYPE_<name>
    assert {getattr(Q, name[len("CIQ_TYPE_"):]): value for value, name in names.items()} == {v: v for v in names}
    assert (Q.Q4_1, Q.Q5_1) == (native_lib.lib.CIQ_TYPE_Q4_1, native_lib.lib.CIQ_TYPE_Q5_1) == (3, 7)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_gpu_plans_mmq_only(native_lib, ggml_type):
    """On a GPU the q32 kernel multiplies Q4_1/Q5_1 in MMQ's semantics (AUTO's "mmq" at every token count, "any" at
    1..8 tokens); above 8 tokens AUTO's "any" takes wgmma on Hopper (f16, `fma(q, d, m)`, API v18; K 576 is a multiple
    of 64), q32 elsewhere; cpu semantics is refused in planning with CIQ_ERR_UNSUPPORTED naming the type, and so is
    f16 where there is no wgmma."""
    if native.device_count() == 0:
        pytest.skip("no GPU (or libggml_ciq built without CUDA)")
    name = Q.type_name(ggml_type)
    hopper = native.variant_available("cuda", "wgmma")
    q32 = ("q32", "mmq", "q8_1_mmq_ds4")
    for variant, semantics in (("auto", "mmq"), ("q32", "mmq"), ("q32", "any")):
        for tokens in (1, 9, 512):
            p = native.plan(variant, 0, semantics, ggml_type, 64, 576, tokens)
            assert (p.variant, p.semantics, p.layout) == q32, (variant, semantics, tokens)
    for tokens in (1, 8, 9, 512):
        p = native.plan("auto", 0, "any", ggml_type, 64, 576, tokens)
        want = ("wgmma", "f16", "f16") if hopper and tokens > 8 else q32
        assert (p.variant, p.semantics, p.layout) == want, tokens
    for semantics in ("cpu",) if hopper else ("f16", "cpu"):
        with pytest.raises(CiqError, match=name):
            native.plan("auto", 0, semantics, ggml_type, 64, 512, 9)
