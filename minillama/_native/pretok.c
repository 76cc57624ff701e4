/* llama.cpp's hand-written pre-tokenizers (unicode_regex_split_custom_gpt2 and _llama3), written anew in C
 * over the code points of UTF-8 text, read in place (utf8_next; ASCII directly): each appends the end of
 * every word, a byte offset, to ends. They read one table, llama.cpp's flags of each code point, which Python
 * builds from unicode_data and hands over once. A position below is a byte offset at the start of a code
 * point; llama.cpp's pos + 1 is the next code point's. */
#include "core.h"

typedef struct {
    const uint8_t *s;
    const uint16_t *flags;
    size_t end;
} text_t;

#define OUT_OF_RANGE 0xFFFFFFFFu

/* The code point at pos and its length in *len; OUT_OF_RANGE (length 0) past the end. */
static inline uint32_t cpt(const text_t *t, size_t pos, size_t *len) {
    if (pos >= t->end) {
        *len = 0;
        return OUT_OF_RANGE;
    }
    return utf8_next(t->s + pos, t->end - pos, len);
}

/* The flags of c: 0 past the end, UNDEFINED (1) for a value past U+10FFFF. */
static inline unsigned flags_of(const text_t *t, uint32_t c) {
    return c <= MAX_CODE_POINT ? t->flags[c] : c == OUT_OF_RANGE ? 0u : 1u;
}

static inline unsigned flg(const text_t *t, size_t pos) {
    if (pos < t->end && t->s[pos] < 0x80) return t->flags[t->s[pos]];
    size_t len;
    return flags_of(t, cpt(t, pos, &len));
}

/* The position after the run of code points from pos whose flags f have (f & any) and not (f & none). */
static inline size_t skip_run(const text_t *t, size_t pos, unsigned any, unsigned none) {
    const uint8_t *s = t->s;
    for (;;) {
        while (pos < t->end && s[pos] < 0x80) { /* ASCII: a byte, a code point */
            unsigned f = t->flags[s[pos]];
            if (!(f & any) || (f & none)) return pos;
            pos++;
        }
        size_t len;
        unsigned f = flags_of(t, cpt(t, pos, &len));
        if (!(f & any) || (f & none)) return pos;
        pos += len;
    }
}

static uint32_t lower_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's 't 'm 'd (2 bytes) or 're 've 'll (3) at pos, else 0; fold: case-insensitive (LLaMA 3). The letters are
 * ASCII, one byte each, and no byte of a longer sequence equals one. */
static size_t contraction(const text_t *t, size_t pos, int fold) {
    const uint8_t *s = t->s;
    if (s[pos] != '\'' || pos + 1 >= t->end) return 0;
    uint32_t a = s[pos + 1];
    if (fold) a = lower_ascii(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= t->end) return 0;
    uint32_t b = s[pos + 2];
    if (fold) b = lower_ascii(b);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* The whitespace run at pos: its end, its code point count, the start of its last code point and the
 * position after its last \r or \n (0: none). */
typedef struct {
    size_t end, count, last, after_rn;
} ws_run;

static inline ws_run whitespace(const text_t *t, size_t pos) {
    ws_run w = {pos, 0, pos, 0};
    for (;;) {
        size_t len;
        uint32_t c = cpt(t, w.end, &len);
        if (!(flags_of(t, c) & FLAG_WHITESPACE)) return w;
        if (c == '\r' || c == '\n') w.after_rn = w.end + 1;
        w.last = w.end;
        w.end += len;
        w.count++;
    }
}

/* The commonest words, seen first with ASCII read directly: an ASCII letter, or a space and an ASCII letter, at
 * pos (pos < end) start a word that runs on over letters, from the position returned (0: not such a word). Both
 * splitters' rules make that of them: no contraction starts so, and their letter rule takes them. */
static inline size_t ascii_word(const text_t *t, size_t pos) {
    const uint8_t *s = t->s;
    uint8_t c = s[pos];
    if (c >= 0x80) return 0;
    if (t->flags[c] & FLAG_LETTER) return pos + 1;
    if (c == ' ' && pos + 1 < t->end && s[pos + 1] < 0x80 && (t->flags[s[pos + 1]] & FLAG_LETTER)) return pos + 2;
    return 0;
}

#define ADD(e) do { if ((e) > prev) { if (!ivec_push(ends, (int32_t)(e))) return 0; prev = (e); } } while (0)
#define WLN (FLAG_WHITESPACE | FLAG_LETTER | FLAG_NUMBER)

static int split_gpt2(const text_t *t, ivec *ends) {
    size_t pos = 0, prev = 0, n = t->end, len;
    while (pos < n) {
        size_t word = ascii_word(t, pos); /* ' ?\p{L}+' takes these */
        if (word) {
            pos = skip_run(t, word, FLAG_LETTER, 0);
            ADD(pos);
            continue;
        }
        uint32_t c = cpt(t, pos, &len);
        unsigned f = flags_of(t, c);
        size_t k = contraction(t, pos, 0);
        if (k) {
            pos += k;
            ADD(pos);
            continue;
        }
        unsigned f2 = c == ' ' ? flg(t, pos + 1) : f;
        size_t from = c == ' ' ? pos + 1 : pos;
        if (f2 & FLAG_LETTER) {
            pos = skip_run(t, from, FLAG_LETTER, 0);
            ADD(pos);
            continue;
        }
        if (f2 & FLAG_NUMBER) {
            pos = skip_run(t, from, FLAG_NUMBER, 0);
            ADD(pos);
            continue;
        }
        if (!(f2 & WLN) && f2) {
            pos = skip_run(t, from, ~0u, WLN);
            ADD(pos);
            continue;
        }
        ws_run w = whitespace(t, pos);
        if (w.count > 1 && w.end < n) {
            pos = w.last;
            ADD(pos);
            continue;
        }
        pos = w.count ? w.end : pos + len;
        ADD(pos);
    }
    return 1;
}

static int split_llama3(const text_t *t, ivec *ends) {
    size_t pos = 0, prev = 0, n = t->end, len;
    while (pos < n) {
        size_t from = ascii_word(t, pos); /* [^\r\n\p{L}\p{N}]?\p{L}+ takes these */
        if (from) {
            pos = skip_run(t, from, FLAG_LETTER, 0);
            ADD(pos);
            continue;
        }
        uint32_t c = cpt(t, pos, &len);
        unsigned f = flags_of(t, c);
        size_t k = contraction(t, pos, 1);
        if (k) {
            pos += k;
            ADD(pos);
            continue;
        }
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (!(c == '\r' || c == '\n' || (f & FLAG_NUMBER)) && ((f & FLAG_LETTER) || (flg(t, pos + len) & FLAG_LETTER))) {
            pos = skip_run(t, pos + len, FLAG_LETTER, 0);
            ADD(pos);
            continue;
        }
        /* \p{N}{1,3} */
        if (f & FLAG_NUMBER) {
            size_t run = 0;
            while (pos < n && (flags_of(t, c = cpt(t, pos, &len)) & FLAG_NUMBER)) {
                pos += len;
                if (++run >= 3) {
                    ADD(pos);
                    run = 0;
                }
            }
            ADD(pos);
            continue;
        }
        /* <space>?[^\s\p{L}\p{N}]+[\r\n]* */
        unsigned f2 = c == ' ' ? flg(t, pos + 1) : f;
        if (!(f2 & WLN) && f) {
            pos = skip_run(t, c == ' ' ? pos + 1 : pos, ~0u, WLN);
            while (pos < n && (t->s[pos] == '\r' || t->s[pos] == '\n')) pos++;
            ADD(pos);
            continue;
        }
        ws_run w = whitespace(t, pos);
        if (w.after_rn > 0) { /* \s*[\r\n]+ */
            pos = w.after_rn;
            ADD(pos);
            continue;
        }
        if (w.count > 1 && w.end < n) { /* \s+(?!\S) */
            pos = w.last;
            ADD(pos);
            continue;
        }
        pos = w.count ? w.end : pos + len; /* \s+, or no match: one code point */
        ADD(pos);
    }
    return 1;
}

int split_words(int mode, const uint8_t *text, size_t n, const uint16_t *flags, ivec *ends) {
    if (n > INT32_MAX) return 0;
    text_t t = {text, flags, n};
    return mode == SPLIT_GPT2 ? split_gpt2(&t, ends) : mode == SPLIT_LLAMA3 ? split_llama3(&t, ends) : 0;
}
