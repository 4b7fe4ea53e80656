#include "zero.h"

#include "fsdp.h"
#include "grads16.h"
#include "ops_mixed.h"

/* ---- stages 0 and 1: whole gradients, reduced after backward (dp_grads.h) ---- */

static float forward_backward_whole_grads(zero_rank *z, float dloss) {
    dp_grads *g = &z->dp;
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

/* A slab of the whole compute weights (stage 2 keeps them whole). */
static const void *whole_slab(const zero_rank *z, int slab) {
    return precision_at(z->dp.precision, dp_grads_whole_params(&z->dp),
                        z->dp.layout.slab_offset[slab]);
}

static float forward_backward_stage2(zero_rank *z, float dloss) {
    const gpt_shape *s = &z->shape;
    dp_grads *g = &z->dp;
    gpt_model *m = z->model;
    const int final = gpt_final_slab(s);

    trace_begin(g->group, "forward");
    float loss = gpt_forward(m, dp_grads_whole_params(g));
    trace_end(g->group);

    trace_begin(g->group, "backward");
    /* The tied embedding collects gradient from the head now and from the embedding
     * at the very end, so its full buffer lives through the whole backward pass. */
    float *embed_grad = dp_grads_slab_grad_alloc(g, 0);
    float *final_grad = dp_grads_slab_grad_alloc(g, final);
    gpt_head_backward(m, whole_slab(z, final), whole_slab(z, 0), final_grad, embed_grad, dloss);
    dp_grads_reduce_slab(g, final, final_grad);
    for (int layer = s->cfg.layers - 1; layer >= 0; layer--) {
        const int slab = gpt_block_slab(s, layer);
        float *block_grad = dp_grads_slab_grad_alloc(g, slab);
        gpt_block_backward(m, layer, whole_slab(z, slab), block_grad);
        dp_grads_reduce_slab(g, slab, block_grad);   /* ... and the block's buffer is gone */
    }
    gpt_embed_backward(m, embed_grad);
    dp_grads_reduce_slab(g, 0, embed_grad);
    trace_end(g->group);
    return loss;
}

static float forward_backward(zero_rank *z, float dloss) {
    switch (z->opts.stage) {
    case 0:
    case 1: return forward_backward_whole_grads(z, dloss);
    case 2: return forward_backward_stage2(z, dloss);
    default: return fsdp_forward_backward(z, dloss);
    }
}

float zero_forward_backward(zero_rank *z, float dloss) {
    dp_grads_begin_step_compute(&z->dp);   /* mixed precision: 16-bit weights, fresh */
    const float loss = forward_backward(z, dloss);
    dp_grads_grads_ready(&z->dp);   /* 16-bit gradients: widened for the update */
    return loss;
}

void zero_optimizer_step(zero_rank *z, const adamw_config *cfg) {
    trace_begin(z->dp.group, "optimizer");
    dp_grads_optimizer_step(&z->dp, cfg);
    trace_end(z->dp.group);
}
