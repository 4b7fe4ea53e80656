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
 * AdamW reads fp32: the reduced 16-bit gradient (this rank's part) is widened into an
 * fp32 vector tagged grads just before the update and freed after it; fp16's loss
 * scale checks and unscales that widened vector (widening keeps inf and NaN, so its
 * check is the 16-bit values' own). */
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

/* AdamW's fp32 gradient: n floats tagged grads widened from grads16 (exact), into
 * `reuse` when it is not NULL (a step the loss scale skipped left it), else allocated;
 * the caller frees it after the update. */
float *grads16_widen_for_optimizer(precision gp, const void *grads16, size_t n, float *reuse);

#endif
