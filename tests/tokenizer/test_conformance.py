"""minillama against llama.cpp on the shared conformance set (600 texts per vocab).

Expected values are llama.cpp's own (shared/conformance/<vocab>.jsonl, written by shared/tools/make_expected.py);
the oracle-backed tests at the bottom ask llama.cpp directly and skip when it is not installed.
"""

from __future__ import annotations

import pytest
from support.oracle import get_oracle
from support.paths import load, params_or_skip, release_tokenizers, vocab_path
from support.reference import conformance_vocabs, read_conformance
from support.report import fail_if_any

VOCABS = conformance_vocabs()  # every model type is implemented: no vocab is left out

#: How many mismatches to show in a failure message.
SHOW = 5


def _fail_report(vocab: str, what: str, bad: list[tuple], total: int) -> str:
    lines = [f"{vocab}: {what}: {len(bad)} of {total} cases differ from llama.cpp; first {min(SHOW, len(bad))}:"]
    for i, text, got, want in bad[:SHOW]:
        lines.append(f"  case {i}: text={text[:120]!r}{'...' if len(text) > 120 else ''}")
        lines.append(f"    got  {got}")
        lines.append(f"    want {want}")
    return "\n".join(lines)


def _first_diff(a, b) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _window(seq, at: int, width: int = 8):
    """A readable slice of a long id list around the first difference."""
    lo = max(0, at - 2)
    return f"[{'..., ' if lo else ''}{', '.join(map(str, seq[lo:lo + width]))}{', ...' if lo + width < len(seq) else ''}]" \
        f" (len {len(seq)}, first diff at {at})"


def _compare_ids(vocab: str, what: str, pairs) -> None:
    bad = []
    n = 0
    for i, text, got, want in pairs:
        n += 1
        if got != want:
            at = _first_diff(got, want)
            bad.append((i, text, _window(got, at), _window(want, at)))
    fail_if_any(bad, _fail_report(vocab, what, bad, n))


@pytest.fixture(scope="module", params=params_or_skip(VOCABS, "conformance/*.jsonl"))
def vocab(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def rows(vocab):
    rows = read_conformance(vocab)
    assert rows, f"{vocab}.jsonl is empty"
    return rows


@pytest.fixture(scope="module")
def tok(vocab):
    # pytest groups the tests by vocab (module-scoped parameter): each vocab is loaded once, then released
    yield load(vocab)
    release_tokenizers()


@pytest.mark.conformance_set
def test_encode_plain(vocab, rows, tok):
    """encode(text, add_special=False, parse_special=False) == llama_tokenize(text, False, False)."""
    _compare_ids(vocab, "encode(add_special=False, parse_special=False)",
                 ((i, r["text"], tok.encode(r["text"], False, False), r["ids"]) for i, r in enumerate(rows)))


@pytest.mark.conformance_set
def test_encode_special(vocab, rows, tok):
    """encode(text, add_special=True, parse_special=True) == llama_tokenize(text, True, True)."""
    _compare_ids(vocab, "encode(add_special=True, parse_special=True)",
                 ((i, r["text"], tok.encode(r["text"], True, True), r["ids_special"]) for i, r in enumerate(rows)))


def test_decode(vocab, rows, tok):
    """decode_bytes(ids) == llama_detokenize(ids, False, False), and decode() is its UTF-8 text (errors='replace')."""
    bad = []
    for i, r in enumerate(rows):
        want = bytes.fromhex(r["detok_hex"])
        got = tok.decode_bytes(r["ids"])
        if got != want:
            bad.append((i, r["text"], got, want))
            continue
        got_s = tok.decode(r["ids"])
        want_s = want.decode("utf-8", errors="replace")
        if got_s != want_s:
            bad.append((i, r["text"], f"decode() -> {got_s!r}", f"{want_s!r}"))
    fail_if_any(bad, _fail_report(vocab, "decode_bytes(ids) / decode(ids)", bad, len(rows)))


@pytest.mark.conformance_set
def test_diverse(vocab, tok):
    """The same three checks on shared/conformance-diverse (1,500 paragraphs of code, C headers, docs and man pages
    in 18 languages): the text the speed work (word caches, provable cuts) is tuned on."""
    rows = read_conformance(vocab, "conformance-diverse")
    _compare_ids(vocab, "diverse encode(add_special=False, parse_special=False)",
                 ((i, r["text"], tok.encode(r["text"], False, False), r["ids"]) for i, r in enumerate(rows)))
    _compare_ids(vocab, "diverse encode(add_special=True, parse_special=True)",
                 ((i, r["text"], tok.encode(r["text"], True, True), r["ids_special"]) for i, r in enumerate(rows)))
    bad = [(i, r["text"], "", "") for i, r in enumerate(rows) if tok.decode_bytes(r["ids"]) != bytes.fromhex(r["detok_hex"])]
    fail_if_any(bad, _fail_report(vocab, "diverse decode_bytes(ids)", bad, len(rows)))


# ---------------------------------------------------------------------------------------------------------------------
# llama.cpp itself (skip without xllamacpp/cffi)
# ---------------------------------------------------------------------------------------------------------------------

def test_metadata_matches_llamacpp(vocab, tok):
    """n_vocab, model type, bos/eos/eot ids and is_eog() for every id, as llama.cpp reports them."""
    o = get_oracle(vocab_path(vocab))
    assert tok.n_vocab == o.n_vocab
    assert tok.kind == o.model
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (o.bos_id, o.eos_id, o.eot_id)
    got = [i for i in range(o.n_vocab) if tok.is_eog(i)]
    want = [i for i in range(o.n_vocab) if o.is_eog(i)]
    assert got == want, "end-of-generation token ids differ"


def test_token_to_piece_matches_llamacpp(vocab, tok):
    """token_to_piece(id, special) == llama_token_to_piece(id, lstrip=0, special) for every id, both specials."""
    o = get_oracle(vocab_path(vocab))
    bad = []
    for special in (True, False):
        for i in range(o.n_vocab):
            got = tok.token_to_piece(i, special=special)
            want = o.piece(i, special)
            if got != want:
                bad.append((i, special, got, want))
    fail_if_any(bad, f"{vocab}: {len(bad)} pieces differ (id, special, got, want): {bad[:SHOW]}")


@pytest.mark.parametrize("remove_special,unparse_special", [(False, True), (True, False), (True, True)])
def test_decode_flags_match_llamacpp(vocab, rows, tok, remove_special, unparse_special):
    """decode_bytes(ids_special, remove_special, unparse_special) == llama_detokenize with the same flags."""
    o = get_oracle(vocab_path(vocab))
    bad = []
    for i, r in enumerate(rows):
        ids = r["ids_special"]
        got = tok.decode_bytes(ids, remove_special=remove_special, unparse_special=unparse_special)
        want = o.detokenize(ids, remove_special, unparse_special)
        if got != want:
            bad.append((i, r["text"], got[:200], want[:200]))
    fail_if_any(bad, _fail_report(
        vocab, f"decode_bytes(remove_special={remove_special}, unparse_special={unparse_special})", bad, len(rows)))
