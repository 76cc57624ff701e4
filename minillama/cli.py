"""The minillama command line tool: one function per subcommand, dispatched from a table."""

from __future__ import annotations

import argparse
import codecs
import gc
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from minillama import __version__
from minillama.errors import ChatTemplateError, MinillamaError
from minillama.palette import FOREGROUND, NEWLINE_MARK, PALETTE

if TYPE_CHECKING:
    from minillama.chat import ChatFormat
    from minillama.generate import LanguageModel
    from minillama.model import Model
    from minillama.tokenizer import Tokenizer

PROG = "minillama"

RESET = "\x1b[0m"


# ---------------------------------------------------------------------------------------------
# Rendering helpers


def warn(message: str) -> None:
    """One 'minillama: warning: ...' line on stderr: something the user asked for that will not happen as meant."""
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def use_color(stream: TextIO) -> bool:
    """Return True when stream is a terminal, NO_COLOR is not set and TERM is not 'dumb'."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def group_pieces(pieces: Iterable[bytes]) -> list[str]:
    """Decode token pieces into groups, joining tokens that split one UTF-8 character between them."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    groups: list[str] = []
    text = ""
    for piece in pieces:
        text += decoder.decode(piece)
        if not decoder.getstate()[0]:  # no bytes left waiting for the rest of a character
            groups.append(text)
            text = ""
    text += decoder.decode(b"", final=True)
    if text:
        groups.append(text)
    return groups


# Control characters (other than tab and newline) are shown as Unicode control pictures on a
# terminal, so a token holding e.g. ESC cannot inject escape sequences.
_CONTROL_PICTURES = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)} | {0x7F: 0x2421}




def colorize(groups: Sequence[str]) -> str:
    """Paint each group on the next pastel background, resetting around newlines so colour never bleeds;
    a newline shows as a coloured ↵ before the line break, so a newline token is seen."""
    fr, fg, fb = FOREGROUND
    out: list[str] = []
    for i, group in enumerate(groups):
        r, g, b = PALETTE[i % len(PALETTE)]
        start = f"\x1b[48;2;{r};{g};{b}m\x1b[38;2;{fr};{fg};{fb}m"
        lines = group.translate(_CONTROL_PICTURES).split("\n")
        marked = [line + NEWLINE_MARK for line in lines[:-1]] + lines[-1:]
        out.append("\n".join(start + line + RESET if line else "" for line in marked))
    return "".join(out)


def plural(n: int, word: str) -> str:
    """'1 file', '2 files'."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def escape_piece(piece: bytes) -> str:
    """A token's bytes as one line of text: controls, backslashes and bytes that are not whole UTF-8 escaped."""
    from minillama.inspection import quote_text

    return quote_text(piece.decode("utf-8", "surrogateescape"))[1:-1]


def format_ids(ids: Iterable[int]) -> str:
    """Format ids like a Python list: [1, 2, 3]."""
    return "[" + ", ".join(str(int(i)) for i in ids) + "]"


# ---------------------------------------------------------------------------------------------
# Subcommands


#: -n -1 and -n -2 (llama.cpp: "infinity", "until context filled"): generate until an end-of-generation token or
#: the model's context is full.
NO_LIMIT = (-1, -2)


def check_sampling_flags(args: argparse.Namespace, no_limit: bool = False) -> None:
    """The sampling flags, --max-tokens and --threads checked before anything loads, errors naming the flags; the
    sampling settings kept as args.sampling (a SamplingParams), --json-schema's as args.response_format; no_limit:
    --max-tokens may also be one of NO_LIMIT."""
    from minillama.request import SamplingParams

    bias = dict(_logit_bias(b) for b in getattr(args, "logit_bias", None) or [])
    try:
        args.sampling = SamplingParams(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, min_p=args.min_p,
            repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
            presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, logit_bias=bias)
    except ValueError as exc:
        raise MinillamaError(re.sub(r"\b(temperature|top_k|top_p|min_p|repeat_penalty|repeat_last_n|presence_penalty"
                                    r"|frequency_penalty|logit_bias|seed)\b",
                                    lambda m: "--" + m.group().replace("_", "-"), str(exc))) from None
    args.response_format = _json_schema(args.json_schema)
    if args.max_tokens < 1 and not (no_limit and args.max_tokens in NO_LIMIT):
        extra = " (or -1 or -2: until end of generation or a full context)" if no_limit else ""
        raise MinillamaError(f"expected --max-tokens (-n) of at least 1{extra}, found {args.max_tokens}")
    threads = getattr(args, "threads", None)
    if threads is not None:
        from minillama.model.threads import usable_cores

        cores = usable_cores()  # more threads than cores only wait on each other (-t 100000 was 47x slower)
        if not 1 <= threads <= cores:
            raise MinillamaError(f"expected --threads from 1 to {cores} (the cores this process may use), "
                                 f"found {threads}")


def _check_order(order: int | None) -> None:
    """--order within 1..MAX_ORDER (checked before anything is read)."""
    from minillama.ngram import MAX_ORDER

    if order is not None and not 1 <= order <= MAX_ORDER:
        raise MinillamaError(f"--order expects a number from 1 to {MAX_ORDER}, found {order}")


# llama-tokenize's escapes (common.cpp string_process_escapes): \n \r \t \' \" \\ and \xNN (a raw byte).
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """text with llama-tokenize's escape sequences replaced; \\xNN above 0x7F is that raw byte."""
    import re

    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] == "x":
            b = int(e[1:], 16)
            return chr(b) if b < 0x80 else bytes([b]).decode("utf-8", "surrogateescape")
        return _ESCAPES[e]

    return re.sub(r"\\(x[0-9a-fA-F]{2}|[nrt'\"\\])", one, text)


def _read_text(words: Sequence[str], file: str | None = None) -> str:
    """The text to work on: FILE's bytes, standard input when the only word is '-', else the words joined by
    spaces. Bytes that are not UTF-8 stay raw bytes (surrogate escapes), as the API and llama.cpp take them."""
    from minillama.fileio import read_input

    if file is not None:
        if words:
            raise MinillamaError(f"expected TEXT or -f FILE, found both (-f {file} and {len(words)} words)")
        return read_input(file, "text file").decode("utf-8", "surrogateescape")
    if not words:
        raise MinillamaError("expected TEXT, '-' (standard input) or -f FILE, found none")
    if list(words) == ["-"]:
        return read_input("-").decode("utf-8", "surrogateescape")
    return " ".join(words)


def _load_tokenizer(path: str | None) -> Tokenizer:
    """Load the tokenizer at path, or the packaged default vocab when path is None."""
    from minillama.tokenizer import Tokenizer, default_vocab_path  # lazy: keeps --help fast

    return Tokenizer.from_file(path if path is not None else default_vocab_path())


def cmd_tokenize(args: argparse.Namespace) -> int:
    """Print the pieces, the ids and the token count of the given text (or one of them, or JSON)."""
    text = _read_text(args.text, args.file)
    if args.escape:
        text = process_escapes(text)
    tok = _load_tokenizer(args.model)
    ids = tok.encode(text, add_special=not args.no_bos, parse_special=args.parse_special)
    pieces = [tok.token_to_piece(i) for i in ids]
    out = sys.stdout
    show = "ids" if args.ids else args.show
    if args.json:
        out.write(json.dumps({"ids": ids, "pieces": [p.decode("utf-8", "replace") for p in pieces],
                              "piece_bytes": [p.hex() for p in pieces], "count": len(ids)}, ensure_ascii=False)
                  + "\n")
    elif show == "ids":
        out.write(format_ids(ids) + "\n")
    elif show == "table":
        out.write("".join(f"{i}\t{escape_piece(p)}\n" for i, p in zip(ids, pieces)))
    else:
        if use_color(out):
            shown = colorize(group_pieces(pieces))
            out.write(shown + ("" if shown.endswith("\n") else "\n"))
        else:  # no colour to show where pieces end: a JSON list, one entry per token
            out.write(json.dumps([p.decode("utf-8", "replace") for p in pieces], ensure_ascii=False) + "\n")
        out.write(format_ids(ids) + "\n")
        out.write(f"{plural(len(ids), 'token')}\n")
    out.flush()
    return 0


def _setup_tokenize(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'tokenize'."""
    p.add_argument("--model", metavar="PATH", help="GGUF, SentencePiece .model, Hugging Face tokenizer.json or "
                   "llama2.c tokenizer.bin (default: built-in vocab)")
    p.add_argument("--show", choices=("pieces", "ids", "table"), default="pieces",
                   help="pieces: coloured pieces (one JSON list entry per token when piped), ids and count; "
                   "ids: only the ids; table: one 'id<TAB>piece' line per token (default: pieces)")
    p.add_argument("--ids", action="store_true", help="same as --show ids")
    p.add_argument("--json", action="store_true", help="print one JSON object: ids, pieces (one per token), "
                   "piece_bytes (hex) and count")
    p.add_argument("-f", "--file", metavar="FILE", help="tokenize the contents of FILE instead of TEXT")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS (add_special=False)")
    p.add_argument("--parse-special", action="store_true", help="turn special-token text into its id")
    p.add_argument("--escape", action="store_true",
                   help="process escapes as llama-tokenize does by default: \\n \\r \\t \\' \\\" \\\\ \\xNN")
    p.add_argument("text", nargs="*", metavar="TEXT",
                   help="text to tokenize (words joined by spaces; '-' reads stdin); bytes that are not UTF-8 are "
                   "tokenized as raw bytes, as llama.cpp does")


def cmd_convert(args: argparse.Namespace) -> int:
    """Write the tokenizer of SRC (any file Tokenizer.from_file opens) as a vocab-only GGUF at OUT."""
    from minillama.fileio import refuse_input_as_output
    from minillama.gguffile import is_gguf, read_gguf, write_vocab_gguf  # lazy: keeps --help fast
    from minillama.tokenizer import Vocab, read_metadata

    src, out = args.src, args.out
    refuse_input_as_output(out, [src])
    with open(src, "rb") as f:
        head = f.read(4)
    types = None
    if is_gguf(head):
        gf = read_gguf(src, tensors=False)
        metadata, types = gf.metadata, gf.value_types
    else:
        metadata = read_metadata(src)
    vocab = Vocab.from_metadata(metadata, src)  # refuse what minillama itself could not load
    write_vocab_gguf(metadata, out, name=args.name, types=types)
    pre = f", pre {vocab.pre}" if vocab.kind == "bpe" else ""
    print(f"{out}: {metadata['tokenizer.ggml.model']} ({vocab.kind}) vocab of {vocab.n_vocab} tokens{pre}, "
          f"{os.path.getsize(out):,} bytes, from {src}")
    return 0


def _setup_convert(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'convert'."""
    p.add_argument("src", metavar="SRC",
                   help="GGUF, SentencePiece .model, Hugging Face tokenizer.json or llama2.c tokenizer.bin")
    p.add_argument("out", metavar="OUT.gguf", help="where to write the vocab-only GGUF")
    p.add_argument("--name", help="general.name to write (default: the source's)")


def cmd_decode(args: argparse.Namespace) -> int:
    """Print the text of token ids (llama_detokenize), exact bytes when piped."""
    import re

    words = args.ids if args.ids and args.ids != ["-"] else [sys.stdin.read(1 << 26)]
    found = re.findall(r"[^\s,\[\]]+", " ".join(words))
    ids = []
    for w in found:
        if not re.fullmatch(r"-?\d+", w):
            raise MinillamaError(f"expected token ids (integers, separated by spaces or commas), found {w!r}")
        ids.append(int(w))
    tok = _load_tokenizer(args.model)
    data = tok.decode_bytes(ids, remove_special=args.skip_special, unparse_special=not args.skip_special)
    out = sys.stdout
    if out.isatty():  # a terminal: text, with control characters shown as pictures (no escape injection)
        text = data.decode("utf-8", "replace").translate(_CONTROL_PICTURES)
        out.write(text + ("" if text.endswith("\n") else "\n"))
        out.flush()
    else:
        out.flush()
        out.buffer.write(data)
        out.buffer.flush()
    return 0


def _item_line(v: object) -> str:
    """One array item of `inspect --key` on one line."""
    return escape_piece(v.encode("utf-8", "surrogateescape")) if isinstance(v, str) else str(v)


def _setup_decode(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'decode'."""
    p.add_argument("--model", metavar="PATH", help="GGUF, SentencePiece .model, Hugging Face tokenizer.json or "
                   "llama2.c tokenizer.bin (default: built-in vocab)")
    p.add_argument("--skip-special", action="store_true",
                   help="leave out special tokens (default: show their text, e.g. <s>)")
    p.add_argument("ids", nargs="*", metavar="IDS",
                   help="token ids, separated by spaces or commas, brackets allowed (none or '-': read stdin)")


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print what a GGUF or tokenizer file holds (metadata, tokenizer, tensor table), reading no tensor data."""
    from minillama.inspection import inspect_file, key_value, render_json, render_text  # lazy: fast --help

    if args.key is not None:
        value = key_value(args.path, args.key)
        out = sys.stdout
        if args.json:
            out.write(render_json({"key": args.key, "value": value}))
        elif isinstance(value, list):  # one item per line; strings escaped so that each stays one line
            out.write("".join(f"{_item_line(v)}\n" for v in value))
        else:
            text = str(value)
            if out.isatty():
                text = text.translate(_CONTROL_PICTURES)
            out.write(text + ("" if text.endswith("\n") else "\n"))
        out.flush()
        return 0
    report = inspect_file(args.path)
    out = sys.stdout
    out.write(render_json(report) if args.json else render_text(report, color=use_color(out)))
    out.flush()
    return 0


def _setup_inspect(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'inspect'."""
    p.add_argument("path", metavar="PATH",
                   help="GGUF, SentencePiece .model, Hugging Face tokenizer.json or llama2.c tokenizer.bin")
    p.add_argument("--json", action="store_true", help="print the same report as JSON (numbers in full, long strings "
                   "and arrays shortened as in the text report; no colour)")
    p.add_argument("--key", metavar="KEY", help="print only this metadata key's whole value (e.g. "
                   "tokenizer.chat_template; arrays one item per line)")


def _has_weights(path: str) -> bool:
    """True when path is a GGUF that holds tensors (a model to run, not just a vocab)."""
    from minillama.gguffile import is_gguf, read_gguf

    with open(path, "rb") as f:
        head = f.read(4)
        if not is_gguf(head):
            return False
    return bool(read_gguf(path).tensors)


def _load_model(path: str, threads: int | None = None) -> Model:
    """Model.from_file with a progress bar on a terminal's stderr when loading takes more than a moment, erased
    when the model is loaded; threads None: "auto"."""
    from minillama.model import AUTO, Model

    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            if not (getattr(sys.stderr, "isatty", None) and sys.stderr.isatty()):
                return
            from tqdm import tqdm

            bar = tqdm(total=total, desc=f"loading {os.path.basename(path)}", unit=" weights", unit_scale=True,
                       file=sys.stderr, delay=0.5, leave=False)
        bar.update(done - bar.n)  # not n= and refresh(): tqdm erases at close only a bar update() drew

    try:
        return Model.from_file(path, progress=progress, threads=AUTO if threads is None else threads)
    finally:
        if bar is not None:
            bar.close()


def cmd_generate(args: argparse.Namespace) -> int:
    """Stream a GGUF model's continuation of the prompt to stdout (minillama.model: the C core, or the pure-Python
    backend)."""
    from minillama.constrain import json_constraint
    from minillama.generate import Generation, perf_lines, prompt_ids
    from minillama.request import Request

    check_sampling_flags(args, no_limit=True)
    given = [what for what, value in (("PROMPT", args.prompt or None), ("-p", args.prompt_text), ("-f", args.file))
             if value is not None]
    if len(given) > 1:
        raise MinillamaError(f"expected one prompt (PROMPT, -p PROMPT or -f FILE), found {' and '.join(given)}")
    if args.prompt_text is not None:
        prompt = args.prompt_text
    elif args.prompt or args.file is not None:
        prompt = _read_text(args.prompt, args.file)
    else:
        raise MinillamaError("expected a prompt: PROMPT, -p PROMPT, -f FILE or '-' (standard input), found none")
    max_tokens = sys.maxsize if args.max_tokens in NO_LIMIT else args.max_tokens  # stops at a full context
    tok = _load_tokenizer(args.model)
    model = _load_model(args.model, args.threads)
    ids, _ = prompt_ids(tok, prompt)
    request = Request(ids, max_tokens, args.sampling, stop=args.stop or (), stop_at_eog=not args.ignore_eos,
                      constraint=json_constraint(tok, args.response_format))
    gen = Generation(model, tok, request)
    out = sys.stdout
    for chunk in gen:
        out.write(chunk)
        out.flush()
    if not gen.text.endswith("\n"):
        out.write("\n")  # end the line the continuation left open
    out.flush()
    st = gen.stats
    if args.verbose:  # llama.cpp's llama_perf_context_print lines: prompt processing and generation apart
        print("\n".join([*perf_lines(st), f"{st.prompt_tokens} prompt tokens, {st.generated_tokens} generated, "
                                          f"stopped by {st.stop_reason}, seed {st.seed}"]), file=sys.stderr)
    return 0


def _logit_bias(text: str) -> tuple[int, float]:
    """-l TOKEN_ID(+/-)BIAS as llama.cpp's common/arg.cpp reads it (15043+1, 15043-1, 15043-inf bans)."""
    m = re.fullmatch(r"\s*(\d+)\s*([+-])(.+)", text)
    try:
        if m is None:
            raise ValueError
        return int(m.group(1)), float(m.group(3)) * (-1.0 if m.group(2) == "-" else 1.0)
    except ValueError:
        raise MinillamaError(f"expected --logit-bias as TOKEN_ID(+/-)BIAS (e.g. 15043+1 or 15043-inf), found "
                             f"{text!r:.60}") from None


def _json_schema(text: str | None) -> dict[str, Any] | None:
    """--json-schema's text as the server's response_format (json_schema), or None without it."""
    if text is None:
        return None
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise MinillamaError(f"expected --json-schema as a JSON schema, found text that does not parse: {exc}") \
            from None
    return {"type": "json_schema", "json_schema": {"schema": schema}}


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The server's generation controls, with llama.cpp's llama-cli spellings (generate and chat)."""
    p.add_argument("--temperature", "--temp", dest="temperature", type=float, default=0.8, metavar="T",
                   help="0 is greedy (default: 0.8)")
    p.add_argument("--top-k", type=int, default=40, metavar="K", help="keep the K most likely (0: all; default: 40)")
    p.add_argument("--top-p", type=float, default=0.95, metavar="P",
                   help="keep the most likely up to probability P (1: all; default: 0.95)")
    p.add_argument("--min-p", type=float, default=0.0, metavar="P", help="keep those at least P times as likely as "
                   "the most likely (default: 0, off; llama.cpp's is 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, metavar="N",
                   help="penalize the ids of the last --repeat-last-n (1: off; default: 1.0)")
    p.add_argument("--repeat-last-n", type=int, default=64, metavar="N",
                   help="ids the penalties look back on, prompt included (0: off, -1: all; default: 64)")
    p.add_argument("--presence-penalty", type=float, default=0.0, metavar="N",
                   help="subtracted from a seen id's score (0: off; default: 0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, metavar="N",
                   help="subtracted per time an id was seen (0: off; default: 0)")
    p.add_argument("-l", "--logit-bias", action="append", metavar="TOKEN_ID(+/-)BIAS",
                   help="add BIAS to a token's score, e.g. 15043+1 or 15043-inf (never); repeatable")
    p.add_argument("-r", "--reverse-prompt", "--stop", dest="stop", action="append", metavar="TEXT",
                   help="end the text before TEXT (not shown); repeatable")
    p.add_argument("-j", "--json-schema", metavar="SCHEMA", help="constrain the output to JSON that SCHEMA (a JSON "
                   "schema; '{}': any JSON object) accepts, as the server's response_format does")
    p.add_argument("-s", "--seed", type=int, metavar="S", help="make the output repeat exactly (default or -1: random)")
    p.add_argument("-t", "--threads", type=int, metavar="N",
                   help="threads of the forward pass's matrix products, at most the cores (default: 1 or up to 4, "
                        "whichever runs faster now)")


def _architectures() -> list[str]:
    """The architectures minillama runs (the model registry, minillama.model.spec): imported only when the
    generate command's arguments are declared, since the model package costs numpy's import."""
    from minillama.model.spec import supported

    return supported()


def _setup_generate(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'generate' (-m, -p, -f, -n as llama.cpp's llama-cli and llama-completion take them)."""
    p.add_argument("--model", "-m", required=True, metavar="PATH",
                   help=f"GGUF model with weights ({', '.join(_architectures())})")
    p.add_argument("-p", "--prompt", dest="prompt_text", metavar="PROMPT",
                   help="the text to continue (instead of PROMPT words)")
    p.add_argument("-f", "--file", metavar="FILE", help="continue the contents of FILE (instead of PROMPT words)")
    p.add_argument("--max-tokens", "-n", "--predict", "--n-predict", dest="max_tokens", type=int, default=128,
                   metavar="N", help="most tokens to generate; -1 or -2: until an end-of-generation token or a full "
                   "context (default: 128)")
    _add_sampling_args(p)
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-generation tokens")
    p.add_argument("-v", "--verbose", action="store_true", help="print token counts and speed to stderr at the end")
    p.add_argument("prompt", nargs="*", metavar="PROMPT", help="text to continue, as is: no chat template ('-': "
                   "stdin); special tokens such as <|im_start|> are recognized")


def _chat_model(args: argparse.Namespace, tok: Tokenizer, fmt: ChatFormat) -> tuple[LanguageModel, str]:
    """The GGUF's own model when it has weights; else the n-gram of --ngram, or one trained now on the package's
    own text; with a line describing it."""
    import time

    from minillama.chat import train_chat_ngram
    from minillama.ngram import DEFAULT_ORDER, NGramModel, default_corpus_path

    if args.ngram is None and args.order is None and args.model is not None and _has_weights(args.model):
        start = time.perf_counter()
        model = _load_model(args.model, args.threads)
        where = "in C (minillama's native core" if model._native else "in Python with numpy (the pure backend"
        return model, (f"{model.hparams.arch} forward pass {where}; {model.hparams.n_layer} layers, "
                       f"{model.hparams.n_embd} wide), loaded in {time.perf_counter() - start:.1f} s")
    if args.ngram is not None:
        try:
            lm = NGramModel.load(args.ngram, tok)
        except MinillamaError:
            raise
        except ValueError as exc:  # a tokenizer of another vocab size
            raise MinillamaError(f"{args.ngram}: {exc}") from None
        return lm, f"{lm.order}-gram placeholder from {args.ngram} ({lm.n_tokens} training tokens)"
    start = time.perf_counter()
    lm = train_chat_ngram(tok, fmt, [default_corpus_path()], order=args.order or DEFAULT_ORDER)
    return lm, (f"{lm.order}-gram placeholder trained just now on the package's own text ({lm.n_tokens} tokens, "
                f"{time.perf_counter() - start:.2f} s); it writes text in the style of that text, nothing more")


def cmd_chat(args: argparse.Namespace) -> int:
    """Chat in the terminal with the GGUF's model (or an n-gram placeholder), each reply streamed token by token."""
    from minillama.chat import ChatSession, SimpleFormat, banner, format_for, main_loop
    from minillama.request import Request
    from minillama.tokenizer import default_vocab_path

    check_sampling_flags(args)
    _check_order(args.order)
    tok = _load_tokenizer(args.model)
    model_path = args.model if args.model is not None else f"the built-in vocab ({default_vocab_path()})"
    notes = []
    try:
        fmt = format_for(tok)
        lm, desc = _chat_model(args, tok, fmt)  # renders the template (training text) without --ngram
    except ChatTemplateError as exc:
        notes.append(f"{model_path}: {exc}; falling back to the simple format.")
        fmt = SimpleFormat()
        lm, desc = _chat_model(args, tok, fmt)
    settings = Request((), args.max_tokens, args.sampling, stop=args.stop or (), stop_at_eog=not args.ignore_eos)
    session = ChatSession(tok, lm, fmt, settings, system=args.system, response_format=args.response_format)
    return main_loop(session, "\n".join([*notes, banner(tok, desc, fmt, model_path)]))


def _setup_chat(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'chat'."""
    p.add_argument("--model", "-m", metavar="PATH", help="GGUF (or other tokenizer file) whose tokenizer and chat "
                   "template to use, and whose weights answer when it has them (default: built-in vocab)")
    p.add_argument("--ngram", metavar="PATH", help="n-gram model saved by 'minillama ngram train' (default: the "
                   "--model GGUF's own weights, or without weights an n-gram trained now on the package's own text)")
    p.add_argument("--order", type=int, metavar="N", help="order of the n-gram trained without --ngram (default: 4)")
    p.add_argument("--max-tokens", "-n", "--predict", "--n-predict", dest="max_tokens", type=int, default=256,
                   metavar="N", help="most tokens per reply (default: 256)")
    _add_sampling_args(p)
    p.add_argument("--system", "-sys", "--system-prompt", dest="system", metavar="TEXT",
                   help="a system message to start the conversation with")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-generation tokens "
                   "(nor, without a chat template, where the model starts the next turn)")


def cmd_ngram(args: argparse.Namespace) -> int:
    """Build an n-gram placeholder model from text files and save it ('ngram train')."""
    from minillama.fileio import refuse_input_as_output
    from minillama.ngram import DEFAULT_ORDER, NGramModel

    order = args.order if args.order is not None else DEFAULT_ORDER
    _check_order(order)
    refuse_input_as_output(args.out, [*args.files, args.model])
    tok = _load_tokenizer(args.model)
    if args.chat:
        from minillama.chat import format_for, train_chat_ngram

        lm = train_chat_ngram(tok, format_for(tok), args.files, order=order)
    else:
        lm = NGramModel.train_files(tok, args.files, order=order)
    out = args.out
    lm.save(out)
    docs = "conversations" if args.chat else "paragraphs"
    print(f"{out}: {lm.order}-gram over a vocab of {lm.n_vocab:,} tokens, {plural(lm.n_tokens, 'token')} in "
          f"{lm.n_sequences:,} {docs} from {plural(len(args.files), 'file')}, {os.path.getsize(out):,} bytes")
    return 0


def _setup_ngram(p: argparse.ArgumentParser) -> None:
    """Declare the actions of 'ngram' (train) and their arguments."""
    sub = p.add_subparsers(dest="ngram_command", metavar="ACTION", required=True)
    t = sub.add_parser("train", help="count the n-grams of text files and save the model",
                       description="Count the n-grams of UTF-8 text files (each paragraph a document) and save "
                       "the model as .npz for 'minillama chat --ngram'.")
    t.add_argument("--model", metavar="PATH", help="tokenizer file (default: built-in vocab)")
    t.add_argument("--order", type=int, metavar="N", help="n: predict from the last n-1 tokens (default: 4)")
    t.add_argument("--out", required=True, metavar="OUT", help="where to write the model (.npz)")
    t.add_argument("--chat", action="store_true", help="train on consecutive paragraphs rendered as user/assistant "
                   "turns with the model's chat format, as 'minillama chat' does without --ngram")
    t.add_argument("files", nargs="+", metavar="FILES", help="UTF-8 text files to train on")


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: its help line, how to declare its arguments, and what runs it."""

    help: str
    setup: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def cmd_bench(args: argparse.Namespace) -> int:
    """Measure encode/decode throughput, load time and memory of a model on a text file."""
    if args.repeat < 1:
        raise MinillamaError(f"expected --repeat of at least 1 (timed runs), found {args.repeat}")
    import json

    from minillama.bench import bench, format_table
    from minillama.ngram import default_corpus_path
    from minillama.tokenizer import default_vocab_path

    model = args.model if args.model is not None else default_vocab_path()
    path = args.file if args.file is not None else default_corpus_path()
    from minillama.fileio import read_text

    text = read_text(path)
    result = bench(model, text, os.path.basename(path), repeat=args.repeat)
    if args.json:
        print(json.dumps(result.as_dict(), indent=1))
    else:
        print(format_table([result]))
    return 0


def _setup_bench(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'bench'."""
    p.add_argument("--model", metavar="PATH", help="model or tokenizer file (default: built-in vocab)")
    p.add_argument("--repeat", type=int, default=5, metavar="N", help="timed repetitions; the best is reported (default 5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("file", nargs="?", metavar="FILE", help="UTF-8 text to encode (default: the package's corpus)")


def cmd_train(args: argparse.Namespace) -> int:
    """Train a BPE vocab on text files; write it as a GGUF (and a llama2.c tokenizer.bin) only when complete."""
    import time

    from minillama.fileio import all_or_nothing, input_path, refuse_input_as_output, refuse_same_outputs
    from minillama.tokenizer.train import min_vocab_size, train_bpe

    refuse_input_as_output(args.out, args.files)
    if args.llama2c is not None:
        refuse_input_as_output(args.llama2c, args.files)
    refuse_same_outputs({"--out": args.out, "--llama2c": args.llama2c})
    for f in args.files:
        if f != "-" and os.path.getsize(input_path(f, "text file")) == 0:
            warn(f"{f} is empty: it adds nothing to the training")
    if args.llama2c is not None and args.kind != "spm":
        raise MinillamaError("--llama2c needs --kind spm: llama2.c's tokenizer.bin holds scores, not merges")
    floor = min_vocab_size(args.kind, args.special)
    if args.vocab_size < floor:
        raise MinillamaError(f"expected --vocab-size of at least {floor} for --kind {args.kind} (its byte and special "
                             f"tokens), found {args.vocab_size}")
    if args.min_frequency < 1:
        raise MinillamaError(f"expected --min-frequency of at least 1 (a pair that occurs), found {args.min_frequency}")
    if not 0.0 < args.character_coverage <= 1.0:
        raise MinillamaError(f"expected --character-coverage in (0, 1], found {args.character_coverage}")
    if args.kind == "spm" and args.pre is not None:
        warn(f"--pre {args.pre} is not used by --kind spm (SentencePiece-style vocabs split on spaces only)")
    start = time.perf_counter()
    written = [args.out] + ([args.llama2c] if args.llama2c is not None else [])
    try:
        tv = train_bpe(args.files, args.vocab_size, kind=args.kind, pre=args.pre or "llama3",
                       special_tokens=args.special,
                       min_frequency=args.min_frequency, character_coverage=args.character_coverage,
                       progress=False if args.no_progress else None,
                       name=args.name or os.path.splitext(os.path.basename(args.out))[0])
        with all_or_nothing():  # both files or neither: a failure keeps the previous ones
            tv.write_gguf(args.out)
            if args.llama2c is not None:
                tv.write_llama2c(args.llama2c)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing written", file=sys.stderr)
        return 130
    if tv.n_vocab < args.vocab_size:
        warn(f"stopped at {tv.n_vocab:,} tokens, short of --vocab-size {args.vocab_size:,}: no pair left occurs "
             f"--min-frequency ({args.min_frequency}) times or more in this text")
    pre = f", pre {tv.pre}" if tv.kind == "bytelevel" else ""
    sizes = ", ".join(f"{path} ({os.path.getsize(path):,} bytes)" for path in written)
    print(f"{sizes}: {tv.kind} BPE vocab of {tv.n_vocab:,} tokens ({plural(len(tv.merges), 'merge')}"
          f"{pre}) from {plural(tv.n_words, 'distinct word')} in {plural(len(args.files), 'file')}, "
          f"{time.perf_counter() - start:.1f} s")
    return 0


def _setup_train(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'train'."""
    p.add_argument("--vocab-size", type=int, required=True, metavar="N",
                   help="tokens in the vocab, special and byte tokens included")
    p.add_argument("--kind", choices=("bytelevel", "spm"), default="bytelevel",
                   help="bytelevel: GPT-2 style (gguf model gpt2); spm: SentencePiece style with scores and byte "
                   "fallback (gguf model llama) (default: bytelevel)")
    p.add_argument("--pre", metavar="NAME",
                   help="llama.cpp pre-tokenizer of a bytelevel vocab, e.g. llama3, gpt-2, qwen2 (default: llama3)")
    p.add_argument("--special", action="append", metavar="TOKEN",
                   help="a special (control) token; repeat for more (default: <|endoftext|> for bytelevel; spm always "
                   "has <unk> <s> </s>)")
    p.add_argument("--min-frequency", type=int, default=2, metavar="N",
                   help="stop when the most frequent pair occurs fewer times (default: 2)")
    p.add_argument("--character-coverage", type=float, default=0.9995, metavar="F",
                   help="spm: share of the text its base characters cover; rarer ones become bytes (default: 0.9995)")
    p.add_argument("--out", required=True, metavar="OUT.gguf", help="where to write the vocab-only GGUF")
    p.add_argument("--llama2c", metavar="OUT.bin", help="spm: also write a llama2.c tokenizer.bin")
    p.add_argument("--name", help="general.name to write (default: OUT's file name)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")
    p.add_argument("files", nargs="+", metavar="FILES", help="UTF-8 text files, each a document ('-': stdin)")


def cmd_dataset(args: argparse.Namespace) -> int:
    """Tokenize files into sharded token files (DIR/shard-NNNNN.bin, DIR/index.json, DIR/doc_offsets.npy)."""
    import time

    from minillama import dataset

    start = time.perf_counter()
    try:
        index = dataset.prepare(args.model, args.out, args.files, workers=args.workers, engine=args.engine,
                                docs=args.docs, text_field=args.text_field, fmt=args.format,
                                max_doc_bytes=_max_doc_bytes(args.max_doc_mib),
                                separator=args.separator, add_special=not args.no_special,
                                parse_special=args.parse_special, shard_tokens=args.shard_tokens,
                                skip_bad=args.skip_bad, ray_address=args.ray_address,
                                progress=False if args.no_progress else None,
                                log=lambda line: print(f"{PROG}: {line}", file=sys.stderr))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; finished shards are kept, run the same command again to resume",
              file=sys.stderr)
        return 130
    bad = f", {index['bad_records']} bad records skipped" if index["bad_records"] else ""
    print(f"{args.out}: {index['tokens']:,} tokens ({index['dtype']}) in {len(index['shards'])} shards, "
          f"{index['docs']:,} documents{bad}, {time.perf_counter() - start:.1f} s")
    return 0


def _max_doc_bytes(mib: float | None) -> int:
    """--max-doc-mib as bytes (MiB x 1,048,576, rounded down), checked with the flag's name; dataset.prepare's
    default cap when not given."""
    import math

    from minillama.dataset.sources import DOC_BYTES_CEILING, MAX_DOC_BYTES

    if mib is None:
        return MAX_DOC_BYTES
    if not (math.isfinite(mib) and 1 <= mib * (1 << 20) <= DOC_BYTES_CEILING):
        raise MinillamaError(f"expected --max-doc-mib from 0.000001 (a byte) to {DOC_BYTES_CEILING >> 20:,} (1 TiB), "
                             f"found {mib:g}")
    return int(mib * (1 << 20))


def _setup_dataset(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'dataset'."""
    p.add_argument("--model", required=True, metavar="PATH", help="model or tokenizer file whose ids to write")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the shards and index.json")
    p.add_argument("--workers", type=int, metavar="N", help="processes (local) or tokenizer actors (ray) "
                   "(default: all cores; at most 4 per core, 1,024 with --ray-address)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: a process pool on this machine; ray: Ray Data on a cluster (pip install "
                   "\".[ray]\" in a checkout) (default: local)")
    p.add_argument("--docs", choices=("paragraph", "line", "file"), default="paragraph",
                   help="text files: one document per blank-line paragraph, line or file (default: paragraph)")
    p.add_argument("--text-field", default="text", metavar="F", help="JSONL field / Parquet column (default: text)")
    p.add_argument("--format", choices=("auto", "text", "jsonl", "parquet"), default="auto",
                   help="input format (default: by extension: .jsonl/.ndjson/.json, .parquet/.pq, else text)")
    p.add_argument("--separator", default="eos", metavar="SEP",
                   help="ids after each document: eos, bos, none or ids like 2 or 2,13 (default: eos, "
                   "not doubled when the model adds eos itself)")
    p.add_argument("--no-special", action="store_true", help="encode without the model's bos/eos")
    p.add_argument("--parse-special", action="store_true", help="match control tokens written in the text")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, metavar="N",
                   help="a shard ends after the document that brings it to N ids (default: 100,000,000)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip and count bad records (not UTF-8, missing field, null) instead of stopping")
    p.add_argument("--max-doc-mib", type=float, metavar="MIB",
                   help="a longer document (UTF-8) is a bad record: encoding one takes up to 25-40 times its size in "
                   "memory (default: 16)")
    p.add_argument("--ray-address", metavar="ADDR", help="engine ray: the cluster to join (e.g. auto or "
                   "ray://head:10001; default: start a local Ray)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")
    p.add_argument("files", nargs="+", metavar="FILES", help="text, JSONL or Parquet files, read in this order")


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the model over HTTP (OpenAI's /v1 endpoints, /tokenize, the token playground at /) until Ctrl-C."""
    from minillama.serve import serve

    serve(args.model, host=args.host, port=args.port, parallel=args.parallel, api_key=args.api_key,
          vocabs=args.vocab or (), timeout=args.timeout, header_timeout=args.header_timeout,
          allowed_hosts=_comma_list(args.allowed_hosts), cors_origins=_comma_list(args.cors_origins),
          embedding_max_inputs=args.embedding_max_inputs, embedding_max_tokens=args.embedding_max_tokens,
          cache_ram=args.cache_ram, verbose=args.verbose,
          reasoning_format=args.reasoning_format, chat_template_file=args.chat_template_file,
          n_ctx=args.ctx_size, threads="auto" if args.threads is None else args.threads, alias=args.alias,
          server_defaults=_server_defaults(args), pooling=args.pooling, metrics=args.metrics, slots=args.slots,
          slot_save_path=args.slot_save_path, ignored=[
              f"{flags}{'' if value is True else f' {value}'}: {why}" for dest, (flags, why) in SERVE_IGNORED.items()
              if (value := getattr(args, dest)) is not None and value is not False],
          reasoning_budget=args.reasoning_budget, reasoning_budget_message=args.reasoning_budget_message,
          reranking=args.reranking, context_shift=args.context_shift)
    return 0


#: llama-server flags people copy that mean nothing on this runtime: accepted, each logged as ignored.
#: dest -> (the flag's spellings, why); a flag with a value keeps it (nargs), a switch is True.
SERVE_IGNORED: dict[str, tuple[str, str]] = {
    "gpu_layers": ("-ngl/--gpu-layers", "minillama runs on the CPU"),
    "flash_attn": ("-fa/--flash-attn", "minillama's attention is its own (tiled from 64 rows, as llama.cpp's)"),
    "jinja": ("--jinja/--no-jinja", "chat templates always run in minillama's Jinja"),
    "batch_size": ("-b/--batch-size", "prompts run in minillama's own passes"),
    "ubatch_size": ("-ub/--ubatch-size", "prompts run in minillama's own passes"),
    "cache_type_k": ("-ctk/--cache-type-k", "the KV cache keeps the model's float type"),
    "cache_type_v": ("-ctv/--cache-type-v", "the KV cache keeps the model's float type"),
    "mmap": ("--mmap/--no-mmap", "the model file is always memory-mapped"),
}


def _server_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """--temp, --seed and -n as llama.cpp's request fields, the ones given; MinillamaError for a value out of range."""
    import math

    out: dict[str, Any] = {}
    if args.temp is not None:
        if not math.isfinite(args.temp):
            raise MinillamaError(f"expected --temp as a finite number (0 or less: greedy), found {args.temp}")
        out["temperature"] = args.temp
    if args.seed is not None:
        if not -1 <= args.seed < 2**32:
            raise MinillamaError(f"expected --seed from 0 to {2**32 - 1} (-1: random), found {args.seed}")
        out["seed"] = args.seed
    if args.n_predict is not None:
        if args.n_predict < -1:
            raise MinillamaError(f"expected -n/--n-predict of 0 or more (-1: until the context is full), found "
                                 f"{args.n_predict}")
        out["n_predict"] = args.n_predict
    return out


def _comma_list(values: list[str] | None) -> list[str]:
    """A repeatable option's values, each also split at commas."""
    return [part.strip() for value in values or () for part in value.split(",") if part.strip()]


def _setup_serve(p: argparse.ArgumentParser) -> None:
    """Declare the arguments of 'serve'."""
    from minillama.serve import (  # no Starlette import: only the names
        DEFAULT_CACHE_RAM_MIB,
        DEFAULT_HEADER_TIMEOUT,
        DEFAULT_HOST,
        DEFAULT_PORT,
        DEFAULT_TIMEOUT,
        EMBEDDING_MAX_INPUTS,
        EMBEDDING_MAX_TOKENS,
    )

    p.add_argument("--model", "-m", required=True, metavar="PATH", help="the GGUF model to serve")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default: {DEFAULT_HOST}, this "
                   "machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default: {DEFAULT_PORT}; 0 picks a "
                   "free one and prints it)")
    p.add_argument("--parallel", "-np", type=int, default=1, metavar="N", help="requests generated at once, each in its "
                   "own slot with its own KV cache; more wait their turn (default: 1)")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' (all but /, /health and "
                   "/v1/models)")
    p.add_argument("--reasoning-format", choices=("auto", "deepseek", "none"), default="auto",
                   help="where a thinking template's <think> goes: reasoning_content (auto, deepseek) or content "
                   "(none); a request's reasoning_format overrides it (default: auto)")
    p.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="tokens of thinking allowed before the end tag is forced: -1 unbounded, 0 none; a request's "
                   "reasoning_budget_tokens overrides it (default: -1)")
    p.add_argument("--reasoning-budget-message", default="", metavar="TEXT",
                   help="text forced before the end-of-thinking tag when the budget runs out (default: none)")
    p.add_argument("--chat-template-file", metavar="PATH", help="a Jinja chat template to chat with instead of the "
                   "model's (default: the GGUF's tokenizer.chat_template, else ChatML as llama-server)")
    p.add_argument("--vocab", action="append", metavar="PATH", help="another tokenizer file for the playground and "
                   "/tokenize to compare token counts with (repeatable)")
    p.add_argument("--allowed-hosts", action="append", metavar="NAMES", help="Host names the server answers to "
                   "besides localhost, IP addresses and --host (comma-separated, repeatable; * for any): other names "
                   "get 403, which stops DNS rebinding")
    p.add_argument("--cors-origins", action="append", metavar="ORIGINS", help="origins (e.g. http://app.example:3000) "
                   "whose pages may call the API from a browser (comma-separated, repeatable; * for any; default: "
                   "only the server's own pages); other Origin headers get 403")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS", help="most seconds to wait "
                   f"for a request's body, or for a client to take more of a reply (default: {DEFAULT_TIMEOUT:g})")
    p.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT, metavar="SECONDS",
                   help=f"most seconds a connection may take to send a request's headers (default: "
                   f"{DEFAULT_HEADER_TIMEOUT:g})")
    p.add_argument("--embedding-max-inputs", type=int, default=EMBEDDING_MAX_INPUTS, metavar="N",
                   help=f"most inputs per /v1/embeddings request (default: {EMBEDDING_MAX_INPUTS}, OpenAI's)")
    p.add_argument("--embedding-max-tokens", type=int, default=EMBEDDING_MAX_TOKENS, metavar="N",
                   help=f"most tokens over all inputs of a /v1/embeddings request (default: {EMBEDDING_MAX_TOKENS}, "
                   "OpenAI's)")
    p.add_argument("--cache-ram", "-cram", default=str(DEFAULT_CACHE_RAM_MIB), metavar="MiB",
                   help="host RAM for prompt prefixes evicted from the slots, which any slot restores when a prompt "
                   f"shares more with one (default: {DEFAULT_CACHE_RAM_MIB}, llama-server's; 0: off)")
    p.add_argument("-v", "--verbose", action="store_true", help="log one line per request: method, route, status, "
                   "prompt, cached and generated tokens, seconds")
    # llama-server's flags, by its names
    p.add_argument("-c", "--ctx-size", type=int, default=0, metavar="N",
                   help="the context each slot holds, in tokens, rounded up to a multiple of 256 as llama-server "
                   "rounds it (default: 0, the model's)")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="threads of the forward pass's matrix products "
                   "(default: 1 or up to 4, whichever runs faster now)")
    p.add_argument("-a", "--alias", metavar="NAME", help="the model's name in the API: /v1/models, 'model' in "
                   "replies (default: the file's name)")
    p.add_argument("-n", "--n-predict", "--predict", dest="n_predict", type=int, metavar="N",
                   help="tokens a request generates unless it says (default: -1, until the context is full or an "
                   "end of generation; OpenAI's /v1/completions: 16)")
    p.add_argument("--temp", "--temperature", dest="temp", type=float, metavar="T",
                   help="temperature unless a request says (default: 0.8; /v1/chat/completions: 1.0)")
    p.add_argument("-s", "--seed", type=int, metavar="S", help="seed unless a request says (default: -1, random)")
    p.add_argument("--embedding", "--embeddings", action="store_true",
                   help="accepted: embeddings are always on (/v1/embeddings, /embedding)")
    p.add_argument("--pooling", choices=("mean", "cls", "last", "rank"), help="how embeddings pool the tokens' "
                   "states; rank: a reranker's scores, as --reranking (default: the file's pooling_type, mean when "
                   "it has none)")
    p.add_argument("--reranking", "--rerank", dest="reranking", action="store_true",
                   help="answer POST /rerank (/reranking, /v1/rerank, /v1/reranking) with a reranker's relevance "
                   "scores (rank pooling; default: off, a 501)")
    p.add_argument("--metrics", action="store_true", help="answer GET /metrics (Prometheus text, llama-server's "
                   "names; default: off, a 501)")
    p.add_argument("--slots", action=argparse.BooleanOptionalAction, default=True,
                   help="answer GET /slots (default: on; --no-slots: a 501)")
    p.add_argument("--slot-save-path", metavar="DIR", help="the folder of POST /slots/ID?action=save|restore's "
                   "files (default: none, slot actions are a 501)")
    # llama-server's flags that mean nothing here: accepted, and the log says each is ignored
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", metavar="N",
                   help="ignored (no GPU)")
    p.add_argument("-fa", "--flash-attn", dest="flash_attn", nargs="?", const=True, metavar="on|off|auto",
                   help="ignored")
    p.add_argument("--jinja", "--no-jinja", dest="jinja", action="store_const", const=True, help="ignored "
                   "(templates always run as Jinja)")
    p.add_argument("-b", "--batch-size", dest="batch_size", metavar="N", help="ignored")
    p.add_argument("-ub", "--ubatch-size", dest="ubatch_size", metavar="N", help="ignored")
    p.add_argument("-ctk", "--cache-type-k", dest="cache_type_k", metavar="TYPE", help="ignored")
    p.add_argument("-ctv", "--cache-type-v", dest="cache_type_v", metavar="TYPE", help="ignored")
    p.add_argument("--mmap", "--no-mmap", dest="mmap", action="store_const", const=True, help="ignored")
    p.add_argument("--context-shift", action=argparse.BooleanOptionalAction, default=False,
                   help="when a generation fills the context, drop half the positions after a request's n_keep and "
                   "go on, as llama-server's --context-shift (default: off, the generation stops)")


COMMANDS: dict[str, Subcommand] = {
    "tokenize": Subcommand("tokenize text and show the pieces and ids", _setup_tokenize, cmd_tokenize),
    "decode": Subcommand("turn token ids back into text", _setup_decode, cmd_decode),
    "convert": Subcommand("write a tokenizer file as a vocab-only GGUF that llama.cpp opens", _setup_convert,
                          cmd_convert),
    "inspect": Subcommand("show a model or tokenizer file's metadata, tokenizer and tensors", _setup_inspect,
                          cmd_inspect),
    "chat": Subcommand("chat with a GGUF model (or an n-gram placeholder), replies streamed token by token", _setup_chat,
                       cmd_chat),
    "ngram": Subcommand("train and save an n-gram placeholder model", _setup_ngram, cmd_ngram),
    "generate": Subcommand("continue a prompt with a GGUF model (an architecture generate --help lists), streamed",
                           _setup_generate, cmd_generate),
    "bench": Subcommand("measure encode/decode speed, load time and memory on a text", _setup_bench, cmd_bench),
    "train": Subcommand("train a BPE vocab on text files and write it as a vocab-only GGUF", _setup_train,
                        cmd_train),
    "dataset": Subcommand("tokenize text/JSONL/Parquet files into sharded token files for training",
                          _setup_dataset, cmd_dataset),
    "serve": Subcommand("serve a GGUF model over an OpenAI-compatible HTTP API, with a token playground",
                        _setup_serve, cmd_serve),
}


# ---------------------------------------------------------------------------------------------
# Entry point


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser with one subparser per entry of COMMANDS; with only (a command's name), only that
    subparser gets its arguments (the others, never used to parse then, are named with their help alone: declaring
    every command's arguments is ~10 ms of each run)."""
    parser = argparse.ArgumentParser(prog=PROG, description="Tokenize text exactly as llama.cpp does.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        if only is None or name == only:
            command.setup(p)
    return parser


def _subparser(parser: argparse.ArgumentParser, names: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of a (nested) subcommand, e.g. ['ngram', 'train'], for its own usage line in errors."""
    for name in names:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or name not in actions[0].choices:
            break
        parser = actions[0].choices[name]
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, but an unknown command gets a 'did you mean' and an unknown flag the usage of its own
    subcommand (argparse reports both at the top level)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    if first is not None and first not in COMMANDS and argv and argv[0] == first:
        import difflib

        near = difflib.get_close_matches(first, list(COMMANDS), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else f" (one of {', '.join(COMMANDS)})"
        parser.error(f"expected a command, found '{first}'{hint}")
    args, extra = parser.parse_known_args(argv)
    if extra:
        names = [args.command] + ([args.ngram_command] if getattr(args, "ngram_command", None) else [])
        _subparser(parser, names).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def run() -> NoReturn:
    """The `minillama` program (the console script and python -m minillama): main()'s status as the exit status.

    The process ends here, so its objects need no cyclic collection on the way out: frozen (gc.freeze), they are
    skipped by the collections finalizing runs, which otherwise walk every object left (a loaded vocab, numpy,
    the modules) and cost ~0.1 s of each run (`minillama dataset` on 25 MB: 0.15 -> 0.04 s to exit)."""
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line tool and return its exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else "")  # "": --help/--version/an error
    try:
        args = _parse(parser, words)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        model = getattr(args, "model", None)
        if model is not None and os.path.isdir(model):  # a Hugging Face model directory: its tokenizer.json
            from minillama.tokenizer import model_file

            args.model = model_file(model)
        return COMMANDS[args.command].run(args)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly and keep Python from complaining at exit.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except (MinillamaError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
