/* The integer GEMM of a prompt's products (mq_gemm, quants.h) for Q5_0 and Q8_0 in quants_avx2.c's table: llama.cpp
 * does not repack these types, so each output must keep ggml_vec_dot_q5_0_q8_0's (_q8_0_q8_0's) float chain: per
 * 32-value block the integer sum of 32 products as eight int32 lanes (lane l: values 4l..4l+3), converted to
 * float and added by one fused multiply-add, times the weight's d times the activation's d, into eight float
 * lanes, summed at the end by hsum_ps. The integer sums are exact in any order; the float operations are those
 * of q32_rows (quants_avx2.c), output by output, so the bits are llama.cpp's.
 *
 * What changes is the order of the loops and what is loaded once: a panel holds MQ_GEMM_ROWS = 8 weight rows
 * block by block (per block the eight rows' quants as bytes, 32 each, then their d as eight floats), and the
 * micro-kernel runs one activation row at a time against all eight, the eight outputs' accumulators in registers:
 * per block the activation's bytes are loaded (and made absolute) once for the eight rows, and the eight d x d
 * products are one multiply. Q5_0's quants (-16..15) take the activation's sign (|y| times q sign(y): no weight is
 * -128, whose negation wraps); Q8_0's may be -128, so its panel holds |q| beside q and the weight gives the sign,
 * as ggml's kernel does. */
#include "cpu.h"
#include "quants_common.h"

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O3", "fp-contract=off")
#include <immintrin.h>

#include "quants_avx2.h"

/* A panel block's bytes: the quants (Q8_0: |q| at 0, q at Q80_Q), then the eight d as floats (Q50_D, Q80_D). */
enum { Q50_D = 8 * 32, Q50_PB = Q50_D + 32, Q80_Q = 8 * 32, Q80_D = 16 * 32, Q80_PB = Q80_D + 32 };

size_t mq_panel_bytes_q5_0_avx2(int n) { return (size_t)(n / 32) * Q50_PB; }
size_t mq_panel_bytes_q8_0_avx2(int n) { return (size_t)(n / 32) * Q80_PB; }

static inline void pack32(const int q8, const uint8_t *w, size_t rb, int nw, int n, uint8_t *panel) {
    const int nb = n / 32, size = q8 ? 34 : 22;
    const size_t pbytes = q8 ? Q80_PB : Q50_PB;
    for (int ib = 0; ib < nb; ib++) {
        uint8_t *pb = panel + (size_t)ib * pbytes;
        float *d = (float *)(pb + (q8 ? Q80_D : Q50_D));
        for (int k = 0; k < MQ_GEMM_ROWS; k++) {
            const uint8_t *b = w + (size_t)(k < nw ? k : nw - 1) * rb + (size_t)ib * size;
            d[k] = h2f(ld_u16(b));
            const __m256i q = q8 ? load32(b + 2) : q5_0_quants(b);
            if (q8) {
                _mm256_storeu_si256((__m256i *)(pb + 32 * k), _mm256_sign_epi8(q, q));
                _mm256_storeu_si256((__m256i *)(pb + Q80_Q + 32 * k), q);
            } else
                _mm256_storeu_si256((__m256i *)(pb + 32 * k), q);
        }
    }
}

void mq_pack_q5_0_avx2(const uint8_t *w, size_t rb, int nw, int n, uint8_t *panel) { pack32(0, w, rb, nw, n, panel); }
void mq_pack_q8_0_avx2(const uint8_t *w, size_t rb, int nw, int n, uint8_t *panel) { pack32(1, w, rb, nw, n, panel); }

/* Blocks whose d x d products are made ahead of their use, a stretch at a time (a small table on the stack). */
#define STRETCH 32

/* Weight row k's step of one block: its integer lanes against the activation's, fused into acc by its d x d. */
#define STEP32(k, acc)                                                                                              \
    do {                                                                                                            \
        const __m256i p = q8 ? _mm256_maddubs_epi16(load32(pb + 32 * (k)),                                           \
                                                    _mm256_sign_epi8(yq, load32(pb + Q80_Q + 32 * (k))))            \
                             : _mm256_maddubs_epi16(ay, _mm256_sign_epi8(load32(pb + 32 * (k)), yq));               \
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[ib - i0][k]), _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)),  \
                              acc);                                                                                 \
    } while (0)

static inline __attribute__((always_inline)) void gemm32(const int q8, const uint8_t *panel, int n, const uint8_t *y,
                                                         size_t ys, int nrc, float *out, size_t os, int nw) {
    const int nb = n / 32;
    const size_t pbytes = q8 ? Q80_PB : Q50_PB, doff = q8 ? Q80_D : Q50_D;
    const __m256i ones = _mm256_set1_epi16(1);
    float dd[STRETCH][MQ_GEMM_ROWS] __attribute__((aligned(32)));
    for (int r = 0; r < nrc; r++) {
        const uint8_t *yr = y + (size_t)r * ys;
        /* the eight outputs' accumulators, named so that they stay in registers */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int i0 = 0; i0 < nb; i0 += STRETCH) {
            const int i1 = nb - i0 < STRETCH ? nb : i0 + STRETCH;
            for (int ib = i0; ib < i1; ib++) /* the eight weight rows' d times the activation's, as q32_rows */
                _mm256_store_ps(dd[ib - i0], _mm256_mul_ps(_mm256_loadu_ps((const float *)(panel + ib * pbytes + doff)),
                                                           _mm256_set1_ps(h2f(ld_u16(yr + (size_t)ib * 34)))));
            for (int ib = i0; ib < i1; ib++) {
                const uint8_t *pb = panel + (size_t)ib * pbytes;
                const __m256i yq = load32(yr + (size_t)ib * 34 + 2), ay = _mm256_sign_epi8(yq, yq);
                (void)ay; /* Q8_0 takes |q| instead */
                STEP32(0, a0);
                STEP32(1, a1);
                STEP32(2, a2);
                STEP32(3, a3);
                STEP32(4, a4);
                STEP32(5, a5);
                STEP32(6, a6);
                STEP32(7, a7);
            }
        }
        const __m256 acc[MQ_GEMM_ROWS] = {a0, a1, a2, a3, a4, a5, a6, a7};
        for (int k = 0; k < nw; k++) out[(size_t)r * os + k] = hsum_ps(acc[k]);
    }
}
#undef STEP32

void mq_gemm_q5_0_avx2(const uint8_t *panel, int n, const uint8_t *y, size_t ys, int nrc, float *out, size_t os,
                       int nw) {
    gemm32(0, panel, n, y, ys, nrc, out, os, nw);
}

void mq_gemm_q8_0_avx2(const uint8_t *panel, int n, const uint8_t *y, size_t ys, int nrc, float *out, size_t os,
                       int nw) {
    gemm32(1, panel, n, y, ys, nrc, out, os, nw);
}

#pragma GCC pop_options
#endif
