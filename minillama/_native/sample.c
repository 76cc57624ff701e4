/* sample.c: the sampler chain's pass over a whole vocab (sample.h). The model's float scores go through a sorted
 * array of the k best so far as 64-bit keys: the float's bits made to sort as integers, then the id inverted (a
 * higher score, then a lower id, is a larger key), so that a score goes in with one integer comparison and moves up
 * past the worse ones with one each. The AVX2 scan compares 32 scores a step with the worst kept and offers only
 * those at least that, or the whole step to the scalar path while the array fills or when the step holds an
 * adjusted id; the scalar scan offers every score. The adjusted ids' scores (doubles: a score plus a bias) are
 * left out of the scan and merged at the end with the k kept, in the same order (score, then id), so both scans
 * give the same ids: the order is total, whatever order the scores were looked at in. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#ifdef MQ_X86_AVX2_BUILD
#include <immintrin.h>
#endif

typedef struct {
    uint64_t *key; /* the best n so far, best first */
    int64_t n, k;  /* held, room */
} kept;

/* f (not NaN) as an integer of the same order, -0.0 as 0.0 (they are equal scores) */
static inline uint32_t order_bits(float f) {
    f += 0.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static inline float bits_float(uint32_t b) {
    uint32_t u = (b & 0x80000000u) ? (b & 0x7fffffffu) : ~b;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* inlined, so that the AVX2 scan's copy is VEX code: a call from it into legacy SSE code cost ~150 ns a score
 * (the upper halves of the ymm registers dirty across the call) */
static inline __attribute__((always_inline)) void offer(kept *h, float f, int64_t i) {
    if (!(f > -INFINITY)) return; /* -inf, NaN */
    const uint64_t key = (uint64_t)order_bits(f) << 32 | (uint32_t)(UINT32_MAX - (uint32_t)i);
    uint64_t *a = h->key;
    int64_t at;
    if (h->n < h->k)
        at = h->n++;
    else if (key > a[h->k - 1])
        at = h->k - 1; /* the worst goes */
    else
        return;
    for (; at > 0 && a[at - 1] < key; at--) a[at] = a[at - 1]; /* up past the worse ones */
    a[at] = key;
}

/* x[lo..hi) one by one, the adjusted ids (from *j on) left out, a NaN noted in *nan */
static inline __attribute__((always_inline)) void scan_scalar(kept *h, const float *x, int64_t lo, int64_t hi,
                                                              const int64_t *adj_idx, int64_t m, int64_t *j,
                                                              int *nan) {
    for (int64_t i = lo; i < hi; i++) {
        const float f = x[i];
        if (f != f) *nan = 1;
        if (*j < m && adj_idx[*j] == i)
            (*j)++;
        else
            offer(h, f, i);
    }
}

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2")
static void scan_avx2(kept *h, const float *x, int64_t n, const int64_t *adj_idx, int64_t m, int *nan) {
    int64_t j = 0, i = 0;
    __m256 nans = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8), v2 = _mm256_loadu_ps(x + i + 16),
                     v3 = _mm256_loadu_ps(x + i + 24);
        nans = _mm256_or_ps(nans, _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(v0, v0, _CMP_UNORD_Q),
                                                            _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q)),
                                               _mm256_or_ps(_mm256_cmp_ps(v2, v2, _CMP_UNORD_Q),
                                                            _mm256_cmp_ps(v3, v3, _CMP_UNORD_Q))));
        if (h->n < h->k || (j < m && adj_idx[j] < i + 32)) {
            scan_scalar(h, x, i, i + 32, adj_idx, m, &j, nan);
            continue;
        }
        const __m256 b = _mm256_set1_ps(bits_float((uint32_t)(h->key[h->k - 1] >> 32))); /* the worst kept */
        uint32_t may = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v0, b, _CMP_GE_OQ)) |
                       (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v1, b, _CMP_GE_OQ)) << 8 |
                       (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v2, b, _CMP_GE_OQ)) << 16 |
                       (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v3, b, _CMP_GE_OQ)) << 24;
        for (; may; may &= may - 1) {
            const int64_t at = i + __builtin_ctz(may);
            offer(h, x[at], at);
        }
    }
    scan_scalar(h, x, i, n, adj_idx, m, &j, nan);
    if (_mm256_movemask_ps(nans)) *nan = 1;
}
#pragma GCC pop_options
#endif

/* a is better than b: a higher score, or the same score at a lower id */
static int better(double va, int64_t ia, double vb, int64_t ib) { return va > vb || (va == vb && ia < ib); }

int64_t ms_top_k(const float *x, int64_t n, const int64_t *adj_idx, const double *adj_val, int64_t m, int64_t k,
                 int64_t *idx, double *val) {
    if (k <= 0 || n > (int64_t)UINT32_MAX) { /* nothing kept (or no room in a key), but a NaN is still a fault */
        for (int64_t i = 0; i < n; i++)
            if (x[i] != x[i]) return -1;
        return k <= 0 ? 0 : -2;
    }
    uint64_t *keys = malloc((size_t)k * sizeof *keys);
    if (!keys) return -3;
    kept h = {keys, 0, k};
    int nan = 0;
#ifdef MQ_X86_AVX2_BUILD
    if (mq_cpu_isa() == MQ_ISA_AVX2)
        scan_avx2(&h, x, n, adj_idx, m, &nan);
    else
#endif
    {
        int64_t j = 0;
        scan_scalar(&h, x, 0, n, adj_idx, m, &j, &nan);
    }
    if (nan) {
        free(keys);
        return -1;
    }
    /* the k kept and the adjusted ones (-inf and NaN left out), best first by insertion: k + m at most */
    int64_t kept = 0;
    for (int64_t s = 0; s < h.n + m; s++) {
        double v;
        int64_t i;
        if (s < h.n) {
            v = (double)bits_float((uint32_t)(keys[s] >> 32));
            i = (int64_t)(UINT32_MAX - (uint32_t)keys[s]);
        } else {
            v = adj_val[s - h.n], i = adj_idx[s - h.n];
            if (!(v > -INFINITY)) continue;
        }
        if (kept == k && !better(v, i, val[k - 1], idx[k - 1])) continue;
        int64_t at = kept < k ? kept++ : k - 1;
        while (at > 0 && better(v, i, val[at - 1], idx[at - 1])) val[at] = val[at - 1], idx[at] = idx[at - 1], at--;
        val[at] = v, idx[at] = i;
    }
    free(keys);
    return kept;
}
