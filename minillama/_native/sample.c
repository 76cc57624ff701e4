/* sample.c: the sampler chain's pass over a whole vocab (sample.h). A heap of the k best so far, its worst at the
 * root; a score goes in only when it beats the root, so after the first k most scores cost one comparison. The
 * AVX2 scan compares 32 scores a step with the root's score rounded down to float (a float that ties or beats
 * the root's double is at least that) and offers only those at least that, or the whole step to the scalar path
 * while the heap fills or when it holds an adjusted id; the scalar scan offers every score. Both give the same ids: the
 * order of the k is total (score, then id), so it does not depend on which scores were looked at first. */
#include "sample.h"

#include <math.h>

#include "cpu.h"

#ifdef MQ_X86_AVX2_BUILD
#include <immintrin.h>
#endif

typedef struct {
    int64_t *idx;
    double *val;
    int64_t n, k; /* held, room */
} heap;

/* a is worse than b: a lower score, or the same score at a later id */
static int worse(double va, int64_t ia, double vb, int64_t ib) { return va < vb || (va == vb && ia > ib); }

static void sift_down(heap *h, int64_t at) {
    for (;;) {
        int64_t w = at, l = 2 * at + 1, r = l + 1;
        if (l < h->n && worse(h->val[l], h->idx[l], h->val[w], h->idx[w])) w = l;
        if (r < h->n && worse(h->val[r], h->idx[r], h->val[w], h->idx[w])) w = r;
        if (w == at) return;
        double v = h->val[at];
        int64_t i = h->idx[at];
        h->val[at] = h->val[w], h->idx[at] = h->idx[w];
        h->val[w] = v, h->idx[w] = i;
        at = w;
    }
}

static void offer(heap *h, double v, int64_t i) {
    if (!(v > -INFINITY)) return; /* -inf, NaN */
    if (h->n < h->k) {            /* room: in at the bottom, up while worse than its parent */
        int64_t at = h->n++;
        while (at > 0) {
            int64_t p = (at - 1) / 2;
            if (!worse(v, i, h->val[p], h->idx[p])) break;
            h->val[at] = h->val[p], h->idx[at] = h->idx[p];
            at = p;
        }
        h->val[at] = v, h->idx[at] = i;
    } else if (worse(h->val[0], h->idx[0], v, i)) {
        h->val[0] = v, h->idx[0] = i;
        sift_down(h, 0);
    }
}

/* x[lo..hi) one by one: the adjusted ids' scores from adj (from *j on), a NaN noted in *nan */
static void scan_scalar(heap *h, const float *x, int64_t lo, int64_t hi, const int64_t *adj_idx, const double *adj_val,
                        int64_t m, int64_t *j, int *nan) {
    for (int64_t i = lo; i < hi; i++) {
        const float f = x[i];
        if (f != f) *nan = 1;
        if (*j < m && adj_idx[*j] == i)
            offer(h, adj_val[(*j)++], i);
        else
            offer(h, (double)f, i);
    }
}

/* The largest float at most v (v a kept score or -inf): a float that ties or beats v is at least this. */
static float floor_float(double v) {
    float f = (float)v;
    if ((double)f > v) f = nextafterf(f, -INFINITY);
    return f;
}

#ifdef MQ_X86_AVX2_BUILD
#pragma GCC push_options
#pragma GCC target("avx2")
/* 32 scores a step: the ones at least `bar` offered one by one (all 32 while the heap fills, or when the step
 * holds an adjusted id), a NaN among them noted */
static void scan_avx2(heap *h, const float *x, int64_t n, const int64_t *adj_idx, const double *adj_val, int64_t m,
                      int *nan) {
    int64_t j = 0, i = 0;
    float bar = -INFINITY; /* floor_float of the root's score once the heap is full */
    __m256 nans = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8), v2 = _mm256_loadu_ps(x + i + 16),
                     v3 = _mm256_loadu_ps(x + i + 24);
        nans = _mm256_or_ps(nans, _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(v0, v0, _CMP_UNORD_Q),
                                                            _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q)),
                                               _mm256_or_ps(_mm256_cmp_ps(v2, v2, _CMP_UNORD_Q),
                                                            _mm256_cmp_ps(v3, v3, _CMP_UNORD_Q))));
        if (h->n < h->k || (j < m && adj_idx[j] < i + 32)) {
            scan_scalar(h, x, i, i + 32, adj_idx, adj_val, m, &j, nan);
        } else {
            const __m256 b = _mm256_set1_ps(bar);
            uint32_t may = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v0, b, _CMP_GE_OQ)) |
                           (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v1, b, _CMP_GE_OQ)) << 8 |
                           (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v2, b, _CMP_GE_OQ)) << 16 |
                           (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v3, b, _CMP_GE_OQ)) << 24;
            if (!may) continue;
            for (; may; may &= may - 1) {
                const int64_t at = i + __builtin_ctz(may);
                offer(h, (double)x[at], at);
            }
        }
        if (h->n == h->k) bar = floor_float(h->val[0]);
    }
    scan_scalar(h, x, i, n, adj_idx, adj_val, m, &j, nan);
    if (_mm256_movemask_ps(nans)) *nan = 1;
}
#pragma GCC pop_options
#endif

int64_t ms_top_k(const float *x, int64_t n, const int64_t *adj_idx, const double *adj_val, int64_t m, int64_t k,
                 int64_t *idx, double *val) {
    heap h = {idx, val, 0, k < 0 ? 0 : k};
    int nan = 0;
    if (h.k == 0) { /* nothing kept, but a NaN is still the scores' fault */
        for (int64_t i = 0; i < n; i++)
            if (x[i] != x[i]) return -1;
        return 0;
    }
#ifdef MQ_X86_AVX2_BUILD
    if (mq_cpu_isa() == MQ_ISA_AVX2)
        scan_avx2(&h, x, n, adj_idx, adj_val, m, &nan);
    else
#endif
    {
        int64_t j = 0;
        scan_scalar(&h, x, 0, n, adj_idx, adj_val, m, &j, &nan);
    }
    if (nan) return -1;
    /* heap order to best first: take the worst off the root into the last place, n times */
    for (int64_t end = h.n - 1; end > 0; end--) {
        double v = h.val[0];
        int64_t i = h.idx[0];
        h.val[0] = h.val[end], h.idx[0] = h.idx[end];
        h.val[end] = v, h.idx[end] = i;
        heap rest = {h.idx, h.val, end, h.k};
        sift_down(&rest, 0);
    }
    return h.n;
}
