/* Little-endian loads and the float16/bfloat16 widening shared by quants.c and quants_avx2.c (the kernels of
 * quants_kernels.h read weight bytes straight from the memory-mapped file, at any alignment). */
#ifndef MINILLAMA_QUANTS_COMMON_H
#define MINILLAMA_QUANTS_COMMON_H

#include <stdint.h>
#include <string.h>

#include "quants.h"

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

/* Kernels a table may leave out (quants_kernels.h is compiled for both tables; the AVX2 one replaces some). */
#define MQ_MAYBE_UNUSED __attribute__((unused))

/* The scalar partners both tables use: F32 (the values themselves) and BF16 (ggml's GGML_FP32_TO_BF16). */
void mq_quantize_f32(const float *x, int64_t n, uint8_t *y);
void mq_quantize_bf16(const float *x, int64_t n, uint8_t *y);

/* An activation block holding a NaN or an infinity: llama.cpp's quantizers have no one answer for it
 * (quantize_row_q8_K skips a NaN when it picks the scale and rounds it to 0; the AVX2 quantize_row_q8_0 keeps or
 * loses it by where it sits), so minillama quantizes such a block with a NaN scale (and block_q8_1's sum NaN) and
 * zero quants: every product with it is NaN, which the forward pass reports, and no non-finite float is ever
 * converted to an integer. tests/support/quant_reference.py makes the same bytes. */
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
