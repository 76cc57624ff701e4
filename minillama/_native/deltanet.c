/* deltanet.c: qwen35's gated DeltaNet ops as ggml's CPU backend computes them, for the Python blocks on the native
 * backend (minillama/model/deltanet.py under native_ops): the element-wise sigmoid and softplus of ggml's unary ops
 * (libm's expf and logf, one value at a time: numpy's float32 exp is a few ulps from them), and the recurrence of
 * ggml_compute_forward_gated_delta_net (ops.cpp), head by head, token after token, with ggml_vec_scale_f32,
 * ggml_vec_dot_f32 and ggml_vec_mad_f32 in the order of its AVX2 build (simd) or its generic one. */
#include <math.h>
#include <string.h>

#include "model.h"

void md_unary(int op, int64_t n, const float *x, float *y) {
    if (op == MD_SIGMOID)
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i]));
    else if (op == MD_SOFTPLUS)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] > 20.0f ? x[i] : logf(1.0f + expf(x[i]));
    else
        for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

/* ggml_vec_dot_f32 of this ggml: in its AVX2 build (simd) the n & ~31 first values in four accumulators of eight
 * (mo_dot_f32), the rest added to that float sum one product at a time; in its generic one a double sum. */
static float dot(const float *x, const float *y, int64_t n, int simd) {
    if (!simd) return mo_dot_f32(x, y, n, 0);
    const int64_t np = n & ~(int64_t)31;
    float sum = np ? mo_dot_f32(x, y, np, 1) : 0.0f;
    for (int64_t i = np; i < n; i++) sum += x[i] * y[i];
    return sum;
}

/* y += x v as ggml_vec_mad_f32: in its AVX2 build (simd) every value fused, the n & ~31 first eight lanes at a time
 * and the rest too (its compiler contracts the leftovers' y[i] += x[i]*v: llama.cpp's outputs show it); in its
 * generic one a product then a sum. */
static void mad(int64_t n, float *y, const float *x, float v, int simd) {
    if (simd)
        for (int64_t i = 0; i < n; i++) y[i] = fmaf(x[i], v, y[i]);
    else
        for (int64_t i = 0; i < n; i++) y[i] += x[i] * v;
}

void md_gated_delta_net(const float *q, const float *k, const float *v, const float *g, const float *beta,
                        float *state, int64_t n, int64_t hv, int64_t hk, int64_t S, int simd, float *out,
                        float *before) {
    const float scale = 1.0f / sqrtf((float)S);
    for (int64_t h = 0; h < hv; h++) {
        float *M = state + h * S * S; /* M[j S + i] = S[i][j] */
        const int64_t kh = h % hk;
        for (int64_t t = 0; t < n; t++) {
            if (before && t == n - 1) memcpy(before + h * S * S, M, (size_t)(S * S) * sizeof(float));
            const float *qt = q + (t * hk + kh) * S, *kt = k + (t * hk + kh) * S, *vt = v + (t * hv + h) * S;
            const float b = beta[t * hv + h], decay = expf(g[t * hv + h]);
            for (int64_t i = 0; i < S * S; i++) M[i] *= decay;
            for (int64_t j = 0; j < S; j++) {
                float *row = M + j * S;
                const float delta = (vt[j] - dot(row, kt, S, simd)) * b;
                mad(S, row, kt, delta, simd);
            }
            float *o = out + (t * hv + h) * S;
            for (int64_t j = 0; j < S; j++) o[j] = dot(M + j * S, qt, S, simd) * scale;
        }
    }
}
