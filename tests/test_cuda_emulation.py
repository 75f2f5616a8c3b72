"""The CUDA sources of the transformer ops (native/src/cuda/ops.cu, ops_llamacpp.cu, attention.cu,
attention_llamacpp.cu) and of the MMQ-order GEMMs (gemm_q32.cu, gemm_mma.cu) compiled for the CPU through
tests/cuda_on_cpu/ (one thread per CUDA thread, __syncthreads and warp collectives as barriers, PTX mma.sync and
ldmatrix emulated at matrix level from the PTX ISA's fragment layouts) and run against the references of
tests/test_ops.py. It checks the kernels' index math, masks, online softmax and fragment use where no GPU is; it
does not check timing, memory ordering or the real f16 instructions' rounding (the emulated f16 mma sums in double).
The integer mma is exact, so the GEMMs' float order (MMQ's, with its stream-k seams) is checked bit for bit.

Kernel launches and the PTX statements are rewritten textually; a rewrite that no longer matches the source fails
the build test. Needs g++ with C++20 <barrier> and _Float16 (GCC 12); skipped without a compiler.
"""

import re
import shutil
import subprocess
from pathlib import Path

import cffi
import numpy as np
import pytest

from ggml_ciq import quants as Q
from ggml_ciq.reference_ops import rope_f64
from test_ops import (ATTENTION_CASES, MASKED_ATTENTION_CASES, TABLE_TYPES, _attention_inputs, attention_ref, bf16_bits,
                      gelu_float_ref, masked_attention_inputs, masked_attention_ref, nmse, random_table, rms_norm_ref,
                      rope_ref)

ROOT = Path(__file__).resolve().parents[1]
EMULATION = Path(__file__).resolve().parent / "cuda_on_cpu"
LAUNCH = re.compile(r"(\w+(?:<[\w, ]+>)?)<<<(.*?)>>>\((.*?)\);", re.S)
ASM = re.compile(r'asm(?: volatile)?\(((?:"[^"]*"\s*)+):(.*?)\);', re.S)
EXTERN_SHARED = re.compile(r"extern __shared__ (?:__align__\(\d+\) )?(\w+) (\w+)\[\];")
CDEF = """
const char *emu_last_error(void);
int emu_attention_supports(int kernel, int64_t head_dim);
int emu_attention(int kernel, const float *q, const uint16_t *k, const uint16_t *v, int64_t tokens, int64_t heads,
                  int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale, int64_t window, float *out);
int emu_attention_masked(int kernel, const float *q, const uint16_t *k, const uint16_t *v, const uint16_t *mask,
                         int64_t mask_row, int64_t tokens, int64_t heads, int64_t heads_kv, int64_t head_dim,
                         int64_t n_kv, float scale, float *out);
int emu_rows_set_f16(const float *x, int64_t n, int64_t k, const int64_t *ids, uint16_t *table, int64_t table_rows,
                     int64_t row_stride);
int emu_rms_norm(int order, const float *x, const float *weight, const float *add, float eps, int64_t n, int64_t d,
                 float *out);
int emu_rms_norm_f16(const float *x, const float *weight, float eps, int64_t tokens, int64_t k, void *out);
int emu_rope(int order, int mode, const float *x, const int32_t *positions, int64_t tokens, int64_t heads,
             int64_t head_dim, float base, float *out);
int emu_rms_norm_rope(int order, int mode, const float *x, const float *weight, float eps, const int32_t *positions,
                      int64_t tokens, int64_t heads, int64_t head_dim, float base, float *out);
int emu_rope_kv_store(int mode, const float *q, const float *k, const float *v, const int32_t *positions,
                      int64_t tokens, int64_t heads, int64_t heads_kv, int64_t head_dim, float base, int64_t start,
                      float *q_out, uint16_t *k_cache, uint16_t *v_cache);
int emu_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values);
int emu_rope_rows_set_kernel(int64_t n, int64_t head_dim, const float *q, const float *q_out, const float *k,
                             const float *v, int64_t v_k, const uint16_t *k_table, int64_t k_row_stride,
                             const uint16_t *v_table, int64_t v_row_stride);
int emu_rope_rows_set_f16(int mode, const int32_t *positions, int64_t tokens, int64_t head_dim, float base,
                          const float *q, int64_t heads, float *q_out, const float *k, int64_t heads_kv,
                          const float *v, int64_t v_k, const int64_t *k_ids, uint16_t *k_table, int64_t k_table_rows,
                          int64_t k_row_stride, const int64_t *v_ids, uint16_t *v_table, int64_t v_table_rows,
                          int64_t v_row_stride);
int emu_glu(int order, int kind, const float *gate, const float *up, int64_t n, float *out);
int emu_add(const float *a, int64_t n, const float *b, int64_t b_n, float *out);
int emu_scale(const float *x, float s, int64_t n, float *out);
int emu_get_rows(int type, const void *table, int64_t table_rows, int64_t k, const int32_t *ids, int64_t n, float *out);
int emu_dequantize_bf16(int type, const void *data, int64_t rows, int64_t k, void *out);
int emu_convert_bf16(const float *x, int64_t n, void *out);
int emu_gemm_q32(int type, const void *weight, int64_t rows, int64_t k, const void *xq, int64_t tokens, float *out);
int emu_gemm_mma(int type, const void *weight, int64_t rows, int64_t k, const void *xq, int64_t tokens, float *out);
"""
SIMT, MMA, MMA_LLAMACPP = 2, 3, 5  # ciq_attention_kernel
HOST, LLAMACPP_CUDA = 0, 1  # ciq_op_order


# PTX statement -> (its emulation in cuda_on_cpu/cuda_runtime.h, accumulator operands c[0..] passed as the array c,
# operand count): every other operand is passed as written.
PTX_EMULATION = {
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32": ("mma_16816", 4, 10),
    "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16": ("mma_16816_f16", 2, 8),
    "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32": ("mma_16832_s8", 4, 11),
    "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32": ("mma_16816_s8", 4, 8),
    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16": ("ldmatrix_x4_trans", 0, 5),
    "ldmatrix.sync.aligned.m8n8.x4.shared.b16": ("ldmatrix_x4", 0, 5),
    "ldmatrix.sync.aligned.m8n8.x2.shared.b16": ("ldmatrix_x2", 0, 3),
}


def rewrite(text: str) -> tuple[str, dict]:
    """CUDA source -> C++ for the emulation; counts of what was rewritten."""
    counts = {"launch": 0, "mma": 0, "ldmatrix": 0, "extern_shared": 0}

    def asm(match):
        code = "".join(re.findall(r'"([^"]*)"', match.group(1)))
        operands = re.findall(r'"[=+]?[rf]"\(([\w\[\]]+)\)', match.group(2))
        for prefix, (function, accumulators, count) in PTX_EMULATION.items():
            if code.startswith(prefix):
                assert len(operands) == count and operands[:accumulators] == [f"c[{i}]" for i in range(accumulators)], \
                    (prefix, operands)
                counts["mma" if prefix.startswith("mma") else "ldmatrix"] += 1
                args = ["c"] * bool(accumulators) + operands[accumulators:]
                return f"ciq_emu::{function}({', '.join(args)});"
        if not match.group(0).startswith("asm volatile"):
            return match.group(0)  # a plain asm the source guards for the CPU (gemm_mmvq.cu's rcp.approx)
        raise AssertionError(f"no emulation for PTX {code!r}")

    def launch(match):
        counts["launch"] += 1
        return f"ciq_emu::launch({match.group(1)}, ciq_emu::Config{{{match.group(2)}}}, {match.group(3)});"

    def extern_shared(match):
        counts["extern_shared"] += 1
        return f"{match.group(1)} *{match.group(2)} = ({match.group(1)} *)ciq_emu::dynamic_smem();"

    text = ASM.sub(asm, text)
    text = LAUNCH.sub(launch, text)
    text = EXTERN_SHARED.sub(extern_shared, text)
    return text, counts


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ for the CUDA-on-CPU emulation")
    build = tmp_path_factory.mktemp("cuda_on_cpu")
    shutil.copytree(ROOT / "native" / "src", build / "src")
    expected = {"ops.cu": {"launch": 18, "mma": 0, "ldmatrix": 0, "extern_shared": 0},
                "ops_llamacpp.cu": {"launch": 10, "mma": 0, "ldmatrix": 0, "extern_shared": 0},
                "attention.cu": {"launch": 3, "mma": 0, "ldmatrix": 0, "extern_shared": 2},
                "attention_split.cuh": {"launch": 1, "mma": 0, "ldmatrix": 0, "extern_shared": 0},
                "attention_llamacpp.cu": {"launch": 1, "mma": 0, "ldmatrix": 0, "extern_shared": 1},
                "mma_sync.cuh": {"launch": 0, "mma": 2, "ldmatrix": 1, "extern_shared": 0},
                "gemm_q32.cu": {"launch": 1, "mma": 0, "ldmatrix": 0, "extern_shared": 0},
                "gemm_mma.cu": {"launch": 2, "mma": 2, "ldmatrix": 2, "extern_shared": 1}}
    for name, want in expected.items():
        path = build / "src" / "cuda" / name
        text, counts = rewrite(path.read_text())
        assert counts == want, f"{name}: rewrote {counts}, expected {want} (source changed: update the test)"
        assert "<<<" not in text and "asm" not in text, f"{name}: a launch or PTX statement was not rewritten"
        if name == "gemm_mma.cu":  # its mma helpers are compiled for sm_80+ only
            text = "#define __CUDA_ARCH__ 900\n" + text
        path.with_suffix(".cpp" if path.suffix == ".cu" else path.suffix).write_text(text)
    library = build / "libciq_emu.so"
    command = [compiler, "-std=c++20", "-O2", "-pthread", "-shared", "-fPIC", "-ffp-contract=off",
               "-DGGML_CIQ_WITH_CUDA", f"-I{EMULATION}", f"-I{ROOT / 'native' / 'include'}", f"-I{build / 'src'}",
               str(build / "src" / "cuda" / "ops.cpp"), str(build / "src" / "cuda" / "ops_llamacpp.cpp"),
               str(build / "src" / "cuda" / "attention.cpp"), str(build / "src" / "cuda" / "attention_llamacpp.cpp"),
               str(build / "src" / "cuda" / "gemm_q32.cpp"), str(build / "src" / "cuda" / "gemm_mma.cpp"),
               str(build / "src" / "status.cpp"), str(build / "src" / "switches.cpp"),
               str(EMULATION / "driver.cpp"), "-o", str(library)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode and ("<barrier>" in result.stderr or "_Float16" in result.stderr):
        pytest.skip(f"{compiler} lacks C++20 <barrier> or _Float16")
    assert result.returncode == 0, result.stderr[-4000:]
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(library))


def call(emu, name, *args, last_error="emu_last_error"):
    """An emulated entry point with numpy arrays as pointers; a non-zero status fails with the driver's message."""
    ffi, lib = emu
    converted = [ffi.cast("void *", ffi.from_buffer(a)) if isinstance(a, np.ndarray) else ffi.NULL if a is None else a
                 for a in args]
    status = getattr(lib, name)(*converted)
    assert status == 0, ffi.string(getattr(lib, last_error)()).decode()


def poisoned(shape, dtype=np.float32):
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = 0xFF
    return out


# test_ops' cases with at most 2 kv heads (group sizes kept): a thread per CUDA thread makes heads expensive here.
EMULATED_CASES = sorted({(t, min(hkv, 2), g, d, n_past, w) for t, hkv, g, d, n_past, w in ATTENTION_CASES})


@pytest.mark.parametrize("kernel", ["simt", "mma", "mma_llamacpp"])
@pytest.mark.parametrize("tokens, heads_kv, group, head_dim, n_past, window", EMULATED_CASES)
def test_attention_emulated(emu, rng, kernel, tokens, heads_kv, group, head_dim, n_past, window):
    q, k, v = _attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past)
    heads, scale = heads_kv * group, 1.0 / np.sqrt(head_dim)
    out = poisoned((tokens, heads * head_dim))
    call(emu, "emu_attention", {"simt": SIMT, "mma": MMA, "mma_llamacpp": MMA_LLAMACPP}[kernel], q, k.view(np.uint16),
         v.view(np.uint16), tokens, heads, heads_kv, head_dim, n_past, scale, window, out)
    if kernel == "mma_llamacpp":
        # llama.cpp's flash attention: f16 q times the f16 scale, p <= 1/8 rounded to f16, P V accumulated in f16
        # (emulated: each mma's result rounded to f16). Against float64 on those q: measured 2.0e-8 to 7.7e-7 (the
        # mma kernel's f32 accumulation: up to 1.6e-8), so the bar sits between f16 accumulation and a wrong index.
        q16 = (q.astype(np.float16) * np.float16(scale)).astype(np.float16)
        assert nmse(out, attention_ref(q16.astype(np.float32), k, v, n_past, 1.0, window)) <= 1e-5
    elif kernel == "mma":
        # q and p rounded to f16 (the reference rounds q only); measured here 1.2e-9 to 1.6e-8 (3e-8 to 2e-7
        # against the unrounded reference). The simt kernel: up to 5.5e-13.
        assert nmse(out, attention_ref(q, k, v, n_past, scale, window, round_q=True)) <= 1e-6
    else:
        assert nmse(out, attention_ref(q, k, v, n_past, scale, window)) <= 1e-10


# (tokens, heads_kv, group, head_dim, n_past, window): one query over 301 keys in 16 heads (16 CTAs on the emulated
# H200's 132 SMs: 5 chunks of 64 keys, flash-decoding's case), and a windowed prefill whose tile 0 is cut into 2
# chunks with rows that see no key of the second (m = -inf there, weight 0 in the combine).
SPLIT_CASES = [(1, 8, 2, 128, 300, 0), (131, 1, 4, 64, 100, 7), (100, 1, 4, 256, 200, 0)]


@pytest.mark.parametrize("kernel", ["simt", "mma"])
def test_attention_emulated_split(emu, rng, monkeypatch, kernel):
    """attention.cu's split over the keys: other float32 folds than one CTA per query tile (not the same bits, so the
    split ran), each within the kernel's bar of float64 (a chunk combined with a wrong max, twice, or not at all fails
    it); GGML_CIQ_ATTENTION_SPLIT=0 turns it off."""
    for tokens, heads_kv, group, head_dim, n_past, window in SPLIT_CASES:
        q, k, v = _attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past)
        heads, scale = heads_kv * group, 1.0 / np.sqrt(head_dim)
        reference = attention_ref(q, k, v, n_past, scale, window, round_q=kernel == "mma")
        outs = []
        for split in ("1", "0"):
            monkeypatch.setenv("GGML_CIQ_ATTENTION_SPLIT", split)
            out = poisoned((tokens, heads * head_dim))
            call(emu, "emu_attention", {"simt": SIMT, "mma": MMA}[kernel], q, k.view(np.uint16), v.view(np.uint16),
                 tokens, heads, heads_kv, head_dim, n_past, scale, window, out)
            assert nmse(out, reference) <= (1e-6 if kernel == "mma" else 1e-10)
            outs.append(out)
        assert not np.array_equal(*outs), (tokens, heads_kv, group, head_dim, n_past, window)


# MASKED_ATTENTION_CASES with at most 2 kv heads and a group of at most 2 (a thread per CUDA thread).
EMULATED_MASKED_CASES = sorted({(t, min(hkv, 2), min(g, 2), d, n_past, w, kind)
                                for t, hkv, g, d, n_past, w, kind in MASKED_ATTENTION_CASES})


@pytest.mark.parametrize("kernel", ["simt", "mma"])
@pytest.mark.parametrize("tokens, heads_kv, group, head_dim, n_past, window, kind", EMULATED_MASKED_CASES)
def test_attention_masked_emulated(emu, rng, monkeypatch, kernel, tokens, heads_kv, group, head_dim, n_past, window,
                                   kind):
    """attention.cu's masked path (the mask's tile marks, the walk from the first marked key tile to the last, the
    mask added to the scores), split over the keys and not: within the kernel's bar of float64 with the same mask,
    NaN cache rows past n_kv never read, a row that sees no key zeros."""
    q, k, v, mask, n_kv = masked_attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past, window, kind)
    heads, scale = heads_kv * group, 1.0 / np.sqrt(head_dim)
    reference = masked_attention_ref(q, k, v, mask, n_kv, scale, round_q=kernel == "mma")
    for split in ("1", "0"):
        monkeypatch.setenv("GGML_CIQ_ATTENTION_SPLIT", split)
        out = poisoned((tokens, heads * head_dim))
        call(emu, "emu_attention_masked", {"simt": SIMT, "mma": MMA}[kernel], q, k.view(np.uint16), v.view(np.uint16),
             mask.view(np.uint16), mask.shape[1], tokens, heads, heads_kv, head_dim, n_kv, scale, out)
        assert np.isfinite(out).all()
        if kind == "empty_row":
            assert not out[3].any()
        assert nmse(out, reference) <= (1e-6 if kernel == "mma" else 1e-10), split


def test_rows_set_f16_emulated(emu, rng):
    """SET_ROWS' kernel: the chosen rows rounded to f16, the others and the stride's gap untouched, ids outside the
    table skipped."""
    table = rng.standard_normal((40, 72)).astype(np.float16)
    ids = np.concatenate([rng.permutation(40)[:13], [-1, 40]]).astype(np.int64)
    x = (rng.standard_normal((15, 64)) * 1000).astype(np.float32)
    expected = table.copy()
    expected[ids[:13], :64] = x[:13].astype(np.float16)
    call(emu, "emu_rows_set_f16", x, 15, 64, ids, table.view(np.uint16), 40, 72)
    assert np.array_equal(table.view(np.uint16), expected.view(np.uint16))


def test_attention_emulated_llamacpp_is_not_mma(emu, rng):
    """mma_llamacpp is its own arithmetic: on the same inputs it differs from mma by more than float noise (measured
    9.8e-8 to 7.8e-7 on these cases; mma itself is ~1e-8 from float64), so a kernel ignoring the flag fails."""
    for tokens, heads_kv, group, head_dim, n_past, window in EMULATED_CASES[:6]:
        q, k, v = _attention_inputs(rng, tokens, heads_kv, group, head_dim, n_past)
        outs = []
        for kernel in (MMA, MMA_LLAMACPP):
            out = poisoned((tokens, heads_kv * group * head_dim))
            call(emu, "emu_attention", kernel, q, k.view(np.uint16), v.view(np.uint16), tokens, heads_kv * group,
                 heads_kv, head_dim, n_past, 1.0 / np.sqrt(head_dim), window, out)
            outs.append(out)
        assert not np.array_equal(*outs) and nmse(outs[1], outs[0]) > 1e-9


def test_attention_emulated_llamacpp_segments(emu, rng, monkeypatch):
    """llama.cpp's stream-k split (attention_llamacpp.cu): 80 queries x 4 heads over 4096 cached keys are 5 tiles of
    64 chunks; with 2 CTAs per SM of the emulated H200 llama.cpp's grid is 260 CTAs (52 segments a tile), with 1 it is
    130 (26). Other segments are other float32 folds: other bits, each within the kernel's bar of float64 (a segment
    folded with the wrong max or twice fails it)."""
    tokens, heads_kv, group, d, n_past, window = 80, 1, 4, 64, 4000, 0
    q, k, v = _attention_inputs(rng, tokens, heads_kv, group, d, n_past)
    q16 = (q.astype(np.float16) * np.float16(1 / 8)).astype(np.float32)
    reference = attention_ref(q16, k, v, n_past, 1.0, window)
    outs = []
    for per_sm in ("2", "1"):
        monkeypatch.setenv("GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM", per_sm)
        out = poisoned((tokens, heads_kv * group * d))
        call(emu, "emu_attention", MMA_LLAMACPP, q, k.view(np.uint16), v.view(np.uint16), tokens, heads_kv * group,
             heads_kv, d, n_past, 1 / 8, window, out)
        assert nmse(out, reference) <= 1e-5
        outs.append(out)
    assert not np.array_equal(*outs)


def test_attention_emulated_llamacpp_max_offset(emu):
    """The row max raised by 3 ln 2 keeps f16 P V sums in range: 16 equal scores over values of 30000 give ~30000
    (p = 1/8 each: 60000 < 65504 in the f16 accumulator); without the offset p = 1 and the sum overflows to inf."""
    d, n_past = 64, 15
    q = np.zeros((1, 1, d), np.float32)
    k = np.zeros((n_past + 1, 1, d), np.float16)
    v = np.full((n_past + 1, 1, d), 30000, np.float16)
    out = poisoned((1, d))
    call(emu, "emu_attention", MMA_LLAMACPP, q, k.view(np.uint16), v.view(np.uint16), 1, 1, 1, d, n_past, 0.125, 0,
         out)
    # p is __expf(-3 * 0.6931) = 0.12502 in the float row sum but 0.125 in f16 for P V: 29995.75, finite.
    assert np.isfinite(out).all() and np.allclose(out, 30000, rtol=2e-4)


@pytest.mark.parametrize("tokens, k", [(3, 64), (5, 768), (2, 1088), (3, 4096), (2, 8192), (2, 8256)])
@pytest.mark.parametrize("aligned", [True, False])
def test_rms_norm_f16_emulated(emu, rng, tokens, k, aligned):
    """ops.cu's rms_norm fused into the f16 activation layout (ciq_rms_norm_activations on a GPU) against its own
    rms_norm then the layout's conversion in numpy (each token's largest |value| in [2^14, 2^15): f16 of value * 2^-e,
    scale 2^e at the 256-byte boundary): the same bytes, with and without the weight, through the warp (K <= 1024),
    block (<= 8192) and strided (8256, and any K from an unaligned row) kernels; tokens scaled 2^-30 .. 2^30."""
    x = (rng.standard_normal((tokens, k)) * np.exp2(rng.integers(-30, 30, (tokens, 1)))).astype(np.float32)
    if not aligned:  # the rows 4 bytes past a 16-byte boundary
        buf = np.empty(tokens * k + 8, np.float32)
        start = next(i for i in range(8) if (buf.ctypes.data + 4 * i) % 16 == 4)
        buf[start:start + tokens * k] = x.reshape(-1)
        x = buf[start:start + tokens * k].reshape(tokens, k)
        assert x.ctypes.data % 16 == 4
    w = (rng.standard_normal(k) + 1).astype(np.float32)
    offset = (tokens * k * 2 + 255) // 256 * 256
    for weight in (w, None):
        normed = poisoned((tokens, k))
        call(emu, "emu_rms_norm", HOST, x, weight, None, 1e-6, tokens, k, normed)
        e = np.maximum(np.frexp(np.abs(normed).max(axis=1))[1], -100)
        want = (normed * np.exp2(15 - e)[:, None].astype(np.float32)).astype(np.float16)
        out = poisoned(offset + 4 * tokens, np.uint8)
        call(emu, "emu_rms_norm_f16", x, weight, 1e-6, tokens, k, out)
        assert np.array_equal(out[:tokens * k * 2].view(np.float16).reshape(tokens, k).view(np.uint16), want.view(np.uint16))
        assert np.array_equal(out[offset:].view(np.float32), np.exp2(e - 15).astype(np.float32))


@pytest.mark.parametrize("mode", [0, 2], ids=["norm", "neox"])
@pytest.mark.parametrize("tokens, heads, heads_kv, head_dim", [(5, 32, 8, 128), (3, 6, 3, 64), (2, 4, 1, 256)])
def test_rope_kv_store_emulated(emu, rng, mode, tokens, heads, heads_kv, head_dim):
    """ops.cu's fused rope + kv_store (q roped in float32, k roped and v rounded into f16 cache rows from start)
    against its own rope then kv_store: the same bits; head counts that are not multiples of the 4-head groups, rows
    before start left alone, with and without v, q roped in place."""
    q = (rng.standard_normal((tokens, heads, head_dim)) * 4).astype(np.float32)
    k = (rng.standard_normal((tokens, heads_kv, head_dim)) * 4).astype(np.float32)
    v = rng.standard_normal((tokens, heads_kv, head_dim)).astype(np.float32)
    positions = (np.arange(tokens) + 500).astype(np.int32)
    start, rows = 3, 3 + tokens + 2
    q_want, k_roped = poisoned(q.shape), poisoned(k.shape)
    call(emu, "emu_rope", HOST, mode, q, positions, tokens, heads, head_dim, 1e6, q_want)
    call(emu, "emu_rope", HOST, mode, k, positions, tokens, heads_kv, head_dim, 1e6, k_roped)
    k_want, v_want = np.full((rows, heads_kv, head_dim), 0x7E00, np.uint16), np.full((rows, heads_kv, head_dim), 0x7E00, np.uint16)
    call(emu, "emu_kv_store", k_want, start, k_roped, tokens, heads_kv * head_dim)
    call(emu, "emu_kv_store", v_want, start, v, tokens, heads_kv * head_dim)
    for with_v in (True, False):
        q_out = poisoned(q.shape)
        k_cache, v_cache = np.full_like(k_want, 0x7E00), np.full_like(v_want, 0x7E00)
        call(emu, "emu_rope_kv_store", mode, q, k, v if with_v else None, positions, tokens, heads, heads_kv, head_dim,
             1e6, start, q_out, k_cache, v_cache if with_v else None)
        assert np.array_equal(q_out, q_want) and np.array_equal(k_cache, k_want)
        assert np.array_equal(v_cache, v_want if with_v else np.full_like(v_want, 0x7E00))
    in_place = q.copy()
    call(emu, "emu_rope_kv_store", mode, in_place, k, v, positions, tokens, heads, heads_kv, head_dim, 1e6, start,
         in_place, np.full_like(k_want, 0x7E00), np.full_like(v_want, 0x7E00))
    assert np.array_equal(in_place, q_want)


def test_attention_emulated_head_dims(emu):
    ffi, lib = emu
    assert [d for d in (32, 64, 80, 96, 128, 192, 256) if lib.emu_attention_supports(MMA, d)] == [64, 96, 128, 256]


@pytest.mark.parametrize("order", [HOST, LLAMACPP_CUDA], ids=["host", "llamacpp_cuda"])
@pytest.mark.parametrize("n, d", [(3, 64), (17, 640), (5, 100), (2, 1030), (3, 1028), (2, 4096), (2, 8196)])
def test_rms_norm_emulated(emu, rng, order, n, d):
    """Both float orders (llama.cpp's: 256 threads below 1024 columns, 1024 from there), with and without the add."""
    x = (rng.standard_normal((n, d)) * 10).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    add = rng.standard_normal((n, d)).astype(np.float32)
    out = poisoned((n, d))
    call(emu, "emu_rms_norm", order, x, w, None, 1e-6, n, d, out)
    assert nmse(out, rms_norm_ref(x, w, 1e-6)) <= 1e-12
    out = poisoned((n, d))
    call(emu, "emu_rms_norm", order, x, w, add, 1e-6, n, d, out)
    assert nmse(out, rms_norm_ref(x, w, 1e-6) + add) <= 1e-12
    out = poisoned((n, d))
    call(emu, "emu_rms_norm", order, x, None, None, 1e-6, n, d, out)
    assert nmse(out, rms_norm_ref(x, None, 1e-6)) <= 1e-12
    fused = poisoned((n, d))
    call(emu, "emu_rms_norm", order, x, w, add, 1e-6, n, d, fused)
    for alias in ("x", "add"):  # the header lets out be x or add: the same values in place
        buf = (x if alias == "x" else add).copy()
        call(emu, "emu_rms_norm", order, buf if alias == "x" else x, w, buf if alias == "add" else add, 1e-6, n, d,
             buf)
        assert np.array_equal(buf, fused), alias


@pytest.mark.parametrize("order", [HOST, LLAMACPP_CUDA], ids=["host", "llamacpp_cuda"])
@pytest.mark.parametrize("neox", [False, True])
def test_rope_emulated(emu, rng, order, neox):
    x = rng.standard_normal((17, 4, 128)).astype(np.float32)
    positions = rng.integers(0, 4096, 17).astype(np.int32)
    out = poisoned(x.shape)
    call(emu, "emu_rope", order, 2 if neox else 0, x, positions, 17, 4, 128, 500000.0, out)
    # 6 heads: ops.cu's groups of 4 heads a thread and a group of 2; each head's values as when it is alone
    x6 = rng.standard_normal((17, 6, 128)).astype(np.float32)
    out6 = poisoned(x6.shape)
    call(emu, "emu_rope", order, 2 if neox else 0, x6, positions, 17, 6, 128, 500000.0, out6)
    for h in range(6):
        alone = poisoned((17, 1, 128))
        call(emu, "emu_rope", order, 2 if neox else 0, np.ascontiguousarray(x6[:, h:h + 1]), positions, 17, 1, 128,
             500000.0, alone)
        assert np.array_equal(alone[:, 0], out6[:, h]), h
    # Host order: the kernel's chain of float products for theta, as the host reference. llama.cpp's: powf per pair
    # (the host's here, as cosf/sinf are the host libm's; on the GPU the fast-math intrinsics), so a few float ulps
    # of angle away from that chain at positions up to 4096: measured 3.4e-10 and 4.1e-10; against float64 angles
    # the host chain is 1.5e-9..2.2e-9 here (a wrong pairing or angle would be O(1)).
    in_place = x.copy()
    call(emu, "emu_rope", order, 2 if neox else 0, in_place, positions, 17, 4, 128, 500000.0, in_place)
    assert np.array_equal(in_place, out)
    if order == HOST:
        assert nmse(out, rope_ref(x, positions, 500000.0, neox)) <= 1e-12
    else:
        assert nmse(out, rope_ref(x, positions, 500000.0, neox)) <= 2e-9
    assert nmse(out, rope_f64(x.astype(np.float64), positions, 500000.0, neox)) <= 1e-8


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("with_q, with_v, v_k", [(True, True, 96), (False, True, 96), (True, False, 96),
                                                 (True, True, 94)], ids=["q-v", "v", "q", "q-v-scalar"])
def test_rope_rows_set_f16_emulated(emu, rng, neox, with_q, with_v, v_k):
    """The plugin's q RoPE + K/V cache writes in one launch (llama.cpp CUDA's order): q as emu_rope's values in
    that order, k as emu_rope's then emu_rows_set_f16's, v as emu_rows_set_f16's, bit for bit (no contraction in the
    emulation: the indexing, the positions per token, the heads' places in a cache row); rows of the tables no id
    names, the stride's gap and ids outside a table untouched (k's and v's ids apart, as llama.cpp's k_idxs and
    v_idxs); q in place gives the same values. Two pairs and four v values a thread where every access is aligned
    (v_k 96), else one each (v_k 94)."""
    tokens, heads, heads_kv, d = 13, 6, 2, 64
    mode = 2 if neox else 0
    q = rng.standard_normal((tokens, heads, d)).astype(np.float32)
    k = rng.standard_normal((tokens, heads_kv, d)).astype(np.float32)
    v = (rng.standard_normal((tokens, v_k)) * 100).astype(np.float32)
    positions = rng.integers(0, 4096, tokens).astype(np.int32)
    ids = np.concatenate([rng.permutation(30)[:tokens - 2], [-1, 30]]).astype(np.int64)
    v_ids = np.concatenate([[30, -1], rng.permutation(30)[:tokens - 2]]).astype(np.int64)
    k_table = rng.standard_normal((30, heads_kv * d + 8)).astype(np.float16)
    v_table = rng.standard_normal((30, v_k + 4)).astype(np.float16)
    k_want, v_want = k_table.copy(), v_table.copy()
    q_want = poisoned(q.shape)
    call(emu, "emu_rope", LLAMACPP_CUDA, mode, q, positions, tokens, heads, d, 5e5, q_want)
    k_roped = poisoned(k.shape)
    call(emu, "emu_rope", LLAMACPP_CUDA, mode, k, positions, tokens, heads_kv, d, 5e5, k_roped)
    call(emu, "emu_rows_set_f16", k_roped, tokens, heads_kv * d, ids, k_want.view(np.uint16), 30, heads_kv * d + 8)
    call(emu, "emu_rows_set_f16", v, tokens, v_k, v_ids, v_want.view(np.uint16), 30, v_k + 4)
    q_out = poisoned(q.shape)
    # which kernel runs (0 vectors, 1 scalar with 32-bit indices): the vector one unless v's rows are not a multiple of
    # 4 values (numpy's buffers are 16-byte aligned; the tables' strides 136 and 98 / 100 values)
    ffi, lib = emu
    ptr = lambda a: ffi.NULL if a is None else ffi.cast("void *", ffi.from_buffer(a))  # noqa: E731
    n = tokens * (heads if with_q else 0) * d // 2 + tokens * heads_kv * d // 2 + (tokens * v_k if with_v else 0)
    kernel = lib.emu_rope_rows_set_kernel(n, d, ptr(q if with_q else None), ptr(q_out if with_q else None), ptr(k),
                                          ptr(v if with_v else None), v_k, ptr(k_table), heads_kv * d + 8,
                                          ptr(v_table if with_v else None), v_k + 4)
    assert kernel == (1 if with_v and v_k % 4 else 0), kernel
    assert lib.emu_rope_rows_set_kernel(1 << 31, d, ptr(q), ptr(q_out), ptr(k), ptr(v), v_k, ptr(k_table),
                                        heads_kv * d + 8, ptr(v_table), v_k + 4) == 2  # past 32-bit indices
    call(emu, "emu_rope_rows_set_f16", mode, positions, tokens, d, 5e5, q if with_q else None, heads,
         q_out if with_q else None, k, heads_kv, v if with_v else None, v_k, ids, k_table.view(np.uint16), 30,
         heads_kv * d + 8, v_ids, v_table.view(np.uint16), 30, v_k + 4)
    assert np.array_equal(k_table.view(np.uint16), k_want.view(np.uint16))
    if with_q:
        assert np.array_equal(q_out.view(np.uint32), q_want.view(np.uint32))
        in_place = q.copy()
        call(emu, "emu_rope_rows_set_f16", mode, positions, tokens, d, 5e5, in_place, heads, in_place, k, heads_kv,
             None, v_k, ids, k_table.view(np.uint16), 30, heads_kv * d + 8, None, None, 0, 0)
        assert np.array_equal(in_place.view(np.uint32), q_want.view(np.uint32))
    else:
        assert (q_out.view(np.uint32) == 0xFFFFFFFF).all()
    if with_v:
        assert np.array_equal(v_table.view(np.uint16), v_want.view(np.uint16))
    else:
        assert not np.array_equal(v_table.view(np.uint16), v_want.view(np.uint16))


@pytest.mark.parametrize("order", [HOST, LLAMACPP_CUDA], ids=["host", "llamacpp_cuda"])
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("shape", [(5, 3, 64), (2, 1, 1030)], ids=["256-threads", "1024-threads"])
def test_rms_norm_rope_emulated(emu, rng, order, neox, shape):
    """The fused q/k norm + RoPE: in the emulation (no FMA contraction: -ffp-contract=off) the llama.cpp order's fused
    kernel must equal its own norm then its own rope value for value, as the host order does by construction: the
    indexing, the per-row positions and the angles of the new kernel (its contraction is checked on the H200
    against ggml-cuda's fused kernel, tests/test_ops.py)."""
    t, h, d = shape
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = (rng.standard_normal(d) + 1).astype(np.float32)
    positions = rng.integers(0, 4096, t).astype(np.int32)
    fused = poisoned(shape)
    call(emu, "emu_rms_norm_rope", order, 2 if neox else 0, x, w, 1e-6, positions, t, h, d, 1e6, fused)
    normed = poisoned(shape)
    call(emu, "emu_rms_norm", order, x, w, None, 1e-6, t * h, d, normed)
    apart = poisoned(shape)
    call(emu, "emu_rope", order, 2 if neox else 0, normed, positions, t, h, d, 1e6, apart)
    assert np.array_equal(fused.view(np.uint32), apart.view(np.uint32))
    # against float64 angles (a sanity bound: a wrong pairing or position is O(1)); the host order steps theta by 515
    # float products at 1030 dims: measured 1.0e-7 there
    reference = rope_f64(rms_norm_ref(x.reshape(-1, d), w, 1e-6).reshape(shape).astype(np.float64), positions, 1e6, neox)
    assert nmse(fused, reference) <= 1e-6


def test_elementwise_emulated(emu, rng):
    n = 4099
    gate, up = (rng.standard_normal((2, n)) * 4).astype(np.float32)
    out = poisoned(n)
    for order in (HOST, LLAMACPP_CUDA):
        out = poisoned(n)
        call(emu, "emu_glu", order, 0, gate, up, n, out)
        assert nmse(out, gate / (np.float32(1) + np.exp(-gate)) * up) <= 1e-12
        out = poisoned(n)
        call(emu, "emu_glu", order, 1, gate, up, n, out)
        assert nmse(out, gelu_float_ref(gate) * up) <= 1e-12
        in_place = gate.copy()  # out may be an input
        call(emu, "emu_glu", order, 1, in_place, up, n, in_place)
        assert np.array_equal(in_place, out)
    for order in (HOST, LLAMACPP_CUDA):  # 4096 values: ops.cu's float4 kernels, the scalar ones' values
        for kind in (0, 1):
            whole, vec = poisoned(n), poisoned(4096)
            call(emu, "emu_glu", order, kind, gate, up, n, whole)
            call(emu, "emu_glu", order, kind, gate[:4096], up[:4096], 4096, vec)
            assert np.array_equal(vec, whole[:4096]), (order, kind)
    out = poisoned(n)
    call(emu, "emu_add", gate, n, up, n, out)
    assert np.array_equal(out, gate + up)
    vec = poisoned(4096)
    call(emu, "emu_add", gate[:4096], 4096, up[:4096], 4096, vec)
    assert np.array_equal(vec, gate[:4096] + up[:4096])
    call(emu, "emu_add", gate[:4096], 4096, up[:64], 64, out)
    assert np.array_equal(out[:4096], (gate[:4096].reshape(64, 64) + up[:64]).reshape(-1))
    call(emu, "emu_scale", gate, np.float32(0.3), n, out)
    assert np.array_equal(out, gate * np.float32(0.3))
    bf16 = poisoned(n, np.uint16)
    call(emu, "emu_convert_bf16", gate, n, bf16)
    assert np.array_equal(bf16, bf16_bits(gate))
    cache = np.full((30, 64), np.nan, np.float16)
    x = (rng.standard_normal((7, 64)) * 100).astype(np.float32)
    call(emu, "emu_kv_store", cache.view(np.uint16), 20, x, 7, 64)
    assert np.array_equal(cache[20:27], x.astype(np.float16)) and np.isnan(cache[:20]).all() and np.isnan(cache[27:]).all()


@pytest.mark.parametrize("ggml_type", TABLE_TYPES, ids=[Q.type_name(t) for t in TABLE_TYPES])
def test_rows_emulated(emu, rng, ggml_type):
    rows, k = 9, 512
    raw = random_table(rng, ggml_type, rows, k)
    ids = np.array([3, 0, 8, 3, -1, 9], np.int32)
    out = poisoned((len(ids), k))
    call(emu, "emu_get_rows", ggml_type, raw, rows, k, ids, len(ids), out)
    ref = Q.dequantize(ggml_type, raw, rows, k)
    assert np.array_equal(out[:4], ref[ids[:4]]) and np.isnan(out[4:]).all()  # ids outside the table: NaN rows
    bf16 = poisoned((rows, k), np.uint16)
    call(emu, "emu_dequantize_bf16", ggml_type, raw, rows, k, bf16)
    assert np.array_equal(bf16, bf16_bits(ref))


Q32_ALL = [Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1]


@pytest.mark.parametrize("k", [384, 576, 96])
@pytest.mark.parametrize("ggml_type", Q32_ALL, ids=[Q.type_name(t) for t in Q32_ALL])
def test_gemm_q32_emulated(emu, rng, ggml_type, k):
    """gemm_q32.cu's kernel on the host's q8_1 activations: 70 rows (a tail of the 64-row tile), 37 tokens (of 32),
    K = 384 (three 128-value steps), 576 and 96 (a last step of two and three blocks: zero-padded activations, as
    SmolLM2's hidden size), against the float64 reference of the same bytes."""
    rows, tokens = 70, 37
    raw = random_table(rng, ggml_type, rows, k)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    xq = Q.quantize_q8_1_mmq(x, ggml_type)
    out = poisoned((tokens, rows))
    call(emu, "emu_gemm_q32", ggml_type, raw, rows, k, xq, tokens, out)
    err = nmse(out, Q.gemm_q32_mmq_quantized(ggml_type, raw, rows, k, xq, tokens))
    print(f"{Q.type_name(ggml_type)}: NMSE {err:.2e}")
    assert err <= 1e-10


# ---- MMQ's stream-k seams in the q32 kernel (gemm_q32.cu) -----------------------------------------------------------

MMQ_WIDTHS, MMQ_FALLBACK_WIDTHS = (8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128), (8, 16, 32, 64, 128)


def mmq_plan(rows, k, tokens, sms=132):
    """llama.cpp MMQ's stream-k grid (mmq.cu at 0c1e570, sm_80+, 32-block types): (J, token tiles, CTAs, K blocks)."""
    widths = MMQ_FALLBACK_WIDTHS if rows % 128 else MMQ_WIDTHS
    j = min(widths, key=lambda w: (-(-tokens // w), w))
    ntx = -(-tokens // j)
    tiles = ntx * -(-rows // 128)
    waves = -(-tiles // sms)
    return j, ntx, tiles if 100 * tiles // (sms * waves) >= 90 else sms, k // 32


def mmq_segment_starts(plan, rows, tile, iter_blocks=8):
    """The K-block offsets where tile `tile`'s segments start (0 first): where a CTA's range, snapped down to MMQ's
    iteration (`iter_blocks` blocks: 8 of 32 values, or 1 super-block for the K-quants), begins inside the tile."""
    j, ntx, blocks, kb = plan
    total = ntx * -(-rows // 128) * kb
    starts = {0}
    for b in range(blocks):
        s = b * total // blocks
        s -= (s % kb) % iter_blocks
        if tile * kb < s < (tile + 1) * kb:
            starts.add(s - tile * kb)
    return sorted(starts)


def q32_mmq_stream_k(ggml_type, raw, rows, k, xq, tokens, seams=True):
    """MMQ's float32 arithmetic for the 32-block types, block by block: acc = fma(float(isum) * d_w, d8, acc) (Q4_1 /
    Q5_1: acc = fma(d_w * d8, float(isum), acc), then fma(m_w, s8, acc)) per segment (the fma through float64: a*b is
    exact there), the segments added as its fixup adds them."""
    q8, d8, s8 = Q.q8_1_mmq_fields(xq, ggml_type, tokens, k)
    if ggml_type in Q.Q32_1_TYPES:
        qw, dw, mw = Q.q32_1_fields(ggml_type, raw, rows, k)
    else:
        qw, dw = Q.q32_fields(ggml_type, raw, rows, k)
    isum = np.einsum("tbv,rbv->trb", q8.reshape(tokens, k // 32, 32).astype(np.int64), qw.astype(np.int64))
    if ggml_type in Q.Q32_1_TYPES:  # [tokens, rows, blocks]
        dd = (dw[None] * d8[:, None, :]).astype(np.float32)
        step = lambda t, rs, b, acc: _fma(mw[rs, b], s8[t, b], _fma(dd[t, rs, b], isum[t, rs, b], acc))  # noqa: E731
    else:
        a = (isum.astype(np.float32) * dw[None]).astype(np.float32)
        step = lambda t, rs, b, acc: _fma(a[t, rs, b], d8[t, b], acc)  # noqa: E731
    plan = mmq_plan(rows, k, tokens)
    out = np.empty((tokens, rows), np.float32)
    for t in range(tokens):
        for r0 in range(0, rows, 128):
            tile = (r0 // 128) * plan[1] + t // plan[0]
            starts = mmq_segment_starts(plan, rows, tile) if seams else [0]
            bounds = starts + [k // 32]
            parts = []
            for s0, s1 in zip(bounds, bounds[1:]):
                acc = np.zeros(min(128, rows - r0), np.float32)
                for b in range(s0, s1):
                    acc = step(t, slice(r0, r0 + 128), b, acc)
                parts.append(acc)
            earlier = np.zeros_like(parts[-1])
            for p in reversed(parts[:-1]):
                earlier = (earlier + p).astype(np.float32)
            out[t, r0:r0 + 128] = (parts[-1] + earlier).astype(np.float32) if len(parts) > 1 else parts[-1]
    return out


@pytest.mark.parametrize("ggml_type", Q32_ALL, ids=[Q.type_name(t) for t in Q32_ALL])
@pytest.mark.parametrize("rows, k, tokens", [(128, 1024, 40), (200, 640, 37), (256, 2048, 130), (128, 4096, 40),
                                             (192, 1728, 40)])
def test_gemm_q32_emulated_mmq_seams(emu, rng, ggml_type, rows, k, tokens):
    """Where MMQ splits a tile's K over CTAs (these shapes fill few of an H200's 132 SMs: e.g. 128 x 1024 at 40 tokens
    is one tile cut at blocks 8, 16, 24), the q32 kernel restarts its sums at MMQ's seams and adds the segments as its
    fixup does: the same bits as a float32 model of MMQ's order, and not those of one pass. 1728 = 54 blocks (a last
    MMQ iteration of 6 blocks, as SmolLM2's FFN)."""
    raw = random_table(rng, ggml_type, rows, k)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    xq = Q.quantize_q8_1_mmq(x, ggml_type)
    out = poisoned((tokens, rows))
    call(emu, "emu_gemm_q32", ggml_type, raw, rows, k, xq, tokens, out)
    plan = mmq_plan(rows, k, tokens)
    assert any(len(mmq_segment_starts(plan, rows, tile)) > 1 for tile in range(plan[1] * -(-rows // 128)))
    model = q32_mmq_stream_k(ggml_type, raw, rows, k, xq, tokens)
    assert np.array_equal(out, model), f"{np.count_nonzero(out != model)} values differ"
    assert not np.array_equal(out, q32_mmq_stream_k(ggml_type, raw, rows, k, xq, tokens, seams=False))


def test_gemm_q32_emulated_mmq_seams_past_the_cap(emu, rng):
    """A tile with more than Q32_PARTIALS (16) earlier segments (128 x 8192 at 40 tokens: one tile, 32 segments) runs
    in one pass: the bits of the one-pass model, within the semantics' NMSE of MMQ's."""
    rows, k, tokens = 128, 8192, 40
    raw = random_table(rng, Q.Q8_0, rows, k)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    xq = Q.quantize_q8_1_mmq(x, Q.Q6_K)
    out = poisoned((tokens, rows))
    call(emu, "emu_gemm_q32", Q.Q8_0, raw, rows, k, xq, tokens, out)
    assert len(mmq_segment_starts(mmq_plan(rows, k, tokens), rows, 0)) > 17
    assert np.array_equal(out, q32_mmq_stream_k(Q.Q8_0, raw, rows, k, xq, tokens, seams=False))
    assert nmse(out, q32_mmq_stream_k(Q.Q8_0, raw, rows, k, xq, tokens)) <= 1e-10


def _fma(a, b, c):
    """float32 fma(a, b, c) through float64 (a*b is exact there; the one rounding of the sum to float32 matches a
    fused multiply-add except in double-rounding ties, absent from these seeded cases)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


def kquant_mmq_stream_k(ggml_type, raw, rows, k, xq, tokens, seams=True):
    """MMQ's float32 order for Q4_K / Q6_K (vec_dot_q8_1_q8_1_mma on Q4_K's {half(d*sc), -half(dmin*m)} and the DS4
    {d8, s8}: acc = fma(A*d8, isum, acc), fma(B, s8, acc) per 32 values; vec_dot_q6_K_q8_1_mma: per 128 values
    tmp = sum of fma(sc_lo*isum_lo + sc_hi*isum_hi, d8, tmp), acc = fma(tmp, d, acc)), per MMQ segment (one super-block
    an iteration), the segments added as its fixup adds them."""
    nb = k // 256
    if ggml_type in (Q.Q4_K, Q.Q5_K):  # Q5_K: MMQ's same formula on its 0..31 quants
        q8, d8, s8 = Q.q8_1_mmq_fields(xq, ggml_type, tokens, k)
        d, dmin, sc, m, q = (Q.q4_K_fields(raw, rows, k) if ggml_type == Q.Q4_K
                             else Q.q5_K_fields(raw.reshape(rows, -1), rows, k))
        wa = (d[..., None] * sc.astype(np.float32)).astype(np.float16).astype(np.float32)   # [rows, nb, 8]
        wb = -(dmin[..., None] * m.astype(np.float32)).astype(np.float16).astype(np.float32)
        isum = np.einsum("tbiv,rbiv->trbi", q8.reshape(tokens, nb, 8, 32).astype(np.int64), q.astype(np.int64))
    else:
        q8, d8, _ = Q.q8_1_mmq_fields(xq, Q.Q6_K, tokens, k)
        d, sc, q = Q.q6_K_fields(raw, rows, k)
        isum16 = np.einsum("tbjv,rbjv->trbj", q8.reshape(tokens, nb, 16, 16).astype(np.int64),
                           q.reshape(rows, nb, 16, 16).astype(np.int64))
        isc = (isum16 * sc[None].astype(np.int64)).reshape(tokens, rows, nb, 8, 2).sum(-1).astype(np.float32)
    d8 = d8.reshape(tokens, nb, 8)
    plan = mmq_plan(rows, k * 8, tokens)[:3] + (nb,)  # K-quants: k_blocks = nb super-blocks, one an iteration
    out = np.empty((tokens, rows), np.float32)

    def segment(t, r, b0, b1):
        acc = np.zeros(r.stop - r.start, np.float32)
        for b in range(b0, b1):
            if ggml_type in (Q.Q4_K, Q.Q5_K):
                for i in range(8):
                    a = (wa[r, b, i] * d8[t, b, i]).astype(np.float32)
                    acc = _fma(a, isum[t, r, b, i].astype(np.float32), acc)
                    acc = _fma(wb[r, b, i], s8.reshape(tokens, nb, 8)[t, b, i], acc)
            else:
                for half in range(2):
                    tmp = np.zeros_like(acc)
                    for i in range(4 * half, 4 * half + 4):
                        tmp = _fma(isc[t, r, b, i], d8[t, b, i], tmp)
                    acc = _fma(tmp, d[r, b], acc)
        return acc

    for t in range(tokens):
        for r0 in range(0, rows, 128):
            r = slice(r0, min(r0 + 128, rows))
            tile = (r0 // 128) * plan[1] + t // plan[0]
            starts = mmq_segment_starts(plan, rows, tile, 1) if seams else [0]
            bounds = starts + [nb]
            parts = [segment(t, r, s0, s1) for s0, s1 in zip(bounds, bounds[1:])]
            earlier = np.zeros_like(parts[-1])
            for p in reversed(parts[:-1]):
                earlier = (earlier + p).astype(np.float32)
            out[t, r] = (parts[-1] + earlier).astype(np.float32) if len(parts) > 1 else parts[-1]
    return out


@pytest.mark.parametrize("ggml_type", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("rows, k, tokens", [(128, 1024, 40), (136, 512, 20), (256, 512, 130)])
def test_gemm_mma_emulated_mmq_order(emu, rng, ggml_type, rows, k, tokens):
    """gemm_mma.cu's kernel (int8 mma and ldmatrix emulated exactly) in MMQ's float32 order: Q6_K's per-128-value
    sums, and MMQ's stream-k seams where it splits K (128 x 1024 at 40 tokens: one tile cut at each super-block; 136
    rows: the fallback widths; 130 tokens: MMQ's J = 80 puts a seam inside a 128-token CTA, so 16-token CTAs run):
    the same bits as a float32 model of MMQ, and not those of one pass."""
    quantize = {Q.Q4_K: Q.quantize_q4_K, Q.Q5_K: Q.quantize_q5_K, Q.Q6_K: Q.quantize_q6_K}[ggml_type]
    raw = quantize((rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    xq = Q.quantize_q8_1_mmq(x, ggml_type)
    out = poisoned((tokens, rows))
    call(emu, "emu_gemm_mma", ggml_type, raw, rows, k, xq, tokens, out)
    model = kquant_mmq_stream_k(ggml_type, raw, rows, k, xq, tokens)
    assert np.array_equal(out, model), f"{np.count_nonzero(out != model)} of {out.size} values differ"
    assert not np.array_equal(out, kquant_mmq_stream_k(ggml_type, raw, rows, k, xq, tokens, seams=False))
