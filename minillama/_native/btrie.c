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
    if (node == 0 || value < 0) return 1; /* the empty text is no token; value < 0: the path only */
    t->value[node] = value;
    return 1;
}

/* The double array under construction, with its free cells in a doubly linked list (so a search for a base
 * skips the cells in use). */
typedef struct {
    btrie *t;
    size_t cap;
    int64_t *next, *prev; /* free list links (-1: end); head: the first free cell */
    int64_t head, tail;
} builder;

/* Room for index i (new cells empty, check -1, appended to the free list); 0 when memory runs out. */
static int da_fit(builder *d, size_t i) {
    if (i < d->cap) return 1;
    size_t n = d->cap ? d->cap : 1024;
    while (n <= i) n *= 2;
    btrie_node *a = realloc(d->t->da, n * sizeof *a);
    if (a) d->t->da = a;
    int64_t *nx = a ? realloc(d->next, n * sizeof *nx) : NULL;
    if (nx) d->next = nx;
    int64_t *pv = nx ? realloc(d->prev, n * sizeof *pv) : NULL;
    if (!pv) return 0;
    d->prev = pv;
    for (size_t k = d->cap; k < n; k++) {
        a[k] = (btrie_node){0, -1, -1, 0.0f};
        nx[k] = -1;
        pv[k] = d->tail;
        if (d->tail >= 0)
            nx[d->tail] = (int64_t)k;
        else
            d->head = (int64_t)k;
        d->tail = (int64_t)k;
    }
    d->cap = n;
    return 1;
}

/* Cell i leaves the free list. */
static void da_take(builder *d, size_t i) {
    int64_t p = d->prev[i], n = d->next[i];
    if (p >= 0)
        d->next[p] = n;
    else
        d->head = n;
    if (n >= 0)
        d->prev[n] = p;
    else
        d->tail = p;
}

int btrie_freeze(btrie *t) {
    size_t n = t->n_nodes;
    /* children grouped by parent: a counting sort of the (parent, label, child) edges */
    int32_t *first = calloc(n + 1, sizeof *first), *kid = malloc((n + 1) * sizeof *kid);
    uint8_t *label = malloc(n + 1);
    int32_t *where = malloc(n * sizeof *where), *queue = malloc(n * sizeof *queue);
    builder d = {t, 0, NULL, NULL, -1, -1};
    t->da = NULL;
    int ok = first && kid && label && where && queue && da_fit(&d, 1023);
    if (ok) {
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
         * placed at the first base that fits them all, tried from the first free cells (a bounded number of
         * them, else past every cell in use, where all is free) */
        where[0] = 0;
        t->da[0] = (btrie_node){0, -2, t->value[0], 0.0f}; /* the root: no one's child */
        da_take(&d, 0);
        size_t tail = 1, top = 1;
        queue[0] = 0;
        while (ok && tail > 0) {
            int32_t s = queue[--tail];
            int32_t a = first[s], b = first[s + 1];
            if (a == b) continue;
            uint8_t low = 255;
            for (int32_t k = a; k < b; k++)
                if (label[k] < low) low = label[k];
            size_t base = top;
            int64_t p = d.head;
            for (int tries = 0; p >= 0 && tries < 256; p = d.next[p]) {
                if ((size_t)p < (size_t)low + 1) continue;
                tries++;
                size_t cand = (size_t)p - low;
                if (!da_fit(&d, cand + 255)) {
                    ok = 0;
                    break;
                }
                int32_t k = a;
                while (k < b && t->da[cand + label[k]].check == -1) k++;
                if (k == b) {
                    base = cand;
                    break;
                }
            }
            if (!ok || base > INT32_MAX - 256 || !da_fit(&d, base + 255)) {
                ok = 0;
                break;
            }
            int32_t ds = where[s];
            t->da[ds].base = (int32_t)base;
            for (int32_t k = a; k < b; k++) {
                size_t i = base + label[k];
                t->da[i] = (btrie_node){0, ds, t->value[kid[k]], 0.0f};
                da_take(&d, i);
                where[kid[k]] = (int32_t)i;
                if (i >= top) top = i + 1;
                queue[tail++] = kid[k];
            }
        }
        t->da_size = d.cap;
    }
    free(d.next);
    free(d.prev);
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
