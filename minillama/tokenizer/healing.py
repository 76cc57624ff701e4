"""Token healing (Tokenizer.encode_for_completion): where a prompt's unstable end begins, and which of its
trailing ids to take off so that a generation loop can spell that text out again.

The end of a prompt is unstable: "The quick bro" ends in " bro", which a model would rarely have seen before
"wn". For BPE vocabs the unstable end is the last pre-token (as tiktoken's encode_with_unstable), for the
others the last whitespace-separated word with the space before it (which SPM tokens carry). Plain functions
over an encoder, its vocab, the text and the ids and character offsets encode_with_offsets gave it.
"""

from __future__ import annotations

from .encoders import Encoder
from .vocab import Attr, Vocab


def completion(encoder: Encoder, vocab: Vocab, text: str, ids: list[int], offsets: list[tuple[int, int]],
               add_special: bool) -> tuple[list[int], list[int], str]:
    """(stable ids, the trailing ids taken off, the text they stood for) of text, from its ids and offsets:
    see Tokenizer.encode_for_completion."""
    n_after = len(encoder.affixes()[1]) if add_special else 0
    n_before = len(encoder.affixes()[0]) if add_special else 0
    body_end = len(ids) - n_after
    if body_end <= n_before or vocab.attrs[ids[body_end - 1]] & int(Attr.CONTROL | Attr.UNKNOWN):
        return ids[:body_end], [], ""
    cut = offsets[body_end - 1][0]
    if text[cut:].strip() and not text[cut].isspace():
        specials = [offsets[k][1] for k in range(n_before, body_end)
                    if vocab.attrs[ids[k]] & int(Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED)]
        cut = last_word_start(encoder, vocab, text, max(specials, default=0), cut)
    k = body_end - 1
    while k - 1 >= n_before and offsets[k - 1][0] >= cut and \
            not vocab.attrs[ids[k - 1]] & int(Attr.CONTROL | Attr.UNKNOWN):
        k -= 1
    return ids[:k], ids[k:body_end], text[offsets[k][0]:]


def last_word_start(encoder: Encoder, vocab: Vocab, text: str, frag_start: int, pos: int) -> int:
    """Where the unstable end of text begins: for BPE the last pre-token (the regex piece the next
    characters may extend, as tiktoken's encode_with_unstable), else the last whitespace-separated word
    with the space before it (which SPM tokens carry). frag_start: where the last plain fragment starts."""
    frag = text[frag_start:]
    if vocab.kind == "bpe":
        prepared = encoder.prepare(frag, frag_start > 0)
        words = encoder.words(prepared)
        if words and len(prepared) == len(frag) and "".join(words) == prepared:
            return min(pos, frag_start + len(prepared) - len(words[-1]))
    while pos > frag_start and not text[pos - 1].isspace():
        pos -= 1
    if pos > frag_start and text[pos - 1] == " ":
        pos -= 1
    return pos
