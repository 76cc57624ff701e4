/* AVX2 kernels and their traits table, chosen at run time (cpu.c) when the CPU has AVX2, FMA and F16C (other
 * CPUs and compilers: this file defines only a stub and the scalar table runs). Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
 * Q5_K and Q6_K (what SmolLM2's Q4_1 and Q4_K_M files hold) are shaped as ggml's own AVX2 kernels: exact integer
 * sums per block or sub-block, float terms accumulated in eight lanes as ggml's AVX2 kernels accumulate them
 * (equal to the scalar kernels to float rounding), and each comes as a "rows" kernel that unpacks a weight block
 * once for up to MQ_NRC activation rows, and Q4_0..Q8_0, Q4_K and Q6_K also as panel kernels (mq_panel: a
 * prompt's weight rows unpacked once, two of them against each tile of activation rows, same bits). Q3_K keeps the
 * scalar kernels' arithmetic with its integer part in SIMD (same bits); Q2_K and the float types are
 * quants_kernels.h compiled for AVX2 (the compiler vectorises their integer loops). IQ4_NL and MXFP4 run as Q4_0
 * (their nibbles through a grid), as llama.cpp's repacked kernels run them; IQ4_XS is quants_avx2_iq.c's. */
#include <math.h>

#include "cpu.h"
#include "quants_common.h"
#include "quants_iq.h"

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O3", "fp-contract=off")
#include <immintrin.h>

#define KNAME(name) name##_avx2
#include "quants_kernels.h"
#include "quants_avx2.h"

/* 16 int16 products (lane l: values whose index is l mod 16) as ggml's eight int32 lanes (value p into lane
 * p % 8) times the scale: lanes l and l + 8 are brought side by side (a 64-bit permute, then a byte shuffle in
 * each half), and one multiply-add of pairs makes lane l = sc * (p[l] + p[l + 8]). */
static inline __m256i lanes_scaled(__m256i p, int sc) {
    const __m256i pairs = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                           0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    __m256i v = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(p, 0xD8), pairs);
    return _mm256_madd_epi16(v, _mm256_set1_epi16((short)sc));
}

/* q8[i] * a[i] over 16 values as 16 int16 lanes (|q8| <= 127, |a| <= 63: no overflow). */
static inline __m256i prod16(const int8_t *q8, const int8_t *a) {
    return _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q8)),
                              _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a)));
}

/* sums[l] += d * aux32[l] (separate multiply and add, as the scalar lanes). */
static inline __m256 lanes_add(__m256 sums, float d, __m256i aux32) {
    return _mm256_add_ps(sums, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(aux32)));
}

static inline float lanes_total(float sumf, __m256 sums) {
    float s[8];
    _mm256_storeu_ps(s, sums);
    for (int l = 0; l < 8; l++) sumf += s[l];
    return sumf;
}

/* aux32 of a K-quant block: values a[256] with one scale per 16 (sc16) against q8. */
static inline __m256i kblock16(const int8_t *q8, const int8_t *a, const int8_t *sc16) {
    __m256i aux = _mm256_setzero_si256();
    for (int k = 0; k < 16; k++) aux = _mm256_add_epi32(aux, lanes_scaled(prod16(q8 + 16 * k, a + 16 * k), sc16[k]));
    return aux;
}

static float dot_q3_k_x(const uint8_t *w, const uint8_t *y, int n) {
    __m256 sums = _mm256_setzero_ps();
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (int ib = 0; ib < n / 256; ib++, w += 110, y += 292) {
        int8_t a[256], sc[16];
        const uint8_t *s = w + 96;
        for (int j = 0; j < 16; j++) {
            int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
            int high = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
            sc[j] = (int8_t)((low | (high << 4)) - 32);
        }
        __m256i hm = load32(w);
        for (int half = 0, m = 0; half < 2; half++) {
            __m256i q3 = load32(w + 32 + 32 * half);
            for (int sh = 0; sh < 4; sh++, m++) {
                __m256i q = _mm256_and_si256(_mm256_srl_epi16(q3, _mm_cvtsi32_si128(2 * sh)), three);
                __m256i h = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(m)), one);
                q = _mm256_sub_epi8(q, _mm256_slli_epi16(_mm256_xor_si256(h, one), 2));
                _mm256_storeu_si256((__m256i *)(a + half * 128 + sh * 32), q);
            }
        }
        __m256i aux = kblock16((const int8_t *)(y + 4), a, sc);
        sums = lanes_add(sums, h2f(ld_u16(w + 108)) * ld_f32(y), aux);
    }
    return lanes_total(0, sums);
}

/* Q4_K/Q5_K/Q6_K as ggml's AVX2 kernels shape them: maddubs of the unsigned quants with the activation bytes,
 * a multiply-add by the sub-block scale, eight float lanes accumulated per block and added at the end. The
 * integer part of every sub-block is exact; the float terms are grouped as ggml's AVX2 groups them, not as the
 * scalar kernels do, so these agree with the references to float rounding (tests/test_quants.py). */
/* Q4_K blocks into an output's two float chains (d: the weight's d x the activation's; dm: the same with dmin),
 * as llama.cpp's repacked kernels add them. p[j]: products times scales of the block's 64-value part j (eight
 * int32 lanes); m: the mins against the activation's sums (lane l: sub-block l). A row alone, or past the last
 * full tile of four, adds each block's whole sums (q4k_whole, as ggml_gemv_q4_K_8x8_q8_K); a full tile adds them
 * part by part (q4k_tile, as ggml_gemm_q4_K_8x8_q8_K for a group of four rows), so each row has the
 * bits llama.cpp computes for a row in that place of a batch. */
static inline void q4k_whole(const __m256i p[4], __m256i m, float d, float dm, float *acc, float *accm) {
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
    *acc = fmaf((float)hsum_epi32(s), d, *acc);
    *accm = fmaf((float)hsum_epi32(m), dm, *accm);
}

/* A full tile's block: p[r][j] the products of row r's part j, m[r] its mins (lane l: sub-block l); lane r of d,
 * dm, acc, accm is row r's. Each part's sums are made for the four rows side by side (part j of the mins: lanes
 * 2j and 2j + 1), and the four rows' chains take their four fused steps together, the same operations lane by
 * lane as one row's. */
static inline void q4k_tile(__m256i p[MQ_NRC][4], const __m256i m[MQ_NRC], __m128 d, __m128 dm, __m128 *acc,
                            __m128 *accm) {
    __m128 a[4];
    for (int j = 0; j < 4; j++) {
        const __m256i pj[4] = {p[0][j], p[1][j], p[2][j], p[3][j]};
        a[j] = _mm_cvtepi32_ps(hsum4_epi32(pj));
    }
    *acc = _mm_fmadd_ps(a[3], d, _mm_fmadd_ps(a[2], d, _mm_fmadd_ps(a[1], d, _mm_fmadd_ps(a[0], d, *acc))));
    /* per 128-bit half, rows 0, 1 then 2, 3: parts 0, 1 (low half) or 2, 3 (high half) of each */
    const __m256 h01 = _mm256_castsi256_ps(_mm256_hadd_epi32(m[0], m[1]));
    const __m256 h23 = _mm256_castsi256_ps(_mm256_hadd_epi32(m[2], m[3]));
    const __m256 m02 = _mm256_cvtepi32_ps(_mm256_castps_si256(_mm256_shuffle_ps(h01, h23, _MM_SHUFFLE(2, 0, 2, 0))));
    const __m256 m13 = _mm256_cvtepi32_ps(_mm256_castps_si256(_mm256_shuffle_ps(h01, h23, _MM_SHUFFLE(3, 1, 3, 1))));
    *accm = _mm_fmadd_ps(_mm256_extractf128_ps(m13, 1), dm, _mm_fmadd_ps(_mm256_extractf128_ps(m02, 1), dm,
            _mm_fmadd_ps(_mm256_castps256_ps128(m13), dm, _mm_fmadd_ps(_mm256_castps256_ps128(m02), dm, *accm))));
}

/* The body of the Q4_K/Q5_K kernel for nrc activation rows (a constant where it is inlined): each block's
 * quants unpacked once, then multiplied with every row. Q4_K sums as llama.cpp runs it on AVX2, where its loader
 * repacks Q4_K matrices eight rows interleaved (ggml_gemv_q4_K_8x8_q8_K / ggml_gemm_q4_K_8x8_q8_K): each output a
 * single float chain over the blocks, exact integer sums fused with d x the activation's d, the mins in a second
 * chain, subtracted at the end (a full tile of four rows as its gemm, other rows as its gemv: q4k_whole). Q5_K as
 * ggml_vec_dot_q5_K_q8_K: eight lanes, each block's lanes fused in, the mins in a fused chain of their own; with
 * batch (MQ_BATCH rows or more), as llama.cpp's tiled kernel: one chain of (d x sum - dmin x mins) x the
 * activation's d. */
static inline __attribute__((always_inline)) void q45_k_rows(const uint8_t *w, const uint8_t *y, size_t ys, int n,
                                                             const int nrc, float *out, size_t os, int five,
                                                             const int batch) {
    __m256 acc[MQ_NRC];
    float summ[MQ_NRC], acc1[MQ_NRC];
    for (int r = 0; r < nrc; r++) acc[r] = _mm256_setzero_ps(), summ[r] = 0, acc1[r] = 0;
    const int tile = !five && nrc == MQ_NRC; /* Q4_K, a full tile: q4k_tile */
    __m128 acct = _mm_setzero_ps(), accmt = _mm_setzero_ps();
    const int size = five ? 176 : 144;
    for (int ib = 0; ib < n / 256; ib++, w += size, y += 292) {
        const __m128i scm = kscales_x(w + 4);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm)); /* scale j: lane16(sc16, j) */
        __m256i lo[4], hi[4];
        k_quants(w, five, lo, hi);
        const float dw = h2f(ld_u16(w)), mw = h2f(ld_u16(w + 2));
        /* the mins against the activation's 16 sums of 16 (exact in int32, in any order) */
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
        __m256i pt[MQ_NRC][4], mt[MQ_NRC]; /* a full tile's products and mins, row by row */
        float dv[MQ_NRC], dmv[MQ_NRC];
        for (int r = 0; r < nrc; r++) {
            const uint8_t *yr = y + (size_t)r * ys, *q8 = yr + 4;
            const __m256i m = _mm256_madd_epi16(load32(yr + 260), mins16);
            __m256i p[4];
            k_parts(lo, hi, sc16, q8, p);
            float yd = ld_f32(yr);
            if (five) {
                const __m256i sumi = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
                if (batch) { /* MQ_BATCH: llama.cpp's tiled kernel */
                    const float res = fmaf(-mw, (float)hsum_epi32(m), dw * (float)hsum_epi32(sumi));
                    acc1[r] = fmaf(res, yd, acc1[r]);
                } else {
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yd), _mm256_cvtepi32_ps(sumi), acc[r]);
                    summ[r] = fmaf((float)hsum_epi32(m), mw * yd, summ[r]);
                }
            } else if (tile) {
                for (int j = 0; j < 4; j++) pt[r][j] = p[j];
                mt[r] = m, dv[r] = dw * yd, dmv[r] = mw * yd;
            } else
                q4k_whole(p, m, dw * yd, mw * yd, &acc1[r], &summ[r]);
        }
        if (tile) q4k_tile(pt, mt, _mm_loadu_ps(dv), _mm_loadu_ps(dmv), &acct, &accmt);
    }
    if (tile) _mm_storeu_ps(acc1, acct), _mm_storeu_ps(summ, accmt);
    for (int r = 0; r < nrc; r++) out[(size_t)r * os] = (five && !batch ? hsum_ps(acc[r]) : acc1[r]) - summ[r];
}

/* Q6_K's -32 offset as ggml_vec_dot_q6_K_q8_K takes it on AVX2: the unsigned quants multiply the activation, and
 * lane l then loses 32 x (the activation's sums of 16-value groups 2l and 2l + 1, each times its scale). Where the
 * offset is taken decides which lane each term lands in, so the float sum's bits. */
static inline __m256i q6k_offset(const uint8_t *yr, __m256i sc16) {
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(load32(yr + 260), sc16), 5));
}

/* Q6_K for nrc activation rows: ggml_vec_dot_q6_K_q8_K's eight lanes; with batch (MQ_BATCH rows or more), as
 * llama.cpp's tiled kernel: one chain of d x the block's sum, by the activation's d. */
static inline __attribute__((always_inline)) void q6_k_rows(const uint8_t *w, const uint8_t *y, size_t ys, int n,
                                                            const int nrc, float *out, size_t os, const int batch) {
    __m256 acc[MQ_NRC];
    float acc1[MQ_NRC];
    for (int r = 0; r < nrc; r++) acc[r] = _mm256_setzero_ps(), acc1[r] = 0;
    const __m256i low4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    for (int ib = 0; ib < n / 256; ib++, w += 210, y += 292) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const __m128i scb = _mm_loadu_si128((const __m128i *)sc);
        __m256i v[8], scale[8]; /* scale[k]: int16 lanes 0-7 scale s, 8-15 scale s + 1 (below) */
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = load32(w + 64 * h), ql1 = load32(w + 64 * h + 32), qh = load32(w + 128 + 32 * h);
            v[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            v[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            v[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                           _mm256_and_si256(qh, m30));
            v[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int k = 0; k < 4; k++) {
                const int s = 8 * h + 2 * k; /* the 16-value groups s and s + 1 */
                scale[4 * h + k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                    scb, _mm_set_epi64x((long long)(0x0101010101010101ull * (unsigned)(s + 1)),
                                        (long long)(0x0101010101010101ull * (unsigned)s))));
            }
        }
        const float dw = h2f(ld_u16(w + 208));
        const __m256i sc16 = _mm256_cvtepi8_epi16(scb);
        for (int r = 0; r < nrc; r++) {
            const uint8_t *yr = y + (size_t)r * ys, *q8 = yr + 4;
            __m256i sumi = q6k_offset(yr, sc16);
            for (int k = 0; k < 8; k++)
                sumi = _mm256_add_epi32(sumi,
                                        _mm256_madd_epi16(_mm256_maddubs_epi16(v[k], load32(q8 + 32 * k)), scale[k]));
            if (batch) /* MQ_BATCH: llama.cpp's tiled kernel */
                acc1[r] = fmaf(dw * (float)hsum_epi32(sumi), ld_f32(yr), acc1[r]);
            else
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(ld_f32(yr) * dw), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    for (int r = 0; r < nrc; r++) out[(size_t)r * os] = batch ? acc1[r] : hsum_ps(acc[r]);
}

/* Q4_1, Q5_0, Q5_1 and Q8_0 as ggml's AVX2 kernels compute them: each block's integer sum of 32 products as
 * eight float lanes, a fused multiply-add by the two scales into eight accumulator lanes (Q4_1/Q5_1: the min times
 * the activation sum added as a scalar), the lanes summed at the end. Integer parts exact, float terms grouped as
 * ggml's AVX2 groups them (equal to the scalar kernels to float rounding). Q4_0 (Q4_0_CHAIN): llama.cpp repacks
 * Q4_0 matrices on AVX2 (eight rows interleaved) and its ggml_gemv/gemm_q4_0_8x8_q8_0 fuse each block's whole
 * integer sum, times the two scales' product, into one float chain per output, for any number of rows. */
static inline __m256i sum_u8_epi32(__m256i u, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
}

static inline __m256 sum_u8_ps(__m256i u, __m256i y) { return _mm256_cvtepi32_ps(sum_u8_epi32(u, y)); }

/* Bytes of one Q4_0..Q8_0 block (a constant where the type is). */
static inline int q32_size(int type) {
    return type == MQ_Q4_0 || type == MQ_IQ4_NL ? 18 : type == MQ_Q4_1 ? 20 : type == MQ_Q5_0 ? 22
           : type == MQ_Q5_1 ? 24 : type == MQ_MXFP4 ? 17 : 34;
}

/* Q4_0_CHAIN: the types llama.cpp repacks on AVX2 with Q4_0's kernels (IQ4_NL, MXFP4: their nibbles through a grid,
 * MXFP4's scale an E8M0 byte). */
static inline int q32_chain(int type) { return type == MQ_Q4_0 || type == MQ_IQ4_NL || type == MQ_MXFP4; }
static inline float q32_scale(int type, const uint8_t *w) {
    return type == MQ_MXFP4 ? e8m0_half(w[0]) : h2f(ld_u16(w));
}

/* The quants of one Q4_0..Q8_0 block as 32 bytes, and whether they are signed. */
static inline __m256i qblock(int type, const uint8_t *w) {
    switch (type) {
    case MQ_Q4_0: return _mm256_sub_epi8(nibbles(w + 2), _mm256_set1_epi8(8));
    case MQ_Q4_1: return nibbles(w + 4);
    case MQ_Q5_0: return q5_0_quants(w);
    case MQ_Q5_1: return _mm256_or_si256(nibbles(w + 8), _mm256_and_si256(bits_to_bytes(w + 4), _mm256_set1_epi8(0x10)));
    case MQ_IQ4_NL: return grid(mq_kvalues_iq4nl, nibbles(w + 2));
    case MQ_MXFP4: return grid(mq_kvalues_mxfp4, nibbles(w + 1));
    default: return load32(w + 2);
    }
}

/* With yf the scale products of a block are made for the MQ_NRC rows at once (the same float operations per row
 * as without: the same bits). */
static inline __attribute__((always_inline)) void q32_rows(const int type, const uint8_t *w, const uint8_t *y,
                                                           size_t ys, int n, const int nrc, float *out, size_t os,
                                                           const float *yf) {
    const int size = q32_size(type);
    const int with_min = type == MQ_Q4_1 || type == MQ_Q5_1, ysize = with_min ? 36 : 34, at = with_min ? 4 : 2;
    const int nb = n / 32, chain = q32_chain(type); /* Q4_0_CHAIN (above) */
    if (chain && nrc == MQ_NRC) { /* the four rows' whole sums reduced side by side (hsum4_epi32) and their chains
                                   * fused together: lane r the fmaf of row r below, the same bits */
        __m128 acc4 = _mm_setzero_ps();
        for (int ib = 0; ib < nb; ib++, w += size, y += ysize) {
            const __m256i q = qblock(type, w), aq = _mm256_sign_epi8(q, q);
            const __m128 dw = _mm_set1_ps(q32_scale(type, w));
            __m256i isum[MQ_NRC];
            for (int r = 0; r < MQ_NRC; r++)
                isum[r] = sum_u8_epi32(aq, _mm256_sign_epi8(load32(y + (size_t)r * ys + at), q));
            const __m128 dy = yf ? _mm_loadu_ps(yf + ib * MQ_NRC)
                                 : _mm_setr_ps(h2f(ld_u16(y)), h2f(ld_u16(y + ys)), h2f(ld_u16(y + 2 * ys)),
                                               h2f(ld_u16(y + 3 * ys)));
            acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(isum)), _mm_mul_ps(dw, dy), acc4);
        }
        float a[MQ_NRC];
        _mm_storeu_ps(a, acc4);
        for (int r = 0; r < MQ_NRC; r++) out[(size_t)r * os] = a[r];
        return;
    }
    __m256 acc[MQ_NRC];
    float summs[MQ_NRC], accs[MQ_NRC];
    __m128 summ4 = _mm_setzero_ps();
    for (int r = 0; r < nrc; r++) acc[r] = _mm256_setzero_ps(), summs[r] = 0, accs[r] = 0;
    for (int ib = 0; ib < nb; ib++, w += size, y += ysize) {
        const __m256i q = qblock(type, w);
        const __m256i aq = with_min ? q : _mm256_sign_epi8(q, q);
        const float dw = q32_scale(type, w);
        float dwy[MQ_NRC];
        if (yf) {
            _mm_storeu_ps(dwy, _mm_mul_ps(_mm_set1_ps(dw), _mm_loadu_ps(yf + ib * MQ_NRC)));
            if (with_min)
                summ4 = _mm_add_ps(summ4, _mm_mul_ps(_mm_set1_ps(h2f(ld_u16(w + 2))),
                                                     _mm_loadu_ps(yf + (nb + ib) * MQ_NRC)));
        }
        for (int r = 0; r < nrc; r++) {
            const uint8_t *yr = y + (size_t)r * ys;
            __m256i yq = load32(yr + at);
            if (chain) {
                const int isum = hsum_epi32(sum_u8_epi32(aq, _mm256_sign_epi8(yq, q)));
                accs[r] = fmaf((float)isum, yf ? dwy[r] : dw * h2f(ld_u16(yr)), accs[r]);
                continue;
            }
            __m256 p = sum_u8_ps(aq, with_min ? yq : _mm256_sign_epi8(yq, q));
            const __m256 d = yf ? _mm256_broadcast_ss(&dwy[r]) : _mm256_set1_ps(dw * h2f(ld_u16(yr)));
            acc[r] = _mm256_fmadd_ps(d, p, acc[r]);
            if (with_min && !yf) summs[r] += h2f(ld_u16(w + 2)) * h2f(ld_u16(yr + 2));
        }
    }
    if (yf && with_min) _mm_storeu_ps(summs, summ4);
    for (int r = 0; r < nrc; r++) out[(size_t)r * os] = chain ? accs[r] : hsum_ps(acc[r]) + summs[r];
}

/* Two weight rows (rb bytes apart) against nrc activation rows with their tile scales (yf): for each (weight row,
 * activation row) the float operations of q32_rows with yf, so the same bits, but each activation block is loaded
 * once for both weight rows and the scale products of the two are made together (batched decode steps: the rows
 * kernel's loads and scale work were a third of its operations). Q4_1 and Q5_0 (-5 to -23% a pair at 2-4 rows);
 * Q8_0's (and Q5_1's) two rows hold more registers than AVX2 has at four activation rows and ran slower. */
static inline __attribute__((always_inline)) void q32_rows2(const int type, const uint8_t *w, size_t rb,
                                                            const uint8_t *y, size_t ys, int n, const int nrc,
                                                            float *out, size_t os, const float *yf) {
    const int size = q32_size(type);
    const int with_min = type == MQ_Q4_1 || type == MQ_Q5_1, ysize = with_min ? 36 : 34, at = with_min ? 4 : 2;
    const int nb = n / 32;
    const uint8_t *w1 = w + rb;
    __m256 a0[MQ_NRC], a1[MQ_NRC];
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
    for (int r = 0; r < nrc; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++, w += size, w1 += size, y += ysize) {
        const __m256i q0 = qblock(type, w), q1 = qblock(type, w1);
        const __m256i u0 = with_min ? q0 : _mm256_sign_epi8(q0, q0), u1 = with_min ? q1 : _mm256_sign_epi8(q1, q1);
        const __m128 yd = _mm_loadu_ps(yf + ib * MQ_NRC);
        float d[2 * MQ_NRC]; /* weight row 0's scale by activation rows 0..3, then weight row 1's */
        _mm_storeu_ps(d, _mm_mul_ps(_mm_set1_ps(q32_scale(type, w)), yd));
        _mm_storeu_ps(d + MQ_NRC, _mm_mul_ps(_mm_set1_ps(q32_scale(type, w1)), yd));
        if (with_min) {
            const __m128 ysum = _mm_loadu_ps(yf + (nb + ib) * MQ_NRC);
            s0 = _mm_add_ps(s0, _mm_mul_ps(_mm_set1_ps(h2f(ld_u16(w + 2))), ysum));
            s1 = _mm_add_ps(s1, _mm_mul_ps(_mm_set1_ps(h2f(ld_u16(w1 + 2))), ysum));
        }
        for (int r = 0; r < nrc; r++) {
            const __m256i yq = load32(y + (size_t)r * ys + at);
            const __m256 p0 = sum_u8_ps(u0, with_min ? yq : _mm256_sign_epi8(yq, q0));
            const __m256 p1 = sum_u8_ps(u1, with_min ? yq : _mm256_sign_epi8(yq, q1));
            a0[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[r]), p0, a0[r]);
            a1[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[MQ_NRC + r]), p1, a1[r]);
        }
    }
    float m0[MQ_NRC] = {0}, m1[MQ_NRC] = {0};
    if (with_min) _mm_storeu_ps(m0, s0), _mm_storeu_ps(m1, s1);
    for (int r = 0; r < nrc; r++)
        out[(size_t)r * os] = hsum_ps(a0[r]) + m0[r], out[(size_t)r * os + 1] = hsum_ps(a1[r]) + m1[r];
}

/* A matrix against one activation row (a decode step's product), four weight rows at a time: for each (row,
 * block) the float operations of q32_rows with nrc = 1, so the same bits, but the activation's block is loaded
 * once for the four, and their scales (d, and Q4_1/Q5_1's m) are widened and multiplied four rows at once. The
 * one-row kernel was bound by its instructions, not by memory: about 35 per block, now about 13. Four rows read
 * side by side are four short streams that the CPU's prefetcher follows poorly (a Q8_0 matrix from memory ran at
 * half speed): each step prefetches the bytes of a group GEMV_AHEAD groups on, which is the matrix read in order. */
#define GEMV_AHEAD 2
static inline __attribute__((always_inline)) void q32_gemv4(const int type, const uint8_t *w, size_t rb,
                                                            const uint8_t *y, int n, float *out) {
    const int size = q32_size(type);
    const int with_min = type == MQ_Q4_1 || type == MQ_Q5_1, ysize = with_min ? 36 : 34, at = with_min ? 4 : 2;
    const int nb = n / 32, chain = q32_chain(type); /* Q4_0_CHAIN (above) */
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 summ = _mm256_setzero_ps(); /* lane 2r + 1: row r's sum of m * s (with_min) */
    __m128 accs = _mm_setzero_ps();    /* lane r: row r's chain (Q4_0) */
    /* the group GEMV_AHEAD groups on, 4 blocks' bytes a step: an address, as it may lie past the matrix (a
     * prefetch there is harmless; a pointer there would not be C) */
    uintptr_t ahead = (uintptr_t)w + GEMV_AHEAD * 4 * rb;
    for (int ib = 0; ib < nb; ib++, w += size, y += ysize, ahead += 4 * (uintptr_t)size) {
        _mm_prefetch((const char *)ahead, _MM_HINT_T0);
        _mm_prefetch((const char *)(ahead + 64), _MM_HINT_T0);
        const __m256i yq = load32(y + at);
        __m256 d8; /* with_min: lane 2r row r's d x the activation's d, lane 2r + 1 its m x s; else lanes 0-3 d */
        if (with_min) {
            const __m128i dm = _mm_setr_epi32((int)ld_u32(w), (int)ld_u32(w + rb), (int)ld_u32(w + 2 * rb),
                                              (int)ld_u32(w + 3 * rb));
            d8 = _mm256_mul_ps(_mm256_cvtph_ps(dm), _mm256_cvtph_ps(_mm_set1_epi32((int)ld_u32(y))));
            summ = _mm256_add_ps(summ, d8);
        } else {
            const __m128i dd = _mm_setr_epi16((short)ld_u16(w), (short)ld_u16(w + rb), (short)ld_u16(w + 2 * rb),
                                              (short)ld_u16(w + 3 * rb), 0, 0, 0, 0);
            const __m128 dw4 = type == MQ_MXFP4 ? _mm_setr_ps(e8m0_half(w[0]), e8m0_half(w[rb]), e8m0_half(w[2 * rb]),
                                                              e8m0_half(w[3 * rb]))
                                                : _mm_cvtph_ps(dd);
            d8 = _mm256_castps128_ps256(_mm_mul_ps(dw4, _mm_set1_ps(h2f(ld_u16(y)))));
        }
        __m256i isum[4];
        float dd[8]; /* d8's lanes, each broadcast from memory below (a load, not a shuffle) */
        if (!chain) _mm256_storeu_ps(dd, d8);
        for (int r = 0; r < 4; r++) {
            const __m256i q = qblock(type, w + r * rb);
            if (chain) {
                isum[r] = sum_u8_epi32(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yq, q));
                continue;
            }
            const __m256 p = sum_u8_ps(with_min ? q : _mm256_sign_epi8(q, q), with_min ? yq : _mm256_sign_epi8(yq, q));
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[with_min ? 2 * r : r]), p, acc[r]);
        }
        if (chain) /* the four rows' whole sums side by side, one fused chain each */
            accs = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(isum)), _mm256_castps256_ps128(d8), accs);
    }
    float m[8];
    _mm256_storeu_ps(m, summ);
    if (chain)
        _mm_storeu_ps(out, accs);
    else
        for (int r = 0; r < 4; r++) out[r] = hsum_ps(acc[r]) + (with_min ? m[2 * r + 1] : 0.0f);
}

#define GEMV32(name, type)                                                                                          \
    static void name(const uint8_t *w, size_t rb, int64_t rows, const uint8_t *y, int n, float *out) {             \
        int64_t r = 0;                                                                                              \
        for (; r + 4 <= rows; r += 4) q32_gemv4(type, w + (size_t)r * rb, rb, y, n, out + r);                     \
        for (; r < rows; r++) q32_rows(type, w + (size_t)r * rb, y, 0, n, 1, out + r, 0, NULL);                    \
    }
GEMV32(gemv_q4_0, MQ_Q4_0)
GEMV32(gemv_q4_1, MQ_Q4_1)
GEMV32(gemv_q5_0, MQ_Q5_0)
GEMV32(gemv_q5_1, MQ_Q5_1)
GEMV32(gemv_q8_0, MQ_Q8_0)
GEMV32(gemv_iq4_nl, MQ_IQ4_NL)
#undef GEMV32

/* Four Q4_K rows against one activation row: each row's two chains as q4k_whole adds them (llama.cpp's
 * ggml_gemv_q4_K_8x8_q8_K), the activation's block loaded once for the four, the rows' whole sums reduced side by
 * side (hsum4_epi32) and their scales widened and multiplied together, the matrix prefetched as q32_gemv4 does. */
static void gemv_q4_k(const uint8_t *w, size_t rb, int64_t rows, const uint8_t *y, int n, float *out) {
    const int nb = n / 256;
    const __m256i split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7); /* d x y's d to lanes 0-3, dmin x it to 4-7 */
    int64_t r0 = 0;
    for (; r0 + 4 <= rows; r0 += 4) {
        const uint8_t *w4 = w + (size_t)r0 * rb, *yb = y;
        uintptr_t ahead = (uintptr_t)w4 + GEMV_AHEAD * 4 * rb; /* as in q32_gemv4: an address, maybe past the end */
        __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps(); /* lane r: row r's chains */
        for (int ib = 0; ib < nb; ib++, w4 += 144, yb += 292, ahead += 4 * 144) {
            for (int l = 0; l < 4 * 144; l += 64) _mm_prefetch((const char *)(ahead + (uintptr_t)l), _MM_HINT_T0);
            const __m256i bs = load32(yb + 260);
            __m256i s[4], m[4];
            for (int r = 0; r < 4; r++) {
                const uint8_t *wr = w4 + (size_t)r * rb;
                const __m128i scm = kscales_x(wr + 4);
                const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
                m[r] = _mm256_madd_epi16(bs, _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm)));
                __m256i lo[4], hi[4], p[4];
                k_quants(wr, 0, lo, hi);
                k_parts(lo, hi, sc16, yb + 4, p);
                s[r] = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
            }
            const __m128i dm = _mm_setr_epi32((int)ld_u32(w4), (int)ld_u32(w4 + rb), (int)ld_u32(w4 + 2 * rb),
                                              (int)ld_u32(w4 + 3 * rb));
            const __m256 f = _mm256_permutevar8x32_ps(_mm256_mul_ps(_mm256_cvtph_ps(dm), _mm256_set1_ps(ld_f32(yb))),
                                                      split);
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(s)), _mm256_castps256_ps128(f), acc);
            accm = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(m)), _mm256_extractf128_ps(f, 1), accm);
        }
        _mm_storeu_ps(out + r0, _mm_sub_ps(acc, accm));
    }
    for (; r0 < rows; r0++) q45_k_rows(w + (size_t)r0 * rb, y, 0, n, 1, out + r0, 0, 0, 0);
}

/* Panels (mq_panel) of the 32-value block types: a row is its n quant bytes (qblock's), then each block's scale
 * and (Q4_1/Q5_1) min as floats. q32_rows' float operations for each (weight row, activation row) pair, two
 * weight rows sharing each activation load. */
static size_t row_bytes32(int n) { return (size_t)n + (size_t)(n / 32) * 2 * sizeof(float); }

static void unpack32(int type, const uint8_t *w, int n, uint8_t *row) {
    const int size = q32_size(type);
    const int nb = n / 32, with_min = type == MQ_Q4_1 || type == MQ_Q5_1;
    float *dm = (float *)(row + n);
    for (int ib = 0; ib < nb; ib++, w += size) {
        _mm256_storeu_si256((__m256i *)(row + 32 * ib), qblock(type, w));
        dm[ib] = q32_scale(type, w);
        if (with_min) dm[nb + ib] = h2f(ld_u16(w + 2));
    }
}

static inline __attribute__((always_inline)) void q32_panel(const int with_min, const int chain, const uint8_t *rows,
                                                            size_t rs, const int nw, const uint8_t *y, size_t ys,
                                                            int n, const int nrc, float *out, size_t os,
                                                            const float *yf) {
    const int nb = n / 32, ysize = with_min ? 36 : 34, at = with_min ? 4 : 2;
    __m256 acc[2][MQ_NRC];
    float accs[2][MQ_NRC];
    __m128 summ4[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int k = 0; k < nw; k++)
        for (int r = 0; r < nrc; r++) acc[k][r] = _mm256_setzero_ps(), accs[k][r] = 0;
    for (int ib = 0; ib < nb; ib++) {
        __m256i qv[2], aq[2];
        float dwy[2][4];
        const __m128 yd = _mm_loadu_ps(yf + ib * MQ_NRC);
        for (int k = 0; k < nw; k++) {
            const uint8_t *row = rows + (size_t)k * rs;
            const float *dm = (const float *)(row + n);
            qv[k] = load32(row + 32 * ib);
            aq[k] = with_min ? qv[k] : _mm256_sign_epi8(qv[k], qv[k]);
            _mm_storeu_ps(dwy[k], _mm_mul_ps(_mm_set1_ps(dm[ib]), yd));
            if (with_min)
                summ4[k] = _mm_add_ps(summ4[k], _mm_mul_ps(_mm_set1_ps(dm[nb + ib]),
                                                           _mm_loadu_ps(yf + (nb + ib) * MQ_NRC)));
        }
        for (int r = 0; r < nrc; r++) {
            const __m256i yq = load32(y + (size_t)r * ys + (size_t)ib * ysize + at);
            for (int k = 0; k < nw; k++) {
                if (chain) {
                    const int isum = hsum_epi32(sum_u8_epi32(aq[k], _mm256_sign_epi8(yq, qv[k])));
                    accs[k][r] = fmaf((float)isum, dwy[k][r], accs[k][r]);
                    continue;
                }
                const __m256 p = sum_u8_ps(aq[k], with_min ? yq : _mm256_sign_epi8(yq, qv[k]));
                acc[k][r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dwy[k][r]), p, acc[k][r]);
            }
        }
    }
    for (int k = 0; k < nw; k++) {
        float summs[4] = {0, 0, 0, 0};
        if (with_min) _mm_storeu_ps(summs, summ4[k]);
        for (int r = 0; r < nrc; r++) out[(size_t)r * os + k] = chain ? accs[k][r] : hsum_ps(acc[k][r]) + summs[r];
    }
}

/* A panel kernel's body for nw = 1..2 and nrc = 1..4, each a constant where it is inlined. */
#define PANEL_CASES(call)                                                                                          \
    switch (nw * 8 + nrc) {                                                                                        \
    case 9: call(1, 1); break;                                                                                     \
    case 10: call(1, 2); break;                                                                                    \
    case 11: call(1, 3); break;                                                                                    \
    case 12: call(1, 4); break;                                                                                    \
    case 17: call(2, 1); break;                                                                                    \
    case 18: call(2, 2); break;                                                                                    \
    case 19: call(2, 3); break;                                                                                    \
    default: call(2, 4); break;                                                                                    \
    }

static void panel32(int type, const uint8_t *rows, size_t rs, int nw, const uint8_t *y, size_t ys, int n, int nrc,
                    float *out, size_t os, const float *yf) {
#define P32(m, c) q32_panel(m, c, rows, rs, w_, y, ys, n, r_, out, os, yf)
#define CALL_MIN(w_c, r_c) { const int w_ = w_c, r_ = r_c; P32(1, 0); }
#define CALL_NOMIN(w_c, r_c) { const int w_ = w_c, r_ = r_c; P32(0, 0); }
#define CALL_CHAIN(w_c, r_c) { const int w_ = w_c, r_ = r_c; P32(0, 1); }
    if (type == MQ_Q4_1 || type == MQ_Q5_1)
        PANEL_CASES(CALL_MIN)
    else if (q32_chain(type))
        PANEL_CASES(CALL_CHAIN)
    else
        PANEL_CASES(CALL_NOMIN)
#undef CALL_CHAIN
#undef CALL_NOMIN
#undef CALL_MIN
#undef P32
}

/* Panels of Q4_K: a row is per block its 256 nibbles as bytes (lo[0], hi[0], ..., lo[3], hi[3] of q45_k_rows,
 * 32 each), then per block its 8 scales and 8 mins (16 bytes), then per block d and dmin as floats. q45_k_rows'
 * Q4_K arithmetic (q4k_whole, or q4k_tile for a full tile) for each pair: each weight row's block (quants, scale
 * vectors) loaded once for the tile's activation rows. */
static size_t row_bytes_q4k(int n) { return (size_t)n + (size_t)(n / 256) * (16 + 2 * sizeof(float)); }

static void unpack_q4k(int type, const uint8_t *w, int n, uint8_t *row) {
    (void)type;
    const int nb = n / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    uint8_t *scm = row + n;
    float *dm = (float *)(scm + 16 * nb);
    for (int ib = 0; ib < nb; ib++, w += 144) {
        kscales(w + 4, scm + 16 * ib, scm + 16 * ib + 8);
        for (int j = 0; j < 4; j++) {
            const __m256i v = load32(w + 16 + 32 * j);
            _mm256_storeu_si256((__m256i *)(row + 256 * ib + 64 * j), _mm256_and_si256(v, low4));
            _mm256_storeu_si256((__m256i *)(row + 256 * ib + 64 * j + 32),
                                _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
        }
        dm[2 * ib] = h2f(ld_u16(w)), dm[2 * ib + 1] = h2f(ld_u16(w + 2));
    }
}

static inline __attribute__((always_inline)) void q4k_panel(const uint8_t *rows, size_t rs, const int nw,
                                                            const uint8_t *y, size_t ys, int n, const int nrc,
                                                            float *out, size_t os) {
    const int nb = n / 256;
    float acc1[2][MQ_NRC], summ[2][MQ_NRC];
    for (int k = 0; k < nw; k++)
        for (int r = 0; r < nrc; r++) acc1[k][r] = 0, summ[k][r] = 0;
    const int tile = nrc == MQ_NRC; /* a full tile: q4k_tile */
    __m128 acct[2] = {_mm_setzero_ps(), _mm_setzero_ps()}, accmt[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *yb = y + (size_t)ib * 292;
        float yd[MQ_NRC];
        for (int r = 0; r < nrc; r++) yd[r] = ld_f32(yb + (size_t)r * ys);
        for (int k = 0; k < nw; k++) {
            /* a weight row's block: its scales and quants loaded once for the tile's activation rows */
            const uint8_t *row = rows + (size_t)k * rs, *q = row + 256 * ib;
            const float *dm = (const float *)(row + n + 16 * nb) + 2 * ib;
            const __m128i scm = _mm_loadu_si128((const __m128i *)(row + n + 16 * ib)); /* 8 scales, 8 mins */
            const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
            const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
            __m256i p[MQ_NRC][4];
            for (int j = 0; j < 4; j++) {
                const __m256i ql = load32(q + 64 * j), qh = load32(q + 64 * j + 32);
                const __m256i sl = lane16(sc16, 2 * j), sh = lane16(sc16, 2 * j + 1);
                for (int r = 0; r < nrc; r++) {
                    const uint8_t *q8 = yb + (size_t)r * ys + 4 + 64 * j;
                    p[r][j] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(ql, load32(q8)), sl),
                                               _mm256_madd_epi16(_mm256_maddubs_epi16(qh, load32(q8 + 32)), sh));
                }
            }
            __m256i mt[MQ_NRC];
            float dv[MQ_NRC], dmv[MQ_NRC];
            for (int r = 0; r < nrc; r++) {
                const __m256i m = _mm256_madd_epi16(load32(yb + (size_t)r * ys + 260), mins16);
                if (tile)
                    mt[r] = m, dv[r] = dm[0] * yd[r], dmv[r] = dm[1] * yd[r];
                else
                    q4k_whole(p[r], m, dm[0] * yd[r], dm[1] * yd[r], &acc1[k][r], &summ[k][r]);
            }
            if (tile) q4k_tile(p, mt, _mm_loadu_ps(dv), _mm_loadu_ps(dmv), &acct[k], &accmt[k]);
        }
    }
    if (tile)
        for (int k = 0; k < nw; k++) _mm_storeu_ps(acc1[k], acct[k]), _mm_storeu_ps(summ[k], accmt[k]);
    for (int k = 0; k < nw; k++)
        for (int r = 0; r < nrc; r++) out[(size_t)r * os + k] = acc1[k][r] - summ[k][r];
}

static void panel_q4k(int type, const uint8_t *rows, size_t rs, int nw, const uint8_t *y, size_t ys, int n, int nrc,
                      float *out, size_t os, const float *yf) {
    (void)type, (void)yf;
#define CALL_Q4K(w_c, r_c) q4k_panel(rows, rs, w_c, y, ys, n, r_c, out, os);
    PANEL_CASES(CALL_Q4K)
#undef CALL_Q4K
}
/* Panels of Q6_K: a row is per block its 256 six-bit values as bytes (v[0..7] of q6_k_rows, 32 each), then per
 * block the eight scale vectors q6_k_rows builds (32 bytes each), then per block d as a float, then per block the
 * 16 scales as int16 (for q6k_offset). q6_k_rows' arithmetic for each pair, each weight row's block loaded once
 * for the tile's activation rows (the batch form's four chains stepped side by side). */
static size_t row_bytes_q6k(int n) { return (size_t)n * 2 + (size_t)(n / 256) * (sizeof(float) + 32); }

static void unpack_q6k(int type, const uint8_t *w, int n, uint8_t *row) {
    (void)type;
    const int nb = n / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    float *d = (float *)(row + 2 * n);
    for (int ib = 0; ib < nb; ib++, w += 210) {
        uint8_t *v = row + 256 * ib, *scale = row + n + 256 * ib;
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = load32(w + 64 * h), ql1 = load32(w + 64 * h + 32), qh = load32(w + 128 + 32 * h);
            const __m256i vs[4] = {
                _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
            for (int k = 0; k < 4; k++) {
                const int s8 = 8 * h + 2 * k;
                _mm256_storeu_si256((__m256i *)(v + 32 * (4 * h + k)), vs[k]);
                _mm256_storeu_si256((__m256i *)(scale + 32 * (4 * h + k)),
                                    _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(sc[s8])),
                                                            _mm_set1_epi16(sc[s8 + 1]), 1));
            }
        }
        d[ib] = h2f(ld_u16(w + 208));
        _mm256_storeu_si256((__m256i *)(d + nb) + ib, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
    }
}

static inline __attribute__((always_inline)) void q6k_panel(const uint8_t *rows, size_t rs, const int nw,
                                                            const uint8_t *y, size_t ys, int n, const int nrc,
                                                            float *out, size_t os, const int batch) {
    const int nb = n / 256;
    __m256 acc[2][MQ_NRC];
    __m128 acc4[2] = {_mm_setzero_ps(), _mm_setzero_ps()}; /* batch: lane r, row r's chain */
    for (int k = 0; k < nw; k++)
        for (int r = 0; r < nrc; r++) acc[k][r] = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *yb = y + (size_t)ib * 292;
        float yd[MQ_NRC] = {0};
        for (int r = 0; r < nrc; r++) yd[r] = ld_f32(yb + (size_t)r * ys);
        for (int k = 0; k < nw; k++) {
            /* a weight row's block loaded once for the tile's activation rows */
            const uint8_t *row = rows + (size_t)k * rs, *v = row + 256 * ib, *scale = row + n + 256 * ib;
            const float dw = ((const float *)(row + 2 * n))[ib];
            const __m256i sc16 = load32(row + 2 * n + 4 * nb + 32 * ib);
            __m256i sumi[MQ_NRC];
            for (int r = 0; r < nrc; r++) sumi[r] = q6k_offset(yb + (size_t)r * ys, sc16);
            for (int j = 0; j < 8; j++) {
                const __m256i vj = load32(v + 32 * j), sj = load32(scale + 32 * j);
                for (int r = 0; r < nrc; r++)
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(vj, load32(yb + (size_t)r * ys + 4 + 32 * j)), sj));
            }
            if (batch) { /* the rows' whole sums side by side (lanes past nrc unused): one fused step each */
                const __m256i s4[4] = {sumi[0], sumi[nrc > 1 ? 1 : 0], sumi[nrc > 2 ? 2 : 0], sumi[nrc > 3 ? 3 : 0]};
                acc4[k] = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(dw), _mm_cvtepi32_ps(hsum4_epi32(s4))), _mm_loadu_ps(yd),
                                       acc4[k]);
            } else
                for (int r = 0; r < nrc; r++)
                    acc[k][r] = _mm256_fmadd_ps(_mm256_set1_ps(yd[r] * dw), _mm256_cvtepi32_ps(sumi[r]), acc[k][r]);
        }
    }
    for (int k = 0; k < nw; k++) {
        float a4[4];
        _mm_storeu_ps(a4, acc4[k]);
        for (int r = 0; r < nrc; r++) out[(size_t)r * os + k] = batch ? a4[r] : hsum_ps(acc[k][r]);
    }
}

static void panel_q6k(int type, const uint8_t *rows, size_t rs, int nw, const uint8_t *y, size_t ys, int n, int nrc,
                      float *out, size_t os, const float *yf) {
    (void)type, (void)yf;
#define CALL_Q6K(w_c, r_c) q6k_panel(rows, rs, w_c, y, ys, n, r_c, out, os, 0);
    PANEL_CASES(CALL_Q6K)
#undef CALL_Q6K
}

static void panel_q6k_batch(int type, const uint8_t *rows, size_t rs, int nw, const uint8_t *y, size_t ys, int n,
                            int nrc, float *out, size_t os, const float *yf) {
    (void)type, (void)yf;
#define CALL_Q6K(w_c, r_c) q6k_panel(rows, rs, w_c, y, ys, n, r_c, out, os, 1);
    PANEL_CASES(CALL_Q6K)
#undef CALL_Q6K
}
#undef PANEL_CASES

/* Each kernel for nrc = 1..4 with nrc a constant in its body. */
#define ROWS_KERNEL(name, call)                                                                                     \
    static void name(const uint8_t *w, const uint8_t *y, size_t ys, int n, int nrc, float *out, size_t os,          \
                     const float *yf) {                                                                             \
        (void)yf;                                                                                                   \
        switch (nrc) {                                                                                              \
        case 1: call(1); break;                                                                                     \
        case 2: call(2); break;                                                                                     \
        case 3: call(3); break;                                                                                     \
        default: call(4); break;                                                                                    \
        }                                                                                                           \
    }
#define Q40(k) q32_rows(MQ_Q4_0, w, y, ys, n, k, out, os, yf)
#define Q41(k) q32_rows(MQ_Q4_1, w, y, ys, n, k, out, os, yf)
#define Q50(k) q32_rows(MQ_Q5_0, w, y, ys, n, k, out, os, yf)
#define Q51(k) q32_rows(MQ_Q5_1, w, y, ys, n, k, out, os, yf)
#define Q80(k) q32_rows(MQ_Q8_0, w, y, ys, n, k, out, os, yf)
#define IQ4NL(k) q32_rows(MQ_IQ4_NL, w, y, ys, n, k, out, os, yf)
#define MXFP4(k) q32_rows(MQ_MXFP4, w, y, ys, n, k, out, os, yf)
#define Q4K(k) q45_k_rows(w, y, ys, n, k, out, os, 0, 0)
#define Q5K(k) q45_k_rows(w, y, ys, n, k, out, os, 1, 0)
#define Q6K(k) q6_k_rows(w, y, ys, n, k, out, os, 0)
#define Q5KB(k) q45_k_rows(w, y, ys, n, k, out, os, 1, 1)
#define Q6KB(k) q6_k_rows(w, y, ys, n, k, out, os, 1)
/* The two-row kernels (mq_rows2_fn), nrc a constant in each body as in ROWS_KERNEL. */
#define ROWS2_KERNEL(name, type)                                                                                    \
    static void name(const uint8_t *w, size_t rb, const uint8_t *y, size_t ys, int n, int nrc, float *out,          \
                     size_t os, const float *yf) {                                                                  \
        switch (nrc) {                                                                                              \
        case 1: q32_rows2(type, w, rb, y, ys, n, 1, out, os, yf); break;                                             \
        case 2: q32_rows2(type, w, rb, y, ys, n, 2, out, os, yf); break;                                             \
        case 3: q32_rows2(type, w, rb, y, ys, n, 3, out, os, yf); break;                                             \
        default: q32_rows2(type, w, rb, y, ys, n, 4, out, os, yf); break;                                            \
        }                                                                                                           \
    }
ROWS2_KERNEL(rows2_q4_1, MQ_Q4_1)
ROWS2_KERNEL(rows2_q5_0, MQ_Q5_0)
#undef ROWS2_KERNEL
ROWS_KERNEL(rows_q4_0, Q40)
ROWS_KERNEL(rows_q4_1, Q41)
ROWS_KERNEL(rows_q5_0, Q50)
ROWS_KERNEL(rows_q5_1, Q51)
ROWS_KERNEL(rows_q8_0, Q80)
ROWS_KERNEL(rows_iq4_nl, IQ4NL)
ROWS_KERNEL(rows_mxfp4, MXFP4)
ROWS_KERNEL(rows_q4_k, Q4K)
ROWS_KERNEL(rows_q5_k, Q5K)
ROWS_KERNEL(rows_q6_k, Q6K)
ROWS_KERNEL(rows_q5_k_batch, Q5KB)
ROWS_KERNEL(rows_q6_k_batch, Q6KB)
#undef ROWS_KERNEL

/* The one-row kernels of these types: the same code with nrc = 1. */
#define ONE_ROW(name, rows)                                                                                         \
    static float name(const uint8_t *w, const uint8_t *y, int n) {                                                  \
        float out;                                                                                                  \
        rows(w, y, 0, n, 1, &out, 0, NULL);                                                                               \
        return out;                                                                                                 \
    }
ONE_ROW(dot_q4_0_x, rows_q4_0)
ONE_ROW(dot_q4_1_x, rows_q4_1)
ONE_ROW(dot_q5_0_x, rows_q5_0)
ONE_ROW(dot_q5_1_x, rows_q5_1)
ONE_ROW(dot_q8_0_x, rows_q8_0)
ONE_ROW(dot_iq4_nl_x, rows_iq4_nl)
ONE_ROW(dot_mxfp4_x, rows_mxfp4)
ONE_ROW(dot_q4_k_fast, rows_q4_k)
ONE_ROW(dot_q5_k_fast, rows_q5_k)
ONE_ROW(dot_q6_k_fast, rows_q6_k)
#undef ONE_ROW

/* The partner quantizers as ggml's x86 quantize_row_q8_0 / _q8_1 (AVX2) and quantize_row_q8_K_ref compute
 * them, so the scalar ones' bits (tests/test_quants.py): the largest magnitude by max, x * (127 / amax) rounded
 * to nearest even; Q8_K: x * (-127 / the value of largest magnitude, its first occurrence), at most 127. The
 * scalar ones call nearbyintf per value: a quarter of a generated token's time outside the products. A block
 * holding a NaN or an infinity is quants_common.h's mq_nonfinite_q8(_k), as in the scalar ones. */
static inline __m256i round_i32(__m256 v) {
    return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* 16 int32 in -128..127 as 16 bytes, in order. */
static inline __m128i bytes16(__m256i a, __m256i b) {
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    return _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

static inline float max8(__m256 m) {
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

/* f as float16 (nearest even) in two little-endian bytes at p. */
static inline void put_half(uint8_t *p, float f) {
    const uint16_t h = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

static void half_x(const float *x, int64_t n, uint8_t *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) put_half(y + 2 * i, x[i]);
}

static void q8_x(const float *x, int64_t n, uint8_t *y, int with_sum) {
    const int size = with_sum ? 36 : 34, at = with_sum ? 4 : 2;
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32, y += size) {
        __m256 v[4], m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            const __m256 a = _mm256_andnot_ps(sign, v[j]);
            m = _mm256_max_ps(m, a);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); /* an infinity or a NaN */
        }
        if (_mm256_movemask_ps(bad)) {
            mq_nonfinite_q8(y, with_sum);
            continue;
        }
        const float amax = max8(m), d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = round_i32(_mm256_mul_ps(v[j], _mm256_set1_ps(id)));
        _mm_storeu_si128((__m128i *)(y + at), bytes16(q[0], q[1]));
        _mm_storeu_si128((__m128i *)(y + at + 16), bytes16(q[2], q[3]));
        put_half(y, d);
        if (with_sum)
            put_half(y + 2, d * (float)hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]),
                                                                   _mm256_add_epi32(q[2], q[3]))));
    }
}

static void q8_k_x(const float *x, int64_t n, uint8_t *y) {
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    for (int64_t ib = 0; ib < n / 256; ib++, x += 256, y += 292) {
        __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int j = 0; j < 256; j += 8) {
            const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
            m = _mm256_max_ps(m, a);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
        }
        if (_mm256_movemask_ps(bad)) {
            mq_nonfinite_q8_k(y);
            continue;
        }
        const float amax = max8(m);
        memset(y, 0, 292);
        if (amax == 0.0f) continue;
        /* the first value of that magnitude: every value is finite here, so amax is one of them; the bound keeps
         * the scan inside the block whatever the floats */
        int first = 0;
        while (first < 255 && fabsf(x[first]) != amax) first++;
        const float iscale = -127.f / x[first], d = 1 / iscale;
        const __m256 s = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < 16; j++) {
            const __m256i a = _mm256_min_epi32(round_i32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * j), s)), top);
            const __m256i b = _mm256_min_epi32(round_i32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * j + 8), s)), top);
            _mm_storeu_si128((__m128i *)(y + 4 + 16 * j), bytes16(a, b));
            const int sum = hsum_epi32(_mm256_add_epi32(a, b));
            y[260 + 2 * j] = (uint8_t)sum, y[261 + 2 * j] = (uint8_t)((uint16_t)sum >> 8);
        }
        memcpy(y, &d, 4);
    }
}

#pragma GCC pop_options

static void q8_0_x(const float *x, int64_t n, uint8_t *y) { q8_x(x, n, y, 0); }
static void q8_1_x(const float *x, int64_t n, uint8_t *y) { q8_x(x, n, y, 1); }

/* The AVX2 table (quants.h): one row per ggml type with kernels. */
#define PANEL32 {row_bytes32, unpack32, panel32, NULL}
static const mq_traits traits[MQ_NTYPES] = {
    [MQ_F32] = {MQ_LAYOUT_F32, .quantize = mq_quantize_f32, .dot = dot_f32_avx2},
    [MQ_F16] = {MQ_LAYOUT_F16, .quantize = half_x, .dot = dot_f16_avx2},
    [MQ_BF16] = {MQ_LAYOUT_BF16, .quantize = mq_quantize_bf16, .dot = dot_bf16_avx2},
    [MQ_Q4_0] = {MQ_LAYOUT_Q4_0, .tile_scales = 1, .quantize = q8_0_x, .dot = dot_q4_0_x, .rows = rows_q4_0,
                 .gemv = gemv_q4_0, .panel = PANEL32},
    [MQ_Q4_1] = {MQ_LAYOUT_Q4_1, .tile_scales = 1, .quantize = q8_1_x, .dot = dot_q4_1_x, .rows = rows_q4_1, .rows2 = rows2_q4_1,
                 .gemv = gemv_q4_1, .panel = {row_bytes32, unpack32, mq_panel_q4_1_avx2, NULL}},
    [MQ_Q5_0] = {MQ_LAYOUT_Q5_0, .tile_scales = 1, .quantize = q8_0_x, .dot = dot_q5_0_x, .rows = rows_q5_0, .rows2 = rows2_q5_0,
                 .gemv = gemv_q5_0, .panel = PANEL32,
                 .gemm = {mq_panel_bytes_q5_0_avx2, mq_pack_q5_0_avx2, mq_gemm_q5_0_avx2, NULL}},
    [MQ_Q5_1] = {MQ_LAYOUT_Q5_1, .tile_scales = 1, .quantize = q8_1_x, .dot = dot_q5_1_x, .rows = rows_q5_1,
                 .gemv = gemv_q5_1, .panel = PANEL32},
    [MQ_Q8_0] = {MQ_LAYOUT_Q8_0, .tile_scales = 1, .quantize = q8_0_x, .dot = dot_q8_0_x, .rows = rows_q8_0,
                 .gemv = gemv_q8_0, .panel = PANEL32,
                 .gemm = {mq_panel_bytes_q8_0_avx2, mq_pack_q8_0_avx2, mq_gemm_q8_0_avx2, NULL}},
    [MQ_Q2_K] = {MQ_LAYOUT_Q2_K, .quantize = q8_k_x, .dot = dot_q2_k_avx2},
    [MQ_Q3_K] = {MQ_LAYOUT_Q3_K, .quantize = q8_k_x, .dot = dot_q3_k_x},
    [MQ_Q4_K] = {MQ_LAYOUT_Q4_K, .quantize = q8_k_x, .dot = dot_q4_k_fast, .rows = rows_q4_k, .gemv = gemv_q4_k,
                 .panel = {row_bytes_q4k, unpack_q4k, panel_q4k, NULL},
                 .gemm = {mq_panel_bytes_q4_k_avx2, mq_pack_q4_k_avx2, mq_gemm_q4_k_avx2, NULL}, .experts = mq_experts_q4_k_avx2},
    [MQ_Q5_K] = {MQ_LAYOUT_Q5_K, .quantize = q8_k_x, .dot = dot_q5_k_fast, .rows = rows_q5_k,
                 .rows_batch = rows_q5_k_batch},
    [MQ_Q6_K] = {MQ_LAYOUT_Q6_K, .quantize = q8_k_x, .dot = dot_q6_k_fast, .rows = rows_q6_k,
                 .rows_batch = rows_q6_k_batch, .panel = {row_bytes_q6k, unpack_q6k, panel_q6k, panel_q6k_batch},
                 .gemm = {mq_panel_bytes_q6_k_avx2, mq_pack_q6_k_avx2, NULL, mq_gemm_q6_k_avx2}},
    [MQ_IQ4_NL] = {MQ_LAYOUT_IQ4_NL, .tile_scales = 1, .quantize = q8_0_x, .dot = dot_iq4_nl_x, .rows = rows_iq4_nl,
                   .gemv = gemv_iq4_nl, .panel = PANEL32},
    [MQ_MXFP4] = {MQ_LAYOUT_MXFP4, .tile_scales = 1, .quantize = q8_0_x, .dot = dot_mxfp4_x, .rows = rows_mxfp4,
                  .gemv = mq_gemv_mxfp4_avx2, .experts = mq_experts_mxfp4_avx2, .panel = PANEL32},
    [MQ_IQ4_XS] = {MQ_LAYOUT_IQ4_XS, .quantize = q8_k_x, .dot = mq_dot_iq4_xs_avx2, .rows = mq_rows_iq4_xs_avx2,
                   .rows_batch = mq_rows_iq4_xs_batch_avx2},
    [MQ_IQ2_XXS] = {MQ_LAYOUT_IQ2_XXS, .quantize = q8_k_x, .dot = mq_dot_iq2_xxs,
                    .rows_batch = mq_rows_iq2_xxs_batch},
    [MQ_IQ2_XS] = {MQ_LAYOUT_IQ2_XS, .quantize = q8_k_x, .dot = mq_dot_iq2_xs,
                   .rows_batch = mq_rows_iq2_xs_batch},
    [MQ_IQ2_S] = {MQ_LAYOUT_IQ2_S, .quantize = q8_k_x, .dot = mq_dot_iq2_s,
                  .rows_batch = mq_rows_iq2_s_batch},
    [MQ_IQ3_XXS] = {MQ_LAYOUT_IQ3_XXS, .quantize = q8_k_x, .dot = mq_dot_iq3_xxs,
                    .rows_batch = mq_rows_iq3_xxs_batch},
    [MQ_IQ3_S] = {MQ_LAYOUT_IQ3_S, .quantize = q8_k_x, .dot = mq_dot_iq3_s,
                  .rows_batch = mq_rows_iq3_s_batch},
    [MQ_IQ1_S] = {MQ_LAYOUT_IQ1_S, .quantize = q8_k_x, .dot = mq_dot_iq1_s,
                  .rows_batch = mq_rows_iq1_s_batch},
    [MQ_IQ1_M] = {MQ_LAYOUT_IQ1_M, .quantize = q8_k_x, .dot = mq_dot_iq1_m,
                  .rows_batch = mq_rows_iq1_m_batch},
};
#undef PANEL32

const mq_traits *mq_traits_avx2(void) { return traits; }
#else
const mq_traits *mq_traits_avx2(void) { return 0; }
#endif
