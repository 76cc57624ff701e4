"""tools/make_synthetic_arch.py's shapes: the small models the tests run, and the mixture-of-experts models at their
published widths (--shape) that tools/bench/bench_model.py --real-width measures beside llama.cpp."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from support import REPO
from support.synthetic import generator

from minillama.model import Model

T = gguf.GGMLQuantizationType




def test_qwen3moe_30b_a3b_is_qwen3_30b_a3bs_width() -> None:
    """Qwen3-30B-A3B's config.json: hidden 2048, 32 heads and 4 kv heads of 128, 128 experts of 768, 8 used, 48
    layers; a Q4_K_M file's types (Q4_K, output Q6_K) and the real 151,936-token vocab."""
    gen = generator()
    c = gen.model_config("qwen3moe", "30b-a3b")
    got = {k: c[k] for k in ("n_embd", "n_head", "n_head_kv", "key_length", "n_expert", "n_expert_used", "n_ff_exp",
                             "n_layer")}
    assert got == {"n_embd": 2048, "n_head": 32, "n_head_kv": 4, "key_length": 128, "n_expert": 128,
                   "n_expert_used": 8, "n_ff_exp": 768, "n_layer": 48}
    assert c["types"]["exps_gate"] == c["types"]["exps_up"] == T.Q4_K and c["types"]["output"] == T.Q6_K
    assert len(gguf.GGUFReader(c["vocab"]).fields["tokenizer.ggml.tokens"].data) == 151936
    assert gen.model_config("qwen3moe", "30b-a3b", layers=8)["n_layer"] == 8


def test_gpt_oss_20b_is_gpt_oss_20bs_width() -> None:
    """gpt-oss-20b's config.json: hidden 2880, 64 heads and 8 kv heads of 64, 32 experts of 2880, 4 used, a sliding
    window of 128, 24 layers; MXFP4 experts and Q8_0 elsewhere."""
    c = generator().model_config("gpt-oss", "20b")
    got = {k: c[k] for k in ("n_embd", "n_head", "n_head_kv", "key_length", "n_expert", "n_expert_used", "n_ff_exp",
                             "sliding_window", "n_layer")}
    assert got == {"n_embd": 2880, "n_head": 64, "n_head_kv": 8, "key_length": 64, "n_expert": 32,
                   "n_expert_used": 4, "n_ff_exp": 2880, "sliding_window": 128, "n_layer": 24}
    assert "types" not in c  # TYPES' own: MXFP4 experts, Q8_0 matrices (2,880 is no multiple of a K-quant's 256)


def test_q4_k_m_gives_more_bits_where_llamacpp_does() -> None:
    """llama.cpp's use_more_bits on Qwen3-30B-A3B's 48 layers: the first and last six, and every third between
    from layer 8 (its Q4_K_M files' Q6_K attn_v and ffn_down_exps)."""
    gen = generator()
    more = [i for i in range(48) if gen.use_more_bits(i, 48)]
    assert more == [0, 1, 2, 3, 4, 5, *range(8, 42, 3), 42, 43, 44, 45, 46, 47]
    assert [i for i in range(8) if gen.use_more_bits(i, 8)] == [0, 3, 6, 7]


def test_layers_sets_the_block_count(tmp_path: Path) -> None:
    """--layers makes a model of that many blocks, which minillama loads."""
    out = tmp_path / "m.gguf"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic_arch.py"), "qwen3moe", str(out),
                    "--layers", "3"], check=True, capture_output=True)
    assert Model.from_file(out).hparams.n_layer == 3


def test_an_unknown_shape_names_the_known_ones(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic_arch.py"), "qwen3moe",
                           str(tmp_path / "m.gguf"), "--shape", "7b"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "no shape '7b' for qwen3moe" in proc.stderr and "30b-a3b" in proc.stderr


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_small_is_the_default_shape(arch: str) -> None:
    gen = generator()
    assert gen.model_config(arch) == gen.model_config(arch, "small") == gen.ARCHS[arch]
