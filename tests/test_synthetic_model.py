"""models/llama3_8b_synthetic.py: a shrunken Llama-3-8B-shaped Q4_K_M file that llama.cpp loads and tokenizes."""

import subprocess
import sys
from pathlib import Path

import pytest

from ggml_ciq import catalog
from ggml_ciq import quants as Q
from ggml_ciq.model import ModelFile

import llamacpp_python  # tests/llamacpp_python.py

CHECKOUT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def recipe():
    return catalog.load_recipe("llama3_8b_synthetic")


def test_recipe_travels_with_the_package():
    """The catalog finds its recipe wherever ggml_ciq is imported from: an installed (non-editable) package carries
    it in ggml_ciq/recipes/, byte for byte the checkout's models/ copy (CI runs the tests on such an install)."""
    import ggml_ciq

    path = catalog.recipe_path("llama3_8b_synthetic")
    package = Path(ggml_ciq.__file__).resolve().parent
    if package.parent != CHECKOUT:  # an install: the recipe must come from the package, not from this checkout
        assert path == package / "recipes" / "llama3_8b_synthetic.py"
    assert path.read_bytes() == (CHECKOUT / "models" / "llama3_8b_synthetic.py").read_bytes()


def test_q4_k_m_rule_for_32_layers(recipe):
    types = recipe.q4_k_m_types(32)
    six = sorted(int(n.split(".")[1]) for n, t in types.items() if "attn_v" in n and t == Q.Q6_K)
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]  # llama-quantize's use_more_bits
    assert types["output.weight"] == Q.Q6_K and types["token_embd.weight"] == Q.Q4_K


def test_small_synthetic_model(recipe, llama, tmp_path):
    out = recipe.write(tmp_path / "syn.gguf", catalog.llama3_vocab_path(), layers=2, embedding=256, ff=512)
    m = ModelFile(out)
    c = m.config
    assert (c.architecture, c.block_count, c.embedding_length, c.vocab_size, c.rope_freq_base) == \
        ("llama", 2, 256, 128256, 500000.0)
    types = {t.name: t.type_name for t in m.weights()}
    assert types["blk.1.ffn_down.weight"] == "Q6_K" and types["blk.0.ffn_down.weight"] == "Q4_K"
    w = m.tensor("blk.0.ffn_up.weight").dequantize()
    assert abs(float(w.std()) - 0.02) < 0.002  # N(0, 0.02) through llama.cpp's Q4_K quantizer
    script = llamacpp_python.script(f"""
        import llama_cpp
        model = llama_cpp.Llama({str(out)!r}, n_ctx=32, verbose=False)
        print(model.tokenize(b"Hello world")[:3])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[128000, 9906, 1917]"  # BOS, "Hello", " world" in the Llama 3 tokenizer
