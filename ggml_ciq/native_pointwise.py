"""PointwiseOps, the part of NativeOps that works on activations row by row: rms_norm (with a fused add), RoPE
(alone and after a per-head rms_norm), GLU, add and scale, each one call of the C API (float order per device and op
order: native/src/cpu/ops.cpp, native/src/cuda/ops.cu)."""

from __future__ import annotations

import numpy as np

from . import native
from .errors import InvalidArgumentError, ShapeError
from .native_buffers import DeviceArray


class PointwiseOps:
    """rms_norm, rope, glu, add, scale (a part of NativeOps, ggml_ciq.native_ops)."""

    # -- norms and RoPE ----------------------------------------------------------------------------------------
    def rms_norm(self, x, weight, eps: float) -> DeviceArray:
        """ggml's rms_norm over the last axis, then * weight (None: no weight)."""
        return self.rms_norm_add(x, weight, eps, None)

    def rms_norm_add(self, x, weight, eps: float, add) -> DeviceArray:
        """rms_norm(x) * weight + add (add of x's shape; None: none) in one op: the add rounds separately in the host
        order, inside one FMA in llama.cpp CUDA's (its fused RMS_NORM + MUL + ADD)."""
        x = self._f32(x, "rms_norm input")
        d = x.shape[-1]
        w = self._norm_weight(weight, d)
        if add is not None:
            add = self._f32(add, "rms_norm add")
            if add.shape != x.shape:
                raise ShapeError(f"rms_norm: add {add.shape} for input {x.shape}")
        out = self.empty(x.shape)
        n = self.native
        n.check(n.lib.ciq_rms_norm(self.device, self._op_order_id, self._fp(x),
                                   self._fp(w) if w is not None else n.ffi.NULL,
                                   self._fp(add) if add is not None else n.ffi.NULL, float(eps), x.size // d, d,
                                   self._fp(out)))
        return out

    def _norm_weight(self, weight, d: int):
        """rms_norm's weight as float32 on this device (None: none), checked against rows of d."""
        if weight is None:
            return None
        w = self._f32(weight, "rms_norm weight")
        if w.size != d:
            raise ShapeError(f"rms_norm: weight of {w.size} values for rows of {d}")
        return w

    def rope(self, x, positions, base: float, neox: bool = False) -> DeviceArray:
        """ggml RoPE (NORM or NEOX) of x[T, H, D] over all D dims at positions[T]."""
        x = self._f32(x, "rope input")
        if len(x.shape) != 3:
            raise ShapeError(f"rope: x must be [tokens, heads, head_dim], got {x.shape}")
        positions = self._positions(positions, x.shape[0], "rope")
        out = self.empty(x.shape)
        n = self.native
        n.check(n.lib.ciq_rope(self.device, self._op_order_id, n.lib.CIQ_ROPE_NEOX if neox else n.lib.CIQ_ROPE_NORM,
                               self._fp(x), self._i32(positions), x.shape[0], x.shape[1], x.shape[2], float(base),
                               self._fp(out)))
        return out

    def rms_norm_rope(self, x, weight, eps: float, positions, base: float, neox: bool = False) -> DeviceArray:
        """rope(rms_norm(x) * weight) of x[T, H, D] (each head's row normed over D) in one op: llama.cpp CUDA fuses
        RMS_NORM + MUL + ROPE into one kernel whose float order is not its separate kernels' (the op order
        llamacpp_cuda follows it); the host order runs rms_norm then rope."""
        x = self._f32(x, "rms_norm_rope input")
        if len(x.shape) != 3:
            raise ShapeError(f"rms_norm_rope: x must be [tokens, heads, head_dim], got {x.shape}")
        t, h, d = x.shape
        w = self._f32(weight, "rms_norm_rope weight")
        if w.size != d:
            raise ShapeError(f"rms_norm_rope: weight of {w.size} values for heads of {d}")
        positions = self._positions(positions, t, "rms_norm_rope")
        out = self.empty(x.shape)
        n = self.native
        n.check(n.lib.ciq_rms_norm_rope(self.device, self._op_order_id,
                                        n.lib.CIQ_ROPE_NEOX if neox else n.lib.CIQ_ROPE_NORM, self._fp(x), self._fp(w),
                                        float(eps), self._i32(positions), t, h, d, float(base), self._fp(out)))
        return out

    def _positions(self, positions, tokens: int, what: str) -> DeviceArray:
        """RoPE positions as int32[tokens] on this device."""
        positions = self.asarray(positions, None if isinstance(positions, DeviceArray) else np.int32)
        if positions.dtype != np.int32 or positions.size != tokens:
            raise ShapeError(f"{what}: positions must be int32[{tokens}], got {positions.dtype}{positions.shape}")
        return positions

    # -- GLU, add, scale ---------------------------------------------------------------------------------------
    def glu(self, gate, up, kind: str) -> DeviceArray:
        """act(gate) * up; kind "silu" or "gelu" (tanh GELU: ggml's fp16 table on the CPU, float on a GPU)."""
        gate, up, kind_id = self._glu_inputs(gate, up, kind)
        out = self.empty(gate.shape)
        native.glu_into(self.device, self._op_order_id, kind_id, self._fp(gate), self._fp(up), self._fp(out), gate.size,
                        gate.shape[-1] if gate.shape else 1)
        return out

    def _glu_inputs(self, gate, up, kind: str):
        """(gate, up as float32 device arrays of one size, the ciq_glu_kind of `kind`)."""
        if kind not in ("silu", "gelu"):
            raise InvalidArgumentError(f"glu: unknown kind {kind!r} (silu or gelu)")
        gate, up = self._f32(gate, "glu gate"), self._f32(up, "glu up")
        self._same_size("glu", gate, up)
        lib = self.native.lib
        return gate, up, lib.CIQ_GLU_SILU if kind == "silu" else lib.CIQ_GLU_GELU

    def add(self, a, b) -> DeviceArray:
        """a + b; b of a's shape, or a row of a's last axis (a bias) added to every row."""
        a, b = self._f32(a, "add input"), self._f32(b, "add input")
        if a.size != b.size and (len(b.shape) != 1 or b.size != a.shape[-1]):
            raise ShapeError(f"add: {b.shape} is neither {a.shape} nor one row of it")
        out = self.empty(a.shape)
        self.native.check(self.native.lib.ciq_add(self.device, self._fp(a), a.size, self._fp(b), b.size, self._fp(out)))
        return out

    def scale(self, x, s: float) -> DeviceArray:
        x = self._f32(x, "scale input")
        out = self.empty(x.shape)
        self.native.check(self.native.lib.ciq_scale(self.device, self._fp(x), float(s), x.size, self._fp(out)))
        return out
