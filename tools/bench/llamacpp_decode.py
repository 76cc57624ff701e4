"""llama.cpp's own forward pass, called directly (llama_decode), for measuring llama.cpp against itself.

The reference continuations (../shared/tools/llamacpp_generate.py) come from llama.cpp's server, which
feeds a prompt to the model in two pieces (all but the last 4 tokens, then those 4; this is how it keeps
checkpoints of a sliding-window cache) and then one token per step. Teacher-forcing minillama gives it
the prompt and the continuation in one pass. This module runs llama.cpp both ways on the same ids, so
the benchmark can show how far llama.cpp's log-probs move with nothing but the way the prompt is split
into batches: that is the noise floor of any comparison with the server's numbers.

It calls the llama.cpp library inside the xllamacpp wheel through cffi, reusing the declarations of
../shared/tools/llamacpp_oracle.py. llama_context_params is passed as opaque bytes: its layout changes
between llama.cpp versions, so the two fields set here are found in the library's own defaults
(n_threads at its documented place after the batch sizes, cb_eval as the two NULL pointers followed by
type_k = type_v = F16, swa_full among the booleans after the abort callback) and checked before use.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np

PARAMS_BYTES = 512  # at least sizeof(llama_context_params); the library reads only its own size
#: Where the cb_eval/type_k/type_v pattern is looked for: within the struct's real size. The bytes past it (up to
#: PARAMS_BYTES) are whatever the return buffer held and may repeat the pattern by chance.
SEARCH_BYTES = 128
N_THREADS_AT = 28  # n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq, n_threads
GGML_TYPE_F16 = 1
#: The booleans after cb_eval's pattern (its 16 bytes, type_k, type_v, moe_cache_size, abort_callback and its data):
#: embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified, as llama_context_default_params sets them.
BOOLS_AFTER = 48
DEFAULT_BOOLS = bytes([0, 1, 1, 1, 1, 0])
SWA_FULL = 4


def _lib(shared: Path):
    """The oracle's cffi handle with the context and decode functions declared too."""
    sys.path.insert(0, str(shared / "tools"))
    import llamacpp_oracle as oracle

    ffi = oracle._ffi
    if not hasattr(oracle, "_decode_declared"):
        ffi.cdef(f"""
        struct llama_context;
        typedef struct {{ char raw[{PARAMS_BYTES}]; }} ctx_params_bytes;
        typedef struct {{ char raw[256]; }} batch_bytes;
        ctx_params_bytes llama_context_default_params(void);
        struct llama_context * llama_init_from_model(struct llama_model * model, ctx_params_bytes params);
        void llama_free(struct llama_context * ctx);
        batch_bytes llama_batch_get_one(llama_token * tokens, int32_t n_tokens);
        int32_t llama_decode(struct llama_context * ctx, batch_bytes batch);
        float * llama_get_logits_ith(struct llama_context * ctx, int32_t i);
        typedef struct llama_memory_i * llama_memory_t;
        llama_memory_t llama_get_memory(const struct llama_context * ctx);
        bool llama_memory_seq_rm(llama_memory_t mem, int32_t seq_id, int32_t p0, int32_t p1);
        void llama_memory_seq_add(llama_memory_t mem, int32_t seq_id, int32_t p0, int32_t p1, int32_t delta);
        """)
        oracle._decode_declared = True
    lib = oracle._load()
    lib.llama_log_set(oracle._quiet, ffi.NULL)
    return ffi, lib


class LlamaCpp:
    """A model loaded once in llama.cpp; teacher_forced() runs it in a fresh context each time."""

    def __init__(self, path: str, shared: Path, n_ctx: int = 2048, threads: int = 2, swa_full: bool = True):
        """swa_full: llama_decode's default, a sliding-window layers' cache as large as the context; False:
        llama-server's default, window + one ubatch cells, reused once positions outgrow them (a ring)."""
        self.ffi, self.lib = ffi, lib = _lib(shared)
        self.path = path
        self.model = lib.llama_model_load_from_file(path.encode(), lib.llama_model_default_params())
        if self.model == ffi.NULL:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        defaults = lib.llama_context_default_params()
        raw = bytearray(ffi.buffer(ffi.addressof(defaults), PARAMS_BYTES))
        n_ctx0, _, _, n_seq_max = struct.unpack_from("<4I", raw, 0)
        threads0 = struct.unpack_from("<ii", raw, N_THREADS_AT)
        if n_seq_max != 1 or threads0[0] != threads0[1] or not 0 < threads0[0] <= 512 or n_ctx0 == 0:
            raise RuntimeError("llama_context_params does not have the expected layout in this llama.cpp")
        tail = bytes(16) + struct.pack("<ii", GGML_TYPE_F16, GGML_TYPE_F16)  # cb_eval, its user data, type_k, type_v
        at = raw.find(tail, 0, SEARCH_BYTES)
        if at < 0 or at % 8 or raw.find(tail, at + 1, SEARCH_BYTES) >= 0:
            raise RuntimeError("llama_context_params does not have the expected layout in this llama.cpp")
        if not swa_full:
            bools = at + BOOLS_AFTER
            if raw[bools:bools + len(DEFAULT_BOOLS)] != DEFAULT_BOOLS:
                raise RuntimeError("llama_context_params does not have the expected layout in this llama.cpp")
            raw[bools + SWA_FULL] = 0
        struct.pack_into("<I", raw, 0, n_ctx)
        struct.pack_into("<ii", raw, N_THREADS_AT, threads, threads)
        self.params = ffi.new("ctx_params_bytes *")
        ffi.memmove(self.params.raw, bytes(raw), PARAMS_BYTES)

    def _decode(self, ctx, ids: list[int]) -> np.ndarray:
        """Run ids (one batch) after what ctx has seen; the logits [n_vocab] of the last one."""
        arr = self.ffi.new(f"llama_token[{len(ids)}]", list(ids))
        if self.lib.llama_decode(ctx, self.lib.llama_batch_get_one(arr, len(ids))) != 0:
            raise RuntimeError("llama_decode failed")
        out = self.lib.llama_get_logits_ith(ctx, -1)
        return np.frombuffer(self.ffi.buffer(out, 4 * self.n_vocab), np.float32).copy()

    def teacher_forced(self, prompt_ids: list[int], gen: list[int], split: int | None,
                       shift: tuple[int, int, int] | None = None) -> np.ndarray:
        """llama.cpp's logits [len(gen), n_vocab] before each of gen: the prompt in one batch (split None) or
        in two (prompt_ids[:split], then the rest), then one token per step as in generation. shift: (step,
        n_keep, n_discard): before that step's token, llama-server's context shift (seq_rm of n_discard positions
        after n_keep, seq_add of the later ones by -n_discard)."""
        ctx = self.lib.llama_init_from_model(self.model, self.params[0])
        if ctx == self.ffi.NULL:
            raise RuntimeError(f"llama.cpp could not make a context for {self.path}")
        try:
            if split:
                self._decode(ctx, prompt_ids[:split])
            rows = [self._decode(ctx, prompt_ids[split or 0:])]
            n_past = len(prompt_ids)
            for i, g in enumerate(gen[:-1]):
                if shift is not None and i + 1 == shift[0]:
                    mem, keep, drop = self.lib.llama_get_memory(ctx), shift[1], shift[2]
                    self.lib.llama_memory_seq_rm(mem, 0, keep, keep + drop)
                    self.lib.llama_memory_seq_add(mem, 0, keep + drop, n_past, -drop)
                    n_past -= drop
                rows.append(self._decode(ctx, [g]))
                n_past += 1
            return np.stack(rows)
        finally:
            self.lib.llama_free(ctx)

    def greedy(self, prompt_ids: list[int], n: int, split: int | None = None) -> list[np.ndarray]:
        """llama.cpp's greedy continuation of prompt_ids (the prompt in one batch, or in two as teacher_forced
        splits it, then one token per step): the logits [n_vocab] before each of the n tokens, whose argmaxes are
        the tokens. Unlike the server it reports every step, also tokens that end inside a UTF-8 character."""
        ctx = self.lib.llama_init_from_model(self.model, self.params[0])
        if ctx == self.ffi.NULL:
            raise RuntimeError(f"llama.cpp could not make a context for {self.path}")
        try:
            if split:
                self._decode(ctx, list(prompt_ids[:split]))
            rows = [self._decode(ctx, list(prompt_ids[split or 0:]))]
            while len(rows) < n:
                rows.append(self._decode(ctx, [int(rows[-1].argmax())]))
            return rows
        finally:
            self.lib.llama_free(ctx)

    def close(self) -> None:
        self.lib.llama_model_free(self.model)
