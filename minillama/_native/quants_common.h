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

/* A prompt's product over a 32-value block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with its weight rows unpacked once
 * rather than once per tile of activation rows. mq_unpack_fn: weight row w (n values) as n quant bytes q (signed,
 * or for Q4_1/Q5_1 unsigned) and per block its scale dm[b] and (Q4_1/Q5_1) min dm[n / 32 + b] as floats.
 * mq_panel_fn: nw (1..2) such unpacked rows (q_stride bytes and 2 n / 32 floats of dm apart) against nrc
 * (1..MQ_NRC) activation rows with their tile scales yf (mq_dotn_fn's): out[i * out_stride + k] = weight row k's
 * dot with row i, the same float operations as the rows kernel, so the same bits. */
typedef void (*mq_unpack_fn)(int type, const uint8_t *w, int n, int8_t *q, float *dm);
typedef void (*mq_panel_fn)(int type, const int8_t *q, const float *dm, size_t q_stride, int nw, const uint8_t *y,
                            size_t y_stride, int n, int nrc, float *out, size_t out_stride, const float *yf);

#endif
