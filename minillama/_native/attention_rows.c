/* A pass of 2..MA_TILED_ROWS-1 rows of one sequence: ggml's one_chunk flash attention for each row (attention.c's
 * row path, ma_attend_cells: per key a float16 dot product in ggml_vec_dot_f16's order, the online softmax, the
 * float16 sum of values rounded after every scale and every fused multiply-add), with the loads shared. The cache's
 * cells are visited in blocks of ROWS_BLOCK, in cell order; a block's keys and values are widened to float32 once
 * for every row and query head that sees one of them (widening a float16 is exact), then each row and head runs its
 * own one_chunk steps over the cells of the block it sees, in cell order: the same operations in the same order as
 * alone, so the same bits. The scalar kernels take the rows one at a time through ma_attend_cells. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "model.h"

#define ROWS_BLOCK 32
#define ROWS_R ((MA_TILED_ROWS - 1) * MA_ROW_HEADS)

/* work: q16 [R][D] | acc [R][Dv] | M, S [R] | kf [ROWS_BLOCK][D] | vf [ROWS_BLOCK][Dv]; or the row path's. */
size_t ma_rows_work(int64_t D, int64_t Dv) {
    const size_t blocked = (size_t)(ROWS_R * (D + Dv + 2) + ROWS_BLOCK * (D + Dv));
    return blocked > ma_row_work(D, Dv) ? blocked : ma_row_work(D, Dv);
}

/* The first cell of positions lo..hi a row at position p sees: s0 (its window's start) .. p. */
static inline int64_t window_start(int64_t p, int64_t window) {
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

static void rows_scalar(const float *q, int64_t q_stride, int64_t n, int64_t nh, const int64_t *pos, int64_t window,
                        const int64_t *cells, int64_t n_kv, const uint16_t *k, int64_t ks, const uint16_t *v,
                        int64_t vs, int64_t D, int64_t Dv, float scale, const float *sink, float *out,
                        int64_t out_stride, float *work) {
    for (int64_t i = 0; i < n; i++)
        ma_attend_cells(q + i * q_stride, nh, k, ks, v, vs, cells, cells ? n_kv : ma_cache_cells(pos[i]),
                        window_start(pos[i], window), pos[i], 1, D, Dv, scale, sink, out + i * out_stride, work);
}

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

/* glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, the __expf_fma build its CPUs with AVX2 and FMA run) four lanes at a
 * time, the same double operations in the same order (its compiler fuses z = InvLn2N x into both kd = z + SHIFT and
 * r = z - kd): k = round(x 32 / ln 2), 2^(k / 32) from its table, a cubic in r; below log(2^-150) 0, NaN x + x. Equal
 * to glibc 2.36's expf for every float x <= 0 (checked over all of them); ma_libm_expf_n checks its libm once. */
static const uint64_t exp2f_table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

static inline __m128 expf4(__m128 x) {
    const __m256d xd = _mm256_cvtps_pd(x), inv = _mm256_set1_pd(0x1.71547652b82fep+0 * 32);
    const __m256d shift = _mm256_set1_pd(0x1.8p+52);
    __m256d kd = _mm256_fmadd_pd(inv, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    const __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    const __m256i t = _mm256_add_epi64(
        _mm256_i64gather_epi64((const long long *)exp2f_table, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8),
        _mm256_slli_epi64(ki, 47));
    const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                      _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm256_set1_pd(1.0));
    y = _mm256_mul_pd(_mm256_fmadd_pd(z, _mm256_mul_pd(r, r), y), _mm256_castsi256_pd(t));
    __m128 out = _mm256_cvtpd_ps(y);
    out = _mm_blendv_ps(out, _mm_setzero_ps(), _mm_cmp_ps(x, _mm_set1_ps(-0x1.9fe368p6f), _CMP_LT_OQ));
    return _mm_blendv_ps(out, _mm_add_ps(x, x), _mm_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* y [n] = expf4 of x [n] where every lane of four is <= 0 or NaN, else libm's expf for those four. */
static void expf_n_avx2(int64_t n, const float *x, float *y) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128 v = _mm_loadu_ps(x + i);
        if (_mm_movemask_ps(_mm_cmp_ps(v, _mm_setzero_ps(), _CMP_GT_OQ)))
            for (int l = 0; l < 4; l++) y[i + l] = expf(x[i + l]);
        else
            _mm_storeu_ps(y + i, expf4(v));
    }
    for (; i < n; i++) y[i] = expf(x[i]);
}

#include "attention_avx2.h"

/* dst [n] = the float16 values src [n] widened (exact). */
static void widen(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(src + i));
    for (; i < n; i++) dst[i] = mq_half_float(src[i]);
}

/* The m seen keys kf + idx[j] D of the block scored against qr (the float16-rounded query): each as
 * ggml_vec_dot_f16 sums it (attention.c's dot_f16_avx2: four accumulators of eight lanes, acc0 + acc2, acc1 + acc3,
 * their sum, lanes l + l+4, then pairs of pairs; the tail in double), eight keys' last reductions done together in
 * a transpose that adds the same operands in the same order; then times scale. */
/* One key's four accumulators summed (acc0 + acc2, acc1 + acc3, their sum); D a constant where it is inlined. */
static inline __attribute__((always_inline)) __m256 dot_lanes(const float *kr, const float *qr, int64_t np) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < np; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i), _mm256_loadu_ps(qr + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 8), _mm256_loadu_ps(qr + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 16), _mm256_loadu_ps(qr + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 24), _mm256_loadu_ps(qr + i + 24), a3);
    }
    return _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
}

/* Keys j and j + 4 of eight: lanes l + l+4 of each (key j's in the low half). */
static inline __attribute__((always_inline)) __m256 halves(const float *kf, const int64_t *idx, int64_t t,
                                                           int64_t cnt, int j, const float *qr, int64_t D,
                                                           int64_t np) {
    const __m256 p = dot_lanes(kf + idx[t + j] * D, qr, np);
    const __m256 p4 = dot_lanes(kf + idx[t + (j + 4 < cnt ? j + 4 : 0)] * D, qr, np);
    return _mm256_add_ps(_mm256_permute2f128_ps(p, p4, 0x20), _mm256_permute2f128_ps(p, p4, 0x31));
}

static inline __attribute__((always_inline)) void scores_d(const float *qr, const float *kf, const int64_t *idx,
                                                           int64_t m, int64_t D, float scale, float *sc) {
    const int64_t np = D & ~(int64_t)31;
    for (int64_t t = 0; t < m; t += 8) {
        const int64_t cnt = m - t < 8 ? m - t : 8;
        /* keys (0, 4), (1, 5), (2, 6), (3, 7), then hadd twice: key kk in lane kk (keys past cnt: key 0 again) */
        __m256 s[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) s[j] = halves(kf, idx, t, cnt, j < cnt ? j : 0, qr, D, np);
        float r[8];
        _mm256_storeu_ps(r, _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3])));
        for (int64_t kk = 0; kk < cnt; kk++) {
            float d = r[kk];
            if (np < D) {
                const float *kr = kf + idx[t + kk] * D;
                double sum = (double)d;
                for (int64_t i = np; i < D; i++) sum += (double)(kr[i] * qr[i]);
                d = (float)sum;
            }
            sc[t + kk] = d * scale;
        }
    }
}

static void scores(const float *qr, const float *kf, const int64_t *idx, int64_t m, int64_t D, float scale,
                   float *sc) {
    if (D == 64)
        scores_d(qr, kf, idx, m, 64, scale, sc);
    else if (D == 128)
        scores_d(qr, kf, idx, m, 128, scale, sc);
    else
        scores_d(qr, kf, idx, m, D, scale, sc);
}

static void rows_avx2(const float *q, int64_t q_stride, int64_t n, int64_t nh, const int64_t *pos, int64_t window,
                      const int64_t *cells, int64_t n_kv, const uint16_t *k, int64_t ks, const uint16_t *v,
                      int64_t vs, int64_t D, int64_t Dv, float scale, const float *sink, float *out,
                      int64_t out_stride, float *work) {
    const int64_t R = n * nh;
    float *q16 = work, *acc = q16 + R * D, *M = acc + R * Dv, *S = M + R, *kf = S + R, *vf = kf + ROWS_BLOCK * D;
    for (int64_t r = 0; r < R; r++) {
        const float *qr = q + r / nh * q_stride + r % nh * D;
        for (int64_t d = 0; d < D; d++) q16[r * D + d] = mq_round_f16(qr[d]);
        for (int64_t d = 0; d < Dv; d++) acc[r * Dv + d] = 0;
        M[r] = -INFINITY, S[r] = 0;
    }
    int64_t lo = 0, hi = n_kv - 1;
    if (!cells) { /* cell c holds position c: from the first position any row sees to the last */
        lo = INT64_MAX, hi = -1;
        for (int64_t i = 0; i < n; i++) {
            const int64_t s0 = window_start(pos[i], window);
            lo = s0 < lo ? s0 : lo, hi = pos[i] > hi ? pos[i] : hi;
        }
    }
    for (int64_t c0 = lo; c0 <= hi; c0 += ROWS_BLOCK) {
        const int64_t nb = hi - c0 + 1 < ROWS_BLOCK ? hi - c0 + 1 : ROWS_BLOCK;
        int64_t kp[ROWS_BLOCK];
        uint64_t mask[MA_TILED_ROWS], any = 0;
        for (int64_t j = 0; j < nb; j++) kp[j] = cells ? cells[c0 + j] : c0 + j;
        for (int64_t i = 0; i < n; i++) { /* the cells row i sees in this block */
            const int64_t s0 = window_start(pos[i], window);
            uint64_t m = 0;
            for (int64_t j = 0; j < nb; j++) m |= (uint64_t)(kp[j] >= s0 && kp[j] <= pos[i]) << j;
            mask[i] = m, any |= m;
        }
        for (int64_t j = 0; j < nb; j++)
            if (any >> j & 1) {
                widen(kf + j * D, k + kp[j] * ks, D);
                widen(vf + j * Dv, v + kp[j] * vs, Dv);
            }
        for (int64_t i = 0; i < n; i++) {
            if (!mask[i]) continue;
            int64_t idx[ROWS_BLOCK], m = 0;
            for (int64_t j = 0; j < nb; j++)
                if (mask[i] >> j & 1) idx[m++] = j;
            for (int64_t g = 0; g < nh; g++) {
                const int64_t r = i * nh + g;
                float w[ROWS_BLOCK], ms[ROWS_BLOCK];
                uint8_t up[ROWS_BLOCK];
                scores(q16 + r * D, kf, idx, m, D, scale, w);
                ma_online_weights(w, ms, up, m, M + r, S + r);
                value_sum(acc + r * Dv, 0, vf, Dv, idx, m, Dv, w, ms, up);
            }
        }
    }
    for (int64_t r = 0; r < R; r++)
        ma_row_finish(acc + r * Dv, Dv, M[r], S[r], sink ? sink + r % nh : NULL,
                      out + r / nh * out_stride + r % nh * Dv, NULL);
}
#pragma GCC pop_options
#define HAVE_AVX2_ROWS 1
#endif

/* The online softmax's steps over m scores w in key order (one_chunk's, as attention.c's run_scalar takes them):
 * a score above the running maximum M takes it (up: its scale ms = expf(old M - score), weight 1), any other the
 * weight w = expf(score - M) (ms 1); S = S ms + w. The exponents are gathered first (each depends only on the maxima
 * before it) and taken together by ma_libm_expf_n. */
void ma_online_weights(float *w, float *ms, uint8_t *up, int64_t m, float *M, float *S) {
    float Mr = *M, Sr = *S;
    for (int64_t j = 0; j < m; j++) {
        up[j] = w[j] > Mr;
        ms[j] = up[j] ? Mr - w[j] : w[j] - Mr;
        Mr = up[j] ? w[j] : Mr;
    }
    ma_libm_expf_n(m, ms, ms);
    for (int64_t j = 0; j < m; j++) {
        if (up[j])
            w[j] = 1;
        else
            w[j] = ms[j], ms[j] = 1;
        Sr = Sr * ms[j] + w[j];
    }
    *M = Mr, *S = Sr;
}

/* Whether expf_n_avx2 gives this process's libm expf bits: checked once on inputs across its range (the table's
 * every entry, both ends, the subnormal results, a case its fused r decides). */
static int expf_checked;
static void check_expf(void) {
#ifdef HAVE_AVX2_ROWS
    if (mq_cpu_isa() != MQ_ISA_AVX2) return;
    float x[4096], y[4096];
    for (int i = 0; i < 4096; i++) x[i] = -(float)i * 0.0265f - (float)(i % 7) * 1e-7f;
    x[0] = -0.0f, x[1] = -INFINITY, x[2] = -0x1.f8cbb2p+5f, x[3] = -103.9f, x[4] = -0x1.9fe368p6f, x[5] = -87.5f;
    expf_n_avx2(4096, x, y);
    for (int i = 0; i < 4096; i++) {
        const float e = expf(x[i]);
        if (memcmp(&e, &y[i], sizeof e)) return;
    }
    expf_checked = 1;
#endif
}
static pthread_once_t expf_once = PTHREAD_ONCE_INIT;

void ma_libm_expf_n(int64_t n, const float *x, float *y) {
    pthread_once(&expf_once, check_expf);
#ifdef HAVE_AVX2_ROWS
    if (expf_checked) {
        expf_n_avx2(n, x, y);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

void ma_attend_rows(const float *q, int64_t q_stride, int64_t n, int64_t nh, const int64_t *pos, int64_t window,
                    const int64_t *cells, int64_t n_kv, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                    int64_t v_stride, int64_t D, int64_t Dv, float scale, const float *sink, float *out,
                    int64_t out_stride, float *work) {
#ifdef HAVE_AVX2_ROWS
    /* one row (a sequence's step in a batch of steps): nothing to share, so the row path, which reads the float16
     * keys and values where they lie rather than widening each block first */
    if (mq_cpu_isa() == MQ_ISA_AVX2 && n > 1) {
        rows_avx2(q, q_stride, n, nh, pos, window, cells, n_kv, k, k_stride, v, v_stride, D, Dv, scale, sink, out,
                  out_stride, work);
        return;
    }
#endif
    rows_scalar(q, q_stride, n, nh, pos, window, cells, n_kv, k, k_stride, v, v_stride, D, Dv, scale, sink, out,
                out_stride, work);
}
