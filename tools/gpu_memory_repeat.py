"""Device memory under repetition (issue 17): thousands of GEMM calls and hundreds of engine prefills on one device,
memory read after a warm-up and at the end; one JSON object on stdout (and --json FILE), exit 1 if memory grew.

    python3 tools/gpu.py run -- python3 tools/gpu_memory_repeat.py --json {OUT}/gpu-memory-repeat.json   # the H200
    python3 tools/gpu_memory_repeat.py --device cpu --gemms 400 --prefills 40          # the same loop here

GEMMs go through the Python API (native.gemm: weight uploaded and freed per call; GemmProblem.run: weight reused),
cycling over every kernel variant the device has and 1..64 tokens, with a refused call (an unknown token count
shape) every 50th; each (variant, tokens) result must be the same bits every time, and the dispatch counters say
which kernels ran. Prefills run the engine with NativeOps on the device (libggml_ciq's ops and kernels). With --plugin-prefills N
(and llama.cpp with the ggml plugin, docs/PLUGIN.md) libllama runs N more prefills with every weight MUL_MAT offered
to the plugin's device (GGML_CIQ_OFFLOAD=all): CIQ0 holding the model on a GPU, CIQ_CPU over unrepacked CPU weights
otherwise, a new llama.cpp context every call (its buffers allocated and freed each time). Device memory is
cudaMemGetInfo's used bytes (the whole device: run nothing else on it), host memory the RSS; on --device cpu the RSS
is the device memory.

    python3 tools/gpu.py run -- python3 tools/gpu_memory_repeat.py --plugin-prefills 200 --json {OUT}/gpu-memory-repeat.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggml_ciq import catalog, native  # noqa: E402
from ggml_ciq.errors import CiqError, ShapeError  # noqa: E402
from ggml_ciq.model import ModelFile  # noqa: E402

FLAT_BYTES = 4 * 2**20


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Memory:
    """Used bytes of the device (cudaMemGetInfo) and of the host (RSS), read after a garbage collection."""

    def __init__(self, device: int):
        self.device, self.cuda, self.source = device, None, "host RSS"
        if device >= 0:
            from ggml_ciq.llama_model import CudaMemory

            self.cuda, self.source = CudaMemory(), "cudaMemGetInfo"
            if self.cuda.used(device) is None:
                self.cuda, self.source = None, "nvidia-smi memory.used (MiB)"
                if self._smi() is None:
                    raise CiqError("cannot read device memory: no libcudart for cudaMemGetInfo, no nvidia-smi")

    def _smi(self) -> int | None:
        import subprocess

        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                  "-i", str(self.device)], capture_output=True, text=True, timeout=60).stdout
            return int(out.strip()) * 2**20
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None

    def read(self) -> dict:
        gc.collect()
        host = rss_bytes()
        if self.device < 0:
            device = host
        else:
            device = self.cuda.used(self.device) if self.cuda else self._smi()
        return {"device_used": device, "host_rss": host}


def differs_from_first(first: dict, key, value) -> bool:
    """Whether `value` differs (bit for bit, NaN equal to NaN) from the first value seen for `key`, which is kept."""
    if key not in first:
        first[key] = value
        return False
    return not np.array_equal(value, first[key], equal_nan=True)


def _growth(before: dict, after: dict) -> dict:
    return {key: after[key] - before[key] for key in before}


def repeat_gemms(model: ModelFile, device: int, calls: int, warm_up: int, memory: Memory) -> dict:
    variants = [v for v in (native.GPU_VARIANTS if device >= 0 else ("cpu",)) if native.variant_available(device, v)]
    weights = [model.tensor("blk.0.attn_k.weight"), model.tensor("blk.0.attn_v.weight"),
               model.tensor("blk.0.ffn_down.weight")]
    rng = np.random.default_rng(17)
    token_counts = (1, 7, 16, 33, 64)
    inputs = {(w.name, t): rng.standard_normal((t, w.k)).astype(np.float32) for w in weights for t in token_counts}
    problems = {w.name: native.GemmProblem.upload(w.ggml_type, w.raw(), w.rows, w.k, device) for w in weights}
    native.dispatch_reset()
    first, mismatches, refused, before = {}, 0, 0, None
    start = time.perf_counter()
    try:
        for i in range(calls):
            if i == warm_up:
                before = memory.read()
            w = weights[i % len(weights)]
            variant = variants[(i // len(weights)) % len(variants)]
            x = inputs[(w.name, token_counts[(i // 7) % len(token_counts)])]
            if i % 50 == 49:
                try:
                    problems[w.name].run(x[:, :-1], variant=variant)
                except ShapeError:
                    refused += 1
                continue
            if i % 2:
                out = native.gemm(w, x, variant=variant, device=device)
            else:
                out = problems[w.name].run(x, variant=variant)
            mismatches += differs_from_first(first, (w.name, variant, len(x)), out)
    finally:
        for problem in problems.values():
            problem.close()
    seconds = time.perf_counter() - start
    after = memory.read()
    dispatches = {f"{v}/{t}": n for (v, t), n in native.dispatch_counts().items() if n}
    return {"calls": calls, "warm_up": warm_up, "variants": variants, "token_counts": list(token_counts),
            "weights": [f"{w.name} {w.type_name} {w.rows}x{w.k}" for w in weights], "refused": refused,
            "results_differing_from_the_first": mismatches, "dispatches": dispatches, "seconds": seconds,
            "after_warm_up": before, "end": after, "growth": _growth(before, after)}


def repeat_prefills(model: ModelFile, device: int, calls: int, warm_up: int, memory: Memory) -> dict:
    from ggml_ciq.engine import Transformer
    from ggml_ciq.ops import NativeOps

    engine = Transformer(model, ops=NativeOps(device))
    prompts = [[1, 17, 300, 42, 7, 99, 260, 5, 11][:n] for n in (3, 5, 9)]
    first, mismatches, before = {}, 0, None
    start = time.perf_counter()
    for i in range(calls):
        if i == warm_up:
            before = memory.read()
        tokens = prompts[i % len(prompts)]
        mismatches += differs_from_first(first, len(tokens), engine.forward(tokens))
    seconds = time.perf_counter() - start
    after = memory.read()
    return {"calls": calls, "warm_up": warm_up, "prompt_tokens": [len(p) for p in prompts],
            "ops_memory_bytes": engine.ops.memory_bytes(), "results_differing_from_the_first": mismatches,
            "seconds": seconds, "after_warm_up": before, "end": after, "growth": _growth(before, after)}


def repeat_plugin_prefills(path: Path, device: int, calls: int, warm_up: int, memory: Memory) -> dict:
    """libllama prefills with the ggml plugin's device taking every weight MUL_MAT (module docstring). The plugin
    stays loaded; each call builds and frees a llama.cpp context."""
    import os

    from ggml_ciq import plugin
    from ggml_ciq.llama_model import LlamaModel

    os.environ["GGML_CIQ_OFFLOAD"] = "all"  # read by the plugin at each supports_op
    prompts = [[1, 17, 300, 42, 7, 99, 260, 5, 11, 64, 3, 9, 21][:n] for n in (3, 9, 13)]  # MMVQ-sized and above
    first, mismatches, before, ran = {}, 0, None, {}
    with plugin.Plugin() as loaded:
        name = f"CIQ{device}" if device >= 0 else "CIQ_CPU"
        if name not in loaded.devices:
            raise CiqError(f"the plugin offers {', '.join(loaded.devices)} here, not {name} for device {device}")
        if device >= 0:
            model = LlamaModel(path, device="cuda", devices=[name])  # CIQi takes the whole graph
        else:
            model = LlamaModel(path, device="cpu", threads=1)
        native.dispatch_reset()
        start = time.perf_counter()
        with model:
            for i in range(calls):
                if i == warm_up:
                    before = memory.read()
                tokens = prompts[i % len(prompts)]
                with model.context_for(len(tokens), flash_attn=False) as ctx:
                    mismatches += differs_from_first(first, len(tokens), ctx.prefill(tokens))
            seconds = time.perf_counter() - start
            after = memory.read()  # model and plugin still loaded, as after the warm-up
        ran = {f"{v}/{t}": n for (v, t), n in native.dispatch_counts().items() if n}
    if not ran:
        raise CiqError(f"no GEMM ran in libggml_ciq: the plugin's device {name} took none")
    return {"calls": calls, "warm_up": warm_up, "plugin_device": name, "prompt_tokens": [len(p) for p in prompts],
            "dispatches": ran, "results_differing_from_the_first": mismatches, "seconds": seconds,
            "after_warm_up": before, "end": after, "growth": _growth(before, after)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--model", default="default", help="GGUF path or catalog name (default: the default model)")
    parser.add_argument("--gemms", type=int, default=2000)
    parser.add_argument("--prefills", type=int, default=200)
    parser.add_argument("--plugin-prefills", type=int, default=0,
                        help="prefills through libllama with the ggml plugin's device (0: none)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    for flag, value, least in (("--gemms", args.gemms, 10), ("--prefills", args.prefills, 10),
                               ("--plugin-prefills", args.plugin_prefills, 0)):
        if value < least or (flag == "--plugin-prefills" and 0 < value < 10):
            parser.error(f"{flag} {value}: give at least 10 (a part of them is the warm-up)"
                         + (", or 0 for none" if least == 0 else ""))
    try:
        device = native.parse_device(args.device)
        if device >= native.device_count():
            raise CiqError(f"{args.device}: {native.device_count()} GPUs found")
        model = ModelFile(catalog.resolve_model(args.model))
        memory = Memory(device)
        result = {"device": native.device_name(device), "model": model.config.name, "flat_bar_bytes": FLAT_BYTES,
                  "device_memory_from": memory.source,
                  "build": native.build_info(),
                  "gemm": repeat_gemms(model, device, args.gemms, args.gemms // 10, memory),
                  "prefill": repeat_prefills(model, device, args.prefills, args.prefills // 10, memory)}
        if args.plugin_prefills:
            # half of them warm-up: llama.cpp's own heap settles over its first contexts (CPU, 9 tokens, no plugin:
            # +10 MB over 2,000 contexts, then flat; with the plugin the same, flat from ~4,000)
            result["plugin_prefill"] = repeat_plugin_prefills(model.path, device, args.plugin_prefills,
                                                              args.plugin_prefills // 2, memory)
    except CiqError as exc:
        print(f"gpu_memory_repeat: error: {exc}", file=sys.stderr)
        return 2
    result["flat"] = all(abs(part["growth"]["device_used"]) < FLAT_BYTES and part["growth"]["host_rss"] < FLAT_BYTES
                         for part in (result["gemm"], result["prefill"], result.get("plugin_prefill"))
                         if part is not None)
    result["same_bits"] = not (result["gemm"]["results_differing_from_the_first"]
                               or result["prefill"]["results_differing_from_the_first"]
                               or result.get("plugin_prefill", {}).get("results_differing_from_the_first"))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0 if result["flat"] and result["same_bits"] else 1


if __name__ == "__main__":
    sys.exit(main())
