/* quants.c: matrix products of ggml quantized weights (read in place, never dequantized) with float32
 * activations, as ggml computes them: each activation row quantized once to the type's partner (Q8_0, Q8_1,
 * Q8_K; F16/BF16/F32 for the float types), integer dot products per block, float32 sums in ggml's order.
 *
 * Everything minillama knows of a weight type is one mq_traits row, indexed by the ggml type number, in one
 * table per instruction set: quants.c's for the scalar kernels (quants_kernels.h), quants_avx2.c's for AVX2.
 * cpu.c chooses the instruction set once; the products read that table's rows only. A type runs in C exactly
 * when it has a row (_core.quant_types() lists them for Python). A new type is its MQ_LAYOUT_* line here, a row
 * in each table and its kernels. */
#ifndef MINILLAMA_QUANTS_H
#define MINILLAMA_QUANTS_H

#include <stddef.h>
#include <stdint.h>

/* ggml's type numbers (enum ggml_type), the weight types with kernels and their partners. */
enum {
    MQ_F32 = 0, MQ_F16 = 1, MQ_Q4_0 = 2, MQ_Q4_1 = 3, MQ_Q5_0 = 6, MQ_Q5_1 = 7, MQ_Q8_0 = 8, MQ_Q8_1 = 9,
    MQ_Q2_K = 10, MQ_Q3_K = 11, MQ_Q4_K = 12, MQ_Q5_K = 13, MQ_Q6_K = 14, MQ_Q8_K = 15, MQ_IQ2_XXS = 16,
    MQ_IQ2_XS = 17, MQ_IQ3_XXS = 18, MQ_IQ1_S = 19, MQ_IQ4_NL = 20, MQ_IQ3_S = 21, MQ_IQ2_S = 22, MQ_IQ4_XS = 23,
    MQ_IQ1_M = 29, MQ_BF16 = 30, MQ_MXFP4 = 39,
    MQ_NTYPES /* rows in a traits table */
};

/* One weight row (n values) against one activation row quantized to the partner. */
typedef float (*mq_dot_fn)(const uint8_t *w, const uint8_t *y, int n);

/* One weight row against nrc (1..MQ_NRC) activation rows at once (row j at y + j * y_stride): out[j * out_stride]
 * = the row's dot with row j. The weight blocks are unpacked once for all nrc rows (a prompt's product). yf: for
 * the types whose row says tile_scales, the rows' block scales as float32, made once per product (block b's d of
 * row j at yf[b * MQ_NRC + j], Q8_1's s at yf[(n / 32 + b) * MQ_NRC + j]); NULL: read from y. */
#define MQ_NRC 4
typedef void (*mq_dotn_fn)(const uint8_t *w, const uint8_t *y, size_t y_stride, int n, int nrc, float *out,
                           size_t out_stride, const float *yf);

/* Two weight rows (w and w + row_bytes) against nrc (1..MQ_NRC) activation rows with their tile scales yf (as
 * mq_dotn_fn's): out[j * out_stride + k] = weight row k's dot with row j, by the float operations of the type's
 * rows kernel, so with its bits (batched decode steps: each activation block loaded once for both rows). */
typedef void (*mq_rows2_fn)(const uint8_t *w, size_t row_bytes, const uint8_t *y, size_t y_stride, int n, int nrc,
                            float *out, size_t out_stride, const float *yf);

/* A matrix of rows weight rows (row_bytes apart) against one activation row y: out[r] = row r's dot with y, with
 * the bits of the type's one-row kernel (a decode step's products, several weight rows at a time). */
typedef void (*mq_gemv_fn)(const uint8_t *w, size_t row_bytes, int64_t rows, const uint8_t *y, int n, float *out);

/* A matrix of rows weight rows against nrc activation rows (y_stride apart): out[j * out_stride + r] = row r's dot
 * with row j, each with the bits of the type's gemv (an expert's rows in a prompt: llama.cpp's mul_mat_id runs
 * its gemv row by row), the weight blocks unpacked once for several activation rows. */
typedef void (*mq_experts_fn)(const uint8_t *w, size_t row_bytes, int64_t rows, const uint8_t *y, size_t y_stride,
                              int n, int nrc, float *out, size_t out_stride);

/* A prompt's product with each weight row unpacked once rather than once per tile of activation rows. A panel row
 * is one weight row of n values unpacked into row_bytes(n) bytes (the quants as bytes, the block scales as
 * floats). panel: nw (1..2) panel rows (row_stride bytes apart) against nrc (1..MQ_NRC) activation rows (y_stride
 * apart; yf their tile scales, as for mq_dotn_fn): out[i * out_stride + k] = panel row k's dot with activation row
 * i, by the same float operations as the type's rows kernel, so with the same bits. */
typedef void (*mq_panel_fn)(int type, const uint8_t *rows, size_t row_stride, int nw, const uint8_t *y,
                            size_t y_stride, int n, int nrc, float *out, size_t out_stride, const float *yf);
typedef struct {
    size_t (*row_bytes)(int n);
    void (*unpack)(int type, const uint8_t *w, int n, uint8_t *row);
    mq_panel_fn panel;       /* NULL: no panel kernels (the rows kernels unpack per tile) */
    mq_panel_fn panel_batch; /* the MQ_BATCH form where the type has one (else NULL) */
} mq_panel;

/* A prompt's product as an integer GEMM: MQ_GEMM_ROWS weight rows packed side by side (pack: rows nw (1..8) rows
 * row_bytes apart, n values each, into one panel of panel_bytes(n) bytes; a missing row repeats the last), so that
 * one register holds a value group of all of them and each int32 lane of the kernel's sums is one weight row.
 * kernel: the panel against nrc (1..MQ_NRC) activation rows (y_stride apart): out[i * out_stride + k] = weight
 * row k's dot with activation row i for k < nw, by the same float operations as the type's rows kernel, so with
 * the same bits. The packing is made per product (each weight row once for all the batch's tiles), so it costs
 * no memory beside the mapping and no load time. */
#define MQ_GEMM_ROWS 8
typedef void (*mq_gemm_fn)(const uint8_t *panel, int n, const uint8_t *y, size_t y_stride, int nrc, float *out,
                           size_t out_stride, int nw);
typedef struct {
    size_t (*panel_bytes)(int n);
    void (*pack)(const uint8_t *w, size_t row_bytes, int nw, int n, uint8_t *panel);
    mq_gemm_fn kernel;       /* NULL: no gemm kernels */
    mq_gemm_fn kernel_batch; /* the MQ_BATCH form where the type has one (else NULL) */
} mq_gemm;

/* From MQ_BATCH activation rows on, llama.cpp's CPU backend multiplies Q5_K and Q6_K matrices (which it does not
 * repack on AVX2) with its tiled kernels, which add each block's whole integer sum times the weight's d (less
 * dmin times the mins' sum) into one float chain, by the activation's d. The rows_batch kernels of that form are
 * used from that many rows on, so a prompt's rows get the bits llama.cpp gives them. */
#define MQ_BATCH 8

/* A float32 activation row of n values (a multiple of the partner's block) as the partner's bytes. */
typedef void (*mq_quantize_fn)(const float *x, int64_t n, uint8_t *y);

/* What minillama knows of one ggml weight type (ggml's type_traits + type_traits_cpu). A row with dot NULL: no
 * kernels (the type does not run in C). */
typedef struct {
    int block, size;                 /* values and bytes per block (ggml's blck_size, type_size) */
    int partner;                     /* the activation type its dot takes (ggml's vec_dot_type), an MQ_ number */
    int partner_block, partner_size; /* the partner's values and bytes per block */
    int tile_scales;                 /* the rows and panel kernels read yf (mq_dotn_fn) */
    mq_quantize_fn quantize;         /* a float32 activation row -> the partner's bytes */
    mq_dot_fn dot;                   /* one weight row . one activation row */
    mq_dotn_fn rows;                 /* NULL: one dot per activation row */
    mq_dotn_fn rows_batch;           /* the MQ_BATCH form (NULL: rows at any size) */
    mq_rows2_fn rows2;               /* NULL: rows one weight row at a time (tile scales needed: tile_scales) */
    mq_gemv_fn gemv;                 /* NULL: dot weight row by weight row */
    mq_panel panel;                  /* panel.panel NULL: none */
    mq_gemm gemm;                    /* gemm.kernel NULL: none (the panels or rows kernels run) */
    mq_experts_fn experts;           /* NULL: the gemv (or dot) activation row by row (an expert's rows) */
} mq_traits;

/* The layout columns of each row (ggml's GGML_QUANT_SIZES; the partner is ggml-cpu's vec_dot_type), written once
 * for both tables. */
#define MQ_LAYOUT(b, s, p, pb, ps) .block = (b), .size = (s), .partner = (p), .partner_block = (pb), .partner_size = (ps)
#define MQ_LAYOUT_F32 MQ_LAYOUT(1, 4, MQ_F32, 1, 4)
#define MQ_LAYOUT_F16 MQ_LAYOUT(1, 2, MQ_F16, 1, 2)
#define MQ_LAYOUT_BF16 MQ_LAYOUT(1, 2, MQ_BF16, 1, 2)
#define MQ_LAYOUT_Q4_0 MQ_LAYOUT(32, 18, MQ_Q8_0, 32, 34)
#define MQ_LAYOUT_Q4_1 MQ_LAYOUT(32, 20, MQ_Q8_1, 32, 36)
#define MQ_LAYOUT_Q5_0 MQ_LAYOUT(32, 22, MQ_Q8_0, 32, 34)
#define MQ_LAYOUT_Q5_1 MQ_LAYOUT(32, 24, MQ_Q8_1, 32, 36)
#define MQ_LAYOUT_Q8_0 MQ_LAYOUT(32, 34, MQ_Q8_0, 32, 34)
#define MQ_LAYOUT_Q2_K MQ_LAYOUT(256, 84, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_Q3_K MQ_LAYOUT(256, 110, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_Q4_K MQ_LAYOUT(256, 144, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_Q5_K MQ_LAYOUT(256, 176, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_Q6_K MQ_LAYOUT(256, 210, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_IQ4_NL MQ_LAYOUT(32, 18, MQ_Q8_0, 32, 34)
#define MQ_LAYOUT_IQ4_XS MQ_LAYOUT(256, 136, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_MXFP4 MQ_LAYOUT(32, 17, MQ_Q8_0, 32, 34)
#define MQ_LAYOUT_IQ2_XXS MQ_LAYOUT(256, 66, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_IQ2_XS MQ_LAYOUT(256, 74, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_IQ2_S MQ_LAYOUT(256, 82, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_IQ3_XXS MQ_LAYOUT(256, 98, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_IQ3_S MQ_LAYOUT(256, 110, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_IQ1_S MQ_LAYOUT(256, 50, MQ_Q8_K, 256, 292)
#define MQ_LAYOUT_IQ1_M MQ_LAYOUT(256, 56, MQ_Q8_K, 256, 292)

/* quants_avx2.c's table (NULL where this build has no AVX2 kernels). */
const mq_traits *mq_traits_avx2(void);
/* The chosen instruction set's row of ggml type t, NULL when t has no kernels. */
const mq_traits *mq_traits_of(int ggml_type);

/* ggml_type when quants.c has kernels for it (the same number), else -1. */
int mq_type_of_ggml(int ggml_type);
/* Values per block and bytes per block of a type with kernels; values per block of its partner. */
int mq_block(int type);
int mq_type_size(int type);
int mq_partner_block(int type);
/* "avx2" or "scalar": the kernels mq_matmul uses on this CPU (cpu.c's choice). */
const char *mq_isa(void);
/* out[t * rows + r] = row r of w (rows x cols of type, row_bytes = cols / block * type_size) . x[t * cols ..]
 * for t < n_x, rows split over `threads` threads. cols must be a positive multiple of the block. 0 when
 * memory ran out. */
int mq_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n_x, float *out,
              int threads);
/* Bytes of one activation row of cols values quantized to type's partner (block_q8_0, _q8_1, _q8_K, ...). */
size_t mq_partner_bytes(int type, int64_t cols);
/* Fills quants.c's tables (the float16 one the three below read); idempotent, thread-safe. */
void mq_init(void);
/* f rounded to float16 (nearest even) and back. */
float mq_round_f16(float f);
uint16_t mq_half(float f);         /* the float16 bits of f (nearest even) */
void mq_halves(const float *x, int64_t n, uint16_t *h); /* of n values at once (F16C where the kernels are AVX2) */
float mq_half_float(uint16_t h);   /* and back */
void mq_quantize_row(int type, const float *x, int64_t cols, uint8_t *y);
/* out[t * out_stride + r] = row r of w (cols values of type) . activation row t of y (n_x rows quantized by
 * mq_quantize_row, mq_partner_bytes apart), for r0 <= r < r1. */
void mq_dot_rows(int type, const uint8_t *w, int64_t cols, const uint8_t *y, int64_t n_x, int64_t r0, int64_t r1,
                 float *out, int64_t out_stride);

#endif
