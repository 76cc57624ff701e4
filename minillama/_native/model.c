/* The blocks of a llama-family transformer (llama, qwen2, qwen3, phi3, gemma3, qwen3moe, gpt-oss) over the tokens of one or more
 * sequences at once (a prompt's chunk, or the single-token steps of several sequences decoding together), in C,
 * in the style of llama2.c's run.c: the weights stay quantized in the map and go through quants.c's kernels,
 * everything between the products (norms, rope, attention over the key/value cache, the gated feed-forward,
 * residuals) is flat C here. minillama/model/llama.py and gemma3.py are the reference (and the pure backend's
 * path); the architectures' differences are data in ms_model / ms_layer (model.h).
 *
 * Every stage but attention works row by row, so the rows of all the sequences go through each weight matrix in one
 * product (the rows kernels read every weight once for up to MQ_NRC rows); attention runs per row, on the cache of
 * the row's sequence, at the row's own position. A row's result does not depend on the other rows of the call:
 * a sequence stepping with others gets the bits it gets alone.
 *
 * Shapes: T rows (of all sequences), d = n_embd, H query heads of D = head_dim, Hkv key/value heads (value heads Dv), S cached
 * positions a query sees. The threads of one call work as a team (quants.c's pool): every stage splits its work
 * (matrix rows, tokens, token x head pairs) over the team and a barrier ends it, so a single-token step costs
 * one wake of the workers rather than one per product. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* The loops over a head's values (attention's dot products and weighted sums, the norms) are written so that
 * the compiler can vectorise them without reordering float sums: O3 here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

typedef struct {
    atomic_uint count, gen;
} barrier;

static inline void cpu_relax(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_ia32_pause();
#endif
}

/* Every part of the team waits here until all have arrived: spins a little (the others are usually a few
 * microseconds behind), then yields the core (on a busy machine a part may wait for a descheduled one). */
static void barrier_wait(barrier *b, int parts) {
    if (parts == 1) return;
    const unsigned gen = atomic_load_explicit(&b->gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) == (unsigned)parts - 1) {
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->gen, 1, memory_order_release);
        return;
    }
    for (int spin = 0; atomic_load_explicit(&b->gen, memory_order_acquire) == gen; spin++) {
        if (spin < 4096)
            cpu_relax();
        else
            sched_yield();
    }
}

typedef struct {
    const ms_model *m;
    float *x;
    int64_t T;
    const ms_seq *seqs;
    const int32_t *seq_of; /* [T]: the sequence of each row */
    const int64_t *pos;    /* [T]: the position of each row */
    float *h;       /* [T, max(d, n_ff)]: normed stream, then the gated activations */
    float *qkv;     /* [T, q_dim + k_dim + v_dim] */
    float *att;     /* [T, H * Dv] */
    float *gu;      /* [T, max(2 n_ff, d)]: gate|up, and the outputs of wo and w_down */
    float *scores;  /* [parts, attention_work]: attend's or attend_runs' work */
    uint8_t *y;     /* activation rows quantized for the next product (T rows per piece type: y_offset) */
    atomic_int *chunks; /* [CHUNKS n_layer + 1]: each product's next weight row to hand out (matmul_part) */
    int64_t n_seq;
    const int64_t *last; /* [n_seq]: each sequence's last row */
    float *logits;       /* NULL, or [n_seq, n_vocab] */
    const float *cos_sin[2]; /* [T, n_rot / 2] cos then sin, per rope table */
    const double *table_base[2];
    const float *table_freqs[2];
    int n_tables;
    barrier bar;
    /* a mixture-of-experts feed-forward (moe.c), n = T k choices: */
    float *mo_logits;                     /* [T, E]: the router's */
    int32_t *mo_chosen, *mo_list, *mo_inv; /* [n] each: mo_route's and mo_group's */
    float *mo_w;                          /* [n]: the choices' weights */
    int64_t *mo_start;                    /* [E + 1]: each expert's slots */
    int32_t *mo_used;                     /* [E]: the experts with slots, mo_n_used of them */
    int64_t mo_n_used;
    float *mo_gu, *mo_act, *mo_down;      /* [n, 2 F], [n, F], [n, d]: gate|up, swiglu, down of each slot */
    uint8_t *mo_yg, *mo_yu, *mo_yd;       /* [n] rows quantized for gate, up (mo_yg when of gate's type), down */
} run;

/* Work counters per layer: wqkv, wo, w_gate_up (or the router), w_down (or the experts' gate|up), the experts'
 * down. */
#define CHUNKS 5

/* rows lo..hi of n split over parts */
static inline void share(int64_t n, int part, int parts, int64_t *lo, int64_t *hi) {
    *lo = n * part / parts, *hi = n * (part + 1) / parts;
}

/* out = x / sqrt(acc / n + eps) * w, acc the sum of x's squares. */
static void rms_scale(const float *x, const float *w, int64_t n, double acc, float eps, float *out) {
    const float ms = (float)(acc / (double)n), s = 1.0f / sqrtf(ms + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}

/* x / sqrt(mean(x^2) + eps) * w, as layers.rmsnorm: squares in float32 summed in double, the rest float32. */
static void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *out) {
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (double)(x[i] * x[i]);
    rms_scale(x, w, n, acc, eps, out);
}

/* rmsnorm of `rows` rows (x and out xs and os apart; out may be x): four rows' sums side by side, each in its own
 * order (four chains of double adds in flight instead of one waiting on the last): the bits of one at a time. */
static void rmsnorm_rows(const float *x, int64_t xs, const float *w, int64_t n, float eps, float *out, int64_t os,
                         int64_t rows) {
    int64_t t = 0;
    for (; t + 4 <= rows; t += 4) {
        const float *a = x + t * xs, *b = a + xs, *c = b + xs, *e = c + xs;
        double acc[4] = {0, 0, 0, 0};
        for (int64_t i = 0; i < n; i++) {
            acc[0] += (double)(a[i] * a[i]);
            acc[1] += (double)(b[i] * b[i]);
            acc[2] += (double)(c[i] * c[i]);
            acc[3] += (double)(e[i] * e[i]);
        }
        for (int k = 0; k < 4; k++) rms_scale(x + (t + k) * xs, w, n, acc[k], eps, out + (t + k) * os);
    }
    for (; t < rows; t++) rmsnorm(x + t * xs, w, n, eps, out + t * os);
}

/* Where piece i's quantized activation rows start in y (T rows for each piece whose type differs from the one
 * before it; a piece of the same type reads the rows quantized for that one). */
static size_t y_offset(const ms_matrix *M, int i, int64_t T) {
    size_t off = 0;
    for (int j = 1; j <= i; j++)
        if (M->type[j] != M->type[j - 1]) off += (size_t)T * mq_partner_bytes(M->type[j - 1], M->cols);
    return off;
}

/* Bytes of y M needs for T rows. */
static size_t y_size(const ms_matrix *M, int64_t T) {
    if (M->n < 1) return 0; /* an absent matrix (the other kind of feed-forward) */
    return y_offset(M, M->n - 1, T) + (size_t)T * mq_partner_bytes(M->type[M->n - 1], M->cols);
}

/* This part's share of out [T, n_out] = M . y (the T rows quantized for M's pieces): chunks of weight rows taken
 * from the product's counter (the next row) until none is left, as ggml hands out its chunks, so a part that runs
 * slower (a core the machine gives to something else for a while) takes fewer rows instead of keeping the others
 * waiting at the barrier. The chunks shrink as the rows run out (a part's share of half of what is left, at most
 * an eighth of its share of the whole, at least 16 rows), so the parts end within a small chunk of each other.
 * Which part computes a row does not change the row's bits. */
static void matmul_part(const ms_matrix *M, const uint8_t *y, int64_t T, float *out, int parts, atomic_int *next) {
    int64_t most = M->n_out / ((int64_t)parts * 8);
    most = most < 16 ? 16 : (most + 15) / 16 * 16; /* whole panels of ROW_BLOCK rows */
    for (;;) {
        int at = atomic_load_explicit(next, memory_order_relaxed);
        int64_t g0, g1;
        do {
            g0 = at;
            if (g0 >= M->n_out) return;
            int64_t chunk = (M->n_out - g0) / (2 * (int64_t)parts);
            chunk = chunk < 16 ? 16 : chunk > most ? most : (chunk + 15) / 16 * 16;
            g1 = g0 + chunk < M->n_out ? g0 + chunk : M->n_out;
        } while (!atomic_compare_exchange_weak_explicit(next, &at, (int)g1, memory_order_relaxed,
                                                        memory_order_relaxed));
        int64_t off = 0;
        for (int i = 0; i < M->n; off += M->rows[i], i++) {
            const int64_t lo = g0 > off ? g0 : off, hi = g1 < off + M->rows[i] ? g1 : off + M->rows[i];
            if (lo < hi)
                mq_dot_rows(M->type[i], M->w[i], M->cols, y + y_offset(M, i, T), T, lo - off, hi - off, out + off,
                            M->n_out);
        }
    }
}

/* Rows t0..t1 of x (stride apart) quantized for each of M's piece types. */
static void quantize_rows(const ms_matrix *M, const float *x, int64_t stride, int64_t T, int64_t t0, int64_t t1,
                          uint8_t *y) {
    for (int i = 0; i < M->n; i++) {
        if (i > 0 && M->type[i] == M->type[i - 1]) continue;
        const size_t yb = mq_partner_bytes(M->type[i], M->cols);
        uint8_t *yi = y + y_offset(M, i, T);
        for (int64_t t = t0; t < t1; t++) mq_quantize_row(M->type[i], x + t * stride, M->cols, yi + (size_t)t * yb);
    }
}

/* Rotate the first n_rot dims of one head by the angles cs (cos[n_rot/2] then sin[n_rot/2]): x0 c - x1 s and
 * x0 s + x1 c with the first product fused into the sum, as ggml's rotate_pairs comes out of its compiler. */
static void rope(float *v, const float *cs, int64_t n_rot, int neox) {
    const int64_t half = n_rot / 2;
    const float *c = cs, *s = cs + half;
    for (int64_t i = 0; i < half; i++) {
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = fmaf(x0, c[i], -(x1 * s[i]));
        v[b] = fmaf(x0, s[i], x1 * c[i]);
    }
}

/* Token t's q, k, v after the product: biases, per-head norms, rope, q's scale; k and v into the cache. */
static void prepare_qkv(run *r, const ms_layer *L, int il, int table, int64_t t) {
    const ms_model *m = r->m;
    const int64_t D = m->head_dim, qkv_dim = L->wqkv.n_out, q_dim = m->n_head * D, k_dim = m->n_head_kv * D;
    float *row = r->qkv + t * qkv_dim, *q = row, *k = row + q_dim, *v = row + q_dim + k_dim;
    if (L->bqkv)
        for (int64_t i = 0; i < qkv_dim; i++) row[i] += L->bqkv[i];
    const float *cs = r->cos_sin[table] + t * m->n_rot;
    if (L->q_norm) rmsnorm_rows(q, D, L->q_norm, D, m->eps, q, D, m->n_head);
    if (L->k_norm) rmsnorm_rows(k, D, L->k_norm, D, m->eps, k, D, m->n_head_kv);
    for (int64_t h = 0; h < m->n_head + m->n_head_kv; h++) {
        const int is_q = h < m->n_head;
        float *head = row + h * D;
        rope(head, cs, m->n_rot, m->rope_neox);
        if (is_q && m->scale_q)
            for (int64_t i = 0; i < D; i++) head[i] *= m->q_scale;
    }
    const int64_t pos = r->pos[t], v_dim = m->n_head_kv * m->head_dim_v;
    const ms_seq *seq = &r->seqs[r->seq_of[t]];
    uint16_t *kd = seq->k[il] + pos * k_dim, *vd = seq->v[il] + pos * v_dim;
    mq_halves(k, k_dim, kd);
    mq_halves(v, v_dim, vd);
}

/* Query heads h..h+nh-1 (sharing one key/value head) of row t against the cached keys they see (their own
 * sequence's, up to its position, in its cache's cell order) as ggml's flash attention computes it (attention.c),
 * into att. work: ma_row_work floats. */
static void attend(run *r, const ms_layer *L, int il, int64_t t, int64_t h, int64_t nh, float *work) {
    const ms_model *m = r->m;
    const int64_t D = m->head_dim, Dv = m->head_dim_v, kvh = h / (m->n_head / m->n_head_kv);
    const int64_t pos = r->pos[t], s0 = L->window > 0 && pos - L->window + 1 > 0 ? pos - L->window + 1 : 0;
    const int64_t k_dim = m->n_head_kv * D, v_dim = m->n_head_kv * Dv;
    const ms_seq *seq = &r->seqs[r->seq_of[t]];
    const float *q = r->qkv + t * L->wqkv.n_out + h * D;
    const uint16_t *k = seq->k[il] + kvh * D, *v = seq->v[il] + kvh * Dv;
    float *out = r->att + t * m->n_head * Dv + h * Dv;
    const int64_t *cells = seq->cells[L->window > 0];
    const int64_t n_kv = cells ? seq->n_cells[L->window > 0] : ma_cache_cells(pos);
    ma_attend_cells(q, nh, k, k_dim, v, v_dim, cells, n_kv, s0, pos,
                    ma_split_cells(n_kv, r->T, m->kv_split) ? m->kv_split : 1, D, Dv, m->attn_scale,
                    L->sinks ? L->sinks + h : NULL, out, work);
}

/* Query heads h..h+nh-1 (sharing one key/value head) of rows t0..t1 of a batch, each run of rows of one sequence given
 * together to a kernel of ma_attend_tiled's arguments: ma_attend_tiled (a batch of MA_TILED_ROWS rows or more, at
 * most MA_TILED_ROWS of them, as ggml's tiled flash attention computes them; work: ma_tiled_work floats) or
 * ma_attend_rows (a batch of 2 to MA_TILED_ROWS - 1 rows, row by row as ggml's one_chunk computes them, their keys
 * and values widened once for all of them; work: ma_rows_work floats). */
typedef void (*attend_fn)(const float *, int64_t, int64_t, int64_t, const int64_t *, int64_t, const int64_t *,
                          int64_t, const uint16_t *, int64_t, const uint16_t *, int64_t, int64_t, int64_t, float,
                          const float *, float *, int64_t, float *);
static void attend_runs(attend_fn fn, run *r, const ms_layer *L, int il, int64_t t0, int64_t t1, int64_t h,
                        int64_t nh, float *work) {
    const ms_model *m = r->m;
    const int64_t D = m->head_dim, Dv = m->head_dim_v, kvh = h / (m->n_head / m->n_head_kv);
    const int64_t k_dim = m->n_head_kv * D, v_dim = m->n_head_kv * Dv;
    for (int64_t t = t0, e; t < t1; t = e) {
        for (e = t + 1; e < t1 && r->seq_of[e] == r->seq_of[t];) e++;
        const ms_seq *seq = &r->seqs[r->seq_of[t]];
        fn(r->qkv + t * L->wqkv.n_out + h * D, L->wqkv.n_out, e - t, nh, r->pos + t, L->window,
           seq->cells[L->window > 0], seq->n_cells[L->window > 0], seq->k[il] + kvh * D, k_dim, seq->v[il] + kvh * Dv,
           v_dim, D, Dv, m->attn_scale, L->sinks ? L->sinks + h : NULL, r->att + t * m->n_head * Dv + h * Dv,
           m->n_head * Dv, work);
    }
}

/* Rows one attention work item takes: llama.cpp's flash attention tiles a batch of MA_TILED_ROWS rows or more
 * (ggml_compute_forward_flash_attn_ext_f16 chooses by the batch's rows), else goes row by row: one row alone (a
 * step: the split-KV path), or the rows of a smaller batch cut into as few groups as give every part two items
 * (each group's rows share the widened keys and values of a key/value head). */
static int64_t attention_rows(const run *r, int parts) {
    if (r->T >= MA_TILED_ROWS || r->T == 1) return r->T >= MA_TILED_ROWS ? MA_TILED_ROWS : 1;
    const int64_t runs = r->m->n_head / ma_group_heads(r->m->n_head, r->m->n_head_kv, MA_ROW_HEADS);
    const int64_t groups = (2 * (int64_t)parts + runs - 1) / runs;
    return (r->T + groups - 1) / groups;
}

/* Query heads one attention work item takes (both paths read a key/value head once for the heads sharing it): as
 * many as share one, up to MA_TILED_HEADS or MA_ROW_HEADS, while the items stay at least two per part. */
static int64_t attention_heads(const run *r, int parts) {
    const int64_t G = attention_rows(r, parts), groups = (r->T + G - 1) / G, H = r->m->n_head, Hkv = r->m->n_head_kv;
    int64_t nh = ma_group_heads(H, Hkv, r->T >= MA_TILED_ROWS ? MA_TILED_HEADS : MA_ROW_HEADS);
    while (nh > 1 && groups * (H / nh) < 2 * (int64_t)parts) nh = ma_group_heads(H, Hkv, nh - 1);
    return nh;
}

/* Floats of work space one part's attention needs for a batch of T rows. */
static size_t attention_work(const ms_model *m, int64_t T) {
    return T >= MA_TILED_ROWS ? ma_tiled_work(m->head_dim, m->head_dim_v)
           : T > 1            ? ma_rows_work(m->head_dim, m->head_dim_v)
                              : ma_row_work(m->head_dim, m->head_dim_v);
}

/* tanh GELU as ggml_gelu_f32 fills llama.cpp's table: its compiler fuses 1 + a x x into fmaf(a x, x, 1), which
 * changes the float16 entry at x = -1.999 (checked against the wheel's ggml_table_gelu_f16, every entry). */
static inline float gelu(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(c * x * fmaf(0.044715f * x, x, 1.0f)));
}

/* GELU as ggml's CPU backend computes it (GGML_GELU_FP16, ggml_vec_geglu_f32): 0 below -10, x above 10, else
 * a table of gelu at every float16 value, rounded to float16, looked up at x rounded to float16. */
static float gelu_table[65536];
static void gelu_table_init(void) {
    mq_init(); /* mq_half_float's table */
    for (uint32_t h = 0; h < 65536; h++) gelu_table[h] = mq_round_f16(gelu(mq_half_float((uint16_t)h)));
}
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

const float *ms_gelu_table(void) {
    pthread_once(&gelu_once, gelu_table_init);
    return gelu_table;
}

/* y [n] = GELU(x) * g, the float16 roundings of x made 64 at a time (mq_halves: F16C where the kernels are AVX2,
 * as ggml's GGML_CPU_FP32_TO_FP16; the same bits as one at a time). */
static void geglu(int64_t n, float *y, const float *x, const float *g) {
    uint16_t h[64];
    for (int64_t i0 = 0; i0 < n; i0 += 64) {
        const int64_t c = n - i0 < 64 ? n - i0 : 64;
        mq_halves(x + i0, c, h);
        for (int64_t i = 0; i < c; i++) {
            const float v = x[i0 + i];
            y[i0 + i] = (v <= -10.0f ? 0.0f : v >= 10.0f ? v : gelu_table[h[i]]) * g[i0 + i];
        }
    }
}

static int table_of(const run *r, const ms_layer *L) {
    for (int i = 0; i < r->n_tables; i++)
        if (*r->table_base[i] == L->rope_base && r->table_freqs[i] == L->rope_freqs) return i;
    return 0; /* not reached: ms_forward made a table for every layer */
}

/* x += norm(o + bias) (bias, norm: NULL when absent), `rows` tokens' rows of d values (x and o d apart). */
static void residual(float *x, float *o, int64_t rows, const float *bias, const float *norm, int64_t d, float eps) {
    if (bias)
        for (int64_t t = 0; t < rows; t++)
            for (int64_t i = 0; i < d; i++) o[t * d + i] += bias[i];
    if (norm) rmsnorm_rows(o, d, norm, d, eps, o, d, rows);
    for (int64_t i = 0; i < rows * d; i++) x[i] += o[i];
}

/* out [T, n_out] = M . x: this part quantizes its tokens' rows of x (stride apart), then the team shares M's
 * rows; a barrier after each half. */
static void product(run *r, const ms_matrix *M, const float *x, int64_t stride, float *out, int64_t t0, int64_t t1,
                    int parts, atomic_int *next) {
    quantize_rows(M, x, stride, r->T, t0, t1, r->y);
    barrier_wait(&r->bar, parts);
    matmul_part(M, r->y, r->T, out, parts, next);
    barrier_wait(&r->bar, parts);
}

/* The first work item of this part's share of attention: item i is the (i % H)-th run of attention_heads query
 * heads (H runs) of the i / H-th group of attention_rows rows. Rows cost about as many cached positions as they
 * see (a prompt's later rows see more), so the parts get equal sums of positions rather than equal counts. */
static int64_t attention_split(const run *r, int part, int parts) {
    const int64_t T = r->T, H = r->m->n_head / attention_heads(r, parts), G = attention_rows(r, parts);
    const int64_t n = (T + G - 1) / G;
    if (part == 0) return 0;
    if (part == parts) return n * H;
    double total = 0;
    for (int64_t t = 0; t < T; t++) total += (double)(r->pos[t] + 1 + 16) * (double)H; /* + a pair's fixed cost */
    const double goal = total * part / parts;
    double sum = 0;
    for (int64_t g = 0; g < n; g++) {
        double c = 0;
        for (int64_t t = g * G; t < T && t < (g + 1) * G; t++) c += (double)(r->pos[t] + 1 + 16);
        if (sum + c * (double)H >= goal) return g * H + (int64_t)((goal - sum) / c);
        sum += c * (double)H;
    }
    return n * H;
}

/* Rows of an expert's matrix one work item takes: enough that a kernel's setup per call (the gemm's activation
 * sums, its tiles) is shared by many rows, few enough that the two parts end a stage together. */
#define EXPERT_ROWS 64

/* The work items of one expert product, shared by the team: item i is rows (i % per) * EXPERT_ROWS.. of used expert
 * i / per, of matrix `which` (0 or 1: gate or up, or down alone); out row j of the slots at out + j * stride. */
static void expert_items(run *r, const ms_matrix *const *M, const uint8_t *const *y, const size_t *y_row, int n_mats,
                         int64_t rows_e, float *out, int64_t stride, int64_t col_step, atomic_int *next) {
    const int64_t per = (rows_e + EXPERT_ROWS - 1) / EXPERT_ROWS, total = (int64_t)n_mats * r->mo_n_used * per;
    for (;;) {
        int64_t i = (int64_t)atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
        if (i >= total) return;
        const int64_t which = i / (r->mo_n_used * per);
        i %= r->mo_n_used * per;
        const int64_t e = r->mo_used[i / per], r0 = i % per * EXPERT_ROWS;
        const int64_t r1 = r0 + EXPERT_ROWS < rows_e ? r0 + EXPERT_ROWS : rows_e, j0 = r->mo_start[e];
        mo_expert_rows(M[which], rows_e, e, y[which], y_row[which], j0, r->mo_start[e + 1] - j0, r0, r1,
                       out + j0 * stride + which * col_step, stride);
    }
}

/* x += the experts' feed-forward of the normed rows h (build_moe_ffn: softmax gating, top k, renormalised weights,
 * SwiGLU experts), each stage shared by the team with a barrier after it; every chosen expert's matrices are read
 * once for all the rows that chose it. */
static void moe_ffn(run *r, const ms_layer *L, int il, int64_t t0, int64_t t1, int part, int parts) {
    const ms_model *m = r->m;
    const int64_t d = m->n_embd, E = m->n_expert, k = m->n_expert_used, F = m->n_ff_exp, n = r->T * k;
    /* the router: a float32 one as llama.cpp's CPU backend multiplies it (mo_router: by the rows its product has,
     * one in the last layer of a pass that wants only the last rows' logits), another type as any matrix */
    const int simd = mo_simd();
    if (mo_router_f32(&L->router)) {
        const int64_t rows = il == m->n_layer - 1 && r->logits ? r->n_seq : r->T;
        for (int64_t t = t0; t < t1; t++)
            mo_router((const float *)(const void *)L->router.w[0], r->h + t * d, E, d, rows, simd, r->mo_logits + t * E);
    } else
        product(r, &L->router, r->h, d, r->mo_logits, t0, t1, parts, &r->chunks[CHUNKS * il + 2]);
    for (int64_t t = t0; t < t1; t++) {
        float *logits = r->mo_logits + t * E;
        if (L->router_bias) /* ggml_add of the router's bias */
            for (int64_t e = 0; e < E; e++) logits[e] += L->router_bias[e];
        if (m->softmax_weight)
            mo_route_softmax_weight(logits, E, k, simd, r->mo_chosen + t * k, r->mo_w + t * k);
        else
            mo_route(logits, E, k, simd, r->mo_chosen + t * k, r->mo_w + t * k);
    }
    barrier_wait(&r->bar, parts);
    if (part == 0) {
        mo_group(r->mo_chosen, n, E, r->mo_start, r->mo_list, r->mo_inv);
        r->mo_n_used = 0;
        for (int64_t e = 0; e < E; e++)
            if (r->mo_start[e + 1] > r->mo_start[e]) r->mo_used[r->mo_n_used++] = (int32_t)e;
    }
    barrier_wait(&r->bar, parts);
    /* each slot's row of h quantized for gate and up, in slot order */
    const int tg = L->gate_exps.type[0], tu = L->up_exps.type[0], td = L->down_exps.type[0];
    const size_t bg = mq_partner_bytes(tg, d), bu = mq_partner_bytes(tu, d), bd = mq_partner_bytes(td, F);
    uint8_t *yu = tu == tg ? r->mo_yg : r->mo_yu;
    int64_t j0, j1;
    share(n, part, parts, &j0, &j1);
    for (int64_t j = j0; j < j1; j++) {
        const float *row = r->h + r->mo_list[j] / k * d;
        mq_quantize_row(tg, row, d, r->mo_yg + (size_t)j * bg);
        if (tu != tg) mq_quantize_row(tu, row, d, yu + (size_t)j * bu);
    }
    barrier_wait(&r->bar, parts);
    const ms_matrix *gu_m[2] = {&L->gate_exps, &L->up_exps};
    const uint8_t *gu_y[2] = {r->mo_yg, yu};
    const size_t gu_b[2] = {bg, bu};
    expert_items(r, gu_m, gu_y, gu_b, 2, F, r->mo_gu, 2 * F, F, &r->chunks[CHUNKS * il + 3]);
    barrier_wait(&r->bar, parts);
    for (int64_t j = j0; j < j1; j++) {
        float *gate = r->mo_gu + j * 2 * F, *up = gate + F;
        const int64_t e = r->mo_chosen[r->mo_list[j]];
        if (L->gate_exps_bias) /* ggml_add_id: the slot's expert's bias row */
            for (int64_t i = 0; i < F; i++) gate[i] += L->gate_exps_bias[e * F + i];
        if (L->up_exps_bias)
            for (int64_t i = 0; i < F; i++) up[i] += L->up_exps_bias[e * F + i];
        if (m->swiglu_oai)
            ma_swiglu_oai(F, r->mo_act + j * F, gate, up);
        else
            ma_swiglu(F, r->mo_act + j * F, gate, up);
        mq_quantize_row(td, r->mo_act + j * F, F, r->mo_yd + (size_t)j * bd);
    }
    barrier_wait(&r->bar, parts);
    const ms_matrix *d_m[1] = {&L->down_exps};
    const uint8_t *d_y[1] = {r->mo_yd};
    expert_items(r, d_m, d_y, &bd, 1, d, r->mo_down, d, 0, &r->chunks[CHUNKS * il + 4]);
    barrier_wait(&r->bar, parts);
    /* x += down_0 w_0 + down_1 w_1 + ..., each product rounded, summed in the order of the choice (ggml_mul, then
     * ggml_add of the experts' views one after another); down_i plus its expert's bias row first (ggml_add_id) */
    for (int64_t t = t0; t < t1; t++) {
        float *x = r->x + t * d;
        const float *w = r->mo_w + t * k;
        const int32_t *slot = r->mo_inv + t * k, *chosen = r->mo_chosen + t * k;
        if (L->down_exps_bias)
            for (int64_t i = 0; i < k; i++) {
                float *down = r->mo_down + slot[i] * d;
                const float *b = L->down_exps_bias + chosen[i] * d;
                for (int64_t c = 0; c < d; c++) down[c] += b[c];
            }
        for (int64_t c = 0; c < d; c++) {
            float acc = r->mo_down[slot[0] * d + c] * w[0];
            for (int64_t i = 1; i < k; i++) {
                const float p = r->mo_down[slot[i] * d + c] * w[i];
                acc = acc + p;
            }
            x[c] += acc;
        }
    }
    /* the next layer's first stage reads only this part's rows of x: no barrier */
}

static void team(void *ctx, int part, int parts) {
    run *r = ctx;
    const ms_model *m = r->m;
    const int64_t T = r->T, d = m->n_embd, n_ff = m->n_ff, G = attention_rows(r, parts), nh = attention_heads(r, parts);
    const int64_t work = (int64_t)attention_work(m, T); /* attend's or attend_runs' */
    int64_t t0, t1;
    share(T, part, parts, &t0, &t1);
    const int64_t a0 = attention_split(r, part, parts), a1 = attention_split(r, part + 1, parts);
    for (int il = 0; il < m->n_layer; il++) {
        const ms_layer *L = &m->layers[il];
        const int table = table_of(r, L);
        /* qkv = wqkv attn_norm(x); rope, norms, the cache; att = attention */
        rmsnorm_rows(r->x + t0 * d, d, L->attn_norm, d, m->eps, r->h + t0 * d, d, t1 - t0);
        product(r, &L->wqkv, r->h, d, r->qkv, t0, t1, parts, &r->chunks[CHUNKS * il]);
        for (int64_t t = t0; t < t1; t++) prepare_qkv(r, L, il, table, t);
        barrier_wait(&r->bar, parts);
        if (T == 1)
            for (int64_t i = a0; i < a1; i++)
                attend(r, L, il, i / (m->n_head / nh), i % (m->n_head / nh) * nh, nh, r->scores + part * work);
        else
            for (int64_t i = a0; i < a1; i++) {
                const int64_t g = i / (m->n_head / nh), e = (g + 1) * G < T ? (g + 1) * G : T;
                attend_runs(T >= MA_TILED_ROWS ? ma_attend_tiled : ma_attend_rows, r, L, il, g * G, e,
                            i % (m->n_head / nh) * nh, nh, r->scores + part * work);
            }
        barrier_wait(&r->bar, parts);
        /* x += post_attn_norm(wo att + bo) */
        product(r, &L->wo, r->att, m->n_head * m->head_dim_v, r->gu, t0, t1, parts, &r->chunks[CHUNKS * il + 1]);
        residual(r->x + t0 * d, r->gu + t0 * d, t1 - t0, L->bo, L->post_attn_norm, d, m->eps);
        rmsnorm_rows(r->x + t0 * d, d, L->ffn_norm, d, m->eps, r->h + t0 * d, d, t1 - t0);
        if (L->router.n) { /* x += the experts' feed-forward of ffn_norm(x) */
            moe_ffn(r, L, il, t0, t1, part, parts);
            continue;
        }
        /* x += post_ffn_norm(w_down (act(gate + b) * (up + b)) + b_down), gate|up = w_gate_up ffn_norm(x) */
        product(r, &L->w_gate_up, r->h, d, r->gu, t0, t1, parts, &r->chunks[CHUNKS * il + 2]);
        for (int64_t t = t0; t < t1; t++) {
            float *gu = r->gu + t * 2 * n_ff, *h = r->h + t * n_ff;
            if (L->b_gate_up)
                for (int64_t i = 0; i < 2 * n_ff; i++) gu[i] += L->b_gate_up[i];
            if (m->gelu)
                geglu(n_ff, h, gu, gu + n_ff);
            else
                ma_swiglu(n_ff, h, gu, gu + n_ff);
        }
        product(r, &L->w_down, r->h, n_ff, r->gu, t0, t1, parts, &r->chunks[CHUNKS * il + 3]);
        residual(r->x + t0 * d, r->gu + t0 * d, t1 - t0, L->b_down, L->post_ffn_norm, d, m->eps);
        /* the next layer's first stage reads only this part's rows of x: no barrier */
    }
    if (r->logits) {
        /* logits [n_seq, n_vocab] = output out_norm(each sequence's last row); when every sequence has one row
         * (decode steps) this part's sequences are its rows of x, else they wait for the other parts' rows */
        int64_t s0, s1;
        share(r->n_seq, part, parts, &s0, &s1);
        if (r->n_seq != T) barrier_wait(&r->bar, parts);
        for (int64_t s = s0; s < s1; s++) rmsnorm(r->x + r->last[s] * d, m->out_norm, d, m->eps, r->h + s * d);
        quantize_rows(&m->output, r->h, d, r->n_seq, s0, s1, r->y);
        barrier_wait(&r->bar, parts);
        matmul_part(&m->output, r->y, r->n_seq, r->logits, parts, &r->chunks[CHUNKS * m->n_layer]);
    }
}

/* ggml_rope_yarn_corr_dim: the pair dimension whose wavelength fits beta turns in n_ctx_orig positions. */
static float yarn_corr_dim(const ms_model *m, float beta, float base) {
    return (float)m->n_rot * logf((float)m->n_ctx_orig / (beta * 2 * 3.14159265358979323846f)) / (2 * logf(base));
}

/* cos and sin of each pair's angle for the T rows' positions, as ggml's rope computes them (ggml_rope_cache_init,
 * rope_yarn): in float32, the angle of pair i + 1 that of pair i times base^(-2/n_rot), divided by freqs[i]; that
 * angle times rope_freq_scale, or with YaRN (rope_ext_factor != 0) a blend of the two by a ramp over the pairs
 * between the correction dims; then cosf and sinf times the attention factor (times 1 + 0.1 ln(1 / freq_scale)
 * with YaRN). Without scaling (freq_scale 1, ext_factor 0, attn_factor 1) that is the plain angle's cosf and sinf.
 * (A double-precision angle is closer to the true one, but a float off by an ulp from llama.cpp's rotates q and k
 * a little differently, and that spreads through every later layer.) */
static void angles(const ms_model *m, double base, const float *freqs, const int64_t *pos, int64_t T, float *cs) {
    const int64_t half = m->n_rot / 2;
    const float theta_scale = powf((float)base, -2.0f / (float)m->n_rot), fs = m->rope_freq_scale;
    const float ext = m->rope_ext_factor;
    float mscale = m->rope_attn_factor, low = 0, high = 0;
    if (ext != 0.0f) {
        const float start = floorf(yarn_corr_dim(m, m->rope_beta_fast, (float)base));
        const float end = ceilf(yarn_corr_dim(m, m->rope_beta_slow, (float)base));
        low = start > 0 ? start : 0;
        high = (float)(m->n_rot - 1) < end ? (float)(m->n_rot - 1) : end;
        mscale *= 1.0f + 0.1f * logf(1.0f / fs);
    }
    for (int64_t t = 0; t < T; t++) {
        float theta = (float)pos[t];
        for (int64_t i = 0; i < half; i++) {
            const float extrap = freqs ? theta / freqs[i] : theta, interp = fs * extrap;
            float th = interp;
            if (ext != 0.0f) {
                const float y = ((float)i - low) / (0.001f > high - low ? 0.001f : high - low);
                const float mix = (1 - (y < 0 ? 0 : y > 1 ? 1 : y)) * ext; /* rope_yarn_ramp times ext_factor */
                th = interp * (1 - mix) + extrap * mix;
            }
            cs[t * m->n_rot + i] = cosf(th) * mscale;
            cs[t * m->n_rot + half + i] = sinf(th) * mscale;
            theta *= theta_scale;
        }
    }
}

int ms_rope_shift(const ms_model *m, int il, uint16_t *k, int64_t n, const int64_t *delta) {
    const ms_layer *L = &m->layers[il];
    const int64_t D = m->head_dim, n_rot = m->n_rot;
    float *cs = malloc(sizeof(float) * (size_t)(n_rot + D));
    if (!cs) return 0;
    float *v = cs + n_rot;
    mq_init();
    for (int64_t t = 0; t < n; t++) {
        if (t == 0 || delta[t] != delta[t - 1]) angles(m, L->rope_base, L->rope_freqs, delta + t, 1, cs);
        for (int64_t h = 0; h < m->n_head_kv; h++) {
            uint16_t *kh = k + (t * m->n_head_kv + h) * D;
            for (int64_t i = 0; i < n_rot; i++) v[i] = mq_half_float(kh[i]);
            rope(v, cs, n_rot, m->rope_neox);
            mq_halves(v, n_rot, kh);
        }
    }
    free(cs);
    return 1;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

int ms_forward(const ms_model *m, float *x, const ms_seq *seqs, int n_seq, int threads, float *logits) {
    int64_t n_tok = 0;
    for (int i = 0; i < n_seq; i++) n_tok += seqs[i].n;
    const size_t T = (size_t)n_tok, d = (size_t)m->n_embd, n_ff = (size_t)m->n_ff;
    size_t qkv = 0, y_bytes = 0, mo_y[3] = {0, 0, 0};
    int moe = 0;
    run r = {.m = m, .x = x, .T = n_tok, .seqs = seqs};
    mq_init();
    if (m->gelu) pthread_once(&gelu_once, gelu_table_init);
    for (int il = 0; il < m->n_layer; il++) {
        const ms_layer *L = &m->layers[il];
        qkv = max_sz(qkv, (size_t)L->wqkv.n_out);
        const ms_matrix *mats[5] = {&L->wqkv, &L->wo, &L->w_gate_up, &L->w_down, &L->router};
        for (int i = 0; i < 5; i++) y_bytes = max_sz(y_bytes, y_size(mats[i], n_tok));
        if (L->router.n) {
            const size_t n = T * (size_t)m->n_expert_used;
            mo_y[0] = max_sz(mo_y[0], n * mq_partner_bytes(L->gate_exps.type[0], m->n_embd));
            mo_y[1] = max_sz(mo_y[1], n * mq_partner_bytes(L->up_exps.type[0], m->n_embd));
            mo_y[2] = max_sz(mo_y[2], n * mq_partner_bytes(L->down_exps.type[0], m->n_ff_exp));
            moe = 1;
        }
        int found = 0;
        for (int i = 0; i < r.n_tables; i++)
            found |= *r.table_base[i] == L->rope_base && r.table_freqs[i] == L->rope_freqs;
        if (!found) {
            if (r.n_tables == 2) return -1; /* the binding allows two rope tables (gemma3's two bases) */
            r.table_base[r.n_tables] = &L->rope_base, r.table_freqs[r.n_tables++] = L->rope_freqs;
        }
    }
    if (!m->out_norm) logits = NULL; /* no head: no logits */
    if (logits) y_bytes = max_sz(y_bytes, y_size(&m->output, n_seq));
    const int parts = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    const size_t attn_work = attention_work(m, n_tok);
    const size_t n_f = T * max_sz(d, n_ff) + T * qkv + T * (size_t)(m->n_head * m->head_dim_v) +
                       T * max_sz(2 * n_ff, d) + (size_t)parts * attn_work +
                       (size_t)r.n_tables * T * (size_t)m->n_rot;
    float *f = malloc(n_f * sizeof(float) + 1);
    uint8_t *y = malloc(y_bytes + 1);
    int64_t *pos = malloc(T * sizeof(int64_t) + 1);
    int32_t *seq_of = malloc(T * sizeof(int32_t) + 1);
    atomic_int *chunks = malloc((CHUNKS * (size_t)m->n_layer + 1) * sizeof(atomic_int));
    int64_t *last = malloc((size_t)n_seq * sizeof(int64_t) + 1);
    /* the experts' work space: logits, choices, slots' activations and outputs, then their quantized rows */
    const size_t E = moe ? (size_t)m->n_expert : 0, n_mo = moe ? T * (size_t)m->n_expert_used : 0;
    const size_t F = moe ? (size_t)m->n_ff_exp : 0;
    const size_t mo_f = T * E + n_mo + n_mo * 2 * F + n_mo * F + n_mo * d, mo_i = 3 * n_mo + E;
    float *mo = moe ? malloc(mo_f * sizeof(float) + mo_i * sizeof(int32_t) + (E + 1) * sizeof(int64_t) + mo_y[0] +
                             mo_y[1] + mo_y[2] + 16) : NULL;
    if (!f || !y || !pos || !seq_of || !chunks || !last || (moe && !mo)) {
        free(f), free(y), free(pos), free(seq_of), free(chunks), free(last), free(mo);
        return 0;
    }
    if (moe) {
        r.mo_start = (int64_t *)mo; /* the int64 first, for their alignment */
        r.mo_logits = (float *)(r.mo_start + E + 1), r.mo_w = r.mo_logits + T * E, r.mo_gu = r.mo_w + n_mo;
        r.mo_act = r.mo_gu + n_mo * 2 * F, r.mo_down = r.mo_act + n_mo * F;
        r.mo_chosen = (int32_t *)(r.mo_down + n_mo * d), r.mo_list = r.mo_chosen + n_mo, r.mo_inv = r.mo_list + n_mo;
        r.mo_used = r.mo_inv + n_mo;
        r.mo_yg = (uint8_t *)(r.mo_used + E), r.mo_yu = r.mo_yg + mo_y[0], r.mo_yd = r.mo_yu + mo_y[1];
    }
    for (int i = 0; i < CHUNKS * m->n_layer + 1; i++) atomic_init(&chunks[i], 0);
    r.chunks = chunks;
    int64_t t = 0;
    for (int i = 0; i < n_seq; i++) {
        for (int64_t j = 0; j < seqs[i].n; j++, t++) pos[t] = seqs[i].start + j, seq_of[t] = i;
        last[i] = t - 1;
    }
    r.n_seq = n_seq, r.last = last, r.logits = logits;
    r.pos = pos, r.seq_of = seq_of;
    r.h = f, r.qkv = r.h + T * max_sz(d, n_ff), r.att = r.qkv + T * qkv;
    r.gu = r.att + T * (size_t)(m->n_head * m->head_dim_v), r.scores = r.gu + T * max_sz(2 * n_ff, d);
    float *cs = r.scores + (size_t)parts * attn_work;
    for (int i = 0; i < r.n_tables; i++) {
        angles(m, *r.table_base[i], r.table_freqs[i], pos, n_tok, cs + (size_t)i * T * (size_t)m->n_rot);
        r.cos_sin[i] = cs + (size_t)i * T * (size_t)m->n_rot;
    }
    r.y = y;
    atomic_init(&r.bar.count, 0);
    atomic_init(&r.bar.gen, 0);
    mq_team(team, &r, parts);
    free(f), free(y), free(pos), free(seq_of), free(chunks), free(last), free(mo);
    return 1;
}

int64_t ms_dim(const ms_model *m, int dim) {
    switch (dim) {
    case MS_DIM_EMBD: return m->n_embd;
    case MS_DIM_QKV: return m->n_head * m->head_dim + m->n_head_kv * m->head_dim + m->n_head_kv * m->head_dim_v;
    case MS_DIM_HEAD: return m->head_dim;
    case MS_DIM_O: return m->n_head * m->head_dim_v;
    case MS_DIM_GATE_UP: return 2 * m->n_ff;
    case MS_DIM_FF: return m->n_ff;
    case MS_DIM_ROT_PAIRS: return m->n_rot / 2;
    case MS_DIM_EXPERTS: return m->n_expert;
    case MS_DIM_EXP_FF: return m->n_expert * m->n_ff_exp;
    case MS_DIM_FF_EXP: return m->n_ff_exp;
    case MS_DIM_EXP_EMBD: return m->n_expert * m->n_embd;
    case MS_DIM_HEADS: return m->n_head;
    default: return 0;
    }
}

const char *ms_check_layer(const ms_model *m, const ms_layer *L) {
    const int dense = L->w_gate_up.n > 0, dense_down = L->w_down.n > 0;
    const int moe = L->router.n > 0, exps = (L->gate_exps.n > 0) + (L->up_exps.n > 0) + (L->down_exps.n > 0);
    if (dense != dense_down || (moe ? exps != 3 : exps != 0) || dense == moe)
        return "expected one feed-forward: w_gate_up and w_down, or router and gate_exps, up_exps, down_exps";
    if (moe && (m->n_expert < 1 || m->n_expert > MS_MAX_EXPERTS || m->n_expert_used < 1 ||
                m->n_expert_used > m->n_expert || m->n_ff_exp < 1 || m->n_ff_exp > (1 << 20)))
        return "expert counts out of range (n_expert 1..512, n_expert_used 1..n_expert, n_ff_exp 1..2^20)";
    if (moe && (L->gate_exps.n != 1 || L->up_exps.n != 1 || L->down_exps.n != 1))
        return "each expert tensor must be one piece";
    return NULL;
}

static int span_cmp(const void *a, const void *b) {
    const ms_span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

int ms_spans_overlap(ms_span *spans, size_t n) {
    qsort(spans, n, sizeof *spans, span_cmp);
    uintptr_t end = spans[0].hi;
    for (size_t i = 1; i < n; end = spans[i].hi > end ? spans[i].hi : end, i++)
        if (spans[i].lo < end && spans[i].lo < spans[i].hi) return 1;
    return 0;
}
