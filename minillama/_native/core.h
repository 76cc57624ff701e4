/* The native core's C interface: UTF-8 decoding, llama.cpp's hand-written pre-tokenizers, the bounded word
 * cache and byte-level BPE rank merging. No Python here: module.c is the only file that knows CPython. */
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

int ivec_push(ivec *a, int32_t x);
int ivec_extend(ivec *a, const int32_t *x, size_t n);
void ivec_free(ivec *a);

/* utf8.c: the code points of n bytes and the byte offset of each (boff has ncp + 1 entries). A byte that
 * starts no well-formed sequence is U+FFFD on its own (Python hands over valid, surrogatepass'ed text). */
int utf8_decode(const uint8_t *s, size_t n, uint32_t **cps, uint32_t **boff, size_t *ncp);

/* pretok.c: llama.cpp's unicode_regex_split_custom_gpt2 / _llama3 over code points; appends the end of each
 * word (a code point index) to ends. flags: llama.cpp's flags of every code point up to U+10FFFF. */
enum { SPLIT_WORDS = 0, SPLIT_GPT2 = 1, SPLIT_LLAMA3 = 2 };
#define FLAG_NUMBER 0x0002
#define FLAG_LETTER 0x0004
#define FLAG_WHITESPACE 0x0100
#define MAX_CODE_POINT 0x10FFFF
int split_words(int mode, const uint32_t *cps, size_t n, const uint16_t *flags, ivec *ends);

/* cache.c: word bytes -> ids, two generations bounded in bytes and entries, thread-safe. */
typedef struct wcache wcache;
wcache *wcache_new(size_t max_bytes, size_t max_words);
void wcache_free(wcache *c);
/* 1 and the ids appended to out when word is cached (an old entry moves to the young generation). */
int wcache_get(wcache *c, const uint8_t *key, size_t klen, ivec *out);
void wcache_put(wcache *c, const uint8_t *key, size_t klen, const int32_t *ids, size_t nids);
void wcache_clear(wcache *c);
typedef struct {
    size_t words, bytes, old_words, old_bytes, largest_entry, longest_word, max_bytes, max_words;
} wcache_info;
void wcache_stats(wcache *c, wcache_info *info);

/* bpe.c: byte-level BPE (llm_tokenizer_bpe) over token ids. merges: n rows (left, right, result), rows with
 * a negative entry never apply, the first of duplicate pairs wins. byte_ids: 256 rows (the byte's token or
 * -1, then up to two ids it becomes when it has none, -1 padded). */
typedef struct bpe bpe;
bpe *bpe_new(const int32_t *merges, size_t n_merges, const int32_t *byte_ids, const uint8_t *tok_bytes,
             size_t tok_len, const int64_t *tok_off, size_t n_vocab, const int32_t *byte_chars,
             int ignore_merges, size_t cache_max_bytes, size_t cache_max_words);
void bpe_free(bpe *b);
wcache *bpe_cache(bpe *b);
/* The ids of text (n bytes): split by mode, or at the code point ends given (SPLIT_WORDS). 0 on failure. */
int bpe_encode(bpe *b, const uint8_t *text, size_t n, int mode, const int64_t *cp_ends, size_t n_ends,
               const uint16_t *flags, ivec *out);

#endif

/* quants.c: matrix products of ggml quantized weights (read in place, never dequantized) with float32
 * activations, as ggml computes them: each activation row quantized once to the type's partner (Q8_0, Q8_1,
 * Q8_K; F16/BF16/F32 for the float types), integer dot products per block, float32 sums in ggml's order. */
enum {
    MQ_F32, MQ_F16, MQ_BF16, MQ_Q4_0, MQ_Q4_1, MQ_Q5_0, MQ_Q5_1, MQ_Q8_0, MQ_Q2_K, MQ_Q3_K, MQ_Q4_K, MQ_Q5_K,
    MQ_Q6_K, MQ_NTYPES
};
/* The mq_type of a ggml type number, -1 when quants.c has no kernel for it. */
int mq_type_of_ggml(int ggml_type);
/* Values per block and bytes per block of an mq_type. */
int mq_block(int type);
int mq_type_size(int type);
/* "avx2" or "scalar": the kernels mq_matmul uses on this CPU. */
const char *mq_isa(void);
/* out[t * rows + r] = row r of w (rows x cols of type, row_bytes = cols / block * type_size) . x[t * cols ..]
 * for t < n_x, rows split over `threads` threads. cols must be a positive multiple of the block. 0 when
 * memory ran out. */
int mq_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n_x, float *out,
              int threads);
