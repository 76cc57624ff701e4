/* The AVX2 pieces attention.c's row path and attention_rows.c share: float16 loads and roundings, and the float16
 * sum of a query's weighted values (ggml's one_chunk VKQ16). Include inside their AVX2 target pragmas (after
 * immintrin.h, model.h and cpu.h). */
#ifndef MINILLAMA_ATTENTION_AVX2_H
#define MINILLAMA_ATTENTION_AVX2_H

/* Rounds the eight floats to float16 (nearest even) and back. */
static inline __m256 round_f16x8(__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Where a run's m value rows lie: f16, key j's row at (uint16_t *)v + j * vs (the cache's float16 rows); else at
 * (float *)v + idx[j] * vs (rows widened to float32 once for a block). f16 is a constant at each call. */
static inline __attribute__((always_inline)) __m256 value8(const int f16, const void *v, int64_t vs,
                                                           const int64_t *idx, int64_t j, int64_t at) {
    return f16 ? load_f16x8((const uint16_t *)v + j * vs + at) : _mm256_loadu_ps((const float *)v + idx[j] * vs + at);
}

static inline __attribute__((always_inline)) float value1(const int f16, const void *v, int64_t vs,
                                                          const int64_t *idx, int64_t j, int64_t at) {
    return f16 ? mq_half_float(((const uint16_t *)v)[j * vs + at]) : ((const float *)v)[idx[j] * vs + at];
}

/* acc [8 nl lanes] from column i0 over the run's m keys: where up[j], acc = f16(acc * ms[j]); then acc = f16(v_j *
 * w[j] + acc), fused. nl is a constant at each call: the compiler keeps the lanes in registers. */
static inline __attribute__((always_inline)) void value_lanes(float *acc, const int nl, const int f16, const void *v,
                                                              int64_t vs, const int64_t *idx, int64_t i0, int64_t m,
                                                              const float *w, const float *ms, const uint8_t *up) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < nl; i++) a[i] = _mm256_loadu_ps(acc + 8 * i);
    for (int64_t j = 0; j < m; j++) {
        if (up[j]) {
            const __m256 m8 = _mm256_set1_ps(ms[j]);
#pragma GCC unroll 8
            for (int i = 0; i < nl; i++) a[i] = round_f16x8(_mm256_mul_ps(a[i], m8));
        }
        const __m256 w8 = _mm256_set1_ps(w[j]);
#pragma GCC unroll 8
        for (int i = 0; i < nl; i++)
            a[i] = round_f16x8(_mm256_fmadd_ps(value8(f16, v, vs, idx, j, i0 + 8 * i), w8, a[i]));
    }
#pragma GCC unroll 8
    for (int i = 0; i < nl; i++) _mm256_storeu_ps(acc + 8 * i, a[i]);
}

/* The weighted values [Dv] of one query over a run of m keys into acc: value_lanes 64 lanes at a time, the last
 * Dv % 8 one by one with the same roundings, so each lane takes the same operations in the same order as one key
 * at a time would. */
static inline __attribute__((always_inline)) void value_sum(float *acc, const int f16, const void *v, int64_t vs,
                                                            const int64_t *idx, int64_t m, int64_t Dv,
                                                            const float *w, const float *ms, const uint8_t *up) {
    const int64_t dv8 = Dv & ~(int64_t)7;
    int64_t i = 0;
    for (; i + 64 <= dv8; i += 64) value_lanes(acc + i, 8, f16, v, vs, idx, i, m, w, ms, up);
    switch ((dv8 - i) / 8) {
    case 7: value_lanes(acc + i, 7, f16, v, vs, idx, i, m, w, ms, up); break;
    case 6: value_lanes(acc + i, 6, f16, v, vs, idx, i, m, w, ms, up); break;
    case 5: value_lanes(acc + i, 5, f16, v, vs, idx, i, m, w, ms, up); break;
    case 4: value_lanes(acc + i, 4, f16, v, vs, idx, i, m, w, ms, up); break;
    case 3: value_lanes(acc + i, 3, f16, v, vs, idx, i, m, w, ms, up); break;
    case 2: value_lanes(acc + i, 2, f16, v, vs, idx, i, m, w, ms, up); break;
    case 1: value_lanes(acc + i, 1, f16, v, vs, idx, i, m, w, ms, up); break;
    default: break;
    }
    for (i = dv8; i < Dv; i++)
        for (int64_t j = 0; j < m; j++) {
            if (up[j]) acc[i] = mq_round_f16(acc[i] * ms[j]);
            acc[i] = mq_round_f16(fmaf(value1(f16, v, vs, idx, j, i), w[j], acc[i]));
        }
}

#endif
