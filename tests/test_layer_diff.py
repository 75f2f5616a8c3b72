"""Per-layer diff on real activations: llama.cpp's own CPU prefill of a real prompt, captured through its eval
callback; our kernels on exactly those mul_mat inputs; our engine's hidden states against llama.cpp's l_out-N."""

import dataclasses
import json

import numpy as np
import pytest

from ggml_ciq import cli, engine, quants
from ggml_ciq.diff import (LAYER_BAR, LayerStateDiff, captured_tensor_diffs, first_diverging_layer, follows_bit_for_bit,
                           hidden_state_diffs)
from ggml_ciq.llama_model import LlamaModel
from ggml_ciq.model import ModelFile

PROMPT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
          "of a wife. However little known the feelings or views of such a man may be on his first entering a "
          "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered "
          "the rightful property of some one or other of their daughters.")


@pytest.fixture(scope="module")
def captured(llama, model):
    """(tokens, llama.cpp's logits, Capture) of llama.cpp's CPU prefill of PROMPT, once per model (llama.cpp loads
    only a whole model: on the GPU machine's K-quant extract of Gemma, as gemma_full, a skip)."""
    if "token_embd.weight" not in model.tensors:
        pytest.skip(f"{model.path} holds only Gemma's K-quant tensors, not the whole model")
    with LlamaModel(model.path) as lm:
        tokens = lm.tokenize(PROMPT)
        with lm.context_for(len(tokens), eval_callback=True) as ctx:
            logits, capture = ctx.capture(tokens)
    return tokens, logits, capture


def test_every_keep_quant_tensor_on_captured_inputs(native_lib, model, captured):
    tokens, _, capture = captured
    n = len(tokens)
    assert n >= 64
    tied = "output.weight" not in model.tensors  # token_embd is then also the output head's weight
    q32 = {t.name for t in model.tensors.values() if t.ggml_type in quants.Q32_TYPES and len(t.shape) == 2
           and (t.name != "token_embd.weight" or tied)}
    expected = {t.name for t in model.weights() if t.name != "token_embd.weight" or tied} | q32
    diffs = captured_tensor_diffs(model, capture, "llamacpp-cpu", 1e-10)
    judged = [d for d in diffs if d.judged]
    assert {d.name for d in judged} == expected  # every Q4_K/Q6_K and 32-block weight llama.cpp multiplies by
    assert {d.layer for d in judged} >= set(range(model.config.block_count))
    for d in diffs:
        t = model.tensor(d.name)
        assert capture.inputs(d.name).shape == (n, t.k) and capture.outputs(d.name).shape == (n, t.rows)
        assert d.tokens == n and np.isfinite(d.nmse)
    worst = max(d.nmse for d in judged)
    print(f"{model.path.name}: {len(judged)} Q4_K/Q6_K tensors, worst NMSE {worst:.2e}; "
          f"listed: {', '.join(f'{d.name} {d.type} {d.nmse:.1e}' for d in diffs if not d.judged)[:400]}")
    assert all(d.passed and d.nmse <= 1e-10 and d.kernel == ("q8_0" if d.name in q32 else "cpu") for d in judged), \
        [(d.name, d.nmse) for d in judged if not d.passed]
    listed = [d for d in diffs if not d.judged]
    assert all(d.kernel == "f64" and d.type not in ("Q4_K", "Q6_K", "Q4_0", "Q5_0", "Q8_0") for d in listed)
    # The bar can fail: llama.cpp's output of one tensor moved by 1e-4 relative (NMSE 1e-8).
    name = judged[len(judged) // 2].name
    outputs = capture.mul_mat[name][1]
    saved = outputs[0]
    outputs[0] = saved * np.float32(1 + 1e-4)
    try:
        moved = {d.name: d for d in captured_tensor_diffs(model, capture, "llamacpp-cpu", 1e-10)}
    finally:
        outputs[0] = saved
    assert not moved[name].passed and sum(not d.passed for d in moved.values()) == 1


def _hidden(model_file, tokens):
    hidden = []
    engine.Transformer(model_file).forward(tokens, hidden_states=hidden, all_logits=True)
    return hidden


def test_hidden_states_name_the_broken_layer(native_lib, model, captured, monkeypatch):
    """Our engine as it is, then with one layer's FFN norm weight scaled by 1.25: the broken run names that layer
    (or an earlier one the intact engine already names), and the intact run's layer states stay close."""
    tokens, _, capture = captured
    intact = hidden_state_diffs(_hidden(ModelFile(model.path), tokens), capture)
    first = first_diverging_layer(intact)
    print(f"{model.path.name}: hidden-state NMSE per layer {[f'{d.nmse:.1e}' for d in intact]}; first above "
          f"{LAYER_BAR:.0e}: {first}")
    assert len(intact) == model.config.block_count
    assert all(d.nmse < 1e-2 for d in intact)
    broken_layer = 3 if model.config.block_count > 3 else 1
    broken_model = ModelFile(model.path)
    name = f"blk.{broken_layer}.ffn_norm.weight"
    t = broken_model.tensor(name)
    monkeypatch.setitem(broken_model.tensors, name, dataclasses.replace(
        t, ggml_type=quants.F32, data=(t.dequantize() * np.float32(1.25)).astype(np.float32)))
    broken = hidden_state_diffs(_hidden(broken_model, tokens), capture)
    assert broken[broken_layer].nmse > 10 * LAYER_BAR  # gemma3 renormalizes the FFN output: ~3e-3
    assert [d.nmse for d in broken[:broken_layer]] == [d.nmse for d in intact[:broken_layer]]
    expected = broken_layer if first is None or first > broken_layer else first
    assert first_diverging_layer(broken) == expected


def test_first_diverging_layer_against_llamacpp_spread():
    """A layer is named where its NMSE is above the layer bar and above llama.cpp's own spread there (measured)."""
    layers = [LayerStateDiff(0, 5e-5, 0.1), LayerStateDiff(1, 2e-4, 0.1, spread=3e-4),
              LayerStateDiff(2, 2e-4, 0.1, spread=1e-4), LayerStateDiff(3, 1.0, 0.1)]
    assert first_diverging_layer(layers) == 2
    assert first_diverging_layer(layers[:2]) is None and first_diverging_layer(layers[3:]) == 3
    assert first_diverging_layer([LayerStateDiff(0, float("nan"), 0.0, spread=1.0)]) == 0


def test_spread_auto_runs_where_ours_does_not_follow_llamacpp():
    """--spread auto: llama.cpp's CUDA build and its AVX2 CPU build with plain buffers, which ours follows bit for
    bit, get the plain layer bar; an AVX-512 build or one with extra buffer types their own spread."""
    assert follows_bit_for_bit("cuda", {}) and follows_bit_for_bit("cpu", {"llamacpp_cpu_path": "avx2"})
    assert not follows_bit_for_bit("cpu", {"llamacpp_cpu_path": "avx512-vnni", "extra_buffers": False})
    assert not follows_bit_for_bit("cpu", {"llamacpp_cpu_path": "avx2", "extra_buffers": True})
    assert not follows_bit_for_bit("cpu", {})


@pytest.mark.parametrize("spread", ["auto", "on"])
def test_diff_prompt_cli(llama, native_lib, default_model, tmp_path, capsys, llamacpp_avx2, spread):
    """diff --prompt on the embedded model; --spread on (auto: against a build ours does not follow bit for bit) adds
    llama.cpp's own per-layer spread, its flash-attention-toggled prefill, and each layer's bar rises to it."""
    rc = cli.main(["diff", str(default_model.path), "--prompt", PROMPT, "--reference", "llamacpp-cpu", "--spread",
                   spread, "--json", str(tmp_path / "d.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "PASS: 15 tensors judged" in out
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["reference"] == "llamacpp-cpu" and report["semantics"] == "cpu" and report["tokens"] >= 64
    assert len(report["tensors"]) == 15 and all(t["nmse"] <= 1e-10 for t in report["tensors"])
    assert [d["layer"] for d in report["layers"]] == [0, 1]
    measured = spread == "on" or not llamacpp_avx2
    assert report["spread"] == ("flash attention on" if measured else None)
    for d in report["layers"]:
        assert (d["spread"] > 0) if measured else d["spread"] is None  # flash attention's float order is another
        assert d["bar"] == max(1e-4, d["spread"] or 0.0)
    assert ("llama.cpp spread" in out) == measured
    first = next((d["layer"] for d in report["layers"] if d["nmse"] > d["bar"]), None)
    assert report["first_diverging_layer"] == report["summary"]["first_diverging_layer"] == first
    assert report["logits_nmse"] < 1e-2 and "device" in report["environment"]


@pytest.mark.gpu
def test_every_keep_quant_tensor_on_llamacpp_cuda_inputs(llama, native_lib, gemma_full):
    gemma_model = gemma_full
    """On a GPU: llama.cpp CUDA's own prefill (all layers on the GPU, flash attention) captured; `mma` (mmq
    semantics) on exactly those inputs against llama.cpp's MMQ outputs, every Q4_K/Q6_K tensor of every layer."""
    from ggml_ciq import native

    if native.device_count() == 0 or "CUDA0" not in llama.devices():
        pytest.skip("needs a CUDA device, libggml_ciq with CUDA and a CUDA build of llama.cpp (GGML_CIQ_LLAMACPP_LIB)")
    with LlamaModel(gemma_model.path, device="cuda") as lm:
        tokens = lm.tokenize(PROMPT)
        with lm.context_for(len(tokens), eval_callback=True) as ctx:
            _, capture = ctx.capture(tokens)
    diffs = [d for d in captured_tensor_diffs(gemma_model, capture, "llamacpp-cuda", 1e-10) if d.judged]
    q32 = {t.name for t in gemma_model.tensors.values() if t.ggml_type in quants.Q32_TYPES
           and len(t.shape) == 2}  # token_embd is the tied output head
    assert {d.name for d in diffs} == {t.name for t in gemma_model.weights()} | q32
    print(f"worst vs llama.cpp CUDA NMSE {max(d.nmse for d in diffs):.2e} over {len(diffs)} tensors")
    assert all(d.kernel == ("q32" if d.name in q32 else "mma") and d.passed for d in diffs), \
        [(d.name, d.kernel, d.nmse) for d in diffs if not d.passed]


def test_capture_concatenates_micro_batches(llama, model, captured):
    """A prompt decoded in micro-batches of 32 is captured piece by piece and concatenated in token order: with
    flash attention off (the CPU default) llama.cpp's results do not depend on the micro-batch size, so the pieces
    must equal the single-batch capture exactly. With flash attention on they do depend on it (LlamaContext)."""
    tokens, logits, one_batch = captured
    with LlamaModel(model.path) as lm, lm.context_for(len(tokens), n_batch=32, eval_callback=True) as ctx:
        assert not ctx.flash_attn
        batched_logits, batched = ctx.capture(tokens)
    pieces = -(-len(tokens) // 32)
    assert set(batched.mul_mat) == set(one_batch.mul_mat) and set(batched.hidden) == set(one_batch.hidden)
    for name, (inputs, outputs) in batched.mul_mat.items():
        assert len(inputs) == len(outputs) == pieces
        np.testing.assert_array_equal(batched.inputs(name), one_batch.inputs(name))
        np.testing.assert_array_equal(batched.outputs(name), one_batch.outputs(name))
    for layer in one_batch.hidden:
        np.testing.assert_array_equal(batched.hidden_state(layer), one_batch.hidden_state(layer))
    np.testing.assert_array_equal(batched_logits, logits)


def test_attention_capture_on_llamacpp_cpu(llama, gemma_full):
    """llama.cpp CPU's flash attention captured node by node (Gemma 3 270M, 600 tokens: micro-batches of 512 and 88,
    sliding-window and global layers): the q, K/V views and output are read in ciq_attention's layouts, the mask gives
    the positions and window, and a float64 attention on exactly those inputs lands on llama.cpp's output (measured
    NMSE 1.3e-13 to 1.7e-12; a transposed or shifted read, or a wrong window, is far above the bar)."""
    from ggml_ciq.diff import capture_attention
    from ggml_ciq.reference_ops import attention_f64

    calls = capture_attention(gemma_full.path, 600, device="cpu")
    assert len(calls) == 2 * 18
    assert {(c.q.shape[0], c.n_past) for c in calls} == {(512, 0), (88, 512)}
    assert all(c.k.shape[0] % 256 == 0 and c.k.shape[0] >= c.n_past + c.q.shape[0] for c in calls)
    windows = {c.window for c in calls if c.n_past == 512}
    assert windows == {0, 512}  # Gemma 3: five sliding-window layers (512) to one global
    for c in calls[-18:]:
        ours = attention_f64(c.q, c.k, c.v, c.n_past, c.scale, c.window)
        assert quants.nmse(np.asarray(ours, np.float32).reshape(c.out.shape), c.out) <= 1e-10, c.name


@pytest.mark.gpu
def test_attention_bit_exact_on_llamacpp_cuda_inputs(llama, native_lib, gemma_full):
    """On a GPU: llama.cpp CUDA's flash attention captured node by node (Gemma 3 270M, 600 tokens: micro-batches of
    512 and 88, sliding-window and global layers); `mma_llamacpp` on exactly those inputs gives llama.cpp's output
    bit for bit (its 16 x 4-column tiles, 32-key chunks, stream-k segments over 2 CTAs per SM and their fold)."""
    from ggml_ciq import native
    from ggml_ciq.diff import attention_call_diffs, capture_attention

    if native.device_count() == 0 or "CUDA0" not in llama.devices():
        pytest.skip("needs a CUDA device, libggml_ciq with CUDA and a CUDA build of llama.cpp (GGML_CIQ_LLAMACPP_LIB)")
    calls = capture_attention(gemma_full.path, 600)
    assert {(c.q.shape[0], c.n_past) for c in calls} == {(512, 0), (88, 512)} and len(calls) == 2 * 18
    native.dispatch_reset()
    diffs = attention_call_diffs(calls)
    assert native.attention_dispatch_counts()["mma_llamacpp"] == len(calls)
    print("values differing per node:", [d.differing for d in diffs])
    assert all(d.differing == 0 for d in diffs), \
        [(d.node, d.n_past, d.window, d.differing, d.nmse) for d in diffs if d.differing]


def test_attention_call_reads_positions_and_window_off_the_mask():
    """AttentionCall takes n_past and the window from its last query's visible keys (llama.cpp's KQ mask: 0 or -inf);
    a mask whose visible keys are not one run (a graph this reading does not cover) is refused, not misread."""
    from ggml_ciq.errors import BackendError
    from ggml_ciq.llama_model import AttentionCall

    tokens, n_kv, d = 3, 256, 8
    q = np.zeros((tokens, 2, d), np.float32)
    k = np.zeros((n_kv, 1, d), np.float16)
    out = np.zeros((tokens, 2 * d), np.float32)

    def mask(n_past, window):
        m = np.full((32, n_kv), -np.inf, np.float16)  # rows padded as llama.cpp pads them
        for t in range(tokens):
            pos = n_past + t
            m[t, max(0, pos - window + 1) if window else 0:pos + 1] = 0
        return m

    call = AttentionCall("fa", q, k, k, out, mask(100, 0), 0.5)
    assert (call.n_past, call.window, call.scale) == (100, 0, 0.5)
    call = AttentionCall("fa", q, k, k, out, mask(200, 64), 0.5)
    assert (call.n_past, call.window) == (200, 64)
    call = AttentionCall("fa", q, k, k, out, mask(10, 64), 0.5)  # the window reaches key 0: no window to see
    assert (call.n_past, call.window) == (10, 0)
    holed = mask(100, 0)
    holed[tokens - 1, 50] = -np.inf
    with pytest.raises(BackendError, match="one run of visible keys"):
        AttentionCall("fa", q, k, k, out, holed, 0.5)
