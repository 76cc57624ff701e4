"""Tiny qwen2 / qwen3 / phi3 / llama / mistral3 / qwen3moe GGUFs with random weights: models of architectures whose real weights cannot
be downloaded here, small enough (under 1 MB) for a test to make and for llama.cpp to run in a second.

    python tools/make_synthetic_arch.py NAME OUT.gguf [--shape SHAPE] [--layers N] [--seed N]  (NAME: a key of ARCHS)
    python tools/make_synthetic_arch.py --expected tests/data/archs_llamacpp_greedy.json [--only NAME ...]
    python tools/make_synthetic_arch.py --server-fed tests/data/llamacpp_server_fed.json [--gguf REAL.gguf ...]

The vocab is minillama's demo vocab (minillama/data/default-vocab.gguf, 1,000 byte-level BPE tokens; llama.cpp
loads it). The weights are Gaussian, scaled so activations stay in range; norm weights are drawn around 1 and
the biases around 0, so a forward pass that skips one of them disagrees with llama.cpp. Matrices are quantized
(Q8_0, Q4_0, Q4_1, Q5_1, and Q4_K for the experts' gate and up: the types llama.cpp's own ggml_quantize_chunk writes, called through cffi when the
xllamacpp wheel is installed, as ../shared/tools/make_synthetic_model.py does; otherwise gguf-py's numpy
quantizers, which write the same bytes for the 32-value types and have none for Q4_K: qwen3moe needs the wheel). The same arch and seed give the same file, byte for
byte: tests/model/test_model_archs.py checks its sha256 before comparing with llama.cpp's stored outputs
(tests/data/archs_llamacpp_greedy.json, made by --expected from these files). Beside one plain model per
architecture: "llama" is Llama-3.2-shaped (rope base 500000, rope_freqs.weight as the converter computes llama3
rope scaling, long prompts), and the "-biases" models carry the optional biases llama.cpp loads. "qwen3moe" is
qwen3's attention with a mixture-of-experts feed-forward: 8 experts of which 2 are used per token, each expert's
gate, up and down one matrix of a 3-D tensor (ffn_gate_exps, ffn_up_exps, ffn_down_exps), the router
(ffn_gate_inp) float32 as llama.cpp's quantizer leaves it. --only remakes
the named models' entries of an existing --expected file and keeps the others as they are.

--shape small (the default) is the tests' model; the other shapes (SHAPES) are the published models' widths for
benchmarks (tools/bench/bench_model.py --real-width): qwen3moe --shape 30b-a3b (Qwen3-30B-A3B as Q4_K_M) and
gpt-oss --shape 20b (gpt-oss-20b, MXFP4 experts), with the real 151,936-token vocab of
../shared/vocab/ggml-vocab-qwen35.gguf; --layers N keeps N of their blocks (8 and 6: about 3 GB).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
ROOT = Path(__file__).resolve().parents[1]
VOCAB = ROOT / "minillama" / "data" / "default-vocab.gguf"
SHARED = Path(os.environ.get("MINILLAMA_SHARED", ROOT.parent / "shared"))
N_PREDICT = 32
#: Models with "long_prompts" are also run on prompts of LONG_TOKENS tokens taken at these character offsets of
#: minillama/data/default-corpus.txt: llama3 rope factors slow down only the pairs whose wavelength exceeds 2048
#: positions, so they change little before a few hundred positions.
LONG_AT = (0, 12000, 24000)
LONG_TOKENS = 1200

#: Llama 3.2's rope_scaling in its config.json (rope_type "llama3"): llama.cpp's converter turns it into the
#: rope_freqs.weight tensor (llama3_rope_factors), which llama.cpp divides each pair's rotation angle by.
LLAMA32_ROPE = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

#: The bias tensors llama.cpp loads, when a file has them, for LLM_ARCH_LLAMA (all optional there): the
#: llama-biases model has every one, each drawn around 0.
LLAMA_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias",
                "ffn_down.bias")

#: qwen35's gated DeltaNet layers: conv kernel 4, 2 key heads and 4 value heads of 16 (as Qwen3.5's 16 and 32 of
#: 128), so value heads share key heads; every 2nd layer is full attention (Qwen3.5: every 4th).
QWEN35_SSM = {"conv_kernel": 4, "state_size": 16, "group_count": 2, "time_step_rank": 4}

#: The rerank prompt of the "qwen3-reranker" model (as Qwen3-Reranker's conversion writes one, shorter): llama-server
#: puts the query and the document in, then encodes it with control tokens matched.
RERANK_TEMPLATE = "<|endoftext|>Query: {query}\nDocument: {document}\nRelevant:"

#: The shapes and settings of each architecture's model (all small; rows are whole Q8_0/Q4_x blocks of 32).
#: key_length: written only when set (qwen3's heads are wider than n_embd / n_head, as Qwen3's own are).
#: tied: no output.weight, the embedding is the output matrix (all False: a tied output on random weights predicts
#: one of a handful of tokens, whatever the input). n_rot: rope.dimension_count, written only when set (phi3
#: rotates part of each head, as Phi-4-mini does; qwen2/qwen3 must rotate all of it). sliding_window: phi3 writes one, as Phi-3's files
#: do, and llama.cpp ignores it for phi3 (SWA disabled), so it is shorter than the test sequences on purpose.
#: layout: the block tensors of another architecture (mistral3's are llama's).
ARCHS: dict[str, dict[str, Any]] = {
    "qwen2": {"n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 320, "n_ctx": 4096,
              "rope_base": 1000000.0, "eps": 1e-6, "tied": False},
    "qwen3": {"n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "key_length": 64, "n_ff": 320,
              "n_ctx": 4096, "rope_base": 1000000.0, "eps": 1e-6, "tied": False},
    "phi3": {"n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 320, "n_ctx": 4096,
             "rope_base": 10000.0, "eps": 1e-5, "tied": False, "sliding_window": 32, "n_rot": 16},
    "llama": {"n_embd": 128, "n_layer": 2, "n_head": 2, "n_head_kv": 1, "n_ff": 320, "n_ctx": 131072,
              "rope_base": 500000.0, "eps": 1e-5, "tied": False, "llama3_rope": LLAMA32_ROPE, "qk_gain": 2.0,
              "long_prompts": True},
    "qwen2-output-bias": {"arch": "qwen2", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 320,
                          "n_ctx": 4096, "rope_base": 1000000.0, "eps": 1e-6, "tied": False, "output_bias": True},
    "qwen3-biases": {"arch": "qwen3", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "key_length": 64,
                     "n_ff": 320, "n_ctx": 4096, "rope_base": 1000000.0, "eps": 1e-6, "tied": False,
                     "biases": ("attn_q.bias", "attn_k.bias", "attn_v.bias")},
    "phi3-biases": {"arch": "phi3", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 320,
                    "n_ctx": 4096, "rope_base": 10000.0, "eps": 1e-5, "tied": False, "n_rot": 16,
                    "biases": ("attn_qkv.bias",)},
    "mistral3": {"layout": "llama", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "key_length": 64,
                 "n_ff": 320, "n_ctx": 4096, "rope_base": 1000000.0, "eps": 1e-5, "tied": False},
    "qwen3moe": {"n_embd": 256, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "key_length": 64, "n_ff": 320,
                 "n_ctx": 4096, "rope_base": 1000000.0, "eps": 1e-6, "tied": False, "n_expert": 8,
                 "n_expert_used": 2, "n_ff_exp": 64},
    "gpt-oss": {"n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "key_length": 32, "n_ff": 64,
                "n_ctx": 131072, "rope_base": 150000.0, "eps": 1e-5, "tied": False, "n_expert": 8,
                "n_expert_used": 2, "n_ff_exp": 64, "sliding_window": 6,
                "yarn": {"factor": 32.0, "original_context_length": 4096}},
    # gpt-oss-wide: gpt-oss with a 400-position window, its server-fed prompt of 700 tokens: one-token steps past
    # 512 cached cells split the sliding-window layers' cells too (the window across both chunks of two threads).
    "gpt-oss-wide": {"arch": "gpt-oss", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "key_length": 32,
                     "n_ff": 64, "n_ctx": 131072, "rope_base": 150000.0, "eps": 1e-5, "tied": False, "n_expert": 8,
                     "n_expert_used": 2, "n_ff_exp": 64, "sliding_window": 400,
                     "yarn": {"factor": 32.0, "original_context_length": 4096}, "server_fed_long": 700},
    # gpt-oss-ring: gpt-oss with a 128-position window, whose sliding-window cache (llama_kv_cache_iswa: 128 + 512
    # cells, padded to 768) wraps within its server-fed prompt of 800 tokens: new positions reuse old cells, the
    # window of every step across the wrap (cells of its last positions before those of its first).
    "gpt-oss-ring": {"arch": "gpt-oss", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "key_length": 32,
                     "n_ff": 64, "n_ctx": 131072, "rope_base": 150000.0, "eps": 1e-5, "tied": False, "n_expert": 8,
                     "n_expert_used": 2, "n_ff_exp": 64, "sliding_window": 128,
                     "yarn": {"factor": 32.0, "original_context_length": 4096}, "server_fed_long": 800},
    "gemma4": {"n_embd": 128, "n_layer": 6, "n_head": 4, "n_head_kv": 2, "key_length": 64, "key_length_swa": 32,
               "n_ff": [256, 256, 256, 256, 512, 512], "n_ctx": 4096, "rope_base": 1000000.0,
               "rope_base_swa": 10000.0, "n_rot": 64, "n_rot_swa": 32, "eps": 1e-6, "tied": False,
               "sliding_window": 8, "swa_pattern": [True, False, True, False, True, False], "shared_kv_layers": 2,
               "n_embd_per_layer": 32, "softcap": 30.0, "no_v": (1,), "rope_kept": 16},
    # deepseek2: multi-head latent attention with q lora, heads of 32 + 16 rope dims, keys/values compressed to 64
    # (attn_k_b / attn_v_b, as the current converter writes them); a dense first block, then 8 experts of which
    # 2 are used, in 4 groups of which 2 are used, sigmoid gating with exp_probs_b, weights renormalised and
    # scaled, 2 shared experts. deepseek2-kvb: an older file's form (attn_kv_b, plain attn_q, softmax gating).
    "deepseek2": {"n_embd": 256, "n_layer": 3, "n_head": 4, "n_head_kv": 1, "n_ff": 320, "n_ctx": 4096,
                  "rope_base": 10000.0, "eps": 1e-6, "tied": False, "n_expert": 8, "n_expert_used": 2,
                  "n_ff_exp": 64, "mla": {"q_lora": 64, "kv_lora": 64, "nope": 32, "rope": 16, "v": 32,
                  "dense_lead": 1, "shared": 2, "groups": 4, "groups_used": 2, "gating": 2, "norm": True,
                  "scale": 2.5, "probs_bias": True, "split_kv": True}},
    # deepseek2-yarn: deepseek2 with DeepSeek-V2's YaRN (factor 40 over 4,096 positions, yarn_log_multiplier 0.0707).
    "deepseek2-yarn": {"arch": "deepseek2", "n_embd": 256, "n_layer": 2, "n_head": 4, "n_head_kv": 1, "n_ff": 320,
                       "n_ctx": 163840, "rope_base": 10000.0, "eps": 1e-6, "tied": False, "n_expert": 8,
                       "n_expert_used": 2, "n_ff_exp": 64,
                       "yarn": {"factor": 40.0, "original_context_length": 4096, "log_mul": 0.0707},
                       "mla": {"q_lora": 64, "kv_lora": 64, "nope": 32, "rope": 16, "v": 32, "dense_lead": 1,
                               "shared": 2, "groups": 0, "groups_used": 0, "gating": 1, "norm": True, "scale": 1.0,
                               "probs_bias": False, "split_kv": True}},
    "deepseek2-kvb": {"arch": "deepseek2", "n_embd": 256, "n_layer": 2, "n_head": 4, "n_head_kv": 4, "n_ff": 320,
                      "n_ctx": 4096, "rope_base": 10000.0, "eps": 1e-6, "tied": False, "n_expert": 8,
                      "n_expert_used": 3, "n_ff_exp": 64, "mla": {"q_lora": 0, "kv_lora": 64, "nope": 32,
                      "rope": 16, "v": 32, "dense_lead": 1, "shared": 1, "groups": 0, "groups_used": 0,
                      "gating": 0, "norm": False, "scale": 0.0, "probs_bias": False, "split_kv": False}},
    "qwen35": {"n_embd": 128, "n_layer": 4, "n_head": 4, "n_head_kv": 2, "key_length": 32, "n_ff": 256,
               "n_ctx": 4096, "rope_base": 10000000.0, "eps": 1e-6, "tied": False, "n_rot": 16,
               "rope_sections": [2, 2, 2, 2], "full_attention_interval": 2, "ssm": QWEN35_SSM},
    "qwen35moe": {"n_embd": 256, "n_layer": 4, "n_head": 4, "n_head_kv": 2, "key_length": 32, "n_ff": 256,
                  "n_ctx": 4096, "rope_base": 10000000.0, "eps": 1e-6, "tied": False, "n_rot": 16,
                  "rope_sections": [2, 2, 2, 2], "full_attention_interval": 2, "ssm": QWEN35_SSM, "n_expert": 8,
                  "n_expert_used": 2, "n_ff_exp": 32, "n_ff_shexp": 64},
    # smollm3: llama's blocks, layer 3 of 4 without rope (llama.cpp: every fourth layer)
    "smollm3": {"layout": "llama", "n_embd": 128, "n_layer": 4, "n_head": 4, "n_head_kv": 2, "n_ff": 256,
                "n_ctx": 65536, "rope_base": 5000000.0, "eps": 1e-6, "tied": False},
    # olmo2: no pre-norms, q/k normed over the whole projection, post-norms after attention and the feed-forward
    "olmo2": {"n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 256, "n_ctx": 4096,
              "rope_base": 500000.0, "eps": 1e-6, "tied": False},
    # granite: llama's blocks (with every bias llama.cpp loads) and the four scales, none of them neutral
    "granite": {"layout": "llama", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 256,
                "n_ctx": 4096, "rope_base": 10000.0, "eps": 1e-5, "tied": False, "biases": LLAMA_BIASES,
                "granite_scales": {"embedding": 4.0, "residual": 0.5, "attention": 0.125, "logit": 0.75}},
    # glm4moe: heads of 32 with rope over 16 dims, q/k/v biases, per-head q/k norms in block 1
    # only; a dense first block, then 8 experts of which 2 are used (sigmoid gating, exp_probs_b, renormalised,
    # scaled) plus one shared expert; block_count 4 of which the last is a next-token-prediction block llama.cpp skips
    "glm4moe": {"n_embd": 256, "n_layer": 4, "n_head": 4, "n_head_kv": 2, "key_length": 32, "n_rot": 16,
                "n_ff": 256, "n_ctx": 4096, "rope_base": 1000000.0, "eps": 1e-5, "tied": False, "n_expert": 8,
                "n_expert_used": 2, "n_ff_exp": 32, "glm": {"dense_lead": 1, "shared": 1, "nextn": 1,
                                                           "qk_norm_layers": (1,), "scale": 2.5}},
    # qwen3 rerankers: rank pooling (pooling_type 4) and the yes/no head cls.output.weight the Qwen3-Reranker
    # conversions carry; one with a rerank prompt (tokenizer.chat_template.rerank), one without (llama-server then
    # joins bos, query, eos, document, eos, which add_bos/add_eos turn on here)
    "qwen3-reranker": {"arch": "qwen3", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "key_length": 64,
                       "n_ff": 320, "n_ctx": 4096, "rope_base": 1000000.0, "eps": 1e-6, "tied": False,
                       "rerank": {"labels": ["yes", "no"], "template": RERANK_TEMPLATE}},
    "qwen3-reranker-plain": {"arch": "qwen3", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2,
                             "key_length": 64, "n_ff": 320, "n_ctx": 4096, "rope_base": 1000000.0, "eps": 1e-6,
                             "tied": False, "rerank": {"labels": ["yes", "no"], "add_bos": True, "add_eos": True}},
    "llama-biases": {"arch": "llama", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 320,
                     "n_ctx": 4096, "rope_base": 10000.0, "eps": 1e-5, "tied": False, "biases": LLAMA_BIASES},
}

#: Quantization type of each kind of matrix (the norms and biases are F32, as llama.cpp's converter writes them).
TYPES: dict[str, T] = {"token_embd": T.Q8_0, "output": T.Q8_0, "attn": T.Q8_0, "ffn_up": T.Q4_0,
                       "ffn_gate": T.Q4_1, "ffn_down": T.Q5_1, "exps_gate": T.Q4_K, "exps_up": T.Q4_K,
                       "exps_down": T.Q8_0, "router": T.F32, "exps_mxfp4": T.MXFP4, "ssm": T.Q8_0}

#: The real-width shapes (--shape): the published models' widths, a real-size vocab (so the output product has its
#: real size) and the tensor types of the published files, n_layer the published depth (--layers makes fewer).
#: Each entry's fields replace ARCHS[arch]'s; "types" replaces entries of TYPES; "more_bits" names the matrices
#: that llama.cpp's Q4_K_M recipe (llama_tensor_get_type) makes Q6_K on the layers its use_more_bits picks.
REAL_VOCAB = SHARED / "vocab" / "ggml-vocab-qwen35.gguf"
SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "qwen3moe": {"30b-a3b": {  # Qwen3-30B-A3B as Q4_K_M
        "n_embd": 2048, "n_layer": 48, "n_head": 32, "n_head_kv": 4, "key_length": 128, "n_ff": 6144,
        "n_ctx": 40960, "n_expert": 128, "n_expert_used": 8, "n_ff_exp": 768, "vocab": REAL_VOCAB,
        "types": {"token_embd": T.Q4_K, "output": T.Q6_K, "attn": T.Q4_K, "exps_gate": T.Q4_K, "exps_up": T.Q4_K,
                  "exps_down": T.Q4_K},
        "more_bits": ("attn_v.weight", "ffn_down_exps.weight"), "file_type": gguf.LlamaFileType.MOSTLY_Q4_K_M}},
    "gpt-oss": {"20b": {  # gpt-oss-20b: MXFP4 experts, Q8_0 elsewhere (its 2,880-wide rows take no K-quant)
        "n_embd": 2880, "n_layer": 24, "n_head": 64, "n_head_kv": 8, "key_length": 64, "n_ff": 2880,
        "n_ctx": 131072, "n_expert": 32, "n_expert_used": 4, "n_ff_exp": 2880, "sliding_window": 128,
        "vocab": REAL_VOCAB}},
}


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the first and last eighth of the layers and every third between."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


#: Rows per pool of a real-width shape's quantized matrices: llama.cpp's K-quant quantizers take about 200 ns a
#: value, tens of minutes for the 5 billion values of a 3 GB model, so each matrix row there is a copy of one of
#: these rows (llama.cpp's bytes all the same, and every row of the file its own bytes to read).
POOL_ROWS = 4096


@functools.cache
def pooled_rows(qtype: T, n_in: int, scale: float, seed: int) -> np.ndarray:
    """POOL_ROWS Gaussian rows of n_in values times scale, quantized to qtype by llama.cpp ([POOL_ROWS, bytes])."""
    rng = np.random.default_rng([seed, int(qtype), n_in])
    return quantize(rng.standard_normal((POOL_ROWS, n_in), dtype=np.float32) * np.float32(scale), qtype)


def model_config(name: str, shape: str = "small", layers: int | None = None) -> dict[str, Any]:
    """ARCHS[name] with the fields of SHAPES[name][shape] (shape "small": ARCHS[name] itself) and n_layer = layers
    when given."""
    c = dict(ARCHS[name])
    if shape != "small":
        if shape not in SHAPES.get(name, {}):
            raise SystemExit(f"no shape {shape!r} for {name}: expected one of {['small', *SHAPES.get(name, {})]}")
        c.update(SHAPES[name][shape])
    if layers is not None:
        c["n_layer"] = layers
    return c


#: Scale of the bias-like vectors that must be large to matter: gpt-oss's attention sinks (a logit beside the
#: scores, which are of order 1) and its router's bias (beside router logits of a few units).
BIAS_SCALE = {"attn_sinks.weight": 1.0, "ffn_gate_inp.bias": 1.0}
#: Gain of gpt-oss's experts' gate and up rows: products of a few units, so that swiglu_oai's clamp at 7 is reached.
OAI_GAIN = {"ffn_gate_exps.weight": 3.0, "ffn_up_exps.weight": 3.0}

#: Scale of the output matrix's rows: logits with a spread of a few units, so llama.cpp's top choice is
#: usually clear of the second (the test compares at margins >= 0.5).
OUTPUT_SCALE = 3.0
#: Scale of the router's rows (ffn_gate_inp): router logits with a spread of a few units, so that a token's choice
#: of experts is usually clear of the next expert (a near tie flips on the last bits of the activations, and with it
#: the whole feed-forward of that token).
ROUTER_SCALE = 4.0
#: Scale of the embedding rows: small beside what the blocks add, so that a tied output matrix does not simply
#: predict the last token again (its own row dominating the final state).
EMBD_SCALE = 0.25

_CDEF = ("size_t ggml_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,"
         " int64_t n_per_row, const float * imatrix);")


@functools.cache
def _llamacpp_quantizer():
    """llama.cpp's ggml_quantize_chunk from the xllamacpp wheel, or None when it is not installed."""
    try:
        import cffi
        import xllamacpp
    except ImportError:
        return None
    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    lib = ffi.dlopen(os.path.join(os.path.dirname(xllamacpp.__file__), "xllamacpp.abi3.so"))

    def quantize(w: np.ndarray, qtype: T) -> np.ndarray:
        rows, n = w.shape
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        out = np.empty((rows, n // bs * ts), dtype=np.uint8)
        k = lib.ggml_quantize_chunk(int(qtype), ffi.cast("float *", w.ctypes.data), ffi.cast("void *", out.ctypes.data),
                                    0, rows, n, ffi.NULL)
        assert k == out.nbytes, (k, out.nbytes)
        return out

    return quantize


def quantize(w: np.ndarray, qtype: T) -> np.ndarray:
    """w (rows, n) float32 as the raw blocks of qtype: llama.cpp's quantizer when installed, else gguf-py's."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    ref = _llamacpp_quantizer()
    return ref(w, qtype) if ref is not None else gguf.quants.quantize(w, qtype)


def llama3_rope_factors(head_dim: int, base: float, scaling: dict[str, float]) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py computes it for rope_type "llama3" (LlamaModel's
    generate_extra_tensors, in torch float32; the same steps in numpy float32 here): 1 for the pairs whose
    wavelength is under original/high_freq_factor, `factor` for those over original/low_freq_factor, and a
    smooth blend between."""
    f32 = np.float32
    freqs = f32(1.0) / (f32(base) ** (np.arange(0, head_dim, 2, dtype=f32) / f32(head_dim)))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(f32(1))
        elif wavelen > low_wavelen:
            out.append(f32(factor))
        else:
            smooth = (f32(old) / wavelen - f32(low)) / f32(high - low)
            out.append(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))
    return np.array(out, dtype=f32)


def hybrid_tensors(c: dict[str, Any], il: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """Block il of qwen35: a gated DeltaNet layer, or (every full_attention_interval-th) gated full attention."""
    d, hd, ssm = c["n_embd"], c["key_length"], c["ssm"]
    s, hk, hv, k = ssm["state_size"], ssm["group_count"], ssm["time_step_rank"], ssm["conv_kernel"]
    q, kv = c["n_head"] * hd, c["n_head_kv"] * hd
    if (il + 1) % c["full_attention_interval"]:
        mixer = [("attn_qkv.weight", "ssm", (2 * hk * s + hv * s, d)), ("attn_gate.weight", "ssm", (hv * s, d)),
                 ("ssm_conv1d.weight", "conv", (2 * hk * s + hv * s, k)), ("ssm_dt.bias", "bias", (hv,)),
                 ("ssm_a", "ssm_a", (hv,)), ("ssm_beta.weight", "ssm", (hv, d)), ("ssm_alpha.weight", "ssm", (hv, d)),
                 ("ssm_norm.weight", "norm", (s,)), ("ssm_out.weight", "ssm", (d, hv * s))]
    else:
        mixer = [("attn_q.weight", "attn", (2 * q, d)), ("attn_q_norm.weight", "norm", (hd,)),
                 ("attn_k.weight", "attn", (kv, d)), ("attn_k_norm.weight", "norm", (hd,)),
                 ("attn_v.weight", "attn", (kv, d)), ("attn_output.weight", "attn", (d, q))]
    ff = c["n_ff"]
    ffn = [("ffn_gate.weight", "ffn_gate", (ff, d)), ("ffn_up.weight", "ffn_up", (ff, d)),
           ("ffn_down.weight", "ffn_down", (d, ff))]
    if "n_expert" in c:  # qwen35moe: the router, the experts, then the shared expert and its gate
        n_exp, ff_exp, sh = c["n_expert"], c["n_ff_exp"], c["n_ff_shexp"]
        ffn = [("ffn_gate_inp.weight", "router", (n_exp, d)), ("ffn_gate_exps.weight", "exps_gate", (n_exp, ff_exp, d)),
               ("ffn_up_exps.weight", "exps_up", (n_exp, ff_exp, d)),
               ("ffn_down_exps.weight", "exps_down", (n_exp, d, ff_exp)),
               ("ffn_gate_inp_shexp.weight", "router", (d,)), ("ffn_gate_shexp.weight", "ffn_gate", (sh, d)),
               ("ffn_up_shexp.weight", "ffn_up", (sh, d)), ("ffn_down_shexp.weight", "ffn_down", (d, sh))]
    return [("attn_norm.weight", "norm", (d,))] + mixer + [("post_attention_norm.weight", "norm", (d,))] + ffn


def layer_tensors(arch: str, c: dict[str, Any], il: int = 0) -> list[tuple[str, str, tuple[int, ...]]]:
    """(GGUF name after "blk.{i}.", kind, numpy shape (n_out, n_in) or (n,), or (n_expert, n_out, n_in) for the
    experts' 3-D tensors) of block il, in file order; each bias in c["biases"] right after its matrix."""
    if "ssm" in c:
        return hybrid_tensors(c, il)
    arch = c.get("layout", arch)
    if arch == "glm4moe":
        return glm4moe_tensors(c, il)
    if arch == "gemma4":
        return gemma4_layer_tensors(c, il)
    d, hd = c["n_embd"], c.get("key_length", c["n_embd"] // c["n_head"])
    q, kv, ff = c["n_head"] * hd, c["n_head_kv"] * hd, c["n_ff"]
    attn = {
        "llama": [("attn_q.weight", "attn", (q, d)), ("attn_k.weight", "attn", (kv, d)),
                  ("attn_v.weight", "attn", (kv, d))],
        "qwen2": [("attn_q.weight", "attn", (q, d)), ("attn_q.bias", "bias", (q,)),
                  ("attn_k.weight", "attn", (kv, d)), ("attn_k.bias", "bias", (kv,)),
                  ("attn_v.weight", "attn", (kv, d)), ("attn_v.bias", "bias", (kv,))],
        "qwen3": [("attn_q.weight", "attn", (q, d)), ("attn_q_norm.weight", "norm", (hd,)),
                  ("attn_k.weight", "attn", (kv, d)), ("attn_k_norm.weight", "norm", (hd,)),
                  ("attn_v.weight", "attn", (kv, d))],
        "phi3": [("attn_qkv.weight", "attn", (q + 2 * kv, d))],
        "olmo2": [("attn_q.weight", "attn", (q, d)), ("attn_k.weight", "attn", (kv, d)),
                  ("attn_v.weight", "attn", (kv, d)), ("attn_q_norm.weight", "norm", (q,)),
                  ("attn_k_norm.weight", "norm", (kv,))],
    }[{"qwen3moe": "qwen3", "gpt-oss": "qwen2"}.get(arch, arch)]
    ffn = ([("ffn_up.weight", "ffn_up", (2 * ff, d))] if arch == "phi3" else  # gate and up in one matrix
           [("ffn_gate.weight", "ffn_gate", (ff, d)), ("ffn_up.weight", "ffn_up", (ff, d))])
    down = [("ffn_down.weight", "ffn_down", (d, ff))]
    if arch == "qwen3moe":  # the router, then each expert's matrices in one tensor (llama.cpp's converter's order)
        n_exp, ff_exp = c["n_expert"], c["n_ff_exp"]
        ffn = [("ffn_gate_inp.weight", "router", (n_exp, d)), ("ffn_gate_exps.weight", "exps_gate", (n_exp, ff_exp, d)),
               ("ffn_up_exps.weight", "exps_up", (n_exp, ff_exp, d))]
        down = [("ffn_down_exps.weight", "exps_down", (n_exp, d, ff_exp))]
    if arch == "gpt-oss":  # biases everywhere, attention sinks, post-attention norm, MXFP4 experts with biases
        n_exp, ff_exp = c["n_expert"], c["n_ff_exp"]
        return ([("attn_norm.weight", "norm", (d,))] + attn + [
            ("attn_output.weight", "attn", (d, q)), ("attn_output.bias", "bias", (d,)),
            ("attn_sinks.weight", "bias", (c["n_head"],)), ("post_attention_norm.weight", "norm", (d,)),
            ("ffn_gate_inp.weight", "router", (n_exp, d)), ("ffn_gate_inp.bias", "bias", (n_exp,)),
            ("ffn_gate_exps.weight", "exps_mxfp4", (n_exp, ff_exp, d)), ("ffn_gate_exps.bias", "bias", (n_exp, ff_exp)),
            ("ffn_up_exps.weight", "exps_mxfp4", (n_exp, ff_exp, d)), ("ffn_up_exps.bias", "bias", (n_exp, ff_exp)),
            ("ffn_down_exps.weight", "exps_mxfp4", (n_exp, d, ff_exp)), ("ffn_down_exps.bias", "bias", (n_exp, d))])
    if arch == "olmo2":  # no pre-norms: a post-norm after attention and one after the feed-forward
        return attn + [("attn_output.weight", "attn", (d, q)), ("post_attention_norm.weight", "norm", (d,))] + ffn + \
            down + [("post_ffw_norm.weight", "norm", (d,))]
    block = ([("attn_norm.weight", "norm", (d,))] + attn + [("attn_output.weight", "attn", (d, q)),
             ("ffn_norm.weight", "norm", (d,))] + ffn + down)
    biases = c.get("biases", ())
    out = []
    for name, kind, shape in block:
        out.append((name, kind, shape))
        if name.replace(".weight", ".bias") in biases:
            out.append((name.replace(".weight", ".bias"), "bias", shape[:1]))
    return out


def glm4moe_tensors(c: dict[str, Any], il: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """Block il of glm4moe: q/k/v with biases (q/k norms in the blocks of c["glm"]["qk_norm_layers"]), attn_output,
    post_attention_norm, then a dense SwiGLU or the router, exp_probs_b, the experts and the shared expert; a
    next-token-prediction block (the last nextn of block_count) also has the nextn.* tensors."""
    g, d, hd = c["glm"], c["n_embd"], c["key_length"]
    q, kv = c["n_head"] * hd, c["n_head_kv"] * hd
    out = [("attn_norm.weight", "norm", (d,)), ("attn_q.weight", "attn", (q, d)), ("attn_q.bias", "bias", (q,)),
           ("attn_k.weight", "attn", (kv, d)), ("attn_k.bias", "bias", (kv,)), ("attn_v.weight", "attn", (kv, d)),
           ("attn_v.bias", "bias", (kv,))]
    if il in g["qk_norm_layers"]:
        out += [("attn_q_norm.weight", "norm", (hd,)), ("attn_k_norm.weight", "norm", (hd,))]
    out += [("attn_output.weight", "attn", (d, q)), ("post_attention_norm.weight", "norm", (d,))]
    if il < g["dense_lead"]:
        ff = c["n_ff"]
        return out + [("ffn_gate.weight", "ffn_gate", (ff, d)), ("ffn_up.weight", "ffn_up", (ff, d)),
                      ("ffn_down.weight", "ffn_down", (d, ff))]
    n_exp, ff_exp, ff_sh = c["n_expert"], c["n_ff_exp"], c["n_ff_exp"] * g["shared"]
    out += [("ffn_gate_inp.weight", "router", (n_exp, d)), ("exp_probs_b.bias", "bias", (n_exp,)),
            ("ffn_gate_exps.weight", "exps_gate", (n_exp, ff_exp, d)),
            ("ffn_up_exps.weight", "exps_up", (n_exp, ff_exp, d)),
            ("ffn_down_exps.weight", "exps_down", (n_exp, d, ff_exp)),
            ("ffn_gate_shexp.weight", "ffn_gate", (ff_sh, d)), ("ffn_up_shexp.weight", "ffn_up", (ff_sh, d)),
            ("ffn_down_shexp.weight", "ffn_down", (d, ff_sh))]
    if il >= c["n_layer"] - g["nextn"]:
        out += [("nextn.eh_proj.weight", "attn", (d, 2 * d)), ("nextn.enorm.weight", "norm", (d,)),
                ("nextn.hnorm.weight", "norm", (d,)), ("nextn.shared_head_norm.weight", "norm", (d,))]
    return out


def gemma4_layer_tensors(c: dict[str, Any], il: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """Block il of gemma4: heads of key_length_swa on the sliding-window layers and key_length on the others, no
    k/v (nor k norm) on the last shared_kv_layers blocks (they read an earlier block's cache), no attn_v on the
    blocks of c["no_v"] (v is then k's projection), the feed-forward of that layer's width, the per-layer
    embedding's gate, projection and norm, and the layer's output scale."""
    d, swa = c["n_embd"], c["swa_pattern"][il]
    hd = c["key_length_swa"] if swa else c["key_length"]
    q, kv, ff, pe = c["n_head"] * hd, c["n_head_kv"] * hd, c["n_ff"][il], c["n_embd_per_layer"]
    has_kv = il < c["n_layer"] - c["shared_kv_layers"]
    attn = [("attn_q.weight", "attn", (q, d)), ("attn_q_norm.weight", "norm", (hd,))]
    if has_kv:
        attn += [("attn_k.weight", "attn", (kv, d)), ("attn_k_norm.weight", "norm", (hd,))]
        if il not in c["no_v"]:
            attn += [("attn_v.weight", "attn", (kv, d))]
    return ([("attn_norm.weight", "norm", (d,))] + attn +
            [("attn_output.weight", "attn", (d, q)), ("post_attention_norm.weight", "norm", (d,)),
             ("ffn_norm.weight", "norm", (d,)), ("ffn_gate.weight", "ffn_gate", (ff, d)),
             ("ffn_up.weight", "ffn_up", (ff, d)), ("ffn_down.weight", "ffn_down", (d, ff)),
             ("post_ffw_norm.weight", "norm", (d,))] +
            ([("inp_gate.weight", "attn", (pe, d)), ("proj.weight", "attn", (d, pe)),
              ("post_norm.weight", "norm", (d,))] if pe else []) +
            [("layer_output_scale.weight", "norm", (1,))])


def gemma4_metadata(w: gguf.GGUFWriter, c: dict[str, Any]) -> None:
    """gemma4's own keys: the sliding-window pattern, the heads and rope of its layers, the shared KV layers, the
    per-layer embedding width and the final logit softcap."""
    w.add_sliding_window_pattern(c["swa_pattern"])
    w.add_key_length_swa(c["key_length_swa"])
    w.add_value_length_swa(c["key_length_swa"])
    w.add_rope_dimension_count_swa(c["n_rot_swa"])
    w.add_rope_freq_base_swa(c["rope_base_swa"])
    w.add_shared_kv_layers(c["shared_kv_layers"])
    w.add_embedding_length_per_layer_input(c["n_embd_per_layer"])
    w.add_final_logit_softcapping(c["softcap"])


def gemma4_rope_freqs(c: dict[str, Any]) -> np.ndarray:
    """rope_freqs.weight of the full-attention layers as the converter writes Gemma 4's proportional rope: 1 for
    the pairs that turn, 1e30 (no turn) for the rest."""
    out = np.full(c["key_length"] // 2, 1e30, dtype=np.float32)
    out[:c["rope_kept"]] = 1.0
    return out


def deepseek2_tensors(c: dict[str, Any], il: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """Block il's tensors of a deepseek2 model, as layer_tensors gives them (llama.cpp's loading order): multi-head
    latent attention, then a dense feed-forward for the leading blocks or the experts and the shared experts."""
    m, d, h = c["mla"], c["n_embd"], c["n_head"]
    hk = m["nope"] + m["rope"]
    out = [("attn_norm.weight", "norm", (d,))]
    if m["q_lora"]:
        out.append(("attn_q_a_norm.weight", "norm", (m["q_lora"],)))
    out.append(("attn_kv_a_norm.weight", "norm", (m["kv_lora"],)))
    if m["q_lora"]:
        out += [("attn_q_a.weight", "attn", (m["q_lora"], d)), ("attn_q_b.weight", "attn", (h * hk, m["q_lora"]))]
    else:
        out.append(("attn_q.weight", "attn", (h * hk, d)))
    out.append(("attn_kv_a_mqa.weight", "attn", (m["kv_lora"] + m["rope"], d)))
    if m["split_kv"]:
        out += [("attn_k_b.weight", "attn", (h, m["kv_lora"], m["nope"])), ("attn_v_b.weight", "attn", (h, m["v"], m["kv_lora"]))]
    else:
        out.append(("attn_kv_b.weight", "attn", (h * (m["nope"] + m["v"]), m["kv_lora"])))
    out += [("attn_output.weight", "attn", (d, h * m["v"])), ("ffn_norm.weight", "norm", (d,))]
    if il < m["dense_lead"]:
        ff = c["n_ff"]
        return out + [("ffn_gate.weight", "ffn_gate", (ff, d)), ("ffn_down.weight", "ffn_down", (d, ff)),
                      ("ffn_up.weight", "ffn_up", (ff, d))]
    n_exp, ff_exp, ff_sh = c["n_expert"], c["n_ff_exp"], c["n_ff_exp"] * m["shared"]
    out.append(("ffn_gate_inp.weight", "router", (n_exp, d)))
    if m["probs_bias"]:
        out.append(("exp_probs_b.bias", "bias", (n_exp,)))
    return out + [("ffn_down_exps.weight", "exps_down", (n_exp, d, ff_exp)),
                  ("ffn_gate_exps.weight", "exps_gate", (n_exp, ff_exp, d)),
                  ("ffn_up_exps.weight", "exps_up", (n_exp, ff_exp, d)),
                  ("ffn_gate_shexp.weight", "ffn_gate", (ff_sh, d)), ("ffn_down_shexp.weight", "ffn_down", (d, ff_sh)),
                  ("ffn_up_shexp.weight", "ffn_up", (ff_sh, d))]


def write_deepseek2_keys(w: gguf.GGUFWriter, c: dict[str, Any]) -> None:
    """deepseek2's own metadata, as llama.cpp's converter writes it (the compressed form: key/value lengths of the
    cached row, the decompressed heads' as *_mla; an older file: the decompressed heads' lengths only)."""
    m = c["mla"]
    w.add_leading_dense_block_count(m["dense_lead"])
    w.add_q_lora_rank(m["q_lora"])  # 0: a plain attn_q (llama.cpp requires the key unless it guesses a "lite" model)
    w.add_kv_lora_rank(m["kv_lora"])
    if m["split_kv"]:
        w.add_key_length(m["kv_lora"] + m["rope"])
        w.add_value_length(m["kv_lora"])
        w.add_key_length_mla(m["nope"] + m["rope"])
        w.add_value_length_mla(m["v"])
    else:
        w.add_key_length(m["nope"] + m["rope"])
        w.add_value_length(m["v"])
    w.add_expert_shared_count(m["shared"])
    if m["scale"]:
        w.add_expert_weights_scale(m["scale"])
    if m["norm"]:
        w.add_expert_weights_norm(True)
    if m["gating"]:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(m["gating"]))
    if m["groups"]:
        w.add_expert_group_count(m["groups"])
        w.add_expert_group_used_count(m["groups_used"])
    w.add_rope_dimension_count(m["rope"])


def write_model(name: str, out: str | os.PathLike[str], seed: int = 0, shape: str = "small",
                layers: int | None = None) -> None:
    """Write the synthetic model `name` (a key of ARCHS) of that shape (a key of SHAPES[name], or "small") to out,
    with `layers` blocks if given; the same name, shape, layers and seed always give the same bytes. Real-width
    shapes go through a temporary file (gguf-py's use_temp_file), one tensor in memory at a time."""
    c = model_config(name, shape, layers)
    arch = c.get("arch", name)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(os.fspath(out), arch, use_temp_file=shape != "small")
    w.add_name("minillama synthetic test model")  # no arch in it: llama.cpp special-cases names with "phi3"
    src = gguf.GGUFReader(c.get("vocab", VOCAB))
    rerank = c.get("rerank", {})
    flags = {f"tokenizer.ggml.{k}_token": rerank[k] for k in ("add_bos", "add_eos") if k in rerank}
    for key, value in flags.items():
        w.add_bool(key, value)
    for field in src.fields.values():  # the whole tokenizer, as the vocab file has it
        if field.name.startswith("tokenizer.") and field.name not in flags:
            vt = field.types[0]
            if vt == gguf.GGUFValueType.ARRAY:
                w.add_array(field.name, field.contents())
            else:
                w.add_key_value(field.name, field.contents(), vt)
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    d = c["n_embd"]
    w.add_context_length(c["n_ctx"])
    w.add_embedding_length(d)
    w.add_block_count(c["n_layer"])
    w.add_feed_forward_length(c["n_ff"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv(c["n_head_kv"])
    if "key_length" in c:
        w.add_key_length(c["key_length"])
        w.add_value_length(c["key_length"])
    w.add_rope_freq_base(c["rope_base"])
    if "n_rot" in c:
        w.add_rope_dimension_count(c["n_rot"])
    w.add_layer_norm_rms_eps(c["eps"])
    if "sliding_window" in c:
        w.add_sliding_window(c["sliding_window"])
    if "yarn" in c:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(c["yarn"]["factor"])
        w.add_rope_scaling_orig_ctx_len(c["yarn"]["original_context_length"])
        if "log_mul" in c["yarn"]:
            w.add_rope_scaling_yarn_log_mul(c["yarn"]["log_mul"])
    if "n_expert" in c:
        w.add_expert_count(c["n_expert"])
        w.add_expert_used_count(c["n_expert_used"])
        w.add_expert_feed_forward_length(c["n_ff_exp"])
    if arch == "gemma4":
        gemma4_metadata(w, c)
    if arch == "deepseek2":
        write_deepseek2_keys(w, c)
    if "granite_scales" in c:
        sc = c["granite_scales"]
        w.add_embedding_scale(sc["embedding"])
        w.add_residual_scale(sc["residual"])
        w.add_attention_scale(sc["attention"])
        w.add_logit_scale(sc["logit"])
    if "glm" in c:
        g = c["glm"]
        w.add_leading_dense_block_count(g["dense_lead"])
        w.add_expert_shared_count(g["shared"])
        w.add_nextn_predict_layers(g["nextn"])
        w.add_expert_weights_scale(g["scale"])
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if "n_ff_shexp" in c:
        w.add_expert_shared_feed_forward_length(c["n_ff_shexp"])
    if "ssm" in c:
        w.add_ssm_conv_kernel(c["ssm"]["conv_kernel"])
        w.add_ssm_state_size(c["ssm"]["state_size"])
        w.add_ssm_group_count(c["ssm"]["group_count"])
        w.add_ssm_time_step_rank(c["ssm"]["time_step_rank"])
        w.add_ssm_inner_size(c["ssm"]["time_step_rank"] * c["ssm"]["state_size"])
        w.add_full_attention_interval(c["full_attention_interval"])
    if "rope_sections" in c:
        w.add_rope_dimension_sections(c["rope_sections"])
    if rerank:
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_classifier_output_labels(rerank["labels"])
        if "template" in rerank:
            w.add_chat_template([{"name": "rerank", "template": rerank["template"]}])
    w.add_file_type(c.get("file_type", gguf.LlamaFileType.MOSTLY_Q8_0))
    types = {**TYPES, **c.get("types", {})}
    pooled = shape != "small"

    def tensor(name: str, kind: str, shape: tuple[int, ...], scale: float | None = None,
               qtype: T | None = None) -> None:
        if kind == "norm":
            w.add_tensor(name, (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32))
        elif kind == "ssm_a":  # -exp(A_log): a decay rate per value head, exp(g) well inside (0, 1)
            w.add_tensor(name, -np.exp(rng.uniform(-2.5, 0.0, shape)).astype(np.float32))
        elif kind == "conv":  # float32, as ggml_ssm_conv takes it
            w.add_tensor(name, (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32))
        elif kind == "bias":
            w.add_tensor(name, ((scale or 0.1) * rng.standard_normal(shape)).astype(np.float32))
        else:
            n_in = shape[-1]
            qtype = qtype or types[kind]
            if pooled and qtype != T.F32:  # each row one of POOL_ROWS rows quantized by llama.cpp, drawn at random
                pool = pooled_rows(qtype, n_in, float(scale or 1.0 / np.sqrt(n_in)), seed)
                blocks = pool[rng.integers(0, len(pool), math.prod(shape[:-1]))]
            else:
                x = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale or 1.0 / np.sqrt(n_in))
                if qtype == T.F32:
                    w.add_tensor(name, x)
                    return
                blocks = quantize(x.reshape(-1, n_in), qtype)
            blocks = blocks.reshape(*shape[:-1], blocks.shape[-1])
            w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)

    if "llama3_rope" in c:  # first, where the converter writes it (generate_extra_tensors)
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(d // c["n_head"], c["rope_base"], c["llama3_rope"]))
    if arch == "gemma4" and not all(c["swa_pattern"]):  # only full-attention layers take it
        w.add_tensor("rope_freqs.weight", gemma4_rope_freqs(c))
    tensor("token_embd.weight", "token_embd", (n_vocab, d), scale=EMBD_SCALE)
    if arch == "gemma4" and c["n_embd_per_layer"]:  # the per-layer embeddings: a table of n_layer rows per token and the stream's projection
        pe = c["n_embd_per_layer"] * c["n_layer"]
        tensor("per_layer_token_embd.weight", "token_embd", (n_vocab, pe), scale=0.5)
        tensor("per_layer_model_proj.weight", "attn", (pe, d))
        tensor("per_layer_proj_norm.weight", "norm", (c["n_embd_per_layer"],))
    gain = {"attn_q.weight": c.get("qk_gain", 1.0), "attn_k.weight": c.get("qk_gain", 1.0),
            "ffn_gate_inp.weight": ROUTER_SCALE, **(OAI_GAIN if arch == "gpt-oss" else {})}
    for i in range(c["n_layer"]):
        block = deepseek2_tensors(c, i) if arch == "deepseek2" else layer_tensors(arch, c, i)
        for name, kind, shape in block:
            scale = gain[name] / np.sqrt(shape[-1]) if name in gain else BIAS_SCALE.get(name)
            more = name in c.get("more_bits", ()) and use_more_bits(i, c["n_layer"])
            tensor(f"blk.{i}.{name}", kind, shape, scale, T.Q6_K if more else None)
    tensor("output_norm.weight", "norm", (d,))
    if not c["tied"]:
        tensor("output.weight", "output", (n_vocab, d), scale=OUTPUT_SCALE / np.sqrt(d))
    if c.get("output_bias"):  # as large as the logits' spread, or it would rarely change the top choice
        tensor("output.bias", "bias", (n_vocab,), scale=OUTPUT_SCALE)
    if rerank:  # outputs about a unit apart: the yes/no softmax spreads the scores over (0, 1)
        tensor("cls.output.weight", "output", (len(rerank["labels"]), d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path: str | os.PathLike[str]) -> str:
    """The file's sha256, hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    return x - np.log(np.exp(x).sum())


def expected(out: str, only: list[str] | None = None) -> None:
    """llama.cpp's greedy continuations on every architecture's seed-0 model (only: on these, the other entries of
    the existing file out kept), written to out as JSON."""
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    sys.path.insert(0, str(SHARED / "tools"))
    from llamacpp_decode import LlamaCpp
    from llamacpp_oracle import Oracle

    prompts = [line.rstrip("\n").replace("\\n", "\n")
               for line in (ROOT / "tools" / "model_prompts.txt").read_text(encoding="utf-8").splitlines() if line]
    data: dict[str, Any] = {"n_predict": N_PREDICT, "archs": {}}
    if only:
        data = json.loads(Path(out).read_text(encoding="utf-8"))
        data["archs"] = {**data["archs"], **dict.fromkeys(only)}  # each new name after the kept ones, in turn
    with tempfile.TemporaryDirectory() as tmp:
        for arch in only or ARCHS:
            path = os.path.join(tmp, f"{arch}.gguf")
            write_model(arch, path)
            vocab, ref = Oracle(path), LlamaCpp(path, SHARED)
            cases = []
            todo = [(p, vocab.tokenize(p, add_special=True, parse_special=True)) for p in prompts]
            if ARCHS[arch].get("long_prompts"):
                corpus = (ROOT / "minillama" / "data" / "default-corpus.txt").read_text(encoding="utf-8")
                todo += [(f"default-corpus.txt[{at}:], {LONG_TOKENS} tokens",
                          vocab.tokenize(corpus[at:at + 8 * LONG_TOKENS], add_special=True,
                                         parse_special=False)[:LONG_TOKENS]) for at in LONG_AT]
            for prompt, ids in todo:
                gen = []
                for row in ref.greedy(ids, N_PREDICT):
                    lp = _log_softmax(row)
                    top = np.argsort(-lp, kind="stable")[:5]
                    gen.append({"id": int(top[0]), "top": [[int(i), round(float(lp[i]), 5)] for i in top]})
                cases.append({"prompt": prompt, "prompt_ids": ids, "aligned": True, "gen": gen})
            ref.close()
            data["archs"][arch] = {"sha256": sha256(path), "cases": cases}
    Path(out).write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


#: Prompt lengths of --server-fed: batches of 64 rows or more take llama.cpp's tiled flash attention (and the
#: first of them leaves a 66-row batch). LONG_SERVER_FED: the one long prompt (llama, whose context is long enough).
SERVER_FED_TOKENS = (70, 110, 200)
LONG_SERVER_FED = 2048
SERVER_FED_ARCHS = ("qwen2", "qwen3", "llama", "mistral3", "qwen3moe", "gpt-oss", "deepseek2", "deepseek2-kvb",
                    "deepseek2-yarn", "gpt-oss-wide", "gpt-oss-ring", "qwen35", "qwen35moe", "smollm3", "olmo2",
                    "granite", "glm4moe")
SERVER_FED_PREDICT = 16
#: The long prompt of real files given with --gguf: Gemma-3's 1,100 tokens pass its sliding-window cache of 1,024
#: cells (window 512 + one ubatch), so the last ubatch and every step reuse cells of positions out of the window.
SERVER_FED_LONG_GGUF = {"gemma-3-270m-q4_k_m.gguf": 1100}


def server_fed(out: str, gguf_paths: list[str], only: list[str] | None = None) -> None:
    """llama.cpp's greedy continuations of prompts of SERVER_FED_TOKENS tokens (default-corpus.txt, at the offsets
    of LONG_AT), fed as llama.cpp's server feeds a prompt (all but its last 4 tokens, then those 4, then one token
    per step; its sliding-window layers' cache as small as the server's), on the seed-0 models of SERVER_FED_ARCHS and on each of gguf_paths (under its file name), to out.
    only: remake these architectures' entries (and gguf_paths') of the existing file out, keep the others."""
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    sys.path.insert(0, str(SHARED / "tools"))
    from llamacpp_decode import LlamaCpp
    from llamacpp_oracle import Oracle

    corpus = (ROOT / "minillama" / "data" / "default-corpus.txt").read_text(encoding="utf-8")
    data: dict[str, Any] = {"n_predict": SERVER_FED_PREDICT, "models": {}}
    if only:
        data = json.loads(Path(out).read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        models = []
        for arch in only or SERVER_FED_ARCHS:
            write_model(arch, os.path.join(tmp, f"{arch}.gguf"))
            models.append((arch, os.path.join(tmp, f"{arch}.gguf")))
        models += [(os.path.basename(p), p) for p in gguf_paths]
        for name, path in models:
            vocab, ref = Oracle(path), LlamaCpp(path, SHARED, n_ctx=LONG_SERVER_FED + 256, swa_full=False)
            long = LONG_SERVER_FED if name == "llama" else ARCHS.get(name, {}).get("server_fed_long",
                                                                             SERVER_FED_LONG_GGUF.get(name))
            lengths = SERVER_FED_TOKENS + ((long,) if long else ())
            cases = []
            for n, at in zip(lengths, (LONG_AT + (0,))[:len(lengths)], strict=True):
                ids = vocab.tokenize(corpus[at:at + 8 * n], add_special=True, parse_special=False)[:n]
                gen = []
                for row in ref.greedy(ids, SERVER_FED_PREDICT, split=n - 4):
                    lp = _log_softmax(row)
                    top = np.argsort(-lp, kind="stable")[:5]
                    gen.append({"id": int(top[0]), "top": [[int(i), round(float(lp[i]), 5)] for i in top]})
                cases.append({"prompt": f"default-corpus.txt[{at}:], {n} tokens", "prompt_ids": ids, "gen": gen})
            ref.close()
            data["models"][name] = {"sha256": sha256(path), "cases": cases}
    Path(out).write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arch", nargs="?", choices=ARCHS)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", default="small",
                    help="small (default: the tests' models) or a real width: " +
                         ", ".join(f"{a} --shape {s}" for a, d in SHAPES.items() for s in d))
    ap.add_argument("--layers", type=int, help="number of blocks (default: the shape's)")
    ap.add_argument("--expected", metavar="OUT.json", help="write llama.cpp's outputs on every arch's model")
    ap.add_argument("--only", nargs="+", choices=ARCHS,
                    help="with --expected or --server-fed: remake these models' entries only")
    ap.add_argument("--server-fed", metavar="OUT.json",
                    help="write llama.cpp's outputs on prompts of 70 to 2,048 tokens fed as its server feeds them")
    ap.add_argument("--gguf", nargs="*", default=[], help="with --server-fed: real models to run as well")
    a = ap.parse_args(argv)
    if a.server_fed:
        server_fed(a.server_fed, a.gguf, a.only)
        return 0
    if a.expected:
        expected(a.expected, a.only)
        return 0
    if not (a.arch and a.out):
        ap.error("expected ARCH and OUT.gguf (or --expected OUT.json)")
    write_model(a.arch, a.out, a.seed, a.shape, a.layers)
    print(f"{a.out}: {os.path.getsize(a.out) / 1e3:.0f} kB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
