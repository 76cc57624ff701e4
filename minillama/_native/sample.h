/* sample.c: the top-k of a vocab's scores, the one pass over every score that the sampler chain makes (the rest of
 * the chain -- top-p, min-p, temperature, the draw -- works on those k in Python, minillama/sampling.py). */
#ifndef MINILLAMA_SAMPLE_H
#define MINILLAMA_SAMPLE_H

#include <stdint.h>

/* The k best of n scores, best first, equal scores in index order (the first k of a stable sort of the scores,
 * highest first): score i is x[i] widened to double, or adj_val[j] where adj_idx[j] == i (m pairs, adj_idx
 * ascending and < n: the ids a logit bias or a penalty changed). A score that is -inf or NaN is never kept.
 * Writes the kept ids and scores to idx[0..] and val[0..] (room for k each); returns how many were kept (fewer
 * than k when fewer scores are kept at all), or -1 when some x[i] is NaN (the model's scores are broken), -2 when n
 * is past 2^32 - 1, -3 when memory ran out. */
int64_t ms_top_k(const float *x, int64_t n, const int64_t *adj_idx, const double *adj_val, int64_t m, int64_t k,
                 int64_t *idx, double *val);

#endif
