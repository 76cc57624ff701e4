/* AVX2 kernels, chosen at run time by quants.c when the CPU has AVX2 (other CPUs and compilers: this file
 * defines only a stub and the scalar kernels run). Q4_0..Q8_0 and Q3_K keep the scalar kernels' arithmetic: the
 * integer part of each block is computed with SIMD (exact: integer sums do not depend on their order, and each
 * of Q3_K's eight lanes still gets the values p with p % 8 == lane), the float32 terms are added in the same
 * order as in quants_kernels.h, so they give the scalar kernels' bits. Q4_K, Q5_K and Q6_K (most of a Q4_K_M
 * file) are shaped as ggml's own AVX2 kernels, 1.4x faster than lane-exact ones: exact integer sub-block sums,
 * float terms grouped as ggml's AVX2 groups them (equal to float rounding). Q2_K uses quants_kernels.h compiled
 * for AVX2 (the compiler vectorises its integer loops). */
#include "quants_common.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2")
#pragma GCC optimize("O3", "fp-contract=off")
#include <immintrin.h>

#define KNAME(name) name##_avx2
#include "quants_kernels.h"

static inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Sum of x[i] * y[i] over 32 int8 pairs (x may be -128, y never is). */
static inline int dot_i8(__m256i x, __m256i y) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return hsum_i32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* Sum of u[i] * y[i], u unsigned below 64. */
static inline int dot_u8(__m256i u, __m256i y) {
    return hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1)));
}

/* 16 bytes of nibbles as 32 values: low nibbles first (values 0-15), then high (16-31). */
static inline __m256i nibbles(const uint8_t *p) {
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* 32 bits as 32 bytes: 0xFF where the bit is set. */
static inline __m256i bits_to_bytes(const uint8_t *p) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)ld_u32(p)), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

static float dot_q4_0_x(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 18, y += 34) {
        int s = dot_i8(_mm256_sub_epi8(nibbles(w + 2), _mm256_set1_epi8(8)), load32(y + 2));
        sumf += (float)s * f16(ld_u16(w)) * f16(ld_u16(y));
    }
    return sumf;
}

static float dot_q4_1_x(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 20, y += 36) {
        int s = dot_u8(nibbles(w + 4), load32(y + 4));
        sumf += (f16(ld_u16(w)) * f16(ld_u16(y))) * (float)s + f16(ld_u16(w + 2)) * f16(ld_u16(y + 2));
    }
    return sumf;
}

static float dot_q5_0_x(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 22, y += 34) {
        __m256i hi = _mm256_andnot_si256(bits_to_bytes(w + 2), _mm256_set1_epi8((char)0xF0));
        int s = dot_i8(_mm256_or_si256(nibbles(w + 6), hi), load32(y + 2));
        sumf += (f16(ld_u16(w)) * f16(ld_u16(y))) * (float)s;
    }
    return sumf;
}

static float dot_q5_1_x(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 24, y += 36) {
        __m256i hi = _mm256_and_si256(bits_to_bytes(w + 4), _mm256_set1_epi8(0x10));
        int s = dot_u8(_mm256_or_si256(nibbles(w + 8), hi), load32(y + 4));
        sumf += (f16(ld_u16(w)) * f16(ld_u16(y))) * (float)s + f16(ld_u16(w + 2)) * f16(ld_u16(y + 2));
    }
    return sumf;
}

static float dot_q8_0_x(const uint8_t *w, const uint8_t *y, int n) {
    float sumf = 0;
    for (int ib = 0; ib < n / 32; ib++, w += 34, y += 34) {
        int s = dot_i8(load32(w + 2), load32(y + 2));
        sumf += (float)s * (f16(ld_u16(w)) * f16(ld_u16(y)));
    }
    return sumf;
}

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
        sums = lanes_add(sums, f16(ld_u16(w + 108)) * ld_f32(y), aux);
    }
    return lanes_total(0, sums);
}

/* Q4_K/Q5_K/Q6_K as ggml's AVX2 kernels shape them: maddubs of the unsigned quants with the activation bytes,
 * a multiply-add by the sub-block scale, eight float lanes accumulated per block and added at the end. The
 * integer part of every sub-block is exact; the float terms are grouped as ggml's AVX2 groups them, not as the
 * scalar kernels do, so these agree with the references to float rounding (tests/test_quants.py). */
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_q45_k_fast(const uint8_t *w, const uint8_t *y, int n, int five) {
    __m256 acc = _mm256_setzero_ps();
    float summ = 0;
    const int size = five ? 176 : 144;
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int ib = 0; ib < n / 256; ib++, w += size, y += 292) {
        uint8_t sc[8], mn[8];
        kscales(w + 4, sc, mn);
        int sumi_m = 0;
        for (int j = 0; j < 16; j++) sumi_m += ld_i16(y + 260 + 2 * j) * mn[j / 2];
        const uint8_t *q4 = w + (five ? 48 : 16), *q8 = y + 4;
        __m256i hm = load32(w + 16), sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i v = load32(q4 + 32 * j);
            __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(2 * j)), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(2 * j + 1)), one), 4));
            }
            __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32(q8 + 64 * j)), _mm256_set1_epi16(sc[2 * j]));
            __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load32(q8 + 64 * j + 32)),
                                           _mm256_set1_epi16(sc[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        float yd = ld_f32(y);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(f16(ld_u16(w)) * yd), _mm256_cvtepi32_ps(sumi)));
        summ += f16(ld_u16(w + 2)) * yd * (float)sumi_m;
    }
    return hsum_ps(acc) - summ;
}

static float dot_q4_k_fast(const uint8_t *w, const uint8_t *y, int n) { return dot_q45_k_fast(w, y, n, 0); }
static float dot_q5_k_fast(const uint8_t *w, const uint8_t *y, int n) { return dot_q45_k_fast(w, y, n, 1); }

static float dot_q6_k_fast(const uint8_t *w, const uint8_t *y, int n) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), m32 = _mm256_set1_epi8(32);
    for (int ib = 0; ib < n / 256; ib++, w += 210, y += 292) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const uint8_t *q8 = y + 4;
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = load32(w + 64 * h), ql1 = load32(w + 64 * h + 32), qh = load32(w + 128 + 32 * h);
            __m256i v[4] = {
                _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
            };
            for (int k = 0; k < 4; k++) {
                const int s = 8 * h + 2 * k; /* the 16-value groups s and s + 1 */
                __m256i y8 = load32(q8 + 128 * h + 32 * k);
                __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(v[k], y8), _mm256_maddubs_epi16(m32, y8));
                __m256i scale = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(sc[s])),
                                                        _mm_set1_epi16(sc[s + 1]), 1);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale));
            }
        }
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(f16(ld_u16(w + 208)) * ld_f32(y)),
                                               _mm256_cvtepi32_ps(sumi)));
    }
    return hsum_ps(acc);
}

#pragma GCC pop_options

static mq_dot_fn table[MQ_NTYPES];

const mq_dot_fn *mq_kernels_avx2(void) {
    for (int t = 0; t < MQ_NTYPES; t++) table[t] = kernels_avx2[t];
    table[MQ_Q4_0] = dot_q4_0_x, table[MQ_Q4_1] = dot_q4_1_x, table[MQ_Q5_0] = dot_q5_0_x;
    table[MQ_Q5_1] = dot_q5_1_x, table[MQ_Q8_0] = dot_q8_0_x, table[MQ_Q3_K] = dot_q3_k_x;
    table[MQ_Q4_K] = dot_q4_k_fast, table[MQ_Q5_K] = dot_q5_k_fast, table[MQ_Q6_K] = dot_q6_k_fast;
    return table;
}
#else
const mq_dot_fn *mq_kernels_avx2(void) { return 0; }
#endif
