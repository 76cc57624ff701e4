/* The mixture-of-experts feed-forward's pieces, as llama.cpp's build_moe_ffn (src/llama-graph.cpp) computes them on
 * the CPU: the router's softmax over the experts (ggml_soft_max), the k best (ggml_argsort_top_k), their weights
 * divided by their sum (norm_w: ggml_sum_rows, clamped, ggml_div); then each chosen expert's SwiGLU over the rows
 * that chose it (ggml_mul_mat_id: one product per expert over all its rows, every weight read once for them).
 * model.c runs these between the barriers of its team (the threads share the experts' work items); minillama/model/
 * moe.py is the reference. No Python here.
 *
 * Shapes: T rows, E experts, k experts used per row, F = n_ff_exp. A choice is one (row t, slot i) pair, id t k + i;
 * the choices of an expert are its slots start[e]..start[e+1] of the grouped list. */
#include <math.h>
#include <string.h>

#include "core.h"
#include "cpu.h"
#include "model.h"

/* ggml_soft_max of one row: exp(x - max) (simd: ggml_v_expf eight at a time, their sum in float as ggml's AVX2
 * ggml_vec_soft_max_f32 reduces them, the rest libm's expf), summed in double, each times 1/sum rounded to float. */
static void softmax(const float *x, int64_t n, int simd, float *p) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0;
    int64_t i = 0;
    if (simd)
        for (; i + 7 < n; i += 8) {
            float v[8];
            for (int j = 0; j < 8; j++) p[i + j] = v[j] = ma_v_expf(x[i + j] - max);
            const float a0 = v[4] + v[0], a1 = v[5] + v[1], a2 = v[6] + v[2], a3 = v[7] + v[3];
            sum += (double)((a0 + a2) + (a1 + a3));
        }
    for (; i < n; i++) sum += (double)(p[i] = expf(x[i] - max));
    const float s = (float)(1.0 / sum);
    for (i = 0; i < n; i++) p[i] *= s;
}

#ifndef MQ_X86_AVX2_BUILD /* the reference forms; an AVX2 build has their vector twins below */
/* ggml_vec_dot_f32 as its AVX2 build sums: lane l of accumulator a (of four) takes x[32 s + 8 a + l] y[...] fused
 * in turn; the four added (0 + 2 and 1 + 3, then those two), the eight lanes halves first, then in pairs; the
 * n % 32 left added in double. */
static float dot_f32_avx2(const float *x, const float *y, int64_t n) {
    float acc[4][8] = {{0}};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
        for (int a = 0; a < 4; a++)
            for (int l = 0; l < 8; l++) acc[a][l] = fmaf(x[i + 8 * a + l], y[i + 8 * a + l], acc[a][l]);
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    const float t0 = v[0] + v[4], t1 = v[1] + v[5], t2 = v[2] + v[6], t3 = v[3] + v[7];
    double sum = (double)((t0 + t1) + (t2 + t3));
    for (int64_t i = np; i < n; i++) sum += (double)(x[i] * y[i]);
    return (float)sum;
}

/* llamafile's tinyBLAS (AVX2, float32): one accumulator of eight lanes, x[8 s + l] y[...] fused in turn, reduced
 * halves first, then lanes 0 + 2 and 1 + 3, then those two. n % 8 == 0. */
static float dot_f32_tiny(const float *x, const float *y, int64_t n) {
    float acc[8] = {0};
    for (int64_t i = 0; i < n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] = fmaf(x[i + l], y[i + l], acc[l]);
    const float t0 = acc[4] + acc[0], t1 = acc[5] + acc[1], t2 = acc[6] + acc[2], t3 = acc[7] + acc[3];
    return (t0 + t2) + (t1 + t3);
}
#endif

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

/* dot_f32_avx2 and dot_f32_tiny with their lanes in registers: each _mm256_fmadd_ps lane is the fmaf of the scalar
 * forms (one rounding), the reductions the same, so the same bits at eight lanes a step instead of a libm call. */
static float dot_f32_avx2_v(const float *x, const float *y, int64_t n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
        for (int a = 0; a < 4; a++)
            acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * a), _mm256_loadu_ps(y + i + 8 * a), acc[a]);
    float v[8];
    _mm256_storeu_ps(v, _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3])));
    const float t0 = v[0] + v[4], t1 = v[1] + v[5], t2 = v[2] + v[6], t3 = v[3] + v[7];
    double sum = (double)((t0 + t1) + (t2 + t3));
    for (int64_t i = np; i < n; i++) sum += (double)(x[i] * y[i]);
    return (float)sum;
}

static float dot_f32_tiny_v(const float *x, const float *y, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
    float v[8];
    _mm256_storeu_ps(v, acc);
    const float t0 = v[4] + v[0], t1 = v[5] + v[1], t2 = v[6] + v[2], t3 = v[7] + v[3];
    return (t0 + t2) + (t1 + t3);
}
#pragma GCC pop_options
#define DOT_F32_AVX2 dot_f32_avx2_v
#define DOT_F32_TINY dot_f32_tiny_v
#else
#define DOT_F32_AVX2 dot_f32_avx2
#define DOT_F32_TINY dot_f32_tiny
#endif

void mo_router(const float *w, const float *x, int64_t E, int64_t d, int64_t rows, int simd, float *logits) {
    const int tiny = simd && rows > 1 && d % 8 == 0 && E % 4 == 0;
    for (int64_t e = 0; e < E; e++) {
        const float *we = w + e * d;
        if (tiny)
            logits[e] = DOT_F32_TINY(we, x, d);
        else if (simd)
            logits[e] = DOT_F32_AVX2(we, x, d);
        else {
            double s = 0;
            for (int64_t i = 0; i < d; i++) s += (double)(we[i] * x[i]);
            logits[e] = (float)s;
        }
    }
}

int mo_simd(void) { return mq_cpu_isa() == MQ_ISA_AVX2; }

float mo_dot_f32(const float *x, const float *y, int64_t n, int simd) {
    if (simd) return DOT_F32_AVX2(x, y, n);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)(x[i] * y[i]);
    return (float)s;
}

int mo_router_f32(const ms_matrix *M) {
    return M->n == 1 && M->type[0] == MQ_F32 && (uintptr_t)M->w[0] % sizeof(float) == 0;
}

void mo_route(const float *logits, int64_t E, int64_t k, int simd, int32_t *chosen, float *weights) {
    float p[MS_MAX_EXPERTS];
    unsigned char taken[MS_MAX_EXPERTS] = {0};
    softmax(logits, E, simd, p);
    double sum = 0;
    for (int64_t i = 0; i < k; i++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) /* strictly greater: a tie keeps the lower expert; NaN: the first free */
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1, chosen[i] = (int32_t)best, weights[i] = p[best];
        sum += (double)weights[i];
    }
    float s = (float)sum;
    s = s < 6.103515625e-5f ? 6.103515625e-5f : s; /* NaN stays NaN, as ggml_clamp leaves it */
    for (int64_t i = 0; i < k; i++) weights[i] = weights[i] / s;
}

void mo_route_softmax_weight(const float *logits, int64_t E, int64_t k, int simd, int32_t *chosen, float *weights) {
    float top[MS_MAX_EXPERTS];
    unsigned char taken[MS_MAX_EXPERTS] = {0};
    for (int64_t i = 0; i < k; i++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) /* as mo_route's choice, over the logits */
            if (!taken[e] && (best < 0 || logits[e] > logits[best])) best = e;
        taken[best] = 1, chosen[i] = (int32_t)best, top[i] = logits[best];
    }
    softmax(top, k, simd, weights); /* ggml_soft_max of the k chosen logits */
}

void mo_group(const int32_t *chosen, int64_t n, int64_t E, int64_t *start, int32_t *list, int32_t *inv) {
    for (int64_t e = 0; e <= E; e++) start[e] = 0;
    for (int64_t a = 0; a < n; a++) start[chosen[a] + 1]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    int64_t fill[MS_MAX_EXPERTS];
    for (int64_t e = 0; e < E; e++) fill[e] = start[e];
    for (int64_t a = 0; a < n; a++) {
        const int64_t j = fill[chosen[a]]++;
        list[j] = (int32_t)a, inv[a] = (int32_t)j;
    }
}

void mo_expert_rows(const ms_matrix *M, int64_t rows_e, int64_t e, const uint8_t *y, size_t y_row, int64_t j0,
                    int64_t n_j, int64_t r0, int64_t r1, float *out, int64_t stride) {
    const int type = M->type[0];
    const size_t row_bytes = (size_t)(M->cols / mq_block(type)) * (size_t)mq_type_size(type);
    const uint8_t *w = M->w[0] + (size_t)e * (size_t)rows_e * row_bytes;
    /* each activation row with the bits of its product alone, as llama.cpp's mul_mat_id multiplies an expert's rows
     * one at a time (the repacked types' gemv, the others' vec_dot; not the tiles of a dense product), but each
     * weight block unpacked once for several rows where a kernel keeps every row's float operations: a type's gemm
     * (MXFP4, Q4_K), or its rows kernel for up to MQ_NRC rows where that is the one-row kernel's arithmetic row by
     * row: the 32-value types (tile_scales: Q4_0..Q8_0, IQ4_NL: one kernel for rows and gemv), and Q5_K, Q6_K and
     * IQ4_XS, whose rows kernels below MQ_BATCH are ggml's vec_dot for each row (their rows_batch forms are not).
     * A single row (a decode step) takes the type's gemv or dot. */
    const mq_traits *T = mq_traits_of(type);
    if (T && T->experts && n_j > 1) {
        T->experts(w + (size_t)r0 * row_bytes, row_bytes, r1 - r0, y + (size_t)j0 * y_row, y_row, (int)M->cols,
                (int)n_j, out + r0, (size_t)stride);
        return;
    }
    const int vec_dot_rows = type == MQ_Q5_K || type == MQ_Q6_K || type == MQ_IQ4_XS;
    if (n_j > 1 && T && T->rows && ((T->tile_scales && T->gemv) || vec_dot_rows)) {
        for (int64_t r = r0; r < r1; r++)
            for (int64_t j = 0; j < n_j; j += MQ_NRC)
                T->rows(w + (size_t)r * row_bytes, y + (size_t)(j0 + j) * y_row, y_row, (int)M->cols,
                        (int)(n_j - j < MQ_NRC ? n_j - j : MQ_NRC), out + j * stride + r, (size_t)stride, NULL);
        return;
    }
    for (int64_t j = 0; j < n_j; j++)
        mq_dot_rows(type, w, M->cols, y + (size_t)(j0 + j) * y_row, 1, r0, r1, out + j * stride, stride);
}
