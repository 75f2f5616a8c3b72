"""The ggml backend plugin (native/plugin, docs/PLUGIN.md) over the CPU-only llama.cpp of llama-cpp-python: libllama
runs Gemma 3 270M's MUL_MATs through our CPU kernels (device CIQ_CPU), with llama.cpp CPU's logits; the plugin refuses
another ggml; supports_op declines the layouts we do not run.

The plugin is the one `pip install .` built (or $GGML_CIQ_PLUGIN); failing that it is built here against the
libggml_ciq in use (headers: $GGML_CIQ_LLAMACPP_SRC or the cached/fetched sdist). Skipped without llama.cpp unless
GGML_CIQ_REQUIRE_LLAMACPP=1."""

import contextlib
import os
import re
import textwrap
from collections import Counter

import cffi
import numpy as np
import pytest

from ggml_ciq import catalog, native, plugin, quants
from ggml_ciq.errors import BackendError, LibraryNotFoundError
from ggml_ciq.llamacpp import F16, F32, Q4_K, Q5_K, Q6_K, Q8_0, _lib_file

PROMPT = os.path.join(os.path.dirname(__file__), "data", "prompt_en.txt")


@pytest.fixture(scope="module")
def plugin_path(llama, native_lib, tmp_path_factory):
    path = plugin.find_plugin()
    if path is None:
        try:
            path = plugin.build(tmp_path_factory.mktemp("plugin"))
        except (BackendError, plugin.SourceError) as exc:
            if os.environ.get("GGML_CIQ_REQUIRE_LLAMACPP"):
                pytest.fail(f"the ggml plugin cannot be built: {exc}")
            pytest.skip(f"the ggml plugin cannot be built: {exc}")
    return path


@pytest.fixture(scope="module")
def plugin_device(plugin_path):
    """The device the tests use: CIQ_CPU over a CPU-only llama.cpp, CIQ0 (the first of one per GPU) over a CUDA one."""
    with plugin.Plugin(plugin_path) as loaded:
        devices = loaded.devices
    assert devices == ["CIQ_CPU"] or devices[0] == "CIQ0", devices
    return devices[0]


@pytest.fixture
def cpu_device(plugin_device):
    if plugin_device != "CIQ_CPU":
        pytest.skip(f"the plugin offers {plugin_device} here: the CPU-device tests need a CPU-only llama.cpp")
    return plugin_device


@pytest.fixture
def offload_all(monkeypatch):
    """Our CPU kernels are not faster than llama.cpp's, so the registry never offloads to the CPU device unless
    told to."""
    monkeypatch.setenv("GGML_CIQ_OFFLOAD", "all")


def test_gemma_prefill_through_the_plugin_equals_llamacpp_cpu(plugin_path, cpu_device, offload_all):
    """All 158 tokens of a real English prompt, all positions' logits: llama.cpp CPU alone against libllama with the
    plugin loaded (every weight MUL_MAT offered to CIQ_CPU), both with the weights in plain buffers (extra buffer
    types off, as every libllama load of ours).
    Same semantics, so the bar is NMSE <= 1e-10; the dispatch counters show every weight GEMM of the one
    micro-batch ran in our library (Gemma 3 270M Q4_K_M: 27 Q4_K, 9 Q6_K, 81 Q5_0, 10 Q8_0 products)."""
    from ggml_ciq.llama_model import LlamaModel

    path = catalog.gemma3_270m_path()
    text = open(PROMPT).read()
    with LlamaModel(path, threads=2) as model:
        tokens = model.tokenize(text)
        with model.context_for(len(tokens)) as ctx:
            reference = ctx.prefill(tokens)
    assert len(tokens) == 158
    with plugin.Plugin(plugin_path) as loaded:
        assert loaded.devices == ["CIQ_CPU"]
        native.dispatch_reset()
        with LlamaModel(path, threads=2) as model, model.context_for(len(tokens)) as ctx:
            logits = ctx.prefill(tokens)
        counts = native.dispatch_counts()
    ran = {key: n for key, n in counts.items() if n}
    assert ran == {("cpu", "Q4_K"): 27, ("cpu", "Q6_K"): 9, ("q32", "Q5_0"): 81, ("q32", "Q8_0"): 10}
    assert logits.shape == reference.shape == (158, 262144) and np.isfinite(logits).all()
    error = quants.nmse(logits, reference)
    print(f"plugin vs llama.cpp CPU: NMSE {error:.2e}, identical {np.mean(logits == reference):.4f}")
    assert error <= 1e-10


def test_plugin_prefills_leave_host_memory_flat(plugin_path, cpu_device, offload_all, default_model):
    """400 libllama prefills (3, 9 and 13 tokens: MMVQ-sized and above) with every weight MUL_MAT on CIQ_CPU, a new
    llama.cpp context each time: the same logits every time, GEMMs counted in our library, and the RSS flat after
    the warm-up (the captured llama.cpp log, 120 lines a context, once grew 15 KB a call; it keeps its newest 5,000
    lines). tools/gpu_memory_repeat.py --plugin-prefills measures the same loop's device memory on a GPU."""
    import gc

    from ggml_ciq.llama_model import LlamaModel
    from test_repetition import FLAT_BYTES, rss_bytes

    prompts = [[1, 17, 300, 42, 7, 99, 260, 5, 11, 64, 3, 9, 21][:n] for n in (3, 9, 13)]
    first, before, calls, warm_up = {}, None, 400, 200
    with plugin.Plugin(plugin_path), LlamaModel(default_model.path, threads=1) as model:
        native.dispatch_reset()
        for i in range(calls):
            if i == warm_up:
                gc.collect()
                before = rss_bytes()
            tokens = prompts[i % len(prompts)]
            with model.context_for(len(tokens), flash_attn=False) as ctx:
                logits = ctx.prefill(tokens)
            if len(tokens) in first:
                assert np.array_equal(logits, first[len(tokens)])
            else:
                first[len(tokens)] = logits
        gc.collect()
        growth = rss_bytes() - before
        ran = sum(native.dispatch_counts().values())
    print(f"{calls - warm_up} plugin prefills after the warm-up: RSS {growth / 2**10:+.0f} KiB, {ran} GEMMs")
    assert ran >= calls * 12  # the default model: 12 weight GEMMs a prefill
    assert growth < FLAT_BYTES


@pytest.mark.parametrize("ggml_type,rows,k,tokens", [(Q4_K, 72, 512, 13), (Q6_K, 37, 256, 9), (Q8_0, 33, 96, 5),
                                                     (Q5_K, 37, 512, 5), (Q5_K, 37, 768, 17)])
def test_mul_mat_graph_on_the_plugin_device(plugin_path, cpu_device, offload_all, llama, ggml_type, rows, k,
                                            tokens):
    """One MUL_MAT computed by the plugin's backend (tensors in its buffer type) against llama.cpp CPU's mul_mat on
    the same blocks: odd rows, tokens that fill no tile. Same semantics: the bar is NMSE <= 1e-10 (bit for bit against
    an AVX2 build of llama.cpp, rounding-level apart from an AVX512 one)."""
    rng = np.random.default_rng(15)
    weight = llama.quantize_chunk(ggml_type, rng.standard_normal((rows, k)).astype(np.float32))
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    expected = llama.mul_mat(ggml_type, weight, rows, k, x, device="CPU", threads=2)
    with plugin.Plugin(plugin_path):
        native.dispatch_reset()
        got = llama.mul_mat(ggml_type, weight, rows, k, x, device="CIQ_CPU")
        ran = sum(native.dispatch_counts().values())
    assert ran == 1
    assert quants.nmse(got, expected) <= 1e-10


STEP_COUNTS = 18  # ggml-ciq-backend.cpp's STEP_COUNTS


def _plugin_steps(llama):
    """With the plugin loaded: a reader of its step counters ("ggml_ciq_plugin_steps": CUDA0 runs, our steps by kind,
    MUL_MATs with their ADD, fused steps, replays, RoPEs, norm + RoPEs, biases, scales, cache writes, attentions), each
    read zeroing them."""
    ffi = cffi.FFI()
    ffi.cdef(_GGML_CDEF + _PLAN_CDEF)
    lib = ffi.dlopen(str(_lib_file(llama.lib_dir, "ggml")))
    dev = lib.ggml_backend_dev_by_name(b"CIQ0")
    address = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(dev), b"ggml_ciq_plugin_steps")
    read = ffi.cast("void (*)(uint64_t *, int)", address)

    def steps() -> list:
        counts = ffi.new(f"uint64_t[{STEP_COUNTS}]")
        read(counts, 1)
        return list(counts)
    steps.library = lib  # kept open with the reader
    return steps


@pytest.mark.gpu
@pytest.mark.parametrize("fuse,rule,graphs,flash_attn,attention", [
    ("1", "1", "0", True, "1"), ("1", "0", "1", True, "1"), ("1", "1", "0", True, "0"), ("1", "0", "0", False, "1"),
    ("0", "1", "1", False, "1")])
def test_gemma_prefill_on_the_gpu_device(plugin_path, plugin_device, offload_all, gemma_full, llama, monkeypatch,
                                         capfd, fuse, rule, graphs, flash_attn, attention):
    """Over a CUDA llama.cpp (docs/GPU.md: the plugin's recipes): Gemma 3 270M with devices CIQ0/CUDA0, every weight
    MUL_MAT through the plugin (GGML_CIQ_OFFLOAD=all), against CUDA0 alone with the same flash-attention setting. The
    semantics differ (wgmma's f16 products, not MMQ's), so this is a sanity bar - a race against CUDA0's stream or a
    misread tensor gives unrelated logits - while llama-perplexity's KL divergence is the measured comparison.
    The plan's steps counted by kind: the fused plan (GGML_CIQ_FUSE=1; the rule, GGML_CIQ_PLUGIN_FUSE_RULE, on by
    default, keeps it for Gemma) runs in a layer 2 norms feeding MUL_MATs and 1 GEGLU fused into the f16 conversion,
    q's and k's norm + RoPE, 2 post-norms with their residual, q's scale and the K and V cache writes; with flash
    attention the attention too (the sliding-window layers through their own mask), so CUDA0 runs only the
    embeddings and the output norm; without it (or with GGML_CIQ_PLUGIN_ATTENTION=0, which also leaves the scale and
    writes to CUDA0) one CUDA0 run a layer is its attention. GGML_CIQ_FUSE=0 takes API v19's plan (MUL_MATs alone,
    five runs a layer). Three
    prefills of the prompt in one context: with GGML_CIQ_PLUGIN_GRAPHS=1 the stretches of ours run eagerly, are
    captured as CUDA graphs and replayed (the replay counter says so); the logits bit for bit the same each time.
    GGML_CIQ_PLUGIN_STATS=1: the backend's line on stderr when the context is freed counts the same graphs, plan and
    replays."""
    from ggml_ciq.compare import logits_agreement
    from ggml_ciq.llama_model import LlamaModel

    if plugin_device != "CIQ0":
        pytest.skip(f"the plugin offers {plugin_device} here, not the GPU device CIQ0")
    monkeypatch.setenv("GGML_CIQ_FUSE", fuse)
    monkeypatch.setenv("GGML_CIQ_PLUGIN_FUSE_RULE", rule)
    monkeypatch.setenv("GGML_CIQ_PLUGIN_ATTENTION", attention)
    path = gemma_full.path
    text = open(PROMPT).read()
    with LlamaModel(path, device="cuda") as model:
        tokens = model.tokenize(text)
        with model.context_for(len(tokens), flash_attn=flash_attn) as ctx:
            reference = ctx.prefill(tokens)
    with plugin.Plugin(plugin_path):
        steps = _plugin_steps(llama)
        steps()
        monkeypatch.setenv("GGML_CIQ_PLUGIN_GRAPHS", graphs)
        monkeypatch.setenv("GGML_CIQ_PLUGIN_STATS", "1")
        capfd.readouterr()
        with LlamaModel(path, device="cuda", devices=["CIQ0"]) as model, \
                model.context_for(len(tokens), flash_attn=flash_attn) as ctx:
            native.dispatch_reset()
            logits = ctx.prefill(tokens)
            counts = native.dispatch_counts()
            first = steps()
            again = [ctx.prefill(tokens) for _ in range(2)]
            replays = steps()[7]
        stats = re.findall(r"ggml-ciq: CIQ0: (\d+) graphs computed, (\d+) plans made; stretches of ours: (\d+) eager, "
                           r"(\d+) captured, (\d+) replayed, (\d+) stale, (\d+) captures failed; host us a graph",
                           capfd.readouterr().err)
    runs, mul_mats, norm_acts, glu_acts, norm_adds, with_add, fused, _, ropes, norm_ropes, biases, scales, writes, \
        attentions, glu_pairs, grouped = first
    print(f"steps: {runs} CUDA0 runs, {mul_mats} MUL_MATs ({with_add} with their ADD), {norm_acts} norms, {glu_acts} "
          f"GEGLUs ({fused} fused), {norm_adds} post-norms, {norm_ropes} q/k norm + RoPEs, {ropes} RoPEs, {scales} "
          f"scales, {writes} cache writes, {attentions} attentions; {replays} stretches replayed in the next two "
          f"prefills")
    assert np.array_equal(again[1], logits) and np.array_equal(again[0], logits)
    assert replays == (runs if graphs == "1" else 0)  # the third prefill: every stretch of ours (one per CUDA0 run)
    assert len(stats) == 1, stats  # one CIQ0 backend, freed with its context
    computed, planned, eager, captured, replayed, stale, failed = map(int, stats[0])
    assert computed >= 3 and planned >= 1 and eager >= 1 and (stale, failed) == (0, 0), stats
    if graphs == "1":  # every stretch captured in the second prefill, replayed in the third
        assert captured >= runs and replayed >= replays, stats
    else:
        assert captured == 0 and replayed == 0, stats
    layers = 18  # tools/plugin_plan.py on llama.cpp CPU's graph (last position's logits): 3 runs, 21 without ours
    if fuse == "1":
        # GGML_CIQ_PLUGIN_GROUP: nothing to group in Gemma 3 (gate and up Q5_0, which no TMA stages; q, k and v with
        # a norm + RoPE between them)
        assert (mul_mats, grouped, glu_pairs, norm_acts, glu_acts, norm_adds, with_add, norm_ropes, ropes, biases) == (
            7 * layers + 1, 0, 0, 2 * layers, layers, 2 * layers - 1, 0, 2 * layers, 0, 0)
        taken = attention == "1"
        assert (scales, writes, attentions) == (layers * taken, 2 * layers * taken, layers * (taken and flash_attn))
        assert fused == norm_acts + glu_acts
        assert 2 <= runs <= 3 if taken and flash_attn else layers + 2 <= runs <= layers + 4, runs
    else:
        assert (mul_mats, norm_acts, glu_acts, norm_adds, with_add, fused, norm_ropes, ropes, scales, writes,
                attentions, glu_pairs, grouped) == (7 * layers + 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        assert runs >= 5 * layers
    keep_quant = {t: sum(n for (variant, wt), n in counts.items() if wt == t and variant != "cpu")
                  for t in ("Q4_K", "Q6_K")}
    assert keep_quant == {"Q4_K": 27, "Q6_K": 9}
    # the 32-block types: every GEMM on the registry's AUTO pick for the prompt's length (wgmma on Hopper: K = 640 is
    # a multiple of 64), the tied output's too (prefill asks for every position's logits: no out_ids row cut)
    block32 = Counter()
    for name, rows, n in (("Q5_0", 2048, 81), ("Q8_0", 256, 9), ("Q8_0", 262144, 1)):
        block32[(native.resolve_variant("auto", "cuda", "any", getattr(quants, name), rows, 640, len(tokens)),
                 name)] += n
    assert {key: counts[key] for key in block32} == dict(block32), counts
    agreement = logits_agreement(logits, reference)
    print(f"plugin vs CUDA0: top-1 {agreement['top1']:.4f}, mean KLD {agreement['kld_mean']:.2e}, "
          f"NMSE {agreement['nmse']:.2e}")
    assert np.isfinite(logits).all() and agreement["top1"] >= 0.9 and agreement["kld_mean"] <= 0.05


_STATS_HOST = re.compile(r"ggml-ciq: CIQ0: (\d+) graphs computed, .*? host us a graph over the last (\d+): "
                         r"graph_compute ([\d.]+) \(CUDA runs ([\d.]+), ours ([\d.]+), hand-overs ([\d.]+)\), "
                         r"synchronize ([\d.]+)")
_TIMELINE = re.compile(r"ggml-ciq: CIQ0: timeline over (\d+) graphs \((\d+) not summed\), us from graph_compute's "
                       r"start, host issued -> GPU passed:(.*) graph_compute returned ([\d.]+), synchronize returned "
                       r"([\d.]+); GPU span median ([\d.]+) \(min ([\d.]+)\)")


@pytest.mark.gpu
@pytest.mark.parametrize("offload", ["", "none"])
def test_timeline_traces_the_graphs_after_the_first_three(plugin_path, plugin_device, gemma_full, llama,
                                                          monkeypatch, capfd, offload):
    """GGML_CIQ_PLUGIN_TIMELINE=1 (API v30) over Gemma 3 270M on CIQ0, six prefills (one graph each) in one context: the
    line counts the three graphs after the first three (every one summed); its boundaries are the plan's, each CUDA0 run and each
    stretch of ours once, in order (the step counters say how many runs); the host's and the GPU's times rise along
    them (20 us of slack: each boundary's timer has its own start event); the GPU passes a boundary no earlier than
    the host issued it (same slack) and the last one before synchronize returned. With GGML_CIQ_OFFLOAD=none nothing
    is ours: one boundary, CUDA0's whole graph. The timers do not change the logits. The stats line's host times
    cover the same graphs (the first three left out: 25th session's lines counted them, divided by the rest), so its
    graph_compute a graph is the timeline's within 25%."""
    from ggml_ciq.llama_model import LlamaModel

    if plugin_device != "CIQ0":
        pytest.skip(f"the plugin offers {plugin_device} here, not the GPU device CIQ0")
    if offload:
        monkeypatch.setenv("GGML_CIQ_OFFLOAD", offload)
    else:
        monkeypatch.delenv("GGML_CIQ_OFFLOAD", raising=False)
    path = gemma_full.path
    text = open(PROMPT).read()
    with plugin.Plugin(plugin_path):
        steps = _plugin_steps(llama)
        results = {}
        for timeline in ("0", "1"):
            monkeypatch.setenv("GGML_CIQ_PLUGIN_TIMELINE", timeline)
            monkeypatch.setenv("GGML_CIQ_PLUGIN_STATS", "1")
            capfd.readouterr()
            with LlamaModel(path, device="cuda", devices=["CIQ0"]) as model:
                tokens = model.tokenize(text)
                with model.context_for(len(tokens), flash_attn=True) as ctx:
                    steps()
                    results[timeline] = [ctx.prefill(tokens) for _ in range(6)]
                    runs = steps()[0] // 6
            results[timeline + "err"] = capfd.readouterr().err
    for logits in results["0"][1:] + results["1"]:
        assert np.array_equal(logits, results["0"][0])
    assert _TIMELINE.search(results["0err"]) is None
    found = _TIMELINE.search(results["1err"])
    assert found, results["1err"][-2000:]
    graphs, skipped = int(found.group(1)), int(found.group(2))
    returned, synced, span, span_min = map(float, found.group(4, 5, 6, 7))
    assert found.group(3).startswith(" begin "), found.group(3)[:200]  # our idle stream's mark at the start
    marks = re.findall(r" (run|ours) (\d+) \(([^)]*)\) ([\d.]+) -> ([\d.]+);", found.group(3))
    print(f"timeline: {len(marks)} boundaries, {runs} CUDA0 runs a prefill; returned {returned}, synchronize "
          f"{synced}, GPU span {span} (min {span_min}) us")
    stats = _STATS_HOST.search(results["1err"])
    assert stats, results["1err"][-2000:]
    computed, over = int(stats.group(1)), int(stats.group(2))
    assert computed == 6 and over == 3 and (graphs, skipped) == (3, 0), (computed, over, graphs, skipped)
    assert sum(kind == "run" for kind, *_ in marks) == runs
    if offload == "none":
        assert [(kind, detail) for kind, _, detail, _, _ in marks] == [("run", "whole graph")]
    else:
        assert runs >= 2 and len(marks) >= 2 * runs - 1
        steps_at = [int(i) for _, i, *_ in marks]
        assert steps_at == sorted(steps_at) and len(set(steps_at)) == len(steps_at)
    host = [float(h) for *_, h, _ in marks]
    gpu = [float(g) for *_, g in marks]
    assert all(b >= a for a, b in zip(host, host[1:]))
    assert all(b >= a - 20 for a, b in zip(gpu, gpu[1:]))
    assert all(g >= h - 20 for h, g in zip(host, gpu))
    assert host[-1] <= returned and gpu[-1] <= synced + 20 and span_min <= span
    compute = float(stats.group(3))
    assert 0.8 * returned <= compute <= 1.25 * returned, (compute, returned)


@pytest.mark.gpu
def test_qwen2_biases_on_the_gpu_device(plugin_path, plugin_device, offload_all, llama, tmp_path, monkeypatch):
    """Over a CUDA llama.cpp: a two-layer random qwen2 model (q/k/v bias rows) through CIQ0, every weight MUL_MAT ours,
    against CUDA0 alone, flash attention on, the attention steps on. The fused plan takes the bias ADDs (BIAS: ciq_add, CUDAi's values), q's
    and k's RoPEs after them, the K/V cache writes and the attention: 6 biases, 4 RoPEs, 4 writes, 2 attentions, and
    CUDA0 runs only the embeddings and the output norm (tools/plugin_plan.py on llama.cpp CPU: 3 runs with the last
    position alone); logits close to CUDA0's (wgmma's f16 products, not MMQ's: a sanity bar) and bit for bit the same
    over two prefills."""
    from ggml_ciq.compare import logits_agreement
    from ggml_ciq.llama_model import LlamaModel

    if plugin_device != "CIQ0":
        pytest.skip(f"the plugin offers {plugin_device} here, not the GPU device CIQ0")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_ATTENTION", "1")  # the attention steps (off by default)
    monkeypatch.setenv("GGML_CIQ_PLUGIN_ROPE_KV", "0")  # k's RoPE and the writes as their own steps (counted below)
    path = catalog.write_small_model(tmp_path / "qwen2.gguf", "qwen2", seed=3)
    tokens = list(range(100, 100 + 77))
    with LlamaModel(path, device="cuda") as model, model.context_for(len(tokens), flash_attn=True) as ctx:
        reference = ctx.prefill(tokens)
    with plugin.Plugin(plugin_path):
        steps = _plugin_steps(llama)
        steps()
        with LlamaModel(path, device="cuda", devices=["CIQ0"]) as model, \
                model.context_for(len(tokens), flash_attn=True) as ctx:
            logits = ctx.prefill(tokens)
            first = steps()
            again = ctx.prefill(tokens)
    runs, ropes, biases, writes, attentions = first[0], first[8], first[10], first[12], first[13]
    assert (biases, ropes, writes, attentions) == (3 * 2, 4, 4, 2) and 2 <= runs <= 3, first
    assert np.array_equal(again, logits)
    agreement = logits_agreement(logits, reference)
    assert np.isfinite(logits).all() and agreement["top1"] >= 0.9 and agreement["kld_mean"] <= 0.05, agreement


@pytest.mark.gpu
def test_llama_groups_on_the_gpu_device(plugin_path, plugin_device, offload_all, llama, tmp_path, monkeypatch):
    """Over a CUDA llama.cpp: a two-layer random llama model (q, k, v Q4_K: a Q6_K v is staged only where K is a
    multiple of 2048, so it would not group at K 512; gate/up Q4_K 1536 x 512) through CIQ0,
    every weight MUL_MAT ours, 77 tokens, under GGML_CIQ_PLUGIN_GROUP and GGML_CIQ_PLUGIN_ROPE_KV on and off.
    GROUP=1: each layer's gate/up and SwiGLU one GLU_PAIR step whose GLU comes from wgmma's epilogue (counted as a GLU
    launch), and k and v one grouped MUL_MAT step (one grouped launch, GGML_CIQ_WGMMA_GROUP=2); with ROPE_KV=1 too, q
    joins them (q's product kept allocated by graph_optimize, its RoPE in the ROPE_KV step): q, v and k one launch.
    ROPE_KV=1: one ROPE_KV step a layer, q's RoPE in it. With GROUP=0 the ROPE_KV steps' logits equal API v30's bit
    for bit: ciq_rope_rows_set_f16 writes the K/V caches ggml-cuda's fused ROPE + SET_ROWS and SET_ROWS write, and q's
    RoPE as ciq_rope. All plans' logits agree to NMSE <= 1e-10 (a grouped launch: float32 sums in another order), each
    is bit for bit the same over two prefills, and all are close to CUDA0's (a sanity bar)."""
    from ggml_ciq.compare import logits_agreement
    from ggml_ciq.llama_model import LlamaModel

    if plugin_device != "CIQ0":
        pytest.skip(f"the plugin offers {plugin_device} here, not the GPU device CIQ0")
    path = catalog.write_small_model(tmp_path / "llama.gguf", "llama", seed=5, v_type=quants.Q4_K)
    tokens = list(range(100, 100 + 77))
    with LlamaModel(path, device="cuda") as model, model.context_for(len(tokens), flash_attn=True) as ctx:
        reference = ctx.prefill(tokens)
    logits, counts = {}, {}
    with plugin.Plugin(plugin_path):
        steps = _plugin_steps(llama)
        monkeypatch.setenv("GGML_CIQ_WGMMA_GROUP", "2")  # k and v in one launch whatever the time model says
        for group, rope_kv in (("1", "1"), ("1", "0"), ("0", "1"), ("0", "0")):
            monkeypatch.setenv("GGML_CIQ_PLUGIN_GROUP", group)
            monkeypatch.setenv("GGML_CIQ_PLUGIN_ROPE_KV", rope_kv)
            steps()
            with LlamaModel(path, device="cuda", devices=["CIQ0"]) as model, \
                    model.context_for(len(tokens), flash_attn=True) as ctx:
                native.dispatch_reset()
                logits[group + rope_kv] = ctx.prefill(tokens)
                first = steps()
                launches = native.wgmma_launch_counts()
                glu_launches, grouped_launches = launches["glu"], launches["grouped"]
                assert np.array_equal(ctx.prefill(tokens), logits[group + rope_kv]), (group, rope_kv)
            counts[group + rope_kv] = (first[14], first[15], glu_launches, grouped_launches, first[16], first[17])
    # (GLU_PAIR steps, MUL_MATs grouped with the one before, GLU launches, grouped launches, ROPE_KV steps, with q's)
    assert counts == {"11": (2, 4, 2, 2, 2, 2), "10": (2, 2, 2, 2, 0, 0), "01": (0, 0, 0, 0, 2, 2),
                      "00": (0, 0, 0, 0, 0, 0)}, counts
    assert np.array_equal(logits["01"], logits["00"])
    for plan in ("11", "10", "01"):
        assert quants.nmse(logits[plan], logits["00"]) <= 1e-10, plan
    for plan, got in logits.items():
        agreement = logits_agreement(got, reference)
        assert np.isfinite(got).all() and agreement["top1"] >= 0.9 and agreement["kld_mean"] <= 0.05, plan


@pytest.mark.gpu
@pytest.mark.parametrize("flash_attn", [False, True])
def test_ciq0_offloading_nothing_is_cuda0(plugin_path, plugin_device, gemma_full, monkeypatch, flash_attn):
    """CIQ0 is CUDA0 with our GEMMs: with GGML_CIQ_OFFLOAD=none it takes the whole graph (the model's only device) and
    hands every node to its CUDA0 backend as graph views, so the logits are CUDA0's own, bit for bit, and our library
    runs nothing."""
    from ggml_ciq.compare import logits_agreement
    from ggml_ciq.llama_model import LlamaModel

    if plugin_device != "CIQ0":
        pytest.skip(f"the plugin offers {plugin_device} here, not the GPU device CIQ0")
    monkeypatch.setenv("GGML_CIQ_OFFLOAD", "none")
    text = open(PROMPT).read()
    with LlamaModel(gemma_full.path, device="cuda") as model:
        tokens = model.tokenize(text)
        with model.context_for(len(tokens), flash_attn=flash_attn) as ctx:
            reference = ctx.prefill(tokens)
    with plugin.Plugin(plugin_path):
        native.dispatch_reset()
        with LlamaModel(gemma_full.path, device="cuda", devices=["CIQ0"]) as model, \
                model.context_for(len(tokens), flash_attn=flash_attn) as ctx:
            logits = ctx.prefill(tokens)
            again = ctx.prefill(tokens)  # CUDA0's CUDA graphs of the views, replayed
            load_log = model.load_log
        counts = native.dispatch_counts()
    assert "using device CIQ0" in load_log
    assert sum(counts.values()) == 0, counts
    assert logits_agreement(logits, reference)["nmse"] == 0
    assert logits_agreement(again, reference)["nmse"] == 0


_GENERATE_GPU = """
    import ctypes, faulthandler, json, sys
    faulthandler.enable()
    from ggml_ciq import native, plugin
    plugin_path, model_path, prompt, device = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    # the plugin first, into the libggml (its soname file) that llama_cpp's libllama then binds to: CIQ0 beside CUDA0
    loaded = plugin.Plugin(plugin.Path(plugin_path))
    import llama_cpp.llama_cpp as _bindings
    from llama_cpp import Llama
    from ggml_ciq.llamacpp import ffi as _ffi
    handle = loaded.ggml._lib.ggml_backend_dev_by_name(device.encode())
    assert handle != _ffi.NULL, device
    _devices = (ctypes.c_void_p * 2)(int(_ffi.cast("uintptr_t", handle)), None)
    _with_devices = _bindings.llama_model_default_params
    def _on_device():
        params = _with_devices()
        params.devices = ctypes.cast(_devices, ctypes.c_void_p).value  # the model on that device alone
        params.use_extra_bufts = False  # as every libllama load of ours (llama.cpp 0c1e570's AMX mul_mat segfaults)
        return params
    _bindings.llama_model_default_params = _on_device
    native.dispatch_reset()
    llm = Llama(model_path=model_path, n_ctx=256, n_gpu_layers=-1, seed=0, verbose=False)
    ids = []
    for token in llm.generate(llm.tokenize(prompt.encode()), top_k=1, temp=0.0, repeat_penalty=1.0):
        ids.append(int(token))
        if len(ids) == 16:
            break
    print(json.dumps({"ids": ids, "gemms": sum(native.dispatch_counts().values()),
                      "text": llm.detokenize(ids).decode(errors="replace")}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("offload", ["table", "all"])
def test_llama_cpp_python_generates_on_ciq0(plugin_path, plugin_device, gemma_full, tmp_path, offload):
    """The Python user's path on a GPU: llama-cpp-python's own `Llama` with its model on CIQ0 (the plugin loaded into
    its ggml), 16 tokens at temperature 0 from Gemma 3 270M, against the same on CUDA0. The measured table takes none
    of a short prompt's or a decode step's MUL_MATs: the same tokens, bit for bit, and no GEMM of ours. With every
    MUL_MAT offloaded (GGML_CIQ_OFFLOAD=all: wgmma on the prompt, mmvq on each step) every step's GEMMs are ours;
    the semantics differ from MMQ's and MMVQ's, so the bar is the first token and the count (printed: both texts)."""
    import json
    import subprocess
    import sys

    if plugin_device != "CIQ0":
        pytest.skip(f"the plugin offers {plugin_device} here, not the GPU device CIQ0")
    script = tmp_path / "generate.py"
    script.write_text(textwrap.dedent(_GENERATE_GPU))
    env = dict(os.environ, GGML_CIQ_PLUGIN_GRAPHS="0")  # the dispatch counters count eager launches, not replays
    env.pop("GGML_CIQ_OFFLOAD", None)
    if offload == "all":
        env["GGML_CIQ_OFFLOAD"] = "all"
    runs = {}
    for device in ("CUDA0", "CIQ0"):
        proc = subprocess.run([sys.executable, str(script), str(plugin_path), str(gemma_full.path),
                               "The capital of France is", device], env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[device] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"CUDA0: {runs['CUDA0']['text']!r}; CIQ0 ({offload}): {runs['CIQ0']['text']!r} "
          f"({runs['CIQ0']['gemms']} GEMMs of ours)")
    assert len(runs["CUDA0"]["ids"]) == 16 and runs["CUDA0"]["gemms"] == 0
    if offload == "table":
        assert runs["CIQ0"]["ids"] == runs["CUDA0"]["ids"] and runs["CIQ0"]["gemms"] == 0
    else:
        per_step = 18 * 7 + 1  # Gemma's 18 layers x 7 weights + the tied output, in whole steps
        assert runs["CIQ0"]["ids"][0] == runs["CUDA0"]["ids"][0]
        assert runs["CIQ0"]["gemms"] >= 15 * per_step and runs["CIQ0"]["gemms"] % per_step == 0, runs["CIQ0"]["gemms"]


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type,rows,k,tokens", [(Q4_K, 4096, 4096, 512), (Q6_K, 4096, 4096, 128),
                                                     (Q4_K, 14336, 4096, 201), (Q5_K, 4096, 14336, 129)])
def test_default_table_mul_mats_on_ciq0(plugin_path, plugin_device, llama, monkeypatch, ggml_type, rows, k, tokens):
    """The conformance cases test-backend-ops lacks (its MUL_MATs are all under the offload table: 0/0 there without
    GGML_CIQ_OFFLOAD=all): one MUL_MAT at a size the default table gives CIQ0 (8B shapes from 128 tokens; odd token
    counts), its supports_op taken, computed on CIQ0's backend by our wgmma (dispatch counters) against llama.cpp
    CUDA0's own MMQ on the same blocks: test-backend-ops' bar for MUL_MAT (NMSE < 5e-4), and closer to the float64
    product than CUDA0 is (f16 semantics against MMQ's q8_1 activations)."""
    if plugin_device != "CIQ0":
        pytest.skip(f"the plugin offers {plugin_device} here, not the GPU device CIQ0")
    if not native.variant_available("cuda", "wgmma"):
        pytest.skip("the default table offloads on Hopper (wgmma) only")
    monkeypatch.delenv("GGML_CIQ_OFFLOAD", raising=False)
    rng = np.random.default_rng(37)
    weight = llama.quantize_chunk(ggml_type, (rng.standard_normal((rows, k)) * 0.02).astype(np.float32))
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    assert native.plan("auto", "cuda", "any", ggml_type, rows, k, tokens).offload
    theirs = llama.mul_mat(ggml_type, weight, rows, k, x, device="CUDA0")
    with plugin.Plugin(plugin_path):
        native.dispatch_reset()
        ours = llama.mul_mat(ggml_type, weight, rows, k, x, device="CIQ0")
        counts = {key: n for key, n in native.dispatch_counts().items() if n}
    assert counts == {("wgmma", quants.type_name(ggml_type)): 1}, counts
    truth = quants.gemm_f64(ggml_type, weight, rows, k, x)
    print(f"{quants.type_name(ggml_type)} {rows} x {k}, {tokens} tokens: CIQ0 vs CUDA0 NMSE "
          f"{quants.nmse(ours, theirs):.2e}; to float64 CIQ0 {quants.nmse(ours, truth):.2e}, "
          f"CUDA0 {quants.nmse(theirs, truth):.2e}")
    assert quants.nmse(ours, theirs) < 5e-4
    assert quants.nmse(ours, truth) < quants.nmse(theirs, truth)


_GGML_CDEF = """
struct ggml_context; struct ggml_tensor; struct ggml_backend_device;
struct ggml_init_params { size_t mem_size; void * mem_buffer; bool no_alloc; };
struct ggml_context * ggml_init(struct ggml_init_params params);
void ggml_free(struct ggml_context * ctx);
struct ggml_tensor * ggml_new_tensor_2d(struct ggml_context * ctx, int type, int64_t ne0, int64_t ne1);
struct ggml_tensor * ggml_new_tensor_3d(struct ggml_context * ctx, int type, int64_t ne0, int64_t ne1, int64_t ne2);
struct ggml_tensor * ggml_view_2d(struct ggml_context * ctx, struct ggml_tensor * a, int64_t ne0, int64_t ne1,
                                  size_t nb1, size_t offset);
struct ggml_tensor * ggml_permute(struct ggml_context * ctx, struct ggml_tensor * a, int axis0, int axis1, int axis2,
                                  int axis3);
struct ggml_tensor * ggml_mul_mat(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_backend_device * ggml_backend_dev_by_name(const char * name);
bool ggml_backend_dev_supports_op(struct ggml_backend_device * device, const struct ggml_tensor * op);
"""


def test_supports_op_declines_layouts_we_do_not_run(plugin_path, plugin_device, offload_all, llama, monkeypatch):
    """CIQ_CPU takes a MUL_MAT only with contiguous 2-D f32 activations and a covered weight type; input and view nodes
    are accepted (test-backend-ops counts nothing otherwise); GGML_CIQ_OFFLOAD=none declines everything, and so does
    the registry's plan on the CPU. CIQ0 claims what CUDA0 claims."""
    ffi = cffi.FFI()
    ffi.cdef(_GGML_CDEF)
    lib = ffi.dlopen(str(_lib_file(llama.lib_dir, "ggml")))
    ctx = lib.ggml_init(ffi.new("struct ggml_init_params *", [1 << 20, ffi.NULL, True])[0])
    try:
        with plugin.Plugin(plugin_path):
            dev = lib.ggml_backend_dev_by_name(plugin_device.encode())
            assert dev != ffi.NULL
            k, rows, tokens = 512, 64, 16
            w = lib.ggml_new_tensor_2d(ctx, Q4_K, k, rows)
            x = lib.ggml_new_tensor_2d(ctx, F32, k, tokens)
            wide = lib.ggml_new_tensor_2d(ctx, F32, 2 * k, tokens)
            x3 = lib.ggml_new_tensor_3d(ctx, F32, tokens, k, 1)
            cases = {
                "plain": (lib.ggml_mul_mat(ctx, w, x), True),
                "q6_K weight": (lib.ggml_mul_mat(ctx, lib.ggml_new_tensor_2d(ctx, Q6_K, k, rows), x), True),
                "input node": (x, True),
                "f16 activations": (lib.ggml_mul_mat(ctx, w, lib.ggml_new_tensor_2d(ctx, F16, k, tokens)), False),
                "non-contiguous activations": (
                    lib.ggml_mul_mat(ctx, w, lib.ggml_view_2d(ctx, wide, k, tokens, 2 * k * 4, 0)), False),
                "permuted activations": (lib.ggml_mul_mat(ctx, w, lib.ggml_permute(ctx, x3, 1, 0, 2, 3)), False),
                "broadcast batch": (lib.ggml_mul_mat(ctx, w, lib.ggml_new_tensor_3d(ctx, F32, k, tokens, 4)), False),
                "q5_K weight": (  # the host in cpu semantics, the GPU in MMQ's (mma, API v17): llama.cpp's own order
                    lib.ggml_mul_mat(ctx, lib.ggml_new_tensor_2d(ctx, Q5_K, k, rows), x), True),
                "f32 weight (not covered)": (
                    lib.ggml_mul_mat(ctx, lib.ggml_new_tensor_2d(ctx, F32, k, rows), x), False),
            }
            answers = {name: bool(lib.ggml_backend_dev_supports_op(dev, op)) for name, (op, _) in cases.items()}
            if plugin_device != "CIQ_CPU":
                # CIQ0 is CUDA0 with our GEMMs: it claims what CUDA0 claims (a layout we decline runs CUDA0's kernel;
                # which MUL_MATs are ours, the dispatch counters of the GPU tests say)
                cuda0 = lib.ggml_backend_dev_by_name(b"CUDA0")
                assert answers == {name: bool(lib.ggml_backend_dev_supports_op(cuda0, op))
                                   for name, (op, _) in cases.items()}
                return
            assert answers == {name: want for name, (_, want) in cases.items()}
            monkeypatch.setenv("GGML_CIQ_OFFLOAD", "none")
            assert not lib.ggml_backend_dev_supports_op(dev, cases["plain"][0])
            monkeypatch.delenv("GGML_CIQ_OFFLOAD")  # the registry's own answer: our CPU kernels are slower
            assert not lib.ggml_backend_dev_supports_op(dev, cases["plain"][0])
    finally:
        lib.ggml_free(ctx)


_PLAN_CDEF = """
struct ggml_cgraph; struct ggml_backend_reg;
struct ggml_cgraph * ggml_new_graph(struct ggml_context * ctx);
void ggml_build_forward_expand(struct ggml_cgraph * cgraph, struct ggml_tensor * tensor);
int ggml_graph_n_nodes(struct ggml_cgraph * cgraph);
struct ggml_tensor * ggml_rms_norm(struct ggml_context * ctx, struct ggml_tensor * a, float eps);
struct ggml_tensor * ggml_scale(struct ggml_context * ctx, struct ggml_tensor * a, float s);
struct ggml_tensor * ggml_scale_inplace(struct ggml_context * ctx, struct ggml_tensor * a, float s);
struct ggml_tensor * ggml_new_tensor_1d(struct ggml_context * ctx, int type, int64_t ne0);
struct ggml_tensor * ggml_mul(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_tensor * ggml_add(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_tensor * ggml_swiglu_split(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_tensor * ggml_reshape_2d(struct ggml_context * ctx, struct ggml_tensor * a, int64_t ne0, int64_t ne1);
struct ggml_tensor * ggml_reshape_3d(struct ggml_context * ctx, struct ggml_tensor * a, int64_t ne0, int64_t ne1,
                                     int64_t ne2);
struct ggml_tensor * ggml_rope_ext(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b,
                                   struct ggml_tensor * c, int n_dims, int mode, int n_ctx_orig, float freq_base,
                                   float freq_scale, float ext_factor, float attn_factor, float beta_fast,
                                   float beta_slow);
struct ggml_tensor * ggml_set_rows(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b,
                                   struct ggml_tensor * c);
const char * ggml_op_desc(const struct ggml_tensor * t);
struct ggml_tensor * ggml_scale_bias(struct ggml_context * ctx, struct ggml_tensor * a, float s, float b);
struct ggml_tensor * ggml_graph_node(struct ggml_cgraph * cgraph, int i);
struct ggml_tensor * ggml_view_3d(struct ggml_context * ctx, struct ggml_tensor * a, int64_t ne0, int64_t ne1,
                                  int64_t ne2, size_t nb1, size_t nb2, size_t offset);
struct ggml_tensor * ggml_flash_attn_ext(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                         struct ggml_tensor * v, struct ggml_tensor * mask, float scale,
                                         float max_bias, float logit_softcap);
struct ggml_backend_reg * ggml_backend_dev_backend_reg(struct ggml_backend_device * device);
void * ggml_backend_reg_get_proc_address(struct ggml_backend_reg * reg, const char * name);
"""


def _plan_hook(lib, ffi, plugin_device):
    """The plugin's plan hook: graph, uid -> (steps as (kind, node, mul, add, flags, run length), uids, run nodes)."""
    dev = lib.ggml_backend_dev_by_name(plugin_device.encode())
    address = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(dev), b"ggml_ciq_plugin_plan")
    assert address != ffi.NULL
    hook = ffi.cast("int (*)(struct ggml_cgraph *, int, uint64_t, int32_t *, uint64_t *, int32_t *, int)", address)

    def plan(graph, uid, index=0):
        rows, uids, runs = ffi.new("int32_t[384]"), ffi.new("uint64_t[64]"), ffi.new("int32_t[256]")
        steps = hook(graph, index, uid, rows, uids, runs, 64)
        if steps < 0:
            return steps
        got = [tuple(rows[6 * i:6 * i + 6]) for i in range(steps)]
        n_run = sum(row[5] for row in got)
        return got, [uids[i] for i in range(steps)], list(runs[0:n_run])

    plan.ffi = ffi  # the FFI of ggml's library (its cdata types)
    return plan


@contextlib.contextmanager
def _plan_graphs(llama, plugin_path, plugin_device):
    """(ggml's library, a 64 MiB context whose tensors get memory, the plan hook) with the plugin loaded."""
    ffi = cffi.FFI()
    ffi.cdef(_GGML_CDEF + _PLAN_CDEF)
    lib = ffi.dlopen(str(_lib_file(llama.lib_dir, "ggml")))
    ctx = lib.ggml_init(ffi.new("struct ggml_init_params *", [64 << 20, ffi.NULL, False])[0])
    try:
        with plugin.Plugin(plugin_path):
            yield lib, ctx, _plan_hook(lib, ffi, plugin_device)
    finally:
        lib.ggml_free(ctx)


# the plan's step kinds (step_kind)
RUN, MUL_MAT, NORM_ACT, GLU_ACT, NORM_ADD, ROPE, NORM_ROPE, BIAS, SCALE, SET_ROWS, ATTN, GLU_PAIR, ROPE_KV = range(13)


def test_gpu_plan_runs_and_shared_activations(plugin_path, plugin_device, offload_all, llama, monkeypatch):
    """API v19's plan (GGML_CIQ_FUSE=0) CIQi's graph_compute runs (CI has no GPU, so through the plugin's
    "ggml_ciq_plugin_plan" hook, with the plugin device's own offload answers): runs of other nodes between our
    MUL_MATs, tiling the graph; a MUL_MAT on the same activations as the previous one of ours reuses their conversion
    (fresh_x 0) unless a node in between wrote over them (an in-place scale); derived run uids (0 for a graph without a
    uid) in a range ggml's counter never reaches, one per step."""
    monkeypatch.setenv("GGML_CIQ_FUSE", "0")
    with _plan_graphs(llama, plugin_path, plugin_device) as (lib, ctx, plan):
        k, tokens = 256, 8
        weight = lambda: lib.ggml_new_tensor_2d(ctx, Q4_K, k, k)  # noqa: E731
        n = lib.ggml_rms_norm(ctx, lib.ggml_new_tensor_2d(ctx, F32, k, tokens), 1e-6)
        q = lib.ggml_mul_mat(ctx, weight(), n)
        q_scaled = lib.ggml_scale(ctx, q, 2.0)
        m = lib.ggml_rms_norm(ctx, lib.ggml_new_tensor_2d(ctx, F32, k, tokens), 1e-6)
        graph = lib.ggml_new_graph(ctx)
        for node in (q_scaled, lib.ggml_mul_mat(ctx, weight(), n), lib.ggml_mul_mat(ctx, weight(), n),
                     lib.ggml_mul_mat(ctx, weight(), q_scaled), lib.ggml_mul_mat(ctx, weight(), m),
                     lib.ggml_scale_inplace(ctx, m, 0.5), lib.ggml_mul_mat(ctx, weight(), m)):
            lib.ggml_build_forward_expand(graph, node)
        count = lib.ggml_graph_n_nodes(graph)
        got, uids, runs = plan(graph, 5)
        # nodes: n, q, q_scaled, k, v, o (on q_scaled), m, d1 (on m), m *= 0.5 in place, d2 (on m)
        assert count == 10
        assert got == [(RUN, 0, -1, -1, 0, 1), (MUL_MAT, 1, -1, -1, 1, 0), (RUN, 2, -1, -1, 0, 1),
                       (MUL_MAT, 3, -1, -1, 0, 0), (MUL_MAT, 4, -1, -1, 0, 0), (MUL_MAT, 5, -1, -1, 1, 0),
                       (RUN, 6, -1, -1, 0, 1), (MUL_MAT, 7, -1, -1, 1, 0), (RUN, 8, -1, -1, 0, 1),
                       (MUL_MAT, 9, -1, -1, 1, 0)], got
        assert runs == [0, 2, 6, 8]
        assert uids == [(1 << 63) | (5 << 20) | i for i in range(len(got))]
        assert plan(graph, 0)[1] == [0] * len(got)
        assert plan(graph, 5, index=99) == -1
        monkeypatch.setenv("GGML_CIQ_FUSE", "sometimes")
        assert plan(graph, 5) == -1  # a value the switch does not take: no plan


def test_gpu_plan_fuses_a_layer(plugin_path, plugin_device, offload_all, llama, monkeypatch):
    """The fused plan (the default) on a llama-shaped layer with a Gemma post-norm, through the plan hook (without the
    attention steps, GGML_CIQ_PLUGIN_ATTENTION=0: its SCALEs stand for CUDAi's RoPEs and attention): the attention
    norm a step of ours feeding q/v/k (their activations converted once), v and k moved before q's stand-in RoPE (a
    scale) so the attention's nodes are one CUDAi run, o's and down's residual ADDs written with their products, the
    FFN norm and SwiGLU steps of ours feeding their MUL_MATs, the post-norm's RMS_NORM + MUL + ADD one step; fused
    (no float32 product, conversion in the op's kernel) exactly where the MUL_MATs reading it take the f16 layout
    (the library's plan for this device says which). With GGML_CIQ_PLUGIN_GROUP=1 q, v and k are one grouped
    MUL_MAT step (row[4] >> 2: the two launched with q) and gate, up and their SwiGLU one GLU_PAIR step (the GLU from
    the GEMM's epilogue: its float32 product written, so down converts it); =0 leaves each apart. A graph without a
    uid gets API v19's plan. (GGML_CIQ_PLUGIN_GROUP is on by default since API v29.)"""
    monkeypatch.setenv("GGML_CIQ_PLUGIN_ATTENTION", "0")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_GROUP", "0")
    with _plan_graphs(llama, plugin_path, plugin_device) as (lib, ctx, plan):
        k, tokens = 256, 64
        weight = lambda: lib.ggml_new_tensor_2d(ctx, Q4_K, k, k)  # noqa: E731
        row = lambda: lib.ggml_new_tensor_1d(ctx, F32, k)  # noqa: E731
        x, residual = (lib.ggml_new_tensor_2d(ctx, F32, k, tokens) for _ in range(2))
        attn = lib.ggml_mul(ctx, lib.ggml_rms_norm(ctx, x, 1e-6), row())                      # 0, 1
        q = lib.ggml_mul_mat(ctx, weight(), attn)                                              # 2
        q_roped = lib.ggml_scale(ctx, q, 2.0)                                                  # 3
        v = lib.ggml_mul_mat(ctx, weight(), attn)                                              # 4
        k_ = lib.ggml_mul_mat(ctx, weight(), attn)                                             # 5
        k_roped = lib.ggml_scale(ctx, k_, 0.5)                                                 # 6
        heads = lib.ggml_add(ctx, lib.ggml_add(ctx, q_roped, k_roped), v)                      # 7, 8
        ffn_inp = lib.ggml_add(ctx, lib.ggml_mul_mat(ctx, weight(), heads), residual)          # 9, 10
        ffn = lib.ggml_mul(ctx, lib.ggml_rms_norm(ctx, ffn_inp, 1e-6), row())                  # 11, 12
        gate, up = lib.ggml_mul_mat(ctx, weight(), ffn), lib.ggml_mul_mat(ctx, weight(), ffn)  # 13, 14
        glu = lib.ggml_swiglu_split(ctx, gate, up)                                             # 15
        out = lib.ggml_add(ctx, lib.ggml_mul_mat(ctx, weight(), glu), ffn_inp)                 # 16, 17
        post = lib.ggml_add(ctx, lib.ggml_mul(ctx, lib.ggml_rms_norm(ctx, out, 1e-6), row()),  # 18, 19, 20
                            residual)
        graph = lib.ggml_new_graph(ctx)
        for node in (attn, q, q_roped, v, k_, k_roped, heads, ffn_inp, ffn, gate, up, glu, out, post):
            lib.ggml_build_forward_expand(graph, node)
        assert lib.ggml_graph_n_nodes(graph) == 21
        answer = native.plan("auto", 0 if plugin_device != "CIQ_CPU" else "cpu",
                             "any" if plugin_device != "CIQ_CPU" else "cpu", Q4_K, k, k, tokens)
        f16, wgmma = answer.layout == "f16", answer.variant == "wgmma"
        fused = 2 if f16 else 0
        got, uids, runs = plan(graph, 7)
        apart = got
        assert got == [(NORM_ACT, 0, 1, -1, fused, 0), (MUL_MAT, 2, -1, -1, 0 if f16 else 1, 0),
                       (MUL_MAT, 4, -1, -1, 0, 0), (MUL_MAT, 5, -1, -1, 0, 0), (RUN, 3, -1, -1, 0, 4),
                       (MUL_MAT, 9, -1, 10, 1, 0), (NORM_ACT, 11, 12, -1, fused, 0),
                       (MUL_MAT, 13, -1, -1, 0 if f16 else 1, 0), (MUL_MAT, 14, -1, -1, 0, 0),
                       (GLU_ACT, 15, -1, -1, fused, 0), (MUL_MAT, 16, -1, 17, 0 if f16 else 1, 0),
                       (NORM_ADD, 18, 19, 20, 0, 0)], got
        assert runs == [3, 6, 7, 8]
        assert uids == [(1 << 63) | (7 << 20) | i for i in range(len(got))]
        monkeypatch.setenv("GGML_CIQ_PLUGIN_GROUP", "1")  # grouped (the default)
        got, uids, runs = plan(graph, 7)
        fresh = 0 if f16 else 1  # q's and gate's: the norm converted its product (fused) or wrote it
        if wgmma:  # the library's answers on a GPU: q, v and k one launch; gate, up and the SwiGLU one
            assert got == [(NORM_ACT, 0, 1, -1, fused, 0), (MUL_MAT, 2, -1, -1, fresh | 2 << 2, 0),
                           (RUN, 3, -1, -1, 0, 4), (MUL_MAT, 9, -1, 10, 1, 0), (NORM_ACT, 11, 12, -1, fused, 0),
                           (GLU_PAIR, 13, 14, 15, fresh, 0), (MUL_MAT, 16, -1, 17, 1, 0),
                           (NORM_ADD, 18, 19, 20, 0, 0)], got
        else:  # the host's (no wgmma): nothing to group, the plan GGML_CIQ_PLUGIN_GROUP=0 makes
            assert got == apart, got
        assert runs == [3, 6, 7, 8]
        # a graph without a uid (an eval callback's views, which end at the node it reads the sources of): API
        # v19's plan, nothing left unwritten
        got, uids, _ = plan(graph, 0)
        assert {row[0] for row in got} == {RUN, MUL_MAT} and all(row[3] == -1 for row in got) and set(uids) == {0}


def test_gpu_plan_takes_ropes(plugin_path, plugin_device, offload_all, llama, monkeypatch):
    """The fused plan's RoPE steps, through the plan hook: q's RoPE right after q's MUL_MAT a step of ours
    (ROPE), a q/k norm + RoPE (RMS_NORM, MUL by a head_dim row, ROPE: ggml-cuda's fused kernel) a step of ours
    (NORM_ROPE), an ADD of a bias row after a MUL_MAT of ours (BIAS, Qwen2's q/k/v biases) and the RoPE after it;
    left to CUDAi: a RoPE with parameters our kernel does not compute as ggml-cuda does (here freq_scale 0.5), one
    whose product a SET_ROWS writes into a cache (CUDAi fuses the two), and one reading what CUDAi computes after our
    MUL_MAT (a scale: taking the RoPE would end no run earlier). The next MUL_MATs move before the run they start; API
    v19's plan (GGML_CIQ_FUSE=0) takes no RoPE and no bias. Without the attention steps (GGML_CIQ_PLUGIN_ATTENTION=0:
    the SET_ROWS and SCALE here are CUDAi's; test_gpu_plan_takes_attention has them)."""
    monkeypatch.setenv("GGML_CIQ_PLUGIN_FUSE_RULE", "0")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_ATTENTION", "0")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_GROUP", "0")  # each MUL_MAT its own step (test_gpu_plan_fuses_a_layer groups)
    with _plan_graphs(llama, plugin_path, plugin_device) as (lib, ctx, plan):
        k, head_dim, heads, tokens = 256, 64, 4, 64
        I32, I64 = 26, 27  # ggml's type ids
        weight = lambda: lib.ggml_new_tensor_2d(ctx, Q4_K, k, k)  # noqa: E731
        pos = lib.ggml_new_tensor_1d(ctx, I32, tokens)
        heads3 = lambda t: lib.ggml_reshape_3d(ctx, t, head_dim, heads, tokens)  # noqa: E731
        no_factors = cffi.FFI().NULL
        rope = lambda t, freq_scale=1.0: lib.ggml_rope_ext(ctx, t, pos, no_factors, head_dim, 2, 0,  # noqa: E731
                                                           10000.0, freq_scale, 0.0, 1.0, 32.0, 1.0)
        x = lib.ggml_new_tensor_2d(ctx, F32, k, tokens)
        attn = lib.ggml_mul(ctx, lib.ggml_rms_norm(ctx, x, 1e-6), lib.ggml_new_tensor_1d(ctx, F32, k))  # 0, 1
        q_r = rope(heads3(lib.ggml_mul_mat(ctx, weight(), attn)))                            # 2 MM, 3 RESHAPE, 4
        k_r = rope(lib.ggml_mul(ctx, lib.ggml_rms_norm(ctx, heads3(lib.ggml_mul_mat(ctx, weight(), attn)), 1e-6),
                                lib.ggml_new_tensor_1d(ctx, F32, head_dim)))                  # 5 MM, 6, 7, 8, 9
        v_r = rope(heads3(lib.ggml_mul_mat(ctx, weight(), attn)), 0.5)                        # 10 MM, 11, 12
        k2_r = rope(heads3(lib.ggml_mul_mat(ctx, weight(), attn)))                            # 13 MM, 14, 15
        store = lib.ggml_set_rows(ctx, lib.ggml_new_tensor_2d(ctx, F32, k, 2 * tokens),       # 16 RESHAPE, 17
                                  lib.ggml_reshape_2d(ctx, k2_r, k, tokens), lib.ggml_new_tensor_1d(ctx, I64, tokens))
        biased = lib.ggml_add(ctx, lib.ggml_mul_mat(ctx, weight(), attn),                     # 18 MM, 19 ADD
                              lib.ggml_new_tensor_1d(ctx, F32, k))                            # of a bias row
        b_r = rope(heads3(biased))                                                            # 20 RESHAPE, 21
        s_r = rope(heads3(lib.ggml_scale(ctx, lib.ggml_mul_mat(ctx, weight(), attn), 0.5)))   # 22 MM, 23 SCALE,
        graph = lib.ggml_new_graph(ctx)                                                       # 24 RESHAPE, 25
        for node in (q_r, k_r, v_r, store, b_r, s_r):
            lib.ggml_build_forward_expand(graph, node)
        assert lib.ggml_graph_n_nodes(graph) == 26
        answer = native.plan("auto", 0 if plugin_device != "CIQ_CPU" else "cpu",
                             "any" if plugin_device != "CIQ_CPU" else "cpu", Q4_K, k, k, tokens)
        f16, wgmma = answer.layout == "f16", answer.variant == "wgmma"
        got, _, runs = plan(graph, 9)
        assert got == [(NORM_ACT, 0, 1, -1, 2 if f16 else 0, 0), (MUL_MAT, 2, -1, -1, 0 if f16 else 1, 0),
                       (ROPE, 4, -1, -1, 0, 0), (MUL_MAT, 5, -1, -1, 0, 0), (NORM_ROPE, 7, 8, 9, 0, 0),
                       (MUL_MAT, 10, -1, -1, 0, 0), (MUL_MAT, 13, -1, -1, 0, 0), (MUL_MAT, 18, -1, -1, 0, 0),
                       (BIAS, 19, -1, -1, 0, 0), (ROPE, 21, -1, -1, 0, 0), (MUL_MAT, 22, -1, -1, 0, 0),
                       (RUN, 11, -1, -1, 0, 10)], got
        assert runs == [11, 12, 14, 15, 16, 17, 20, 23, 24, 25]
        monkeypatch.setenv("GGML_CIQ_FUSE", "0")
        got, _, _ = plan(graph, 9)
        assert {row[0] for row in got} == {RUN, MUL_MAT}


def test_gpu_plan_takes_rope_kv(plugin_path, plugin_device, offload_all, llama, monkeypatch):
    """The ROPE_KV step (GGML_CIQ_PLUGIN_ROPE_KV, on by default), through the plan hook, on llama.cpp's attention block
    in its order (q's MUL_MAT and RoPE, v's, k's MUL_MAT, RoPE, VIEW and K cache write, the V cache write by its own
    ids, the attention): k's RoPE, its VIEW + SET_ROWS and v's SET_ROWS one step of ours (ggml-cuda's fused ROPE +
    VIEW + SET_ROWS and its v write: one launch), q's RoPE joined to it (here q's product has memory of its own, so its
    RoPE can wait) and, with GGML_CIQ_PLUGIN_GROUP and wgmma's answers, q, v and k one grouped launch; CUDAi's run is
    then the attention alone. The plugin's graph_optimize keeps q's product allocated until k's RoPE (the allocation
    dependency hook: one pair a layer, none with the switch off). Left apart: a V write into an f32 cache (not ours),
    and with the switch off API v30's steps (q's RoPE ours; k's RoPE and both writes CUDAi's)."""
    monkeypatch.setenv("GGML_CIQ_PLUGIN_FUSE_RULE", "0")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_ATTENTION", "0")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_GROUP", "0")
    with _plan_graphs(llama, plugin_path, plugin_device) as (lib, ctx, plan):
        ffi = plan.ffi
        k, d, heads, heads_kv, tokens, n_kv = 256, 64, 4, 2, 64, 128
        I32, I64 = 26, 27  # ggml's type ids
        x = lib.ggml_new_tensor_2d(ctx, F32, k, tokens)
        pos = lib.ggml_new_tensor_1d(ctx, I32, tokens)
        mask = lib.ggml_new_tensor_2d(ctx, F16, n_kv, tokens)
        rope = lambda t: lib.ggml_rope_ext(ctx, t, pos, ffi.NULL, d, 0, 0, 5e5, 1.0, 0.0, 1.0, 32.0, 1.0)  # noqa: E731
        mm = lambda rows: lib.ggml_mul_mat(ctx, lib.ggml_new_tensor_2d(ctx, Q4_K, k, rows), x)  # noqa: E731

        def block(v_type=F16):
            graph = lib.ggml_new_graph(ctx)
            k_cache = lib.ggml_new_tensor_2d(ctx, F16, d * heads_kv, n_kv)
            v_cache = lib.ggml_new_tensor_2d(ctx, v_type, d * heads_kv, n_kv)
            k_ids, v_ids = (lib.ggml_new_tensor_1d(ctx, I64, tokens) for _ in range(2))
            q = rope(lib.ggml_reshape_3d(ctx, mm(d * heads), d, heads, tokens))                  # 0 MM, 1, 2 ROPE
            lib.ggml_build_forward_expand(graph, q)
            v = mm(d * heads_kv)                                                                 # 3 MM
            lib.ggml_build_forward_expand(graph, v)
            k_ = rope(lib.ggml_reshape_3d(ctx, mm(d * heads_kv), d, heads_kv, tokens))           # 4 MM, 5, 6 ROPE
            k_flat = lib.ggml_view_2d(ctx, k_, d * heads_kv, tokens, d * heads_kv * 4, 0)       # 7 VIEW
            lib.ggml_build_forward_expand(graph, lib.ggml_set_rows(ctx, k_cache, k_flat, k_ids))  # 8 SET_ROWS
            lib.ggml_build_forward_expand(graph, lib.ggml_set_rows(ctx, v_cache, v, v_ids))       # 9 SET_ROWS
            views = [lib.ggml_view_3d(ctx, c, d, n_kv, heads_kv, d * heads_kv * 2, d * 2, 0)
                     for c in (k_cache, v_cache)]
            attn = lib.ggml_flash_attn_ext(ctx, lib.ggml_permute(ctx, q, 0, 2, 1, 3), views[0], views[1], mask, 0.125,
                                           0.0, 0.0)
            lib.ggml_build_forward_expand(graph, attn)
            return graph

        graph = block()
        ops = [ffi.string(lib.ggml_op_desc(lib.ggml_graph_node(graph, i))).decode()
               for i in range(lib.ggml_graph_n_nodes(graph))]
        assert ops[:10] == ["MUL_MAT", "RESHAPE", "ROPE", "MUL_MAT", "MUL_MAT", "RESHAPE", "ROPE", "VIEW", "SET_ROWS",
                            "SET_ROWS"], ops
        answer = native.plan("auto", 0 if plugin_device != "CIQ_CPU" else "cpu",
                             "any" if plugin_device != "CIQ_CPU" else "cpu", Q4_K, k, d * heads, tokens)
        fresh = 1  # q converts x (no norm of ours before it)
        got, _, runs = plan(graph, 13)
        assert got[:4] == [(MUL_MAT, 0, -1, -1, fresh, 0), (MUL_MAT, 3, -1, -1, 0, 0), (MUL_MAT, 4, -1, -1, 0, 0),
                           (ROPE_KV, 6, 2, 9, 0, 0)], got
        assert [ops[i] for i in runs if ops[i] not in ("VIEW", "RESHAPE", "PERMUTE")] == ["FLASH_ATTN_EXT"]
        monkeypatch.setenv("GGML_CIQ_PLUGIN_GROUP", "1")
        got, _, _ = plan(graph, 13)
        if answer.variant == "wgmma":  # the library's answers on a GPU: q, v and k one launch
            assert got[:2] == [(MUL_MAT, 0, -1, -1, fresh | 2 << 2, 0), (ROPE_KV, 6, 2, 9, 0, 0)], got
        else:
            assert got[:4] == [(MUL_MAT, 0, -1, -1, fresh, 0), (MUL_MAT, 3, -1, -1, 0, 0),
                               (MUL_MAT, 4, -1, -1, 0, 0), (ROPE_KV, 6, 2, 9, 0, 0)], got
        monkeypatch.setenv("GGML_CIQ_PLUGIN_GROUP", "0")
        # graph_optimize's dependency: q's product (node 0) kept until k's RoPE (node 6)
        dev = lib.ggml_backend_dev_by_name(plugin_device.encode())
        address = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(dev),
                                                        b"ggml_ciq_plugin_alloc_deps")
        assert address != ffi.NULL
        deps_hook = ffi.cast("int (*)(struct ggml_cgraph *, int, int32_t *, int)", address)
        pairs = ffi.new("int32_t[8]")
        assert deps_hook(graph, 0, pairs, 4) == 1 and list(pairs[0:2]) == [0, 6]
        assert deps_hook(graph, 99, pairs, 4) == -1
        # a V cache of float32 rows: the V write stays CUDAi's, k's RoPE and write and q's RoPE still one step
        graph_f32 = block(v_type=F32)
        got, _, runs = plan(graph_f32, 14)
        assert got[3] == (ROPE_KV, 6, 2, -1, 0, 0), got
        monkeypatch.setenv("GGML_CIQ_PLUGIN_ROPE_KV", "0")
        assert deps_hook(graph, 0, pairs, 4) == 0
        got, _, runs = plan(graph, 13)
        assert [row[0] for row in got] == [MUL_MAT, ROPE, MUL_MAT, MUL_MAT, RUN], got
        assert sorted(ops[i] for i in runs if ops[i] not in ("VIEW", "RESHAPE", "PERMUTE")) == [
            "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "SET_ROWS"]
        monkeypatch.setenv("GGML_CIQ_PLUGIN_ROPE_KV", "sometimes")
        assert plan(graph, 13) == -1 and deps_hook(graph, 0, pairs, 4) == -1


def test_gpu_plan_takes_attention(plugin_path, plugin_device, offload_all, llama, monkeypatch):
    """The attention steps (GGML_CIQ_PLUGIN_ATTENTION=1; off by default), through the plan hook, on llama.cpp's attention
    block: q's RoPE and SCALE, k's RoPE feeding its cache write, the K and V writes (SET_ROWS of float32 rows into f16
    caches by int64 ids), FLASH_ATTN_EXT over views of the caches with an f16 mask, and o's MUL_MAT: all ours, no CUDAi
    run. Left to CUDAi, each alone (per op, never an abort): an attention with soft-capping, one with ALiBi (max_bias),
    a SCALE with a bias or SET_ROWS by int32 ids (each with the attention that reads it: a step of ours extends a
    stretch of ours and never waits for CUDAi's run). With the switch off the block's writes, q's scale and the
    attention are one CUDAi run, k's RoPE with them (ggml-cuda fuses it with its write)."""
    monkeypatch.setenv("GGML_CIQ_PLUGIN_FUSE_RULE", "0")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_ATTENTION", "1")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_GROUP", "0")  # each MUL_MAT its own step (test_gpu_plan_fuses_a_layer groups)
    with _plan_graphs(llama, plugin_path, plugin_device) as (lib, ctx, plan):
        k, d, heads, heads_kv, tokens, n_kv = 256, 64, 4, 2, 64, 128
        I32, I64 = 26, 27  # ggml's type ids
        x = lib.ggml_new_tensor_2d(ctx, F32, k, tokens)
        pos = lib.ggml_new_tensor_1d(ctx, I32, tokens)
        mask = lib.ggml_new_tensor_2d(ctx, F16, n_kv, tokens)
        rope = lambda t: lib.ggml_rope_ext(ctx, t, pos, cffi.FFI().NULL, d, 2, 0, 10000.0, 1.0, 0.0,  # noqa: E731
                                           1.0, 32.0, 1.0)

        def block(graph, softcap=0.0, max_bias=0.0, id_type=I64, scale_bias=0.0):
            """One attention block into graph, in llama.cpp's order (the cache writes expanded first)."""
            kv_cache = [lib.ggml_new_tensor_2d(ctx, F16, d * heads_kv, n_kv) for _ in range(2)]
            ids = lib.ggml_new_tensor_1d(ctx, id_type, tokens)
            q = rope(lib.ggml_reshape_3d(ctx, lib.ggml_mul_mat(ctx, lib.ggml_new_tensor_2d(ctx, Q4_K, k, d * heads), x),
                                         d, heads, tokens))
            q = lib.ggml_scale_bias(ctx, q, 0.125, scale_bias)
            k_ = rope(lib.ggml_reshape_3d(ctx, lib.ggml_mul_mat(ctx, lib.ggml_new_tensor_2d(ctx, Q4_K, k, d * heads_kv),
                                                                x), d, heads_kv, tokens))
            v = lib.ggml_mul_mat(ctx, lib.ggml_new_tensor_2d(ctx, Q4_K, k, d * heads_kv), x)
            lib.ggml_build_forward_expand(graph, lib.ggml_set_rows(ctx, kv_cache[0], lib.ggml_reshape_2d(
                ctx, k_, d * heads_kv, tokens), ids))
            lib.ggml_build_forward_expand(graph, lib.ggml_set_rows(ctx, kv_cache[1], v, ids))
            views = [lib.ggml_view_3d(ctx, c, d, n_kv, heads_kv, d * heads_kv * 2, d * 2, 0) for c in kv_cache]
            attn = lib.ggml_flash_attn_ext(ctx, lib.ggml_permute(ctx, q, 0, 2, 1, 3), views[0], views[1], mask, 1.0,
                                           max_bias, softcap)
            width = d * heads
            o = lib.ggml_mul_mat(ctx, lib.ggml_new_tensor_2d(ctx, Q4_K, width, k), lib.ggml_reshape_2d(ctx, attn, width,
                                                                                                     tokens))
            lib.ggml_build_forward_expand(graph, o)

        def kinds(**variant):
            """The plan's step kinds, and the ops CUDAi's runs compute (views and reshapes compute nothing)."""
            graph = lib.ggml_new_graph(ctx)
            block(graph, **variant)
            got, _, runs = plan(graph, 11)
            ops = [cffi.FFI().string(lib.ggml_op_desc(lib.ggml_graph_node(graph, i))).decode() for i in runs]
            return [row[0] for row in got], sorted(op for op in ops if op not in ("VIEW", "RESHAPE", "PERMUTE"))

        # ggml's order: k's branch and write, v's, then q's, the attention and o
        assert kinds() == ([MUL_MAT, ROPE, SET_ROWS, MUL_MAT, SET_ROWS, MUL_MAT, ROPE, SCALE, ATTN, MUL_MAT], [])
        # the attention, the writes or the scale CUDAi's: those nodes alone in its runs, every other step still ours
        for variant, theirs in (({"softcap": 30.0}, ["FLASH_ATTN_EXT"]), ({"max_bias": 8.0}, ["FLASH_ATTN_EXT"]),
                                ({"id_type": I32}, ["FLASH_ATTN_EXT", "SET_ROWS", "SET_ROWS"]), ({"scale_bias": 1.0}, ["FLASH_ATTN_EXT", "SCALE"])):
            steps, ops = kinds(**variant)
            assert ops == theirs, (variant, steps, ops)
            op_of = {SET_ROWS: "SET_ROWS", SCALE: "SCALE", ATTN: "FLASH_ATTN_EXT"}
            assert sorted(k for k in steps if k != RUN) == sorted(
                k for k in (MUL_MAT, ROPE, SET_ROWS, MUL_MAT, SET_ROWS, MUL_MAT, ROPE, SCALE, ATTN, MUL_MAT)
                if op_of.get(k) not in theirs), (variant, steps)
        monkeypatch.setenv("GGML_CIQ_PLUGIN_ATTENTION", "0")
        assert kinds() == ([MUL_MAT, MUL_MAT, MUL_MAT, ROPE, RUN, MUL_MAT],
                           ["FLASH_ATTN_EXT", "ROPE", "SCALE", "SET_ROWS", "SET_ROWS"])


def test_gpu_plan_keeps_order_and_float32_where_needed(plugin_path, plugin_device, offload_all, llama, monkeypatch):
    """What the fused plan must not do: move a MUL_MAT before a run that writes its activations or reads its output
    (here a scale in place over the norm's product, and one reading q's product); fuse a norm whose RMS_NORM has
    another reader; fold an ADD that broadcasts a row over the product into the MUL_MAT (the GEMM's addend is a whole
    residual: that ADD is a BIAS step of its own). With the rule (GGML_CIQ_PLUGIN_FUSE_RULE, on by default) this graph
    gets API v19's plan instead: the fused one keeps four CUDAi runs of its six. Without the attention steps
    (GGML_CIQ_PLUGIN_ATTENTION=0: the SCALEs here stand for CUDAi's work)."""
    monkeypatch.setenv("GGML_CIQ_PLUGIN_FUSE_RULE", "0")
    monkeypatch.setenv("GGML_CIQ_PLUGIN_ATTENTION", "0")
    with _plan_graphs(llama, plugin_path, plugin_device) as (lib, ctx, plan):
        k, tokens = 256, 64
        weight = lambda: lib.ggml_new_tensor_2d(ctx, Q4_K, k, k)  # noqa: E731
        row = lib.ggml_new_tensor_1d(ctx, F32, k)
        x = lib.ggml_new_tensor_2d(ctx, F32, k, tokens)
        norm = lib.ggml_rms_norm(ctx, x, 1e-6)
        attn = lib.ggml_mul(ctx, norm, row)                          # 0 RMS_NORM, 1 MUL
        q = lib.ggml_mul_mat(ctx, weight(), attn)                    # 2
        q2 = lib.ggml_scale(ctx, q, 2.0)                             # 3 reads q
        o = lib.ggml_mul_mat(ctx, weight(), q2)                      # 4: after 3 (reads its product)
        scaled = lib.ggml_scale_inplace(ctx, attn, 0.5)              # 5 writes over attn
        v = lib.ggml_mul_mat(ctx, weight(), scaled)                  # 6: after 5 (reads what it wrote)
        other = lib.ggml_add(ctx, lib.ggml_mul(ctx, norm, row), o)   # 7 MUL (norm read twice), 8 ADD
        with_residual = lib.ggml_add(ctx, lib.ggml_mul_mat(ctx, weight(), other), x)  # 9 MUL_MAT, 10 ADD: taken
        broadcast = lib.ggml_add(ctx, lib.ggml_mul_mat(ctx, weight(), with_residual),  # 11 MUL_MAT, 12 ADD of
                                 lib.ggml_new_tensor_2d(ctx, F32, k, 1))                # one row: a BIAS
        graph = lib.ggml_new_graph(ctx)
        for node in (attn, q, q2, o, scaled, v, other, with_residual, broadcast):
            lib.ggml_build_forward_expand(graph, node)
        assert lib.ggml_graph_n_nodes(graph) == 13
        got, _, runs = plan(graph, 3)
        kinds = [(row_[0], row_[1]) for row_ in got]
        assert kinds == [(RUN, 0), (MUL_MAT, 2), (RUN, 3), (MUL_MAT, 4), (RUN, 5), (MUL_MAT, 6), (RUN, 7),
                         (MUL_MAT, 9), (MUL_MAT, 11), (BIAS, 12)], got
        assert got[7][3] == 10 and got[8][3] == -1  # the residual ADD in the GEMM, the broadcast one apart
        assert runs == [0, 1, 3, 5, 7, 8]
        monkeypatch.setenv("GGML_CIQ_PLUGIN_FUSE_RULE", "1")
        got, _, runs = plan(graph, 3)
        assert [(row_[0], row_[1], row_[3]) for row_ in got] == [
            (RUN, 0, -1), (MUL_MAT, 2, -1), (RUN, 3, -1), (MUL_MAT, 4, -1), (RUN, 5, -1), (MUL_MAT, 6, -1),
            (RUN, 7, -1), (MUL_MAT, 9, -1), (RUN, 10, -1), (MUL_MAT, 11, -1), (RUN, 12, -1)], got


def test_plugin_refuses_another_ggml(llama, native_lib, tmp_path):
    """A plugin built for another ggml version (here: told at build time it is for ggml 0.15.0) is refused by its
    own ggml_backend_init with one log line naming both versions, and loading raises a BackendError."""
    from ggml_ciq.llama_model import _Library

    library = _Library.load()  # its log callback also receives ggml's log
    try:
        path = plugin.build(tmp_path / "old", ggml_version="0.15.0")
    except plugin.SourceError as exc:
        pytest.skip(f"the ggml plugin cannot be built: {exc}")
    start = len(library.log)
    with pytest.raises(BackendError, match="0.15.0"):
        plugin.Plugin(path)
    refusal = [line for line in "".join(library.log[start:]).splitlines() if line.startswith("ggml-ciq:")]
    assert len(refusal) == 1
    assert "built against ggml 0.15.0" in refusal[0] and f"cannot run in ggml {llama.version}" in refusal[0]


def test_missing_plugin_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(plugin.PLUGIN_ENV, str(tmp_path / "nothing.so"))
    with pytest.raises(LibraryNotFoundError, match="not built"):
        plugin.Plugin()


def test_compare_third_arm(plugin_path, cpu_device, offload_all, default_model, tmp_path):
    """`compare --plugin`: llama.cpp alone, llama.cpp + the plugin and our engine in one process; the plugin arm's
    logits equal llama.cpp's (same semantics), its GEMMs ran in our library, and the JSON reads back."""
    from ggml_ciq import cli
    from ggml_ciq.compare import LLAMACPP, PLUGIN, load_compare_json

    out = tmp_path / "compare.json"
    assert cli.main(["compare", str(default_model.path), "--tokens", "40", "--repeat", "1", "--plugin",
                     "--json", str(out)]) == 0
    result = load_compare_json(out)
    arm = result.arm(PLUGIN)
    assert arm.settings["plugin_devices"] == ["CIQ_CPU"] and arm.settings["warm_up_gemms"] > 0
    assert arm.settings["offload"] == "all"
    assert sum(arm.settings["warm_up_gemms_by_kernel"].values()) == arm.settings["warm_up_gemms"]
    assert arm.tokens_per_second > 0
    agreement = result.pair(LLAMACPP, PLUGIN).agreement
    assert agreement["positions"] == 40 and agreement["nmse"] <= 1e-10


def test_bad_switch_value_is_one_line(plugin_path, llama):
    """GGML_CIQ_OFFLOAD=bogus (or GGML_CIQ_FUSE=sometimes): loading the plugin into ggml directly (as llama.cpp's tools
    do, GGML_BACKEND_PATH) gives one ggml-ciq log line naming the variable and what it takes, and no plugin (never a silent decline of every op);
    from Python, plugin.Plugin raises that error before loading. Each in a fresh process (the plugin registers once)."""
    import subprocess
    import sys

    code = ("import cffi, sys; ffi = cffi.FFI(); ffi.cdef('void * ggml_backend_load(const char * path);'); "
            "lib = ffi.dlopen(sys.argv[1], ffi.RTLD_GLOBAL); print('loaded' if lib.ggml_backend_load(sys.argv[2].encode()) else 'none')")
    for variable, value, said in (("GGML_CIQ_OFFLOAD", "bogus", "GGML_CIQ_OFFLOAD=bogus is not all or none"),
                                  ("GGML_CIQ_FUSE", "sometimes", "GGML_CIQ_FUSE='sometimes': expected 1 or 0"),
                                  ("GGML_CIQ_PLUGIN_GRAPHS", "2", "GGML_CIQ_PLUGIN_GRAPHS='2': expected 1 or 0"),
                                  ("GGML_CIQ_PLUGIN_STATS", "loud", "GGML_CIQ_PLUGIN_STATS='loud': expected 1 or 0"),
                                  ("GGML_CIQ_PLUGIN_ATTENTION", "mma",
                                   "GGML_CIQ_PLUGIN_ATTENTION='mma': expected 1 or 0"),
                                  ("GGML_CIQ_PLUGIN_GROUP", "all", "GGML_CIQ_PLUGIN_GROUP='all': expected 1 or 0"),
                                  ("GGML_CIQ_PLUGIN_TIMELINE", "verbose",
                                   "GGML_CIQ_PLUGIN_TIMELINE='verbose': expected 1 or 0"),
                                  ("GGML_CIQ_PLUGIN_ROPE_KV", "q", "GGML_CIQ_PLUGIN_ROPE_KV='q': expected 1 or 0")):
        proc = subprocess.run([sys.executable, "-c", code, str(_lib_file(llama.lib_dir, "ggml")), str(plugin_path)],
                              env=dict(os.environ, **{variable: value}), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == "none", (proc.stdout, proc.stderr[-2000:])
        ours = [line for line in proc.stderr.splitlines() if line.startswith("ggml-ciq:")]
        assert len(ours) == 1 and said in ours[0], proc.stderr[-2000:]
    env = dict(os.environ, GGML_CIQ_OFFLOAD="bogus")
    code = ("from ggml_ciq import plugin\ntry:\n    plugin.Plugin(plugin.Path(__import__('sys').argv[1]))\n"
            "except Exception as e:\n    print(type(e).__name__, e)")
    proc = subprocess.run([sys.executable, "-c", code, str(plugin_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip() == "InvalidArgumentError GGML_CIQ_OFFLOAD=bogus is not all or none", proc.stderr[-2000:]


def test_one_device_per_cuda_device(plugin_path, llama):
    """CIQi for each CUDAi that the ggml has and libggml_ciq sees, whatever their count (llama.cpp's layer split,
    `-dev CIQ0/CUDA0/CIQ1/CUDA1 -ts 0/1/0/1`, carries a model over several GPUs through our kernels), each lending
    CUDAi's buffers (named in its description); CIQ_CPU alone over a ggml without GPU devices. The same holds in a
    process where CUDA_VISIBLE_DEVICES hides every GPU: no CIQ GPU device then."""
    import subprocess
    import sys

    from ggml_ciq import native

    ggml_gpus = [name for name in llama.devices() if name.startswith("CUDA")]
    n = 0
    while f"CUDA{n}" in ggml_gpus and n < native.device_count():
        n += 1
    with plugin.Plugin(plugin_path) as loaded:
        described = loaded.describe()["devices"]
    if n:
        assert [d["name"] for d in described] == [f"CIQ{i}" for i in range(n)], described
        assert all(d["description"].endswith(f"(CUDA{i}'s memory)") for i, d in enumerate(described)), described
    elif not ggml_gpus:
        assert [d["name"] for d in described] == ["CIQ_CPU"], described
    else:  # a CUDA ggml where libggml_ciq sees no GPU: nothing to offer
        assert described == [], described
    code = ("from ggml_ciq import plugin\nwith plugin.Plugin(plugin.Path(__import__('sys').argv[1])) as p:\n"
            "    print(','.join(p.devices))")
    proc = subprocess.run([sys.executable, "-c", code, str(plugin_path)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0 and proc.stdout.strip() in ("CIQ_CPU", ""), (proc.stdout, proc.stderr[-2000:])
    assert not proc.stdout.strip().startswith("CIQ0"), proc.stdout


_GENERATE = """
    import json, sys
    from llama_cpp import Llama
    plugin_path, model_path, prompt, with_plugin = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    if with_plugin:
        from ggml_ciq import native, plugin
        loaded = plugin.Plugin(plugin.Path(plugin_path))  # into the libggml llama_cpp loaded: CIQ_CPU, an ACCEL device
        native.dispatch_reset()
    llm = Llama(model_path=model_path, n_ctx=256, n_threads=2, n_gpu_layers=0, seed=0, verbose=False)
    ids = []
    for token in llm.generate(llm.tokenize(prompt.encode()), top_k=1, temp=0.0, repeat_penalty=1.0):
        ids.append(int(token))
        if len(ids) == 16:
            break
    gemms = sum(native.dispatch_counts().values()) if with_plugin else 0
    print(json.dumps({"ids": ids, "gemms": gemms, "text": llm.detokenize(ids).decode(errors="replace")}))
"""


def test_llama_cpp_python_generates_through_the_plugin(plugin_path, cpu_device, gemma_full, tmp_path):
    """The Python user's path: llama-cpp-python's own `Llama` over a CPU-only llama.cpp, with the plugin loaded into
    its ggml (CIQ_CPU joins every context as an ACCEL device) and every MUL_MAT offloaded: 16 tokens generated at
    temperature 0 from Gemma 3 270M, prompt and each decode step through our CPU kernels (dispatch counters), the same
    tokens as llama.cpp alone (llama.cpp CPU's semantics, bit for bit). Each run in its own process (a plugin
    registers once); both load the weights in plain buffers (tests/llamacpp_python.py)."""
    import json
    import subprocess
    import sys

    import llamacpp_python

    script = tmp_path / "generate.py"
    script.write_text(llamacpp_python.script(_GENERATE))
    prompt = "The capital of France is"
    runs = {}
    for with_plugin in ("0", "1"):
        env = dict(os.environ, GGML_CIQ_OFFLOAD="all")
        proc = subprocess.run([sys.executable, str(script), str(plugin_path), str(gemma_full.path), prompt, with_plugin],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[with_plugin] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"llama.cpp: {runs['0']['text']!r}; through the plugin: {runs['1']['text']!r} "
          f"({runs['1']['gemms']} GEMMs of ours)")
    assert len(runs["0"]["ids"]) == 16 and runs["1"]["ids"] == runs["0"]["ids"]
    # the prompt's GEMMs and 15 decode steps' (the 16th token needs no step of its own): Gemma's 18 layers x 7
    # weights (+ the tied output) a step, in whole steps
    per_step = 18 * 7 + 1
    assert runs["1"]["gemms"] >= 16 * per_step - per_step and runs["1"]["gemms"] % per_step == 0, runs["1"]["gemms"]


@pytest.mark.parametrize("model,want", [
    # name: (API v19's runs, with the attention steps the fused plan's runs, NORM_ACT, GLU_ACT, NORM_ADD, ROPE,
    # NORM_ROPE, BIAS, SCALE, SET_ROWS, ATTN; the fused plan's runs without them, its ROPE_KV steps with
    # GGML_CIQ_PLUGIN_ROPE_KV=1 (the default), the rule's pick)
    ("gemma3-270m", (109, 3, 36, 18, 35, 0, 36, 0, 18, 36, 18, 21, 0, "fused plan with ROPE_KV")),
    ("smollm2-135m", (151, 3, 60, 30, 0, 60, 0, 0, 0, 60, 30, 33, 30, "fused plan with ROPE_KV")),
    ("qwen2.5-coder-0.5b", (145, 3, 48, 24, 0, 48, 0, 72, 0, 48, 24, 27, 24, "fused plan with ROPE_KV")),
])
def test_gpu_plan_over_llamacpps_allocated_graph(plugin_path, cpu_device, llama, model, want):
    """The plugin's plans over llama.cpp's own graph of a 512-token prefill, allocated by ggml-alloc (its in-place and
    free-block reuse, as on a GPU up to alignment: tools/plugin_plan.py, on llama.cpp CPU): API v19's plan cuts a layer
    into five CUDAi runs; the fused plan takes the norms, GLUs and post-norms, q's RoPE (llama; k's stays CUDAi's,
    fused with its KV write) or q's and k's norm + RoPE (Gemma 3), Qwen2.5's q/k/v bias ADDs, and moves MUL_MATs before
    a run where ggml-alloc's addresses allow: one CUDAi run a layer (its KV writes and attention). With the attention
    steps (GGML_CIQ_PLUGIN_ATTENTION=1) it also takes k's RoPE, Gemma's q SCALE, the K/V cache writes (SET_ROWS) and
    the attention (FLASH_ATTN_EXT, each layer's own mask: Gemma's sliding-window layers read the SWA mask): three
    CUDAi runs a graph, none inside a layer (the embeddings' GET_ROWS, the last layer's row pick, the output norm).
    With the ROPE_KV steps (GGML_CIQ_PLUGIN_ROPE_KV=1, the default) k's RoPE and both cache writes are one step of
    ours a llama or Qwen2 layer (Gemma 3's k norm + RoPE is NORM_ROPE's), the same runs; q's RoPE stays its own step
    here: ggml-alloc on llama.cpp CPU gave v's product q's memory once q's RoPE had read it (on CIQi graph_optimize's
    dependency keeps it: test_gpu_plan_takes_rope_kv). The rule keeps the fused plan where it halves the runs (all
    three here; before the RoPE steps the fused plan kept three runs a Gemma layer, and the rule took API v19's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("plugin_plan", os.path.join(os.path.dirname(__file__), "..",
                                                                              "tools", "plugin_plan.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    path = catalog.resolve_model(model)
    _, got, ops, deps = tool.plans(path, 512, plugin_path)
    count = lambda label, kind: sum(1 for row in got[label] if row[0] == kind)  # noqa: E731
    *steps, runs_without, rope_kv, pick = want
    assert count("API v19's plan", "RUN") == steps[0] and {row[0] for row in got["API v19's plan"]} == {"RUN", "MUL_MAT"}
    kinds = ("RUN", "NORM_ACT", "GLU_ACT", "NORM_ADD", "ROPE", "NORM_ROPE", "BIAS", "SCALE", "SET_ROWS", "ATTN")
    assert [count("fused plan with attention", kind) for kind in kinds] == steps[1:]
    # GGML_CIQ_PLUGIN_GROUP (on by default; wgmma's answers only: test_gpu_plan_fuses_a_layer): no GLU_PAIR nor group
    # here; a MUL_MAT step's group (row[4] >> 2) would count the MUL_MATs launched with it
    assert count("fused plan with attention", "GLU_PAIR") == 0
    for label in ("fused plan", "fused plan with attention", "fused plan with ROPE_KV"):
        gemms = count(label, "MUL_MAT") + 2 * count(label, "GLU_PAIR") + sum(row[4] >> 2 for row in got[label])
        assert gemms == count("API v19's plan", "MUL_MAT"), label
    assert got["default"] == got[pick]
    first_op = {"MUL_MAT": ("MUL_MAT",), "NORM_ACT": ("RMS_NORM",), "NORM_ADD": ("RMS_NORM",),
                "GLU_ACT": ("SWIGLU", "GEGLU"), "GLU_PAIR": ("MUL_MAT",), "ROPE": ("ROPE",), "NORM_ROPE": ("RMS_NORM",),
                "BIAS": ("ADD",),
                "SCALE": ("SCALE",), "SET_ROWS": ("SET_ROWS",), "ATTN": ("FLASH_ATTN_EXT",)}
    for label in ("fused plan", "fused plan with attention"):
        assert all(ops[row[1]] in first_op[row[0]] for row in got[label] if row[0] != "RUN")
        # a norm + RoPE covers RMS_NORM, MUL, ROPE
        assert all((ops[row[2]], ops[row[3]]) == ("MUL", "ROPE") for row in got[label] if row[0] == "NORM_ROPE")
        # a GLU pair: gate's MUL_MAT, up's, their GLU
        assert all((ops[row[2]], ops[row[3]]) in (("MUL_MAT", "SWIGLU"), ("MUL_MAT", "GEGLU"))
                   for row in got[label] if row[0] == "GLU_PAIR")
    assert count("fused plan", "RUN") == runs_without
    with_kv = got["fused plan with ROPE_KV"]
    assert count("fused plan with ROPE_KV", "ROPE_KV") == rope_kv
    assert count("fused plan with ROPE_KV", "RUN") == runs_without
    assert count("fused plan with ROPE_KV", "ROPE") == count("fused plan", "ROPE")  # q's: it cannot wait here
    # a ROPE_KV: k's ROPE (node), no q RoPE joined (mul), the V write (add)
    assert all(ops[row[1]] == "ROPE" and row[2] == -1 and ops[row[3]] == "SET_ROWS" for row in with_kv
               if row[0] == "ROPE_KV")
    assert not {row[0] for row in got["fused plan"]} & {"ROPE_KV"}
    # graph_optimize's dependencies: a llama layer's q product (a MUL_MAT) kept until its k's RoPE; none where q's RoPE
    # reads a bias ADD (Qwen2) or a q norm (Gemma 3)
    assert len(deps) == (rope_kv if model == "smollm2-135m" else 0), deps
    assert all(ops[kept] == "MUL_MAT" and ops[until] == "ROPE" and kept < until for kept, until in deps)
    assert not {row[0] for row in got["fused plan"]} & {"SCALE", "SET_ROWS", "ATTN"}
