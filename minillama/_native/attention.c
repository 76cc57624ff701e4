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
 * Keys and values come as float16 (the cache's type, as llama.cpp's): half the bytes a step reads. They are stored
 * by position; every path visits the cache's cells in llama.cpp's cell order (ma_attend_cells' cells: which
 * position each cell holds once a sliding-window cache has wrapped or a context shift has moved positions), each
 * row skipping the cells it does not see, as ggml skips a masked cell. */
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

/* A row's end: the sink (when given: one more logit of the softmax, with no value) as one_chunk applies it to the
 * float32 copy of its sum, a new maximum scaling the sum and S; then out = acc / S (0 where no key was seen), or
 * with partial (the split-KV path) the unscaled acc and partial = {M, S}. */
void ma_row_finish(float *acc, int64_t Dv, float M, float S, const float *sink, float *out, float *partial) {
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

/* The online softmax of nq query heads (at most MA_ROW_HEADS) sharing keys and values: their queries rounded to
 * float16 (q16 [nq][D]), running sums of values (acc [nq][Dv]), maxima and sums of weights. A run of keys (run_fn)
 * carries it on, so the keys one chunk sees may come in several runs (cells of a cache in llama.cpp's order whose
 * positions are not consecutive) and get the bits of one pass over them in that order. */
typedef struct {
    float *q16, *acc, M[MA_ROW_HEADS], S[MA_ROW_HEADS];
    int64_t nq, D, Dv;
    float scale;
} row_state;

/* work: nq (D + Dv) floats. */
static void row_begin(row_state *st, const float *q, int64_t nq, int64_t D, int64_t Dv, float scale, float *work) {
    st->q16 = work, st->acc = work + nq * D, st->nq = nq, st->D = D, st->Dv = Dv, st->scale = scale;
    for (int64_t i = 0; i < nq * D; i++) st->q16[i] = mq_round_f16(q[i]);
}

static void row_reset(row_state *st) {
    for (int64_t i = 0; i < st->nq * st->Dv; i++) st->acc[i] = 0;
    for (int64_t g = 0; g < st->nq; g++) st->M[g] = -INFINITY, st->S[g] = 0;
}

/* Each head's end (finish) into out + g Dv (partial + 2 g). */
static void row_end(row_state *st, const float *sink, float *out, float *partial) {
    for (int64_t g = 0; g < st->nq; g++)
        ma_row_finish(st->acc + g * st->Dv, st->Dv, st->M[g], st->S[g], sink ? sink + g : NULL, out + g * st->Dv,
               partial ? partial + 2 * g : NULL);
}

/* The keys and values of positions s0..s1 (rows ks / vs values apart) into the state, one key at a time. */
typedef void (*run_fn)(row_state *st, const uint16_t *k, int64_t ks, const uint16_t *v, int64_t vs, int64_t s0,
                       int64_t s1);

/* one_chunk's loop for each head: each score a float16 dot product, a new maximum scaling the float16 sum. */
static void run_scalar(row_state *st, const uint16_t *k, int64_t ks, const uint16_t *v, int64_t vs, int64_t s0,
                       int64_t s1) {
    const int64_t D = st->D, Dv = st->Dv;
    for (int64_t g = 0; g < st->nq; g++) {
        float *acc = st->acc + g * Dv, M = st->M[g], S = st->S[g];
        for (int64_t s = s0; s <= s1; s++) {
            const float sc = dot_f16_scalar(k + s * ks, st->q16 + g * D, D) * st->scale;
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
        st->M[g] = M, st->S[g] = S;
    }
}

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "attention_avx2.h"

static float dot_f16_avx2(const uint16_t *x, const float *y, int64_t n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
#pragma GCC unroll 4
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
 * so their dot products overlap rather than wait, each behind the previous key's exp and value update; then the
 * run's weights (the running maximum and S go key by key as before: a scale factor where a key raised the maximum,
 * else 1, and each key's weight; ma_online_weights, its exponents four at a time); then the weighted values (value_sum, attention_avx2.h), 64 lanes of the sum at a time held in registers over
 * the whole run, each lane taking the same roundings in the same order as one key at a time would. */
#define SCORE_RUN 128

/* run_scalar's heads together: each run of keys scored for every head while the key row is in the cache, and its
 * values read once from memory for all of them. */
static void run_avx2(row_state *st, const uint16_t *k, int64_t ks, const uint16_t *v, int64_t vs, int64_t s0,
                     int64_t s1) {
    const int64_t nq = st->nq, D = st->D, Dv = st->Dv;
    float w[MA_ROW_HEADS][SCORE_RUN], ms[MA_ROW_HEADS][SCORE_RUN];
    uint8_t up[MA_ROW_HEADS][SCORE_RUN];
    for (int64_t c0 = s0; c0 <= s1; c0 += SCORE_RUN) {
        const int64_t n = s1 + 1 - c0 < SCORE_RUN ? s1 + 1 - c0 : SCORE_RUN;
        for (int64_t j = 0; j < n; j++)
            for (int64_t g = 0; g < nq; g++)
                w[g][j] = dot_f16_avx2(k + (c0 + j) * ks, st->q16 + g * D, D) * st->scale;
        for (int64_t g = 0; g < nq; g++) {
            ma_online_weights(w[g], ms[g], up[g], n, st->M + g, st->S + g);
            value_sum(st->acc + g * Dv, 1, v + c0 * vs, vs, NULL, n, Dv, w[g], ms[g], up[g]);
        }
    }
}
#pragma GCC pop_options
#define HAVE_AVX2_ROW 1
#endif

static run_fn run_kernel(void) {
#ifdef HAVE_AVX2_ROW
    return mq_cpu_isa() == MQ_ISA_AVX2 ? run_avx2 : run_scalar;
#else
    return run_scalar;
#endif
}

/* The cells c0..c1-1 of a cache whose positions lie in s0..s1 into the state, in cell order (pos: each cell's
 * position, -1 empty; NULL: cell c holds position c), each run of cells holding consecutive positions in one go;
 * the number of cells taken. */
static int64_t run_cells(run_fn run, row_state *st, const uint16_t *k, int64_t ks, const uint16_t *v, int64_t vs,
                         const int64_t *pos, int64_t c0, int64_t c1, int64_t s0, int64_t s1) {
    if (!pos) {
        const int64_t lo = c0 > s0 ? c0 : s0, hi = c1 - 1 < s1 ? c1 - 1 : s1;
        if (lo <= hi) run(st, k, ks, v, vs, lo, hi);
        return lo <= hi ? hi - lo + 1 : 0;
    }
    int64_t seen = 0;
    for (int64_t c = c0; c < c1;) {
        const int64_t p = pos[c];
        if (p < s0 || p > s1) {
            c++;
            continue;
        }
        int64_t e = c + 1;
        while (e < c1 && pos[e] == p + (e - c) && pos[e] <= s1) e++;
        run(st, k, ks, v, vs, p, p + (e - c) - 1);
        seen += e - c;
        c = e;
    }
    return seen;
}

/* parts <= 1: one_chunk over the n_kv cells. Else the split-KV path (ggml_compute_forward_flash_attn_ext_f16 with
 * one query row and 512 cached cells or more): the n_kv cells cut into `parts` chunks of ceil(n_kv / parts), one
 * per llama.cpp thread; each chunk's one_chunk partial (M, S, unscaled sum) from a fresh start, over its cells
 * whose positions lie in s0..s1; then ggml_flash_attn_ext_reduce_partials merges them in chunk order (chunks that
 * saw nothing skipped): with M' the larger maximum, sum = sum expf(M - M') + chunk's expf(Mc - M'), S likewise (its
 * compiler fuses the first product into the add), and at the end sum times 1 / S. */
void ma_attend_cells(const float *q, int64_t nq, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                     int64_t v_stride, const int64_t *cells, int64_t n_kv, int64_t s0, int64_t s1, int64_t parts,
                     int64_t D, int64_t Dv, float scale, const float *sink, float *out, float *work) {
    const run_fn run = run_kernel();
    row_state st;
    row_begin(&st, q, nq, D, Dv, scale, work);
    if (parts <= 1) {
        row_reset(&st);
        run_cells(run, &st, k, k_stride, v, v_stride, cells, 0, n_kv, s0, s1);
        row_end(&st, sink, out, NULL);
        return;
    }
    float *chunk = work + nq * (D + Dv), *sum = chunk + nq * Dv, partial[2 * MA_ROW_HEADS];
    float M[MA_ROW_HEADS], S[MA_ROW_HEADS];
    const int64_t size = (n_kv + parts - 1) / parts;
    for (int64_t g = 0; g < nq; g++) M[g] = -INFINITY, S[g] = 0;
    for (int64_t i = 0; i < nq * Dv; i++) sum[i] = 0;
    for (int64_t c = 0; c < parts && c * size < n_kv; c++) {
        const int64_t end = (c + 1) * size < n_kv ? (c + 1) * size : n_kv;
        row_reset(&st);
        /* every cell of the chunk masked: S = 0, skipped by the merge; but the first chunk takes the sink */
        if (!run_cells(run, &st, k, k_stride, v, v_stride, cells, c * size, end, s0, s1) && !(c == 0 && sink))
            continue;
        row_end(&st, c == 0 ? sink : NULL, chunk, partial);
        for (int64_t g = 0; g < nq; g++) {
            const float Mc = partial[2 * g], Sc = partial[2 * g + 1], *cg = chunk + g * Dv;
            float *sg = sum + g * Dv;
            if (Sc == 0) continue;
            const float M_new = fmaxf(M[g], Mc), old = expf(M[g] - M_new), new = expf(Mc - M_new);
            for (int64_t i = 0; i < Dv; i++) sg[i] = fmaf(sg[i], old, cg[i] * new);
            S[g] = fmaf(S[g], old, Sc * new);
            M[g] = M_new;
        }
    }
    for (int64_t g = 0; g < nq; g++) {
        const float inv = S[g] != 0 ? 1.0f / S[g] : 1.0f;
        for (int64_t i = 0; i < Dv; i++) out[g * Dv + i] = sum[g * Dv + i] * inv;
    }
}

/* The tiled path (ggml_compute_forward_flash_attn_ext_tiled), which llama.cpp takes for a batch of 64 rows or
 * more: the keys in tiles of FA_TILE cache cells, in cell order (tile boundaries at multiples of FA_TILE); each
 * score a float32 chain of fused multiply-adds over the query (not rounded to float16) and the key widened to
 * float32, in dimension order (simd_gemm), times scale; cells a row does not see (empty, or a position out of its
 * window or after it) are -inf, whose weight is 0 and leaves the sums as they are. Per tile and row: the tile's
 * maximum M', and when it exceeds the running M the sum of values and S are scaled by expf(M - M'); then every
 * weight is ggml_v_expf(score - M') (ggml_vec_soft_max_f32), their sum taken eight at a time in its AVX2 order
 * and added in double to S; the values accumulate in float32, each weight times its value row fused into the sum
 * in cell order (simd_gemm again). At the end the sum times 1 / S. A row's result depends only on its own
 * query and range, never on the rows tiled with it, so this computes row by row what ggml computes tile by tile,
 * sharing each key tile (transposed to float32) across the rows given together. */
#define FA_TILE 64

/* work, for R = MA_TILED_ROWS x MA_TILED_HEADS rows (a row: one query head of one position): kt [D][FA_TILE] | sc
 * [FA_TILE] | acc [R][Dv] | M, S [R] | then for the blocked rows: vt [FA_TILE][Dv] (the tile's values widened once)
 * | their scores [R + BLOCK][FA_TILE] | a spare sum [Dv] (the lanes of a block past its last row). */
#define BLOCK 4
#define TILED_R (MA_TILED_ROWS * MA_TILED_HEADS)
size_t ma_tiled_work(int64_t D, int64_t Dv) {
    return (size_t)(FA_TILE * D + FA_TILE + (int64_t)TILED_R * (Dv + 2) + FA_TILE * Dv + (TILED_R + BLOCK) * FA_TILE +
                    Dv);
}

struct tiled_ctx;

typedef struct {
    /* sc[8 g0 .. 8 g1) = the dot products of q with the tile's keys (kt: [D][FA_TILE], transposed) */
    void (*scores)(const float *kt, const float *q, int64_t D, int64_t g0, int64_t g1, float *sc);
    /* acc [Dv] *= s */
    void (*scale)(float *acc, int64_t Dv, float s);
    /* acc [Dv] += v * w, fused, v float16 */
    void (*mad)(float *acc, const uint16_t *v, int64_t Dv, float w);
    /* kt [D][FA_TILE] columns 0..n-1 = the n keys k (rows ks apart) widened to float32 */
    void (*keys)(float *kt, const uint16_t *k, int64_t ks, int64_t n, int64_t D);
    /* NULL, or the rows rows[0..n) that see the whole tile (every key of FA_TILE) in blocks of BLOCK rows: each key
     * row widened once for the block, each output lane's sums kept in registers across the tile, the same fused
     * operations in the same order per output as the row-by-row path (see full_rows_avx2) */
    void (*full_rows)(const struct tiled_ctx *c, const int64_t *rows, int64_t n);
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

static void keys_scalar(float *kt, const uint16_t *k, int64_t ks, int64_t n, int64_t D) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < D; d++) kt[d * FA_TILE + j] = mq_half_float(k[j * ks + d]);
}

static const tiled_ops ops_scalar = {scores_scalar, scale_scalar, mad_scalar, keys_scalar, NULL};

/* One tile of one sequence's rows: what the blocked kernels need beside the rows. */
struct tiled_ctx {
    const tiled_ops *ops;
    const float *q, *kt; /* the queries (row r: position r % n, q_stride apart, head r / n), the tile's keys */
    const uint16_t *const *v; /* [FA_TILE]: the tile's value rows */
    int64_t n, q_stride, D, Dv;
    float scale, *acc, *M, *S, *vt, *scb, *spare;
};

/* Row r's query: head r / n of position r % n. */
static inline const float *q_row(const float *q, int64_t r, int64_t n, int64_t q_stride, int64_t D) {
    return q + r % n * q_stride + r / n * D;
}

/* The sum of eight weights as ggml_vec_soft_max_f32's AVX2 loop adds them: upper half onto lower, then pairs. */
static inline float sum8(const float *p) {
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

/* The lowest and highest key of a tile mask (bit j: key j of the tile seen), which is not 0. */
static inline int64_t mask_lo(uint64_t m) { return __builtin_ctzll(m); }
static inline int64_t mask_hi(uint64_t m) { return 63 - __builtin_clzll(m); }

/* Row i's weights over the keys of a tile its mask sees (a..b its lowest and highest), its scores sc[8 g0 .. 8 g1)
 * made (g0 = a / 8, g1 = b / 8 + 1): the others of those groups masked (-inf), the scores times scale, a new
 * maximum scaling the row's sum acc [Dv] and S, then sc = ggml_v_expf(score - M) and S += their sum (eight at a
 * time, in double; a masked key's weight is 0). */
static void tile_weights(const tiled_ops *ops, float *sc, uint64_t mask, float scale, float *M, float *S,
                         float *acc, int64_t Dv) {
    const int64_t g0 = mask_lo(mask) / 8, g1 = mask_hi(mask) / 8 + 1;
    float mx = -INFINITY;
    for (int64_t j = 8 * g0; j < 8 * g1; j++) {
        sc[j] = mask >> j & 1 ? sc[j] * scale : -INFINITY;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    if (mx > *M) {
        const float ms = expf(*M - mx);
        ops->scale(acc, Dv, ms);
        *S *= ms;
        *M = mx;
    }
    for (int64_t j = 8 * g0; j < 8 * g1; j++) sc[j] -= *M; /* the running maximum, not the tile's */
    ma_v_expf_n(8 * (g1 - g0), sc + 8 * g0, sc + 8 * g0);
    double sum = 0;
    for (int64_t g = g0; g < g1; g++) sum += (double)sum8(sc + 8 * g);
    *S = (float)((double)*S + sum);
}

/* Whether a row at position p sees a key at position kp (-1: an empty cell). */
static inline int sees(int64_t p, int64_t kp, int64_t window) {
    return kp >= 0 && kp <= p && (window == 0 || p - kp < window);
}

static void attend_tiled(const tiled_ops *ops, const float *q, int64_t q_stride, int64_t n, int64_t nh,
                         const int64_t *pos, int64_t window, const int64_t *cells, int64_t n_kv, const uint16_t *k,
                         int64_t ks, const uint16_t *v, int64_t vs, int64_t D, int64_t Dv, float scale,
                         const float *sink, float *out, int64_t out_stride, float *work) {
    float *kt = work, *sc = kt + FA_TILE * D, *acc = sc + FA_TILE, *M = acc + TILED_R * Dv, *S = M + TILED_R,
          *vt = S + TILED_R, *scb = vt + FA_TILE * Dv, *spare = scb + (TILED_R + BLOCK) * FA_TILE;
    const uint16_t *vrow[FA_TILE];
    struct tiled_ctx cx = {ops, q, kt, vrow, n, q_stride, D, Dv, scale, acc, M, S, vt, scb, spare};
    const int64_t R = n * nh;
    int64_t lo = 0, hi = n_kv - 1, full[TILED_R];
    uint64_t mask[MA_TILED_ROWS];
    if (!cells) { /* cell c holds position c: the tiles from the first any row sees to the last */
        lo = INT64_MAX, hi = -1;
        for (int64_t i = 0; i < n; i++) {
            const int64_t s0 = window > 0 && pos[i] - window + 1 > 0 ? pos[i] - window + 1 : 0;
            lo = s0 < lo ? s0 : lo, hi = pos[i] > hi ? pos[i] : hi;
        }
    }
    for (int64_t r = 0; r < R; r++) {
        M[r] = -INFINITY, S[r] = 0;
        for (int64_t j = 0; j < Dv; j++) acc[r * Dv + j] = 0;
    }
    for (int64_t j = 0; j < Dv; j++) spare[j] = 0;
    for (int64_t c0 = lo / FA_TILE * FA_TILE; c0 <= hi; c0 += FA_TILE) {
        const int64_t c1 = c0 + FA_TILE - 1 < hi ? c0 + FA_TILE - 1 : hi; /* the tile's last cell */
        uint64_t any = 0;
        for (int64_t i = 0; i < n; i++) { /* the keys row i sees in this tile */
            uint64_t m = 0;
            if (!cells) {
                const int64_t s0 = window > 0 && pos[i] - window + 1 > 0 ? pos[i] - window + 1 : 0;
                const int64_t a = s0 > c0 ? s0 - c0 : 0, b = pos[i] < c1 ? pos[i] - c0 : c1 - c0;
                if (a <= b) m = (b - a == 63 ? ~(uint64_t)0 : (((uint64_t)1 << (b - a + 1)) - 1)) << a;
            } else
                for (int64_t j = 0; j <= c1 - c0; j++) m |= (uint64_t)sees(pos[i], cells[c0 + j], window) << j;
            mask[i] = m, any |= m;
        }
        if (!any) continue;
        /* the tile's keys, each run of cells holding consecutive positions widened in one go; empty cells and
         * those past the last (to the end of their group of eight): masked, but defined */
        for (int64_t j = 0; j <= c1 - c0;) {
            const int64_t p = cells ? cells[c0 + j] : c0 + j;
            int64_t e = j + 1;
            if (p < 0) {
                for (int64_t d = 0; d < D; d++) kt[d * FA_TILE + j] = 0;
                vrow[j] = NULL;
                j = e;
                continue;
            }
            while (e <= c1 - c0 && (cells ? cells[c0 + e] : c0 + e) == p + (e - j)) e++;
            ops->keys(kt + j, k + p * ks, ks, e - j, D);
            for (int64_t x = j; x < e; x++) vrow[x] = v + (p + x - j) * vs;
            j = e;
        }
        for (int64_t j = c1 - c0 + 1; j < FA_TILE && j % 8; j++)
            for (int64_t d = 0; d < D; d++) kt[d * FA_TILE + j] = 0;
        int64_t n_full = 0;
        for (int64_t r = 0; r < R; r++) {
            const uint64_t m = mask[r % n];
            if (!m) continue;
            if (ops->full_rows && m == ~(uint64_t)0) {
                full[n_full++] = r;
                continue;
            }
            const int64_t a = mask_lo(m), b = mask_hi(m);
            ops->scores(kt, q_row(q, r, n, q_stride, D), D, a / 8, b / 8 + 1, sc);
            float *ar = acc + r * Dv;
            tile_weights(ops, sc, m, scale, M + r, S + r, ar, Dv);
            for (int64_t j = a; j <= b; j++)
                if (m >> j & 1) ops->mad(ar, vrow[j], Dv, sc[j]);
        }
        if (n_full) ops->full_rows(&cx, full, n_full);
    }
    for (int64_t r = 0; r < R; r++) {
        if (sink) { /* after the last tile, as the tiled path applies it (its running maximum left as it is) */
            const float sk = sink[r / n];
            float ms = 1, vs = 1;
            if (sk > M[r]) {
                ms = expf(M[r] - sk);
                ops->scale(acc + r * Dv, Dv, ms);
            } else
                vs = expf(sk - M[r]);
            S[r] = S[r] * ms + vs;
        }
        const float inv = S[r] == 0 ? 0 : 1.0f / S[r];
        float *o = out + r % n * out_stride + r / n * Dv;
        for (int64_t j = 0; j < Dv; j++) o[j] = acc[r * Dv + j] * inv;
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

/* sc[r][0 .. FA_TILE) = the scores of BLOCK queries q[r] with every key of the tile, sixteen keys of four rows in
 * eight registers at a time: per lane the same chain of fused multiply-adds in dimension order as scores_avx2. */
static void scores_block_avx2(const float *kt, const float *const *q, int64_t D, float *const *sc) {
    for (int64_t c = 0; c < FA_TILE; c += 16) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
        for (int64_t d = 0; d < D; d++) {
            const __m256 k0 = _mm256_loadu_ps(kt + d * FA_TILE + c), k1 = _mm256_loadu_ps(kt + d * FA_TILE + c + 8);
            __m256 x = _mm256_broadcast_ss(q[0] + d);
            a0 = _mm256_fmadd_ps(k0, x, a0), a1 = _mm256_fmadd_ps(k1, x, a1);
            x = _mm256_broadcast_ss(q[1] + d);
            b0 = _mm256_fmadd_ps(k0, x, b0), b1 = _mm256_fmadd_ps(k1, x, b1);
            x = _mm256_broadcast_ss(q[2] + d);
            c0 = _mm256_fmadd_ps(k0, x, c0), c1 = _mm256_fmadd_ps(k1, x, c1);
            x = _mm256_broadcast_ss(q[3] + d);
            d0 = _mm256_fmadd_ps(k0, x, d0), d1 = _mm256_fmadd_ps(k1, x, d1);
        }
        _mm256_storeu_ps(sc[0] + c, a0), _mm256_storeu_ps(sc[0] + c + 8, a1);
        _mm256_storeu_ps(sc[1] + c, b0), _mm256_storeu_ps(sc[1] + c + 8, b1);
        _mm256_storeu_ps(sc[2] + c, c0), _mm256_storeu_ps(sc[2] + c + 8, c1);
        _mm256_storeu_ps(sc[3] + c, d0), _mm256_storeu_ps(sc[3] + c + 8, d1);
    }
}

/* acc[r] [Dv] += the tile's value rows vt [FA_TILE][Dv] times the weights w[r], key by key in cell order, each
 * product fused into the sum (mad_avx2's operations per lane), sixteen lanes of four rows held in registers. */
static void mad_block_avx2(float *const *acc, const float *const *w, const float *vt, int64_t Dv) {
    int64_t c = 0;
    for (; c + 16 <= Dv; c += 16) {
        __m256 a0 = _mm256_loadu_ps(acc[0] + c), a1 = _mm256_loadu_ps(acc[0] + c + 8);
        __m256 b0 = _mm256_loadu_ps(acc[1] + c), b1 = _mm256_loadu_ps(acc[1] + c + 8);
        __m256 c0 = _mm256_loadu_ps(acc[2] + c), c1 = _mm256_loadu_ps(acc[2] + c + 8);
        __m256 d0 = _mm256_loadu_ps(acc[3] + c), d1 = _mm256_loadu_ps(acc[3] + c + 8);
        for (int64_t j = 0; j < FA_TILE; j++) {
            const __m256 v0 = _mm256_loadu_ps(vt + j * Dv + c), v1 = _mm256_loadu_ps(vt + j * Dv + c + 8);
            __m256 x = _mm256_broadcast_ss(w[0] + j);
            a0 = _mm256_fmadd_ps(v0, x, a0), a1 = _mm256_fmadd_ps(v1, x, a1);
            x = _mm256_broadcast_ss(w[1] + j);
            b0 = _mm256_fmadd_ps(v0, x, b0), b1 = _mm256_fmadd_ps(v1, x, b1);
            x = _mm256_broadcast_ss(w[2] + j);
            c0 = _mm256_fmadd_ps(v0, x, c0), c1 = _mm256_fmadd_ps(v1, x, c1);
            x = _mm256_broadcast_ss(w[3] + j);
            d0 = _mm256_fmadd_ps(v0, x, d0), d1 = _mm256_fmadd_ps(v1, x, d1);
        }
        _mm256_storeu_ps(acc[0] + c, a0), _mm256_storeu_ps(acc[0] + c + 8, a1);
        _mm256_storeu_ps(acc[1] + c, b0), _mm256_storeu_ps(acc[1] + c + 8, b1);
        _mm256_storeu_ps(acc[2] + c, c0), _mm256_storeu_ps(acc[2] + c + 8, c1);
        _mm256_storeu_ps(acc[3] + c, d0), _mm256_storeu_ps(acc[3] + c + 8, d1);
    }
    for (; c + 8 <= Dv; c += 8) {
        __m256 a[BLOCK];
#pragma GCC unroll 4
        for (int r = 0; r < BLOCK; r++) a[r] = _mm256_loadu_ps(acc[r] + c);
        for (int64_t j = 0; j < FA_TILE; j++) {
            const __m256 v0 = _mm256_loadu_ps(vt + j * Dv + c);
#pragma GCC unroll 4
            for (int r = 0; r < BLOCK; r++) a[r] = _mm256_fmadd_ps(v0, _mm256_broadcast_ss(w[r] + j), a[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < BLOCK; r++) _mm256_storeu_ps(acc[r] + c, a[r]);
    }
    for (; c < Dv; c++)
        for (int r = 0; r < BLOCK; r++)
            for (int64_t j = 0; j < FA_TILE; j++) acc[r][c] = fmaf(vt[j * Dv + c], w[r][j], acc[r][c]);
}

/* tile_weights for a row that sees every key of the tile, eight scores at a time: the maximum as the row-by-row
 * compare takes it (_mm256_max_ps keeps its second operand where the first is NaN or both are equal, as `sc > mx ?
 * sc : mx` does; the lanes' maxima hold no NaN, so their order does not matter). */
static void weights_full_avx2(float *sc, float scale, float *M, float *S, float *acc, int64_t Dv) {
    const __m256 s8 = _mm256_set1_ps(scale);
    __m256 mx8 = _mm256_set1_ps(-INFINITY);
    for (int g = 0; g < FA_TILE; g += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(sc + g), s8);
        _mm256_storeu_ps(sc + g, x);
        mx8 = _mm256_max_ps(x, mx8);
    }
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, mx8);
    for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
    if (mx > *M) {
        const float ms = expf(*M - mx);
        scale_avx2(acc, Dv, ms);
        *S *= ms;
        *M = mx;
    }
    const __m256 m8 = _mm256_set1_ps(*M);
    for (int g = 0; g < FA_TILE; g += 8) _mm256_storeu_ps(sc + g, _mm256_sub_ps(_mm256_loadu_ps(sc + g), m8));
    ma_v_expf_n(FA_TILE, sc, sc);
    double sum = 0;
    for (int g = 0; g < FA_TILE; g += 8) sum += (double)sum8(sc + g);
    *S = (float)((double)*S + sum);
}

/* The rows rows[0..n) that see every key of the tile: the tile's values widened to float32 once; the scores of
 * BLOCK rows at a time; each row's weights (tile_weights, as row by row); the weighted values of BLOCK rows at a
 * time. A block's lanes past its last row repeat its first row's query into spare rows, whose results are dropped. */
static void full_rows_avx2(const struct tiled_ctx *c, const int64_t *rows, int64_t n) {
    const int64_t Dv = c->Dv, dv8 = Dv & ~(int64_t)7;
    for (int64_t j = 0; j < FA_TILE; j++) {
        const uint16_t *vr = c->v[j];
        float *o = c->vt + j * Dv;
        int64_t i = 0;
        for (; i < dv8; i += 8) _mm256_storeu_ps(o + i, load_f16x8(vr + i));
        for (; i < Dv; i++) o[i] = mq_half_float(vr[i]);
    }
    float *spare_sc = c->scb + TILED_R * FA_TILE;
    for (int64_t b = 0; b < n; b += BLOCK) {
        const float *q[BLOCK];
        float *sc[BLOCK];
        for (int r = 0; r < BLOCK; r++) {
            const int real = b + r < n;
            q[r] = q_row(c->q, rows[real ? b + r : b], c->n, c->q_stride, c->D);
            sc[r] = real ? c->scb + rows[b + r] * FA_TILE : spare_sc + r * FA_TILE;
        }
        scores_block_avx2(c->kt, q, c->D, sc);
    }
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = rows[k];
        weights_full_avx2(c->scb + i * FA_TILE, c->scale, c->M + i, c->S + i, c->acc + i * Dv, Dv);
    }
    for (int64_t b = 0; b < n; b += BLOCK) {
        float *acc[BLOCK];
        const float *w[BLOCK];
        for (int r = 0; r < BLOCK; r++) {
            const int real = b + r < n;
            acc[r] = real ? c->acc + rows[b + r] * Dv : c->spare;
            w[r] = real ? c->scb + rows[b + r] * FA_TILE : spare_sc + r * FA_TILE;
        }
        mad_block_avx2(acc, w, c->vt, Dv);
    }
}

/* keys_scalar eight keys by eight dimensions at a time: widened, then transposed in registers. */
static void keys_avx2(float *kt, const uint16_t *k, int64_t ks, int64_t n, int64_t D) {
    const int64_t n8 = n & ~(int64_t)7, d8 = D & ~(int64_t)7;
    for (int64_t j = 0; j < n8; j += 8) {
        for (int64_t d = 0; d < d8; d += 8) {
            __m256 r[8], t[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) r[i] = load_f16x8(k + (j + i) * ks + d);
#pragma GCC unroll 4
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
#pragma GCC unroll 2
            for (int i = 0; i < 8; i += 4) {
                r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(kt + (d + i) * FA_TILE + j, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
                _mm256_storeu_ps(kt + (d + i + 4) * FA_TILE + j, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
            }
        }
        for (int64_t jj = j; jj < j + 8; jj++)
            for (int64_t d = d8; d < D; d++) kt[d * FA_TILE + jj] = mq_half_float(k[jj * ks + d]);
    }
    keys_scalar(kt + n8, k + n8 * ks, ks, n - n8, D);
}

#pragma GCC pop_options

static const tiled_ops ops_avx2 = {scores_avx2, scale_avx2, mad_avx2, keys_avx2, full_rows_avx2};
#endif

void ma_attend_tiled(const float *q, int64_t q_stride, int64_t n, int64_t nh, const int64_t *pos, int64_t window,
                     const int64_t *cells, int64_t n_kv, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                     int64_t v_stride, int64_t D, int64_t Dv, float scale, const float *sink, float *out,
                     int64_t out_stride, float *work) {
#ifdef HAVE_AVX2_ROW
    const tiled_ops *ops = mq_cpu_isa() == MQ_ISA_AVX2 ? &ops_avx2 : &ops_scalar;
#else
    const tiled_ops *ops = &ops_scalar;
#endif
    attend_tiled(ops, q, q_stride, n, nh, pos, window, cells, n_kv, k, k_stride, v, v_stride, D, Dv, scale, sink, out,
                 out_stride, work);
}

int ma_attend_seq(const float *q, int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t Dv, int64_t start,
                  const uint16_t *k, const uint16_t *v, int64_t window, const int64_t *cells, int64_t n_kv,
                  float scale, const float *sinks, int64_t pass_rows, int64_t kv_split, float *out) {
    const int64_t kd = Hkv * D, vd = Hkv * Dv, group = H / Hkv;
    mq_init(); /* mq_half_float's table: no model need have been run yet */
    const int tiled = pass_rows >= MA_TILED_ROWS, rows = !tiled && pass_rows > 1;
    float *work = malloc(sizeof(float) * (tiled ? ma_tiled_work(D, Dv) : ma_rows_work(D, Dv)));
    int64_t *pos = tiled || rows ? malloc(sizeof(int64_t) * (size_t)n) : NULL;
    if (!work || ((tiled || rows) && !pos)) {
        free(work);
        free(pos);
        return 0;
    }
    for (int64_t t = 0; pos && t < n; t++) pos[t] = start + t;
    const int64_t nh = ma_group_heads(H, Hkv, tiled ? MA_TILED_HEADS : MA_ROW_HEADS);
    for (int64_t h = 0; h < H; h += nh) {
        const uint16_t *kh = k + (h / group) * D, *vh = v + (h / group) * Dv;
        const float *sink = sinks ? sinks + h : NULL;
        if (tiled) {
            for (int64_t t = 0; t < n; t += MA_TILED_ROWS)
                ma_attend_tiled(q + t * H * D + h * D, H * D, n - t < MA_TILED_ROWS ? n - t : MA_TILED_ROWS, nh,
                                pos + t, window, cells, n_kv, kh, kd, vh, vd, D, Dv, scale, sink,
                                out + t * H * Dv + h * Dv, H * Dv, work);
            continue;
        }
        if (rows) {
            for (int64_t t = 0; t < n; t += MA_TILED_ROWS - 1)
                ma_attend_rows(q + t * H * D + h * D, H * D, n - t < MA_TILED_ROWS - 1 ? n - t : MA_TILED_ROWS - 1, nh,
                               pos + t, window, cells, n_kv, kh, kd, vh, vd, D, Dv, scale, sink,
                               out + t * H * Dv + h * Dv, H * Dv, work);
            continue;
        }
        for (int64_t t = 0; t < n; t++) {
            const int64_t p = start + t, s0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            const int64_t cells_kv = cells ? n_kv : ma_cache_cells(p);
            ma_attend_cells(q + t * H * D + h * D, nh, kh, kd, vh, vd, cells, cells_kv, s0, p,
                            ma_split_cells(cells_kv, pass_rows, kv_split) ? kv_split : 1, D, Dv, scale, sink,
                            out + t * H * Dv + h * Dv, work);
        }
    }
    free(work);
    free(pos);
    return 1;
}
