/* cpu.c: the instruction set the kernels run (quants.c's products, attention.c, swiglu.c), chosen once. */
#ifndef MINILLAMA_CPU_H
#define MINILLAMA_CPU_H

/* The builds that compile AVX2 kernels (GCC's target pragmas on x86); elsewhere only the scalar ones exist. */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define MQ_X86_AVX2_BUILD 1
#endif

enum { MQ_ISA_SCALAR, MQ_ISA_AVX2 };

/* MQ_ISA_AVX2 when this build has the AVX2 kernels and the CPU has AVX2, FMA and F16C, unless the environment
 * says MINILLAMA_KERNELS=scalar; else MQ_ISA_SCALAR. Decided on the first call, the same answer after it. */
int mq_cpu_isa(void);

#endif
