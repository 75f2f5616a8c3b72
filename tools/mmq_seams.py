"""Where our MMQ-semantics GEMMs (`mma` for K-quants, `q32` for Q4_0/Q5_0/Q8_0) and llama.cpp CUDA's MMQ part.

llama.cpp 0c1e570 runs MMQ as stream-k: with 128-row x J-token tiles (J = 128 at 512 tokens) it launches one CTA per
tile when the tiles fill the GPU's waves to >= 90%, else one per SM, and then CTAs split a tile's K range and a fixup
kernel adds the pieces. Since 3f7d5aa our kernels reproduce those seams (mmq_stream_k.cuh): every row should show 0
differing values, split or not (at 5ec6c6e, before, only the unsplit Q8_0/Q5_0/Q4_K ones did). Rows of 1000 take
MMQ's fallback widths; at 200 tokens MMQ's J = 112 (since e0a24c9 `mma` runs 16-token CTAs there); K = 4096 gives
q32 up to 15 earlier segments a tile (its cap is 16). Writes JSON with the device and both commits.

    python tools/mmq_seams.py --json out.json
"""

import argparse
import itertools
import json
import sys

import numpy as np

from ggml_ciq import environment, native
from ggml_ciq import quants as Q
from ggml_ciq.llamacpp import LlamaCpp
from tool_cli import run_main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--tokens", type=int, nargs="+", default=[512, 88, 200])
    return run_main("mmq_seams", p, run, argv)


def run(args) -> int:
    llama = LlamaCpp.load()
    rng = np.random.default_rng(18)
    rows_set = (640, 1000, 2048, 4096, 4224)
    cases = [(Q.Q8_0, "q32", 640), (Q.Q5_0, "q32", 640), (Q.Q8_0, "q32", 4096), (Q.Q4_K, "mma", 2048),
             (Q.Q6_K, "mma", 2048), (Q.Q4_K, "mma", 4096)]
    results = []
    for (ggml_type, variant, k), tokens in itertools.product(cases, args.tokens):
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        for rows in rows_set:
            data = llama.quantize_chunk(ggml_type, (rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
            ours = native.gemm(data, x, variant=variant, device="cuda", semantics="mmq", ggml_type=ggml_type,
                               rows=rows, k=k)
            theirs = llama.mul_mat(ggml_type, data, rows, k, x, device="CUDA0")
            widths = (8, 16, 32, 64, 128) if rows % 128 else (8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128)
            j = min(widths, key=lambda w: (-(-tokens // w), w))
            tiles = -(-rows // 128) * -(-tokens // j)
            waves = -(-tiles // 132)
            split = 100 * tiles // (132 * waves) < 90
            r = {"type": Q.type_name(ggml_type), "variant": variant, "rows": rows, "k": k, "tokens": tokens,
                 "mmq_tiles": tiles, "mmq_splits_k": split, "differing": int(np.count_nonzero(ours != theirs)),
                 "nmse": Q.nmse(ours, theirs)}
            results.append(r)
            print(f"{r['type']:5} {variant:4} {rows:5} x {k} x {tokens:3}: MMQ {tiles:4} tiles, splits K: {str(split):5}  "
                  f"{r['differing']:7} of {ours.size} values differ, NMSE {r['nmse']:.3g}", flush=True)
    with open(args.json, "w") as f:
        json.dump({"results": results, "environment": environment.describe()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
