/* The native core's C interface: UTF-8 decoding, llama.cpp's hand-written pre-tokenizers, the bounded word
 * cache and byte-level BPE rank merging. No Python here: only the binding files (module.c, bind*.c) know CPython. */
#ifndef MINILLAMA_CORE_H
#define MINILLAMA_CORE_H

#include <stddef.h>
#include <stdint.h>

/* A growable array of int32 (token ids, word ends). ok == 0 after a failed allocation. */
typedef struct {
    int32_t *v;
    size_t n, cap;
    int ok;
} ivec;

/* utf8.c: room for n more items (capacity doubled as needed); 0 and ok cleared when memory runs out. */
int ivec_room(ivec *a, size_t n);
int ivec_extend(ivec *a, const int32_t *x, size_t n);
void ivec_free(ivec *a);
/* A big table probed at random, of n bytes (zeroed when zero): huge pages where the kernel gives them; NULL when
 * memory runs out. big_free takes the same n. */
void *big_alloc(size_t n, int zero);
void big_free(void *p, size_t n);

static inline int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap && !ivec_room(a, 1)) return 0;
    a->v[a->n++] = x;
    return 1;
}

/* One code point of UTF-8 as llama.cpp's unicode_cpts_from_utf8 reads it: *len bytes (1 and U+FFFD for a byte
 * that starts no well-formed sequence; no check for overlong forms or surrogates, so Python's surrogatepass'ed
 * text reads back as its code points). n >= 1. */
static inline uint32_t utf8_next(const uint8_t *s, size_t n, size_t *len) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    size_t k = c < 0x80 ? 1 : c < 0xC0 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 0;
    if (k == 0 || k > n) {
        *len = 1;
        return 0xFFFD;
    }
    uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1Fu : k == 3 ? c & 0x0Fu : c & 0x07u;
    for (size_t j = 1; j < k; j++) {
        if ((s[j] & 0xC0) != 0x80) {
            *len = 1;
            return 0xFFFD;
        }
        cp = cp << 6 | (s[j] & 0x3Fu);
    }
    *len = k;
    return cp;
}

/* cp (below 0x110000) written as UTF-8 at d: 1 to 4 bytes, the count returned. No check for surrogates: callers
 * that must not write them map them first (text.c writes U+FFFD). */
static inline size_t utf8_put(uint8_t *d, uint32_t cp) {
    if (cp < 0x80) {
        d[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (uint8_t)(0xC0 | cp >> 6);
        d[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (uint8_t)(0xE0 | cp >> 12);
        d[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        d[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (uint8_t)(0xF0 | cp >> 18);
    d[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    d[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    d[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* pretok.c: llama.cpp's unicode_regex_split_custom_gpt2 / _llama3 over the code points of UTF-8 text (read
 * by utf8_next); appends the end of each word (a byte offset) to ends. flags: llama.cpp's flags of every code
 * point up to U+10FFFF. */
enum { SPLIT_WORDS = 0, SPLIT_GPT2 = 1, SPLIT_LLAMA3 = 2 };
#define FLAG_NUMBER 0x0002
#define FLAG_LETTER 0x0004
#define FLAG_WHITESPACE 0x0100
#define MAX_CODE_POINT 0x10FFFF
int split_words(int mode, const uint8_t *text, size_t n, const uint16_t *flags, ivec *ends);

/* A word's key for the hash tables of bpe.c and cache.c: its first 16 bytes (zero padded) as two words, and
 * a hash of all its bytes. Little-endian loads where they are known to be cheap, bytewise elsewhere. */
typedef struct {
    uint64_t k0, k1, hash;
} word_key;

static inline uint64_t key_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static inline uint64_t load64(const uint8_t *s) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t x;
    __builtin_memcpy(&x, s, 8);
    return x;
#else
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = x << 8 | s[i];
    return x;
#endif
}

/* Bytes s[0..n) (n <= 8) as a little-endian number, the rest zero. */
static inline uint64_t load_upto8(const uint8_t *s, size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (n == 8) return load64(s);
    if (n >= 4) {
        uint32_t lo, hi;
        __builtin_memcpy(&lo, s, 4);
        __builtin_memcpy(&hi, s + n - 4, 4);
        return (uint64_t)lo | ((uint64_t)hi >> (8 * (8 - n))) << 32;
    }
#endif
    uint64_t x = 0;
    for (size_t i = n; i > 0; i--) x = x << 8 | s[i - 1];
    return x;
}

static inline void word_key_of(const uint8_t *s, size_t n, word_key *k) {
    if (n <= 16) {
        k->k0 = load_upto8(s, n < 8 ? n : 8);
        k->k1 = n > 8 ? load_upto8(s + 8, n - 8) : 0;
        k->hash = key_mix((k->k0 ^ (uint64_t)n << 56) * 0x9E3779B97F4A7C15ULL ^ k->k1);
        return;
    }
    k->k0 = load64(s);
    k->k1 = load64(s + 8);
    uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ULL;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) h = key_mix(h ^ load64(s + i));
    if (i < n) h = key_mix(h ^ load64(s + n - 8)); /* the last 8 bytes, overlapping the chunk before */
    k->hash = h;
}

/* cache.c: word bytes -> ids, two generations bounded in bytes and entries, thread-safe. */
typedef struct wcache wcache;
wcache *wcache_new(size_t max_bytes, size_t max_words);
void wcache_free(wcache *c);
/* 1 and the ids appended to out when word is cached (an old entry moves to the young generation). */
int wcache_get(wcache *c, const uint8_t *key, size_t klen, ivec *out);
void wcache_put(wcache *c, const uint8_t *key, size_t klen, const int32_t *ids, size_t nids);
/* The same with the key's hash (word_key_of) already known. */
int wcache_get_h(wcache *c, uint64_t hash, const uint8_t *key, size_t klen, ivec *out);
void wcache_put_h(wcache *c, uint64_t hash, const uint8_t *key, size_t klen, const int32_t *ids, size_t nids);
/* Several puts under one taking of the lock (a BPE merge window's new words). */
typedef struct {
    uint64_t hash;
    const uint8_t *key;
    size_t klen;
    const int32_t *ids;
    size_t nids;
} wcache_item;
void wcache_put_many(wcache *c, size_t n, const wcache_item *items);
void wcache_clear(wcache *c);
typedef struct {
    size_t words, bytes, old_words, old_bytes, largest_entry, longest_word, max_bytes, max_words;
} wcache_info;
void wcache_stats(wcache *c, wcache_info *info);

/* bpe.c: BPE (llm_tokenizer_bpe) over token ids. merges: n rows (left, right, result), rows with a negative
 * entry never apply, the first of duplicate pairs wins. byte_ids: 256 rows (the byte's token or -1, then up to
 * two ids it becomes when it has none, -1 padded). chars NULL: byte-level BPE; else SPM-style BPE over UTF-8
 * characters (a token of one code point is that character's), byte_ids giving the ASCII characters' tokens
 * (a space's is U+2581's when escape_spaces) and each byte's <0xXX> token second; newline_ids[k - 1] the token a
 * word of k newlines stays whole as (-1: merged as any word). Not with ignore_merges. */
typedef struct {
    int escape_spaces;
    const int32_t *newline_ids;
    size_t n_newline;
} bpe_chars;
typedef struct bpe bpe;
bpe *bpe_new(const int32_t *merges, size_t n_merges, const int32_t *byte_ids, const uint8_t *tok_bytes,
             size_t tok_len, const int64_t *tok_off, size_t n_vocab, const int32_t *byte_chars,
             int ignore_merges, size_t cache_max_bytes, size_t cache_max_words, const bpe_chars *chars);
void bpe_free(bpe *b);
wcache *bpe_cache(bpe *b);
/* The ids of text (n bytes): split by mode, or at the code point ends given (SPLIT_WORDS). 0 on failure. */
int bpe_encode(bpe *b, const uint8_t *text, size_t n, int mode, const int64_t *cp_ends, size_t n_ends,
               const uint16_t *flags, ivec *out);

/* pretok_multi.c: pre-tokenizers of several patterns (unicode_regex_split over a pattern list), each pattern
 * splitting the pieces of the one before into matches and gaps: Falcon's punctuation runs, then GPT-2, then
 * ASCII digit triples; StarCoder's single numbers, then GPT-2. Same contract as split_words. */
enum { SPLIT_FALCON = 3, SPLIT_STARCODER = 4, SPLIT_NEWLINES = 5, SPLIT_END = 6 }; /* NEWLINES: bpe.c's */
#define FLAG_PUNCTUATION 0x0020
#define FLAG_CATEGORIES 0x00FF
int split_multi(int mode, const uint8_t *text, size_t n, const uint16_t *flags, ivec *ends);

/* merges.c: the (left, right, result) ids of each merge, as Vocab.arrays().merges resolves them (split at the
 * first space after the first byte; -1 where a part is no token), from the tokens' bytes (n_vocab + 1
 * offsets) and the merges' text, one merge a line ('\n' after each but the last). Rows: 3 x n_merges int32.
 * 0 when the text does not hold n_merges lines, offsets are out of order, or memory runs out. */
int resolve_merges(const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, size_t n_vocab,
                   const uint8_t *text, size_t text_len, size_t n_merges, int32_t *rows);

/* bpe.c: a binary min-heap of uint64 keys in h[0..*n) (room for the push is the caller's), shared by spm.c. */
void heap_push(uint64_t *h, size_t *n, uint64_t x);
uint64_t heap_pop(uint64_t *h, size_t *n);

/* spm.c: SentencePiece BPE (llm_tokenizer_spm) over the bytes of text (U+2581 for spaces). tok_off: n_vocab + 1
 * offsets into tok_bytes; scores: one a token; byte_ids: 256 ids (llama.cpp's byte_to_token, -1: none). */
typedef struct spm spm;
spm *spm_new(const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, size_t n_vocab, const float *scores,
             const int32_t *byte_ids, size_t cache_max_bytes, size_t cache_max_words);
void spm_free(spm *m);
wcache *spm_cache(spm *m);
/* The ids of text (n bytes; valid_utf8: known to be valid UTF-8) appended to out. 0 on failure: out->ok == 0
 * when memory ran out, else a byte that no token covers has no byte token in this vocab. */
int spm_encode(spm *m, const uint8_t *text, size_t n, int valid_utf8, ivec *out);
/* spm_encode of a str's characters as encoders/spm.py prepares a plain fragment: n characters of kind (1, 2 or 4)
 * bytes each, every space U+2581, behind U+2581 when add_prefix and n > 0. -1 (out untouched) when a character
 * is a surrogate (the caller's escaping path decides), else as spm_encode. */
int spm_encode_plain(spm *m, const void *chars, size_t n, int kind, int add_prefix, ivec *out);

/* text.c: the UTF-8 of n characters of kind (1, 2 or 4) bytes each, as CPython stores a str, every space as
 * U+2581 when escape_spaces. ucs_utf8_size: its length, *surrogate set when a character is a surrogate (or past
 * U+10FFFF); ucs_utf8_write writes one as U+FFFD and sets *surrogate too, and needs 3 bytes of room past the end. */
size_t ucs_utf8_size(const void *chars, size_t n, int kind, int escape_spaces, int *surrogate);
size_t ucs_utf8_write(const void *chars, size_t n, int kind, int escape_spaces, uint8_t *out, int *surrogate);

/* fileio.paragraphs of UTF-8 text as byte spans: text cut at each r"\n[ \t\r\f\v]*\n" (leftmost, not overlapping),
 * each part stripped of newlines at both ends and kept when it holds a character that is not whitespace
 * (str.isspace). Returns how many parts are kept and writes the (start, end) pairs of the first cap of them into
 * spans. */
size_t paragraph_spans(const uint8_t *s, size_t n, size_t *spans, size_t cap);
/* paragraph_spans with the room it needs: every kept part's (start, end) pair, *k of them, in a malloc'd array
 * (the caller frees it); NULL when memory ran out. */
size_t *paragraph_cut(const uint8_t *s, size_t n, size_t *k);

/* digest.c: BLAKE2b (RFC 7693, unkeyed) of n bytes: outlen (1..64) bytes, hashlib.blake2b's. */
void blake2b(const uint8_t *data, size_t n, uint8_t *out, size_t outlen);
/* The BLAKE2b digest of size (1..64) bytes of the UTF-8 of each of n texts into out (n x size bytes), and the UTF-8
 * bytes of all in *total. Text i: lens[i] characters of kinds[i] (1, 2 or 4) bytes each at data[i], as CPython
 * stores a str, or lens[i] bytes of UTF-8 when kinds[i] is 0. 0 done, 1 a text holds a surrogate, 2 memory ran
 * out. */
int blake2b_texts(const void *const *data, const size_t *lens, const int *kinds, size_t n, size_t size, uint8_t *out,
                  size_t *total);

/* decode.c: every token's piece (blob, n + 1 offsets into it; special[i] 1 where the plain table has it empty),
 * copied. pieces_size: the bytes of the pieces of ids[0..n) (each < pieces_count) in the full or plain table,
 * less the first piece's leading space when strip_space (*skip: 1 then, else 0); pieces_join writes them. */
typedef struct pieces pieces;
pieces *pieces_new(const uint8_t *blob, size_t blob_len, const int64_t *off, size_t n, const uint8_t *special);
void pieces_free(pieces *p);
size_t pieces_count(const pieces *p);
size_t pieces_size(const pieces *p, const int32_t *ids, size_t n, int plain, int strip_space, size_t *skip);
void pieces_join(const pieces *p, const int32_t *ids, size_t n, int plain, size_t skip, uint8_t *out);


/* ---- Unigram and WordPiece (ugm.c, wpm.c, btrie.c) ---------------------------------------------------- */

/* btrie.c: a trie over bytes (token texts, user-defined texts). Built by btrie_insert (children in a hash
 * table keyed by (node, byte)), then btrie_freeze turns it into a double array: node s has the child for
 * byte c at base[s] + c when check there is s, one cache line a step (a node is 16 bytes). Node 0 is the root; value -1: none. */
typedef struct {
    int32_t base, check, value;
    float aux; /* what a user keeps beside the value (Unigram: the token's float32 score) */
} btrie_node;

typedef struct {
    uint64_t key; /* node << 8 | byte, + 1 (0: an empty slot) */
    int32_t child;
} btrie_slot;

typedef struct {
    int32_t *value; /* building: per node */
    size_t n_nodes, cap_nodes;
    btrie_slot *slots;
    size_t n_slots, mask; /* slots: a power of two, at most half full */
    int32_t root[256];    /* building: the root's children directly (-1: none) */
    btrie_node *da;       /* frozen: the double array */
    size_t da_size;
} btrie;

int btrie_init(btrie *t);
void btrie_free(btrie *t);
/* Sets the value of the node of s[0..n) (n >= 1), creating the path; the last insert of a text wins. A value
 * < 0 creates the path only. */
int btrie_insert(btrie *t, const uint8_t *s, size_t n, int32_t value);
/* The double array of the built trie (the build tables are freed); 0 when memory runs out. */
int btrie_freeze(btrie *t);

/* The child of frozen node s for byte c, or -1. */
static inline int32_t btrie_child(const btrie *t, int32_t s, uint8_t c) {
    size_t i = (size_t)t->da[s].base + c;
    return i < t->da_size && t->da[i].check == s ? (int32_t)i : -1;
}

static inline int32_t btrie_value(const btrie *t, int32_t s) { return t->da[s].value; }

/* ugm.c: llama.cpp's llm_tokenizer_ugm (normalize: user-defined prefixes, the charsmap's XCDA, U+FFFD for
 * invalid bytes, the space rules; then the Viterbi pass over a byte trie of the tokens). The tables are
 * copied. ugm_encode: 1 ok, 0 out of memory, -1 a broken charsmap (the caller's pure path reports it). */
typedef struct ugm ugm;
ugm *ugm_new(const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, const int32_t *tok_ids,
             const float *tok_scores, size_t n_tok, const uint8_t *user_bytes, size_t user_len,
             const int64_t *user_off, size_t n_user, const uint32_t *units, size_t n_units, const uint8_t *repl,
             size_t n_repl, int32_t unk_id, double unk_score, int escape_ws, int add_space_prefix,
             int remove_extra_ws);
void ugm_free(ugm *u);
int ugm_encode(const ugm *u, const uint8_t *text, size_t n, ivec *out);

/* wpm.c: llama.cpp's llm_tokenizer_wpm: each code point through norm (0x110000 entries: the code point it
 * becomes in the low 21 bits, its class above: WPM_KEEP, WPM_SPACE ends a word, WPM_DROP vanishes,
 * WPM_ALONE is a word of its own), each word behind U+2581 cut greedily into the longest tokens, a word
 * with a position no token starts at is unk. wpm_encode: 1 ok, 0 out of memory, -1 unk needed but < 0. */
enum { WPM_KEEP = 0, WPM_SPACE = 1, WPM_DROP = 2, WPM_ALONE = 3 };
#define WPM_CP_BITS 21
typedef struct wpm wpm;
wpm *wpm_new(const uint8_t *tok_bytes, size_t tok_len, const int64_t *tok_off, const int32_t *ids, size_t n_ids,
             size_t n_vocab, const uint32_t *norm, int32_t unk_id);
void wpm_free(wpm *w);
int wpm_encode(const wpm *w, const uint8_t *text, size_t n, ivec *out);

#endif
