/* A trie over bytes for the Unigram and WordPiece encoders: node values in one array, children in one
 * open-addressing table keyed by (node, byte), the root's children in a direct table. Built once at load,
 * then only read (threads share it). */
#include <stdlib.h>
#include <string.h>

#include "core.h"

int btrie_init(btrie *t) {
    memset(t, 0, sizeof *t);
    for (int c = 0; c < 256; c++) t->root[c] = -1;
    t->cap_nodes = 256;
    t->value = malloc(t->cap_nodes * sizeof *t->value);
    t->n_slots = 1024;
    t->mask = t->n_slots - 1;
    t->slots = calloc(t->n_slots, sizeof *t->slots);
    if (!t->value || !t->slots) {
        btrie_free(t);
        return 0;
    }
    t->value[0] = -1;
    t->n_nodes = 1;
    return 1;
}

void btrie_free(btrie *t) {
    free(t->value);
    free(t->slots);
    t->value = NULL;
    t->slots = NULL;
}

static void put_slot(btrie_slot *slots, size_t mask, uint64_t key, int32_t child) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
    while (slots[i].key) i = (i + 1) & mask;
    slots[i] = (btrie_slot){key, child};
}

/* A new child of node for byte c; -1 when memory runs out or the trie is full. */
static int32_t add_child(btrie *t, int32_t node, uint8_t c) {
    if (t->n_nodes >= INT32_MAX) return -1;
    if (t->n_nodes == t->cap_nodes) {
        int32_t *v = realloc(t->value, 2 * t->cap_nodes * sizeof *v);
        if (!v) return -1;
        t->value = v;
        t->cap_nodes *= 2;
    }
    int32_t child = (int32_t)t->n_nodes++;
    t->value[child] = -1;
    if (node == 0) {
        t->root[c] = child;
        return child;
    }
    if (2 * (t->n_nodes + 1) > t->n_slots) { /* keep the table at most half full */
        size_t n = 2 * t->n_slots;
        btrie_slot *s = calloc(n, sizeof *s);
        if (!s) return -1;
        for (size_t i = 0; i < t->n_slots; i++)
            if (t->slots[i].key) put_slot(s, n - 1, t->slots[i].key, t->slots[i].child);
        free(t->slots);
        t->slots = s;
        t->n_slots = n;
        t->mask = n - 1;
    }
    put_slot(t->slots, t->mask, ((uint64_t)(uint32_t)node << 8 | c) + 1, child);
    return child;
}

int btrie_insert(btrie *t, const uint8_t *s, size_t n, int32_t value) {
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t next = btrie_child(t, node, s[i]);
        if (next < 0 && (next = add_child(t, node, s[i])) < 0) return 0;
        node = next;
    }
    if (node == 0) return 1; /* the empty text is no token */
    t->value[node] = value;
    return 1;
}
