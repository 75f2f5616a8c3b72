"""GemmOps, the part of NativeOps that holds weights and multiplies by them: Weight (a matrix on the device, in its
GGUF blocks or dequantized), load_weight and the stacked weights (stack_weights, stack_glu), linear and its fused
forms (linear_group, linear_glu, glu_linear) over the C API's GEMMs (ciq_gemm, ciq_gemm_plan, ciq_gemm_quantized*),
and get_rows (rows of a weight table, sharing its raw blocks with a tied output weight)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from . import environment, native, quants
from .errors import CiqError, InvalidArgumentError, ShapeError, UnsupportedTypeError
from .model import Tensor
from .native_buffers import DeviceArray

GET_ROWS_TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q4_0, quants.Q5_0, quants.Q8_0, quants.Q4_K,
                  quants.Q5_K, quants.Q6_K, quants.Q4_1, quants.Q5_1)


@dataclass
class Weight:
    """A weight matrix [rows, k] ready for ``linear``: raw Q4_K/Q6_K blocks ("keep-quant"), raw Q4_0/Q5_0/Q8_0
    blocks (GPU, "q32": the q32 variant in MMQ's semantics, or with f16/any semantics whatever the registry picks -
    wgmma on Hopper above 8 tokens), or dequantized once to bf16 (GPU, "bf16") or float32 (CPU, "f32")."""

    name: str
    ggml_type: int
    rows: int
    k: int
    kind: str
    data: DeviceArray
    parts: tuple = ()  # stack_weights: the rows of each stacked matrix, in order (their outputs are returned apart)
    glu: bool = False  # stack_glu: gate's and up's rows interleaved by CIQ_GLU_INTERLEAVE; its GEMM gives their GLU


class GemmOps:
    """get_rows, load_weight, stack_weights, stack_glu, linear, linear_group, linear_glu, glu_linear (a part of
    NativeOps, ggml_ciq.native_ops)."""

    # -- weights -----------------------------------------------------------------------------------------------
    def get_rows(self, tensor: Tensor, ids) -> DeviceArray:
        """Rows ``ids`` of a [rows, k] table dequantized to float32 as llama.cpp's get_rows."""
        if tensor.ggml_type not in GET_ROWS_TYPES:
            raise UnsupportedTypeError(f"{tensor.name}: get_rows of type {tensor.type_name} is not supported")
        if isinstance(ids, DeviceArray):  # int32 ids already on the device (a graph's input): checked by the caller
            ids_dev = self.asarray(ids, np.int32)
            if ids_dev.size == 0:
                raise ShapeError("get_rows: no ids")
            ids = ids_dev
        else:
            ids = np.asarray(ids).reshape(-1)
            if ids.size == 0:
                raise ShapeError("get_rows: no ids")
            if ids.min() < 0 or ids.max() >= tensor.rows:
                raise ShapeError(f"{tensor.name}: row ids must be in [0, {tensor.rows}), got {ids.min()}..{ids.max()}")
            ids_dev = self.asarray(ids, np.int32)
        table = self._raw(tensor)
        out = self.empty((ids.size, tensor.k))
        self.native.check(self.native.lib.ciq_rows_get(self.device, tensor.ggml_type, table.ptr, tensor.rows, tensor.k,
                                                       self._i32(ids_dev), ids.size, self._fp(out)))
        return out

    def _raw(self, tensor: Tensor) -> DeviceArray:
        """The tensor's raw blocks on the device, uploaded once (get_rows and a tied output weight share them)."""
        table = self._tables.get(tensor.name)
        if table is None:
            table = self._tables[tensor.name] = self._upload_raw(tensor)
        return table

    def load_weight(self, tensor: Tensor) -> Weight:
        """Q4_K/Q6_K: raw blocks for the keep-quant GEMM; on a GPU Q4_0/Q5_0/Q8_0 raw blocks where a kernel of these
        ops' semantics multiplies them (_block32_raw); other types dequantized once (bf16 on a GPU, float32 on the
        CPU)."""
        if len(tensor.shape) != 2:
            raise ShapeError(f"{tensor.name}: a weight must be 2-D, got shape {tensor.shape}")
        kind = self._block_kind(tensor)
        if kind == "keep-quant":
            return Weight(tensor.name, tensor.ggml_type, tensor.rows, tensor.k, kind, self._upload_raw(tensor))
        if kind == "q32":
            return Weight(tensor.name, tensor.ggml_type, tensor.rows, tensor.k, kind, self._raw(tensor))
        if tensor.ggml_type not in GET_ROWS_TYPES:
            raise UnsupportedTypeError(f"{tensor.name}: weight type {tensor.type_name} is not supported")
        if self.device < 0:
            return Weight(tensor.name, tensor.ggml_type, tensor.rows, tensor.k, "f32",
                          self.asarray(tensor.dequantize(), np.float32))
        raw = self._upload_raw(tensor)
        dense = self.empty((tensor.rows, tensor.k), np.float16)  # bf16 bits; float16 only sizes the buffer
        self.native.check(self.native.lib.ciq_tensor_dequantize_bf16(self.device, tensor.ggml_type, raw.ptr, tensor.rows,
                                                              tensor.k, dense.ptr))
        del raw
        self.trim()  # the raw blocks are not needed again: no cached copy of them
        return Weight(tensor.name, tensor.ggml_type, tensor.rows, tensor.k, "bf16", dense)

    def _block_kind(self, tensor: Tensor) -> str | None:
        """The Weight kind that keeps this tensor in its GGUF blocks on these ops: "keep-quant" (Q4_K/Q6_K; Q5_K where
        planned), "q32" (Q4_0/Q5_0/Q8_0, Q4_1/Q5_1 on a GPU where _block32_raw), else None (dequantized)."""
        if tensor.is_keep_quant:
            return "keep-quant"
        if tensor.ggml_type == quants.Q5_K and len(tensor.shape) == 2:  # host: cpu semantics; GPU: mma (MMQ's),
            return "keep-quant" if self._planned(tensor, self.semantics) else None  # wgmma (f16, "any" on Hopper)
        if (self.device >= 0 and tensor.ggml_type in quants.Q32_TYPES + quants.Q32_1_TYPES
                and self._block32_raw(tensor)):
            return "q32"
        return None

    def _planned(self, tensor: Tensor, semantics: str) -> bool:
        """Whether the registry has a kernel for this weight in these semantics on this device above the small
        batches (its plan for the prefill's token counts)."""
        try:
            native.plan("auto", self.device, semantics, tensor.ggml_type, tensor.rows, tensor.k,
                        native.variant_info("mmvq").max_tokens + 1)
        except CiqError:
            return False
        return True

    def _block32_raw(self, tensor: Tensor) -> bool:
        """Whether a 32-block weight stays in its blocks on this GPU. f16 semantics: where the registry has a kernel
        for it (wgmma: every 32-block type on Hopper, K a multiple of 64), else (bf16 then) never. mmq semantics: where
        the q32 variant takes it (q32_kernel: every type, any K a multiple of 32, its q8_1-mmq activations
        zero-padded). "any" (the fast path): where wgmma takes it, and Q4_0/Q5_0/Q8_0 at K % 128 == 0 (q32; the
        registry then picks per token count: wgmma above 8 tokens where it runs, q32 at 1..8 and elsewhere); the rest
        in bf16, which measured faster than q32 (q32 0.22x-0.24x MMQ at 8B shapes; SmolLM2-135M Q4_1 prefill 122k t/s
        with bf16 against 69k with q32: bench/results/summary/prefill-smollm2.json)."""
        if self.semantics == "f16":
            return self._planned(tensor, "f16")
        if self.semantics == "any":
            return self._planned(tensor, "f16") or (self.q32_kernel and tensor.ggml_type in quants.Q32_TYPES
                                                     and tensor.k % 128 == 0)
        return self.q32_kernel

    def stack_weights(self, tensors: list[Tensor]) -> Weight | None:
        """One weight of these matrices' rows stacked (q/k/v, gate/up: one GEMM launch, its outputs apart through
        ciq_gemm_quantized_outputs), where these ops fuse (``fuse``) and the tensors are quantized blocks of one type
        and K that our GEMMs read (as load_weight would keep them); None otherwise (load them apart). Its outputs are
        the values of one GEMM over the stacked rows: the same semantics as the matrices apart, but the kernel may
        plan the bigger problem otherwise (wgmma: another split-K, float32 sums in another order)."""
        if not self.fuse or len(tensors) < 2:
            return None
        first = tensors[0]
        if any(len(t.shape) != 2 or t.ggml_type != first.ggml_type or t.k != first.k for t in tensors):
            return None
        kind = self._block_kind(first)
        if kind is None or (kind == "q32" and not self._block32_auto):  # what linear_group (groups) takes
            return None
        data = self._upload_bytes(np.concatenate([np.ascontiguousarray(t.raw()).reshape(-1) for t in tensors]))
        return Weight("+".join(t.name for t in tensors), first.ggml_type, sum(t.rows for t in tensors), first.k, kind,
                      data, tuple(t.rows for t in tensors))

    def stack_glu(self, gate: Tensor, up: Tensor) -> Weight | None:
        """One gate/up weight for linear_glu: their rows interleaved CIQ_GLU_INTERLEAVE at a time (ggml_ciq.h), where
        these ops fuse, the two are of one type, K and row count (a multiple of CIQ_GLU_INTERLEAVE) and kept in blocks
        as stack_weights keeps them; None otherwise (and with GGML_CIQ_FUSE_GLU=0: the GLU then fused into down's
        activation conversion, glu_linear)."""
        if not self.fuse or not environment.switch("GGML_CIQ_FUSE_GLU") or len(gate.shape) != 2 or len(up.shape) != 2:
            return None
        block = self.native.lib.CIQ_GLU_INTERLEAVE
        if (gate.ggml_type, gate.k, gate.rows) != (up.ggml_type, up.k, up.rows) or gate.rows % block:
            return None
        kind = self._block_kind(gate)
        if kind is None or (kind == "q32" and not self._block32_auto):  # what linear_group (groups) takes
            return None
        g = np.ascontiguousarray(gate.raw()).reshape(gate.rows // block, -1)
        u = np.ascontiguousarray(up.raw()).reshape(up.rows // block, -1)
        data = self._upload_bytes(np.stack([g, u], axis=1))
        return Weight(f"{gate.name}+{up.name} (glu)", gate.ggml_type, 2 * gate.rows, gate.k, kind, data, glu=True)

    # -- GEMMs -------------------------------------------------------------------------------------------------
    def linear(self, weight: Weight, x, add=None) -> DeviceArray:
        """x[n, k] @ W^T (+ add [n, rows]: add()'s values; from the GEMM's epilogue where the kernel fuses it) ->
        [n, rows] float32. A stacked weight (stack_weights) goes through linear_group."""
        x = self._f32(x, "linear input")
        if x.shape[-1] != weight.k:
            raise ShapeError(f"{weight.name}: input rows of {x.shape[-1]} values, the weight takes {weight.k}")
        if weight.parts:
            raise InvalidArgumentError(f"{weight.name}: a stacked weight's outputs come from linear_group")
        if weight.glu:
            raise InvalidArgumentError(f"{weight.name}: a gate/up weight interleaved for its GLU goes through linear_glu")
        tokens = x.size // weight.k
        if add is not None:  # from the epilogue where linear_group takes the weight; else the GEMM, then the add
            if self.groups([weight]):
                return self.linear_group([weight], x, adds=[add])[0]
            return self.add(self.linear(weight, x), add)
        out = self.empty((tokens, weight.rows))
        n = self.native
        if weight.kind in ("keep-quant", "q32"):
            variant, semantics = self._kernel(weight, tokens)
            n.check(n.lib.ciq_gemm(self.device, variant, semantics, weight.ggml_type, weight.data.ptr,
                                   weight.data.nbytes, weight.rows, weight.k, self._fp(x), tokens, out.ptr,
                                   n.lib.CIQ_OUT_F32))
        elif weight.kind == "bf16":
            scratch = self._bf16(tokens * weight.k)
            n.check(n.lib.ciq_values_convert_bf16(self.device, self._fp(x), tokens * weight.k, scratch.ptr))
            n.check(n.lib.ciq_gemm_dense_bf16(self.device, weight.data.ptr, weight.rows, weight.k, scratch.ptr, tokens,
                                              out.ptr, n.lib.CIQ_OUT_F32))
        else:  # CPU float32: the buffers are host memory
            dense = self._host_view(weight.data)
            np.matmul(self._host_view(x).reshape(tokens, weight.k), dense.T, out=self._host_view(out))
        return out

    def groups(self, weights: list[Weight]) -> bool:
        """Whether linear_group takes these weights: blocks our GEMMs read (keep-quant, and 32-block ones unless in
        MMQ's semantics, where the engine keeps llama.cpp's one quantization per GEMM), all of one K."""
        kinds = ("keep-quant", "q32") if self._block32_auto else ("keep-quant",)
        return all(w.kind in kinds and w.k == weights[0].k for w in weights)

    def linear_group(self, weights: list[Weight], x, norm: tuple | None = None, adds: list | None = None,
                     glu: tuple | None = None) -> list[DeviceArray]:
        """``linear`` of several quantized weights on one input x[n, k] (``groups``): each GEMM is planned once
        (ciq_gemm_plan), x is quantized (or converted) once per activation layout the plans name
        (ciq_activations_quantize), then each GEMM runs its plan on those bytes (ciq_gemm_quantized): the same
        kernels and bytes as separate ``linear`` calls. A stacked weight (stack_weights) gives one output per part.
        norm (weight, eps): the inputs are rms_norm(x) * weight, with the norm fused into the f16 conversion where
        the ops fuse (ciq_rms_norm_activations: the same bytes); glu (up, kind): the inputs are glu(x, up, kind), fused
        into a GPU's f16 conversion in the host order (ciq_glu_activations: the same bytes); adds: per weight None or
        its addend (linear's add). Two or three weights without addends go through ciq_gemm_quantized_group (one launch
        where wgmma groups them: q+k Q4_K beside v Q6_K, or q, k and v apart; its one plan may split K otherwise than
        the weights apart)."""
        x = self._f32(x, "linear input")
        if not self.groups(weights) or x.shape[-1] != weights[0].k:
            raise ShapeError("linear_group: quantized weights of one K (groups()), and inputs of that K")
        if any(w.glu for w in weights):
            raise InvalidArgumentError("linear_group: a gate/up weight interleaved for its GLU goes through linear_glu")
        k = weights[0].k
        tokens = x.size // k
        plans = [self._plan(w, tokens) for w in weights]
        layouts = self._activations(plans, x, tokens, k, norm, glu)
        adds = adds or [None] * len(weights)
        if len(adds) != len(weights):
            raise ShapeError(f"linear_group: {len(adds)} addends for {len(weights)} weights")
        if 2 <= len(weights) <= 3 and adds == [None] * len(weights) and \
                all(p.activation_layout == plans[0].activation_layout for p in plans):
            return self._gemm_group(weights, plans, layouts[plans[0].activation_layout], tokens)
        outs = []
        for w, plan, add in zip(weights, plans, adds):
            outs += self._gemm_planned(w, plan, layouts[plan.activation_layout], tokens, add)
        return outs

    def linear_glu(self, weight: Weight, x, kind: str, norm: tuple | None = None) -> DeviceArray:
        """glu(gate(x'), up(x'), kind) [n, rows/2] float32 of a stack_glu weight, x' = rms_norm(x) * norm[0] where
        norm (weight, eps) is given (fused as linear_group fuses it): ciq_gemm_quantized_glu, the GLU from wgmma's
        epilogue (no gate/up product in memory); the values of the GEMM, its halves apart, then glu."""
        if not weight.glu:
            raise InvalidArgumentError(f"{weight.name}: linear_glu takes a gate/up weight from stack_glu")
        n, plan, activations, tokens, glu_kind, out = self._glu_call(weight, x, kind, norm, weight.rows // 2)
        n.check(n.lib.ciq_gemm_quantized_glu(self.device, plan, weight.ggml_type, weight.data.ptr, weight.data.nbytes,
                                             weight.rows, weight.k, activations.ptr, tokens, glu_kind, self._fp(out)))
        return out

    def linear_glu_pair(self, gate: Weight, up: Weight, x, kind: str, norm: tuple | None = None) -> DeviceArray:
        """glu(gate(x'), up(x'), kind) [n, rows] float32 of two plain weights of one type and shape (llama.cpp's
        ffn_gate and ffn_up as they are): ciq_gemm_quantized_glu_pair, the GLU from wgmma's epilogue where both are
        staged by TMA and rows % 64 == 0 (linear_glu's values for stack_glu of the two), else the two GEMMs then glu."""
        if gate.glu or up.glu or gate.parts or up.parts or gate.ggml_type != up.ggml_type or \
                (gate.rows, gate.k) != (up.rows, up.k) or not self.groups([gate, up]):
            raise InvalidArgumentError(f"{gate.name}, {up.name}: linear_glu_pair takes two plain quantized weights of "
                                       "one type and shape")
        n, plan, activations, tokens, glu_kind, out = self._glu_call(gate, x, kind, norm, gate.rows)
        n.check(n.lib.ciq_gemm_quantized_glu_pair(self.device, plan, gate.ggml_type, gate.data.ptr, up.data.ptr,
                                                  gate.data.nbytes, gate.rows, gate.k, activations.ptr, tokens,
                                                  glu_kind, self._fp(out)))
        return out

    def _glu_call(self, weight: Weight, x, kind: str, norm, width: int) -> tuple:
        """What linear_glu and linear_glu_pair pass the library: its handle, weight's plan, x (normed where norm is
        given) in that plan's layout, the token count, the ciq_glu_kind, and a [tokens, width] float32 output."""
        if kind not in ("silu", "gelu"):
            raise InvalidArgumentError(f"glu: unknown kind {kind!r} (silu or gelu)")
        x = self._f32(x, "linear input")
        if x.shape[-1] != weight.k:
            raise ShapeError(f"{weight.name}: input rows of {x.shape[-1]} values, the weight takes {weight.k}")
        n, k = self.native, weight.k
        tokens = x.size // k
        plan = self._plan(weight, tokens)
        activations = self._activations([plan], x, tokens, k, norm)[plan.activation_layout]
        glu_kind = n.lib.CIQ_GLU_SILU if kind == "silu" else n.lib.CIQ_GLU_GELU
        return n, plan, activations, tokens, glu_kind, self.empty((tokens, width))

    def glu_linear(self, weight: Weight, gate, up, kind: str, op_class: str | None = None,
                   add=None) -> DeviceArray:
        """linear(weight, glu(gate, up, kind), add), the same values: where the weight's GEMM reads the f16 layout on
        a GPU and the GLU follows the host order, the GLU is fused into that conversion (ciq_glu_activations: one
        kernel fewer and no float32 intermediate); elsewhere the two ops in turn. op_class: the timer class of the
        GEMM (with the GLU where fused into it; the GLU apart is left out of it, as an op of its own)."""
        timer = self.timer(op_class) if op_class else contextlib.nullcontext()
        gate, up, _ = self._glu_inputs(gate, up, kind)
        if self.device >= 0 and self.op_order == "host" and gate.shape[-1] == weight.k and self.groups([weight]):
            with timer:  # linear_group's glu prologue: fused where the plan reads the f16 layout
                return self.linear_group([weight], gate, glu=(up, kind), adds=[add])[0]
        h = self.glu(gate, up, kind)
        with timer:
            return self.linear(weight, h, add)

    # -- plans, activation layouts, outputs --------------------------------------------------------------------
    def _kernel(self, weight: Weight, tokens: int) -> tuple[int, int]:
        """(variant, semantics) ids of a quantized weight's GEMM at this token count."""
        lib = self.native.lib
        if (self._compute_capability and weight.ggml_type in quants.MMVQ_TYPES
                and quants.llamacpp_cuda_uses_mmvq(weight.ggml_type, tokens, self._compute_capability)):
            return lib.CIQ_VARIANT_MMVQ, lib.CIQ_SEMANTICS_MMVQ
        if weight.kind == "q32" and not self._block32_auto:  # llama.cpp CUDA MMQ's semantics
            return lib.CIQ_VARIANT_Q32, lib.CIQ_SEMANTICS_MMQ
        return lib.CIQ_VARIANT_AUTO, self._semantics_id

    def _plan(self, weight: Weight, tokens: int):
        """The ciq_plan of a quantized weight's GEMM at this token count (_kernel's variant and semantics)."""
        n = self.native
        plan = n.ffi.new("ciq_plan *")
        n.check(n.lib.ciq_gemm_plan(self.device, *self._kernel(weight, tokens), weight.ggml_type, weight.rows,
                                    weight.k, tokens, plan))
        return plan

    def _activations(self, plans, x: DeviceArray, tokens: int, k: int, norm: tuple | None = None,
                     glu: tuple | None = None) -> dict:
        """{layout: x quantized (or converted) into it} for the plans' layouts (linear_group's prologues: norm, glu)."""
        n = self.native
        norm_w = self._norm_weight(norm[0], k) if norm is not None else None
        f16_gpu = self.device >= 0 and self.op_order == "host"
        layouts, source = {}, None
        for plan in plans:
            layout = plan.activation_layout
            if layout in layouts:
                continue
            buf = layouts[layout] = self.empty((plan.activation_bytes,), np.uint8)
            f16 = layout == n.lib.CIQ_LAYOUT_F16
            # fused prologues: a GPU's f16 conversion (one kernel); the host runs the norm's two in turn for any layout
            if norm is not None and self.fuse and (f16 or self.device < 0):
                n.check(n.lib.ciq_rms_norm_activations(self.device, self._op_order_id, self._fp(x),
                                                       self._fp(norm_w) if norm_w is not None else n.ffi.NULL,
                                                       float(norm[1]), tokens, k, layout, buf.ptr))
                continue
            if glu is not None and f16 and f16_gpu:
                gate, up, kind_id = self._glu_inputs(x, glu[0], glu[1])
                n.check(n.lib.ciq_glu_activations(self.device, self._op_order_id, kind_id, self._fp(gate), self._fp(up),
                                                  tokens, k, layout, buf.ptr))
                continue
            if source is None:  # the prologue apart, once for every other layout
                source = (self.rms_norm(x, norm_w, norm[1]) if norm is not None else
                          self.glu(x, glu[0], glu[1]) if glu is not None else x)
            n.check(n.lib.ciq_activations_quantize(self.device, layout, self._fp(source), buf.ptr, tokens, k))
        return layouts

    def _gemm_planned(self, weight: Weight, plan, activations: DeviceArray, tokens: int,
                      add=None) -> list[DeviceArray]:
        """[tokens, rows] float32 per stacked part (one for a plain weight): the plan's GEMM on activations already
        in its layout (ciq_gemm_quantized), plus add [tokens, rows] where given (a plain weight only; the values of
        add() after it, from wgmma's epilogue: ciq_gemm_quantized_outputs)."""
        n = self.native
        outs = self._outs(weight, tokens)
        if add is not None:
            add = self._f32(add, "linear add")
            if len(outs) > 1 or add.shape != (tokens, weight.rows):
                raise ShapeError(f"{weight.name}: add {add.shape} for an output of {(tokens, weight.rows)}")
        if len(outs) == 1 and add is None:
            n.check(n.lib.ciq_gemm_quantized(self.device, plan, weight.ggml_type, weight.data.ptr, weight.data.nbytes,
                                             weight.rows, weight.k, activations.ptr, tokens, outs[0].ptr,
                                             n.lib.CIQ_OUT_F32))
            return outs
        outputs = self._outputs(outs, add)
        n.check(n.lib.ciq_gemm_quantized_outputs(self.device, plan, weight.ggml_type, weight.data.ptr,
                                                 weight.data.nbytes, weight.rows, weight.k, activations.ptr, tokens,
                                                 outputs, len(outs), n.lib.CIQ_OUT_F32))
        return outs

    def _gemm_group(self, weights: list[Weight], plans, activations: DeviceArray, tokens: int) -> list[DeviceArray]:
        """Two or three weights' GEMMs on the same activations (ciq_gemm_quantized_group: one launch where wgmma
        groups them, e.g. q+k Q4_K beside v Q6_K; else one each): [tokens, rows] float32 per stacked part, in order."""
        n = self.native
        group = n.ffi.new("ciq_gemm_weight[]", len(weights))
        outs, keep = [], []
        for g, w, plan in zip(group, weights, plans):
            mine = self._outs(w, tokens)
            outputs = self._outputs(mine)
            keep.append(outputs)  # the struct's pointers do not keep the arrays alive
            g.plan, g.type, g.weight, g.weight_nbytes, g.rows = plan, w.ggml_type, w.data.ptr, w.data.nbytes, w.rows
            g.outputs, g.n_outputs = outputs, len(mine)
            outs += mine
        n.check(n.lib.ciq_gemm_quantized_group(self.device, group, len(weights), weights[0].k, activations.ptr, tokens,
                                               n.lib.CIQ_OUT_F32))
        return outs

    def _outs(self, weight: Weight, tokens: int) -> list[DeviceArray]:
        """A GEMM's float32 outputs [tokens, rows], one per stacked part (one for a plain weight)."""
        return [self.empty((tokens, rows)) for rows in (weight.parts or (weight.rows,))]

    def _outputs(self, outs: list[DeviceArray], add=None):
        """ciq_gemm_output[] of these [tokens, rows] outputs, each with the addend add (one output) or none."""
        n = self.native
        outputs = n.ffi.new("ciq_gemm_output[]", len(outs))
        for o, out in zip(outputs, outs):
            o.rows, o.out = out.shape[1], out.ptr
            o.add = self._fp(add) if add is not None else n.ffi.NULL
        return outputs

    def _bf16(self, values: int) -> DeviceArray:
        if self._pool.arena is not None:  # a graph keeps its own: the shared one may move before a replay
            return self.empty((values,), np.float16)
        if self._bf16_scratch is None or self._bf16_scratch.size < values:
            self._bf16_scratch = None
            self._bf16_scratch = self.empty((values,), np.float16)
        return self._bf16_scratch
