/* model.c: the blocks of a llama-family transformer run in C over the quantized weights in the map,
 * and what it needs from quants.c (one activation row quantized, a range of weight rows dotted) and threadpool.c (a
 * team of pool threads). No Python here: bind_model.c's Stack binding checks every length and keeps the buffers
 * alive. */
#ifndef MINILLAMA_MODEL_H
#define MINILLAMA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "quants.h"     /* mq_partner_bytes, mq_quantize_row, mq_dot_rows, mq_init, the float16 helpers */
#include "threadpool.h" /* mq_team */

/* attention.c: out [Dv] = query q [D] attending to the cached float16 keys k and values v (key/value rows k_stride /
 * v_stride values apart, stored by position) of positions s0..s1, scores times scale, as ggml's CPU flash attention
 * computes it (one_chunk: every generated token, and batches of fewer than 64 rows), visiting the cache's n_kv cells
 * in llama.cpp's order: cell c holds position cells[c] (-1: empty), or with cells NULL position c (a cache that has
 * not wrapped). The same for nq query heads (at most MA_ROW_HEADS) sharing those keys and values, q + g D into out
 * + g Dv, each with the bits it gets alone. parts > 1: llama.cpp's split-KV path for a batch of one row over n_kv >=
 * MA_SPLIT_KV cells with `parts` threads (the sink goes into the first chunk's partial only). sink: NULL, or the
 * heads' sink logits (gpt-oss's attn_sinks: one more entry of the softmax, with no value, applied at the row's end
 * as ggml applies it). work: ma_row_work(D, Dv) floats. */
#define MA_ROW_HEADS 4
#define MA_SPLIT_KV 512
void ma_attend_cells(const float *q, int64_t nq, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                     int64_t v_stride, const int64_t *cells, int64_t n_kv, int64_t s0, int64_t s1, int64_t parts,
                     int64_t D, int64_t Dv, float scale, const float *sink, float *out, float *work);
/* A row's end as one_chunk makes it: the sink (NULL or the head's sink logit) applied to the float32 copy of its sum
 * acc [Dv], then out = acc / S (0 where no key was seen), or with partial the unscaled acc and partial = {M, S}. */
void ma_row_finish(float *acc, int64_t Dv, float M, float S, const float *sink, float *out, float *partial);
/* Floats of work either row path needs for MA_ROW_HEADS query heads. */
static inline size_t ma_row_work(int64_t D, int64_t Dv) { return (size_t)(MA_ROW_HEADS * (D + 3 * Dv)); }
/* The query heads sharing one key/value head (H / Hkv of them) that one call takes together: the most that divides
 * them, up to most. */
static inline int64_t ma_group_heads(int64_t H, int64_t Hkv, int64_t most) {
    int64_t nh = most;
    while (H / Hkv % nh) nh--;
    return nh;
}

/* llama-server's cache of a sliding-window layer (llama_kv_cache_iswa, swa_full off): window + one ubatch (512)
 * cells, padded to 256 (at most the context's); past that many positions new ones reuse cells of positions no row
 * sees any more (minillama/model/cache.py's Ring mirrors which). */
static inline int64_t ma_swa_cells(int64_t window) { return (window + 512 + 255) / 256 * 256; }
/* The cells llama.cpp's attention of a row at position pos reads from a cache whose cell c holds position c: the
 * used cells 0..pos padded to a multiple of 256. */
static inline int64_t ma_cache_cells(int64_t pos) { return (pos + 1 + 255) / 256 * 256; }
/* Whether a row's attention over n_kv cells splits across kv_split threads (llama.cpp's split-KV path): a pass of
 * one row, more than one thread and at least MA_SPLIT_KV cells. */
static inline int ma_split_cells(int64_t n_kv, int64_t pass_rows, int64_t kv_split) {
    return pass_rows == 1 && kv_split > 1 && n_kv >= MA_SPLIT_KV;
}
/* Rows a batch needs for llama.cpp's tiled flash attention (ggml_compute_forward_flash_attn_ext_tiled): a
 * batch (ubatch) of fewer rows takes ma_attend_cells's path. */
#define MA_TILED_ROWS 64
/* Query heads one call of the tiled path takes (their keys and values read once for all of them). */
#define MA_TILED_HEADS 4
/* The same for n rows (at most MA_TILED_ROWS) of nh query heads (at most MA_TILED_HEADS, sharing one key/value
 * head) of one sequence as the tiled path computes them: head g of row i's query at q + i q_stride + g D, its
 * position pos[i], seeing positions pos[i] - window + 1 (window > 0) or 0 up to pos[i], in tiles of 64 of the n_kv
 * cells (cells as ma_attend_cells's; NULL: cell c holds position c, n_kv unused); its output at out + i out_stride +
 * g Dv; sink: NULL or the nh heads' sink logits, as ma_attend_cells's. Each head's rows get the bits they get alone.
 * work: ma_tiled_work(D, Dv) floats. */
void ma_attend_tiled(const float *q, int64_t q_stride, int64_t n, int64_t nh, const int64_t *pos, int64_t window,
                     const int64_t *cells, int64_t n_kv, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                     int64_t v_stride, int64_t D, int64_t Dv, float scale, const float *sink, float *out,
                     int64_t out_stride, float *work);
size_t ma_tiled_work(int64_t D, int64_t Dv);
/* attention_rows.c: n rows (at most MA_TILED_ROWS - 1) of nh query heads (at most MA_ROW_HEADS, sharing one
 * key/value head) of one sequence in a pass of 2..MA_TILED_ROWS - 1 rows, each with the bits ma_attend_cells gives it
 * alone (one_chunk, no split): head g of row i's query at q + i q_stride + g D, its position pos[i], seeing
 * positions pos[i] - window + 1 (window > 0) or 0 up to pos[i] in the cache's cell order (cells, n_kv as
 * ma_attend_cells's; NULL: cell c holds position c, n_kv unused); its output at out + i out_stride + g Dv; sink: NULL
 * or the nh heads' sink logits. The keys and values of a block of cells are widened once for every row and head
 * seeing them. work: ma_rows_work(D, Dv) floats. */
void ma_attend_rows(const float *q, int64_t q_stride, int64_t n, int64_t nh, const int64_t *pos, int64_t window,
                    const int64_t *cells, int64_t n_kv, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                    int64_t v_stride, int64_t D, int64_t Dv, float scale, const float *sink, float *out,
                    int64_t out_stride, float *work);
size_t ma_rows_work(int64_t D, int64_t Dv);
/* Rows q [n, H, D] of one sequence at positions start..start+n-1 attending to its float16 cache k [start + n, Hkv,
 * D], v [start + n, Hkv, Dv] (stored by position; cells, n_kv: its cell order, as ma_attend_cells's), into out [n,
 * H, Dv], as model.c attends them in a pass of pass_rows rows (all sequences'): the tiled path from MA_TILED_ROWS
 * rows, the split-KV path for a pass of one row (ma_split_cells), else row by row (ma_attend_rows); sinks: NULL or
 * [H], each head's sink logit. The Python blocks' attention on the native backend. 1 done, 0 out of memory. */
int ma_attend_seq(const float *q, int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t Dv, int64_t start,
                  const uint16_t *k, const uint16_t *v, int64_t window, const int64_t *cells, int64_t n_kv,
                  float scale, const float *sinks, int64_t pass_rows, int64_t kv_split, float *out);

/* swiglu.c: y [n] = silu(x) * g as ggml_vec_swiglu_f32 computes it (ggml_v_expf for all but the last n % 8). */
void ma_swiglu(int64_t n, float *y, const float *x, const float *g);
/* y [n] = gpt-oss's clamped SwiGLU of gate x and up g as ggml-cpu's swiglu_oai computes it (alpha 1.702, limit 7:
 * x' = min(x, 7), g' = clamp(g, -7, 7), x' / (1 + expf(-1.702 x')) * (g' + 1); libm's expf, one value at a time,
 * as ggml's loop: no SIMD form to mirror). */
void ma_swiglu_oai(int64_t n, float *y, const float *x, const float *g);
/* One lane of ggml_v_expf (the exp of ggml's SIMD soft_max and silu; not libm's expf). */
float ma_v_expf(float x);
/* y [n] = ggml_v_expf of each of x [n] (eight lanes at a time where the AVX2 kernels run: the same bits). */
void ma_v_expf_n(int64_t n, const float *x, float *y);
/* y [n] = libm's expf of each of x [n] (attention_rows.c: four lanes at a time where the AVX2 kernels run and a
 * check found that they give this libm's bits, for the lanes <= 0 or NaN: the exponents of the online softmax). */
void ma_libm_expf_n(int64_t n, const float *x, float *y);
/* The online softmax's steps over m scores w [m] (in key order) from the running maximum *M and sum of weights *S:
 * each score's weight into w, where it raised the maximum up = 1 and the scale of the sums so far into ms (else ms
 * 1), as one_chunk takes them one by one (libm's expf); *M and *S carried on. */
void ma_online_weights(float *w, float *ms, uint8_t *up, int64_t m, float *M, float *S);

/* A weight matrix: its rows in up to MS_MAX_PARTS pieces of the map (q, k, v apart in the file, each of its own
 * type: gemma3's Q4_K_M has Q5_0 q and k beside a Q8_0 v). */
#define MS_MAX_PARTS 3
typedef struct {
    int n, type[MS_MAX_PARTS];       /* pieces, the mq_type of each */
    const uint8_t *w[MS_MAX_PARTS];  /* raw rows */
    int64_t rows[MS_MAX_PARTS];      /* rows of each piece */
    int64_t cols, n_out;             /* inputs; outputs (the pieces' rows) */
} ms_matrix;

/* The fields of one block, in one list: X(KIND, name, required, size, outputs). It makes ms_layer's members, the
 * binding's parse table (module.c's Stack takes a dict per layer, field by name) and _core.Stack.FIELDS. KIND:
 * VEC a float32 vector of `size` values (NULL when absent: llama has no q_norm, gemma3 no biases, ...), MAT a
 * weight matrix of `size` inputs and `outputs` outputs, F64 / I64 a number. Sizes are MS_DIM_* names: EMBD
 * n_embd, QKV the q|k|v outputs, HEAD head_dim, O n_head * head_dim_v, GATE_UP 2 n_ff, FF n_ff, ROT_PAIRS
 * n_rot / 2, EXPERTS n_expert, EXP_FF n_expert * n_ff_exp, FF_EXP n_ff_exp, EXP_EMBD n_expert * n_embd, HEADS
 * n_head. sinks: a sink logit per query head (gpt-oss); router_bias: added to the router's logits; gate_exps_bias,
 * up_exps_bias, down_exps_bias: expert e's row (e n_ff_exp.., e n_embd..) added to its product (ggml_add_id). rope_base
 * is the layer's rope base; window > 0: a query sees only keys fewer than window positions back. The feed-forward is
 * dense (w_gate_up, w_down) or a mixture of experts (router [n_embd -> n_expert], and each expert tensor one matrix
 * of its n_expert matrices one after another: gate_exps/up_exps expert e's rows e n_ff_exp.., down_exps e n_embd..;
 * moe.c), never both (ms_check_layer). */
#define MS_LAYER_FIELDS(X)                                                                                           \
    X(VEC, attn_norm, 1, EMBD, NONE)                                                                                 \
    X(MAT, wqkv, 1, EMBD, QKV)                                                                                       \
    X(VEC, bqkv, 0, QKV, NONE)                                                                                       \
    X(VEC, q_norm, 0, HEAD, NONE)                                                                                    \
    X(VEC, k_norm, 0, HEAD, NONE)                                                                                    \
    X(MAT, wo, 1, O, EMBD)                                                                                           \
    X(VEC, bo, 0, EMBD, NONE)                                                                                        \
    X(VEC, post_attn_norm, 0, EMBD, NONE)                                                                            \
    X(VEC, ffn_norm, 1, EMBD, NONE)                                                                                  \
    X(MAT, w_gate_up, 0, EMBD, GATE_UP)                                                                              \
    X(VEC, b_gate_up, 0, GATE_UP, NONE)                                                                              \
    X(MAT, w_down, 0, FF, EMBD)                                                                                      \
    X(MAT, router, 0, EMBD, EXPERTS)                                                                                 \
    X(MAT, gate_exps, 0, EMBD, EXP_FF)                                                                               \
    X(MAT, up_exps, 0, EMBD, EXP_FF)                                                                                 \
    X(MAT, down_exps, 0, FF_EXP, EXP_EMBD)                                                                           \
    X(VEC, sinks, 0, HEADS, NONE)                                                                                    \
    X(VEC, router_bias, 0, EXPERTS, NONE)                                                                            \
    X(VEC, gate_exps_bias, 0, EXP_FF, NONE)                                                                          \
    X(VEC, up_exps_bias, 0, EXP_FF, NONE)                                                                            \
    X(VEC, down_exps_bias, 0, EXP_EMBD, NONE)                                                                        \
    X(VEC, b_down, 0, EMBD, NONE)                                                                                    \
    X(VEC, post_ffn_norm, 0, EMBD, NONE)                                                                             \
    X(VEC, rope_freqs, 0, ROT_PAIRS, NONE)                                                                           \
    X(F64, rope_base, 1, NONE, NONE)                                                                                 \
    X(I64, window, 1, NONE, NONE)

typedef const float *ms_field_VEC;
typedef ms_matrix ms_field_MAT;
typedef double ms_field_F64;
typedef int64_t ms_field_I64;

typedef struct {
#define MS_LAYER_MEMBER(kind, name, required, size, outputs) ms_field_##kind name;
    MS_LAYER_FIELDS(MS_LAYER_MEMBER)
#undef MS_LAYER_MEMBER
} ms_layer;

/* The sizes a layer field is given in (MS_LAYER_FIELDS); ms_dim gives their values for a model. */
enum {
    MS_DIM_NONE, MS_DIM_EMBD, MS_DIM_QKV, MS_DIM_HEAD, MS_DIM_O, MS_DIM_GATE_UP, MS_DIM_FF, MS_DIM_ROT_PAIRS,
    MS_DIM_EXPERTS, MS_DIM_EXP_FF, MS_DIM_FF_EXP, MS_DIM_EXP_EMBD, MS_DIM_HEADS
};

/* The hyper-parameters, in one list: X(KIND, name). It makes ms_model's members and the binding's parse table
 * (a dict by name) and _core.Stack.HPARAMS. I64 an integer, F32 a float, BOOL a flag: rope_neox (rope pairs
 * (i, i + n_rot/2) rather than (2i, 2i+1)), gelu (GeGLU rather than SwiGLU), scale_q (multiply q by q_scale after
 * rope, gemma3); attn_scale multiplies the scores; kv_split: the threads of the llama.cpp whose single-row
 * attention over 512 cached cells or more (its split-KV path, one chunk of the cells per thread) is mirrored;
 * softmax_weight: the experts' weights are the softmax of the chosen k router logits (gpt-oss) rather than the
 * softmax over all experts renormalised; swiglu_oai: the experts' activation is ma_swiglu_oai; rope_freq_scale,
 * rope_ext_factor, rope_attn_factor, rope_beta_fast, rope_beta_slow, n_ctx_orig: ggml_rope_ext's YaRN arguments
 * (1, 0, 1 and any betas: plain rope). */
#define MS_HPARAMS(X)                                                                                                \
    X(I64, n_embd)                                                                                                   \
    X(I64, n_head)                                                                                                   \
    X(I64, n_head_kv)                                                                                                \
    X(I64, head_dim)                                                                                                 \
    X(I64, head_dim_v)                                                                                               \
    X(I64, n_ff)                                                                                                     \
    X(I64, n_rot)                                                                                                    \
    X(F32, eps)                                                                                                      \
    X(BOOL, rope_neox)                                                                                               \
    X(BOOL, gelu)                                                                                                    \
    X(BOOL, scale_q)                                                                                                 \
    X(F32, q_scale)                                                                                                  \
    X(F32, attn_scale)                                                                                               \
    X(I64, n_expert)                                                                                                 \
    X(I64, n_expert_used)                                                                                            \
    X(I64, n_ff_exp)                                                                                                 \
    X(I64, kv_split)                                                                                                 \
    X(BOOL, softmax_weight)                                                                                          \
    X(BOOL, swiglu_oai)                                                                                              \
    X(F32, rope_freq_scale)                                                                                          \
    X(F32, rope_ext_factor)                                                                                          \
    X(F32, rope_attn_factor)                                                                                         \
    X(F32, rope_beta_fast)                                                                                           \
    X(F32, rope_beta_slow)                                                                                           \
    X(I64, n_ctx_orig)

typedef int64_t ms_hparam_I64;
typedef float ms_hparam_F32;
typedef int ms_hparam_BOOL;

typedef struct {
    int n_layer;
#define MS_HPARAM_MEMBER(kind, name) ms_hparam_##kind name;
    MS_HPARAMS(MS_HPARAM_MEMBER)
#undef MS_HPARAM_MEMBER
    ms_layer *layers;
    /* The head, when out_norm is not NULL: the final norm and the output matrix (n_embd -> n_vocab outputs). */
    const float *out_norm;
    ms_matrix output;
} ms_model;

/* The value of size dim (MS_DIM_*) for model m's hyper-parameters; 0 for MS_DIM_NONE. */
int64_t ms_dim(const ms_model *m, int dim);

/* llama.cpp's LLAMA_MAX_EXPERTS. */
#define MS_MAX_EXPERTS 512
/* NULL when layer L of m (its fields parsed and sized by ms_dim) has one whole feed-forward, dense or of experts,
 * with expert counts in range; else what is wrong, for the binding's error. */
const char *ms_check_layer(const ms_model *m, const ms_layer *L);

/* moe.c: the mixture-of-experts feed-forward's pieces, as llama.cpp's build_moe_ffn computes them (softmax gating,
 * the k best experts, their weights renormalised); model.c runs them between its barriers.
 * mo_route: logits [E] of one token -> chosen [k] (descending probability; ties: the lower expert first) and their
 * weights [k] (divided by their sum, clamped to float16's smallest normal). simd: the softmax of ggml's AVX2 build
 * (ggml_v_expf eight values at a time, each eight summed in float), else of its generic one (libm's expf). */
void mo_route(const float *logits, int64_t E, int64_t k, int simd, int32_t *chosen, float *weights);
/* The same with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT (gpt-oss): the k largest logits (ties: the lower
 * expert first), their weights the softmax of those k logits alone, not renormalised. */
void mo_route_softmax_weight(const float *logits, int64_t E, int64_t k, int simd, int32_t *chosen, float *weights);
/* mo_router: logits [E] = the float32 router w [E, d] times one row x [d], in the order of llama.cpp's AVX2 build:
 * ggml_vec_dot_f32 (four accumulators of eight) when its product has one row (rows), llamafile's tinyBLAS (one
 * accumulator of eight per output) for more when d % 8 == 0 and E % 4 == 0; simd 0: ggml's generic dot (a double
 * sum in order). */
void mo_router(const float *w, const float *x, int64_t E, int64_t d, int64_t rows, int simd, float *logits);
/* 1 when the mq kernels are AVX2 (ggml's AVX2 orders: mo_route's and mo_router's simd). */
int mo_simd(void);
/* ggml_vec_dot_f32 of x and y [n] (mo_router's: its AVX2 order, the n % 32 left added in double; else its generic
 * one, a double sum in order). */
float mo_dot_f32(const float *x, const float *y, int64_t n, int simd);

/* deltanet.c: qwen35's gated DeltaNet ops as ggml's CPU backend computes them.
 * md_unary: y [n] = op(x) for op MD_SIGMOID (ggml_vec_sigmoid_f32), MD_SOFTPLUS (op_softplus), MD_EXP (op_exp),
 * with libm's expf and logf. */
enum { MD_SIGMOID = 0, MD_SOFTPLUS = 1, MD_EXP = 2 };
void md_unary(int op, int64_t n, const float *x, float *y);
/* ggml's gated_delta_net over n tokens of one sequence: q, k [n, hk, S] (L2-normed), v [n, hv, S], g, beta
 * [n, hv]; state [hv, S, S] (state[h][j][i] = S_h[i][j]) updated in place; out [n, hv, S]; before (NULL: none)
 * [hv, S, S] the state before the last token. Value head h reads key head h % hk. */
void md_gated_delta_net(const float *q, const float *k, const float *v, const float *g, const float *beta,
                        float *state, int64_t n, int64_t hv, int64_t hk, int64_t S, int simd, float *out,
                        float *before);
/* 1 when M is one float32 piece at a float's alignment: mo_router multiplies it. */
int mo_router_f32(const ms_matrix *M);
/* The n = T k choices chosen [n] grouped by expert: start [E + 1] (expert e's slots start[e]..start[e+1]), list
 * [n] (choice ids t k + i, by expert, then by id), inv [n] (the slot of each choice id). */
void mo_group(const int32_t *chosen, int64_t n, int64_t E, int64_t *start, int32_t *list, int32_t *inv);
/* out[(j - j0) * stride + r] = row r of expert e of M (rows_e rows per expert) . y row j (partner rows y_row bytes
 * apart), for j0 <= j < j0 + n_j and r0 <= r < r1: one work item of an expert's product over its slots. */
void mo_expert_rows(const ms_matrix *M, int64_t rows_e, int64_t e, const uint8_t *y, size_t y_row, int64_t j0,
                    int64_t n_j, int64_t r0, int64_t r1, float *out, int64_t stride);

/* One sequence's rows of a pass: n >= 1 tokens at positions start.., their keys and values stored in k[l]
 * [.., n_head_kv, head_dim] / v[l] as float16 (llama.cpp's cache type), each holding at least start + n
 * positions; no two sequences of a call share a cache. */
typedef struct {
    int64_t n, start;
    uint16_t *const *k, *const *v; /* n_layer arrays each */
    /* the cell order of its full-attention layers' cache ([0]) and of its sliding-window layers' ([1]), as
     * ma_attend_cells takes it: cells[i] NULL (cell c holds position c), or n_cells[i] cells each holding a
     * position below start + n or -1 */
    const int64_t *cells[2];
    int64_t n_cells[2];
} ms_seq;

/* Runs every block over x [sum of seqs[i].n, n_embd] (in place): seqs[0]'s rows first, then seqs[1]'s, ...;
 * n_seq >= 1. Every weight matrix is read once for all the rows; each row attends to its own sequence's cache.
 * logits: NULL, or (the model has a head) [n_seq, n_vocab]: each sequence's last row through the final norm and
 * the output matrix, in the same pass (one wake of the threads per step). 1 done, 0 out of memory. */
int ms_forward(const ms_model *m, float *x, const ms_seq *seqs, int n_seq, int threads, float *logits);

/* The cached float16 keys k [n, n_head_kv, head_dim] of layer il rotated by delta[t] positions each (row t), as
 * llama.cpp's K shift after a context shift computes them (build_rope_shift: ggml_rope_ext over the float16 cache,
 * every cell by its own shift, 0 included): each value widened, rotated by the forward pass's rope for that
 * position, rounded back to float16. 1 done, 0 out of memory. */
int ms_rope_shift(const ms_model *m, int il, uint16_t *k, int64_t n, const int64_t *delta);

/* The bytes [lo, hi) of one array a pass writes (x, the logits, a cache). */
typedef struct {
    uintptr_t lo, hi;
} ms_span;

/* Whether two of the n >= 1 spans share a byte (an empty span shares none): the threads of a pass write them at
 * once, so ms_forward's arrays must not. Sorts spans by start. */
int ms_spans_overlap(ms_span *spans, size_t n);

/* GELU at each of the 65536 float16 values (indexed by its bits), rounded to float16: the table GeGLU looks up. */
const float *ms_gelu_table(void);

#endif
