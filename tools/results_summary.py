#!/usr/bin/env python3
"""Write bench/results/summary/<claim>.json: one small summary per STATUS.md claim, read from the archived files.

The raw measurements left the working tree at 41d23b3; this reads them from git, so it
needs no checkout of them:

    python3 tools/results_summary.py            # rewrites bench/results/summary/ (run from the repository root)
    python3 tools/results_summary.py --index    # the table of bench/results/README.md

Each summary keeps the run's device, GPU clocks line, our commit and llama.cpp's, and per source file its figures
(bench rows, compare arms and pairs, test and sanitizer summary lines); `source` names the archived file
(`git show 41d23b3:<path>`). A new claim: add it to CLAIMS with the files behind it.
"""
from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

ARCHIVE = "41d23b3"   # the last commit with the raw files (a tag does not travel with every clone)
H, C = "bench/results/h200/", "bench/results/cpu/"   # paths inside the archive

# claim id -> (the claim, archived files). STATUS.md's rows name these ids.
CLAIMS = {
    "gemm-wgmma-vs-mmq": ("bench gemm: wgmma vs MMQ, llama.cpp in the same process",
                          [H + f"issue16-4a93705/{s}.json" for s in ("llama3-8b-n512", "llama3-8b-n2048", "seed6")]),
    "gemm-tree-vs-4a93705": ("the tree's kernels (9b4011e's) against 4a93705's, alternately, wgmma alone",
                             [H + f"issue16-474f736/lib-ab-4a93705/{s}" for s in (
                                 "seed6-base-r1.json", "seed6-new-r1.json",
                                 "llama3-8b-n512-base-r1.json", "llama3-8b-n512-new-r1.json")]),
    "gemm-test-backend-ops-perf": ("llama.cpp's test-backend-ops perf, 4096 x 512 x 14336, CIQ0 vs CUDA0",
                                   [H + "plugin-0eb01a5/test-backend-ops-perf-ciq0.txt",
                                    H + "plugin-0eb01a5/test-backend-ops-perf-cuda0.txt"]),
    "gemm-rs-vs-ss": ("wgmma's RS form against its SS form, wgmma alone",
                      [H + f"wgmma-rs/bn256-2552d21/llama3-8b-n512-rs{i}.json" for i in (0, 1)]),
    "gemm-streamk": ("wgmma stream-K A/B, wgmma alone",
                     [H + f"gemm-streamk-9c75ce8/llama3-8b-n512-streamk{i}.json" for i in (0, 1)]),
    "gemm-diag": ("where wgmma's time goes (CIQ_WGMMA_DIAG 0/1/2)",
                  [H + f"gemm-streamk-9c75ce8/first-rule-fd020b7/gemm-diag{i}-llama3-8b-n512.json" for i in (0, 1, 2)]),
    "gemm-mma-vs-mmq": ("mma (MMQ semantics) vs MMQ: speed and NMSE",
                        [H + "fusion-7c5ac0a/llama3-8b-n512.json", H + "fusion-7c5ac0a/seed6.json",
                         H + "small-batch-0eb01a5/diff-default-tokens131-vs-llamacpp-cuda.json"]),
    "gemm-mmq-seams": ("MMQ-semantics GEMMs with MMQ's stream-k seams against MMQ", [H + "fidelity-76fd922/mmq-seams.json"]),
    "gemm-mmvq-bits": ("mmvq vs llama.cpp CUDA at 1..8 tokens",
                       [H + f"small-batch-0eb01a5/diff-{m}-tokens{t}-vs-llamacpp-cuda.json"
                        for m in ("default", "gemma3-270m") for t in (1, 8)]),
    "gemm-mmvq-speed": ("mmvq vs llama.cpp's MMVQ, 1 and 8 tokens", [H + "offload-3f4cfb3/offload-mmvq-llama3-8b.json"]),
    "gemm-wgmma-vs-float64": ("wgmma and MMQ against float64, Gemma's tensors",
                              [H + "diff-gemma3-270m-wgmma-vs-llamacpp-cuda.json"]),
    "gemm-mmq-accuracy": ("MMQ / MMVQ / our f16 against float64 on Gemma's real activations",
                          [C + "mmvq-accuracy-gemma3-270m.json"]),
    "gemm-crossover": ("where wgmma starts to beat MMQ",
                       [H + "offload-3f4cfb3/offload-wgmma-llama3-8b.json", H + "offload-3f4cfb3/offload-gemma3-270m.json"]),
    "gemm-q32": ("the GPU q32 kernel vs MMQ", [H + "offload-3f4cfb3/offload-q32-8b-shapes.json",
                                                 H + "offload-3f4cfb3/offload-gemma3-270m.json"]),
    "gemm-output-row": ("Gemma's Q8_0 output row at 1 and 8 tokens", [H + "split-3367ca4/output-row-q8_0.json"]),
    "gemm-wmma": ("the WMMA family vs MMQ", [H + "llama3-8b-n512.json", H + "seed6.json"]),
    "gemm-captured-cpu": ("Q4_K/Q6_K GEMMs on llama.cpp CPU's captured activations", [C + "diff-prompt-gemma3-270m.json"]),
    "gemm-captured-cuda": ("the same on llama.cpp CUDA's", [H + "diff-prompt-gemma3-270m-llamacpp-cuda.json"]),
    "gemm-cpu-speed": ("CPU GEMM vs llama.cpp CPU, 2 threads", [C + "gemma-and-4096-2threads.json"]),
    "plugin-llama-bench-8b": ("llama-bench, synthetic Llama-3-8B, CUDA0 vs CIQ0/CUDA0",
                              [H + "plugin-dc0d48e/llama-bench-llama3-8b-synthetic.json",
                               H + "plugin-dc0d48e/llama-bench-llama3-8b-synthetic-order-CIQ0-first.json",
                               H + "plugin-dc0d48e/llama-bench-llama3-8b-synthetic-order-CUDA0-first.txt"]),
    "plugin-threshold": ("the offload threshold end to end", [H + "plugin-ac2ab62/llama-bench-llama3-8b-synthetic.txt"]),
    "plugin-llama-bench-gemma": ("llama-bench, Gemma 3 270M",
                                 [H + f"plugin-ac2ab62/llama-bench-gemma3-270m-{s}.json"
                                  for s in ("ciq0-first", "cuda0-first", "offload-all")]),
    "plugin-test-backend-ops": ("test-backend-ops -o MUL_MAT on CIQ0 and CIQ_CPU",
                                [H + "plugin-3f4cfb3/test-backend-ops-all.txt", H + "plugin-3f4cfb3/test-backend-ops-default.txt",
                                 C + "plugin-test-backend-ops-mul_mat.txt"]),
    "plugin-gpu-tests": ("the plugin's GPU tests", [H + "plugin-ac2ab62/pytest-plugin.txt"]),
    "plugin-kld": ("llama-perplexity --kl-divergence, Gemma 3 270M, plugin vs CUDA0",
                   [H + f"plugin-0eb01a5/kld-{s}.txt" for s in ("plugin-vs-cuda0-fa-off", "plugin-vs-cuda0-fa-on",
                                                                "cuda0-fa-on-vs-off")]),
    "plugin-memcheck": ("memcheck on a whole llama.cpp prefill through the plugin",
                        [H + "plugin-0eb01a5/sanitizer-plugin-memcheck.txt"]),
    "prefill-8b": ("synthetic Llama-3-8B prefill as CUDA graphs vs llama.cpp CUDA, one process, API v14",
                   [H + f"issue16-f56790f/prefill-llama3-8b-synthetic-n{n}-graph.json.gz" for n in (512, 2048, 4096, 8192)]),
    "prefill-8b-ab": ("the 8B at 512 / 2048 with API v14's switches off (4a93705's path), same lease",
                      [H + f"issue16-f56790f/prefill-llama3-8b-synthetic-n{n}-graph-old.json.gz" for n in (512, 2048)]),
    "prefill-8b-breakdown": ("the 8B's time by op class (eager)",
                             [H + f"issue16-f56790f/prefill-breakdown-llama3-8b-synthetic-{n}.json" for n in (512, 2048)]),
    "prefill-gemma": ("Gemma 3 270M as CUDA graphs vs llama.cpp CUDA, one process",
                      [H + f"issue16-474f736/compare-gemma3-270m-{n}-graph.json.gz" for n in (512, 4096)]
                      + [H + "issue16-4a93705/compare-gemma3-270m-512-graph.json",
                         H + "issue16-4a93705/compare-gemma3-270m-4096-graph.json.gz"]),
    "prefill-gemma-fidelity": ("Gemma: ours llamacpp vs llama.cpp CUDA; every arm vs float64",
                               [H + f"fidelity-f8ae543/compare-gemma3-270m-{n}.json" for n in (512, 4096)]
                               + [H + "split-3367ca4/compare-gemma3-270m-512-graph.json"]),
    "prefill-graphs": ("CUDA graphs against eager, Gemma 3 270M", [H + f"graphs-f8ae543/prefill-gemma3-270m-{s}.json"
                                                                   for s in ("512-fast", "512-fast-graph",
                                                                             "4096-fast", "4096-fast-graph")]),
    "prefill-attention-split": ("attention split over the keys, prefill A/B",
                                [H + f"split-3367ca4/prefill-gemma3-270m-4096-fast-graph-split{i}.json" for i in (0, 1)]
                                + [H + "split-3367ca4/prefill-gemma3-270m-512-split-ab-console.txt"]),
    "prefill-fusion": ("API v11's fusions A/B", [H + f"fusion-7c5ac0a/prefill-{m}-512-fast-graph-fuse{f}-tail1.json"
                                               for m in ("llama3-8b", "gemma3-270m") for f in (0, 1)]),
    "ops-glu": ("the vectorized GLU and its fusion into down's f16 conversion", [H + "ops-d27bb3d/ops-timing.json"]),
    "ops-vs-llamacpp": ("our llama.cpp-order ops against llama.cpp's own", [H + "ops-5ec6c6e/pytest-gpu-ops-vs-llamacpp.txt"]),
    "ops-norm-rope": ("ciq_rms_norm_rope against ggml-cuda's fused RMS_NORM + MUL + ROPE",
                      [H + "trace-7b2d56f/pytest-gpu-ops-vs-llamacpp-fused.txt"]),
    "ops-layer-trace": ("per layer and op, ours llamacpp on llama.cpp CUDA's inputs",
                        [H + "fidelity-f8ae543/layer-trace-gemma3-270m-512.json"]),
    "attention-bench": ("bench attention: our kernels vs llama.cpp's FLASH_ATTN_EXT",
                        [H + f"attention-2b2bad3/attention-{m}-split{i}.json" for m in ("llama3-8b", "gemma3-270m")
                         for i in (0, 1)]),
    "attention-prefill-ab": ("attention wgmma in the 8B's prefill, A/B",
                             [H + f"attention-2b2bad3/prefill-llama3-8b-{n}-fast-graph-attnwgmma{i}.json"
                              for n in (512, 2048) for i in (0, 1)]),
    "attention-llamacpp-bits": ("mma_llamacpp against FLASH_ATTN_EXT on llama.cpp's captured inputs",
                                [H + "attention-777fac1/attention-diff-gemma3-270m.json"]),
    "cpu-engine": ("CPU engine vs llama.cpp CPU, Gemma 3 270M",
                   [C + f"compare-gemma3-270m-{n}.json" for n in (512, 2048, 4096)]),
    "cpu-reference": ("CPU: distance to the float64 reference",
                      [C + "compare-reference-gemma3-270m-512.json", C + "compare-reference-gemma3-270m-4096.json",
                       C + "reference-time-gemma3-270m.txt"]),
    "gpu-tests": ("GPU tests at 4a93705",
                  [H + f"issue16-4a93705/pytest-gpu-{s}.txt" for s in (
                      "wgmma-4a93705", "wgmma-llamacpp-4a93705", "engine-4a93705", "attention-4a93705",
                      "engine-all-4a93705", "engine-llamacpp-cuda-hidden-4a93705")]),
    "sanitizers": ("compute-sanitizer memcheck / racecheck",
                   [H + f"issue16-f56790f/sanitizer-{t}-wgmma-group-glu.txt" for t in ("memcheck", "racecheck")]
                   + [H + f"issue16-4a93705/sanitizer-{t}-{k}.txt" for t in ("memcheck", "racecheck")
                      for k in ("wgmma-rs", "attention-wgmma")]
                   + [H + f"fidelity-f8ae543/sanitizer-{t}-engine.txt" for t in ("memcheck", "racecheck")]
                   + [H + f"{d}/sanitizer-{t}-{k}.txt" for d, k in (
                       ("gemm-streamk-9c75ce8/first-rule-fd020b7", "wgmma-stream-k"), ("mends-f4cfd12", "fusion"),
                       ("wgmma-block32-8306a9d", "block32"), ("fidelity-76fd922", "seams"))
                      for t in ("memcheck", "racecheck")]),
    "gemm-wgmma-block32": ("wgmma on Q4_0/Q5_0/Q8_0 (K a multiple of 64): GPU tests",
                           [H + "wgmma-block32-8306a9d/pytest-gpu-block32.txt"]),
    "gpu-memory": ("device memory under repetition", [H + "gpu-memory-repeat-ac2ab62.json"]),
}

TXT = re.compile(r"\d+ (passed|failed)|ERROR SUMMARY|RACECHECK SUMMARY|Mean +KLD|Same top p|^\s*(pp|tg)\d+\s|^\s*test +CUDA0"
                 r"|tests passed|Backend \S+: *(OK|FAIL)|type_a=q[46]_K.*n=512.*us/run|^\| .*\|$|^\s*\d+ tokens")
ENV_KEYS = ("device", "gpus", "ggml_ciq_commit", "llamacpp_commit", "time", "switches")
ROW_KEYS = ("type", "rows", "k", "tokens", "variant", "us", "llamacpp_us", "speedup", "tflops", "n_past", "heads",
            "heads_kv", "head_dim", "window", "kernel")


def archived(path: str) -> bytes:
    return subprocess.run(["git", "show", f"{ARCHIVE}:{path}"], check=True, capture_output=True).stdout


def small(x, depth=0):
    """A JSON value cut to its scalars: long lists counted, per-position arrays dropped, floats to 4 digits."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, str):
        return x[:160]
    if isinstance(x, dict):
        if depth > 4:
            return "{...}"
        return {k: small(v, depth + 1) for k, v in x.items() if not k.endswith("per_position")}
    if isinstance(x, list):
        if len(x) > 16 and all(isinstance(v, (int, float)) for v in x):
            return {"n": len(x)}
        if len(x) > 16:
            return [small(v, depth + 1) for v in x[:16]] + [f"... {len(x) - 16} more"]
        return [small(v, depth + 1) for v in x]
    return x


def summarize_json(d):
    if isinstance(d, list):   # llama-bench -o json
        keep = ("devices", "n_prompt", "n_gen", "avg_ts", "stddev_ts", "flash_attn", "test_time")
        return {"llama_bench": [{k: small(r.get(k)) for k in keep} for r in d]}
    out = {}
    env = d.get("environment") or {}
    if env:
        out["environment"] = {k: small(env[k]) for k in ENV_KEYS if k in env}
        if "ggml_ciq" in env:
            out["environment"]["api_version"] = env["ggml_ciq"].get("api_version")
    for k, v in d.items():
        if k in ("environment", "schema"):
            continue
        if k == "rows" and isinstance(v, list):
            out[k] = [{f: small(r[f]) for f in ROW_KEYS if r.get(f) is not None} for r in v]
        elif k == "arms":
            out[k] = [{f: small(a.get(f)) for f in ("name", "tokens_per_second", "seconds")} for a in v]
        elif k == "pairs":
            out[k] = [{"p": p.get("p"), "q": p.get("q"), "role": p.get("role"),
                       **{f: small(p.get("agreement", {}).get(f)) for f in ("top1", "kld_mean", "nmse")}} for p in v]
        elif k == "text":
            continue
        else:
            out[k] = small(v)
    return out


def summarize(path: str) -> dict:
    raw = archived(path)
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    entry = {"source": f"{ARCHIVE}:{path}"}
    if path.endswith((".json", ".json.gz")):
        entry.update(summarize_json(json.loads(raw)))
    else:
        text = raw.decode(errors="replace").splitlines()
        lines = [" ".join(ln.split())[:200] for ln in text if TXT.search(ln)]
        lines = lines or [ln.rstrip()[:200] for ln in text[-6:]]
        entry["lines"] = lines[:24] + ([f"... {len(lines) - 24} more matching lines"] if len(lines) > 24 else [])
    return entry


def index_rows() -> str:
    """The summaries table of bench/results/README.md."""
    rows = []
    for claim_id, (claim, paths) in CLAIMS.items():
        dirs = sorted({p.removeprefix("bench/results/").rsplit("/", 1)[0] for p in paths})
        where = ", ".join(f"`{d}/`" for d in dirs) if len(dirs) <= 3 else f"{len(dirs)} folders (`files` in it)"
        rows.append(f"| [`{claim_id}`](summary/{claim_id}.json) | {claim} | {where} |")
    return "\n".join(rows)


def main() -> int:
    if sys.argv[1:] == ["--index"]:
        print(index_rows())
        return 0
    out = Path("bench/results/summary")
    out.mkdir(parents=True, exist_ok=True)
    for claim_id, (claim, paths) in CLAIMS.items():
        files = [summarize(p) for p in paths]
        envs = [f.get("environment", {}) for f in files]
        doc = {"claim": claim, "archive": ARCHIVE, "archive_commit": "41d23b3",
               "device": next((e["device"] for e in envs if "device" in e), None),
               "gpu_clocks": next((e["gpus"][0] for e in envs if e.get("gpus")), None),
               "ggml_ciq_commit": sorted({e["ggml_ciq_commit"] for e in envs if "ggml_ciq_commit" in e}) or None,
               "llamacpp_commit": "0c1e570", "files": files}
        (out / f"{claim_id}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(CLAIMS)} summaries in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
