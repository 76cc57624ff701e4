"""granite (IBM Granite 3.x dense): llama's blocks with four scales read from the file.

As llama.cpp's src/models/granite.cpp computes it: the embedding rows are multiplied by embedding_scale (when the
file has one); each attention output and each feed-forward output is multiplied by residual_scale (when set) before
it joins the stream; the scores are scaled by attention.scale (when set, else 1/sqrt(head_dim)); the logits are
multiplied by 1/logit_scale (a required key). Otherwise llama's block: rms norms, q/k/v with optional biases (or one
attn_qkv), "NORM" rope with the optional rope_freqs.weight, an optional attn_output bias, SwiGLU with optional
biases. Not implemented, and refused: the mixture-of-experts form (expert_count > 0: Granite MoE files carry the
granitemoe architecture), rope switched off (rope.scaling.finetuned false), Granite Vision's deepstack inputs and rope
scaling.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..errors import FormatError
from . import llama
from .batch import Batch
from .layers import rmsnorm, rope_angles, rope_norm
from .spec import ArchSpec, register
from .weights import HParams, Weights

F32 = np.float32


@dataclasses.dataclass(frozen=True)
class GraniteHParams(HParams):
    """HParams of a granite file with its scales (0: not set, as llama.cpp's defaults)."""

    logit_scale: float = 1.0
    residual_scale: float = 0.0
    embedding_scale: float = 0.0
    attention_scale: float = 0.0


#: GraniteHParams field -> (metadata key after "granite.", required).
SCALE_KEYS = {"logit_scale": ("logit_scale", True), "residual_scale": ("residual_scale", False),
              "embedding_scale": ("embedding_scale", False), "attention_scale": ("attention.scale", False)}


def read_hparams(w: Weights, name: str) -> GraniteHParams:
    """The generic hyper-parameters and the four scales, each a finite number (logit_scale above 0: the logits are
    divided by it)."""
    hp = w.hparams(name)
    scales: dict[str, float] = {}
    for field, (key, required) in SCALE_KEYS.items():
        full = f"{name}.{key}"
        value = w.gguf.metadata.get(full)
        if value is None:
            if required:
                raise FormatError(f"expected metadata key {full!r} (needed to run granite), not found", path=w.path,
                                  key=full)
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (field == "logit_scale" and value <= 0):
            raise FormatError(f"{full} is {value!r}, expected a finite number" + (" > 0" if field == "logit_scale"
                              else ""), path=w.path, key=full)
        scales[field] = float(F32(value))
    return GraniteHParams(**dataclasses.asdict(hp), **scales)


def embed_scale(hp: HParams) -> float | None:
    """embedding_scale, when the file sets one (ggml_scale of the embedding rows)."""
    return getattr(hp, "embedding_scale", 0.0) or None


def finish_logits(logits: np.ndarray, hp: HParams) -> np.ndarray:
    """The logits times 1/logit_scale, in float32 (ggml_scale(cur, 1.0f / f_logit_scale))."""
    return logits * (F32(1) / F32(getattr(hp, "logit_scale", 1.0)))


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    angles: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    attn = getattr(hp, "attention_scale", 0.0)
    scale = attn if attn else 1.0 / np.sqrt(hp.head_dim)
    residual = F32(getattr(hp, "residual_scale", 0.0))
    for il, w in enumerate(layers):
        factors = w.get("rope_freqs")
        if id(factors) not in angles:
            angles[id(factors)] = rope_angles(batch.positions, hp.n_rot, hp.rope_base, factors)
        cos, sin = angles[id(factors)]
        q, k, v = llama.project(w, rmsnorm(x, w["attn_norm"], hp.eps), hp)
        a = w["wo"](batch.attend(il, rope_norm(q, cos, sin), rope_norm(k, cos, sin), v, scale))
        if w.get("bo") is not None:
            a = a + w["bo"]
        x = (a * residual if residual else a) + x
        f = llama.dense_ffn(w, rmsnorm(x, w["ffn_norm"], hp.eps), hp)
        x = (f * residual if residual else f) + x
    return x


#: Metadata whose non-neutral values mean a feature not implemented here.
REFUSED_KEYS = {
    "expert_count": ((0,), "a mixture-of-experts feed-forward"),
    "rope.scaling.finetuned": ((True, 1), "rope switched off (rope.scaling.finetuned false)"),
    "rope.scaling.factor": ((0.0, 1.0), "rope scaling"),
    "deepstack_mapping": ((), "Granite Vision's deepstack inputs"),
}

SPEC = register(ArchSpec("granite", llama.LAYER_TENSORS, llama.prepare, blocks, llama.OPTIONAL_TENSORS,
                         refused_keys=REFUSED_KEYS, embed_scale=embed_scale, read_hparams=read_hparams,
                         finish_logits=finish_logits))
