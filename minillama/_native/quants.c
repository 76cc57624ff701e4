/* Matrix products of ggml quantized weights with float32 activations, as ggml computes them (see core.h):
 * the activation rows are quantized once per product to the weight type's partner, then each weight row's
 * blocks are dotted in place with every activation row (the row stays in cache across them), the rows split
 * over threads. The scalar kernels (quants_kernels.h, compiled here) are the fallback; quants_avx2.c holds the
 * same kernels for AVX2, used when the CPU has it. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "model.h"
#include "quants_common.h"

float mq_f16_table[65536];

#define KNAME(name) name##_scalar
#include "quants_kernels.h"
#undef KNAME

const mq_dot_fn *mq_kernels_avx2(void);
const mq_dotn_fn *mq_rows_avx2(void);
const mq_dotn_fn *mq_rows_batch_avx2(void);
const mq_gemv_fn *mq_gemv_avx2(void);
const mq_panel *mq_panels_avx2(void);
const mq_quantizers *mq_quantizers_avx2(void);

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float f32_from(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE half -> float, exactly (the FP16 library's fp16_ieee_to_fp32_value, as ggml's table holds it). */
static float half_to_float(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    const float normalized = f32_from((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = f32_from((two_w >> 17) | (126u << 23)) - 0.5f;
    return f32_from(sign | (two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized)));
}

/* float -> IEEE half, rounded to nearest even (fp16_ieee_from_fp32_value, GGML_FP32_TO_FP16). */
static uint16_t float_to_half(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = f32_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = f32_from((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static const mq_dot_fn *kernels;
static const mq_dotn_fn no_rows[MQ_NTYPES], *rows_kernels = no_rows; /* NULL entries: one dot per activation row */
static const mq_dotn_fn *rows_batch = no_rows; /* the MQ_BATCH forms (NULL: the rows kernel at any size) */
static const mq_gemv_fn no_gemv[MQ_NTYPES], *gemv = no_gemv; /* NULL entries: the one-row kernel row by row */
static const mq_panel no_panels[MQ_NTYPES], *panels = no_panels; /* NULL entries: the rows kernels unpack per tile */
static const char *isa = "scalar";
static void quantize_f16(const float *x, int64_t n, uint8_t *y);
static void quantize_q8(const float *x, int64_t n, uint8_t *y, int with_sum);
static void quantize_q8_k(const float *x, int64_t n, uint8_t *y);
static const mq_quantizers quantizers_scalar = {quantize_f16, quantize_q8, quantize_q8_k};
static const mq_quantizers *quantizers = &quantizers_scalar;

static void init_once(void) {
    for (uint32_t h = 0; h < 65536; h++) mq_f16_table[h] = half_to_float((uint16_t)h);
    kernels = kernels_scalar;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    const mq_dot_fn *k = mq_kernels_avx2();
    if (k && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        kernels = k;
        rows_kernels = mq_rows_avx2();
        rows_batch = mq_rows_batch_avx2();
        gemv = mq_gemv_avx2() ? mq_gemv_avx2() : no_gemv;
        panels = mq_panels_avx2() ? mq_panels_avx2() : no_panels;
        quantizers = mq_quantizers_avx2() ? mq_quantizers_avx2() : &quantizers_scalar;
        isa = "avx2";
    }
#endif
    if (getenv("MINILLAMA_KERNELS") && strcmp(getenv("MINILLAMA_KERNELS"), "scalar") == 0) {
        kernels = kernels_scalar;
        rows_kernels = no_rows;
        rows_batch = no_rows;
        gemv = no_gemv;
        panels = no_panels;
        quantizers = &quantizers_scalar;
        isa = "scalar";
    }
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

/* ggml type number -> mq_type (ggml: F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q2_K 10 .. Q6_K 14,
 * BF16 30). */
static const struct { int ggml, block, size, partner_size, partner_block; } TYPES[MQ_NTYPES] = {
    [MQ_F32] = {0, 1, 4, 4, 1},        [MQ_F16] = {1, 1, 2, 2, 1},        [MQ_BF16] = {30, 1, 2, 2, 1},
    [MQ_Q4_0] = {2, 32, 18, 34, 32},   [MQ_Q4_1] = {3, 32, 20, 36, 32},   [MQ_Q5_0] = {6, 32, 22, 34, 32},
    [MQ_Q5_1] = {7, 32, 24, 36, 32},   [MQ_Q8_0] = {8, 32, 34, 34, 32},   [MQ_Q2_K] = {10, 256, 84, 292, 256},
    [MQ_Q3_K] = {11, 256, 110, 292, 256}, [MQ_Q4_K] = {12, 256, 144, 292, 256},
    [MQ_Q5_K] = {13, 256, 176, 292, 256}, [MQ_Q6_K] = {14, 256, 210, 292, 256},
};

int mq_type_of_ggml(int ggml_type) {
    for (int t = 0; t < MQ_NTYPES; t++)
        if (TYPES[t].ggml == ggml_type) return t;
    return -1;
}
int mq_block(int type) { return TYPES[type].block; }
int mq_type_size(int type) { return TYPES[type].size; }
int mq_partner_block(int type) { return TYPES[type].partner_block; }
const char *mq_isa(void) {
    pthread_once(&once, init_once);
    return isa;
}

/* ggml's x86 quantize_row_q8_0 / _q8_1: d = amax / 127, q = round-to-nearest-even(x * 127 / amax). A block
 * holding a NaN or an infinity is mq_nonfinite_q8's instead (quants_common.h). */
static void quantize_q8(const float *x, int64_t n, uint8_t *y, int with_sum) {
    const int size = with_sum ? 36 : 34, at = with_sum ? 4 : 2;
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32, y += size) {
        float amax = 0;
        int finite = 1;
        for (int j = 0; j < 32; j++) {
            const float ax = fabsf(x[j]);
            amax = ax > amax ? ax : amax; /* fmaxf, not a libm call */
            finite &= ax <= FLT_MAX;      /* false for an infinity and for a NaN */
        }
        if (!finite) {
            mq_nonfinite_q8(y, with_sum);
            continue;
        }
        const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = (int)nearbyintf(x[j] * id);
            y[at + j] = (uint8_t)(int8_t)q;
            sum += q;
        }
        uint16_t h = float_to_half(d);
        y[0] = (uint8_t)h, y[1] = (uint8_t)(h >> 8);
        if (with_sum) {
            h = float_to_half(d * (float)sum);
            y[2] = (uint8_t)h, y[3] = (uint8_t)(h >> 8);
        }
    }
}

/* ggml's quantize_row_q8_K_ref: iscale = -127 / (the value of largest magnitude), q = min(127, rint(iscale x)),
 * d = 1 / iscale, bsums the sums of 16. A block holding a NaN or an infinity is mq_nonfinite_q8_k's instead. */
static void quantize_q8_k(const float *x, int64_t n, uint8_t *y) {
    for (int64_t ib = 0; ib < n / 256; ib++, x += 256, y += 292) {
        float amax = 0, max = 0;
        int finite = 1;
        for (int j = 0; j < 256; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) amax = ax, max = x[j];
            finite &= ax <= FLT_MAX;
        }
        if (!finite) {
            mq_nonfinite_q8_k(y);
            continue;
        }
        memset(y, 0, 292);
        if (amax == 0.0f) continue;
        const float iscale = -127.f / max, d = 1 / iscale;
        for (int j = 0; j < 256; j++) {
            int v = (int)nearbyintf(iscale * x[j]);
            y[4 + j] = (uint8_t)(int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += (int8_t)y[4 + 16 * j + l];
            y[260 + 2 * j] = (uint8_t)s, y[261 + 2 * j] = (uint8_t)((uint16_t)s >> 8);
        }
        memcpy(y, &d, 4);
    }
}

static void quantize_f16(const float *x, int64_t n, uint8_t *y) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = float_to_half(x[i]);
        y[2 * i] = (uint8_t)h, y[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

static void quantize_partner(int type, const float *x, int64_t n, uint8_t *y) {
    switch (type) {
    case MQ_F32: memcpy(y, x, (size_t)n * 4); break;
    case MQ_F16: quantizers->f16(x, n, y); break;
    case MQ_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = f32_bits(x[i]);
            uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 64)
                                                         : (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
            y[2 * i] = (uint8_t)h, y[2 * i + 1] = (uint8_t)(h >> 8);
        }
        break;
    case MQ_Q4_1: case MQ_Q5_1: quantizers->q8(x, n, y, 1); break;
    case MQ_Q4_0: case MQ_Q5_0: case MQ_Q8_0: quantizers->q8(x, n, y, 0); break;
    default: quantizers->q8_k(x, n, y); break;
    }
}

typedef struct {
    mq_team_fn team; /* set: run team(ctx, part, parts), the rest unused */
    void *ctx;
    int part, parts;
    int type;
    const uint8_t *w, *y;
    size_t row_bytes, y_bytes;
    int64_t rows, cols, n_x, r0, r1;
    atomic_int *next; /* set: take chunks of `chunk` weight rows from this counter until none is left */
    int64_t chunk;
    float *out;
} job;

/* For the 32-value types' rows kernels: the block scales of n_x activation rows (y_bytes apart, partner blocks of
 * partner_size bytes) as float32, MQ_NRC rows a tile (quants_common.h's yf layout); NULL where not wanted or no
 * memory (the kernels then read the scales from y). */
static float *tile_scales(int type, const uint8_t *y, size_t y_bytes, int64_t cols, int64_t n_x) {
    if (type < MQ_Q4_0 || type > MQ_Q8_0 || n_x < 2) return NULL;
    const int64_t nb = cols / 32, tiles = (n_x + MQ_NRC - 1) / MQ_NRC;
    const int with_s = type == MQ_Q4_1 || type == MQ_Q5_1, psize = TYPES[type].partner_size;
    float *yf = calloc((size_t)(tiles * 2 * nb * MQ_NRC), sizeof(float));
    if (!yf) return NULL;
    for (int64_t t = 0; t < n_x; t++) {
        float *f = yf + (t / MQ_NRC) * 2 * nb * MQ_NRC + t % MQ_NRC;
        const uint8_t *yb = y + (size_t)t * y_bytes;
        for (int64_t b = 0; b < nb; b++, yb += psize) {
            f[b * MQ_NRC] = f16(ld_u16(yb));
            if (with_s) f[(nb + b) * MQ_NRC] = f16(ld_u16(yb + 2));
        }
    }
    return yf;
}

#define ROW_BLOCK 16

/* dot_range where the type has panel kernels: weight rows unpacked once into panel rows (up to ROW_BLOCK of them,
 * ~24 KB, so that they stay in L1 with a tile), then every tile of MQ_NRC activation rows against them two rows
 * at a time. 0 when the buffer cannot be had (the caller falls back to the rows kernel). */
static int dot_panels(const mq_panel *P, mq_panel_fn panel, int type, const uint8_t *w, size_t row_bytes,
                      const uint8_t *y, size_t y_bytes, int64_t cols, int64_t n_x, int64_t r0, int64_t r1, float *out,
                      int64_t out_stride, const float *yf) {
    const size_t rs = (P->row_bytes((int)cols) + 31) & ~(size_t)31;
    int64_t block = (int64_t)(24 * 1024 / rs) & ~(int64_t)1;
    block = block < 2 ? 2 : block > ROW_BLOCK ? ROW_BLOCK : block;
    uint8_t *buf = aligned_alloc(32, (size_t)block * rs);
    if (!buf) return 0;
    const size_t tile_f = (size_t)(cols / 32) * 2 * MQ_NRC;
    for (int64_t rb = r0; rb < r1; rb += block) {
        const int64_t nr = r1 - rb < block ? r1 - rb : block;
        for (int64_t k = 0; k < nr; k++) P->unpack(type, w + (size_t)(rb + k) * row_bytes, (int)cols, buf + k * rs);
        for (int64_t t = 0; t < n_x; t += MQ_NRC)
            for (int64_t k = 0; k < nr; k += 2)
                panel(type, buf + k * rs, rs, nr - k < 2 ? 1 : 2, y + (size_t)t * y_bytes, y_bytes, (int)cols,
                      (int)(n_x - t < MQ_NRC ? n_x - t : MQ_NRC), out + t * out_stride + rb + k, (size_t)out_stride,
                      yf ? yf + (size_t)(t / MQ_NRC) * tile_f : NULL);
    }
    free(buf);
    return 1;
}

/* Rows r0..r1 of w against n_x quantized activation rows (y_bytes apart): out[t * out_stride + r]. */
static void dot_range(int type, const uint8_t *w, size_t row_bytes, const uint8_t *y, size_t y_bytes, int64_t cols,
                      int64_t n_x, int64_t r0, int64_t r1, float *out, int64_t out_stride) {
    const mq_dot_fn dot = kernels[type];
    if (n_x == 1 && gemv[type]) {
        gemv[type](w + (size_t)r0 * row_bytes, row_bytes, r1 - r0, y, (int)cols, out + r0);
        return;
    }
    const int batch = n_x >= MQ_BATCH && rows_batch[type];
    const mq_dotn_fn dotn = batch ? rows_batch[type] : rows_kernels[type];
    /* the rows kernels' tile scales; a single activation row goes to the one-row kernel, which reads none */
    float *yf = dotn && n_x > 1 ? tile_scales(type, y, y_bytes, cols, n_x) : NULL;
    const size_t tile_f = (size_t)(cols / 32) * 2 * MQ_NRC;
    const mq_panel *P = &panels[type];
    const mq_panel_fn panel = batch ? P->panel_batch : P->panel;
    if (panel && n_x > MQ_NRC && (yf || !P->tile_scales) &&
        dot_panels(P, panel, type, w, row_bytes, y, y_bytes, cols, n_x, r0, r1, out, out_stride, yf)) {
        /* done: the weight rows unpacked once */
    } else if (dotn && n_x > 1) {
        /* ROW_BLOCK weight rows at a time against every tile of MQ_NRC activation rows: both stay in L1 */
        for (int64_t rb = r0; rb < r1; rb += ROW_BLOCK)
            for (int64_t t = 0; t < n_x; t += MQ_NRC)
                for (int64_t r = rb; r < r1 && r < rb + ROW_BLOCK; r++)
                    dotn(w + (size_t)r * row_bytes, y + (size_t)t * y_bytes, y_bytes, (int)cols,
                         (int)(n_x - t < MQ_NRC ? n_x - t : MQ_NRC), out + t * out_stride + r, (size_t)out_stride,
                         yf ? yf + (size_t)(t / MQ_NRC) * tile_f : NULL);
    } else
        for (int64_t r = r0; r < r1; r++)
            for (int64_t t = 0; t < n_x; t++)
                out[t * out_stride + r] = dot(w + (size_t)r * row_bytes, y + (size_t)t * y_bytes, (int)cols);
    free(yf);
}

static void *run_job(void *arg) {
    const job *j = arg;
    if (j->team)
        j->team(j->ctx, j->part, j->parts);
    else if (j->next)
        for (int64_t r0; (r0 = (int64_t)atomic_fetch_add_explicit(j->next, 1, memory_order_relaxed) * j->chunk) <
                         j->rows;)
            dot_range(j->type, j->w, j->row_bytes, j->y, j->y_bytes, j->cols, j->n_x, r0,
                      r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows, j->out, j->rows);
    else
        dot_range(j->type, j->w, j->row_bytes, j->y, j->y_bytes, j->cols, j->n_x, j->r0, j->r1, j->out, j->rows);
    return NULL;
}

#define MAX_THREADS 64
#define SMALL_PRODUCT (1 << 20)

/* Worker threads kept between products (a token step makes about 200 of them: creating threads for each cost
 * more than the small ones take). One product runs at a time (call); the caller does part 0 itself. */
static struct {
    pthread_mutex_t call, mu;
    pthread_cond_t work, done;
    int n_workers, pending, n_jobs;
    unsigned long gen;
    job *jobs;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, 0, 0, NULL};

static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg; /* runs part id + 1 */
    unsigned long seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.gen == seen) pthread_cond_wait(&pool.work, &pool.mu);
        seen = pool.gen;
        if (id + 1 < pool.n_jobs) {
            job *j = &pool.jobs[id + 1];
            pthread_mutex_unlock(&pool.mu);
            run_job(j);
            pthread_mutex_lock(&pool.mu);
            if (--pool.pending == 0) pthread_cond_signal(&pool.done);
        }
    }
    return NULL;
}

/* A forked child has none of the parent's workers: it starts its own. */
static void pool_after_fork(void) {
    pthread_mutex_init(&pool.call, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.work, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.n_workers = pool.pending = pool.n_jobs = 0;
}

static void register_fork(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

/* Starts pool workers until there are n - 1 (or none more can be started); the pool is locked (call, mu) on
 * return. Returns how many of n parts run at once: the caller and the workers. */
static int pool_lock(int n) {
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    pthread_once(&fork_once, register_fork);
    pthread_mutex_lock(&pool.call);
    pthread_mutex_lock(&pool.mu);
    while (pool.n_workers < n - 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void *)(intptr_t)pool.n_workers) != 0) break;
        pthread_detach(t);
        pool.n_workers++;
    }
    return n - 1 < pool.n_workers ? n : pool.n_workers + 1;
}

/* Runs jobs[0..spread) at once, jobs[0] on the caller, then jobs[spread..n) on the caller; unlocks the pool. */
static void pool_run(job *jobs, int spread, int n) {
    pool.jobs = jobs, pool.n_jobs = spread, pool.pending = spread - 1;
    pool.gen++;
    pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.mu);
    run_job(&jobs[0]);
    for (int i = spread; i < n; i++) run_job(&jobs[i]);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pool.n_jobs = 0;
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.call);
}

/* Runs jobs[0..n) on the caller and n - 1 pool workers (as many as could be started; the caller does the rest). */
static void run_parallel(job *jobs, int n) { pool_run(jobs, pool_lock(n), n); }

int mq_team(mq_team_fn fn, void *ctx, int threads) {
    pthread_once(&once, init_once);
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads == 1) {
        fn(ctx, 0, 1);
        return 1;
    }
    job jobs[MAX_THREADS];
    const int spread = pool_lock(threads);
    for (int i = 0; i < spread; i++) jobs[i] = (job){.team = fn, .ctx = ctx, .part = i, .parts = spread};
    pool_run(jobs, spread, spread);
    return spread;
}

void mq_init(void) { pthread_once(&once, init_once); }
float mq_round_f16(float f) { return mq_f16_table[float_to_half(f)]; }
uint16_t mq_half(float f) { return float_to_half(f); }
void mq_halves(const float *x, int64_t n, uint16_t *h) { quantizers->f16(x, n, (uint8_t *)h); }
float mq_half_float(uint16_t h) { return mq_f16_table[h]; }

size_t mq_partner_bytes(int type, int64_t cols) {
    return (size_t)(cols / TYPES[type].partner_block) * (size_t)TYPES[type].partner_size;
}

void mq_quantize_row(int type, const float *x, int64_t cols, uint8_t *y) {
    pthread_once(&once, init_once);
    quantize_partner(type, x, cols, y);
}

void mq_dot_rows(int type, const uint8_t *w, int64_t cols, const uint8_t *y, int64_t n_x, int64_t r0, int64_t r1,
                 float *out, int64_t out_stride) {
    pthread_once(&once, init_once);
    dot_range(type, w, (size_t)(cols / TYPES[type].block) * (size_t)TYPES[type].size, y, mq_partner_bytes(type, cols),
              cols, n_x, r0, r1, out, out_stride);
}

int mq_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n_x, float *out,
              int threads) {
    pthread_once(&once, init_once);
    const size_t y_bytes = mq_partner_bytes(type, cols);
    uint8_t *y = malloc(y_bytes * (size_t)n_x + 1);
    if (!y) return 0;
    for (int64_t t = 0; t < n_x; t++) quantize_partner(type, x + t * cols, cols, y + (size_t)t * y_bytes);
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > rows) threads = rows > 0 ? (int)rows : 1;
    /* Below about a million weights times activation rows, waking a worker costs more than it saves (SmolLM2's
     * attention projections: generation 54 -> 60 tok/s with two threads for the rest). */
    if ((double)rows * (double)cols * (double)n_x < (double)SMALL_PRODUCT) threads = 1;
    /* the rows in chunks from a shared counter (whole panels of ROW_BLOCK rows): a part the machine slows takes
     * fewer of them rather than keeping the others waiting; which part computes a row does not change its bits */
    job jobs[MAX_THREADS];
    atomic_int next;
    atomic_init(&next, 0);
    int64_t chunk = rows / ((int64_t)threads * 8);
    chunk = chunk < ROW_BLOCK ? ROW_BLOCK : (chunk + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
    for (int i = 0; i < threads; i++)
        jobs[i] = (job){.type = type, .w = w, .y = y,
                        .row_bytes = (size_t)(cols / TYPES[type].block) * (size_t)TYPES[type].size,
                        .y_bytes = y_bytes, .rows = rows, .cols = cols, .n_x = n_x, .r0 = rows * i / threads,
                        .r1 = rows * (i + 1) / threads, .out = out, .next = threads > 1 ? &next : NULL,
                        .chunk = chunk};
    if (threads == 1)
        run_job(&jobs[0]);
    else
        run_parallel(jobs, threads);
    free(y);
    return 1;
}
