"""ggml block formats and the reference GEMMs, in numpy, bit-exact with ggml and llama.cpp CUDA MMQ.

docs/SEMANTICS.md is the contract. Shapes: weight blocks ``[rows, K/256, block_bytes]`` (uint8),
activations ``[tokens, K]`` float32, GEMM output ``[tokens, rows]``.
"""

from __future__ import annotations

import numpy as np

from .errors import ShapeError, UnsupportedTypeError

QK_K = 256
Q8_1_MMQ_VALUES = 128

# ggml type ids (ggml.h enum ggml_type).
F32, F16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K, BF16 = 0, 1, 2, 6, 8, 12, 13, 14, 15, 30
Q4_1, Q5_1 = 3, 7
TYPE_NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K",
              Q5_K: "Q5_K", Q6_K: "Q6_K", Q8_K: "Q8_K", BF16: "BF16", Q4_1: "Q4_1", Q5_1: "Q5_1"}
# (values per block, bytes per block)
BLOCK_LAYOUT = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q5_0: (32, 22), Q8_0: (32, 34),
                Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), Q8_K: (256, 292), Q4_1: (32, 20), Q5_1: (32, 24)}
KEEP_QUANT_TYPES = (Q4_K, Q6_K)
HOST_KEEP_QUANT_TYPES = KEEP_QUANT_TYPES + (Q5_K,)  # the host "cpu" variant's: Q5_K in cpu semantics only
Q32_TYPES = (Q4_0, Q5_0, Q8_0)  # 32-value blocks: int8 values and one fp16 scale per block (the q32 variant)
Q32_1_TYPES = (Q4_1, Q5_1)  # 32-value blocks with an fp16 d and m each (value = q*d + m)

Q8_K_DTYPE = np.dtype([("d", "<f4"), ("qs", "i1", QK_K), ("bsums", "<i2", QK_K // 16)])
Q8_1_MMQ_BYTES = 144


def type_name(ggml_type: int) -> str:
    if ggml_type in TYPE_NAMES:
        return TYPE_NAMES[ggml_type]
    import gguf

    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def unsupported_type(ggml_type: int, what: str = "") -> UnsupportedTypeError:
    """The error for a tensor type ggml-ciq does not decode, naming what it decodes (`what`: the tensor, if known)."""
    decoded = ", ".join(type_name(t) for t in BLOCK_LAYOUT if t != Q8_K)
    return UnsupportedTypeError(f"{what + ': ' if what else ''}unsupported tensor type {type_name(ggml_type)} "
                                f"(ggml-ciq decodes {decoded})")


def row_bytes(ggml_type: int, k: int) -> int:
    """Bytes of one row of k values; ShapeError if k is not a whole number of blocks."""
    if ggml_type not in BLOCK_LAYOUT:
        raise unsupported_type(ggml_type)
    values, nbytes = BLOCK_LAYOUT[ggml_type]
    if k % values:
        raise ShapeError(f"{type_name(ggml_type)} rows need K % {values} == 0, got K={k}")
    return k // values * nbytes


def _blocks(data, ggml_type: int, rows: int, k: int) -> np.ndarray:
    """View raw tensor bytes as [rows, K/256, block_bytes] uint8."""
    nbytes = row_bytes(ggml_type, k)
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    if raw.size != rows * nbytes:
        raise ShapeError(f"{type_name(ggml_type)} [{rows} x {k}] needs {rows * nbytes} bytes, got {raw.size}")
    return raw.reshape(rows, k // QK_K, BLOCK_LAYOUT[ggml_type][1])


def _half(raw: np.ndarray) -> np.ndarray:
    """Little-endian fp16 from [..., 2] uint8 as float32."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Q4_K

def q4_K_fields(data, rows: int, k: int):
    """Decode Q4_K blocks into (d, dmin [rows, nb] f32; sc, m [rows, nb, 8] int; q [rows, nb, 8, 32] int)."""
    b = _blocks(data, Q4_K, rows, k)
    d, dmin = _half(b[..., 0:2]), _half(b[..., 2:4])
    s = b[..., 4:16].astype(np.int32)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    qs = b[..., 16:144].reshape(rows, -1, 4, 32)
    q = np.stack([qs & 0xF, qs >> 4], axis=3).reshape(rows, -1, 8, 32).astype(np.int32)
    return d, dmin, sc, m, q


def dequantize_q4_K(data, rows: int, k: int) -> np.ndarray:
    """ggml dequantize_row_q4_K, bit for bit: (d*sc)*q - dmin*m in float32."""
    d, dmin, sc, m, q = q4_K_fields(data, rows, k)
    d1 = d[..., None] * sc.astype(np.float32)
    m1 = dmin[..., None] * m.astype(np.float32)
    return (d1[..., None] * q.astype(np.float32) - m1[..., None]).reshape(rows, k)


def _quantize_scale_min(x: np.ndarray, top: int):
    """Q4_K/Q5_K's simple deterministic quantizer (min/max per sub-block; not ggml's search), quants 0..top ->
    (fp16 d, dmin [rows, nb]; the 12 packed scale bytes [rows, nb, 12]; q uint8 [rows, nb, 8, 32])."""
    rows, k = x.shape
    xb = x.astype(np.float32).reshape(rows, k // QK_K, 8, 32)
    lo = np.minimum(xb.min(-1), 0.0)
    scale = (xb.max(-1) - lo) / np.float32(top)
    d = (scale.max(-1) / 63.0).astype(np.float16)
    dmin = ((-lo).max(-1) / 63.0).astype(np.float16)
    df, dminf = d.astype(np.float32)[..., None], dmin.astype(np.float32)[..., None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 63).astype(np.int32)
    m = np.clip(np.rint(np.divide(-lo, dminf, out=np.zeros_like(lo), where=dminf > 0)), 0, 63).astype(np.int32)
    step = (df * sc)[..., None]
    q = np.divide(xb + (dminf * m)[..., None], step, out=np.zeros_like(xb), where=step > 0)
    q = np.clip(np.rint(q), 0, top).astype(np.uint8)
    s = np.zeros((rows, k // QK_K, 12), np.int32)
    s[..., 0:4] = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    s[..., 4:8] = m[..., 0:4] | ((m[..., 4:8] >> 4) << 6)
    s[..., 8:12] = (sc[..., 4:8] & 0xF) | ((m[..., 4:8] & 0xF) << 4)
    return d, dmin, s.astype(np.uint8), q


def _pack_k4(rows: int, nb: int, d, dmin, scales, q, nbytes: int) -> np.ndarray:
    """d, dmin, scales[12] first, the low nibbles (value e of chunk c: qs[32c + e%32], low then high nibble) last."""
    out = np.zeros((rows, nb, nbytes), np.uint8)
    out[..., 0:2] = d.view(np.uint8).reshape(rows, -1, 2)
    out[..., 2:4] = dmin.view(np.uint8).reshape(rows, -1, 2)
    out[..., 4:16] = scales
    qc = (q & 0xF).reshape(rows, -1, 4, 2, 32)
    out[..., nbytes - 128:] = (qc[:, :, :, 0] | (qc[:, :, :, 1] << 4)).reshape(rows, -1, 128)
    return out


def quantize_q4_K(x: np.ndarray) -> np.ndarray:
    """Simple deterministic Q4_K quantizer (min/max per sub-block; not ggml's search) -> raw bytes."""
    rows, k = x.shape
    row_bytes(Q4_K, k)
    d, dmin, scales, q = _quantize_scale_min(x, 15)
    return _pack_k4(rows, k // QK_K, d, dmin, scales, q, 144).reshape(-1)


def quantize_q5_K(x: np.ndarray) -> np.ndarray:
    """The same quantizer with 5-bit quants (0..31) -> raw Q5_K bytes: bit j of qh[l] is bit 4 of value 32j + l."""
    rows, k = x.shape
    row_bytes(Q5_K, k)
    d, dmin, scales, q = _quantize_scale_min(x, 31)
    out = _pack_k4(rows, k // QK_K, d, dmin, scales, q, 176)
    high = (q >> 4).reshape(rows, -1, 8, 32).astype(np.uint8)
    out[..., 16:48] = (high << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=2, dtype=np.uint8)
    return out.reshape(-1)


# ----------------------------------------------------------------------------------------------
# Q6_K

def q6_K_fields(data, rows: int, k: int):
    """Decode Q6_K blocks into (d [rows, nb] f32; sc [rows, nb, 16] int; q [rows, nb, 256] int in -32..31)."""
    b = _blocks(data, Q6_K, rows, k)
    ql, qh = b[..., 0:128].astype(np.int32), b[..., 128:192].astype(np.int32)
    sc = b[..., 192:208].view(np.int8).astype(np.int32)
    d = _half(b[..., 208:210])
    halves = []
    for n in range(2):
        lo, hi = ql[..., 64 * n:64 * n + 64], qh[..., 32 * n:32 * n + 32]
        groups = [lo[..., 0:32] & 0xF, lo[..., 32:64] & 0xF, lo[..., 0:32] >> 4, lo[..., 32:64] >> 4]
        halves += [g | (((hi >> (2 * i)) & 3) << 4) for i, g in enumerate(groups)]
    q = np.concatenate(halves, axis=-1) - 32
    return d, sc, q


def dequantize_q6_K(data, rows: int, k: int) -> np.ndarray:
    """ggml dequantize_row_q6_K, bit for bit: (d*sc)*q in float32."""
    d, sc, q = q6_K_fields(data, rows, k)
    ds = d[..., None] * sc.astype(np.float32)
    return (ds[..., None] * q.reshape(rows, -1, 16, 16).astype(np.float32)).reshape(rows, k)


def quantize_q6_K(x: np.ndarray) -> np.ndarray:
    """Simple deterministic Q6_K quantizer (absmax per 16 values) -> raw bytes."""
    rows, k = x.shape
    row_bytes(Q6_K, k)
    xb = x.astype(np.float32).reshape(rows, k // QK_K, 16, 16)
    scale = np.abs(xb).max(-1) / 31.0
    d = (scale.max(-1) / 127.0).astype(np.float16)
    df = d.astype(np.float32)[..., None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), -128, 127)
    step = (df * sc)[..., None]
    q = np.divide(xb, step, out=np.zeros_like(xb), where=step > 0)
    q = (np.clip(np.rint(q), -32, 31) + 32).astype(np.int32).reshape(rows, -1, 2, 4, 32)
    lo, hi = q & 0xF, q >> 4
    out = np.zeros((rows, k // QK_K, 210), np.uint8)
    ql = np.concatenate([lo[:, :, :, 0] | (lo[:, :, :, 2] << 4), lo[:, :, :, 1] | (lo[:, :, :, 3] << 4)], axis=-1)
    out[..., 0:128] = ql.reshape(rows, -1, 128)
    qh = hi[:, :, :, 0] | (hi[:, :, :, 1] << 2) | (hi[:, :, :, 2] << 4) | (hi[:, :, :, 3] << 6)
    out[..., 128:192] = qh.reshape(rows, -1, 64)
    out[..., 192:208] = sc.astype(np.int8).view(np.uint8)
    out[..., 208:210] = d.view(np.uint8).reshape(rows, -1, 2)
    return out.reshape(-1)


# ----------------------------------------------------------------------------------------------
# Other ggml types (dequantization only)

def dequantize(ggml_type: int, data, rows: int, k: int) -> np.ndarray:
    """Dequantize a 2-D tensor's raw bytes to float32 [rows, k]."""
    if ggml_type == Q4_K:
        return dequantize_q4_K(data, rows, k)
    if ggml_type == Q6_K:
        return dequantize_q6_K(data, rows, k)
    nbytes = row_bytes(ggml_type, k)
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    if raw.size != rows * nbytes:
        raise ShapeError(f"{type_name(ggml_type)} [{rows} x {k}] needs {rows * nbytes} bytes, got {raw.size}")
    raw = np.ascontiguousarray(raw).reshape(rows, -1)
    if ggml_type == F32:
        return raw.view("<f4").copy()
    if ggml_type == F16:
        return raw.view("<f2").astype(np.float32)
    if ggml_type == BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if ggml_type in (Q4_0, Q5_0, Q8_0):
        q, d = q32_fields(ggml_type, raw, rows, k)
        return (q.astype(np.float32) * d[..., None]).reshape(rows, k)
    if ggml_type == Q5_K:
        return _dequantize_q5_K(raw, rows, k)
    if ggml_type in Q32_1_TYPES:
        q, d, m = q32_1_fields(ggml_type, raw, rows, k)
        return (q.astype(np.float32) * d[..., None] + m[..., None]).reshape(rows, k)  # ggml's q*d + m, two roundings
    raise unsupported_type(ggml_type)


def q32_fields(ggml_type: int, data, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 / Q5_0 / Q8_0 blocks -> (signed values int8 [rows, K/32, 32], scales float32 [rows, K/32])."""
    nbytes = row_bytes(ggml_type, k)
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    if ggml_type not in (Q4_0, Q5_0, Q8_0) or raw.size != rows * nbytes:
        raise ShapeError(f"{type_name(ggml_type)} [{rows} x {k}]: not 32-block data of {rows * nbytes} bytes")
    b = np.ascontiguousarray(raw).reshape(rows, k // 32, -1)
    d = _half(b[..., 0:2])
    if ggml_type == Q8_0:
        return b[..., 2:34].view(np.int8).copy(), d
    if ggml_type == Q4_0:
        qs = b[..., 2:18]
        return (np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.int8) - 8), d
    qh = np.ascontiguousarray(b[..., 2:6]).view("<u4").astype(np.int64)
    bits = ((qh >> np.arange(32)) & 1).astype(np.uint8)
    qs = b[..., 6:22]
    q = np.concatenate([(qs & 0xF) | (bits[..., :16] << 4), (qs >> 4) | (bits[..., 16:] << 4)], axis=-1)
    return q.astype(np.int8) - 16, d


def q32_1_fields(ggml_type: int, data, rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 / Q5_1 blocks -> (unsigned values uint8 [rows, K/32, 32] in 0..15 / 0..31, d and m float32 [rows, K/32]):
    value = q * d + m."""
    nbytes = row_bytes(ggml_type, k)
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    if ggml_type not in Q32_1_TYPES or raw.size != rows * nbytes:
        raise ShapeError(f"{type_name(ggml_type)} [{rows} x {k}]: not Q4_1/Q5_1 data of {rows * nbytes} bytes")
    b = np.ascontiguousarray(raw).reshape(rows, k // 32, -1)
    d, m = _half(b[..., 0:2]), _half(b[..., 2:4])
    if ggml_type == Q4_1:
        qs = b[..., 4:20]
        return np.concatenate([qs & 0xF, qs >> 4], axis=-1), d, m
    qh = np.ascontiguousarray(b[..., 4:8]).view("<u4").astype(np.int64)
    bits = ((qh >> np.arange(32)) & 1).astype(np.uint8)
    qs = b[..., 8:24]
    return np.concatenate([(qs & 0xF) | (bits[..., :16] << 4), (qs >> 4) | (bits[..., 16:] << 4)], axis=-1), d, m


def quantize_q8_1_cpu(x: np.ndarray) -> np.ndarray:
    """float32 [tokens, K] -> ggml block_q8_1 bytes [tokens, K/32, 36] as llama.cpp x86 CPU's quantize_row_q8_1
    (the q8_1-cpu layout): d = amax/127, q = round-half-even(x * (127/amax)), half d, half s = fp16(d * sum(q))."""
    x = np.ascontiguousarray(x, np.float32)
    tokens, k = x.shape
    v = x.reshape(tokens, k // 32, 32)
    amax = np.abs(v).max(-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(v * inv[..., None]).astype(np.int8)
    s = d * q.astype(np.int32).sum(-1).astype(np.float32)
    out = np.empty((tokens, k // 32, 36), np.uint8)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:4] = s.astype(np.float16)[..., None].view(np.uint8)
    out[..., 4:] = q.view(np.uint8)
    return out


def gemm_q32_1_cpu_quantized(ggml_type: int, data, rows: int, k: int, xq: np.ndarray, tokens: int) -> np.ndarray:
    """Q4_1 / Q5_1 on q8_1-cpu bytes, exact in float64: sum over blocks of d_w * d_x * isum + m_w * s_x."""
    qw, dw, mw = q32_1_fields(ggml_type, data, rows, k)
    b = np.ascontiguousarray(xq).reshape(tokens, k // 32, 36)
    dx = _half(b[..., 0:2]).astype(np.float64)
    sx = _half(b[..., 2:4]).astype(np.float64)
    qx = b[..., 4:].view(np.int8).astype(np.float64)
    isum = np.einsum("rbj,tbj->trb", qw.astype(np.float64), qx)
    return (np.einsum("trb,rb,tb->tr", isum, dw.astype(np.float64), dx)
            + np.einsum("rb,tb->tr", mw.astype(np.float64), sx))


def q5_K_fields(raw: np.ndarray, rows: int, k: int):
    """Q5_K blocks -> (d, dmin [rows, nb]; sc, m [rows, nb, 8]; q [rows, nb, 8, 32] in 0..31)."""
    b = np.ascontiguousarray(raw).reshape(rows, k // QK_K, 176)
    d, dmin = _half(b[..., 0:2]), _half(b[..., 2:4])
    s = b[..., 4:16].astype(np.int32)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    qh = b[..., 16:48].astype(np.int32)
    qs = b[..., 48:176].reshape(rows, -1, 4, 32).astype(np.int32)
    chunks = []
    for c in range(4):
        chunks.append((qs[:, :, c] & 0xF) | (((qh >> (2 * c)) & 1) << 4))
        chunks.append((qs[:, :, c] >> 4) | (((qh >> (2 * c + 1)) & 1) << 4))
    return d, dmin, sc, m, np.stack(chunks, axis=2)


def _dequantize_q5_K(raw: np.ndarray, rows: int, k: int) -> np.ndarray:
    d, dmin, sc, m, q = q5_K_fields(raw, rows, k)
    d1 = d[..., None] * sc.astype(np.float32)
    m1 = dmin[..., None] * m.astype(np.float32)
    return (d1[..., None] * q.astype(np.float32) - m1[..., None]).reshape(rows, k)


# ----------------------------------------------------------------------------------------------
# Activation quantization

def _check_activations(x: np.ndarray, multiple: int) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % multiple:
        raise ShapeError(f"activations must be [tokens, K] with K % {multiple} == 0, got {x.shape}")
    return x


def quantize_q8_K(x: np.ndarray) -> np.ndarray:
    """ggml quantize_row_q8_K_ref per token: Q8_K records [tokens, K/256] (292 B each)."""
    x = _check_activations(x, QK_K)
    tokens, k = x.shape
    xb = x.reshape(tokens, k // QK_K, QK_K)
    index = np.abs(xb).argmax(-1)[..., None]
    signed_max = np.take_along_axis(xb, index, -1)[..., 0]
    nonzero = signed_max != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.float32(-127.0) / signed_max
        q = np.minimum(127, np.rint(iscale[..., None] * xb))
        d = np.float32(1.0) / iscale
    out = np.zeros((tokens, k // QK_K), Q8_K_DTYPE)
    qs = np.where(nonzero[..., None], q, 0).astype(np.int8)
    out["qs"] = qs
    out["bsums"] = qs.reshape(tokens, -1, 16, 16).sum(-1, dtype=np.int16)
    out["d"] = np.where(nonzero, d, 0)
    return out


def q8_K_round_trip(x: np.ndarray) -> np.ndarray:
    """x as a K-quant weight's CPU vec_dot sees it: quantize_row_q8_K, dequantized (float32)."""
    blocks = quantize_q8_K(x)
    return (blocks["qs"].astype(np.float32) * blocks["d"][..., None]).reshape(x.shape)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 (round to nearest even, as ggml's fp32_to_bf16) -> float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C roundf on float32 (exact: the fractional part of a float32 is representable)."""
    a = np.abs(v)
    f = np.floor(a)
    return np.copysign(f + (a - f >= 0.5), v)


MMQ_DS4_TYPES = (Q4_K, Q5_K, Q4_0, Q4_1, Q5_1)  # q8_1-mmq scale words half2 {d, s}; the other types float d (D4)
MMQ_TYPES = MMQ_DS4_TYPES + (Q6_K, Q5_0, Q8_0)


def q8_1_mmq_blocks(k: int) -> int:
    """q8_1-mmq blocks of one token for K values (a multiple of 32): the last one zero-padded, as llama.cpp pads src1."""
    return -(-k // Q8_1_MMQ_VALUES)


def quantize_q8_1_mmq(x: np.ndarray, weight_type: int) -> np.ndarray:
    """llama.cpp quantize_mmq_q8_1: [ceil(K/128), tokens] blocks of 144 B (DS4 for MMQ_DS4_TYPES, D4 for Q6_K, Q5_0,
    Q8_0); K a multiple of 32, the values past K zeros (q = 0, d = 0, s = 0)."""
    x = _check_activations(x, 32)
    if weight_type not in MMQ_TYPES:
        raise UnsupportedTypeError(f"q8_1-mmq layout is not defined for {type_name(weight_type)} weights")
    tokens, k = x.shape
    nblocks = q8_1_mmq_blocks(k)
    padded = np.zeros((tokens, nblocks * Q8_1_MMQ_VALUES), np.float32)
    padded[:, :k] = x
    xg = padded.reshape(tokens, -1, 32)
    amax = np.abs(xg).max(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        d_inv = np.float32(127.0) / amax
        q = _round_half_away(xg * d_inv[..., None])
        d = np.float32(1.0) / d_inv
    q = np.where(amax[..., None] > 0, q, 0).astype(np.int8)
    t = xg.reshape(tokens, -1, 8, 4)
    t = ((t[..., 0] + t[..., 1]) + t[..., 2]) + t[..., 3]
    s = ((t[..., 0] + t[..., 4]) + (t[..., 2] + t[..., 6])) + ((t[..., 1] + t[..., 5]) + (t[..., 3] + t[..., 7]))
    if weight_type in MMQ_DS4_TYPES:
        with np.errstate(over="ignore"):  # sums beyond fp16 range become inf, as on the GPU
            words = np.stack([d.astype(np.float16), s.astype(np.float16)], axis=-1).view(np.uint32)[..., 0]
    else:
        words = d.astype(np.float32).view(np.uint32)
    out = np.empty((nblocks, tokens, Q8_1_MMQ_BYTES), np.uint8)
    out[..., 0:16] = words.reshape(tokens, -1, 4).transpose(1, 0, 2).copy().view(np.uint8)
    out[..., 16:] = q.view(np.uint8).reshape(tokens, -1, Q8_1_MMQ_VALUES).transpose(1, 0, 2)
    return out


def q8_1_mmq_fields(blocks: np.ndarray, weight_type: int, tokens: int, k: int):
    """Unpack q8_1-mmq blocks into (q [tokens, K] int, d8 [tokens, K/32] f32, s8 [tokens, K/32] f32 or None for D4);
    the padding past K dropped."""
    nblocks = q8_1_mmq_blocks(k)
    b = blocks.reshape(nblocks, tokens, Q8_1_MMQ_BYTES)
    q = b[..., 16:].view(np.int8).transpose(1, 0, 2).reshape(tokens, -1)[:, :k].astype(np.int32)
    words = np.ascontiguousarray(b[..., 0:16]).view(np.uint32).transpose(1, 0, 2).reshape(tokens, -1)[:, :k // 32]
    if weight_type in MMQ_DS4_TYPES:
        halves = np.ascontiguousarray(words).view(np.float16).reshape(tokens, k // 32, 2).astype(np.float32)
        return q, halves[..., 0], halves[..., 1]
    return q, np.ascontiguousarray(words).view(np.float32), None


# ----------------------------------------------------------------------------------------------
# Reference GEMMs, out[tokens, rows] = X @ W^T. Integer sums are exact; float parts run in float64.

def gemm_cpu_semantics(weight_type: int, data, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """llama.cpp CPU semantics: Q8_K activations, integer sub-block sums, float per super-block (Q4_K, Q5_K, Q6_K)."""
    xq = quantize_q8_K(_check_activations(x, QK_K))
    return gemm_cpu_semantics_quantized(weight_type, data, rows, k, xq)


def gemm_cpu_semantics_quantized(weight_type: int, data, rows: int, k: int, xq: np.ndarray) -> np.ndarray:
    tokens = xq.shape[0]
    q8 = xq["qs"].astype(np.float64)                      # [tokens, nb, 256]
    dy = xq["d"].astype(np.float64)                       # [tokens, nb]
    xf = (dy[..., None] * q8).reshape(tokens, k)          # exact products
    if weight_type in (Q4_K, Q5_K):
        if weight_type == Q4_K:
            d, dmin, sc, m, q = q4_K_fields(data, rows, k)
        else:
            d, dmin, sc, m, q = q5_K_fields(_blocks(data, Q5_K, rows, k), rows, k)
        wf = (d.astype(np.float64)[..., None, None] * sc[..., None] * q).reshape(rows, k)
        bsum32 = xq["bsums"].astype(np.float64).reshape(tokens, -1, 8, 2).sum(-1)   # [tokens, nb, 8]
        xmin = (dy[..., None] * bsum32).reshape(tokens, -1)
        wmin = (dmin.astype(np.float64)[..., None] * m).reshape(rows, -1)
        return xf @ wf.T - xmin @ wmin.T
    if weight_type == Q6_K:
        d, sc, q = q6_K_fields(data, rows, k)
        wf = (d.astype(np.float64)[..., None, None] * sc[..., None] * q.reshape(rows, -1, 16, 16)).reshape(rows, k)
        return xf @ wf.T
    raise UnsupportedTypeError(f"keep-quant GEMM in cpu semantics supports Q4_K, Q5_K and Q6_K, not "
                               f"{type_name(weight_type)}")


def gemm_mmq_semantics(weight_type: int, data, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """llama.cpp CUDA MMQ semantics: q8_1 activations, fp16-rounded d*sc and dmin*m."""
    x = _check_activations(x, QK_K)
    xq = quantize_q8_1_mmq(x, weight_type)
    return gemm_mmq_semantics_quantized(weight_type, data, rows, k, xq, x.shape[0])


def gemm_mmq_semantics_quantized(weight_type: int, data, rows: int, k: int, xq: np.ndarray,
                                 tokens: int) -> np.ndarray:
    q8, d8, s8 = q8_1_mmq_fields(xq, weight_type, tokens, k)
    xf = (np.repeat(d8.astype(np.float64), 32, axis=1) * q8)
    if weight_type in (Q4_K, Q5_K):  # Q5_K: MMQ's Q4_K formula (vec_dot_q8_1_q8_1_mma) on its 0..31 quants
        d, dmin, sc, m, q = (q4_K_fields(data, rows, k) if weight_type == Q4_K
                             else q5_K_fields(_blocks(data, Q5_K, rows, k), rows, k))
        a = (d[..., None] * sc.astype(np.float32)).astype(np.float16).astype(np.float64)
        b = -(dmin[..., None] * m.astype(np.float32)).astype(np.float16).astype(np.float64)
        wf = (a[..., None] * q).reshape(rows, k)
        return xf @ wf.T + s8.astype(np.float64) @ b.reshape(rows, -1).T
    if weight_type == Q6_K:
        d, sc, q = q6_K_fields(data, rows, k)
        wf = (d.astype(np.float64)[..., None, None] * sc[..., None] * q.reshape(rows, -1, 16, 16)).reshape(rows, k)
        return xf @ wf.T
    raise UnsupportedTypeError(f"keep-quant GEMM in MMQ semantics supports Q4_K, Q5_K and Q6_K, not "
                               f"{type_name(weight_type)}")


def gemm_q32_mmq_quantized(ggml_type: int, data, rows: int, k: int, xq: np.ndarray, tokens: int) -> np.ndarray:
    """The q32 variant's MMQ semantics (llama.cpp CUDA MMQ for the 32-value block types) on q8_1-mmq bytes: sum over
    blocks of d_w * d8 * isum (Q4_1 / Q5_1: plus m_w * s8), exact in float64."""
    q8, d8, s8 = q8_1_mmq_fields(xq, ggml_type, tokens, k)
    xf = np.repeat(d8.astype(np.float64), 32, axis=1) * q8
    if ggml_type in Q32_1_TYPES:
        qw, dw, mw = q32_1_fields(ggml_type, data, rows, k)
        return (xf @ (dw.astype(np.float64)[..., None] * qw).reshape(rows, k).T
                + s8.astype(np.float64) @ mw.astype(np.float64).T)
    qw, dw = q32_fields(ggml_type, data, rows, k)
    return xf @ (dw.astype(np.float64)[..., None] * qw).reshape(rows, k).T


F16_K_UNIT = 64  # the f16 layout's K multiple (native/src/blocks.h; the wgmma row's k_multiple)


def convert_f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f16 semantics' activations: (f16 [tokens, K] of x * 2^-e, scale [tokens] = 2^e), e putting amax in [2^14, 2^15);
    K a multiple of F16_K_UNIT (wgmma's pipeline stage)."""
    x = _check_activations(x, F16_K_UNIT)
    e = np.maximum(np.frexp(np.abs(x).max(-1))[1], -100)
    up = np.ldexp(np.float32(1.0), 15 - e).astype(np.float32)
    with np.errstate(over="ignore"):
        return (x * up[:, None]).astype(np.float16), np.ldexp(np.float32(1.0), e - 15).astype(np.float32)


def f16_layout(x: np.ndarray) -> np.ndarray:
    """The bytes of libggml_ciq's f16 activation layout: f16 values, padding to 256 B, float scales."""
    xh, scale = convert_f16(x)
    body = xh.reshape(-1).view(np.uint8)
    pad = np.zeros(-body.size % 256, np.uint8)
    return np.concatenate([body, pad, scale.view(np.uint8)])


def dequantize_f16(weight_type: int, data, rows: int, k: int) -> np.ndarray:
    """f16 semantics' weights, one rounding each: Q4_K and Q5_K fma(q, half(d*sc), -half(dmin*m)), Q6_K
    (q-32)*half(d*sc); Q4_0 / Q5_0 / Q8_0 q*d (q their signed values, d the block's fp16 scale: the product is exact
    before the rounding); Q4_1 / Q5_1 fma(q, d, m)."""
    if weight_type in (Q4_0, Q5_0, Q8_0):
        q, d = q32_fields(weight_type, data, rows, k)
        return (d.astype(np.float64)[..., None] * q).astype(np.float16).reshape(rows, k)
    if weight_type in Q32_1_TYPES:  # fma(q, d, m): q*d + m is exact in float64 (its bits lie within 2^-24 .. 2^21)
        q, d, m = q32_1_fields(weight_type, data, rows, k)
        return (d.astype(np.float64)[..., None] * q + m.astype(np.float64)[..., None]).astype(np.float16).reshape(rows, k)
    if weight_type in (Q4_K, Q5_K):  # Q5_K: MMQ's Q4_K formula (vec_dot_q8_1_q8_1_mma) on its 0..31 quants
        d, dmin, sc, m, q = (q4_K_fields(data, rows, k) if weight_type == Q4_K
                             else q5_K_fields(_blocks(data, Q5_K, rows, k), rows, k))
        a = (d[..., None] * sc.astype(np.float32)).astype(np.float16).astype(np.float64)
        b = (dmin[..., None] * m.astype(np.float32)).astype(np.float16).astype(np.float64)
        return (a[..., None] * q - b[..., None]).astype(np.float16).reshape(rows, k)
    if weight_type == Q6_K:
        d, sc, q = q6_K_fields(data, rows, k)
        s = (d[..., None] * sc.astype(np.float32)).astype(np.float16).astype(np.float64)
        return (s[..., None] * q.reshape(rows, -1, 16, 16)).astype(np.float16).reshape(rows, k)
    raise UnsupportedTypeError(f"f16 semantics cover Q4_K, Q5_K, Q6_K, Q4_0, Q5_0, Q8_0, Q4_1 and Q5_1, "
                               f"not {type_name(weight_type)}")


def gemm_f16_semantics(weight_type: int, data, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """The wgmma kernel's semantics: f16 activations and weights (see convert_f16, dequantize_f16), exact sums."""
    xh, scale = convert_f16(x)
    w = dequantize_f16(weight_type, data, rows, k).astype(np.float64)
    return (xh.astype(np.float64) @ w.T) * scale.astype(np.float64)[:, None]


def gemm_f64(weight_type: int, data, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """The truth: ggml-dequantized weights times the float activations, in float64."""
    w = dequantize(weight_type, data, rows, k).astype(np.float64)
    return np.asarray(x, dtype=np.float64) @ w.T


def nmse(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 22) -> float:
    """sum((a-b)^2) / sum(b^2), in float64 (chunk values at a time: logits of thousands of positions are GiBs);
    inf when a has non-finite values."""
    a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    num = den = 0.0
    for s in range(0, max(a.size, b.size), chunk):
        x, y = a[s:s + chunk].astype(np.float64), b[s:s + chunk].astype(np.float64)
        if not np.all(np.isfinite(x)):
            return float("inf")
        num, den = num + float(np.sum((x - y) ** 2)), den + float(np.sum(y * y))
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


REFERENCE_GEMMS = {"cpu": gemm_cpu_semantics, "mmq": gemm_mmq_semantics, "f16": gemm_f16_semantics, "f64": gemm_f64}


# ----------------------------------------------------------------------------------------------
# MMVQ: llama.cpp CUDA's mul_mat_vec_q, the kernel it runs for 1..8 activation columns (docs/SEMANTICS.md "mmvq").
# Float32 throughout, in the kernel's own association (read from the SASS of ggml-cuda/mmvq.cu at 0c1e570 built
# for sm_90a with -use_fast_math): every product-then-add is one fused multiply-add where nvcc fuses it.

Q8_1_DTYPE = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)])  # ggml block_q8_1: half2 ds {d, sum}, qs
MMVQ_MAX_TOKENS = 8  # MMVQ_MAX_BATCH_SIZE
MMVQ_TYPES = (Q4_0, Q5_0, Q8_0, Q4_K, Q6_K, Q4_1, Q5_1, Q5_K)
Q8_1_INV_127 = np.float32(1.0 / 127.0)  # nvcc folds amax / 127.0f into amax * this under -use_fast_math


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_q8_1 (MMVQ's activations): [tokens, K/32] block_q8_1 records (36 B each).

    Per 32 values: amax = max|x|, d = amax * f32(1/127), q = roundf(x * (1/d)) (0 when amax is 0), sum by the warp's
    xor butterfly (offsets 16, 8, 4, 2, 1), ds = half2(d, sum) rounded to nearest even. The GPU's 1/d is
    rcp.approx.ftz (llama.cpp's fast math): q can differ by one at a rounding tie; GPU kernels are checked on the
    GPU's own bytes."""
    x = _check_activations(x, 32)
    tokens, k = x.shape
    xb = x.reshape(tokens, k // 32, 32)
    amax = np.abs(xb).max(-1)
    d = amax * Q8_1_INV_127
    with np.errstate(divide="ignore", invalid="ignore"):
        q = _round_half_away(xb * (np.float32(1.0) / d)[..., None])
    q = np.where(amax[..., None] > 0, q, 0).astype(np.int8)
    s = xb
    for offset in (16, 8, 4, 2, 1):
        s = s[..., :offset] + s[..., offset:2 * offset]
    out = np.empty((tokens, k // 32), Q8_1_DTYPE)
    out["qs"] = q
    with np.errstate(over="ignore"):  # sums beyond fp16 range become inf, as on the GPU
        out["d"], out["s"] = d.astype(np.float16), s[..., 0].astype(np.float16)
    return out


def mmvq_warps(tokens: int) -> int:
    """Warps per CTA of llama.cpp's mul_mat_vec_q for this many columns (calc_nwarps, the generic NVIDIA table that
    Ampere, Ada, Hopper and Blackwell use): 4 up to 4 columns, 2 up to 8. They set which thread sums which blocks."""
    if not 1 <= tokens <= MMVQ_MAX_TOKENS:
        raise ShapeError(f"MMVQ runs 1..{MMVQ_MAX_TOKENS} tokens, got {tokens}")
    return 4 if tokens <= 4 else 2


def _fma32(a, b, c) -> np.ndarray:
    """float32 fma(a, b, c), correctly rounded: a*b is exact in float64; the sum is rounded to odd (TwoSum's error
    decides), which makes the final rounding to float32 exact."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    fix = (err != 0) & ((s.view(np.int64) & 1) == 0)
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _q8_1_fields(xq: np.ndarray, k: int):
    xq = np.asarray(xq)
    if xq.dtype != Q8_1_DTYPE:
        xq = np.ascontiguousarray(xq).view(np.uint8).view(Q8_1_DTYPE)
    xq = xq.reshape(-1, k // 32)
    return xq["qs"].astype(np.int32), xq["d"].astype(np.float32), xq["s"].astype(np.float32)


def _half_products(dw, mw, d8, s8):
    """MMVQ's Q4_1/Q5_1 scale products, [rows, tokens, blocks] float32: half(d_w*d8) and half(m_w*s8), as __hmul2 (the
    products of two fp16 values are exact in float32; one rounding to fp16, inf beyond its range)."""
    with np.errstate(over="ignore"):
        d4d8 = (dw[:, None, :] * d8[None]).astype(np.float16).astype(np.float32)
        m4s8 = (mw[:, None, :] * s8[None]).astype(np.float16).astype(np.float32)
    return d4d8, m4s8


def _q45_K_fields(weight_type: int, data, rows: int, k: int):
    """(d, dmin, sc, m, q [rows, nb, 8, 32]) of Q4_K (quants 0..15) or Q5_K (0..31) data."""
    if weight_type == Q4_K:
        return q4_K_fields(data, rows, k)
    return q5_K_fields(_blocks(data, Q5_K, rows, k), rows, k)


def _mmvq_partials(weight_type: int, data, rows: int, k: int, q8, d8, s8, r0: int, r1: int):
    """Each thread's contribution per 256- or 32-value block for rows r0..r1: (tpb, op, a, b) with arrays
    [rows, tokens, blocks, tpb]; op "fma": the thread adds fma(a, b, acc), "add": acc + a (b None)."""
    tokens = q8.shape[0]
    if weight_type in Q32_TYPES:
        qw, dw = q32_fields(weight_type, data, rows, k)
        qw, dw = qw[r0:r1].astype(np.int32), dw[r0:r1]
        nb = k // 32
        xv = q8.reshape(1, tokens, nb, 32)
        if weight_type == Q8_0:  # 4 threads per block, 8 values each; acc = fma(d_w*d8, float(isum), acc)
            isum = (qw.reshape(-1, 1, nb, 4, 8) * xv.reshape(1, tokens, nb, 4, 8)).sum(-1)
            a = dw[:, None, :, None] * d8[None, :, :, None]
            return 4, "fma", np.broadcast_to(a, isum.shape), isum.astype(np.float32)
        # Q4_0 / Q5_0: 2 threads per block, values 8s..8s+7 and 16+8s..16+8s+7, raw quants (q+8, q+16);
        # inner = fma(d8, float(isum), -c*s8) with c = 4 (Q4_0) or 8 (Q5_0) per thread, acc = fma(d_w, inner, acc)
        raw = qw + (8 if weight_type == Q4_0 else 16)
        isum = (raw.reshape(-1, 1, nb, 2, 2, 8) * xv.reshape(1, tokens, nb, 2, 2, 8)).sum((-1, -3))
        c = np.float32(-4.0 if weight_type == Q4_0 else -8.0)
        inner = _fma32(d8[None, :, :, None], isum.astype(np.float32), (s8 * c)[None, :, :, None])
        return 2, "fma", np.broadcast_to(dw[:, None, :, None], inner.shape), inner
    if weight_type in Q32_1_TYPES:
        # Q4_1 / Q5_1: 2 threads per block, the values of Q4_0's split (quants 0..15 / 0..31); the fp16 products
        # d4d8 = half(d_w*d8), m4s8 = half(m_w*s8) (__hmul2); r = fma(d4d8, float(isum), m4s8/2) (each of the two
        # threads adds half the offset term), acc = acc + r.
        qw, dw, mw = q32_1_fields(weight_type, data, rows, k)
        qw, dw, mw = qw[r0:r1].astype(np.int32), dw[r0:r1], mw[r0:r1]
        nb = k // 32
        isum = (qw.reshape(-1, 1, nb, 2, 2, 8) * q8.reshape(1, tokens, nb, 2, 2, 8)).sum((-1, -3))
        d4d8, m4s8 = _half_products(dw, mw, d8, s8)
        r = _fma32(d4d8[..., None], isum.astype(np.float32), (m4s8 * np.float32(0.5))[..., None])
        return 2, "add", r, None
    nb = k // QK_K
    if weight_type in (Q4_K, Q5_K):
        # 16 threads per super-block: thread s = 4c + l takes sub-blocks 2c, 2c+1 at positions 4l..4l+3 and
        # 16+4l..16+4l+3. sumf_d = fma(d8_1, sc_1*dot_1, d8_0*(sc_0*dot_0)), sumf_m likewise with m and the q8
        # sums; r = fma(sumf_d, d, -(sumf_m*dmin)); acc = acc + r.
        # Q5_K: the same split and arithmetic (vec_dot_q5_K_q8_1_impl_vmmq) on its 0..31 quants.
        d, dmin, sc, m, q = _q45_K_fields(weight_type, data, rows, k)
        d, dmin, sc, m, q = d[r0:r1], dmin[r0:r1], sc[r0:r1], m[r0:r1], q[r0:r1]
        qs = q.reshape(-1, 1, nb, 4, 2, 2, 4, 4)                      # [r, ., kb, c, i, hh, l, b]
        xs = q8.reshape(1, tokens, nb, 4, 2, 2, 4, 4)
        dot1 = (qs * xs).sum((-1, -3))                               # [r, t, kb, c, i, l]
        dot2 = xs.sum((-1, -3))                                      # [1, t, kb, c, i, l]
        scr = sc.reshape(-1, 1, nb, 4, 2, 1)
        mr = m.reshape(-1, 1, nb, 4, 2, 1)
        d8r = d8.reshape(1, tokens, nb, 4, 2, 1)
        xd = (dot1 * scr).astype(np.float32)
        xm = (dot2 * mr).astype(np.float32)
        sumf_d = _fma32(d8r[..., 1, :], xd[..., 1, :], d8r[..., 0, :] * xd[..., 0, :])   # [r, t, kb, c, l]
        sumf_m = _fma32(d8r[..., 1, :], xm[..., 1, :], d8r[..., 0, :] * xm[..., 0, :])
        dd = d.reshape(-1, 1, nb, 1, 1)
        r = _fma32(sumf_d, dd, -(sumf_m * dmin.reshape(-1, 1, nb, 1, 1)))
        return 16, "add", r.reshape(r.shape[0], tokens, nb, 16), None
    if weight_type == Q6_K:
        # 32 threads per super-block: thread s = 16n + 8h + w takes, for i = 0, 1, the 4 values 128n + 32g + 4w + b
        # with g = h + 2i (q8 block 4n + g, 16-value scale 8n + 2g + w/4). sumf = fma(d8_1, sc_1*dot_1,
        # d8_0*(sc_0*dot_0)); acc = fma(d, sumf, acc).
        d, sc, q = q6_K_fields(data, rows, k)
        d, sc, q = d[r0:r1], sc[r0:r1], q[r0:r1]
        qs = q.reshape(-1, 1, nb, 2, 2, 2, 8, 4)                      # [r, ., kb, n, i, h, w, b]
        xs = q8.reshape(1, tokens, nb, 2, 2, 2, 8, 4)
        dot = (qs * xs).sum(-1)                                      # [r, t, kb, n, i, h, w]
        scr = np.repeat(sc.reshape(-1, 1, nb, 2, 2, 2, 2), 4, axis=-1)  # 16-value sub-block 8n + 4i + 2h + w//4
        x = (dot * scr).astype(np.float32)
        d8r = d8.reshape(1, tokens, nb, 2, 2, 2, 1)                  # q8 block 4n + 2i + h
        sumf = _fma32(d8r[..., 1, :, :], x[..., 1, :, :], d8r[..., 0, :, :] * x[..., 0, :, :])  # [r, t, kb, n, h, w]
        sumf = sumf.reshape(sumf.shape[0], tokens, nb, 32)
        return 32, "fma", np.broadcast_to(d.reshape(-1, 1, nb, 1), sumf.shape), sumf
    raise UnsupportedTypeError(f"MMVQ is defined here for {', '.join(TYPE_NAMES[t] for t in MMVQ_TYPES)}, "
                               f"not {type_name(weight_type)}")


def gemm_mmvq_semantics_quantized(weight_type: int, data, rows: int, k: int, xq: np.ndarray) -> np.ndarray:
    """mul_mat_vec_q on quantize_q8_1 records [tokens, K/32]: float32 [tokens, rows], bit for bit the kernel's
    float order (subnormals kept; the GPU flushes them).

    Thread tid of the CTA's nwarps*32 (mmvq_warps) is part s = tid % tpb of blocks tid // tpb + n * (nwarps*32/tpb),
    summed in n order; lane x of warp 0 then adds warps 1.. in order, and the xor butterfly over offsets
    16, 8, 4, 2, 1 sums the lanes."""
    if weight_type not in MMVQ_TYPES:
        raise UnsupportedTypeError(f"MMVQ is defined here for {', '.join(TYPE_NAMES[t] for t in MMVQ_TYPES)}, "
                                   f"not {type_name(weight_type)}")
    row_bytes(weight_type, k)
    q8, d8, s8 = _q8_1_fields(xq, k)
    tokens = q8.shape[0]
    nwarps = mmvq_warps(tokens)
    q8 = q8.reshape(tokens, k)
    out = np.empty((tokens, rows), np.float32)
    row_chunk = max(1, (1 << 22) // (tokens * k))
    for r0 in range(0, rows, row_chunk):
        r1 = min(rows, r0 + row_chunk)
        tpb, op, a, b = _mmvq_partials(weight_type, data, rows, k, q8, d8, s8, r0, r1)
        nb = a.shape[2]
        per_iter = nwarps * 32 // tpb
        steps = -(-nb // per_iter)
        pad = [(0, 0), (0, 0), (0, steps * per_iter - nb), (0, 0)]
        a = np.pad(a, pad).reshape(r1 - r0, tokens, steps, per_iter * tpb)  # thread tid = b0 * tpb + s
        if b is not None:
            b = np.pad(b, pad).reshape(a.shape)
        acc = np.zeros((r1 - r0, tokens, per_iter * tpb), np.float32)
        for n in range(steps):
            acc = _fma32(a[:, :, n], b[:, :, n], acc) if op == "fma" else acc + a[:, :, n]
        acc = acc.reshape(r1 - r0, tokens, nwarps, 32)
        v = acc[:, :, 0]
        for w in range(1, nwarps):
            v = v + acc[:, :, w]
        for offset in (16, 8, 4, 2, 1):
            v = v[..., :offset] + v[..., offset:2 * offset]
        out[:, r0:r1] = v[..., 0].T
    return out


def gemm_mmvq_semantics(weight_type: int, data, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """llama.cpp CUDA MMVQ semantics (1..8 tokens): quantize_q8_1, then mul_mat_vec_q's arithmetic."""
    return gemm_mmvq_semantics_quantized(weight_type, data, rows, k, quantize_q8_1(x))


REFERENCE_GEMMS["mmvq"] = gemm_mmvq_semantics  # the registry's mmvq variant (1..8 tokens)


def gemm_mmvq_exact(weight_type: int, data, rows: int, k: int, xq: np.ndarray) -> np.ndarray:
    """MMVQ's formula on the same q8_1 bytes with every float step exact (float64; only the order of additions
    differs from the kernel): K-quants d*Σ_j sc_j*d8_j*Σq*q8 - dmin*Σ_j m_j*d8_j*Σq8 (Q6_K without the min term);
    Q4_0/Q5_0 d_w*(d8*Σ raw*q8 - c*s8) with raw = q+8 (c = 8) or q+16 (c = 16); Q8_0 d_w*d8*Σq*q8; Q4_1/Q5_1
    Σ half(d_w*d8)*Σq*q8 + half(m_w*s8) (the fp16 products are MMVQ's formula, not its order)."""
    q8, d8, s8 = _q8_1_fields(xq, k)
    tokens = q8.shape[0]
    q8 = q8.reshape(tokens, k).astype(np.float64)
    d8, s8 = d8.astype(np.float64), s8.astype(np.float64)
    xf = np.repeat(d8, 32, axis=1) * q8
    if weight_type in Q32_TYPES:
        qw, dw = q32_fields(weight_type, data, rows, k)
        if weight_type == Q8_0:
            return xf @ (dw.astype(np.float64)[..., None] * qw).reshape(rows, k).T
        off = 8 if weight_type == Q4_0 else 16
        raw = (qw.astype(np.float64) + off) * dw.astype(np.float64)[..., None]
        return xf @ raw.reshape(rows, k).T - off * (s8 @ dw.astype(np.float64).T)
    if weight_type in Q32_1_TYPES:
        qw, dw, mw = q32_1_fields(weight_type, data, rows, k)
        d4d8, m4s8 = _half_products(dw, mw, d8.astype(np.float32), s8.astype(np.float32))   # [rows, tokens, blocks]
        isum = np.einsum("rbj,tbj->trb", qw.astype(np.float64), q8.reshape(tokens, -1, 32))
        return (np.einsum("trb,rtb->tr", isum, d4d8.astype(np.float64))
                + m4s8.astype(np.float64).sum(-1).T)
    if weight_type in (Q4_K, Q5_K):
        d, dmin, sc, m, q = _q45_K_fields(weight_type, data, rows, k)
        wf = (d.astype(np.float64)[..., None, None] * sc[..., None] * q).reshape(rows, k)
        qsum = (d8 * q8.reshape(tokens, -1, 32).sum(-1))                 # [tokens, K/32]
        return xf @ wf.T - qsum @ (dmin.astype(np.float64)[..., None] * m).reshape(rows, -1).T
    if weight_type == Q6_K:
        d, sc, q = q6_K_fields(data, rows, k)
        wf = (d.astype(np.float64)[..., None, None] * sc[..., None] * q.reshape(rows, -1, 16, 16)).reshape(rows, k)
        return xf @ wf.T
    raise UnsupportedTypeError(f"MMVQ is defined here for {', '.join(TYPE_NAMES[t] for t in MMVQ_TYPES)}, "
                               f"not {type_name(weight_type)}")


def llamacpp_cuda_uses_mmvq(ggml_type: int, tokens: int, compute_capability: tuple[int, int] = (9, 0)) -> bool:
    """Whether llama.cpp CUDA (0c1e570) multiplies this weight type by `tokens` columns with mul_mat_vec_q
    (ggml_cuda_should_use_mmvq, NVIDIA): <= 8 columns, less for some K-quants on Ada, Orin and RTX 50-class Blackwell."""
    cc = 100 * compute_capability[0] + 10 * compute_capability[1]
    limits = {890: {10: 4, 11: 6},                                   # Ada: Q2_K, Q3_K
              870: {10: 1, 11: 1, Q4_K: 1, Q5_K: 1, Q6_K: 1},         # Orin
              1200: {10: 5, 11: 5, Q4_K: 5, Q5_K: 6, Q6_K: 7},        # Blackwell (RTX 5090)
              1210: {10: 6},                                         # DGX Spark
              700: {10: 4, 11: 6, Q4_K: 5, Q5_K: 6, Q6_K: 7}}         # Volta
    return 1 <= tokens <= limits.get(cc, {}).get(ggml_type, MMVQ_MAX_TOKENS)
