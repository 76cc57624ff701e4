"""Hyper-parameters and weight tensors of a GGUF model, found by name from tables and dequantized to float32.

A GGUF file names every tensor (``blk.3.attn_q.weight``) and lists its shape in ggml order, ne0 first: a
matrix that maps n_in values to n_out values is [n_in, n_out] and is stored as n_out rows of n_in values.
``Weights.matrix`` returns it as numpy (n_out, n_in) float32, dequantized by minillama.quants
(one dequantizer for the whole package). Hyper-parameters come from ``{arch}.<key>`` metadata, the names
gguf.Keys uses; the table below says which key fills which field and what the default is.
"""

from __future__ import annotations

import math
import mmap
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from ..backend import backend_choice, native_core
from ..embedding import Embedding
from ..errors import FormatError, MinillamaError, UnsupportedError
from ..gguffile.reader import GGUFFile, TensorInfo, read_gguf
from ..quants import check_tensor_table, dequantize, native_types, tensor_layout, tensor_view
from .layers import Linear, QuantLinear
from .moe import Experts

__all__ = ["HParams", "Weights", "TensorSpec"]


@dataclass(frozen=True)
class HParams:
    """What the forward pass needs to know about a model's shape, read from its metadata."""

    arch: str
    n_vocab: int
    n_embd: int  # model width d
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  # size of a query/key head
    head_dim_v: int  # size of a value head
    n_ff: int  # hidden width of the feed-forward network
    n_ctx: int  # context length the model was trained for
    n_rot: int  # leading dims of each head that rope rotates
    rope_base: float
    eps: float  # rms norm epsilon
    sliding_window: int  # 0: every layer sees the whole context
    n_expert: int = 0  # experts of a mixture-of-experts feed-forward (0: a dense one)
    n_expert_used: int = 0  # experts each token goes through
    n_ff_exp: int = 0  # hidden width of one expert
    n_expert_shared: int = 0  # shared experts every token goes through (deepseek2), as one wider feed-forward
    n_expert_groups: int = 0  # groups of experts a token first chooses among (0 or 1: no groups)
    n_group_used: int = 0  # groups each token chooses its experts from
    expert_gating: int = 0  # llama.cpp's expert_gating_func: 0 the architecture's default, 1 softmax, 2 sigmoid
    expert_weights_scale: float = 0.0  # the chosen experts' weights are multiplied by it (0 or 1: not scaled)
    expert_weights_norm: bool = False  # the chosen experts' weights are divided by their sum
    n_layer_dense_lead: int = 0  # leading blocks with a dense feed-forward instead of experts
    n_lora_q: int = 0  # rank of q's low-rank projection (multi-head latent attention; 0: one q matrix)
    n_lora_kv: int = 0  # rank of the compressed keys/values (multi-head latent attention)
    head_dim_mla: int = 0  # a query/key head as multi-head latent attention decompresses it (0: not MLA)
    head_dim_v_mla: int = 0  # a value head as multi-head latent attention decompresses it
    rope_scaling: str = "linear"  # rope.scaling.type: "none", "linear" or "yarn" (llama.cpp's default "linear")
    rope_scale: float = 0.0  # rope.scaling.factor: the context extension (0: none); rope turns 1/factor as fast
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor: multiplies the rotated q and k (YaRN's mscale)
    n_ctx_orig: int = 0  # rope.scaling.original_context_length (YaRN's correction dims; default n_ctx)
    yarn_log_mul: float = 0.0  # rope.scaling.yarn_log_multiplier, as stored (deepseek2's YaRN: 0.1 x mscale_all_dim)

    def at(self, il: int) -> HParams:
        """Layer il's hyper-parameters: these, for an architecture whose layers all have one shape (gemma4's
        differ: its HParams subclass overrides this)."""
        return self
    ssm_d_conv: int = 0  # gated DeltaNet layers (qwen35): short convolution kernel width
    ssm_d_inner: int = 0  # their value width (value heads x value head size)
    ssm_d_state: int = 0  # their key/value head size
    ssm_dt_rank: int = 0  # their value heads
    ssm_n_group: int = 0  # their key heads
    full_attention_interval: int = 4  # every this-th layer is full attention, the others DeltaNet (qwen35)
    n_ff_shexp: int = 0  # hidden width of a shared expert (0: n_ff)
    rope_sections: tuple[int, ...] = ()  # rope.dimension_sections (multi-section rope), when the file has it

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def k_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def v_dim(self) -> int:
        return self.n_head_kv * self.head_dim_v

    @property
    def o_dim(self) -> int:
        return self.n_head * self.head_dim_v

    @property
    def n_rot_pairs(self) -> int:
        """Pairs of dims rope turns in each head (the length of rope_freqs.weight)."""
        return self.n_rot // 2

    @property
    def qkv_dim(self) -> int:
        """Outputs of a fused q/k/v matrix (phi3's attn_qkv)."""
        return self.q_dim + self.k_dim + self.v_dim

    @property
    def ssm_key_dim(self) -> int:
        """Key (and query) width of a DeltaNet layer: key heads x head size."""
        return self.ssm_n_group * self.ssm_d_state

    @property
    def ssm_value_dim(self) -> int:
        """Value width of a DeltaNet layer as llama.cpp sizes its tensors: value heads x head size."""
        return self.ssm_dt_rank * self.ssm_d_state

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of a DeltaNet layer's short convolution: q, k and v side by side."""
        return 2 * self.ssm_key_dim + self.ssm_value_dim

    @property
    def q_gate_dim(self) -> int:
        """Outputs of a gated-attention q matrix (qwen35): each head's query, then its output gate."""
        return 2 * self.q_dim

    @property
    def n_ff_shared(self) -> int:
        """Hidden width of the shared expert: expert_shared_feed_forward_length, else n_ff (as llama.cpp)."""
        return self.n_ff_shexp or self.n_ff

    @property
    def gate_up_dim(self) -> int:
        """Outputs of a fused gate/up matrix (phi3's ffn_up: gate first, then up)."""
        return 2 * self.n_ff


_Default = Callable[[dict[str, Any]], Any] | None

#: HParams field -> (metadata key after "{arch}.", default computed from the fields before it; None: required).
HPARAM_KEYS: dict[str, tuple[str, _Default]] = {
    "n_layer": ("block_count", None),
    "n_ctx": ("context_length", None),
    "n_embd": ("embedding_length", None),
    "n_ff": ("feed_forward_length", None),
    "n_head": ("attention.head_count", None),
    "n_head_kv": ("attention.head_count_kv", lambda h: h["n_head"]),
    "head_dim": ("attention.key_length", lambda h: h["n_embd"] // h["n_head"]),
    "head_dim_v": ("attention.value_length", lambda h: h["head_dim"]),
    "n_rot": ("rope.dimension_count", lambda h: h["head_dim"]),
    "rope_base": ("rope.freq_base", lambda h: 10000.0),
    "eps": ("attention.layer_norm_rms_epsilon", None),
    "sliding_window": ("attention.sliding_window", lambda h: 0),
    "n_expert": ("expert_count", lambda h: 0),
    "n_expert_used": ("expert_used_count", lambda h: 0),
    "n_ff_exp": ("expert_feed_forward_length", lambda h: h["n_ff"] // h["n_expert_used"] if h["n_expert_used"] else 0),
    "rope_scale": ("rope.scaling.factor", lambda h: 0.0),
    "rope_attn_factor": ("rope.scaling.attn_factor", lambda h: 1.0),
    "n_ctx_orig": ("rope.scaling.original_context_length", lambda h: h["n_ctx"]),
    "yarn_log_mul": ("rope.scaling.yarn_log_multiplier", lambda h: 0.0),
    "n_expert_shared": ("expert_shared_count", lambda h: 0),
    "n_expert_groups": ("expert_group_count", lambda h: 0),
    "n_group_used": ("expert_group_used_count", lambda h: 0),
    "expert_gating": ("expert_gating_func", lambda h: 0),
    "expert_weights_scale": ("expert_weights_scale", lambda h: 0.0),
    "expert_weights_norm": ("expert_weights_norm", lambda h: False),
    "n_layer_dense_lead": ("leading_dense_block_count", lambda h: 0),
    "n_lora_q": ("attention.q_lora_rank", lambda h: 0),
    "n_lora_kv": ("attention.kv_lora_rank", lambda h: 0),
    "head_dim_mla": ("attention.key_length_mla", lambda h: 0),
    "head_dim_v_mla": ("attention.value_length_mla", lambda h: 0),
    "ssm_d_conv": ("ssm.conv_kernel", lambda h: 0),
    "ssm_d_inner": ("ssm.inner_size", lambda h: 0),
    "ssm_d_state": ("ssm.state_size", lambda h: 0),
    "ssm_dt_rank": ("ssm.time_step_rank", lambda h: 0),
    "ssm_n_group": ("ssm.group_count", lambda h: 0),
    "full_attention_interval": ("full_attention_interval", lambda h: 4),
    "n_ff_shexp": ("expert_shared_feed_forward_length", lambda h: 0),
}

#: rope.scaling.type values llama.cpp knows (it asserts on any other); minillama's architectures read "none",
#: "linear" and "yarn" (an architecture that implements no scaling refuses a factor through its refused_keys).
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")

#: LLAMA_MAX_LAYERS: llama.cpp's per-layer arrays hold this many blocks and it refuses a model with more.
MAX_LAYERS = 512
#: LLAMA_MAX_EXPERTS: llama.cpp refuses a model with more experts.
MAX_EXPERTS = 512
_U32 = (1 << 32) - 1  # llama.cpp reads these keys as uint32

#: Integer fields -> (least, most) value. A value must come from an integer GGUF type (ggml refuses 1.5 or NaN
#: in a key it reads as uint32) and lie within these bounds before anything is sized by it.
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "n_layer": (1, MAX_LAYERS), "n_ctx": (1, _U32), "n_embd": (1, _U32), "n_ff": (1, _U32), "n_head": (1, _U32),
    "n_head_kv": (1, _U32), "head_dim": (1, _U32), "head_dim_v": (1, _U32), "n_rot": (0, _U32),
    "sliding_window": (0, _U32), "n_expert": (0, MAX_EXPERTS), "n_expert_used": (0, MAX_EXPERTS),
    "n_ff_exp": (0, _U32), "n_ctx_orig": (1, _U32), "n_expert_shared": (0, MAX_EXPERTS),
    "n_expert_groups": (0, MAX_EXPERTS), "n_group_used": (0, MAX_EXPERTS), "expert_gating": (0, 4),
    "n_layer_dense_lead": (0, MAX_LAYERS), "n_lora_q": (0, _U32), "n_lora_kv": (0, _U32), "head_dim_mla": (0, _U32),
    "head_dim_v_mla": (0, _U32),
    "ssm_d_conv": (0, 64), "ssm_d_inner": (0, _U32), "ssm_d_state": (0, _U32),
    "ssm_dt_rank": (0, _U32), "ssm_n_group": (0, _U32), "full_attention_interval": (1, _U32), "n_ff_shexp": (0, _U32),
}
#: Boolean fields (a GGUF bool).
BOOL_FIELDS = frozenset({"expert_weights_norm"})

#: Float fields -> (least value, inclusive): finite, and the rope base and attention factor above 0.
FLOAT_LEAST: dict[str, tuple[float, bool]] = {"rope_base": (0.0, False), "eps": (0.0, True),
                                              "rope_scale": (0.0, True), "rope_attn_factor": (0.0, False),
                                              "expert_weights_scale": (0.0, True), "yarn_log_mul": (0.0, True)}

_INT_TYPES = frozenset({GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
                        GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64})
_FLOAT_TYPES = _INT_TYPES | {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}

_BLOCK = re.compile(r"blk\.(\d+)\.")

#: A tensor the forward pass needs: its GGUF name ("{i}": the layer) and its shape in ggml order, as HParams
#: field names (ne0 first: [n_in, n_out] for a matrix) or sizes.
TensorSpec = tuple[str, tuple[str | int, ...]]


def _element_type(v: Any) -> GGUFValueType:
    """The GGUF type a per-layer list's element stands for (the reader keeps the list's values, not its type)."""
    if isinstance(v, (bool, np.bool_)):
        return GGUFValueType.BOOL
    return GGUFValueType.INT64 if isinstance(v, (int, np.integer)) else GGUFValueType.FLOAT64


def check_complete(gf: GGUFFile, file_size: int) -> None:
    """FormatError when the file ends before its tensor data does, as a partly downloaded GGUF does: the message
    says the file is incomplete, its size and the size it should have (where the last tensor's data ends), where
    check_tensor_table would name only the first tensor past the end. A tensor of a type or shape it cannot size
    is left to check_tensor_table."""
    end, last = 0, ""
    for info in gf.tensors:
        try:
            _, rows, row_bytes = tensor_layout(info, gf.path)
        except MinillamaError:
            continue
        tensor_end = gf.data_offset + info.offset + rows * row_bytes
        if tensor_end > end:
            end, last = tensor_end, info.name
    if end > file_size:
        raise FormatError(f"the file is incomplete (a truncated download?): expected {end:,} bytes (the data of its "
                          f"last tensor, {last}, ends there), found {file_size:,}", path=gf.path)


def map_pages(mm: mmap.mmap) -> None:
    """Map every page of mm now, as llama.cpp's loader maps a model (MAP_POPULATE): the first pass over a prompt
    then reads the weights instead of taking a page fault every few pages on both threads (on Gemma 3 a quarter of
    that pass). One byte read per page."""
    np.frombuffer(mm, np.uint8)[::mmap.PAGESIZE].max()


class Weights:
    """A GGUF file with weights: metadata, tensor table, and the data memory-mapped until dequantized."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.gguf: GGUFFile = read_gguf(self.path)
        self.tensors: dict[str, TensorInfo] = {t.name: t for t in self.gguf.tensors}
        if not self.tensors:
            raise FormatError("expected a model with weights, found a GGUF with no tensors at all (a vocab-only "
                              "file: it can tokenize, and 'minillama chat' runs an n-gram placeholder on it)",
                              path=self.path)
        with open(self.path, "rb") as f:
            self._size = os.fstat(f.fileno()).st_size
            check_complete(self.gguf, self._size)  # a partial download: said so, with the size it should have
            check_tensor_table(self.gguf, self._size)  # every tensor aligned, inside the file, apart
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        #: The native core (MINILLAMA_BACKEND): matrices of a type it multiplies stay quantized in the map.
        self._core = native_core(backend_choice())
        #: The types whose matrices stay quantized and run in C (the C traits table's rows); none on the pure backend.
        self._native_types = native_types(self._core) if self._core is not None else frozenset()

    @property
    def arch(self) -> str:
        """general.architecture ("llama", "gemma3", ...)."""
        arch = self.gguf.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise FormatError(f"expected a string general.architecture, found {arch!r}", path=self.path,
                              key="general.architecture")
        return arch

    def hparams(self, arch: str, per_layer: frozenset[str] = frozenset()) -> HParams:
        """Read HPARAM_KEYS from "{arch}.*" metadata, each value checked for its type and bounds before the next
        default is computed from it; n_vocab from the token embedding's shape. Nothing is sized by a value that
        has not passed its check, and block_count must match the blk.* tensors the file holds.

        per_layer: fields whose key may hold one value per layer (llama.cpp's get_key_or_arr): each value is
        checked, the field gets the first and self.layer_values[field] the whole tuple (block_count of them)."""
        md, types, h = self.gguf.metadata, self.gguf.value_types, {}
        #: Fields given per layer in this file (per_layer): field -> one value per layer.
        self.layer_values: dict[str, tuple[int | float, ...]] = {}
        for name, (key, default) in HPARAM_KEYS.items():
            full = f"{arch}.{key}"
            value = md.get(full)
            given = value is not None
            if not given:
                if default is None:
                    raise FormatError(f"expected metadata key {full!r} (needed to run the model), not found",
                                      path=self.path, key=full)
                value = default(h)
            elif isinstance(value, (list, np.ndarray)) and name in per_layer and "n_layer" in h:
                if len(value) != h["n_layer"]:
                    raise FormatError(f"{full} holds {len(value)} values, expected one per layer ({h['n_layer']})",
                                      path=self.path, key=full)
                self.layer_values[name] = tuple(self._checked(name, full, v, _element_type(v)) for v in value)
                h[name] = self.layer_values[name][0]
                continue
            elif isinstance(value, (list, np.ndarray)):
                raise UnsupportedError(f"{self.path}: {full} is a per-layer list ({len(value)} values); "
                                       "minillama supports one value for all layers")
            h[name] = self._checked(name, full, value, types.get(full) if given else None)
        if h["n_expert_used"] > h["n_expert"] or (h["n_expert"] > 0) != (h["n_expert_used"] > 0):
            raise FormatError(f"{arch}.expert_used_count is {h['n_expert_used']} with {arch}.expert_count "
                              f"{h['n_expert']}, expected 1..{h['n_expert']} experts used per token"
                              if h["n_expert"] else f"{arch}.expert_used_count is {h['n_expert_used']} with no "
                              "experts (expert_count 0), expected 0", path=self.path, key=f"{arch}.expert_used_count")
        if h["n_head"] % h["n_head_kv"]:
            raise FormatError(f"{h['n_head']} query heads cannot share {h['n_head_kv']} key/value heads evenly",
                              path=self.path, key=f"{arch}.attention.head_count_kv")
        if h["n_rot"] > h["head_dim"] or h["n_rot"] % 2:
            raise FormatError(f"rope rotates {h['n_rot']} dims of heads of {h['head_dim']}, expected an even "
                              "number no larger than the head", path=self.path, key=f"{arch}.rope.dimension_count")
        self._check_blocks(arch, h["n_layer"])
        embd = self.info("token_embd.weight")
        if len(embd.shape) != 2 or embd.shape[0] != h["n_embd"] or embd.shape[1] == 0:
            raise FormatError(f"token_embd.weight has shape {list(embd.shape)}, expected [{h['n_embd']}, n_vocab] "
                              "with n_vocab of at least 1", path=self.path, key="token_embd.weight")
        tokens = md.get("tokenizer.ggml.tokens")
        if isinstance(tokens, list) and len(tokens) != embd.shape[1]:
            raise FormatError(f"the vocab has {len(tokens)} tokens but token_embd.weight has {embd.shape[1]} rows; "
                              "expected one row per token", path=self.path, key="token_embd.weight")
        return HParams(arch=arch, n_vocab=embd.shape[1], rope_scaling=self._rope_scaling(arch),
                       rope_sections=self._rope_sections(arch), **h)

    def _rope_sections(self, arch: str) -> tuple[int, ...]:
        """rope.dimension_sections (up to 4 integers, llama.cpp reads it as 4, missing ones 0), () without it."""
        full = f"{arch}.rope.dimension_sections"
        value = self.gguf.metadata.get(full)
        if value is None:
            return ()
        values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value]
        if len(values) > 4 or not all(isinstance(v, (int, np.integer)) and 0 <= v <= _U32 for v in values):
            raise FormatError(f"{full} is {values!r}, expected at most 4 integers >= 0", path=self.path, key=full)
        return tuple(int(v) for v in values) + (0,) * (4 - len(values))

    def _rope_scaling(self, arch: str) -> str:
        """rope.scaling.type ("linear" when absent, as llama.cpp); FormatError for a value llama.cpp refuses."""
        key = f"{arch}.rope.scaling.type"
        value = self.gguf.metadata.get(key, "linear")
        if value not in ROPE_SCALING_TYPES:
            raise FormatError(f"{key} is {value!r}, expected one of {', '.join(ROPE_SCALING_TYPES)}",
                              path=self.path, key=key)
        return str(value)

    def _checked(self, name: str, full: str, value: Any, vtype: GGUFValueType | None) -> int | float | bool:
        """One hyper-parameter after its type and bounds check (vtype None: a default, computed here)."""
        given = "" if vtype is not None else " (its default)"
        if name in BOOL_FIELDS:
            if vtype is not None and vtype != GGUFValueType.BOOL:
                raise FormatError(f"{full} is {value!r} of type {vtype.name}, expected a bool", path=self.path, key=full)
            return bool(value)
        if name in INT_BOUNDS:
            least, most = INT_BOUNDS[name]
            if vtype is not None and vtype not in _INT_TYPES:
                raise FormatError(f"{full} is {value!r} of type {vtype.name}, expected an integer type",
                                  path=self.path, key=full)
            if not least <= value <= most:
                raise FormatError(f"{full} is {value}{given}, expected {least}..{most}", path=self.path, key=full)
            return int(value)
        if vtype is not None and vtype not in _FLOAT_TYPES:
            raise FormatError(f"{full} is {value!r} of type {vtype.name}, expected a number", path=self.path, key=full)
        least, inclusive = FLOAT_LEAST[name]
        if not (math.isfinite(value) and (value >= least if inclusive else value > least)):
            raise FormatError(f"{full} is {value}{given}, expected a finite number {'>=' if inclusive else '>'} "
                              f"{least}", path=self.path, key=full)
        return float(value)

    def _check_blocks(self, arch: str, n_layer: int) -> None:
        """block_count must name exactly the blocks whose tensors the file holds (blk.0 .. blk.{n_layer-1})."""
        found = {int(m.group(1)) for name in self.tensors if (m := _BLOCK.match(name))}
        if found != set(range(n_layer)):
            extra = sorted(found - set(range(n_layer)))
            missing = sorted(set(range(n_layer)) - found)
            what = (f"tensors of block {extra[0]}" if extra else f"no tensors for block {missing[0]}")
            raise FormatError(f"{arch}.block_count is {n_layer}, but the file holds tensors for {len(found)} blocks "
                              f"({what}); expected blk.0..blk.{n_layer - 1}", path=self.path,
                              key=f"{arch}.block_count")

    def has(self, name: str) -> bool:
        """True when the file holds a tensor of that name."""
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        """The tensor table entry of name; FormatError naming it when the file lacks it."""
        info = self.tensors.get(name)
        if info is None:
            raise FormatError(f"expected a tensor {name!r}, not found among the file's {len(self.tensors)} tensors",
                              path=self.path, key=name)
        return info

    def _raw(self, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray, GGMLQuantizationType]:
        """The tensor's bytes as (rows, row_bytes) uint8 over the map, after checking shape, type and extent."""
        info = self.info(name)
        found = tuple(info.shape) + (1,) * (len(shape) - len(info.shape))
        if found[:len(shape)] != shape or any(d != 1 for d in found[len(shape):]):
            raise FormatError(f"tensor {name} has shape {list(info.shape)}, expected {list(shape)}",
                              path=self.path, key=name)
        return tensor_view(self.gguf, info, self._mmap, self._size)

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """FormatError/UnsupportedError unless tensor name exists with this ggml shape, a known type, in the file."""
        self._raw(name, shape)

    def matrix(self, name: str, shape: tuple[int, ...]) -> np.ndarray | Linear | Experts:
        """Tensor name, whose ggml shape must be `shape` (ne0 first): a (ne0,) float32 vector, or for 2-D a
        Linear: on the native backend a QuantLinear over the raw blocks in the map (nothing dequantized), on
        the pure one the (ne1, ne0) matrix dequantized to float32; for 3-D (one matrix per expert) Experts, left
        as raw blocks in the map on both backends."""
        raw, qtype = self._raw(name, shape)
        if len(shape) == 3:
            core = self._core if qtype in self._native_types and shape[0] > 0 else None
            return Experts(raw.reshape(shape[2], shape[1], raw.shape[1]), qtype, shape[0], core, self._mmap)
        if len(shape) == 2 and qtype in self._native_types and shape[0] > 0:
            return QuantLinear(raw, qtype, shape[0], self._core, self._mmap)
        out = dequantize(raw, qtype, shape[0])
        return out.reshape(shape[0]) if len(shape) == 1 else Linear(out)

    def embedding(self, name: str, shape: tuple[int, int]) -> Embedding:
        """A 2-D tensor left quantized in the map, its rows read on demand (Embedding.lookup)."""
        raw, qtype = self._raw(name, shape)
        return Embedding(shape[1], shape[0], qtype, table=raw, path=self.path)

    def spec(self, spec: TensorSpec, hp: HParams, layer: int | None = None) -> tuple[str, tuple[int, ...]]:
        """A table entry made concrete: the tensor's name for this layer and its expected ggml shape."""
        template, dims = spec
        name = template.format(i=layer) if layer is not None else template
        at = hp.at(layer) if layer is not None else hp
        return name, tuple(d if isinstance(d, int) else getattr(at, d) for d in dims)

    def load(self, spec: TensorSpec, hp: HParams, layer: int | None = None) -> np.ndarray | Linear:
        """Dequantize the tensor a table entry names, checking its shape."""
        return self.matrix(*self.spec(spec, hp, layer))

    def mapping(self) -> mmap.mmap | None:
        """The file's map where the weights stay in it (the native backend: map_pages it), else None."""
        return self._mmap if self._core is not None and self._size else None

    def close(self) -> None:
        """Unmap the file (arrays already dequantized stay valid)."""
        try:
            self._mmap.close()
        except BufferError:  # an Embedding still reads from it: the map closes when that goes
            pass
