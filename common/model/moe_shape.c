/* The MoE model's shape: which blocks are MoE, what a rank holds, the sizes, and the
 * initial values (moe.h). */
#include "moe.h"

#include <math.h>
#include <stdio.h>

#include "rng.h"

int moe_config_check(const moe_config *cfg, int layers, int ep_size, char *err,
                     size_t err_len) {
    if (cfg->experts < 1) {
        snprintf(err, err_len, "--experts %d: must be a positive integer", cfg->experts);
        return 0;
    }
    if (cfg->top_k != 1 && cfg->top_k != 2) {
        snprintf(err, err_len, "--top-k %d: must be 1 or 2", cfg->top_k);
        return 0;
    }
    if (cfg->top_k > cfg->experts) {
        snprintf(err, err_len, "--top-k %d needs at least %d experts, not --experts %d",
                 cfg->top_k, cfg->top_k, cfg->experts);
        return 0;
    }
    if (cfg->every != 1 && cfg->every != 2) {
        snprintf(err, err_len, "--moe-every %d: must be 1 (every block) or 2 (every other)",
                 cfg->every);
        return 0;
    }
    if (cfg->every > layers) {
        snprintf(err, err_len, "--moe-every %d with --layers %d leaves no MoE block (try"
                 " --moe-every 1)", cfg->every, layers);
        return 0;
    }
    if (!(cfg->capacity_factor == 0 || (cfg->capacity_factor >= 0.01 &&
                                         cfg->capacity_factor <= 1000))) {
        snprintf(err, err_len, "--capacity-factor %g: must be 0 (no dropping) or between 0.01"
                 " and 1000", cfg->capacity_factor);
        return 0;
    }
    if (!(cfg->aux_coef >= 0 && cfg->aux_coef <= 100)) {
        snprintf(err, err_len, "--aux-loss %g: must be between 0 and 100", cfg->aux_coef);
        return 0;
    }
    if (ep_size < 1 || cfg->experts % ep_size != 0) {
        snprintf(err, err_len, "expert-parallel size %d does not divide --experts %d",
                 ep_size, cfg->experts);
        return 0;
    }
    return 1;
}

moe_shape moe_shape_make(const moe_config *cfg, const gpt_config *model, int ep_size,
                         int ep_rank) {
    moe_shape s = {.cfg = *cfg, .dim = model->dim, .hidden = 4 * model->dim,
                   .layers = model->layers, .ep_size = ep_size, .ep_rank = ep_rank};
    s.moe_layers = cfg->experts > 0 ? model->layers / cfg->every : 0;
    s.experts_local = cfg->experts / ep_size;
    s.expert_begin = ep_rank * s.experts_local;
    return s;
}

int moe_is_moe_layer(const moe_shape *s, int layer) {
    return s->cfg.experts > 0 && layer % s->cfg.every == s->cfg.every - 1;
}

int moe_layer_index(const moe_shape *s, int layer) {
    return moe_is_moe_layer(s, layer) ? layer / s->cfg.every : -1;
}

size_t moe_expert_numel(const moe_shape *s) {
    const size_t C = s->dim, H = s->hidden;
    return H * C + H + C * H + C;
}

size_t moe_router_numel(const moe_shape *s) {
    return (size_t)s->moe_layers * s->cfg.experts * s->dim;
}

size_t moe_local_experts_numel(const moe_shape *s) {
    return (size_t)s->moe_layers * s->experts_local * moe_expert_numel(s);
}

size_t moe_dense_mlp_numel(const moe_shape *s) {
    return (size_t)s->moe_layers * moe_expert_numel(s);
}

/* The dense model's parameters (gpt_num_params of the whole model, no TP). */
static double dense_params(const moe_shape *s, int vocab, int ctx) {
    const double C = s->dim;
    return s->layers * (12 * C * C + 13 * C) + ((double)vocab + ctx + 2) * C;
}

/* Parameters of the MoE model with `experts_used` experts a block counted. */
static double params_with(const moe_shape *s, int experts_used, int vocab, int ctx) {
    return dense_params(s, vocab, ctx) - (double)moe_dense_mlp_numel(s) +
           (double)moe_router_numel(s) +
           (double)s->moe_layers * experts_used * (double)moe_expert_numel(s);
}

double moe_total_params(const moe_shape *s, const gpt_config *model) {
    return params_with(s, s->cfg.experts, model->vocab, model->ctx);
}

double moe_active_params(const moe_shape *s, const gpt_config *model) {
    return params_with(s, s->cfg.top_k, model->vocab, model->ctx);
}

moe_expert_tensors moe_expert_view(const moe_shape *s, float *experts, int moe_layer, int j) {
    const size_t C = s->dim, H = s->hidden;
    float *e = experts + ((size_t)moe_layer * s->experts_local + j) * moe_expert_numel(s);
    return (moe_expert_tensors){.fc_w = e, .fc_b = e + H * C, .fc2_w = e + H * C + H,
                                .fc2_b = e + H * C + H + C * H};
}

float *moe_router_of(const moe_shape *s, float *routers, int moe_layer) {
    return routers + (size_t)moe_layer * s->cfg.experts * s->dim;
}

/* rng streams: tensor kind x MoE block x global expert, apart from the model's */
enum { STREAM_ROUTER = 1000, STREAM_FC = 2000, STREAM_FC2 = 3000 };

static uint64_t stream_of(int kind, const moe_shape *s, int moe_layer, int expert) {
    return ((uint64_t)kind << 32) + (uint64_t)moe_layer * s->cfg.experts + expert;
}

static void fill_normal(float *x, size_t n, uint64_t seed, uint64_t stream, float std) {
    rng_normals(seed, stream, 0, n, std, x);
}

void moe_init_routers(const moe_shape *s, uint64_t seed, float *routers) {
    const size_t n = (size_t)s->cfg.experts * s->dim;
    for (int i = 0; i < s->moe_layers; i++)
        fill_normal(moe_router_of(s, routers, i), n, seed, stream_of(STREAM_ROUTER, s, i, 0),
                    0.02f);
}

void moe_init_local_experts(const moe_shape *s, uint64_t seed, float *experts) {
    const size_t C = s->dim, H = s->hidden;
    const float residual_std = 0.02f / sqrtf(2.0f * s->layers);
    for (int i = 0; i < s->moe_layers; i++) {
        for (int j = 0; j < s->experts_local; j++) {
            const int e = s->expert_begin + j;
            moe_expert_tensors t = moe_expert_view(s, experts, i, j);
            fill_normal(t.fc_w, H * C, seed, stream_of(STREAM_FC, s, i, e), 0.02f);
            fill_normal(t.fc2_w, C * H, seed, stream_of(STREAM_FC2, s, i, e), residual_std);
            for (size_t h = 0; h < H; h++) t.fc_b[h] = 0;
            for (size_t c = 0; c < C; c++) t.fc2_b[c] = 0;
        }
    }
}
