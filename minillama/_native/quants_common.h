/* Little-endian loads and the float16/bfloat16 widening shared by quants.c and quants_avx2.c (the kernels of
 * quants_kernels.h read weight bytes straight from the memory-mapped file, at any alignment). */
#ifndef MINILLAMA_QUANTS_COMMON_H
#define MINILLAMA_QUANTS_COMMON_H

#include <stdint.h>
#include <string.h>

#include "core.h"

/* float16 -> float32 of every bit pattern, filled once by mq_init (quants.c). */
extern float mq_f16_table[65536];

static inline uint16_t ld_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline int16_t ld_i16(const uint8_t *p) { return (int16_t)ld_u16(p); }
static inline uint32_t ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline float ld_f32(const uint8_t *p) {
    uint32_t u = ld_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float f16(uint16_t h) { return mq_f16_table[h]; }
static inline float bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef float (*mq_dot_fn)(const uint8_t *w, const uint8_t *y, int n);

/* One weight row against nrc (1..MQ_NRC) activation rows at once (row j at y + j * y_stride): out[j * out_stride]
 * = the row's dot with row j. The weight blocks are unpacked once for all nrc rows (a prompt's product). yf: for
 * the 32-value types, the rows' block scales as float32, made once per product (mq_tile_scales: block b's d of
 * row j at yf[b * MQ_NRC + j], Q8_1's s at yf[(n / 32 + b) * MQ_NRC + j]); NULL: read from y. */
#define MQ_NRC 4
typedef void (*mq_dotn_fn)(const uint8_t *w, const uint8_t *y, size_t y_stride, int n, int nrc, float *out,
                           size_t out_stride, const float *yf);

/* A matrix of rows weight rows (row_bytes apart) against one activation row y: out[r] = row r's dot with y, with
 * the bits of the type's one-row kernel (a decode step's products, several weight rows at a time). */
typedef void (*mq_gemv_fn)(const uint8_t *w, size_t row_bytes, int64_t rows, const uint8_t *y, int n, float *out);
/* A prompt's product with each weight row unpacked once rather than once per tile of activation rows (Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0 and Q4_K on AVX2). A panel row is one weight row of n values unpacked into
 * mq_panel.row_bytes(n) bytes (the quants as bytes, the block scales as floats). panel: nw (1..2) panel rows
 * (row_stride bytes apart) against nrc (1..MQ_NRC) activation rows (y_stride apart; yf their tile scales, as for
 * mq_dotn_fn): out[i * out_stride + k] = panel row k's dot with activation row i, by the same float operations as
 * the type's rows kernel, so with the same bits. tile_scales: the kernel reads yf (the 32-value types). */
typedef void (*mq_panel_fn)(int type, const uint8_t *rows, size_t row_stride, int nw, const uint8_t *y,
                            size_t y_stride, int n, int nrc, float *out, size_t out_stride, const float *yf);
typedef struct {
    int tile_scales;
    size_t (*row_bytes)(int n);
    void (*unpack)(int type, const uint8_t *w, int n, uint8_t *row);
    mq_panel_fn panel;
    mq_panel_fn panel_batch; /* the MQ_BATCH form where the type has one (else NULL) */
} mq_panel;

/* From MQ_BATCH activation rows on, llama.cpp's CPU backend multiplies Q5_K and Q6_K matrices (which it does not
 * repack on AVX2) with its tiled kernels, which add each block's whole integer sum times the weight's d (less
 * dmin times the mins' sum) into one float chain, by the activation's d. The rows kernels of that form
 * (mq_rows_batch_avx2) are used from that many rows on, so a prompt's rows get the bits llama.cpp gives them. */
#define MQ_BATCH 8

/* An activation row quantized to its partner (quants.c: the scalar ones; quants_avx2.c: the same bits in SIMD).
 * f16: n values to float16 (F16 weights' partner, and the key/value cache); q8: blocks of 32 to Q8_0 (34 bytes)
 * or with_sum Q8_1 (36 bytes); q8_k: blocks of 256 to Q8_K (292 bytes). */
typedef struct {
    void (*f16)(const float *x, int64_t n, uint8_t *y);
    void (*q8)(const float *x, int64_t n, uint8_t *y, int with_sum);
    void (*q8_k)(const float *x, int64_t n, uint8_t *y);
} mq_quantizers;

/* An activation block holding a NaN or an infinity: llama.cpp's quantizers have no one answer for it
 * (quantize_row_q8_K skips a NaN when it picks the scale and rounds it to 0; the AVX2 quantize_row_q8_0 keeps or
 * loses it by where it sits), so minillama quantizes such a block with a NaN scale (and block_q8_1's sum NaN) and
 * zero quants: every product with it is NaN, which the forward pass reports, and no non-finite float is ever
 * converted to an integer. minillama/quants.py makes the same bytes. */
#define MQ_HALF_NAN 0x7E00u
static inline void mq_nonfinite_q8(uint8_t *y, int with_sum) {
    memset(y, 0, with_sum ? 36 : 34);
    y[0] = (uint8_t)MQ_HALF_NAN, y[1] = (uint8_t)(MQ_HALF_NAN >> 8);
    if (with_sum) y[2] = y[0], y[3] = y[1];
}
static inline void mq_nonfinite_q8_k(uint8_t *y) {
    const uint32_t nan_bits = 0x7FC00000u; /* float32 quiet NaN, as numpy's */
    memset(y, 0, 292);
    memcpy(y, &nan_bits, 4);
}

#endif
