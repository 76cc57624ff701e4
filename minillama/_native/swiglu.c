/* SwiGLU, silu(x) * g, as ggml's CPU backend computes it (ggml_vec_swiglu_f32): eight values at a time through
 * ggml_v_silu, x / (1 + e^-x) with e^-x from ggml_v_expf (a polynomial after a range reduction, adapted from
 * Arm's optimized routines: up to about 2 ulp from the true value, and not what libm's expf gives); the n % 8
 * values left at the end through libm's expf. Matching it bit for bit keeps a block's output equal to
 * llama.cpp's: a silu one ulp apart now and then flips an 8-bit activation quantum in the next product.
 *
 * A scalar kernel does each lane's operations one at a time with fmaf (the reference and the fallback); an
 * AVX2 kernel does eight at once; they give the same bits. The AVX2 one runs where the quantized products run
 * theirs (cpu.c's one choice: the CPU's features and MINILLAMA_KERNELS). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "model.h"

static inline float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* One lane of ggml_v_expf. */
static float v_expf_lane(float x) {
    const float r = 0x1.8p23f, z = fmaf(x, 0x1.715476p+0f, r), n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = float_bits(z) << 23;
    const float k = bits_float(e + float_bits(1.0f)), u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                         0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126)) return fmaf(j, k, k);
    const uint32_t g = n <= 0 ? 0x82000000u : 0;
    const float s1 = bits_float(g + 0x7f000000u), s2 = bits_float(e - g);
    if (fabsf(n) > 192) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

static void swiglu_scalar(int64_t n, float *y, const float *x, const float *g) {
    const int64_t n8 = n & ~(int64_t)7;
    int64_t i = 0;
    for (; i < n8; i++) y[i] = x[i] / (1.0f + v_expf_lane(0.0f - x[i])) * g[i];
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

typedef void (*swiglu_fn)(int64_t, float *, const float *, const float *);

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

static inline __m256 v_expf8(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.f), n);
    const __m256 c = _mm256_cmp_ps(absn, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(c)) return _mm256_fmadd_ps(j, k, k);
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 d = _mm256_cmp_ps(absn, _mm256_set1_ps(192), _CMP_GT_OQ);
    return _mm256_or_ps(_mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
                        _mm256_andnot_ps(d, _mm256_or_ps(_mm256_and_ps(c, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                                                         _mm256_andnot_ps(c, _mm256_fmadd_ps(k, j, k)))));
}

static void swiglu_avx2(int64_t n, float *y, const float *x, const float *g) {
    int64_t i = 0;
    for (; i + 7 < n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        const __m256 e = v_expf8(_mm256_sub_ps(_mm256_setzero_ps(), xv));
        const __m256 silu = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1), e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(g + i)));
    }
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}
static void v_expf8_store(const float *x, float *y) { _mm256_storeu_ps(y, v_expf8(_mm256_loadu_ps(x))); }
#pragma GCC pop_options
#define HAVE_AVX2_SWIGLU 1
#endif

float ma_v_expf(float x) { return v_expf_lane(x); }

void ma_v_expf_n(int64_t n, const float *x, float *y) {
    int64_t i = 0;
#ifdef HAVE_AVX2_SWIGLU
    if (mq_cpu_isa() == MQ_ISA_AVX2)
        for (; i + 7 < n; i += 8) v_expf8_store(x + i, y + i);
#endif
    for (; i < n; i++) y[i] = v_expf_lane(x[i]);
}

void ma_swiglu(int64_t n, float *y, const float *x, const float *g) {
#ifdef HAVE_AVX2_SWIGLU
    const swiglu_fn kernel = mq_cpu_isa() == MQ_ISA_AVX2 ? swiglu_avx2 : swiglu_scalar;
#else
    const swiglu_fn kernel = swiglu_scalar;
#endif
    kernel(n, y, x, g);
}

void ma_swiglu_oai(int64_t n, float *y, const float *x, const float *g) {
    const float alpha = 1.702f, limit = 7.0f;
    for (int64_t i = 0; i < n; i++) {
        const float a = limit < x[i] ? limit : x[i];                        /* std::min: NaN stays */
        const float b = g[i] < -limit ? -limit : limit < g[i] ? limit : g[i]; /* std::clamp */
        const float glu = a / (1.0f + expf(alpha * (-a)));
        y[i] = glu * (b + 1.0f);
    }
}
