"""Our `mma_llamacpp` attention against llama.cpp CUDA's flash attention, node by node on llama.cpp's own inputs.

llama.cpp CUDA prefills a Gemma (or any) GGUF with flash attention on; every FLASH_ATTN_EXT node's q and K/V cache
views go through ciq_attention on exactly those inputs, and the outputs are compared bit for bit. The stream-k split
llama.cpp uses depends on its flash-attention CTAs per SM: each value in --blocks-per-sm is tried
(GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM). Writes JSON with the device, clocks and both commits.

    python tools/attention_diff.py MODEL.gguf --tokens 512 4096 --json out.json
"""

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

from ggml_ciq import diff, environment
from tool_cli import run_main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--tokens", type=int, nargs="+", default=[512])
    p.add_argument("--blocks-per-sm", type=int, nargs="+", default=[2])
    p.add_argument("--kernel", default="mma_llamacpp")
    p.add_argument("--json", required=True)
    p.add_argument("--save", help="SAVE-TOKENS.npz per token count: the inputs and llama.cpp's output of its first and "
                                  "last node (offline analysis)")
    return run_main("attention_diff", p, run, argv)


def run(args) -> int:
    result = {"model": args.model, "kernel": args.kernel, "runs": [], "environment": environment.describe()}
    for n in args.tokens:
        t0 = time.perf_counter()
        calls = diff.capture_attention(args.model, n)
        captured = time.perf_counter() - t0
        for per_sm in args.blocks_per_sm:
            os.environ["GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM"] = str(per_sm)
            diffs = diff.attention_call_diffs(calls, args.kernel)
            equal = sum(d.differing == 0 for d in diffs)
            worst = max(diffs, key=lambda d: d.nmse)
            print(f"{n} tokens, {per_sm} CTAs/SM: {equal}/{len(diffs)} nodes bit for bit; worst {worst.node} "
                  f"(n_past {worst.n_past}, window {worst.window}): {worst.differing} values differ, NMSE "
                  f"{worst.nmse:.3g}, max |d| {worst.max_abs:.3g}  (capture {captured:.0f} s)", flush=True)
            result["runs"].append({"tokens": n, "blocks_per_sm": per_sm, "nodes": len(diffs), "bit_exact_nodes": equal,
                                   "calls": [asdict(d) for d in diffs]})
        if args.save:
            import numpy as np

            keep = {}
            for tag, c in (("first", calls[0]), ("last", calls[-1])):
                keep.update({f"{tag}_{k}": getattr(c, k) for k in ("q", "k", "v", "out")})
                keep[f"{tag}_meta"] = np.array([c.n_past, c.window, c.scale], np.float64)
            np.savez_compressed(f"{args.save}-{n}.npz", **keep)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
