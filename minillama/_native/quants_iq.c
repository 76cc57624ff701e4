/* The grid types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M against Q8_K, for both traits tables.
 *
 * A block (256 values) is unpacked into its signed integer values (a grid entry's magnitudes, its signs applied),
 * an integer scale per 16 values (2 ls + 1) and, for IQ1_S/IQ1_M, a delta sign per 8 values; the integer sums are
 * exact. The float terms are those of the kernel llama.cpp's CPU backend runs on an AVX2 machine for a row at that
 * place in a batch:
 * - below MQ_BATCH activation rows, ggml_vec_dot_<type>_q8_K's AVX2 form: eight int32 lanes per block (lane l:
 *   values 4l..4l+3 of every 32, each times its scale), fused with d x the activation's d into eight float lanes,
 *   summed as hsum_float_8 and times the type's constant (1/8, 1/4 or 1); IQ1_S adds 1/8 x its delta sums (one
 *   float chain), IQ1_M 1/8 x a second set of lanes;
 * - from MQ_BATCH rows on, its tiled kernel's: each block's whole integer sum (IQ1: 8 x the grid part plus the
 *   deltas) times d x the type's constant, fused with the activation's d into one chain.
 * The scalar table uses the same kernels (fmaf where ggml's AVX2 code fuses), so both give llama.cpp's bits. */
#include <math.h>

#include "quants_common.h"
#include "quants_iq.h"
#include "quants_iq1_grids.h"
#include "quants_iq_grids.h"

typedef struct {
    int8_t v[256];   /* the values as integers (the grid's magnitudes with their signs; IQ1: -1, 0, 1) */
    int8_t sc[16];   /* the integer scale of each 16 values */
    int8_t delta[32]; /* IQ1_S/IQ1_M: the delta sign (+1/-1) of each 8 values */
} iq_block;

static inline int grid_byte(uint64_t g, int j) { return (int)((g >> (8 * j)) & 0xFF); }

/* 8 values from a grid entry of 8 magnitudes and a sign byte (bit j set: value j negative). */
static inline void put8(int8_t *v, uint64_t g, unsigned signs) {
    for (int j = 0; j < 8; j++) {
        const int m = grid_byte(g, j);
        v[j] = (int8_t)((signs >> j) & 1 ? -m : m);
    }
}
/* 8 values from two grid entries of 4 magnitudes (IQ3). */
static inline void put4x2(int8_t *v, uint32_t g1, uint32_t g2, unsigned signs) {
    put8(v, (uint64_t)g1 | ((uint64_t)g2 << 32), signs);
}

/* Each unpacker: the block's values and scales into b, its float16 d as float32. */
static float unpack_iq2_xxs(const uint8_t *w, iq_block *b) {
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = w + 2 + 8 * g;
        const uint32_t s32 = ld_u32(q + 4);
        b->sc[2 * g] = b->sc[2 * g + 1] = (int8_t)(2 * (s32 >> 28) + 1);
        for (int l = 0; l < 4; l++)
            put8(b->v + 32 * g + 8 * l, mq_iq2xxs_grid[q[l]], mq_ksigns_iq2xs[(s32 >> (7 * l)) & 127]);
    }
    return f16(ld_u16(w));
}

static float unpack_iq2_xs(const uint8_t *w, iq_block *b) {
    for (int g = 0; g < 8; g++) {
        const uint8_t s = w[66 + g];
        b->sc[2 * g] = (int8_t)(2 * (s & 15) + 1), b->sc[2 * g + 1] = (int8_t)(2 * (s >> 4) + 1);
        for (int l = 0; l < 4; l++) {
            const uint16_t q = ld_u16(w + 2 + 2 * (4 * g + l));
            put8(b->v + 32 * g + 8 * l, mq_iq2xs_grid[q & 511], mq_ksigns_iq2xs[q >> 9]);
        }
    }
    return f16(ld_u16(w));
}

static float unpack_iq2_s(const uint8_t *w, iq_block *b) {
    const uint8_t *qs = w + 2, *signs = w + 34, *qh = w + 66, *scales = w + 74;
    for (int g = 0; g < 8; g++) {
        b->sc[2 * g] = (int8_t)(2 * (scales[g] & 15) + 1), b->sc[2 * g + 1] = (int8_t)(2 * (scales[g] >> 4) + 1);
        for (int l = 0; l < 4; l++)
            put8(b->v + 32 * g + 8 * l, mq_iq2s_grid[qs[4 * g + l] | ((qh[g] << (8 - 2 * l)) & 0x300)],
                 signs[4 * g + l]);
    }
    return f16(ld_u16(w));
}

static float unpack_iq3_xxs(const uint8_t *w, iq_block *b) {
    const uint8_t *qs = w + 2;
    for (int g = 0; g < 8; g++) {
        const uint32_t aux = ld_u32(w + 66 + 4 * g);
        b->sc[2 * g] = b->sc[2 * g + 1] = (int8_t)(2 * (aux >> 28) + 1);
        for (int l = 0; l < 4; l++)
            put4x2(b->v + 32 * g + 8 * l, mq_iq3xxs_grid[qs[8 * g + 2 * l]], mq_iq3xxs_grid[qs[8 * g + 2 * l + 1]],
                   mq_ksigns_iq2xs[(aux >> (7 * l)) & 127]);
    }
    return f16(ld_u16(w));
}

static float unpack_iq3_s(const uint8_t *w, iq_block *b) {
    const uint8_t *qs = w + 2, *qh = w + 66, *signs = w + 74, *scales = w + 106;
    for (int g = 0; g < 8; g++) {
        b->sc[2 * g] = b->sc[2 * g + 1] = (int8_t)(1 + 2 * ((scales[g / 2] >> (4 * (g & 1))) & 15));
        for (int l = 0; l < 4; l++)
            put4x2(b->v + 32 * g + 8 * l, mq_iq3s_grid[qs[8 * g + 2 * l] | ((qh[g] << (8 - 2 * l)) & 256)],
                   mq_iq3s_grid[qs[8 * g + 2 * l + 1] | ((qh[g] << (7 - 2 * l)) & 256)], signs[4 * g + l]);
    }
    return f16(ld_u16(w));
}

/* An IQ1 grid entry: 8 signed bytes (-1, 0, 1). */
static inline void put_iq1(int8_t *v, uint64_t g) {
    for (int j = 0; j < 8; j++) v[j] = (int8_t)(uint8_t)grid_byte(g, j);
}

static float unpack_iq1_s(const uint8_t *w, iq_block *b) {
    const uint8_t *qs = w + 2;
    for (int g = 0; g < 8; g++) {
        const uint16_t h = ld_u16(w + 34 + 2 * g);
        b->sc[2 * g] = b->sc[2 * g + 1] = (int8_t)(2 * ((h >> 12) & 7) + 1);
        for (int l = 0; l < 4; l++) {
            put_iq1(b->v + 32 * g + 8 * l, mq_iq1s_grid[qs[4 * g + l] | (((h >> (3 * l)) & 7) << 8)]);
            b->delta[4 * g + l] = (int8_t)(h & 0x8000 ? -1 : 1);
        }
    }
    return f16(ld_u16(w));
}

static float unpack_iq1_m(const uint8_t *w, iq_block *b) {
    const uint8_t *qs = w, *qh = w + 32;
    uint16_t sc[4];
    for (int k = 0; k < 4; k++) sc[k] = ld_u16(w + 48 + 2 * k);
    for (int g = 0; g < 8; g++) {
        const int shift = 6 * (g % 2);
        b->sc[2 * g] = (int8_t)(2 * ((sc[g / 2] >> shift) & 7) + 1);
        b->sc[2 * g + 1] = (int8_t)(2 * ((sc[g / 2] >> (shift + 3)) & 7) + 1);
        const unsigned h0 = qh[2 * g], h1 = qh[2 * g + 1];
        const unsigned idx[4] = {qs[4 * g] | ((h0 << 8) & 0x700), qs[4 * g + 1] | ((h0 << 4) & 0x700),
                                 qs[4 * g + 2] | ((h1 << 8) & 0x700), qs[4 * g + 3] | ((h1 << 4) & 0x700)};
        const unsigned dbit[4] = {h0 & 0x08, h0 & 0x80, h1 & 0x08, h1 & 0x80};
        for (int l = 0; l < 4; l++) {
            put_iq1(b->v + 32 * g + 8 * l, mq_iq1s_grid[idx[l]]);
            b->delta[4 * g + l] = (int8_t)(dbit[l] ? -1 : 1);
        }
    }
    return f16((uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)));
}

typedef float (*iq_unpack_fn)(const uint8_t *w, iq_block *b);
enum { IQ_GRID, IQ_1S, IQ_1M };
typedef struct {
    int size;            /* bytes per block */
    iq_unpack_fn unpack;
    float post;          /* vec_dot: the factor after hsum_float_8 (IQ1: of the deltas' sum) */
    float tile;          /* tiled kernel: the factor of d */
    int kind;
} iq_type;

/* ggml's eight int32 lanes of one block against a Q8_K block's quants: lane l holds values 4l..4l+3 of every 32,
 * each 4 times the scale of its 16. */
static inline void lanes(const iq_block *b, const int8_t *q8, int32_t L[8]) {
    for (int l = 0; l < 8; l++) L[l] = 0;
    for (int q = 0; q < 64; q++) {
        int s = 0;
        for (int k = 0; k < 4; k++) s += b->v[4 * q + k] * q8[4 * q + k];
        L[q & 7] += b->sc[q >> 2] * s;
    }
}
/* The same lanes of the deltas (IQ1): each 4 activations' sum times its delta sign and scale. */
static inline void delta_lanes(const iq_block *b, const int8_t *q8, int32_t L[8]) {
    for (int l = 0; l < 8; l++) L[l] = 0;
    for (int q = 0; q < 64; q++) {
        int s = 0;
        for (int k = 0; k < 4; k++) s += q8[4 * q + k];
        L[q & 7] += b->sc[q >> 2] * b->delta[q >> 1] * s;
    }
}

/* hsum_float_8: the two halves added, then pairs, then the last two. */
static inline float hsum8(const float a[8]) {
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

/* One weight row against one Q8_K row: ggml_vec_dot_<type>_q8_K's AVX2 float order. */
static float iq_dot(const iq_type *K, const uint8_t *w, const uint8_t *y, int n) {
    float acc[8] = {0}, acc2[8] = {0}, acc1 = 0;
    for (int ib = 0; ib < n / 256; ib++, w += K->size, y += 292) {
        iq_block b;
        const float d = K->unpack(w, &b) * ld_f32(y);
        const int8_t *q8 = (const int8_t *)(y + 4);
        int32_t L[8];
        lanes(&b, q8, L);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)L[l], acc[l]);
        if (K->kind == IQ_GRID) continue;
        int32_t D[8];
        delta_lanes(&b, q8, D);
        if (K->kind == IQ_1M)
            for (int l = 0; l < 8; l++) acc2[l] = fmaf(d, (float)D[l], acc2[l]);
        else
            acc1 = fmaf(d, (float)(D[0] + D[1] + D[2] + D[3] + D[4] + D[5] + D[6] + D[7]), acc1);
    }
    switch (K->kind) {
    case IQ_1S: return fmaf(K->post, acc1, hsum8(acc));
    case IQ_1M: return fmaf(K->post, hsum8(acc2), hsum8(acc));
    default: return K->post * hsum8(acc);
    }
}

/* nrc weight-row . activation-row products from MQ_BATCH rows on: the tiled kernel's one chain per row. */
static void iq_rows_batch(const iq_type *K, const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc,
                          float *out, size_t os) {
    float chain[MQ_NRC] = {0};
    for (int ib = 0; ib < n / 256; ib++, w += K->size, y += 292) {
        iq_block b;
        const float dt = K->unpack(w, &b) * K->tile;
        for (int r = 0; r < nrc; r++) {
            const uint8_t *yr = y + (size_t)r * ys;
            const int8_t *q8 = (const int8_t *)(yr + 4);
            int32_t L[8], s = 0;
            lanes(&b, q8, L);
            for (int l = 0; l < 8; l++) s += L[l];
            if (K->kind != IQ_GRID) {
                int32_t D[8];
                delta_lanes(&b, q8, D);
                s *= 8;
                for (int l = 0; l < 8; l++) s += D[l];
            }
            chain[r] = fmaf(dt * (float)s, ld_f32(yr), chain[r]);
        }
    }
    for (int r = 0; r < nrc; r++) out[(size_t)r * os] = chain[r];
}

#define IQ_TYPE(name, size, post, tile, kind)                                                                       \
    static const iq_type type_##name = {size, unpack_##name, post, tile, kind};                                   \
    float mq_dot_##name(const uint8_t *w, const uint8_t *y, int n) { return iq_dot(&type_##name, w, y, n); }      \
    void mq_rows_##name##_batch(const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc, float *out,        \
                                size_t os, const float *yf) {                                                     \
        (void)yf;                                                                                                   \
        iq_rows_batch(&type_##name, w, y, ys, n, nrc > MQ_NRC ? MQ_NRC : nrc, out, os);                             \
    }
IQ_TYPE(iq2_xxs, 66, 0.125f, 0.125f, IQ_GRID)
IQ_TYPE(iq2_xs, 74, 0.125f, 0.125f, IQ_GRID)
IQ_TYPE(iq2_s, 82, 0.125f, 0.125f, IQ_GRID)
IQ_TYPE(iq3_xxs, 98, 0.25f, 0.25f, IQ_GRID)
IQ_TYPE(iq3_s, 110, 1.0f, 1.0f, IQ_GRID)
IQ_TYPE(iq1_s, 50, 0.125f, 0.125f, IQ_1S)
IQ_TYPE(iq1_m, 56, 0.125f, 0.125f, IQ_1M)
#undef IQ_TYPE
