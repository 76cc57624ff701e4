/* The choice of instruction set, made once for every kernel (see cpu.h). */
#define _POSIX_C_SOURCE 200809L
#include "cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static int isa = MQ_ISA_SCALAR;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void choose(void) {
#ifdef MQ_X86_AVX2_BUILD
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        isa = MQ_ISA_AVX2;
#endif
    const char *forced = getenv("MINILLAMA_KERNELS");
    if (forced && strcmp(forced, "scalar") == 0) isa = MQ_ISA_SCALAR;
}

int mq_cpu_isa(void) {
    pthread_once(&once, choose);
    return isa;
}
