"""One exception family for everything a user's file or argument can get wrong.

Every error minillama raises on purpose derives from `MinillamaError`:

* `FormatError` (also a ValueError): the file is not what it claims to be -- truncated, wrong magic,
  a length that runs past the end of the file, a value of the wrong type; the message names the byte
  offset and the metadata key where reading failed, and says what was expected and what was found.
  Also raised at encode time by a vocab that lacks what llama.cpp's algorithm needs there (an SPM
  vocab without byte tokens, a WordPiece or Unigram vocab without an unknown token), where llama.cpp
  itself aborts. `NonFiniteError`, a FormatError, is a model whose forward pass gives NaN or infinity.
* `UnsupportedError`: a valid file using something minillama does not implement (a pre-tokenizer
  name, a tokenizer model, a tensor type, a GGUF version).
* `InputError` (also an OSError): an input path that cannot be read (missing, a directory, a FIFO, a
  device, over the size limit).
* `OutputError`: an output path that cannot be written (a directory, a FIFO, no such directory, one of
  the command's own inputs, a data set directory that another run holds or that minillama did not write).
* `ArgumentError` (also a ValueError): a bad argument, such as a token id outside the vocab;
  `ArgumentTypeError` (also a TypeError) when it has the wrong type.

So `except ValueError` still catches bad files and bad arguments, `except TypeError` wrong types,
and `except MinillamaError` all of them.
"""

from __future__ import annotations


class MinillamaError(Exception):
    """Base class of every error minillama raises on purpose."""


class FormatError(MinillamaError, ValueError):
    """The file is not what it claims to be (names the offset and key where reading failed)."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None,
                 key: str | None = None) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if offset is not None:
            where.append(f"offset {offset}")
        if key is not None:
            where.append(f"key {key!r}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.path, self.offset, self.key = path, offset, key

    def __reduce__(self):  # picklable (keyword-only arguments), e.g. across a process pool
        return _rebuild, (type(self), self.args, self.path, self.offset, self.key)


def _rebuild(cls: type[FormatError], args: tuple, path: str | None, offset: int | None,
             key: str | None) -> FormatError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.path, err.offset, err.key = path, offset, key
    return err


class NonFiniteError(FormatError):
    """A model whose forward pass gives NaN or infinity (its weights hold them, or its activations overflow
    float32): raised alike by both backends instead of sampling from meaningless scores."""


class UnsupportedError(MinillamaError):
    """A valid file that uses something minillama does not implement (a pre-tokenizer, a model type...)."""


class ArgumentError(MinillamaError, ValueError):
    """A bad argument: a token id outside the vocab, a count out of range."""


class InputError(MinillamaError, OSError):
    """An input path that cannot be read as asked: missing, a directory, a FIFO or device, too large."""


class ChatTemplateError(MinillamaError):
    """A chat template from a file that does not compile, fails to render or passes a render limit."""


class ChatTemplateRefused(ChatTemplateError, ArgumentError):
    """The chat template's own raise_exception() refused the conversation (e.g. an unknown role)."""


class OutputError(MinillamaError):
    """An output path that cannot be written as asked: a directory, FIFO or socket, a missing directory."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (a TypeError as well as an ArgumentError/ValueError)."""


class ContextLengthError(ArgumentError):
    """More tokens than the model's context holds (minillama.model: Model.logits, Model.next_token)."""


# --- warnings: valid input that will probably not do what the user wants ---------------------------------------


class MinillamaWarning(UserWarning):
    """Base class of every warning minillama issues (filter them all with this category)."""


class MissingPreTokenizerWarning(MinillamaWarning):
    """A byte-level BPE GGUF without tokenizer.ggml.pre: llama.cpp falls back to 'default', often wrong."""


class DoubleBosWarning(MinillamaWarning):
    """encode(add_special=True) of text that already starts with the bos text: the ids get bos twice."""


class IgnoredNormalizerWarning(MinillamaWarning):
    """A SentencePiece .model whose normalizer llama.cpp ignores: ids will differ from sentencepiece's."""
