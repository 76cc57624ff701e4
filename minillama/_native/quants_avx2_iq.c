/* AVX2 kernels of the IQ4_XS type (256 values a block: float16 d, eight 6-bit sub-block scales, nibbles into
 * ggml's IQ4_NL grid) against Q8_K, for quants_avx2.c's table. The integer sums are exact; the float terms are
 * those of the kernel llama.cpp's CPU backend runs for a row at that place in a batch: below MQ_BATCH activation
 * rows ggml_vec_dot_iq4_xs_q8_K's AVX2 form (each block's eight int32 lanes fused with d x the activation's d
 * into eight float lanes, summed as hsum_float_8), from MQ_BATCH rows on its tiled kernel's (each block's whole
 * sum times d, fused with the activation's d into one chain). */
#include <math.h>

#include "cpu.h"
#include "quants_common.h"

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O3", "fp-contract=off")
#include <immintrin.h>

#include "quants_avx2.h"

/* One IQ4_XS block against one Q8_K block: ggml's eight int32 lanes (lane l: values 4l..4l+3 of each 32, each
 * 32 times its scale). q: the block's 256 values as bytes, ls: its scales. */
static inline __m256i iq4_xs_lanes(const __m256i q[8], const __m256i ls[8], const uint8_t *q8) {
    __m256i s = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m256i y = _mm256_loadu_si256((const __m256i *)(q8 + 32 * j));
        const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q[j], q[j]), _mm256_sign_epi8(y, q[j]));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p16, ls[j]));
    }
    return s;
}

static inline __attribute__((always_inline)) void iq4_xs_rows(const uint8_t *w, const uint8_t *y, size_t ys, int n,
                                                              const int nrc, float *out, size_t os, const int batch) {
    __m256 acc[MQ_NRC];
    float chain[MQ_NRC];
    for (int r = 0; r < nrc; r++) acc[r] = _mm256_setzero_ps(), chain[r] = 0;
    for (int ib = 0; ib < n / 256; ib++, w += 136, y += 292) {
        __m256i q[8], ls[8];
        const uint16_t sh = ld_u16(w + 2);
        for (int j = 0; j < 8; j++) {
            q[j] = grid(mq_kvalues_iq4nl, nibbles(w + 8 + 16 * j));
            const int sc = (((w[4 + j / 2] >> (4 * (j & 1))) & 0xF) | (((sh >> (2 * j)) & 3) << 4)) - 32;
            ls[j] = _mm256_set1_epi16((short)sc);
        }
        const float dw = h2f(ld_u16(w));
        for (int r = 0; r < nrc; r++) {
            const uint8_t *yr = y + (size_t)r * ys;
            const __m256i s = iq4_xs_lanes(q, ls, yr + 4);
            if (batch)
                chain[r] = fmaf(dw * (float)hsum_epi32(s), ld_f32(yr), chain[r]);
            else
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * ld_f32(yr)), _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    for (int r = 0; r < nrc; r++) out[(size_t)r * os] = batch ? chain[r] : hsum_ps(acc[r]);
}

/* nrc a constant in each body. */
#define IQ4_XS_ROWS(name, batch)                                                                                    \
    void name(const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc, float *out, size_t os,                \
              const float *yf) {                                                                                    \
        (void)yf;                                                                                                   \
        switch (nrc) {                                                                                              \
        case 1: iq4_xs_rows(w, y, ys, n, 1, out, os, batch); break;                                                 \
        case 2: iq4_xs_rows(w, y, ys, n, 2, out, os, batch); break;                                                 \
        case 3: iq4_xs_rows(w, y, ys, n, 3, out, os, batch); break;                                                 \
        default: iq4_xs_rows(w, y, ys, n, 4, out, os, batch); break;                                                \
        }                                                                                                           \
    }
IQ4_XS_ROWS(mq_rows_iq4_xs_avx2, 0)
IQ4_XS_ROWS(mq_rows_iq4_xs_batch_avx2, 1)
#undef IQ4_XS_ROWS

float mq_dot_iq4_xs_avx2(const uint8_t *w, const uint8_t *y, int n) {
    float out;
    iq4_xs_rows(w, y, 0, n, 1, &out, 0, 0);
    return out;
}

#pragma GCC pop_options
#else
/* no AVX2 kernels in this build: nothing here */
typedef int mq_no_avx2_iq;
#endif
