/* The kernels of quants_kernels.h compiled for AVX2 (the compiler vectorises their integer loops; the float
 * order is unchanged, so they give the scalar kernels' bits). Chosen at run time by quants.c when the CPU has
 * AVX2; on other CPUs and compilers this file defines nothing and the scalar kernels run. */
#include "quants_common.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2")
#pragma GCC optimize("O3", "fp-contract=off")
#define KNAME(name) name##_avx2
#include "quants_kernels.h"
#pragma GCC pop_options

const mq_dot_fn *mq_kernels_avx2(void) { return kernels_avx2; }
#else
const mq_dot_fn *mq_kernels_avx2(void) { return 0; }
#endif
