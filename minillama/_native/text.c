/* UTF-8 from a str's characters as CPython stores them (n of 1, 2 or 4 bytes each), every space as U+2581 when
 * asked (SPM's prepare): the encode fast path's text and the vocab's token bytes, written in one pass. */
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
