"""Tokenizer tables, as data: pre-tokenizer patterns, what each `tokenizer.ggml.pre` name means, model kinds,
special-token roles and the keys and texts llama.cpp finds them by.

The patterns are llama.cpp's own regex_exprs (src/llama-vocab.cpp), verbatim; how they run is
`pretokenize.py`'s business, how they are translated for Python's re `regex_translate.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from ..errors import UnsupportedError
from ..gguffile.constants import Keys

K = Keys.Tokenizer

# ---------------------------------------------------------------------------------------------
# The pattern sets (llama.cpp's regex_exprs, verbatim).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_ORIGINAL = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
KIMI_K2 = r"\p{Han}+"
AFMOE_DIGITS = r"\p{AFMoE_digits}"
# tiny_aya's digit rule, as its tokenizer.json writes it; llama.cpp runs its AFMoE digit splitter for it.
TINY_AYA_DIGITS = r"\d{1,3}(?=(?:\d{3})*\b)"
_CJK = "[一-龥぀-ゟ゠-ヿ]+"
_PUNCT_WORD = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^" + "\r\n" + r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+")
_CASED = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?")
_UPLOW = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?")
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_PORO = " ?[^(\\s|.,!?…。，、।۔،)]+"

PATTERNS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),
    "jais2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
              r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    "deepseek-llm": (
        "[\r\n]",
        r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        "[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+"),
    "deepseek3": (r"\p{N}{1,3}", _CJK, _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[" + "\r\n" + r"]*|\s*[" + "\r\n" + r"]+|\s+(?!\S)|\s+"),
    "spark2_5": (r"\p{N}{1,3}", _CJK, _PUNCT_WORD + r"| ?[\p{P}\p{S}]+|[" + "\r\n" + r"]|\s+(?!\S)|\s+", r"\p{N}"),
    "youtu": ("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
              _UPLOW + r"|\p{N}" + _TAIL),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", GPT2),
    "gpt2": (GPT2,),
    "qwen2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "qwen35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+",),
    "poro": (_PORO,),
    "viking": (_PORO, r"\p{N}"),
    "tekken": (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
               r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}" + _TAIL,),
    "chameleon": (r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", GPT2),
    "gpt4o": (_CASED + r"|\p{N}{1,3}" + _TAIL,),
    "granite-emb-multi": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+" + _CONTRACTIONS + "?"
        r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*" + _CONTRACTIONS + "?"
        r"|\p{N}{1,3}" + _TAIL,),
    "tiny-aya": (TINY_AYA_DIGITS, _UPLOW + r"|\p{N}{1,3}" + _TAIL),
    "kimi-k2": (KIMI_K2,),
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "afmoe": (AFMOE_DIGITS,
              "[一-鿿㐀-䶿\uf900-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
              _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "laguna": (r"[^\n]+|[\n]+",
               _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "newlines": (r"[^\n]+|[\n]+",),
    "minicpm5": (r"\p{N}{1,3}",
                 _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "whitespace": (r"\S+",),
})


@dataclass(frozen=True)
class PreSpec:
    """What a `tokenizer.ggml.pre` value means: its patterns and the vocab flags llama.cpp sets for it."""

    patterns: str
    ignore_merges: bool = False
    add_bos: bool | None = None       # None: leave the model type's default
    clean_spaces: bool = True
    escape_whitespaces: bool = False  # SPM-style BPE: spaces become U+2581 before splitting
    byte_encode: bool = True          # GPT-2 byte-level text; False: raw UTF-8 with <0xXX> fallback
    add_sep: bool = False
    no_bos: bool = False              # the bos id is cleared (chatglm)
    newline_tokens: bool = False      # a word of only newlines that is a token stays whole (gemma4)


def _names(spec: PreSpec, *names: str) -> dict[str, PreSpec]:
    return dict.fromkeys(names, spec)


_LLAMA3 = PreSpec("llama3", ignore_merges=True, add_bos=True)
_UNCLEAN = {"clean_spaces": False}

# tokenizer.ggml.pre -> meaning; the names llama.cpp's llama_vocab::impl::load accepts.
PRE_TOKENIZERS: MappingProxyType[str, PreSpec] = MappingProxyType({
    "default": PreSpec("default"),
    **_names(PreSpec("minicpm5", ignore_merges=True), "minicpm5"),
    **_names(_LLAMA3, "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
             "lfm2", "jina-v5-nano"),
    "deepseek-llm": PreSpec("deepseek-llm", **_UNCLEAN),
    "deepseek-coder": PreSpec("deepseek-coder", **_UNCLEAN),
    "deepseek-v3": PreSpec("deepseek3", **_UNCLEAN),
    "spark2_5": PreSpec("spark2_5", **_UNCLEAN),
    "youtu": PreSpec("youtu", ignore_merges=True, **_UNCLEAN),
    "falcon": PreSpec("falcon"),
    "mpt": PreSpec("gpt2"),
    "starcoder": PreSpec("starcoder"),
    **_names(PreSpec("gpt2"), "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
             "a.x-4.0", "mellum", "modern-bert", "exaone4", "olmo", "jais"),
    "jais-2": PreSpec("jais2"),
    **_names(PreSpec("newlines", escape_whitespaces=True, byte_encode=False, add_bos=True, newline_tokens=True),
             "gemma4", "granite-embed-multi-311m"),
    "sarvam-moe": PreSpec("newlines", escape_whitespaces=True, byte_encode=False, **_UNCLEAN),
    **_names(PreSpec("gpt2", add_sep=True), "jina-v1-en", "jina-v2-code", "roberta-bpe"),
    "whitespace": PreSpec("whitespace", byte_encode=False),
    "refact": PreSpec("starcoder"),
    "command-r": PreSpec("starcoder", **_UNCLEAN),
    **_names(PreSpec("qwen2", **_UNCLEAN), "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan",
             "solar-open"),
    "qwen35": PreSpec("qwen35", **_UNCLEAN),
    "stablelm2": PreSpec("qwen2"),
    "megrez": PreSpec("qwen2"),
    **_names(PreSpec("llama3"), "dbrx", "smaug-bpe"),
    "poro-chat": PreSpec("poro", **_UNCLEAN),
    **_names(PreSpec("llama3", no_bos=True), "glm4", "chatglm-bpe"),
    "viking": PreSpec("viking", **_UNCLEAN),
    "tekken": PreSpec("tekken", ignore_merges=True, add_bos=True, **_UNCLEAN),
    "smollm": PreSpec("starcoder", **_UNCLEAN),
    **_names(PreSpec("starcoder"), "codeshell", "exaone", "minerva-7b", "mellum2"),
    **_names(PreSpec("poro"), "bloom", "gpt3-finnish"),
    "exaone-moe": PreSpec("exaone-moe"),
    "chameleon": PreSpec("chameleon", add_bos=True, **_UNCLEAN),
    **_names(PreSpec("gpt4o", **_UNCLEAN), "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
    "granite-embed-multi-97m": PreSpec("granite-emb-multi", ignore_merges=True, **_UNCLEAN),
    **_names(PreSpec("tiny-aya", **_UNCLEAN), "tiny_aya", "cohere2moe"),
    "superbpe": PreSpec("superbpe", **_UNCLEAN),
    **_names(PreSpec("gpt2", **_UNCLEAN), "trillion", "granite-docling"),
    **_names(PreSpec("bailingmoe", **_UNCLEAN), "bailingmoe", "bailingmoe2", "llada-moe"),
    "seed-coder": PreSpec("seed-coder", **_UNCLEAN),
    **_names(PreSpec("deepseek3", **_UNCLEAN), "hunyuan-dense", "hy_v4", "joyai-llm"),
    "kimi-k2": PreSpec("kimi-k2", **_UNCLEAN),
    "ufakzeka": PreSpec("ufakzeka", **_UNCLEAN),
    "grok-2": PreSpec("qwen2", **_UNCLEAN),
    "afmoe": PreSpec("afmoe", **_UNCLEAN),
    "laguna": PreSpec("laguna", **_UNCLEAN),
})


def pre_spec(name: str) -> PreSpec:
    """The meaning of a `tokenizer.ggml.pre` value; an empty value means 'default', as in llama.cpp."""
    spec = PRE_TOKENIZERS.get(name or "default")
    if spec is None:
        raise UnsupportedError(f"unknown pre-tokenizer tokenizer.ggml.pre = {name!r}; expected one of "
                               f"{len(PRE_TOKENIZERS)} names llama.cpp knows, e.g. 'llama-bpe', 'gpt-2', 'qwen2'")
    return spec


# ---------------------------------------------------------------------------------------------
# Patterns llama.cpp runs with hand-written splitters.
# llama.cpp's hand-written Kimi-K2 splitter, as the regex it stands for.
KIMI_K2_SPLITTER = (r"\p{Han}+"
         r"|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})\p{L})+(?:'[sStTmMdD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Patterns llama.cpp runs with hand-written splitters, and the regex each stands for.
CUSTOM_SPLITTERS = {
    GPT2: GPT2 + r"|\s+",
    LLAMA3: LLAMA3,
    LLAMA3_ORIGINAL: LLAMA3,
    KIMI_K2: KIMI_K2_SPLITTER,
}


# ---------------------------------------------------------------------------------------------
# Vocab: model kinds, special-token roles, the keys and texts llama.cpp finds them by.
# tokenizer.ggml.model -> (Vocab.kind, default special ids bos, eos, unk, sep, pad, mask).
GGML_MODEL_KINDS: dict[str, tuple[str, dict[str, int | None]]] = {
    "llama": ("spm", {"bos": 1, "eos": 2, "unk": 0, "sep": None, "pad": None, "mask": None}),
    "gpt2": ("bpe", {"bos": 11, "eos": 11, "unk": None, "sep": None, "pad": None, "mask": None}),
    "bert": ("wpm", {"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0, "mask": 103}),
    "t5": ("ugm", {"bos": None, "eos": 1, "unk": 2, "sep": None, "pad": 0, "mask": None}),
    # SPM-style BPE (merges over raw UTF-8 with spaces as U+2581); llama.cpp sets its pre-tokenizer to "gemma4"
    # whatever the file says, and reads every special id from the file.
    "gemma4": ("bpe", {"bos": None, "eos": None, "unk": None, "sep": None, "pad": None, "mask": None}),
}

# Tokenizer models whose pre-tokenizer llama.cpp fixes, ignoring the file's tokenizer.ggml.pre.
FORCED_PRE = {"gemma4": "gemma4"}

# Special-token roles, in the order llama.cpp lists them.
SPECIAL_NAMES = ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
                 "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")

# GGUF keys of BertNormalizer's options (llama.cpp reads them; gguf-py has no constants for them).
KEY_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
KEY_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"

# Special id keys in the order llama.cpp reads them; the later deprecated FIM keys override.
SPECIAL_ID_KEYS = (
    ("bos", K.BOS_ID), ("eos", K.EOS_ID), ("eot", K.EOT_ID), ("eom", K.EOM_ID), ("unk", K.UNK_ID),
    ("sep", K.SEP_ID), ("pad", K.PAD_ID), ("mask", K.MASK_ID), ("fim_pre", K.FIM_PRE_ID),
    ("fim_suf", K.FIM_SUF_ID), ("fim_mid", K.FIM_MID_ID), ("fim_pad", K.FIM_PAD_ID), ("fim_rep", K.FIM_REP_ID),
    ("fim_sep", K.FIM_SEP_ID), ("fim_pre", K.PREFIX_ID), ("fim_suf", K.SUFFIX_ID), ("fim_mid", K.MIDDLE_ID),
)

# Token texts llama.cpp recognises when the file does not name the id (first match in list order).
SPECIAL_BY_TEXT: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["))
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

# The GGUF key of each role's id (the current name; SPECIAL_ID_KEYS also lists the deprecated FIM ones).
SPECIAL_ID_KEY: dict[str, str] = dict(SPECIAL_ID_KEYS[:len(SPECIAL_NAMES)])
