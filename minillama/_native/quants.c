/* Matrix products of ggml quantized weights with float32 activations, as ggml computes them (see quants.h):
 * the activation rows are quantized once per product to the weight type's partner, then each weight row's
 * blocks are dotted in place with every activation row (the row stays in cache across them), the rows split
 * over the pool's threads (threadpool.c). The scalar kernels (quants_kernels.h, compiled here) fill the scalar
 * table, the fallback; quants_avx2.c's table holds the same kernels for AVX2, used when cpu.c chooses it. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu.h"
#include "quants_common.h"
#include "quants_iq.h"
#include "threadpool.h"

float mq_f16_table[65536];

#define KNAME(name) name##_scalar
#include "quants_kernels.h"
#undef KNAME

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

static void quantize_f16(const float *x, int64_t n, uint8_t *y);
static void quantize_q8_0(const float *x, int64_t n, uint8_t *y);
static void quantize_q8_1(const float *x, int64_t n, uint8_t *y);
static void quantize_q8_k(const float *x, int64_t n, uint8_t *y);

/* The scalar kernels' table: one row per ggml type with kernels (quants.h). */
static const mq_traits scalar_traits[MQ_NTYPES] = {
    [MQ_F32] = {MQ_LAYOUT_F32, .quantize = mq_quantize_f32, .dot = dot_f32_scalar},
    [MQ_F16] = {MQ_LAYOUT_F16, .quantize = quantize_f16, .dot = dot_f16_scalar},
    [MQ_BF16] = {MQ_LAYOUT_BF16, .quantize = mq_quantize_bf16, .dot = dot_bf16_scalar},
    [MQ_Q4_0] = {MQ_LAYOUT_Q4_0, .quantize = quantize_q8_0, .dot = dot_q4_0_scalar},
    [MQ_Q4_1] = {MQ_LAYOUT_Q4_1, .quantize = quantize_q8_1, .dot = dot_q4_1_scalar},
    [MQ_Q5_0] = {MQ_LAYOUT_Q5_0, .quantize = quantize_q8_0, .dot = dot_q5_0_scalar},
    [MQ_Q5_1] = {MQ_LAYOUT_Q5_1, .quantize = quantize_q8_1, .dot = dot_q5_1_scalar},
    [MQ_Q8_0] = {MQ_LAYOUT_Q8_0, .quantize = quantize_q8_0, .dot = dot_q8_0_scalar},
    [MQ_Q2_K] = {MQ_LAYOUT_Q2_K, .quantize = quantize_q8_k, .dot = dot_q2_k_scalar},
    [MQ_Q3_K] = {MQ_LAYOUT_Q3_K, .quantize = quantize_q8_k, .dot = dot_q3_k_scalar},
    [MQ_Q4_K] = {MQ_LAYOUT_Q4_K, .quantize = quantize_q8_k, .dot = dot_q4_k_scalar},
    [MQ_Q5_K] = {MQ_LAYOUT_Q5_K, .quantize = quantize_q8_k, .dot = dot_q5_k_scalar},
    [MQ_Q6_K] = {MQ_LAYOUT_Q6_K, .quantize = quantize_q8_k, .dot = dot_q6_k_scalar},
    [MQ_IQ4_NL] = {MQ_LAYOUT_IQ4_NL, .quantize = quantize_q8_0, .dot = dot_iq4_nl_scalar},
    [MQ_IQ4_XS] = {MQ_LAYOUT_IQ4_XS, .quantize = quantize_q8_k, .dot = dot_iq4_xs_scalar},
    [MQ_MXFP4] = {MQ_LAYOUT_MXFP4, .quantize = quantize_q8_0, .dot = dot_mxfp4_scalar},
    [MQ_IQ2_XXS] = {MQ_LAYOUT_IQ2_XXS, .quantize = quantize_q8_k, .dot = mq_dot_iq2_xxs,
                    .rows_batch = mq_rows_iq2_xxs_batch},
    [MQ_IQ2_XS] = {MQ_LAYOUT_IQ2_XS, .quantize = quantize_q8_k, .dot = mq_dot_iq2_xs,
                   .rows_batch = mq_rows_iq2_xs_batch},
    [MQ_IQ2_S] = {MQ_LAYOUT_IQ2_S, .quantize = quantize_q8_k, .dot = mq_dot_iq2_s,
                  .rows_batch = mq_rows_iq2_s_batch},
    [MQ_IQ3_XXS] = {MQ_LAYOUT_IQ3_XXS, .quantize = quantize_q8_k, .dot = mq_dot_iq3_xxs,
                    .rows_batch = mq_rows_iq3_xxs_batch},
    [MQ_IQ3_S] = {MQ_LAYOUT_IQ3_S, .quantize = quantize_q8_k, .dot = mq_dot_iq3_s,
                  .rows_batch = mq_rows_iq3_s_batch},
    [MQ_IQ1_S] = {MQ_LAYOUT_IQ1_S, .quantize = quantize_q8_k, .dot = mq_dot_iq1_s,
                  .rows_batch = mq_rows_iq1_s_batch},
    [MQ_IQ1_M] = {MQ_LAYOUT_IQ1_M, .quantize = quantize_q8_k, .dot = mq_dot_iq1_m,
                  .rows_batch = mq_rows_iq1_m_batch},
};

/* The chosen instruction set's table (cpu.c), set once by init_once. */
static const mq_traits *table = scalar_traits;

static void init_once(void) {
    for (uint32_t h = 0; h < 65536; h++) mq_f16_table[h] = half_to_float((uint16_t)h);
    if (mq_cpu_isa() == MQ_ISA_AVX2 && mq_traits_avx2()) table = mq_traits_avx2();
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

const mq_traits *mq_traits_of(int ggml_type) {
    pthread_once(&once, init_once);
    return ggml_type >= 0 && ggml_type < MQ_NTYPES && table[ggml_type].dot ? &table[ggml_type] : NULL;
}

int mq_type_of_ggml(int ggml_type) { return mq_traits_of(ggml_type) ? ggml_type : -1; }
int mq_block(int type) { return table[type].block; }
int mq_type_size(int type) { return table[type].size; }
int mq_partner_block(int type) { return table[type].partner_block; }
const char *mq_isa(void) {
    pthread_once(&once, init_once);
    return table == scalar_traits ? "scalar" : "avx2";
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

static void quantize_q8_0(const float *x, int64_t n, uint8_t *y) { quantize_q8(x, n, y, 0); }
static void quantize_q8_1(const float *x, int64_t n, uint8_t *y) { quantize_q8(x, n, y, 1); }

void mq_quantize_f32(const float *x, int64_t n, uint8_t *y) { memcpy(y, x, (size_t)n * 4); }

void mq_quantize_bf16(const float *x, int64_t n, uint8_t *y) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = f32_bits(x[i]);
        uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 64)
                                                     : (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
        y[2 * i] = (uint8_t)h, y[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

/* For the rows kernels that read them (tile_scales): the block scales of n_x activation rows (y_bytes apart,
 * partner blocks of partner_size bytes) as float32, MQ_NRC rows a tile (quants.h's yf layout); NULL where not
 * wanted or no memory (the kernels then read the scales from y). */
static float *tile_scales(const mq_traits *T, const uint8_t *y, size_t y_bytes, int64_t cols, int64_t n_x) {
    if (!T->tile_scales || n_x < 2) return NULL;
    const int64_t nb = cols / 32, tiles = (n_x + MQ_NRC - 1) / MQ_NRC;
    const int with_s = T->partner == MQ_Q8_1, psize = T->partner_size;
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

/* dot_range where the type has gemm kernels: MQ_GEMM_ROWS weight rows at a time packed side by side (one panel,
 * a few tens of KB, in L1/L2 while every tile of MQ_NRC activation rows runs against it). 0 when the buffer cannot
 * be had (the caller falls back to the panels or rows kernels). */
static int dot_gemm(const mq_gemm *G, mq_gemm_fn kernel, const uint8_t *w, size_t row_bytes, const uint8_t *y,
                    size_t y_bytes, int64_t cols, int64_t n_x, int64_t r0, int64_t r1, float *out,
                    int64_t out_stride) {
    uint8_t *buf = aligned_alloc(32, (G->panel_bytes((int)cols) + 31) & ~(size_t)31);
    if (!buf) return 0;
    for (int64_t rb = r0; rb < r1; rb += MQ_GEMM_ROWS) {
        const int nw = (int)(r1 - rb < MQ_GEMM_ROWS ? r1 - rb : MQ_GEMM_ROWS);
        G->pack(w + (size_t)rb * row_bytes, row_bytes, nw, (int)cols, buf);
        for (int64_t t = 0; t < n_x; t += MQ_NRC)
            kernel(buf, (int)cols, y + (size_t)t * y_bytes, y_bytes, (int)(n_x - t < MQ_NRC ? n_x - t : MQ_NRC),
                   out + t * out_stride + rb, (size_t)out_stride, nw);
    }
    free(buf);
    return 1;
}

/* Rows r0..r1 of w against n_x quantized activation rows (y_bytes apart): out[t * out_stride + r]. */
static void dot_range(int type, const uint8_t *w, size_t row_bytes, const uint8_t *y, size_t y_bytes, int64_t cols,
                      int64_t n_x, int64_t r0, int64_t r1, float *out, int64_t out_stride) {
    const mq_traits *T = &table[type];
    if (n_x == 1 && T->gemv) {
        T->gemv(w + (size_t)r0 * row_bytes, row_bytes, r1 - r0, y, (int)cols, out + r0);
        return;
    }
    const int batch = n_x >= MQ_BATCH && T->rows_batch;
    const mq_gemm_fn gemm = batch ? T->gemm.kernel_batch : T->gemm.kernel;
    if (gemm && n_x > MQ_NRC &&
        dot_gemm(&T->gemm, gemm, w, row_bytes, y, y_bytes, cols, n_x, r0, r1, out, out_stride))
        return; /* done: the weight rows packed once */
    const mq_dotn_fn dotn = batch ? T->rows_batch : T->rows;
    /* the rows kernels' tile scales; a single activation row goes to the one-row kernel, which reads none */
    float *yf = dotn && n_x > 1 ? tile_scales(T, y, y_bytes, cols, n_x) : NULL;
    const size_t tile_f = (size_t)(cols / 32) * 2 * MQ_NRC;
    const mq_panel *P = &T->panel;
    const mq_panel_fn panel = batch ? P->panel_batch : P->panel;
    if (panel && n_x > MQ_NRC && (yf || !T->tile_scales) &&
        dot_panels(P, panel, type, w, row_bytes, y, y_bytes, cols, n_x, r0, r1, out, out_stride, yf)) {
        /* done: the weight rows unpacked once */
    } else if (dotn && n_x > 1) {
        /* ROW_BLOCK weight rows at a time against every tile of MQ_NRC activation rows: both stay in L1 */
        const mq_rows2_fn rows2 = dotn == T->rows && yf ? T->rows2 : NULL; /* two weight rows a call */
        for (int64_t rb = r0; rb < r1; rb += ROW_BLOCK)
            for (int64_t t = 0; t < n_x; t += MQ_NRC) {
                const int nrc = (int)(n_x - t < MQ_NRC ? n_x - t : MQ_NRC);
                const float *yft = yf ? yf + (size_t)(t / MQ_NRC) * tile_f : NULL;
                int64_t r = rb;
                const int64_t end = r1 < rb + ROW_BLOCK ? r1 : rb + ROW_BLOCK;
                if (rows2)
                    for (; r + 2 <= end; r += 2)
                        rows2(w + (size_t)r * row_bytes, row_bytes, y + (size_t)t * y_bytes, y_bytes, (int)cols, nrc,
                              out + t * out_stride + r, (size_t)out_stride, yft);
                for (; r < end; r++)
                    dotn(w + (size_t)r * row_bytes, y + (size_t)t * y_bytes, y_bytes, (int)cols, nrc,
                         out + t * out_stride + r, (size_t)out_stride, yft);
            }
    } else
        for (int64_t r = r0; r < r1; r++)
            for (int64_t t = 0; t < n_x; t++)
                out[t * out_stride + r] = T->dot(w + (size_t)r * row_bytes, y + (size_t)t * y_bytes, (int)cols);
    free(yf);
}

/* One product over a team: a single part does every row; several take chunks of `chunk` weight rows (whole
 * panels of ROW_BLOCK rows) from a shared counter until none is left, so that a part the machine slows takes fewer
 * of them rather than keeping the others waiting. Which part computes a row does not change its bits. */
typedef struct {
    int type;
    const uint8_t *w, *y;
    size_t row_bytes, y_bytes;
    int64_t rows, cols, n_x, chunk;
    atomic_int next;
    float *out;
} product;

static void product_part(void *ctx, int part, int parts) {
    product *p = ctx;
    (void)part;
    if (parts == 1) {
        dot_range(p->type, p->w, p->row_bytes, p->y, p->y_bytes, p->cols, p->n_x, 0, p->rows, p->out, p->rows);
        return;
    }
    for (int64_t r0; (r0 = (int64_t)atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed) * p->chunk) <
                     p->rows;)
        dot_range(p->type, p->w, p->row_bytes, p->y, p->y_bytes, p->cols, p->n_x, r0,
                  r0 + p->chunk < p->rows ? r0 + p->chunk : p->rows, p->out, p->rows);
}

#define SMALL_PRODUCT (1 << 20)

void mq_init(void) { pthread_once(&once, init_once); }
float mq_round_f16(float f) { return mq_f16_table[float_to_half(f)]; }
uint16_t mq_half(float f) { return float_to_half(f); }
void mq_halves(const float *x, int64_t n, uint16_t *h) { table[MQ_F16].quantize(x, n, (uint8_t *)h); }
float mq_half_float(uint16_t h) { return mq_f16_table[h]; }

size_t mq_partner_bytes(int type, int64_t cols) {
    return (size_t)(cols / table[type].partner_block) * (size_t)table[type].partner_size;
}

void mq_quantize_row(int type, const float *x, int64_t cols, uint8_t *y) {
    pthread_once(&once, init_once);
    table[type].quantize(x, cols, y);
}

void mq_dot_rows(int type, const uint8_t *w, int64_t cols, const uint8_t *y, int64_t n_x, int64_t r0, int64_t r1,
                 float *out, int64_t out_stride) {
    pthread_once(&once, init_once);
    dot_range(type, w, (size_t)(cols / table[type].block) * (size_t)table[type].size, y,
              mq_partner_bytes(type, cols), cols, n_x, r0, r1, out, out_stride);
}

int mq_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n_x, float *out,
              int threads) {
    pthread_once(&once, init_once);
    const size_t y_bytes = mq_partner_bytes(type, cols);
    uint8_t *y = malloc(y_bytes * (size_t)n_x + 1);
    if (!y) return 0;
    for (int64_t t = 0; t < n_x; t++) table[type].quantize(x + t * cols, cols, y + (size_t)t * y_bytes);
    if (threads < 1) threads = 1;
    if (threads > MQ_MAX_THREADS) threads = MQ_MAX_THREADS;
    if (threads > rows) threads = rows > 0 ? (int)rows : 1;
    /* Below about a million weights times activation rows, waking a worker costs more than it saves (SmolLM2's
     * attention projections: generation 54 -> 60 tok/s with two threads for the rest). */
    if ((double)rows * (double)cols * (double)n_x < (double)SMALL_PRODUCT) threads = 1;
    int64_t chunk = rows / ((int64_t)threads * 8);
    chunk = chunk < ROW_BLOCK ? ROW_BLOCK : (chunk + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
    product p = {.type = type, .w = w, .y = y,
                 .row_bytes = (size_t)(cols / table[type].block) * (size_t)table[type].size, .y_bytes = y_bytes, .rows = rows, .cols = cols, .n_x = n_x, .chunk = chunk, .out = out};
    atomic_init(&p.next, 0);
    mq_team(product_part, &p, threads);
    free(y);
    return 1;
}
