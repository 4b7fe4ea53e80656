#include "zero.h"

#include "fsdp.h"
#include "grad_buckets.h"

/* ---- stages 0 and 1: whole gradients, reduced after backward ------------------ */

void zero_reduce_grads(zero_rank *z) {
    const shard_layout *l = &z->layout;
    if (z->opts.fault == ZERO_FAULT_SKIP_GRAD_REDUCE) return;
    if (z->opts.stage == 0) {
        /* plain DDP: every rank gets the whole summed gradient */
        for (int slab = l->num_slabs - 1; slab >= 0; slab--)
            grad_buckets_slab_ready(z->buckets, slab);
        grad_buckets_wait(z->buckets);
        return;
    }
    /* Stage 1 needs the summed gradient only where it updates: a reduce-scatter (half
     * of an all-reduce) leaves it in place, in this rank's piece of every slab. The
     * rest of the buffer keeps this rank's own unreduced gradients, which nothing
     * reads. */
    shard_reduce_scatter_in_place(z->group, l, z->grads);
}

static float forward_backward_whole_grads(zero_rank *z, float dloss) {
    trace_begin(z->group, "forward");
    float loss = gpt_forward(z->model, z->params);
    trace_end(z->group);
    trace_begin(z->group, "backward");
    vec_zero(z->grads, z->layout.num_params);
    gpt_backward(z->model, z->params, z->grads, dloss, NULL, NULL);
    trace_end(z->group);
    zero_reduce_grads(z);
    return loss;
}

/* ---- stage 2: one slab's gradient at a time ----------------------------------- */

static const float *whole_slab(const zero_rank *z, int slab) {
    return z->params + z->layout.slab_offset[slab];
}

static float forward_backward_stage2(zero_rank *z, float dloss) {
    const gpt_shape *s = &z->shape;
    gpt_model *m = z->model;
    const int final = gpt_final_slab(s);

    trace_begin(z->group, "forward");
    float loss = gpt_forward(m, z->params);
    trace_end(z->group);

    trace_begin(z->group, "backward");
    /* The tied embedding collects gradient from the head now and from the embedding
     * at the very end, so its full buffer lives through the whole backward pass. */
    float *embed_grad = zero_slab_grad_alloc(z, 0);
    float *final_grad = zero_slab_grad_alloc(z, final);
    gpt_head_backward(m, whole_slab(z, final), whole_slab(z, 0), final_grad, embed_grad, dloss);
    zero_reduce_into_shard(z, final, final_grad);
    for (int layer = s->cfg.layers - 1; layer >= 0; layer--) {
        const int slab = gpt_block_slab(s, layer);
        float *block_grad = zero_slab_grad_alloc(z, slab);
        gpt_block_backward(m, layer, whole_slab(z, slab), block_grad);
        zero_reduce_into_shard(z, slab, block_grad);   /* ... and the block's buffer is gone */
    }
    gpt_embed_backward(m, embed_grad);
    zero_reduce_into_shard(z, 0, embed_grad);
    trace_end(z->group);
    return loss;
}

float zero_forward_backward(zero_rank *z, float dloss) {
    switch (z->opts.stage) {
    case 0:
    case 1: return forward_backward_whole_grads(z, dloss);
    case 2: return forward_backward_stage2(z, dloss);
    default: return fsdp_forward_backward(z, dloss);
    }
}

void zero_optimizer_step(zero_rank *z, const adamw_config *cfg) {
    const shard_layout *l = &z->layout;
    z->adam_step++;
    trace_begin(z->group, "optimizer");
    if (z->opts.stage == 0) {
        adamw_update(z->params, z->grads, z->adam_m, z->adam_v, l->num_params, cfg,
                     z->adam_step);
    } else {
        shard_adamw(l, z->params, z->params_whole, z->grads, z->grads_whole, z->adam_m,
                    z->adam_v, cfg, z->adam_step);
    }
    trace_end(z->group);
    /* Stages 1 and 2 keep whole parameters for the next forward: every rank sends its
     * updated piece to all the others. */
    if ((z->opts.stage == 1 || z->opts.stage == 2) &&
        z->opts.fault != ZERO_FAULT_SKIP_PARAM_ALLGATHER)
        shard_allgather_in_place(z->group, l, z->params);
}

