"""AttentionOps, the part of NativeOps over the K/V cache: causal GQA attention over float16 caches (the kernel
NativeOps' attention_kernel names: ATTENTION_KERNELS), the cache stores (kv_store) and RoPE with the stores fused
(rope_kv_store)."""

from __future__ import annotations

import numpy as np

from . import native
from .errors import BackendError, InvalidArgumentError, ShapeError
from .native_buffers import DeviceArray


class AttentionOps:
    """attention, kv_store, rope_kv_store, rows_set_f16, rope_rows_set_f16 (a part of NativeOps, ggml_ciq.native_ops)."""

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float, window: int = 0) -> DeviceArray:
        """Causal GQA of q[T, H, D] over f16 caches [C, Hkv, D] holding positions 0..n_past+T-1 -> [T, H*D]."""
        q = self._f32(q, "attention q")
        k_cache, v_cache = self.asarray(k_cache, np.float16), self.asarray(v_cache, np.float16)
        if len(q.shape) != 3 or len(k_cache.shape) != 3 or k_cache.shape != v_cache.shape:
            raise ShapeError(f"attention: q [T, H, D] and equal caches [C, Hkv, D], got {q.shape}, {k_cache.shape}, "
                             f"{v_cache.shape}")
        t, h, d = q.shape
        c, hkv, dk = k_cache.shape
        if dk != d or h % hkv or n_past < 0 or n_past + t > c:
            raise ShapeError(f"attention: q {q.shape} with caches {k_cache.shape} at n_past {n_past}")
        out = self.empty((t, h * d))
        n = self.native
        n.check(n.lib.ciq_attention(self.device, self._attention_kernel_id, self._fp(q),
                                    self._u16(k_cache), self._u16(v_cache), t, h, hkv, d, c, int(n_past), float(scale),
                                    int(window), self._fp(out)))
        return out

    def attention_masked(self, q, k_cache, v_cache, mask, n_kv: int, scale: float) -> DeviceArray:
        """ggml's FLASH_ATTN_EXT (ciq_attention_masked): q[T, H, D] over the first n_kv rows of f16 caches [C, Hkv, D],
        each score scale * q.k + mask[t, p] (f16 [>= T, >= n_kv]; -inf: the key weighs nothing) -> [T, H*D]."""
        q = self._f32(q, "attention q")
        k_cache, v_cache = self.asarray(k_cache, np.float16), self.asarray(v_cache, np.float16)
        mask = self.asarray(mask, np.float16)
        if len(q.shape) != 3 or len(k_cache.shape) != 3 or k_cache.shape != v_cache.shape or len(mask.shape) != 2:
            raise ShapeError(f"attention_masked: q [T, H, D], equal caches [C, Hkv, D] and a mask [T, P], got {q.shape}, "
                             f"{k_cache.shape}, {v_cache.shape}, {mask.shape}")
        t, h, d = q.shape
        c, hkv, dk = k_cache.shape
        if dk != d or h % hkv or not 0 < n_kv <= c or mask.shape[0] < t or mask.shape[1] < n_kv:
            raise ShapeError(f"attention_masked: q {q.shape} with caches {k_cache.shape}, mask {mask.shape}, n_kv {n_kv}")
        out = self.empty((t, h * d))
        n = self.native
        n.check(n.lib.ciq_attention_masked(self.device, self._attention_kernel_id, self._fp(q), self._u16(k_cache),
                                           self._u16(v_cache), self._u16(mask), mask.shape[1], t, h, hkv, d,
                                           int(n_kv), float(scale), self._fp(out)))
        return out

    def rows_set_f16(self, table, ids, x) -> None:
        """table[ids[i], :K] = x[i] rounded to f16 (ggml's SET_ROWS): table f16 [R, >= K], ids int64 [N], x float32 [N, K]."""
        x = self._f32(x, "rows_set_f16 input")
        ids = self.asarray(ids, np.int64)
        if len(table.shape) != 2 or len(x.shape) != 2 or x.shape[1] > table.shape[1] or ids.shape != (x.shape[0],):
            raise ShapeError(f"rows_set_f16: table {table.shape}, ids {ids.shape}, x {x.shape}")
        n = self.native
        n.check(n.lib.ciq_rows_set_f16(self.device, self._fp(x), x.shape[0], x.shape[1],
                                       n.ffi.cast("int64_t *", ids.ptr), self._u16(table), table.shape[0],
                                       table.shape[1]))

    def attention_kernel_name(self, head_dim: int) -> str:
        """The kernel ``attention`` runs for this head_dim on this device."""
        n = self.native
        out = n.ffi.new("ciq_attention_kernel *")
        n.check(n.lib.ciq_attention_resolve(self.device, self._attention_kernel_id, head_dim, out))
        return native.enum_names("ciq_attention_kernel", "CIQ_ATTENTION_")[out[0]]

    def attention_runs(self, head_dim: int) -> bool:
        """Whether ``attention`` runs for this head_dim on this device (attention_kernel_name's question, as a bool)."""
        try:
            self.attention_kernel_name(head_dim)
        except BackendError:  # the kernel does not run it here (CIQ_ERR_UNSUPPORTED)
            return False
        return True

    def kv_store(self, cache, start: int, x) -> None:
        """cache[start:start+T] = x[T, Hkv, D] rounded to f16."""
        x = self._f32(x, "kv_store input")
        self._check_cache(cache, start, x, "kv_store")
        n = self.native
        n.check(n.lib.ciq_kv_store(self.device, self._u16(cache), int(start), self._fp(x), x.shape[0],
                                   x.size // x.shape[0]))

    def rope_kv_store(self, q, k, v, positions, base: float, neox: bool, k_cache, v_cache, start: int) -> DeviceArray:
        """rope(q) returned, rope(k) and v (None: not stored) stored into the caches at row start, in one op
        (ciq_rope_kv_store: one kernel on a GPU in the host order): the values of rope, rope and kv_store."""
        q, k = self._f32(q, "rope input"), self._f32(k, "rope input")
        if len(q.shape) != 3 or len(k.shape) != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
            raise ShapeError(f"rope_kv_store: q {q.shape} and k {k.shape} must be [tokens, heads, head_dim] alike")
        v = None if v is None else self._f32(v, "kv_store input")
        self._check_cache(k_cache, start, k, "rope_kv_store")
        if v is not None:
            if v.shape != k.shape:
                raise ShapeError(f"rope_kv_store: v {v.shape} for k {k.shape}")
            self._check_cache(v_cache, start, v, "rope_kv_store")
        positions = self._positions(positions, q.shape[0], "rope_kv_store")
        out = self.empty(q.shape)
        n = self.native
        n.check(n.lib.ciq_rope_kv_store(self.device, self._op_order_id,
                                        n.lib.CIQ_ROPE_NEOX if neox else n.lib.CIQ_ROPE_NORM, self._fp(q), self._fp(k),
                                        self._fp(v) if v is not None else n.ffi.NULL, self._i32(positions), q.shape[0],
                                        q.shape[1], k.shape[1], q.shape[2], float(base), int(start), self._fp(out),
                                        self._u16(k_cache), self._u16(v_cache) if v is not None else n.ffi.NULL))
        return out

    def rope_rows_set_f16(self, q, k, v, positions, base: float, neox: bool, k_ids, k_table, v_ids=None,
                          v_table=None):
        """The plugin's attention inputs (ciq_rope_rows_set_f16): rope(q) returned (q None: None), rope(k) rounded to f16
        into rows k_ids of k_table [R, >= Hkv*D], v (None: not stored) into rows v_ids of v_table [R, >= v's width]:
        the values of rope, rope, rows_set_f16, rows_set_f16 (one kernel on a GPU, in llama.cpp CUDA's order only)."""
        k = self._f32(k, "rope input")
        q = None if q is None else self._f32(q, "rope input")
        v = None if v is None else self._f32(v, "rows_set_f16 input")
        if len(k.shape) != 3 or (q is not None and (len(q.shape) != 3 or q.shape[0] != k.shape[0] or
                                                    q.shape[2] != k.shape[2])):
            raise ShapeError(f"rope_rows_set_f16: q {None if q is None else q.shape} and k {k.shape} must be "
                             "[tokens, heads, head_dim] alike")
        tokens, heads_kv, head_dim = k.shape
        k_ids = self.asarray(k_ids, np.int64)
        v_ids = None if v is None else self.asarray(v_ids, np.int64)
        if k_ids.shape != (tokens,) or len(k_table.shape) != 2 or k_table.shape[1] < heads_kv * head_dim or (
                v is not None and (len(v.shape) != 2 or v.shape[0] != tokens or v_ids.shape != (tokens,) or
                                   v_table is None or len(v_table.shape) != 2 or v.shape[1] > v_table.shape[1])):
            raise ShapeError(f"rope_rows_set_f16: k {k.shape}, v {None if v is None else v.shape}, ids {k_ids.shape} / "
                             f"{None if v is None else v_ids.shape}, tables {k_table.shape} / "
                             f"{None if v_table is None else v_table.shape}")
        out = None if q is None else self.empty(q.shape)
        n = self.native
        null = n.ffi.NULL
        n.check(n.lib.ciq_rope_rows_set_f16(
            self.device, self._op_order_id, n.lib.CIQ_ROPE_NEOX if neox else n.lib.CIQ_ROPE_NORM,
            self._i32(self._positions(positions, tokens, "rope_rows_set_f16")), tokens, head_dim, float(base),
            null if q is None else self._fp(q), 0 if q is None else q.shape[1], null if q is None else self._fp(out),
            self._fp(k), heads_kv, null if v is None else self._fp(v), 0 if v is None else v.shape[1],
            n.ffi.cast("int64_t *", k_ids.ptr), self._u16(k_table), k_table.shape[0], k_table.shape[1],
            null if v is None else n.ffi.cast("int64_t *", v_ids.ptr), null if v is None else self._u16(v_table),
            0 if v is None else v_table.shape[0], 0 if v is None else v_table.shape[1]))
        return out

    def _check_cache(self, cache, start: int, x, what: str) -> None:
        """A float16 K/V cache of this device that x[T, Hkv, D] fits from row start."""
        if not isinstance(cache, DeviceArray) or cache.dtype != np.float16 or cache.device != self.device:
            raise InvalidArgumentError(f"{what}: the cache must be a float16 DeviceArray on this device")
        if tuple(x.shape[1:]) != tuple(cache.shape[1:]) or start < 0 or start + x.shape[0] > cache.shape[0]:
            raise ShapeError(f"{what}: {x.shape} at row {start} into a {cache.shape} cache")
