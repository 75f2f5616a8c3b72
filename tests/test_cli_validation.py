"""Every CLI argument is checked before any work starts: each subcommand with each invalid value exits 2 with one
line naming the problem in the user's terms (no traceback, no exception class, no usage block).

The table runs in-process with every command function replaced by one that fails the test, so a case passes only
if the value is refused before the command starts; a sample runs as real processes, and the checks that need the
model (tensor names, token ids) run the real commands.
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ggml_ciq import cli

INTERNAL = re.compile(r"Traceback|[A-Za-z]+(Error|Exception)\b|usage:|invalid int value|invalid float value")


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "file.txt").write_text("x")
    (tmp / "saved.json").write_text("{}")
    return {"<DIR>": str(tmp), "<FILE>": str(tmp / "file.txt"), "<UNDER_FILE>": str(tmp / "file.txt" / "out.json"),
            "<SAVED>": str(tmp / "saved.json"), "<MISSING>": str(tmp / "missing.json"), "<PNG>": str(tmp / "p.png")}


INVALID = [
    # (argv, words the one line must contain); <DIR>, <FILE>, ... are replaced by the places fixture's paths
    ([], "the following arguments are required: command"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["diff", "--tokens", "-5"], "argument --tokens: must be >= 1, got -5"),
    (["diff", "--tokens", "0"], "argument --tokens: must be >= 1, got 0"),
    (["diff", "--tokens", "1.5"], "argument --tokens: expects a whole number, got '1.5'"),
    (["diff", "--tokens", "many"], "argument --tokens: expects a whole number, got 'many'"),
    (["diff", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["diff", "--backend", "gpu"], "unknown --backend 'gpu' (choose from auto, reference, ciq-cpu, ciq-cuda)"),
    (["diff", "--reference", "llamacpp-metal"], "unknown --reference 'llamacpp-metal'"),
    (["diff", "--variant", "turbo"], "argument --variant: unknown kernel variant 'turbo'"),
    (["diff", "--backend", "ciq-cpu", "--variant", "wgmma"], "--variant wgmma is a GPU kernel"),
    (["diff", "--backend", "reference", "--variant", "mma"], "--variant mma is a GPU kernel"),
    (["diff", "--bar", "0"], "argument --bar: must be a finite number > 0, got 0"),
    (["diff", "--bar=-1e-3"], "argument --bar: must be a finite number > 0, got -1e-3"),
    (["diff", "--bar", "nan"], "argument --bar: must be a finite number > 0, got nan"),
    (["diff", "--bar", "inf"], "argument --bar: must be a finite number > 0, got inf"),
    (["diff", "--bar", "tight"], "argument --bar: expects a number, got 'tight'"),
    (["diff", "--threads", "0"], "argument --threads: must be from 1 to 512, got 0"),
    (["diff", "--threads", "100000"], "argument --threads: must be from 1 to 512, got 100000"),
    (["diff", "--layer-bar", "1e-3"], "--layer-bar belong to diff --prompt"),
    (["diff", "--flash-attn", "on"], "--flash-attn belong to diff --prompt"),
    (["diff", "--spread", "on"], "--spread belong to diff --prompt"),
    (["diff", "--prompt", "hi", "--spread", "maybe"], "argument --spread: invalid choice"),
    (["diff", "--flash-attn", "maybe"], "argument --flash-attn: invalid choice: 'maybe'"),
    (["diff", "--prompt", "  "], "argument --prompt: is empty"),
    (["diff", "--prompt", "hi", "--layer-bar", "0"], "argument --layer-bar: must be a finite number > 0"),
    (["diff", "--prompt", "hi", "--tokens", "5"], "--tokens belong to the random-activation diff"),
    (["diff", "--prompt", "hi", "--backend", "ciq-cpu", "--tensor", "x"], "--backend, --tensor belong to"),
    (["diff", "--json", "<DIR>"], "argument --json: <DIR> is a directory"),
    (["diff", "--json", "<UNDER_FILE>"], "cannot write <UNDER_FILE>: <FILE> is not a directory"),
    (["diff", "--frob"], "unrecognized arguments: --frob"),
    (["diff", "a.gguf", "b.gguf"], "unrecognized arguments: b.gguf"),
    (["bench"], "the following arguments are required: op"),
    (["bench", "frob"], "argument op: invalid choice: 'frob'"),
    (["bench", "gemm", "--backend", "ciq-metal"], "argument --backend: invalid choice: 'ciq-metal'"),
    (["bench", "gemm", "--shape", "Q4_K:16:300"], "argument --shape: Q4_K rows need K % 256 == 0, got K=300"),
    (["bench", "gemm", "--shape", "Q4_K:0:256"], "--shape Q4_K:0:256: ROWS and K must be >= 1"),
    (["bench", "gemm", "--shape", "Q4_K:-1:256"], "expected TYPE:ROWS:K"),
    (["bench", "gemm", "--shape", "Q4_K:16"], "expected TYPE:ROWS:K"),
    (["bench", "gemm", "--shape", "F16:16:256"], "our GEMM kernels take Q4_K, Q6_K, Q5_K, Q4_0, Q5_0, Q8_0, Q4_1, Q5_1"),
    (["bench", "gemm", "--shapes", "llama4"], "unknown shape set 'llama4'"),
    (["bench", "gemm", "--tokens", "0"], "argument --tokens: must be >= 1, got 0"),
    (["bench", "gemm", "--tokens", "8,,16"], "argument --tokens: expects comma-separated whole numbers"),
    (["bench", "gemm", "--tokens", "a,b"], "argument --tokens: expects comma-separated whole numbers"),
    (["bench", "gemm", "--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    (["bench", "gemm", "--threads", "-2"], "argument --threads: must be from 1 to 512, got -2"),
    (["bench", "gemm", "--variants", "mma,turbo"], "argument --variants: unknown kernel variant 'turbo'"),
    (["bench", "gemm", "--variants", "mma"], "--variants belong to --backend ciq-cuda"),
    (["bench", "gemm", "--no-ceiling", "--plot", "<PNG>"], "--no-ceiling, --plot belong to --backend ciq-cuda"),
    (["bench", "gemm", "--backend", "ciq-cuda", "--threads", "4"], "--threads sets our CPU kernels' threads"),
    (["bench", "gemm", "--backend", "ciq-cuda", "--ab", "mma"], "--ab takes two variants"),
    (["bench", "attention", "--case", "512:0:32:8"], "expected TOKENS:N_PAST:HEADS:HEADS_KV:HEAD_DIM[:WINDOW]"),
    (["bench", "attention", "--case", "512:0:6:4:128"], "6 heads cannot share 4 K/V heads"),
    (["bench", "attention", "--case", "0:0:4:1:128"], "TOKENS, HEADS, HEADS_KV and HEAD_DIM must be >= 1"),
    (["bench", "attention", "--cases", "llama4"], "unknown case set 'llama4'"),
    (["bench", "attention", "--kernels", "cpu,flash"], "unknown attention kernel 'flash'"),
    (["bench", "attention", "--shape", "Q4_K:256:256"], "unrecognized arguments: --shape Q4_K:256:256"),
    (["bench", "gemm", "--cases", "llama3-8b"], "unrecognized arguments: --cases llama3-8b"),
    (["bench", "attention", "--backend", "ciq-cuda", "--threads", "2"], "--threads sets the CPU threads"),
    (["bench", "gemm", "--backend", "ciq-cuda", "--ab", "mma,wgmma", "--variants", "mma"], "--variants belong to"),
    (["bench", "gemm", "--backend", "ciq-cuda", "--plot", "<FILE>"], "argument --plot: <FILE> must end in .png"),
    (["bench", "gemm", "--json", "<DIR>"], "argument --json: <DIR> is a directory"),
    (["bench", "plot"], "bench plot needs --json SAVED_FILE and --plot OUT.png"),
    (["bench", "plot", "--json", "<MISSING>", "--plot", "<PNG>"], "no saved results at <MISSING>"),
    (["bench", "plot", "--json", "<SAVED>", "--plot", "<PNG>", "--repeat", "3"], "unrecognized arguments: --repeat 3"),
    (["bench", "plot", "--json", "<SAVED>", "--plot", "<DIR>"], "argument --plot: <DIR> must end in .png"),
    (["prefill"], "give exactly one of --prompt TEXT, --tokens N and --ids LIST"),
    (["prefill", "--tokens", "3", "--ids", "1"], "give exactly one of"),
    (["prefill", "--tokens", "0"], "argument --tokens: must be >= 1, got 0"),
    (["prefill", "--tokens", "-5"], "argument --tokens: must be >= 1, got -5"),
    (["prefill", "--ids", ""], "argument --ids: expects comma-separated whole numbers, got ''"),
    (["prefill", "--ids", "1,-2"], "argument --ids: must be >= 0, got -2"),
    (["prefill", "--ids", "1,x"], "argument --ids: expects comma-separated whole numbers, got '1,x'"),
    (["prefill", "--prompt", ""], "argument --prompt: is empty"),
    (["prefill", "--tokens", "3", "--seed", "-1"], "argument --seed: must be >= 0"),
    (["prefill", "--tokens", "3", "--top", "0"], "argument --top: must be >= 1"),
    (["prefill", "--tokens", "3", "--cuda-graph"], "--cuda-graph runs the prefill as CUDA graphs: it needs --device cuda"),
    (["prefill", "--tokens", "3", "--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    (["prefill", "--tokens", "3", "--device", "tpu"], "argument --device: unknown device 'tpu'"),
    (["prefill", "--tokens", "3", "--device", "cuda:x"], "argument --device: unknown device 'cuda:x'"),
    (["prefill", "--tokens", "3", "--device", "cuda:-1"], "argument --device: unknown device 'cuda:-1'"),
    (["prefill", "--tokens", "3", "--ctx-size", "0"], "argument --ctx-size: must be >= 1"),
    (["prefill", "--tokens", "3", "--ubatch", "0"], "argument --ubatch: must be >= 1"),
    (["prefill", "--tokens", "40", "--ctx-size", "32"], "a prompt of 40 tokens is longer than the context (32"),
    (["prefill", "--tokens", "3", "--json", "<DIR>"], "argument --json: <DIR> is a directory"),
    (["compare", "--tokens", "0"], "argument --tokens: must be >= 1, got 0"),
    (["compare", "--tokens", "-5"], "argument --tokens: must be >= 1, got -5"),
    (["compare", "--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    (["compare", "--cuda-graph", "--reference", "off"], "--cuda-graph times our prefills as CUDA graphs: it needs --device cuda"),
    (["compare", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["compare", "--threads", "0"], "argument --threads: must be from 1 to 512"),
    (["compare", "--flash-attn", "yes"], "argument --flash-attn: invalid choice: 'yes'"),
    (["compare", "--prompt", " "], "argument --prompt: is empty"),
    (["compare", "--semantics", "fast,fast"], "argument --semantics: expects distinct names from llamacpp, exact, fast"),
    (["compare", "--semantics", "quick"], "argument --semantics: expects distinct names from llamacpp, exact, fast"),
    (["prefill", "--semantics", "quick"], "argument --semantics: invalid choice: 'quick'"),
    (["compare", "--plot", "<FILE>"], "argument --plot: <FILE> must end in .png or .svg or .pdf"),
    (["compare", "--json", "<UNDER_FILE>"], "cannot write <UNDER_FILE>: <FILE> is not a directory"),
    (["fetch"], "the following arguments are required: model"),
    (["fetch", "gemma3-1b"], "'gemma3-1b' is not a catalog model"),
    (["fetch", "default", "--dir", "<DIR>"], "--dir is where hub downloads go"),
    (["fetch", "owner", "model.gguf"], "REPO_ID as owner/name, got 'owner'"),
    (["fetch", "a/b/c", "model.gguf"], "REPO_ID as owner/name, got 'a/b/c'"),
    (["fetch", "owner/repo", "model.gguf", "--dir", "<FILE>"], "argument --dir: <FILE> is not a directory"),
    (["info", "--verbose"], "unrecognized arguments: --verbose"),
]


def _fill(text: str, places: dict) -> str:
    for key, path in places.items():
        text = text.replace(key, path)
    return text


def _run(argv, capsys) -> tuple[int, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("argv, words", INVALID, ids=[" ".join(a) or "(nothing)" for a, _ in INVALID])
def test_invalid_argument_is_one_line_before_any_work(argv, words, places, capsys, monkeypatch):
    def work_started(args):
        pytest.fail(f"{' '.join(argv)}: the command started")

    for name in dir(cli):
        if name.startswith("cmd_"):
            monkeypatch.setattr(cli, name, work_started)
    argv, words = [_fill(a, places) for a in argv], _fill(words, places)
    rc, err = _run(argv, capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("ggml-ciq: error: ") and words in lines[0], lines[0]
    assert not INTERNAL.search(lines[0]), lines[0]


@pytest.mark.parametrize("argv, words", [(["diff", "--tokens", "-5"], "must be >= 1, got -5"),
                                         (["bench", "gemm", "--shape", "Q4_K:16:300"], "K % 256"),
                                         (["prefill", "--ids", "1,x"], "comma-separated whole numbers")])
def test_as_a_process(argv, words):
    """The console entry point as a user meets it: no usage block, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "ggml_ciq.cli", *argv], capture_output=True, text=True, timeout=120,
                          cwd=tempfile.gettempdir())
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and not INTERNAL.search(lines[0]), proc.stderr


def test_attention_diff_tool_bad_model_is_one_line(tmp_path):
    """tools/attention_diff.py (issue 18's GPU check) on a model path that does not exist: one line, exit 2, before
    any GPU work."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "tools" / "attention_diff.py"), str(tmp_path / "none.gguf"),
                           "--json", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "none.gguf" in lines[0] and "Traceback" not in proc.stderr, \
        proc.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("args, words", [(["{missing}"], "none.gguf: no such file"),
                                         (["{missing}", "--tokens", "600"], "--tokens must be in 1..512")])
def test_layer_trace_tool_bad_input_is_one_line(tmp_path, args, words):
    """tools/layer_trace.py (issue 18's per-op trace) on a missing model or a token count past one micro-batch: one
    line, exit 2, no JSON written."""
    root = Path(__file__).resolve().parents[1]
    argv = [a.format(missing=tmp_path / "none.gguf") for a in args] + ["--device", "cpu", "--json", str(tmp_path / "o.json")]
    proc = subprocess.run([sys.executable, str(root / "tools" / "layer_trace.py"), *argv], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, \
        proc.stderr
    assert not (tmp_path / "o.json").exists()


def test_checks_that_need_the_model(native_lib, llama, capsys):
    """The model argument, then tensor names, token ids and the memory a diff or benchmark needs (against the model
    once it is open), before any GEMM or prefill."""
    for argv, words in [(["diff", "gemma3-270"], "'gemma3-270' is neither a file nor a catalog model (default, "),
                        (["prefill", "missing.gguf", "--tokens", "3"], "model file not found: missing.gguf"),
                        (["diff", "--tensor", "blk.0.attn_qq.weight"], "blk.0.attn_qq.weight"),
                        (["diff", "--tokens", "100000000", "--backend", "ciq-cpu"],
                         "--tokens 100000000: the diff of blk.0.ffn_gate.weight (1536 x 512) needs about 7438.7 GiB"),
                        (["bench", "gemm", "--shape", "Q4_K:4096:4096", "--tokens", "8,100000000"],
                         "bench gemm at 100000000 tokens on 4096 x 4096 needs about 9155.3 GiB of host memory"),
                        (["prefill", "--ids", "1,2,512"], "token ids must be in [0, 512)")]:
        rc, err = _run(argv, capsys)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and words in lines[0] and not INTERNAL.search(lines[0]), err
