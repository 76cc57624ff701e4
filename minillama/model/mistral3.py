"""mistral3 (Ministral 3, Mistral Small 3.x text models): llama's blocks under another architecture name.

llama.cpp's src/models/mistral3.cpp is llama's graph (rms norms, q/k/v with optional biases, "NORM" rope with the
optional rope_freqs.weight, SwiGLU) and its loader takes llama's tensors. Two features of it are not implemented
here and refused with UnsupportedError: llama 4 attention temperature scaling (mistral3.attention.temperature_scale,
q scaled by a factor that grows with the position) and YaRN rope scaling (mistral3.rope.scaling.factor other than
1). A file without them, as llama.cpp runs it, is llama.
"""

from __future__ import annotations

from . import llama
from .spec import ArchSpec, Native, register

SPEC = register(ArchSpec(
    "mistral3", llama.LAYER_TENSORS, llama.prepare, llama.blocks, llama.OPTIONAL_TENSORS,
    refused_keys={"attention.temperature_scale": ((0.0,), "llama 4 attention temperature scaling"),
                  "rope.scaling.factor": ((0.0, 1.0), "YaRN rope scaling")},
    native=Native()))
