#include "zero.h"

#include "fsdp.h"
#include "grads16.h"
#include "ops_mixed.h"

/* ---- stages 0 and 1: whole gradients, reduced after backward (dp_grads.h) ---- */

static float forward_backward_whole_grads(zero_rank *z, float dloss) {
    dp_grads *g = z->dp;
    trace_begin(g->group, "forward");
    float loss = gpt_forward(z->model, dp_grads_whole_params(g));
    trace_end(g->group);
    trace_begin(g->group, "backward");
    dp_grads_step_begin(g);
    if (g->grads16)   /* 16-bit gradients: slab by slab in fp32, rounded once */
        gpt_backward_grads16(z->model, dp_grads_whole_params(g), g->grad_precision,
                             g->grads16, dloss, NULL, NULL);
    else
        gpt_backward(z->model, dp_grads_whole_params(g), g->grads, dloss, NULL, NULL);
    trace_end(g->group);
    dp_grads_after_backward(g);
    return loss;
}

/* ---- stage 2: one slab's gradient at a time ----------------------------------- */

/* ZeRO-2's slab buffers: a whole-slab gradient, reduce-scattered into this rank's
 * shard (and gone) the moment backward finishes the slab. */
static float *stage2_open(void *ctx, int slab) { return dp_grads_slab_grad_alloc(ctx, slab); }
static void stage2_close(void *ctx, int slab, float *grad) { dp_grads_reduce_slab(ctx, slab, grad); }

static float forward_backward_stage2(zero_rank *z, float dloss) {
    dp_grads *g = z->dp;
    trace_begin(g->group, "forward");
    float loss = gpt_forward(z->model, dp_grads_whole_params(g));
    trace_end(g->group);
    trace_begin(g->group, "backward");
    gpt_backward_by_slab(z->model, dp_grads_whole_params(g), dloss, stage2_open, stage2_close,
                         g);
    trace_end(g->group);
    return loss;
}

static float forward_backward(zero_rank *z, float dloss) {
    switch (z->dp->zero) {
    case 0:
    case 1: return forward_backward_whole_grads(z, dloss);
    case 2: return forward_backward_stage2(z, dloss);
    default: return fsdp_forward_backward(z, dloss);
    }
}

float zero_forward_backward(zero_rank *z, float dloss) {
    dp_grads_begin_step_compute(z->dp);   /* mixed precision: 16-bit weights, fresh */
    return forward_backward(z, dloss);
}
