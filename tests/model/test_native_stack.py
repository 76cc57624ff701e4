"""The blocks in C (minillama/_native/model.c, minillama/model/stack.py) against the Python blocks they replace on
the native backend, and the binding's checks.

Tiny float32 models of every architecture model.c runs (llama with rope_freqs, qwen2 with q/k/v biases, qwen3 with
per-head q/k norms, phi3 with fused matrices and a partial rope, gemma3 with its extra norms, GeGLU, query scale and
sliding-window layers, gpt-oss with YaRN, attention sinks, biases and float32 experts), written here: with F32 weights nothing is quantized, so the two paths differ only by float
rounding once the Python blocks attend as llama.cpp's CPU flash attention does (ggml_attention below: model.c's
attention.c computes that, float16 roundings and all, where layers.attention is a plain float32 softmax). A pass
split into chunks and single-token steps gives the bits of one fresh pass (each token's row is computed alone,
whatever else is in the chunk); so do several sequences in one pass (batched steps, prompt chunks side by side):
each gets the bits it gets alone. The real models' agreement with llama.cpp is checked by
test_model.py / test_quants.py (SmolLM2) and tools/bench/bench_model.py --exactness-only (Gemma 3).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.batching import steps_together_and_alone

from minillama.generate import Sampler
from minillama.model import Model
from minillama.model.batch import Batch
from minillama.model.layers import rmsnorm

gguf = pytest.importorskip("gguf")

try:
    from minillama._native import _core
except ImportError:
    _core = None
pytestmark = pytest.mark.skipif(_core is None, reason="the native core is not built")

D, FF, HEADS, HEADS_KV, VOCAB, CTX = 32, 64, 4, 2, 40, 64
#: gpt-oss: 3 experts, so that the float32 router is multiplied in one order for one row and for several (with a
#: multiple of 4, llama.cpp and model.c take tinyBLAS for several rows, and a chunk's bits are not a step's)
EXPERTS, FF_EXP = 3, 16


def write_tiny(path: Path, arch: str, blocks: int = 2) -> Path:
    """A tiny float32 model of arch with every tensor its Python blocks read (and the optional ones they take)."""
    rng = np.random.default_rng(sum(map(ord, arch)))
    head = 16 if arch == "gemma3" else D // HEADS  # gemma3: heads wider than n_embd / n_head
    n_rot = 4 if arch == "phi3" else head  # phi3: rope turns part of each head
    w = gguf.GGUFWriter(str(path), arch)
    keys = {"block_count": blocks, "context_length": CTX, "embedding_length": D, "feed_forward_length": FF,
            "attention.head_count": HEADS, "attention.head_count_kv": HEADS_KV, "attention.key_length": head,
            "attention.value_length": head, "rope.dimension_count": n_rot}
    for key, value in keys.items():
        w.add_key_value(f"{arch}.{key}", value, gguf.GGUFValueType.UINT32)
    w.add_key_value(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5, gguf.GGUFValueType.FLOAT32)
    w.add_key_value(f"{arch}.rope.freq_base", 500.0, gguf.GGUFValueType.FLOAT32)
    if arch == "gemma3":
        w.add_key_value("gemma3.attention.sliding_window", 3, gguf.GGUFValueType.UINT32)
    if arch == "gpt-oss":  # YaRN whose ramp crosses the pairs, a window on the even layers, 4 experts of 16
        for key, value in (("attention.sliding_window", 3), ("expert_count", EXPERTS), ("expert_used_count", 2),
                           ("expert_feed_forward_length", FF_EXP), ("rope.scaling.original_context_length", 4096)):
            w.add_key_value(f"gpt-oss.{key}", value, gguf.GGUFValueType.UINT32)
        w.add_key_value("gpt-oss.rope.scaling.type", "yarn", gguf.GGUFValueType.STRING)
        w.add_key_value("gpt-oss.rope.scaling.factor", 32.0, gguf.GGUFValueType.FLOAT32)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])

    def t(name: str, *shape: int, scale: float | None = None, around: float = 0.0) -> None:
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale or 1 / np.sqrt(shape[-1]))
        w.add_tensor(name, (x + np.float32(around)).astype(np.float32))

    t("token_embd.weight", VOCAB, D, scale=1.0)
    t("output_norm.weight", D, scale=0.1, around=1.0)
    if arch == "llama":
        t("rope_freqs.weight", n_rot // 2, scale=0.5, around=2.0)
    q, kv = HEADS * head, HEADS_KV * head
    for il in range(blocks):
        b = f"blk.{il}."
        t(b + "attn_norm.weight", D, scale=0.1, around=1.0)
        if arch == "phi3":
            t(b + "attn_qkv.weight", q + 2 * kv, D)
            t(b + "ffn_up.weight", 2 * FF, D)
        else:
            t(b + "attn_q.weight", q, D)
            t(b + "attn_k.weight", kv, D)
            t(b + "attn_v.weight", kv, D)
        if arch not in ("phi3", "gpt-oss"):
            t(b + "ffn_gate.weight", FF, D)
            t(b + "ffn_up.weight", FF, D)
        if arch in ("qwen2", "gpt-oss"):
            for part, n in (("q", q), ("k", kv), ("v", kv)):
                t(b + f"attn_{part}.bias", n, scale=0.1)
        if arch in ("qwen3", "gemma3"):
            t(b + "attn_q_norm.weight", head, scale=0.1, around=1.0)
            t(b + "attn_k_norm.weight", head, scale=0.1, around=1.0)
        t(b + "attn_output.weight", D, q)
        if arch == "gpt-oss":  # biases, sinks, the experts (gate and up beyond swiglu_oai's clamp) and their biases
            t(b + "attn_output.bias", D, scale=0.1)
            t(b + "attn_sinks.weight", HEADS, scale=1.0)
            t(b + "post_attention_norm.weight", D, scale=0.1, around=1.0)
            t(b + "ffn_gate_inp.weight", EXPERTS, D, scale=1.0)
            t(b + "ffn_gate_inp.bias", EXPERTS, scale=1.0)
            for part, shape in (("gate", (EXPERTS, FF_EXP, D)), ("up", (EXPERTS, FF_EXP, D)),
                                ("down", (EXPERTS, D, FF_EXP))):
                t(b + f"ffn_{part}_exps.weight", *shape, scale=3.0 if part != "down" else None)
                t(b + f"ffn_{part}_exps.bias", *shape[:2], scale=0.1)
            continue
        t(b + "ffn_norm.weight", D, scale=0.1, around=1.0)
        t(b + "ffn_down.weight", D, FF)
        if arch == "gemma3":
            t(b + "post_attention_norm.weight", D, scale=0.1, around=1.0)
            t(b + "post_ffw_norm.weight", D, scale=0.1, around=1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


#: gemma3: layer 5 sees the whole context
ARCHS = {"llama": 2, "qwen2": 2, "qwen3": 2, "phi3": 2, "gemma3": 7, "gpt-oss": 2}


@pytest.fixture(scope="module", params=list(ARCHS))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Model:
    path = write_tiny(tmp_path_factory.mktemp("stack") / f"{request.param}.gguf", request.param, ARCHS[request.param])
    mp = pytest.MonkeyPatch()
    mp.setenv("MINILLAMA_BACKEND", "native")
    try:
        m = Model.from_file(path, threads=2)
    finally:
        mp.undo()
    assert m._stack is not None, "the native backend runs this model's blocks in C"
    return m


IDS = [(7 * i + 3) % VOCAB for i in range(21)]

F16 = np.float16


def _dot_f16(x: np.ndarray, y: np.ndarray) -> np.float32:
    """ggml_vec_dot_f16 on AVX2: lane l of accumulator j takes x[32 i + 8 j + l] y[...] by fused multiply-adds
    (a product of two float16 values is exact in float64, so one rounding to float32 is the fused one); then
    acc0 + acc2, acc1 + acc3, their sum; lanes l and l + 4; pairs; the tail in float64."""
    n = len(x)
    np_ = n - n % 32
    acc = np.zeros((4, 8), np.float32)
    for i in range(0, np_, 32):
        blk = (x[i:i + 32].astype(np.float64) * y[i:i + 32]).reshape(4, 8)
        acc = (acc.astype(np.float64) + blk).astype(np.float32)
    t = (acc[0] + acc[2]) + (acc[1] + acc[3])
    h = t[:4] + t[4:]
    s = np.float64((h[0] + h[1]) + (h[2] + h[3]))
    for i in range(np_, n):
        s += np.float64(np.float32(x[i] * y[i]))
    return np.float32(s)


def ggml_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
                   scale: float, window: int = 0, sinks: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's CPU flash attention for one query row at a time (ggml_compute_forward_flash_attn_ext_f16_one_chunk,
    float16 cache): q rounded to float16; per visible key the score _dot_f16 * scale; an online softmax whose
    weighted sum of values is rounded to float16 after every rescale and every fused multiply-add; that sum
    times 1 / (the sum of the weights); a head's sink (gpt-oss) after the last key, on the float32 sum. Same
    signature as layers.attention."""
    t, h, _ = q.shape
    _, hkv, dv = v.shape
    q16, k16, v16 = (a.astype(F16).astype(np.float32) for a in (q, k, v))
    out = np.empty((t, h, dv), np.float32)
    for i in range(t):
        for j in range(h):
            kv = j // (h // hkv)
            m, total, acc = -np.inf, np.float32(0), np.zeros(dv, np.float32)
            for c in range(k.shape[0]):
                if k_pos[c] > q_pos[i] or (window > 0 and q_pos[i] - k_pos[c] >= window):
                    continue
                sc = np.float32(_dot_f16(k16[c, kv], q16[i, j]) * np.float32(scale))
                ms = w = np.float32(1)
                if sc > m:
                    ms = np.float32(np.exp(np.float32(m - sc))) if m != -np.inf else np.float32(0)
                    m = sc
                    acc = (acc * ms).astype(F16).astype(np.float32)
                else:
                    w = np.float32(np.exp(np.float32(sc - m)))
                acc = (acc.astype(np.float64) + v16[c, kv].astype(np.float64) * w).astype(np.float32)
                acc = acc.astype(F16).astype(np.float32)
                total = np.float32(np.float32(total * ms) + w)
            if sinks is not None:  # one more logit without a value, as one_chunk applies it after its loop
                s = np.float32(sinks[j])
                if s > m:
                    ms = np.float32(np.exp(np.float32(m - s))) if m != -np.inf else np.float32(0)
                    acc, total = acc * ms, np.float32(np.float32(total * ms) + np.float32(1))
                else:
                    total = np.float32(total + np.float32(np.exp(np.float32(s - m))))
            out[i, j] = acc * (np.float32(1) / total)
    return out.reshape(t, h * dv)


def python_blocks(m: Model, native: bool = True) -> contextlib.AbstractContextManager[None]:
    """m's forward pass in its Python blocks for a while: on the native backend (native) with the core's attention
    and element-wise kernels, else as the pure backend runs them (numpy, a float32 cache)."""
    @contextlib.contextmanager
    def swapped() -> Iterator[None]:
        stack, core = m._stack, m._attn_core
        m._stack = None
        if not native:
            m._attn_core = None
        try:
            yield
        finally:
            m._stack, m._attn_core = stack, core
    return swapped()


def test_c_blocks_equal_python_blocks(tiny: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure backend's Python blocks with ggml's attention mirrored in numpy (ggml_attention) come within float32
    noise of the C blocks; on the native backend (the core's attention, silu, exp and float32 products) the Python
    blocks give the C blocks' bits (gpt-oss's to float32 noise: model.c runs it on the native backend)."""
    got = tiny.logits(IDS)
    with python_blocks(tiny):
        ours = tiny.logits(IDS)
    if tiny.hparams.arch == "gpt-oss":  # its swiglu_oai and YaRN angles are numpy's in the Python blocks
        np.testing.assert_allclose(ours, got, rtol=1e-5, atol=1e-5 * np.abs(got).max())
    else:
        assert np.array_equal(ours, got)
    monkeypatch.setattr("minillama.model.batch.attention", ggml_attention)
    with python_blocks(tiny, native=False):
        want = tiny.logits(IDS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_c_attention_is_not_a_float32_softmax(tiny: Model) -> None:
    """The reference above is what makes the previous test pass: with layers.attention the C blocks differ by
    float16 roundings (so that test would catch model.c going back to a float32 softmax)."""
    got = tiny.logits(IDS)
    with python_blocks(tiny, native=False):
        plain = tiny.logits(IDS)
    assert np.abs(got - plain).max() > 1e-4 * np.abs(plain).max()


def test_chunks_and_steps_equal_one_pass(tiny: Model) -> None:
    fresh = tiny.logits(IDS)
    cache = tiny._new_cache()
    parts = [tiny._forward(IDS[:5], 0, cache, last_only=False), tiny._forward(IDS[5:13], 5, cache, last_only=False)]
    parts += [tiny._forward([i], n, cache, last_only=False) for n, i in enumerate(IDS[13:], 13)]
    np.testing.assert_array_equal(np.concatenate(parts), fresh)


def test_next_token_runs_the_c_steps(tiny: Model) -> None:
    tiny.reset()
    ids = IDS[:4]
    for _ in range(6):
        ids.append(tiny.next_token(ids, Sampler(temperature=0)))
    assert tiny.evaluated == 1
    assert ids[4:] == tiny.logits(ids)[3:-1].argmax(-1).tolist()


def test_binding_checks_every_length(tiny: Model) -> None:
    ns = tiny._stack
    assert ns is not None
    hp = tiny.hparams
    args = ns._stack_args  # the (hparams, layers) the Stack was made from
    _core.Stack(*args)
    good_layer = args[1][0]

    def with_field(name: str, value: object) -> tuple:
        return (args[0], [{**good_layer, name: value}])

    wqkv = good_layer["wqkv"]
    bad = {
        "attn_norm too short": with_field("attn_norm", np.ones(hp.n_embd - 1, np.float32)),
        "attn_norm missing": with_field("attn_norm", None),
        "attn_norm float64": with_field("attn_norm", np.ones(hp.n_embd)),
        "a matrix piece lies about its rows": with_field("wqkv", ((wqkv[0][0], wqkv[0][1], wqkv[0][2] + 1,
                                                                   wqkv[0][3]),) + wqkv[1:]),
        "a matrix of the wrong width": with_field("wqkv", tuple((p[0], p[1], p[2], p[3] * 2) for p in wqkv)),
        "an unknown type": with_field("wqkv", tuple((p[0], 99, p[2], p[3]) for p in wqkv)),
        "too few outputs": with_field("wqkv", ((wqkv[0][0][:-1], wqkv[0][1], wqkv[0][2] - 1, wqkv[0][3]),)
                                      + wqkv[1:]),
        "not a tuple of pieces": with_field("wqkv", wqkv[0][0]),
        "a negative window": with_field("window", -1),
        "a layer short of a field": (args[0], [{k: v for k, v in good_layer.items() if k != "window"}]),
        "heads that do not share": ({**args[0], "n_head": 3}, args[1]),
        "no feed-forward": with_field("w_gate_up" if good_layer["router"] is None else "router", None),
        "a dense and an expert feed-forward": with_field("router", good_layer["wo"]),
        "more experts used than there are": ({**args[0], "n_expert": 2, "n_expert_used": 3}, args[1]),
        "too many experts": ({**args[0], "n_expert": 513, "n_expert_used": 1}, args[1]),
        "a sink per kv head": with_field("sinks", np.ones(hp.n_head_kv, np.float32)),
        "a router bias without experts": with_field("router_bias", np.ones(1, np.float32)),
        "a zero rope speed": ({**args[0], "rope_freq_scale": 0.0}, args[1]),
        "a NaN YaRN factor": ({**args[0], "rope_ext_factor": float("nan")}, args[1]),
        "no original context": ({**args[0], "n_ctx_orig": 0}, args[1]),
    }
    for what, a in bad.items():
        with pytest.raises((ValueError, TypeError, BufferError)):
            _core.Stack(*a)
            pytest.fail(what)
    stack = _core.Stack(*args)
    cache = tiny._new_cache()
    cache.reserve(4)
    x = np.zeros((2, hp.n_embd), np.float32)
    caches = (cache.k, cache.v)
    bad_calls = {
        "x not whole rows": (np.zeros(hp.n_embd + 1, np.float32), [(1, 0, *caches)], 1),
        "x read-only": (np.frombuffer(bytes(8 * hp.n_embd), np.float32), [(2, 0, *caches)], 1),
        "x float64": (np.zeros((2, hp.n_embd)), [(2, 0, *caches)], 1),
        "past the caches' room": (x, [(2, cache.k[0].shape[0] - 1, *caches)], 1),
        "a negative start": (x, [(2, -1, *caches)], 1),
        "too few caches": (x, [(2, 0, cache.k[:-1], cache.v)], 1),
        "zero threads": (x, [(2, 0, *caches)], 0),
        "a float32 cache": (x, [(2, 0, [c.astype(np.float32) for c in cache.k], cache.v)], 1),
    }
    for what, call in bad_calls.items():
        with pytest.raises((ValueError, TypeError, BufferError)):
            stack.forward(*call)
            pytest.fail(what)
    stack.forward(x, [(2, 2, *caches)], 2)


def test_layers_and_hyper_parameters_cross_by_name(tiny: Model) -> None:
    """A layer and the hyper-parameters are dicts keyed by the names model.h lists (Stack.FIELDS, Stack.HPARAMS);
    a missing or unknown name is a ValueError naming it, and a position-ordered tuple is refused."""
    assert _core.Stack.FIELDS == ("attn_norm", "wqkv", "bqkv", "q_norm", "k_norm", "wo", "bo", "post_attn_norm",
                                  "ffn_norm", "w_gate_up", "b_gate_up", "w_down", "router", "gate_exps", "up_exps",
                                  "down_exps", "sinks", "router_bias", "gate_exps_bias", "up_exps_bias",
                                  "down_exps_bias", "b_down", "post_ffn_norm", "rope_freqs", "rope_base", "window")
    assert _core.Stack.HPARAMS == ("n_embd", "n_head", "n_head_kv", "head_dim", "head_dim_v", "n_ff", "n_rot", "eps",
                                   "rope_neox", "gelu", "scale_q", "q_scale", "attn_scale", "n_expert",
                                   "n_expert_used", "n_ff_exp", "kv_split", "softmax_weight", "swiglu_oai",
                                   "rope_freq_scale", "rope_ext_factor", "rope_attn_factor", "rope_beta_fast",
                                   "rope_beta_slow", "n_ctx_orig")
    ns = tiny._stack
    assert ns is not None
    hparams, layers, _ = ns._stack_args
    assert list(layers[0]) == list(_core.Stack.FIELDS) and list(hparams) == list(_core.Stack.HPARAMS)
    cases = {
        "layer 1 has no 'bo'": (hparams, [layers[0], {k: v for k, v in layers[1].items() if k != "bo"}]),
        "layer 0 has an unknown field 'attn_bias'": (hparams, [{**layers[0], "attn_bias": None}]),
        "hparams has no 'eps'": ({k: v for k, v in hparams.items() if k != "eps"}, layers),
        "hparams has an unknown field 'n_experts'": ({**hparams, "n_experts": 4}, layers),
    }
    for message, args in cases.items():
        with pytest.raises(ValueError, match=message):
            _core.Stack(*args)
    with pytest.raises(TypeError, match="layer 0 must be a dict by name"):
        _core.Stack(hparams, [tuple(layers[0].values())])
    with pytest.raises(TypeError, match="hparams must be a dict by name"):
        _core.Stack(tuple(hparams.values()), layers)


def test_binding_checks_the_head(tiny: Model) -> None:
    """The final norm and output matrix a Stack may run (forward's logits): every length checked."""
    ns = tiny._stack
    assert ns is not None and ns.n_vocab == tiny.n_vocab
    hparams, layers, head = ns._stack_args
    norm, out, n_vocab = head
    bad_heads = {
        "not a tuple": "head",
        "too short": (norm, out),
        "a short norm": (norm[:-1], out, n_vocab),
        "more outputs than the matrix has": (norm, out, n_vocab + 1),
        "no outputs": (norm, out, 0),
        "an output matrix of the wrong width": (norm, tuple((p[0], p[1], p[2], p[3] * 2) for p in out), n_vocab),
    }
    for what, h in bad_heads.items():
        with pytest.raises((ValueError, TypeError)):
            _core.Stack(hparams, layers, h)
            pytest.fail(what)
    with_head, without = _core.Stack(hparams, layers, head), _core.Stack(hparams, layers)
    cache = tiny._new_cache()
    cache.reserve(4)
    x = np.zeros((2, tiny.hparams.n_embd), np.float32)
    seqs = [(2, 0, cache.k, cache.v)]
    both = np.zeros(x.size + n_vocab, np.float32)  # x and logits in one buffer
    bad_calls = {
        "logits of the wrong size": (with_head, np.zeros(n_vocab - 1, np.float32)),
        "logits float64": (with_head, np.zeros(n_vocab)),
        "logits read-only": (with_head, np.frombuffer(bytes(4 * n_vocab), np.float32)),
        "logits over x": (with_head, both[:n_vocab]),
        "logits from a Stack without a head": (without, np.zeros(n_vocab, np.float32)),
    }
    for what, (stack, logits) in bad_calls.items():
        xx = both[:x.size].reshape(x.shape) if what == "logits over x" else x
        with pytest.raises((ValueError, TypeError, BufferError)):
            stack.forward(xx, seqs, 1, logits)
            pytest.fail(what)


def test_head_in_the_pass_equals_the_head_after_it(tiny: Model) -> None:
    """A step's logits from the C pass's head (final norm and output matrix in C) equal the logits of the
    blocks' output through the Python head (numpy's norm, then the output product)."""
    for n in (1, 5, len(IDS)):
        session = tiny.session()
        got = session.logits_next(IDS[:n])
        want = tiny.logits(IDS[:n])[-1]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


#: Sequences of unlike lengths (gemma3's window of 3 is crossed by all but the last).
PROMPTS = [IDS[:9], IDS[3:5], IDS[:14], [IDS[7]]]


def test_batched_steps_run_the_c_blocks_and_equal_lone_steps(tiny: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Single-token steps of several sequences in one pass (each at its own position, on its own cache) give every
    sequence the bits of its steps alone, through the C blocks (the Python blocks are not called)."""
    monkeypatch.setattr(tiny, "_arch", dataclasses.replace(tiny._arch, blocks=lambda *a: pytest.fail("the Python "
                                                                                                  "blocks ran")))
    got, want = steps_together_and_alone(tiny, PROMPTS, 6)
    np.testing.assert_array_equal(got, want)


def test_batched_c_steps_equal_python_batched_steps(tiny: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C blocks' batched steps against the Python blocks' (the reference, attending as ggml does), to float
    rounding."""
    got, _ = steps_together_and_alone(tiny, PROMPTS, 4)
    stack, tiny._stack = tiny._stack, None
    monkeypatch.setattr("minillama.model.batch.attention", ggml_attention)
    try:
        want, _ = steps_together_and_alone(tiny, PROMPTS, 4)
    finally:
        tiny._stack = stack
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_chunks_of_several_sequences_in_one_pass(tiny: Model) -> None:
    """Rows of several sequences, several rows each, at unlike starts in one pass: each sequence's rows are those
    of its own pass (the binding takes any Batch, not only single-token steps)."""
    ns = tiny._stack
    assert ns is not None
    caches, seqs, rows, want = [], [], [], []
    for n, (start, length) in enumerate([(0, 5), (3, 1), (6, 4)]):
        ids = IDS[n:n + start + length]
        alone = tiny._new_cache()
        want.append(tiny._forward(ids, 0, alone, last_only=False)[start:])  # the rows after the first start
        c = tiny._new_cache()
        if start:
            tiny._forward(ids[:start], 0, c, last_only=False)
        c.reserve(start + length)
        seqs.append((len(rows), start, c))
        rows += ids[start:]
        caches.append(c)
    x = tiny._embedding.lookup(np.asarray(rows, dtype=np.intp))
    if tiny._scale is not None:
        x *= np.float32(tiny._scale)
    x = ns.forward(x, Batch(seqs, np.asarray([])))
    got = tiny._logits(rmsnorm(x, tiny._output_norm, tiny.hparams.eps))
    np.testing.assert_array_equal(got, np.concatenate(want))


def test_binding_refuses_odd_batches(tiny: Model) -> None:
    """forward(x, seqs, threads) with sequences that do not fit x or their caches, or that share memory, raises
    a Python error before any work (never a crash, never a write out of an array)."""
    ns = tiny._stack
    assert ns is not None
    stack, hp = ns._stack, tiny.hparams
    a, b = tiny._new_cache(), tiny._new_cache()
    a.reserve(8), b.reserve(8)
    room = a.k[0].shape[0]
    x = np.zeros((3, hp.n_embd), np.float32)
    A, B = (a.k, a.v), (b.k, b.v)
    bad_calls = {
        "no sequences": (x, []),
        "rows short of x": (x, [(1, 0, *A), (1, 0, *B)]),
        "rows past x": (x, [(2, 0, *A), (2, 0, *B)]),
        "zero rows": (x, [(0, 0, *A), (3, 0, *B)]),
        "negative rows": (x, [(-1, 0, *A), (4, 0, *B)]),
        "the second past its cache": (x, [(1, 0, *A), (2, room - 1, *B)]),
        "the second at a negative position": (x, [(1, 0, *A), (2, -5, *B)]),
        "a huge position": (x, [(1, 0, *A), (2, 1 << 62, *B)]),
        "the second with too few caches": (x, [(1, 0, *A), (2, 0, b.k, b.v[:-1])]),
        "one cache for two sequences": (x, [(1, 0, *A), (2, 4, *A)]),
        "a layer's keys given twice": (x, [(3, 0, [a.k[0]] * len(a.k), a.v)]),
        "x inside a cache": (a.k[0].reshape(-1)[:3 * hp.n_embd].reshape(3, hp.n_embd), [(3, 0, *A)]),
        "a sequence not a tuple": (x, [[3, 0, *A]]),
        "a tuple too short": (x, [(3, 0, a.k)]),
        "caches not lists": (x, [(3, 0, tuple(a.k), a.v)]),
        "rows not a number": (x, [("3", 0, *A)]),
        "too many sequences": (x, [(1, 0, *A)] * 70000),
    }
    before = [c.copy() for c in a.k + a.v + b.k + b.v]
    for what, call in bad_calls.items():
        with pytest.raises((ValueError, TypeError, BufferError, OverflowError)):
            stack.forward(*call, 1)
            pytest.fail(what)
    for old, new in zip(before, a.k + a.v + b.k + b.v, strict=True):
        np.testing.assert_array_equal(old, new)  # nothing written by a refused call
    with pytest.raises(TypeError):
        stack.forward(x, tuple([(3, 0, *A)]), 1)  # seqs must be a list
    stack.forward(x, [(1, 0, *A), (2, room - 2, *B)], 2)  # the same calls, fitting: run


def test_python_blocks_kernels_check_every_length() -> None:
    """The kernels the Python blocks call on the native backend (attend, silu, exp_rows, mul_f32) refuse lengths that
    do not fit their shapes with a ValueError, before reading anything (the sanitizer run holds them to it)."""
    from minillama._native import _core

    f32, f16 = np.float32, np.float16
    q, k, v = np.zeros((3, 4, 8), f32), np.zeros((5, 2, 8), f16), np.zeros((5, 2, 8), f16)
    out = np.zeros((3, 32), f32)
    _core.attend(q, k, v, out, (3, 4, 2, 8, 8), 2, 0, 0.5, 3, 2)  # fits: positions 2..4 over a cache of 5
    _core.attend(q, k, v, out, (3, 4, 2, 8, 8), 2, 0, 0.5, 3, 2, np.zeros(4, f32))  # with sinks
    for dims, start, rows, sinks in [((3, 4, 2, 8, 8), 3, 3, None),  # the cache holds 5 positions, not 6
                                     ((3, 4, 3, 8, 8), 2, 3, None),  # 4 heads are no multiple of 3
                                     ((3, 4, 2, 8, 8), 2, 2, None),  # a pass of fewer rows than the sequence's
                                     ((3, 4, 2, 8, 8), 2, 3, np.zeros(3, f32)),  # a sink per head: 4
                                     ((3, 4, 2, 16, 8), 2, 3, None)]:  # q holds 8 values a head
        with pytest.raises(ValueError, match="attend"):
            _core.attend(q, k, v, out, dims, start, 0, 0.5, rows, 2, sinks)
    x = np.zeros(12, f32)
    for fn in (_core.silu, _core.exp_rows):
        fn(x, np.zeros(12, f32), 4)
        for o, n in [(np.zeros(12, f32), 5), (np.zeros(8, f32), 4), (np.zeros(12, f32), 0)]:
            with pytest.raises(ValueError, match="expected x and out"):
                fn(x, o, n)
    w = np.zeros((4, 8), f32)
    _core.mul_f32(w, np.zeros((2, 8), f32), np.zeros((2, 4), f32), 4, 8)
    for xx, o, e, d in [(np.zeros((2, 7), f32), np.zeros((2, 4), f32), 4, 8), (np.zeros((2, 8), f32),
                        np.zeros((2, 5), f32), 4, 8), (np.zeros((2, 8), f32), np.zeros((2, 4), f32), 4, 9)]:
        with pytest.raises(ValueError, match="mul_f32"):
            _core.mul_f32(w, xx, o, e, d)


@pytest.mark.parametrize("n, start, window", [(1, 699, 0), (1, 699, 400), (1, 699, 200), (1, 299, 0), (1, 299, 100),
                                              (70, 600, 400), (70, 100, 0), (8, 600, 400), (2, 699, 0), (5, 650, 0),
                                              (42, 650, 0), (42, 900, 200), (63, 700, 300), (63, 40, 0)])
def test_attention_gives_ggmls_flash_attention_bits(n: int, start: int, window: int) -> None:
    """The core's attention (_core.attend: the C blocks' and the Python blocks') against llama.cpp's own
    ggml_flash_attn_ext on 2 threads, to the bit: one row over 512 cells or more takes its split-KV path, also on
    a sliding-window layer (a window across both threads' chunks was summed unsplit, 0.003 off); rows of 64 and
    more its tiled path (which read every key as 0 when called before any model had run: the float16 table was
    not made yet); others its row-by-row path (2 to 63 rows: each block of cells widened once for all the rows, each
    row seeing its own causal end and window). The cache: the used cells padded to 256, as llama.cpp's."""
    from support.ggml_graph import ggml_flash_attn, graph_lib

    from minillama._native import _core

    ffi, lib = graph_lib()
    rng = np.random.default_rng(start + window)
    H, Hkv, D = 4, 2, 64
    end = start + n
    cells = (end + 255) // 256 * 256
    k = (rng.standard_normal((cells, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((cells, Hkv, D)).astype(np.float16)
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    pos = np.arange(start, end)[:, None]
    c = np.arange(cells)[None, :]
    visible = (c <= pos) & ((window == 0) | (pos - c < window))
    ref = ggml_flash_attn(ffi, lib, q, k, v, visible, 0.125)
    out = np.zeros((n, H * D), np.float32)
    _core.attend(q, np.ascontiguousarray(k[:end]), np.ascontiguousarray(v[:end]), out, (n, H, Hkv, D, D), start,
                 window, 0.125, n, 2)
    np.testing.assert_array_equal(out.reshape(n, H, D), ref)


def _ring_order(window: int, passes: list[int]) -> np.ndarray:
    """The cell order of llama.cpp's sliding-window cache after passes of those many rows (from position 0), as
    KVCache's Ring places them."""
    from minillama.model.cache import Ring, swa_cells

    ring = Ring(swa_cells(window, 1 << 20), window)
    start = 0
    for n in passes:
        ring.place(start, n)
        start += n
    cells = ring.cells()
    assert cells is not None and start > ring.size  # the ring has wrapped: cells are not in position order
    return cells


def _shifted_order(n_ctx: int, keep: int, discard: int, new: int) -> np.ndarray:
    """A full-attention cache of n_ctx cells after llama-server's context shift: positions keep..keep+discard-1
    removed, the later ones moved back by discard, then `new` positions placed in the freed cells:
    [kept][new, empty][old, shifted]."""
    cells = np.arange(n_ctx, dtype=np.int64)
    cells[keep:keep + discard] = -1
    cells[keep + discard:] -= discard
    cells[keep:keep + new] = np.arange(n_ctx - discard, n_ctx - discard + new)
    return cells


@pytest.mark.parametrize("order, n, window", [("ring", 1, 128), ("ring", 8, 128), ("ring", 70, 128),
                                              ("ring", 1, 300), ("shift", 1, 0), ("shift", 5, 0), ("shift", 64, 0),
                                              ("ring", 2, 128), ("ring", 42, 128), ("ring", 63, 128), ("shift", 2, 0),
                                              ("shift", 42, 0), ("shift", 63, 0)])
def test_attention_over_cells_out_of_position_order_gives_ggmls_bits(order: str, n: int, window: int) -> None:
    """A cache whose cells do not hold positions in order (llama.cpp's sliding-window cache once it has wrapped: new
    positions reuse the cells of those out of the window; a cache after a context shift: [kept][new][old shifted])
    is visited in cell order, as ggml_flash_attn_ext visits it, each row masking the positions it does not see: to
    the bit on its three paths (one row over 512 cells or more: the split-KV chunks of cells; a few rows: one pass
    over the cells; 64 rows and more: tiles of 64 cells). Without the order the sums ran in position order."""
    from support.ggml_graph import ggml_flash_attn, graph_lib

    from minillama._native import _core

    ffi, lib = graph_lib()
    rng = np.random.default_rng(n + window)
    H, Hkv, D = 4, 2, 64
    if order == "ring":  # a prompt in ubatches of 512 rows, then the rows asked for
        cells = _ring_order(window, [512, 300, n] if n > 1 else [512, 512, 200, 1, 1, 1])
    else:
        cells = _shifted_order(768, 40, 300, n)
    end = int(cells.max()) + 1
    start = end - n
    k_cells = (rng.standard_normal((cells.size, Hkv, D)) * 2).astype(np.float16)
    v_cells = rng.standard_normal((cells.size, Hkv, D)).astype(np.float16)
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    pos = np.arange(start, end)[:, None]
    visible = (cells[None, :] >= 0) & (cells[None, :] <= pos) & ((window == 0) | (pos - cells[None, :] < window))
    assert visible.any(axis=1).all()
    ref = ggml_flash_attn(ffi, lib, q, k_cells, v_cells, visible, 0.125)
    # minillama's cache by position: cell c's key at row cells[c]; positions in no cell hold noise never read
    k = (rng.standard_normal((end, Hkv, D)) * 100).astype(np.float16)
    v = (rng.standard_normal((end, Hkv, D)) * 100).astype(np.float16)
    k[cells[cells >= 0]], v[cells[cells >= 0]] = k_cells[cells >= 0], v_cells[cells >= 0]
    out = np.zeros((n, H * D), np.float32)
    _core.attend(q, k, v, out, (n, H, Hkv, D, D), start, window, 0.125, n, 2, None, cells)
    np.testing.assert_array_equal(out.reshape(n, H, D), ref)


#: (rows, heads, kv heads, head dim, value dim, start, window, sinks) of the attention's edge cases. From 64 rows the
#: tiled path: row groups not aligned to the key tiles, value dims of 16 lanes, of 16 + 8, of 16 + 4 and of 8, blocks
#: of rows cut short (groups of 6 or 22 rows seeing a whole tile), a sliding window cutting tiles at their start,
#: sinks, 1, 2 and 4 query heads per key/value head. Below, the row path: one-row steps over 512 cells or more (the
#: split-KV path) and fewer, and passes of 2 to 63 rows over long caches (blocks of cells shared by the rows: key dims
#: with a tail past 32, windows, a cache after a context shift, "shift": its cells out of position order); value dims
#: of 64 + 32, of 16 + 4, of 256; 1, 2, 3 and 4 heads per key/value head
_ATTENTION_CASES = [(200, 4, 2, 64, 64, 70, 0, False), (133, 6, 3, 40, 24, 5, 0, True),
                    (150, 2, 1, 32, 20, 100, 90, False), (64, 3, 3, 16, 8, 300, 0, True),
                    (70, 2, 2, 64, 64, 900, 0, False), (86, 2, 1, 48, 48, 0, 0, True), (300, 8, 2, 64, 64, 600, 0, False),
                    (1, 8, 2, 64, 64, 700, 0, False), (1, 4, 1, 96, 96, 300, 0, True), (1, 4, 2, 40, 20, 1200, 0, True),
                    (1, 4, 4, 256, 256, 600, 0, False), (20, 6, 2, 32, 24, 40, 0, True), (1, 8, 2, 64, 64, 200, 0, False),
                    (1, 6, 1, 64, 72, 900, 0, False), (2, 9, 3, 64, 64, 700, 0, False),
                    (5, 4, 1, 40, 24, 650, 300, True), (42, 9, 3, 64, 64, 650, 0, False),
                    (63, 6, 2, 96, 72, 900, 250, True), (42, 8, 2, 112, 100, 520, 0, False),
                    (42, 9, 3, 64, 64, 650, 0, False, "shift"), (7, 4, 2, 48, 40, 300, 100, True, "shift")]


def _attention(case: tuple) -> np.ndarray:
    """_core.attend's output for one case of random queries and cache (seeded by the case), as a pass of its rows
    (llama.cpp's thread count 2: the split-KV path's chunks); a ninth field "shift": the cache's cells in the order a
    context shift of 100 positions leaves (_shifted_order)."""
    from minillama._native import _core

    n, h, hkv, d, dv, start, window, sinks = case[:8]
    cells = _shifted_order(start + 100, 40, 100, n) if case[8:] == ("shift",) else None
    rng = np.random.default_rng(sum(case[:8]))
    q = (rng.standard_normal((n, h, d)) * 1.5).astype(np.float32)
    k = rng.standard_normal((start + n, hkv, d)).astype(np.float16)
    v = rng.standard_normal((start + n, hkv, dv)).astype(np.float16)
    out = np.zeros((n, h * dv), np.float32)
    sk = rng.standard_normal(h).astype(np.float32) * 3 if sinks else None
    _core.attend(q, k, v, out, (n, h, hkv, d, dv), start, window, 1 / np.sqrt(d), n, 2, sk, cells)
    return out


def test_attention_kernels_equal_the_scalar_rows(tmp_path: Path) -> None:
    """The AVX2 attention (tiled: rows that see a whole key tile taken four at a time, the tile's keys and values
    widened once for the query heads sharing them, sums kept in registers; row path: the query heads sharing a
    key/value head scored and summed in one pass over a run of keys, a pass of several rows sharing each block of
    keys and values widened once, eight scores' last sums transposed together, libm's expf four at a time) gives the bits of the scalar kernels, which take
    one query row at a time through the same operations in the same order (MINILLAMA_KERNELS=scalar, in a child: the
    choice is made once per process)."""
    import json
    import os
    import subprocess
    import sys

    if _core.kernels() != "avx2":
        pytest.skip("the AVX2 kernels do not run here: nothing to compare the scalar ones with")
    repo = Path(__file__).resolve().parents[2]
    code = ("import sys, json, numpy as np; r = sys.argv[1]; sys.path[:0] = [r, r + '/tests', r + '/tests/model']; "
            "from minillama._native import _core; assert _core.kernels() == 'scalar'; "
            "import test_native_stack as t; "
            "np.savez(sys.argv[2], *[t._attention(tuple(c)) for c in json.loads(sys.argv[3])])")
    env = dict(os.environ, MINILLAMA_KERNELS="scalar")
    out = subprocess.run([sys.executable, "-c", code, str(repo), str(tmp_path / "scalar.npz"),
                          json.dumps(_ATTENTION_CASES)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    scalar = np.load(tmp_path / "scalar.npz")
    for i, case in enumerate(_ATTENTION_CASES):
        got, want = _attention(case), scalar[f"arr_{i}"]
        assert np.isfinite(got).all()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (case, np.abs(got - want).max())
