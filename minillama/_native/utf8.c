/* UTF-8 to code points, with each code point's byte offset, and the int32 vector the core fills. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* Room for n more items (capacity doubled as needed); 0 and ok cleared when memory runs out. */
static int ivec_room(ivec *a, size_t n) {
    if (a->cap - a->n >= n) return 1;
    size_t cap = a->cap ? a->cap : 64;
    while (cap - a->n < n) {
        if (cap > SIZE_MAX / 2 / sizeof(int32_t)) {
            a->ok = 0;
            return 0;
        }
        cap *= 2;
    }
    int32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v) {
        a->ok = 0;
        return 0;
    }
    a->v = v;
    a->cap = cap;
    return 1;
}

int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap && !ivec_room(a, 1)) return 0;
    a->v[a->n++] = x;
    return 1;
}

int ivec_extend(ivec *a, const int32_t *x, size_t n) {
    if (!ivec_room(a, n)) return 0;
    if (n) memcpy(a->v + a->n, x, n * sizeof *x);
    a->n += n;
    return 1;
}

void ivec_free(ivec *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* The length of the well-formed sequence at s[0..n), 0 when there is none (continuations checked). */
static size_t seq_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    size_t len = c < 0x80 ? 1 : c < 0xC0 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    for (size_t k = 1; k < len; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return len;
}

int utf8_decode(const uint8_t *s, size_t n, uint32_t **cps_out, uint32_t **boff_out, size_t *ncp) {
    if (n >= UINT32_MAX) return 0;
    uint32_t *cps = malloc((n + 1) * sizeof *cps);
    uint32_t *boff = malloc((n + 1) * sizeof *boff);
    if (!cps || !boff) {
        free(cps);
        free(boff);
        return 0;
    }
    size_t i = 0, k = 0;
    while (i < n) {
        size_t len = seq_len(s + i, n - i);
        uint32_t cp;
        switch (len) {
        case 1: cp = s[i]; break;
        case 2: cp = (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F); break;
        case 3: cp = (uint32_t)(s[i] & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F); break;
        case 4:
            cp = (uint32_t)(s[i] & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 | (uint32_t)(s[i + 2] & 0x3F) << 6 |
                 (s[i + 3] & 0x3F);
            break;
        default: cp = 0xFFFD; len = 1; break;
        }
        boff[k] = (uint32_t)i;
        cps[k++] = cp;
        i += len;
    }
    boff[k] = (uint32_t)n;
    *cps_out = cps;
    *boff_out = boff;
    *ncp = k;
    return 1;
}
