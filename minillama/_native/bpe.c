/* Byte-level BPE as llama.cpp runs it (llm_tokenizer_bpe), over token ids: each word's bytes start as their
 * byte tokens; while some adjacent pair is a merge, the pair of lowest rank merges (ties: the leftmost).
 * Short words by a plain scan, long ones (HEAP_MIN_LEN bytes and more) by a heap + linked list, as
 * encoders/bpe.py. The merge table is built from Vocab.arrays() at load; symbols are always tokens (the
 * Python side hands over only vocabs where every applicable merge makes a token). */
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define HEAP_MIN_LEN 48
#define EMPTY_KEY UINT64_MAX
#define GONE INT32_MIN /* a symbol merged into its left neighbour */

typedef struct {
    uint64_t key; /* left << 32 | right */
    int32_t rank, result;
} pair_slot;

typedef struct {
    uint64_t hash;
    uint32_t off, len;
    int32_t id;
} tok_slot;

struct bpe {
    pair_slot *pairs;
    size_t pair_cap;
    int32_t byte_ids[256];       /* each byte's token, or -(b + 1) for a byte whose character is no token */
    int32_t byte_fallback[256][2]; /* the ids such a byte becomes instead (-1: none), as encoders/bpe.py */
    int32_t (*byte_pairs)[2];      /* [a << 8 | b]: rank and result of the pair of bytes a, b (rank -1: none) */
    int ignore_merges;
    tok_slot *toks; /* ignore_merges: a token's raw bytes -> its id */
    size_t tok_cap;
    uint8_t *raw; /* the tokens' raw bytes (byte-level text decoded) */
    wcache *cache;
};

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static uint64_t hash_raw(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return mix(h ^ n);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* rank and result of the pair (a, b); rank -1 when it is no merge. */
static inline int32_t pair_rank(const bpe *b, int32_t l, int32_t r, int32_t *result) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    size_t mask = b->pair_cap - 1;
    for (size_t i = (size_t)mix(key) & mask;; i = (i + 1) & mask) {
        const pair_slot *s = &b->pairs[i];
        if (s->key == key) {
            *result = s->result;
            return s->rank;
        }
        if (s->key == EMPTY_KEY) return -1;
    }
}

/* Start loading the slot where the pair (l, r) is looked for: the two lookups after a merge then wait for
 * memory once, not twice (the pair table is far larger than the caches). */
static inline void pair_prefetch(const bpe *b, int32_t l, int32_t r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    __builtin_prefetch(&b->pairs[(size_t)mix(key) & (b->pair_cap - 1)]);
}

/* The code point of the UTF-8 sequence at s[0..n) and its length in *len, or -1. */
static int32_t utf8_one(const uint8_t *s, size_t n, size_t *len) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    size_t k = c >= 0xC0 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : 0;
    if (!k || k > n) return -1;
    int32_t cp = c & (k == 2 ? 0x1F : 0x0F);
    for (size_t j = 1; j < k; j++) {
        if ((s[j] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[j] & 0x3F);
    }
    *len = k;
    return cp;
}

/* The whole-token table (ignore_merges): each token whose text is byte-level characters, by its raw bytes. */
static int build_tokens(bpe *b, const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, size_t n_vocab,
                        const int32_t *byte_chars) {
    int16_t inv[0x200];
    for (size_t i = 0; i < 0x200; i++) inv[i] = -1;
    for (int i = 0; i < 256; i++)
        if (byte_chars[i] >= 0 && byte_chars[i] < 0x200) inv[byte_chars[i]] = (int16_t)i;
    if (tok_len >= UINT32_MAX) return 0;
    b->raw = malloc(tok_len ? tok_len : 1);
    b->tok_cap = pow2_at_least(2 * n_vocab);
    b->toks = calloc(b->tok_cap, sizeof *b->toks);
    if (!b->raw || !b->toks) return 0;
    size_t used = 0;
    for (size_t t = 0; t < n_vocab; t++) {
        int64_t s = tok_off[t], e = tok_off[t + 1];
        if (s < 0 || e < s || (uint64_t)e > tok_len) return 0;
        size_t start = used, i = (size_t)s, ok = 1;
        while (i < (size_t)e) {
            size_t len;
            int32_t cp = utf8_one(tok_bytes + i, (size_t)e - i, &len);
            if (cp < 0 || cp >= 0x200 || inv[cp] < 0) {
                ok = 0;
                break;
            }
            b->raw[used++] = (uint8_t)inv[cp];
            i += len;
        }
        if (!ok || used == start) {
            used = start;
            continue;
        }
        uint64_t h = hash_raw(b->raw + start, used - start);
        size_t mask = b->tok_cap - 1, j = (size_t)h & mask, dup = 0;
        for (; b->toks[j].len; j = (j + 1) & mask) {
            tok_slot *x = &b->toks[j];
            if (x->hash == h && x->len == used - start && memcmp(b->raw + x->off, b->raw + start, x->len) == 0) {
                dup = 1; /* two texts of the same bytes cannot be (token texts are unique); keep the first */
                break;
            }
        }
        if (dup) {
            used = start;
            continue;
        }
        b->toks[j] = (tok_slot){h, (uint32_t)start, (uint32_t)(used - start), (int32_t)t};
    }
    return 1;
}

static int32_t whole_token(const bpe *b, const uint8_t *w, size_t n) {
    if (!n) return -1;
    uint64_t h = hash_raw(w, n);
    size_t mask = b->tok_cap - 1;
    for (size_t j = (size_t)h & mask; b->toks[j].len; j = (j + 1) & mask) {
        const tok_slot *x = &b->toks[j];
        if (x->hash == h && x->len == n && memcmp(b->raw + x->off, w, n) == 0) return x->id;
    }
    return -1;
}

bpe *bpe_new(const int32_t *merges, size_t n_merges, const int32_t *byte_ids, const uint8_t *tok_bytes,
             size_t tok_len, const int64_t *tok_off, size_t n_vocab, const int32_t *byte_chars,
             int ignore_merges, size_t cache_max_bytes, size_t cache_max_words) {
    if (n_vocab == 0 || n_vocab > INT32_MAX || n_merges > INT32_MAX) return NULL;
    bpe *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    for (int i = 0; i < 256; i++) {
        int32_t id = byte_ids[3 * i];
        if (id >= 0 && (size_t)id >= n_vocab) {
            bpe_free(b);
            return NULL;
        }
        b->byte_ids[i] = id >= 0 ? id : -(i + 1);
        for (int k = 0; k < 2; k++) {
            int32_t f = byte_ids[3 * i + 1 + k];
            b->byte_fallback[i][k] = f >= 0 && (size_t)f < n_vocab ? f : -1;
        }
    }
    b->pair_cap = pow2_at_least(n_merges + n_merges / 2 + 2); /* load <= 2/3: half the memory of 2n */
    b->pairs = malloc(b->pair_cap * sizeof *b->pairs);
    b->cache = wcache_new(cache_max_bytes, cache_max_words);
    if (!b->pairs || !b->cache) {
        bpe_free(b);
        return NULL;
    }
    for (size_t i = 0; i < b->pair_cap; i++) b->pairs[i].key = EMPTY_KEY;
    for (size_t m = 0; m < n_merges; m++) {
        int32_t l = merges[3 * m], r = merges[3 * m + 1], res = merges[3 * m + 2];
        if (l < 0 || r < 0 || res < 0 || (size_t)l >= n_vocab || (size_t)r >= n_vocab || (size_t)res >= n_vocab)
            continue;
        uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
        size_t mask = b->pair_cap - 1, i = (size_t)mix(key) & mask;
        while (b->pairs[i].key != EMPTY_KEY && b->pairs[i].key != key) i = (i + 1) & mask;
        if (b->pairs[i].key == key) continue; /* the first of duplicate merges wins */
        b->pairs[i] = (pair_slot){key, (int32_t)m, res};
    }
    /* The first pairs of every word are pairs of byte tokens: looked up in 256 x 256 (512 KB) instead of the
     * big pair table (a cache miss each). */
    b->byte_pairs = malloc(65536 * sizeof *b->byte_pairs);
    if (!b->byte_pairs) {
        bpe_free(b);
        return NULL;
    }
    for (int i = 0; i < 65536; i++) {
        int32_t l = b->byte_ids[i >> 8], r = b->byte_ids[i & 0xFF];
        b->byte_pairs[i][1] = -1;
        b->byte_pairs[i][0] = l >= 0 && r >= 0 ? pair_rank(b, l, r, &b->byte_pairs[i][1]) : -1;
    }
    b->ignore_merges = ignore_merges;
    if (ignore_merges && !build_tokens(b, tok_bytes, tok_len, tok_off, n_vocab, byte_chars)) {
        bpe_free(b);
        return NULL;
    }
    return b;
}

void bpe_free(bpe *b) {
    if (!b) return;
    free(b->pairs);
    free(b->byte_pairs);
    free(b->toks);
    free(b->raw);
    wcache_free(b->cache);
    free(b);
}

wcache *bpe_cache(bpe *b) { return b->cache; }

/* Scratch space of one encode call, grown to the longest word. */
typedef struct {
    int32_t *syms, *ranks, *res, *nxt, *prv;
    uint64_t *heap;
    size_t cap;
} scratch;

static int scratch_fit(scratch *s, size_t n) {
    if (n <= s->cap) return 1;
    size_t cap = n < 64 ? 64 : n;
    if (cap > SIZE_MAX / 2 / sizeof(uint64_t)) return 0;
    int32_t *p[5];
    int32_t **slots[5] = {&s->syms, &s->ranks, &s->res, &s->nxt, &s->prv};
    for (int i = 0; i < 5; i++) {
        p[i] = realloc(*slots[i], cap * sizeof(int32_t));
        if (!p[i]) return 0;
        *slots[i] = p[i];
    }
    uint64_t *h = realloc(s->heap, 2 * cap * sizeof(uint64_t));
    if (!h) return 0;
    s->heap = h;
    s->cap = cap;
    return 1;
}

static void scratch_free(scratch *s) {
    free(s->syms);
    free(s->ranks);
    free(s->res);
    free(s->nxt);
    free(s->prv);
    free(s->heap);
}

/* The plain scan: ranks of every adjacent pair kept, two updated per merge. Leaves n symbols in syms. */
static size_t merge_simple(const bpe *b, const uint8_t *w, int32_t *syms, int32_t *ranks, int32_t *res, size_t n) {
    if (n < 2) return n;
    for (size_t i = 0; i + 1 < n; i++) {
        const int32_t *p = b->byte_pairs[w[i] << 8 | w[i + 1]];
        ranks[i] = p[0];
        res[i] = p[1];
    }
    for (;;) {
        size_t best = SIZE_MAX;
        int32_t br = INT32_MAX;
        for (size_t i = 0; i + 1 < n; i++)
            if (ranks[i] >= 0 && ranks[i] < br) {
                br = ranks[i];
                best = i;
            }
        if (best == SIZE_MAX) return n;
        syms[best] = res[best];
        memmove(syms + best + 1, syms + best + 2, (n - best - 2) * sizeof *syms);
        memmove(ranks + best, ranks + best + 1, (n - best - 2) * sizeof *ranks);
        memmove(res + best, res + best + 1, (n - best - 2) * sizeof *res);
        n--;
        if (best + 1 < n) pair_prefetch(b, syms[best], syms[best + 1]);
        if (best > 0) pair_prefetch(b, syms[best - 1], syms[best]);
        if (best + 1 < n) ranks[best] = pair_rank(b, syms[best], syms[best + 1], &res[best]);
        if (best > 0) ranks[best - 1] = pair_rank(b, syms[best - 1], syms[best], &res[best - 1]);
        if (n < 2) return n;
    }
}

void heap_push(uint64_t *h, size_t *n, uint64_t x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= x) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], x = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = x;
    return top;
}

/* The heap + linked list: a key is rank << 32 | left; stale when the pair at left has another rank now.
 * Every push follows a merge, which removes a symbol, so the heap never holds more than 2n keys. */
static size_t merge_heap(const bpe *b, const uint8_t *w, scratch *s, size_t n) {
    int32_t *syms = s->syms, *nxt = s->nxt, *prv = s->prv, res;
    uint64_t *heap = s->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = b->byte_pairs[w[i] << 8 | w[i + 1]][0];
        if (r >= 0) heap_push(heap, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t key = heap_pop(heap, &hn);
        int32_t left = (int32_t)(key & 0xFFFFFFFFu), right = nxt[left];
        if (right < 0 || syms[left] == GONE) continue;
        int32_t r = pair_rank(b, syms[left], syms[right], &res);
        if (r < 0 || (uint64_t)r != key >> 32) continue;
        syms[left] = res;
        syms[right] = GONE;
        int32_t after = nxt[right], before = prv[left];
        nxt[left] = after;
        if (after >= 0) pair_prefetch(b, syms[left], syms[after]);
        if (before >= 0) pair_prefetch(b, syms[before], syms[left]);
        if (after >= 0) {
            prv[after] = left;
            r = pair_rank(b, syms[left], syms[after], &res);
            if (r >= 0) heap_push(heap, &hn, (uint64_t)r << 32 | (uint32_t)left);
        }
        if (before >= 0) {
            r = pair_rank(b, syms[before], syms[left], &res);
            if (r >= 0) heap_push(heap, &hn, (uint64_t)r << 32 | (uint32_t)before);
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (syms[i] != GONE) syms[k++] = syms[i];
    return k;
}

/* The ids of one word (its bytes), appended to out; 0 on allocation failure. */
static int encode_word(bpe *b, scratch *s, const uint8_t *w, size_t n, ivec *out) {
    if (!n) return 1;
    /* Answers that need no cache (read-only tables, no lock): a byte that is a token, and with ignore_merges
     * a word that is a token -- most words of real text; the cache keeps the words that merge. */
    if (n == 1 && b->byte_ids[w[0]] >= 0) return ivec_push(out, b->byte_ids[w[0]]);
    int32_t id = b->ignore_merges ? whole_token(b, w, n) : -1;
    if (id >= 0) return ivec_push(out, id);
    if (wcache_get(b->cache, w, n, out)) return 1;
    if (!out->ok) return 0;
    size_t start = out->n;
    {
        if (!scratch_fit(s, n)) return 0;
        for (size_t i = 0; i < n; i++) s->syms[i] = b->byte_ids[w[i]];
        size_t k = n >= HEAP_MIN_LEN ? merge_heap(b, w, s, n) : merge_simple(b, w, s->syms, s->ranks, s->res, n);
        for (size_t i = 0; i < k; i++) {
            int32_t x = s->syms[i];
            if (x >= 0) {
                if (!ivec_push(out, x)) return 0;
                continue;
            }
            for (int j = 0; j < 2; j++) /* a byte whose character is no token (no merge names it) */
                if (b->byte_fallback[-x - 1][j] >= 0 && !ivec_push(out, b->byte_fallback[-x - 1][j])) return 0;
        }
    }
    wcache_put(b->cache, w, n, out->v + start, out->n - start);
    return 1;
}

int bpe_encode(bpe *b, const uint8_t *text, size_t n, int mode, const int64_t *cp_ends, size_t n_ends,
               const uint16_t *flags, ivec *out) {
    uint32_t *cps = NULL, *boff = NULL;
    size_t ncp = 0;
    ivec ends = {NULL, 0, 0, 1};
    scratch s = {0};
    int ok = 0;
    if (!utf8_decode(text, n, &cps, &boff, &ncp)) return 0;
    if (mode == SPLIT_WORDS) {
        int64_t prev = 0;
        for (size_t i = 0; i < n_ends; i++) {
            if (cp_ends[i] < prev || (uint64_t)cp_ends[i] > ncp) goto done;
            prev = cp_ends[i];
            if (!ivec_push(&ends, (int32_t)cp_ends[i])) goto done;
        }
        if ((size_t)prev != ncp) goto done;
    } else if (!(mode >= SPLIT_FALCON ? split_multi(mode, cps, ncp, flags, &ends)
                                      : split_words(mode, cps, ncp, flags, &ends))) {
        goto done;
    }
    free(cps);
    cps = NULL;
    size_t prev = 0;
    for (size_t i = 0; i < ends.n; i++) {
        size_t e = (size_t)ends.v[i];
        if (e < prev || e > ncp) goto done;
        if (!encode_word(b, &s, text + boff[prev], boff[e] - boff[prev], out)) goto done;
        prev = e;
    }
    ok = out->ok;
done:
    free(cps);
    free(boff);
    ivec_free(&ends);
    scratch_free(&s);
    return ok;
}
