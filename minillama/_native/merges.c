/* Merge resolution at load: each merge line "left right" -> the ids of left, right and left+right, by a hash
 * of the tokens' bytes, so that loading a vocab does not look 840k strings up in a Python dict (llama3:
 * ~0.5 s there). The rule is Vocab.arrays().merges's, llama.cpp's: the line splits at its first space after
 * position 0; a line with no such space has parts "" and "" and no result. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

typedef struct {
    uint64_t hash;
    int32_t id; /* -1: empty slot */
} tok_entry;

static const uint8_t NONE[1]; /* the bytes of "" (memcmp takes no NULL, even for 0 bytes) */

typedef struct {
    const uint8_t *bytes;
    const int64_t *off;
    tok_entry *slots;
    size_t mask;
} tok_index;

/* FNV-1a over a then b (the bytes of a + b), finalised. */
static uint64_t hash2(const uint8_t *a, size_t na, const uint8_t *b, size_t nb) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < na; i++) h = (h ^ a[i]) * 1099511628211ULL;
    for (size_t i = 0; i < nb; i++) h = (h ^ b[i]) * 1099511628211ULL;
    h ^= (uint64_t)(na + nb);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

/* The id of the token whose bytes are a + b, or -1 (the first of equal tokens). */
static int32_t find2(const tok_index *t, const uint8_t *a, size_t na, const uint8_t *b, size_t nb) {
    uint64_t h = hash2(a, na, b, nb);
    for (size_t i = (size_t)h & t->mask; t->slots[i].id >= 0; i = (i + 1) & t->mask) {
        const tok_entry *e = &t->slots[i];
        if (e->hash != h) continue;
        const uint8_t *s = t->bytes + t->off[e->id];
        if ((size_t)(t->off[e->id + 1] - t->off[e->id]) == na + nb && memcmp(s, a, na) == 0 &&
            memcmp(s + na, b, nb) == 0)
            return e->id;
    }
    return -1;
}

int resolve_merges(const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, size_t n_vocab,
                   const uint8_t *text, size_t text_len, size_t n_merges, int32_t *rows) {
    if (n_vocab > INT32_MAX || tok_off[0] != 0) return 0;
    for (size_t i = 0; i < n_vocab; i++)
        if (tok_off[i + 1] < tok_off[i] || (uint64_t)tok_off[i + 1] > tok_len) return 0;
    if (n_merges == 0) return text_len == 0;
    size_t cap = 16;
    while (cap < 2 * n_vocab) cap *= 2;
    tok_index t = {tok_bytes, tok_off, malloc(cap * sizeof(tok_entry)), cap - 1};
    if (!t.slots) return 0;
    for (size_t i = 0; i < cap; i++) t.slots[i].id = -1;
    for (size_t id = 0; id < n_vocab; id++) {
        const uint8_t *s = tok_bytes + tok_off[id];
        size_t n = (size_t)(tok_off[id + 1] - tok_off[id]);
        if (find2(&t, s, n, NONE, 0) >= 0) continue; /* equal bytes: the first id stands */
        uint64_t h = hash2(s, n, NONE, 0);
        size_t i = (size_t)h & t.mask;
        while (t.slots[i].id >= 0) i = (i + 1) & t.mask;
        t.slots[i] = (tok_entry){h, (int32_t)id};
    }
    size_t pos = 0, m = 0;
    int ok = 1;
    for (; m < n_merges; m++) {
        if (pos > text_len) {
            ok = 0;
            break;
        }
        const uint8_t *line = text + pos, *nl = memchr(line, '\n', text_len - pos);
        size_t len = nl ? (size_t)(nl - line) : text_len - pos;
        if ((m + 1 < n_merges) != (nl != NULL)) { /* a line too few or too many */
            ok = 0;
            break;
        }
        const uint8_t *sp = len > 1 ? memchr(line + 1, ' ', len - 1) : NULL;
        int32_t *row = rows + 3 * m;
        if (sp) {
            size_t na = (size_t)(sp - line), nb = len - na - 1;
            row[0] = find2(&t, line, na, NONE, 0);
            row[1] = find2(&t, sp + 1, nb, NONE, 0);
            row[2] = find2(&t, line, na, sp + 1, nb);
        } else {
            row[0] = row[1] = find2(&t, NONE, 0, NONE, 0);
            row[2] = -1;
        }
        pos += len + 1;
    }
    free(t.slots);
    return ok;
}
