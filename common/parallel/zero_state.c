#include "zero_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "grad_buckets.h"

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
    if (z->params_whole) shard_allgather_in_place(z->group, l, z->params);
}

zero_rank *zero_rank_create(comm *group, const gpt_shape *s, int local_batch, int T,
                            uint64_t seed, const zero_options *opts) {
    zero_rank *z = mem_alloc(MEM_OTHER, sizeof *z);   /* freed with a stopped rank */
    z->group = group;
    z->shape = *s;
    z->opts = *opts;
    shard_layout_init(&z->layout, s, comm_size(group), comm_rank(group));
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
    /* stage 0 is DDP: its all-reduce is DDP's, in one bucket, after backward */
    if (opts->stage == 0)
        z->buckets = grad_buckets_create(group, s, z->grads, SIZE_MAX, SIZE_MAX, COMM_F32);
    return z;
}

void zero_rank_free(zero_rank *z) {
    if (!z) return;
    gpt_model_free(z->model);
    grad_buckets_free(z->buckets);
    mem_free(z->params);
    mem_free(z->grads);
    mem_free(z->adam_m);
    mem_free(z->adam_v);
    shard_layout_free(&z->layout);
    mem_free(z);
}

void zero_checkpoint_state(zero_rank *z, ckpt_state *out) {
    memset(out, 0, sizeof *out);
    out->parts[0] = (ckpt_part){.shape = z->shape, .layout = &z->layout, .params = z->params,
                                .adam_m = z->adam_m, .adam_v = z->adam_v,
                                .params_sharded = !z->params_whole,
                                .moments_sharded = !z->optimizer_whole};
    out->count = 1;
    out->adam_steps[0] = &z->adam_step;
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
        comm_reduce_scatter(z->group, slab_grad, piece, l->slab_numel[slab], COMM_F32,
                            COMM_SUM);
    mem_free(slab_grad);
}

/* ---- checking ------------------------------------------------------------------- */

/* The whole vector from this rank's pieces: a temporary (tagged other) for shards,
 * in place for whole vectors. */
static void gather_whole(zero_rank *z, float *vector, int is_whole, float *host) {
    const shard_layout *l = &z->layout;
    float *whole = is_whole ? vector : device_floats(MEM_OTHER, l->num_params);
    for (int slab = 0; slab < l->num_slabs; slab++)
        comm_allgather(z->group, zero_piece(z, vector, is_whole, slab),
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
