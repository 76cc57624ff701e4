/* Unigram as llama.cpp runs it (llm_tokenizer_ugm), on UTF-8 bytes, the port of the byte path of
 * encoders/ugm.py and ugm_normalize.py: normalize (at each position the longest user-defined prefix is kept
 * verbatim, else the longest key of the precompiled charsmap is replaced, else one well-formed code point
 * is copied or an invalid byte becomes U+FFFD; spaces become the space marker with llama.cpp's dummy
 * prefix / merged runs), then the Viterbi pass one code point at a time over a byte trie of the tokens,
 * in llama.cpp's order of double-precision sums, so every comparison is the one llama.cpp makes. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* Tokens longer than LONG_PREFIX bytes stand in the trie by their first LONG_PREFIX bytes only (a walk
 * down a 100,000-byte token from every position of a long run would be quadratic); at that node the
 * Viterbi step compares each of them whole (memcmp), as encoders/ugm.py does with PREFIX_MAX. */
#define LONG_PREFIX 64

typedef struct {
    int32_t node, id; /* the trie node of its first LONG_PREFIX bytes */
    float score;
    size_t off, len; /* in the struct's long_bytes */
} long_tok;

struct ugm {
    btrie tokens; /* value: the token id, aux: its score (float32, as the vocab holds it: exact) */
    btrie user;   /* user-defined texts: the deepest node counts, value or not */
    long_tok *longs; /* sorted by node */
    size_t n_longs;
    uint8_t *long_bytes;
    uint8_t key_start[256]; /* 0: no charsmap key starts with this byte (the walk is skipped) */
    uint32_t *units;
    size_t n_units;
    uint8_t *repl;
    size_t n_repl;
    int32_t unk;
    double unk_score;
    int escape_ws, add_space_prefix, remove_extra_ws;
};

static uint32_t xcda_base(uint32_t p) { return (p >> 10) << ((p & (1u << 9)) >> 6); }

void ugm_free(ugm *u) {
    if (!u) return;
    btrie_free(&u->tokens);
    btrie_free(&u->user);
    free(u->longs);
    free(u->long_bytes);
    free(u->units);
    free(u->repl);
    free(u);
}

/* Every text i of blob[off[i]..off[i+1]) into t with value i, a text longer than max_len by its first max_len
 * bytes only (and no value); 0 on bad offsets or no memory. */
static int insert_all(btrie *t, const uint8_t *blob, size_t len, const int64_t *off, size_t n, size_t max_len) {
    for (size_t i = 0; i < n; i++) {
        int64_t s = off[i], e = off[i + 1];
        if (s < 0 || e < s || (uint64_t)e > len) return 0;
        size_t k = (size_t)(e - s);
        if (!btrie_insert(t, blob + s, k > max_len ? max_len : k, k > max_len ? -1 : (int32_t)i)) return 0;
    }
    return 1;
}

/* By node, then in the vocab's order (ties of equal scores go to the first, as in encoders/ugm.py). */
static int by_node(const void *a, const void *b) {
    const long_tok *x = a, *y = b;
    if (x->node != y->node) return (x->node > y->node) - (x->node < y->node);
    return (x->off > y->off) - (x->off < y->off);
}

/* The tokens longer than LONG_PREFIX, each with the frozen trie's node of its prefix; 0 when memory runs out. */
static int collect_longs(ugm *u, const uint8_t *blob, const int64_t *off, const int32_t *ids, const float *scores,
                         size_t n) {
    size_t count = 0, bytes = 0;
    for (size_t i = 0; i < n; i++)
        if ((size_t)(off[i + 1] - off[i]) > LONG_PREFIX) count++, bytes += (size_t)(off[i + 1] - off[i]);
    if (!count) return 1;
    u->longs = malloc(count * sizeof *u->longs);
    u->long_bytes = malloc(bytes);
    if (!u->longs || !u->long_bytes) return 0;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = (size_t)(off[i + 1] - off[i]);
        if (len <= LONG_PREFIX) continue;
        int32_t node = 0;
        for (size_t k = 0; k < LONG_PREFIX && node >= 0; k++) node = btrie_child(&u->tokens, node, blob[off[i] + k]);
        if (node < 0) return 0; /* inserted above: cannot be */
        memcpy(u->long_bytes + used, blob + off[i], len);
        u->longs[u->n_longs++] = (long_tok){node, ids[i], scores[i], used, len};
        used += len;
    }
    qsort(u->longs, u->n_longs, sizeof *u->longs, by_node);
    return 1;
}

ugm *ugm_new(const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, const int32_t *tok_ids,
             const float *tok_scores, size_t n_tok, const uint8_t *user_bytes, size_t user_len,
             const int64_t *user_off, size_t n_user, const uint32_t *units, size_t n_units, const uint8_t *repl,
             size_t n_repl, int32_t unk_id, double unk_score, int escape_ws, int add_space_prefix,
             int remove_extra_ws) {
    if (n_tok > INT32_MAX || n_user > INT32_MAX) return NULL;
    ugm *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    u->units = malloc((n_units + 1) * sizeof *u->units);
    u->repl = malloc(n_repl + 1);
    int ok = u->units && u->repl;
    int t_ok = ok && btrie_init(&u->tokens);
    int u_ok = t_ok && btrie_init(&u->user);
    if (!u_ok || !insert_all(&u->tokens, tok_bytes, tok_len, tok_off, n_tok, LONG_PREFIX) ||
        !insert_all(&u->user, user_bytes, user_len, user_off, n_user, SIZE_MAX) || !btrie_freeze(&u->tokens) ||
        !btrie_freeze(&u->user) || !collect_longs(u, tok_bytes, tok_off, tok_ids, tok_scores, n_tok)) {
        ugm_free(u);
        return NULL;
    }
    for (size_t i = 0; i < u->tokens.da_size; i++) { /* entry index -> the id and score themselves */
        btrie_node *d = &u->tokens.da[i];
        if (d->check != -1 && d->value >= 0) {
            d->aux = tok_scores[d->value];
            d->value = tok_ids[d->value];
        }
    }
    if (n_units) memcpy(u->units, units, n_units * sizeof *u->units);
    if (n_repl) memcpy(u->repl, repl, n_repl);
    u->n_units = n_units;
    u->n_repl = n_repl;
    for (int c = 0; c < 256; c++) { /* the first step of the walk, done once: a key may start here */
        uint32_t node = n_units ? xcda_base(units[0]) ^ (uint32_t)c : 0;
        u->key_start[c] = n_units && c && (node >= n_units || (units[node] & 0x800000FFu) == (uint32_t)c);
    }
    u->unk = unk_id;
    u->unk_score = unk_score;
    u->escape_ws = escape_ws;
    u->add_space_prefix = add_space_prefix;
    u->remove_extra_ws = remove_extra_ws;
    return u;
}

/* A growable byte buffer. */
typedef struct {
    uint8_t *v;
    size_t n, cap;
} bbuf;

static int bbuf_add(bbuf *b, const uint8_t *s, size_t n) {
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) return 0;
            cap *= 2;
        }
        uint8_t *v = realloc(b->v, cap);
        if (!v) return 0;
        b->v = v;
        b->cap = cap;
    }
    memcpy(b->v + b->n, s, n);
    b->n += n;
    return 1;
}

/* The longest charsmap key at s[0..n): its length (0: none) and replacement offset; -1 on an index out of
 * the array (llama.cpp throws there). */
static long long charsmap_match(const ugm *u, const uint8_t *s, size_t n, size_t *offset) {
    if (u->n_units == 0) return 0; /* no charsmap (the Python side keeps an empty one on the pure path) */
    uint32_t node = xcda_base(u->units[0]);
    size_t length = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c == 0) break;
        node ^= c;
        if (node >= u->n_units) return -1;
        uint32_t p = u->units[node];
        if ((p & 0x800000FFu) != c) break;
        node ^= xcda_base(p);
        if (p & 0x100) {
            if (node >= u->n_units) return -1;
            length = i + 1;
            *offset = u->units[node] & 0x7FFFFFFFu;
        }
    }
    return (long long)length;
}

static const uint8_t FFFD[3] = {0xEF, 0xBF, 0xBD};
static const uint8_t MARK[3] = {0xE2, 0x96, 0x81};

/* llm_tokenizer_ugm_session::normalize into out; 1 ok, 0 no memory, -1 a broken charsmap. */
static int normalize(const ugm *u, const uint8_t *s, size_t n, bbuf *out) {
    const uint8_t *space = u->escape_ws ? MARK : (const uint8_t *)" ";
    size_t space_len = u->escape_ws ? 3 : 1;
    int merge = u->remove_extra_ws, prepend = u->add_space_prefix, prepended = 0, in_word = 0;
    size_t i = 0;
    while (i < n) {
        const uint8_t *piece;
        size_t piece_len, used;
        int32_t node = 0;
        size_t k = i;
        while (k < n) { /* the deepest user-defined node, token or not */
            int32_t next = btrie_child(&u->user, node, s[k]);
            if (next < 0) break;
            node = next;
            k++;
        }
        size_t offset = 0;
        long long m;
        if (k > i) {
            piece = s + i;
            piece_len = used = k - i;
        } else if (u->key_start[s[i]] && (m = charsmap_match(u, s + i, n - i, &offset)) != 0) {
            if (m < 0 || offset >= u->n_repl) return -1;
            const uint8_t *end = memchr(u->repl + offset, 0, u->n_repl - offset);
            if (!end) return -1;
            piece = u->repl + offset;
            piece_len = (size_t)(end - piece);
            used = (size_t)m;
        } else {
            size_t len;
            uint32_t cp = utf8_next(s + i, n - i, &len);
            if (cp == 0xFFFD && len == 1) { /* a byte that starts no code point */
                piece = FFFD;
                piece_len = 3;
            } else {
                piece = s + i;
                piece_len = len;
            }
            used = len;
        }
        for (size_t j = 0; j < piece_len; j++) {
            if (piece[j] != ' ') {
                if (!in_word) {
                    in_word = 1;
                    if (((prepend && !prepended) || merge) && !bbuf_add(out, space, space_len)) return 0;
                    prepended = 1;
                }
                if (!bbuf_add(out, piece + j, 1)) return 0;
            } else {
                in_word = 0;
                if (!merge && !bbuf_add(out, space, space_len)) return 0;
            }
        }
        i += used;
    }
    return 1;
}

/* The Viterbi step from i for the long tokens whose first LONG_PREFIX bytes end at node (each ends at its
 * own position, so their order does not matter). */
static void long_steps(const ugm *u, int32_t node, const uint8_t *s, size_t n, size_t i, double cur, double *best,
                       int32_t *tok, uint32_t *start) {
    size_t lo = 0, hi = u->n_longs;
    while (lo < hi) { /* the first entry of node */
        size_t mid = lo + (hi - lo) / 2;
        if (u->longs[mid].node < node)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < u->n_longs && u->longs[lo].node == node; lo++) {
        const long_tok *t = &u->longs[lo];
        if (t->len > n - i || memcmp(s + i, u->long_bytes + t->off, t->len) != 0) continue;
        double v = cur + (double)t->score;
        if (v > best[i + t->len]) {
            best[i + t->len] = v;
            tok[i + t->len] = t->id;
            start[i + t->len] = (uint32_t)i;
        }
    }
}

/* The Viterbi pass (llm_tokenizer_ugm_session::tokenize) over the normalized bytes. */
static int viterbi(const ugm *u, const uint8_t *s, size_t n, ivec *out) {
    if (n == 0) return 1;
    if (n >= UINT32_MAX) return 0;
    double *best = malloc((n + 1) * sizeof *best);
    int32_t *tok = malloc((n + 1) * sizeof *tok);
    uint32_t *start = malloc((n + 1) * sizeof *start);
    if (!best || !tok || !start) {
        free(best);
        free(tok);
        free(start);
        return 0;
    }
    for (size_t i = 0; i <= n; i++) {
        best[i] = -DBL_MAX;
        tok[i] = u->unk;
        start[i] = 0;
    }
    best[0] = 0.0;
    size_t i = 0;
    while (i < n) {
        uint8_t lead = s[i];
        size_t units = lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        if (units > n - i) units = n - i;
        double cur = best[i];
        int single = 0;
        int32_t node = 0;
        for (size_t j = i; j < n; j++) {
            node = btrie_child(&u->tokens, node, s[j]);
            if (node < 0) break;
            const btrie_node *d = &u->tokens.da[node];
            if (d->value >= 0) {
                if (j + 1 - i == units) single = 1;
                double v = cur + (double)d->aux;
                if (v > best[j + 1]) {
                    best[j + 1] = v;
                    tok[j + 1] = d->value;
                    start[j + 1] = (uint32_t)i;
                }
            }
            if (j + 1 - i == LONG_PREFIX && u->n_longs) {
                long_steps(u, node, s, n, i, cur, best, tok, start);
                break; /* no token goes on in the trie */
            }
        }
        if (!single) {
            double v = cur + u->unk_score;
            if (v > best[i + units]) {
                best[i + units] = v;
                tok[i + units] = u->unk;
                start[i + units] = (uint32_t)i;
            }
        }
        i += units;
    }
    /* backtrack: consecutive unknowns are one */
    size_t first = out->n, end = n;
    int prev_unk = 0;
    for (;;) {
        int32_t t = tok[end];
        int is_unk = t == u->unk;
        if (!(prev_unk && is_unk) && !ivec_push(out, t)) break;
        if (start[end] == 0) break;
        prev_unk = is_unk;
        end = start[end];
    }
    free(best);
    free(tok);
    free(start);
    if (!out->ok) return 0;
    for (size_t a = first, b = out->n ? out->n - 1 : 0; a < b; a++, b--) {
        int32_t x = out->v[a];
        out->v[a] = out->v[b];
        out->v[b] = x;
    }
    return 1;
}

int ugm_encode(const ugm *u, const uint8_t *text, size_t n, ivec *out) {
    bbuf norm = {NULL, 0, 0};
    int r = normalize(u, text, n, &norm);
    if (r == 1) r = viterbi(u, norm.v, norm.n, out);
    free(norm.v);
    return r;
}
