/* llama.cpp's hand-written pre-tokenizers (unicode_regex_split_custom_gpt2 and _llama3), written anew in C
 * over code points: each appends the end of every word to ends. They read one table, llama.cpp's flags of
 * each code point, which Python builds from unicode_data and hands over once. */
#include "core.h"

typedef struct {
    const uint32_t *cps;
    const uint16_t *flags;
    size_t end;
} text_t;

#define OUT_OF_RANGE 0xFFFFFFFFu

static uint32_t cpt(const text_t *t, size_t pos) { return pos < t->end ? t->cps[pos] : OUT_OF_RANGE; }

/* The flags at pos: 0 past the end, UNDEFINED (1) for a value past U+10FFFF. */
static unsigned flg(const text_t *t, size_t pos) {
    if (pos >= t->end) return 0;
    uint32_t c = t->cps[pos];
    return c <= MAX_CODE_POINT ? t->flags[c] : 1u;
}

static uint32_t lower_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's 't 'm 'd (2) or 're 've 'll (3) at pos, else 0; fold: case-insensitive (LLaMA 3). */
static size_t contraction(const text_t *t, size_t pos, int fold) {
    if (cpt(t, pos) != '\'' || pos + 1 >= t->end) return 0;
    uint32_t a = cpt(t, pos + 1);
    if (fold) a = lower_ascii(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= t->end) return 0;
    uint32_t b = cpt(t, pos + 2);
    if (fold) b = lower_ascii(b);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

#define ADD(e) do { if ((e) > prev) { if (!ivec_push(ends, (int32_t)(e))) return 0; prev = (e); } } while (0)

static int split_gpt2(const text_t *t, ivec *ends) {
    size_t pos = 0, prev = 0, n = t->end;
    while (pos < n) {
        uint32_t c = cpt(t, pos);
        unsigned f = flg(t, pos);
        size_t k = contraction(t, pos, 0);
        if (k) {
            pos += k;
            ADD(pos);
            continue;
        }
        unsigned f2 = c == ' ' ? flg(t, pos + 1) : f;
        if (f2 & FLAG_LETTER) {
            pos += c == ' ';
            while (f2 & FLAG_LETTER) f2 = flg(t, ++pos);
            ADD(pos);
            continue;
        }
        if (f2 & FLAG_NUMBER) {
            pos += c == ' ';
            while (f2 & FLAG_NUMBER) f2 = flg(t, ++pos);
            ADD(pos);
            continue;
        }
        if (!(f2 & (FLAG_WHITESPACE | FLAG_LETTER | FLAG_NUMBER)) && f2) {
            pos += c == ' ';
            while (!(f2 & (FLAG_WHITESPACE | FLAG_LETTER | FLAG_NUMBER)) && f2) f2 = flg(t, ++pos);
            ADD(pos);
            continue;
        }
        size_t ws = 0;
        while (flg(t, pos + ws) & FLAG_WHITESPACE) ws++;
        if (ws > 1 && cpt(t, pos + ws) != OUT_OF_RANGE) {
            pos += ws - 1;
            ADD(pos);
            continue;
        }
        pos += ws ? ws : 1;
        ADD(pos);
    }
    return 1;
}

static int split_llama3(const text_t *t, ivec *ends) {
    size_t pos = 0, prev = 0, n = t->end;
    while (pos < n) {
        uint32_t c = cpt(t, pos);
        unsigned f = flg(t, pos);
        size_t k = contraction(t, pos, 1);
        if (k) {
            pos += k;
            ADD(pos);
            continue;
        }
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (!(c == '\r' || c == '\n' || (f & FLAG_NUMBER)) && ((f & FLAG_LETTER) || (flg(t, pos + 1) & FLAG_LETTER))) {
            pos++;
            while (flg(t, pos) & FLAG_LETTER) pos++;
            ADD(pos);
            continue;
        }
        /* \p{N}{1,3} */
        if (f & FLAG_NUMBER) {
            size_t ini = pos;
            while (flg(t, pos) & FLAG_NUMBER) {
                if (++pos - ini >= 3) {
                    ADD(pos);
                    ini = pos;
                }
            }
            ADD(pos);
            continue;
        }
        /* <space>?[^\s\p{L}\p{N}]+[\r\n]* */
        unsigned f2 = c == ' ' ? flg(t, pos + 1) : f;
        if (!(f2 & (FLAG_WHITESPACE | FLAG_LETTER | FLAG_NUMBER)) && f) {
            pos += c == ' ';
            while (!(f2 & (FLAG_WHITESPACE | FLAG_LETTER | FLAG_NUMBER)) && f2) f2 = flg(t, ++pos);
            uint32_t c2 = cpt(t, pos);
            while (c2 == '\r' || c2 == '\n') c2 = cpt(t, ++pos);
            ADD(pos);
            continue;
        }
        size_t ws = 0, last_rn = 0;
        while (flg(t, pos + ws) & FLAG_WHITESPACE) {
            uint32_t c2 = cpt(t, pos + ws);
            if (c2 == '\r' || c2 == '\n') last_rn = pos + ws + 1;
            ws++;
        }
        if (last_rn > 0) { /* \s*[\r\n]+ */
            pos = last_rn;
            ADD(pos);
            continue;
        }
        if (ws > 1 && cpt(t, pos + ws) != OUT_OF_RANGE) { /* \s+(?!\S) */
            pos += ws - 1;
            ADD(pos);
            continue;
        }
        pos += ws ? ws : 1; /* \s+, or no match: one code point */
        ADD(pos);
    }
    return 1;
}

int split_words(int mode, const uint32_t *cps, size_t n, const uint16_t *flags, ivec *ends) {
    if (n > INT32_MAX) return 0;
    text_t t = {cps, flags, n};
    return mode == SPLIT_GPT2 ? split_gpt2(&t, ends) : mode == SPLIT_LLAMA3 ? split_llama3(&t, ends) : 0;
}
