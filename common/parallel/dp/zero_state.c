#include "zero_state.h"

#include <string.h>

#include "alloc.h"

zero_rank *zero_rank_create(comm *group, const gpt_shape *s, int local_batch, int T,
                            uint64_t seed, const zero_options *opts) {
    zero_rank *z = mem_alloc(MEM_OTHER, sizeof *z);   /* freed with a stopped rank */
    z->shape = *s;
    z->opts = *opts;
    /* stage 0 is DDP: its all-reduce is DDP's, in one bucket, after backward */
    const dp_grads_options dp = {.zero = opts->stage, .precision = opts->precision,
                                 .grad_precision = opts->grad_precision,
                                 .replicate = opts->replicate,
                                 .fault = (dp_fault)opts->fault};
    dp_grads_init(&z->dp, group, s, seed, &dp);
    z->zpp = opts->stage == 3 && opts->zeropp
                 ? zeropp_create(&z->dp, opts->zeropp, opts->ranks_per_node, opts->zeropp_fault)
                 : NULL;
    gpt_model_options model_opts = {.precision = opts->precision,
                                    .checkpoint_activations = opts->checkpoint_activations};
    z->model = gpt_model_create(s, local_batch, T, &model_opts);
    return z;
}

void zero_rank_free(zero_rank *z) {
    if (!z) return;
    gpt_model_free(z->model);
    zeropp_free(z->zpp);
    dp_grads_free(&z->dp);
    mem_free(z);
}

void zero_checkpoint_state(zero_rank *z, ckpt_state *out) {
    const dp_grads *g = &z->dp;
    memset(out, 0, sizeof *out);
    out->parts[0] = (ckpt_part){.shape = z->shape, .layout = &g->layout, .params = g->params,
                                .adam_m = g->adam_m, .adam_v = g->adam_v,
                                .params_sharded = !g->params_whole,
                                .moments_sharded = !g->optimizer_whole};
    out->count = 1;
    out->adam_steps[0] = &z->dp.adam_step;
}

/* ---- checking ------------------------------------------------------------------- */

static void download_whole(zero_rank *z, dp_vector which, float *host) {
    float *whole = dp_grads_gather_whole(&z->dp, which);
    if (host) ops_download(host, whole, z->dp.layout.num_params * sizeof(float));
    dp_grads_whole_free(&z->dp, whole);
}

void zero_gather_grads(zero_rank *z, float *host) { download_whole(z, DP_GRADS, host); }

void zero_gather_params(zero_rank *z, float *host) { download_whole(z, DP_PARAMS, host); }
