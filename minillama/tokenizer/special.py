"""Splitting special tokens out of text, as llama.cpp's tokenizer_st_partition does.

Special tokens (control, user-defined, unknown) are searched longest first; every occurrence of
one splits each remaining text fragment. Control and unknown tokens are only matched when
parse_special is set; user-defined tokens always are (as Hugging Face tokenizers does). A token with
the lstrip/rstrip attribute swallows the C whitespace on that side of it.
"""

from __future__ import annotations

from .unicode import C_SPACE
from .vocab import Attr, Vocab

PREFIX_CHARS = 3


def _always_matched(vocab: Vocab) -> list[int]:
    """The special ids matched without parse_special (not control, not unknown), longest first; kept on
    the vocab (llama3 has 256 control tokens that a plain encode would otherwise walk past each time)."""
    ids = vocab.__dict__.get("_always_matched")
    if ids is None:
        skip = int(Attr.CONTROL | Attr.UNKNOWN)
        ids = vocab.__dict__["_always_matched"] = [i for i in vocab.special_cache if not vocab.attrs[i] & skip]
    return ids


def partition(vocab: Vocab, text: str, parse_special: bool) -> list[str | int]:
    """Text as a list of plain-text fragments (str) and special token ids (int), in order."""
    if not text:
        return []
    frags: list[tuple[int, int] | int] = [(0, len(text))]
    tokens, attrs = vocab.tokens, vocab.attrs
    lstrip_bit, rstrip_bit = int(Attr.LSTRIP), int(Attr.RSTRIP)
    # Vocabs hold up to thousands of special tokens that share a few prefixes ("<|reserved_...",
    # "[PAD..."): one search per distinct prefix rules most of them out of a long text at once.
    prefix_in_text: dict[str, bool] = {}
    for sid in vocab.special_cache if parse_special else _always_matched(vocab):
        attr = attrs[sid]
        tok = tokens[sid]
        head = tok[:PREFIX_CHARS]
        present = prefix_in_text.get(head)
        if present is None:
            present = prefix_in_text[head] = head in text
        if not present or tok not in text:
            continue
        lstrip, rstrip, n = attr & lstrip_bit, attr & rstrip_bit, len(tok)
        out: list[tuple[int, int] | int] = []
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
                continue
            s, e = frag
            while True:
                m = text.find(tok, s, e)
                if m < 0:
                    break
                left = m
                if lstrip:
                    while left > s and text[left - 1] in C_SPACE:
                        left -= 1
                if left > s:
                    out.append((s, left))
                out.append(sid)
                s = m + n
                if rstrip:
                    while s < e and text[s] in C_SPACE:
                        s += 1
            if s < e:
                out.append((s, e))
        frags = out
    return [f if isinstance(f, int) else text[f[0]:f[1]] for f in frags]
