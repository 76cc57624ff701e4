"""`minillama inspect`: what a GGUF or tokenizer file holds, from its metadata alone (tensor data is never read).

inspect_file() builds a plain report (dicts, lists, str, int, float, bool, None: ready for json.dumps);
render_text() turns it into the human-readable listing and render_json() into the machine-readable one.
Long values are summarised in both: arrays keep their length and first items, strings their length and start.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys, LlamaFileType, TokenType

from .errors import MinillamaError
from .gguffile.dtypes import ARRAY_TYPES, SHORT_NAMES
from .tokenizer import (
    Vocab,
    format_display,
    padding_added,
    read_metadata,
    sniff_format,
    special_id_keys,
    vocab_piece,
)

K = Keys.Tokenizer
G = Keys.General

ARRAY_HEAD = 8  # array items kept in the report
STRING_HEAD = 256  # characters kept of a long string value
ITEM_HEAD = 64  # characters kept of each string inside an array
TEXT_STRING = 64  # characters of a string shown by render_text
TEXT_ARRAY_WIDTH = 72  # characters of array items shown by render_text

# Special ids in the order llama.cpp lists them.


# ---------------------------------------------------------------------------------------------
# Building the report


def key_value(path: str | os.PathLike[str], key: str) -> Any:
    """The whole value of one metadata key (arrays as lists), for `inspect --key`; MinillamaError naming
    the keys that are there when it is not."""
    import difflib

    md = read_metadata(path)  # a GGUF's own metadata; for other files the GGUF keys they convert to
    if key not in md:
        near = difflib.get_close_matches(key, list(md), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(near)}?" if near else f" ({len(md)} keys: see 'minillama inspect')"
        raise MinillamaError(f"expected a metadata key {key!r} in {path}, found none{hint}")
    value = md[key]
    if isinstance(value, np.ndarray):
        return [_number(x) for x in value.tolist()]
    return _number(value) if not isinstance(value, (str, list)) else value


def inspect_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The report for a GGUF or tokenizer file: header, metadata, tokenizer summary and tensor table."""
    path, fmt, size = sniff_format(path)  # FormatError for unrecognised files
    if fmt == "gguf":
        return _inspect_gguf(path, size)
    md = read_metadata(path)
    warnings = []
    if padding_added(md):
        warnings.append(f"{padding_added(md):,} [PAD] tokens added to reach vocab_size of the config.json beside it, "
                        "as llama.cpp's converter does (the embedding has that many rows)")
    return {
        "path": path, "format": fmt, "version": None, "file_size": size,
        "architecture": _str_or_none(md.get(G.ARCHITECTURE)) if fmt != "llama2.c" else None,
        "name": _str_or_none(md.get(G.NAME)), "file_type": None,
        "alignment": None, "data_offset": None,
        "metadata": None, "tokenizer": tokenizer_summary(md, path), "tensors": None, "totals": None,
        "hparams": None, "warnings": warnings,
    }


def _inspect_gguf(path: str, size: int) -> dict[str, Any]:
    """The report of a GGUF file: everything comes from the header, key/value section and tensor table."""
    from .gguffile import read_gguf

    gf = read_gguf(path, tensors=True)
    md = gf.metadata
    file_type = md.get(G.FILE_TYPE)
    try:
        file_type_name = LlamaFileType(file_type).name if isinstance(file_type, int) else None
    except ValueError:
        file_type_name = None
    tensors = [_tensor_entry(t.name, t.shape, t.ggml_type, gf.data_offset + t.offset) for t in gf.tensors]
    warnings = []
    known = [t for t in tensors if t["n_bytes"] is not None]
    if known:
        end = max(t["offset"] + t["n_bytes"] for t in known)
        if end > size:
            warnings.append(f"tensor data needs {end} bytes but the file has {size} (truncated file?)")
    unknown = [t["name"] for t in tensors if t["n_bytes"] is None]
    if unknown:
        warnings.append(f"{len(unknown)} tensor(s) of unknown type, not counted in total bytes: "
                        + ", ".join(unknown[:5]) + (", ..." if len(unknown) > 5 else ""))
    tokenizer = tokenizer_summary(md, path) if (K.MODEL in md or K.LIST in md) else None
    return {
        "path": path, "format": "gguf", "version": gf.version, "file_size": size,
        "architecture": _str_or_none(md.get(G.ARCHITECTURE)), "name": _str_or_none(md.get(G.NAME)),
        "file_type": file_type_name, "alignment": gf.alignment, "data_offset": gf.data_offset,
        "metadata": [metadata_entry(k, v, gf.value_types.get(k)) for k, v in md.items()],
        "tokenizer": tokenizer, "tensors": tensors, "totals": _totals(tensors),
        "hparams": hparams_summary(md, tensors), "warnings": warnings,
    }


# The architecture's hyper-parameters inspect shows, by the name after "{arch}." in the GGUF key (gguf-py's
# Keys.LLM / Attention / Rope / SSM names), in groups; a group is left out when the file has none of its keys.
_HPARAM_GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "model": (("context_length", "context_length"), ("embedding_length", "embedding_length"),
              ("block_count", "block_count"), ("feed_forward_length", "feed_forward_length"),
              ("head_count", "attention.head_count"), ("head_count_kv", "attention.head_count_kv"),
              ("key_length", "attention.key_length"), ("value_length", "attention.value_length"),
              ("q_lora_rank", "attention.q_lora_rank"), ("kv_lora_rank", "attention.kv_lora_rank"),
              ("final_logit_softcapping", "final_logit_softcapping")),
    "experts": (("count", "expert_count"), ("used", "expert_used_count"), ("shared", "expert_shared_count"),
                ("groups", "expert_group_count"), ("groups_used", "expert_group_used_count"),
                ("feed_forward_length", "expert_feed_forward_length"),
                ("shared_feed_forward_length", "expert_shared_feed_forward_length"),
                ("gating_func", "expert_gating_func"), ("weights_norm", "expert_weights_norm"),
                ("weights_scale", "expert_weights_scale"), ("leading_dense_blocks", "leading_dense_block_count")),
    "sliding_window": (("size", "attention.sliding_window"), ("pattern", "attention.sliding_window_pattern")),
    "rope": (("freq_base", "rope.freq_base"), ("dimension_count", "rope.dimension_count"),
             ("freq_base_swa", "rope.freq_base_swa"), ("scaling_type", "rope.scaling.type"),
             ("scaling_factor", "rope.scaling.factor"),
             ("original_context_length", "rope.scaling.original_context_length"),
             ("yarn_ext_factor", "rope.scaling.yarn_ext_factor"),
             ("yarn_attn_factor", "rope.scaling.yarn_attn_factor"),
             ("yarn_beta_fast", "rope.scaling.yarn_beta_fast"), ("yarn_beta_slow", "rope.scaling.yarn_beta_slow"),
             ("yarn_log_multiplier", "rope.scaling.yarn_log_multiplier")),
    "deltanet": (("conv_kernel", "ssm.conv_kernel"), ("state_size", "ssm.state_size"),
                 ("inner_size", "ssm.inner_size"), ("group_count", "ssm.group_count"),
                 ("time_step_rank", "ssm.time_step_rank"), ("full_attention_interval", "full_attention_interval")),
}
# llama.cpp's gating functions (LLAMA_EXPERT_GATING_FUNC_TYPE) by the number a file stores.
_GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}
# Sliding-window patterns llama.cpp fixes for an architecture whose files carry none (set_swa_pattern(n): layer il
# is a sliding-window layer when il % n < n - 1).
_ARCH_SWA_PATTERN = {"gpt-oss": 2, "gemma2": 2, "gemma3": 6, "cohere2": 4}
# The tensors of a layer's experts (merged 3-D tensors, one matrix per expert), shared experts and router.
_EXPERT_TENSOR = re.compile(r"blk\.\d+\.(ffn_\w*?(?:exps|shexp|chexps|gate_inp)\w*|exp_probs_b)\.(weight|bias|scale)")
# llama.cpp's default interval of full-attention layers of the gated-DeltaNet hybrids (the file may say another).
_ARCH_FULL_ATTENTION_INTERVAL = {"qwen35": 4, "qwen35moe": 4}


def hparams_summary(md: dict[str, Any], tensors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The architecture's notable hyper-parameters, read from the file's `{arch}.*` keys: sizes, experts (with
    their tensors and types), sliding window (with the layers it applies to), rope and its scaling (YaRN), the
    gated DeltaNet sizes of hybrids. None when the file names no architecture."""
    arch = md.get(G.ARCHITECTURE)
    if not isinstance(arch, str):
        return None
    out: dict[str, Any] = {}
    for group, keys in _HPARAM_GROUPS.items():
        got = {name: _hparam_value(md[f"{arch}.{key}"]) for name, key in keys if f"{arch}.{key}" in md}
        out[group] = got or None
    experts = out["experts"]
    if experts is not None and isinstance(experts.get("gating_func"), int):
        experts["gating_func"] = _GATING.get(experts["gating_func"], experts["gating_func"])
    by_name: dict[str, dict[str, Any]] = {}
    for t in tensors:
        m = _EXPERT_TENSOR.fullmatch(t["name"])
        if m:
            e = by_name.setdefault(f"{m.group(1)}.{m.group(2)}", {"name": f"{m.group(1)}.{m.group(2)}", "types": [],
                                                                  "layers": 0, "shape": t["shape"]})
            e["layers"] += 1
            if t["type"] not in e["types"]:
                e["types"].append(t["type"])
    if by_name:
        out["experts"] = {**(experts or {}), "tensors": list(by_name.values())}
    n_layer = md.get(f"{arch}.block_count")
    window = out["sliding_window"]
    if window is not None and window.get("size") and isinstance(n_layer, int):
        window["layers"] = _swa_layers(window.get("pattern"), n_layer, arch)
    deltanet = out["deltanet"]
    interval = (deltanet or {}).get("full_attention_interval", _ARCH_FULL_ATTENTION_INTERVAL.get(arch))
    if deltanet is not None and isinstance(interval, int) and interval > 0 and isinstance(n_layer, int):
        deltanet["layers"] = [il for il in range(n_layer) if (il + 1) % interval]  # the others: full attention
    return out


def _hparam_value(v: Any) -> Any:
    """A hyper-parameter as JSON: numbers as _number gives them, arrays as lists."""
    if isinstance(v, np.ndarray):
        return [_number(x, ARRAY_TYPES.get(v.dtype)) for x in v.tolist()]
    return _number(v) if not isinstance(v, (str, list)) else v


def _swa_layers(pattern: Any, n_layer: int, arch: str) -> list[int] | None:
    """The layers that attend within the sliding window, as llama.cpp's load_swa_pattern reads them: a per-layer
    bool array, or a period n (the file's, else llama.cpp's for the architecture; 0: every layer) whose last layer
    of each n sees the whole context; None when neither says."""
    if isinstance(pattern, list):
        return [il for il, swa in enumerate(pattern[:n_layer]) if swa]
    n = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) else _ARCH_SWA_PATTERN.get(arch)
    if n is None:
        return None
    return [il for il in range(n_layer) if n == 0 or il % n < n - 1]


def _str_or_none(v: Any) -> str | None:
    """v when it is a string, else None."""
    return v if isinstance(v, str) else None


def _safe_str(s: str) -> str:
    """A string that encodes as UTF-8: bytes that were not valid UTF-8 (surrogate escapes) become '\\xNN'."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _number(v: Any, vtype: GGUFValueType | None = None) -> Any:
    """A JSON-safe Python number: float32 values by their shortest repr, non-finite floats as strings."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            return str(float(v))  # 'nan', 'inf', '-inf'
        if vtype == GGUFValueType.FLOAT32 or isinstance(v, np.float32):
            return float(str(np.float32(v)))
        return float(v)
    return v


def _item_type(v: Any) -> GGUFValueType | None:
    """The item type of an array value as read_gguf returns it (None for an empty list)."""
    if isinstance(v, np.ndarray):
        return ARRAY_TYPES.get(v.dtype)
    if v and isinstance(v[0], str):
        return GGUFValueType.STRING
    if v:
        return GGUFValueType.ARRAY
    return None


def _summarise(v: Any, vtype: GGUFValueType | None, string_head: int) -> tuple[Any, int | None, bool]:
    """(value kept, length or None, truncated?) for one metadata value."""
    if isinstance(v, str):
        return v[:string_head], len(v), len(v) > string_head
    if isinstance(v, (np.ndarray, list)):
        itype = _item_type(v)
        head = v[:ARRAY_HEAD]
        if isinstance(head, np.ndarray):
            items = [_number(x, itype) for x in head.tolist()]
        else:
            items = [_summarise(x, None, ITEM_HEAD)[0] for x in head]
        return items, len(v), len(v) > ARRAY_HEAD
    return _number(v, vtype), None, False


def metadata_entry(key: str, value: Any, vtype: GGUFValueType | None) -> dict[str, Any]:
    """One metadata key as a report entry: type names, the (possibly shortened) value and its length."""
    if vtype is None:
        vtype = (GGUFValueType.STRING if isinstance(value, str) else
                 GGUFValueType.ARRAY if isinstance(value, (list, np.ndarray)) else
                 GGUFValueType.BOOL if isinstance(value, bool) else
                 GGUFValueType.INT64 if isinstance(value, int) else GGUFValueType.FLOAT64)
    entry: dict[str, Any] = {"key": key, "type": vtype.name.lower()}
    if vtype == GGUFValueType.ARRAY:
        itype = _item_type(value)
        entry["item_type"] = itype.name.lower() if itype is not None else None
    kept, length, truncated = _summarise(value, vtype, STRING_HEAD)
    if length is not None:
        entry["length"] = length
    entry["value"] = kept
    entry["truncated"] = truncated
    return entry


def tensor_size(shape: tuple[int, ...] | list[int], ggml_type: int) -> int | None:
    """Bytes of a tensor's data: n_elements / block_size * type_size (None for an unknown type)."""
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return None
    return math.prod(shape) // block * type_size


def _tensor_entry(name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> dict[str, Any]:
    """One row of the tensor table: type name, shape (GGUF ne order), element and byte counts, file offset."""
    try:
        type_name = GGMLQuantizationType(ggml_type).name
    except ValueError:
        type_name = f"type{ggml_type}"
    n_elements = math.prod(shape)
    return {"name": name, "type": type_name, "type_id": ggml_type, "shape": list(shape),
            "n_elements": n_elements, "n_bytes": tensor_size(shape, ggml_type), "offset": offset}


def _totals(tensors: list[dict[str, Any]]) -> dict[str, Any]:
    """Tensor count, parameters, bytes and tensors per type."""
    by_type: dict[str, int] = {}
    for t in tensors:
        by_type[t["type"]] = by_type.get(t["type"], 0) + 1
    return {"tensors": len(tensors), "parameters": sum(t["n_elements"] for t in tensors),
            "bytes": sum(t["n_bytes"] or 0 for t in tensors), "types": by_type}


def _piece(vocab: Any, i: int) -> str:
    """The text of llama_token_to_piece(i, special=True) (bytes that are not UTF-8 as surrogate escapes)."""
    return vocab_piece(vocab, i).decode("utf-8", "surrogateescape")


def _token_type_counts(md: dict[str, Any]) -> dict[str, int] | None:
    """How many tokens of each gguf.TokenType the file declares (None when it has no token types)."""
    types = md.get(K.TOKEN_TYPE)
    if not isinstance(types, np.ndarray) or types.dtype.kind not in "iu":
        return None
    values, counts = np.unique(types, return_counts=True)
    out: dict[str, int] = {}
    for v, c in zip(values.tolist(), counts.tolist()):
        try:
            name = TokenType(v).name
        except ValueError:
            name = f"TYPE_{v}"
        out[name] = c
    return out


def tokenizer_summary(md: dict[str, Any], source: str) -> dict[str, Any]:
    """Model, pre-tokenizer, sizes, special ids with their pieces, flags and token type counts."""
    tokens = md.get(K.LIST)
    merges = md.get(K.MERGES)
    raw_model = md.get(K.MODEL)
    summary: dict[str, Any] = {
        "model": _str_or_none(raw_model), "type": None, "pre": _str_or_none(md.get(K.PRE)),
        "vocab_size": len(tokens) if isinstance(tokens, list) else None,
        "merges": len(merges) if isinstance(merges, list) else 0,
        "special": {}, "eog": [], "flags": {}, "token_types": _token_type_counts(md), "error": None,
    }
    try:
        vocab = Vocab.from_metadata(md, source)
    except MinillamaError as exc:  # still show what the file says, as it says it
        summary["error"] = str(exc)
        n = summary["vocab_size"] or 0
        for name, key in special_id_keys().items():
            v = md.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                summary["special"][name] = {"id": v, "piece": tokens[v] if 0 <= v < n else None}
        for flag, key in (("add_bos", K.ADD_BOS), ("add_eos", K.ADD_EOS), ("add_space_prefix", K.ADD_PREFIX)):
            if isinstance(md.get(key), (bool, np.bool_)):
                summary["flags"][flag] = bool(md[key])
        return summary
    summary["type"] = vocab.kind
    if summary["pre"] is None:
        summary["pre"] = vocab.pre  # 'default' when the file names none
    for name in special_id_keys():
        i = vocab.special.get(name)
        if i is not None:
            summary["special"][name] = {"id": i, "piece": _piece(vocab, i)}
    summary["eog"] = sorted(vocab.eog_ids)
    summary["flags"] = {"add_bos": vocab.add_bos, "add_eos": vocab.add_eos, "add_sep": vocab.add_sep,
                        "add_space_prefix": vocab.add_space_prefix,
                        "remove_extra_whitespaces": vocab.remove_extra_whitespaces}
    return summary


# ---------------------------------------------------------------------------------------------
# Rendering


def _json_safe(x: Any) -> Any:
    """A copy of x whose strings all encode as UTF-8 (see _safe_str)."""
    if isinstance(x, str):
        return _safe_str(x)
    if isinstance(x, dict):
        return {_safe_str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


# Characters json.dumps(ensure_ascii=False) leaves raw that a terminal acts on: DEL and C1 controls (CSI),
# bidi marks and overrides, line/paragraph separators, invisible format characters.
_TERMINAL_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]")


def render_json(report: dict[str, Any]) -> str:
    """The report as indented JSON (all numbers in full, no colour), ending with a newline; characters a
    terminal would act on are written as \\u escapes (they only occur inside strings)."""
    text = json.dumps(_json_safe(report), indent=2, ensure_ascii=False)
    return _TERMINAL_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"


def quote_text(s: str, limit: int | None = None) -> str:
    """s in double quotes with backslash escapes for quotes, invalid bytes and every character that is not
    printable (terminal controls such as ESC, BEL, OSC and bidi overrides never reach the terminal)."""
    cut = limit is not None and len(s) > limit
    body = s[:limit] if cut else s
    out = []
    for ch in body:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif 0xD800 <= o <= 0xDFFF:
            out.append(f"\\x{o - 0xDC00:02x}" if 0xDC80 <= o <= 0xDCFF else f"\\u{o:04x}")
        elif not ch.isprintable() and ch != " ":  # C0/C1 controls, bidi overrides (U+202E), other format chars
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + ('"...' if cut else '"')


def _show(s: str) -> str:
    """A key or name as is when printable, else quoted with escapes."""
    return s if s.isprintable() and s else quote_text(s)


def _is_plain(s: str) -> bool:
    """True when a string reads unambiguously without quotes."""
    return bool(s) and s == s.strip() and s.isprintable() and len(s) <= TEXT_STRING


def _fmt_scalar(v: Any) -> str:
    """A report value on one line of text."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return v if _is_plain(v) else quote_text(v, TEXT_STRING)
    if isinstance(v, list):
        return "[" + ", ".join(_fmt_item(x) for x in v) + "]"
    return str(v)


def _fmt_item(v: Any) -> str:
    """An array item on one line of text (strings always quoted)."""
    return quote_text(v, 32) if isinstance(v, str) else _fmt_scalar(v)


def _type_label(entry: dict[str, Any]) -> str:
    """The short type of a metadata entry: u32, str, [str], [i32] ..."""
    t = GGUFValueType[entry["type"].upper()]
    if t != GGUFValueType.ARRAY:
        return SHORT_NAMES[t]
    it = entry.get("item_type")
    return "[" + (SHORT_NAMES[GGUFValueType[it.upper()]] if it else "?") + "]"


def _fmt_value(entry: dict[str, Any]) -> str:
    """A metadata value on one line: long strings shortened with their length, arrays with length and first items."""
    v, length = entry["value"], entry.get("length")
    if entry["type"] == "array":
        shown, width = [], 0
        for x in v:
            s = _fmt_item(x)
            if shown and width + len(s) + 2 > TEXT_ARRAY_WIDTH:
                break
            shown.append(s)
            width += len(s) + 2
        more = ", ..." if length > len(shown) else ""
        items = "item" if length == 1 else "items"
        return f"{length:,} {items}: [" + ", ".join(shown) + more + "]" if length else "0 items: []"
    if entry["type"] == "string":
        if _is_plain(v) and not entry["truncated"]:
            return v
        if length > TEXT_STRING:
            return quote_text(v, TEXT_STRING) + f" ({length:,} chars)"
        return quote_text(v)
    if entry["key"] == G.FILE_TYPE and isinstance(v, int):
        try:
            return f"{v} ({LlamaFileType(v).name})"
        except ValueError:
            return str(v)
    return _fmt_scalar(v)


def _human_bytes(n: int) -> str:
    """A byte count in binary units: 92.1 MiB."""
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"  # pragma: no cover


def _human_count(n: int) -> str:
    """A count in decimal units: 134.5M."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


class _Listing:
    """The lines of render_text being built, with its styles (ANSI bold/dim when color is True)."""

    def __init__(self, color: bool) -> None:
        self.color = color
        self.lines: list[str] = []

    def bold(self, s: str) -> str:
        return f"\x1b[1m{s}\x1b[0m" if self.color else s

    def dim(self, s: str) -> str:
        return f"\x1b[2m{s}\x1b[0m" if self.color else s

    def field(self, label: str, text: str) -> None:
        self.lines.append(f"  {label:<14}{' ' if len(label) >= 14 else ''}{text}")

    def section(self, title: str) -> None:
        self.lines += ["", self.bold(title)]


def _header_lines(out: _Listing, report: dict[str, Any]) -> None:
    """Path, format, architecture, name, file type, tensor totals and warnings."""
    out.lines.append(out.bold(_show(report["path"])))
    fmt = format_display(report["format"])
    if report["version"] is not None:
        fmt += f" v{report['version']}"
    out.field("format", f"{fmt}, {report['file_size']:,} bytes ({_human_bytes(report['file_size'])})")
    for label, key in (("architecture", "architecture"), ("name", "name"), ("file type", "file_type")):
        if report[key] is not None:
            out.field(label, _show(str(report[key])))
    totals = report["totals"]
    if totals is not None and not totals["tensors"]:
        out.field("tensors", "none (vocab-only file)")
    elif totals is not None:
        out.field("tensors", f"{totals['tensors']:,}, {totals['parameters']:,} parameters "
                             f"({_human_count(totals['parameters'])}), {totals['bytes']:,} bytes "
                             f"({_human_bytes(totals['bytes'])})")
    for w in report["warnings"]:
        out.field("warning", _show(w))


def _layers_text(layers: list[int], n_layer: Any) -> str:
    """Layer indices as '0, 2, 4 (3 of 6 layers)'."""
    total = f" of {n_layer:,}" if isinstance(n_layer, int) else ""
    return (", ".join(map(str, layers)) or "none") + f" ({len(layers):,}{total} layers)"


def _pairs_text(values: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    """A group of hyper-parameters on one line: 'name value, ...' (underscores as spaces)."""
    return ", ".join(f"{k.replace('_', ' ')} {_fmt_scalar(v) if not isinstance(v, list) else _fmt_item(v)}"
                     for k, v in values.items() if k not in skip)


_ATTENTION_KEYS = ("head_count", "head_count_kv", "key_length", "value_length", "q_lora_rank", "kv_lora_rank")


def _hparams_lines(out: _Listing, hp: dict[str, Any], arch: str | None) -> None:
    """The architecture's notable hyper-parameters: sizes, experts and their tensors, sliding window, rope,
    DeltaNet."""
    groups = [g for g in ("model", "experts", "sliding_window", "rope", "deltanet") if hp.get(g)]
    if not groups:
        return
    out.section(f"hyper-parameters ({_show(arch)})" if arch else "hyper-parameters")
    n_layer = (hp.get("model") or {}).get("block_count")
    sizes = hp.get("model") or {}
    attention = {k: v for k, v in sizes.items() if k in _ATTENTION_KEYS}
    if len(attention) < len(sizes):
        out.field("model", _pairs_text(sizes, _ATTENTION_KEYS))
    if attention:
        out.field("attention", _pairs_text(attention))
    experts = hp.get("experts")
    if experts:
        text = _pairs_text(experts, ("tensors",))
        if text:
            out.field("experts", text)
        for k, t in enumerate(experts.get("tensors", [])):
            out.field("expert tensors" if k == 0 else "",
                      f"{_show(t['name'])} {'/'.join(t['types'])} {' x '.join(map(str, t['shape']))} "
                      f"({t['layers']:,} layers)")
    window = hp.get("sliding_window")
    if window:
        text = f"{window['size']:,} tokens" if isinstance(window.get("size"), int) else _pairs_text(window)
        if window.get("layers") is not None:
            text += ", layers " + _layers_text(window["layers"], n_layer)
        out.field("sliding window", text)
    if hp.get("rope"):
        out.field("rope", _pairs_text(hp["rope"]))
    deltanet = hp.get("deltanet")
    if deltanet:
        text = _pairs_text(deltanet, ("layers",))
        if deltanet.get("layers") is not None:
            text += "; DeltaNet layers " + _layers_text(deltanet["layers"], n_layer)
        out.field("deltanet", text)


def _metadata_lines(out: _Listing, entries: list[dict[str, Any]]) -> None:
    """One aligned line per metadata key: key, short type, value."""
    out.section(f"metadata ({len(entries)} keys)")
    keys = [_show(e["key"]) for e in entries]
    width = min(max((len(k) for k in keys), default=0), 44)
    for key, e in zip(keys, entries):
        out.lines.append(f"  {key:<{width}}  {out.dim(f'{_type_label(e):<5}')}  {_fmt_value(e)}")


def _tokenizer_lines(out: _Listing, tok: dict[str, Any]) -> None:
    """Model, vocab size, error, special tokens, end-of-generation ids, flags and token types."""
    out.section("tokenizer")
    model = _show(tok["model"]) if tok["model"] is not None else "?"
    if tok["type"] is not None:
        model += f" ({tok['type']})"
    if tok["pre"]:
        model += f", pre {_show(tok['pre'])}"
    out.field("model", model)
    if tok["vocab_size"] is not None:
        merges = f", {tok['merges']:,} merges" if tok["merges"] or tok["type"] == "bpe" else ""
        out.field("vocab", f"{tok['vocab_size']:,} tokens{merges}")
    if tok["error"]:
        out.field("error", _show(tok["error"]))
    specials = list(tok["special"].items())
    id_width = max((len(str(s["id"])) for _, s in specials), default=0)
    for k, (name, s) in enumerate(specials):
        piece = quote_text(s["piece"], 48) if s["piece"] is not None else out.dim("(out of range)")
        out.field("special" if k == 0 else "", f"{name:<8}{s['id']:>{id_width}}  {piece}")
    if tok["eog"]:
        out.field("end of gen", ", ".join(str(i) for i in tok["eog"]))
    if tok["flags"]:
        out.field("flags", ", ".join(f"{k} {_fmt_scalar(v)}" for k, v in tok["flags"].items()))
    types = tok["token_types"]
    out.field("token types", ", ".join(f"{k} {v:,}" for k, v in types.items()) if types else out.dim("(none in file)"))


def _tensor_lines(out: _Listing, tensors: list[dict[str, Any]], totals: dict[str, Any]) -> None:
    """The tensor table: name, type, shape, parameters and bytes per tensor, then the totals."""
    out.section(f"tensors ({len(tensors):,})")
    shapes = [" x ".join(str(d) for d in t["shape"]) for t in tensors]
    names = [_show(t["name"]) for t in tensors]
    nw = min(max(len(n) for n in names), 48)
    tw = max(4, *(len(t["type"]) for t in tensors))
    sw = max(5, *(len(s) for s in shapes))
    pw = max(10, len(f"{totals['parameters']:,}"))
    bw = max(5, len(f"{totals['bytes']:,}"))
    out.lines.append(out.dim(f"  {'name':<{nw}}  {'type':<{tw}}  {'shape':<{sw}}  {'parameters':>{pw}}  "
                             f"{'bytes':>{bw}}"))
    for t, name, shape in zip(tensors, names, shapes):
        nbytes = f"{t['n_bytes']:,}" if t["n_bytes"] is not None else "?"
        out.lines.append(f"  {name:<{nw}}  {t['type']:<{tw}}  {shape:<{sw}}  {t['n_elements']:>{pw},}  "
                         f"{nbytes:>{bw}}")
    types = ", ".join(f"{k} {v}" for k, v in totals["types"].items())
    out.lines.append(f"  {'total':<{nw}}  by type: {types}")
    out.lines.append(f"  {'':<{nw}}  {totals['tensors']:,} tensors, {totals['parameters']:,} parameters, "
                     f"{totals['bytes']:,} bytes")


def render_text(report: dict[str, Any], color: bool = False) -> str:
    """The report as an aligned, human-readable listing (ANSI bold/dim when color is True)."""
    out = _Listing(color)
    _header_lines(out, report)
    if report.get("hparams"):
        _hparams_lines(out, report["hparams"], report["architecture"])
    if report["metadata"] is not None:
        _metadata_lines(out, report["metadata"])
    if report["tokenizer"] is not None:
        _tokenizer_lines(out, report["tokenizer"])
    if report["tensors"] and report["totals"] is not None:
        _tensor_lines(out, report["tensors"], report["totals"])
    return "\n".join(out.lines) + "\n"
