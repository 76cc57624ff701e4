"""What Hugging Face transformers' tokenizer calls return and check, for Tokenizer's HF-style methods.

* BatchEncoding: what `tok(text)` returns (input_ids, attention_mask; a dict with attribute access).
* padding: id lists padded to one width on the side asked for (transformers' padding / padding_side), as
  lists or as numpy arrays (return_tensors="np").
* skip_special_tokens: the one name, across decode, stream_decoder and the HF-style calls, mapped onto
  llama_detokenize's two flags.
* apply_chat_template's conversation handling, as transformers 5.23's render_jinja_template does it:
  None values dropped, reasoning fields aliased, continue_final_message's open-ended last message, and
  the check that refuses a keyword argument that is neither a parameter nor a variable the template reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, UnsupportedError

PaddingSide = Literal["right", "left"]

# transformers' padding argument -> what minillama does ("longest", "max_length" or None: no padding)
PADDING: dict[Any, str | None] = {False: None, "do_not_pad": None, True: "longest", "longest": "longest",
                                  "max_length": "max_length"}

# the parameters of transformers 5.23's PreTrainedTokenizerBase.apply_chat_template (the rest of **kwargs
# are template variables)
CHAT_PARAMETERS = ("conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                   "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
                   "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' names for one thing
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker after the message to continue


class BatchEncoding(dict):
    """transformers' BatchEncoding as users touch it: a dict ("input_ids", "attention_mask") whose keys
    are also attributes (enc.input_ids)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"BatchEncoding has no {name!r} (it holds {', '.join(self)})") from None


def skip_flags(skip_special_tokens: bool | None, remove_special: bool, unparse_special: bool) -> tuple[bool, bool]:
    """llama_detokenize's (remove_special, unparse_special) for HF's skip_special_tokens: True drops bos/eos
    and control tokens, False writes every token's text; None keeps the llama.cpp flags as given."""
    if skip_special_tokens is None:
        return remove_special, unparse_special
    if remove_special or unparse_special:
        raise ArgumentError("pass skip_special_tokens, or llama.cpp's remove_special/unparse_special, not both "
                            f"(got skip_special_tokens={skip_special_tokens!r}, remove_special={remove_special!r}, "
                            f"unparse_special={unparse_special!r})")
    return (True, False) if skip_special_tokens else (False, True)


def check_padding_side(side: Any) -> PaddingSide:
    if side not in ("right", "left"):
        raise ArgumentError(f"padding_side must be 'right' or 'left', got {side!r}")
    return side


def check_max_length(truncation: Any, max_length: Any) -> int | None:
    """The length to truncate to, or None: truncation=True needs max_length, and max_length alone is refused
    (transformers would truncate with a warning; here it must be asked for)."""
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0):
        raise ArgumentError(f"max_length must be an int >= 0 or None, got {max_length!r}")
    if truncation not in (True, False, None, "longest_first", "only_first", "do_not_truncate"):
        raise ArgumentError(f"truncation must be True or False, got {truncation!r}")
    on = truncation in (True, "longest_first", "only_first")
    if on and max_length is None:
        raise ArgumentError("truncation=True needs max_length=N (the most ids to keep, special tokens included)")
    if not on and max_length is not None and truncation is not None:
        raise ArgumentError(f"max_length={max_length} is given but truncation is {truncation!r}: pass truncation=True "
                            "to truncate (or padding='max_length' to pad)")
    return max_length if on else None


def pad(rows: list[list[int]], padding: Any, max_length: int | None, pad_id: int | None,
        side: PaddingSide) -> tuple[list[list[int]], list[list[int]]]:
    """(ids, attention masks), padded as transformers' padding= asks; ArgumentError without a pad id."""
    try:
        how = PADDING[padding]
    except (KeyError, TypeError):
        raise ArgumentError(f"padding must be True, False, 'longest', 'max_length' or 'do_not_pad', "
                            f"got {padding!r}") from None
    masks = [[1] * len(r) for r in rows]
    if how is None:
        return rows, masks
    if how == "max_length" and max_length is None:
        raise ArgumentError("padding='max_length' needs max_length=N")
    width = max([len(r) for r in rows] + ([max_length] if how == "max_length" and max_length else []), default=0)
    if pad_id is None and any(len(r) < width for r in rows):
        raise ArgumentError("this vocab has no pad token (tokenizer.ggml.padding_token_id): set tok.pad_id = "
                            "<an id> (e.g. tok.eos_id) to pad with")
    out, out_masks = [], []
    for r, m in zip(rows, masks):
        fill = width - len(r)
        if side == "left":
            out.append([pad_id] * fill + r)
            out_masks.append([0] * fill + m)
        else:
            out.append(r + [pad_id] * fill)
            out_masks.append(m + [0] * fill)
    return out, out_masks


def as_tensors(enc: dict[str, Any], return_tensors: Any, batched: bool) -> dict[str, Any]:
    """enc's lists as transformers returns them: unchanged (None), or int64 numpy arrays with a batch axis ("np")."""
    if return_tensors is None:
        return enc
    if return_tensors != "np":
        raise UnsupportedError(f"return_tensors={return_tensors!r} is not available: minillama returns numpy "
                               "arrays (return_tensors='np') or lists (None)")
    out = {}
    for key, rows in enc.items():
        rows = rows if batched else [rows]
        if len({len(r) for r in rows}) > 1:
            raise ArgumentError(f"the texts give {min(map(len, rows))} to {max(map(len, rows))} ids: pass "
                                "padding=True to make one array of them")
        out[key] = np.array(rows, dtype=np.int64).reshape(len(rows), -1)
    return out


# --- apply_chat_template ------------------------------------------------------------------------------------------


def conversations(conversation: Any) -> tuple[list[list[dict[str, Any]]], bool]:
    """(the conversations, whether several were given), each message a fresh dict without None values and
    with its reasoning under all of transformers' names (what render_jinja_template hands the template)."""
    if isinstance(conversation, (str, bytes, Mapping)) or not isinstance(conversation, Sequence):
        raise ArgumentTypeError("apply_chat_template() takes a list of messages ({'role': ..., 'content': ...}) or "
                                f"a list of such lists, got {type(conversation).__name__}")
    if not conversation:
        raise ArgumentError("cannot apply a chat template to an empty conversation: expected at least one message")
    batched = isinstance(conversation[0], (list, tuple))
    out = []
    for chat in (conversation if batched else [conversation]):
        msgs = []
        for m in chat:
            if not isinstance(m, Mapping):
                raise ArgumentTypeError(f"chat messages must be dicts, got {type(m).__name__} {str(m)[:40]!r}")
            m = {k: v for k, v in m.items() if v is not None}
            reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
            if reasoning is not None:
                m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
            msgs.append(m)
        out.append(msgs)
    return out, batched


def open_final_message(chat: list[dict[str, Any]], field: bool | str, source: str) -> str:
    """Mark the last message's text for continue_final_message (a tag after it, as transformers does) and
    return that text; ArgumentError when there is none to continue or the template never reads it."""
    if not chat:
        raise ArgumentError("continue_final_message is set but the conversation is empty")
    name = field if isinstance(field, str) else "content"
    final = chat[-1].get(name)
    if final is None:
        raise ArgumentError(f"continue_final_message is set but the final message has no {name!r} to continue")
    fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final] if name in _REASONING_FIELDS else [name]
    if not any(f in source for f in fields):
        raise ArgumentError(f"continue_final_message is set to {name!r} but the chat template never reads it")
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if isinstance(block, Mapping) and "text" in block:
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG  # the blocks are the fresh copies of conversations()
                return text
        raise ArgumentError("continue_final_message is set but the final message holds no text block to continue")
    if not isinstance(final, str):
        raise ArgumentTypeError(f"continue_final_message: the final message's {name!r} is a "
                                f"{type(final).__name__}, expected text")
    for f in fields:
        chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return final


def cut_after_final(rendered: str, final: str) -> str:
    """The rendering cut right after the final message's text (what follows it, an end-of-turn, dropped)."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ArgumentError("continue_final_message is set but the final message does not appear in the "
                            "rendered chat (the template changes it)")
    at = rendered.rindex(tag)
    if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing space
