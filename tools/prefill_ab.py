"""A/B of two engine configurations on one model in one process: prefill tokens/s, alternating runs, medians.

Usage: python3 tools/prefill_ab.py MODEL TOKENS [--json OUT]
Compares the fast semantics as shipped (Q4_0/Q5_0/Q8_0 weights from FAST_Q32_DENSE_FROM values through cuBLAS on a
bf16 copy) against the same ops with every such weight on the q32 kernel (q32_dense_from=None).
"""

import json
import statistics
import sys
import time

import numpy as np

from ggml_ciq import catalog
from ggml_ciq.engine import FAST_Q32_DENSE_FROM, Transformer
from ggml_ciq.environment import describe
from ggml_ciq.model import ModelFile
from ggml_ciq.ops import NativeOps


def main(argv):
    path, tokens = argv[0], int(argv[1])
    model = ModelFile(catalog.resolve_model(path))
    ids = np.random.default_rng(0).integers(3, 20000, tokens)
    configs = {"dense from %d" % FAST_Q32_DENSE_FROM: NativeOps("cuda", q32_dense_from=FAST_Q32_DENSE_FROM),
               "q32 everywhere": NativeOps("cuda")}
    engines = {name: Transformer(model, ops=ops, n_ctx=tokens) for name, ops in configs.items()}
    logits = {name: e.forward(ids, all_logits=True) for name, e in engines.items()}  # warm-up
    seconds = {name: [] for name in engines}
    for _ in range(5):
        for name, e in engines.items():
            e.ops.numpy(e.ops.zeros((1,)))  # idle device
            start = time.perf_counter()
            e.forward(ids, all_logits=True)
            seconds[name].append(time.perf_counter() - start)
    result = {name: {"tokens_per_second": tokens / statistics.median(s), "seconds": s,
                     "memory_bytes": engines[name].ops.memory_bytes()} for name, s in seconds.items()}
    a, b = logits.values()
    result["logits_nmse_between"] = float(((a.astype(np.float64) - b) ** 2).sum() / (b.astype(np.float64) ** 2).sum())
    result.update(model=path, tokens=tokens, environment=describe())
    for name in engines:
        print(f"{name:24s} {result[name]['tokens_per_second']:10.1f} tokens/s  {result[name]['memory_bytes'] / 2**20:8.1f} MiB")
    if "--json" in argv:
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
