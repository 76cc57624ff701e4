/* SentencePiece BPE as llama.cpp runs it (llm_tokenizer_spm), over the text's bytes: symbols are cut by the
 * length each lead byte announces (whatever follows: raw bytes as llama.cpp sees them); while some adjacent
 * pair of symbols concatenates to a token, the pair whose token has the highest score merges (ties: the
 * leftmost); each remaining symbol is its token, or (resegment) its bytes as byte tokens. Every merged symbol
 * is a token, so resegment's rev_merge step never applies to it.
 *
 * As encoders/spm.py: the text is cut into words before each U+2581 symbol whose left neighbour is a character
 * that no token holds just before U+2581 (no merge can cross there, so both sides merge alone, in the same
 * order), and words are cached; a word not in the cache is cut further between every two characters that no
 * token holds side by side, and each segment merges by a plain scan when short, by a heap + linked list when
 * long. Token lookups: a Bloom filter, then packed keys for tokens of up to 7 bytes, hashed bytes for longer.
 * Score order is a rank per token (smaller for higher scores, equal scores equal ranks, NaN last), as the
 * pure heap path. The tables are built once from Vocab.arrays(); after that the object is read-only except for
 * its word cache, which has its own lock, so threads share one. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define SPM_HEAP_MIN 48        /* symbols: a word this long merges by the heap */
#define SPM_MAX_WORD INT32_MAX /* symbol indexes are int32 */
#define SMALL 129              /* small symbols: ASCII and U+2581 */

/* The token tables, open addressing. Tokens of 1..7 bytes (most of what a merge asks about): the key is the
 * bytes packed with the length in the top byte (0: empty), one integer compared, id and rank in the same
 * slot. Longer ones: a small array of 32-bit hash keys (0: empty) probed, then bytes compared. */
typedef struct {
    int32_t id;
    uint32_t rank;
} spm_val;

typedef struct {
    uint64_t key;
    spm_val val;
} spm_short;

typedef struct {
    uint32_t off, len;
} spm_span;

/* A one-hash Bloom filter over every token's hash, 16 bits a token: most pairs a merge asks about are no token,
 * and this small bitset answers them without touching the tables. */

struct spm {
    uint8_t *blob; /* every token's bytes */
    uint64_t *bloom;
    size_t bloom_mask; /* words - 1, a power of two */
    spm_short *shorts;
    uint32_t *long_keys;
    spm_span *long_spans;
    spm_val *long_vals;
    size_t short_cap, long_cap;
    int32_t byte_ids[256]; /* llama.cpp's byte_to_token, -1 where the vocab has none */
    /* Built on the first encode (pairs_lock, pairs_ready), not at load: */
    uint8_t ascii_pairs[128 * 128 / 8]; /* two ASCII characters some token holds side by side */
    uint64_t *pairs;                     /* the other such pairs of characters: a << 21 | b, plus 1 (0: empty) */
    size_t pair_cap, pair_count;
    /* the symbols ASCII 0..127 and U+2581 (128), indexed directly: their tokens, and the token of each two */
    int32_t small_ids[SMALL];
    spm_val small_pairs[SMALL * SMALL];
    pthread_mutex_t pairs_lock;
    atomic_int pairs_ready; /* 1 built, -1 out of memory */
    wcache *cache;
};

static const uint8_t LEAD_LEN[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};

static uint64_t spm_hash(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        h = (h ^ x) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    return x ^ (x >> 33);
}

/* s[0..n) (n <= 7) packed with n in the top byte. Every caller's buffer has 8 readable bytes past s (token
 * blob and word copies are padded), so little-endian machines load them at once. */
static inline uint64_t pack7(const uint8_t *s, size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t x;
    memcpy(&x, s, 8);
    return (x & ((1ULL << (8 * n)) - 1)) | (uint64_t)n << 56;
#else
    uint64_t x = (uint64_t)n << 56;
    for (size_t i = 0; i < n; i++) x |= (uint64_t)s[i] << (8 * i);
    return x;
#endif
}

/* The id of the token whose bytes are s[0..n) (n >= 1) and its rank in *rank, or -1. */
static inline int32_t spm_find(const spm *m, const uint8_t *s, size_t n, uint32_t *rank) {
    size_t j;
    if (n <= 7) {
        uint64_t key = pack7(s, n), h = mix64(key);
        if (!(m->bloom[(h >> 32) & m->bloom_mask] >> (h >> 58) & 1)) return -1;
        size_t mask = m->short_cap - 1;
        for (j = (size_t)h & mask; m->shorts[j].key != key; j = (j + 1) & mask)
            if (!m->shorts[j].key) return -1;
        *rank = m->shorts[j].val.rank;
        return m->shorts[j].val.id;
    }
    uint64_t h = spm_hash(s, n);
    if (!(m->bloom[(h >> 32) & m->bloom_mask] >> (h >> 58) & 1)) return -1;
    uint32_t key = (uint32_t)(h >> 32) | 1;
    size_t mask = m->long_cap - 1;
    for (j = (size_t)h & mask; m->long_keys[j]; j = (j + 1) & mask) {
        const spm_span *t = &m->long_spans[j];
        if (m->long_keys[j] == key && t->len == n && memcmp(m->blob + t->off, s, n) == 0) {
            *rank = m->long_vals[j].rank;
            return m->long_vals[j].id;
        }
    }
    return -1;
}

/* The id of the token whose bytes are s[0..n) (n >= 1), or -1. */
static inline int32_t spm_lookup(const spm *m, const uint8_t *s, size_t n) {
    uint32_t rank;
    return spm_find(m, s, n, &rank);
}

/* The code point of s[0..k) when it is one well-formed-looking sequence (lead announcing k, k - 1
 * continuation bytes), else -1. The same test on tokens and on text: see spm_new's keep set. */
static inline int32_t one_char(const uint8_t *s, size_t k) {
    uint8_t c = s[0];
    if (k == 1) return c < 0x80 ? c : -1;
    if (k < 2 || k > 4 || LEAD_LEN[c >> 4] != k || (s[1] & 0xC0) != 0x80) return -1;
    if (k == 2) return (c & 0x1F) << 6 | (s[1] & 0x3F);
    if ((s[2] & 0xC0) != 0x80) return -1;
    if (k == 3) return (c & 0x0F) << 12 | (s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    if ((s[3] & 0xC0) != 0x80) return -1;
    int32_t cp = (c & 0x07) << 18 | (s[1] & 0x3F) << 12 | (s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    return cp <= MAX_CODE_POINT ? cp : -1;
}

static inline int is_space_mark(const uint8_t *s) { return s[0] == 0xE2 && s[1] == 0x96 && s[2] == 0x81; }

/* A score as a rank: smaller for higher scores, equal for equal scores (-0 is 0), every NaN after every number
 * and below UINT32_MAX (which the scan uses for "no pair"): the float's bits made to sort as unsigned ints,
 * reversed. The same order as llama.cpp's comparator on numbers, and as the pure heap's ranks. */
static uint32_t score_rank(float x) {
    if (isnan(x)) return UINT32_MAX - 1;
    if (x == 0) x = 0; /* -0.0 */
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x80000000u ? u : ~u & 0x7FFFFFFFu;
}

/* Whether some token holds the characters a, b side by side. */
static inline int has_pair(const spm *m, uint32_t a, uint32_t b) {
    if ((a | b) < 128) return m->ascii_pairs[(a << 7 | b) >> 3] >> (b & 7) & 1;
    if (!m->pair_cap) return 0;
    uint64_t key = ((uint64_t)a << 21 | b) + 1;
    size_t mask = m->pair_cap - 1;
    for (size_t i = (size_t)mix64(key) & mask; m->pairs[i]; i = (i + 1) & mask)
        if (m->pairs[i] == key) return 1;
    return 0;
}

static int put_pair(spm *m, uint32_t a, uint32_t b) {
    if ((a | b) < 128) {
        m->ascii_pairs[(a << 7 | b) >> 3] |= (uint8_t)(1u << (b & 7));
        return 1;
    }
    if ((m->pair_count + 1) * 2 > m->pair_cap) {
        size_t cap = m->pair_cap ? 2 * m->pair_cap : 4096;
        uint64_t *t = calloc(cap, sizeof *t);
        if (!t) return 0;
        for (size_t i = 0; i < m->pair_cap; i++) {
            uint64_t k = m->pairs[i];
            if (!k) continue;
            size_t j = (size_t)mix64(k) & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = k;
        }
        free(m->pairs);
        m->pairs = t;
        m->pair_cap = cap;
    }
    uint64_t key = ((uint64_t)a << 21 | b) + 1;
    size_t mask = m->pair_cap - 1, i = (size_t)mix64(key) & mask;
    for (; m->pairs[i]; i = (i + 1) & mask)
        if (m->pairs[i] == key) return 1;
    m->pairs[i] = key;
    m->pair_count++;
    return 1;
}

/* Every two characters (one_char sequences) that token w holds side by side. A superset is safe: a cut is
 * made only between two characters no token holds side by side, so no merge can cross it. In well-formed
 * UTF-8 the only such sequences are the characters in turn (a sequence ending where a character starts is the
 * one before it, and none starts inside one), so those are read in one pass; other tokens try every length. */
static int add_pairs(spm *m, const uint8_t *w, size_t len) {
    int32_t prev = -1;
    size_t p = 0;
    while (p < len) {
        size_t k = LEAD_LEN[w[p] >> 4];
        int32_t b = k <= len - p ? one_char(w + p, k) : -1;
        if (b < 0) break;
        if (prev >= 0 && !put_pair(m, (uint32_t)prev, (uint32_t)b)) return 0;
        prev = b;
        p += k;
    }
    if (p == len) return 1;
    for (size_t p = 1; p < len; p++) {
        size_t k2 = LEAD_LEN[w[p] >> 4];
        int32_t b = k2 <= len - p ? one_char(w + p, k2) : -1;
        if (b < 0) continue;
        for (size_t k1 = 1; k1 <= 4 && k1 <= p; k1++) {
            int32_t a = one_char(w + p - k1, k1);
            if (a >= 0 && !put_pair(m, (uint32_t)a, (uint32_t)b)) return 0;
        }
    }
    return 1;
}

/* A small symbol's bytes into b (3 bytes free); its length. */
static size_t small_bytes(int c, uint8_t *b) {
    if (c < 128) {
        b[0] = (uint8_t)c;
        return 1;
    }
    memcpy(b, "\xE2\x96\x81", 3);
    return 3;
}

/* The index of the symbol w[a..b) among the small ones, or -1. */
static inline int small_index(const uint8_t *w, uint32_t a, uint32_t b) {
    if (b - a == 1 && w[a] < 0x80) return w[a];
    return b - a == 3 && is_space_mark(w + a) ? 128 : -1;
}

/* The pair tables from every token text (each distinct text is in one of the token tables), and the small
 * symbols' tables. */
static int build_pairs(spm *m) {
    for (int a = 0; a < SMALL; a++) {
        uint8_t t[16] = {0};
        size_t la = small_bytes(a, t);
        uint32_t rank;
        m->small_ids[a] = spm_find(m, t, la, &rank);
        for (int b = 0; b < SMALL; b++) {
            size_t lb = small_bytes(b, t + la);
            int32_t id = spm_find(m, t, la + lb, &rank);
            m->small_pairs[a * SMALL + b] = (spm_val){id, id >= 0 ? rank : UINT32_MAX};
            memset(t + la, 0, 8);
        }
    }
    for (size_t j = 0; j < m->short_cap; j++) {
        uint64_t key = m->shorts[j].key;
        uint8_t w[16] = {0};
        size_t len = (size_t)(key >> 56);
        for (size_t i = 0; i < len; i++) w[i] = (uint8_t)(key >> (8 * i));
        if (key && !add_pairs(m, w, len)) return 0;
    }
    for (size_t j = 0; j < m->long_cap; j++)
        if (m->long_keys[j] && !add_pairs(m, m->blob + m->long_spans[j].off, m->long_spans[j].len)) return 0;
    return 1;
}

/* 1 once the pair tables are there (built by the first caller, under the lock), 0 when memory ran out. */
static int pairs_ready(spm *m) {
    int ready = atomic_load_explicit(&m->pairs_ready, memory_order_acquire);
    if (ready) return ready > 0;
    pthread_mutex_lock(&m->pairs_lock);
    ready = atomic_load_explicit(&m->pairs_ready, memory_order_relaxed);
    if (!ready) {
        ready = build_pairs(m) ? 1 : -1;
        atomic_store_explicit(&m->pairs_ready, ready, memory_order_release);
    }
    pthread_mutex_unlock(&m->pairs_lock);
    return ready > 0;
}

spm *spm_new(const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, size_t n_vocab, const float *scores,
             const int32_t *byte_ids, size_t cache_max_bytes, size_t cache_max_words) {
    if (n_vocab == 0 || n_vocab > INT32_MAX || tok_len >= UINT32_MAX) return NULL;
    spm *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (pthread_mutex_init(&m->pairs_lock, NULL) != 0) {
        free(m);
        return NULL;
    }
    for (int b = 0; b < 256; b++) {
        if (byte_ids[b] >= 0 && (size_t)byte_ids[b] >= n_vocab) goto fail;
        m->byte_ids[b] = byte_ids[b] >= 0 ? byte_ids[b] : -1;
    }
    m->blob = calloc(tok_len + 8, 1); /* padded for pack7 */
    m->cache = wcache_new(cache_max_bytes, cache_max_words);
    if (!m->blob || !m->cache) goto fail;
    if (tok_len) memcpy(m->blob, tok_bytes, tok_len);
    size_t n_short = 0;
    for (size_t t = 0; t < n_vocab; t++) {
        int64_t s = tok_off[t], e = tok_off[t + 1];
        if (s < 0 || e < s || (uint64_t)e > tok_len) goto fail;
        n_short += e - s <= 7;
    }
    m->short_cap = m->long_cap = 16;
    while (m->short_cap < n_short + n_short / 2) m->short_cap *= 2; /* load at most 2/3 */
    while (m->long_cap < 2 * (n_vocab - n_short)) m->long_cap *= 2;
    m->shorts = calloc(m->short_cap, sizeof *m->shorts);
    size_t words = 16;
    while (words * 4 < n_vocab) words *= 2; /* 16 bits or more a token */
    m->bloom_mask = words - 1;
    m->bloom = calloc(words, sizeof *m->bloom);
    m->long_keys = calloc(m->long_cap, sizeof *m->long_keys);
    m->long_spans = malloc(m->long_cap * sizeof *m->long_spans);
    m->long_vals = malloc(m->long_cap * sizeof *m->long_vals);
    if (!m->shorts || !m->bloom || !m->long_keys || !m->long_spans || !m->long_vals) goto fail;
    for (size_t t = 0; t < n_vocab; t++) {
        size_t len = (size_t)(tok_off[t + 1] - tok_off[t]);
        const uint8_t *w = m->blob + tok_off[t];
        uint32_t rank;
        if (!len || spm_find(m, w, len, &rank) >= 0) continue; /* no empty symbol; of duplicates the first */
        spm_val v = {(int32_t)t, score_rank(scores[t])};
        uint64_t bh = len <= 7 ? mix64(pack7(w, len)) : spm_hash(w, len);
        m->bloom[(bh >> 32) & m->bloom_mask] |= 1ULL << (bh >> 58);
        if (len <= 7) {
            uint64_t key = pack7(w, len);
            size_t mask = m->short_cap - 1, j = (size_t)mix64(key) & mask;
            while (m->shorts[j].key) j = (j + 1) & mask;
            m->shorts[j] = (spm_short){key, v};
        } else {
            uint64_t h = spm_hash(w, len);
            size_t mask = m->long_cap - 1, j = (size_t)h & mask;
            while (m->long_keys[j]) j = (j + 1) & mask;
            m->long_keys[j] = (uint32_t)(h >> 32) | 1;
            m->long_spans[j] = (spm_span){(uint32_t)tok_off[t], (uint32_t)len};
            m->long_vals[j] = v;
        }
    }
    return m;
fail:
    spm_free(m);
    return NULL;
}

void spm_free(spm *m) {
    if (!m) return;
    free(m->blob);
    free(m->shorts);
    free(m->bloom);
    free(m->long_keys);
    free(m->long_spans);
    free(m->long_vals);
    free(m->pairs);
    wcache_free(m->cache);
    pthread_mutex_destroy(&m->pairs_lock);
    free(m);
}

wcache *spm_cache(spm *m) { return m->cache; }

/* Scratch space of one encode call for the heap merge of long segments, grown to the longest (in symbols). */
typedef struct {
    uint32_t *start;
    int32_t *nxt, *prv;
    uint64_t *heap;
    size_t cap, heap_cap;
} spm_scratch;

static int fit(spm_scratch *s, size_t n) {
    if (n <= s->cap) return 1;
    if (n > SIZE_MAX / 8) return 0;
    void **slots[3] = {(void **)&s->start, (void **)&s->nxt, (void **)&s->prv};
    for (int i = 0; i < 3; i++) {
        void *p = realloc(*slots[i], n * 4);
        if (!p) return 0;
        *slots[i] = p;
    }
    s->cap = n;
    return 1;
}

static void scratch_release(spm_scratch *s) {
    free(s->start);
    free(s->nxt);
    free(s->prv);
    free(s->heap);
}

/* Emit symbol w[a..b) with token id (or -1: its bytes as byte tokens). 0: no byte token, or no memory (out->ok
 * cleared). */
static int emit(const spm *m, const uint8_t *w, size_t a, size_t b, int32_t id, ivec *out) {
    if (id >= 0) return ivec_push(out, id);
    for (size_t i = a; i < b; i++) {
        int32_t x = m->byte_ids[w[i]];
        if (x < 0 || !ivec_push(out, x)) return 0;
    }
    return 1;
}

/* Segments of fewer symbols merge by the plain scan, on the stack; longer ones by the heap. */
#define SCAN_MAX SPM_HEAP_MIN
#define NO_PAIR UINT32_MAX /* the rank of a pair that is no token (score_rank never gives it) */

/* The pair (l, r) of the scan: the token of w[st[l]..end) and its rank, or -1 and NO_PAIR. */
static inline int32_t scan_pair(const spm *m, const uint8_t *w, uint32_t a, uint32_t end, uint32_t *rank) {
    int32_t id = spm_find(m, w + a, end - a, rank);
    if (id < 0) *rank = NO_PAIR;
    return id;
}

/* The plain scan over n (2..SCAN_MAX) symbols starting at st[0..n) (st[n]: the segment's end), small[i] each
 * symbol's small index or -1. Symbols are linked (a merged-away one keeps rank NO_PAIR, so the scan for the
 * best pair -- lowest rank, leftmost on ties, as llama.cpp's queue -- passes over it); a merge looks up the
 * two pairs it changes. Symbol 0 is never merged away, so it is always the first one. */
static int merge_scan(const spm *m, const uint8_t *w, const uint32_t *st, const int16_t *small, size_t n,
                      ivec *out) {
    int32_t sid[SCAN_MAX], pid[SCAN_MAX], nxt[SCAN_MAX], prv[SCAN_MAX];
    uint32_t rk[SCAN_MAX];
    for (size_t i = 0; i < n; i++) {
        sid[i] = small[i] >= 0 ? m->small_ids[small[i]] : -2; /* -2: not looked up */
        nxt[i] = (int32_t)i + 1;
        prv[i] = (int32_t)i - 1;
        if (i + 1 == n) {
            pid[i] = -1;
            rk[i] = NO_PAIR;
        } else if (small[i] >= 0 && small[i + 1] >= 0) {
            spm_val v = m->small_pairs[small[i] * SMALL + small[i + 1]];
            pid[i] = v.id;
            rk[i] = v.rank;
        } else {
            pid[i] = scan_pair(m, w, st[i], st[i + 2], &rk[i]);
        }
    }
    /* st[nxt[i]] is the end of live symbol i: st[n] ends the last */
    for (;;) {
        size_t best = 0;
        uint32_t br = rk[0];
        for (size_t i = 1; i + 1 < n; i++)
            if (rk[i] < br) {
                br = rk[i];
                best = i;
            }
        if (br == NO_PAIR) break;
        int32_t r = nxt[best], after = nxt[r];
        sid[best] = pid[best];
        rk[r] = NO_PAIR;
        nxt[best] = after;
        if ((size_t)after < n) {
            prv[after] = (int32_t)best;
            pid[best] = scan_pair(m, w, st[best], st[nxt[after]], &rk[best]);
        } else {
            rk[best] = NO_PAIR;
        }
        if (best > 0) {
            int32_t p = prv[best];
            pid[p] = scan_pair(m, w, st[p], st[after], &rk[p]);
        }
    }
    for (size_t i = 0; i < n; i = (size_t)nxt[i]) {
        uint32_t a = st[i], b = st[nxt[i]];
        int32_t id = sid[i] != -2 ? sid[i] : spm_lookup(m, w + a, b - a);
        if (!emit(m, w, a, b, id, out)) return 0;
    }
    return 1;
}

#define GONE UINT32_MAX

/* End of live symbol i: the start of the next live one, or the word's end. */
static inline uint32_t sym_end(const spm_scratch *s, int32_t i, size_t len) {
    return s->nxt[i] >= 0 ? s->start[s->nxt[i]] : (uint32_t)len;
}

/* Push the pair (l, r) when it is a token: key rank << 32 | l, the smallest first (llama.cpp's order). */
static void push_pair(const spm *m, spm_scratch *s, const uint8_t *w, size_t len, int32_t l, size_t *hn) {
    if (l < 0 || s->nxt[l] < 0) return;
    uint32_t a = s->start[l], b = sym_end(s, s->nxt[l], len), rank;
    if (spm_find(m, w + a, b - a, &rank) >= 0) heap_push(s->heap, hn, (uint64_t)rank << 32 | (uint32_t)l);
}

/* The heap (bpe.c's) + linked list over the symbols of w[0..len). An entry is stale when its left symbol is
 * gone, has no right neighbour, or the pair there now has another rank; one of equal key and rank names the
 * same merge. Every push but the first n - 1 follows a merge, which follows a pop, so the heap holds fewer
 * than 2n keys. */
static int merge_heap(const spm *m, spm_scratch *s, const uint8_t *w, size_t len, ivec *out) {
    if (len >= SPM_MAX_WORD || !fit(s, len + 1)) {
        out->ok = 0; /* counted as memory: Python hands over less than 2 GiB */
        return 0;
    }
    uint32_t *st = s->start;
    size_t n = 0;
    for (size_t p = 0; p < len; n++) {
        st[n] = (uint32_t)p;
        size_t k = LEAD_LEN[w[p] >> 4];
        p += k < len - p ? k : len - p;
    }
    if (2 * n > s->heap_cap) {
        uint64_t *h = realloc(s->heap, 2 * n * sizeof *h);
        if (!h) {
            out->ok = 0;
            return 0;
        }
        s->heap = h;
        s->heap_cap = 2 * n;
    }
    int32_t *nxt = s->nxt, *prv = s->prv;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(m, s, w, len, (int32_t)i, &hn);
    while (hn) {
        uint64_t key = heap_pop(s->heap, &hn);
        int32_t l = (int32_t)(key & 0xFFFFFFFFu);
        if (st[l] == GONE) continue;
        int32_t r = nxt[l];
        if (r < 0) continue;
        uint32_t a = st[l], b = sym_end(s, r, len);
        uint32_t rank;
        if (spm_find(m, w + a, b - a, &rank) < 0 || rank != key >> 32) continue;
        int32_t after = nxt[r];
        st[r] = GONE;
        nxt[l] = after;
        if (after >= 0) prv[after] = l;
        push_pair(m, s, w, len, l, &hn);
        push_pair(m, s, w, len, prv[l], &hn);
    }
    for (int32_t i = 0; i >= 0; i = nxt[i]) {
        uint32_t a = st[i], b = sym_end(s, i, len);
        if (!emit(m, w, a, b, spm_lookup(m, w + a, b - a), out)) return 0;
    }
    return 1;
}

/* Merge one segment w[0..len) (no cut applies inside; len >= 1; the text it lies in is padded for pack7) and
 * append its ids. Symbols are llama.cpp's: the length each lead byte announces, whatever follows. A segment of
 * one symbol is its token; up to SCAN_MAX symbols merge by the scan, more by the heap. */
static int merge_segment(const spm *m, spm_scratch *s, const uint8_t *w, size_t len, ivec *out) {
    uint32_t st[SCAN_MAX + 1];
    int16_t small[SCAN_MAX];
    size_t n = 0, p = 0;
    while (p < len && n < SCAN_MAX) {
        uint8_t c = w[p];
        size_t k = LEAD_LEN[c >> 4];
        if (k > len - p) k = len - p;
        st[n] = (uint32_t)p;
        small[n++] = k == 1 ? (c < 0x80 ? c : -1) : k == 3 && is_space_mark(w + p) ? 128 : -1;
        p += k;
    }
    if (p < len) return merge_heap(m, s, w, len, out);
    st[n] = (uint32_t)len;
    if (n == 1) return emit(m, w, 0, len, small[0] >= 0 ? m->small_ids[small[0]] : spm_lookup(m, w, len), out);
    return merge_scan(m, w, st, small, n, out);
}

/* A word whose segments are looked up in the cache too: one too large to be cached whole, whose segments
 * (the pieces of Japanese text between spaces) recur. */
#define SEGMENT_CACHE_MIN 256

/* The character at w[p] (p < len) as the cut sees it: its code point (-1: no one_char sequence), its length in
 * *k. */
static inline int32_t char_at(const uint8_t *w, size_t p, size_t len, size_t *k) {
    uint8_t c = w[p];
    if (c < 0x80) {
        *k = 1;
        return c;
    }
    size_t n = LEAD_LEN[c >> 4];
    *k = n = n < len - p ? n : len - p;
    return one_char(w + p, n);
}

/* The ids of one word (w[0..len), in padded text), appended to out: from the cache, else merged a segment at
 * a time, each segment ending between two characters that no token holds side by side (no merge crosses
 * there). */
static int encode_word(spm *m, spm_scratch *s, const uint8_t *w, size_t len, ivec *out) {
    if (!len) return 1;
    if (wcache_get(m->cache, w, len, out)) return 1;
    if (!out->ok) return 0;
    size_t at = out->n, seg = 0, p = 0, k;
    int32_t a = -1;
    while (p < len) {
        int32_t b = char_at(w, p, len, &k);
        if (a >= 0 && b >= 0 && !has_pair(m, (uint32_t)a, (uint32_t)b)) {
            if (!(len >= SEGMENT_CACHE_MIN ? encode_word(m, s, w + seg, p - seg, out)
                                           : merge_segment(m, s, w + seg, p - seg, out)))
                return 0;
            seg = p;
        }
        a = b;
        p += k;
    }
    if (seg == 0) {
        if (!merge_segment(m, s, w, len, out)) return 0;
    } else if (!(len >= SEGMENT_CACHE_MIN ? encode_word(m, s, w + seg, len - seg, out)
                                          : merge_segment(m, s, w + seg, len - seg, out))) {
        return 0;
    }
    wcache_put(m->cache, w, len, out->v + at, out->n - at);
    return 1;
}

/* Where the words of text[0..n) (8 readable bytes after it, for pack7) end: before each U+2581 symbol whose
 * left neighbour is a character that no token holds before U+2581. Valid UTF-8 (a str's) is searched for
 * U+2581 with memchr; other bytes are walked a symbol at a time, since a lead byte there may take the next
 * bytes whatever they are. */
static int encode_text(spm *m, const uint8_t *text, size_t n, int valid_utf8, ivec *out) {
    spm_scratch s = {0};
    size_t word = 0, p = 0;
    int ok = 1;
    if (valid_utf8) {
        const uint8_t *q;
        while (ok && p < n && (q = memchr(text + p, 0xE2, n - p)) != NULL) {
            p = (size_t)(q - text);
            if (p > word && n - p >= 3 && is_space_mark(q)) {
                size_t a = p - 1; /* the character before: back over continuation bytes */
                while (a > word && (text[a] & 0xC0) == 0x80) a--;
                int32_t cp = one_char(text + a, p - a);
                if (cp >= 0 && !has_pair(m, (uint32_t)cp, 0x2581)) {
                    ok = encode_word(m, &s, text + word, p - word, out);
                    word = p;
                }
            }
            p++;
        }
    } else {
        size_t prev = 0; /* the start of the symbol before p */
        while (ok && p < n) {
            size_t k = LEAD_LEN[text[p] >> 4];
            if (k > n - p) k = n - p;
            if (k == 3 && p > word && is_space_mark(text + p)) {
                int32_t cp = one_char(text + prev, p - prev);
                if (cp >= 0 && !has_pair(m, (uint32_t)cp, 0x2581)) {
                    ok = encode_word(m, &s, text + word, p - word, out);
                    word = p;
                }
            }
            prev = p;
            p += k;
        }
    }
    if (ok) ok = encode_word(m, &s, text + word, n - word, out);
    scratch_release(&s);
    return ok && out->ok;
}

int spm_encode(spm *m, const uint8_t *text, size_t n, int valid_utf8, ivec *out) {
    uint8_t *buf = n <= SIZE_MAX - 8 ? malloc(n + 8) : NULL; /* a padded copy: merges read it 8 bytes at once */
    if (!buf || !pairs_ready(m)) {
        free(buf);
        out->ok = 0;
        return 0;
    }
    if (n) memcpy(buf, text, n);
    memset(buf + n, 0, 8);
    int ok = encode_text(m, buf, n, valid_utf8, out);
    free(buf);
    return ok;
}

/* Below this many characters the buffer is sized for the worst case (3 or 4 bytes a character) instead of
 * counted. */
#define PLAIN_COUNT_MIN (1 << 16)

int spm_encode_plain(spm *m, const void *chars, size_t n, int kind, int add_prefix, ivec *out) {
    if (kind != 1 && kind != 2 && kind != 4) return -1;
    if (!n) return 1;
    if (n > (SIZE_MAX - 16) / 4) {
        out->ok = 0;
        return 0;
    }
    /* room: the UTF-8, the prefix, 8 bytes of padding (which also take the writer's 3 bytes past the end) */
    int bad = 0;
    size_t cap = (n < PLAIN_COUNT_MIN ? n * (kind == 4 ? 4 : 3) : ucs_utf8_size(chars, n, kind, 1, &bad)) + 3 + 8;
    if (bad) return -1;
    uint8_t *buf = malloc(cap);
    if (!buf || !pairs_ready(m)) {
        free(buf);
        out->ok = 0;
        return 0;
    }
    size_t o = add_prefix ? ucs_utf8_write(" ", 1, 1, 1, buf, &bad) : 0;
    o += ucs_utf8_write(chars, n, kind, 1, buf + o, &bad);
    if (bad) { /* a surrogate hands the text back: the caller's escaping path decides */
        free(buf);
        return -1;
    }
    memset(buf + o, 0, 8);
    int ok = encode_text(m, buf, o, 1, out);
    free(buf);
    return ok;
}
