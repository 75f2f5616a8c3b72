"""Device time of the engine's attention for a Llama-3-8B-shaped prefill: 32 heads over 8 K/V heads, head_dim 128,
micro-batches of 512 tokens at n_past 0, 512, ... (as the engine runs 2048 tokens), CUDA events, median of 5.

Usage: python3 tools/attention_time.py [tokens] [kernel]      (defaults: 2048 mma); prints ms per layer and x32.
"""

import sys

import numpy as np

from ggml_ciq.ops import NativeOps


def main(total: int = 2048, kernel: str = "mma") -> None:
    ops, rng = NativeOps("cuda", attention_kernel=kernel), np.random.default_rng(0)
    heads, heads_kv, d, ubatch = 32, 8, 128, 512
    k = ops.asarray(rng.standard_normal((total, heads_kv, d)).astype(np.float16))
    v = ops.asarray(rng.standard_normal((total, heads_kv, d)).astype(np.float16))
    qs = [ops.asarray(rng.standard_normal((min(ubatch, total - s), heads, d)).astype(np.float32))
          for s in range(0, total, ubatch)]
    runs = []
    for _ in range(6):
        ops.timings.clear()
        with ops.timer("attention"):
            for i, q in enumerate(qs):
                ops.attention(q, k, v, i * ubatch, d ** -0.5, 0)
        ops.settle_timings()
        runs.append(ops.timings["attention"] * 1e3)
    ms = float(np.median(runs[1:]))
    flops = sum(4 * len(q) * (i * ubatch + (len(q) + 1) / 2) * d * heads for i, q in enumerate(qs))
    print(f"attention {kernel}, {total} tokens: {ms:.3f} ms per layer, {32 * ms:.1f} ms for 32 layers, "
          f"{flops / ms * 1e-9:.0f} TFLOP/s (causal FLOPs)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048, sys.argv[2] if len(sys.argv) > 2 else "mma")
