"""minillama.tokenizer: open a model's tokenizer and encode/decode exactly as llama.cpp does.

    from minillama.tokenizer import Tokenizer
    tok = Tokenizer.from_file("model.gguf")  # or tokenizer.bin, a SentencePiece .model, a tokenizer.json
    ids = tok.encode("Hello world", add_special=True, parse_special=False)
    tok.decode(ids); tok.decode_bytes(ids); tok.token_to_piece(ids[0])

For users of Hugging Face tokenizers, tiktoken and transformers: encode_with_offsets, allowed_special /
disallowed_special, encode_for_completion (token healing), apply_chat_template (transformers' signature and
defaults), tok(text) (a BatchEncoding), token_to_id / id_to_token / convert_ids_to_tokens / get_vocab /
get_vocab_size, decode_batch / batch_decode, skip_special_tokens, truncation / max_length, pad_id /
padding_side, chat_template, encode_batch(return_array=True, pad_to=..., truncate=...), len(tok) / vocab_size,
tokenize / convert_tokens_to_ids, bos_token(_id) / eos_token(_id) / unk / sep / mask / pad (settable),
encode(add_special_tokens=), tok(text, return_offsets_mapping=True), and tiktoken's encode_ordinary,
encode_ordinary_batch, max_token_value, eot_token and decode_single_token_bytes.

The pipeline: file -> Vocab (formats/, vocab.py) -> special-token split (special.py) -> encoder
(encoders/: score-based SPM, rank-based BPE with its pre-tokenizer, WordPiece or Unigram) -> ids -> pieces
(decode.py).

Text is taken as its UTF-8 bytes, which is what llama.cpp tokenizes. A Python str may also hold lone
surrogates, which have no UTF-8 form; `encode` gives them one meaning, in one place:

* U+DC80..U+DCFF stand for the raw bytes 0x80..0xFF (Python's 'surrogateescape'), so text read with
  ``data.decode("utf-8", "surrogateescape")`` tokenizes exactly as llama.cpp tokenizes ``data``,
  invalid UTF-8 included (SPM and Unigram vocabs see the bytes, byte-level BPE and WordPiece see
  U+FFFD for each invalid byte, as in llama.cpp). Escapes that together form valid UTF-8 are that
  character: "\udcc3\udca9" is "é".
* Any other surrogate (U+D800..U+DC7F, U+DD00..U+DFFF) becomes U+FFFD.

Nothing else is changed: NUL bytes, control characters, unassigned code points and text of any
length without a space are tokenized as llama.cpp does. For valid str input `encode` never raises;
the only exceptions are a vocab lacking what llama.cpp's algorithm needs for that text (FormatError,
where llama.cpp aborts) and bad arguments.

Errors: everything raised on purpose is a minillama.errors.MinillamaError -- FormatError for files
that are not what they claim, UnsupportedError for valid files using what is not implemented,
ArgumentError (a ValueError) / ArgumentTypeError (also a TypeError) for bad arguments.

Threads: a Tokenizer may be shared by any number of threads and gives the same results as in one
thread: its word caches are plain dicts (a get or set is atomic under the GIL; the bounded cache
clears itself when full) and tables built on first use are built under a lock, once.

The package's modules, from the face down: facade.py (the Tokenizer class), files.py (what inspect and the
CLI ask of files), batch.py, healing.py, special.py, offsets.py, decode.py, hf_api.py, encoders/,
pretokenize.py, vocab.py, formats/, tables.py, unicode.py; train.py (trains a vocab) sits above the face.
This module only re-exports the public names.
"""

from __future__ import annotations

from .decode import PieceTable, StreamDecoder
from .facade import Tokenizer
from .files import (
           default_vocab_path,
           format_display,
           padding_added,
           sniff_format,
           special_id_keys,
           vocab_piece,
)
from .formats import model_file, read_metadata
from .hf_api import BatchEncoding, PaddingSide
from .special import SpecialSet
from .vocab import Attr, Vocab

__all__ = ["Tokenizer", "Vocab", "Attr", "StreamDecoder", "BatchEncoding", "default_vocab_path", "read_metadata",
           "model_file", "sniff_format", "format_display", "special_id_keys", "vocab_piece", "padding_added",
           "SpecialSet", "PieceTable", "PaddingSide"]
