/* One training loop for every strategy. A strategy provides its step in parts; the
 * loop does the rest the same way for all of them:
 *
 *   for step = 1 .. steps:
 *       loss = compute_grads(step, S)   forward, backward with dloss x S, reduction
 *       fp16: every rank's gradients finite? (one flag over all ranks) then unscale by
 *             1/S, else skip this step's update and halve S (loss_scale.h)
 *       if step == 1: keep_first_grads  (not timed) for the comparison with the baseline
 *       update()                        the optimizer, and what the strategy does after it
 *       a progress line with the global-batch loss (world rank 0)
 *       after step 1: after_warmup(), communication statistics and memory peaks reset
 *
 * Step 1 is the warm-up: it pays for first touches of memory and for the comparison,
 * so it is timed only when it is the only step.
 *
 * Checkpoints (checkpoint.h): with --resume the loop first loads the strategy's state
 * and runs steps saved + 1 .. --steps (the outcome's arrays hold those steps), fp16's
 * loss scale continuing from an fp16 checkpoint's; with --save it saves after the last
 * step and every --save-every steps, untimed, with the precision and the loss scale. The global loss of each step is summed
 * over a group of the loop's own, so the strategy's groups count their traffic alone. */
#ifndef TRAIN_LOOP_H
#define TRAIN_LOOP_H

#include "checkpoint.h"
#include "run_config.h"
#include "comm.h"
#include "grad_vector.h"
#include "report.h"

#define TRAIN_MAX_GRAD_VECTORS 64

typedef struct {
    const char *name;   /* in tables and JSON: "ddp", "zero1", "tp", "pp-1f1b", ... */
    void *ctx;
    /* Returns this rank's share of the step's global-batch mean loss: the shares of all
     * ranks add up to it (a rank's mean loss x its tokens / the global batch's tokens;
     * 0 on a rank whose loss another rank already counts). */
    float (*compute_grads)(void *ctx, int step, float loss_scale);
    void (*keep_first_grads)(void *ctx);   /* may be NULL */
    void (*update)(void *ctx, int step);
    void (*after_warmup)(void *ctx);       /* may be NULL */
    /* The gradient vectors this rank's update reads (whole or its shard; one per
     * pipeline chunk; fp32 or 16-bit), after compute_grads: the loss scale checks and
     * unscales them. Returns how many (at most TRAIN_MAX_GRAD_VECTORS); NULL: the
     * strategy takes no loss scale (its program refuses fp16). */
    int (*optimizer_grads)(void *ctx, grad_vector *vectors);
    /* What this rank holds, for --save and --resume; NULL: the strategy has none. */
    void (*checkpoint_state)(void *ctx, ckpt_state *out);
} train_strategy;

typedef struct {
    run_result result;   /* the largest rank's time, communication and memory; no
                            differences (-1) and no bytes formula (-1) yet */
    float *loss;         /* [steps run] global-batch mean, on every rank */
    double *step_seconds;   /* [steps run] this rank's */
} train_outcome;

/* Collective over world; world NULL is one rank without a communicator (the baseline,
 * DataParallel's master thread). tokens_per_step: of the global batch. */
void train_loop(comm *world, const run_config *cfg, double tokens_per_step,
                const train_strategy *strategy, train_outcome *out);
/* The loss and the step times, handed over as plain heap arrays that outlive the rank
 * (the caller free()s them; the outcome's own, which go with a stopped rank's buffers,
 * are given back, and result.loss points to the new one). */
float *train_outcome_take_loss(train_outcome *out);
double *train_outcome_take_step_seconds(train_outcome *out);
void train_outcome_free(train_outcome *out);

#endif
