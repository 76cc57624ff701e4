/* The AVX2 helpers quants_avx2.c and quants_avx2_iq.c share. Include inside their AVX2 target pragmas (after
 * immintrin.h and quants_common.h). */
#ifndef MINILLAMA_QUANTS_AVX2_H
#define MINILLAMA_QUANTS_AVX2_H

/* A float16 scale as float32 by the CPU's own conversion (exact, as the table is): ggml's AVX2 kernels convert
 * with F16C too. The 256 KB table is out of cache while a step streams weights, and its misses cost a quarter
 * of a Q4_1 product. */
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Q4_K/Q5_K's twelve scale bytes as eight scales (bytes 0-7) and eight mins (bytes 8-15): kscales' values, by
 * llama.cpp's 32-bit masks (a dozen operations instead of the byte loop). */
static inline __m128i kscales_x(const uint8_t *s) {
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    uint32_t u[4];
    memcpy(u, s, 12);
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    const uint32_t mins_lo = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins_lo;
    u[0] &= m1;
    return _mm_loadu_si128((const __m128i *)u);
}

/* 16 bytes of nibbles as 32 values: low nibbles first (values 0-15), then high (16-31). */
static inline __m256i nibbles(const uint8_t *p) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
}

/* 32 bits as 32 bytes: 0xFF where the bit is set. */
static inline __m256i bits_to_bytes(const uint8_t *p) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)ld_u32(p)), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* A Q5_0 block's 32 quants as signed bytes (-16..15): the nibbles, less 16 where the fifth bit is clear. */
static inline __m256i q5_0_quants(const uint8_t *w) {
    return _mm256_or_si256(nibbles(w + 6), _mm256_andnot_si256(bits_to_bytes(w + 2), _mm256_set1_epi8((char)0xF0)));
}

/* 32 nibbles (nibbles()) as the signed bytes of a 16-entry grid (mq_kvalues_iq4nl, mq_kvalues_mxfp4). */
static inline __m256i grid(const int8_t *g, __m256i nib) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)g)), nib);
}

/* The sum of eight float lanes as ggml's hsum_float_8 adds them (halves, then pairs, then the two). */
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* The K-quant pieces quants_avx2.c's kernels and quants_moe_avx2.c's expert products share (load32 and kscales_x
 * above too). */
/* int16 lane k of each 128-bit half (one shuffle; _mm256_set1_epi16 of a scalar costs two). */
static inline __m256i lane16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * k)));
}

/* Lane i: the sum of x[i]'s eight lanes (exact, in any order). */
static inline __m128i hsum4_epi32(const __m256i x[4]) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(x[0], x[1]), _mm256_hadd_epi32(x[2], x[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* A Q4_K (five = 0) or Q5_K block's 256 quants as bytes: lo[j], hi[j] the low and high nibbles of its 64-value
 * part j (with Q5_K's fifth bit). */
static inline void k_quants(const uint8_t *w, const int five, __m256i lo[4], __m256i hi[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const uint8_t *q4 = w + (five ? 48 : 16);
    const __m256i hm = load32(w + 16);
    for (int j = 0; j < 4; j++) {
        const __m256i v = load32(q4 + 32 * j);
        lo[j] = _mm256_and_si256(v, low4), hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        if (five) {
            lo[j] = _mm256_or_si256(lo[j], _mm256_slli_epi16(
                _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(2 * j)), one), 4));
            hi[j] = _mm256_or_si256(hi[j], _mm256_slli_epi16(
                _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(2 * j + 1)), one), 4));
        }
    }
}

/* p[j]: part j's quants (k_quants) times the activation's q8 (its 256 int8), times the sub-block scales (sc16:
 * scale k is lane16(sc16, k)); exact in int32. */
static inline void k_parts(const __m256i lo[4], const __m256i hi[4], __m256i sc16, const uint8_t *q8, __m256i p[4]) {
    for (int j = 0; j < 4; j++) {
        const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[j], load32(q8 + 64 * j)), lane16(sc16, 2 * j));
        const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[j], load32(q8 + 64 * j + 32)),
                                             lane16(sc16, 2 * j + 1));
        p[j] = _mm256_add_epi32(pl, ph);
    }
}

/* quants_avx2_iq.c's kernels (the mq_dot_fn and mq_dotn_fn of quants.h) for the AVX2 table. */
float mq_dot_iq4_xs_avx2(const uint8_t *w, const uint8_t *y, int n);
void mq_rows_iq4_xs_avx2(const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc, float *out, size_t os,
                         const float *yf);
void mq_rows_iq4_xs_batch_avx2(const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc, float *out, size_t os,
                               const float *yf);
/* quants_moe_avx2.c's products (quants.h's mq_experts_fn and mq_gemv_fn). */
void mq_experts_mxfp4_avx2(const uint8_t *w, size_t rb, int64_t rows, const uint8_t *y, size_t ys, int n, int nrc,
                           float *out, size_t os);
void mq_experts_q4_k_avx2(const uint8_t *w, size_t rb, int64_t rows, const uint8_t *y, size_t ys, int n, int nrc,
                          float *out, size_t os);
void mq_gemv_mxfp4_avx2(const uint8_t *w, size_t rb, int64_t rows, const uint8_t *y, int n, float *out);

/* The gemm kernels of one type (mq_gemm of quants.h): its panel's bytes for n columns, packing nw weight rows into
 * a panel, and the panel against nrc activation rows. quants_gemm_avx2.c: Q4_K, Q6_K; quants_gemm32_avx2.c: Q5_0,
 * Q8_0. */
#define MQ_GEMM_AVX2(t)                                                                                            \
    size_t mq_panel_bytes_##t##_avx2(int n);                                                                       \
    void mq_pack_##t##_avx2(const uint8_t *w, size_t row_bytes, int nw, int n, uint8_t *panel);                    \
    void mq_gemm_##t##_avx2(const uint8_t *panel, int n, const uint8_t *y, size_t ys, int nrc, float *out, size_t os, \
                            int nw);
MQ_GEMM_AVX2(q4_k)
MQ_GEMM_AVX2(q6_k)
MQ_GEMM_AVX2(q5_0)
MQ_GEMM_AVX2(q8_0)
#undef MQ_GEMM_AVX2

/* quants_batch32_avx2.c's Q4_1 panel kernel (mq_panel_fn of quants.h; yf is never NULL: Q4_1 has tile_scales). */
void mq_panel_q4_1_avx2(int type, const uint8_t *rows, size_t rs, int nw, const uint8_t *y, size_t ys, int n,
                        int nrc, float *out, size_t os, const float *yf);

#endif
