/* The panel kernel (mq_panel, quants.h) of Q4_1 for quants_avx2.c's table: a prompt's product of unpacked weight
 * rows (quants_avx2.c's unpack32: each row its n quants as bytes, then each block's scale and min as floats)
 * against tiles of up to MQ_NRC activation rows quantized to Q8_1 (yf: their block scales and sums as floats).
 *
 * The float operations per (weight row, activation row) are ggml_vec_dot_q4_1_q8_1's on AVX2, as quants_avx2.c's
 * q32_rows and q32_panel do them: per block the integer products of the 32 values summed into eight int32 lanes
 * (four products a lane), made float, and fused-multiply-added by the product of the two scales into eight float
 * lanes; the min times the activation block's sum added into a scalar per block; the eight lanes summed at the end
 * (hsum_ps, ggml's hsum_float_8) and the scalar added. So each output has the bits llama.cpp gives it.
 *
 * What differs from q32_panel is the shape of the work: the whole tile (two weight rows by four activation rows)
 * is written out with its eight accumulators as named registers, each activation block loaded once for both
 * weight rows, so the compiler keeps every accumulator in a register (q32_panel's arrays, indexed in loops, were
 * spilled to the stack and reloaded each block). Edge tiles (one weight row, fewer activation rows) take the
 * same operations in a loop. */
#include <math.h>

#include "cpu.h"
#include "quants_common.h"

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O3", "fp-contract=off")
#include <immintrin.h>

#include "quants.h"
#include "quants_avx2.h"

/* Bytes of a Q8_1 block (d, s as float16, then 32 quants) and where its quants start. */
enum { Q81_SIZE = 36, Q81_QS = 4 };

/* The eight int32 lanes of a block's products (four a lane) as floats: ggml's mul_sum_us8_pairs_float. */
static inline __m256 products(__m256i q, __m256i yq, __m256i ones) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(q, yq), ones));
}

/* Two weight rows by four activation rows. */
static void tile_2x4(const uint8_t *w0, const uint8_t *w1, int n, const uint8_t *y, size_t ys, float *out,
                     size_t os, const float *yf) {
    const int nb = n / 32;
    const float *dm0 = (const float *)(w0 + n), *dm1 = (const float *)(w1 + n);
    const uint8_t *y0 = y + Q81_QS, *y1 = y0 + ys, *y2 = y1 + ys, *y3 = y2 + ys;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m128 s0 = _mm_setzero_ps(), s1 = s0;
    for (int ib = 0; ib < nb; ib++) {
        const __m256i q0 = load32(w0 + 32 * ib), q1 = load32(w1 + 32 * ib);
        const __m128 yd = _mm_loadu_ps(yf + ib * MQ_NRC), ysum = _mm_loadu_ps(yf + (nb + ib) * MQ_NRC);
        float d[8]; /* the scales' products: weight row 0 by activation rows 0..3, then weight row 1 */
        _mm_storeu_ps(d, _mm_mul_ps(_mm_set1_ps(dm0[ib]), yd));
        _mm_storeu_ps(d + 4, _mm_mul_ps(_mm_set1_ps(dm1[ib]), yd));
        s0 = _mm_add_ps(s0, _mm_mul_ps(_mm_set1_ps(dm0[nb + ib]), ysum));
        s1 = _mm_add_ps(s1, _mm_mul_ps(_mm_set1_ps(dm1[nb + ib]), ysum));
        const size_t at = (size_t)ib * Q81_SIZE;
        __m256i yq = load32(y0 + at);
        a00 = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[0]), products(q0, yq, ones), a00);
        a10 = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[4]), products(q1, yq, ones), a10);
        yq = load32(y1 + at);
        a01 = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[1]), products(q0, yq, ones), a01);
        a11 = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[5]), products(q1, yq, ones), a11);
        yq = load32(y2 + at);
        a02 = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[2]), products(q0, yq, ones), a02);
        a12 = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[6]), products(q1, yq, ones), a12);
        yq = load32(y3 + at);
        a03 = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[3]), products(q0, yq, ones), a03);
        a13 = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[7]), products(q1, yq, ones), a13);
    }
    float m0[4], m1[4];
    _mm_storeu_ps(m0, s0);
    _mm_storeu_ps(m1, s1);
    out[0] = hsum_ps(a00) + m0[0], out[1] = hsum_ps(a10) + m1[0];
    out[os] = hsum_ps(a01) + m0[1], out[os + 1] = hsum_ps(a11) + m1[1];
    out[2 * os] = hsum_ps(a02) + m0[2], out[2 * os + 1] = hsum_ps(a12) + m1[2];
    out[3 * os] = hsum_ps(a03) + m0[3], out[3 * os + 1] = hsum_ps(a13) + m1[3];
}

/* One weight row by nrc (1..MQ_NRC) activation rows: the same operations per pair (nrc a constant where
 * tile_1xn inlines it). */
static inline __attribute__((always_inline)) void tile_1xn(const uint8_t *w, int n, const uint8_t *y, size_t ys,
                                                           const int nrc, float *out, size_t os, const float *yf) {
    const int nb = n / 32;
    const float *dm = (const float *)(w + n);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MQ_NRC];
    __m128 s = _mm_setzero_ps();
    for (int r = 0; r < MQ_NRC; r++) acc[r] = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const __m256i q = load32(w + 32 * ib);
        float d[MQ_NRC];
        _mm_storeu_ps(d, _mm_mul_ps(_mm_set1_ps(dm[ib]), _mm_loadu_ps(yf + ib * MQ_NRC)));
        s = _mm_add_ps(s, _mm_mul_ps(_mm_set1_ps(dm[nb + ib]), _mm_loadu_ps(yf + (nb + ib) * MQ_NRC)));
        for (int r = 0; r < nrc; r++) {
            const __m256i yq = load32(y + (size_t)r * ys + (size_t)ib * Q81_SIZE + Q81_QS);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[r]), products(q, yq, ones), acc[r]);
        }
    }
    float m[MQ_NRC];
    _mm_storeu_ps(m, s);
    for (int r = 0; r < nrc; r++) out[(size_t)r * os] = hsum_ps(acc[r]) + m[r];
}

void mq_panel_q4_1_avx2(int type, const uint8_t *rows, size_t rs, int nw, const uint8_t *y, size_t ys, int n,
                        int nrc, float *out, size_t os, const float *yf) {
    (void)type;
    if (nw == 2 && nrc == MQ_NRC) {
        tile_2x4(rows, rows + rs, n, y, ys, out, os, yf);
        return;
    }
    for (int k = 0; k < nw; k++) {
        const uint8_t *w = rows + (size_t)k * rs;
        switch (nrc) {
        case 1: tile_1xn(w, n, y, ys, 1, out + k, os, yf); break;
        case 2: tile_1xn(w, n, y, ys, 2, out + k, os, yf); break;
        case 3: tile_1xn(w, n, y, ys, 3, out + k, os, yf); break;
        default: tile_1xn(w, n, y, ys, MQ_NRC, out + k, os, yf); break;
        }
    }
}

#pragma GCC pop_options
#endif
