/* The int32 vector the core fills (ivec_push is inline in core.h; this is its slow path). */
#include <stdlib.h>
#include <string.h>

#include "core.h"

int ivec_room(ivec *a, size_t n) {
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
