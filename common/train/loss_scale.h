/* The dynamic loss scale of fp16 training.
 *
 * fp16 holds 2^-24 .. 65504: gradients below half of 2^-24 round to zero, and most of a
 * model's gradients are small. So fp16 training multiplies the loss by a scale S before
 * backward (every gradient comes out S times larger, above the flush), divides the
 * fp32 gradients by S before the optimizer, and adapts S as it goes:
 *
 *   every step:   used = s                                          the backward's S
 *                 finite = grads_finite(this rank's fp32 gradients)
 *                 finite = loss_scale_all_finite(world, finite)    every rank, same answer
 *                 if loss_scale_update(&s, finite):                 1: take the step
 *                     loss_scale_unscale(&used, grads, n); the optimizer step
 *                 else: no optimizer step at all (AdamW's step count does not advance)
 *
 *   (unscale by the S the gradients were made with: an update that grows S has already
 *   doubled s.scale, and dividing by it would halve that step's gradients)
 *
 *   update:  a step with an inf or NaN anywhere is skipped and S is multiplied by
 *            backoff_factor (never below min_scale); after growth_interval clean steps
 *            in a row S is multiplied by growth_factor. A skip restarts the count.
 *
 * With the defaults S is a power of two, so scaling and unscaling change no mantissa
 * bit: S x g / S is g exactly (outside fp32's own overflow and subnormal range).
 * bf16 and fp32 keep fp32's exponent range and need no scale: `enabled` 0 leaves S at
 * 1 and takes every step (grads_finite and the all-reduce may then be left out). */
#ifndef LOSS_SCALE_H
#define LOSS_SCALE_H
#include <stddef.h>

#include "comm.h"
#include "precision.h"

typedef struct {
    float init_scale;      /* 65536 = 2^16: PyTorch's GradScaler and Megatron's start */
    float growth_factor;   /* 2 */
    float backoff_factor;  /* 0.5 */
    /* 1000 clean steps, as DeepSpeed and Megatron (PyTorch: 2000). A growth that
     * overshoots costs one skipped step, so at most one step in growth_interval is
     * lost to probing (0.1%), and after a backoff S regains a factor of 2 within 1000
     * steps: the shorter of the two common choices, since runs here are short. */
    int growth_interval;
    float min_scale;       /* 1: a backoff never takes S below it */
    int enabled;           /* 0: S stays 1 and every step is taken (fp32, bf16) */
} loss_scale_config;

typedef struct {
    loss_scale_config cfg;
    float scale;           /* S: multiply the loss by it before backward */
    int clean_steps;       /* finite steps in a row since the last change of S */
    int skipped_steps;     /* in all */
} loss_scale;

/* The defaults above, enabled for PRECISION_FP16 only. */
loss_scale_config loss_scale_defaults(precision p);
/* 1 when cfg can run: init_scale finite and >= min_scale > 0, growth_factor > 1,
 * 0 < backoff_factor < 1, growth_interval >= 1 (or enabled 0: anything goes). Else 0,
 * and why holds one line naming the field, its value and what would be valid. */
int loss_scale_config_check(const loss_scale_config *cfg, char *why, size_t why_size);
/* Starts at init_scale (1 when disabled). A config that fails the check is a caller's
 * bug: the scale is then left disabled and 0 returned (the check says why); else 1. */
int loss_scale_init(loss_scale *s, const loss_scale_config *cfg);
/* Whether a start scale can train at all: 1 when init_scale is an fp32 number and at
 * least the last of `steps` steps of `tokens` tokens each (the global batch's) can be
 * taken; else 0, and why says which, with the valid range. Every step is lost when
 * even after steps - 1 back-offs the loss's gradient at a token's target overflows
 * fp16 (the comment in loss_scale.c derives the bound: 2 x 65520 x tokens). */
int loss_scale_start_check(double init_scale, double backoff_factor, double tokens, int steps,
                           char *why, size_t why_size);

/* Is every element of this rank's fp32 gradient (on the current device) finite?
 * One vec_sum: it sums in double (CPU and GPU), where NaN or inf anywhere makes the sum
 * NaN or inf, while finite fp32 values cannot overflow it (n x 2^128 stays below
 * double's 2^1024 for any n that fits in memory). A float sum would not do: two
 * gradients of 3e38 overflow it. */
int grads_finite(const float *grads, size_t n);
/* 1 when every rank of group saw finite gradients (group NULL: this rank alone). One
 * COMM_MAX all-reduce of one float; collective: every rank of group calls it, even one
 * without gradients (pass the world group, since skipping is all or nothing). */
int loss_scale_all_finite(comm *group, int locally_finite);
/* Applies the decision: returns 1 when the optimizer step must be taken (all_finite),
 * else counts a skipped step, backs S off and returns 0; grows S after growth_interval
 * clean steps in a row (and not to infinity). Disabled: returns 1 and changes nothing.
 * The same inputs give the same result and state on every rank. */
int loss_scale_update(loss_scale *s, int all_finite);
/* grads /= S on the current device, after a step loss_scale_update let through; s is
 * the state the step's backward used, from before that update (which may grow S). */
void loss_scale_unscale(const loss_scale *s, float *grads, size_t n);

/* What fp16 does to gradients without (scale 1) or with a scale, on host memory: the
 * share of the finite non-zero elements of grads whose product with scale rounds to 0
 * in fp16 (flush) or to +-inf (overflow); 0 when there are none. */
double fp16_flush_share(const float *grads, size_t n, float scale);
double fp16_overflow_share(const float *grads, size_t n, float scale);

#endif
