"""ArchSpec: what an architecture is, as one typed, frozen value that its module registers.

Each architecture is one module of this package (llama.py, qwen2.py, ...) that ends with
``SPEC = register(ArchSpec(...))``: the tensors of a block (required, optional, refused), the flags that differ
between architectures (with llama's defaults), the Python blocks (the reference, and the pure backend's forward
pass) and, when model.c runs it, the Native kind it maps to. Model.from_file, the C blocks (stack.py), the CLI's
help and the docs' test read architectures from here only: adding a dense architecture built from existing blocks
is one new module, found by supported() without being listed anywhere else.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from .batch import Batch
    from .cache import KVCache
    from .weights import HParams, TensorSpec, Weights

__all__ = ["ArchSpec", "Native", "register", "get", "supported", "ARCHS"]

Blocks = Callable[["np.ndarray", list[dict[str, Any]], "HParams", "Batch"], "np.ndarray"]
#: (hp, il) -> block il's (required, optional) tensors, for architectures whose blocks differ (deepseek2's leading
#: dense blocks, qwen35's DeltaNet or attention blocks).
BlockTensors = Callable[["HParams", int], tuple[Mapping[str, "TensorSpec"], Mapping[str, "TensorSpec"]]]
#: A sequence's cache for an architecture that keeps more than keys and values (recurrent state): (hp, dtype).
NewCache = Callable[["HParams", Any], "KVCache"]
Prepare = Callable[[dict[str, Any]], dict[str, Any]]


def whole_context(hp: HParams, il: int) -> tuple[float, int]:
    """Every layer rotates with the file's rope base and sees the whole context (no sliding window)."""
    return hp.rope_base, 0


def no_rope_scaling(hp: HParams) -> tuple[float, float, float]:
    """Rope at the trained speed: (freq_scale 1, ext_factor 0, attn_factor 1)."""
    return 1.0, 0.0, 1.0


def no_embed_scale(hp: HParams) -> float | None:
    """The embedding rows go in as they are."""
    return None


@dataclass(frozen=True)
class Native:
    """How model.c (the C blocks, stack.py) runs an architecture: what differs between them is data.

    rope_neox: rope pairs dims (i, i + n_rot/2) ("NEOX") rather than (2i, 2i+1); geglu: GeGLU (tanh GELU) rather
    than SwiGLU; scale_q: q is multiplied by 1/sqrt(head_dim) after rope and the scores are not scaled (gemma3's
    query_pre_attn_scalar) instead of scores scaled by 1/sqrt(head_dim); layer(hp, il): layer il's (rope base,
    sliding window, 0 for none); softmax_weight: the experts' weights are the softmax of the chosen router logits
    (llama.cpp's SOFTMAX_WEIGHT gating); swiglu_oai: the experts' activation is gpt-oss's clamped SwiGLU; rope(hp):
    ggml_rope_ext's (freq_scale, ext_factor, attn_factor) for the file's rope scaling (YaRN when ext_factor != 0;
    its betas are llama.cpp's defaults, 32 and 1)."""

    rope_neox: bool = False
    geglu: bool = False
    scale_q: bool = False
    layer: Callable[[HParams, int], tuple[float, int]] = whole_context
    softmax_weight: bool = False
    swiglu_oai: bool = False
    rope: Callable[[HParams], tuple[float, float, float]] = no_rope_scaling


@dataclass(frozen=True)
class ArchSpec:
    """One architecture (general.architecture = name).

    layer_tensors / optional_tensors: block {i}'s tensors, field -> (GGUF name, ggml shape as HParams fields);
    the optional ones are loaded when the file has them (llama.cpp's TENSOR_NOT_REQUIRED). refused_tensors: a
    tensor whose presence means a feature not implemented -> what it is (UnsupportedError). refused_keys: a
    metadata key (after "{name}.") whose value, when the file has one other than the neutral ones, means a
    feature not implemented -> (neutral values, what it is). rope_whole_head: rope.dimension_count must equal the
    head size, as llama.cpp asserts for the architecture. output_bias: output.bias, when the file has it, is
    added to the logits. prepare(block): the loaded block as the blocks take it (matrices fused); blocks(x,
    layers, hp, batch): every block over x (the Python reference); embed_scale(hp): factor of the embedding rows,
    or None. native: model.c's kind, None when only the Python blocks run it. experts: a mixture-of-experts
    architecture, whose files must have expert_count >= 1 (llama.cpp asserts it). block_tensors(hp, il): block
    il's (required, optional) tensors when they differ between blocks (deepseek2's leading dense blocks), else
    None: layer_tensors and optional_tensors for every block.

    For an architecture whose layers differ in shape or that has tensors outside its blocks (gemma4), all None
    by default: read_hparams(weights, name): its HParams (a subclass whose at(il) gives layer il's); extras(weights,
    hp): its tensors outside the blocks as (fields put into every prepared block, their tensor names);
    cache_shapes(hp): each layer's KV cache (heads, key size, value size); finish_logits(logits, hp): what the
    logits go through after the output matrix (a final softcap); new_cache(hp, dtype): a sequence's cache when the
    architecture keeps recurrent state beside keys and values (qwen35; None: a KVCache)."""

    name: str
    layer_tensors: Mapping[str, TensorSpec]
    prepare: Prepare
    blocks: Blocks
    optional_tensors: Mapping[str, TensorSpec] = field(default_factory=dict)
    refused_tensors: Mapping[str, str] = field(default_factory=dict)
    refused_keys: Mapping[str, tuple[tuple[object, ...], str]] = field(default_factory=dict)
    rope_whole_head: bool = True
    output_bias: bool = False
    embed_scale: Callable[[HParams], float | None] = no_embed_scale
    native: Native | None = None
    experts: bool = False
    read_hparams: Callable[[Weights, str], HParams] | None = None
    extras: Callable[[Weights, HParams], tuple[dict[str, Any], set[str]]] | None = None
    cache_shapes: Callable[[HParams], list[tuple[int, int, int]]] | None = None
    finish_logits: Callable[[np.ndarray, HParams], np.ndarray] | None = None
    block_tensors: BlockTensors | None = None
    new_cache: NewCache | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise TypeError(f"ArchSpec: expected a general.architecture name, found {self.name!r}")
        for what in ("layer_tensors", "optional_tensors", "refused_tensors", "refused_keys"):  # frozen all through
            object.__setattr__(self, what, MappingProxyType(dict(getattr(self, what))))
        both = self.layer_tensors.keys() & self.optional_tensors.keys()
        if both:
            raise TypeError(f"ArchSpec {self.name}: fields {sorted(both)} are both required and optional")
        for what in ("prepare", "blocks", "embed_scale"):
            if not callable(getattr(self, what)):
                raise TypeError(f"ArchSpec {self.name}: expected a callable {what}, found {getattr(self, what)!r}")


_ARCHS: dict[str, ArchSpec] = {}
#: general.architecture -> its spec, every module registered so far (supported() finds them all first).
ARCHS: Mapping[str, ArchSpec] = MappingProxyType(_ARCHS)
_found = False


def register(spec: ArchSpec) -> ArchSpec:
    """Add spec to the registry (an architecture module's last line: SPEC = register(ArchSpec(...))); a second
    spec of the same name is a TypeError (two modules claiming one architecture)."""
    old = _ARCHS.get(spec.name)
    if old is not None and old is not spec:
        raise TypeError(f"architecture {spec.name!r} is registered twice")
    _ARCHS[spec.name] = spec
    return spec


def _discover() -> None:
    """Import every module of this package once, so each architecture module registers its spec."""
    global _found
    if _found:
        return
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if not info.name.startswith("_") and not info.ispkg:
            importlib.import_module(f"{package}.{info.name}")
    _found = True


def supported() -> list[str]:
    """The architectures minillama runs, sorted (the CLI's help, the error messages and the docs say these)."""
    _discover()
    return sorted(_ARCHS)


def get(name: str) -> ArchSpec | None:
    """The spec of architecture name, or None when minillama does not run it."""
    _discover()
    return _ARCHS.get(name)
