/* 16-bit gradients (--grad-dtype bf16|fp16, as PyTorch FSDP's reduce_dtype and
 * DeepSpeed's fp16 gradients): the gradient a rank holds between micro-batches, and
 * reduces, is 2 bytes a parameter, in the precision the run computes in.
 *
 * The ops still accumulate weight gradients in fp32 (ops_mixed.h: dweight is float *):
 * backward works slab by slab in an fp32 working copy widened (exactly) from the 16-bit
 * gradient, so each product sums in fp32 onto what earlier micro-batches left, and the
 * slab is rounded back once per micro-batch. The working copies are tagged grads and
 * live for one slab's backward (the tied embedding's for the whole pass): the peak
 * counts them, the state held between steps does not.
 *
 * AdamW reads the reduced 16-bit gradient (this rank's part) itself, widening a chunk
 * at a time into the thread's scratch (mixed_adamw_update): no fp32 copy of the vector
 * is held, so between backwards the gradients cost 2 B a parameter, the update
 * included. fp16's loss scale checks the 16-bit values a chunk at a time (widening
 * keeps inf and NaN) and hands its 1/S to the update, which multiplies each widened
 * chunk by it: the products of unscaling a widened copy in place. */
#ifndef GRADS16_H
#define GRADS16_H
#include <stddef.h>

#include "model.h"
#include "precision.h"

/* A slab's fp32 working copy: n floats tagged grads, widened from grad16 (of gp). */
float *grads16_slab_widen(precision gp, const void *grad16, size_t n);
/* The working copy rounded back into grad16 (nearest even), and freed. */
void grads16_slab_round(precision gp, void *grad16, float *work, size_t n);

/* One micro-batch's backward of a whole model (one stage, no TP) onto its 16-bit
 * gradient vector `grads` (of gp, slab-ordered), slab by slab in working copies as
 * above; on_slab_ready (may be NULL) once a slab is rounded, as gpt_backward calls it.
 * The tied embedding's copy lives through the pass: the LM head's product and the
 * embedding's rows both reach it in fp32 before its one rounding. From zeroed
 * gradients the result is gpt_backward's fp32 gradient rounded to gp, bit for bit. */
void gpt_backward_grads16(gpt_model *m, const void *params, precision gp, void *grads,
                          float dloss, gpt_slab_ready_fn on_slab_ready, void *ctx);

/* The gradient as AdamW reads it, for comparisons: dst[n] (fp32, host) = grads16
 * widened (exact), times unscale when it is not 1 (fp16's 1/S, as vec_scale applies it). */
void grads16_widen_unscaled(precision gp, float *dst, const void *grads16, float unscale,
                            size_t n);

#endif
