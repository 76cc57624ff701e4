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
#include "model.h"

/* exp(x - max) of every logit, summed in double in order, each times 1/sum rounded to float: ggml's soft_max. */
static void softmax(const float *x, int64_t n, float *p) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(p[i] = expf(x[i] - max));
    const float s = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) p[i] *= s;
}

void mo_route(const float *logits, int64_t E, int64_t k, int32_t *chosen, float *weights) {
    float p[MS_MAX_EXPERTS];
    unsigned char taken[MS_MAX_EXPERTS] = {0};
    softmax(logits, E, p);
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
    mq_dot_rows(type, w, M->cols, y + (size_t)j0 * y_row, n_j, r0, r1, out, stride);
}
