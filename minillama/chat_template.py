"""Chat templates: a conversation rendered to prompt text as Hugging Face transformers' apply_chat_template does.

The template is the Jinja2 source a GGUF carries in `tokenizer.chat_template`. It runs in Jinja2's immutable
sandbox with transformers' settings (trim_blocks, lstrip_blocks, the loopcontrols extension, its `tojson`
filter without HTML escaping, the `raise_exception` and `strftime_now` globals, a plain `dict` and a
`namespace` that refuses underscore names) and sees what transformers passes: `messages` (plain dicts),
`tools`, `documents`, `add_generation_prompt`, the special token texts (`bos_token`, `eos_token`,
`unk_token`, `pad_token` when the vocab has them) and any further keyword arguments.

A chat template comes from the file, so it is untrusted code. The sandbox stops escapes but not a
template that loops for hours or builds a string of 10 GB, and checks inside one process run only between
steps (one `join`, `~` or `%*s` can build gigabytes first). So, plainly:

* the template is compiled and rendered in a worker process (minillama.limited_worker, forked once and
  reused) that the parent kills when a compile or render takes longer than MAX_RENDER_SECONDS of wall
  clock, and whose address space may grow by at most MAX_RENDER_MEMORY per request (RLIMIT_AS; past it
  an allocation fails), with a CPU-time limit (RLIMIT_CPU) for when the parent is gone. These hold for
  every construct; a render costs about 0.1-0.3 ms more than in-process for it (a fork per render would
  cost 13-40 ms in a process holding a model), and a compiled template is kept in the worker;
* inside the worker, the cheap checks give the precise message when they see the problem first: loops
  over range(), calls, attribute and item look-ups and output chunks check the time budget; what can
  multiply sizes is checked before it runs (`*` on strings and lists, `**` on numbers, padding widths
  (center, ljust, rjust, zfill, expandtabs, indent, format widths), replace and join, tojson's indent);
  any string or list a call returns is checked after;
* the rendered text has a length cap (MAX_OUTPUT_CHARS, or 4x the conversation if larger);
* anything that goes wrong, including a compile error of Python's own compiler (25 nested loops), becomes
  a ChatTemplateError naming the problem (ChatTemplateRefused, also an ArgumentError, when the template's
  own raise_exception refused the conversation).

Where fork or resource limits do not exist (Windows) the template runs in this process with the cheap
checks only.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from . import limited_worker
from .errors import ArgumentError, ChatTemplateError, ChatTemplateRefused

#: template variable -> the Vocab special id it names (transformers' special_tokens_map)
SPECIAL_TOKEN_VARS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unk", "pad_token": "pad"}


#: Deepest nesting of lists and dicts a conversation (or a template variable) may have.
MAX_DEPTH = 64


def _plain(value: Any, depth: int = 0) -> Any:
    """value rebuilt from plain JSON types (transformers' _plain_template_data): nothing else reaches the sandbox.
    ArgumentError for a value nested deeper than MAX_DEPTH (a RecursionError otherwise, here or in the render)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if depth >= MAX_DEPTH and isinstance(value, Mapping | list | tuple):
        raise ArgumentError(f"expected the conversation and template variables nested at most {MAX_DEPTH} levels "
                            "deep (lists and dicts), found deeper")
    depth += 1
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, depth): _plain(v, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, depth) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v, depth) for v in value)
    np = sys.modules.get("numpy")  # not imported here: a process without numpy holds no numpy scalar
    if np is not None and isinstance(value, np.generic):  # numpy scalars: np.bool_(False) must stay falsy
        return _plain(value.item())
    return f"<{type(value).__name__}>"  # an inert placeholder: templates only test such values for presence


MAX_RENDER_SECONDS = 1.0
MAX_OUTPUT_CHARS = 1 << 22  # 4 Mi characters (or 4x the conversation's text, if that is more)
MAX_POWER_BITS = 4096  # a ** b may make a number of at most this many bits
MAX_JSON_INDENT = 64
MAX_RENDER_MEMORY = 256 << 20  # a render (or compile) may grow the worker's address space by this much
_WIDTH = re.compile(r"%[-+ #0]*(\d+)|\{[^{}]*:[^{}]*?(\d+)[^{}]*\}")  # %10s and {:>10} widths
_PADDING = {"center", "ljust", "rjust", "zfill"}

_limits = threading.local()  # this thread's render: deadline and size cap


def _check_time() -> None:
    deadline = getattr(_limits, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise ChatTemplateError(f"chat template took longer than {MAX_RENDER_SECONDS} s to render (a loop that "
                                "does not end?)")


def _cap() -> int:
    return getattr(_limits, "cap", MAX_OUTPUT_CHARS)


def _check_size(n: int | float, what: str) -> None:
    if n > _cap():
        raise ChatTemplateError(f"chat template builds {what} of {int(n):,} items, more than the {_cap():,} allowed")


def _check_value(value: Any, what: str) -> Any:
    if isinstance(value, (str, list, tuple, bytes)) and len(value) > _cap():
        _check_size(len(value), what)
    return value


class _Range(Sequence[int]):
    """range() for templates: the same sequence, but iterating it checks the time budget."""

    def __init__(self, *args: int) -> None:
        from jinja2.sandbox import MAX_RANGE

        self._r = range(*args)
        if len(self._r) > MAX_RANGE:
            raise ChatTemplateError(f"chat template asks for range() of {len(self._r):,} items, more than the "
                                    f"{MAX_RANGE:,} allowed")

    def __len__(self) -> int:
        return len(self._r)

    def __getitem__(self, i: Any) -> Any:
        return self._r[i]

    def __iter__(self) -> Iterator[int]:
        for i in self._r:
            _check_time()
            yield i


def _power_bits(base: Any, exp: Any) -> float:
    """About how many bits base ** exp takes (0 when it is small or not an integer power)."""
    if not isinstance(base, (int, float)) or not isinstance(exp, (int, float)) or exp <= 0:
        return 0.0
    size = abs(base)
    return 0.0 if size <= 1 else float(exp) * math.log2(size)


def _refused_class() -> type[Exception]:
    import jinja2

    class Refused(jinja2.exceptions.TemplateError):
        """The template's own raise_exception(): it refuses this conversation."""

    return Refused


_Refused = _refused_class()


def _raise_exception(message: str) -> None:
    """Let a template refuse a conversation (transformers' global `raise_exception`)."""
    raise _Refused(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' tojson filter: json.dumps without HTML escaping."""
    if isinstance(indent, int) and indent > MAX_JSON_INDENT:
        raise ChatTemplateError(f"chat template asks tojson for indent {indent}, more than {MAX_JSON_INDENT}")
    return _check_value(json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                   sort_keys=sort_keys), "a JSON text")


def _strftime_now(fmt: str) -> str:
    """Today's date for templates that print it (transformers' global `strftime_now`)."""
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """dict() for templates, without attribute access to the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _limited_sandbox_class() -> type:
    """ImmutableSandboxedEnvironment with every operation, call, attribute and item checked against the limits."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "%"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_time()
            if operator == "**" and _power_bits(left, right) > MAX_POWER_BITS:
                raise ChatTemplateError(f"chat template computes {left!r} ** {right!r}, a number of more than "
                                        f"{MAX_POWER_BITS} bits")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                        _check_size(len(seq) * n, "a repetition")
            if operator == "%" and isinstance(left, str):
                _check_widths(left)
            return _check_value(super().call_binop(context, operator, left, right), "a value")

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            _check_time()
            owner = getattr(__obj, "__self__", None)
            name = getattr(__obj, "__name__", "")
            if isinstance(owner, str):
                _check_str_method(owner, name, args, kwargs)
            return _check_value(super().call(__context, __obj, *args, **kwargs), f"a result of {name or 'a call'}")

        def getattr(self, obj: Any, attribute: str) -> Any:
            _check_time()
            return _check_value(super().getattr(obj, attribute), "a value")

        def getitem(self, obj: Any, argument: Any) -> Any:
            _check_time()
            return _check_value(super().getitem(obj, argument), "a value")

        def wrap_str_format(self, value: Any) -> Any:
            owner = getattr(value, "__self__", None)
            if isinstance(owner, str) and getattr(value, "__name__", "") in ("format", "format_map"):
                _check_widths(owner)
            return super().wrap_str_format(value)

    return LimitedSandbox


def _namespace_class() -> type:
    """namespace() that refuses underscore-prefixed names (no reaching CPython internals)."""
    import jinja2.exceptions
    import jinja2.utils

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set the attribute {name!r}")

    return TemplateNamespace


def _sandbox() -> Any:
    """transformers' environment (ImmutableSandboxedEnvironment, trim/lstrip blocks, loopcontrols,
    raise_exception, tojson, strftime_now) with the limits of the module doc."""
    import jinja2.ext

    env = _limited_sandbox_class()(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    for name in ("center", "indent", "wordwrap", "format"):
        env.filters[name] = _checked_filter(env.filters[name], name)
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, range=_Range,
                       dict=_TemplateDict(), namespace=_namespace_class())
    return env


def _check_widths(fmt: str) -> None:
    for m in _WIDTH.finditer(fmt):
        _check_size(int(m.group(1) or m.group(2)), "a formatted field")


def _check_str_method(s: str, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse a str method call whose result would pass the size cap, before it runs."""
    nums = [a for a in (*args, *kwargs.values()) if isinstance(a, int)]
    if name in _PADDING and nums:
        _check_size(max(nums), f"a padded string ({name})")
    elif name == "expandtabs" and nums:
        _check_size(len(s) * max(nums), "a string (expandtabs)")
    elif name == "replace" and len(args) >= 2 and isinstance(args[1], str):
        _check_size(len(s) + (len(s) + 1) * len(args[1]), "a string (replace)")
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        _check_size(len(s) * len(args[0]) + sum(len(x) for x in args[0] if isinstance(x, str)), "a string (join)")


def _checked_filter(f: Any, name: str) -> Any:
    """A Jinja2 filter whose width/format arguments are checked against the size cap first."""
    import functools

    @functools.wraps(f)
    def checked(*args: Any, **kwargs: Any) -> Any:
        _check_time()
        nums = [a for a in (*args[1:], *kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)]
        if nums:
            _check_size(max(nums), f"a {name} width")
        if name == "format" and args and isinstance(args[0], str):
            _check_widths(args[0])
        return _check_value(f(*args, **kwargs), f"a {name} result")

    return checked


def _compile(source: str) -> Any:
    """source compiled in the limited sandbox; any failure (Jinja2's, or Python's compiler refusing 25 nested
    loops) is a ChatTemplateError."""
    try:
        return _sandbox().from_string(source)
    except MemoryError:
        raise ChatTemplateError(f"the chat template needs more than {MAX_RENDER_MEMORY >> 20} MiB of memory "
                                "to compile") from None
    except Exception as exc:  # noqa: BLE001 - untrusted code: every failure is the template's
        raise ChatTemplateError(f"the chat template does not compile: {type(exc).__name__}: {exc}") from None


def _render_here(template: Any, variables: dict[str, Any], cap: int) -> str:
    """template rendered in this process with the in-process checks of the module doc."""
    _limits.deadline, _limits.cap = time.monotonic() + MAX_RENDER_SECONDS, cap
    try:
        out: list[str] = []
        total = 0
        for chunk in template.generate(**variables):
            total += len(chunk)
            if total > cap:
                raise ChatTemplateError(f"chat template output passed {cap:,} characters")
            _check_time()
            out.append(chunk)
        return "".join(out)
    except ChatTemplateError:
        raise
    except _Refused as exc:
        raise ChatTemplateRefused(f"the chat template refused the conversation: {exc}") from None
    except RecursionError:
        raise ChatTemplateError("chat template recursed too deeply") from None
    except MemoryError:
        raise ChatTemplateError(f"chat template needs more than the {MAX_RENDER_MEMORY >> 20} MiB of memory a "
                                "render may use") from None
    except Exception as exc:  # noqa: BLE001 - untrusted code: every failure is the template's
        raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from None
    finally:
        _limits.deadline = None


# -- the render worker: compiles and renders in a limited process (see limited_worker) ------------------------

_compiled: OrderedDict[str, Any] = OrderedDict()  # in the worker: source -> compiled template, newest last
_COMPILED_KEEP = 64
_KINDS = {"error": ChatTemplateError, "refused": ChatTemplateRefused}
_worker: limited_worker.LimitedWorker | None = None
_worker_lock = threading.Lock()


def _serve(request: tuple[str, str, dict[str, Any], int]) -> tuple[str, str]:
    """The worker's handler: ("compile", source, ...) or ("render", source, variables, cap) -> (kind, text)."""
    op, source, variables, cap = request
    try:
        template = _compiled.pop(source, None)
        if template is None:
            if op == "render":  # a new worker: the parent compiles first, under its own time budget
                return "compile", ""
            template = _compile(source)
        _compiled[source] = template
        while len(_compiled) > _COMPILED_KEEP:
            _compiled.popitem(last=False)
        return ("ok", "") if op == "compile" else ("ok", _render_here(template, variables, cap))
    except ChatTemplateRefused as exc:
        return "refused", str(exc)
    except ChatTemplateError as exc:
        return "error", str(exc)


def _in_worker(op: str, source: str, variables: dict[str, Any], cap: int) -> str:
    """_serve's answer from the worker process, or the ChatTemplateError that says why there is none."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _sandbox()  # import Jinja2 before forking: the worker needs nothing it has to import
            _worker = limited_worker.LimitedWorker(_serve, MAX_RENDER_MEMORY)
    doing = "to compile" if op == "compile" else "to render"
    kind, text = _worker.call((op, source, variables, cap), MAX_RENDER_SECONDS, 4 * cap + 4096)
    if kind == "compile":  # a new worker, which has not compiled this template yet
        _in_worker("compile", source, {}, cap)
        kind, text = _worker.call((op, source, variables, cap), MAX_RENDER_SECONDS, 4 * cap + 4096)
    if kind == "ok":
        return text
    if kind == limited_worker.TIMEOUT:
        raise ChatTemplateError(f"chat template took longer than {MAX_RENDER_SECONDS} s {doing} (a loop that "
                                "does not end?)")
    if kind == limited_worker.DIED:
        raise ChatTemplateError(f"the chat template's render process ended ({text}) {doing} it; a compile or "
                                f"render may use {MAX_RENDER_SECONDS} s and {MAX_RENDER_MEMORY >> 20} MiB")
    raise _KINDS.get(kind, ChatTemplateError)(text)


class ChatTemplate:
    """A Jinja2 chat template rendered exactly as transformers does (sandboxed, trim/lstrip blocks), in a
    worker process with time and memory limits."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 special_tokens: Mapping[str, str] | None = None, add_bos: bool = False) -> None:
        """source compiled now (ChatTemplateError if it does not); the special-token texts are template
        variables; add_bos says whether encoding the rendered text adds bos itself (see without_bos)."""
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.special_tokens = {"bos_token": bos_token, "eos_token": eos_token, **(special_tokens or {})}
        self._template = None  # compiled here only where no worker process can run (no fork)
        if limited_worker.available():
            _in_worker("compile", source, {}, MAX_OUTPUT_CHARS)
        else:
            self._template = _compile(source)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Any] | None = None, documents: Sequence[Any] | None = None, **kwargs: Any) -> str:
        """messages=[{role, content, ...}] as apply_chat_template(tokenize=False) renders them, under the limits
        of the module doc (ChatTemplateError when the template fails or passes one)."""
        variables = {**self.special_tokens, **_plain(kwargs), "messages": _plain(list(messages)),
                     "tools": _plain(tools), "documents": _plain(documents),
                     "add_generation_prompt": add_generation_prompt}
        size = len(json.dumps([variables["messages"], variables["tools"], variables["documents"]], default=str))
        cap = max(MAX_OUTPUT_CHARS, 4 * size)
        if self._template is not None:
            return _render_here(self._template, variables, cap)
        return _in_worker("render", self.source, variables, cap)


def without_bos(text: str, bos_token: str, add_bos: bool) -> str:
    """Rendered text without a leading bos text when encoding adds bos itself (never two bos)."""
    if bos_token and add_bos and text.startswith(bos_token):
        return text[len(bos_token):]
    return text
