/* The model's ops in the precision a run computes in (precision.h): what mixed
 * precision means here, op by op.
 *
 *   fp32        each op is its ops.h twin, the same call: bit for bit today's numbers.
 *   bf16, fp16  activations, their gradients and the compute copy of the weights are
 *               16-bit (uint16_t bit patterns, passed as void *). Every op reads them
 *               widened to fp32 (exact), computes in fp32 as its ops.h twin does (the
 *               LayerNorm statistics, softmax, cross-entropy and every sum accumulate in
 *               fp32) and rounds what it writes to 16 bits (nearest even).
 *               Matrix products multiply the 16-bit values and accumulate in fp32
 *               (matmul16.h: oneDNN on the CPU).
 *
 * What stays fp32 in every precision (float * below): LayerNorm's mean and rstd, the
 * per-token losses, and the parameter gradients (dweight, dbias, dwte, dwpe), the
 * "main gradients" that micro-batches accumulate into, as Megatron-LM keeps them. With
 * 16-bit gradients (--grad-dtype, grads16.h) they are a slab's fp32 working copy,
 * widened from the 16-bit gradient before backward and rounded back after it.
 *
 * Pointers typed void * hold elements of the precision p; the semantics of each op
 * (what is overwritten, what accumulates, what may alias) are its ops.h twin's. Each op
 * is watched as one op of its kind (ops_observe.h), whatever it runs inside. On a
 * thread that computes on a GPU, a 16-bit op runs the GPU backend's version
 * (ops_mixed_table.h; pointers are then device memory). */
#ifndef OPS_MIXED_H
#define OPS_MIXED_H
#include <stddef.h>

#include "adamw_config.h"
#include "precision.h"

/* The element i of a vector of precision p: base + i elements. */
void *precision_at(precision p, const void *base, size_t i);

/* ---- whole vectors between the master (fp32) and the compute precision ---------- */
/* dst = src rounded to p (fp32: a copy); dst[n] of p, src[n] fp32 */
void mixed_round(precision p, void *dst, const float *src, size_t n);
/* dst = src widened to fp32 (exact; fp32: a copy) */
void mixed_widen(precision p, float *dst, const void *src, size_t n);

/* ---- the ops: arguments as in ops.h, with the precision first --------------------- */
void mixed_embedding_forward(precision p, void *out, const int *tokens, const void *wte,
                             int N, int C, int vocab_start, int vocab_len);
void mixed_embedding_backward(precision p, float *dwte, const void *dout, const int *tokens,
                              int N, int C, int vocab_start, int vocab_len);
void mixed_position_forward(precision p, void *out, const void *wpe, int B, int T, int C);
void mixed_position_backward(precision p, float *dwpe, const void *dout, int B, int T, int C);

void mixed_layernorm_forward(precision p, void *out, float *mean, float *rstd,
                             const void *inp, const void *weight, const void *bias, int N,
                             int C);
/* dinp += ... (widened, added in fp32, rounded once), dweight += ..., dbias += ... */
void mixed_layernorm_backward(precision p, void *dinp, float *dweight, float *dbias,
                              const void *dout, const void *inp, const void *weight,
                              const float *mean, const float *rstd, int N, int C);

/* out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC]: the product summed in fp32, the
 * bias added in fp32, rounded once. bias may be NULL. */
void mixed_linear_forward(precision p, void *out, const void *inp, const void *weight,
                          const void *bias, int N, int IC, int OC);
/* The same, never in FP8 (the LM head: --precision fp8 keeps it bf16, fp8_linear.h);
 * mixed_linear_forward's products are FP8 while fp8_linear_use has a recipe. */
void mixed_head_forward(precision p, void *out, const void *inp, const void *weight,
                        const void *bias, int N, int IC, int OC);
/* dinp = dout @ weight (rounded); dweight += dout^T @ inp and dbias += column sums of
 * dout, both fp32. Any of the three may be NULL: not computed. */
void mixed_linear_backward(precision p, void *dinp, float *dweight, float *dbias,
                           const void *dout, const void *inp, const void *weight, int N,
                           int IC, int OC);

void mixed_attention_forward(precision p, void *out, void *att, const void *qkv, int B,
                             int T, int C, int NH);
void mixed_attention_backward(precision p, void *dqkv, void *datt, const void *dout,
                              const void *qkv, const void *att, int B, int T, int C, int NH);

void mixed_gelu_forward(precision p, void *out, void *x, size_t n);
void mixed_gelu_backward(precision p, void *dinp, const void *dgelu, const void *dout,
                         size_t n);

/* losses: fp32; probs (of p) may equal logits */
void mixed_crossentropy_forward(precision p, float *losses, void *probs, const void *logits,
                                const int *targets, int N, int V);
void mixed_crossentropy_backward(precision p, void *dlogits, const void *probs,
                                 const int *targets, float dloss, int N, int V);

void mixed_vec_zero(precision p, void *x, size_t n);
void mixed_vec_copy(precision p, void *dst, const void *src, size_t n);
void mixed_vec_add(precision p, void *y, const void *x, size_t n);   /* y += x, rounded */

/* ---- the optimizer reading 16-bit gradients (--grad-dtype, grads16.h) --------------
 * Neither holds an fp32 copy of the vector: each widens a chunk at a time into the
 * thread's scratch (below), so a 16-bit gradient costs 2 B a parameter at the update
 * (ops_mixed_optimizer.c). */
/* 1 when every element of x is finite (fp32: isfinite(vec_sum), as grads_finite). */
int mixed_vec_finite(precision p, const void *x, size_t n);
/* adamw_update on grads of p, each widened and multiplied by grad_scale (the loss
 * scale's 1/S; 1 leaves it alone) before it is used: bit for bit widening the whole
 * vector, vec_scale and adamw_update. fp32 with grad_scale 1: adamw_update itself. */
void mixed_adamw_update(precision p, float *params, const void *grads, float grad_scale,
                        float *m, float *v, size_t n, const adamw_config *cfg, int step);
/* mixed_adamw_update on grads of gp, and the updated params[n] rounded to cp into
 * compute[n] (of cp) in the same pass, a chunk at a time while it is in cache: bit for
 * bit the update followed by mixed_round(cp, compute, params, n), with one pass over
 * memory instead of two (the GPU, and cp fp32: those two calls). */
void mixed_adamw_update_round(precision gp, float *params, const void *grads,
                              float grad_scale, float *m, float *v, size_t n,
                              const adamw_config *cfg, int step, precision cp, void *compute);
/* x[n] (fp32) rounded to p (nearest even) into its own first n elements of p, as
 * mixed_round into a separate buffer would write them; returns x. fp32: x unchanged. */
void *mixed_round_in_place(precision p, float *x, size_t n);

/* The calling thread's scratch (the fp32 widenings a 16-bit op works in, kept between
 * calls so that a loop allocates nothing, and matmul16's primitives): given back here;
 * a thread that ends gives it back by itself. */
void ops_mixed_release_thread(void);
/* A diagnostic: the bytes of the calling thread's scratch now (0 before its first 16-bit
 * op). It grows only when an op needs more, so it stays constant while a loop repeats. */
size_t ops_mixed_scratch_bytes(void);

#endif
