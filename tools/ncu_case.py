"""One problem, a few launches of one GPU variant, for Nsight Compute (weights: random blocks, sane scales).

Usage: ncu --kernel-name regex:gemm_wgmma --launch-skip 2 --launch-count 1 python3 tools/ncu_case.py \
           [TYPE ROWS K TOKENS [VARIANT]]       (default: Q4_K 14336 4096 512 wgmma)
"""

import sys

import numpy as np

from ggml_ciq import native
from ggml_ciq import quants as Q


def random_blocks(weight_type: int, rows: int, k: int, rng) -> np.ndarray:
    """Random quant bits; the f16 super-block scales set to 2^-10 so every value is finite."""
    size = Q.BLOCK_LAYOUT[weight_type][1]
    blocks = rng.integers(0, 256, (rows * k // 256, size), dtype=np.uint8)
    d = np.full(1, 2.0 ** -10, np.float16).view(np.uint8)
    offsets = (0, 2) if weight_type == Q.Q4_K else (208,)
    for o in offsets:
        blocks[:, o:o + 2] = d
    return blocks.reshape(-1)


def main(argv):
    name, rows, k, tokens, variant = (argv + ["Q4_K", "14336", "4096", "512", "wgmma"][len(argv):])[:5]
    weight_type = {"Q4_K": Q.Q4_K, "Q6_K": Q.Q6_K}[name]
    rows, k, tokens = int(rows), int(k), int(tokens)
    rng = np.random.default_rng(0)
    data = random_blocks(weight_type, rows, k, rng)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    problem = native.GemmProblem.upload(weight_type, data, rows, k, "cuda")
    for _ in range(4):
        out = problem.run(x, variant=variant)
    print(f"{name} {rows}x{k} tokens={tokens} {variant}: |out| max {np.abs(out).max():.3g}")


if __name__ == "__main__":
    main(sys.argv[1:])
