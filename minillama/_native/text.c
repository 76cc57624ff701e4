/* UTF-8 from a str's characters as CPython stores them (n of 1, 2 or 4 bytes each), every space as U+2581 when
 * asked (SPM's prepare): the encode fast path's text and the vocab's token bytes, written in one pass. And the
 * cut of UTF-8 text into paragraphs (minillama dataset's documents). */
#include <stdlib.h>
#include <string.h>

#include "core.h"

size_t ucs_utf8_size(const void *chars, size_t n, int kind, int escape_spaces, int *surrogate) {
    size_t len = 0, sp = escape_spaces ? 2 : 0;
    int bad = 0;
    if (kind == 1) {
        const uint8_t *c = chars;
        for (size_t i = 0; i < n; i++) len += 1 + sp * (c[i] == ' ') + (c[i] >> 7);
    } else if (kind == 2) {
        const uint16_t *c = chars;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = c[i];
            len += x < 0x80 ? 1 + sp * (x == ' ') : x < 0x800 ? 2 : 3;
            bad |= (x & 0xF800) == 0xD800;
        }
    } else {
        const uint32_t *c = chars;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = c[i];
            len += x < 0x80 ? 1 + sp * (x == ' ') : x < 0x800 ? 2 : x < 0x10000 ? 3 : 4;
            bad |= (x & 0xFFFFF800u) == 0xD800 || x > MAX_CODE_POINT;
        }
    }
    *surrogate = bad;
    return len;
}

/* ASCII x at o (a space as U+2581 when sp), 4 bytes written; its length. */
static inline size_t put_ascii(uint8_t *o, uint32_t x, int sp) {
    int mark = sp && x == ' ';
    uint32_t v = mark ? 0x8196E2u : x; /* E2 96 81, little-endian */
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), 0};
    memcpy(o, b, 4);
    return mark ? 3 : 1;
}

/* Code point x (>= 0x80; a surrogate or one past U+10FFFF is written as U+FFFD) as UTF-8 at o; its length. */
static inline size_t put_wide(uint8_t *o, uint32_t x) {
    if ((x & 0xFFFFF800u) == 0xD800 || x > MAX_CODE_POINT) x = 0xFFFD;
    return utf8_put(o, x);
}

size_t ucs_utf8_write(const void *chars, size_t n, int kind, int escape_spaces, uint8_t *out, int *surrogate) {
    size_t o = 0;
    int bad = 0;
    if (kind == 1) {
        const uint8_t *c = chars;
        for (size_t i = 0; i < n; i++)
            o += c[i] < 0x80 ? put_ascii(out + o, c[i], escape_spaces) : put_wide(out + o, c[i]);
    } else if (kind == 2) {
        const uint16_t *c = chars;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = c[i];
            bad |= (x & 0xF800) == 0xD800;
            o += x < 0x80 ? put_ascii(out + o, x, escape_spaces) : put_wide(out + o, x);
        }
    } else {
        const uint32_t *c = chars;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = c[i];
            bad |= (x & 0xFFFFF800u) == 0xD800 || x > MAX_CODE_POINT;
            o += x < 0x80 ? put_ascii(out + o, x, escape_spaces) : put_wide(out + o, x);
        }
    }
    *surrogate = bad;
    return o;
}

/* Whether the UTF-8 text holds a character that is not whitespace as str.isspace() has it (ASCII 9-13, 28-32;
 * U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). */
static int has_content(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t b = s[i];
        if (b < 0x80) {
            if (!((b >= 9 && b <= 13) || (b >= 28 && b <= 32))) return 1;
            i++;
            continue;
        }
        size_t len;
        uint32_t c = utf8_next(s + i, n - i, &len);
        i += len;
        if (!(c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
              c == 0x202F || c == 0x205F || c == 0x3000))
            return 1;
    }
    return 0;
}

size_t paragraph_spans(const uint8_t *s, size_t n, size_t *spans, size_t cap) {
    size_t k = 0, start = 0, i = 0;
    for (;;) {
        /* the next cut: a newline, blanks (space, \t, \r, \f, \v), a newline */
        const uint8_t *nl = i < n ? memchr(s + i, '\n', n - i) : NULL;
        size_t cut = n, next = n;
        while (nl) {
            size_t j = (size_t)(nl - s) + 1;
            while (j < n && (s[j] == ' ' || s[j] == '\t' || s[j] == '\r' || s[j] == '\f' || s[j] == '\v')) j++;
            if (j < n && s[j] == '\n') {
                cut = (size_t)(nl - s);
                next = j + 1;
                break;
            }
            nl = j < n ? memchr(s + j, '\n', n - j) : NULL; /* no cut starts before j: blanks are no newline */
        }
        size_t a = start, b = cut;
        while (a < b && s[a] == '\n') a++;
        while (b > a && s[b - 1] == '\n') b--;
        if (has_content(s + start, cut - start)) {
            if (k / 2 < cap) {
                spans[k] = a;
                spans[k + 1] = b;
            }
            k += 2;
        }
        if (cut == n) return k / 2;
        start = i = next;
    }
}

size_t *paragraph_cut(const uint8_t *s, size_t n, size_t *k) {
    /* room for a paragraph every 64 bytes at first (a 256 KiB chunk of prose has one every ~200), more when the
     * text has more: a long paragraph costs no memory in proportion to it */
    size_t cap = n / 64 + 16;
    for (;;) {
        size_t *spans = malloc(2 * cap * sizeof *spans);
        if (!spans) return NULL;
        *k = paragraph_spans(s, n, spans, cap);
        if (*k <= cap) return spans;
        free(spans);
        cap = *k;
    }
}
