/* Pre-tokenizers of several patterns, as llama.cpp's unicode_regex_split runs a pattern list: the first
 * pattern splits the text into its matches and the gaps between them; each later pattern splits every piece
 * the same way, as if the piece were the whole text. Written for the pattern lists of tables.py whose
 * patterns are a character class (matched on llama.cpp's collapsed text: ASCII as itself, any other code
 * point as its category), GPT-2's hand-written splitter (pretok.c), or ASCII digit triples:
 *   falcon:    [\p{P}\$\+<=>\^~\|`]+   then GPT-2   then [0-9][0-9][0-9]
 *   starcoder: \p{N}                   then GPT-2
 * Positions are byte offsets of UTF-8 text (code points read by utf8_next), as in pretok.c. Exactness against
 * the Python regexes is what tests/test_backend_parity.py checks. */
#include "core.h"

/* The category llama.cpp's collapsed text gives a non-ASCII code point: none for whitespace (\v there),
 * else its flags' category bits (a placeholder matches a \p{..} class only when they are exactly that class). */
static unsigned collapsed_category(const uint16_t *flags, uint32_t c) {
    unsigned f = c <= MAX_CODE_POINT ? flags[c] : 1u;
    return f & FLAG_WHITESPACE ? 0 : f & FLAG_CATEGORIES;
}

/* [\p{P}\$\+<=>\^~\|`] collapsed: every ASCII punctuation or symbol character, and non-ASCII punctuation. */
static int falcon_class(const uint16_t *flags, uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                         (c >= 0x7B && c <= 0x7E);
    return collapsed_category(flags, c) == FLAG_PUNCTUATION;
}

/* \p{N} collapsed: ASCII digits and non-ASCII numbers. */
static int number_class(const uint16_t *flags, uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return collapsed_category(flags, c) == FLAG_NUMBER;
}

static int ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

typedef struct {
    const uint8_t *s;
    const uint16_t *flags;
    int digit_triples; /* a third pattern, [0-9][0-9][0-9], splits each GPT-2 word */
    ivec *ends, words; /* words: one piece's GPT-2 word ends, reused */
} multi;

/* The word s[s..e) after the last pattern: its ends appended. Digits are single bytes and no byte of a longer
 * sequence is one, so the triples are looked for byte by byte. */
static int emit(multi *m, size_t s, size_t e) {
    if (m->digit_triples) {
        size_t pos = s, prev = s;
        while (pos + 3 <= e) {
            if (!(ascii_digit(m->s[pos]) && ascii_digit(m->s[pos + 1]) && ascii_digit(m->s[pos + 2]))) {
                pos++;
                continue;
            }
            if (pos > prev && !ivec_push(m->ends, (int32_t)pos)) return 0;
            pos += 3;
            if (!ivec_push(m->ends, (int32_t)pos)) return 0;
            prev = pos;
        }
        return prev < e ? ivec_push(m->ends, (int32_t)e) : 1;
    }
    return ivec_push(m->ends, (int32_t)e);
}

/* One piece of the first pattern, s[s..e), through GPT-2's splitter and then emit. */
static int piece(multi *m, size_t s, size_t e) {
    m->words.n = 0;
    if (!split_words(SPLIT_GPT2, m->s + s, e - s, m->flags, &m->words)) return 0;
    size_t prev = s;
    for (size_t i = 0; i < m->words.n; i++) {
        size_t end = s + (size_t)m->words.v[i];
        if (end <= prev || end > e || !emit(m, prev, end)) return 0;
        prev = end;
    }
    return prev == e;
}

int split_multi(int mode, const uint8_t *text, size_t n, const uint16_t *flags, ivec *ends) {
    if (n > INT32_MAX || (mode != SPLIT_FALCON && mode != SPLIT_STARCODER)) return 0;
    int (*cls)(const uint16_t *, uint32_t) = mode == SPLIT_FALCON ? falcon_class : number_class;
    int run = mode == SPLIT_FALCON; /* falcon's class is a run (+), starcoder's one code point */
    multi m = {text, flags, mode == SPLIT_FALCON, ends, {NULL, 0, 0, 1}};
    size_t pos = 0, gap = 0, len;
    int ok = 1;
    while (ok && pos < n) {
        if (!cls(flags, utf8_next(text + pos, n - pos, &len))) {
            pos += len;
            continue;
        }
        size_t end = pos + len;
        while (run && end < n && cls(flags, utf8_next(text + end, n - end, &len))) end += len;
        if (pos > gap) ok = piece(&m, gap, pos);
        ok = ok && piece(&m, pos, end);
        pos = gap = end;
    }
    if (ok && gap < n) ok = piece(&m, gap, n);
    ivec_free(&m.words);
    return ok && ends->ok;
}
