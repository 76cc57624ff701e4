/* The word cache: word bytes -> ids, in two generations as the Python one (encoders/base.py). New words go
 * into the young generation; a word found only in the old one is copied back; when the young one reaches
 * max_bytes (each entry's real size: header, ids, key, slots) or max_words it becomes the old one and the
 * previous old one is freed (its entries' chunks at once), so memory stays under 2 x max_bytes (and a
 * chunk's slack). One mutex guards it: encoders on many threads share one cache and hold the lock only to
 * look up or insert. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

typedef struct entry {
    uint64_t hash;
    uint32_t klen, nids;
    int32_t ids[]; /* then the key's bytes */
} entry;

typedef struct {
    uint64_t hash; /* beside the pointer: a probe compares it without touching the entry */
    entry *e;
} slot;

/* Entries live in chunks a generation frees all at once: no malloc or free an entry (a generation turning
 * old frees thousands), and neighbours in time are neighbours in memory. */
typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    uint64_t data[]; /* entries are 8-aligned */
} chunk;

typedef struct {
    slot *slots;
    size_t cap, count, bytes;
    chunk *chunks; /* the newest first: entries are cut from its end */
} gen;

struct wcache {
    pthread_mutex_t lock;
    gen young, old;
    size_t max_bytes, max_words;
    size_t chunk_bytes; /* a chunk's room: a sixteenth of max_bytes, 4 KB to 256 KB */
};

static const uint8_t *key_of(const entry *e) { return (const uint8_t *)(e->ids + e->nids); }

static size_t entry_cost(size_t klen, size_t nids) {
    return sizeof(entry) + nids * sizeof(int32_t) + klen + 2 * sizeof(slot);
}

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    word_key k;
    word_key_of(s, n, &k);
    return k.hash;
}

static void gen_free(gen *g) {
    for (chunk *c = g->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(g->slots);
    memset(g, 0, sizeof *g);
}

static entry *gen_find(const gen *g, uint64_t h, const uint8_t *key, size_t klen) {
    if (!g->cap) return NULL;
    size_t mask = g->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        entry *e = g->slots[i].e;
        if (!e) return NULL;
        if (g->slots[i].hash == h && e->klen == klen && memcmp(key_of(e), key, klen) == 0) return e;
    }
}

/* Insert e (not present); 0 when the table could not grow. */
static int gen_insert(gen *g, entry *e) {
    if ((g->count + 1) * 2 > g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 1024;
        slot *slots = calloc(cap, sizeof *slots);
        if (!slots) return 0;
        for (size_t i = 0; i < g->cap; i++) {
            entry *x = g->slots[i].e;
            if (!x) continue;
            size_t j = (size_t)x->hash & (cap - 1);
            while (slots[j].e) j = (j + 1) & (cap - 1);
            slots[j] = g->slots[i];
        }
        free(g->slots);
        g->slots = slots;
        g->cap = cap;
    }
    size_t mask = g->cap - 1, j = (size_t)e->hash & mask;
    while (g->slots[j].e) j = (j + 1) & mask;
    g->slots[j] = (slot){e->hash, e};
    g->count++;
    g->bytes += entry_cost(e->klen, e->nids);
    return 1;
}

/* Room for an entry of size bytes in g's newest chunk, or a new chunk (of chunk_bytes, or just the entry's
 * size when larger); NULL when memory ran out. */
static entry *gen_alloc(gen *g, size_t chunk_bytes, size_t size) {
    size = (size + 7) & ~(size_t)7;
    chunk *c = g->chunks;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > chunk_bytes ? size : chunk_bytes;
        c = malloc(sizeof(chunk) + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = g->chunks;
        g->chunks = c;
    }
    entry *e = (entry *)((uint8_t *)c->data + c->used);
    c->used += size;
    return e;
}

/* Give back the entry gen_alloc just made (the table could not take it). */
static void gen_unalloc(gen *g, const entry *e) {
    chunk *c = g->chunks;
    c->used = (size_t)((const uint8_t *)e - (const uint8_t *)c->data);
}

wcache *wcache_new(size_t max_bytes, size_t max_words) {
    wcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return NULL;
    }
    c->max_bytes = max_bytes;
    c->max_words = max_words;
    c->chunk_bytes = max_bytes / 16 < 4096 ? 4096 : max_bytes / 16 > 262144 ? 262144 : max_bytes / 16;
    return c;
}

void wcache_free(wcache *c) {
    if (!c) return;
    gen_free(&c->young);
    gen_free(&c->old);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* Under the lock: put a new entry for key in the young generation (turning it old first when full). */
static void put_locked(wcache *c, uint64_t h, const uint8_t *key, size_t klen, const int32_t *ids, size_t nids) {
    size_t cost = entry_cost(klen, nids);
    if (klen > UINT32_MAX || nids > UINT32_MAX || cost > c->max_bytes / 8) return;
    if (gen_find(&c->young, h, key, klen)) return;
    if (c->young.bytes + cost > c->max_bytes || c->young.count >= c->max_words) {
        gen_free(&c->old);
        c->old = c->young;
        memset(&c->young, 0, sizeof c->young);
    }
    entry *e = gen_alloc(&c->young, c->chunk_bytes, sizeof(entry) + nids * sizeof(int32_t) + klen);
    if (!e) return;
    e->hash = h;
    e->klen = (uint32_t)klen;
    e->nids = (uint32_t)nids;
    if (nids) memcpy(e->ids, ids, nids * sizeof(int32_t));
    if (klen) memcpy((uint8_t *)(e->ids + nids), key, klen);
    if (!gen_insert(&c->young, e)) gen_unalloc(&c->young, e);
}

int wcache_get(wcache *c, const uint8_t *key, size_t klen, ivec *out) {
    return wcache_get_h(c, hash_bytes(key, klen), key, klen, out);
}

int wcache_get_h(wcache *c, uint64_t h, const uint8_t *key, size_t klen, ivec *out) {
    int found = 0;
    pthread_mutex_lock(&c->lock);
    entry *e = gen_find(&c->young, h, key, klen);
    if (e) {
        found = ivec_extend(out, e->ids, e->nids);
    } else if ((e = gen_find(&c->old, h, key, klen)) != NULL) {
        found = ivec_extend(out, e->ids, e->nids);
        if (found) put_locked(c, h, key, klen, out->v + out->n - e->nids, e->nids);
    }
    pthread_mutex_unlock(&c->lock);
    return found;
}

void wcache_put(wcache *c, const uint8_t *key, size_t klen, const int32_t *ids, size_t nids) {
    wcache_put_h(c, hash_bytes(key, klen), key, klen, ids, nids);
}

void wcache_put_h(wcache *c, uint64_t h, const uint8_t *key, size_t klen, const int32_t *ids, size_t nids) {
    pthread_mutex_lock(&c->lock);
    put_locked(c, h, key, klen, ids, nids);
    pthread_mutex_unlock(&c->lock);
}

void wcache_put_many(wcache *c, size_t n, const wcache_item *items) {
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < n; i++) {
        const wcache_item *x = &items[i];
        put_locked(c, x->hash, x->key, x->klen, x->ids, x->nids);
    }
    pthread_mutex_unlock(&c->lock);
}

void wcache_clear(wcache *c) {
    pthread_mutex_lock(&c->lock);
    gen_free(&c->young);
    gen_free(&c->old);
    pthread_mutex_unlock(&c->lock);
}

static void gen_scan(const gen *g, wcache_info *info) {
    for (size_t i = 0; i < g->cap; i++) {
        const entry *e = g->slots[i].e;
        if (!e) continue;
        size_t cost = entry_cost(e->klen, e->nids);
        if (cost > info->largest_entry) info->largest_entry = cost;
        if (e->klen > info->longest_word) info->longest_word = e->klen;
    }
}

void wcache_stats(wcache *c, wcache_info *info) {
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&c->lock);
    info->words = c->young.count;
    info->bytes = c->young.bytes;
    info->old_words = c->old.count;
    info->old_bytes = c->old.bytes;
    gen_scan(&c->young, info);
    gen_scan(&c->old, info);
    pthread_mutex_unlock(&c->lock);
    info->max_bytes = c->max_bytes;
    info->max_words = c->max_words;
}
