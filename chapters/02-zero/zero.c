#include "zero.h"

#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "fsdp.h"

static float *device_floats(mem_tag tag, size_t n) {
    return mem_alloc_on(MEM_DEVICE, tag, n * sizeof(float));
}

float *zero_piece(const zero_rank *z, float *vector, int is_whole, int slab) {
    const shard_layout *l = &z->layout;
    return vector + (is_whole ? shard_piece_begin(l, slab) : l->shard_pos[slab]);
}

/* Every rank computes only the values of its own pieces: gpt_init_params gives any
 * index range bit-identical to the whole model's initialisation. A whole copy is then
 * assembled by all-gathering the pieces, slab by slab. */
static void init_params(zero_rank *z, uint64_t seed) {
    const shard_layout *l = &z->layout;
    float *host = malloc((l->shard_len + 1) * sizeof(float));
    if (!host) abort();
    for (int slab = 0; slab < l->num_slabs; slab++) {
        size_t begin = shard_piece_begin(l, slab);
        gpt_init_params(&z->shape, seed, begin, begin + l->piece_len[slab],
                        host + l->shard_pos[slab]);
    }
    for (int slab = 0; slab < l->num_slabs; slab++)
        ops_upload(zero_piece(z, z->params, z->params_whole, slab), host + l->shard_pos[slab],
                   l->piece_len[slab] * sizeof(float));
    free(host);
    if (z->params_whole)
        for (int slab = 0; slab < l->num_slabs; slab++)
            comm_allgather(z->world, z->params + shard_piece_begin(l, slab),
                           z->params + l->slab_offset[slab], l->slab_numel[slab], COMM_F32);
}

zero_rank *zero_rank_create(comm *world, const gpt_shape *s, int local_batch, int T,
                            uint64_t seed, const zero_options *opts) {
    zero_rank *z = calloc(1, sizeof *z);
    if (!z) abort();
    z->world = world;
    z->shape = *s;
    z->opts = *opts;
    shard_layout_init(&z->layout, s, comm_size(world), comm_rank(world));
    const size_t P = z->layout.num_params, shard = z->layout.shard_len;
    z->params_whole = opts->stage <= 2;
    z->grads_whole = opts->stage <= 1;
    z->optimizer_whole = opts->stage == 0;
    z->params = device_floats(MEM_PARAMS, z->params_whole ? P : shard);
    /* stages 2 and 3 hold whole gradients only one slab at a time, during backward */
    z->grads = device_floats(MEM_GRADS, z->grads_whole ? P : shard);
    z->adam_m = device_floats(MEM_OPTIMIZER, z->optimizer_whole ? P : shard);
    z->adam_v = device_floats(MEM_OPTIMIZER, z->optimizer_whole ? P : shard);
    init_params(z, seed);
    gpt_model_options model_opts = {.checkpoint_activations = opts->checkpoint_activations};
    z->model = gpt_model_create(s, local_batch, T, &model_opts);
    return z;
}

void zero_rank_free(zero_rank *z) {
    if (!z) return;
    gpt_model_free(z->model);
    mem_free(z->params);
    mem_free(z->grads);
    mem_free(z->adam_m);
    mem_free(z->adam_v);
    shard_layout_free(&z->layout);
    free(z);
}

float *zero_slab_grad_alloc(zero_rank *z, int slab) {
    return device_floats(MEM_GRADS, z->layout.slab_numel[slab]);
}

void zero_reduce_into_shard(zero_rank *z, int slab, float *slab_grad) {
    const shard_layout *l = &z->layout;
    float *piece = z->grads + l->shard_pos[slab];
    if (z->opts.fault == ZERO_FAULT_SKIP_GRAD_REDUCE)
        vec_copy(piece, slab_grad + l->piece_offset[slab], l->piece_len[slab]);
    else
        comm_reduce_scatter(z->world, slab_grad, piece, l->slab_numel[slab], COMM_F32,
                            COMM_SUM);
    mem_free(slab_grad);
}

/* ---- stages 0 and 1: whole gradients, reduced after backward ------------------ */

static float forward_backward_whole_grads(zero_rank *z, float dloss) {
    const shard_layout *l = &z->layout;
    trace_begin(z->world, "forward");
    float loss = gpt_forward(z->model, z->params);
    trace_end(z->world);
    trace_begin(z->world, "backward");
    vec_zero(z->grads, l->num_params);
    gpt_backward(z->model, z->params, z->grads, dloss, NULL, NULL);
    trace_end(z->world);
    if (z->opts.fault == ZERO_FAULT_SKIP_GRAD_REDUCE) return loss;
    if (z->opts.stage == 0) {
        /* plain DDP: every rank gets the whole summed gradient */
        comm_allreduce(z->world, z->grads, l->num_params, COMM_F32, COMM_SUM);
    } else {
        /* Stage 1 needs the summed gradient only where it updates: a reduce-scatter
         * (half of an all-reduce) leaves it in place, in this rank's piece of every
         * slab. The rest of the buffer keeps this rank's own unreduced gradients,
         * which nothing reads. */
        for (int slab = 0; slab < l->num_slabs; slab++)
            comm_reduce_scatter(z->world, z->grads + l->slab_offset[slab],
                                z->grads + shard_piece_begin(l, slab), l->slab_numel[slab],
                                COMM_F32, COMM_SUM);
    }
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

    trace_begin(z->world, "forward");
    float loss = gpt_forward(m, z->params);
    trace_end(z->world);

    trace_begin(z->world, "backward");
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
    trace_end(z->world);
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
    trace_begin(z->world, "optimizer");
    if (z->opts.stage == 0) {
        adamw_update(z->params, z->grads, z->adam_m, z->adam_v, l->num_params, cfg,
                     z->adam_step);
    } else {
        /* AdamW is element by element, so updating only our pieces with our moments
         * gives exactly what the whole-model update would give there. */
        for (int slab = 0; slab < l->num_slabs; slab++)
            adamw_update(zero_piece(z, z->params, z->params_whole, slab),
                         zero_piece(z, z->grads, z->grads_whole, slab),
                         z->adam_m + l->shard_pos[slab], z->adam_v + l->shard_pos[slab],
                         l->piece_len[slab], cfg, z->adam_step);
    }
    trace_end(z->world);
    /* Stages 1 and 2 keep whole parameters for the next forward: every rank sends its
     * updated piece to all the others. */
    if ((z->opts.stage == 1 || z->opts.stage == 2) &&
        z->opts.fault != ZERO_FAULT_SKIP_PARAM_ALLGATHER)
        for (int slab = 0; slab < l->num_slabs; slab++)
            comm_allgather(z->world, z->params + shard_piece_begin(l, slab),
                           z->params + l->slab_offset[slab], l->slab_numel[slab], COMM_F32);
}

/* ---- checking ------------------------------------------------------------------- */

/* The whole vector from this rank's pieces: a temporary (tagged other) for shards,
 * in place for whole vectors. */
static void gather_whole(zero_rank *z, float *vector, int is_whole, float *host) {
    const shard_layout *l = &z->layout;
    float *whole = is_whole ? vector : device_floats(MEM_OTHER, l->num_params);
    for (int slab = 0; slab < l->num_slabs; slab++)
        comm_allgather(z->world, zero_piece(z, vector, is_whole, slab),
                       whole + l->slab_offset[slab], l->slab_numel[slab], COMM_F32);
    if (host) ops_download(host, whole, l->num_params * sizeof(float));
    if (!is_whole) mem_free(whole);
}

void zero_gather_grads(zero_rank *z, float *host) {
    if (z->opts.stage == 0) {   /* already whole and reduced */
        if (host) ops_download(host, z->grads, z->layout.num_params * sizeof(float));
        return;
    }
    gather_whole(z, z->grads, z->grads_whole, host);
}

void zero_gather_params(zero_rank *z, float *host) {
    if (z->params_whole) {   /* this rank's own copy, as it would train on */
        if (host) ops_download(host, z->params, z->layout.num_params * sizeof(float));
        return;
    }
    gather_whole(z, z->params, 0, host);
}
