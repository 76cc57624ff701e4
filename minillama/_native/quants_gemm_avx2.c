/* The integer GEMM of a prompt's products (mq_gemm, quants.h) for quants_avx2.c's table: MQ_GEMM_ROWS = 8 weight
 * rows packed side by side, so that one register holds four values of each of the eight rows (row k in int32 lane
 * k) and one multiply-add of unsigned quants by a broadcast group of four activation bytes serves eight outputs.
 * The micro-kernel takes a tile of up to MQ_NRC activation rows against a panel: 4 x 8 outputs, their int16 sums
 * kept in four registers over a 32-value sub-block, then scaled into int32. The integer sums are exact (in any
 * order); the float operations per (weight row, activation row) are those of the type's rows kernel in
 * quants_avx2.c, done in the eight lanes side by side, so each output has the bits llama.cpp gives it.
 *
 * Q4_K: per 256-value block, sub-block k (32 values) of the eight rows as 8 groups of 32 bytes (group g: values
 * 4g..4g+3 of row 0, then of row 1, ...), the quants as bytes (0..15); then per sub-block the eight rows' scales
 * (each twice, as an int16 pair), per 64-value part j the rows' mins of sub-blocks 2j and 2j + 1 (an int16 pair),
 * the rows' d and dmin as floats. Eight products of a quant (<= 15) and an activation byte (|q8| <= 127) sum to
 * at most 15240 in int16, so the sums of a sub-block (eight groups of two pairs: 16 products a lane) reach
 * 30480: exact. */
#include <math.h>

#include "cpu.h"
#include "quants_common.h"

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O3", "fp-contract=off")
#include <immintrin.h>

#include "quants_avx2.h"

/* Where a Q4_K panel block's parts start (bytes), and its size. */
enum { Q4K_SC = 2048, Q4K_MN = Q4K_SC + 8 * 32, Q4K_D = Q4K_MN + 4 * 32, Q4K_DMIN = Q4K_D + 32, Q4K_PB = Q4K_DMIN + 32 };

size_t mq_panel_bytes_q4_k_avx2(int n) { return (size_t)(n / 256) * Q4K_PB; }

/* Four bytes at p in all eight int32 lanes. */
static inline __m256i bcast4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* 16 bytes at p in both 128-bit halves (a load: no shuffle), and its four-byte group i in every int32 lane (one
 * in-lane shuffle: a broadcast from memory costs a shuffle too, and one group of 16 bytes serves four). */
static inline __m256i bcast16(const uint8_t *p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
}
/* The shuffle wants an immediate: i is a constant wherever the loops are unrolled (the switch folds away), but not
 * in an -O1 build (the sanitizer run), where the switch picks one. */
static inline __m256i splat4(__m256i v, int i) {
    switch (i & 3) {
    case 0: return _mm256_shuffle_epi32(v, 0x00);
    case 1: return _mm256_shuffle_epi32(v, 0x55);
    case 2: return _mm256_shuffle_epi32(v, 0xAA);
    default: return _mm256_shuffle_epi32(v, 0xFF);
    }
}

/* An 8 x 8 transpose of int32 lanes: lane g of r[k] goes to lane k of r[g]. */
static inline void transpose8(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) /* rows 0-3 (h = 0) or 4-7: u[4h + c] holds their lanes c and c + 4 */
        for (int c = 0; c < 2; c++) {
            u[4 * h + 2 * c] = _mm256_unpacklo_epi64(t[4 * h + c], t[4 * h + 2 + c]);
            u[4 * h + 2 * c + 1] = _mm256_unpackhi_epi64(t[4 * h + c], t[4 * h + 2 + c]);
        }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        r[c + 4] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
}

void mq_pack_q4_k_avx2(const uint8_t *w, size_t rb, int nw, int n, uint8_t *panel) {
    const int nb = n / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int ib = 0; ib < nb; ib++) {
        uint8_t *pb = panel + (size_t)ib * Q4K_PB;
        uint32_t *sc = (uint32_t *)(pb + Q4K_SC), *mn = (uint32_t *)(pb + Q4K_MN);
        float *d = (float *)(pb + Q4K_D), *dmin = (float *)(pb + Q4K_DMIN);
        const uint8_t *src[8];
        for (int k = 0; k < 8; k++) {
            src[k] = w + (size_t)(k < nw ? k : nw - 1) * rb + (size_t)ib * 144;
            uint8_t s8[16];
            _mm_storeu_si128((__m128i *)s8, kscales_x(src[k] + 4));
            for (int s = 0; s < 8; s++) sc[8 * s + k] = (uint32_t)s8[s] * 0x10001u;
            for (int j = 0; j < 4; j++) mn[8 * j + k] = (uint32_t)s8[8 + 2 * j] | (uint32_t)s8[9 + 2 * j] << 16;
            d[k] = h2f(ld_u16(src[k])), dmin[k] = h2f(ld_u16(src[k] + 2));
        }
        for (int j = 0; j < 4; j++) /* part j: sub-blocks 2j (low nibbles) and 2j + 1 (high) */
            for (int h = 0; h < 2; h++) {
                __m256i r[8];
                for (int k = 0; k < 8; k++) {
                    const __m256i v = load32(src[k] + 16 + 32 * j);
                    r[k] = _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, low4);
                }
                transpose8(r);
                for (int g = 0; g < 8; g++) _mm256_storeu_si256((__m256i *)(pb + 256 * (2 * j + h) + 32 * g), r[g]);
            }
    }
}

/* A panel of Q4_K against nrc activation rows, as q45_k_rows / q4k_panel sum each pair: a full tile of four rows
 * part by part (q4k_tile: for each 64-value part a fused step of d x the activation's d, the mins likewise), fewer
 * rows each block's whole sums (q4k_whole); out = the sums' chain less the mins' chain. */
static inline __attribute__((always_inline)) void q4k_gemm(const uint8_t *panel, int n, const uint8_t *y, size_t ys,
                                                           const int nrc, float *out, size_t os, int nw) {
    const int nb = n / 256, tile = nrc == MQ_NRC;
    __m256 acc[MQ_NRC], accm[MQ_NRC];
    for (int r = 0; r < nrc; r++) acc[r] = _mm256_setzero_ps(), accm[r] = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *pb = panel + (size_t)ib * Q4K_PB, *yb = y + (size_t)ib * 292;
        const __m256 dw = _mm256_loadu_ps((const float *)(pb + Q4K_D)), mw = _mm256_loadu_ps((const float *)(pb + Q4K_DMIN));
        __m256 d[MQ_NRC], dm[MQ_NRC];
        int32_t pairs[MQ_NRC][4]; /* the activation's sums of the sub-blocks of part j as an int16 pair */
        for (int r = 0; r < nrc; r++) {
            const uint8_t *yr = yb + (size_t)r * ys;
            const __m256 yd = _mm256_set1_ps(ld_f32(yr));
            d[r] = _mm256_mul_ps(dw, yd), dm[r] = _mm256_mul_ps(mw, yd);
            _mm_storeu_si128((__m128i *)pairs[r], _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)(yr + 260)),
                                                                  _mm_loadu_si128((const __m128i *)(yr + 276))));
        }
        __m256i whole[MQ_NRC], wholem[MQ_NRC];
        for (int j = 0; j < 4; j++) {
            __m256i s32[MQ_NRC];
            for (int h = 0; h < 2; h++) {
                const int k = 2 * j + h;
                const uint8_t *q = pb + 256 * k, *a = yb + 4 + 32 * k;
                __m256i s16[MQ_NRC];
                for (int gh = 0; gh < 2; gh++) { /* groups 4gh..4gh + 3: 16 activation bytes in both halves */
                    __m256i av[MQ_NRC];
                    for (int r = 0; r < nrc; r++) av[r] = bcast16(a + (size_t)r * ys + 16 * gh);
                    for (int gi = 0; gi < 4; gi++) {
                        const __m256i wq = load32(q + 32 * (4 * gh + gi));
                        for (int r = 0; r < nrc; r++) {
                            const __m256i p = _mm256_maddubs_epi16(wq, splat4(av[r], gi));
                            s16[r] = gh || gi ? _mm256_add_epi16(s16[r], p) : p;
                        }
                    }
                }
                const __m256i sc = load32(pb + Q4K_SC + 32 * k);
                for (int r = 0; r < nrc; r++) {
                    const __m256i t = _mm256_madd_epi16(s16[r], sc);
                    s32[r] = h ? _mm256_add_epi32(s32[r], t) : t;
                }
            }
            const __m256i mn = load32(pb + Q4K_MN + 32 * j);
            for (int r = 0; r < nrc; r++) {
                const __m256i m = _mm256_madd_epi16(mn, _mm256_set1_epi32(pairs[r][j]));
                if (tile) {
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[r]), d[r], acc[r]);
                    accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dm[r], accm[r]);
                } else
                    whole[r] = j ? _mm256_add_epi32(whole[r], s32[r]) : s32[r],
                    wholem[r] = j ? _mm256_add_epi32(wholem[r], m) : m;
            }
        }
        if (!tile)
            for (int r = 0; r < nrc; r++) {
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(whole[r]), d[r], acc[r]);
                accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wholem[r]), dm[r], accm[r]);
            }
    }
    for (int r = 0; r < nrc; r++) {
        const __m256 v = _mm256_sub_ps(acc[r], accm[r]);
        if (nw == MQ_GEMM_ROWS) {
            _mm256_storeu_ps(out + (size_t)r * os, v);
        } else {
            float o[8];
            _mm256_storeu_ps(o, v);
            for (int k = 0; k < nw; k++) out[(size_t)r * os + k] = o[k];
        }
    }
}

void mq_gemm_q4_k_avx2(const uint8_t *panel, int n, const uint8_t *y, size_t ys, int nrc, float *out, size_t os,
                       int nw) {
    switch (nrc) {
    case 1: q4k_gemm(panel, n, y, ys, 1, out, os, nw); break;
    case 2: q4k_gemm(panel, n, y, ys, 2, out, os, nw); break;
    case 3: q4k_gemm(panel, n, y, ys, 3, out, os, nw); break;
    default: q4k_gemm(panel, n, y, ys, 4, out, os, nw); break;
    }
}

/* Q6_K (its MQ_BATCH form only: below it llama.cpp's eight float lanes per output do not map onto this
 * layout, and the panels run): per block the eight rows' six-bit quants (0..63) as Q4_K's, then per 16-value
 * group s the rows' scales (each twice, an int16 pair), per pair of groups 2i, 2i + 1 the rows' two scales (an
 * int16 pair, for the -32 offset against the activation's sums of 16), the rows' d as floats. Two products of a
 * quant and an activation byte reach 16002, so a 16-value group's sums are kept as two int16 sums of eight. */
enum { Q6K_SC = 2048, Q6K_OFF = Q6K_SC + 16 * 32, Q6K_D = Q6K_OFF + 8 * 32, Q6K_PB = Q6K_D + 32 };

size_t mq_panel_bytes_q6_k_avx2(int n) { return (size_t)(n / 256) * Q6K_PB; }

void mq_pack_q6_k_avx2(const uint8_t *w, size_t rb, int nw, int n, uint8_t *panel) {
    const int nb = n / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    for (int ib = 0; ib < nb; ib++) {
        uint8_t *pb = panel + (size_t)ib * Q6K_PB;
        uint32_t *sc = (uint32_t *)(pb + Q6K_SC), *off = (uint32_t *)(pb + Q6K_OFF);
        float *d = (float *)(pb + Q6K_D);
        const uint8_t *src[8];
        for (int k = 0; k < 8; k++) {
            src[k] = w + (size_t)(k < nw ? k : nw - 1) * rb + (size_t)ib * 210;
            const int8_t *s8 = (const int8_t *)(src[k] + 192);
            for (int s = 0; s < 16; s++) sc[8 * s + k] = (uint32_t)(uint16_t)s8[s] * 0x10001u;
            for (int i = 0; i < 8; i++) off[8 * i + k] = (uint32_t)(uint16_t)s8[2 * i] | (uint32_t)(uint16_t)s8[2 * i + 1] << 16;
            d[k] = h2f(ld_u16(src[k] + 208));
        }
        for (int c = 0; c < 8; c++) { /* 32-value chunk c: q6_k_rows' v[c] */
            const int h = c / 4, part = c % 4;
            __m256i r[8];
            for (int k = 0; k < 8; k++) {
                const uint8_t *q = src[k];
                const __m256i ql = load32(q + 64 * h + 32 * (part & 1)), qh = load32(q + 128 + 32 * h);
                const __m256i lo = _mm256_and_si256(part < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
                const __m256i hb = part == 0 ? _mm256_slli_epi16(qh, 4) : part == 1 ? _mm256_slli_epi16(qh, 2)
                                   : part == 2 ? qh : _mm256_srli_epi16(qh, 2); /* bits 2 part, 2 part + 1 at 0x30 */
                r[k] = _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
            }
            transpose8(r);
            for (int g = 0; g < 8; g++) _mm256_storeu_si256((__m256i *)(pb + 256 * c + 32 * g), r[g]);
        }
    }
}

/* A panel of Q6_K against nrc activation rows, as q6_k_rows' batch form: one chain per output of d x the block's
 * whole sum, fused with the activation's d. */
static inline __attribute__((always_inline)) void q6k_gemm(const uint8_t *panel, int n, const uint8_t *y, size_t ys,
                                                           const int nrc, float *out, size_t os, int nw) {
    const int nb = n / 256;
    __m256 acc[MQ_NRC];
    for (int r = 0; r < nrc; r++) acc[r] = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *pb = panel + (size_t)ib * Q6K_PB, *yb = y + (size_t)ib * 292;
        __m256i sum[MQ_NRC], offs[MQ_NRC];
        for (int r = 0; r < nrc; r++) {
            const uint8_t *bs = yb + (size_t)r * ys + 260;
            offs[r] = _mm256_madd_epi16(load32(pb + Q6K_OFF), bcast4(bs));
            for (int i = 1; i < 8; i++)
                offs[r] = _mm256_add_epi32(offs[r], _mm256_madd_epi16(load32(pb + Q6K_OFF + 32 * i), bcast4(bs + 4 * i)));
            sum[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offs[r], 5));
        }
        for (int s = 0; s < 16; s++) { /* the 16-value group s: values 16s.., groups 4s..4s+3 of four */
            const uint8_t *q = pb + 128 * s, *a = yb + 4 + 16 * s;
            const __m256i sc = load32(pb + Q6K_SC + 32 * s);
            __m256i av[MQ_NRC];
            for (int r = 0; r < nrc; r++) av[r] = bcast16(a + (size_t)r * ys);
            for (int half = 0; half < 2; half++) {
                const __m256i w0 = load32(q + 64 * half), w1 = load32(q + 64 * half + 32);
                for (int r = 0; r < nrc; r++) {
                    const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, splat4(av[r], 2 * half)),
                                                         _mm256_maddubs_epi16(w1, splat4(av[r], 2 * half + 1)));
                    sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(s16, sc));
                }
            }
        }
        const __m256 dw = _mm256_loadu_ps((const float *)(pb + Q6K_D));
        for (int r = 0; r < nrc; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_cvtepi32_ps(sum[r])),
                                     _mm256_set1_ps(ld_f32(yb + (size_t)r * ys)), acc[r]);
    }
    for (int r = 0; r < nrc; r++) {
        if (nw == MQ_GEMM_ROWS) {
            _mm256_storeu_ps(out + (size_t)r * os, acc[r]);
        } else {
            float o[8];
            _mm256_storeu_ps(o, acc[r]);
            for (int k = 0; k < nw; k++) out[(size_t)r * os + k] = o[k];
        }
    }
}

void mq_gemm_q6_k_avx2(const uint8_t *panel, int n, const uint8_t *y, size_t ys, int nrc, float *out, size_t os,
                       int nw) {
    switch (nrc) {
    case 1: q6k_gemm(panel, n, y, ys, 1, out, os, nw); break;
    case 2: q6k_gemm(panel, n, y, ys, 2, out, os, nw); break;
    case 3: q6k_gemm(panel, n, y, ys, 3, out, os, nw); break;
    default: q6k_gemm(panel, n, y, ys, 4, out, os, nw); break;
    }
}

#pragma GCC pop_options
#endif
