"""How far each GEMM semantics is from float64 on a model's real activations at small batch (docs/SEMANTICS.md
"mmvq"): llama.cpp CPU prefills a prompt with its eval callback on; for every captured weight mul_mat of an MMVQ type,
the first N tokens' inputs go through the numpy references of mmq (llama.cpp CUDA MMQ, what it runs above 8 tokens),
mmvq (its mul_mat_vec_q, 1..8 tokens), f16 (our wgmma) and cpu, each against the float64 product.
A causal prefill's first N rows are exactly an N-token prefill's rows, so one capture serves every N.

Usage: python tools/mmvq_accuracy.py [MODEL] [--tokens 1,5,8] [--json OUT]
"""

import argparse
import json
import sys

import numpy as np

from ggml_ciq import catalog, quants as Q
from ggml_ciq.compare import TEXT
from ggml_ciq.llama_model import LlamaModel
from ggml_ciq.model import ModelFile

SEMANTICS = ("mmq", "mmvq", "f16", "cpu")


def product(semantics: str, tensor, x: np.ndarray) -> np.ndarray:
    t, raw, rows, k = tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k
    if semantics == "mmvq":
        return Q.gemm_mmvq_semantics(t, raw, rows, k, x) if x.shape[0] <= Q.MMVQ_MAX_TOKENS else None
    if t in Q.Q32_TYPES:  # the 32-block types: mmq as the q32 variant (K a multiple of 128), no f16 or cpu reference
        if semantics != "mmq" or k % 128:
            return None
        return Q.gemm_q32_mmq_quantized(t, raw, rows, k, Q.quantize_q8_1_mmq(x, t),
                                        x.shape[0])
    return Q.REFERENCE_GEMMS[semantics](t, raw, rows, k, x)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="gemma3-270m")
    parser.add_argument("--tokens", default="1,5,8")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    path = catalog.resolve_model(args.model)
    counts = [int(n) for n in args.tokens.split(",")]
    model = ModelFile(path)
    llama = LlamaModel(path, device="cpu")
    try:
        ids = llama.tokenize(TEXT)[:max(counts)]
        with llama.context_for(len(ids), eval_callback=True) as ctx:
            _, capture = ctx.capture(ids)
    finally:
        llama.close()
    rows = []
    for name in capture.mul_mat:
        tensor = model.tensor(name)
        if tensor.ggml_type not in Q.MMVQ_TYPES:
            continue
        x_all = capture.inputs(name)
        for n in counts:
            x = x_all[:n]
            truth = Q.gemm_f64(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k, x)
            row = {"tensor": name, "type": tensor.type_name, "tokens": n}
            for sem in SEMANTICS:
                out = product(sem, tensor, x)
                row[sem] = None if out is None else Q.nmse(out, truth)
            rows.append(row)
            print(f"{name:28s} {tensor.type_name:5s} N={n}: " +
                  " ".join(f"{s}={row[s]:.2e}" if row[s] is not None else f"{s}=-" for s in SEMANTICS), flush=True)
    print("\nworst and median NMSE against float64 per type and token count:")
    for t in sorted({r["type"] for r in rows}):
        for n in counts:
            sel = [r for r in rows if r["type"] == t and r["tokens"] == n]
            cells = []
            for s in SEMANTICS:
                v = [r[s] for r in sel if r[s] is not None]
                cells.append(f"{s} {np.median(v):.1e}/{max(v):.1e}" if v else f"{s} -")
            print(f"  {t:5s} N={n}: " + "  ".join(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": str(path), "tokens": counts, "text": "ggml_ciq.compare.TEXT", "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
