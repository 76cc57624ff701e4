/* A trie over bytes for the Unigram and WordPiece encoders. Built from the texts with a hash table of
 * children, then frozen into a double array (base/check, as darts and llama.cpp's XCDA do): a lookup is one
 * index and one compare; nodes are placed depth first, so a walk down one text reads nearby cells. Only read after
 * that (threads share it). */
#include <stdlib.h>
#include <string.h>

#include "core.h"

static size_t slot_of(uint64_t key, size_t mask) { return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 24) & mask; }

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
    free(t->da);
    t->value = NULL;
    t->slots = NULL;
    t->da = NULL;
}

/* The child of a node under construction, or -1. */
static int32_t build_child(const btrie *t, int32_t node, uint8_t c) {
    if (node == 0) return t->root[c];
    uint64_t key = ((uint64_t)(uint32_t)node << 8 | c) + 1;
    for (size_t i = slot_of(key, t->mask);; i = (i + 1) & t->mask) {
        if (t->slots[i].key == key) return t->slots[i].child;
        if (!t->slots[i].key) return -1;
    }
}

static void put_slot(btrie_slot *slots, size_t mask, uint64_t key, int32_t child) {
    size_t i = slot_of(key, mask);
    while (slots[i].key) i = (i + 1) & mask;
    slots[i] = (btrie_slot){key, child};
}

/* A new child of node for byte c; -1 when memory runs out or the trie is full. */
static int32_t add_child(btrie *t, int32_t node, uint8_t c) {
    if (t->n_nodes >= INT32_MAX / 2) return -1;
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
        int32_t next = build_child(t, node, s[i]);
        if (next < 0 && (next = add_child(t, node, s[i])) < 0) return 0;
        node = next;
    }
    if (node == 0) return 1; /* the empty text is no token */
    t->value[node] = value;
    return 1;
}

/* Room for index i in the double array (new cells empty: check -1). */
static int da_fit(btrie *t, size_t i, size_t *cap) {
    if (i < *cap) return 1;
    size_t n = *cap;
    while (n <= i) n *= 2;
    btrie_node *d = realloc(t->da, n * sizeof *d);
    if (!d) return 0;
    for (size_t k = *cap; k < n; k++) d[k] = (btrie_node){0, -1, -1};
    t->da = d;
    *cap = n;
    return 1;
}

int btrie_freeze(btrie *t) {
    size_t n = t->n_nodes;
    /* children grouped by parent: a counting sort of the (parent, label, child) edges */
    int32_t *first = calloc(n + 1, sizeof *first), *kid = malloc((n + 1) * sizeof *kid);
    uint8_t *label = malloc(n + 1);
    int32_t *where = malloc(n * sizeof *where), *queue = malloc(n * sizeof *queue);
    size_t cap = 1024;
    t->da = malloc(cap * sizeof *t->da);
    int ok = first && kid && label && where && queue && t->da;
    if (ok) {
        for (size_t k = 0; k < cap; k++) t->da[k] = (btrie_node){0, -1, -1};
        for (int c = 0; c < 256; c++)
            if (t->root[c] >= 0) first[1]++;
        for (size_t i = 0; i < t->n_slots; i++)
            if (t->slots[i].key) first[((t->slots[i].key - 1) >> 8) + 1]++;
        for (size_t s = 0; s < n; s++) first[s + 1] += first[s];
        int32_t *fill = where; /* borrowed as the fill pointer of each parent */
        memcpy(fill, first, n * sizeof *fill);
        for (int c = 0; c < 256; c++)
            if (t->root[c] >= 0) label[fill[0]] = (uint8_t)c, kid[fill[0]++] = t->root[c];
        for (size_t i = 0; i < t->n_slots; i++) {
            uint64_t key = t->slots[i].key;
            if (key) {
                size_t p = (size_t)((key - 1) >> 8);
                label[fill[p]] = (uint8_t)((key - 1) & 0xFF);
                kid[fill[p]++] = t->slots[i].child;
            }
        }
        /* depth first (a stack), so that a walk down one text stays in a few cache lines: each node's children
         * placed at the first base that fits them all */
        where[0] = 0;
        t->da[0] = (btrie_node){0, -2, t->value[0]}; /* the root: no one's child */
        size_t tail = 1, next_free = 1, top = 1;
        queue[0] = 0;
        while (ok && tail > 0) {
            int32_t s = queue[--tail];
            int32_t a = first[s], b = first[s + 1];
            if (a == b) continue;
            uint8_t low = 255;
            for (int32_t k = a; k < b; k++)
                if (label[k] < low) low = label[k];
            while (next_free < cap && t->da[next_free].check != -1) next_free++;
            /* the first base from the first free cell that fits, tried a few times, else past every cell used
             * (a node of many children would otherwise scan the whole array) */
            size_t base = next_free > low ? next_free - low : 1;
            for (int tries = 0;; base++, tries++) {
                if (tries == 64) base = top;
                if (!da_fit(t, base + 255, &cap)) {
                    ok = 0;
                    break;
                }
                int32_t k = a;
                while (k < b && t->da[base + label[k]].check == -1) k++;
                if (k == b) break;
            }
            if (!ok || base > INT32_MAX - 256) {
                ok = 0;
                break;
            }
            int32_t ds = where[s];
            t->da[ds].base = (int32_t)base;
            for (int32_t k = a; k < b; k++) {
                size_t i = base + label[k];
                t->da[i] = (btrie_node){0, ds, t->value[kid[k]]};
                where[kid[k]] = (int32_t)i;
                if (i >= top) top = i + 1;
                queue[tail++] = kid[k];
            }
        }
        t->da_size = cap;
    }
    free(first);
    free(kid);
    free(label);
    free(where);
    free(queue);
    free(t->value);
    free(t->slots);
    t->value = NULL;
    t->slots = NULL;
    return ok;
}
