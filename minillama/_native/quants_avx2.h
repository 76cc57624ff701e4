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
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
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

/* quants_avx2_iq.c's kernels (the mq_dot_fn and mq_dotn_fn of quants.h) for the AVX2 table. */
float mq_dot_iq4_xs_avx2(const uint8_t *w, const uint8_t *y, int n);
void mq_rows_iq4_xs_avx2(const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc, float *out, size_t os,
                         const float *yf);
void mq_rows_iq4_xs_batch_avx2(const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc, float *out, size_t os,
                               const float *yf);

/* quants_gemm_avx2.c's gemm kernels (mq_gemm of quants.h). */
size_t mq_panel_bytes_q4_k_avx2(int n);
void mq_pack_q4_k_avx2(const uint8_t *w, size_t row_bytes, int nw, int n, uint8_t *panel);
void mq_gemm_q4_k_avx2(const uint8_t *panel, int n, const uint8_t *y, size_t ys, int nrc, float *out, size_t os,
                       int nw);
size_t mq_panel_bytes_q6_k_avx2(int n);
void mq_pack_q6_k_avx2(const uint8_t *w, size_t row_bytes, int nw, int n, uint8_t *panel);
void mq_gemm_q6_k_avx2(const uint8_t *panel, int n, const uint8_t *y, size_t ys, int nrc, float *out, size_t os,
                       int nw);

#endif
