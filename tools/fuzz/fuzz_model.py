"""Fuzz Model.from_file (and Embedding.from_file) with mutated model GGUFs; print a summary. A benchmark-style
script, not a test:

    ulimit -v 2097152; python tools/fuzz/fuzz_model.py [--runs 10000] [--seed 1] [--slow 2] [--mem-mb 2048]

The seeds are small models the script writes itself with gguf's GGUFWriter: a two-block llama (F32, F16 and
Q8_0 tensors, tied output), the same with an output matrix and rope keys, and a one-block gemma3 with a sliding
window. Each input is one seed with one to three mutations: most aim at the fields a hostile file would change
(a hyper-parameter's value or value type, a tensor's dims, type or data offset, an array or string length),
written with boundary values (0, 2^31, 2^63, NaN, inf, 1.5 ...); the rest are tools/fuzz/fuzz_readers.py's byte
mutations (bit flips, truncations, deletions, duplications). Every input is loaded, then scored (logits of three
ids, one greedy next_token) and its embedding looked up.

The only outcomes allowed are success and a MinillamaError. Anything else, or an input taking more than --slow
seconds, is a finding, printed and written to --crash-dir. --mem-mb sets the address-space limit in-process
(RLIMIT_AS, what `ulimit -v` sets): a memory bomb shows as a MemoryError finding instead of swapping.
"""

from __future__ import annotations

import argparse
import random
import resource
import struct
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
from fuzz_readers import Fuzzer, _where, mutate, report

#: A field of the seed file a mutation can aim at: (byte position, width in bytes, kind).
Field = tuple[int, int, str]

_U32_VALUES = (0, 1, 2, 3, 7, 8, 31, 32, 33, 511, 512, 513, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)
_U64_VALUES = (*_U32_VALUES, 1 << 32, 1 << 40, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)
_FLOATS = (0.0, -0.0, 1.5, -1.0, 1e-30, 1e30, float("nan"), float("inf"), float("-inf"), 2.0 ** 63)


# ---------------------------------------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------------------------------------

def _write_model(path: Path, arch: ModuleType, name: str, hp: dict[str, int], keys: dict[str, object],
                 types: dict[str, str], output: bool) -> bytes:
    """A model of architecture `arch` whose tensors follow its LAYER_TENSORS table; tensor types by field name."""
    import gguf

    from minillama.model import OUTPUT, OUTPUT_NORM, TOKEN_EMBD

    w = gguf.GGUFWriter(str(path), name)
    for key, value in keys.items():
        if isinstance(value, float):
            w.add_float32(f"{name}.{key}", value)
        else:
            w.add_uint32(f"{name}.{key}", value)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(hp["n_vocab"])])
    specs = [(t, None) for t in (TOKEN_EMBD, OUTPUT_NORM, *([OUTPUT] if output else []))]
    specs += [(t, il) for il in range(hp["n_layer"]) for t in arch.LAYER_TENSORS.values()]
    rng = np.random.default_rng(0)
    for (template, dims), il in specs:
        shape = tuple(hp[d] for d in reversed(dims))  # numpy order: ne0 last
        arr = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        kind = types.get(template.split(".")[-2], "F32")
        if kind == "Q8_0":
            qt = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(template.format(i=il), gguf.quants.quantize(arr, qt), raw_dtype=qt)
        else:
            w.add_tensor(template.format(i=il), arr.astype(np.float16) if kind == "F16" else arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def seed_models() -> dict[str, bytes]:
    """Small valid models (deterministic), a few KB to a few tens of KB each."""
    from minillama.model import gemma3, llama

    d, hd = 32, 8
    llama_hp = {"n_layer": 2, "n_embd": d, "n_ff": 64, "n_vocab": 24, "q_dim": 4 * hd, "k_dim": 2 * hd,
                "v_dim": 2 * hd, "o_dim": 4 * hd, "head_dim": hd}
    keys = {"block_count": 2, "context_length": 32, "embedding_length": d, "feed_forward_length": 64,
            "attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-5}
    types = {"attn_q": "F16", "ffn_up": "Q8_0", "ffn_gate": "Q8_0", "token_embd": "Q8_0"}
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        out["llama.gguf"] = _write_model(t / "a.gguf", llama, "llama", llama_hp, keys, types, output=False)
        out["llama-out.gguf"] = _write_model(
            t / "b.gguf", llama, "llama", llama_hp,
            {**keys, "rope.dimension_count": 8, "rope.freq_base": 10000.0, "attention.key_length": hd}, {},
            output=True)
        g_hp = {**llama_hp, "n_layer": 1}
        out["gemma3.gguf"] = _write_model(
            t / "c.gguf", gemma3, "gemma3", g_hp,
            {**keys, "block_count": 1, "attention.sliding_window": 4, "attention.key_length": hd,
             "attention.value_length": hd}, {"attn_k": "F16"}, output=False)
    return out


def fields(data: bytes) -> list[Field]:
    """The seed's header fields a hostile file would change: counts, every metadata value type and scalar value,
    array and string lengths, every tensor's dims count, dims, type and offset (a plain walk of a valid file)."""
    from minillama.gguffile.dtypes import FILE_DTYPES, V

    out: list[Field] = [(8, 8, "u64"), (16, 8, "u64")]
    pos = 24

    def skip_string() -> None:
        nonlocal pos
        out.append((pos, 8, "u64"))
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]

    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    for _ in range(n_kv):
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]  # the key
        out.append((pos, 4, "u32"))  # value type
        vtype = V(struct.unpack_from("<I", data, pos)[0])
        pos += 4
        if vtype == V.STRING:
            skip_string()
        elif vtype == V.ARRAY:
            itype = V(struct.unpack_from("<I", data, pos)[0])
            out += [(pos, 4, "u32"), (pos + 4, 8, "u64")]
            n = struct.unpack_from("<Q", data, pos + 4)[0]
            pos += 12
            for _ in range(n):
                if itype == V.STRING:
                    pos += 8 + struct.unpack_from("<Q", data, pos)[0]
                else:
                    pos += FILE_DTYPES[itype].itemsize
        else:
            size = FILE_DTYPES[vtype].itemsize
            out.append((pos, size, {4: "f32", 8: "f64"}[size] if vtype in (V.FLOAT32, V.FLOAT64) else f"u{8 * size}"))
            pos += size
    for _ in range(n_tensors):
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]  # the name
        n_dims = struct.unpack_from("<I", data, pos)[0]
        out.append((pos, 4, "u32"))
        out += [(pos + 4 + 8 * i, 8, "u64") for i in range(n_dims)]
        pos += 4 + 8 * n_dims
        out += [(pos, 4, "u32"), (pos + 4, 8, "offset")]
        pos += 12
    return out


def aim(data: bytes, field: Field, rnd: random.Random) -> bytes:
    """Overwrite one header field with a boundary value of its kind (or a small nudge of it)."""
    pos, width, kind = field
    if pos + width > len(data):  # an earlier mutation cut the file short
        return data
    b = bytearray(data)
    if kind in ("f32", "f64"):
        b[pos:pos + width] = struct.pack("<f" if width == 4 else "<d", rnd.choice(_FLOATS))
        return bytes(b)
    fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[width]
    old = struct.unpack_from(fmt, b, pos)[0]
    mask = (1 << (8 * width)) - 1
    choice = rnd.random()
    if kind == "offset" and choice < 0.6:  # point at another place in the data: overlaps, misalignment
        new = rnd.choice((0, 32, 64, 4, old + 1, old - 32, old + 32, old * 2))
    elif choice < 0.3:
        new = old + rnd.randint(-3, 3)
    else:
        new = rnd.choice(_U64_VALUES if width == 8 else _U32_VALUES)
    struct.pack_into(fmt, b, pos, new & mask)
    return bytes(b)


# ---------------------------------------------------------------------------------------------------------
# the target
# ---------------------------------------------------------------------------------------------------------

def exercise(path: str) -> str:
    """Load path as a model and use it; an outcome label, or the undocumented exception propagates."""
    from minillama.embedding import Embedding
    from minillama.errors import MinillamaError
    from minillama.generate import Sampler
    from minillama.model import Model

    try:
        with Embedding.from_file(path) as emb:
            emb.lookup([0, emb.n_vocab - 1])
    except MinillamaError as e:
        emb_outcome = f"embedding:{type(e).__name__}"
    else:
        emb_outcome = "embedding:ok"
    try:
        model = Model.from_file(path, threads=1)
    except MinillamaError as e:
        return f"load:{type(e).__name__}:{_where(e)}|{emb_outcome}"
    try:
        n = model.n_vocab
        model.logits([0, n - 1, n // 2][:model.n_ctx])
        model.next_token([1 % n], Sampler(temperature=0))
    except MinillamaError as e:
        return f"run:{type(e).__name__}:{_where(e)}|{emb_outcome}"
    return f"ok:{model.hparams.arch}|{emb_outcome}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10000, help="mutated inputs to try (default 10000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slow", type=float, default=2.0, help="seconds after which an input counts as a finding")
    ap.add_argument("--mem-mb", type=int, default=2048, help="address-space limit in MiB (0: none; default 2048)")
    ap.add_argument("--crash-dir", type=Path, default=Path(tempfile.gettempdir()) / "minillama-fuzz-model-crashes")
    ap.add_argument("--save-seeds", type=Path, help="write the interesting inputs there (regression inputs)")
    ap.add_argument("--max-seed-size", type=int, default=65536, help="largest input --save-seeds keeps")
    args = ap.parse_args(argv)

    warnings.simplefilter("ignore", RuntimeWarning)  # overflow in hostile weights: the data's result, as in ggml
    seeds = seed_models()
    targets = {name: fields(data) for name, data in seeds.items()}
    if args.mem_mb:
        limit = args.mem_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    fuzzer = Fuzzer(args.crash_dir, args.slow, target=exercise)
    rnd = random.Random(args.seed)
    names = sorted(seeds)
    t0 = time.perf_counter()
    for data in seeds.values():
        fuzzer.one(data)
    for _ in range(args.runs):
        name = rnd.choice(names)
        data = seeds[name]
        for _ in range(rnd.randint(1, 3)):
            if rnd.random() < 0.8:
                data = aim(data, rnd.choice(targets[name]), rnd)
            else:
                data = mutate(data, [(rnd.randint(0, 7), rnd.randint(0, 1 << 20), rnd.randint(0, 1 << 16))])
        fuzzer.one(data)
        if fuzzer.runs % 1000 == 0:
            print(f"... {fuzzer.runs} inputs, slowest {fuzzer.max_time:.2f} s, {len(fuzzer.findings)} findings",
                  file=sys.stderr, flush=True)
    fuzzer.close()
    return report(fuzzer, "random mutations", time.perf_counter() - t0, args)


if __name__ == "__main__":
    sys.exit(main())
