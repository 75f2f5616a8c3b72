"""One small tail-shaped run of every GPU kernel (quantizers included), for compute-sanitizer.

Usage: compute-sanitizer --tool memcheck python3 tools/sanitize_case.py [variant ...]
"""

import sys

import numpy as np

from ggml_ciq import native
from ggml_ciq import quants as Q


def main(variants):
    rng = np.random.default_rng(0)
    rows, k = 1000 + 13, 512
    for weight_type, quantize in ((Q.Q4_K, Q.quantize_q4_K), (Q.Q6_K, Q.quantize_q6_K)):
        data = quantize((rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
        for tokens in (1, 17, 131):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            native.quantize_activations(x, "cpu", weight_type, "cuda")
            native.quantize_activations(x, "mmq", weight_type, "cuda")
            native.quantize_activations(x, "f16", weight_type, "cuda")
            for variant in variants:
                sem = native.default_semantics(variant, "cuda")
                out = native.gemm(data, x, variant=variant, device="cuda", semantics=sem, ggml_type=weight_type,
                                  rows=rows, k=k)
                err = Q.nmse(out, Q.REFERENCE_GEMMS[sem](weight_type, data, rows, k, x))
                print(f"{variant:13s} {Q.type_name(weight_type)} tokens={tokens:4d} nmse={err:.2e}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(native.GPU_VARIANTS))
