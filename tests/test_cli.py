"""The ggml-ciq command line as a user runs it: exit codes, one-line errors, JSON reports."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest


def ggml_ciq(*args, timeout=600):
    # Run outside the checkout so the installed package (with its native library) is the one imported.
    proc = subprocess.run([sys.executable, "-m", "ggml_ciq.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=tempfile.gettempdir())
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line_error(rc, err, *needles):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ggml-ciq: error:"), err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_diff_default_model(llama, tmp_path):
    rc, out, err = ggml_ciq("diff", "--backend", "reference", "--reference", "llamacpp-cpu", "--tokens", 9,
                            "--json", tmp_path / "d.json")
    assert rc == 0, err
    assert "PASS: 16 tensors compared, 0 above the bar" in out
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["tokens"] == 9 and report["semantics"] == "cpu" and len(report["tensors"]) == 16
    assert all(t["ours_vs_llamacpp"] <= 1e-10 and t["llamacpp_vs_f64"] > 1e-8 for t in report["tensors"])
    assert report["environment"]["llamacpp"]["version"]


def test_diff_native_cpu_on_gemma(llama, native_lib, gemma_model, tmp_path):
    rc, out, err = ggml_ciq("diff", gemma_model.path, "--backend", "ciq-cpu", "--tokens", 17, "--json",
                            tmp_path / "g.json")
    assert rc == 0, err
    report = json.loads((tmp_path / "g.json").read_text())
    # Every quantized weight of Gemma 3 has a CPU kernel of ours: the K-quants on `cpu`, Q5_0 / Q8_0 on `q32`.
    ran = {(t["type"], t["variant"]) for t in report["tensors"]}
    assert len(report["tensors"]) == len(gemma_model.quantized_weights()) == 127
    assert ran == {("Q4_K", "cpu"), ("Q6_K", "cpu"), ("Q5_0", "q32"), ("Q8_0", "q32")}
    assert all(t["passed"] for t in report["tensors"])


def test_diff_all_quantized_reports_other_types(llama, gemma_model):
    rc, out, err = ggml_ciq("diff", gemma_model.path, "--all-quantized", "--tensor", "blk.0.attn_q.weight",
                            "--tensor", "blk.0.ffn_down.weight", "--tokens", 3)
    assert rc == 0, err
    assert "Q5_0" in out and "Q6_K" in out


def test_diff_default_job(llama, native_lib):
    rc, out, err = ggml_ciq("diff")  # the README's main job: our kernels (GPU if present) vs llama.cpp
    assert rc == 0, err
    assert "PASS: 16 tensors compared" in out


def test_diff_fails_when_bar_is_broken(llama, native_lib):
    """Exit 1 and FAIL when a tensor breaks --bar: the numpy reference backend (float64 sums, llama.cpp's semantics)
    is rounding-level apart from llama.cpp (~1e-13); our native kernels at 3 tokens are bit for bit (NMSE 0 passes
    any bar)."""
    rc, out, err = ggml_ciq("diff", "--tokens", 3, "--bar", "1e-30", "--backend", "reference")
    assert rc == 1 and "FAIL" in out
    rc, out, err = ggml_ciq("diff", "--tokens", 3, "--bar", "1e-30", "--backend", "ciq-cpu",
                            "--reference", "llamacpp-cpu")
    assert rc == 0 and "PASS" in out, out[-2000:]


def test_bench_cpu(llama, native_lib, tmp_path):
    rc, out, err = ggml_ciq("bench", "gemm", "--backend", "ciq-cpu", "--shape", "Q4_K:256:512", "--shape",
                            "Q6_K:300:768", "--shape", "Q8_0:97:288", "--shape", "Q5_0:33:64", "--tokens", "1,17",
                            "--repeat", 2, "--json", tmp_path / "b.json")
    assert rc == 0, err
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [(r["type"], r["rows"], r["tokens"]) for r in rows] == [
        (t, n, tokens) for t, n in (("Q4_K", 256), ("Q6_K", 300), ("Q8_0", 97), ("Q5_0", 33)) for tokens in (1, 17)]
    assert all(r["ciq_us"] > 0 and r["llamacpp_us"] > 0 for r in rows)
    assert set(json.loads((tmp_path / "b.json").read_text())["geomean_ratio_by_type"]) == {"Q4_K", "Q6_K", "Q8_0",
                                                                                           "Q5_0"}


def test_bench_attention_cpu(llama, native_lib, tmp_path):
    """bench attention on the CPU: our host kernels and llama.cpp CPU's FLASH_ATTN_EXT on the same q and f16 caches,
    a windowed case and GQA, with the NMSE between the two outputs (a wrong mask or head mapping on either side gives
    ~1); a GPU-only kernel asked for on the CPU is one line."""
    rc, out, err = ggml_ciq("bench", "attention", "--case", "17:5:4:1:64", "--case", "70:30:8:2:128:16", "--kernels",
                            "cpu,ggml", "--repeat", 2, "--threads", 2, "--json", tmp_path / "a.json")
    assert rc == 0, err
    saved = json.loads((tmp_path / "a.json").read_text())
    rows = saved["rows"]
    assert [(r["tokens"], r["window"], r["kernel"]) for r in rows] == [(17, 0, "cpu"), (17, 0, "ggml"), (70, 16, "cpu"),
                                                                       (70, 16, "ggml")]
    assert all(r["us"] > 0 and r["llamacpp_us"] > 0 and r["nmse_vs_llamacpp"] <= 1e-5 for r in rows), rows
    assert saved["bench"] == "attention" and set(saved["geomean_speedup"]) == {"cpu", "ggml"}
    rc, _, err = ggml_ciq("bench", "attention", "--case", "17:5:4:1:64", "--kernels", "mma", "--repeat", 1)
    assert_one_line_error(rc, err, "mma runs none of these cases on the CPU")
    # a kernel that does not run a case (ggml: head_dim a multiple of 8) is named, not dropped silently; without
    # llama.cpp the file has no speedups and stays strict JSON (no NaN)
    rc, out, err = ggml_ciq("bench", "attention", "--case", "5:0:2:1:12", "--repeat", 1, "--no-llamacpp", "--json",
                            tmp_path / "b.json")
    assert rc == 0, err
    assert "not run: 5:0:2:1:12:0 on ggml" in out
    saved = json.loads((tmp_path / "b.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert [r["kernel"] for r in saved["rows"]] == ["cpu"] and saved["geomean_speedup"] == {}
    assert saved["skipped"][0]["who"] == "ggml" and "multiple of 8" in saved["skipped"][0]["why"]


def test_info(native_lib):
    rc, out, err = ggml_ciq("info")
    assert rc == 0, err
    assert "libggml_ciq" in out and "gemma3-270m" in out


def test_bad_inputs_one_line_exit_2(tmp_path, default_model, gemma_model, llama):
    rc, _, err = ggml_ciq("diff", tmp_path / "missing.gguf")
    assert_one_line_error(rc, err, "not found", "missing.gguf")
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    rc, _, err = ggml_ciq("diff", tmp_path / "x.gguf")
    assert_one_line_error(rc, err, "not a GGUF file")
    data = default_model.path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) * 2 // 3])
    rc, _, err = ggml_ciq("diff", tmp_path / "cut.gguf")
    assert_one_line_error(rc, err, "truncated: tensor", "cut.gguf")
    rc, _, err = ggml_ciq("diff", gemma_model.path, "--tensor", "blk.0.attn_norm.weight")
    assert_one_line_error(rc, err, "blk.0.attn_norm.weight", "F32", "no kernel of ours multiplies")
    rc, _, err = ggml_ciq("diff", gemma_model.path, "--tensor", "blk.0.nope")
    assert_one_line_error(rc, err, "no tensor named blk.0.nope")
    rc, _, err = ggml_ciq("bench", "gemm", "--shape", "Q4_K:16:300")
    assert_one_line_error(rc, err, "K % 256")
    rc, _, err = ggml_ciq("diff", "--backend", "ciq-cuda", "--reference", "llamacpp-cuda")
    assert_one_line_error(rc, err, "CUDA0")


def test_unsupported_tensor_type_one_line(tmp_path, llama):
    import gguf

    from ggml_ciq.gguf_writer import gguf_file

    path = tmp_path / "q2k.gguf"
    with gguf_file(path, "llama") as writer:
        writer.add_tensor("blk.0.ffn_down.weight", np.zeros((4, 84), np.uint8),
                          raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    rc, _, err = ggml_ciq("diff", path, "--all-quantized")  # the undecodable left out (not_diffed): nothing left
    assert_one_line_error(rc, err, "no weight of a type our kernels multiply", "(Q2_K)", "none of a type ggml-ciq decodes")
    rc, _, err = ggml_ciq("diff", path)
    assert_one_line_error(rc, err, "no weight of a type our kernels multiply", "(Q2_K)", "Q4_K, Q5_K, Q6_K")
    rc, _, err = ggml_ciq("diff", path, "--tensor", "blk.0.ffn_down.weight")
    assert_one_line_error(rc, err, "blk.0.ffn_down.weight", "Q2_K", "does not decode")


@pytest.mark.parametrize("argv", [["frobnicate"], ["diff", "--tokens", "many"]])
def test_usage_errors_exit_2(argv):
    rc, _, err = ggml_ciq(*argv)
    assert_one_line_error(rc, err, "--help")


def test_bench_plot_from_saved_results(tmp_path):
    saved = Path(__file__).resolve().parent.parent / "bench" / "results" / "bench-gemm-seed6-4a93705.json"
    rc, _, err = ggml_ciq("bench", "plot", "--json", saved, "--plot", tmp_path / "p.png")
    assert rc == 0, err
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_gpu_without_gpu_is_one_line(native_lib):
    from ggml_ciq import native

    if native.device_count() > 0:
        pytest.skip("a GPU is present")
    for extra in ([], ["--ab", "wmma,mma"]):
        rc, _, err = ggml_ciq("bench", "gemm", "--backend", "ciq-cuda", "--shapes", "seed6", *extra)
        assert_one_line_error(rc, err, "no CUDA device")


def test_fetch(default_model, monkeypatch):
    rc, out, err = ggml_ciq("fetch", "default")
    assert rc == 0 and out.strip() == str(default_model.path), err
    rc, _, err = ggml_ciq("fetch", "no-such-model")
    assert_one_line_error(rc, err, "not a catalog model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, _, err = ggml_ciq("fetch", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q4_k_m.gguf", "--dir",
                          tempfile.mkdtemp())
    assert_one_line_error(rc, err, "cannot fetch Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf")


def test_prefill(llama, native_lib, gemma_model, tmp_path):
    rc, out, err = ggml_ciq("prefill", gemma_model.path, "--prompt", "The capital of France is", "--json",
                            tmp_path / "p.json")
    assert rc == 0, err
    assert "tokens/s" in out and "keep-quant GEMM" in out and "attention" in out and "Paris" in out
    assert "K/V cache" in out and "MiB" in out
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["tokens"] >= 5 and report["seconds"]["keep-quant GEMM"] > 0
    assert report["memory_bytes"] > report["kv_cache_bytes"] > 0
    rc, out, err = ggml_ciq("prefill", "--tokens", 7, "--ubatch", 3)
    assert rc == 0 and "7 tokens" in out, err
    rc, out, err = ggml_ciq("prefill", "--ids", "1,2,3")
    assert rc == 0 and "3 tokens" in out, err


def test_prefill_bad_inputs_one_line_exit_2(native_lib, tmp_path):
    from ggml_ciq import catalog
    from ggml_ciq.gguf_writer import gguf_file

    rc, _, err = ggml_ciq("prefill", "--tokens", 7, "--prompt", "x")
    assert_one_line_error(rc, err, "exactly one of")
    from ggml_ciq import native

    if native.device_count() == 0:
        rc, _, err = ggml_ciq("prefill", "--tokens", 7, "--device", "cuda")
        assert_one_line_error(rc, err, "GPU")
    rc, _, err = ggml_ciq("prefill", "--tokens", 2_000_000_000, "--ctx-size", 2_000_000_000)  # before any token is drawn
    assert_one_line_error(rc, err, "the K/V cache for 2000000000 tokens needs", "GiB of host memory is free")
    path = tmp_path / "bert.gguf"
    with gguf_file(path, "bert"):
        pass
    rc, _, err = ggml_ciq("prefill", path, "--tokens", 4)
    assert_one_line_error(rc, err, "architecture bert is not supported")
    rc, _, err = ggml_ciq("prefill", "--tokens", 40, "--ctx-size", 32)
    assert_one_line_error(rc, err, "prompt of 40 tokens is longer than the context (32 tokens)")
    rc, _, err = ggml_ciq("prefill", "--ids", "1,2,512")
    assert_one_line_error(rc, err, "token ids must be in [0, 512)")
    rc, _, err = ggml_ciq("prefill", "--ids", "1,x")
    assert_one_line_error(rc, err, "comma-separated whole numbers")
    broken = catalog.write_small_model(tmp_path / "broken.gguf", "qwen3", drop=("blk.1.attn_k_norm.weight",))
    rc, _, err = ggml_ciq("prefill", broken, "--tokens", 4)
    assert_one_line_error(rc, err, "blk.1.attn_k_norm.weight", "needed by the qwen3 architecture")


def test_bench_takes_each_variant_to_the_types_it_multiplies(native_lib):
    """bench gemm times a variant only on the weight types and token counts it multiplies (q32: the 32-block types;
    mmvq: 1..8 tokens; the rest: the K-quants), and --ab refuses a pair that share no case, before any GPU work."""
    from ggml_ciq import bench, quants
    from ggml_ciq.errors import InvalidArgumentError

    q8, q4k = bench.Shape(quants.Q8_0, 64, 256), bench.Shape(quants.Q4_K, 64, 256)
    assert bench.runs("q32", q8, 17) and not bench.runs("q32", q4k, 17)
    assert bench.runs("mma", q4k, 17) and not bench.runs("mma", q8, 17)
    assert bench.runs("mmvq", q4k, 8) and not bench.runs("mmvq", q4k, 9)
    with pytest.raises(InvalidArgumentError, match="no shape and token count that both variants multiply"):
        bench.bench_ab([q8], [17], "mma", "wgmma")


@pytest.fixture(scope="module")
def q2k_model(llama, tmp_path_factory):
    """The default model with blk.1.ffn_up.weight requantized to Q2_K by llama.cpp (a type llama.cpp runs and
    ggml-ciq does not decode)."""
    import gguf

    from ggml_ciq import catalog
    from ggml_ciq.model import ModelFile

    src = catalog.default_model_path()
    model, reader = ModelFile(src), gguf.GGUFReader(str(src))
    path = tmp_path_factory.mktemp("q2k") / "default-q2k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(f.name, f.contents(), f.types[0], f.types[1])
        else:
            writer.add_key_value(f.name, f.contents(), f.types[0])
    for t in reader.tensors:
        if t.name == "blk.1.ffn_up.weight":
            w = model.tensor(t.name).dequantize()
            blocks = llama.quantize_chunk(10, w).reshape(w.shape[0], -1)  # GGML_TYPE_Q2_K
            writer.add_tensor(t.name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q2_K)
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_type_we_do_not_decode(q2k_model, native_lib, tmp_path):
    """A Q2_K weight: diff runs every other weight and names it as not diffed (output and JSON), --all-quantized too;
    naming it with --tensor, and a prefill, fail in one line naming the tensor and the type, exit 2."""
    rc, out, err = ggml_ciq("diff", q2k_model, "--tokens", 3, "--json", tmp_path / "d.json")
    assert rc == 0 and "PASS" in out and "blk.1.ffn_up.weight (Q2_K)" in out, (out[-1500:], err)
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["not_diffed"] == [{"name": "blk.1.ffn_up.weight", "type": "Q2_K",
                                     "why": "llama.cpp only (not decoded)"}]
    assert "blk.1.ffn_up.weight" not in {t["name"] for t in report["tensors"]} and report["tensors"]
    rc, out, err = ggml_ciq("diff", q2k_model, "--tokens", 3, "--all-quantized")
    assert rc == 0 and "blk.1.ffn_up.weight (Q2_K)" in out, (out[-1500:], err)
    for args in (("diff", q2k_model, "--tensor", "blk.1.ffn_up.weight"),
                 ("prefill", q2k_model, "--prompt", "The capital of France is")):
        rc, out, err = ggml_ciq(*args)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and "blk.1.ffn_up.weight" in lines[0] and "Q2_K" in lines[0], (args, err)
        assert "Traceback" not in err
