"""The base of every merge model: a bounded cache from word to ids in front of `encode_word`."""

from __future__ import annotations

from ..vocab import Vocab

# Upper bound on cached words per tokenizer; past it the cache starts over, so memory stays flat
# on endless input (a word is a pre-token for BPE, a run between unmergeable boundaries for SPM).
CACHE_MAX_WORDS = 1 << 16


class Model:
    """Turns plain text into ids; subclasses say how text splits into words and how a word merges."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.token_to_id = vocab.token_to_id
        self._cache: dict[str, list[int]] = {}

    def affixes(self) -> tuple[list[int], list[int]]:
        """Ids that add_special puts before and after the text: bos/eos as the vocab's flags say."""
        v = self.vocab
        before = [v.special["bos"]] if v.add_bos else []
        after = [v.special["eos"]] if v.add_eos else []
        return before, after  # type: ignore[return-value]

    def prepare(self, text: str, after_special: bool) -> str:
        """Model-specific text preparation of one fragment (space markers, dummy prefix)."""
        return text

    def words(self, text: str) -> list[str]:
        """Split text into words that can be encoded independently."""
        raise NotImplementedError

    def encode_word(self, word: str) -> list[int]:
        """Encode one word from scratch."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Encode one fragment of plain text (special tokens already split off)."""
        out: list[int] = []
        cache = self._cache
        for w in self.words(text):
            ids = cache.get(w)
            if ids is None:
                ids = self.encode_word(w)
                if len(cache) >= CACHE_MAX_WORDS:
                    cache.clear()
                cache[w] = ids
            out += ids
        return out
