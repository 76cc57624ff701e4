/* Detokenizing: every token's piece (llama_token_to_piece with special=True) in one blob, copied once from
 * decode.py's PieceTable, and the join of the pieces of a run of ids. The plain table is the same pieces with
 * control and unknown tokens empty (llama_detokenize's unparse_special=False). */
#include <stdlib.h>
#include <string.h>

#include "core.h"

typedef struct {
    uint32_t off, len;
} piece_span;

struct pieces {
    uint8_t *blob;
    piece_span *span;
    uint8_t *special; /* 1: empty in the plain table */
    size_t n;
};

pieces *pieces_new(const uint8_t *blob, size_t blob_len, const int64_t *off, size_t n, const uint8_t *special) {
    if (blob_len >= UINT32_MAX || n == 0 || n > INT32_MAX) return NULL;
    pieces *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n;
    p->blob = malloc(blob_len ? blob_len : 1);
    p->span = malloc(n * sizeof *p->span);
    p->special = malloc(n);
    if (!p->blob || !p->span || !p->special) goto fail;
    if (blob_len) memcpy(p->blob, blob, blob_len);
    memcpy(p->special, special, n);
    for (size_t i = 0; i < n; i++) {
        int64_t a = off[i], b = off[i + 1];
        if (a < 0 || b < a || (uint64_t)b > blob_len) goto fail;
        p->span[i] = (piece_span){(uint32_t)a, (uint32_t)(b - a)};
    }
    return p;
fail:
    pieces_free(p);
    return NULL;
}

void pieces_free(pieces *p) {
    if (!p) return;
    free(p->blob);
    free(p->span);
    free(p->special);
    free(p);
}

size_t pieces_count(const pieces *p) { return p->n; }

/* The length of piece id in the chosen table. */
static inline size_t piece_len(const pieces *p, int32_t id, int plain) {
    return plain && p->special[id] ? 0 : p->span[id].len;
}

size_t pieces_size(const pieces *p, const int32_t *ids, size_t n, int plain, int strip_space, size_t *skip) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += piece_len(p, ids[i], plain);
    *skip = 0;
    if (strip_space && n && piece_len(p, ids[0], plain) && p->blob[p->span[ids[0]].off] == ' ') *skip = 1;
    return total - *skip;
}

void pieces_join(const pieces *p, const int32_t *ids, size_t n, int plain, size_t skip, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        size_t len = piece_len(p, ids[i], plain);
        if (!len) continue;
        const uint8_t *src = p->blob + p->span[ids[i]].off;
        if (skip) { /* only the first piece, which starts with the space */
            src += skip;
            len -= skip;
            skip = 0;
        }
        memcpy(out, src, len);
        out += len;
    }
}
