"""Write a Llama-3-8B-shaped Q4_K_M GGUF: the real Llama 3 tokenizer and hyperparameters from llama.cpp's
vocab-only GGUF, random N(0, 0.02) weights quantized by llama.cpp's own quantizer (ggml_quantize_chunk).

    python3 models/llama3_8b_synthetic.py OUT.gguf --vocab ggml-vocab-llama-bpe.gguf [--layers 32]

Real 8B weights cannot be downloaded here; this gives the same shapes and type mix (4.6 GiB for 32 layers). The
file is streamed tensor by tensor (peak memory ~ one 14336 x 4096 float32 matrix). `--embedding/--ff/--layers`
shrink it for tests; the vocabulary (128256 tokens) always stays.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggml_ciq import quants  # noqa: E402
from ggml_ciq.errors import CiqError  # noqa: E402
from ggml_ciq.gguf_writer import add_blocks_info, gguf_file, start_tensor_data  # noqa: E402

F32 = 0


def q4_k_m_types(n_layer: int) -> dict[str, int]:
    """llama-quantize's Q4_K_M rule: Q6_K for attn_v/ffn_down in the first and last eighth of the layers and every
    third layer between, Q6_K for output, Q4_K elsewhere."""
    types = {"token_embd.weight": quants.Q4_K, "output.weight": quants.Q6_K}
    for i in range(n_layer):
        more_bits = i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2
        for name in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            types[f"blk.{i}.{name}.weight"] = quants.Q4_K
        for name in ("attn_v", "ffn_down"):
            types[f"blk.{i}.{name}.weight"] = quants.Q6_K if more_bits else quants.Q4_K
    return types


def tensor_shapes(n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, n_vocab: int):
    """(name, [rows, cols] or [n]) in llama.cpp's order."""
    kv = n_embd // n_head * n_head_kv
    yield "token_embd.weight", (n_vocab, n_embd)
    for i in range(n_layer):
        yield f"blk.{i}.attn_norm.weight", (n_embd,)
        yield f"blk.{i}.attn_q.weight", (n_embd, n_embd)
        yield f"blk.{i}.attn_k.weight", (kv, n_embd)
        yield f"blk.{i}.attn_v.weight", (kv, n_embd)
        yield f"blk.{i}.attn_output.weight", (n_embd, n_embd)
        yield f"blk.{i}.ffn_norm.weight", (n_embd,)
        yield f"blk.{i}.ffn_gate.weight", (n_ff, n_embd)
        yield f"blk.{i}.ffn_up.weight", (n_ff, n_embd)
        yield f"blk.{i}.ffn_down.weight", (n_embd, n_ff)
    yield "output_norm.weight", (n_embd,)
    yield "output.weight", (n_vocab, n_embd)


def write(out: Path, vocab: Path, layers: int | None = None, embedding: int | None = None, ff: int | None = None,
          seed: int = 0, progress=None) -> Path:
    import gguf

    from ggml_ciq.llamacpp import LlamaCpp
    from ggml_ciq.model import ModelFile

    base = ModelFile(vocab)
    if base.config.architecture != "llama":
        raise CiqError(f"{vocab}: expected a llama vocab GGUF, got architecture {base.config.architecture}")
    c = base.config
    n_layer = layers or c.block_count
    n_embd = embedding or c.embedding_length
    n_ff = ff or c.feed_forward_length
    head_dim = c.embedding_length // c.head_count
    n_head = n_embd // head_dim
    n_head_kv = max(1, c.head_count_kv * n_head // c.head_count)
    for name, value in (("embedding", n_embd), ("ff", n_ff)):
        if value % 256:
            raise CiqError(f"--{name} {value} is not a multiple of 256 (K-quant rows)")
    llama = LlamaCpp.load()
    with gguf_file(out, "llama") as writer:
        for key, kv in base.fields.items():
            if key in ("general.architecture", "general.file_type") or key.startswith("llama."):
                continue
            sub_type = None if kv.item_type is None else gguf.GGUFValueType(kv.item_type)
            writer.add_key_value(key, kv.value, gguf.GGUFValueType(kv.value_type), sub_type=sub_type)
        writer.add_name(f"synthetic Llama-3-8B shape ({n_layer} layers, n_embd {n_embd}, random weights, Q4_K_M)")
        writer.add_block_count(n_layer)
        writer.add_context_length(c.context_length)
        writer.add_embedding_length(n_embd)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(c.rope_freq_base)
        writer.add_layer_norm_rms_eps(c.rms_norm_eps)
        writer.add_vocab_size(c.vocab_size)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)

        types = q4_k_m_types(n_layer)
        shapes = list(tensor_shapes(n_layer, n_embd, n_ff, n_head, n_head_kv, c.vocab_size))
        for name, shape in shapes:
            if len(shape) == 1:
                writer.add_tensor_info(name, shape, np.dtype(np.float32), shape[0] * 4)
            else:
                add_blocks_info(writer, name, types[name], shape[0], shape[1])
        start_tensor_data(writer)

        def piece(index: int, name: str, shape, r0: int, r1: int) -> np.ndarray:
            """Rows r0..r1 of a tensor, from their own random stream (the file does not depend on the thread count)."""
            rng = np.random.default_rng([seed, index, r0])
            if len(shape) == 1:
                return (1.0 + 0.05 * rng.standard_normal(shape[0])).astype(np.float32)
            w = rng.standard_normal((r1 - r0, shape[1]), dtype=np.float32)
            w *= np.float32(0.02)
            return llama.quantize_chunk(types[name], w).reshape(r1 - r0, -1)

        # Row blocks of ~16M values are generated and quantized on every core (numpy and ggml_quantize_chunk run
        # without the GIL) and written in order, a bounded number in flight.
        pieces = []
        for index, (name, shape) in enumerate(shapes):
            step = shape[0] if len(shape) == 1 else max(1, (1 << 24) // shape[1])
            pieces += [(index, name, shape, r0, min(r0 + step, shape[0])) for r0 in range(0, shape[0], step)]
        workers = os.cpu_count() or 1
        with ThreadPoolExecutor(workers) as pool:
            pending, parts = deque(), []
            for i, args in enumerate(pieces):
                pending.append((args, pool.submit(piece, *args)))
                while pending and (len(pending) > 2 * workers or i == len(pieces) - 1):
                    (index, name, shape, r0, r1), future = pending.popleft()
                    parts.append(future.result())
                    if r1 == shape[0]:  # the tensor's last piece
                        writer.write_tensor_data(parts[0] if len(parts) == 1 else np.concatenate(parts))
                        parts = []
                        if progress:
                            progress(name)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=Path, required=True, help="llama.cpp's models/ggml-vocab-llama-bpe.gguf")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--embedding", type=int, help="n_embd (default 4096; multiple of 256)")
    parser.add_argument("--ff", type=int, help="n_ff (default 14336; multiple of 256)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        write(args.out, args.vocab, args.layers, args.embedding, args.ff, args.seed,
              progress=lambda name: print(name, file=sys.stderr))
    except CiqError as exc:
        print(f"llama3_8b_synthetic: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
