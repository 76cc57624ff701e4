/* BPE as llama.cpp runs it (llm_tokenizer_bpe), over token ids: each word's bytes start as their byte tokens
 * (byte-level vocabs), or its UTF-8 characters as their tokens (SPM-style BPE: gemma4, raw UTF-8 with spaces as
 * U+2581 and <0xXX> byte tokens for a character that is no token); while some adjacent pair is a merge, the
 * pair of lowest rank merges (ties: the leftmost).
 * Short words by a plain scan (in lanes, several words at once), long ones (HEAP_MIN_LEN bytes and more) by a
 * heap + linked list, as encoders/bpe.py. The merge table is built from Vocab.arrays() at load; symbols are always tokens (the
 * Python side hands over only vocabs where every applicable merge makes a token). */
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define HEAP_MIN_LEN 48
#define EMPTY_KEY UINT64_MAX
#define GONE INT32_MIN /* a symbol merged into its left neighbour */
/* Ids a symbol can become: a byte-level symbol up to 2 fallback ids, a character up to its 4 bytes' <0xXX>. */
#define MAX_IDS_PER_SYM 4
/* Character mode: a symbol that is no token is -(cp + 1), or -(BAD_BYTE + b + 1) for a byte b that starts no
 * well-formed sequence (utf8_next's U+FFFD of length 1). */
#define BAD_BYTE 0x110000

typedef struct {
    uint64_t key; /* left << 32 | right */
    int32_t rank, result;
} pair_slot;

/* A whole token by its raw bytes: the first 16 in the slot (one cache line to look at for most words), the rest
 * at raw + raw_off[id]. len 0: an empty slot. */
typedef struct {
    uint64_t k0, k1;
    uint32_t len;
    int32_t id;
} tok_slot;

struct bpe {
    pair_slot *pairs;
    size_t pair_cap;
    int32_t byte_ids[256];       /* each byte's token, or -(b + 1) for a byte whose character is no token */
    int32_t byte_fallback[256][2]; /* the ids such a byte becomes instead (-1: none), as encoders/bpe.py */
    uint64_t *byte_pairs;          /* [a << 8 | b]: pair_key of the pair of bytes a, b */
    int ignore_merges;
    tok_slot *toks; /* ignore_merges: a token's raw bytes -> its id */
    size_t tok_cap;
    uint8_t *raw;     /* the tokens' raw bytes (byte-level text decoded) */
    uint32_t *raw_off; /* where each token's raw bytes start in raw */
    wcache *cache;
    int chars;              /* symbols start as UTF-8 characters, not bytes (SPM-style BPE) */
    int escape_spaces;      /* character mode: a space is the character U+2581 */
    int32_t *char_ids;      /* character mode: [cp] the token of that one code point + 1, 0 for none */
    int32_t *newline_ids;   /* [k - 1]: the token of a run of k newlines kept whole, -1 for none (n_newline runs) */
    size_t n_newline;
};

#define CHAR_IDS_BYTES ((size_t)(MAX_CODE_POINT + 1) * sizeof(int32_t))

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* rank and result of the pair (a, b); rank -1 when it is no merge. */
static inline int32_t pair_rank(const bpe *b, int32_t l, int32_t r, int32_t *result) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    size_t mask = b->pair_cap - 1;
    for (size_t i = (size_t)key_mix(key) & mask;; i = (i + 1) & mask) {
        const pair_slot *s = &b->pairs[i];
        if (s->key == key) {
            *result = s->result;
            return s->rank;
        }
        if (s->key == EMPTY_KEY) return -1;
    }
}

/* A pair's rank and result as one number that orders by rank: NO_PAIR (above all) when it is no merge. */
#define NO_PAIR UINT64_MAX
static inline uint64_t pair_key(int32_t rank, int32_t result) {
    return rank < 0 ? NO_PAIR : (uint64_t)rank << 32 | (uint32_t)result;
}

/* Start loading the slot where the pair (l, r) is looked for: the two lookups after a merge then wait for
 * memory once, not twice (the pair table is far larger than the caches). always_inline: GCC 12 finds a plain
 * static function whose only effect is a prefetch "const" and deletes its calls, prefetch and all. */
__attribute__((always_inline)) static inline void pair_prefetch(const bpe *b, int32_t l, int32_t r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    __builtin_prefetch(&b->pairs[(size_t)key_mix(key) & (b->pair_cap - 1)]);
}

/* The slot of the token of raw bytes w[0..n) (n >= 1, key k), or the empty slot where it would go. */
static inline size_t tok_slot_of(const bpe *b, const uint8_t *w, size_t n, const word_key *k) {
    size_t mask = b->tok_cap - 1, j = (size_t)k->hash & mask;
    for (;; j = (j + 1) & mask) {
        const tok_slot *x = &b->toks[j];
        if (!x->len) return j;
        if (x->len == n && x->k0 == k->k0 && x->k1 == k->k1 &&
            (n <= 16 || memcmp(b->raw + b->raw_off[x->id] + 16, w + 16, n - 16) == 0))
            return j;
    }
}

/* The whole-token table (ignore_merges): each token whose text is byte-level characters, by its raw bytes. */
static int build_tokens(bpe *b, const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, size_t n_vocab,
                        const int32_t *byte_chars) {
    int16_t inv[0x200];
    for (size_t i = 0; i < 0x200; i++) inv[i] = -1;
    for (int i = 0; i < 256; i++)
        if (byte_chars[i] >= 0 && byte_chars[i] < 0x200) inv[byte_chars[i]] = (int16_t)i;
    if (tok_len >= UINT32_MAX || n_vocab >= UINT32_MAX / 2) return 0;
    b->raw = malloc(tok_len ? tok_len : 1);
    b->raw_off = malloc(n_vocab * sizeof *b->raw_off);
    b->tok_cap = pow2_at_least(2 * n_vocab);
    b->toks = b->tok_cap <= SIZE_MAX / sizeof *b->toks ? big_alloc(b->tok_cap * sizeof *b->toks, 1) : NULL;
    if (!b->raw || !b->raw_off || !b->toks) return 0;
    size_t used = 0;
    for (size_t t = 0; t < n_vocab; t++) {
        int64_t s = tok_off[t], e = tok_off[t + 1];
        if (s < 0 || e < s || (uint64_t)e > tok_len) return 0;
        size_t start = used, i = (size_t)s, ok = 1;
        while (i < (size_t)e) {
            size_t len;
            uint32_t cp = utf8_next(tok_bytes + i, (size_t)e - i, &len);
            if (cp >= 0x200 || inv[cp] < 0) {
                ok = 0;
                break;
            }
            b->raw[used++] = (uint8_t)inv[cp];
            i += len;
        }
        b->raw_off[t] = (uint32_t)start;
        if (!ok || used == start) {
            used = start;
            continue;
        }
        word_key k;
        word_key_of(b->raw + start, used - start, &k);
        size_t j = tok_slot_of(b, b->raw + start, used - start, &k);
        if (b->toks[j].len) { /* two texts of the same bytes cannot be (token texts are unique); keep the first */
            used = start;
            continue;
        }
        b->toks[j] = (tok_slot){k.k0, k.k1, (uint32_t)(used - start), (int32_t)t};
    }
    return 1;
}

/* Character mode: every token of exactly one code point, by that code point (the last of equal texts, as
 * Vocab.token_to_id). */
static int build_chars(bpe *b, const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, size_t n_vocab) {
    b->char_ids = big_alloc(CHAR_IDS_BYTES, 1);
    if (!b->char_ids) return 0;
    for (size_t t = 0; t < n_vocab; t++) {
        int64_t s = tok_off[t], e = tok_off[t + 1];
        if (s < 0 || e < s || (uint64_t)e > tok_len) return 0;
        if (e == s || e - s > 4) continue;
        size_t len;
        uint32_t cp = utf8_next(tok_bytes + s, (size_t)(e - s), &len);
        if (len != (size_t)(e - s) || (cp == 0xFFFD && len == 1) || cp > MAX_CODE_POINT) continue;
        b->char_ids[cp] = (int32_t)t + 1;
    }
    return 1;
}

bpe *bpe_new(const int32_t *merges, size_t n_merges, const int32_t *byte_ids, const uint8_t *tok_bytes,
             size_t tok_len, const int64_t *tok_off, size_t n_vocab, const int32_t *byte_chars,
             int ignore_merges, size_t cache_max_bytes, size_t cache_max_words, const bpe_chars *chars) {
    if (n_vocab == 0 || n_vocab > INT32_MAX || n_merges > INT32_MAX) return NULL;
    if (chars && (ignore_merges || (chars->n_newline && !chars->newline_ids))) return NULL;
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
    b->pairs = b->pair_cap <= SIZE_MAX / sizeof *b->pairs ? big_alloc(b->pair_cap * sizeof *b->pairs, 0) : NULL;
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
        size_t mask = b->pair_cap - 1, i = (size_t)key_mix(key) & mask;
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
        int32_t res = -1, rank = l >= 0 && r >= 0 ? pair_rank(b, l, r, &res) : -1;
        b->byte_pairs[i] = pair_key(rank, res);
    }
    b->ignore_merges = ignore_merges;
    if (ignore_merges && !build_tokens(b, tok_bytes, tok_len, tok_off, n_vocab, byte_chars)) {
        bpe_free(b);
        return NULL;
    }
    if (chars) {
        b->chars = 1;
        b->escape_spaces = chars->escape_spaces;
        b->n_newline = chars->n_newline;
        b->newline_ids = malloc((chars->n_newline ? chars->n_newline : 1) * sizeof *b->newline_ids);
        if (!b->newline_ids || !build_chars(b, tok_bytes, tok_len, tok_off, n_vocab)) {
            bpe_free(b);
            return NULL;
        }
        for (size_t k = 0; k < chars->n_newline; k++) {
            int32_t id = chars->newline_ids[k];
            b->newline_ids[k] = id >= 0 && (size_t)id < n_vocab ? id : -1;
        }
    }
    return b;
}

void bpe_free(bpe *b) {
    if (!b) return;
    big_free(b->pairs, b->pair_cap * sizeof *b->pairs);
    free(b->byte_pairs);
    big_free(b->toks, b->tok_cap * sizeof *b->toks);
    free(b->raw);
    free(b->raw_off);
    big_free(b->char_ids, CHAR_IDS_BYTES);
    free(b->newline_ids);
    wcache_free(b->cache);
    free(b);
}

wcache *bpe_cache(bpe *b) { return b->cache; }

/* A word's first symbols (n >= 1 bytes): its bytes' tokens, or in character mode its characters' (a character
 * that is no token as its marker, an escaped space as U+2581); the count returned (at most n). */
static size_t init_syms(const bpe *b, const uint8_t *w, size_t n, int32_t *syms) {
    if (!b->chars) {
        for (size_t i = 0; i < n; i++) syms[i] = b->byte_ids[w[i]];
        return n;
    }
    size_t k = 0, len;
    for (size_t i = 0; i < n; i += len) {
        if (w[i] < 0x80) { /* byte_ids holds the ASCII characters' tokens, escaped space included, or markers */
            len = 1;
            syms[k++] = b->byte_ids[w[i]];
            continue;
        }
        uint32_t cp = utf8_next(w + i, n - i, &len);
        if ((cp == 0xFFFD && len == 1) || cp > MAX_CODE_POINT) {
            len = 1;
            syms[k++] = -(int32_t)(BAD_BYTE + w[i]) - 1;
            continue;
        }
        int32_t id = b->char_ids[cp] - 1;
        syms[k++] = id >= 0 ? id : -(int32_t)cp - 1;
    }
    return k;
}

/* The key of the pair of first symbols i, i + 1 of word w (pair_key): byte pairs from their table. */
static inline uint64_t first_pair(const bpe *b, const uint8_t *w, const int32_t *syms, size_t i) {
    if (!b->chars) return b->byte_pairs[w[i] << 8 | w[i + 1]];
    int32_t res = -1, rank = syms[i] >= 0 && syms[i + 1] >= 0 ? pair_rank(b, syms[i], syms[i + 1], &res) : -1;
    return pair_key(rank, res);
}

/* Scratch space of one encode call for the heap merge of long words, grown to the longest. */
typedef struct {
    int32_t *syms, *nxt, *prv;
    uint64_t *heap;
    size_t cap;
} scratch;

static int scratch_fit(scratch *s, size_t n) {
    if (n <= s->cap) return 1;
    if (n > SIZE_MAX / 2 / sizeof(uint64_t)) return 0;
    int32_t **slots[3] = {&s->syms, &s->nxt, &s->prv};
    for (int i = 0; i < 3; i++) {
        int32_t *p = realloc(*slots[i], n * sizeof(int32_t));
        if (!p) return 0;
        *slots[i] = p;
    }
    uint64_t *h = realloc(s->heap, 2 * n * sizeof(uint64_t));
    if (!h) return 0;
    s->heap = h;
    s->cap = n;
    return 1;
}

static void scratch_free(scratch *s) {
    free(s->syms);
    free(s->nxt);
    free(s->prv);
    free(s->heap);
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
static size_t merge_heap(const bpe *b, const uint8_t *w, scratch *s, size_t n) { /* n symbols */
    int32_t *syms = s->syms, *nxt = s->nxt, *prv = s->prv, res;
    uint64_t *heap = s->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint64_t k = first_pair(b, w, syms, i);
        if (k != NO_PAIR) heap_push(heap, &hn, (k & 0xFFFFFFFF00000000ULL) | i);
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

/* A merged word's symbols as ids, appended to dst (room for MAX_IDS_PER_SYM a symbol is the caller's): a symbol
 * that is a byte whose character is no token (no merge names it) becomes its fallback ids; in character mode a
 * character that is no token becomes its bytes' <0xXX> tokens (bytes without one dropped, as llama.cpp). */
static size_t syms_to_ids(const bpe *b, const int32_t *syms, size_t kept, int32_t *dst) {
    size_t m = 0;
    for (size_t i = 0; i < kept; i++) {
        int32_t x = syms[i];
        if (x >= 0) {
            dst[m++] = x;
            continue;
        }
        if (b->chars) {
            uint32_t c = (uint32_t)-(x + 1);
            uint8_t u[4];
            size_t k = c >= BAD_BYTE ? (u[0] = (uint8_t)(c - BAD_BYTE), 1) : utf8_put(u, c);
            for (size_t j = 0; j < k; j++)
                if (b->byte_fallback[u[j]][0] >= 0) dst[m++] = b->byte_fallback[u[j]][0];
            continue;
        }
        for (int j = 0; j < 2; j++)
            if (b->byte_fallback[-x - 1][j] >= 0) dst[m++] = b->byte_fallback[-x - 1][j];
    }
    return m;
}

/* The ids of a word (n >= 1 bytes, key k) that need no merging, appended to out: a byte that is a token, with
 * ignore_merges a word that is a token (read-only tables, no lock: most words of real text), else a word in
 * the cache (the words that merge). 1 found, -1 not found, 0 out of memory. */
static int known_word(bpe *b, const uint8_t *w, size_t n, const word_key *k, ivec *out) {
    if (n == 1 && b->byte_ids[w[0]] >= 0) return ivec_push(out, b->byte_ids[w[0]]);
    if (w[0] == '\n' && n <= b->n_newline && b->newline_ids[n - 1] >= 0) { /* a run of newlines kept whole */
        size_t i = 1;
        while (i < n && w[i] == '\n') i++;
        if (i == n) return ivec_push(out, b->newline_ids[n - 1]);
    }
    if (b->ignore_merges) {
        const tok_slot *x = &b->toks[tok_slot_of(b, w, n, k)];
        if (x->len) return ivec_push(out, x->id);
    }
    if (wcache_get_h(b->cache, k->hash, w, n, out)) return 1;
    return out->ok ? -1 : 0;
}

/* A word known_word did not know, merged now (the heap; bpe_encode gives the lanes below the words of 2 to
 * HEAP_MIN_LEN - 1 bytes), its ids appended to out and put in the cache; 0 on allocation failure. */
static int merge_word(bpe *b, scratch *s, const uint8_t *w, size_t n, const word_key *k, ivec *out) {
    int32_t one; /* a word of one byte has nothing to merge */
    int32_t *syms = &one;
    if (n > 1) {
        if (!scratch_fit(s, n)) return 0;
        syms = s->syms;
    }
    size_t m = init_syms(b, w, n, syms);
    size_t kept = m > 1 ? merge_heap(b, w, s, m) : m;
    if (!ivec_room(out, MAX_IDS_PER_SYM * kept)) return 0;
    size_t start = out->n;
    out->n += syms_to_ids(b, syms, kept, out->v + start);
    wcache_put_h(b->cache, k->hash, w, n, out->v + start, out->n - start);
    return 1;
}

/* New short words are merged by the plain scan: the pair_key of every adjacent pair kept (pk), the smallest is
 * the merge of lowest rank, the leftmost of equals (the same rank is the same merge), two keys updated a merge.
 * Not one word after another: the steps of LANES words are taken in turn, one step of each before the next of
 * any, so the pair-table lookups a step needs (a cache miss each: the table is megabytes) are prefetched and
 * arrive while the other lanes step. A lane whose word is done takes the next
 * one, so the lanes stay full. The words wait in a window of up to WINDOW (the same word twice is one entry),
 * their ids as markers -(j + 1) in the output (ids are >= 0) until the window is merged (full, or TAIL_MAX ids
 * past its first marker: the copy that replacing the markers makes stays small); then the markers are replaced
 * in order. */
#define LANES 8
#define WINDOW 64
#define TAIL_MAX 4096
#define DUE_NONE SIZE_MAX

typedef struct {
    const uint8_t *w;
    size_t n;
    uint64_t hash;
    size_t start, nids; /* its ids in the window's res */
} pending;

typedef struct {
    size_t word; /* its pending entry */
    size_t nsym;
    size_t due; /* the symbol whose pairs with its neighbours need their ranks (a merge left it), or DUE_NONE */
    int32_t syms[HEAP_MIN_LEN];
    uint64_t pk[HEAP_MIN_LEN];
} lane;

typedef struct {
    pending p[WINDOW];
    size_t n;
    size_t first; /* where the first marker is in the output (when n > 0) */
    lane lanes[LANES];
    ivec res;  /* the merged words' ids */
    ivec tail; /* the output from first on, while the markers are replaced */
} batch;

/* A lane's start on pending word j (2 <= n < HEAP_MIN_LEN): its bytes' tokens, their pairs' keys. */
static void lane_start(const bpe *b, lane *l, const pending *p, size_t j) {
    const uint8_t *w = p->w;
    size_t n = p->n;
    l->word = j;
    l->due = DUE_NONE;
    l->nsym = n = init_syms(b, w, n, l->syms);
    for (size_t i = 0; i + 1 < n; i++) l->pk[i] = first_pair(b, w, l->syms, i);
}

/* One step of the plain scan: the ranks the last merge left due, then the merge of lowest rank (its new pairs
 * prefetched and left due for the next step). 0 when the word is done. */
static int lane_step(const bpe *b, lane *l) {
    int32_t *syms = l->syms, res = -1, r;
    uint64_t *pk = l->pk;
    size_t n = l->nsym;
    if (l->due != DUE_NONE) {
        size_t at = l->due;
        if (at + 1 < n) {
            r = pair_rank(b, syms[at], syms[at + 1], &res);
            pk[at] = pair_key(r, res);
        }
        if (at > 0) {
            r = pair_rank(b, syms[at - 1], syms[at], &res);
            pk[at - 1] = pair_key(r, res);
        }
        l->due = DUE_NONE;
    }
    if (n < 2) return 0;
    size_t best = 0;
    uint64_t low = pk[0];
    for (size_t i = 1; i + 1 < n; i++)
        if (pk[i] < low) {
            low = pk[i];
            best = i;
        }
    if (low == NO_PAIR) return 0;
    syms[best] = (int32_t)(uint32_t)low;
    memmove(syms + best + 1, syms + best + 2, (n - best - 2) * sizeof *syms);
    memmove(pk + best, pk + best + 1, (n - best - 2) * sizeof *pk);
    l->nsym = --n;
    if (best + 1 < n) pair_prefetch(b, syms[best], syms[best + 1]);
    if (best > 0) pair_prefetch(b, syms[best - 1], syms[best]);
    l->due = best;
    return 1;
}

/* Merge the window's words, cache them (under one taking of the cache's lock) and put their ids in place of
 * their markers; 0 on allocation failure. */
static int batch_flush(bpe *b, batch *t, ivec *out) {
    size_t next = 0, active = 0;
    t->res.n = 0;
    while (active < LANES && next < t->n) {
        lane_start(b, &t->lanes[active], &t->p[next], next);
        active++, next++;
    }
    while (active) {
        for (size_t i = 0; i < active;) {
            lane *l = &t->lanes[i];
            if (lane_step(b, l)) {
                i++;
                continue;
            }
            pending *p = &t->p[l->word];
            if (!ivec_room(&t->res, MAX_IDS_PER_SYM * l->nsym)) return 0;
            p->start = t->res.n;
            p->nids = syms_to_ids(b, l->syms, l->nsym, t->res.v + p->start);
            t->res.n += p->nids;
            if (next < t->n) { /* the lane takes the next word */
                lane_start(b, l, &t->p[next], next);
                next++;
                i++;
            } else { /* the last lane moves here */
                if (i != --active) *l = t->lanes[active];
            }
        }
    }
    wcache_item items[WINDOW]; /* cached together: the lock taken once a window */
    for (size_t j = 0; j < t->n; j++) {
        const pending *p = &t->p[j];
        items[j] = (wcache_item){p->hash, p->w, p->n, t->res.v + p->start, p->nids};
    }
    wcache_put_many(b->cache, t->n, items);
    t->tail.n = 0;
    if (!ivec_extend(&t->tail, out->v + t->first, out->n - t->first)) return 0;
    out->n = t->first;
    const int32_t *v = t->tail.v;
    for (size_t i = 0, m = t->tail.n; i < m;) { /* runs of ids copied whole, each marker replaced */
        size_t j = i;
        while (j < m && v[j] >= 0) j++;
        if (!ivec_extend(out, v + i, j - i)) return 0;
        if (j == m) break;
        const pending *p = &t->p[-v[j] - 1];
        if (!ivec_extend(out, t->res.v + p->start, p->nids)) return 0;
        i = j + 1;
    }
    t->n = 0;
    return 1;
}

static batch *batch_new(void) {
    batch *t = malloc(sizeof *t);
    if (!t) return NULL;
    t->n = 0;
    t->res = t->tail = (ivec){NULL, 0, 0, 1};
    return t;
}

static void batch_free(batch *t) {
    if (!t) return;
    ivec_free(&t->res);
    ivec_free(&t->tail);
    free(t);
}

/* A short new word into the window (the same word twice shares one entry), its marker into out; the window
 * merged when full. 0 on allocation failure. */
static int batch_add(bpe *b, batch *t, const uint8_t *w, size_t n, uint64_t hash, ivec *out) {
    size_t j = 0;
    while (j < t->n && !(t->p[j].hash == hash && t->p[j].n == n && memcmp(t->p[j].w, w, n) == 0)) j++;
    if (j == t->n) {
        if (j == 0) t->first = out->n;
        t->p[t->n++] = (pending){w, n, hash, 0, 0};
    }
    if (!ivec_push(out, -(int32_t)j - 1)) return 0;
    return t->n < WINDOW || batch_flush(b, t, out);
}

/* Word ends (byte offsets) of text from the code point offsets cp_ends (rising to the text's length). */
static int byte_ends(const uint8_t *text, size_t n, const int64_t *cp_ends, size_t n_ends, ivec *ends) {
    size_t pos = 0, len;
    int64_t cp = 0;
    for (size_t i = 0; i < n_ends; i++) {
        if (cp_ends[i] < cp) return 0;
        for (; cp < cp_ends[i]; cp++) {
            if (pos >= n) return 0;
            utf8_next(text + pos, n - pos, &len);
            pos += len;
        }
        if (!ivec_push(ends, (int32_t)pos)) return 0;
    }
    return pos == n;
}

/* llama.cpp's pattern [^\n]+|[\n]+ (SPM-style BPE): runs of newlines and runs of everything else. */
static int split_newlines(const uint8_t *text, size_t n, ivec *ends) {
    for (size_t i = 0; i < n;) {
        int nl = text[i] == '\n';
        while (i < n && (text[i] == '\n') == nl) i++;
        if (!ivec_push(ends, (int32_t)i)) return 0;
    }
    return 1;
}

/* Words are hashed AHEAD words before they are encoded, and their slot in the token table (ignore_merges; a
 * cache miss for most words) fetched then, so it has arrived when the word's turn comes. */
#define AHEAD 8

static inline void key_ahead(const bpe *b, const uint8_t *text, size_t n, const ivec *ends, size_t i, word_key *k) {
    size_t s = i ? (size_t)ends->v[i - 1] : 0, e = (size_t)ends->v[i];
    if (e <= s || e > n) return; /* bad ends: the loop stops at this word without the key */
    if (e - s == 1 && b->byte_ids[text[s]] >= 0) return; /* a byte token: known_word needs no key */
    word_key_of(text + s, e - s, k);
    if (b->ignore_merges) __builtin_prefetch(&b->toks[(size_t)k->hash & (b->tok_cap - 1)]);
}

int bpe_encode(bpe *b, const uint8_t *text, size_t n, int mode, const int64_t *cp_ends, size_t n_ends,
               const uint16_t *flags, ivec *out) {
    ivec ends = {NULL, 0, 0, 1};
    scratch s = {0};
    batch *t = NULL; /* made at the first new short word */
    word_key keys[AHEAD];
    int ok = 0;
    if (n > INT32_MAX) return 0;
    /* about a word and an id per 4 bytes of text: one allocation each instead of a few doublings */
    if (!ivec_room(&ends, n / 4 + 16) || !ivec_room(out, n / 4 + 16)) goto done;
    if (mode == SPLIT_WORDS        ? !byte_ends(text, n, cp_ends, n_ends, &ends)
        : mode == SPLIT_NEWLINES ? !split_newlines(text, n, &ends)
                                 : !(mode >= SPLIT_FALCON ? split_multi(mode, text, n, flags, &ends)
                                                          : split_words(mode, text, n, flags, &ends)))
        goto done;
    for (size_t i = 0; i < AHEAD && i < ends.n; i++) key_ahead(b, text, n, &ends, i, &keys[i]);
    size_t prev = 0;
    for (size_t i = 0; i < ends.n; i++) {
        size_t e = (size_t)ends.v[i];
        if (e < prev || e > n) goto done;
        const uint8_t *w = text + prev;
        size_t len = e - prev;
        prev = e;
        word_key k = keys[i % AHEAD];
        if (i + AHEAD < ends.n) key_ahead(b, text, n, &ends, i + AHEAD, &keys[i % AHEAD]);
        if (!len) continue;
        int r = known_word(b, w, len, &k, out);
        if (r == 0) goto done;
        if (r < 0 && len >= 2 && len < HEAP_MIN_LEN) {
            if (!t && !(t = batch_new())) goto done;
            if (!batch_add(b, t, w, len, k.hash, out)) goto done;
        } else if (r < 0 && !merge_word(b, &s, w, len, &k, out)) {
            goto done;
        }
        if (t && t->n && out->n - t->first >= TAIL_MAX && !batch_flush(b, t, out)) goto done;
    }
    if (t && t->n && !batch_flush(b, t, out)) goto done;
    ok = out->ok;
done:
    ivec_free(&ends);
    batch_free(t);
    scratch_free(&s);
    return ok;
}
