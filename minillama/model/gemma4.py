"""gemma4 (Gemma 4, text model): gemma3's block with layers of two shapes, per-layer embeddings and shared caches.

As llama.cpp's src/models/gemma4.cpp computes it. The file's attention.sliding_window_pattern says which layers
attend within the sliding window; those have heads of attention.key_length_swa, rotate rope.dimension_count_swa
dims with rope.freq_base_swa, and the others (full attention) have heads of attention.key_length, rotate
rope.dimension_count dims with rope.freq_base and divide each pair's angle by rope_freqs.weight (Gemma 4's
"proportional" rope: 1e30 stops a pair). In a block: q and k are RMS-normed per head with weights, v without one
(it is k's projection when the block has no attn_v), NEOX rope, scores not scaled (scale 1); attention and
feed-forward (GeGLU, of feed_forward_length, one per layer) are each RMS-normed again before they join the
stream. The last attention.shared_kv_layers blocks compute no keys or values: they read the cache of the last
block before them of their kind (sliding-window or full). With embedding_length_per_layer_input > 0 each token
also has a row of per_layer_token_embd (one slice per layer, scaled by sqrt of its width), added to a normed
projection of the embedded stream and scaled by 1/sqrt(2); after its feed-forward, block il gates its slice
with GELU(inp_gate x) and adds post_norm(proj(...)) to the stream. layer_output_scale, when a block has it,
multiplies the block's output. The logits go through tanh softcapping (final_logit_softcapping, 30 when the
file has no such key, as llama.cpp). Mixture-of-experts blocks (Gemma 4 26B-A4B: ffn_gate_inp) and vision or
audio towers are refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FormatError, UnsupportedError
from .batch import Batch
from .layers import Linear, gelu, glu_ffn, rmsnorm, rope_angles, rope_neox
from .spec import ArchSpec, register
from .weights import HParams, TensorSpec, Weights

F32 = np.float32

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields of that layer, ne0 first).
LAYER_TENSORS: dict[str, TensorSpec] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)),
    "wq": ("blk.{i}.attn_q.weight", ("n_embd", "q_dim")),
    "q_norm": ("blk.{i}.attn_q_norm.weight", ("head_dim",)),
    "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
    "post_attn_norm": ("blk.{i}.post_attention_norm.weight", ("n_embd",)),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", ("n_embd",)),
    "w_gate": ("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    "w_up": ("blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    "w_down": ("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
    "post_ffn_norm": ("blk.{i}.post_ffw_norm.weight", ("n_embd",)),
}

#: Loaded when the file has them: k and its norm (absent on the shared-cache blocks), v (absent: v is k's
#: projection), the layer's output scale. Required per layer where llama.cpp requires them (REQUIRED_WHERE).
OPTIONAL_TENSORS: dict[str, TensorSpec] = {
    "wk": ("blk.{i}.attn_k.weight", ("n_embd", "k_dim")),
    "k_norm": ("blk.{i}.attn_k_norm.weight", ("head_dim",)),
    "wv": ("blk.{i}.attn_v.weight", ("n_embd", "v_dim")),
    "out_scale": ("blk.{i}.layer_output_scale.weight", ("one",)),
    "rope_freqs": ("rope_freqs.weight", ("n_rot_pairs_full",)),
    "ple_gate": ("blk.{i}.inp_gate.weight", ("n_embd", "n_embd_per_layer")),
    "ple_proj": ("blk.{i}.proj.weight", ("n_embd_per_layer", "n_embd")),
    "ple_post_norm": ("blk.{i}.post_norm.weight", ("n_embd",)),
}

#: Tensors outside the blocks, with per-layer embeddings (embedding_length_per_layer_input > 0).
PLE_TABLE: TensorSpec = ("per_layer_token_embd.weight", ("n_ple", "n_vocab"))
PLE_MODEL_PROJ: TensorSpec = ("per_layer_model_proj.weight", ("n_embd", "n_ple"))
PLE_PROJ_NORM: TensorSpec = ("per_layer_proj_norm.weight", ("n_embd_per_layer",))

#: Name prefixes of the tensors of a vision or audio tower (and its projector) in the same file.
TOWER_PREFIXES = ("v.", "a.", "mm.")

#: llama.cpp's f_final_logit_softcapping when the file has no final_logit_softcapping key.
DEFAULT_SOFTCAP = 30.0
#: llama.cpp's rope_freq_base_train_swa when the file has no rope.freq_base_swa key.
DEFAULT_ROPE_BASE_SWA = 10000.0


@dataclass(frozen=True)
class Gemma4HParams(HParams):
    """HParams of a gemma4 file: the base fields hold the full-attention layers' head and rope sizes; at(il)
    gives layer il's (its kind's head size and rope dims, its feed-forward width and key/value heads)."""

    swa: tuple[bool, ...] = ()
    n_ff_layers: tuple[int, ...] = ()
    n_head_kv_layers: tuple[int, ...] = ()
    full_dims: tuple[int, int, int] = (0, 0, 0)  # head_dim, head_dim_v, n_rot of the full-attention layers
    swa_dims: tuple[int, int, int] = (0, 0, 0)  # the same of the sliding-window layers
    rope_base_swa: float = DEFAULT_ROPE_BASE_SWA
    n_embd_per_layer: int = 0
    n_layer_kv: int = 0  # the first n_layer_kv blocks compute keys and values; the others read an earlier one's
    softcap: float = DEFAULT_SOFTCAP
    one: int = 1

    def at(self, il: int) -> HParams:
        head_dim, head_dim_v, n_rot = self.swa_dims if self.swa[il] else self.full_dims
        return dataclasses.replace(self, head_dim=head_dim, head_dim_v=head_dim_v, n_rot=n_rot,
                                   n_ff=self.n_ff_layers[il], n_head_kv=self.n_head_kv_layers[il])

    @property
    def n_ple(self) -> int:
        """Width of a token's per-layer embedding row: every layer's slice."""
        return self.n_embd_per_layer * self.n_layer

    @property
    def n_rot_pairs_full(self) -> int:
        """Length of rope_freqs.weight: half the full-attention layers' head."""
        return self.full_dims[0] // 2

    def kv_source(self, il: int) -> int:
        """The block whose cache block il attends to: itself, or for a shared-cache block the last block with a
        cache of its kind (llama.cpp's reuse: n_layer_kv - 2 for a sliding-window block, n_layer_kv - 1 else)."""
        return il if il < self.n_layer_kv else self.n_layer_kv - (2 if self.swa[il] else 1)


def read_hparams(w: Weights, name: str) -> Gemma4HParams:
    """The generic hyper-parameters (feed_forward_length and head_count_kv may hold one value per layer) and
    gemma4's own keys, as llama_model_gemma4::load_arch_hparams reads them; a file with experts or a vision or
    audio tower is refused (UnsupportedError)."""
    tower = next((t for t in w.tensors if t.startswith(TOWER_PREFIXES)), None)
    if tower is not None:
        raise UnsupportedError(f"{w.path}: tensor {tower} belongs to a vision or audio tower, which minillama does "
                               "not run; expected a text-only gemma4 file (the towers ship as a separate mmproj "
                               "file)")
    routers = sorted(t for t in w.tensors if t.endswith("ffn_gate_inp.weight"))
    if routers:
        raise UnsupportedError(f"{w.path}: tensor {routers[0]} is a mixture-of-experts router (Gemma 4 26B-A4B), "
                               "which minillama does not implement for gemma4; expected a dense gemma4 file")
    hp = w.hparams(name, per_layer=frozenset({"n_ff", "n_head_kv"}))
    md, n = w.gguf.metadata, hp.n_layer

    def key(k: str, default: Any = None, kind: type = int) -> Any:
        full = f"{name}.{k}"
        value = md.get(full)
        if value is None:
            if default is None:
                raise FormatError(f"expected metadata key {full!r} (needed to run gemma4), not found", path=w.path,
                                  key=full)
            return default
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
              and value >= 0 and (kind is float or float(value).is_integer()))
        if not ok:
            raise FormatError(f"{full} is {value!r}, expected a non-negative {'number' if kind is float else 'integer'}",
                              path=w.path, key=full)
        return kind(value)

    full = f"{name}.attention.sliding_window_pattern"
    pattern = md.get(full)
    if not isinstance(pattern, (list, np.ndarray)) or len(pattern) != n:
        raise FormatError(f"{full} is {pattern!r}, expected one true/false per layer ({n})", path=w.path, key=full)
    swa = tuple(bool(p) for p in pattern)
    head_k_swa, head_v_swa = key("attention.key_length_swa"), key("attention.value_length_swa")
    if hp.head_dim != hp.head_dim_v or head_k_swa != head_v_swa:
        raise FormatError(f"gemma4 heads have keys of {hp.head_dim} and values of {hp.head_dim_v} (sliding window: "
                          f"{head_k_swa} and {head_v_swa}), expected the same sizes, as llama.cpp requires",
                          path=w.path, key=f"{name}.attention.value_length")
    n_rot_swa = key("rope.dimension_count_swa", hp.n_rot)
    if not 0 < head_k_swa or n_rot_swa > head_k_swa or n_rot_swa % 2:
        raise FormatError(f"rope rotates {n_rot_swa} dims of the sliding-window heads of {head_k_swa}, expected an "
                          "even number no larger than the head", path=w.path, key=f"{name}.rope.dimension_count_swa")
    if hp.sliding_window == 0 and any(swa):
        raise FormatError(f"{name}.attention.sliding_window is missing or 0, expected the window of the "
                          "sliding-window layers", path=w.path, key=f"{name}.attention.sliding_window")
    shared = key("attention.shared_kv_layers", 0)
    n_layer_kv = n - shared
    if shared and (n_layer_kv < 2 or not swa[n_layer_kv - 2] or swa[n_layer_kv - 1]):
        raise FormatError(f"{name}.attention.shared_kv_layers is {shared} of {n} layers, expected the two blocks "
                          "before the shared ones to be a sliding-window block then a full one (their caches are "
                          "shared)", path=w.path, key=f"{name}.attention.shared_kv_layers")
    n_ff = w.layer_values.get("n_ff", (hp.n_ff,) * n)
    n_head_kv = w.layer_values.get("n_head_kv", (hp.n_head_kv,) * n)
    bad = next((h for h in n_head_kv if h == 0 or hp.n_head % h), None)
    if bad is not None:
        raise FormatError(f"{hp.n_head} query heads cannot share {bad} key/value heads evenly", path=w.path,
                          key=f"{name}.attention.head_count_kv")
    return Gemma4HParams(**{f.name: getattr(hp, f.name) for f in dataclasses.fields(HParams)},
                         swa=swa, n_ff_layers=tuple(int(v) for v in n_ff),
                         n_head_kv_layers=tuple(int(v) for v in n_head_kv),
                         full_dims=(hp.head_dim, hp.head_dim_v, hp.n_rot), swa_dims=(head_k_swa, head_v_swa, n_rot_swa),
                         rope_base_swa=key("rope.freq_base_swa", DEFAULT_ROPE_BASE_SWA, float),
                         n_embd_per_layer=key("embedding_length_per_layer_input"), n_layer_kv=n_layer_kv,
                         softcap=key("final_logit_softcapping", DEFAULT_SOFTCAP, float))


def _required(w: Weights, hp: Gemma4HParams, il: int) -> list[str]:
    """The optional fields llama.cpp requires of block il: k and its norm on a block with a cache, rope_freqs on a
    full-attention block, the per-layer embedding's tensors when the file has them."""
    need = ["wk", "k_norm"] if il < hp.n_layer_kv else []
    if not hp.swa[il]:
        need.append("rope_freqs")
    if hp.n_embd_per_layer > 0:
        need += ["ple_gate", "ple_proj", "ple_post_norm"]
    return need


def extras(w: Weights, hp: HParams) -> tuple[dict[str, Any], set[str]]:
    """The per-layer embeddings' tensors outside the blocks (the table stays quantized, its rows read per token),
    and a check that each block has what llama.cpp requires of it: FormatError naming the missing tensor."""
    assert isinstance(hp, Gemma4HParams)
    for il in range(hp.n_layer):
        for field in _required(w, hp, il):
            w.check(*w.spec(OPTIONAL_TENSORS[field], hp, il))
    if hp.n_embd_per_layer == 0:
        return {}, set()
    for spec in (PLE_MODEL_PROJ, PLE_PROJ_NORM):
        w.check(*w.spec(spec, hp))
    table = w.embedding(*w.spec(PLE_TABLE, hp))  # type: ignore[arg-type]
    found = {"ple_table": table, "ple_model_proj": w.load(PLE_MODEL_PROJ, hp),
             "ple_proj_norm": w.load(PLE_PROJ_NORM, hp)}
    return found, {PLE_TABLE[0], PLE_MODEL_PROJ[0], PLE_PROJ_NORM[0]}


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """Gate and up fused into one matrix; q, k, v kept apart (a block may have no k or v)."""
    return {**t, "w_gate_up": Linear.fuse([t.pop("w_gate"), t.pop("w_up")])}


def embed_scale(hp: HParams) -> float:
    """Gemma multiplies the embedding rows by sqrt(d) (in float32, as ggml_scale(sqrtf(n_embd)))."""
    return float(np.sqrt(F32(hp.n_embd)))


def cache_shapes(hp: HParams) -> list[tuple[int, int, int]]:
    """Each block's cache: (its key/value heads, key size, value size); none (0 wide) for the shared-cache blocks."""
    assert isinstance(hp, Gemma4HParams)
    out = []
    for il in range(hp.n_layer):
        at = hp.at(il)
        out.append((at.n_head_kv, at.head_dim, at.head_dim_v) if il < hp.n_layer_kv else (at.n_head_kv, 0, 0))
    return out


def finish_logits(logits: np.ndarray, hp: HParams) -> np.ndarray:
    """cap * tanh(logits / cap), in float32 as ggml_scale, ggml_tanh, ggml_scale (cap 0: none)."""
    cap = getattr(hp, "softcap", 0.0)
    if not cap:
        return logits
    return np.tanh(logits * F32(1.0 / F32(cap))) * F32(cap)


def per_layer_inputs(x: np.ndarray, w: dict[str, Any], hp: Gemma4HParams, tokens: np.ndarray) -> np.ndarray:
    """Each row's per-layer inputs [T, n_layer, n_embd_per_layer]: (table row * sqrt(width) + proj_norm(model_proj
    x / sqrt(d))) / sqrt(2), x the scaled embeddings (llama.cpp's project_per_layer_inputs)."""
    t, pe = x.shape[0], hp.n_embd_per_layer
    rows = w["ple_table"].lookup(tokens) * F32(np.sqrt(F32(pe)))
    proj = w["ple_model_proj"](x) * F32(1.0 / np.sqrt(F32(hp.n_embd)))
    proj = rmsnorm(proj.reshape(t, hp.n_layer, pe), w["ple_proj_norm"], hp.eps)
    return (proj + rows.reshape(t, hp.n_layer, pe)) * F32(1.0 / np.sqrt(F32(2.0)))


def attention_qkv(w: dict[str, Any], h: np.ndarray, at: HParams) -> tuple[np.ndarray, np.ndarray | None,
                                                                           np.ndarray | None]:
    """q [T, H, D] and, on a block with a cache, k and v [T, Hkv, D] (v: k's projection when there is no attn_v)."""
    t = h.shape[0]
    q = w["wq"](h).reshape(t, at.n_head, at.head_dim)
    if w.get("wk") is None:
        return q, None, None
    k = w["wk"](h)
    v = w["wv"](h) if w.get("wv") is not None else k
    return q, k.reshape(t, at.n_head_kv, at.head_dim), v.reshape(t, at.n_head_kv, at.head_dim_v)


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    assert isinstance(hp, Gemma4HParams)
    pos = batch.positions
    ple = None
    if hp.n_embd_per_layer > 0:
        if batch.tokens is None:
            raise ValueError("gemma4's per-layer embeddings need the batch's token ids (Batch.tokens)")
        ple = per_layer_inputs(x, layers[0], hp, batch.tokens)
    angles: dict[bool, tuple[np.ndarray, np.ndarray]] = {}
    for il, w in enumerate(layers):
        at, swa = hp.at(il), hp.swa[il]
        if swa not in angles:
            angles[swa] = (rope_angles(pos, at.n_rot, hp.rope_base_swa) if swa else
                           rope_angles(pos, at.n_rot, hp.rope_base, w.get("rope_freqs")))
        cos, sin = angles[swa]
        window = hp.sliding_window if swa else 0
        q, k, v = attention_qkv(w, rmsnorm(x, w["attn_norm"], hp.eps), at)
        q = rope_neox(rmsnorm(q, w["q_norm"], hp.eps), cos, sin)
        if k is not None and v is not None:
            v = rmsnorm(v, F32(1), hp.eps)
            k = rope_neox(rmsnorm(k, w["k_norm"], hp.eps), cos, sin)
            a = batch.attend(il, q, k, v, 1.0, window)
        else:
            a = batch.attend_cached(hp.kv_source(il), q, 1.0, window)
        x = x + rmsnorm(w["wo"](a), w["post_attn_norm"], hp.eps)
        f = glu_ffn(rmsnorm(x, w["ffn_norm"], hp.eps), w["w_gate_up"], w["w_down"], gelu)
        x = rmsnorm(f, w["post_ffn_norm"], hp.eps) + x
        if ple is not None:
            g = gelu(w["ple_gate"](x)) * ple[:, il]
            x = x + rmsnorm(w["ple_proj"](g), w["ple_post_norm"], hp.eps)
        if w.get("out_scale") is not None:
            x = x * w["out_scale"]
    return x


SPEC = register(ArchSpec("gemma4", LAYER_TENSORS, prepare, blocks, OPTIONAL_TENSORS, rope_whole_head=False,
                         embed_scale=embed_scale, read_hparams=read_hparams, extras=extras,
                         cache_shapes=cache_shapes, finish_logits=finish_logits))
