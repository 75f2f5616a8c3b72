"""NativeOps (ggml_ciq/native_ops.py over the C API's transformer ops) against numpy references, on the CPU (device -1)
and, when present, a CUDA GPU (skipped without one).

Every output buffer is NaN-poisoned (PoisonedOps), inputs are fresh random (seed printed), sizes have tails.
NMSE = sum((a - b)^2) / sum(b^2). Bars: exact where the arithmetic is the same (dequantization, rounding,
add/scale), NMSE <= 1e-12 where only the summation or libm differs, otherwise a stated, measured bound.
"""

import ctypes
import ctypes.util

import numpy as np
import pytest

from ggml_ciq import native
from ggml_ciq import quants as Q
from ggml_ciq.errors import BackendError, CiqError, InvalidArgumentError, OutOfMemoryError, ShapeError, UnsupportedTypeError
from ggml_ciq.model import Tensor
from ggml_ciq.numpy_ops import NumpyOps
from ggml_ciq.numpy_ops import rms_norm as rms_norm_ref
from ggml_ciq.ops import DeviceArray, NativeOps
from ggml_ciq.reference_ops import rope_f64


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "unwritten (poisoned) or non-finite outputs"
    err, energy = ((a - b) ** 2).sum(), (b ** 2).sum()
    if not energy:  # an all-zero reference must be matched exactly
        return 0.0 if err == 0 else np.inf
    return float(err / energy)


class PoisonedOps(NativeOps):
    """NativeOps whose fresh buffers are NaN bytes (0xFF: NaN in f32, f16 and bf16)."""

    def empty(self, shape, dtype=np.float32):
        out = super().empty(shape, dtype)
        if out.nbytes:
            self.native.check(self.native.lib.ciq_memory_fill(self.device, out.ptr, 0xFF, out.nbytes))
        return out


def _gpu_or_skip():
    if native.device_count() == 0:
        pytest.skip("no CUDA device (or libggml_ciq built without CUDA)")


@pytest.fixture(params=["cpu", "cuda"])
def ops(request, native_lib):
    if request.param == "cuda":
        _gpu_or_skip()
    return PoisonedOps(request.param)


# ---- references (the float order of ggml CPU: ggml_ciq/numpy_ops.py's, and written here where it has none) ----------

_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_LIBM.tanhf.restype, _LIBM.tanhf.argtypes = ctypes.c_float, [ctypes.c_float]


def _gelu_table():
    """ggml_table_gelu_f16 as ggml's x86 FMA build makes it: every f16 input, float32 arithmetic with
    1 + 0.044715 x^2 fused (the exact float64 product plus 1), the C library's own tanhf."""
    h = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    f = np.float32
    with np.errstate(invalid="ignore", over="ignore"):
        fused = ((f(0.044715) * h).astype(np.float64) * h + 1.0).astype(np.float32)
        inner = f(0.7978845608028654) * h * fused
    tanh = np.array([_LIBM.tanhf(float(v)) for v in inner], np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return (f(0.5) * h * (f(1) + tanh)).astype(np.float16)


def gelu_fp16_table_ref(x):
    """ggml CPU's GELU: the table entry of x rounded to f16; 0 below -10, x itself from 10 on."""
    table = getattr(gelu_fp16_table_ref, "table", None)
    if table is None:
        table = gelu_fp16_table_ref.table = _gelu_table()
    y = table[x.astype(np.float16).view(np.uint16)].astype(np.float32)
    return np.where(x <= -10.0, np.float32(0), np.where(x >= 10.0, x, y)).astype(np.float32)


def rope_ref(x, positions, base, neox):
    """ggml's RoPE in float64 from float32 angles stepped as ggml's rope cache (theta *= base^(-2/d) in float32)."""
    d = x.shape[-1]
    theta_scale = np.float32(np.power(np.float64(np.float32(base)), np.float64(np.float32(-2.0) / np.float32(d))))
    theta = np.empty((len(positions), d // 2), np.float32)
    theta[:, 0] = positions
    for i in range(1, d // 2):
        theta[:, i] = theta[:, i - 1] * theta_scale
    cos, sin = np.cos(theta.astype(np.float64))[:, None, :], np.sin(theta.astype(np.float64))[:, None, :]
    first, second = (slice(0, d // 2), slice(d // 2, d)) if neox else (slice(0, d, 2), slice(1, d, 2))
    x0, x1 = x[..., first].astype(np.float64), x[..., second].astype(np.float64)
    out = np.empty(x.shape, np.float64)
    out[..., first], out[..., second] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out


def gelu_float_ref(x):
    """The tanh GELU in float64 (llama.cpp CUDA computes it in float)."""
    h = x.astype(np.float64)
    return 0.5 * h * (1.0 + np.tanh(0.7978845608028654 * h * (1.0 + 0.044715 * h * h)))


def attention_ref(q, k_cache, v_cache, n_past, scale, window, round_q=False):
    """Float64 causal GQA over the f16 caches' first n_past + T rows; round_q: q rounded to f16 first (mma)."""
    t, h, d = q.shape
    group = h // k_cache.shape[1]
    n_kv = n_past + t
    q64 = (q.astype(np.float16) if round_q else q).astype(np.float64)
    k = np.repeat(k_cache[:n_kv].astype(np.float64), group, axis=1)
    v = np.repeat(v_cache[:n_kv].astype(np.float64), group, axis=1)
    s = np.einsum("thd,phd->htp", q64, k) * scale
    pos = n_past + np.arange(t)[:, None]
    p = np.arange(n_kv)[None, :]
    visible = (p <= pos) & ((pos - p < window) if window else True)
    s = np.where(visible[None], s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("htp,phd->thd", w, v).reshape(t, h * d)


# ---- elementwise, norm, rope -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, d", [(1, 64), (17, 640), (131, 2048), (5, 100)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(ops, rng, n, d, with_weight):
    x = (rng.standard_normal((n, d)) * rng.uniform(0.01, 100)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32) if with_weight else None
    out = ops.rms_norm(ops.asarray(x), ops.asarray(w) if w is not None else None, 1e-6).numpy()
    # CPU: the same order except numpy's pairwise float64 sum (rounded to float32 anyway). GPU: float32 tree sum.
    assert nmse(out, rms_norm_ref(x, w, 1e-6)) <= 1e-12


@pytest.mark.parametrize("tokens, heads, head_dim", [(1, 1, 64), (17, 4, 128), (131, 8, 256), (3, 2, 6)])
@pytest.mark.parametrize("neox", [False, True])
def test_rope(ops, rng, tokens, heads, head_dim, neox):
    x = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, 8192, tokens).astype(np.int32)
    positions[0] = 0
    base = float(rng.choice([10000.0, 500000.0, 1000000.0]))
    out = ops.rope(ops.asarray(x), positions, base, neox).numpy()
    # The same float32 angles; libm cosf/sinf (CPU) or CUDA's (<= 2 ulp), float32 products, against float64.
    assert nmse(out, rope_ref(x, positions, base, neox)) <= 1e-12
    assert np.array_equal(out[0], x[0])  # position 0: cos 1, sin 0


def test_rope_pairing_is_checked(native_lib, rng):
    """The RoPE test can fail: NORM and NEOX outputs differ by far more than the bar."""
    x = rng.standard_normal((17, 4, 64)).astype(np.float32)
    positions = np.arange(17, dtype=np.int32) + 3
    ops = NativeOps("cpu")
    assert nmse(ops.rope(x, positions, 10000.0, neox=True).numpy(), rope_ref(x, positions, 10000.0, False)) > 1e-3


@pytest.mark.parametrize("kind", ["silu", "gelu"])
@pytest.mark.parametrize("tokens, k", [(1, 256), (7, 640), (130, 2048), (3, 14336), (2, 16640)])
def test_glu_activations(ops, rng, kind, tokens, k):
    """ciq_glu_activations: the bytes of ciq_glu then ciq_activations_quantize. On a GPU the f16 layout, fused (one
    pass with the row in registers up to K = 16384, the two-pass kernel above: 16640); on the host every layout that
    takes this K."""
    n, lib = ops.native, ops.native.lib
    gate = (rng.standard_normal((tokens, k)) * 6).astype(np.float32)
    up = rng.standard_normal((tokens, k)).astype(np.float32)
    g, u = ops.asarray(gate), ops.asarray(up)
    kind_id = lib.CIQ_GLU_SILU if kind == "silu" else lib.CIQ_GLU_GELU
    h = ops.glu(g, u, kind)
    checked = _fused_activations_checked(ops, tokens, k, h, lambda layout, out: lib.ciq_glu_activations(
        ops.device, lib.CIQ_ORDER_HOST, kind_id, ops._fp(g), ops._fp(u), tokens, k, layout, out))
    assert checked == (1 if ops.device >= 0 else len([u for u in LAYOUT_UNITS if k % u == 0]))


# K unit of each activation layout (ciq_layout order): Q8_K, q8_1-mmq DS4 and D4, f16, q8_0, q8_1, q8_1-cpu.
LAYOUT_UNITS = (256, 128, 128, 64, 32, 32, 32)


def _fused_activations_checked(ops, tokens, k, h, fused_call) -> int:
    """For every layout that takes this K: fused_call(layout, out) (an op fused into ciq_activations_quantize) writes
    the bytes of ciq_activations_quantize of h, into NaN-poisoned buffers; on a GPU only the f16 layout is fused (the
    others CIQ_ERR_UNSUPPORTED). Returns how many layouts were compared."""
    n, lib = ops.native, ops.native.lib
    checked = 0
    for layout in native.enum_names("ciq_layout", "CIQ_LAYOUT_"):
        layout_id = getattr(lib, f"CIQ_LAYOUT_{layout.upper()}")
        size = n.ffi.new("size_t *")
        if lib.ciq_activations_size(layout_id, tokens, k, size) != lib.CIQ_OK:
            continue  # this K is not a multiple of the layout's unit
        fused, apart = ops.empty((size[0],), np.uint8), ops.empty((size[0],), np.uint8)  # poisoned: 0xFF
        status = fused_call(layout_id, fused.ptr)
        if ops.device >= 0 and layout != "f16":
            assert status == lib.CIQ_ERR_UNSUPPORTED, layout
            continue
        n.check(status)
        n.check(lib.ciq_activations_quantize(ops.device, layout_id, ops._fp(h), apart.ptr, tokens, k))
        assert np.array_equal(fused.numpy(), apart.numpy()), layout
        checked += 1
    return checked


def test_glu_activations_bad_input(native_lib):
    """NULL pointers, an unknown kind or layout, a K the layout does not take, llama.cpp CUDA's order on the host:
    each one error naming the problem; nothing is written."""
    n = native.load()
    lib, ffi = n.lib, n.ffi
    x = ffi.new("float[]", 2 * 256)
    out = ffi.new("uint8_t[]", 4096)
    cases = [((None, x), lib.CIQ_LAYOUT_F16, lib.CIQ_GLU_SILU, 256, lib.CIQ_ORDER_HOST, "NULL pointer"),
             ((x, x), lib.CIQ_LAYOUT_F16, 7, 256, lib.CIQ_ORDER_HOST, "unknown kind 7"),
             ((x, x), 99, lib.CIQ_GLU_SILU, 256, lib.CIQ_ORDER_HOST, "unknown activation layout 99"),
             ((x, x), lib.CIQ_LAYOUT_F16, lib.CIQ_GLU_SILU, 100, lib.CIQ_ORDER_HOST, "multiple of 64"),
             ((x, x), lib.CIQ_LAYOUT_F16, lib.CIQ_GLU_SILU, 256, lib.CIQ_ORDER_LLAMACPP_CUDA, "")]
    for (gate, up), layout, kind, k, order, message in cases:
        status = lib.ciq_glu_activations(lib.CIQ_DEVICE_CPU, order, kind, gate if gate is not None else ffi.NULL, up,
                                         1, k, layout, out)
        assert status != lib.CIQ_OK and message in ffi.string(lib.ciq_last_error()).decode()
    assert bytes(out) == bytes(4096)


@pytest.mark.parametrize("tokens, k", [(1, 256), (7, 640), (130, 2048), (3, 4096), (5, 9216)])
def test_rms_norm_activations(ops, rng, tokens, k):
    """ciq_rms_norm_activations: the bytes of ciq_rms_norm (with a weight, and without) then
    ciq_activations_quantize. On a GPU the f16 layout, fused along ciq_rms_norm's three row kernels (a warp a row at
    K <= 1024, a block with the row in registers to 8192, the strided two-pass kernel at 9216); on the host every
    layout that takes this K. Rows scaled over 2^-30 .. 2^30 (each token's own power of two)."""
    n, lib = ops.native, ops.native.lib
    x = (rng.standard_normal((tokens, k)) * np.exp2(rng.integers(-30, 30, (tokens, 1)))).astype(np.float32)
    weight = (rng.standard_normal(k) + 1).astype(np.float32)
    xd, wd = ops.asarray(x), ops.asarray(weight)
    checked = 0
    for w in (wd, None):
        wp = ops._fp(w) if w is not None else n.ffi.NULL
        checked += _fused_activations_checked(ops, tokens, k, ops.rms_norm(xd, w, 1e-6), lambda layout, out: (
            lib.ciq_rms_norm_activations(ops.device, lib.CIQ_ORDER_HOST, ops._fp(xd), wp, 1e-6, tokens, k, layout, out)))
    per_weight = 1 if ops.device >= 0 else len([u for u in LAYOUT_UNITS if k % u == 0])
    assert checked == 2 * per_weight


def test_rms_norm_activations_bad_input(native_lib):
    """NULL pointers, an unknown layout, a K the layout does not take, llama.cpp CUDA's order on the host: each one
    error naming the problem; nothing is written."""
    n = native.load()
    lib, ffi = n.lib, n.ffi
    x = ffi.new("float[]", 2 * 256)
    out = ffi.new("uint8_t[]", 4096)
    cases = [(ffi.NULL, lib.CIQ_LAYOUT_F16, 256, lib.CIQ_ORDER_HOST, "NULL pointer"),
             (x, 99, 256, lib.CIQ_ORDER_HOST, "unknown activation layout 99"),
             (x, lib.CIQ_LAYOUT_F16, 100, lib.CIQ_ORDER_HOST, "multiple of 64"),
             (x, lib.CIQ_LAYOUT_F16, 256, lib.CIQ_ORDER_LLAMACPP_CUDA, "")]
    for xp, layout, k, order, message in cases:
        status = lib.ciq_rms_norm_activations(lib.CIQ_DEVICE_CPU, order, xp, ffi.NULL, 1e-6, 1, k, layout, out)
        assert status != lib.CIQ_OK and message in ffi.string(lib.ciq_last_error()).decode()
    assert bytes(out) == bytes(4096)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_kv_store_equals_apart(ops, rng, neox):
    """rope_kv_store (ciq_rope_kv_store: one kernel on a GPU) against rope, rope, kv_store, kv_store: the same q bits
    and cache bytes (8B's 32/8 heads of 128 and odd ones: 6/3 of 64, 37 tokens from row 5); cache rows outside the
    stored ones untouched; without v, v's cache untouched; llama.cpp CUDA's order refused on a GPU."""
    for heads, heads_kv, d in ((32, 8, 128), (6, 3, 64)):
        t, start = 37, 5
        q = rng.standard_normal((t, heads, d)).astype(np.float32)
        k, v = (rng.standard_normal((2, t, heads_kv, d)) * 3).astype(np.float32)
        positions = np.arange(start, start + t, dtype=np.int32)
        want = {}
        for name in ("k", "v"):
            want[name] = ops.zeros((start + t + 4, heads_kv, d), np.float16)
        ops.kv_store(want["k"], start, ops.rope(k, positions, 5e5, neox))
        ops.kv_store(want["v"], start, v)
        q_want = ops.rope(q, positions, 5e5, neox).numpy()
        for with_v in (True, False):
            kc, vc = (ops.zeros((start + t + 4, heads_kv, d), np.float16) for _ in range(2))
            q_out = ops.rope_kv_store(q, k, v if with_v else None, positions, 5e5, neox, kc, vc, start).numpy()
            assert np.array_equal(q_out, q_want) and np.array_equal(kc.numpy().view(np.uint16),
                                                                      want["k"].numpy().view(np.uint16))
            v_want = want["v"].numpy() if with_v else np.zeros_like(want["v"].numpy())
            assert np.array_equal(vc.numpy().view(np.uint16), v_want.view(np.uint16)), with_v
    with pytest.raises(ShapeError, match="cache"):
        ops.rope_kv_store(q, k, v, positions, 5e5, neox, kc, vc, start + 10)
    if ops.device >= 0:
        other = NativeOps(ops.device, op_order="llamacpp_cuda")
        with pytest.raises(CiqError, match="host order only"):
            other.rope_kv_store(q, k, v, positions, 5e5, neox, kc, vc, start)


@pytest.mark.parametrize("value, on", [("", True), ("1", True), ("on", True), ("TRUE", True), ("0", False),
                                       ("off", False), ("No", False)])
def test_fuse_switch(native_lib, monkeypatch, value, on):
    """GGML_CIQ_FUSE turns the fusions of NativeOps(fuse=True) off (never on where fuse is not asked), and the result
    files' environment records it."""
    from ggml_ciq import environment

    monkeypatch.setenv("GGML_CIQ_FUSE", value)
    assert NativeOps("cpu", fuse=True).fuse is on and NativeOps("cpu").fuse is False
    assert environment.switches().get("GGML_CIQ_FUSE") == (value or None)


def test_fuse_switch_bad_value(native_lib, monkeypatch):
    """A value that is neither on nor off is an error naming the variable, not a guess."""
    monkeypatch.setenv("GGML_CIQ_FUSE", "maybe")
    with pytest.raises(InvalidArgumentError, match="GGML_CIQ_FUSE='maybe': expected 1 or 0"):
        NativeOps("cpu", fuse=True)


def _q4k_tensor(rng, name, rows, k):
    return Tensor(name, Q.Q4_K, (rows, k), Q.quantize_q4_K(rng.standard_normal((rows, k)).astype(np.float32)))


@pytest.mark.parametrize("tokens", [1, 8, 9, 37, 300])
@pytest.mark.parametrize("parts", [(256, 128, 136), (96, 40, 41)], ids=["tiles", "tails"])
def test_stacked_weight_outputs(ops, rng, tokens, parts):
    """A stacked weight (NativeOps.stack_weights: q/k/v-like matrices of one type, ciq_gemm_quantized_outputs): each
    output is its rows of the whole stacked product bit for bit (one ciq_gemm_quantized of one weight of those rows),
    counted as one launch, at token counts either side of llama.cpp's MMVQ/MMQ switch (8/9) and past a 256-token
    tile. "tiles": every output but the last a multiple of 128 rows (wgmma writes them from its epilogue); "tails":
    not (the whole product is copied out). Outputs NaN-poisoned."""
    k = 512
    tensors = [_q4k_tensor(rng, f"blk.0.w{i}.weight", rows, k) for i, rows in enumerate(parts)]
    fusing = PoisonedOps(ops.device, fuse=True)
    stacked = fusing.stack_weights(tensors)
    assert stacked is not None and stacked.parts == parts and stacked.rows == sum(parts)
    whole = Tensor("whole", Q.Q4_K, (sum(parts), k), np.concatenate([t.raw() for t in tensors]))
    x = fusing.asarray(rng.standard_normal((tokens, k)).astype(np.float32))
    native.dispatch_reset()
    outs = [y.numpy() for y in fusing.linear_group([stacked], x)]
    assert sum(native.dispatch_counts().values()) == 1
    want = fusing.linear(fusing.load_weight(whole), x).numpy()
    assert np.isfinite(want).all() and len(outs) == len(parts)
    first = 0
    for out, rows in zip(outs, parts):
        assert out.shape == (tokens, rows) and np.array_equal(out, want[:, first:first + rows]), (rows, first)
        first += rows
    assert NativeOps(ops.device).stack_weights(tensors) is None  # fuse off: loaded apart
    with pytest.raises(InvalidArgumentError, match="linear_group"):
        fusing.linear(stacked, x)


@pytest.mark.parametrize("tokens", [1, 9, 37, 300])
@pytest.mark.parametrize("rows", [256, 4099])
def test_linear_add_equals_add_after(ops, rng, tokens, rows):
    """linear(weight, x, add) (the residual from the GEMM's epilogue where wgmma runs, ciq_gemm_quantized_outputs)
    against linear then add: the same bits, odd rows included (the epilogue's scalar tail); the addend spans 2^-20 ..
    2^20 so a lost or doubled rounding shows."""
    k = 512
    tensor = _q4k_tensor(rng, "blk.0.attn_output.weight", rows, k)
    w = ops.load_weight(tensor)
    x = ops.asarray(rng.standard_normal((tokens, k)).astype(np.float32))
    residual = (rng.standard_normal((tokens, rows)) * np.exp2(rng.integers(-20, 20, (tokens, rows)))).astype(np.float32)
    r = ops.asarray(residual)
    native.dispatch_reset()
    fused = ops.linear(w, x, r).numpy()
    assert sum(native.dispatch_counts().values()) == 1
    apart = ops.add(ops.linear(w, x), r).numpy()
    assert np.isfinite(fused).all() and np.array_equal(fused, apart)
    assert np.array_equal(r.numpy(), residual)  # the addend is read, not written
    with pytest.raises(ShapeError, match="add"):
        ops.linear(w, x, ops.asarray(residual[:, :-1].copy()))


@pytest.mark.parametrize("k", [512, 768, 2048, 9216])
def test_linear_group_norm_fused_equals_apart(ops, rng, k):
    """linear_group(weights, x, norm=(weight, eps)) with the norm fused into the conversion (fuse: on a GPU one
    kernel, ciq_rms_norm_activations) against rms_norm then linear_group: the same bits (37 tokens; K through the
    norm's three row kernels)."""
    tensors = [_q4k_tensor(rng, f"blk.0.w{i}.weight", rows, k) for i, rows in enumerate((128, 72))]
    norm = ops.asarray((rng.standard_normal(k) + 1).astype(np.float32))
    x = ops.asarray((rng.standard_normal((37, k)) * 3).astype(np.float32))
    fusing = PoisonedOps(ops.device, fuse=True)
    weights = [fusing.load_weight(t) for t in tensors]
    fused = [y.numpy() for y in fusing.linear_group(weights, x, norm=(norm, 1e-5))]
    apart = [y.numpy() for y in ops.linear_group(weights, ops.rms_norm(x, norm, 1e-5))]
    assert all(np.isfinite(a).all() and np.array_equal(a, b) for a, b in zip(fused, apart))


def test_gemm_outputs_bad_input(native_lib, rng):
    """ciq_gemm_quantized_outputs: no outputs or too many, outputs whose rows do not add up to the weight's, a NULL
    output, an addend with bf16 output, an output overlapping an addend (its own or another's) or another output:
    each one error naming the problem, nothing written."""
    n = native.load()
    lib, ffi = n.lib, n.ffi
    rows, k, tokens = 64, 256, 3
    raw = Q.quantize_q4_K(rng.standard_normal((rows, k)).astype(np.float32))
    plan = ffi.new("ciq_plan *")
    n.check(lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, lib.CIQ_VARIANT_AUTO, lib.CIQ_SEMANTICS_ANY, Q.Q4_K, rows, k, tokens,
                              plan))
    xq = ffi.new("uint8_t[]", plan.activation_bytes)
    n.check(lib.ciq_activations_quantize(lib.CIQ_DEVICE_CPU, plan.activation_layout,
                                         ffi.from_buffer("float[]", rng.standard_normal((tokens, k)).astype(np.float32)),
                                         xq, tokens, k))
    a = ffi.new("float[]", tokens * rows)
    b = ffi.new("float[]", tokens * rows)

    def run(specs, out_type=lib.CIQ_OUT_F32, count=None):
        outputs = ffi.new("ciq_gemm_output[]", max(1, len(specs)))
        for o, (r, out, add) in zip(outputs, specs):
            o.rows, o.out, o.add = r, out, add
        return lib.ciq_gemm_quantized_outputs(lib.CIQ_DEVICE_CPU, plan, Q.Q4_K, ffi.from_buffer(raw), len(raw), rows,
                                              k, xq, tokens, outputs, len(specs) if count is None else count, out_type)

    cases = [([], lib.CIQ_OUT_F32, 0, "0 outputs"),
             ([(16, a, ffi.NULL)] * 5, lib.CIQ_OUT_F32, None, "5 outputs"),
             ([(32, a, ffi.NULL), (16, b, ffi.NULL)], lib.CIQ_OUT_F32, None, "the outputs have 48 rows, the weight 64"),
             ([(32, a, ffi.NULL), (40, b, ffi.NULL)], lib.CIQ_OUT_F32, None, "output 1 has 40 rows, 32 of"),
             ([(32, a, ffi.NULL), (32, ffi.NULL, ffi.NULL)], lib.CIQ_OUT_F32, None, "output 1 is NULL"),
             ([(64, a, b)], lib.CIQ_OUT_BF16, None, "needs float32 output"),
             ([(64, a, a + 5)], lib.CIQ_OUT_F32, None, "output 0 overlaps the addend of output 0"),
             ([(32, a, ffi.NULL), (32, b, a + 40)], lib.CIQ_OUT_F32, None, "output 0 overlaps the addend of output 1"),
             ([(32, a, ffi.NULL), (32, a + 90, ffi.NULL)], lib.CIQ_OUT_F32, None, "outputs 0 and 1 overlap")]
    for specs, out_type, count, message in cases:
        status = run(specs, out_type, count)
        assert status == lib.CIQ_ERR_INVALID_ARGUMENT and message in ffi.string(lib.ciq_last_error()).decode(), message
    assert bytes(ffi.buffer(a)) == bytes(tokens * rows * 4) and bytes(ffi.buffer(b)) == bytes(tokens * rows * 4)
    assert run([(32, a, ffi.NULL), (32, b, ffi.NULL)]) == lib.CIQ_OK  # the same call, well formed


def _quantized_tensor(rng, name, ggml_type, rows, k):
    """A random [rows, k] tensor in Q4_K, Q6_K or Q8_0 blocks (Q8_0 written here: fp16 d = amax / 127, q = x / d)."""
    x = rng.standard_normal((rows, k)).astype(np.float32)
    if ggml_type == Q.Q4_K:
        return Tensor(name, ggml_type, (rows, k), Q.quantize_q4_K(x))
    if ggml_type == Q.Q6_K:
        return Tensor(name, ggml_type, (rows, k), Q.quantize_q6_K(x))
    blocks = x.reshape(-1, 32)
    d = (np.abs(blocks).max(axis=1) / 127).astype(np.float16)
    q = np.clip(np.rint(blocks / np.maximum(d.astype(np.float32), 1e-30)[:, None]), -127, 127).astype(np.int8)
    raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), q.view(np.uint8)], axis=1)
    return Tensor(name, Q.Q8_0, (rows, k), raw.reshape(rows, -1))


def _wgmma_runs(ops, tokens) -> bool:
    return ops.device >= 0 and tokens > 8 and native.variant_available(ops.device, "wgmma")


@pytest.mark.parametrize("tokens", [1, 9, 37, 300])
@pytest.mark.parametrize("case", [(Q.Q4_K, 512, 192), (Q.Q6_K, 512, 128), (Q.Q6_K, 2048, 64), (Q.Q8_0, 640, 128)],
                         ids=["q4k-rs", "q6k-ss", "q6k-rs", "q8_0-ss"])
def test_linear_glu_equals_apart(ops, rng, monkeypatch, tokens, case):
    """stack_glu + linear_glu (ciq_gemm_quantized_glu: gate/up interleaved 64 rows at a time, the GLU from wgmma's
    epilogue, no gate/up product in memory) against the stacked gate/up GEMM, then glu: with the norm fused in, both
    GLU kinds, at token counts either side of MMVQ's 8 and past a tile. Where wgmma runs: one launch counted as a GLU
    launch, NMSE <= 1e-10 (stream-K and the tail split may cut a row's K otherwise: float32 sums in another order) and
    the same bits with both off; elsewhere (the product, its halves apart, then ciq_glu) the same bits. Outputs NaN-poisoned.
    The forms: Q4_K and Q6_K with K % 2048 == 0 staged by TMA (RS), Q6_K at K 512 and Q8_0 read into registers (SS)."""
    ggml_type, k, ff = case
    fusing = PoisonedOps(ops.device, fuse=True)
    gate, up = (_quantized_tensor(rng, f"blk.0.ffn_{n}.weight", ggml_type, ff, k) for n in ("gate", "up"))
    weight = fusing.stack_glu(gate, up)
    if ggml_type == Q.Q8_0 and ops.device < 0:  # the CPU dequantizes Q8_0 weights: nothing to interleave
        assert weight is None
        return
    assert weight is not None and weight.glu and weight.rows == 2 * ff and not weight.parts
    stacked = fusing.stack_weights([gate, up])
    x = fusing.asarray((rng.standard_normal((tokens, k)) * 2).astype(np.float32))
    norm = fusing.asarray((rng.standard_normal(k) + 1).astype(np.float32))
    wgmma = _wgmma_runs(ops, tokens)
    for kind in ("silu", "gelu"):
        native.dispatch_reset()
        got = fusing.linear_glu(weight, x, kind, norm=(norm, 1e-5)).numpy()
        assert sum(native.dispatch_counts().values()) == 1
        assert (native.wgmma_launch_counts()["glu"] >= 1) == wgmma
        want = fusing.glu(*fusing.linear_group([stacked], x, norm=(norm, 1e-5)), kind).numpy()
        assert got.shape == (tokens, ff) and np.isfinite(got).all() and np.isfinite(want).all()
        if wgmma:
            assert nmse(got, want) <= 1e-10, kind
            monkeypatch.setenv("GGML_CIQ_WGMMA_STREAMK", "0")
            monkeypatch.setenv("GGML_CIQ_WGMMA_TAIL", "0")
            got = fusing.linear_glu(weight, x, kind, norm=(norm, 1e-5)).numpy()
            want = fusing.glu(*fusing.linear_group([stacked], x, norm=(norm, 1e-5)), kind).numpy()
            monkeypatch.delenv("GGML_CIQ_WGMMA_STREAMK")
            monkeypatch.delenv("GGML_CIQ_WGMMA_TAIL")
        assert np.array_equal(got, want), kind
    with pytest.raises(InvalidArgumentError, match="linear_glu"):
        fusing.linear(weight, x)
    with pytest.raises(InvalidArgumentError, match="linear_glu"):
        fusing.linear_group([weight], x)
    with pytest.raises(InvalidArgumentError, match="from stack_glu"):
        fusing.linear_glu(stacked, x, "silu")
    with pytest.raises(InvalidArgumentError, match="unknown kind"):
        fusing.linear_glu(weight, x, "relu")
    assert NativeOps(ops.device).stack_glu(gate, up) is None  # fuse off: none
    monkeypatch.setenv("GGML_CIQ_FUSE_GLU", "0")  # this fusion alone off
    assert fusing.stack_glu(gate, up) is None
    monkeypatch.delenv("GGML_CIQ_FUSE_GLU")
    odd = [_quantized_tensor(rng, f"blk.0.ffn_{n}.weight", Q.Q4_K, 96, 512) for n in ("gate", "up")]
    assert fusing.stack_glu(*odd) is None  # rows not a multiple of 64


def test_gemm_glu_bad_input(native_lib, rng):
    """ciq_gemm_quantized_glu: a weight whose rows are not whole interleaved blocks of 128, an unknown GLU kind: each
    one error naming the problem, nothing written."""
    n = native.load()
    lib, ffi = n.lib, n.ffi
    k, tokens = 256, 3
    plan = ffi.new("ciq_plan *")
    n.check(lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, lib.CIQ_VARIANT_AUTO, lib.CIQ_SEMANTICS_ANY, Q.Q4_K, 192, k, tokens,
                              plan))
    xq = ffi.new("uint8_t[]", plan.activation_bytes)
    n.check(lib.ciq_activations_quantize(lib.CIQ_DEVICE_CPU, plan.activation_layout,
                                         ffi.from_buffer("float[]", rng.standard_normal((tokens, k)).astype(np.float32)),
                                         xq, tokens, k))
    out = ffi.new("float[]", tokens * 96)
    for rows, kind, message in [(192, lib.CIQ_GLU_SILU, "multiple of 128 rows, got 192"),
                                (128, 7, "unknown GLU kind 7")]:
        raw = Q.quantize_q4_K(rng.standard_normal((rows, k)).astype(np.float32))
        status = lib.ciq_gemm_quantized_glu(lib.CIQ_DEVICE_CPU, plan, Q.Q4_K, ffi.from_buffer(raw), len(raw), rows, k,
                                            xq, tokens, kind, out)
        assert status == lib.CIQ_ERR_INVALID_ARGUMENT and message in ffi.string(lib.ciq_last_error()).decode(), message
    assert bytes(ffi.buffer(out)) == bytes(tokens * 96 * 4)


@pytest.mark.parametrize("tokens", [1, 9, 37, 300])
def test_group_of_two_types(ops, rng, monkeypatch, tokens):
    """linear_group of a stacked Q4_K q+k (256 + 128 rows) and a Q6_K v of 200 rows (a row tail), K 2048 (both staged
    by TMA): ciq_gemm_quantized_group. GGML_CIQ_WGMMA_GROUP=2 runs the two in one launch where wgmma runs (counted as
    grouped; two dispatches), 0 never, 1 where the time model gains; either order of the weights. Against the weights
    apart: the same bits unless grouped (one plan over both: NMSE <= 1e-10). Outputs NaN-poisoned."""
    k = 2048
    fusing = PoisonedOps(ops.device, fuse=True)
    qk = fusing.stack_weights([_quantized_tensor(rng, f"blk.0.attn_{n}.weight", Q.Q4_K, rows, k)
                               for n, rows in (("q", 256), ("k", 128))])
    v = fusing.load_weight(_quantized_tensor(rng, "blk.0.attn_v.weight", Q.Q6_K, 200, k))
    x = fusing.asarray(rng.standard_normal((tokens, k)).astype(np.float32))
    apart = [y.numpy() for y in fusing.linear_group([qk], x) + fusing.linear_group([v], x)]
    assert [a.shape[1] for a in apart] == [256, 128, 200]
    for group in ("2", "0", "1"):
        monkeypatch.setenv("GGML_CIQ_WGMMA_GROUP", group)
        for order in ((qk, v), (v, qk)):
            native.dispatch_reset()
            outs = [y.numpy() for y in fusing.linear_group(list(order), x)]
            assert sum(native.dispatch_counts().values()) == 2
            grouped = native.wgmma_launch_counts()["grouped"]
            assert grouped == 0 if group == "0" or not _wgmma_runs(ops, tokens) else grouped >= 1 or group == "1"
            want = apart if order[0] is qk else apart[2:] + apart[:2]
            for got, ref in zip(outs, want):
                assert got.shape == ref.shape and np.isfinite(got).all()
                assert nmse(got, ref) <= 1e-10 if grouped else np.array_equal(got, ref), (group, tokens)


@pytest.mark.parametrize("tokens", [1, 9, 37, 300])
@pytest.mark.parametrize("case", [((Q.Q4_K, Q.Q4_K, Q.Q6_K), (256, 128, 200), 2048),
                                  ((Q.Q6_K, Q.Q4_K, Q.Q4_K), (200, 128, 256), 2048),
                                  ((Q.Q4_K,) * 3, (256, 128, 200), 512), ((Q.Q6_K,) * 3, (256, 128, 200), 2048),
                                  ((Q.Q4_K, Q.Q6_K, Q.Q4_K), (256, 128, 200), 512),
                                  ((Q.Q6_K, Q.Q4_K, Q.Q4_K), (256, 128, 200), 2048)],
                         ids=["q4q4q6", "q6q4q4", "q4x3", "q6x3", "q6-not-staged", "q4-tail-not-last"])
def test_group_of_three(ops, rng, monkeypatch, tokens, case):
    """linear_group of three plain weights (llama.cpp's q, k and v as they are, one with a row tail):
    ciq_gemm_quantized_group. With GGML_CIQ_WGMMA_GROUP=2, where wgmma runs, one launch (counted grouped; three
    dispatches) for one K-quant type or Q4_K and Q6_K in any order given (the library puts Q4_K first, the outputs
    follow their weights); apart where a Q6_K that TMA cannot stage (K 512) is one of them or, once Q4_K goes first, a
    weight with a row tail is not the last. Against each weight apart: NMSE <= 1e-10 when grouped (one plan over all),
    else the same bits. Outputs NaN-poisoned."""
    types, rows, k = case
    fusing = PoisonedOps(ops.device, fuse=True)
    weights = [fusing.load_weight(_quantized_tensor(rng, f"blk.0.attn_{n}.weight", t, r, k))
               for n, t, r in zip("qkv", types, rows)]
    x = fusing.asarray(rng.standard_normal((tokens, k)).astype(np.float32))
    apart = [fusing.linear_group([w], x)[0].numpy() for w in weights]
    order = sorted(range(3), key=lambda i: types[i] == Q.Q6_K)  # the launch's order: Q4_K first
    staged = all(t != Q.Q6_K or k % 2048 == 0 for t in types) and all(rows[i] % 128 == 0 for i in order[:2])
    for group in ("2", "0"):
        monkeypatch.setenv("GGML_CIQ_WGMMA_GROUP", group)
        native.dispatch_reset()
        outs = [y.numpy() for y in fusing.linear_group(weights, x)]
        assert sum(native.dispatch_counts().values()) == 3
        grouped = native.wgmma_launch_counts()["grouped"]
        assert grouped == (1 if group == "2" and staged and _wgmma_runs(ops, tokens) else 0), (group, tokens)
        for got, ref in zip(outs, apart):
            assert got.shape == ref.shape and np.isfinite(got).all()
            assert nmse(got, ref) <= 1e-10 if grouped else np.array_equal(got, ref), (group, tokens)


@pytest.mark.parametrize("tokens", [1, 9, 37, 300])
@pytest.mark.parametrize("case", [(Q.Q4_K, 512, 192), (Q.Q6_K, 2048, 64), (Q.Q6_K, 512, 128), (Q.Q4_K, 512, 96),
                                  (Q.Q8_0, 640, 128)],
                         ids=["q4k", "q6k-staged", "q6k-not-staged", "q4k-rows96", "q8_0"])
def test_linear_glu_pair(ops, rng, tokens, case):
    """linear_glu_pair (ciq_gemm_quantized_glu_pair: gate and up as llama.cpp holds them, two matrices) against
    linear_glu of the same two interleaved by stack_glu: the same bits (on a GPU both the GLU from wgmma's epilogue, one
    plan for both; elsewhere the GEMMs apart, then glu), and against the two GEMMs apart then glu: NMSE <= 1e-10.
    Where wgmma stages both (Q4_K; Q6_K with K % 2048 == 0) and rows % 64 == 0: one launch counted as a GLU launch,
    else none; two dispatches. Both GLU kinds, the norm fused in; outputs NaN-poisoned."""
    ggml_type, k, ff = case
    fusing = PoisonedOps(ops.device, fuse=True)
    gate, up = (_quantized_tensor(rng, f"blk.0.ffn_{n}.weight", ggml_type, ff, k) for n in ("gate", "up"))
    wg, wu = fusing.load_weight(gate), fusing.load_weight(up)
    x = fusing.asarray((rng.standard_normal((tokens, k)) * 2).astype(np.float32))
    if not fusing.groups([wg, wu]):  # the CPU dequantizes Q8_0 weights: no blocks to multiply
        with pytest.raises(InvalidArgumentError, match="two plain quantized weights"):
            fusing.linear_glu_pair(wg, wu, x, "silu")
        return
    norm = fusing.asarray((rng.standard_normal(k) + 1).astype(np.float32))
    interleaved = fusing.stack_glu(gate, up) if ff % 64 == 0 else None
    epilogue = _wgmma_runs(ops, tokens) and ff % 64 == 0 and ggml_type != Q.Q8_0 and \
        (ggml_type != Q.Q6_K or k % 2048 == 0)
    for kind in ("silu", "gelu"):
        native.dispatch_reset()
        got = fusing.linear_glu_pair(wg, wu, x, kind, norm=(norm, 1e-5)).numpy()
        assert sum(native.dispatch_counts().values()) == 2
        assert (native.wgmma_launch_counts()["glu"] == 1) == epilogue, (kind, tokens)
        assert got.shape == (tokens, ff) and np.isfinite(got).all()
        want = fusing.glu(*fusing.linear_group([wg, wu], x, norm=(norm, 1e-5)), kind).numpy()
        assert nmse(got, want) <= 1e-10, kind
        if interleaved is not None:
            assert np.array_equal(got, fusing.linear_glu(interleaved, x, kind, norm=(norm, 1e-5)).numpy()), kind
    with pytest.raises(InvalidArgumentError, match="one type and shape"):
        fusing.linear_glu_pair(wg, fusing.load_weight(_quantized_tensor(rng, "w", ggml_type, ff + 64, k)), x, "silu")
    with pytest.raises(InvalidArgumentError, match="unknown kind"):
        fusing.linear_glu_pair(wg, wu, x, "relu")


def test_gemm_group_bad_input(native_lib, rng):
    """ciq_gemm_quantized_group: three weights, plans reading different activation layouts, outputs of the two weights
    overlapping: each one error naming the problem."""
    n = native.load()
    lib, ffi = n.lib, n.ffi
    k, tokens, rows = 256, 3, 32
    plans = [ffi.new("ciq_plan *") for _ in range(2)]
    n.check(lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, lib.CIQ_VARIANT_AUTO, lib.CIQ_SEMANTICS_ANY, Q.Q4_K, rows, k, tokens,
                              plans[0]))
    n.check(lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, lib.CIQ_VARIANT_AUTO, lib.CIQ_SEMANTICS_ANY, Q.Q8_0, rows, k, tokens,
                              plans[1]))
    assert plans[0].activation_layout != plans[1].activation_layout
    raw = Q.quantize_q4_K(rng.standard_normal((rows, k)).astype(np.float32))
    raw8 = _quantized_tensor(rng, "w", Q.Q8_0, rows, k).raw()
    xq = ffi.new("uint8_t[]", 1 << 16)
    a, b = ffi.new("float[]", tokens * rows), ffi.new("float[]", tokens * rows)
    outputs = [ffi.new("ciq_gemm_output[1]") for _ in range(2)]

    def weights(specs):
        group = ffi.new("ciq_gemm_weight[]", len(specs))
        for g, (plan, ggml_type, blocks, out), o in zip(group, specs, outputs * 2):
            o[0].rows, o[0].out = rows, out
            g.plan, g.type, g.weight, g.weight_nbytes, g.rows = plan, ggml_type, ffi.from_buffer(blocks), len(blocks), rows
            g.outputs, g.n_outputs = o, 1
        return group

    w4 = (plans[0], Q.Q4_K, raw)
    cases = [([w4 + (a,)] * 4, "4 weights (1..3)"),
             ([w4 + (a,), (plans[1], Q.Q8_0, raw8, b)], "one x_quantized cannot be both"),
             ([w4 + (a,), w4 + (a + 10,)], "outputs 0 and 1 overlap")]
    for specs, message in cases:
        group = weights(specs)
        status = lib.ciq_gemm_quantized_group(lib.CIQ_DEVICE_CPU, group, len(specs), k, xq, tokens, lib.CIQ_OUT_F32)
        assert status == lib.CIQ_ERR_INVALID_ARGUMENT and message in ffi.string(lib.ciq_last_error()).decode(), message


@pytest.mark.parametrize("n", [1, 17, 4096, 4099])
def test_glu_silu(ops, rng, n):
    gate = (rng.standard_normal(n) * 6).astype(np.float32)
    up = rng.standard_normal(n).astype(np.float32)
    out = ops.glu(ops.asarray(gate), ops.asarray(up), "silu").numpy()
    ref = (gate / (np.float32(1) + np.exp(-gate)) * up).astype(np.float32)
    assert nmse(out, ref) <= 1e-12  # same order; expf vs numpy's float32 exp (<= 1 ulp apart)


def test_llamacpp_cpu_order_is_the_host_order_but_simd_silu(native_lib, rng):
    """CIQ_ORDER_LLAMACPP_CPU: SiLU through ggml_v_expf on each 8-value block from the first value (not bit-equal to
    expf's: the test can fail), expf on the n % 8 tail (bit-equal to the host order there); GELU the host order's;
    a GPU refuses the order, unknown orders are named."""
    n, lib, ffi = native_lib, native_lib.lib, native_lib.ffi
    gate = (rng.standard_normal(4099) * 6).astype(np.float32)
    up = rng.standard_normal(4099).astype(np.float32)

    def glu(order, kind):
        out = np.full_like(gate, np.nan)
        n.check(lib.ciq_glu(lib.CIQ_DEVICE_CPU, order, kind, ffi.from_buffer("float[]", gate),
                            ffi.from_buffer("float[]", up), gate.size, ffi.from_buffer("float[]", out)))
        return out

    simd, host = glu(lib.CIQ_ORDER_LLAMACPP_CPU, lib.CIQ_GLU_SILU), glu(lib.CIQ_ORDER_HOST, lib.CIQ_GLU_SILU)
    assert np.array_equal(simd[4096:], host[4096:]) and not np.array_equal(simd[:4096], host[:4096])
    assert nmse(simd, host) <= 1e-12
    assert np.array_equal(glu(lib.CIQ_ORDER_LLAMACPP_CPU, lib.CIQ_GLU_GELU), glu(lib.CIQ_ORDER_HOST, lib.CIQ_GLU_GELU))
    out = np.empty_like(gate)
    assert lib.ciq_glu(lib.CIQ_DEVICE_CPU, 3, lib.CIQ_GLU_SILU, ffi.from_buffer("float[]", gate),
                       ffi.from_buffer("float[]", up), 8, ffi.from_buffer("float[]", out)) == lib.CIQ_ERR_INVALID_ARGUMENT
    assert "LLAMACPP_CPU 2" in ffi.string(lib.ciq_last_error()).decode()
    with pytest.raises(InvalidArgumentError, match="runs on a GPU, not the CPU"):
        NativeOps("cpu", op_order="llamacpp_cuda")
    if native.device_count():
        with pytest.raises(InvalidArgumentError, match="runs on the CPU, not a GPU"):
            NativeOps("cuda", op_order="llamacpp_cpu")


@pytest.mark.parametrize("n", [1, 17, 4096, 4099])
def test_glu_gelu(ops, rng, n):
    gate = (rng.standard_normal(n) * 5).astype(np.float32)
    if n >= 3:
        gate[:3] = [-10.0, 10.0, 12.5]  # the table's cut-offs
    up = rng.standard_normal(n).astype(np.float32)
    out = ops.glu(ops.asarray(gate), ops.asarray(up), "gelu").numpy()
    if ops.device < 0:
        ref = gelu_fp16_table_ref(gate) * up
        assert np.array_equal(out, ref)  # same table, same float32 product
    else:
        ref = np.where(gate <= -10.0, 0.0, np.where(gate >= 10.0, gate, gelu_float_ref(gate))) * up
        # Float tanhf in CUDA (<= 2 ulp); the GPU does not use the fp16 table (llama.cpp CUDA does not either).
        assert nmse(out, ref) <= 1e-12


def test_gelu_table_is_the_fp16_one(native_lib):
    """The CPU GELU is ggml's fp16-table GELU, not float GELU, on every f16 input, and the same table as NumpyOps'."""
    gate = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    gate = gate[np.isfinite(gate)]
    out = NativeOps("cpu").glu(gate, np.ones_like(gate), "gelu").numpy()
    assert np.array_equal(out, gelu_fp16_table_ref(gate))
    assert np.array_equal(out, NumpyOps().glu(gate, np.ones_like(gate), "gelu"))
    inside = np.abs(gate) < 4
    assert nmse(out[inside], gelu_float_ref(gate[inside])) > 1e-9


@pytest.mark.parametrize("n", [1, 17, 4099])
def test_add_scale(ops, rng, n):
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    assert np.array_equal(ops.add(ops.asarray(a), ops.asarray(b)).numpy(), a + b)
    x, bias = rng.standard_normal((n, 24)).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    assert np.array_equal(ops.add(ops.asarray(x), ops.asarray(bias)).numpy(), x + bias)  # a bias row
    assert np.array_equal(ops.scale(ops.asarray(a), 0.37).numpy(), a * np.float32(0.37))


def test_kv_store(ops, rng):
    cache = ops.asarray(np.full((40, 4, 64), np.nan, np.float16))
    x = (rng.standard_normal((17, 4, 64)) * 100).astype(np.float32)
    x[0, 0, :4] = [65520.0, -1e-8, 3e-5, 1.0 + 2 ** -11]  # overflow to inf, subnormal, tie to even
    ops.kv_store(cache, 5, ops.asarray(x))
    host = cache.numpy()
    with np.errstate(over="ignore"):
        assert np.array_equal(host[5:22], x.astype(np.float16))
    assert np.isnan(host[:5]).all() and np.isnan(host[22:]).all()
    with pytest.raises(ShapeError):
        ops.kv_store(cache, 30, ops.asarray(x))


def test_convert_bf16(ops, rng):
    x = (rng.standard_normal(1031) * 1e3).astype(np.float32)
    x[:4] = [np.inf, -0.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8]  # ties to even down and up
    xd = ops.asarray(x)
    out = ops.empty((x.size,), np.float16)
    ops.native.check(ops.native.lib.ciq_values_convert_bf16(ops.device, ops._fp(xd), x.size, out.ptr))
    assert np.array_equal(out.numpy().view(np.uint16), bf16_bits(x))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


# ---- get_rows and dequantization ---------------------------------------------------------------------------------

def random_table(rng, ggml_type: int, rows: int, k: int) -> np.ndarray:
    """Raw bytes of a [rows, k] table: random quants, finite fp16 scales of either sign."""
    values, nbytes = Q.BLOCK_LAYOUT[ggml_type]
    if ggml_type == Q.F32:
        return rng.standard_normal((rows, k)).astype(np.float32).view(np.uint8).reshape(-1)
    if ggml_type == Q.F16:
        return rng.standard_normal((rows, k)).astype(np.float16).view(np.uint8).reshape(-1)
    if ggml_type == Q.BF16:
        return (rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(-1)
    blocks = rng.integers(0, 256, (rows * k // values, nbytes), dtype=np.uint8)
    scale = lambda n: rng.uniform(-0.1, 0.1, n).astype(np.float16).view(np.uint8).reshape(n, 2)  # noqa: E731
    if ggml_type in Q.Q32_TYPES:
        blocks[:, 0:2] = scale(len(blocks))
    elif ggml_type in (Q.Q4_K, Q.Q5_K) + Q.Q32_1_TYPES:  # d, then dmin (K-quants) or m (Q4_1/Q5_1)
        blocks[:, 0:2], blocks[:, 2:4] = scale(len(blocks)), scale(len(blocks))
    else:  # Q6_K: d last
        blocks[:, 208:210] = scale(len(blocks))
    return blocks.reshape(-1)


TABLE_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q4_1, Q.Q5_1]


@pytest.mark.parametrize("ggml_type", TABLE_TYPES, ids=[Q.type_name(t) for t in TABLE_TYPES])
def test_get_rows(ops, rng, ggml_type):
    rows, k = 37, 512
    raw = random_table(rng, ggml_type, rows, k)
    tensor = Tensor("token_embd.weight", ggml_type, (rows, k), raw)
    ids = rng.integers(0, rows, 19).astype(np.int32)
    ids[:2] = [0, rows - 1]
    out = ops.get_rows(tensor, ids).numpy()
    ref = Q.dequantize(ggml_type, raw, rows, k)[ids]
    assert np.array_equal(out, ref), f"{Q.type_name(ggml_type)}: max |diff| {np.abs(out - ref).max()}"


@pytest.mark.parametrize("ggml_type", TABLE_TYPES, ids=[Q.type_name(t) for t in TABLE_TYPES])
def test_dequantize_bf16(ops, rng, ggml_type):
    rows, k = 5, 768
    raw = random_table(rng, ggml_type, rows, k)
    data = ops.empty((raw.size,), np.uint8)
    ops.native.check(ops.native.lib.ciq_memory_upload(ops.device, data.ptr, ops.native.ffi.from_buffer(raw), raw.size))
    out = ops.empty((rows, k), np.float16)
    ops.native.check(ops.native.lib.ciq_tensor_dequantize_bf16(ops.device, ggml_type, data.ptr, rows, k, out.ptr))
    assert np.array_equal(out.numpy().view(np.uint16), bf16_bits(Q.dequantize(ggml_type, raw, rows, k)))


def test_get_rows_real_embedding(native_lib, gemma_model, rng):
    if "token_embd.weight" not in gemma_model.tensors:
        pytest.skip(f"{gemma_model.path} holds only the Q4_K/Q6_K tensors (tools/gemma_kquants.py)")
    tensor = gemma_model.tensor("token_embd.weight")
    ids = rng.integers(0, tensor.rows, 33).astype(np.int32)
    out = PoisonedOps("cpu").get_rows(tensor, ids).numpy()
    raw = tensor.raw().reshape(tensor.rows, -1)[ids]
    assert np.array_equal(out, Q.dequantize(tensor.ggml_type, np.ascontiguousarray(raw).reshape(-1), len(ids), tensor.k))


def test_get_rows_bad_input(native_lib, rng):
    ops = NativeOps("cpu")
    raw = random_table(rng, Q.Q8_0, 4, 64)
    with pytest.raises(ShapeError):
        ops.get_rows(Tensor("t", Q.Q8_0, (4, 64), raw), np.array([0, 4], np.int32))
    with pytest.raises(UnsupportedTypeError):
        ops.get_rows(Tensor("t", 20, (4, 64), raw), np.array([0], np.int32))  # IQ4_NL


# ---- attention ---------------------------------------------------------------------------------------------------

# (tokens, heads_kv, group, head_dim, n_past, window): tails of 1, 17, 131 tokens against 64-token tiles.
ATTENTION_CASES = [
    (1, 1, 1, 64, 0, 0), (1, 8, 2, 128, 300, 0), (1, 4, 1, 256, 70, 7),
    (17, 4, 2, 64, 5, 7), (17, 1, 8, 256, 0, 7), (17, 8, 4, 128, 600, 512),
    (131, 8, 1, 128, 0, 0), (131, 4, 4, 256, 40, 512), (131, 1, 4, 64, 100, 7), (131, 1, 1, 256, 0, 0),
    (131, 4, 2, 128, 1, 0), (64, 2, 3, 96, 64, 0),
]


def _attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past):
    heads = heads_kv * group
    cache_rows = n_past + tokens + 9  # rows past n_past + tokens are NaN: a kernel reading them fails
    q = (rng.standard_normal((tokens, heads, head_dim)) * 2).astype(np.float32)
    k = np.full((cache_rows, heads_kv, head_dim), np.nan, np.float16)
    v = np.full_like(k, np.nan)
    k[:n_past + tokens] = rng.standard_normal((n_past + tokens, heads_kv, head_dim))
    v[:n_past + tokens] = rng.standard_normal((n_past + tokens, heads_kv, head_dim))
    return q, k, v


def _wgmma_attention_or_skip():
    _gpu_or_skip()
    if not NativeOps("cuda", attention_kernel="wgmma").attention_runs(128):
        pytest.skip("attention wgmma needs a Hopper GPU (sm_90) and a build with sm_90a code")


@pytest.fixture(params=["cpu", "ggml", "simt", "mma", "mma_llamacpp", "wgmma"])
def attention_ops(request, native_lib):
    if request.param == "wgmma":
        _wgmma_attention_or_skip()
    elif request.param not in ("cpu", "ggml"):
        _gpu_or_skip()
    return PoisonedOps("cpu" if request.param in ("cpu", "ggml") else "cuda", attention_kernel=request.param)


@pytest.mark.parametrize("tokens, heads_kv, group, head_dim, n_past, window", ATTENTION_CASES)
def test_attention(attention_ops, rng, tokens, heads_kv, group, head_dim, n_past, window):
    ops = attention_ops
    kernel = ops.attention_kernel
    if kernel == "wgmma" and head_dim not in (64, 128, 256):
        with pytest.raises(BackendError, match="does not run head_dim"):
            ops.attention_kernel_name(head_dim)  # asked for by name: an error, never another kernel
        return
    assert ops.attention_kernel_name(head_dim) == kernel  # the kernel asked for is the one that runs
    q, k, v = _attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past)
    scale = 1.0 / np.sqrt(head_dim)
    out = ops.attention(ops.asarray(q), ops.asarray(k), ops.asarray(v), n_past, scale, window).numpy()
    if kernel == "mma_llamacpp":
        # llama.cpp CUDA's flash attention: f16 q times the f16 scale, p <= 1/8 rounded to f16, P V accumulated in
        # f16. Against float64 on those q: 2.0e-8 to 7.7e-7 in the emulation (tests/test_cuda_emulation.py).
        q16 = (q.astype(np.float16) * np.float16(scale)).astype(np.float32)
        assert nmse(out, attention_ref(q16, k, v, n_past, 1.0, window)) <= 1e-5
    elif kernel in ("mma", "wgmma", "ggml"):
        # q and the softmax weights rounded to f16 (mma: for the tensor cores, as llama.cpp's CUDA FlashAttention;
        # ggml: as llama.cpp CPU's f16 K/V products); the reference rounds q too, the weights' rounding (2^-12)
        # remains. mma measured 1.2e-9 to 1.6e-8 (emulation and H200); wgmma (the same roundings) is held to mma's bar.
        assert nmse(out, attention_ref(q, k, v, n_past, scale, window, round_q=True)) <= 1e-6
    else:
        # Float32 running sums (keys and dims ascending on the CPU, tiled on the GPU) against float64, so not the
        # same order: measured on the CPU 1e-14 (a few keys) to 1.1e-12 (512 visible keys); bar 1e-10.
        assert nmse(out, attention_ref(q, k, v, n_past, scale, window)) <= 1e-10


@pytest.mark.parametrize("kernel", ["simt", "mma", "wgmma"])
@pytest.mark.parametrize("tokens, heads_kv, group, head_dim, n_past, window, splits",
                         [(512, 1, 4, 256, 0, 512, True), (512, 1, 4, 256, 3584, 0, True),
                          (512, 1, 4, 256, 3584, 512, True), (1, 8, 4, 128, 4000, 0, True),
                          (131, 1, 4, 64, 100, 7, True), (64, 8, 4, 128, 1000, 0, True),
                          (512, 8, 4, 128, 0, 0, False)])
def test_attention_split_over_keys(native_lib, rng, monkeypatch, kernel, tokens, heads_kv, group, head_dim, n_past,
                                   window, splits):
    """attention.cu's split over the keys on the GPU, at Gemma 3 270M's micro-batches (512 queries, 4 heads on 1 kv
    head: 32 CTAs; global and sliding layers after 3584 cached keys), a decode row over 4000 keys, a window cutting
    rows out of a chunk and Llama-3-8B's 32 heads at 64 queries: within the kernel's bar of float64, not the unsplit
    bits (GGML_CIQ_ATTENTION_SPLIT=0), and the same bits on a second call. Llama-3-8B at 512 queries is 256 CTAs, more
    than the H200's 132 SMs: not split (the unsplit bits). wgmma (128 queries a CTA, 64 at D 256) splits below half the SMs
    and only where a tile's key range reaches 1024 keys (the 8B at 512 queries: 128 CTAs, not split)."""
    if kernel == "wgmma":
        _wgmma_attention_or_skip()
    else:
        _gpu_or_skip()
    ops = PoisonedOps("cuda", attention_kernel=kernel)
    q, k, v = _attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past)
    scale = 1.0 / np.sqrt(head_dim)
    qd, kd, vd = ops.asarray(q), ops.asarray(k), ops.asarray(v)
    split = ops.attention(qd, kd, vd, n_past, scale, window).numpy()
    assert np.array_equal(split, ops.attention(qd, kd, vd, n_past, scale, window).numpy())
    monkeypatch.setenv("GGML_CIQ_ATTENTION_SPLIT", "0")
    whole = ops.attention(qd, kd, vd, n_past, scale, window).numpy()
    reference = attention_ref(q, k, v, n_past, scale, window, round_q=kernel != "simt")
    for out in (split, whole):
        assert nmse(out, reference) <= (1e-10 if kernel == "simt" else 1e-6)
    if kernel == "wgmma":  # the longest key range of a tile (QT queries): wgmma splits from 1024 keys
        qt = 128 if head_dim <= 128 else 64
        splits = splits and min(n_past + tokens, window + qt - 1 if window else n_past + tokens) >= 1024
    assert np.array_equal(split, whole) != splits


def test_attention_ggml_same_values_on_every_isa(native_lib, rng, monkeypatch):
    """The ggml kernel's AVX2 dot products and its scalar ones are the same eight fma lanes: bit-identical outputs
    (windows, n_past, head_dim 96 and 256 included)."""
    if native.build_info()["cpu_isa"] == "scalar":
        pytest.skip("no AVX2 path on this CPU")
    for tokens, heads_kv, group, head_dim, n_past, window in ATTENTION_CASES:
        q, k, v = _attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past)
        ops = PoisonedOps("cpu", attention_kernel="ggml")
        fast = ops.attention(ops.asarray(q), ops.asarray(k), ops.asarray(v), n_past, 0.125, window).numpy()
        monkeypatch.setenv("GGML_CIQ_CPU_ISA", "scalar")
        slow = ops.attention(ops.asarray(q), ops.asarray(k), ops.asarray(v), n_past, 0.125, window).numpy()
        monkeypatch.delenv("GGML_CIQ_CPU_ISA")
        assert np.array_equal(fast, slow), (tokens, heads_kv, group, head_dim, n_past, window)


def test_attention_auto_on_gpu(native_lib, monkeypatch):
    """AUTO: wgmma where it runs (Hopper, sm_90a code, head_dim 64/128/256), else mma; GGML_CIQ_ATTENTION_WGMMA=0
    passes over wgmma."""
    _gpu_or_skip()
    ops = NativeOps("cuda")
    hopper = NativeOps("cuda", attention_kernel="wgmma").attention_runs(128)
    best = "wgmma" if hopper else "mma"
    assert [ops.attention_kernel_name(d) for d in (64, 96, 128, 256)] == [best, "mma", best, best]
    monkeypatch.setenv("GGML_CIQ_ATTENTION_WGMMA", "0")
    assert [ops.attention_kernel_name(d) for d in (64, 96, 128, 256)] == ["mma"] * 4
    with pytest.raises(BackendError):
        ops.attention_kernel_name(80)  # no kernel built for head_dim 80


@pytest.mark.parametrize("value", ["maybe", "2x", "of"])
def test_attention_wgmma_switch_bad_value(native_lib, monkeypatch, value):
    """GGML_CIQ_ATTENTION_WGMMA is read where AUTO resolves, on every device: a value that is neither on nor off is an
    error naming the variable (as the Python switches), never taken as off; an explicit kernel does not read it."""
    monkeypatch.setenv("GGML_CIQ_ATTENTION_WGMMA", value)
    with pytest.raises(InvalidArgumentError, match=f"GGML_CIQ_ATTENTION_WGMMA='{value}': expected 1 or 0"):
        NativeOps("cpu").attention_kernel_name(64)
    assert NativeOps("cpu", attention_kernel="cpu").attention_kernel_name(64) == "cpu"
    for good in ("0", " Off ", "YES", ""):
        monkeypatch.setenv("GGML_CIQ_ATTENTION_WGMMA", good)
        assert NativeOps("cpu").attention_kernel_name(64) == "cpu"


# (tokens, n_past, heads, heads_kv, head_dim, window): 128-query tiles (64 at D 256) with tails, key tiles (128 keys; 64 at D 256)
# crossing the diagonal, the window's start and the cache's last filled row, GQA groups of 1..4, decode rows.
WGMMA_ATTENTION_CASES = [
    (300, 1000, 6, 2, 128, 0), (300, 1000, 6, 2, 128, 700), (129, 0, 4, 1, 64, 0), (255, 77, 8, 8, 64, 33),
    (200, 300, 4, 1, 256, 0), (200, 300, 4, 1, 256, 512), (1, 4095, 8, 2, 128, 0), (7, 130, 2, 2, 256, 5),
]


@pytest.mark.parametrize("tokens, n_past, heads, heads_kv, head_dim, window", WGMMA_ATTENTION_CASES)
def test_attention_wgmma_against_float64(native_lib, rng, tokens, n_past, heads, heads_kv, head_dim, window):
    """attention_wgmma.cu on longer key ranges than ATTENTION_CASES: within mma's bar of float64 (q rounded to f16 in
    the reference), poisoned outputs overwritten, NaN cache rows past the filled ones never read, the same bits on a
    second call, and the launch counted as wgmma's."""
    _wgmma_attention_or_skip()
    ops = PoisonedOps("cuda", attention_kernel="wgmma")
    q, k, v = _attention_inputs(rng, tokens, heads_kv, heads // heads_kv, head_dim, n_past)
    q *= 2  # larger scores: a sharper softmax, rows whose maximum moves between key tiles
    scale = 1.0 / np.sqrt(head_dim)
    qd, kd, vd = ops.asarray(q), ops.asarray(k), ops.asarray(v)
    native.dispatch_reset()
    out = ops.attention(qd, kd, vd, n_past, scale, window).numpy()
    counts = native.attention_dispatch_counts()
    assert counts["wgmma"] == 1 and sum(counts.values()) == 1
    assert np.isfinite(out).all()
    assert nmse(out, attention_ref(q, k, v, n_past, scale, window, round_q=True)) <= 1e-6
    assert np.array_equal(out, ops.attention(qd, kd, vd, n_past, scale, window).numpy())


def test_attention_mma_llamacpp_is_its_own_arithmetic(native_lib, rng):
    """On the GPU: mma_llamacpp differs from mma by more than float noise (f16 P V sums), and its max offset keeps
    16 equal scores over values of 30000 finite (p = 1/8; without the offset the f16 sum overflows)."""
    _gpu_or_skip()
    q, k, v = _attention_inputs(rng, 131, 4, 4, 256, 40)
    outs = [PoisonedOps("cuda", attention_kernel=kernel).attention(q, k, v, 40, 1 / 16, 512).numpy()
            for kernel in ("mma", "mma_llamacpp")]
    assert not np.array_equal(*outs) and nmse(outs[1], outs[0]) > 1e-9
    v = np.full((16, 1, 64), 30000, np.float16)
    out = PoisonedOps("cuda", attention_kernel="mma_llamacpp").attention(
        np.zeros((1, 1, 64), np.float32), np.zeros((16, 1, 64), np.float16), v, 15, 0.125, 0).numpy()
    assert np.isfinite(out).all() and np.allclose(out, 30000, rtol=2e-4)


# ---- ggml's FLASH_ATTN_EXT and SET_ROWS (the ggml plugin's attention steps) --------------------------------------

def masked_attention_ref(q, k_cache, v_cache, mask, n_kv, scale, round_q=False):
    """Float64 GQA of q over the caches' first n_kv rows, scores scale * q.k + mask; rows with no key: zeros."""
    t, h, d = q.shape
    group = h // k_cache.shape[1]
    q64 = (q.astype(np.float16) if round_q else q).astype(np.float64)
    k = np.repeat(k_cache[:n_kv].astype(np.float64), group, axis=1)
    v = np.repeat(v_cache[:n_kv].astype(np.float64), group, axis=1)
    m = mask[:t, :n_kv].astype(np.float64)
    visible = np.isfinite(m)
    s = np.where(visible[None], np.einsum("thd,phd->htp", q64, k) * scale + np.where(visible, m, 0)[None], -np.inf)
    top = s.max(-1, keepdims=True)
    w = np.where(visible[None], np.exp(s - np.where(np.isfinite(top), top, 0)), 0.0)
    sums = w.sum(-1, keepdims=True)
    w = np.divide(w, sums, out=np.zeros_like(w), where=sums > 0)
    return np.einsum("htp,phd->thd", w, v).reshape(t, h * d)


def masked_attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past, window, kind):
    """q, caches and a llama.cpp-style f16 mask for `tokens` queries at positions n_past.. over n_kv keys (n_past +
    tokens rounded up to 32, the cells past them filled but masked), its rows padded to a multiple of 8 and 16 columns
    wider than n_kv. kind: causal (with the window), two_sequences (a block-diagonal mask: the second half of the
    queries sees only its own keys), empty_row (query 3 sees nothing: zeros), or bias (finite negative values added
    to the visible scores). Cache rows past n_kv are NaN: a kernel reading them fails."""
    heads, n_kv = heads_kv * group, -(-(n_past + tokens) // 32) * 32
    q = (rng.standard_normal((tokens, heads, head_dim)) * 2).astype(np.float32)
    k = np.full((n_kv + 9, heads_kv, head_dim), np.nan, np.float16)
    v = np.full_like(k, np.nan)
    k[:n_kv] = rng.standard_normal((n_kv, heads_kv, head_dim))
    v[:n_kv] = rng.standard_normal((n_kv, heads_kv, head_dim))
    pos = n_past + np.arange(tokens)[:, None]
    p = np.arange(n_kv + 16)[None, :]
    visible = (p <= pos) & ((pos - p < window) if window else True)
    if kind == "two_sequences":
        half = tokens // 2
        second = np.arange(tokens)[:, None] >= half
        visible &= np.where(second, p >= n_past + half, p < n_past + half)
    mask = np.where(visible, 0.0, -np.inf)
    if kind == "bias":
        mask = np.where(visible, -rng.uniform(0, 4, visible.shape), -np.inf)
    if kind == "empty_row":
        mask[3] = -np.inf
    rows = -(-tokens // 8) * 8
    padded = np.full((rows, n_kv + 16), -np.inf)
    padded[:tokens] = mask
    return q, k, v, padded.astype(np.float16), n_kv


# (tokens, heads_kv, group, head_dim, n_past, window, kind): query and key tiles with tails, Gemma 3's 4 heads on one
# kv head at 256 dims (sliding and global), GQA groups, a decode row, and the masks llama.cpp makes for two sequences.
MASKED_ATTENTION_CASES = [
    (131, 1, 4, 256, 0, 0, "causal"), (131, 1, 4, 256, 40, 64, "causal"), (64, 2, 3, 96, 64, 0, "causal"),
    (17, 8, 4, 128, 600, 512, "causal"), (100, 2, 2, 64, 0, 0, "two_sequences"), (70, 1, 2, 128, 30, 0, "empty_row"),
    (1, 4, 2, 128, 300, 0, "causal"), (77, 2, 1, 64, 5, 0, "bias"),
]


@pytest.fixture(params=["cpu", "simt", "mma", "wgmma"])
def masked_ops(request, native_lib):
    if request.param == "wgmma":
        _wgmma_attention_or_skip()
    elif request.param != "cpu":
        _gpu_or_skip()
    return PoisonedOps("cpu" if request.param == "cpu" else "cuda", attention_kernel=request.param)


@pytest.mark.parametrize("tokens, heads_kv, group, head_dim, n_past, window, kind", MASKED_ATTENTION_CASES)
def test_attention_masked(masked_ops, rng, tokens, heads_kv, group, head_dim, n_past, window, kind):
    """ciq_attention_masked against float64 with the same mask: poisoned outputs written, masked keys (finite in the
    cache) weigh nothing, NaN rows past n_kv never read, a row that sees no key is zeros, the launch counted as the
    kernel asked for."""
    ops = masked_ops
    if ops.attention_kernel == "wgmma" and head_dim == 96:
        with pytest.raises(BackendError, match="does not run head_dim"):
            ops.attention_kernel_name(head_dim)  # asked for by name: an error, never another kernel
        return
    q, k, v, mask, n_kv = masked_attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past, window, kind)
    scale = 1.0 / np.sqrt(head_dim)
    native.dispatch_reset()
    out = ops.attention_masked(ops.asarray(q), ops.asarray(k), ops.asarray(v), ops.asarray(mask), n_kv, scale).numpy()
    counts = native.attention_dispatch_counts()
    assert counts[ops.attention_kernel] == 1 and sum(counts.values()) == 1
    assert np.isfinite(out).all()
    if kind == "empty_row":
        assert not out[3].any()
    f16 = ops.attention_kernel in ("mma", "wgmma")  # q and p rounded to f16
    reference = masked_attention_ref(q, k, v, mask, n_kv, scale, round_q=f16)
    assert nmse(out, reference) <= (1e-6 if f16 else 1e-10)


@pytest.mark.parametrize("kernel", ["cpu", "mma", "wgmma"])
def test_attention_masked_causal_is_attention(native_lib, rng, monkeypatch, kernel):
    """A causal mask without a window gives ciq_attention's bits (the same kernel and key tiles: the host's keys in
    order; on a GPU mma or wgmma with the split over the keys off: a tile all 0 adds nothing, a diagonal one adds 0 or
    masks), so the plugin's attention is the engine's."""
    if kernel == "wgmma":
        _wgmma_attention_or_skip()
    elif kernel != "cpu":
        _gpu_or_skip()
    monkeypatch.setenv("GGML_CIQ_ATTENTION_SPLIT", "0")
    ops = PoisonedOps("cpu" if kernel == "cpu" else "cuda", attention_kernel=kernel)
    for tokens, heads_kv, group, head_dim, n_past in [(131, 1, 4, 256, 0), (64, 2, 3, 96, 64), (77, 4, 2, 128, 5)]:
        if kernel == "wgmma" and not ops.attention_runs(head_dim):  # wgmma builds head_dim 64, 128 and 256
            continue
        q, k, v, mask, n_kv = masked_attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past, 0, "causal")
        k[n_past + tokens:n_kv], v[n_past + tokens:n_kv] = 0, 0  # a tile's keys past the causal end: loaded as zeros
        masked = ops.attention_masked(q, k, v, mask, n_kv, 0.125).numpy()
        assert np.array_equal(masked, ops.attention(q, k, v, n_past, 0.125, 0).numpy()), (tokens, head_dim)


def test_attention_masked_rejects(native_lib):
    """Bad arguments are errors naming them: a kernel it does not run, a mask row shorter than the keys."""
    ops = NativeOps("cpu", attention_kernel="ggml")
    q, k = np.zeros((2, 2, 64), np.float32), np.zeros((4, 1, 64), np.float16)
    mask = np.zeros((2, 4), np.float16)
    with pytest.raises(BackendError, match="cpu, simt, mma and wgmma"):
        ops.attention_masked(q, k, k, mask, 4, 1.0)
    n, out = native.load(), np.zeros((2, 128), np.float32)
    f32, u16 = (lambda a: n.ffi.from_buffer("float[]", a)), (lambda a: n.ffi.from_buffer("uint16_t[]", a.view(np.uint16)))
    with pytest.raises(InvalidArgumentError, match="mask_row 3 is shorter than n_kv 4"):
        n.check(n.lib.ciq_attention_masked(-1, 0, f32(q), u16(k), u16(k), u16(mask), 3, 2, 2, 1, 64, 4, 1.0, f32(out)))


def test_rows_set_f16(ops, rng):
    """ggml's SET_ROWS into an f16 table with a row stride: the chosen rows get x rounded to f16 (nearest even), the
    others and the stride's gap keep their bytes; on the host an id outside the table is an error naming it."""
    table = rng.standard_normal((40, 72)).astype(np.float16)
    ids = rng.permutation(40)[:13].astype(np.int64)
    x = (rng.standard_normal((13, 64)) * 1000).astype(np.float32)
    t = ops.asarray(table)
    ops.rows_set_f16(t, ids, x)
    expected = table.copy()
    expected[ids, :64] = x.astype(np.float16)
    assert np.array_equal(t.numpy().view(np.uint16), expected.view(np.uint16))
    if ops.device == -1:
        with pytest.raises(InvalidArgumentError, match="id 40 at 1 outside"):
            ops.rows_set_f16(t, np.array([0, 40], np.int64), x[:2])


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("v_k", [200, 198], ids=["vectors", "scalar"])
def test_rope_rows_set_f16_is_the_ops_apart(ops, rng, neox, v_k):
    """ciq_rope_rows_set_f16 (the plugin's q RoPE, k RoPE + K cache write and V cache write in one call; a GPU runs
    it in llama.cpp CUDA's order only) against rope, rope, rows_set_f16, rows_set_f16 in the same order on the same
    device: the same bits, q poisoned first; tails (13 tokens, 6 q heads over 2); rows no id names keep their bytes;
    without q or v the rest is the same; a GPU's vector kernel (v_k 200) and its scalar one (v_k 198: v rows not a
    multiple of 4) alike. A GPU asked for the host order refuses (UNSUPPORTED)."""
    if ops.device != -1:
        with pytest.raises(BackendError, match="llama.cpp CUDA's order only"):
            ops.rope_rows_set_f16(None, np.ones((1, 1, 2), np.float32), None, [0], 1e4, neox, [0],
                                  ops.empty((1, 2), np.float16))
        ops = PoisonedOps("cuda", op_order="llamacpp_cuda")
    tokens, heads, heads_kv, d = 13, 6, 2, 128
    q = rng.standard_normal((tokens, heads, d)).astype(np.float32)
    k = rng.standard_normal((tokens, heads_kv, d)).astype(np.float32)
    v = (rng.standard_normal((tokens, v_k)) * 100).astype(np.float32)
    positions = np.arange(700, 700 + tokens, dtype=np.int32)
    ids, v_ids = rng.permutation(40)[:tokens].astype(np.int64), rng.permutation(40)[:tokens].astype(np.int64)
    k_table = rng.standard_normal((40, heads_kv * d + 8)).astype(np.float16)
    v_table = rng.standard_normal((40, v_k + 4)).astype(np.float16)
    want_k, want_v = ops.asarray(k_table), ops.asarray(v_table)
    want_q = ops.rope(ops.asarray(q), positions, 5e5, neox)
    ops.rows_set_f16(want_k, ids, ops.rope(ops.asarray(k), positions, 5e5, neox).numpy().reshape(tokens, -1))
    ops.rows_set_f16(want_v, v_ids, v)
    for with_q, with_v in ((True, True), (False, True), (True, False)):
        got_k, got_v = ops.asarray(k_table), ops.asarray(v_table)
        got_q = ops.rope_rows_set_f16(q if with_q else None, k, v if with_v else None, positions, 5e5, neox, ids,
                                      got_k, v_ids, got_v)
        assert np.array_equal(got_k.numpy().view(np.uint16), want_k.numpy().view(np.uint16))
        assert np.array_equal(got_v.numpy().view(np.uint16), (want_v.numpy() if with_v else v_table).view(np.uint16))
        assert (got_q is None) == (not with_q)
        if with_q:
            assert np.array_equal(got_q.numpy().view(np.uint32), want_q.numpy().view(np.uint32))
    assert nmse(want_q.numpy(), rope_f64(q.astype(np.float64), positions, 5e5, neox)) <= 1e-8
    with pytest.raises(ShapeError):
        ops.rope_rows_set_f16(q, k, v, positions, 5e5, neox, ids[:5], ops.asarray(k_table), v_ids,
                              ops.asarray(v_table))


@pytest.mark.parametrize("n, d", [(17, 640), (131, 256), (3, 2048)])
def test_llamacpp_cuda_order_rms_norm(native_lib, rng, n, d):
    """The llama.cpp-CUDA-order norm on the GPU (rsqrtf, its reduction tree, the add in one FMA): within float
    rounding of the host order, and not bit-identical to it (else the order would not be the switch's)."""
    _gpu_or_skip()
    x = (rng.standard_normal((n, d)) * rng.uniform(0.01, 100)).astype(np.float32)
    w, add = rng.standard_normal(d).astype(np.float32), rng.standard_normal((n, d)).astype(np.float32)
    host, llama = PoisonedOps("cuda"), PoisonedOps("cuda", op_order="llamacpp_cuda")
    a = llama.rms_norm_add(llama.asarray(x), llama.asarray(w), 1e-6, llama.asarray(add)).numpy()
    b = host.rms_norm_add(host.asarray(x), host.asarray(w), 1e-6, host.asarray(add)).numpy()
    assert nmse(a, rms_norm_ref(x, w, 1e-6) + add) <= 1e-12 and nmse(b, rms_norm_ref(x, w, 1e-6) + add) <= 1e-12
    assert not np.array_equal(a, b)
    c = llama.rms_norm(llama.asarray(x), None, 1e-6).numpy()
    assert nmse(c, rms_norm_ref(x, None, 1e-6)) <= 1e-12


@pytest.mark.parametrize("neox", [False, True])
def test_llamacpp_cuda_order_rope_and_glu(native_lib, rng, neox):
    """llama.cpp CUDA's RoPE (powf per pair, fast-math sin/cos) and GELU/SiLU: close to float64, as its kernels are;
    at positions up to 8192 the fast sin/cos of large angles is what separates it from the host order."""
    _gpu_or_skip()
    llama = PoisonedOps("cuda", op_order="llamacpp_cuda")
    x = rng.standard_normal((131, 4, 128)).astype(np.float32)
    positions = rng.integers(0, 8192, 131).astype(np.int32)
    out = llama.rope(llama.asarray(x), positions, 10000.0, neox).numpy()
    assert nmse(out, rope_f64(x.astype(np.float64), positions, 10000.0, neox)) <= 1e-5
    gate, up = (rng.standard_normal((2, 4099)) * 4).astype(np.float32)
    assert nmse(llama.glu(llama.asarray(gate), llama.asarray(up), "gelu").numpy(), gelu_float_ref(gate) * up) <= 1e-10
    silu = llama.glu(llama.asarray(gate), llama.asarray(up), "silu").numpy()
    assert nmse(silu, gate.astype(np.float64) / (1 + np.exp(-gate.astype(np.float64))) * up) <= 1e-10


def test_llamacpp_cuda_order_is_gpu_only(native_lib):
    with pytest.raises(InvalidArgumentError, match="GPU"):
        NativeOps("cpu", op_order="llamacpp_cuda")
    with pytest.raises(InvalidArgumentError, match="op order"):
        NativeOps("cpu", op_order="fast")
    n = native.load()
    x = np.ones(4, np.float32)
    buf = n.ffi.from_buffer("float[]", x)
    assert n.lib.ciq_rms_norm(-1, n.lib.CIQ_ORDER_LLAMACPP_CUDA, buf, n.ffi.NULL, n.ffi.NULL, 1e-6, 1, 4, buf) \
        == n.lib.CIQ_ERR_UNSUPPORTED


def test_attention_masks_are_checked(native_lib, rng):
    """The attention test can fail: dropping the window, or the causal mask, moves the output far past the bar."""
    q, k, v = _attention_inputs(rng, 17, 2, 2, 64, 20)
    out = NativeOps("cpu").attention(q, k, v, 20, 0.125, 7).numpy()
    assert nmse(out, attention_ref(q, k, v, 20, 0.125, 0)) > 1e-3
    assert nmse(out, attention_ref(q, k, v, 19, 0.125, 7)) > 1e-3


def test_attention_bad_input(native_lib, rng):
    ops = NativeOps("cpu")
    q, k, v = _attention_inputs(rng, 17, 2, 2, 64, 0)
    with pytest.raises(ShapeError):
        ops.attention(q, k, v, 10, 0.125, 0)  # n_past + tokens > cache rows
    with pytest.raises(ShapeError):
        ops.attention(q[:, :3], k, v, 0, 0.125, 0)  # 3 heads over 2 kv heads
    with pytest.raises(BackendError):
        NativeOps("cpu", attention_kernel="mma").attention(q, k, v, 0, 0.125, 0)
    n = native.load()
    out = n.ffi.new("float[]", 17 * 4 * 64)
    status = n.lib.ciq_attention(n.lib.CIQ_DEVICE_CPU, n.lib.CIQ_ATTENTION_AUTO, n.ffi.from_buffer("float[]", q), n.ffi.from_buffer("uint16_t[]", k.view(np.uint16)),
                                 n.ffi.from_buffer("uint16_t[]", v.view(np.uint16)), 17, 4, 2, 64, 16, 0, 0.125, 0, out)
    assert status == n.lib.CIQ_ERR_INVALID_ARGUMENT and b"cache rows" in n.ffi.string(n.lib.ciq_last_error())


# ---- GEMMs, arrays, memory, timing -------------------------------------------------------------------------------

Q32_ALL_TYPES = Q.Q32_TYPES + Q.Q32_1_TYPES


@pytest.mark.parametrize("ggml_type", Q32_ALL_TYPES, ids=[Q.type_name(t) for t in Q32_ALL_TYPES])
@pytest.mark.parametrize("rows, k, tokens", [(1013, 640, 1), (77, 384, 17), (64, 128, 131), (75, 576, 37),
                                             (33, 1536, 9)])
def test_gemm_q32(ops, rng, ggml_type, rows, k, tokens):
    """The q32 variant (llama.cpp CUDA MMQ's semantics for 32-value blocks) against the float64 reference on the
    device's own q8_1 activations. Tails: rows not a multiple of the 64-row tile, tokens not of 32, K not of 256 and
    not of 128 (576: the activations' last block zero-padded); the output is NaN-poisoned first (native.gemm_q32)."""
    raw = random_table(rng, ggml_type, rows, k)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    x[:, 5] *= 50.0  # an outlier channel
    xq = native.quantize_activations(x, "mmq", ggml_type, ops.device)  # DS4 or D4, as the registry lays them out
    if ops.device < 0:  # the host's bytes are the reference's (the GPU's: tests/test_cuda.py, to llama.cpp's fast math)
        assert np.array_equal(xq, Q.quantize_q8_1_mmq(x, ggml_type).reshape(-1))
    native.dispatch_reset()
    out = native.gemm_q32(raw, x, ggml_type, rows, k, ops.device)
    counts = native.dispatch_counts()
    assert counts[("q32", Q.type_name(ggml_type))] == 1 and sum(counts.values()) == 1, counts
    err = nmse(out, Q.gemm_q32_mmq_quantized(ggml_type, raw, rows, k, xq, tokens))
    float_err = nmse(out, x.astype(np.float64) @ Q.dequantize(ggml_type, raw, rows, k).T.astype(np.float64))
    print(f"{Q.type_name(ggml_type)} {rows}x{k}x{tokens}: NMSE {err:.2e} (float activations: {float_err:.2e})")
    assert err <= 1e-10 and float_err > 1e3 * max(err, 1e-18)  # the activations' quantization is what is tested


def test_gemm_q32_bad_input(native_lib, rng):
    raw = random_table(rng, Q.Q8_0, 4, 96)
    with pytest.raises(ShapeError, match="K % 32 == 0, got K=80"):
        native.gemm_q32(raw[:4 * 2 * 34], np.zeros((2, 80), np.float32), Q.Q8_0, 4, 80)
    with pytest.raises(UnsupportedTypeError, match="is not Q4_0"):
        native.gemm_q32(random_table(rng, Q.Q4_K, 4, 256), np.zeros((2, 256), np.float32), Q.Q4_K, 4, 256)
    with pytest.raises(InvalidArgumentError, match="unknown semantics"):
        native.gemm_q32(raw, np.zeros((2, 96), np.float32), Q.Q8_0, 4, 96, semantics="f16")


def test_linear_keep_quant(ops, rng):
    rows, k = 48, 512
    w = Q.quantize_q4_K(rng.standard_normal((rows, k)).astype(np.float32))
    tensor = Tensor("blk.0.attn_q.weight", Q.Q4_K, (rows, k), w)
    x = rng.standard_normal((17, k)).astype(np.float32)
    out = ops.linear(ops.load_weight(tensor), ops.asarray(x)).numpy()
    ref = native.gemm(tensor, x, variant="auto", device=ops.device, semantics=ops.semantics)
    assert np.array_equal(out, ref)


def test_linear_group(ops, rng):
    """One input, several keep-quant weights (q, k, v of mixed types and row counts): the activations are quantized
    once per layout, the outputs equal separate linear calls bit for bit, one launch per weight."""
    k, tokens = 512, 37
    shapes = [(Q.Q4_K, 96), (Q.Q4_K, 40), (Q.Q6_K, 40)]
    tensors = [Tensor(f"blk.0.w{i}.weight", t, (rows, k),
                      (Q.quantize_q4_K if t == Q.Q4_K else Q.quantize_q6_K)(rng.standard_normal((rows, k)).astype(np.float32)))
               for i, (t, rows) in enumerate(shapes)]
    weights = [ops.load_weight(t) for t in tensors]
    x = ops.asarray(rng.standard_normal((tokens, k)).astype(np.float32))
    native.dispatch_reset()
    grouped = [y.numpy() for y in ops.linear_group(weights, x)]
    launches = sum(native.dispatch_counts().values())
    separate = [ops.linear(w, x).numpy() for w in weights]
    assert launches == 3 and all(np.array_equal(a, b) for a, b in zip(grouped, separate))
    assert all(np.isfinite(a).all() and a.shape == (tokens, t.rows) for a, t in zip(grouped, tensors))


@pytest.mark.parametrize("ggml_type", [Q.F16, Q.Q8_0, Q.Q5_0, Q.BF16], ids=["F16", "Q8_0", "Q5_0", "BF16"])
def test_linear_dense(ops, rng, ggml_type):
    rows, k = 40, 768
    raw = random_table(rng, ggml_type, rows, k)
    tensor = Tensor("blk.0.attn_v.weight", ggml_type, (rows, k), raw)
    x = rng.standard_normal((131, k)).astype(np.float32)
    out = ops.linear(ops.load_weight(tensor), ops.asarray(x)).numpy()
    w = Q.dequantize(ggml_type, raw, rows, k)
    if ops.device < 0:
        assert np.array_equal(out, x @ w.T)  # float32 numpy matmul on the dequantized weight
    elif ggml_type in Q.Q32_TYPES:  # on a GPU: what AUTO runs in these ops' semantics ("any": wgmma's f16 semantics
        # on Hopper, K a multiple of 64; elsewhere the q32 variant, llama.cpp CUDA MMQ's), the same bits
        native.dispatch_reset()
        want = native.gemm(raw, x, variant="auto", device=ops.device, semantics=ops.semantics, ggml_type=ggml_type,
                           rows=rows, k=k)
        ran = {variant for (variant, _), count in native.dispatch_counts().items() if count}
        assert np.array_equal(out, want)
        assert ran == ({"wgmma"} if native.variant_available(ops.device, "wgmma") else {"q32"}), ran
    else:
        as_bf16 = lambda a: (bf16_bits(a).astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
        # bf16 x and W (exact products), float32 accumulation in cuBLAS.
        assert nmse(out, as_bf16(x) @ as_bf16(w).T) <= 1e-10


def test_device_array_views(native_lib, rng):
    ops = NativeOps("cpu")
    x = rng.standard_normal((10, 3, 4)).astype(np.float32)
    a = ops.asarray(x)
    assert isinstance(a, DeviceArray) and a.shape == (10, 3, 4) and a.dtype == np.float32 and a.nbytes == x.nbytes
    assert np.array_equal(a.rows(2, 7).numpy(), x[2:7])
    assert np.array_equal(a.view((10, 12)).rows(9, 10).numpy(), x[9:].reshape(1, 12))
    assert np.array_equal(a.view((-1, 4)).numpy(), x.reshape(-1, 4))
    with pytest.raises(ShapeError):
        a.rows(5, 11)
    with pytest.raises(ShapeError):
        a.view((7, 7))
    z = ops.zeros((3, 5), np.int32)
    assert z.dtype == np.int32 and not z.numpy().any()


def test_memory_bytes_and_timer(ops):
    assert ops.memory_bytes() == 0
    a = ops.zeros((1000,))
    b = ops.zeros((10, 10), np.float16)
    view = a.rows(0, 10)
    assert ops.memory_bytes() == 4000 + 200
    del a, b
    ops.trim()
    assert ops.memory_bytes() == 4000  # the view keeps its buffer alive
    del view
    again = ops.empty((1000,))  # reuses the cached buffer
    assert ops.memory_bytes() == 4000
    del again
    ops.trim()
    assert ops.memory_bytes() == 0
    with ops.timer("rest"):
        ops.add(np.ones(1 << 20, np.float32), np.ones(1 << 20, np.float32))
    with ops.timer("rest"):
        pass
    assert not ops.timings  # marked, not read: timing does not wait for the device
    ops.settle_timings()
    assert ops.timings["rest"] > 0 and set(ops.timings) == {"rest"}
    ops.settle_timings()  # nothing pending: unchanged
    assert set(ops.timings) == {"rest"}


def test_bad_arguments(native_lib):
    ops = NativeOps("cpu")
    with pytest.raises(InvalidArgumentError):
        ops.glu(np.ones(4, np.float32), np.ones(4, np.float32), "relu")
    with pytest.raises(ShapeError):
        ops.add(np.ones(4, np.float32), np.ones(5, np.float32))
    with pytest.raises(InvalidArgumentError):
        NativeOps("cpu", attention_kernel="flash")
    before = ops.memory_bytes()
    with pytest.raises(OutOfMemoryError, match="out of memory"):  # 256 TiB
        ops.zeros((1 << 46,))
    assert ops.memory_bytes() == before  # nothing left allocated


@pytest.mark.parametrize("neox", [True, False])
def test_rms_norm_rope_host_order_is_the_two_ops(ops, rng, neox):
    """The fused op in the host order is rms_norm then rope, bit for bit (tails: 7 tokens, 3 heads, odd pairs); the
    llama.cpp CUDA order's kernel is checked against ggml-cuda's own fused kernel below."""
    x = (rng.standard_normal((7, 3, 66)) * 4).astype(np.float32)
    w = (rng.standard_normal(66) + 1).astype(np.float32)
    positions = np.arange(300, 307, dtype=np.int32)
    fused = ops.rms_norm_rope(x, w, 1e-6, positions, 1e4, neox=neox).numpy()
    normed = ops.rms_norm(x.reshape(21, 66), w, 1e-6).numpy().reshape(7, 3, 66)
    apart = ops.rope(normed, positions, 1e4, neox=neox).numpy()
    assert np.isfinite(fused).all()
    assert np.array_equal(fused.view(np.uint32), apart.view(np.uint32))


def test_rms_norm_rope_rejects_bad_shapes(native_lib):
    ops = NativeOps("cpu")
    x, w, pos = np.ones((4, 2, 8), np.float32), np.ones(8, np.float32), np.arange(4, dtype=np.int32)
    with pytest.raises(ShapeError, match="tokens, heads, head_dim"):
        ops.rms_norm_rope(x.reshape(8, 8), w, 1e-6, pos, 1e4)
    with pytest.raises(ShapeError, match="weight of 7 values"):
        ops.rms_norm_rope(x, w[:7], 1e-6, pos, 1e4)
    with pytest.raises(ShapeError, match="positions"):
        ops.rms_norm_rope(x, w, 1e-6, pos[:3], 1e4)
    with pytest.raises(InvalidArgumentError, match="head_dim must be even"):
        ops.rms_norm_rope(np.ones((4, 2, 7), np.float32), np.ones(7, np.float32), 1e-6, pos, 1e4)
    with pytest.raises(InvalidArgumentError, match="base must be > 0"):
        ops.rms_norm_rope(x, w, 1e-6, pos, -1.0)


# ---- against llama.cpp's own ops (ggml graphs through the bridge: ggml_ciq.llamacpp.OpGraph) -----------------------

OPS_VS_LLAMACPP = [  # (kind, shape): Gemma 3 270M's widths (640, head 256, 4/1 heads), tails, llama.cpp's 1024-thread norm
    ("rms_norm", (37, 640)), ("rms_norm_mul", (37, 640)), ("rms_norm_mul", (5, 1030)), ("rms_norm_mul_add", (37, 640)),
    ("rms_norm_mul", (37 * 4, 256)), ("rope_neox", (37, 4, 256)), ("rope_neox", (37, 1, 256)), ("rope_norm", (19, 3, 64)),
    ("rms_norm_mul_rope_neox", (37, 4, 256)), ("rms_norm_mul_rope_neox", (37, 1, 256)),
    ("rms_norm_mul_rope_norm", (19, 3, 64)), ("rms_norm_mul_rope_neox", (5, 2, 1030)),
    ("geglu", (37, 2048)), ("swiglu", (9, 700)), ("swiglu", (3, 4864)), ("scale", (37, 1024)),
]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("kind, shape", OPS_VS_LLAMACPP)
def test_ops_equal_llamacpp_bit_for_bit(llama, native_lib, rng, device, kind, shape, llamacpp_avx2):
    """Our ops in llama.cpp's order on a device (llamacpp_cpu on the CPU: the host order, SiLU in AVX2's lanes;
    llamacpp_cuda on the GPU) against llama.cpp's own ops on the same device, as its graphs chain them (RMS_NORM +
    MUL + ADD, which ggml-cuda fuses; ROPE at positions past 0 with Gemma's bases; the split GLUs, SwiGLU rows with
    and without a tail of 8; SCALE): the same values. The CPU half runs in CI."""
    from ggml_ciq.llamacpp import OpGraph

    if device == "cuda":
        _gpu_or_skip()
        if "CUDA0" not in llama.devices():
            pytest.skip("needs llama.cpp built with CUDA (GGML_CIQ_LLAMACPP_LIB)")
    elif kind == "swiglu" and not llamacpp_avx2:
        pytest.skip("SwiGLU follows llama.cpp's AVX2 build (8-lane ggml_v_expf); this llama.cpp is built for another "
                    "ISA (AVX-512: 16 lanes)")
    ops = PoisonedOps(device, op_order="llamacpp_cuda" if device == "cuda" else "llamacpp_cpu")
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    eps, base, s = 1e-6, 1e6 if shape[-1] == 256 else 1e4, 0.0625
    inputs, extra = {"x": x}, {}
    if kind.startswith("rms_norm") and kind != "rms_norm":
        inputs["weight"] = (rng.standard_normal(shape[-1]) + 1).astype(np.float32)
    if kind == "rms_norm_mul_add":
        inputs["add"] = (rng.standard_normal(shape) * 100).astype(np.float32)
    if "rope" in kind:
        inputs["positions"] = np.arange(500, 500 + shape[0], dtype=np.int32)
    if kind in ("geglu", "swiglu"):
        inputs["up"] = rng.standard_normal(shape).astype(np.float32)
    with OpGraph(llama, "CPU" if device == "cpu" else "CUDA0", kind, shape, eps=eps, base=base, s=s) as graph:
        theirs = graph.run(**inputs)
    if kind == "rms_norm":
        ours = ops.rms_norm(x, None, eps)
    elif kind == "rms_norm_mul":
        ours = ops.rms_norm(x, inputs["weight"], eps)
    elif kind == "rms_norm_mul_add":
        ours = ops.rms_norm_add(x, inputs["weight"], eps, inputs["add"])
    elif kind.startswith("rope"):
        ours = ops.rope(x, inputs["positions"], base, neox=kind == "rope_neox")
    elif "rope" in kind:  # RMS_NORM + MUL + ROPE: one kernel in ggml-cuda, the three ops in ggml CPU
        ours = ops.rms_norm_rope(x, inputs["weight"], eps, inputs["positions"], base, neox=kind.endswith("neox"))
    elif kind in ("geglu", "swiglu"):
        ours = ops.glu(x, inputs["up"], "gelu" if kind == "geglu" else "silu")
    else:
        ours = ops.scale(x, s)
    ours = ours.numpy().reshape(shape)
    differ = int(np.count_nonzero(ours != theirs))  # values: +0 and -0 are one value (ggml CPU's GELU below -10: -0)
    assert differ == 0, f"{differ} of {ours.size} values differ, NMSE {nmse(ours, theirs):.3g}"
