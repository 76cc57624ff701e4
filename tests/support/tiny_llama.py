"""A tiny llama GGUF of float32 weights (random, seeded), written with gguf's GGUFWriter: the base that the hostile
model tests mutate one key or offset of, and that the kernel tests quantize."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

V = gguf.GGUFValueType
D, FF, HEADS, HEADS_KV, VOCAB = 32, 64, 4, 2, 40

#: key (after "llama.") -> (value, GGUF type) of a sound tiny model.
GOOD_KEYS: dict[str, tuple[object, object]] = {
    "block_count": (1, V.UINT32), "context_length": (16, V.UINT32), "embedding_length": (D, V.UINT32),
    "feed_forward_length": (FF, V.UINT32), "attention.head_count": (HEADS, V.UINT32),
    "attention.head_count_kv": (HEADS_KV, V.UINT32), "attention.layer_norm_rms_epsilon": (1e-5, V.FLOAT32),
}


def block_tensors(il: int) -> dict[str, tuple[int, ...]]:
    """numpy shapes (ne1, ne0) of block il's tensors."""
    kv = HEADS_KV * D // HEADS
    return {f"blk.{il}.attn_norm.weight": (D,), f"blk.{il}.attn_q.weight": (D, D), f"blk.{il}.attn_k.weight": (kv, D),
            f"blk.{il}.attn_v.weight": (kv, D), f"blk.{il}.attn_output.weight": (D, D),
            f"blk.{il}.ffn_norm.weight": (D,), f"blk.{il}.ffn_gate.weight": (FF, D),
            f"blk.{il}.ffn_up.weight": (FF, D), f"blk.{il}.ffn_down.weight": (D, FF)}


def write_model(path: Path, keys: dict[str, tuple[object, object]] | None = None, blocks: int = 1,
                n_vocab: int = VOCAB, tokens: int | None = VOCAB, default_vocab: bool = False) -> Path:
    """A tiny llama GGUF: GOOD_KEYS (block_count = blocks) updated by keys, tensors for `blocks` blocks, a token_embd of n_vocab rows and
    a vocab of `tokens` tokens (None: no tokenizer keys); with default_vocab, the packaged demo vocab instead
    (add_default_vocab, n_vocab its size): a tiny model that speaks real text."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (value, vtype) in {**GOOD_KEYS, "block_count": (blocks, V.UINT32), **(keys or {})}.items():
        w.add_key_value(f"llama.{key}", value, vtype)
    if default_vocab:
        n_vocab = add_default_vocab(w)
    elif tokens is not None:
        w.add_tokenizer_model("llama")
        w.add_token_list([f"t{i}" for i in range(tokens)])
    shapes = {"token_embd.weight": (n_vocab, D), "output_norm.weight": (D,)}
    for il in range(blocks):
        shapes.update(block_tensors(il))
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_default_vocab(w: gguf.GGUFWriter) -> int:
    """Write the packaged demo vocab (1,000 tokens, byte-level BPE) into w's tokenizer keys, without a BOS added;
    its size, the rows token_embd needs: a tiny model that speaks real text."""
    from minillama.gguffile import read_gguf
    from minillama.tokenizer import default_vocab_path

    md = read_gguf(default_vocab_path(), tensors=False).metadata
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    w.add_tokenizer_pre(md["tokenizer.ggml.pre"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_types([int(t) for t in md["tokenizer.ggml.token_type"]])
    w.add_token_merges(md["tokenizer.ggml.merges"])
    w.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    w.add_add_bos_token(False)
    return len(md["tokenizer.ggml.tokens"])
