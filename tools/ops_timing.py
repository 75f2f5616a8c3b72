"""The engine's elementwise and norm ops on the GPU at prefill shapes (Llama-3-8B and Gemma 3 270M, 512 tokens): the
vectorized kernels against the scalar ones they replaced, in one process. The scalar kernels still run where the
vectorized ones do not apply, so each A/B calls the same op twice: on 16-byte-aligned rows (the new kernel) and on
the same values 4 bytes further (the old one); glu_activations against glu then ciq_activations_quantize.

Usage: python3 tools/ops_timing.py [--repeat 50] [--json FILE]
Timing: CUDA events around `repeat` back-to-back calls after 5 warm-up calls, the median of 7 such runs. The 8B's
buffers together exceed the H200's 50 MB of L2, Gemma's fit (as in its prefill); GB/s counts each op's compulsory
reads and writes.
"""

import argparse
import json
import statistics
import sys

import numpy as np

from ggml_ciq import native
from ggml_ciq.bench import _time_gpu_us
from ggml_ciq.errors import CiqError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        print("ops_timing: error: --repeat must be >= 1", file=sys.stderr)
        return 2
    try:
        if native.device_count() == 0:
            print("ops_timing: error: no CUDA device (or libggml_ciq built without CUDA)", file=sys.stderr)
            return 2
        rows = run(args.repeat)
    except CiqError as exc:
        print(f"ops_timing: error: {exc}", file=sys.stderr)
        return 2
    print(f"{'op':44s} {'shape':>14s} {'us':>9s} {'GB/s':>7s}")
    for r in rows:
        print(f"{r['op']:44s} {r['shape']:>14s} {r['us']:9.2f} {r['gb_per_s']:7.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": native.device_name(0), "build": native.build_info(), "repeat": args.repeat,
                       "rows": rows}, f, indent=1)
    return 0


def run(repeat: int) -> list[dict]:
    from ggml_ciq.ops import NativeOps

    ops = NativeOps("cuda")
    n, lib, ffi = ops.native, ops.native.lib, ops.native.ffi
    rng = np.random.default_rng(0)

    def timed(call) -> float:  # bench gemm's timing: events around `repeat` calls, 5 warm-up calls, 7 batches
        return statistics.median(_time_gpu_us(lambda i: call(), repeat, 0, 5, 7))

    def buffer(values: int):  # one extra float: the same values 4 bytes further (a misaligned view)
        return ops.asarray((rng.standard_normal(values + 1) * 2).astype(np.float32))

    def at(a, offset: int):
        return ffi.cast("float *", a.ptr) + offset

    rows = []

    def record(op: str, shape: str, us: float, nbytes: int):
        rows.append({"op": op, "shape": shape, "us": us, "gb_per_s": nbytes / us / 1e3})

    for t, d, what in ((512, 4096, "llama3-8b hidden"), (512, 640, "gemma3 hidden"), (2048, 256, "gemma3 q heads"),
                       (4096, 128, "llama3-8b k heads x8")):
        x, w, out = buffer(t * d), buffer(d), buffer(t * d)
        for offset, kernel in ((0, "vectorized"), (1, "scalar")):
            us = timed(lambda: n.check(lib.ciq_rms_norm(0, lib.CIQ_ORDER_HOST, at(x, offset), at(w, offset), ffi.NULL,
                                                        1e-6, t, d, at(out, offset))))
            record(f"rms_norm {what} ({kernel})", f"{t}x{d}", us, 8 * t * d)
    for t, d, what in ((512, 14336, "llama3-8b ffn"), (512, 2048, "gemma3 ffn")):
        g, u, out = buffer(t * d), buffer(t * d), buffer(t * d)
        for offset, kernel in ((0, "float4"), (1, "scalar")):
            us = timed(lambda: n.check(lib.ciq_glu(0, lib.CIQ_ORDER_HOST, lib.CIQ_GLU_SILU, at(g, offset), at(u, offset),
                                                   t * d, at(out, offset))))
            record(f"glu silu {what} ({kernel})", f"{t}x{d}", us, 12 * t * d)
        act = ops.empty((native.activation_bytes("f16", t, d),), np.uint8)
        us = timed(lambda: native.quantize_into(0, "f16", at(out, 0), act.ptr, t, d))
        record(f"convert_f16 {what}", f"{t}x{d}", us, 6 * t * d)
        us = timed(lambda: n.check(lib.ciq_glu_activations(0, lib.CIQ_ORDER_HOST, lib.CIQ_GLU_SILU, at(g, 0), at(u, 0),
                                                           t, d, lib.CIQ_LAYOUT_F16, act.ptr)))
        record(f"glu_activations f16 {what} (fused)", f"{t}x{d}", us, 10 * t * d)
    for t, d in ((512, 4096),):
        a, b, out = buffer(t * d), buffer(t * d), buffer(t * d)
        for offset, kernel in ((0, "float4"), (1, "scalar")):
            us = timed(lambda: n.check(lib.ciq_add(0, at(a, offset), t * d, at(b, offset), t * d, at(out, offset))))
            record(f"add llama3-8b residual ({kernel})", f"{t}x{d}", us, 12 * t * d)
    for t, heads, hd, what in ((512, 32, 128, "llama3-8b q"), (512, 8, 128, "llama3-8b k"), (512, 4, 256, "gemma3 q")):
        x = buffer(t * heads * hd)
        positions = ops.asarray(np.arange(t, dtype=np.int32))
        us = timed(lambda: n.check(lib.ciq_rope(0, lib.CIQ_ORDER_HOST, lib.CIQ_ROPE_NEOX, at(x, 0),
                                                ffi.cast("int32_t *", positions.ptr), t, heads, hd, 500000.0,
                                                at(x, 0))))
        record(f"rope {what} (in place)", f"{t}x{heads}x{hd}", us, 8 * t * heads * hd)
    return rows


if __name__ == "__main__":
    sys.exit(main())
