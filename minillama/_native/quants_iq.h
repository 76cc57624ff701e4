/* Kernels of the grid types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M against Q8_K (quants_iq.c),
 * one set in portable C for both traits tables: each gives the bits of the kernel llama.cpp's CPU backend runs
 * on an AVX2 machine (see quants_iq.c). */
#ifndef MINILLAMA_QUANTS_IQ_H
#define MINILLAMA_QUANTS_IQ_H

#include <stddef.h>
#include <stdint.h>

#define MQ_IQ_KERNELS(name)                                                                                         \
    float mq_dot_##name(const uint8_t *w, const uint8_t *y, int n);                                                \
    void mq_rows_##name##_batch(const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc, float *out,         \
                                size_t os, const float *yf);
MQ_IQ_KERNELS(iq2_xxs)
MQ_IQ_KERNELS(iq2_xs)
MQ_IQ_KERNELS(iq2_s)
MQ_IQ_KERNELS(iq3_xxs)
MQ_IQ_KERNELS(iq3_s)
MQ_IQ_KERNELS(iq1_s)
MQ_IQ_KERNELS(iq1_m)
#undef MQ_IQ_KERNELS

#endif
