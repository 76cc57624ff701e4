/* AVX2 products for the mixture-of-experts feed-forward, for quants_avx2.c's table: the experts kernels (quants.h's
 * mq_experts_fn) of MXFP4 (gpt-oss's experts) and of Q4_K (Qwen3-30B-A3B's), which multiply an expert's rows in
 * a prompt each with the bits of the type's gemv (llama.cpp's mul_mat_id runs its repacked gemv row by row) but
 * unpack each weight block once for several rows; and MXFP4's gemv (a decode step), which is its experts kernel
 * for one row.
 *
 * MXFP4 (bound by its instructions, not by memory: the work per block is what counts), eight weight rows at a time.
 * Bits: as ggml_gemv_mxfp4_8x8_q8_0 (llama.cpp repacks MXFP4 as Q4_0, eight rows interleaved), each output is one
 * float chain over the blocks, acc = fmaf((float)isum, d_w x d_y, acc), isum the block's exact integer dot. Only
 * how isum is found differs from quants_avx2.c's Q4_0-form kernels (integer sums inside a block reorganised):
 * - the grid lookup gives the value + 12 (0..24, unsigned), so one _mm256_maddubs_epi16 takes a weight byte and an
 *   activation byte as they are (no sign trick); 12 x the activation block's sum, made once per product, is taken
 *   off after;
 * - two weight rows' 16 nibble bytes share a register (row a in the low 128 bits, row b in the high), against the
 *   activation's halves broadcast to both: one lookup and one multiply-add of pairs serve two rows;
 * - eight rows' four-lane partial sums are reduced together by three horizontal adds (lanes: rows 0 2 4 6 1 3 5 7),
 *   and their eight chains step as one vector, E8M0 scales widened eight at a time. */
#include <math.h>

#include "cpu.h"
#include "quants_common.h"

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O3", "fp-contract=off")
#include <immintrin.h>

#include "quants_avx2.h"

#define OFFSET 12  /* the grid's values + OFFSET are 0..24: maddubs pairs stay far inside int16 */
#define TILE 8     /* activation rows that share each unpacked weight block */
#define CHUNK 128  /* activation blocks whose sums are made at once (4096 columns); longer rows go in pieces */
#define MX_BYTES 17 /* an MXFP4 block: the E8M0 byte, 16 bytes of nibbles */
#define Y_BYTES 34  /* a Q8_0 block */
#define GEMV_AHEAD 2 /* groups of rows ahead that Q4_K's prefetch reads, as quants_avx2.c's gemv_q4_k */

/* The lane order of a group's sums (sums8), and the permutations between it and row order. */
#define TO_ROWS _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)
#define TO_LANES _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)

static inline __m256i grid_u(void) {
    static const int8_t g[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0}; /* mxfp4 + OFFSET */
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)g));
}

/* The E8M0 bytes of the block at w in eight rows (rb apart), in sums8's lane order, as e8m0_half computes them. */
static inline __m256 scales8(const uint8_t *w, size_t rb) {
    const __m256i e = _mm256_setr_epi32(w[0], w[2 * rb], w[4 * rb], w[6 * rb], w[rb], w[3 * rb], w[5 * rb], w[7 * rb]);
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

/* Two rows' blocks (at a and b) through the grid: lo = values 0-15 of a | of b, hi = values 16-31. */
static inline void pair(const uint8_t *a, const uint8_t *b, __m256i g, __m256i *lo, __m256i *hi) {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + 1))),
                                              _mm_loadu_si128((const __m128i *)(b + 1)), 1);
    const __m256i m = _mm256_set1_epi8(0x0F);
    *lo = _mm256_shuffle_epi8(g, _mm256_and_si256(v, m));
    *hi = _mm256_shuffle_epi8(g, _mm256_and_si256(_mm256_srli_epi16(v, 4), m));
}

/* A pair's products with one activation block (ylo, yhi its halves in both 128-bit lanes): four int32 lanes of
 * row a, then four of row b (each maddubs lane at most 2 x 24 x 128, their sum inside int16). */
static inline __m256i pair_dot(__m256i lo, __m256i hi, __m256i ylo, __m256i yhi) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi)),
                             _mm256_set1_epi16(1));
}

/* Four pairs' lanes as eight rows' whole sums, lanes in the order rows 0 2 4 6 1 3 5 7. */
static inline __m256i sums8(__m256i p01, __m256i p23, __m256i p45, __m256i p67) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(p01, p23), _mm256_hadd_epi32(p45, p67));
}

/* For activation blocks c0..c1 of nrc rows (ys apart): OFFSET x each block's sum of quants, and its d as float
 * (block c0 + i of row j at [j * CHUNK + i]). */
static void act_sums(const uint8_t *y, size_t ys, int nrc, int c0, int c1, int32_t *cs, float *dy) {
    const __m256i off = _mm256_set1_epi8(OFFSET), one = _mm256_set1_epi16(1);
    for (int j = 0; j < nrc; j++)
        for (int ib = c0; ib < c1; ib++) {
            const uint8_t *yb = y + (size_t)j * ys + (size_t)ib * Y_BYTES;
            const __m256i s = _mm256_madd_epi16(
                _mm256_maddubs_epi16(off, _mm256_loadu_si256((const __m256i *)(yb + 2))), one);
            cs[j * CHUNK + ib - c0] = hsum_epi32(s);
            dy[j * CHUNK + ib - c0] = h2f(ld_u16(yb));
        }
}

/* Eight rows (rb apart, at w) against nrc activation rows over blocks c0..c1: out[j * os + 0..7] holds the chains
 * (read back unless first). */
static inline __attribute__((always_inline)) void group(const uint8_t *w, size_t rb, const uint8_t *y, size_t ys,
                                                        int c0, int c1, const int nrc, const int32_t *cs,
                                                        const float *dy, float *out, size_t os, int first) {
    __m256 acc[TILE];
    for (int j = 0; j < nrc; j++)
        acc[j] = first ? _mm256_setzero_ps()
                       : _mm256_permutevar8x32_ps(_mm256_loadu_ps(out + (size_t)j * os), TO_LANES);
    const __m256i g = grid_u();
    /* the group two on, walked as its bytes in order at this group's pace: an address, maybe past the matrix */
    uintptr_t ahead = (uintptr_t)w + 2 * 8 * rb + (uintptr_t)c0 * 8 * MX_BYTES;
    for (int ib = c0; ib < c1; ib++, ahead += 8 * MX_BYTES) {
        _mm_prefetch((const char *)ahead, _MM_HINT_T0);
        _mm_prefetch((const char *)(ahead + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(ahead + 128), _MM_HINT_T0);
        const uint8_t *wb = w + (size_t)ib * MX_BYTES;
        __m256i lo[4], hi[4];
        for (int p = 0; p < 4; p++) pair(wb + 2 * p * rb, wb + (2 * p + 1) * rb, g, &lo[p], &hi[p]);
        const __m256 dw = scales8(wb, rb);
        for (int j = 0; j < nrc; j++) {
            const uint8_t *yb = y + (size_t)j * ys + (size_t)ib * Y_BYTES;
            const __m256i ylo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(yb + 2)));
            const __m256i yhi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(yb + 18)));
            __m256i s = sums8(pair_dot(lo[0], hi[0], ylo, yhi), pair_dot(lo[1], hi[1], ylo, yhi),
                              pair_dot(lo[2], hi[2], ylo, yhi), pair_dot(lo[3], hi[3], ylo, yhi));
            s = _mm256_sub_epi32(s, _mm256_set1_epi32(cs[j * CHUNK + ib - c0]));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(dy[j * CHUNK + ib - c0])),
                                     acc[j]);
        }
    }
    for (int j = 0; j < nrc; j++) _mm256_storeu_ps(out + (size_t)j * os, _mm256_permutevar8x32_ps(acc[j], TO_ROWS));
}

/* One row against one activation row, the same chain (the rows past the last group of eight). */
static float row_dot(const uint8_t *w, const uint8_t *y, int n) {
    const __m128i g = _mm_loadu_si128((const __m128i *)mq_kvalues_mxfp4), m = _mm_set1_epi8(0x0F);
    float acc = 0;
    for (int ib = 0; ib < n / 32; ib++, w += MX_BYTES, y += Y_BYTES) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(w + 1));
        const __m128i lo = _mm_shuffle_epi8(g, _mm_and_si128(v, m));
        const __m128i hi = _mm_shuffle_epi8(g, _mm_and_si128(_mm_srli_epi16(v, 4), m));
        const __m128i plo = _mm_maddubs_epi16(_mm_sign_epi8(lo, lo),
                                              _mm_sign_epi8(_mm_loadu_si128((const __m128i *)(y + 2)), lo));
        const __m128i phi = _mm_maddubs_epi16(_mm_sign_epi8(hi, hi),
                                              _mm_sign_epi8(_mm_loadu_si128((const __m128i *)(y + 18)), hi));
        __m128i s = _mm_madd_epi16(_mm_add_epi16(plo, phi), _mm_set1_epi16(1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
        acc = fmaf((float)_mm_cvtsi128_si32(s), e8m0_half(w[0]) * h2f(ld_u16(y)), acc);
    }
    return acc;
}

/* CALL(k) for a tile of nt (1..TILE) activation rows, k a constant where it is inlined. */
#define TILE_CASES(nt, CALL)                                                                                       \
    switch (nt) {                                                                                                  \
    case 1: CALL(1); break;                                                                                        \
    case 2: CALL(2); break;                                                                                        \
    case 3: CALL(3); break;                                                                                        \
    case 4: CALL(4); break;                                                                                        \
    case 5: CALL(5); break;                                                                                        \
    case 6: CALL(6); break;                                                                                        \
    case 7: CALL(7); break;                                                                                        \
    default: CALL(8); break;                                                                                       \
    }

void mq_experts_mxfp4_avx2(const uint8_t *w, size_t rb, int64_t rows, const uint8_t *y, size_t ys, int n, int nrc,
                           float *out, size_t os) {
    int32_t cs[TILE * CHUNK];
    float dy[TILE * CHUNK];
    const int nb = n / 32;
    const int64_t full = rows & ~(int64_t)7;
    for (int j0 = 0; j0 < nrc; j0 += TILE) {
        const int nt = nrc - j0 < TILE ? nrc - j0 : TILE;
        const uint8_t *yt = y + (size_t)j0 * ys;
        float *ot = out + (size_t)j0 * os;
        for (int c0 = 0; c0 < nb; c0 += CHUNK) {
            const int c1 = nb - c0 < CHUNK ? nb : c0 + CHUNK;
            act_sums(yt, ys, nt, c0, c1, cs, dy);
            for (int64_t g = 0; g < full; g += 8) {
                const uint8_t *wg = w + (size_t)g * rb;
#define GROUP(k) group(wg, rb, yt, ys, c0, c1, k, cs, dy, ot + g, os, c0 == 0)
                TILE_CASES(nt, GROUP)
#undef GROUP
            }
        }
        for (int64_t r = full; r < rows; r++)
            for (int j = 0; j < nt; j++)
                ot[(size_t)j * os + (size_t)r] = row_dot(w + (size_t)r * rb, yt + (size_t)j * ys, n);
    }
}

void mq_gemv_mxfp4_avx2(const uint8_t *w, size_t rb, int64_t rows, const uint8_t *y, int n, float *out) {
    mq_experts_mxfp4_avx2(w, rb, rows, y, 0, n, 1, out, 0);
}

/* Q4_K rows against several activation rows, each pair with gemv_q4_k's float operations (llama.cpp's
 * ggml_gemv_q4_K_8x8_q8_K, which its mul_mat_id runs row by row): a group of four weight rows, each row's block
 * unpacked once (k_quants, its scales) for a tile of up to TILE activation rows; each pair's whole sums (k_parts
 * and the mins) reduced four weight rows side by side, their chains stepped together. Rows past the last group of
 * four take the same steps in a group of their own (the unused lanes thrown away). */
static inline __attribute__((always_inline)) void q4k_group(const uint8_t *w, size_t rb, const int nr,
                                                            const uint8_t *y, size_t ys, int n, const int nrc,
                                                            float *out, size_t os) {
    const __m256i split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7); /* d x y's d to lanes 0-3, dmin x it to 4-7 */
    __m128 acc[TILE], accm[TILE];
    for (int j = 0; j < nrc; j++) acc[j] = _mm_setzero_ps(), accm[j] = _mm_setzero_ps();
    uintptr_t ahead = (uintptr_t)w + GEMV_AHEAD * 4 * rb; /* as in gemv_q4_k: an address, maybe past the end */
    for (int ib = 0; ib < n / 256; ib++, ahead += 4 * 144) {
        for (int l = 0; l < 4 * 144; l += 64) _mm_prefetch((const char *)(ahead + (uintptr_t)l), _MM_HINT_T0);
        const uint8_t *yb = y + (size_t)ib * 292;
        __m256i s[TILE][4], m[TILE][4];
        uint32_t dmr[4] = {0, 0, 0, 0};
        for (int r = 0; r < 4; r++) {
            if (r >= nr) {
                for (int j = 0; j < nrc; j++) s[j][r] = m[j][r] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *wr = w + (size_t)r * rb + (size_t)ib * 144;
            const __m128i scm = kscales_x(wr + 4);
            const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
            const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
            __m256i lo[4], hi[4];
            k_quants(wr, 0, lo, hi);
            dmr[r] = ld_u32(wr);
            for (int j = 0; j < nrc; j++) {
                const uint8_t *yr = yb + (size_t)j * ys;
                __m256i p[4];
                k_parts(lo, hi, sc16, yr + 4, p);
                s[j][r] = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
                m[j][r] = _mm256_madd_epi16(load32(yr + 260), mins16);
            }
        }
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dmr));
        for (int j = 0; j < nrc; j++) {
            const __m256 f = _mm256_permutevar8x32_ps(_mm256_mul_ps(dm, _mm256_set1_ps(ld_f32(yb + (size_t)j * ys))),
                                                      split);
            acc[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(s[j])), _mm256_castps256_ps128(f), acc[j]);
            accm[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(m[j])), _mm256_extractf128_ps(f, 1), accm[j]);
        }
    }
    for (int j = 0; j < nrc; j++) {
        float o[4];
        _mm_storeu_ps(o, _mm_sub_ps(acc[j], accm[j]));
        for (int r = 0; r < nr; r++) out[(size_t)j * os + (size_t)r] = o[r];
    }
}

void mq_experts_q4_k_avx2(const uint8_t *w, size_t rb, int64_t rows, const uint8_t *y, size_t ys, int n, int nrc,
                          float *out, size_t os) {
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? (int)(rows - r0) : 4;
        for (int j0 = 0; j0 < nrc; j0 += TILE) {
            const uint8_t *wg = w + (size_t)r0 * rb, *yt = y + (size_t)j0 * ys;
            float *o = out + (size_t)j0 * os + (size_t)r0;
#define GROUP(k) q4k_group(wg, rb, nr, yt, ys, n, k, o, os)
            TILE_CASES(nrc - j0 < TILE ? nrc - j0 : TILE, GROUP)
#undef GROUP
        }
    }
}

#pragma GCC pop_options
#else
typedef int mq_mxfp4_avx2_empty; /* ISO C wants a declaration in every file */
#endif
