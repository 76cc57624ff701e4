/* Attention of one query row over its key/value cache, computed as ggml's CPU flash attention computes it
 * (ggml_compute_forward_flash_attn_ext_f16_one_chunk, the kernel llama.cpp runs for every generated token and
 * for every batch of fewer than 64 rows; larger batches take the tiled path below): the query rounded to float16; each score a float16 dot product
 * summed as ggml_vec_dot_f16 sums it (four accumulators of eight lanes, fused multiply-adds, then its fixed
 * reduction); an online softmax, one key at a time, whose running weighted sum of values is kept in float16
 * (rounded after every scale and every fused multiply-add, as ggml_vec_scale_f16 and ggml_vec_mad_f16 store
 * it); at the end that sum times 1 / (the sum of weights).
 *
 * Matching those roundings bit for bit is what makes minillama's log-probs track llama.cpp's (a float32
 * softmax is closer to the exact value but about 1e-3 away from llama.cpp's in every attention output, which
 * the 8-bit activation quantization of the next product then amplifies). A scalar kernel (the reference and
 * the fallback) and an AVX2/F16C one compute the same bits; the AVX2 one runs where the quantized products run
 * theirs (cpu.c's one choice: the CPU's features and MINILLAMA_KERNELS). The float16 table the scalar one reads
 * is filled by mq_init, which model.c calls before any attention.
 *
 * Keys and values come as float16 (the cache's type, as llama.cpp's): half the bytes a step reads. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "model.h"

/* x . y over n values in ggml_vec_dot_f16's order: lanes l of four accumulators take x[32 i + 8 j + l] y[..]
 * by fused multiply-adds; then acc0 += acc2, acc1 += acc3, acc0 += acc1; the eight lanes summed as
 * (l + l+4) pairs, then pairs of those; the tail (n % 32 values) added in double. */
static float dot_f16_scalar(const uint16_t *x, const float *y, int64_t n) {
    float acc[4][8] = {{0}};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 8; l++) acc[j][l] = fmaf(mq_half_float(x[i + 8 * j + l]), y[i + 8 * j + l], acc[j][l]);
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    const float h0 = t[0] + t[4], h1 = t[1] + t[5], h2 = t[2] + t[6], h3 = t[3] + t[7];
    double sum = (double)((h0 + h1) + (h2 + h3));
    for (int64_t i = np; i < n; i++) sum += (double)(mq_half_float(x[i]) * y[i]);
    return (float)sum;
}

/* The one_chunk kernel over positions s0..s1: out = the weighted sum of values times 1 / S, or with partial given
 * (the split-KV path) the sum itself and partial[0..1] = M, S. */
/* A row's end: the sink (when given: one more logit of the softmax, with no value) as one_chunk applies it to the
 * float32 copy of its sum, a new maximum scaling the sum and S; then out = acc / S (0 where no key was seen), or
 * with partial the unscaled acc and partial = {M, S}. */
static void finish(float *acc, int64_t Dv, float M, float S, const float *sink, float *out, float *partial) {
    if (sink) {
        const float s = *sink;
        float ms = 1, vs = 1;
        if (s > M) {
            ms = expf(M - s);
            M = s;
            for (int64_t i = 0; i < Dv; i++) acc[i] *= ms;
        } else
            vs = expf(s - M);
        S = S * ms + vs;
    }
    if (partial) {
        partial[0] = M;
        partial[1] = S;
        memcpy(out, acc, (size_t)Dv * sizeof *out);
        return;
    }
    const float inv = S == 0 ? 0 : 1.0f / S;
    for (int64_t i = 0; i < Dv; i++) out[i] = acc[i] * inv;
}

static void row_scalar(const float *q, const uint16_t *k, int64_t ks, const uint16_t *v, int64_t vs, int64_t s0,
                       int64_t s1, int64_t D, int64_t Dv, float scale, const float *sink, float *out, float *work,
                       float *partial) {
    float *q16 = work, *acc = work + D;
    for (int64_t i = 0; i < D; i++) q16[i] = mq_round_f16(q[i]);
    for (int64_t i = 0; i < Dv; i++) acc[i] = 0;
    float M = -INFINITY, S = 0;
    for (int64_t s = s0; s <= s1; s++) {
        const float sc = dot_f16_scalar(k + s * ks, q16, D) * scale;
        float ms = 1, w = 1;
        if (sc > M) {
            const float old = M;
            M = sc;
            ms = expf(old - M);
            for (int64_t i = 0; i < Dv; i++) acc[i] = mq_round_f16(acc[i] * ms);
        } else
            w = expf(sc - M);
        const uint16_t *vr = v + s * vs;
        for (int64_t i = 0; i < Dv; i++) acc[i] = mq_round_f16(fmaf(mq_half_float(vr[i]), w, acc[i]));
        S = S * ms + w;
    }
    finish(acc, Dv, M, S, sink, out, partial);
}

typedef void (*row_fn)(const float *, const uint16_t *, int64_t, const uint16_t *, int64_t, int64_t, int64_t,
                       int64_t, int64_t, float, const float *, float *, float *, float *);

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

/* Rounds the eight floats to float16 (nearest even) and back. */
static inline __m256 round_f16x8(__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static float dot_f16_avx2(const uint16_t *x, const float *y, int64_t n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm256_fmadd_ps(load_f16x8(x + i + 8 * j), _mm256_loadu_ps(y + i + 8 * j), acc[j]);
    acc[0] = _mm256_add_ps(acc[0], acc[2]);
    acc[1] = _mm256_add_ps(acc[1], acc[3]);
    acc[0] = _mm256_add_ps(acc[0], acc[1]);
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    double sum = (double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    for (int64_t i = np; i < n; i++) sum += (double)(mq_half_float(x[i]) * y[i]);
    return (float)sum;
}

/* The scores of a run of keys are made before the softmax goes over them (they depend only on q and the keys),
 * so their dot products overlap rather than wait, each behind the previous key's exp and value update. */
#define SCORE_RUN 128

static void row_avx2(const float *q, const uint16_t *k, int64_t ks, const uint16_t *v, int64_t vs, int64_t s0,
                     int64_t s1, int64_t D, int64_t Dv, float scale, const float *sink, float *out, float *work,
                     float *partial) {
    float *q16 = work, *acc = work + D;
    const int64_t dv8 = Dv & ~(int64_t)7;
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) _mm256_storeu_ps(q16 + i, round_f16x8(_mm256_loadu_ps(q + i)));
    for (; i < D; i++) q16[i] = mq_round_f16(q[i]);
    for (i = 0; i < Dv; i++) acc[i] = 0;
    float M = -INFINITY, S = 0, sc_run[SCORE_RUN];
    for (int64_t c0 = s0; c0 <= s1; c0 += SCORE_RUN) {
        const int64_t n = s1 + 1 - c0 < SCORE_RUN ? s1 + 1 - c0 : SCORE_RUN;
        for (int64_t j = 0; j < n; j++) sc_run[j] = dot_f16_avx2(k + (c0 + j) * ks, q16, D) * scale;
        for (int64_t j = 0; j < n; j++) {
            const float sc = sc_run[j];
            float ms = 1, w = 1;
            if (sc > M) {
                const float old = M;
                M = sc;
                ms = expf(old - M);
                const __m256 m8 = _mm256_set1_ps(ms);
                for (i = 0; i < dv8; i += 8)
                    _mm256_storeu_ps(acc + i, round_f16x8(_mm256_mul_ps(_mm256_loadu_ps(acc + i), m8)));
                for (; i < Dv; i++) acc[i] = mq_round_f16(acc[i] * ms);
            } else
                w = expf(sc - M);
            const uint16_t *vr = v + (c0 + j) * vs;
            const __m256 w8 = _mm256_set1_ps(w);
            for (i = 0; i < dv8; i += 8)
                _mm256_storeu_ps(acc + i,
                                 round_f16x8(_mm256_fmadd_ps(load_f16x8(vr + i), w8, _mm256_loadu_ps(acc + i))));
            for (; i < Dv; i++) acc[i] = mq_round_f16(fmaf(mq_half_float(vr[i]), w, acc[i]));
            S = S * ms + w;
        }
    }
    finish(acc, Dv, M, S, sink, out, partial);
}
#pragma GCC pop_options
#define HAVE_AVX2_ROW 1
#endif

static row_fn row_kernel(void) {
#ifdef HAVE_AVX2_ROW
    return mq_cpu_isa() == MQ_ISA_AVX2 ? row_avx2 : row_scalar;
#else
    return row_scalar;
#endif
}

void ma_attend_row(const float *q, const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                   int64_t s0, int64_t s1, int64_t D, int64_t Dv, float scale, const float *sink, float *out,
                   float *work) {
    row_kernel()(q, k, k_stride, v, v_stride, s0, s1, D, Dv, scale, sink, out, work, NULL);
}

/* The split-KV path (ggml_compute_forward_flash_attn_ext_f16 with one query row and 512 cached cells or more):
 * the n_kv cells cut into `parts` chunks of ceil(n_kv / parts), one per llama.cpp thread; each chunk's one_chunk
 * partial (M, S, unscaled sum) from a fresh start, over the positions of s0..s1 inside it; then
 * ggml_flash_attn_ext_reduce_partials merges them in chunk order (chunks that saw nothing skipped): with M' the
 * larger maximum, sum = sum expf(M - M') + chunk's expf(Mc - M'), S likewise (its compiler fuses the first
 * product into the add), and at the end sum times 1 / S. work: D + 3 Dv floats. */
void ma_attend_row_split(const float *q, const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                         int64_t s0, int64_t s1, int64_t n_kv, int64_t parts, int64_t D, int64_t Dv, float scale,
                         const float *sink, float *out, float *work) {
    const row_fn row = row_kernel();
    float *chunk = work + D + Dv, *sum = chunk + Dv, partial[2];
    const int64_t size = (n_kv + parts - 1) / parts;
    float M = -INFINITY, S = 0;
    for (int64_t i = 0; i < Dv; i++) sum[i] = 0;
    for (int64_t c = 0; c < parts && c * size < n_kv; c++) {
        const int64_t lo = c * size > s0 ? c * size : s0, end = (c + 1) * size < n_kv ? (c + 1) * size : n_kv;
        const int64_t hi = end - 1 < s1 ? end - 1 : s1;
        /* every cell of the chunk masked: S = 0, skipped by the merge; but the first chunk takes the sink */
        if (lo > hi && !(c == 0 && sink)) continue;
        row(q, k, k_stride, v, v_stride, lo, hi, D, Dv, scale, c == 0 ? sink : NULL, chunk, work, partial);
        if (partial[1] == 0) continue;
        const float M_new = fmaxf(M, partial[0]), old = expf(M - M_new), new = expf(partial[0] - M_new);
        for (int64_t i = 0; i < Dv; i++) sum[i] = fmaf(sum[i], old, chunk[i] * new);
        S = fmaf(S, old, partial[1] * new);
        M = M_new;
    }
    const float inv = S != 0 ? 1.0f / S : 1.0f;
    for (int64_t i = 0; i < Dv; i++) out[i] = sum[i] * inv;
}

/* The tiled path (ggml_compute_forward_flash_attn_ext_tiled), which llama.cpp takes for a batch of 64 rows or
 * more: the keys in tiles of FA_TILE cache positions (tile boundaries at multiples of FA_TILE); each score a
 * float32 chain of fused multiply-adds over the query (not rounded to float16) and the key widened to float32, in
 * dimension order (simd_gemm), times scale; positions a row does not see are -inf. Per tile and row: the tile's
 * maximum M', and when it exceeds the running M the sum of values and S are scaled by expf(M - M'); then every
 * weight is ggml_v_expf(score - M') (ggml_vec_soft_max_f32), their sum taken eight at a time in its AVX2 order
 * and added in double to S; the values accumulate in float32, each weight times its value row fused into the sum
 * in position order (simd_gemm again). At the end the sum times 1 / S. A row's result depends only on its own
 * query and range, never on the rows tiled with it, so this computes row by row what ggml computes tile by tile,
 * sharing each key tile (transposed to float32) across the rows given together. */
#define FA_TILE 64

size_t ma_tiled_work(int64_t D, int64_t Dv) {
    return (size_t)(FA_TILE * D + FA_TILE + (int64_t)MA_TILED_ROWS * (Dv + 2));
}

typedef struct {
    /* sc[8 g0 .. 8 g1) = the dot products of q with the tile's keys (kt: [D][FA_TILE], transposed) */
    void (*scores)(const float *kt, const float *q, int64_t D, int64_t g0, int64_t g1, float *sc);
    /* acc [Dv] *= s */
    void (*scale)(float *acc, int64_t Dv, float s);
    /* acc [Dv] += v * w, fused, v float16 */
    void (*mad)(float *acc, const uint16_t *v, int64_t Dv, float w);
} tiled_ops;

static void scores_scalar(const float *kt, const float *q, int64_t D, int64_t g0, int64_t g1, float *sc) {
    for (int64_t j = 8 * g0; j < 8 * g1; j++) {
        float acc = 0;
        for (int64_t d = 0; d < D; d++) acc = fmaf(kt[d * FA_TILE + j], q[d], acc);
        sc[j] = acc;
    }
}

static void scale_scalar(float *acc, int64_t Dv, float s) {
    for (int64_t i = 0; i < Dv; i++) acc[i] *= s;
}

static void mad_scalar(float *acc, const uint16_t *v, int64_t Dv, float w) {
    for (int64_t i = 0; i < Dv; i++) acc[i] = fmaf(mq_half_float(v[i]), w, acc[i]);
}

static const tiled_ops ops_scalar = {scores_scalar, scale_scalar, mad_scalar};

/* The sum of eight weights as ggml_vec_soft_max_f32's AVX2 loop adds them: upper half onto lower, then pairs. */
static inline float sum8(const float *p) {
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

static void attend_tiled(const tiled_ops *ops, const float *q, int64_t q_stride, int64_t n, const int64_t *pos,
                         int64_t window, const uint16_t *k, int64_t ks, const uint16_t *v, int64_t vs, int64_t D,
                         int64_t Dv, float scale, const float *sink, float *out, int64_t out_stride, float *work) {
    float *kt = work, *sc = kt + FA_TILE * D, *acc = sc + FA_TILE, *M = acc + MA_TILED_ROWS * Dv,
          *S = M + MA_TILED_ROWS;
    int64_t lo = INT64_MAX, hi = -1;
    for (int64_t i = 0; i < n; i++) {
        const int64_t s0 = window > 0 && pos[i] - window + 1 > 0 ? pos[i] - window + 1 : 0;
        lo = s0 < lo ? s0 : lo, hi = pos[i] > hi ? pos[i] : hi;
        M[i] = -INFINITY, S[i] = 0;
        for (int64_t j = 0; j < Dv; j++) acc[i * Dv + j] = 0;
    }
    for (int64_t c0 = lo / FA_TILE * FA_TILE; c0 <= hi; c0 += FA_TILE) {
        const int64_t c1 = c0 + FA_TILE - 1 < hi ? c0 + FA_TILE - 1 : hi; /* the last key any row sees */
        for (int64_t j = 0; j <= c1 - c0; j++) {
            const uint16_t *kr = k + (c0 + j) * ks;
            for (int64_t d = 0; d < D; d++) kt[d * FA_TILE + j] = mq_half_float(kr[d]);
        }
        for (int64_t j = c1 - c0 + 1; j < FA_TILE && j % 8; j++) /* past the last key: masked, but defined */
            for (int64_t d = 0; d < D; d++) kt[d * FA_TILE + j] = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t s0 = window > 0 && pos[i] - window + 1 > 0 ? pos[i] - window + 1 : 0;
            const int64_t a = s0 > c0 ? s0 - c0 : 0, b = pos[i] < c1 ? pos[i] - c0 : c1 - c0; /* seen: a..b */
            if (a > b) continue;
            const int64_t g0 = a / 8, g1 = b / 8 + 1;
            ops->scores(kt, q + i * q_stride, D, g0, g1, sc);
            float mx = -INFINITY;
            for (int64_t j = 8 * g0; j < 8 * g1; j++) {
                sc[j] = j < a || j > b ? -INFINITY : sc[j] * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            float *ai = acc + i * Dv;
            if (mx > M[i]) {
                const float ms = expf(M[i] - mx);
                ops->scale(ai, Dv, ms);
                S[i] *= ms;
                M[i] = mx;
            }
            for (int64_t j = 8 * g0; j < 8 * g1; j++) sc[j] -= M[i]; /* the running maximum, not the tile's */
            ma_v_expf_n(8 * (g1 - g0), sc + 8 * g0, sc + 8 * g0);
            double sum = 0;
            for (int64_t g = g0; g < g1; g++) sum += (double)sum8(sc + 8 * g);
            S[i] = (float)((double)S[i] + sum);
            for (int64_t j = a; j <= b; j++) ops->mad(ai, v + (c0 + j) * vs, Dv, sc[j]);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        if (sink) { /* after the last tile, as the tiled path applies it (its running maximum left as it is) */
            float ms = 1, vs = 1;
            if (*sink > M[i]) {
                ms = expf(M[i] - *sink);
                ops->scale(acc + i * Dv, Dv, ms);
            } else
                vs = expf(*sink - M[i]);
            S[i] = S[i] * ms + vs;
        }
        const float inv = S[i] == 0 ? 0 : 1.0f / S[i];
        for (int64_t j = 0; j < Dv; j++) out[i * out_stride + j] = acc[i * Dv + j] * inv;
    }
}

#ifdef HAVE_AVX2_ROW
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
static void scores_avx2(const float *kt, const float *q, int64_t D, int64_t g0, int64_t g1, float *sc) {
    __m256 acc[FA_TILE / 8];
    for (int64_t g = g0; g < g1; g++) acc[g] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        const __m256 qd = _mm256_set1_ps(q[d]);
        for (int64_t g = g0; g < g1; g++) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(kt + d * FA_TILE + 8 * g), qd, acc[g]);
    }
    for (int64_t g = g0; g < g1; g++) _mm256_storeu_ps(sc + 8 * g, acc[g]);
}

static void scale_avx2(float *acc, int64_t Dv, float s) {
    const __m256 s8 = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= Dv; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), s8));
    for (; i < Dv; i++) acc[i] *= s;
}

static void mad_avx2(float *acc, const uint16_t *v, int64_t Dv, float w) {
    const __m256 w8 = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= Dv; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(load_f16x8(v + i), w8, _mm256_loadu_ps(acc + i)));
    for (; i < Dv; i++) acc[i] = fmaf(mq_half_float(v[i]), w, acc[i]);
}
#pragma GCC pop_options

static const tiled_ops ops_avx2 = {scores_avx2, scale_avx2, mad_avx2};
#endif

void ma_attend_tiled(const float *q, int64_t q_stride, int64_t n, const int64_t *pos, int64_t window,
                     const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride, int64_t D, int64_t Dv,
                     float scale, const float *sink, float *out, int64_t out_stride, float *work) {
#ifdef HAVE_AVX2_ROW
    const tiled_ops *ops = mq_cpu_isa() == MQ_ISA_AVX2 ? &ops_avx2 : &ops_scalar;
#else
    const tiled_ops *ops = &ops_scalar;
#endif
    attend_tiled(ops, q, q_stride, n, pos, window, k, k_stride, v, v_stride, D, Dv, scale, sink, out, out_stride, work);
}

int ma_attend_seq(const float *q, int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t Dv, int64_t start,
                  const uint16_t *k, const uint16_t *v, int64_t window, float scale, const float *sinks,
                  int64_t pass_rows, int64_t kv_split, float *out) {
    const int64_t kd = Hkv * D, vd = Hkv * Dv, group = H / Hkv;
    const int tiled = pass_rows >= MA_TILED_ROWS;
    mq_init(); /* mq_half_float's table: a caller may come before any model ran (it read zeros) */
    float *work = malloc(sizeof(float) * (tiled ? ma_tiled_work(D, Dv) : (size_t)(D + 3 * Dv)));
    int64_t *pos = tiled ? malloc(sizeof(int64_t) * (size_t)n) : NULL;
    if (!work || (tiled && !pos)) {
        free(work);
        free(pos);
        return 0;
    }
    for (int64_t t = 0; tiled && t < n; t++) pos[t] = start + t;
    for (int64_t h = 0; h < H; h++) {
        const uint16_t *kh = k + (h / group) * D, *vh = v + (h / group) * Dv;
        const float *sink = sinks ? sinks + h : NULL;
        if (tiled) {
            for (int64_t t = 0; t < n; t += MA_TILED_ROWS)
                ma_attend_tiled(q + t * H * D + h * D, H * D, n - t < MA_TILED_ROWS ? n - t : MA_TILED_ROWS, pos + t,
                                window, kh, kd, vh, vd, D, Dv, scale, sink, out + t * H * Dv + h * Dv, H * Dv, work);
            continue;
        }
        for (int64_t t = 0; t < n; t++) {
            const int64_t p = start + t, s0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            const int64_t n_kv = ma_split_cells(p, window, pass_rows, kv_split);
            float *o = out + t * H * Dv + h * Dv;
            if (n_kv)
                ma_attend_row_split(q + t * H * D + h * D, kh, kd, vh, vd, s0, p, n_kv, kv_split, D, Dv, scale, sink, o,
                                    work);
            else
                ma_attend_row(q + t * H * D + h * D, kh, kd, vh, vd, s0, p, D, Dv, scale, sink, o, work);
        }
    }
    free(work);
    free(pos);
    return 1;
}
